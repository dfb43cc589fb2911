#!/usr/bin/python3
"""bench_cluster.py: one hot SKU on a Redis Cluster, its 8 lanes on one
primary against the same 8 lanes over three (the spread of docs/cluster.md), with a one-slot SKU
(all of it on one primary) beside them.

A real cluster of 3 primaries and no replicas (tests/topology.py) on free
loopback ports, one service on it, three products of 10^8 units:

  one-slot   `lua`, 1 segment: every key in one slot, on one primary
  lanes x1   `lua`, 8 segments, spread, each lane's slot then moved by hand
             to the first primary: 8 lanes, 1 primary
  lanes x3   `lua`, 8 segments, spread as the hash tags fall: 8 lanes over
             the 3 primaries

Each is sold by `flashload run` (closed loop, --connections, --seconds),
verified by flashload's own reader, in rounds that alternate the three, so
that the box's noise falls on all of them alike. Prints each run and the
medians, and the ratio lanes x3 / lanes x1.

What it cannot show on a small box: the primaries, the service and
flashload share its cores, so three primaries do not bring three times the
CPU. On separate machines, each primary does a third of a hot SKU's Redis
work (docs/cluster.md).

Usage: bench_cluster.py BIN [--connections N] [--seconds S] [--rounds R]
Every run is bounded (flashload --duration); the cluster is stopped by PID."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def run(binary, s, c, sku, conns, seconds):
    """One flashload run on sku: (orders/s, verdict line)."""
    p = subprocess.run([os.path.join(binary, "flashload"), "run",
                        "--target", "http://127.0.0.1:%d" % s.port, "--no-create",
                        "--sku", sku, "--connections", str(conns), "--duration", str(seconds),
                        "--redis", c.url, "--db", s.db_path, "--quiet"],
                       capture_output=True, text=True, timeout=seconds + 120)
    rate = re.search(r"requests\s+\d+ answered in [\d.]+ s: (\d+)/s", p.stdout)
    verdict = re.search(r"verdict\s+(\S+)", p.stdout)
    p99 = re.search(r"p99 (\S+)", p.stdout)
    return (int(rate.group(1)) if rate else 0, verdict.group(1) if verdict else "ERROR",
            p99.group(1) if p99 else "?", p.stdout if p.returncode else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    o = ap.parse_args()
    os.environ.setdefault("FLASHSALE_BIN", os.path.abspath(o.bin))
    import harness
    import topology
    d = tempfile.mkdtemp(prefix="bench-cluster-")
    c = topology.Cluster(primaries=3, replicas=0)
    s = None
    try:
        s = harness.Service(c.url, os.path.join(d, "orders.db"))
        first = c.primaries()[0]
        s.create_product("one-slot", 10 ** 8, strategy="lua", segments=1)
        s.create_product("lanes-x1", 10 ** 8, strategy="lua", segments=8)
        s.create_product("lanes-x3", 10 ** 8, strategy="lua", segments=8)
        for i in range(8):
            c.move_slot(c.keyslot("fs:{lanes-x1:%d}:gen" % i), first)
        where = {}
        for sku in ("lanes-x1", "lanes-x3"):
            where[sku] = sorted({c.owner(c.keyslot("fs:{%s:%d}:gen" % (sku, i))).port
                                 for i in range(8)})
        where["one-slot"] = [c.owner(c.keyslot("fs:{one-slot}:gen")).port]
        for sku in ("one-slot", "lanes-x1", "lanes-x3"):
            print("%-9s on primaries %s" % (sku, where[sku]))
            s.order(sku, user="warm")            # a moved lane is rebuilt on its new node
        harness.wait_until(lambda: all(s.order(k, user="warm").status == 201
                                       for k in ("one-slot", "lanes-x1", "lanes-x3")), 20,
                           what="every product selling")
        got = {"one-slot": [], "lanes-x1": [], "lanes-x3": []}
        bad = 0
        for r in range(o.rounds):
            for sku in got:
                rate, verdict, p99, out = run(o.bin, s, c, sku, o.connections, o.seconds)
                got[sku].append(rate)
                bad += verdict != "PASS"
                print("round %d  %-9s %6d orders/s  p99 %-8s verifier %s" %
                      (r + 1, sku, rate, p99, verdict), flush=True)
                if out:
                    print(out[-2000:])
        med = {k: statistics.median(v) for k, v in got.items()}
        print("medians (c=%d, %d s, %d rounds): one-slot %d, lanes x1 %d, lanes x3 %d orders/s; "
              "lanes x3 / lanes x1 = %.2f; lanes x1 / one-slot = %.2f" %
              (o.connections, o.seconds, o.rounds, med["one-slot"], med["lanes-x1"],
               med["lanes-x3"], med["lanes-x3"] / max(med["lanes-x1"], 1),
               med["lanes-x1"] / max(med["one-slot"], 1)))
        return 1 if bad else 0
    finally:
        if s:
            s.stop()
        c.stop()


if __name__ == "__main__":
    sys.exit(main())
