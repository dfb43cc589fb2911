"""test_hosts.py: flashsale on many hosts, and the faults between them
(docs/operations.md, "Running flashsale on many hosts"). Every host is a network namespace of this machine
(tests/hosts.py): Redis primary and replica, three sentinels, PostgreSQL,
three instances and the load generator each on a host of its own, joined
by a router in which a partition is cut. flashload's verifier, on its own
host, checks the books after every run.

Needs root (network namespaces); where the tests cannot run, each says why
and is skipped, never passed."""
import re

import harness
from hosts import Net, World, load_under_fault, split_brain


def world(ctx, **kw):
    why = Net.why_not()
    if why:
        raise harness.Skip(why)
    return World(ctx, **kw)


def passed(rc, so, se):
    assert rc == 0, so + se
    assert re.search(r"verdict    PASS \(checked: client, api, (redis, )?postgresql\)", so), so


def test_three_instances_on_three_hosts_sell_exactly(ctx):
    """No shared file, no shared loopback: three instances on hosts of
    their own sell one product through Sentinel and PostgreSQL, and the
    verifier on a fourth host finds every 201 a row and nothing oversold."""
    w = world(ctx)
    for strategy in ("lua", "lock", "db"):
        passed(*w.flashload("--sku", "h-" + strategy, "--strategy", strategy, "--stock", 2000,
                            "--requests", 5000, "--connections", 48, "--users", 500,
                            "--quantity", "1-2"))


def under_load(ctx, w, sku, strategy, fault, seconds=10, fault_at=2.0):
    """flashload for `seconds` on sku while fault(w) runs `fault_at` s in
    (hosts.load_under_fault). Returns the run's JSON and its text, after
    checking the verifier's PASS."""
    import json
    out = ctx.path(sku + ".json")
    rc, so, se = load_under_fault(w, out, sku, strategy, fault, seconds=seconds,
                                  fault_at=fault_at)
    passed(rc, so, se)
    return json.load(open(out)), so


def test_an_instance_cut_from_the_redis_primary(ctx):
    """app1 loses the Redis primary (and its replica) for 3 s while the
    others keep it: app1 answers 503 in bounded time, a reservation whose
    answer was lost in the cut is settled by the books (never a 201
    without its row), and the sale goes on through app2 and app3."""
    import time
    w = world(ctx)
    app1 = w.net["app1"]
    cut = {}

    def fault(w):
        for r in ("redis1", "redis2"):
            w.net.cut(app1, w.net[r], check=False)
        # Both checked at once (a check waits out its 1 s timeout).
        w.net.assert_cuts([(app1, w.net[r], 6379) for r in ("redis1", "redis2")])
        t = time.monotonic()
        time.sleep(3)
        w.net.heal()
        cut["s"] = time.monotonic() - t
    # The cut begins 2 s in, checked by 3 s; healed by 6 s, when the load ends.
    for strategy in ("lua", "lock"):
        j, so = under_load(ctx, w, "cut-redis-" + strategy, strategy, fault, seconds=6)
        codes = j["codes"]
        print("    %s: app1 cut from Redis for %.1f s: %d answered, %d created, codes %s, "
              "longest without a 201 %.0f ms" % (strategy, cut["s"], j["answered"], j["created"],
                                                 codes, j["max_sale_gap_ms"] or -1))
        assert sum(n for c, n in codes.items() if c.endswith("unavailable")) > 0, codes


def test_an_instance_cut_from_postgresql_mid_sale(ctx):
    """app1 loses PostgreSQL for 8 s while its groups commit (longer than
    a connection's 5 s bound): what app1 could not commit it answers 503,
    whatever was in a COMMIT when the network went is learned afterwards
    (never guessed: every 201 has its row), and the units of orders that
    did not commit go back."""
    import time
    w = world(ctx)
    app1 = w.net["app1"]

    def fault(w):
        w.net.cut(app1, w.net["pg1"], port=5432)
        time.sleep(8)
        w.net.heal()
    j, so = under_load(ctx, w, "cut-pg", "lua", fault, seconds=13)
    codes = j["codes"]
    print("    app1 cut from PostgreSQL for 8 s: %d answered, %d created, codes %s, longest "
          "without a 201 %.0f ms" % (j["answered"], j["created"], codes,
                                     j["max_sale_gap_ms"] or -1))
    assert any(c.startswith("db_") for c in codes), codes


