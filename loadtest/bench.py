#!/usr/bin/python3
"""bench.py: `make bench`: the service next to the gateway a team would
otherwise deploy, and next to the box's HTTP ceiling, measured side by side
in one run with one load generator. Four groups (--groups picks some):

orders    the order path with stock for everyone, wrk -t2 with
          loadtest/wrk_orders.lua (one SKU, a fresh buyer per order):
            flashsale lua         201 only once the order's row is committed
                                  (synchronous=FULL)
            flashsale lock x1/x8  the `lock` strategy, 1 and 8 segments
            gateway               the reference (loadtest/gateway/): nginx +
                                  Lua module + lua-resty-redis, one EVALSHA
                                  per order, nothing stored; 1 and 2 workers
            nginx return 200      the same nginx answering GET /ok
            libmicrohttpd hello   bin/mhdhello: the service's HTTP stack bare
          then flashload runs the three strategies once more and verifies
          the books (a figure from a service that oversold is no figure).
spike     the shape of a real sale: every run sells a fresh SKU of
          --spike-stock units (10,000) to wrk's buyers at each connection
          count, so most answers are 409 sold_out; answers/s of every kind,
          the service against the gateway (which marks a sold-out SKU in
          nginx shared memory), and whether each run sold exactly its units
          (201s counted by wrk, and the store: the service's `sold`, the
          gateway's Redis stock).
idle      the answers that touch no shared state: the service's GET /healthz
          against nginx return 200 (the better of 1 and 2 workers), a
          sold-out POST /v1/orders and GET /v1/products/{sku} against the
          service's own /healthz; a waiting room's answers to a buyer
          who must come back later (its ticket asked about, an order sent
          with it before its turn) and to one who asks for its place
          again (its ticket given back from the instance's memory): goals,
          >= 0.8 of /healthz; the gateway's sold-out and product answers
          beside them. Every load of this group runs a wrk Lua script (a
          request formatted per call, each status counted): wrk shares the
          two cores, and a POST through a script costs it more than a bare
          GET, which alone made a sold-out POST look 0.8x of /healthz.
overload  the closed-loop capacity of the service and of the gateway
          (flashload, the largest connection count, 201s/s), then an open
          loop (flashload --rate) at --overload-rates times each target's own
          capacity over --overload-connections (2,000) connections for
          --overload-seconds each: goodput (201s answered within 250 ms from
          their scheduled time), p99, and the answers by kind (201, 409, 503
          `overloaded` counted as shed, other errors, answers later than 1 s,
          no answer within --overload-timeout, never sent). The service's
          runs are verified by flashload (nothing lost).
quota     the same overload inside a container's CPU limit:
          loadtest/overload.sh --cpu-quota (--quota-cpus, 0.5) puts the
          service alone in a cgroup with that quota on the last CPU, Redis
          and flashload on the others, and measures the capacity and then
          --quota-factors (0.5,0.8,1,1.5,2) times it, --quota-reps times
          (3; --quick: 1); the table has each factor's medians, and so for
          the peer of ../shared/peers where it is there. Root only (a cgroup
          of its own); elsewhere the group says why it did not run.

Every target of a group runs ROUNDS times, the targets alternating, and each
figure is the median of its rounds: the machine is shared and noisy, and a
ratio of figures taken side by side is what holds. Ratios are printed against
the goals docs/performance.md states (the order path's, against the gateway
and the HTTP ceilings; the sale's: spike, static answers, overload), each
with "met" or "NOT met". A report,
bench.html (one self-contained file: the tables and an inline SVG chart of
goodput against offered load) and bench.json, is written to --out (the
working directory).

A benchmark, not a test: it fails only when something cannot run or a
verification fails (flashload's verdict, or a spike run that sold more than
its units).

Usage: bench.py BIN_DIR [SECONDS] [ROUNDS] [CONNECTIONS,...] [options]
       bench.py --help
"""
import argparse
import datetime
import html
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
HZ = os.sysconf("SC_CLK_TCK")
GROUPS = ("orders", "spike", "idle", "overload", "quota")


def free_port():
    """A free TCP port on 127.0.0.1 (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=30):
    """Waits until port accepts a connection; exits if proc ends or timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("bench: %s exited at start" % what)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("bench: %s did not start" % what)


class Procs:
    """Everything started here, stopped by pid at the end."""

    def __init__(self):
        self.procs = []

    def start(self, args, log):
        p = subprocess.Popen(args, stdout=log, stderr=log)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


class Out:
    """The printed lines, kept for the HTML report too."""

    def __init__(self):
        self.lines = []

    def __call__(self, s=""):
        print(s, flush=True)
        self.lines.append(s)


out = Out()


def cpu_ticks(pids):
    """utime + stime of pids and their children processes (nginx workers)."""
    total = 0
    family = set(pids)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(d) in family or int(fields[1]) in family:
                    total += int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):
                pass
    return total


def redis_calls(r):
    """Calls and microseconds Redis spent, over every command."""
    calls = usec = 0
    for name, s in r.info("commandstats").items():
        if name.startswith("cmdstat_"):
            calls += s["calls"]
            usec += s["usec"]
    return calls, usec


def parse_us(s):
    """wrk's "1.23ms" in microseconds; None if unreadable."""
    m = re.match(r"([\d.]+)(us|ms|s)$", s)
    if not m:
        return None
    return float(m.group(1)) * {"us": 1, "ms": 1000, "s": 1e6}[m.group(2)]


