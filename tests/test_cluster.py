"""test_cluster.py: the service on a Redis Cluster (docs/cluster.md), against a
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
- the `lock` strategy (its lock on the stock's own Redis, so on the
  cluster too): its locks and fences in the SKU's slot,
  sold exactly on every primary, through a reshard of that slot, a forced
  failover and a killed primary, and under flashload's verifier.

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


def test_cluster_sells_with_the_redis_lock(ctx):
    """The `lock` strategy on a cluster: each segment's lock and
    its fence keys live in the SKU's slot, on the primary serving it; a
    SKU per primary sells out exactly, one segment (the loop's two round
    trips) and four (orders larger than a segment take the blocking path,
    which locks several segments through the lock module)."""
    c = ctx.cluster()
    s = ctx.service(c.url)
    skus = [sku_on(c, p, "lk") for p in c.primaries()]
    for i, sku in enumerate(skus):
        s.create_product(sku, 300, strategy="lock", segments=1 if i == 0 else 4)
    answers = {sku: hammer([s], sku, conns=8, per_conn=50, qty=1 if i < 2 else 2)
               for i, sku in enumerate(skus)}
    for i, (sku, p) in enumerate(zip(skus, c.primaries())):
        created = [j for st, j in answers[sku] if st == 201]
        refused = {j["error"] for st, j in answers[sku] if st != 201}
        assert refused <= {"sold_out", "insufficient_stock", "lock_timeout"}, refused
        assert books(s, sku, 300, created) == 300
        # The lock's keys are on the SKU's primary, in its slot.
        fence = "fs:{%s}:lock:0:fence" % sku
        assert c.owner(c.keyslot(fence)) is p and p.cmd("EXISTS", fence) == 1, fence
    # An order larger than any segment of the 4-segment SKUs: locks several.
    s.create_product("lkbig", 40, strategy="lock", segments=4)
    big = s.order("lkbig", qty=25)
    assert big.status == 201, big
    assert s.product("lkbig")["stock_available"] == 15
    print("    lock on 3 primaries (1 and 4 segments): each sold out exactly, 300 of 300; "
          "an order of 25 over 4 segments of 10 took several locks")
    s.stop()
    p = flashsale("audit", "--redis", c.url, "--db", s.db_path)
    assert p.returncode == 0 and "audit: consistent" in p.stdout, p.stdout + p.stderr


def flow_through(ctx, fault, what, segments=8, strategy="lua"):
    """A hot SKU sold by 8 buyers while fault(cluster, primary, sku) runs:
    with segments > 1 a spread SKU whose lane 0 is on that primary (its
    other lanes on every primary), else a one-slot SKU on it. Returns the
    cluster, the service and the SKU; prints the times."""
    c = ctx.cluster()
    s = ctx.service(c.url)
    primary = c.primaries()[0]
    spread = strategy == "lua" and segments > 1
    sku = sku_on(c, primary, "hot", lane=0 if spread else None)
    initial = 100000
    s.create_product(sku, initial, strategy=strategy, segments=segments)
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
    assert refused <= {"redis_unavailable", "rebuilding", "lock_timeout"}, refused
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


def test_cluster_lock_reshard_while_orders_flow(ctx):
    """The `lock` strategy while its SKU's slot -- the stock, the locks and
    their fences -- moves to another primary."""
    moved = {}
    c, s, sku = flow_through(ctx, reshard_slot_of("fs:{%s}:gen", moved),
                             "lock: reshard of the SKU's slot (4 segments)", segments=4,
                             strategy="lock")
    assert c.owner(c.keyslot("fs:{%s}:lock:0:fence" % sku)) is moved["dst"]


def test_cluster_lock_forced_failover_while_orders_flow(ctx):
    flow_through(ctx, lambda c, p, sku: c.fail_over(p),
                 "lock: CLUSTER FAILOVER FORCE of the SKU's primary (4 segments)", segments=4,
                 strategy="lock")


def test_cluster_lock_primary_killed_while_orders_flow(ctx):
    flow_through(ctx, lambda c, p, sku: c.kill_primary(p),
                 "lock: the SKU's primary killed (SIGKILL, 4 segments)", segments=4,
                 strategy="lock")


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


def sku_low_on(c, primary, stem, within=64):
    """A SKU whose slot is among primary's lowest `within` (a reshard that
    moves the lowest slots up to it is then quick)."""
    lo = min(e[0] for e in c.slot_map(primary) if e[2] == primary.port)
    for i in range(200000):
        sku = "%s%d" % (stem, i)
        slot = c.keyslot("fs:{%s}:gen" % sku)
        if lo <= slot < lo + within and c.owner(slot) is primary:
            return sku
    raise AssertionError("no SKU found low on %r" % primary)


def flashload_through(ctx, fault, at_s, strategy, segments, what, low=False):
    """flashload's own verifier (which reads the cluster by itself,
    following MOVED) on a run with holds, while fault(cluster, primary,
    sku) runs at_s seconds into it on the SKU's primary."""
    import os
    import subprocess
    import threading
    c = ctx.cluster()
    s = ctx.service(c.url)
    primary = c.primaries()[0]
    sku = sku_low_on(c, primary, "fl") if low else sku_on(c, primary, "fl")
    faulter = threading.Timer(at_s, lambda: fault(c, primary, sku))
    faulter.start()
    try:
        p = subprocess.run([os.path.join(harness.BIN, "flashload"), "run",
                            "--target", "http://127.0.0.1:%d" % s.port, "--redis", c.url,
                            "--db", s.db_path, "--sku", sku, "--stock", "200000",
                            "--strategy", strategy, "--segments", str(segments),
                            "--connections", "16", "--duration", "8", "--hold-seconds", "2",
                            "--pay", "0.5", "--cancel", "0.2", "--quiet"],
                           capture_output=True, text=True, timeout=120)
    finally:
        faulter.join()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "PASS" in p.stdout, p.stdout[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()][-12:]
    print("    flashload on the cluster, %s:\n      " % what + "\n      ".join(lines))
    return c, s, sku