def test_split_brain_the_old_primary_sells_nothing_twice(ctx):
    """The split brain in which Jepsen saw Redis lose acknowledged writes:
    the Redis primary (redis1) is cut from the sentinels, the replica and
    every instance but app1, which is cut from the rest instead; the
    sentinels promote redis2 and app2, app3 sell from it, while app1 goes
    on selling from the old primary. Then the network heals, and the old
    primary is made a replica (its writes since the cut are thrown away).
    Nothing is oversold and every 201 has its row: an order reserved in
    the old copy commits only under the generation it was reserved in,
    and the promoted copy is a new generation, rebuilt from the orders.
    `lock` here; `lua`, with its unsafe twin, is the between-hosts group's
    split-brain scene (test_flashload_compare_between_hosts_group)."""
    import json
    for strategy in ("lock",):
        w = world(ctx)
        sku = "split-" + strategy
        out = ctx.path(sku + ".json")
        rc, so, se, seen = split_brain(w, out, sku, strategy)
        passed(rc, so, se)
        j = json.load(open(out))
        gen = w.pg.psql("SELECT stock_gen FROM products WHERE sku='%s'" % sku,
                        dbname="flashsale")[0][0]
        print("    %s: redis2 promoted %.1f s after the cut; app1 ran %d commands on the old "
              "primary in the next 4 s; the old primary a replica %.1f s after the cut; the "
              "copy's generation now %s; %d answered, %d created, codes %s, longest without a "
              "201 %.0f ms" % (strategy, seen["promoted"], seen["old_commands"], seen["healed"],
                               gen, j["answered"], j["created"], j["codes"],
                               j["max_sale_gap_ms"] or -1))
        assert seen["old_commands"] > 0, "app1 ran nothing on the old primary: no split brain"
        assert j["verdict"]["oversold"] == 0 and j["verdict"]["lost"] == 0, j["verdict"]


