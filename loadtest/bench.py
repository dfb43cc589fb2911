#!/usr/bin/python3
"""bench.py: `make bench`: the service's order path next to the gateway a
team would otherwise deploy, and next to the box's HTTP ceiling, measured
side by side in one run with one load generator.

Targets, all loaded by wrk -t2 with loadtest/wrk_orders.lua (one SKU, a
fresh buyer per order) or, for the ceilings, a bare GET:

  flashsale lua         the service, `lua` strategy: 201 only once the
                        order's row is committed (synchronous=FULL)
  flashsale lock x1/x8  the service, `lock` strategy, 1 and 8 segments
  gateway               the reference (loadtest/gateway/): nginx + Lua
                        module + lua-resty-redis, one EVALSHA per order,
                        nothing stored; with 1 and with 2 nginx workers
  nginx return 200      the same nginx answering GET /ok: the HTTP ceiling
  libmicrohttpd hello   bin/mhdhello: the ceiling of the service's HTTP stack

Every target runs ROUNDS times, the targets alternating, and each figure is
the median of its rounds: the machine is shared and noisy, and a ratio of
figures taken side by side is what holds. For each target the CPU time its
processes and Redis spent is read from /proc and INFO commandstats, and
printed per order. Then flashload runs the service's three strategies once
more and verifies the books (sold + remaining == initial, every 201 one
order row): a figure from a service that oversold is no figure.

A benchmark, not a test: it fails only when something cannot run or a
verification fails.

Usage: bench.py BIN_DIR [SECONDS] [ROUNDS] [CONNECTIONS,...]
"""
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
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
HZ = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=30):
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
    m = re.match(r"([\d.]+)(us|ms|s)$", s)
    if not m:
        return None
    return float(m.group(1)) * {"us": 1, "ms": 1000, "s": 1e6}[m.group(2)]


