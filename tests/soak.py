#!/usr/bin/python3
"""soak.py: a long run of mixed load against one flashsale while its Redis
restarts, to find what only time finds: memory or descriptors that grow,
books that drift after many rebuilds, a crash after the hundredth reconnect.

One redis-server (AOF on, appendfsync everysec) and one bin/flashsale (its
SQLite file in a temp dir) on free ports. One product per safe strategy and
segment count (lua 1 and 8, lock 1 and 4, db, db-optimistic, local), each
driven by its own `flashload run` in an open loop at a moderate rate for the
whole run and verified by it at the end from the client, the API, Redis and
SQLite. The products differ on purpose: some have stock to spare, some sell
out part-way, one runs into its per-user limit, some send idempotency keys
and replay them, some buy several units at once.

Every --restart-every seconds Redis goes down for a second and comes back on
the same port and directory, in a cycle of three: stopped by SIGTERM (it
flushes its AOF: nothing lost), again, then a data loss, alternately SIGKILL
(everysec: the last second of writes is lost) and SIGKILL with the AOF
deleted (Redis comes back empty). Any restart gives Redis a new run_id, so
the service must rebuild every stock copy from SQLite; 503 answers while
Redis is down are expected. No restart falls in the last stretch of the run,
so the verifiers see a settled state.

Every 5 s: the service's RSS (/proc/PID/status VmRSS), open descriptors and
threads, and a progress line. At the end: each verifier's verdict, `flashsale
audit` (Redis and SQLite agree), SIGTERM (the service must exit 0), a table.

Exit 1 when any of these is broken:
  - a verifier FAILs (or does not finish), or the audit finds a discrepancy;
  - the service dies, or does not exit 0 on SIGTERM (under valgrind: an
    error or a definite leak makes valgrind exit 99);
  - an order is answered 500;
  - (not under valgrind) RSS: the last sample under load exceeds the first
    sample after the warm-up by more than 20% + 8 MB. The warm-up ends 20 s
    after the first Redis restart (or at a quarter of the run without one):
    SQLite's page caches and malloc's per-thread arenas fill legitimately at
    first, and the first outage runs code paths (reconnects, rebuilds, 503s
    on 32 lock workers) that take their share once, a step of ~7 MB here.
    Past that, with a constant load, memory should be flat;
  - (not under valgrind) descriptors: more than 16 above the warm-up sample.
Said but not failed (a busy machine does it too): a product whose load fell
behind (open-loop backlog over 1% of its requests, or p99 over 2 s); the
temp dir is then kept.

RSS does step up at each Redis outage, by less each time (+7 MB at the
first, +0.3-0.7 MB at the eighth and ninth of a 10-minute run): glibc's
malloc_stats() taken between restarts showed the bytes in use flat (19-20
MB over 10 restarts) while the arenas' system bytes grew, i.e. memory freed
after the outage's burst of 503s kept by the allocator, not leaked.

--valgrind runs the same under valgrind memcheck (--error-exitcode=99
--leak-check=full --errors-for-leak-kinds=definite), 60 s by default, at 4%
of the rates, with long Redis, lock and pending timeouts and few threads,
Redis restarted every 20 s (SIGTERM, then a data loss); it prints valgrind's
ERROR SUMMARY, its leak or heap summary and every error's stack, and keeps
the temp dir with valgrind.log.

Usage:
  tests/soak.py [--seconds N] [--restart-every S] [--rate-scale F] [--keep]
  tests/soak.py --valgrind [--seconds 60]
  (or SOAK_SECONDS, SOAK_RESTART_EVERY, SOAK_RATE_SCALE in the environment)
  make soak [SOAK_SECONDS=600]      make soak-valgrind [SOAK_VALGRIND_SECONDS=60]
The temp dir holds each flashload's log and JSON, the service's log,
commands.txt (every command run) and rss.csv (the samples).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import Client, wait_until  # noqa: E402

RSS_SHARE, RSS_SLACK_MB, FD_SLACK = 0.20, 8.0, 16
SAMPLE_EVERY = 5.0
DOWN_SECONDS = 1.0
# The cycle of restarts; "loss" alternates between kill9 and wipe.
CYCLE = ("term", "term", "loss")

# label, strategy, segments, rate/s, stock as a share of the units the rate
# asks for over the run (< 1: sells out part-way), flashload options.
# per-user limit: "hit" is set so that buyers reach it about half-way.
PRODUCTS = [
    ("lua-1", "lua", 1, 350, 2.0, "hit", ["--users", "2000", "--idempotency", "--retry", "0.05"]),
    ("lua-8", "lua", 8, 350, 0.5, "big", ["--quantity", "1-3"]),
    ("lock-1", "lock", 1, 200, 2.0, "big", []),
    ("lock-4", "lock", 4, 200, 0.6, "big", ["--quantity", "1-2", "--idempotency"]),
    ("db", "db", 1, 300, 2.0, "big", ["--quantity", "1-3", "--idempotency", "--retry", "0.05"]),
    # db-optimistic retries on every version conflict: ~100/s is about what
    # it sustains here next to the others (at 150/s its backlog grew).
    ("db-opt", "db-optimistic", 1, 80, 0.7, "big", []),
    ("local", "local", 1, 250, 2.0, "big", ["--zipf", "1.1"]),
]


def mean_qty(extra):
    if "--quantity" not in extra:
        return 1.0
    q = extra[extra.index("--quantity") + 1]
    lo, _, hi = q.partition("-")
    return (int(lo) + int(hi or lo)) / 2.0


def log(msg):
    print(msg, flush=True)


class SoakRedis(harness.Redis):
    """harness.Redis with AOF and appendfsync everysec, restartable in three
    ways on the same port and directory."""

    def __init__(self):
        super().__init__(persist=True)

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--save", "", "--logfile", os.path.join(self.dir, "redis.log"),
                "--appendonly", "yes", "--appendfsync", "everysec"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        harness._live.append(self.proc)
        wait_until(self._ping, 30, what="redis-server to answer")

    def restart_as(self, kind, down_s):
        if kind == "term":        # clean stop: the AOF is flushed, nothing lost
            self.proc.terminate()
        else:                     # kill9: at most the last second of writes lost
            self.proc.kill()
        self.proc.wait()
        if kind == "wipe":        # and no AOF at all: Redis comes back empty
            shutil.rmtree(os.path.join(self.dir, "appendonlydir"), ignore_errors=True)
        time.sleep(down_s)
        self.start()


class ServiceProc:
    """bin/flashsale, optionally under valgrind (same PID: valgrind execs its
    tool in place)."""

    def __init__(self, tmp, redis_url, args, valgrind=False):
        self.port = harness.free_port()
        self.db = os.path.join(tmp, "orders.db")
        self.log_path = os.path.join(tmp, "flashsale.log")
        self.vg_log = os.path.join(tmp, "valgrind.log") if valgrind else None
        cmd = []
        if valgrind:
            cmd = ["valgrind", "--error-exitcode=99", "--leak-check=full",
                   "--errors-for-leak-kinds=definite", "--show-leak-kinds=definite",
                   "--num-callers=40", "--fair-sched=yes", "--log-file=" + self.vg_log]
        cmd += [os.path.join(harness.BIN, "flashsale"), "--listen", "127.0.0.1:%d" % self.port,
                "--redis", redis_url, "--db", self.db] + args
        self.cmd = cmd
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        harness._live.append(self.proc)
        self.url = "http://127.0.0.1:%d" % self.port
        self.client = Client(self.port, timeout=30)
        wait_until(self._up, 180 if valgrind else 20, step=0.1, what="flashsale to listen")

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError("flashsale exited with %s" % self.proc.returncode)
        try:
            return self.client.get("/healthz").status in (200, 503)
        except OSError:
            self.client.close()
            return False

    def status(self):
        """(rss_kb, fds, threads), or None once the process is gone."""
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                st = f.read()
            fds = len(os.listdir("/proc/%d/fd" % self.proc.pid))
        except OSError:
            return None
        rss = int(re.search(r"VmRSS:\s+(\d+)", st).group(1))
        thr = int(re.search(r"Threads:\s+(\d+)", st).group(1))
        return rss, fds, thr

    def metrics(self):
        """Order outcomes summed over SKUs, and the stock rebuilds."""
        out = {}
        try:
            text = self.client.get("/metrics").raw
        except (OSError, harness.http.client.HTTPException):
            self.client.close()
            return out
        for m in re.finditer(r'^flashsale_orders_total\{[^}]*outcome="([a-z_]+)"\} (\d+)$', text,
                             re.M):
            out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
        m = re.search(r"^flashsale_stock_rebuilds_total (\d+)$", text, re.M)
        if m:
            out["rebuilds"] = int(m.group(1))
        m = re.search(r"^flashsale_sqlite_memory_bytes (\d+)$", text, re.M)
        if m:
            out["sqlite_mem"] = int(m.group(1))
        return out

    def stop(self, timeout):
        """SIGTERM; returns (exit code, seconds taken)."""
        self.client.close()
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return "killed after %ds" % timeout, time.monotonic() - t0
        self.log.close()
        return self.proc.returncode, time.monotonic() - t0


def db_sizes(path):
    """The SQLite file's and its WAL's sizes, for the progress line."""
    def size(p):
        try:
            return "%.0f MB" % (os.path.getsize(p) / 1048576.0)
        except OSError:
            return "-"
    return "%s, wal %s" % (size(path), size(path + "-wal"))


def mb(kb):
    return kb / 1024.0


def slope_mb_per_min(samples):
    """Least-squares slope of RSS over time, in MB per minute."""
    if len(samples) < 3:
        return 0.0
    xs = [s[0] for s in samples]
    ys = [mb(s[1]) for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 60.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def valgrind_summary(path):
    """The ERROR SUMMARY line, the LEAK SUMMARY block and any error stacks."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        return "no valgrind log: %s" % e, "", ""
    text = re.sub(r"^==\d+== ", "", text, flags=re.M)
    err = re.findall(r"^ERROR SUMMARY:.*$", text, re.M)
    leak = (re.search(r"^LEAK SUMMARY:\n(?:   .*\n)+", text, re.M) or
            re.search(r"^HEAP SUMMARY:\n(?:  .*\n)+(?:\n?All heap blocks were freed.*\n)?",
                      text, re.M))
    # Error reports are the paragraphs between the header and the summaries.
    body = text.split("HEAP SUMMARY:")[0]
    paras = [p for p in body.split("\n\n")[1:] if p.strip() and "Command:" not in p
             and not p.startswith("Parent PID")]
    definite = [p for p in text.split("\n\n") if "definitely lost in loss record" in p]
    return (err[-1] if err else "no ERROR SUMMARY line (did the service exit?)",
            leak.group(0).rstrip() if leak else "no HEAP SUMMARY in the valgrind log",
            "\n\n".join(paras + definite).strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float,
                    default=float(os.environ.get("SOAK_SECONDS", "0")) or None)
    ap.add_argument("--restart-every", type=float,
                    default=float(os.environ.get("SOAK_RESTART_EVERY", "0")) or None)
    ap.add_argument("--rate-scale", type=float,
                    default=float(os.environ.get("SOAK_RATE_SCALE", "0")) or None)
    ap.add_argument("--valgrind", action="store_true", help="the service under valgrind memcheck")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temp dir (kept on failure and under valgrind anyway)")
    o = ap.parse_args()
    vg = o.valgrind
    seconds = o.seconds or (60.0 if vg else 600.0)
    every = o.restart_every or (20.0 if vg else 60.0)
    scale = o.rate_scale or (0.04 if vg else 1.0)
    cycle = ("term", "loss") if vg else CYCLE
    quiet = max(15.0, min(30.0, seconds / 5))   # no restart this close to the end
    restarts_at = []
    t = every
    while t <= seconds - quiet:
        restarts_at.append(t)
        t += every
    warm = restarts_at[0] + 20.0 if restarts_at else seconds / 4   # see the docstring

    tmp = tempfile.mkdtemp(prefix="fs-soak-")
    failures = []
    warnings = []             # products that fell behind: the workdir is kept
    redis = service = None
    loads = []

    def on_term(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)

    try:
        redis = SoakRedis()
        # Under valgrind everything is ~20-50x slower: long timeouts, few threads.
        if vg:
            sargs = ["--redis-timeout-ms", "5000", "--pending-timeout-ms", "30000",
                     "--shutdown-grace-ms", "60000", "--lock-wait-ms", "10000",
                     "--lock-ttl-ms", "10000", "--db-busy-timeout-ms", "20000",
                     "--threads", "2", "--lock-workers", "4"]
        else:
            sargs = ["--redis-timeout-ms", "500", "--pending-timeout-ms", "3000"]
        service = ServiceProc(tmp, redis.url, sargs, valgrind=vg)
        with open(os.path.join(tmp, "commands.txt"), "a") as f:
            f.write(" ".join(service.cmd) + "\n")
        log("soak: %s%d s, restart Redis every %d s (%d restarts), workdir %s" %
            ("valgrind, " if vg else "", seconds, every, len(restarts_at), tmp))
        log("soak: redis %s (AOF, appendfsync everysec), flashsale pid %d on %s" %
            (redis.url, service.proc.pid, service.url))

        tag = "%x" % (int(time.time()) & 0xffffff)
        for label, strat, segs, rate, share, limit, extra in PRODUCTS:
            r = max(1.0, rate * scale)
            units = r * seconds * mean_qty(extra)
            stock = max(50, int(units * share))
            users = int(extra[extra.index("--users") + 1]) if "--users" in extra else 1000
            lim = max(2, int(units / users * 0.5)) if limit == "hit" else max(100, int(units))
            sku = "soak-%s-%s" % (tag, label)
            jpath = os.path.join(tmp, label + ".json")
            cmd = [os.path.join(harness.BIN, "flashload"), "run", "--target", service.url,
                   "--sku", sku, "--strategy", strat, "--segments", str(segs),
                   "--stock", str(stock), "--per-user-limit", str(lim),
                   "--rate", "%g" % r, "--duration", "%g" % seconds,
                   "--connections", "8" if vg else "32", "--threads", "1",
                   "--redis", redis.url, "--db", service.db, "--json", jpath, "--progress",
                   "--timeout", "60" if vg else "10",
                   "--settle-ms", "60000" if vg else "15000"] + extra
            with open(os.path.join(tmp, "commands.txt"), "a") as f:
                f.write(" ".join(cmd) + "\n")
            lf = open(os.path.join(tmp, label + ".log"), "w")
            p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
            harness._live.append(p)
            loads.append(dict(label=label, strategy=strat, segments=segs, rate=r, stock=stock,
                              limit=lim, sku=sku, json=jpath, proc=p, logf=lf, cmd=cmd))
            log("  %-7s %-14s segments %d  %4.0f/s  stock %8d  per-user limit %6d  %s" %
                (label, strat, segs, r, stock, lim, " ".join(extra)))
        t0 = time.monotonic()

        samples = []          # (t, rss_kb, fds, threads)
        restarts = []         # (t, kind)
        next_sample = t0 + SAMPLE_EVERY
        prev_m, prev_t = {}, t0
        losses = 0
        while True:
            now = time.monotonic()
            el = now - t0
            if restarts_at and el >= restarts_at[0]:
                restarts_at.pop(0)
                kind = cycle[len(restarts) % len(cycle)]
                if kind == "loss":
                    kind = ("kill9", "wipe")[losses % 2]
                    losses += 1
                ts = time.monotonic()
                redis.restart_as(kind, DOWN_SECONDS)
                restarts.append((el, kind))
                log("[%5.0fs] redis restart %d: %s (back after %.1f s)" %
                    (el, len(restarts), kind, time.monotonic() - ts))
            if service.proc.poll() is not None:
                failures.append("the service died (exit %s) at %.0f s" %
                                (service.proc.returncode, el))
                break
            early = [ld for ld in loads if ld["proc"].poll() is not None and el < seconds - 1]
            if early:
                failures.append("flashload %s exited early (%s); see %s" % (
                    early[0]["label"], early[0]["proc"].returncode,
                    os.path.join(tmp, early[0]["label"] + ".log")))
                break
            if now >= next_sample:
                next_sample += SAMPLE_EVERY
                st = service.status()
                if st:
                    samples.append((el,) + st)
                m = service.metrics()
                created = m.get("created", 0)
                dt = now - prev_t
                rate = (created - prev_m.get("created", 0)) / dt if prev_m and dt > 0 else 0
                if m:
                    prev_m, prev_t = m, now
                rss = "rss %6.1f MB" % mb(st[0]) if st else "rss ?"
                log("[%5.0fs] %s  fds %3d  threads %2d | redis restarts %d | orders %d (%.0f/s), "
                    "503 %d, rebuilds %d | sqlite %s, in memory %.1f MB" %
                    (el, rss, st[1] if st else -1, st[2] if st else -1, len(restarts), created,
                     rate, m.get("redis_unavailable", 0), m.get("rebuilds", 0),
                     db_sizes(service.db), m.get("sqlite_mem", 0) / 1048576.0))
            if el >= seconds:
                break
            time.sleep(0.2)

        # ------------------------------------------------------------ the end
        # The end sample is the last one with the load still fully on.
        under_load = [s for s in samples if warm <= s[0] <= seconds - SAMPLE_EVERY / 2]
        final_m = service.metrics() if service.proc.poll() is None else {}
        log("soak: load over; waiting for the %d verifiers" % len(loads))
        deadline = time.monotonic() + (1200 if vg else 600)
        next_line = time.monotonic() + SAMPLE_EVERY
        while any(ld["proc"].poll() is None for ld in loads):
            if time.monotonic() > deadline:
                failures.append("verifiers still running after the deadline")
                break
            time.sleep(0.5)
            left = [ld["label"] for ld in loads if ld["proc"].poll() is None]
            if left and time.monotonic() >= next_line:
                next_line += SAMPLE_EVERY
                log("[%5.0fs] verifying: %s" % (time.monotonic() - t0, ", ".join(left)))
        for ld in loads:
            if ld["proc"].poll() is None:
                ld["proc"].kill()
                ld["proc"].wait()
            ld["logf"].close()
            ld["rc"] = ld["proc"].returncode
            try:
                with open(ld["json"]) as f:
                    ld["res"] = json.load(f)
            except (OSError, ValueError):
                ld["res"] = None

        after = service.status() if service.proc.poll() is None else None
        if service.proc.poll() is None:
            rc_client = redis.client()
            try:
                wait_until(lambda: all(rc_client.hlen("fs:{%s}:pending" % ld["sku"]) == 0
                                       for ld in loads), 120 if vg else 30, step=0.5,
                           what="pending reservations to settle")
            except AssertionError as e:
                failures.append(str(e))
        audit = subprocess.run([os.path.join(harness.BIN, "flashsale"), "audit", "--redis",
                                redis.url, "--db", service.db] +
                               (["--pending-timeout-ms", "3000"] if not vg else []),
                               capture_output=True, text=True, timeout=300)
        audit_out = (audit.stdout + audit.stderr).strip()
        stop_rc, stop_s = service.stop(300 if vg else 60)

        # ---------------------------------------------------------- the table
        log("")
        log("%-7s %-14s %3s %6s %9s %9s %9s %8s %7s %6s %6s %7s %8s  %s" %
            ("product", "strategy", "seg", "rate/s", "initial", "sold", "available",
             "201s", "503s", "429s", "409s", "xport", "p99", "verdict"))
        total_500 = 0
        for ld in loads:
            j = ld["res"]
            if not j or "verdict" not in j:
                log("%-7s %-14s %3d  no result (flashload exit %s); see %s" %
                    (ld["label"], ld["strategy"], ld["segments"], ld["rc"],
                     os.path.join(tmp, ld["label"] + ".log")))
                failures.append("%s: no verdict (flashload exit %s)" % (ld["label"], ld["rc"]))
                continue
            v, stc = j["verdict"], j["status"]
            total_500 += stc.get("500", 0)
            verdict = "PASS" if v["pass"] else "FAIL"
            if not v["pass"]:
                verdict += ": " + "; ".join(x["what"] for x in v["violations"])
            if ld["rc"] != 0 or not v["pass"]:
                failures.append("%s: verifier %s (exit %s)" % (ld["label"], verdict, ld["rc"]))
            p99 = j["latency_us"]["p99"]
            log("%-7s %-14s %3d %6.0f %9d %9d %9d %8d %7d %6d %6d %7d %7.1fms  %s" %
                (ld["label"], ld["strategy"], ld["segments"], ld["rate"], v["initial"], v["sold"],
                 v["available"], stc.get("201", 0), stc.get("503", 0), stc.get("429", 0),
                 stc.get("409", 0), j["transport_errors"], p99 / 1000.0, verdict))
        log("")
        for ld in loads:
            j = ld["res"]
            if j:
                log("  %-7s answers %d (%.0f/s), oversold %d, lost %d, backlog %d, codes %s" %
                    (ld["label"], j["answered"], j["per_second"], j["verdict"]["oversold"]
                     if "verdict" in j else -1, j["verdict"]["lost"] if "verdict" in j else -1,
                     j["backlog"], json.dumps(j["codes"], sort_keys=True)))
        if total_500:
            failures.append("%d orders answered 500" % total_500)
        # Falling behind is not a verdict (the machine may be busy), but it is
        # what a slowdown over time looks like: said, not hidden.
        for ld in loads:
            j = ld["res"]
            if j and (j["backlog"] > 0.01 * ld["rate"] * seconds or
                      j["latency_us"]["p99"] > 2000000 * (10 if vg else 1)):
                log("  WARNING %s fell behind: %.0f/s answered of %.0f/s asked, %d never sent "
                    "in time, p99 %.1f s; see %s" %
                    (ld["label"], j["per_second"], ld["rate"], j["backlog"],
                     j["latency_us"]["p99"] / 1e6, os.path.join(tmp, ld["label"] + ".log")))
                warnings.append(ld["label"])

        kinds = {}
        for _, k in restarts:
            kinds[k] = kinds.get(k, 0) + 1
        log("")
        log("redis restarts  %d (%s); stock copies rebuilt: %s; orders created: %s, "
            "503 redis_unavailable: %s" %
            (len(restarts), ", ".join("%s %d" % kv for kv in sorted(kinds.items())) or "none",
             final_m.get("rebuilds", "?"), final_m.get("created", "?"),
             final_m.get("redis_unavailable", "?")))
        if samples:
            base = under_load[0] if under_load else samples[0]
            end = under_load[-1] if under_load else samples[-1]
            top = max(samples, key=lambda s: s[1])
            growth = end[1] - base[1]
            limit_kb = base[1] * RSS_SHARE + RSS_SLACK_MB * 1024
            ok = growth <= limit_kb
            log("service RSS     start %.1f MB (at %.0f s, after the warm-up), end %.1f MB "
                "(at %.0f s, under load), max %.1f MB (at %.0f s); growth %+.1f MB (%+.1f%%); "
                "trend after warm-up %+.3f MB/min; first sample %.1f MB (at %.0f s), "
                "after verification %s" %
                (mb(base[1]), base[0], mb(end[1]), end[0], mb(top[1]), top[0], mb(growth),
                 100.0 * growth / base[1], slope_mb_per_min(under_load), mb(samples[0][1]),
                 samples[0][0], "%.1f MB" % mb(after[0]) if after else "-"))
            log("                rule: end <= start + 20%% + 8 MB = %.1f MB: %s%s" %
                (mb(base[1] + limit_kb), "OK" if ok else "BROKEN",
                 " (not applied under valgrind)" if vg else ""))
            log("descriptors     start %d, end %d, max %d; threads start %d, end %d" %
                (base[2], end[2], max(s[2] for s in samples), base[3], end[3]))
            if not vg and not ok:
                failures.append("RSS grew by %.1f MB (%.0f%%) after the warm-up" %
                                (mb(growth), 100.0 * growth / base[1]))
            if not vg and end[2] > base[2] + FD_SLACK:
                failures.append("descriptors grew from %d to %d" % (base[2], end[2]))
            with open(os.path.join(tmp, "rss.csv"), "w") as f:
                f.write("seconds,rss_kb,fds,threads\n")
                for s in samples:
                    f.write("%.1f,%d,%d,%d\n" % s)
        log("audit           exit %d: %s" % (audit.returncode, audit_out.replace("\n", " | ")
                                              [:600]))
        if audit.returncode != 0:
            failures.append("audit: exit %d" % audit.returncode)
        log("SIGTERM         the service exited %s in %.1f s" % (stop_rc, stop_s))
        if stop_rc != 0:
            failures.append("the service exited %s on SIGTERM" % stop_rc)
        if vg:
            err, leak, stacks = valgrind_summary(service.vg_log)
            log("valgrind        %s" % err)
            log(leak)
            if stacks:
                log("valgrind reports:\n" + stacks)
            if not err.startswith("ERROR SUMMARY: 0 errors"):
                failures.append("valgrind: " + err)
        with open(service.log_path) as f:
            slog = f.read()
        lines = slog.splitlines()
        warns = [ln for ln in lines if " flashsale warn: " in ln]
        errs = [ln for ln in lines if " flashsale error: " in ln]
        log("service log     %d lines, %d warnings, %d errors (%s)" %
            (len(lines), len(warns), len(errs), service.log_path))
        kinds_seen = {}
        for ln in errs + warns:
            what = re.sub(r"[0-9a-f]{8,}|\d+", "N", ln.split(" ", 1)[1])
            kinds_seen[what] = kinds_seen.get(what, 0) + 1
        for what, n in sorted(kinds_seen.items(), key=lambda kv: -kv[1]):
            log("  %5d x %s" % (n, what[:200]))
    except KeyboardInterrupt as e:
        failures.append("interrupted (%s)" % e)
    finally:
        for ld in loads:
            p = ld["proc"]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if service and service.proc.poll() is None:
            service.proc.kill()
            service.proc.wait()
        if redis:
            redis.stop()
        harness.stop_all()
    log("")
    if failures:
        log("soak: FAIL (workdir kept: %s)" % tmp)
        for f in failures:
            log("  - " + f)
        return 1
    if o.keep or vg or warnings:
        log("soak: PASS (workdir kept: %s)" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        log("soak: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
