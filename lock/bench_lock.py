#!/usr/bin/python3
"""bench_lock.py: `make bench-lock`: runs bin/lockbench against a private
redis-server (free port, temp dir, started and stopped here by the test
harness) and prints its figures.

Usage: bench_lock.py LOCKBENCH [SECONDS]"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import harness  # noqa: E402


def main():
    exe = sys.argv[1]
    seconds = sys.argv[2] if len(sys.argv) > 2 else "3"
    redis = harness.Redis()
    try:
        return subprocess.run([exe, "--redis", redis.url, "--seconds", seconds]).returncode
    finally:
        redis.stop()
        harness.stop_all()


if __name__ == "__main__":
    sys.exit(main())
