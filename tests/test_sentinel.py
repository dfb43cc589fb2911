"""test_sentinel.py: the service on a Sentinel-watched Redis
(docs/operations.md, "On Redis Sentinel"),
against real redis-servers and real sentinels (tests/topology.py):

- it finds the primary through the sentinels, and after the primary is
  killed and a replica promoted, follows it by itself and sells again;
  every 201 is a committed row, nothing is sold twice;
- a promoted replica that missed writes never oversells: the replica is
  cut off (it misses the decrements and the pending records of the units
  sold meanwhile), the primary killed, the stale replica promoted. Its copy
  of the stock still names the old primary's run_id in its generation
  (docs/storage.md, `gen`), so the service finds it invalid for the server
  it now talks to and rebuilds it from SQLite (stock_initial - sold) before
  the next sale. Without that check the stale copy would sell again the
  units sold while the replica was cut off: the test counts them;
- the same for the `lock` strategy, whose lock and fence live on the lost
  primary too;
- `flashsale audit` and a bad URL.

What is asserted is counts and invariants; times are printed."""
import os
import subprocess
import threading
import time

import harness
from harness import Client, db_rows, wait_until


def flashsale(*args):
    return subprocess.run([os.path.join(harness.BIN, "flashsale")] + list(args),
                          capture_output=True, text=True, timeout=60)


def sold_rows(s, sku):
    rows = db_rows(s.db_path, "SELECT order_id, quantity FROM orders WHERE sku=?", (sku,))
    return {r[0]: r[1] for r in rows}


def books(s, sku, initial, created):
    """Every 201 is a row and the rows are all 201s; sold + available ==
    initial once the copy is good; returns the units sold."""
    ids = [j["order_id"] for j in created]
    assert len(set(ids)) == len(ids)
    rows = sold_rows(s, sku)
    assert sorted(rows) == sorted(ids), (len(rows), len(ids))
    units = sum(j["quantity"] for j in created)
    assert sum(rows.values()) == units
    # The copy is rebuilt by maintenance after a failover: read until it is.
    p = wait_until(lambda: (lambda p: p if p["sold"] + p["stock_available"] == initial
                            else None)(s.product(sku)), 15, what="the stock copy rebuilt")
    assert p["sold"] == units, (p, units)
    assert p["sold"] + p["stock_available"] == initial, p
    assert min(p["segment_available"]) >= 0, p
    return units


class Buyers:
    """conns connections ordering one unit each in a loop until stopped;
    keeps every answer with the time it came."""

    def __init__(self, s, sku, conns=8):
        self.s, self.sku, self.stop_ = s, sku, threading.Event()
        self.answers = []
        self.mu = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(conns)]
        for t in self.threads:
            t.start()

    def run(self, i):
        c = Client(self.s.port, timeout=10)
        n = 0
        try:
            while not self.stop_.is_set():
                n += 1
                try:
                    r = c.post("/v1/orders", {"sku": self.sku, "user_id": "b%d-%d" % (i, n),
                                              "quantity": 1})
                    item = (time.monotonic(), r.status, r.json)
                except OSError:
                    c.close()
                    c = Client(self.s.port, timeout=10)
                    item = (time.monotonic(), 0, None)
                with self.mu:
                    self.answers.append(item)
                if item[1] != 201:
                    time.sleep(0.01)
        finally:
            c.close()

    def created_since(self, t):
        with self.mu:
            return [a for a in self.answers if a[0] >= t and a[1] == 201]

    def stop(self):
        self.stop_.set()
        for t in self.threads:
            t.join()
        return self.answers


def test_service_follows_a_failover(ctx):
    topo = ctx.sentinels(replicas=1)
    s = ctx.service(topo.url)
    s.create_product("fo", 100000, strategy="lua", segments=4)
    buyers = Buyers(s, "fo")
    wait_until(lambda: len(buyers.created_since(0)) >= 100, 15, what="sales before the failover")
    killed = time.monotonic()
    old = topo.kill_primary()
    new = topo.wait_failover(old.port)
    promoted = time.monotonic()
    wait_until(lambda: buyers.created_since(promoted), 20, what="a 201 after the failover")
    back = min(a[0] for a in buyers.created_since(promoted))
    wait_until(lambda: len(buyers.created_since(back)) >= 100, 15, what="steady sales again")
    answers = buyers.stop()
    created = [j for _, st, j in answers if st == 201]
    refused = {j["error"] for _, st, j in answers if st not in (201, 0) and j}
    assert refused <= {"redis_unavailable"}, refused
    units = books(s, "fo", 100000, created)
    assert new.role() == "master"
    print("    %d sold; primary killed, replica promoted %.1f s later, next 201 %.2f s after "
          "the promotion (%.1f s after the kill); refused meanwhile: %s"
          % (units, promoted - killed, back - promoted, back - killed, sorted(refused)))


