"""test_topologies.py: the real Redis topologies the tests will run the
service on (Sentinel and Cluster, as production runs Redis), checked by themselves first: harness.Sentinels and
harness.Cluster (tests/topology.py) must do what they say, or a later test
of the service on them proves nothing.

- Sentinel: a forced failover moves the primary and every sentinel names
  the new one; a replica cut off with cut_replica really misses the writes
  made meanwhile -- healed, it gets them; cut again and promoted after the
  primary is killed, the new primary lacks them.
- Cluster: six nodes made into three shards; a reshard with keys in the
  slots moved, read all along by a reader that follows MOVED and ASK;
  a forced failover and a primary killed, every key still readable.
"""
import threading

from harness import wait_until


def test_sentinel_failover_moves_the_primary(ctx):
    s = ctx.sentinels(replicas=2)
    assert s.url.startswith("redis-sentinel://") and s.url.endswith("/mymaster")
    assert s.url.count(",") == 2
    old = s.primary
    assert old.role() == "master" and len(s.replicas) == 2
    assert all(r.role() == "slave" for r in s.replicas)
    old.cmd("SET", "k", "v")
    assert old.cmd("WAIT", 2, 2000) == 2
    new = s.failover()
    assert new is not old and new.role() == "master"
    for sentinel in s.sentinels:                    # every one of them says so
        assert s.master_addr(sentinel) == ("127.0.0.1", new.port)
    assert new.cmd("GET", "k") == "v"


def test_cut_replica_misses_writes_and_is_promoted_without_them(ctx):
    s = ctx.sentinels(replicas=1)
    p, r = s.primary, s.replicas[0]
    p.cmd("SET", "before", "1")
    assert p.cmd("WAIT", 1, 2000) == 1 and r.cmd("GET", "before") == "1"

    # Cut: a write no replica acknowledges, absent on the replica even
    # after its reconnects (each refused).
    s.cut_replica(r)
    p.cmd("SET", "healed", "1")
    assert p.cmd("WAIT", 1, 300) == 0
    wait_until(lambda: "NOPERM" in r.logs(), 5, what="the replica's PSYNC to be refused")
    assert r.cmd("GET", "healed") is None
    # The control: healed, the replica gets it; so the cut was the cause.
    s.heal_replica(r)
    wait_until(lambda: r.cmd("GET", "healed") == "1", 5, what="the healed replica to catch up")

    # Cut again, write, kill the primary: the sentinels promote the replica
    # (its link down for a second only), which never had the write.
    s.cut_replica(r)
    p.cmd("SET", "lost", "1")
    assert p.cmd("WAIT", 1, 300) == 0
    assert r.cmd("GET", "lost") is None
    old = s.kill_primary()
    new = s.wait_failover(old.port)
    assert new is r and new.role() == "master"
    assert new.cmd("GET", "before") == "1" and new.cmd("GET", "healed") == "1"
    assert new.cmd("GET", "lost") is None                 # lost for good


def _keys_in(c, slots, n):
    """n keys whose slots are among slots, and n others."""
    inside, outside = [], []
    cli = c.live()[0].client()
    names = ["key:%d" % i for i in range(6000)]
    pipe = cli.pipeline(transaction=False)
    for k in names:
        pipe.execute_command("CLUSTER", "KEYSLOT", k)
    for k, slot in zip(names, pipe.execute()):
        (inside if slot in slots else outside).append(k)
    assert len(inside) >= n, len(inside)
    return inside[:n], outside[:n]


def test_cluster_reshard_and_failover_keep_keys_readable(ctx):
    c = ctx.cluster()
    assert c.url.startswith("redis-cluster://") and c.url.count(",") == 5
    primaries = c.primaries()
    assert len(primaries) == 3 and all(c.replica_of(p) for p in primaries)
    src, dst = primaries[0], primaries[1]
    lo = min(e[0] for e in c.slot_map(src) if e[2] == src.port)
    moving = set(range(lo, lo + 300))
    inside, outside = _keys_in(c, moving, 30)
    keys = inside + outside
    for k in keys:
        assert c.set(k, "v-" + k)

    # Reshard while a reader reads every key, following MOVED and ASK.
    stop, bad, reads = threading.Event(), [], [0]

    def reader():
        while not stop.is_set():
            for k in keys:
                try:
                    v = c.get(k)
                except Exception as e:  # noqa: BLE001 - recorded
                    v = repr(e)
                if v != "v-" + k:
                    bad.append((k, v))
                reads[0] += 1
    t = threading.Thread(target=reader)
    t.start()
    try:
        moved = c.reshard(src, dst, 300)
    finally:
        stop.set()
        t.join()
    assert moved == sorted(moving), (moved[:5], len(moved))
    assert bad == [] and reads[0] > len(keys), (bad[:5], reads[0])
    for k in inside:                  # really moved: dst has them, src redirects
        assert dst.cmd("GET", k) == "v-" + k
        try:
            src.cmd("GET", k)
            raise AssertionError("%s still served by the old owner" % k)
        except Exception as e:  # noqa: BLE001 - the MOVED expected
            assert str(e).startswith("MOVED ") and str(e).endswith(":%d" % dst.port), e

    # A forced failover of the shard that took the keys, then a primary
    # killed: the keys stay readable wherever they are now.
    new = c.fail_over(dst)
    assert new is not dst and new.role() == "master"
    wait_until(lambda: dst.role() == "slave", 10, what="the old primary to follow")
    assert all(c.get(k) == "v-" + k for k in keys)
    victim = primaries[2]
    heir = c.kill_primary(victim)
    assert heir.role() == "master" and victim not in c.primaries()
    assert all(c.get(k) == "v-" + k for k in keys)
    assert c.redirects["MOVED"] > 0