def wrk(url, conns, seconds, sku=None, scripted_get=False, body=None):
    """Runs wrk; returns (requests/s, p50 us, p99 us, statuses or None, non-2xx/3xx, errors).
    With sku, POSTs orders for it (wrk_orders.lua, which counts the statuses);
    scripted_get: GETs through the same script (WRK_GET), which costs wrk what a POST does;
    body: POSTs it to url through the script (WRK_BODY)."""
    args = ["wrk", "-t2", "-c%d" % conns, "-d%ds" % seconds, "--latency"]
    env = dict(os.environ)
    if body:
        args += ["-s", os.path.join(HERE, "wrk_orders.lua")]
        env["WRK_BODY"] = body
    elif sku:
        args += ["-s", os.path.join(HERE, "wrk_orders.lua")]
        env["WRK_SKU"] = sku
    elif scripted_get:
        args += ["-s", os.path.join(HERE, "wrk_orders.lua")]
        env["WRK_GET"] = "1"
    p = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 60,
                       env=env)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", p.stdout)
    p50 = re.search(r"^\s+50%\s+(\S+)", p.stdout, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", p.stdout, re.M)
    st = re.search(r"^STATUS (.*)$", p.stdout, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", p.stdout)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                     p.stdout)
    if not rps:
        sys.exit("bench: wrk gave no figure for %s:\n%s%s" % (url, p.stdout, p.stderr))
    statuses = dict(kv.split("=") for kv in st.group(1).split()) if st else None
    return (float(rps.group(1)), parse_us(p50.group(1)) if p50 else None,
            parse_us(p99.group(1)) if p99 else None, statuses,
            int(non2xx.group(1)) if non2xx else 0,
            sum(int(x) for x in errs.groups()) if errs else 0)


def post(url, body):
    """POSTs body as JSON: (status, the JSON answer)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def get_json(url):
    """GETs url: its JSON answer (raises on a non-2xx)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def flashload(bin_dir, args, timeout=900):
    """Runs flashload with --json; returns (its JSON, exit code)."""
    fd, out_path = tempfile.mkstemp(prefix="bench-", suffix=".json")
    os.close(fd)
    os.unlink(out_path)
    p = subprocess.run([os.path.join(bin_dir, "flashload")] + [str(a) for a in args] +
                       ["--json", out_path, "--quiet"], capture_output=True, text=True,
                       timeout=timeout)
    if not os.path.exists(out_path):
        sys.exit("bench: flashload failed (%d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
    with open(out_path) as f:
        j = json.load(f)
    os.unlink(out_path)
    return j, p.returncode


def fmt_us(us):
    """Microseconds as "812us", "1.25ms" or "2.10s"; None as "-"."""
    if us is None:
        return "-"
    if us < 1000:
        return "%dus" % us
    if us < 1000000:
        return "%.2fms" % (us / 1000.0)
    return "%.2fs" % (us / 1e6)


class Target:
    """One row of a group, run once per round. kind says what its answers
    must be: orders (201), spike (a fresh SKU each run: 201 and 409 only, and
    exactly its units sold), soldout (409), get (2xx), turn (429: a waiting
    room's not_your_turn), ticket (200: a place given back); body: what
    each POST sends (the script's own order otherwise)."""

    def __init__(self, group, name, url, conns, pids, kind, sku=None, fresh=None, sold=None,
                 body=None):
        self.group, self.name, self.url, self.conns, self.pids = group, name, url, conns, pids
        self.kind, self.sku, self.fresh, self.sold = kind, sku, fresh, sold
        self.body = body
        self.runs = []                 # dicts: rps p50 p99 cpu redis calls [+ spike fields]

    def med(self, key):
        """The median of key over the runs that have it; None if none."""
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None


def start_gateway(procs, log, tmp, redis_port, workers):
    """The gateway with workers nginx workers on a free port: (process, port)."""
    port = free_port()
    run = os.path.join(tmp, "gateway-%d" % workers)
    os.makedirs(run)
    gw = os.path.join(HERE, "gateway")
    with open(os.path.join(gw, "nginx.conf.in")) as f:
        conf = f.read()
    for k, v in (("WORKERS", workers), ("PORT", port), ("REDIS_PORT", redis_port),
                 ("RUN", run), ("DIR", gw)):
        conf = conf.replace("@%s@" % k, str(v))
    with open(os.path.join(run, "nginx.conf"), "w") as f:
        f.write(conf)
    p = procs.start(["nginx", "-p", run, "-c", os.path.join(run, "nginx.conf"),
                     "-e", os.path.join(run, "error.log")], log)
    wait_port(port, p, "nginx (gateway)")
    return p, port


def measure(t, seconds, r, redis_pid):
    """One wrk run of t, its CPU and Redis cost, and its answers checked (exits if wrong)."""
    sku = t.fresh() if t.fresh else t.sku
    c0, rc0 = cpu_ticks(t.pids), redis_calls(r)
    r0 = cpu_ticks([redis_pid])
    # The idle group compares GETs with a POST: every one of its loads goes
    # through a Lua script, so that wrk's own work per request (two cores
    # shared with the target) is the same and the ratios are the targets'.
    rps, p50, p99, statuses, non2xx, errors = wrk(t.url, t.conns, seconds,
                                                  sku if t.kind != "get" else None,
                                                  scripted_get=t.group == "idle", body=t.body)
    c1, rc1, r1 = cpu_ticks(t.pids), redis_calls(r), cpu_ticks([redis_pid])
    n = rps * seconds
    store = t.kind != "get"
    run = {"rps": rps, "p50": p50, "p99": p99,
           "cpu": (c1 - c0) * 1e6 / HZ / n if n else None,
           "redis": (r1 - r0) * 1e6 / HZ / n if n and store else None,
           "calls": (rc1[0] - rc0[0]) / n if n and store else None}
    extra = ""
    if t.kind == "get":
        if n == 0 or non2xx or errors:
            sys.exit("bench: %s did not answer 2xx (%d others, %d socket errors)"
                     % (t.name, non2xx, errors))
    else:
        answered = sum(int(v) for k, v in statuses.items() if k != "errors")
        want = {"orders": "201", "soldout": "409", "turn": "429", "ticket": "200"}.get(t.kind)
        if want and (answered == 0 or int(statuses.get(want, 0)) < 0.99 * answered
                     or int(statuses["errors"]) > 0):
            sys.exit("bench: %s did not answer %s (answers: %s)" % (t.name, want, statuses))
        if t.kind == "spike":
            run.update(spike_check(t, sku, statuses))
            extra = "  sold %s%s" % (run["sold"], "  (" + run["note"] + ")" if run["note"] else "")
    t.runs.append(run)
    out("  %-40s c=%-4d %9.0f/s  p99 %s%s" % (t.name, t.conns, rps, fmt_us(p99), extra))


def spike_check(t, sku, statuses):
    """A spike run's books: the 201s wrk got, what the store says was sold,
    and a note when either is not exactly the SKU's units or when anything
    other than 201 and 409 was answered."""
    got201 = int(statuses.get("201", 0))
    sold, left = t.sold(sku)
    units = t.units
    notes = []
    if sold != units:
        notes.append("sold %d of %d units, %d left" % (sold, units, left))
    if got201 != sold:
        notes.append("%d 201s for %d units sold" % (got201, sold))
    others = {k: v for k, v in statuses.items() if k not in ("201", "409") and int(v) > 0}
    if others:
        notes.append("answered other than 201/409: %s" %
                     " ".join("%s=%s" % kv for kv in sorted(others.items())))
    return {"sold": sold, "got201": got201, "exact": sold == units and got201 == units,
            "oversold": sold > units or got201 > units, "note": "; ".join(notes)}


def run_rounds(targets, rounds, seconds, r, redis_pid, what):
    """Every target once per round, alternating."""
    out("%s: %d targets x %d rounds, %d s each, wrk -t2; %d CPUs shared by everything"
        % (what, len(targets), rounds, seconds, os.cpu_count()))
    for i in range(rounds):
        out("round %d of %d" % (i + 1, rounds))
        for t in targets:
            measure(t, seconds, r, redis_pid)


def parse_args(argv):
    """The command line, with --quick and LOAD_BENCH_QUICK applied."""
    ap = argparse.ArgumentParser(
        prog="bench.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0],
        epilog="Defaults: about 7 minutes on two cores. --quick: about 2.")
    ap.add_argument("bin_dir")
    ap.add_argument("seconds", nargs="?", type=int, default=None,
                    help="seconds per wrk run (4; --quick: 2)")
    ap.add_argument("rounds", nargs="?", type=int, default=None,
                    help="rounds of every group but overload (3; --quick: 1)")
    ap.add_argument("connections_pos", nargs="?", metavar="connections",
                    help="connection counts of the order and spike rows (64,256)")
    ap.add_argument("--connections", help="the same as the positional")
    ap.add_argument("--quick", action="store_true",
                    help="2 s runs, 1 round, overload runs of 4 s (env LOAD_BENCH_QUICK=1)")
    ap.add_argument("--groups", default=",".join(GROUPS),
                    help="which groups, comma-separated (%(default)s)")
    ap.add_argument("--spike-stock", type=int, default=10000,
                    help="units of each spike run's fresh SKU (%(default)s)")
    ap.add_argument("--overload-rates", default="0.5,1,1.5,2",
                    help="offered loads, times each target's capacity (%(default)s)")
    ap.add_argument("--overload-connections", type=int, default=2000,
                    help="open-loop connections (%(default)s)")
    ap.add_argument("--overload-seconds", type=float, default=None,
                    help="seconds per open-loop run (10; --quick: 4)")
    ap.add_argument("--overload-timeout", type=float, default=3,
                    help="seconds after which flashload gives an answer up (%(default)s)")
    ap.add_argument("--quota-cpus", type=float, default=0.5,
                    help="the quota group's CPU quota, in CPUs (%(default)s)")
    ap.add_argument("--quota-factors", default="0.5,0.8,1,1.5,2",
                    help="the quota group's offered loads, times its capacity (%(default)s)")
    ap.add_argument("--quota-reps", type=int, default=None,
                    help="runs of each quota factor; medians are shown (3; --quick: 1)")
    ap.add_argument("--out", default=".", help="where bench.html and bench.json go (.)")
    a = ap.parse_args(argv)
    if os.environ.get("LOAD_BENCH_QUICK", "") not in ("", "0"):
        a.quick = True
    if a.seconds is None:
        a.seconds = 2 if a.quick else 4
    if a.rounds is None:
        a.rounds = 1 if a.quick else 3
    if a.overload_seconds is None:
        a.overload_seconds = 4 if a.quick else 10
    if a.quota_reps is None:
        a.quota_reps = 1 if a.quick else 3
    if a.quota_reps < 1 or not 0 < a.quota_cpus <= 64:
        ap.error("--quota-reps must be positive, --quota-cpus in (0, 64]")
    a.conn_list = [int(c) for c in (a.connections or a.connections_pos or "64,256").split(",")]
    a.groups = [g for g in a.groups.split(",") if g]
    for g in a.groups:
        if g not in GROUPS:
            ap.error("unknown group %s (%s)" % (g, ", ".join(GROUPS)))
    a.rates = [float(x) for x in a.overload_rates.split(",")]
    if a.seconds < 1 or a.rounds < 1 or a.spike_stock < 1 or a.overload_connections < 1 \
            or a.overload_seconds <= 0 or not a.rates or min(a.rates) <= 0:
        ap.error("seconds, rounds, stock, connections and rates must be positive")
    return a


def main():
    """Starts the processes, runs the groups asked for, reports; stops everything by PID."""
    a = parse_args(sys.argv[1:])
    bin_dir, seconds, rounds, conn_list = a.bin_dir, a.seconds, a.rounds, a.conn_list
    low = conn_list[0]
    import redis
    tmp = tempfile.mkdtemp(prefix="fs-bench-")
    procs = Procs()
    log = open(os.path.join(tmp, "bench.log"), "w")
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    res = {"targets": [], "verified": [], "overload": None, "quota": None}
    try:
        rport = free_port()
        redis_p = procs.start(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", tmp], log)
        wait_port(rport, redis_p, "redis-server")
        r = redis.Redis(host="127.0.0.1", port=rport, decode_responses=True)
        redis_url = "redis://127.0.0.1:%d/0" % rport
        sport = free_port()
        db = os.path.join(tmp, "orders.db")
        svc = procs.start([os.path.join(bin_dir, "flashsale"), "--listen",
                           "127.0.0.1:%d" % sport, "--redis", redis_url, "--db", db], log)
        wait_port(sport, svc, "flashsale")
        base = "http://127.0.0.1:%d" % sport
        for sku, strategy, segs in (("b-lua", "lua", 1), ("b-lock1", "lock", 1),
                                    ("b-lock8", "lock", 8)):
            post(base + "/v1/products", {"sku": sku, "stock": 10 ** 9, "strategy": strategy,
                                         "segments": segs})
        gw1, gport1 = start_gateway(procs, log, tmp, rport, 1)
        gw2, gport2 = start_gateway(procs, log, tmp, rport, 2)
        r.set("gw:{b-gw}:stock", 10 ** 12)
        hport = free_port()
        hello = procs.start([os.path.join(bin_dir, "mhdhello"), "--listen",
                             "127.0.0.1:%d" % hport, "--threads", "2"], log)
        wait_port(hport, hello, "mhdhello")
        gws = ((gw1, gport1, "gateway, 1 nginx worker"), (gw2, gport2, "gateway, 2 nginx workers"))
        env = {"bin": bin_dir, "base": base, "r": r, "redis_url": redis_url, "db": db,
               "svc": svc, "gws": gws, "redis_pid": redis_p.pid, "hport": hport, "hello": hello}

        if "orders" in a.groups:
            res["targets"] += group_orders(a, env)
            out("verifying the service's books with flashload (%d s per strategy)" % seconds)
            for name, strategy, segs in (("lua", "lua", 1), ("lock x1", "lock", 1),
                                         ("lock x8", "lock", 8)):
                j, _ = flashload(bin_dir, ["--target", base, "--redis", redis_url, "--db", db,
                                           "--stock", 10 ** 7, "--users", 100000,
                                           "--strategy", strategy, "--segments", segs,
                                           "--connections", low, "--duration", seconds])
                res["verified"].append((name, j["per_second"], j["verdict"]["pass"]))
        if "spike" in a.groups:
            res["targets"] += group_spike(a, env)
        if "idle" in a.groups:
            res["targets"] += group_idle(a, env)
        if "overload" in a.groups:
            res["overload"] = group_overload(a, env)
        if "quota" in a.groups:
            res["quota"] = group_quota(a, bin_dir)
    finally:
        procs.stop_all()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    res["wall_s"] = time.monotonic() - t_start
    res["started"] = started.strftime("%Y-%m-%d %H:%M UTC")
    goals = report(a, res)
    write_report(a, res, goals)
    failed = [n for n, _, ok in res["verified"] if not ok]
    if res["overload"]:
        failed += ["overload %s x%g" % (o["target"], o["factor"]) for o in res["overload"]["runs"]
                   if o["verified"] is False]
    if res["quota"]:
        failed += ["quota %s x%g" % (q["target"], q["factor"]) for q in res["quota"]["rows"]
                   if q["verified"] is False]
    failed += ["spike %s c=%d" % (t.name, t.conns) for t in res["targets"]
               if t.kind == "spike" and any(x["oversold"] for x in t.runs)]
    if failed:
        out("bench: verification failed: %s" % ", ".join(failed))
        sys.exit(1)


def group_orders(a, env):
    """The order rows: stock for everyone."""
    orders = lambda port: "http://127.0.0.1:%d/v1/orders" % port   # noqa: E731
    svc, low = env["svc"], a.conn_list[0]
    sport = int(env["base"].rsplit(":", 1)[1])
    (gw1, gport1, _), (gw2, gport2, _) = env["gws"]
    ts = []
    for c in a.conn_list:
        ts.append(Target("orders", "flashsale lua", orders(sport), c, [svc.pid], "orders", "b-lua"))
    ts.append(Target("orders", "flashsale lock x1", orders(sport), low, [svc.pid], "orders",
                     "b-lock1"))
    ts.append(Target("orders", "flashsale lock x8", orders(sport), low, [svc.pid], "orders",
                     "b-lock8"))
    for c in a.conn_list:
        ts.append(Target("orders", "gateway, 1 nginx worker", orders(gport1), c, [gw1.pid],
                         "orders", "b-gw"))
        ts.append(Target("orders", "gateway, 2 nginx workers", orders(gport2), c, [gw2.pid],
                         "orders", "b-gw"))
    ts.append(Target("orders", "nginx return 200", "http://127.0.0.1:%d/ok" % gport2, low,
                     [gw2.pid], "get"))
    ts.append(Target("orders", "libmicrohttpd hello", "http://127.0.0.1:%d/" % env["hport"], low,
                     [env["hello"].pid], "get"))
    run_rounds(ts, a.rounds, a.seconds, env["r"], env["redis_pid"], "orders")
    return ts


def group_spike(a, env):
    """A fresh SKU of a.spike_stock units per run, service and gateway."""
    base, r, units = env["base"], env["r"], a.spike_stock
    seq = [0]

    def name(who):
        seq[0] += 1
        return "spike-%s-%d-%d" % (who, os.getpid(), seq[0])

    def svc_fresh():
        sku = name("svc")
        st, body = post(base + "/v1/products", {"sku": sku, "stock": units, "strategy": "lua"})
        if st != 201:
            sys.exit("bench: could not create %s: %s %s" % (sku, st, body))
        return sku

    def svc_sold(sku):
        p = get_json("%s/v1/products/%s" % (base, sku))
        return p["sold"], p["stock_available"]

    def gw_fresh():
        sku = name("gw")
        r.set("gw:{%s}:stock" % sku, units)
        return sku

    def gw_sold(sku):
        left = int(r.get("gw:{%s}:stock" % sku))
        return units - left, left

    ts = []
    for c in a.conn_list:
        ts.append(Target("spike", "flashsale lua", base + "/v1/orders", c, [env["svc"].pid],
                         "spike", fresh=svc_fresh, sold=svc_sold))
        for p, port, label in env["gws"]:
            ts.append(Target("spike", label, "http://127.0.0.1:%d/v1/orders" % port, c, [p.pid],
                             "spike", fresh=gw_fresh, sold=gw_sold))
    for t in ts:
        t.units = units
    run_rounds(ts, a.rounds, a.seconds, r, env["redis_pid"],
               "spike (a fresh SKU of %d units per run)" % units)
    return ts


def group_idle(a, env):
    """The answers that touch no shared state, at the first connection count."""
    base, r, low, svc = env["base"], env["r"], a.conn_list[0], env["svc"]
    # A sold-out product (its one unit bought) and a product page, for each.
    post(base + "/v1/products", {"sku": "b-gone", "stock": 1, "strategy": "lua"})
    st, body = post(base + "/v1/orders", {"sku": "b-gone", "user_id": "first", "quantity": 1})
    if st != 201:
        sys.exit("bench: could not buy b-gone's unit: %s %s" % (st, body))
    post(base + "/v1/products", {"sku": "b-page", "stock": 1000, "strategy": "lua"})
    r.set("gw:{b-gw-gone}:stock", 0)
    r.set("gw:{b-gw-page}:stock", 1000)
    ts = [Target("idle", "flashsale GET /healthz", base + "/healthz", low, [svc.pid], "get")]
    for p, port, label in env["gws"]:
        ts.append(Target("idle", "nginx return 200, %s" % label.split(", ")[1],
                         "http://127.0.0.1:%d/ok" % port, low, [p.pid], "get"))
    ts.append(Target("idle", "flashsale sold-out POST /v1/orders", base + "/v1/orders", low,
                     [svc.pid], "soldout", "b-gone"))
    ts.append(Target("idle", "flashsale GET /v1/products/{sku}", base + "/v1/products/b-page",
                     low, [svc.pid], "get"))
    ts += room_targets(base, low, svc)
    p, port, label = env["gws"][1]
    ts.append(Target("idle", "%s: sold-out POST" % label, "http://127.0.0.1:%d/v1/orders" % port,
                     low, [p.pid], "soldout", "b-gw-gone"))
    ts.append(Target("idle", "%s: GET product" % label,
                     "http://127.0.0.1:%d/v1/products/b-gw-page" % port, low, [p.pid], "get"))
    run_rounds(ts, a.rounds, a.seconds, r, env["redis_pid"],
               "answers that touch no shared state")
    return ts


def room_targets(base, conns, svc):
    """A waiting room's answers to a buyer who must come back later, from
    the instance's memory: a ticket asked about and an order sent with it,
    both before its turn; and a place asked for again (its ticket given
    back from the places the instance knows). The room admits 1 order
    a second, and the ticket is the 600th place: its turn is minutes away,
    past this group's runs (an order in its turn would answer 201, and the
    run would stop on it)."""
    st, p = post(base + "/v1/products", {"sku": "b-room", "stock": 10 ** 6, "strategy": "lua",
                                         "waiting_room": {"turn_seconds": 3600, "rate": 1}})
    if st != 201:
        sys.exit("bench: could not create b-room: %s %s" % (st, p))
    for i in range(600):
        st, t = post(base + "/v1/products/b-room/tickets", {"user_id": "w%d" % i})
        if st != 201:
            sys.exit("bench: could not take b-room's place %d: %s %s" % (i, st, t))
    if t.get("state") != "waiting":
        sys.exit("bench: b-room's 600th place is not waiting: %s" % t)
    order = json.dumps({"sku": "b-room", "user_id": "w599", "quantity": 1,
                        "ticket": t["ticket"]})
    return [Target("idle", "flashsale room: GET a waiting ticket",
                   base + "/v1/products/b-room/tickets/" + t["ticket"], conns, [svc.pid], "get"),
            Target("idle", "flashsale room: order before its turn",
                   base + "/v1/orders?wait_ms=0", conns, [svc.pid], "turn", "b-room",
                   body=order),
            Target("idle", "flashsale room: a place asked again",
                   base + "/v1/products/b-room/tickets", conns, [svc.pid], "ticket", "b-room",
                   body=json.dumps({"user_id": "w599"}))]


def overload_row(j, rc, target, factor, rate, capacity, seconds, verified):
    """One open-loop run's figures from flashload's JSON. Shed: 503
    `overloaded` (flashload's own count, or its error code on a flashload
    that does not count them)."""
    status = {int(k): v for k, v in j.get("status", {}).items()}
    codes = j.get("codes", {})
    shed = j["shed"] if "shed" in j else codes.get("overloaded", 0)
    good = j["goodput"]["created"] if "goodput" in j else None
    late = j["late"]["answers"] if "late" in j else None
    s5xx = sum(v for k, v in status.items() if k >= 500)
    others = sum(v for k, v in status.items() if k not in (201, 409) and k < 500)
    row = {"target": target, "factor": factor, "offered": rate, "capacity": capacity,
           "seconds": seconds, "answered": j["answered"], "201": status.get(201, 0),
           "409": status.get(409, 0), "shed": shed, "5xx": s5xx - shed, "other": others,
           "good": good, "goodput": good / seconds if good is not None else None,
           "late": late, "no_answer": j["transport_errors"], "unsent": j["backlog"],
           "p50": j["latency_us"]["p50"], "p99": j["latency_us"]["p99"],
           "max": j["latency_us"]["max"], "max_open": j.get("max_open"),
           "verified": verified}
    row["within_1s"] = (late == 0 and row["no_answer"] == 0 and row["unsent"] == 0
                        if late is not None else None)
    return row


def group_overload(a, env):
    """Closed-loop capacity, then the open loop at multiples of it."""
    bin_dir, base, r = env["bin"], env["base"], env["r"]
    capc = max(a.conn_list)
    secs = a.overload_seconds
    seq = [0]

    def gw_sku():
        seq[0] += 1
        sku = "over-gw-%d-%d" % (os.getpid(), seq[0])
        r.set("gw:{%s}:stock" % sku, 10 ** 12)
        return sku

    def svc_args():
        return ["--target", base, "--strategy", "lua", "--stock", 10 ** 8, "--users", 100000]

    def gw_args(port):
        return ["--target", "http://127.0.0.1:%d" % port, "--no-create", "--sku", gw_sku(),
                "--users", 100000, "--no-verify"]

    out("overload: closed-loop capacity first (flashload, %d connections, %d s, 201s/s)"
        % (capc, a.seconds))
    caps = {}
    j, _ = flashload(bin_dir, svc_args() + ["--no-verify", "--connections", capc,
                                            "--duration", a.seconds])
    caps["flashsale lua"] = j["status"].get("201", 0) / j["seconds"]
    for p, port, label in env["gws"]:
        j, _ = flashload(bin_dir, gw_args(port) + ["--connections", capc, "--duration", a.seconds])
        caps[label] = j["status"].get("201", 0) / j["seconds"]
    for k, v in caps.items():
        out("  %-40s c=%-4d %9.0f 201s/s" % (k, capc, v))
    gw_label = max((g for g in caps if g.startswith("gateway")), key=lambda g: caps[g])
    gw_port = [port for _, port, label in env["gws"] if label == gw_label][0]
    out("overload: open loop, %d connections, %g s per rate, answers given up after %g s; "
        "the gateway: %s" % (a.overload_connections, secs, a.overload_timeout, gw_label))
    common = ["--connections", a.overload_connections, "--duration", secs, "--timeout",
              a.overload_timeout, "--goodput-ms", 250, "--late-ms", 1000]
    runs = []
    bound = secs + a.overload_timeout + 120
    for f in a.rates:
        for target in ("flashsale lua", gw_label):
            rate = max(1, round(f * caps[target]))
            if target == "flashsale lua":
                j, rc = flashload(bin_dir, svc_args() + ["--redis", env["redis_url"], "--db",
                                                        env["db"], "--rate", rate] + common,
                                  timeout=bound)
                verified = j.get("verdict", {}).get("pass")
            else:
                j, rc = flashload(bin_dir, gw_args(gw_port) + ["--rate", rate] + common,
                                  timeout=bound)
                verified = None
            row = overload_row(j, rc, target, f, rate, caps[target], secs, verified)
            runs.append(row)
            out("  %-24s x%-4g %7d/s offered: goodput %s/s, p99 %s, 201 %d, 409 %d, shed %d, "
                "later than 1 s %s, no answer %d, unsent %d%s"
                % (target, f, rate, "%.0f" % row["goodput"] if row["goodput"] is not None else "?",
                   fmt_us(row["p99"]), row["201"], row["409"], row["shed"],
                   row["late"] if row["late"] is not None else "?", row["no_answer"],
                   row["unsent"], {True: ", verifier PASS", False: ", verifier FAIL",
                                   None: ""}[verified]))
    return {"capacity": caps, "capacity_connections": capc, "gateway": gw_label,
            "connections": a.overload_connections, "seconds": secs,
            "timeout": a.overload_timeout, "runs": runs}


QUOTA_LINE = re.compile(
    r"^ovl-(svc|peer)-(\d+)-(\S+)\s+capacity\s+(\d+)/s\s+offered\s+(\d+)/s \(x[\d.]+\)\s+"
    r"goodput\s+(\d+)/s = [\d.]+ of capacity\s+201 (\d+)\s+shed (\d+)\s+late>1s (\d+)\s+"
    r"p99 (\d+) ms\s+backlog (\d+)\s+transport errors (\d+)\s+(.*)$", re.M)


def group_quota(a, bin_dir):
    """overload.sh --cpu-quota: each factor's runs, and their medians per target; or
    {"skipped": why}."""
    factors = [float(x) for x in a.quota_factors.split(",") if x]
    if os.geteuid() != 0:
        out("quota: not run: needs root (a cgroup of its own)")
        return {"skipped": "needs root"}
    cmd = [os.path.join(HERE, "overload.sh"), "--cpu-quota", "%g" % a.quota_cpus,
           "--reps", str(a.quota_reps), "--factors", " ".join("%g" % f for f in factors),
           "--dur", "%g" % a.overload_seconds, "--cap-dur", str(a.seconds),
           "--flashsale", os.path.join(bin_dir, "flashsale")]
    out("quota: %s (each factor %d time(s), medians)" % (" ".join(cmd[1:]), a.quota_reps))
    bound = (a.overload_seconds + a.seconds + 30) * len(factors) * a.quota_reps * 2 + 120
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=bound)
    except subprocess.TimeoutExpired:
        out("quota: overload.sh did not end within %d s" % bound)
        return {"skipped": "timed out"}
    if p.returncode != 0 and not QUOTA_LINE.search(p.stdout):
        why = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        out("quota: not run: %s" % why)
        return {"skipped": why}
    runs = []
    for m in QUOTA_LINE.finditer(p.stdout):
        who, rep, f, cap, offered, good, c201, shed, late, p99, backlog, terr, verdict = m.groups()
        runs.append({"target": "flashsale lua" if who == "svc" else "peer", "rep": int(rep),
                     "factor": float(f), "capacity": int(cap), "offered": int(offered),
                     "goodput": int(good), "201": int(c201), "shed": int(shed),
                     "late": int(late), "p99_ms": int(p99), "unsent": int(backlog),
                     "transport_errors": int(terr),
                     "verified": True if "PASS" in verdict else False if "FAIL" in verdict
                     else None})
    rows = []
    for target in ("flashsale lua", "peer"):
        for f in factors:
            rs = [r for r in runs if r["target"] == target and r["factor"] == f]
            if not rs:
                continue
            med = lambda k: statistics.median(r[k] for r in rs)
            rows.append({"target": target, "factor": f, "runs": len(rs),
                         "capacity": med("capacity"), "offered": med("offered"),
                         "goodput_of_cap": statistics.median(r["goodput"] / r["capacity"]
                                                             for r in rs),
                         "shed_share": statistics.median(r["shed"] / max(1, r["offered"] *
                                                         a.overload_seconds) for r in rs),
                         "shed": med("shed"), "late": max(r["late"] for r in rs),
                         "unsent": max(r["unsent"] for r in rs), "p99_ms": med("p99_ms"),
                         "verified": None if all(r["verified"] is None for r in rs)
                         else all(r["verified"] for r in rs)})
    return {"cpus": a.quota_cpus, "seconds": a.overload_seconds, "reps": a.quota_reps,
            "runs": runs, "rows": rows}


def find(targets, group, name, c):
    """The target of group named name at c connections, or None."""
    for t in targets:
        if t.group == group and t.name == name and t.conns == c:
            return t
    return None


def report(a, res):
    """Prints the tables and the ratios; returns the goals as
    (label, value text, goal text, met or None)."""
    targets, conn_list, low, rounds = res["targets"], a.conn_list, a.conn_list[0], a.rounds
    goals = []

    def goal(label, value, want, fmt="%.2f"):
        met = value is not None and value >= want
        goals.append((label, fmt % value if value is not None else "-", ">= %.2f" % want, met))
        out("  %-44s %8s   [>= %.2f: %s]" % (label, fmt % value if value is not None else "-",
                                             want, "met" if met else "NOT met"))

    def info(label, value):
        goals.append((label, "%.2f" % value, "", None))
        out("  %-44s %8.2f" % (label, value))

    def best_gw(group, c):
        vals = [find(targets, group, n, c).med("rps") for n in
                ("gateway, 1 nginx worker", "gateway, 2 nginx workers")]
        return max(vals)

    out()
    if targets:
        out("%-40s %5s %10s %9s %9s %10s %10s %8s" % (
            "target", "conns", "per second", "p50", "p99", "CPU/answer", "Redis/ans",
            "calls/ans"))
    group = None
    for t in targets:
        if t.group != group:
            group = t.group
            out("-- %s" % {"orders": "orders with stock for everyone",
                           "spike": "spike: a fresh SKU of %d units per run (answers of every "
                                    "kind)" % a.spike_stock,
                           "idle": "answers that touch no shared state"}[group])
        cpu, red, calls = t.med("cpu"), t.med("redis"), t.med("calls")
        out("%-40s %5d %10.0f %9s %9s %10s %10s %8s" % (
            t.name, t.conns, t.med("rps"), fmt_us(t.med("p50")), fmt_us(t.med("p99")),
            "%.1fus" % cpu if cpu is not None else "-",
            "%.1fus" % red if red is not None else "-",
            "%.2f" % calls if calls is not None else "-"))
    if targets:
        out("(medians of %d rounds; CPU/answer: the target's own processes; Redis/answer: CPU of"
            " redis-server; calls/answer from INFO commandstats)" % rounds)

    if "orders" in a.groups:
        out("\nratios (the order path's goals in brackets)")
        for c in conn_list:
            goal("lua / best gateway, c=%d" % c,
                 find(targets, "orders", "flashsale lua", c).med("rps") / best_gw("orders", c), 1.3)
        lua_t = find(targets, "orders", "flashsale lua", low)
        goal("lua / nginx return 200, c=%d" % low,
             lua_t.med("rps") / find(targets, "orders", "nginx return 200", low).med("rps"), 0.4)
        p99 = lua_t.med("p99")
        met = p99 is not None and p99 <= 5000
        goals.append(("lua p99, c=%d" % low, fmt_us(p99), "<= 5ms", met))
        out("  %-44s %8s   [<= 5ms: %s]" % ("lua p99, c=%d" % low, fmt_us(p99),
                                            "met" if met else "NOT met"))
        l1 = find(targets, "orders", "flashsale lock x1", low).med("rps")
        l8 = find(targets, "orders", "flashsale lock x8", low).med("rps")
        goal("lock x8 / lock x1", l8 / l1, 5.0)
        goal("lock x1 / lua", l1 / lua_t.med("rps"), 0.25)
        info("lua / libmicrohttpd hello",
             lua_t.med("rps") / find(targets, "orders", "libmicrohttpd hello", low).med("rps"))
        out("\nverified by flashload (sold + remaining == initial, one row per 201, no oversell):")
        for name, rate, ok in res["verified"]:
            out("  %-10s %9.0f/s  %s" % (name, rate, "PASS" if ok else "FAIL"))

    if "spike" in a.groups or "idle" in a.groups:
        out("\nratios (the sale's goals in brackets)")
    if "spike" in a.groups:
        for c in conn_list:
            goal("spike: service / best gateway, c=%d" % c,
                 find(targets, "spike", "flashsale lua", c).med("rps") / best_gw("spike", c), 1.2)
        spikes = [t for t in targets if t.group == "spike"]
        inexact = ["%s c=%d run %d: %s" % (t.name, t.conns, i + 1, x["note"])
                   for t in spikes for i, x in enumerate(t.runs) if not x["exact"]]
        nruns = sum(len(t.runs) for t in spikes)
        label = "spike: every run sold exactly %d units" % a.spike_stock
        text = "%d/%d" % (nruns - len(inexact), nruns)
        goals.append((label, text + " runs", "all", not inexact))
        out("  %-44s %8s   [all: %s]" % (label, text, "met" if not inexact else "NOT met"))
        for s in inexact:
            out("    not exact: %s" % s)
    if "idle" in a.groups:
        hz = find(targets, "idle", "flashsale GET /healthz", low).med("rps")
        ng = max(t.med("rps") for t in targets
                 if t.group == "idle" and t.name.startswith("nginx return 200"))
        goal("GET /healthz / nginx return 200 (best), c=%d" % low, hz / ng, 0.9)
        goal("sold-out POST /v1/orders / /healthz", find(
            targets, "idle", "flashsale sold-out POST /v1/orders", low).med("rps") / hz, 0.9)
        goal("GET /v1/products/{sku} / /healthz", find(
            targets, "idle", "flashsale GET /v1/products/{sku}", low).med("rps") / hz, 0.8)
        for name in ("GET a waiting ticket", "order before its turn", "a place asked again"):
            goal("waiting room: %s / /healthz" % name, find(
                targets, "idle", "flashsale room: " + name, low).med("rps") / hz, 0.8)
        gw = [t for t in targets if t.group == "idle" and t.name.startswith("gateway")]
        for t in gw:
            info("(%s / its nginx return 200)" % t.name.replace("gateway, 2 nginx workers",
                                                              "gateway"),
                 t.med("rps") / find(targets, "idle", "nginx return 200, 2 nginx workers",
                                     low).med("rps"))
    ov = res["overload"]
    if ov:
        out()
        out("overload: open loop at multiples of each target's closed-loop capacity, %d "
            "connections, %g s per rate" % (ov["connections"], ov["seconds"]))
        out("%-24s %5s %9s %9s %6s %9s %9s %7s %7s %6s %5s %5s %6s %6s  %s" % (
            "target", "x cap", "offered/s", "goodput/s", "of cap", "p50", "p99", "201", "409",
            "shed", "5xx", "late", "no ans", "unsent", "verdict"))
        for o in ov["runs"]:
            out("%-24s %5g %9d %9s %6s %9s %9s %7d %7d %6d %5d %5s %6d %6d  %s" % (
                o["target"][:24], o["factor"], o["offered"],
                "%.0f" % o["goodput"] if o["goodput"] is not None else "?",
                "%.2f" % (o["goodput"] / o["capacity"]) if o["goodput"] is not None else "?",
                fmt_us(o["p50"]), fmt_us(o["p99"]), o["201"], o["409"], o["shed"], o["5xx"],
                o["late"] if o["late"] is not None else "?", o["no_answer"], o["unsent"],
                {True: "PASS", False: "FAIL", None: "-"}[o["verified"]]))
        out("(goodput: 201s answered within 250 ms of their scheduled time, per second of the "
            "run; shed: 503 overloaded; late: answered after 1 s; no ans: none within %g s; "
            "unsent: due, never sent; capacity: %s)" % (
                ov["timeout"], ", ".join("%s %.0f/s" % kv for kv in ov["capacity"].items())))
        out("ratios at the top rate (the overload goals in brackets)")
        fmax = max(o["factor"] for o in ov["runs"])
        f2 = 2.0 if any(o["factor"] == 2.0 for o in ov["runs"]) else fmax
        for o in ov["runs"]:
            if o["factor"] != f2:
                continue
            who = "service" if o["target"] == "flashsale lua" else "gateway"
            if o["goodput"] is None:
                out("  %s at x%g: this flashload does not count goodput" % (who, f2))
                continue
            if who == "service":
                goal("overload x%g: service goodput / capacity" % f2, o["goodput"] / o["capacity"],
                     0.9)
                text = ("every one" if o["within_1s"] else "%d late, %d no answer, %d unsent"
                        % (o["late"], o["no_answer"], o["unsent"]))
                goals.append(("overload x%g: service answers all within 1 s" % f2, text, "all",
                              bool(o["within_1s"])))
                out("  %-44s %8s   [all: %s]" % ("overload x%g: answered within 1 s" % f2, text,
                                                 "met" if o["within_1s"] else "NOT met"))
                goals.append(("overload x%g: service verifier" % f2,
                              "PASS" if o["verified"] else "FAIL", "PASS", bool(o["verified"])))
            else:
                info("(overload x%g: gateway goodput / its capacity)" % f2,
                     o["goodput"] / o["capacity"])
                out("  %-44s %8s" % ("(overload x%g: gateway answered within 1 s)" % f2,
                                     "every one" if o["within_1s"] else
                                     "%d late, %d no answer, %d unsent"
                                     % (o["late"], o["no_answer"], o["unsent"])))
    q = res.get("quota")
    if q and "rows" in q:
        out()
        out("quota: inside a CPU quota of %g CPUs (overload.sh --cpu-quota), open loop at "
            "multiples of the capacity measured in the same quota, %g s per run, medians of %d"
            % (q["cpus"], q["seconds"], q["reps"]))
        out("%-14s %5s %9s %9s %8s %7s %8s %9s %7s %7s  %s" % (
            "target", "x cap", "capacity", "offered/s", "shed", "shed %", "goodput",
            "p99", "late", "unsent", "verdict"))
        for r in q["rows"]:
            out("%-14s %5g %9.0f %9.0f %8.0f %6.1f%% %8.2f %7.0fms %7d %7d  %s" % (
                r["target"], r["factor"], r["capacity"], r["offered"], r["shed"],
                100 * r["shed_share"], r["goodput_of_cap"], r["p99_ms"], r["late"], r["unsent"],
                {True: "PASS", False: "FAIL", None: "-"}[r["verified"]]))
        out("(goodput: 201s within 250 ms of their scheduled time as a share of the capacity; "
            "late: answers after 1 s, the most of the runs)")
        out("goals inside a CPU quota (the service)")
        for r in q["rows"]:
            if r["target"] != "flashsale lua":
                continue
            if r["factor"] == 0.8:
                met = r["shed_share"] <= 0.01
                goals.append(("quota x0.8: service shed", "%.1f%%" % (100 * r["shed_share"]),
                              "<= 1%", met))
                out("  %-44s %8s   [<= 1%%: %s]" % ("quota x0.8: shed", "%.1f%%" %
                                                   (100 * r["shed_share"]),
                                                   "met" if met else "NOT met"))
            if r["factor"] == 1.0:
                goal("quota x1: service goodput / capacity", r["goodput_of_cap"], 0.9)
            if r["factor"] == 2.0:
                goal("quota x2: service goodput / capacity", r["goodput_of_cap"], 0.6)
                ok = r["late"] == 0
                goals.append(("quota x2: service answers all within 1 s",
                              "every one" if ok else "%d late" % r["late"], "all", ok))
                out("  %-44s %8s   [all: %s]" % ("quota x2: answered within 1 s",
                                                 "every one" if ok else "%d late" % r["late"],
                                                 "met" if ok else "NOT met"))
    out("\nbench: %d s wall" % res["wall_s"])
    return goals


# ---- the HTML report ----

def nice_step(span, n=6):
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) giving about n ticks."""
    raw = span / n if span > 0 else 1
    mag = 10 ** int("%d" % (len(str(int(raw))) - 1)) if raw >= 1 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def goodput_svg(ov):
    """Goodput against offered load, service and gateway, with each one's
    closed-loop capacity dashed and the line where goodput == offered."""
    W, H, L, R, T, B = 760, 380, 70, 190, 20, 50
    series = []
    for name, color in (("flashsale lua", "#1f77b4"), (ov["gateway"], "#ff7f0e")):
        pts = [(o["offered"], o["goodput"]) for o in ov["runs"]
               if o["target"] == name and o["goodput"] is not None]
        series.append((name, color, sorted(pts), ov["capacity"][name]))
    xmax = max([p[0] for s in series for p in s[2]] + [1]) * 1.05
    ymax = max([p[1] for s in series for p in s[2]] + [s[3] for s in series] + [1]) * 1.1
    xs = lambda x: L + (W - L - R) * x / xmax            # noqa: E731
    ys = lambda y: H - B - (H - T - B) * y / ymax        # noqa: E731
    e = []
    e.append('<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" '
             'width="%d" height="%d" role="img" aria-label="goodput against offered load">'
             % (W, H, W, H))
    e.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>'
             % (L, T, W - L - R, H - T - B))
    for axis, vmax, step in (("x", xmax, nice_step(xmax)), ("y", ymax, nice_step(ymax))):
        v = 0
        while v <= vmax:
            if axis == "x":
                e.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>'
                         '<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%s</text>'
                         % (xs(v), T, xs(v), H - B, xs(v), H - B + 15, "%gk" % (v / 1000)))
            else:
                e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>'
                         '<text x="%d" y="%.1f" font-size="11" text-anchor="end">%s</text>'
                         % (L, ys(v), W - R, ys(v), L - 5, ys(v) + 4, "%gk" % (v / 1000)))
            v += step
    e.append('<text x="%d" y="%d" font-size="12" text-anchor="middle">offered load, '
             'requests/s (open loop)</text>' % ((L + W - R) / 2, H - 12))
    e.append('<text x="15" y="%d" font-size="12" text-anchor="middle" transform="rotate(-90 15 %d)">'
             'goodput, 201s within 250 ms /s</text>' % ((T + H - B) / 2, (T + H - B) / 2))
    lim = min(xmax, ymax)
    e.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb" stroke-dasharray="2 3"/>'
             % (xs(0), ys(0), xs(lim), ys(lim)))
    ly = T + 10
    for name, color, pts, cap in series:
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-dasharray="6 4" '
                 'opacity="0.7"/>' % (L, ys(cap), W - R, ys(cap), color))
        if pts:
            e.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                     % (color, " ".join("%.1f,%.1f" % (xs(x), ys(y)) for x, y in pts)))
        for x, y in pts:
            e.append('<circle class="mark" cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s: %d/s '
                     'offered, goodput %d/s</title></circle>' % (xs(x), ys(y), color,
                                                                html.escape(name), x, y))
        e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                 '<text x="%d" y="%d" font-size="12">%s</text>'
                 % (W - R + 10, ly, W - R + 30, ly, color, W - R + 35, ly + 4, html.escape(name)))
        e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-dasharray="6 4"/>'
                 '<text x="%d" y="%d" font-size="11">capacity %.0f/s</text>'
                 % (W - R + 10, ly + 16, W - R + 30, ly + 16, color, W - R + 35, ly + 20, cap))
        ly += 44
    e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#bbb" stroke-dasharray="2 3"/>'
             '<text x="%d" y="%d" font-size="11">goodput = offered</text>'
             % (W - R + 10, ly, W - R + 30, ly, W - R + 35, ly + 4))
    e.append("</svg>")
    return "\n".join(e)


def html_table(head, rows):
    """An HTML table of escaped cells."""
    h = "<tr>" + "".join("<th>%s</th>" % html.escape(str(c)) for c in head) + "</tr>"
    b = "".join("<tr>" + "".join("<td>%s</td>" % html.escape(str(c)) for c in r) + "</tr>"
                for r in rows)
    return "<table>%s%s</table>" % (h, b)


def write_report(a, res, goals):
    """bench.json and bench.html in a.out."""
    os.makedirs(a.out, exist_ok=True)
    targets, ov = res["targets"], res["overload"]
    doc = {"started": res["started"], "wall_s": res["wall_s"], "cpus": os.cpu_count(),
           "seconds": a.seconds, "rounds": a.rounds, "groups": a.groups,
           "spike_stock": a.spike_stock,
           "targets": [{"group": t.group, "name": t.name, "conns": t.conns, "kind": t.kind,
                        "median": {k: t.med(k) for k in ("rps", "p50", "p99", "cpu", "redis",
                                                         "calls")},
                        "runs": t.runs} for t in targets],
           "verified": [{"name": n, "per_second": p, "pass": ok} for n, p, ok in res["verified"]],
           "overload": ov, "quota": res.get("quota"),
           "goals": [{"what": g[0], "value": g[1], "goal": g[2], "met": g[3]} for g in goals]}
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(doc, f, indent=2)
    parts = ["<!doctype html><html><head><meta charset=\"utf-8\"><title>flashsale make bench, %s"
             "</title><style>body{font-family:sans-serif;max-width:1100px;margin:1em auto;"
             "padding:0 1em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;font-size:13px}"
             "td:first-child,th:first-child{text-align:left}.met{color:#080}.not{color:#b00}"
             "pre{font-size:12px;background:#f6f6f6;padding:.5em;overflow-x:auto}</style>"
             "</head><body>" % html.escape(res["started"])]
    parts.append("<h1>make bench</h1><p>%s, %d CPUs shared by everything, %d round(s) of %d s "
                 "per target, %d s wall. Ratios come from this one run.</p>"
                 % (html.escape(res["started"]), os.cpu_count(), a.rounds, a.seconds,
                    res["wall_s"]))
    if goals:
        parts.append("<h2>Goals</h2><table><tr><th>what</th><th>this run</th><th>goal</th>"
                     "<th></th></tr>")
        for label, value, want, met in goals:
            parts.append("<tr><td>%s</td><td>%s</td><td>%s</td><td class=\"%s\">%s</td></tr>" % (
                html.escape(label), html.escape(value), html.escape(want),
                "" if met is None else ("met" if met else "not"),
                "" if met is None else ("met" if met else "NOT met")))
        parts.append("</table>")
    if ov:
        parts.append("<h2>Overload: goodput against offered load</h2>"
                     "<p>Open loop (flashload --rate), %d connections, %g s per rate; each "
                     "target offered multiples of its own closed-loop capacity (%d connections)."
                     "</p>" % (ov["connections"], ov["seconds"], ov["capacity_connections"]))
        parts.append(goodput_svg(ov))
        parts.append(html_table(
            ["target", "x capacity", "offered/s", "goodput/s", "of capacity", "p50", "p99",
             "max", "201", "409", "503 shed", "other 5xx", "later than 1 s", "no answer",
             "unsent", "verifier"],
            [[o["target"], o["factor"], o["offered"],
              "%.0f" % o["goodput"] if o["goodput"] is not None else "?",
              "%.2f" % (o["goodput"] / o["capacity"]) if o["goodput"] is not None else "?",
              fmt_us(o["p50"]), fmt_us(o["p99"]), fmt_us(o["max"]), o["201"], o["409"],
              o["shed"], o["5xx"], o["late"] if o["late"] is not None else "?", o["no_answer"],
              o["unsent"], {True: "PASS", False: "FAIL", None: "-"}[o["verified"]]]
             for o in ov["runs"]]))
    titles = {"orders": "Orders with stock for everyone (wrk -t2)",
              "spike": "Spike: a fresh SKU of %d units per run (wrk -t2)" % a.spike_stock,
              "idle": "Answers that touch no shared state (wrk -t2)"}
    for g in ("orders", "spike", "idle"):
        ts = [t for t in targets if t.group == g]
        if not ts:
            continue
        parts.append("<h2>%s</h2>" % html.escape(titles[g]))
        rows = []
        for t in ts:
            row = [t.name, t.conns, "%.0f" % t.med("rps"), fmt_us(t.med("p50")),
                   fmt_us(t.med("p99")),
                   "%.1fus" % t.med("cpu") if t.med("cpu") is not None else "-"]
            if g == "spike":
                row.append(", ".join(str(x["sold"]) for x in t.runs))
                row.append("; ".join(x["note"] for x in t.runs if x["note"]) or "exact")
            rows.append(row)
        head = ["target", "conns", "per second (median)", "p50", "p99", "CPU/answer"]
        if g == "spike":
            head += ["sold, each run", "books"]
        parts.append(html_table(head, rows))
    parts.append("<h2>The printed output</h2><pre>%s</pre></body></html>"
                 % html.escape("\n".join(out.lines)))
    path = os.path.join(a.out, "bench.html")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    out("report: %s and bench.json" % os.path.abspath(path))


if __name__ == "__main__":
    main()
