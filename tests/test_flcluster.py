"""test_flcluster.py: flashload's own Redis reader on a real Redis Cluster
(docs/cluster.md).

flashload's verifier reads the service's Redis by docs/storage.md with
plain hiredis, sharing no routing code with the service (loadtest/stores/cluster.c
follows the cluster's redirections by itself). The service does not run on
a cluster yet, so these tests write SKUs' keys in the documented format by
hand into a real 6-node cluster (tests/topology.py), with a matching SQLite
file, and read them with `flashload inspect` -- the verifier's reads of
given SKUs without a load run. What must hold:

- each SKU's reads go to the primary serving its hash tag {sku}, whichever
  seed the URL names first; a MOVED is followed once per SKU, and the next
  reads of that SKU go straight to its node (the nodes' own command
  counters say so, not only flashload);
- after the SKU's slot moves (CLUSTER SETSLOT), the reader follows MOVED to
  the new owner, and the copy, whose gen names the old owner's run_id, is
  reported invalid exactly as on a single server whose run_id it is not;
  rewritten for the new owner, it passes;
- a slot being migrated: ASK is followed with ASKING (and the copy judged
  by the run_id of the node that answered the ASK); a half-migrated SKU
  gets TRYAGAIN, waited out while the move finishes, and given up after a
  bounded wait when it does not;
- a dead first seed: the next seed is used;
- a bad redis-cluster:// URL: a clear usage error;
- a product spread over the cluster (a lua product of segments > 1: lane i
  a one-segment copy under {<sku>:<i>}, no {<sku>} key at all), written
  with its lanes on different primaries: each lane read on its own node
  and judged by that node's run_id, the units and pending units summed
  over lanes, an order taken in steps (a record per lane) counted in each;
  lanes of two generations, a missing lane and a lane whose slot moved
  (its gen naming the old owner) each make the copy invalid."""
import sqlite3
import subprocess
import time

import harness
from harness import free_port, wait_until
from test_flashload import FLASHLOAD, flashload

PREFIX = "fs:"
SCHEMA = """
PRAGMA user_version = 6;
CREATE TABLE products(sku TEXT PRIMARY KEY, name TEXT NOT NULL, strategy TEXT NOT NULL,
  segments INTEGER NOT NULL, per_user_limit INTEGER NOT NULL, stock_initial INTEGER NOT NULL,
  sold INTEGER NOT NULL, stock_gen INTEGER NOT NULL,
  db_available INTEGER NOT NULL CHECK(db_available >= 0), db_version INTEGER NOT NULL,
  cs_delay_ms INTEGER NOT NULL, lock_ttl_ms INTEGER NOT NULL, created_at TEXT NOT NULL,
  hold_seconds INTEGER NOT NULL DEFAULT 0, held INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE orders(order_id TEXT PRIMARY KEY, sku TEXT NOT NULL, user_id TEXT NOT NULL,
  quantity INTEGER NOT NULL CHECK(quantity > 0), idempotency_key TEXT UNIQUE,
  created_at TEXT NOT NULL);
CREATE INDEX orders_by_sku ON orders(sku, order_id);
CREATE TABLE holds(order_id TEXT PRIMARY KEY, sku TEXT NOT NULL,
  quantity INTEGER NOT NULL CHECK(quantity > 0), gen INTEGER NOT NULL, takes TEXT NOT NULL,
  in_db INTEGER NOT NULL, expires_ms INTEGER NOT NULL, state TEXT NOT NULL,
  decided_ms INTEGER, payment_ref TEXT, return_gen INTEGER) WITHOUT ROWID;
CREATE TABLE voided_orders(order_id TEXT PRIMARY KEY, sku TEXT NOT NULL, reason TEXT NOT NULL,
  voided_at TEXT NOT NULL) WITHOUT ROWID;
"""
STOCK, SOLD, GEN = 100, 10, 3


def key(sku, suffix):
    """The documented name of one of sku's keys: <prefix>{<sku>}:<suffix>."""
    return "%s{%s}:%s" % (PREFIX, sku, suffix)


