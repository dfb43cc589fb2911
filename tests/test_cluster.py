"""test_cluster.py: the service on a Redis Cluster (issue 21), against a
real 6-node cluster (3 primaries, 3 replicas; tests/topology.py):

- `--redis redis-cluster://...`: each SKU's keys live in the slot of its
  hash tag {sku} (docs/storage.md), so on the primary serving that slot;
  SKUs spread over the primaries, and every primary sells;
- idempotency keys and the per-user limit stay exact (all of a SKU's keys
  are in one slot, so one script checks them);
- resharding a hot SKU's slot to another primary while orders flow
  (`redis-cli --cluster reshard`), a forced failover of its primary
  (CLUSTER FAILOVER FORCE) and a primary killed with SIGKILL: nothing is
  sold twice, no 201 is lost, and sales go on. The copy that lands on a
  node other than the one it was built on names the old node's run_id in
  its generation, so it is found invalid there and rebuilt from SQLite
  before the next sale;
- the strategies whose lock lives on the service's own Redis are refused
  on a cluster, with the reason.

What is asserted is counts and invariants; times are printed."""
import time

import harness

from harness import wait_until
from test_sentinel import Buyers, books, flashsale
from test_strategies import hammer


def sku_on(c, primary, stem, taken=()):
    """A SKU whose keys live on primary."""
    for i in range(10000):
        sku = "%s%d" % (stem, i)
        if sku not in taken and c.owner(c.keyslot("fs:{%s}:gen" % sku)) is primary:
            return sku
    raise AssertionError("no SKU found on %r" % primary)


def test_cluster_sells_on_every_primary(ctx):
    c = ctx.cluster()
    s = ctx.service(c.url)
    skus = [sku_on(c, p, "cl") for p in c.primaries()]
    for sku in skus:
        s.create_product(sku, 300, strategy="lua", segments=4)
    answers = {sku: hammer([s], sku, conns=8, per_conn=50) for sku in skus}
    for sku, p in zip(skus, c.primaries()):
        created = [j for st, j in answers[sku] if st == 201]
        refused = {j["error"] for st, j in answers[sku] if st != 201}
        assert len(created) == 300, (sku, len(created), refused)
        assert refused <= {"sold_out"}, refused
        assert books(s, sku, 300, created) == 300
        # The copy is on the SKU's primary, built for it (its run_id).
        gen = p.cmd("GET", "fs:{%s}:gen" % sku)
        assert gen and gen.split(":", 1)[1] == p.info("server")["run_id"], gen
        assert sum(int(p.cmd("GET", "fs:{%s}:stock:%d" % (sku, i))) for i in range(4)) == 0
    print("    3 SKUs, one per primary (ports %s), each sold out exactly: 300 of 300"
          % [p.port for p in c.primaries()])
    s.stop()
    p = flashsale("audit", "--redis", c.url, "--db", s.db_path)
    assert p.returncode == 0 and "audit: consistent" in p.stdout, p.stdout + p.stderr


def test_cluster_keys_and_limits_stay_exact(ctx):
    c = ctx.cluster()
    s = ctx.service(c.url)
    s.create_product("lim", 100, strategy="lua", segments=8, per_user_limit=3)
    first = s.order("lim", user="ann", key="k-1")
    assert first.status == 201, first
    again = s.order("lim", user="ann", key="k-1")
    assert again.status == 200 and again.json["order_id"] == first.json["order_id"], again
    assert s.order("lim", user="ann", qty=2).status == 201
    over = s.order("lim", user="ann")
    assert over.status == 409 and over.json["error"] == "per_user_limit", over
    # An order larger than a segment (100 / 8 = 12 or 13 each).
    big = s.order("lim", user="bob", qty=3)
    assert big.status == 201, big
    p = s.product("lim")
    assert p["sold"] == 6 and p["stock_available"] == 94, p


def test_cluster_refuses_locks_on_its_own_redis(ctx):
    c = ctx.cluster()
    s = ctx.service(c.url)
    r = s.post("/v1/products", {"sku": "lk", "name": "Lk", "stock": 10, "strategy": "lock"})
    assert r.status == 400, r
    assert "Cluster" in r.json["message"], r.json