def sell(s, sku, n):
    """n one-unit orders, one by one; returns their answers (all 201)."""
    out = []
    for i in range(n):
        r = s.order(sku, user="pre-%d-%d" % (n, i))
        assert r.status == 201, r
        out.append(r.json)
    return out


def stale_replica_scene(ctx, strategy, segments):
    """Sells units the replica misses, promotes it, then sells out: returns
    (units sold in all, units the stale copy would have sold again)."""
    topo = ctx.sentinels(replicas=1)
    s = ctx.service(topo.url)
    sku = "stale-%s-%d" % (strategy, segments)
    initial = 200
    s.create_product(sku, initial, strategy=strategy, segments=segments)
    p, r = topo.primary, topo.replicas[0]
    created = sell(s, sku, 50)
    assert p.cmd("WAIT", 1, 2000) == 1                  # the replica has these 50
    topo.cut_replica(r)
    created += sell(s, sku, 80)                         # ...and misses these 80
    assert p.cmd("WAIT", 1, 300) == 0
    copy = sum(int(r.cmd("GET", "fs:{%s}:stock:%d" % (sku, i)) or 0) for i in range(segments))
    assert copy == initial - 50, copy                  # the replica's stale copy
    old = topo.kill_primary()
    new = topo.wait_failover(old.port)
    assert new is r
    # Sell out, by many buyers at once.
    from test_strategies import hammer
    answers = hammer([s], sku, conns=16, per_conn=20)
    created += [j for st, j in answers if st == 201]
    refused = {j["error"] for st, j in answers if st != 201}
    assert refused <= {"sold_out", "insufficient_stock", "redis_unavailable", "lock_timeout"}, \
        refused
    # Whatever the answers while the service moved over, sell what is left.
    wait_until(lambda: (sell_rest(s, sku, created) or True) and
               s.product(sku)["stock_available"] == 0, 20, what="the rest sold")
    units = books(s, sku, initial, created)
    assert units == initial, units
    return units, copy - (initial - 130)


def sell_rest(s, sku, created):
    for _ in range(50):
        r = s.order(sku, user="rest-%d" % len(created))
        if r.status == 201:
            created.append(r.json)
        elif r.status == 409:
            return


def test_stale_replica_promoted_never_oversells_lua(ctx):
    units, would = stale_replica_scene(ctx, "lua", 1)
    print("    lua: %d sold of 200, exactly; the stale copy would have sold %d units again"
          % (units, would))


def test_stale_replica_promoted_never_oversells_lock_segments(ctx):
    units, would = stale_replica_scene(ctx, "lock", 4)
    print("    lock x4: %d sold of 200, exactly; the stale copy would have sold %d units again"
          % (units, would))


def test_unsafe_trust_redis_oversells_on_a_stale_replica(ctx):
    """The same scene with Redis as the truth: the promoted replica's copy
    (50 units short of what was sold) is trusted, and sells again the 80
    units sold while the replica was cut off."""
    topo = ctx.sentinels(replicas=1)
    s = ctx.service(topo.url)
    initial = 200
    s.create_product("trust", initial, strategy="unsafe-trust-redis")
    p, r = topo.primary, topo.replicas[0]
    created = sell(s, "trust", 50)
    assert p.cmd("WAIT", 1, 2000) == 1
    topo.cut_replica(r)
    created += sell(s, "trust", 80)
    old = topo.kill_primary()
    topo.wait_failover(old.port)
    from test_strategies import hammer
    answers = hammer([s], "trust", conns=8, per_conn=30)
    created += [j for st, j in answers if st == 201]
    units = sum(j["quantity"] for j in created)
    rows = db_rows(s.db_path, "SELECT count(*) FROM orders WHERE sku='trust'")
    assert rows[0][0] == len(created)
    assert units == initial + 80, units               # the 80 units sold twice
    print("    unsafe-trust-redis: %d units answered 201 of %d: the %d sold while the replica "
          "was cut off, sold again" % (units, initial, units - initial))


def test_audit_and_bad_urls(ctx):
    topo = ctx.sentinels(replicas=1)
    s = ctx.service(topo.url)
    s.create_product("au", 10, strategy="lua")
    sell(s, "au", 3)
    s.stop()
    p = flashsale("audit", "--redis", topo.url, "--db", s.db_path)
    assert p.returncode == 0 and "audit: consistent" in p.stdout, p.stdout + p.stderr
    for url, want in (("redis-sentinel://127.0.0.1:1/", "master"),
                      ("redis-cluster://127.0.0.1:7000/3", "only database 0")):
        p = flashsale("--redis", url, "--db", ctx.path("x.db"), "--listen",
                                  "127.0.0.1:0")
        assert p.returncode == 2 and want in p.stderr, (url, p.stderr)
