#!/usr/bin/python3
"""bench_pgscale.py: many instances on one PostgreSQL, measured (make
bench-pgscale; docs/operations.md, "Many instances on one PostgreSQL").

On a throwaway PostgreSQL server with its default max_connections (100)
and one Redis, round after round (the machines are shared and noisy:
medians of rounds, ratios of figures from the same round):

  ten / two     ten instances, then two, each at the default connection
                budget (--db-max-connections 8), sell three products at
                once -- lua (64 connections, then 1,024: a closed loop of
                64 leaves each of ten instances 6 orders in flight, a
                crowd's thousands of buyers many more), db-for-update and
                db-lock (16 each) -- every run verified by flashload; meanwhile a
                psql connects every 100 ms, and each refusal is counted,
                as is the most connections the server held for the orders'
                database
  pooled        one instance through PgBouncer in transaction pooling
                (pool of 20 server connections), then the same instance's
                twin straight to the server: lua at 64 connections, both
                verified

Prints the table and its goals with met / NOT met:
  - ten instances sell lua at >= 0.8 of what two sell, with the verifier's
    PASS everywhere and no psql refused;
  - lua through PgBouncer (transaction pooling) >= 0.8 of direct.

Usage: bench_pgscale.py BIN [--seconds S] [--rounds R] [--quick] [--lua-connections N,...]
                        [--lua-alone]"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import harness  # noqa: E402
import pgserver  # noqa: E402


def flashload(binary, targets, redis, db, strategy, conns, seconds, sku, stock):
    """One verified run; (201s per second, the verdict's line, rc)."""
    args = [os.path.join(binary, "flashload")]
    for t in targets:
        args += ["--target", "http://127.0.0.1:%d" % t.port]
    args += ["--redis", redis.url, "--db", db, "--sku", sku, "--strategy", strategy,
             "--stock", str(stock), "--duration", str(seconds), "--connections", str(conns),
             "--quiet"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 180)
    m = re.search(r"status\s+201: (\d+)", r.stdout)
    w = re.search(r"^requests\s+\d+ answered in ([\d.]+) s", r.stdout, re.M)
    v = re.search(r"^verdict\s+(.*)$", r.stdout, re.M)
    rate = int(m.group(1)) / float(w.group(1)) if m and w else 0.0
    return rate, v.group(1) if v else "no verdict: " + (r.stdout + r.stderr)[-300:], r.returncode


def psql_prober(pg, stop, out):
    """Connects every 100 ms until stop is set: out gets tries, refusals, and
    the most connections the instances (application_name flashsale) held."""
    tries = refused = peak = 0
    while not stop.is_set():
        r = subprocess.run(["psql", "-h", pg.ip, "-p", str(pg.port), "-U", "postgres", "-d",
                            "postgres", "-Atc", "SELECT count(*) FROM pg_stat_activity WHERE "
                            "datname = 'flashsale' AND application_name = 'flashsale'"],
                           capture_output=True, text=True, timeout=30)
        tries += 1
        if r.returncode != 0:
            refused += 1
        else:
            peak = max(peak, int(r.stdout.strip() or 0))
        time.sleep(0.1)
    out.update(tries=tries, refused=refused, peak=peak)


def mixed(binary, services, redis, url, seconds, tag, lua_conns=64, alone=False):
    """lua (lua_conns connections), db-for-update and db-lock at once on
    services (alone: lua only); (lua 201/s, [verdicts], prober figures)."""
    runs, probe, stop = {}, {}, threading.Event()
    specs = (("lua", lua_conns, 100000000), ("db-for-update", 16, 1000000), ("db-lock", 16, 1000000))
    if alone:
        specs = specs[:1]

    def one(strategy, conns, stock):
        runs[strategy] = flashload(binary, services, redis, url, strategy, conns, seconds,
                                   "%s-%s" % (strategy, tag), stock)
    threads = [threading.Thread(target=one, args=s) for s in specs]
    prober = threading.Thread(target=psql_prober, args=(pg_of[0], stop, probe))
    prober.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    prober.join()
    return runs["lua"][0], {k: v for k, v in runs.items()}, probe


pg_of = [None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 s, 1 round")
    ap.add_argument("--lua-connections", default="64,1024",
                    help="the mixed runs' lua connections, a list: each is a pair of runs")
    ap.add_argument("--lua-alone", action="store_true",
                    help="the pairs sell lua only (no db-for-update, no db-lock beside it)")
    o = ap.parse_args()
    if o.quick:
        o.seconds, o.rounds = 2, 1
    binary = os.path.abspath(o.bin)
    os.environ["FLASHSALE_BIN"] = binary
    harness.BIN = binary
    tmp = tempfile.mkdtemp(prefix="fs-bench-pgscale-")
    redis = harness.Redis()
    pg = pgserver.Postgres(settings={"max_connections": "100"})
    pg_of[0] = pg
    bouncer = None
    services = []
    rows, verdicts, probes = {}, [], []
    try:
        url = pg.database("flashsale")
        bouncer = pgserver.PgBouncer(pg, mode="transaction", pool_size=20)
        ten = [harness.Service(redis.url, url, log_dir=tmp) for _ in range(10)]
        services += ten
        via = harness.Service(redis.url, bouncer.url("flashsale"), log_dir=tmp)
        services.append(via)
        conns = [int(c) for c in o.lua_connections.split(",")]
        for rnd in range(o.rounds):
            for c in conns:
                for name, group in (("ten instances", ten), ("two instances", ten[:2])):
                    rate, runs, probe = mixed(binary, group, redis, url, o.seconds,
                                              "%s-%d-%d" % (name[:3], c, rnd), c, o.lua_alone)
                    rows.setdefault("lua, %s, c=%d" % (name, c), []).append(rate)
                    for s, (r, v, rc) in runs.items():
                        if s != "lua":
                            rows.setdefault("%s, %s, c=%d" % (s, name, c), []).append(r)
                        verdicts.append(("%s, %s, c=%d" % (s, name, c), v, rc))
                    probes.append(("%s, c=%d" % (name, c), probe))
            for name, target in (("lua through PgBouncer (transaction)", via),
                                 ("lua direct", ten[2])):
                r, v, rc = flashload(binary, [target], redis, url, "lua", 64, o.seconds,
                                     "p-%s-%d" % (name[:9].replace(" ", ""), rnd), 100000000)
                rows.setdefault(name, []).append(r)
                verdicts.append((name, v, rc))
            print("round %d of %d done" % (rnd + 1, o.rounds), file=sys.stderr, flush=True)
        print("\n201s/s, medians of %d round(s) of %g s (closed loop; ten and two instances "
              "sell %s, lua at c connections)" % (o.rounds, o.seconds,
                                                  "lua alone" if o.lua_alone else
                                                  "three products at once"))
        for k, v in rows.items():
            print("  %-46s %9.0f   (%s)" % (k, statistics.median(v),
                                            ", ".join("%.0f" % x for x in v)))
        print("\npsql during the mixed runs: %s" % "; ".join(
            "%s: %d connects, %d refused, the instances held at most %d connections"
            % (n, p.get("tries", 0), p.get("refused", 0), p.get("peak", 0)) for n, p in probes))
        bad = [(n, v) for n, v, rc in verdicts if rc != 0 or not v.startswith("PASS")]
        print("verifier: %d runs, %d not PASS%s" % (len(verdicts), len(bad),
                                                    "".join("\n  %s: %s" % b for b in bad)))

        def ratio(x, y):
            return statistics.median(a / b for a, b in zip(rows[x], rows[y]) if b > 0)
        refused = sum(p.get("refused", 0) for _, p in probes)
        print("\ngoals (many instances on one PostgreSQL), ratios of the same round's figures, medians:")
        for name, r, want in [
                ("ten / two instances (lua, %s, c=%d)" % ("alone" if o.lua_alone else "mixed", c),
                 ratio("lua, ten instances, c=%d" % c, "lua, two instances, c=%d" % c), 0.8)
                for c in conns] + [
                ("PgBouncer transaction / direct (lua, c=64)",
                 ratio("lua through PgBouncer (transaction)", "lua direct"), 0.8)]:
            print("  %-46s %6.2f  (>= %.1f) %s" % (name, r, want, "met" if r >= want else
                                                   "NOT met"))
        print("  %-46s %6d  (0)     %s" % ("psql refused during the mixed runs", refused,
                                           "met" if refused == 0 else "NOT met"))
        print("  %-46s %6d  (0)     %s" % ("runs without the verifier's PASS", len(bad),
                                           "met" if not bad else "NOT met"))
    finally:
        for s_ in services:
            if s_.proc.poll() is None:
                s_.stop()
        if bouncer:
            bouncer.stop()
        pg.stop()
        redis.stop()
        harness.stop_all()


if __name__ == "__main__":
    main()