def test_patroni_decides_the_failover(ctx):
    """PostgreSQL as operators run it (docs/operations.md, "Patroni decides
    the failover"): two Patroni nodes, etcd
    their store, synchronous_mode on (tests/patroni.py); app1 and app3
    reach the leader by the libpq multi-host URL, app2 through HAProxy and
    Patroni's REST check (GET /primary). Mid-sale, a planned switchover;
    then the leader's host killed (SIGKILL of Patroni, PostgreSQL and its
    backends): its synchronous standby is promoted once the leader key
    expires (ttl), and the killed node, started again, rejoins; last, the
    leader cut from etcd and from its replica: Patroni demotes it, and the
    instances commit nothing on it meanwhile (a COMMIT there waits for the
    standby in vain: canceled, answered 503, revoked). After each, app2
    sells through HAProxy on the new leader. Every run: the verifier's
    PASS, 0 lost, 0 oversold. Before the cut, the unsafe twin on the same
    cluster: synchronous_mode off, the leader cut from its replica 2 s then
    killed: the verifier finds 201s the promoted replica does not have."""
    import json
    import time
    from hosts import patroni_cut, patroni_kill, patroni_switchover
    import patroni
    w = world(ctx, standby="patroni", haproxy=True, via_proxy=(1,))
    app2 = w.apps[1]
    print("    Patroni cluster up in %.1f s: %s" % (w.patroni.bootstrap_s, {
        k: m["role"] for k, m in w.patroni.members().items()}))
    out = ctx.path("switchover.json")
    rc, so, se, seen = patroni_switchover(w, out, "pat-switchover", seconds=6)
    passed(rc, so, se)
    j = json.load(open(out))
    print("    switchover from %s: %.1f s; %d answered, %d created, codes %s, longest without a "
          "201 %.0f ms" % (seen["leader"], seen["switchover"], j["answered"], j["created"],
                           j["codes"], j["max_sale_gap_ms"] or -1))
    assert j["max_sale_gap_ms"] < 5000, j["max_sale_gap_ms"]
    assert w.patroni.leader().name != seen["leader"]
    assert app2.order("pat-switchover", user="after").status == 201      # HAProxy followed
    w.patroni.wait_healthy(60)
    out = ctx.path("kill.json")
    rc, so, se, seen = patroni_kill(w, out, "pat-kill", seconds=16)
    passed(rc, so, se)
    j = json.load(open(out))
    dead = w.patroni.node(seen["leader"])
    t = time.monotonic()
    dead.start()
    w.patroni.wait_healthy(90)
    print("    %s's host killed: %s promoted %.1f s after; %d answered, %d created, codes %s, "
          "longest without a 201 %.0f ms; the killed node rejoined %.1f s after its start"
          % (seen["leader"], w.patroni.leader().name, seen["promoted"], j["answered"],
             j["created"], j["codes"], j["max_sale_gap_ms"] or -1, time.monotonic() - t))
    assert seen["promoted"] < patroni.TTL + 5, seen
    assert j["verdict"]["lost"] == 0 and j["verdict"]["oversold"] == 0, j["verdict"]
    assert app2.order("pat-kill", user="after").status == 201
    # The unsafe twin, on the same cluster: synchronous_mode off (and any
    # lag allowed at a failover, as an availability-first setting has it),
    # the leader cut from its replica 2 s, then its host killed: Patroni
    # promotes a replica that lacks what the leader acknowledged meanwhile.
    w.patroni.configure(synchronous_mode=False, maximum_lag_on_failover=1 << 40)
    harness.wait_until(lambda: "sync_standby" not in [m.get("role") for m in
                                                      w.patroni.members().values()], 30,
                       step=0.2, what="Patroni to drop its synchronous standby")
    out = ctx.path("async.json")
    rc, so, se, seen = patroni_kill(w, out, "pat-async", seconds=18, cut_first=2.0)
    j = json.load(open(out))
    v = j["verdict"]
    print("    synchronous_mode off, %s cut from its replica 2 s then killed: promoted %.1f s "
          "after; verdict %s, %d units lost, %d orders confirmed by a 201 not recorded"
          % (seen["leader"], seen["promoted"], "PASS" if v["pass"] else "FAIL", v["lost"],
             v["created_without_order"]))
    assert rc == 1 and not v["pass"] and v["created_without_order"] > 0, (so + se)[-3000:]
    # Back to synchronous_mode; the killed node, whose acknowledged orders
    # the new leader lacks, rewinds and rejoins.
    w.patroni.node(seen["leader"]).start()
    w.patroni.configure(synchronous_mode=True, maximum_lag_on_failover=1048576)
    w.patroni.wait_healthy(90)
    out = ctx.path("cut.json")
    rc, so, se, seen = patroni_cut(w, out, "pat-cut", seconds=18)
    passed(rc, so, se)
    j = json.load(open(out))
    print("    %s cut from etcd and its replica: demoted in %.1f s, %s promoted in %.1f s, "
          "writable after demotion %.1f s; %d answered, %d created, codes %s, longest without "
          "a 201 %.0f ms" % (seen["leader"], seen["demoted"], w.patroni.leader().name,
                             seen["promoted"], seen["writable_after"], j["answered"],
                             j["created"], j["codes"], j["max_sale_gap_ms"] or -1))
    assert seen["writable_after"] == 0, seen
    # What matters is the order: the old leader stops taking writes before
    # another is promoted, so there are never two writable leaders.
    # Patroni's own promise (demoted within loop_wait + 2 x retry_timeout
    # <= ttl of its last renewal) is usually kept with seconds to spare
    # (4.5-8 s here) but drifts past the ttl when its Python loop shares a
    # loaded box (10.8 s once in CI): checked against the promotion instead.
    assert seen["demoted"] < seen["promoted"] < 2 * patroni.TTL + 5, seen
    assert j["verdict"]["lost"] == 0 and j["verdict"]["oversold"] == 0, j["verdict"]
    assert app2.order("pat-cut", user="after").status == 201


