#!/usr/bin/python3
"""bench.py: `make bench`: how close the service runs to the ceilings
below it, measured in the same run, on the same cores, with the same
number of connections:

  1. Redis: redis-benchmark calling the service's own reserve script
     (stock/lua/reserve.lua) by EVALSHA, on keys set up so that every call
     really reserves a unit and writes a pending record;
  2. HTTP: a bare libmicrohttpd server (bin/mhdhello, set up like the
     service's http/) answering "hello", loaded by flashload --get;
  3. the service: flashload ordering a `lua` product, verified afterwards.

Each figure is printed next to the service's as a ratio. wrk, when
installed, is run against the hello server and the service as a second
opinion on flashload's own figures. A benchmark, not a test: it fails only
when something cannot run.

Usage: bench.py BIN_DIR [CONNECTIONS] [SECONDS]
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=20):
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


def redis_ceiling(redis_port, conns, seconds, pipeline):
    """EVALSHA reserve.lua through redis-benchmark; returns (ops/s, reserved)."""
    import redis
    r = redis.Redis(host="127.0.0.1", port=redis_port, decode_responses=True)
    with open(os.path.join(HERE, "..", "stock", "lua", "reserve.lua")) as f:
        sha = r.script_load(f.read())
    run_id = r.info("server")["run_id"]
    sku = "bench-%d" % pipeline
    k = lambda s: "bench:{%s}:%s" % (sku, s)             # noqa: E731
    # One segment holding far more units than the run can take, a valid
    # generation for this Redis, no per-user limit, no idempotency key: the
    # script walks its whole success path (check, DECRBY, pending record).
    r.set(k("gen"), "1:" + run_id)
    r.set(k("stock:0"), 10 ** 12)
    keys = [k("gen"), k("pending"), k("users"), k("idem:none"), k("empty"), k("stock:0")]
    argv = [run_id, "o__rand_int__", "u__rand_int__", "1", "0", "", "0", "bench", "60000", ""]
    # Size the run to the time asked for: a short probe first.
    def once(n):
        out = subprocess.run(["redis-benchmark", "-p", str(redis_port), "-c", str(conns),
                              "-n", str(n), "-r", "1000000000", "-P", str(pipeline), "--csv",
                              "EVALSHA", sha, str(len(keys))] + keys + argv,
                             capture_output=True, text=True, timeout=600)
        m = re.search(r'^"EVALSHA[^"]*","([\d.]+)"', out.stdout, re.M)
        if not m:
            sys.exit("bench: redis-benchmark gave no figure:\n" + out.stdout + out.stderr)
        return float(m.group(1))
    probe = once(20000)
    before = int(r.get(k("stock:0")))
    n = max(20000, int(probe * seconds))
    ops = once(n)
    reserved = before - int(r.get(k("stock:0")))
    pending = r.hlen(k("pending"))
    # redis-benchmark may send a few more than -n (its clients' last rounds).
    if not n <= reserved <= n + conns * pipeline:
        sys.exit("bench: the script reserved %d units in %d calls: keys not set up right"
                 % (reserved, n))
    r.delete(*[k(s) for s in ("gen", "stock:0", "pending", "empty")])
    return ops, pending


def flashload(bin_dir, args):
    out = tempfile.mktemp(prefix="bench-", suffix=".json")
    p = subprocess.run([os.path.join(bin_dir, "flashload")] + [str(a) for a in args] +
                       ["--json", out], capture_output=True, text=True, timeout=900)
    if p.returncode != 0 or not os.path.exists(out):
        sys.exit("bench: flashload failed (%d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
    with open(out) as f:
        j = json.load(f)
    os.unlink(out)
    return j


def wrk(url, conns, seconds, script=None):
    if not shutil.which("wrk"):
        return None
    args = ["wrk", "-t2", "-c%d" % conns, "-d%ds" % seconds, "--latency"]
    if script:
        args += ["-s", script]
    p = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"Requests/sec:\s+([\d.]+)", p.stdout)
    p99 = re.search(r"^\s+99%\s+(\S+)", p.stdout, re.M)
    return (float(m.group(1)), p99.group(1) if p99 else "-") if m else None


def fmt_us(us):
    if us < 1000:
        return "%dus" % us
    if us < 1000000:
        return "%.2fms" % (us / 1000.0)
    return "%.2fs" % (us / 1e6)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    bin_dir = sys.argv[1]
    conns = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    seconds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    tmp = tempfile.mkdtemp(prefix="fs-bench-")
    procs = Procs()
    log = open(os.path.join(tmp, "bench.log"), "w")
    rows = []
    try:
        rport = free_port()
        redis_p = procs.start(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", tmp], log)
        wait_port(rport, redis_p, "redis-server")
        print("bench: %d connections, about %d s per figure, %d CPUs shared by everything"
              % (conns, seconds, os.cpu_count()), flush=True)

        # The service first, so the ceilings below are taken on the same warm machine.
        sport = free_port()
        svc = procs.start([os.path.join(bin_dir, "flashsale"), "--listen", "127.0.0.1:%d" % sport,
                           "--redis", "redis://127.0.0.1:%d/0" % rport,
                           "--db", os.path.join(tmp, "orders.db")], log)
        wait_port(sport, svc, "flashsale")
        target = "http://127.0.0.1:%d" % sport
        j = flashload(bin_dir, ["--target", target, "--redis", "redis://127.0.0.1:%d/0" % rport,
                                "--db", os.path.join(tmp, "orders.db"), "--stock", 10 ** 9,
                                "--users", 100000, "--connections", conns, "--duration", seconds])
        service = j["per_second"]
        verdict = "PASS" if j["verdict"]["pass"] else "FAIL"
        rows.append(("flashsale lua, 100000 buyers (flashload; %s)" % verdict, service,
                     j["latency_us"]["p50"], j["latency_us"]["p99"]))
        # One buyer, as wrk's one-body script sends: the service is faster
        # then (its order rows append to one place of the user index), so
        # this is the row to hold wrk's figure against.
        one = flashload(bin_dir, ["--target", target, "--sku", j["sku"], "--no-create",
                                  "--users", 1, "--connections", conns, "--duration", seconds,
                                  "--no-verify"])
        rows.append(("flashsale lua, one buyer (flashload)", one["per_second"],
                     one["latency_us"]["p50"], one["latency_us"]["p99"]))
        body = os.path.join(tmp, "order.lua")
        with open(body, "w") as f:
            f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                    'wrk.body = \'{"sku":"%s","user_id":"u0","quantity":1}\'\n' % j["sku"])
        w = wrk(target + "/v1/orders", conns, seconds, body)
        if w:
            rows.append(("  same one-buyer load, by wrk -t2", w[0], None, w[1]))
        svc.send_signal(signal.SIGTERM)
        svc.wait(30)

        for pipeline in (1, 16):
            ops, pending = redis_ceiling(rport, conns, seconds, pipeline)
            rows.append(("redis-benchmark EVALSHA reserve.lua, pipeline %d" % pipeline, ops,
                         None, None))

        hport = free_port()
        hello = procs.start([os.path.join(bin_dir, "mhdhello"), "--listen",
                             "127.0.0.1:%d" % hport, "--threads", "2"], log)
        wait_port(hport, hello, "mhdhello")
        j = flashload(bin_dir, ["--target", "http://127.0.0.1:%d" % hport, "--get", "/",
                                "--connections", conns, "--duration", seconds])
        rows.append(("libmicrohttpd hello (flashload --get)", j["per_second"],
                     j["latency_us"]["p50"], j["latency_us"]["p99"]))
        w = wrk("http://127.0.0.1:%d/" % hport, conns, seconds)
        if w:
            rows.append(("  same, by wrk -t2", w[0], None, w[1]))
    finally:
        procs.stop_all()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print("%-50s %10s %9s %9s %12s" % ("what", "per second", "p50", "p99", "service is"))
    for name, ops, p50, p99 in rows:
        ratio = service / ops if ops else 0
        print("%-50s %10.0f %9s %9s %11.0f%%" % (
            name, ops, fmt_us(p50) if p50 is not None else "-",
            (fmt_us(p99) if isinstance(p99, int) else p99) if p99 is not None else "-",
            100 * ratio))
    print("\nEach row ran alone on this %d-CPU machine with its load generator beside it;"
          " 'service is' = the service's orders/s as a share of that row's rate."
          % os.cpu_count())


if __name__ == "__main__":
    main()
