#!/usr/bin/python3
"""run.py: runs every flashsale test and prints one summary line.

1. The C unit-test programs ($FLASHSALE_BIN/tests/test_*), each given a
   private Redis in FLASHSALE_TEST_REDIS, and a PostgreSQL server in
   FLASHSALE_TEST_PG, when its source reads it (one of each for them all,
   started for the first that needs it); each prints "N passed, N failed".
2. The integration tests: functions named test_* in tests/test_*.py, each
   called with a fresh Ctx (its own temp dir; the Redis servers and services
   it starts are stopped afterwards, even on failure).

Sanitizers: a test fails when a sanitizer reports in what it ran. ASan and
UBSan write to stderr, so the services' logs and the unit tests' stderr are
read for their markers. ThreadSanitizer (make test-tsan) is given
TSAN_OPTIONS here (tsan_options()): the unit tests keep its reports on their
stderr; every program an integration test starts (the services, flashload,
flashlock, lockcheck, `flashsale audit`...) writes them to
<test's temp dir>/tsan.<pid> through log_path, whatever the test does with
its output, and those files are read when the test ends.

Usage: run.py [PATTERN...]   only tests whose name contains a pattern
                             (unit/test_db, test_holds::, test_holds::test_x)
       run.py --unit NAME[:CASE]...   unit-test program NAME (test_db), or
                             its cases whose name contains CASE
After the summary line ("N passed, N failed"), the ten slowest tests of the
run with their times in seconds (slowest first), so a run that grew slower
says where. Exit status 1 when anything failed.
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

# What a sanitizer writes when it finds something. "ThreadSanitizer:" also
# catches the runtime's own errors (FATAL: ThreadSanitizer: ..., CHECK failed,
# DEADLYSIGNAL), which end a test as surely as a race does.
SANITIZER_MARKERS = ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                     "WARNING: ThreadSanitizer", "ThreadSanitizer:")
TSAN_SUPP = os.path.join(HERE, "tsan.supp")
_USER_TSAN_OPTIONS = os.environ.get("TSAN_OPTIONS", "")


def tsan_options(log_path=None):
    """TSAN_OPTIONS for the programs the tests run (ignored by the rel and san
    builds). halt_on_error=0: every race of a run is reported, not only the
    first; second_deadlock_stack=1: a lock-order report shows both stacks.
    The suppressions file names third-party libraries only. log_path: a file
    prefix (a report goes to <prefix>.<pid>) instead of stderr. Options
    already in the environment's TSAN_OPTIONS come last, so they win (e.g.
    history_size=4 when a report says it failed to restore a stack)."""
    opts = ["suppressions=" + TSAN_SUPP, "halt_on_error=0", "second_deadlock_stack=1"]
    if log_path:
        opts.append("log_path=" + log_path)
    return " ".join(opts + [_USER_TSAN_OPTIONS]).strip()


def sanitizer_excerpts(text, where):
    """The sanitizer reports in text, each as "where: excerpt"; a
    ThreadSanitizer report whole (between its ===== lines), others from a
    little before the marker."""
    found = []
    pos = 0
    while len(found) < 5:
        hits = [(text.find(m, pos), m) for m in SANITIZER_MARKERS]
        hits = [(i, m) for i, m in hits if i >= 0]
        if not hits:
            break
        i, m = min(hits)
        if text.startswith("ThreadSanitizer: reported", i):    # the tally after the reports
            pos = i + len(m)
            continue
        if "ThreadSanitizer" in m:
            start = text.rfind("==================", 0, i)
            start = text.rfind("\n", 0, i) + 1 if start < 0 or i - start > 200 else start
            end = text.find("==================", i)
            end = len(text) if end < 0 else end + 18
            excerpt = text[start:end][:12000]
        else:
            start = max(0, i - 200)
            end = i + 1500
            excerpt = text[start:end]
        found.append("%s: %s" % (where, excerpt))
        pos = max(end, i + len(m))
    return found


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

    def postgres(self, **kw):
        """A throwaway PostgreSQL server (harness.Postgres)."""
        p = harness.Postgres(**kw)
        self._cleanup.append(p.stop)
        return p

    def pgbouncer(self, pg, **kw):
        """A PgBouncer in front of pg (harness.PgBouncer)."""
        b = harness.PgBouncer(pg, **kw)
        self._cleanup.append(b.stop)
        return b

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
                            db or self.path("orders.db"), log_dir=self.tmp, **kw)
        self._cleanup.append(lambda: s.proc.poll() is None and s.kill())
        self.last_service = s
        self.services.append(s)
        return s

    def tsan_log_prefix(self):
        """Where the programs this test runs write ThreadSanitizer reports
        (TSAN_OPTIONS log_path: <prefix>.<pid>)."""
        return os.path.join(self.tmp, "tsan")

    def sanitizer_reports(self):
        """Sanitizer findings in the logs of the services this test ran, and
        the ThreadSanitizer reports of any program it ran."""
        found = []
        for s in self.services:
            try:
                text = s.logs()
            except OSError:
                continue
            found += sanitizer_excerpts(text, s.log_path)
        for path in sorted(glob.glob(self.tsan_log_prefix() + ".*")):
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            found += sanitizer_excerpts(text, path) or ["%s: %s" % (path, text[:3000])]
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


def reads_env(program, var):
    """Whether unit-test program reads var (FLASHSALE_TEST_REDIS,
    FLASHSALE_TEST_PG): its source (or a header of tests/unit/ it includes)
    names it."""
    src = os.path.join(HERE, "unit", os.path.basename(program) + ".c")
    try:
        text = open(src).read()
    except OSError:
        return True                 # cannot tell: give it one
    if var in text:
        return True
    for h in re.findall(r'#include "tests/unit/([\w.]+\.h)"', text):
        try:
            if var in open(os.path.join(HERE, "unit", h)).read():
                return True
        except OSError:
            pass
    return False


def run_unit(patterns, selected=None):
    """The unit-test programs whose name (unit/<program>) contains a
    pattern; selected: [(program, case filter)] instead (run.py --unit)."""
    passed = failed = 0
    bins = sorted(glob.glob(os.path.join(harness.BIN, "tests", "test_*")))
    if selected is not None:
        runs = []
        for name, case in selected:
            b = os.path.join(harness.BIN, "tests", name)
            if not os.access(b, os.X_OK):
                print("FAIL no unit-test program %s (make unit T=%s builds it)" % (b, name))
                failed += 1
                continue
            runs.append((b, case))
    else:
        if not bins:
            print("FAIL no unit-test programs found in %s/tests" % harness.BIN)
            return 0, 1
        runs = [(b, None) for b in bins if wanted("unit/" + os.path.basename(b), patterns)]
    redis = pg = None
    try:
        for b, case in runs:
            name = "unit/" + os.path.basename(b) + (":" + case if case else "")
            # ThreadSanitizer reports stay on the program's stderr, read below.
            env = dict(os.environ, TSAN_OPTIONS=tsan_options())
            if reads_env(b, "FLASHSALE_TEST_REDIS"):
                if redis is None:
                    redis = harness.Redis()
                env["FLASHSALE_TEST_REDIS"] = redis.url
            if reads_env(b, "FLASHSALE_TEST_PG"):
                if pg is None:
                    pg = harness.Postgres()
                env["FLASHSALE_TEST_PG"] = pg.url()
            t0 = time.monotonic()
            p = subprocess.run([b] + ([case] if case else []), env=env, capture_output=True,
                               text=True, timeout=TEST_TIMEOUT_S)
            TIMES.append((time.monotonic() - t0, name))
            reports = sanitizer_excerpts(p.stderr, name + " stderr") + \
                sanitizer_excerpts(p.stdout, name + " stdout")
            if reports:
                failed += 1
                print("FAIL %s (exit %d): sanitizer reports:\n%s" % (name, p.returncode,
                                                                    "\n".join(reports)))
                continue
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
            elif np_ == 0:
                failed += 1
                print("FAIL %s: no case ran (no case name contains %r)" % (name, case))
    finally:
        if redis is not None:
            redis.stop()
        if pg is not None:
            pg.stop()
    return passed, failed


SKIPPED = []        # (test, why): tests that could not run here (harness.Skip)
TIMES = []          # (seconds, test): every test that ran, passed or failed (slowest())
SLOWEST = 10


def slowest(times, n=SLOWEST):
    """The lines that list the n slowest of times ((seconds, name) pairs),
    slowest first: a heading, then one line per test."""
    top = sorted(times, key=lambda t: -t[0])[:n]
    if not top:
        return []
    return ["the %d slowest tests (seconds):" % len(top)] + \
        ["  %7.1f  %s" % (secs, name) for secs, name in top]


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
            # Every program the test starts inherits these (harness.Service
            # and the tests' own subprocess calls copy os.environ).
            os.environ["TSAN_OPTIONS"] = tsan_options(ctx.tsan_log_prefix())
            t0 = time.monotonic()
            ok = False
            signal.alarm(TEST_TIMEOUT_S)
            try:
                try:
                    fn(ctx)
                except harness.Skip as e:
                    SKIPPED.append((full, str(e)))
                    print("skip %s: %s" % (full, e))
                    continue
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
                if not (isinstance(e, AssertionError) and "sanitizer reports:" in str(e)):
                    reports = ctx.sanitizer_reports()    # they may explain the failure
                    if reports:
                        print("---- sanitizer reports ----\n" + "\n".join(reports))
                s = getattr(ctx, "last_service", None)
                for other in ctx.services:     # the others' warnings and errors
                    if other is s:
                        continue
                    try:
                        lines = other.logs().splitlines()
                    except OSError:
                        continue
                    bad = [line for line in lines[:-15] if " warn: " in line or " error: " in line]
                    if bad:
                        print("---- %s: earlier warnings and errors (last 20) ----"
                              % other.log_path)
                        print("\n".join(bad[-20:]))
                    if lines:
                        print("---- %s: last 15 lines ----" % other.log_path)
                        print("\n".join(lines[-15:]))
                    rc = other.proc.poll() if other.proc else None
                    if rc is not None:       # it ended: how (a signal is negative)
                        print("---- %s: the process ended (status %s); its last lines ----"
                              % (other.log_path, rc))
                        print("\n".join(lines[-8:]))
                if s:
                    print("---- service log (last 40 lines) ----")
                    try:
                        print("\n".join(s.logs().splitlines()[-40:]))
                    except OSError:
                        pass
            finally:
                signal.alarm(0)
                ctx.close(keep=not ok and os.environ.get("FLASHSALE_KEEP_FAILED") == "1")
            TIMES.append((time.monotonic() - t0, full))
            if ok:
                passed += 1
                print("ok   %s (%.1fs)" % (full, time.monotonic() - t0))
            else:
                failed += 1
            sys.stdout.flush()
    return passed, failed


def main():
    args = sys.argv[1:]
    try:
        if args[:1] == ["--unit"]:
            selected = []
            for a in args[1:]:
                name, _, case = a.partition(":")
                selected.append((name, case or None))
            if not selected:
                print("usage: run.py --unit NAME[:CASE]...")
                sys.exit(2)
            up, uf = run_unit([], selected)
            ip = if_ = 0
        else:
            up, uf = run_unit(args)
            ip, if_ = run_integration(args)
    finally:
        harness.stop_all()
    skipped = "; %d skipped, not passed: %s" % (len(SKIPPED), "; ".join(
        "%s (%s)" % t for t in SKIPPED)) if SKIPPED else ""
    print("%d passed, %d failed%s" % (up + ip, uf + if_, skipped))
    for line in slowest(TIMES):
        print(line)
    sys.exit(1 if uf + if_ else 0)


if __name__ == "__main__":
    main()