def test_postgresql_primary_cut_from_its_synchronous_standby(ctx):
    """The primary cut from its synchronous standby for 5 s mid-sale: a
    COMMIT there waits for the standby without end. The service cancels
    one after --db-commit-timeout-ms and answers its orders 503 (committed
    on the primary perhaps, never 201: a failover would lose them), then
    refuses each new group at once until the primary confirms a commit
    again. Every request is answered in bounded time, none wedges, the
    sale resumes after the heal, and the verifier finds every 201 a row."""
    import time
    timeout_ms = 2000
    w = world(ctx, standby="sync", service_args=("--db-commit-timeout-ms", str(timeout_ms)))
    n = w.net
    seen = {}

    def fault(w):
        n.cut(n["pg1"], n["pg2"], port=5432)
        seen["cut"] = time.monotonic()
        time.sleep(5)
        n.heal()
        seen["healed"] = time.monotonic()
    j, so = under_load(ctx, w, "pgsync-cut", "lua", fault, seconds=16, fault_at=3.0)
    lat_max = j["latency_us"]["max"] / 1000.0
    logs = "".join(open(a.log_path).read() for a in w.apps)
    canceled = logs.count("perhaps not on the standby")
    print("    primary cut from its sync standby for 5 s: %d answered, %d created, codes %s, "
          "longest without a 201 %.0f ms, slowest answer %.0f ms, COMMITs canceled %d"
          % (j["answered"], j["created"], j["codes"], j["max_sale_gap_ms"] or -1, lat_max,
             canceled))
    assert j["transport_errors"] == 0, j
    assert j["codes"].get("db_unavailable", 0) > 0, j["codes"]      # the cut was felt
    assert canceled > 0, "no COMMIT was canceled"
    # Bounded: a COMMIT's timeout, the cancel's answer, a probe; never the cut's length.
    assert lat_max < timeout_ms + 4000, lat_max
    # The sale resumed after the heal (the run goes on 8 s past it): once
    # the standby is back, which its walreceiver retries every 5 s
    # (wal_retrieve_retry_interval), and a probe confirms a commit.
    assert j["last_created_s"] > 3.0 + 5.0, j["last_created_s"]        # a 201 after the heal
    assert j["max_sale_gap_ms"] < 5000 + 7000, j["max_sale_gap_ms"]


def test_flapping_partitions(ctx):
    """For 20 s while orders flow, a partition is cut, healed and cut
    again, 0.7-2.5 s on and 0.5-1.5 s off (a seeded schedule, printed: 7-8
    cuts; 35 s of it made twice as many, and cost the suite 15 s more; a
    minute at 1-3 s each way made as many in three times the time): app1
    from the Redis primary and its replica, app2 from PostgreSQL, the
    primary from its synchronous standby -- one at a time, in a random
    order (the seed takes each at least twice).
    Every cut is checked to cut. The verifier then finds every 201 a row,
    nothing oversold and no order without a 201, and the sale goes on
    after the last heal."""
    import random
    import time
    w = world(ctx, standby="sync", service_args=("--db-commit-timeout-ms", "2000"))
    n = w.net
    rnd = random.Random(3101)
    faults = {
        "app1|redis": [("app1", "redis1", 6379), ("app1", "redis2", 6379)],
        "app2|pg1": [("app2", "pg1", 5432)],
        "pg1|pg2": [("pg1", "pg2", 5432)],
    }
    done = []

    def fault(w):
        end = time.monotonic() + 20
        while time.monotonic() < end:
            name = rnd.choice(sorted(faults))
            on, off = rnd.uniform(0.7, 2.5), rnd.uniform(0.5, 1.5)
            t = time.monotonic()
            for a, b, port in faults[name]:
                n.cut(n[a], n[b], port=port)         # checked: a cannot reach b:port
            time.sleep(max(0.0, on - (time.monotonic() - t)))
            n.heal()
            done.append("%s %.1fs" % (name, time.monotonic() - t))
            time.sleep(off)
        done.append("healed")
    j, so = under_load(ctx, w, "flap", "lua", fault, seconds=26, fault_at=3.0)
    v = j["verdict"]
    print("    %d cuts in 20 s: %s" % (len(done) - 1, ", ".join(done[:-1])))
    print("    %d answered, %d created, codes %s, longest without a 201 %.0f ms, slowest "
          "answer %.0f ms; verdict lost %d, oversold %d, orders without a 201 %d"
          % (j["answered"], j["created"], j["codes"], j["max_sale_gap_ms"] or -1,
             j["latency_us"]["max"] / 1000.0, v["lost"], v["oversold"],
             v["orders_without_201"]))
    assert len(done) >= 6, done
    assert all(sum(d.startswith(f) for d in done) >= 2 for f in faults), done
    assert j["transport_errors"] == 0, j
    # After the last heal the sale goes on: a new one on every instance.
    passed(*w.flashload("--sku", "flap-after", "--strategy", "lua", "--stock", 2000,
                        "--requests", 3000, "--connections", 24, "--users", 500))


