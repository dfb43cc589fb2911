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


def sku_on(c, primary, stem, taken=(), lane=None):
    """A SKU whose keys live on primary (a spread one's: its lane `lane`)."""
    for i in range(10000):
        sku = "%s%d" % (stem, i)
        tag = sku if lane is None else "%s:%d" % (sku, lane)
        if sku not in taken and c.owner(c.keyslot("fs:{%s}:gen" % tag)) is primary:
            return sku
    raise AssertionError("no SKU found on %r" % primary)


def test_cluster_sells_on_every_primary(ctx):
    c = ctx.cluster()
    s = ctx.service(c.url)
    skus = [sku_on(c, p, "cl") for p in c.primaries()]
    for sku in skus:
        s.create_product(sku, 300, strategy="lua")          # one segment: one slot
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
        assert int(p.cmd("GET", "fs:{%s}:stock:0" % sku)) == 0
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


def flow_through(ctx, fault, what, segments=8):
    """A hot SKU sold by 8 buyers while fault(cluster, primary, sku) runs:
    with segments > 1 a spread SKU whose lane 0 is on that primary (its
    other lanes on every primary), else a one-slot SKU on it. Returns the
    cluster, the service and the SKU; prints the times."""
    c = ctx.cluster()
    s = ctx.service(c.url)
    primary = c.primaries()[0]
    sku = sku_on(c, primary, "hot", lane=0 if segments > 1 else None)
    initial = 100000
    s.create_product(sku, initial, strategy="lua", segments=segments)
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
    assert refused <= {"redis_unavailable", "rebuilding"}, refused
    units = books(s, sku, initial, created)
    n503 = sum(1 for _, st, _ in answers if st == 503)
    times = sorted(a[0] for a in answers if a[1] == 201 and t0 - 1 <= a[0] <= first)
    gap = max((b - a for a, b in zip(times, times[1:])), default=0)
    print("    %s: %d sold exactly; the fault took %.1f s, the longest time without a 201 "
          "in it %.2f s; %d answered 503" % (what, units, done - t0, gap, n503))
    return c, s, sku


def reshard_slot_of(key, moved):
    """A fault: moves key's slot (and the slots below it on its primary)
    to the next primary with redis-cli --cluster reshard."""
    def reshard(c, primary, sku):
        slot = c.keyslot(key % sku)
        dst = c.primaries()[1]
        # redis-cli moves the source's lowest slots: as many as reach it.
        lo = min(e[0] for e in c.slot_map(primary) if e[2] == primary.port)
        moved["slots"] = c.reshard(primary, dst, slot - lo + 1)
        assert slot in moved["slots"]
        moved["dst"] = dst
    return reshard


def test_cluster_reshard_while_orders_flow(ctx):
    moved = {}
    c, s, sku = flow_through(ctx, reshard_slot_of("fs:{%s}:gen", moved),
                             "reshard of a one-slot SKU's slot", segments=1)
    dst = moved["dst"]
    gen = dst.cmd("GET", "fs:{%s}:gen" % sku)
    assert gen.split(":", 1)[1] == dst.info("server")["run_id"], gen


def test_cluster_reshard_of_a_lane_while_orders_flow(ctx):
    moved = {}
    c, s, sku = flow_through(ctx, reshard_slot_of("fs:{%s:0}:gen", moved),
                             "reshard of a spread SKU's lane 0 (8 lanes)")
    dst = moved["dst"]
    # The lane moved with its keys; the copy there names the old node until
    # the first order routed to it asks for a rebuild (the books above may
    # balance before that, from SQLite's figures): order until it is.
    run_id = dst.info("server")["run_id"]

    def rebuilt():
        s.order(sku, user="after")
        gen = dst.cmd("GET", "fs:{%s:0}:gen" % sku)
        return gen and gen.split(":", 1)[1] == run_id
    wait_until(rebuilt, 20, step=0.1, what="lane 0 rebuilt on its new primary")


def test_cluster_forced_failover_while_orders_flow(ctx):
    flow_through(ctx, lambda c, p, sku: c.fail_over(p),
                 "CLUSTER FAILOVER FORCE of a spread SKU's primary (8 lanes)")


def test_cluster_primary_killed_while_orders_flow(ctx):
    flow_through(ctx, lambda c, p, sku: c.kill_primary(p),
                 "a spread SKU's primary killed (SIGKILL, 8 lanes)")


