#!/usr/bin/python3
"""run.py: runs every flashsale test and prints one summary line.

1. The C unit-test programs ($FLASHSALE_BIN/tests/test_*), each given a
   private Redis in FLASHSALE_TEST_REDIS; each prints "N passed, N failed".
2. The integration tests: functions named test_* in tests/test_*.py, each
   called with a fresh Ctx (its own temp dir; the Redis servers and services
   it starts are stopped afterwards, even on failure).

Usage: run.py [PATTERN...]   only tests whose name contains a pattern
Last line: "N passed, N failed". Exit status 1 when anything failed.
"""
import glob
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

TEST_TIMEOUT_S = int(os.environ.get("FLASHSALE_TEST_TIMEOUT", "300"))


class Ctx:
    """What one test owns: a temp dir, and processes stopped when it ends."""

    def __init__(self, name):
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix="fs-test-")
        self._cleanup = []
        self.services = []

    def path(self, name):
        return os.path.join(self.tmp, name)

    def redis(self, **kw):
        r = harness.Redis(**kw)
        self._cleanup.append(r.stop)
        return r

    def zookeeper(self, **kw):
        z = harness.ZooKeeper(**kw)
        self._cleanup.append(z.stop)
        return z

    def etcd(self, **kw):
        e = harness.Etcd(**kw)
        self._cleanup.append(e.stop)
        return e

    def sentinels(self, **kw):
        """A primary, replicas and three sentinels (harness.Sentinels)."""
        s = harness.Sentinels(**kw)
        self._cleanup.append(s.stop)
        return s

    def cluster(self, **kw):
        """A Redis Cluster, 3 primaries + 3 replicas (harness.Cluster)."""
        c = harness.Cluster(**kw)
        self._cleanup.append(c.stop)
        return c

    def lock_servers(self, strategy, persist=False):
        """Starts the lock server(s) strategy needs (harness.LockServers);
        persist: the Redlock servers keep an AOF, so a restart keeps their
        locks and fencing counters."""
        if strategy == "redlock":
            servers = [self.redis(persist=persist) for _ in range(3)]
        elif strategy == "zookeeper":
            servers = [self.zookeeper()]
        elif strategy == "etcd":
            servers = [self.etcd()]
        else:
            servers = []
        return harness.LockServers(strategy, servers)

    def service(self, redis, db=None, **kw):
        s = harness.Service(redis.url if hasattr(redis, "url") else redis,
                            db or self.path("orders.db"), **kw)
        self._cleanup.append(lambda: s.proc.poll() is None and s.kill())
        self.last_service = s
        self.services.append(s)
        return s

    def sanitizer_reports(self):
        """Sanitizer findings in the logs of the services this test ran."""
        found = []
        for s in self.services:
            try:
                text = s.logs()
            except OSError:
                continue
            for marker in ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer"):
                if marker in text:
                    found.append("%s: %s" % (s.log_path, text[text.index(marker) - 200:][:1500]))
        return found

    def on_cleanup(self, fn):
        self._cleanup.append(fn)

    def close(self, keep):
        for fn in reversed(self._cleanup):
            try:
                fn()
            except Exception:  # noqa: BLE001 - cleanup must go on
                pass
        if keep:
            print("    (kept %s for inspection)" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout("test exceeded %ds" % TEST_TIMEOUT_S)


def wanted(name, patterns):
    return not patterns or any(p in name for p in patterns)


def run_unit(patterns):
    passed = failed = 0
    bins = sorted(glob.glob(os.path.join(harness.BIN, "tests", "test_*")))
    if not bins:
        print("FAIL no unit-test programs found in %s/tests" % harness.BIN)
        return 0, 1
    redis = harness.Redis()
    try:
        for b in bins:
            name = "unit/" + os.path.basename(b)
            if not wanted(name, patterns):
                continue
            env = dict(os.environ, FLASHSALE_TEST_REDIS=redis.url)
            t0 = time.monotonic()
            p = subprocess.run([b], env=env, capture_output=True, text=True,
                               timeout=TEST_TIMEOUT_S)
            m = re.search(r"^(\d+) passed, (\d+) failed$", p.stdout, re.M)
            if not m or p.returncode not in (0, 1):
                failed += 1
                print("FAIL %s (exit %d, no summary)\n%s%s" % (name, p.returncode, p.stdout[-3000:],
                                                               p.stderr[-3000:]))
                continue
            np_, nf = int(m.group(1)), int(m.group(2))
            passed += np_
            failed += nf
            status = "ok  " if nf == 0 and p.returncode == 0 else "FAIL"
            print("%s %s: %d passed, %d failed (%.1fs)" % (status, name, np_, nf,
                                                            time.monotonic() - t0))
            if nf or p.returncode:
                print(p.stdout[-3000:] + p.stderr[-3000:])
    finally:
        redis.stop()
    return passed, failed


def run_integration(patterns):
    passed = failed = 0
    signal.signal(signal.SIGALRM, _alarm)
    for path in sorted(glob.glob(os.path.join(HERE, "test_*.py"))):
        modname = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        tests = [(n, f) for n, f in vars(mod).items() if n.startswith("test_") and callable(f)]
        tests.sort(key=lambda nf: nf[1].__code__.co_firstlineno)
        for name, fn in tests:
            full = "%s::%s" % (modname, name)
            if not wanted(full, patterns):
                continue
            ctx = Ctx(full)
            t0 = time.monotonic()
            ok = False
            signal.alarm(TEST_TIMEOUT_S)
            try:
                fn(ctx)
                for s in ctx.services:            # let sanitizers report at exit
                    if s.proc.poll() is None:
                        s.stop()
                reports = ctx.sanitizer_reports()
                if reports:
                    raise AssertionError("sanitizer reports:\n" + "\n".join(reports))
                ok = True
            except BaseException as e:  # noqa: BLE001 - every failure is reported
                if isinstance(e, KeyboardInterrupt):
                    raise
                print("FAIL %s (%.1fs)" % (full, time.monotonic() - t0))
                traceback.print_exc(file=sys.stdout)
                s = getattr(ctx, "last_service", None)
                if s:
                    print("---- service log (last 40 lines) ----")
                    try:
                        print("\n".join(s.logs().splitlines()[-40:]))
                    except OSError:
                        pass
            finally:
                signal.alarm(0)
                ctx.close(keep=False)
            if ok:
                passed += 1
                print("ok   %s (%.1fs)" % (full, time.monotonic() - t0))
            else:
                failed += 1
            sys.stdout.flush()
    return passed, failed


def main():
    patterns = sys.argv[1:]
    try:
        up, uf = run_unit(patterns)
        ip, if_ = run_integration(patterns)
    finally:
        harness.stop_all()
    print("%d passed, %d failed" % (up + ip, uf + if_))
    sys.exit(1 if uf + if_ else 0)


if __name__ == "__main__":
    main()
