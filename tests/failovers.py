#!/usr/bin/python3
"""failovers.py: many Sentinel failovers under load, half of them to a
replica that missed writes, and the books after each (the service
must come through a failover of the Redis production runs, exact).

A primary, one replica and three sentinels (tests/topology.py), and one
bin/flashsale on the redis-sentinel:// URL. Four products -- lua with 1 and
8 segments, lock with 1 and 8 -- each bought by its own buyers, one unit at
a time, for the whole run. Each round:

  1. every other round, the replica is cut off from replication (the
     primary refuses its PSYNC): it misses every decrement and pending
     record from then on;
  2. sales go on for a moment on the primary alone;
  3. the primary is killed with SIGKILL; the sentinels promote the replica
     (stale, in a cut round);
  4. the time from the kill to each product's next 201 is taken;
  5. the old primary is restarted: the sentinels make it a replica of the
     new one, which it copies, and the next round starts from there.

At the end, after the buyers stopped and the copies settled, each
product's books: every 201 is an order row and every row a 201 (lost: a 201
with no row), sold + available == stock_initial and no segment below zero
(oversold: more units answered 201 than sold, or units sold twice).

Usage: tests/failovers.py [--rounds N] [--keep]   (FLASHSALE_BIN: bin dir)
Exit 1 when any product's books are wrong."""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("FLASHSALE_BIN", os.path.join(HERE, "..", "bin"))
import harness  # noqa: E402
from harness import Client, db_rows, wait_until  # noqa: E402

PRODUCTS = [("lua", 1), ("lua", 8), ("lock", 1), ("lock", 8)]
STOCK = 1_000_000


class Buyers:
    """conns connections per product ordering one unit each, all the run."""

    def __init__(self, port, skus, conns=3):
        self.port, self.stop_ = port, threading.Event()
        self.answers = {sku: [] for sku in skus}
        self.mu = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(sku, i))
                        for sku in skus for i in range(conns)]
        for t in self.threads:
            t.start()

    def run(self, sku, i):
        c = Client(self.port, timeout=10)
        n = 0
        while not self.stop_.is_set():
            n += 1
            sent = time.monotonic()
            try:
                r = c.post("/v1/orders", {"sku": sku, "user_id": "b%d-%d" % (i, n), "quantity": 1})
                item = (time.monotonic(), r.status, r.json, sent)
            except OSError:
                c.close()
                c = Client(self.port, timeout=10)
                item = (time.monotonic(), 0, None, sent)
            with self.mu:
                self.answers[sku].append(item)
            if item[1] != 201:
                time.sleep(0.01)
        c.close()

    def first_201_after(self, sku, t):
        """When the first order sent after t was answered 201."""
        with self.mu:
            times = [a[0] for a in self.answers[sku] if a[3] >= t and a[1] == 201]
        return min(times) if times else None

    def stop(self):
        self.stop_.set()
        for t in self.threads:
            t.join()


def books(s, sku, answers):
    """(units answered 201, lost 201s, oversold units, problems)."""
    created = {j["order_id"]: j["quantity"] for _, st, j, _ in answers if st == 201}
    rows = {r[0]: r[1] for r in db_rows(s.db_path, "SELECT order_id, quantity FROM orders "
                                                   "WHERE sku=?", (sku,))}
    lost = len(set(created) - set(rows))
    problems = []
    if set(rows) - set(created):
        problems.append("%d rows never answered 201" % len(set(rows) - set(created)))
    p = s.settled_product(sku)
    units = sum(created.values())
    oversold = max(0, p["sold"] + p["stock_available"] - STOCK) + max(0, units - p["sold"])
    if p["sold"] != sum(rows.values()):
        problems.append("sold %d but rows hold %d" % (p["sold"], sum(rows.values())))
    if p["sold"] + p["stock_available"] != STOCK:
        problems.append("sold %d + available %d != %d" % (p["sold"], p["stock_available"], STOCK))
    if min(p["segment_available"]) < 0:
        problems.append("a segment below zero")
    return units, lost, oversold, problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="failovers-")
    try:
        return run(a, tmp)
    finally:
        harness.stop_all()           # whatever a failure left running


def run(a, tmp):
    topo = harness.Sentinels(replicas=1)
    s = harness.Service(topo.url, os.path.join(tmp, "orders.db"))
    skus = []
    for strategy, segments in PRODUCTS:
        sku = "%s-%d" % (strategy, segments)
        s.create_product(sku, STOCK, strategy=strategy, segments=segments)
        skus.append(sku)
    buyers = Buyers(s.port, skus)
    recover = []          # (round, stale, sku, seconds from the kill to the next 201)
    ok = True
    try:
        wait_until(lambda: all(buyers.first_201_after(k, 0) for k in skus), 20, what="sales")
        for rnd in range(a.rounds):
            stale = rnd % 2 == 0
            primary, replica = topo.primary, topo.replicas[0]
            if stale:
                topo.cut_replica(replica)
            time.sleep(0.5)                            # sales the replica may miss
            old = topo.kill_primary()            # returns once the process is gone
            killed = time.monotonic()
            new = topo.wait_failover(old.port)
            for sku in skus:
                wait_until(lambda: buyers.first_201_after(sku, killed), 30,
                           what="a 201 of %s after round %d" % (sku, rnd))
                recover.append((rnd, stale, sku, buyers.first_201_after(sku, killed) - killed))
            worst = max(r[3] for r in recover if r[0] == rnd)
            print("round %2d: %s replica promoted (%d -> %d); every product sold again within "
                  "%.2f s of the kill" % (rnd + 1, "STALE" if stale else "synced", old.port,
                                          new.port, worst), flush=True)
            old.restart()
            topo.wait_synced(new.port, timeout=30)
        time.sleep(1)
    finally:
        buyers.stop()
    print("\nproduct   answered-201 units  lost 201s  oversold  next 201 after the kill: "
          "p50 / max (stale rounds p50 / max)")
    for sku in skus:
        wait_until(lambda: s.product(sku)["sold"] + s.product(sku)["stock_available"] == STOCK,
                   15, what="the copy of %s settled" % sku)
        units, lost, over, problems = books(s, sku, buyers.answers[sku])
        t = [r[3] for r in recover if r[2] == sku]
        ts = [r[3] for r in recover if r[2] == sku and r[1]]
        print("%-9s %18d %10d %9d  %.2f / %.2f s (%.2f / %.2f s)%s"
              % (sku, units, lost, over, statistics.median(t), max(t), statistics.median(ts),
                 max(ts), ("  PROBLEMS: " + "; ".join(problems)) if problems else ""))
        ok &= not problems and lost == 0 and over == 0
    s.stop()
    topo.stop()
    print("\n%d failovers (%d to a stale replica): %s" % (a.rounds, (a.rounds + 1) // 2,
                                                         "books exact" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