def test_cluster_flashload_verifies_across_a_failover(ctx):
    flashload_through(ctx, lambda c, p, sku: c.kill_primary(p), 3.0, "lua", 8,
                      "lua, primary killed at 3 s of 8")


def test_cluster_flashload_verifies_lock_through_a_reshard_and_a_failover(ctx):
    """The `lock` strategy under flashload's verifier: its SKU's slot --
    stock, locks, fences -- resharded to another primary at 1.5 s, then that
    primary killed (its replica takes over), both within the 8 s run."""
    moved = {}

    def both(c, primary, sku):
        t0 = time.monotonic()
        reshard_slot_of("fs:{%s}:gen", moved)(c, primary, sku)
        time.sleep(0.5)
        moved["kill_at"] = 1.5 + time.monotonic() - t0
        c.kill_primary(moved["dst"])
    c, s, sku = flashload_through(ctx, both, 1.5, "lock", 4,
                                  "lock (4 segments), slot resharded at 1.5 s, then its new "
                                  "primary killed", low=True)
    # Both faults happened within the run: the slot left its first primary
    # and then the one it moved to (dead now) for that one's replica.
    assert moved["kill_at"] < 6.0, (moved["kill_at"], len(moved["slots"]))
    owner = c.owner(c.keyslot("fs:{%s}:lock:0:fence" % sku))
    assert owner is not None and owner is not moved["dst"] and not moved["dst"].alive(), owner
    print("      (killed at %.1f s of 8; the slot is now on port %d)" % (moved["kill_at"], owner.port))


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