def make_db(path, skus):
    """A SQLite file in the documented schema (docs/storage.md), one product
    per (sku, segments[, strategy]) (`lua` unless given), SOLD of its STOCK
    units sold in one order."""
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    for i, (sku, segments, *strategy) in enumerate(skus):
        con.execute("INSERT INTO products VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, 0, 0, 0,"
                    " '2026-11-26T00:00:00.000Z', 0, 0)",
                    (sku, sku, (strategy or ["lua"])[0], segments, STOCK, SOLD, GEN, STOCK))
        con.execute("INSERT INTO orders VALUES (?, ?, 'u1', ?, NULL, '2026-11-26T00:00:00.000Z')",
                    ("01M8%022dZ" % i, sku, SOLD))
    con.commit()
    con.close()


def copy_keys(sku, segments, run_id, units=STOCK - SOLD):
    """The stock copy of sku as load.lua leaves it: gen naming run_id, the
    units spread over the segments (the first ones one more)."""
    kv = {key(sku, "gen"): "%d:%s" % (GEN, run_id)}
    for i in range(segments):
        kv[key(sku, "stock:%d" % i)] = str(units // segments + (i < units % segments))
    return kv


def run_id(node):
    """node's run_id, as INFO server gives it (what gen names)."""
    return node.info("server")["run_id"]


def skus_on(c, primaries, per=1):
    """per SKU names whose hash tag each of primaries serves, in order."""
    found = {p.port: [] for p in primaries}
    for i in range(2000):
        sku = "fc-%d" % i
        owner = c.owner(c.keyslot(key(sku, "gen")))
        if owner.port in found and len(found[owner.port]) < per:
            found[owner.port].append(sku)
        if all(len(v) == per for v in found.values()):
            return [s for p in primaries for s in found[p.port]]
    raise AssertionError("no SKU names for every primary")


def url_of(*nodes):
    """A redis-cluster:// URL whose seeds are nodes, in this order."""
    return "redis-cluster://" + ",".join(n.addr for n in nodes)


def blocks(out):
    """flashload inspect's output, one dict of first word -> rest per SKU
    (the violations under "violations")."""
    res = []
    for chunk in out.strip().split("\n\n"):
        b = {"violations": [], "lanes": []}
        for line in chunk.splitlines():
            if line.startswith("  ["):
                b["violations"].append(line.strip())
            elif line.startswith("lane "):
                b["lanes"].append(line.split(None, 2)[2])
            else:
                word, _, rest = line.partition(" ")
                b[word] = rest.strip()
        res.append(b)
    return res


def cmdstat(node, cmd):
    """(calls, rejected_calls) of cmd on node since CONFIG RESETSTAT."""
    st = node.info("commandstats").get("cmdstat_" + cmd, {})
    return st.get("calls", 0), st.get("rejected_calls", 0)


def inspect(url, db, *skus, segments=None, timeout=30):
    """flashload inspect of skus (in order) on url and db: (rc, out, err)."""
    args = ["inspect", "--redis", url, "--db", db]
    for s in skus:
        args += ["--sku", s]
    if segments:
        args += ["--segments", segments]
    return flashload(*args, timeout=timeout)


def begin_move(c, slot, src, dst):
    """The slot half way from src to dst: IMPORTING on dst, MIGRATING on src."""
    dst.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", c.node_id(src))
    src.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", c.node_id(dst))


def migrate(src, dst, *keys):
    """MIGRATE keys from src to dst (one atomic step on src)."""
    src.cmd("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)


def move_slot(c, slot, src, dst):
    """The slot and its keys from src to dst by hand, as redis-cli --cluster
    reshard does it (tests/topology.py)."""
    assert c.owner(slot) is src
    c.move_slot(slot, dst)


def test_cluster_reads_follow_the_slots(ctx):
    c = ctx.cluster()
    p1, p2, p3 = c.primaries()
    rid = {p.port: run_id(p) for p in (p1, p2, p3)}
    a, b, d = skus_on(c, [p1, p2, p3])
    db = ctx.path("orders.db")
    # Several segments in one slot: a `lock` product (a `lua` one of more
    # than one segment is spread over the cluster: below).
    make_db(db, [(a, 1), (b, 4, "lock"), (d, 2, "lock")])
    for sku, segs, owner in ((a, 1, p1), (b, 4, p2), (d, 2, p3)):
        for k, v in copy_keys(sku, segs, rid[owner.port]).items():
            c.set(k, v)
        if segs > 1:
            # The empty-segment bitmap, no bit set. Were it absent, the
            # reader's MGET (gen, empty, stock:*) could not be served while
            # the slot migrates: a multi-key command with a key missing is
            # TRYAGAIN there until the move ends, however it is routed.
            c.execute("SETBIT", key(sku, "empty"), 7, 0)
        c.execute("HSET", key(sku, "returned"), "01M8ZZZZZZZZZZZZZZZZZZZZZZ", "1")
    # A replica first: it redirects every SKU, its own shard's too.
    seed = c.replica_of(p1)
    url = url_of(seed, p1, p2, p3)
    for n in c.live():
        n.cmd("CONFIG", "RESETSTAT")

    # 1. Each SKU read from its primary; one MOVED per SKU, none when a
    # SKU is read again (its node remembered).
    rc, out, err = inspect(url, db, a, b, d, a)
    assert rc == 0, out + err
    got = blocks(out)
    for blk, sku, owner, moved in zip(got, (a, b, d, a), (p1, p2, p3, p1), (1, 1, 1, 0)):
        assert blk["sku"] == sku, out
        assert blk["redis"] == ("served by 127.0.0.1:%d (run_id %s); followed %d MOVED, 0 ASK, "
                                "0 TRYAGAIN/CLUSTERDOWN; 0 reconnects"
                                % (owner.port, rid[owner.port], moved)), out
        assert blk["copy"] == "valid, generation %d: %d units (lowest: segment %d, %d)" % (
            GEN, STOCK - SOLD, {a: 0, b: 2, d: 0}[sku], {a: 90, b: 22, d: 45}[sku]), out
        assert blk["returned"] == "1 ended hold" and blk["pending"] == "0 records (0 units)"
        assert blk["verdict"] == "PASS (checked: redis, sqlite)", out
    # The nodes' own counters: the replica refused one MGET per SKU and
    # nothing else; each primary served its SKU's reads, never redirecting.
    assert cmdstat(seed, "mget") == (0, 3) and cmdstat(seed, "hscan") == (0, 0)
    for p, reads in ((p1, 2), (p2, 1), (p3, 1)):
        assert cmdstat(p, "mget") == (reads, 0), (p.port, p.info("commandstats"))
        assert cmdstat(p, "hscan") == (2 * reads, 0), (p.port, p.info("commandstats"))

    # 2. a's slot moves to p2: MOVED to p2, where the copy's gen names p1's
    # run_id -- invalid, as on a single server whose run_id it is not.
    slot_a = c.keyslot(key(a, "gen"))
    move_slot(c, slot_a, p1, p2)
    rc, out, err = inspect(url_of(p1, p3), db, a)
    assert rc == 1, out + err
    moved = blocks(out)[0]
    assert moved["redis"].startswith("served by 127.0.0.1:%d (run_id %s); followed 1 MOVED,"
                                     % (p2.port, rid[p2.port])), out
    assert moved["copy"] == "stale, generation %d: its gen names another Redis process" % GEN
    assert moved["violations"] == ["[redis] no valid stock copy in Redis for the SKU "
                                   "(its gen names another Redis process)"], out
    single = ctx.redis()
    for k, v in copy_keys(a, 1, rid[p1.port]).items():     # p1's copy on one server
        single.client().set(k, v)
    rc1, out1, err1 = inspect(single.url, db, a)
    assert rc1 == 1, out1 + err1
    alone = blocks(out1)[0]
    assert (alone["copy"], alone["violations"], alone["verdict"]) == \
        (moved["copy"], moved["violations"], moved["verdict"]), (out, out1)
    c.set(key(a, "gen"), "%d:%s" % (GEN, rid[p2.port]))      # rebuilt for p2
    rc, out, err = inspect(url_of(p1), db, a)
    assert rc == 0 and "served by 127.0.0.1:%d " % p2.port in out, out + err

    # 3. b's slot migrating from p2 to p3, every key of b already moved:
    # ASK, then ASKING and the command on p3, for each of the three reads;
    # the copy judged by p3's run_id (the node that answered), not p2's.
    slot_b = c.keyslot(key(b, "gen"))
    c.set(key(b, "gen"), "%d:%s" % (GEN, rid[p3.port]))
    begin_move(c, slot_b, p2, p3)
    migrate(p2, p3, *p2.cmd("CLUSTER", "GETKEYSINSLOT", slot_b, 100))
    rc, out, err = inspect(url_of(p2), db, b)
    assert rc == 0, out + err
    asked = blocks(out)[0]
    assert asked["redis"] == ("served by 127.0.0.1:%d (run_id %s); followed 0 MOVED, 3 ASK, "
                              "0 TRYAGAIN/CLUSTERDOWN; 0 reconnects" % (p3.port, rid[p3.port])), out
    assert asked["copy"].startswith("valid, generation %d: 90 units" % GEN), out

    # 4. d half migrated from p3 to p1 (gen moved, its stock keys not):
    # the MGET gets TRYAGAIN; left so, the reader gives up after its
    # bounded wait (40 sends, 50 ms apart); finished meanwhile, it reads.
    slot_d = c.keyslot(key(d, "gen"))
    c.set(key(d, "gen"), "%d:%s" % (GEN, rid[p1.port]))
    begin_move(c, slot_d, p3, p1)
    migrate(p3, p1, key(d, "gen"))
    t0 = time.monotonic()
    rc, out, err = inspect(url_of(p3), db, d)
    took = time.monotonic() - t0
    assert rc == 2 and out == "", out + err
    assert "redis MGET: no answer for {%s} after 40 sends" % d in err and "TRYAGAIN" in err, err
    assert 1.8 < took < 10, took
    p3.cmd("CONFIG", "RESETSTAT")
    proc = subprocess.Popen([FLASHLOAD, "inspect", "--redis", url_of(p3), "--db", db,
                             "--sku", d], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: cmdstat(p3, "mget")[1] >= 2, 5, step=0.01,
                   what="the reader's MGET to be refused with TRYAGAIN")
        migrate(p3, p1, key(d, "empty"), key(d, "stock:0"), key(d, "stock:1"),
                key(d, "returned"))
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    half = blocks(out)[0]
    m = half["redis"]
    assert m.startswith("served by 127.0.0.1:%d (run_id %s); followed 0 MOVED, " %
                        (p1.port, rid[p1.port])), out
    asks, retries = int(m.split(", ")[1].split()[0]), int(m.split(", ")[2].split()[0])
    assert asks >= 1 and retries >= 2, out
    assert half["copy"] == "valid, generation %d: 90 units (lowest: segment 0, 45)" % GEN, out

    # 5. A first seed that is down: the next one answers.
    dead = free_port()
    rc, out, err = inspect("redis-cluster://127.0.0.1:%d,%s" % (dead, p1.addr), db, a)
    assert rc == 0, out + err
    assert blocks(out)[0]["redis"].endswith("; 1 reconnects"), out


def lane_key(sku, lane, suffix):
    """A key of lane `lane` of a spread product: <prefix>{<sku>:<lane>}:<suffix>."""
    return key("%s:%d" % (sku, lane), suffix)


def spread_sku(c, primaries, lanes):
    """A SKU name whose `lanes` lanes fall on every one of primaries, and
    the owner of each lane."""
    want = {p.port for p in primaries}
    for i in range(500):
        sku = "sp-%d" % i
        owners = [c.owner(c.keyslot(lane_key(sku, j, "gen"))) for j in range(lanes)]
        if {o.port for o in owners} == want:
            return sku, owners
    raise AssertionError("no SKU whose lanes fall on every primary")


def record(q, lane):
    """A pending record in format 2 (docs/storage.md): q units from the
    lane's one segment."""
    return "2|%d|1795460000123|0|0:%d|10:vm:8080#ab2:u10:" % (q, q)


def test_spread_product_read_lane_by_lane(ctx):
    c = ctx.cluster()
    p1, p2, p3 = c.primaries()
    rid = {p.port: run_id(p) for p in (p1, p2, p3)}
    lanes = 4
    sku, owners = spread_sku(c, [p1, p2, p3], lanes)
    db = ctx.path("orders.db")
    make_db(db, [(sku, lanes)])
    left = STOCK - SOLD
    units = [left // lanes + (j < left % lanes) for j in range(lanes)]   # 23, 23, 22, 22
    for j, owner in enumerate(owners):
        c.set(lane_key(sku, j, "gen"), "%d:%s" % (GEN, rid[owner.port]))
        c.set(lane_key(sku, j, "stock:0"), str(units[j]))
    # Two ended holds given back: one of them (taken in steps) to two lanes.
    c.execute("HSET", lane_key(sku, 0, "returned"), "01M8ZZZZZZZZZZZZZZZZZZZZZA", "1")
    c.execute("HSET", lane_key(sku, 2, "returned"), "01M8ZZZZZZZZZZZZZZZZZZZZZA", "1")
    c.execute("HSET", lane_key(sku, 1, "returned"), "01M8ZZZZZZZZZZZZZZZZZZZZZB", "1")
    assert c.get(key(sku, "gen")) is None          # nothing under {sku} itself
    for n in c.live():
        n.cmd("CONFIG", "RESETSTAT")

    def lane_line(j, node, state="valid", gen=GEN, n=None):
        n = units[j] if n is None else n
        return "127.0.0.1:%d (run_id %s): %s, generation %d: %d unit%s%s" % (
            node.port, rid[node.port], state, gen, n, "" if n == 1 else "s",
            "; its gen names another Redis process" if state == "stale" else "")

    # 1. Each lane read on its own node (one MOVED for each lane the first
    # seed does not serve), the units summed, the returned holds counted
    # once each.
    rc, out, err = inspect(url_of(p1), db, sku)
    assert rc == 0, out + err
    b = blocks(out)[0]
    away = sum(o.port != p1.port for o in owners)
    assert b["redis"] == ("spread over %d lanes on 3 nodes; followed %d MOVED, 0 ASK, "
                          "0 TRYAGAIN/CLUSTERDOWN; 0 reconnects" % (lanes, away)), out
    assert b["lanes"] == [lane_line(j, o) for j, o in enumerate(owners)], out
    assert b["copy"] == "valid, generation %d: %d units in %d lanes (lowest: lane 2, 22)" % (
        GEN, left, lanes), out
    assert b["pending"] == "0 records (0 units)" and b["returned"] == "2 ended holds", out
    assert b["verdict"] == "PASS (checked: redis, sqlite)", out
    print("    a spread product, read lane by lane:\n      " + "\n      ".join(out.splitlines()))
    # The nodes' own counters: one MGET per lane and two HSCANs (pending,
    # returned) per lane, each on the lane's primary; the seed refused (by
    # MOVED) only the first MGET of each lane it does not serve.
    for p in (p1, p2, p3):
        mine = sum(o.port == p.port for o in owners)
        assert cmdstat(p, "mget") == (mine, away if p is p1 else 0), \
            (p.port, p.info("commandstats"))
        assert cmdstat(p, "hscan") == (2 * mine, 0), (p.port, p.info("commandstats"))
    # Without SQLite, the keys say it is spread ({sku}:gen absent,
    # {sku:0}:gen there) and how many lanes (up to the first without gen).
    rc, out, err = flashload("inspect", "--redis", url_of(p2), "--sku", sku)
    assert rc == 0, out + err
    nodb = blocks(out)[0]
    assert nodb["lanes"] == b["lanes"] and nodb["copy"] == b["copy"], out

    # 2. An order taken in steps: 2 units from lane 1 and 3 from lane 3,
    # one record in each under the same order id; the units are summed over
    # lanes, both records counted, nothing lost.
    oid = "01M8YYYYYYYYYYYYYYYYYYYYYY"
    c.execute("HSET", lane_key(sku, 1, "pending"), oid, record(2, 1))
    c.execute("HSET", lane_key(sku, 3, "pending"), oid, record(3, 3))
    c.set(lane_key(sku, 1, "stock:0"), str(units[1] - 2))
    c.set(lane_key(sku, 3, "stock:0"), str(units[3] - 3))
    rc, out, err = inspect(url_of(p1), db, sku)
    assert rc == 1, out + err
    b = blocks(out)[0]
    assert b["copy"] == "valid, generation %d: %d units in %d lanes (lowest: lane 3, %d)" % (
        GEN, left - 5, lanes, units[3] - 3), out
    assert b["pending"] == "2 records (5 units)", out
    assert b["violations"] == ["[redis] 2 reservations (5 units) pending"], out
    c.execute("DEL", lane_key(sku, 1, "pending"))
    c.execute("DEL", lane_key(sku, 3, "pending"))
    c.set(lane_key(sku, 1, "stock:0"), str(units[1]))
    c.set(lane_key(sku, 3, "stock:0"), str(units[3]))

    # 3. Lanes of two generations (a rebuild half done): no valid copy,
    # though every lane is valid where it is.
    c.set(lane_key(sku, 2, "gen"), "%d:%s" % (GEN + 1, rid[owners[2].port]))
    rc, out, err = inspect(url_of(p1), db, sku)
    assert rc == 1, out + err
    b = blocks(out)[0]
    assert b["lanes"][2] == lane_line(2, owners[2], gen=GEN + 1), out
    why = "its lanes are of generations %d to %d: a rebuild half done" % (GEN, GEN + 1)
    assert b["copy"] == "invalid: " + why, out
    assert b["violations"] == ["[redis] no valid stock copy in Redis for the SKU (%s)" % why], out
    c.set(lane_key(sku, 2, "gen"), "%d:%s" % (GEN, rid[owners[2].port]))

    # 4. A lane without its stock key: missing.
    c.execute("DEL", lane_key(sku, 3, "stock:0"))
    rc, out, err = inspect(url_of(p1), db, sku)
    assert rc == 1, out + err
    b = blocks(out)[0]
    assert b["lanes"][3].endswith(": missing, generation %d: no stock key" % GEN), out
    assert b["copy"] == "missing: lane 3's gen or stock key is missing", out
    c.set(lane_key(sku, 3, "stock:0"), str(units[3]))

    # 5. Lane 1's slot moves to another primary: read there (MOVED), its
    # gen names the old owner's run_id, so that lane -- and the copy -- is
    # invalid, while the other lanes are still valid on their nodes.
    j = 1
    old = owners[j]
    new = next(p for p in (p1, p2, p3) if p.port != old.port)
    move_slot(c, c.keyslot(lane_key(sku, j, "gen")), old, new)
    rc, out, err = inspect(url_of(p1, p2, p3), db, sku)
    assert rc == 1, out + err
    b = blocks(out)[0]
    moved_owners = [new if k == j else o for k, o in enumerate(owners)]
    assert b["lanes"] == [lane_line(k, o, "stale" if k == j else "valid")
                          for k, o in enumerate(moved_owners)], out
    assert b["lanes"][j].startswith("127.0.0.1:%d (run_id %s): stale" % (new.port, rid[new.port]))
    assert b["copy"] == "stale, generation %d: lane %d's gen names another Redis process" % (
        GEN, j), out
    assert b["violations"] == ["[redis] no valid stock copy in Redis for the SKU (lane %d's gen "
                               "names another Redis process)" % j], out
    print("    lane %d's slot moved:\n      " % j + "\n      ".join(out.splitlines()))
    # Its gen rewritten for the new owner: valid again.
    for k, o in enumerate(moved_owners):
        c.set(lane_key(sku, k, "gen"), "%d:%s" % (GEN, rid[o.port]))
    rc, out, err = inspect(url_of(p1, p2, p3), db, sku)
    assert rc == 0, out + err
    assert blocks(out)[0]["lanes"][j] == lane_line(j, new), out


def test_bad_cluster_urls_are_refused_clearly(ctx):
    cases = {
        "redis-cluster://": "no node address after redis-cluster://",
        "redis-cluster://127.0.0.1:70000": "bad node address '127.0.0.1:70000' (want host[:port]",
        "redis-cluster://127.0.0.1:7000,,127.0.0.1:7001": "node address 2 of the list is empty",
        "redis-cluster://127.0.0.1:7000/0": "a database given, but a Redis Cluster has only "
                                            "database 0",
        "redis-cluster://secret@127.0.0.1:7000": "bad credentials (want [user]:password@",
        "redis-cluster:127.0.0.1:7000": "not a redis-cluster:// URL",
    }
    db = ctx.path("none.db")
    for url, why in cases.items():
        for cmd in (["inspect", "--sku", "x", "--db", db], ["run", "--no-create", "--sku", "x"]):
            rc, out, err = flashload(*cmd, "--redis", url)
            assert rc == 64, (url, cmd, rc, out, err)
            assert why in err and "--redis: " in err, (url, err)
    # inspect's own usage errors and help.
    for bad in (["--bogus"], ["--redis", "redis://127.0.0.1:1/0"], ["--sku", "x"],
                ["--sku", "x", "--redis"]):
        rc, out, err = flashload("inspect", *bad)
        assert rc == 64 and err.startswith("flashload: ") and len(err.splitlines()) == 1, \
            (bad, rc, err)
        assert err.endswith("(see flashload inspect --help)\n"), err
    rc, out, err = flashload("inspect", "--help")
    assert rc == 0 and "redis-cluster://[[user]:pw@]host[:port][,host[:port]...]" in out, out
    # A well-formed URL naming nothing that answers: a setup error, not a hang.
    dead = free_port()
    rc, out, err = flashload("inspect", "--sku", "x", "--redis",
                             "redis-cluster://127.0.0.1:%d" % dead)
    assert rc == 2, (rc, out, err)
    assert "no node of the cluster answered (last: 127.0.0.1:%d: connect: " % dead in err, err
