#!/usr/bin/python3
"""bench_pg.py: the orders on PostgreSQL, measured (make bench-pg).

On a throwaway PostgreSQL server (tests/pgserver.py) and Redis, in one run,
round after round (the machines are shared and noisy: medians of rounds,
ratios of figures from the same round):

  pgbench hot row   a transaction per order, as seckill articles write it:
                    UPDATE products SET available = available - 1, sold =
                    sold + 1 WHERE sku = 'hot' AND available >= 1; INSERT
                    the order (the hot-row convoy)
  pgbench insert    the INSERT of the order alone
  service           flashsale on the server: lua (stock in Redis, the
                    orders group-committed) and db (stock in the products
                    row, taken in the group's transaction) at each
                    concurrency; lua on two instances sharing the server;
                    and lua on SQLite, the default, for the ratio

every run closed-loop (pgbench -c N; flashload --connections N), the
service's runs verified by flashload (every 201 a row, nothing oversold).
Prints the table and the goals of the orders on PostgreSQL (docs/performance.md,
"Orders on PostgreSQL") with met / NOT met.

Usage: bench_pg.py BIN [--seconds S] [--rounds R] [--connections 64,256]
       [--quick]"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import harness  # noqa: E402
import pgserver  # noqa: E402

PGBENCH_SCHEMA = """
CREATE TABLE products(sku TEXT PRIMARY KEY, available BIGINT NOT NULL, sold BIGINT NOT NULL);
INSERT INTO products VALUES ('hot', 1000000000, 0);
CREATE TABLE orders(order_id TEXT PRIMARY KEY, sku TEXT NOT NULL, user_id TEXT NOT NULL,
  quantity INTEGER NOT NULL, created_at TEXT NOT NULL);