def test_cluster_lock_module_flashlock_and_redlock(ctx):
    """The lock module itself on a cluster URL: lockcheck's API
    checks; 4 processes x 15 holds of one lock, each a non-atomic fenced
    increment (no two holders at once, tokens rising, no lost update);
    Redlock with a cluster as one of its three members; and flashlock,
    4 processes x 8 guarded increments."""
    import shlex
    from test_lock_backends import fenced_holds, lockcheck, loop_workers
    from test_lock import flashlock_args, guarded_section, start
    c = ctx.cluster()
    p = lockcheck(c.url, "selftest", "--name", "self")
    assert p.returncode == 0, p.stdout + p.stderr
    # The lock's keys are in its name's slot, on the primary serving it.
    fence = "{self}:fence"
    assert c.owner(c.keyslot(fence)).cmd("EXISTS", fence) == 1
    counter = ctx.redis()
    fenced_holds(*loop_workers(ctx, c.url, counter, 4, 15, "clx"), 60)
    # Redlock: the cluster and two independent servers.
    a, b = ctx.redis(), ctx.redis()
    members = ["--url", a.url, "--url", b.url]
    fenced_holds(*loop_workers(ctx, c.url, counter, 3, 10, "clr", extra=members), 30)
    assert a.client().exists("{clr}:fence") and b.client().exists("{clr}:fence")
    # flashlock, as flock(1) across processes, with its lock on the cluster.
    loop = " ".join(shlex.quote(x) for x in
                    flashlock_args(c.url, "fl-procs", guarded_section(counter.port, "n"),
                                   ttl=5000, wait=30000))
    workers = [start(ctx, ["sh", "-c", "for i in $(seq 8); do %s || exit 1; done" % loop])
               for _ in range(4)]
    for w in workers:
        assert w.wait(120) == 0, w.stderr.read()
    r = counter.client()
    assert r.get("n") == "32" and r.get("overlaps") is None, (r.get("n"), r.get("overlaps"))
    print("    lock module on the cluster: selftest %s; 60 fenced holds by 4 processes, "
          "30 by Redlock (cluster + 2 servers), 32 flashlock'd increments: no overlap"
          % p.stdout.strip())


def test_cluster_waiting_room(ctx):
    """A waiting room on a cluster (docs/waiting-room.md): its keys are in the SKU's
    slot, on the primary that serves it, beside the stock; a SKU on each
    primary, a crowd each, verified; with the room, every unit to the
    first places of its line, and the room's keys where its stock is. A
    spread product (segments over the slots) has its room in the SKU's
    own slot and no cap by the units left (its stock is elsewhere): it
    sells too."""
    import json
    from test_flashload import flashload
    c = ctx.cluster()
    s = ctx.service(c.url)
    skus = [sku_on(c, p, "wr") for p in c.primaries()[:2]]
    for sku, p in zip(skus, c.primaries()):
        out = ctx.path(sku + ".json")
        rc, so, se = flashload("--target", "http://127.0.0.1:%d" % s.port, "--redis", c.url,
                               "--db", s.db_path, "--sku", sku, "--stock", 300, "--crowd", 1500,
                               "--ramp", 0.3, "--impatient", 0.2, "--waiting-room",
                               "--connections", 64, "--json", out, timeout=120)
        assert rc == 0 and "verdict    PASS" in so, so + se
        crowd = json.load(open(out))["crowd"]
        assert crowd["winners"] == 300 and crowd["no_final"] == 0, crowd
        assert crowd["first_place_share"] >= 0.99, crowd
        room = "fs:{%s}:room" % sku
        assert c.owner(c.keyslot(room)) is p and p.cmd("EXISTS", room) == 1, room
        print("    %s: %.1f%% of the units to the first 300 places, %.1f%% to the first 300 "
              "arrivals" % (sku, 100 * crowd["first_place_share"], 100 * crowd["first_s_share"]))
    rc, so, se = flashload("--target", "http://127.0.0.1:%d" % s.port, "--redis", c.url,
                           "--db", s.db_path, "--sku", "wrspread", "--stock", 200, "--segments",
                           8, "--crowd", 600, "--ramp", 0.2, "--waiting-room", "--room-rate",
                           2000, "--connections", 32, timeout=120)
    assert rc == 0 and "verdict    PASS" in so, so + se