def wrk(url, conns, seconds, sku=None):
    """Runs wrk; returns (requests/s, p50 us, p99 us, statuses or None)."""
    args = ["wrk", "-t2", "-c%d" % conns, "-d%ds" % seconds, "--latency"]
    env = dict(os.environ)
    if sku:
        args += ["-s", os.path.join(HERE, "wrk_orders.lua")]
        env["WRK_SKU"] = sku
    p = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 60,
                       env=env)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", p.stdout)
    p50 = re.search(r"^\s+50%\s+(\S+)", p.stdout, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", p.stdout, re.M)
    st = re.search(r"^STATUS (.*)$", p.stdout, re.M)
    if not rps:
        sys.exit("bench: wrk gave no figure for %s:\n%s%s" % (url, p.stdout, p.stderr))
    statuses = dict(kv.split("=") for kv in st.group(1).split()) if st else None
    return (float(rps.group(1)), parse_us(p50.group(1)) if p50 else None,
            parse_us(p99.group(1)) if p99 else None, statuses)


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def flashload(bin_dir, args):
    out = tempfile.mktemp(prefix="bench-", suffix=".json")
    p = subprocess.run([os.path.join(bin_dir, "flashload")] + [str(a) for a in args] +
                       ["--json", out, "--quiet"], capture_output=True, text=True, timeout=900)
    if not os.path.exists(out):
        sys.exit("bench: flashload failed (%d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
    with open(out) as f:
        j = json.load(f)
    os.unlink(out)
    return j


def fmt_us(us):
    if us is None:
        return "-"
    if us < 1000:
        return "%dus" % us
    if us < 1000000:
        return "%.2fms" % (us / 1000.0)
    return "%.2fs" % (us / 1e6)


class Target:
    def __init__(self, name, url, conns, sku, pids, orders=True):
        self.name, self.url, self.conns, self.sku, self.pids = name, url, conns, sku, pids
        self.orders = orders
        self.runs = []                 # (rps, p50, p99, cpu us/req, redis us/req, calls/req)

    def med(self, i):
        vals = [r[i] for r in self.runs if r[i] is not None]
        return statistics.median(vals) if vals else None


def start_gateway(procs, log, tmp, redis_port, workers):
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
    c0, rc0 = cpu_ticks(t.pids), redis_calls(r)
    r0 = cpu_ticks([redis_pid])
    rps, p50, p99, statuses = wrk(t.url, t.conns, seconds, t.sku)
    c1, rc1, r1 = cpu_ticks(t.pids), redis_calls(r), cpu_ticks([redis_pid])
    n = rps * seconds
    if statuses is not None:
        answered = sum(int(v) for k, v in statuses.items() if k != "errors")
        good = int(statuses.get("201", 0))
        if answered == 0 or good < 0.99 * answered or int(statuses["errors"]) > 0:
            sys.exit("bench: %s did not sell (answers: %s)" % (t.name, statuses))
    t.runs.append((rps, p50, p99, (c1 - c0) * 1e6 / HZ / n if n else None,
                   (r1 - r0) * 1e6 / HZ / n if n and t.orders else None,
                   (rc1[0] - rc0[0]) / n if n and t.orders else None))
    print("  %-34s c=%-4d %9.0f/s  p99 %s" % (t.name, t.conns, rps, fmt_us(p99)), flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    bin_dir = sys.argv[1]
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    conn_list = [int(c) for c in (sys.argv[4] if len(sys.argv) > 4 else "64,256").split(",")]
    low = conn_list[0]
    import redis
    tmp = tempfile.mkdtemp(prefix="fs-bench-")
    procs = Procs()
    log = open(os.path.join(tmp, "bench.log"), "w")
    try:
        rport = free_port()
        redis_p = procs.start(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", tmp], log)
        wait_port(rport, redis_p, "redis-server")
        r = redis.Redis(host="127.0.0.1", port=rport, decode_responses=True)
        sport = free_port()
        db = os.path.join(tmp, "orders.db")
        svc = procs.start([os.path.join(bin_dir, "flashsale"), "--listen",
                           "127.0.0.1:%d" % sport, "--redis", "redis://127.0.0.1:%d/0" % rport,
                           "--db", db], log)
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

        orders = lambda port: "http://127.0.0.1:%d/v1/orders" % port   # noqa: E731
        targets = []
        for c in conn_list:
            targets.append(Target("flashsale lua", orders(sport), c, "b-lua", [svc.pid]))
        targets.append(Target("flashsale lock x1", orders(sport), low, "b-lock1", [svc.pid]))
        targets.append(Target("flashsale lock x8", orders(sport), low, "b-lock8", [svc.pid]))
        for c in conn_list:
            targets.append(Target("gateway, 1 nginx worker", orders(gport1), c, "b-gw", [gw1.pid]))
            targets.append(Target("gateway, 2 nginx workers", orders(gport2), c, "b-gw",
                                  [gw2.pid]))
        targets.append(Target("nginx return 200", "http://127.0.0.1:%d/ok" % gport2, low, None,
                              [gw2.pid], orders=False))
        targets.append(Target("libmicrohttpd hello", "http://127.0.0.1:%d/" % hport, low, None,
                              [hello.pid], orders=False))

        print("bench: %d targets x %d rounds, %d s each, wrk -t2; %d CPUs shared by everything"
              % (len(targets), rounds, seconds, os.cpu_count()), flush=True)
        for i in range(rounds):
            print("round %d of %d" % (i + 1, rounds), flush=True)
            for t in targets:
                measure(t, seconds, r, redis_p.pid)

        print("verifying the service's books with flashload (%d s per strategy)" % seconds,
              flush=True)
        verified = []
        for name, strategy, segs in (("lua", "lua", 1), ("lock x1", "lock", 1),
                                     ("lock x8", "lock", 8)):
            j = flashload(bin_dir, ["--target", base, "--redis", "redis://127.0.0.1:%d/0" % rport,
                                    "--db", db, "--stock", 10 ** 7, "--users", 100000,
                                    "--strategy", strategy, "--segments", segs,
                                    "--connections", low, "--duration", seconds])
            verified.append((name, j["per_second"], j["verdict"]["pass"]))
    finally:
        procs.stop_all()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    report(targets, verified, conn_list, low, rounds)
    if not all(ok for _, _, ok in verified):
        sys.exit(1)


def report(targets, verified, conn_list, low, rounds):
    print()
    print("%-26s %5s %10s %9s %9s %10s %10s %8s" % (
        "target", "conns", "per second", "p50", "p99", "CPU/order", "Redis/ord", "calls/ord"))
    for t in targets:
        cpu, red, calls = t.med(3), t.med(4), t.med(5)
        print("%-26s %5d %10.0f %9s %9s %10s %10s %8s" % (
            t.name, t.conns, t.med(0), fmt_us(t.med(1)), fmt_us(t.med(2)),
            "%.1fus" % cpu if cpu is not None else "-",
            "%.1fus" % red if red is not None else "-",
            "%.2f" % calls if calls is not None else "-"))
    print("(medians of %d rounds; CPU/order: the target's own processes; Redis/order: CPU of"
          " redis-server; calls/order from INFO commandstats)" % rounds)

    def get(name, c):
        for t in targets:
            if t.name == name and t.conns == c:
                return t
        return None

    print("\nratios (goals of issue 14 in brackets)")
    for c in conn_list:
        lua = get("flashsale lua", c).med(0)
        gw = max(get("gateway, 1 nginx worker", c).med(0), get("gateway, 2 nginx workers", c).med(0))
        line(" lua / best gateway, c=%d" % c, lua / gw, 1.3)
    lua_t = get("flashsale lua", low)
    line(" lua / nginx return 200, c=%d" % low, lua_t.med(0) / get("nginx return 200", low).med(0),
         0.4)
    p99 = lua_t.med(2)
    print("  %-36s %8s   [<= 5ms: %s]" % (" lua p99, c=%d" % low, fmt_us(p99),
                                         "met" if p99 is not None and p99 <= 5000 else "NOT met"))
    l1, l8 = get("flashsale lock x1", low).med(0), get("flashsale lock x8", low).med(0)
    line(" lock x8 / lock x1", l8 / l1, 5.0)
    line(" lock x1 / lua", l1 / lua_t.med(0), 0.25)
    line(" lua / libmicrohttpd hello", lua_t.med(0) / get("libmicrohttpd hello", low).med(0), None)
    print("\nverified by flashload (sold + remaining == initial, one row per 201, no oversell):")
    for name, rate, ok in verified:
        print("  %-10s %9.0f/s  %s" % (name, rate, "PASS" if ok else "FAIL"))


def line(label, value, goal):
    verdict = "" if goal is None else "   [>= %.2f: %s]" % (goal, "met" if value >= goal else
                                                            "NOT met")
    print("  %-36s %8.2f%s" % (label, value, verdict))


if __name__ == "__main__":
    main()