"""
HOT_ROW = """\\set u random(1, 1000)
BEGIN;
UPDATE products SET available = available - 1, sold = sold + 1 WHERE sku = 'hot' AND available >= 1;
INSERT INTO orders VALUES (gen_random_uuid()::text, 'hot', 'u' || :u, 1, now()::text);
END;
"""
INSERT_ONLY = """\\set u random(1, 1000)
INSERT INTO orders VALUES (gen_random_uuid()::text, 'hot', 'u' || :u, 1, now()::text);
"""


def pgbench(pg, dbname, script, conns, seconds, tmp):
    path = os.path.join(tmp, "script.sql")
    with open(path, "w") as f:
        f.write(script)
    # A short run on a busy machine can end before its clients have all
    # connected (0 transactions, no tps line): that run says nothing, and
    # one three times as long is made instead.
    for secs in (max(1, round(seconds)), 3 * max(1, round(seconds))):
        r = subprocess.run([os.path.join(pg.bin, "pgbench"), "-h", "127.0.0.1", "-p",
                            str(pg.port), "-U", "postgres", "-n", "-c", str(conns), "-j", "2",
                            "-T", "%d" % secs, "-f", path, dbname],
                           capture_output=True, text=True, timeout=secs + 120)
        m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", r.stdout)
        if r.returncode == 0 and m:
            return float(m.group(1))
        if r.returncode != 0 or "actually processed: 0" not in r.stdout:
            break
    raise RuntimeError("pgbench failed: %s %s" % (r.stdout[-500:], r.stderr[-500:]))


def cpu_jiffies():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]                  # idle + iowait
    return sum(v) - idle, sum(v)


CPU = {}                                # row name -> [(busy fraction, CPU us per order)]


def measured(name, fn):
    """Runs fn (which returns (orders/s, orders)), and keeps how busy the
    machine was and its CPU time per order over the run beside the rate."""
    b0, t0 = cpu_jiffies()
    rate, orders = fn()
    b1, t1 = cpu_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    busy = (b1 - b0) / max(1, t1 - t0)
    CPU.setdefault(name, []).append((busy, (b1 - b0) / hz * 1e6 / max(1, orders)))
    return rate


def flashload(binary, targets, redis, db, strategy, conns, seconds, sku):
    args = [os.path.join(binary, "flashload")]
    for t in targets:
        args += ["--target", "http://127.0.0.1:%d" % t.port]
    args += ["--redis", redis.url, "--db", db, "--sku", sku, "--strategy", strategy,
             "--stock", "100000000", "--duration", str(seconds), "--connections", str(conns)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 180)
    m = re.search(r"stock\s+\d+ for sale, (\d+) sold", r.stdout)
    w = re.search(r"^requests\s+(\d+) answered in ([\d.]+) s", r.stdout, re.M)
    if r.returncode != 0 or not m or not w:
        raise RuntimeError("flashload %s on %s failed (%d):\n%s%s" % (strategy, db, r.returncode,
                                                                    r.stdout[-1500:], r.stderr[-500:]))
    return int(m.group(1)) / float(w.group(2)), int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", default="64,256")
    ap.add_argument("--quick", action="store_true", help="1 s, 1 round, 64 connections")
    o = ap.parse_args()
    if o.quick:
        o.seconds, o.rounds, o.connections = 1, 1, "64"
    conns = [int(c) for c in o.connections.split(",")]
    binary = os.path.abspath(o.bin)
    os.environ["FLASHSALE_BIN"] = binary
    harness.BIN = binary
    tmp = tempfile.mkdtemp(prefix="fs-bench-pg-")
    redis = harness.Redis()
    pg = pgserver.Postgres(settings={"max_connections": "600"})
    services = []
    try:
        pg.psql("CREATE DATABASE pgb")
        pg.psql(PGBENCH_SCHEMA, dbname="pgb")
        url = pg.database("flashsale")
        lite = os.path.join(tmp, "orders.db")
        # The admission limit off: what is measured is the store's path.
        args = ["--max-inflight", "1000000"]
        a = harness.Service(redis.url, url, log_dir=tmp, args=args)
        b = harness.Service(redis.url, url, log_dir=tmp, args=args)
        s = harness.Service(redis.url, lite, log_dir=tmp, args=args)
        services = [a, b, s]
        rows = {}

        def add(name, v):
            rows.setdefault(name, []).append(v)

        for rnd in range(o.rounds):
            for c in conns:
                tag = "r%d-c%d" % (rnd, c)
                add("pgbench hot row c=%d" % c, pgbench(pg, "pgb", HOT_ROW, c, o.seconds, tmp))
                add("pgbench insert c=%d" % c, pgbench(pg, "pgb", INSERT_ONLY, c, o.seconds, tmp))
                for name, targets, db, strategy, sku in (
                        ("lua on postgresql", [a], url, "lua", "lp-"),
                        ("lua on sqlite", [s], lite, "lua", "ls-"),
                        ("db on postgresql", [a], url, "db", "dp-"),
                        ("lua on postgresql, 2 instances", [a, b], url, "lua", "l2-")):
                    name = "%s c=%d" % (name, c)
                    add(name, measured(name, lambda: flashload(
                        binary, targets, redis, db, strategy, c, o.seconds, sku + tag)))
            print("round %d of %d done" % (rnd + 1, o.rounds), file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in rows.items()}
        print("\norders/s, medians of %d round(s) of %g s (closed loop); for the service's "
              "runs, how busy the machine's CPUs were and its CPU time per order (load generator,"
              " service, Redis and PostgreSQL together), medians" % (o.rounds, o.seconds))
        for k, v in rows.items():
            cpu = ""
            if k in CPU:
                cpu = "  busy %3.0f%%, %4.0f us CPU/order" % (
                    100 * statistics.median(b for b, _ in CPU[k]),
                    statistics.median(u for _, u in CPU[k]))
            print("  %-40s %9.0f   (%s)%s" % (k, med[k], ", ".join("%.0f" % x for x in v), cpu))

        def ratio(x, y):
            # Per round, then the median: figures of one round share the machine's mood.
            return statistics.median(a / b for a, b in zip(rows[x], rows[y]))
        print("\ngoals (orders on PostgreSQL), ratios of the same round's figures, medians:")
        goals = []
        for c in conns:
            goals += [("lua on postgresql / lua on sqlite, c=%d" % c,
                       ratio("lua on postgresql c=%d" % c, "lua on sqlite c=%d" % c), 0.7),
                      ("lua on postgresql / pgbench insert, c=%d" % c,
                       ratio("lua on postgresql c=%d" % c, "pgbench insert c=%d" % c), 1.0),
                      ("db on postgresql / pgbench hot row, c=%d" % c,
                       ratio("db on postgresql c=%d" % c, "pgbench hot row c=%d" % c), 10.0),
                      ("2 instances / 1 on postgresql (lua), c=%d" % c,
                       ratio("lua on postgresql, 2 instances c=%d" % c,
                             "lua on postgresql c=%d" % c), 1.0)]
        for name, r, want in goals:
            print("  %-44s %6.2f  (>= %.1f) %s" % (name, r, want, "met" if r >= want else "NOT met"))
    finally:
        for s_ in services:
            if s_.proc.poll() is None:
                s_.stop()
        pg.stop()
        redis.stop()
        harness.stop_all()


if __name__ == "__main__":
    main()