def test_cluster_spreads_one_hot_sku_over_every_primary(ctx):
    """A spread SKU (8 lanes): its lanes on every primary, each sold from;
    orders larger than a lane taken in steps; the per-user limit (SQLite's)
    and idempotency keys exact across lanes."""
    c = ctx.cluster()
    s = ctx.service(c.url)
    s.create_product("wide", 800, strategy="lua", segments=8, per_user_limit=500)
    ports = set()
    for i in range(8):
        node = c.owner(c.keyslot("fs:{wide:%d}:gen" % i))
        assert int(node.cmd("GET", "fs:{wide:%d}:stock:0" % i)) == 100
        assert node.cmd("GET", "fs:{wide:%d}:gen" % i).endswith(node.info("server")["run_id"])
        ports.add(node.port)
    assert ports == {p.port for p in c.primaries()}, ports
    assert c.execute("EXISTS", "fs:{wide}:gen") == 0
    # Larger than any lane (100 each): taken in steps over lanes.
    big = s.order("wide", user="big", qty=250)
    assert big.status == 201, big
    assert s.product("wide")["stock_available"] == 550
    # The limit spans lanes: SQLite's, at commit.
    assert s.order("wide", user="big", qty=250).status == 201
    over = s.order("wide", user="big", qty=1)
    assert over.status == 409 and over.json["error"] == "per_user_limit", over
    assert over.json["bought"] == 500, over.json
    # An idempotency key, replayed until it lands on other lanes.
    first = s.order("wide", user="k", key="once")
    assert first.status == 201, first
    for _ in range(20):
        again = s.order("wide", user="k", key="once")
        assert again.status == 200 and again.json["order_id"] == first.json["order_id"], again
    # Sell out with many buyers and orders of 1..3: exact.
    answers = hammer([s], "wide", conns=8, per_conn=40, qty=3)
    created = [j for st, j in answers if st == 201]
    refused = {j["error"] for st, j in answers if st != 201}
    assert refused <= {"sold_out", "insufficient_stock"}, refused
    p = s.product("wide")
    sold = 500 + 1 + 3 * len(created)
    assert p["sold"] == sold and p["sold"] + p["stock_available"] == 800, (p, sold)
    lanes = [int(c.owner(c.keyslot("fs:{wide:%d}:gen" % i)).cmd("GET", "fs:{wide:%d}:stock:0" % i))
             for i in range(8)]
    assert sum(lanes) == p["stock_available"] and min(lanes) >= 0, lanes
    # Every committed order's pending records cleared, in every lane.
    wait_until(lambda: sum(c.execute("HLEN", "fs:{wide:%d}:pending" % i) for i in range(8)) == 0,
               10, what="the lanes' pending records cleared")
    print("    8 lanes on %d primaries; 250-unit orders in steps; limit and key exact; "
          "%d of 800 sold, lanes left %s" % (len(ports), p["sold"], lanes))


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


def test_cluster_flashload_verifies_orders_larger_than_a_lane(ctx):
    """flashload's verifier on a spread SKU (32 lanes of 200 units) whose
    orders are often larger than any one lane (taken in steps over several)
    and capped per user across lanes: sold with nothing oversold, no limit
    passed."""
    import os
    import subprocess
    c = ctx.cluster()
    s = ctx.service(c.url)
    p = subprocess.run([os.path.join(harness.BIN, "flashload"), "run",
                        "--target", "http://127.0.0.1:%d" % s.port, "--redis", c.url,
                        "--db", s.db_path, "--sku", "steps", "--stock", "6400",
                        "--strategy", "lua", "--segments", "32", "--quantity", "50-400",
                        "--per-user-limit", "600", "--users", "40", "--connections", "16",
                        "--duration", "4", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "PASS" in p.stdout, p.stdout[-3000:]
    rows = harness.db_rows(s.db_path, "SELECT user_id, sum(quantity) FROM orders"
                                      " WHERE sku='steps' GROUP BY user_id")
    assert rows and max(u for _, u in rows) <= 600, rows
    big = harness.db_rows(s.db_path, "SELECT count(*) FROM orders WHERE sku='steps'"
                                     " AND quantity > 200")[0][0]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("status", "stock", "verdict"))]
    print("    orders of 50-400 units over 32 lanes of 200, limit 600 a user: %d orders larger "
          "than a lane committed; %d users, most bought %d\n      %s"
          % (big, len(rows), max(u for _, u in rows), "\n      ".join(lines)))
