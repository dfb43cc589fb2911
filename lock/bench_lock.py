#!/usr/bin/python3
"""bench_lock.py: `make bench-lock`: runs bin/lockbench against a private
redis-server and, when they can start, a standalone ZooKeeper and etcd
(free ports, temp dirs, started and stopped here by the test harness), and
prints its figures: Redis's, then each other lock server's next to them.

Usage: bench_lock.py LOCKBENCH [SECONDS]"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import harness  # noqa: E402


def main():
    exe = sys.argv[1]
    seconds = sys.argv[2] if len(sys.argv) > 2 else "3"
    servers = []
    try:
        redis = harness.Redis()
        servers.append(redis)
        args = [exe, "--redis", redis.url, "--seconds", seconds]
        for cls in (harness.ZooKeeper, harness.Etcd):
            try:
                srv = cls()
            except Exception as e:  # noqa: BLE001 - reported, Redis's figures still come
                print("bench-lock: no %s: %s" % (cls.__name__, str(e).splitlines()[0]))
                continue
            servers.append(srv)
            args += ["--url", srv.url]
        return subprocess.run(args).returncode
    finally:
        for s in servers:
            s.stop()
        harness.stop_all()


if __name__ == "__main__":
    sys.exit(main())