def flow_through(ctx, fault, what):
    """A hot SKU sold by 8 buyers while fault(cluster, its primary) runs;
    returns the books and prints the times."""
    c = ctx.cluster()
    s = ctx.service(c.url)
    primary = c.primaries()[0]
    sku = sku_on(c, primary, "hot")
    initial = 100000
    s.create_product(sku, initial, strategy="lua", segments=8)
    buyers = Buyers(s, sku)
    wait_until(lambda: len(buyers.created_since(0)) >= 200, 15, what="sales before the fault")
    t0 = time.monotonic()
    fault(c, primary, sku)
    done = time.monotonic()
    wait_until(lambda: len(buyers.created_since(done)) >= 200, 20, what="sales after the fault")
    first = min(a[0] for a in buyers.created_since(done))
    answers = buyers.stop()
    created = [j for _, st, j in answers if st == 201]
    refused = {j["error"] for _, st, j in answers if st not in (201, 0) and j}
    assert refused <= {"redis_unavailable"}, refused
    units = books(s, sku, initial, created)
    n503 = sum(1 for _, st, _ in answers if st == 503)
    times = sorted(a[0] for a in answers if a[1] == 201 and t0 - 1 <= a[0] <= first)
    gap = max((b - a for a, b in zip(times, times[1:])), default=0)
    print("    %s: %d sold exactly; the fault took %.1f s, the longest time without a 201 "
          "in it %.2f s; %d answered 503" % (what, units, done - t0, gap, n503))
    return c, s, sku


def test_cluster_reshard_while_orders_flow(ctx):
    moved = {}

    def reshard(c, primary, sku):
        slot = c.keyslot("fs:{%s}:gen" % sku)
        dst = c.primaries()[1]
        # The SKU's slot and its neighbours: redis-cli moves the lowest
        # slots of the source, so move them down to the SKU's one.
        lo = min(e[0] for e in c.slot_map(primary) if e[2] == primary.port)
        moved["slots"] = c.reshard(primary, dst, slot - lo + 1)
        assert slot in moved["slots"]
        moved["dst"] = dst
    c, s, sku = flow_through(ctx, reshard, "reshard of the SKU's slot")
    dst = moved["dst"]
    gen = dst.cmd("GET", "fs:{%s}:gen" % sku)
    assert gen.split(":", 1)[1] == dst.info("server")["run_id"], gen


def test_cluster_forced_failover_while_orders_flow(ctx):
    flow_through(ctx, lambda c, p, sku: c.fail_over(p), "CLUSTER FAILOVER FORCE")


def test_cluster_primary_killed_while_orders_flow(ctx):
    flow_through(ctx, lambda c, p, sku: c.kill_primary(p), "primary killed (SIGKILL)")


def test_cluster_flashload_verifies_across_a_failover(ctx):
    """flashload's own verifier (which reads the cluster by itself,
    following MOVED) passes on a run with holds, while the SKU's primary
    is killed in the middle of it."""
    import os
    import subprocess
    import threading
    c = ctx.cluster()
    s = ctx.service(c.url)
    primary = c.primaries()[0]
    sku = sku_on(c, primary, "fl")
    killer = threading.Timer(3.0, lambda: c.kill_primary(primary))
    killer.start()
    try:
        p = subprocess.run([os.path.join(harness.BIN, "flashload"), "run",
                            "--target", "http://127.0.0.1:%d" % s.port, "--redis", c.url,
                            "--db", s.db_path, "--sku", sku, "--stock", "200000",
                            "--strategy", "lua", "--segments", "8", "--connections", "16",
                            "--duration", "8", "--hold-seconds", "2", "--pay", "0.5",
                            "--cancel", "0.2", "--quiet"],
                           capture_output=True, text=True, timeout=120)
    finally:
        killer.join()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "PASS" in p.stdout, p.stdout[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()][-12:]
    print("    flashload on the cluster, primary killed at 3 s of 8:\n      " +
          "\n      ".join(lines))