def test_an_instance_killed_before_it_revokes_its_503s(ctx):
    """The primary cut from its synchronous standby: app3 cancels COMMITs,
    answers their orders 503 and marks them to be revoked -- then dies
    (SIGKILL) before the database confirms again. Its marks in Redis tell
    the other instances' sweeps to revoke those orders rather than keep
    the rows they find on the primary: no order stands beside a 503.
    Two holes this closed (2026-11-28; before, 2-7 orders without a 201
    in 3 of 4 runs): the mark was written by the repair thread after the
    503 (a kill in between left no mark), and a rebuild drops pending
    records, so a mark whose record was gone was never acted on; now the
    mark goes before the 503 and the sweeps revoke by the mark alone.
    (app3: flashload's verifier asks the first instance.)"""
    import time
    w = world(ctx, standby="sync", service_args=("--db-commit-timeout-ms", "1500"))
    n = w.net
    app3 = w.apps[2]

    def fault(w):
        n.cut(n["pg1"], n["pg2"], port=5432)
        time.sleep(5)
        app3.kill()
        time.sleep(1)
        n.heal()
    # app3's heartbeat lapses 5 s after the kill (at 8 s), the sweeps run
    # every 2 s: its orders are revoked by about 15 s; the load runs to 20.
    j, so = under_load(ctx, w, "pgsync-kill", "lua", fault, seconds=20, fault_at=3.0)
    # The sweeps name the owner of what they revoke: app3's host.
    revoked = sum(len(re.findall(r"owner \S*app3\S* gone or late; it was answered 503",
                                 open(a.log_path).read())) for a in w.apps[:2])
    print("    app3 killed mid-cut: %d answered, %d created, codes %s, transport errors %d; "
          "the others revoked %d of its orders answered 503; orders without a 201 %d"
          % (j["answered"], j["created"], j["codes"], j["transport_errors"], revoked,
             j["verdict"]["orders_without_201"]))
    assert revoked > 0, "no other instance revoked an order app3 answered 503"


def test_flashload_compare_between_hosts_group(ctx):
    """`flashload compare --groups between-hosts` (docs/comparison.md): the
    split brain under unsafe-trust-redis, on a deployment of its own made
    by tools/hosts_scene.py; in the table, report.json and report.html,
    the scene showing its flaw (units oversold). (Ours, lua under the same
    split brain, is test_split_brain_the_old_primary_sells_nothing_twice's
    -- run here too it cost the suite 30 s more; the group's Patroni
    scenes -- the leader killed with synchronous_mode off and on, cut off,
    switched over -- are test_patroni_decides_the_failover's, on one
    cluster; `make demo-hosts` runs them all, each on its own.)"""
    import json
    import os
    import subprocess
    if Net.why_not():
        raise harness.Skip(Net.why_not())
    out = ctx.path("cmp")
    os.makedirs(out)
    r = subprocess.run([os.path.join(harness.BIN, "flashload"), "compare", "--groups",
                        "between-hosts", "--strategies", "unsafe-trust-redis",
                        "--between-scenes", "split-brain",
                        "--out", out],
                       capture_output=True, text=True, timeout=600)
    print("\n".join("    " + line for line in r.stdout.strip().split("\n")[:12]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-- between hosts" in r.stdout and "between hosts, as done and seen:" in r.stdout
    rep = json.load(open(os.path.join(out, "report.json")))
    scenes = {(s["between"], s["strategy"]): s for s in rep["scenes"]}
    assert sorted(scenes) == [("split-brain", "unsafe-trust-redis")], sorted(scenes)
    for s in scenes.values():
        assert s["group"] == "between-hosts" and s["ran"] and s["as_expected"], s
    unsafe_split = scenes[("split-brain", "unsafe-trust-redis")]
    assert unsafe_split["unsafe"] and unsafe_split["oversold"] > 0, unsafe_split
    assert "app1 ran" in unsafe_split["detail"], unsafe_split
    html = open(os.path.join(out, "report.html")).read()
    assert "Between hosts" in html and "split brain" in html
