"""test_compare_locks.py: `flashload compare` as a user choosing a lock runs
it, with the lock servers it starts itself (three redis-servers for
Redlock, ZooKeeper, etcd), on subsets of the strategies so that each test
stays short:

- the ordinary-contention scenes of the locks and their pause scenes come
  out in two groups, every scene run under a fault marked as such, in the
  terminal, report.json and report.html;
- the "choosing a lock" table has a row per lock with every field, the
  fault probes measured (holder killed with SIGKILL, lock server restarted,
  lock server restarted empty), nothing oversold, and `n/a` with a reason
  where a probe does not apply;
- a lock server that cannot start has its scenes and probes reported as
  skipped, with the reason, and never counted or shown as passed;
- bin/libclockjump.so, the shim the clock scene runs a redis-server under,
  moves that server's wall clock (a key's lease runs out at once) and
  nothing else;
- the Redis failures group (those that break a Redis lock and RedLock,
  section 4.2 of Alibaba Cloud's "Implementation Principles and Best
  Practices of Distributed Lock"), on servers and
  sentinels compare starts for it: a failover to a replica that missed the
  last sales, a Redlock server's clock jumped forward, a Redlock server
  that lost its last AOF second, a Redlock member failed over to a replica
  without the lock; each unsafe version oversells, each of ours sells
  exactly, and the lock table's "failover to a replica" column says so;
- the holds group: `lua` and `db` sell holds that buyers pay for, cancel
  or abandon; the stock sells out, the units that come back are sold
  again, every hold ends one way, the expiries are on time, and the
  terminal, report.json and report.html say so;
- the fairness group (the same article's section 6.1: "when the lock
  wakes up, it does so in sequence"): buyers arriving at each lock
  in a known order on two instances; the fair lock serves every one in
  turn, and the terminal, report.json (scenes and the lock table) and
  report.html (the arrival-against-service chart) say what each did;
- report.html fits 1400 px without horizontal scrolling (headless
  Chromium measures the page);
- nothing compare started is left running.

Figures are not asserted (a shared 2-core machine): counts, flags and
invariants are."""
import json
import mmap
import os
import re
import struct
import subprocess
import sys
import time

import harness
from test_flashload import CHROMIUM, FLASHLOAD, chromium

LOCK_FIELDS = {"strategy", "lock_server", "orders_per_s_1seg", "orders_per_s_8seg", "p50_us",
               "p99_us", "p50_us_8seg", "p99_us_8seg", "handoff", "kill_holder",
               "server_restart", "server_data_lost", "pause_past_lease", "failover_to_replica",
               "fairness"}
PROBES = ("kill_holder", "server_restart", "server_data_lost", "pause_past_lease")


def ours(ctx):
    """The processes of compare's own: their command lines name its temp
    dir, under the test's (TMPDIR), so another comparison running on the
    machine is not counted."""
    mine = os.path.join(ctx.path("tmp"), "flashload-")
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [l for l in ps.splitlines() if mine in l and not l.startswith("ps ")]


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return None


def descendants(root):
    """{pid: cmdline} of root's live descendants, from /proc. A
    redis-server renames itself (its title drops the temp dir), and a
    service on PostgreSQL names no file there: they are found by their
    parent instead."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        for c, pp in parent.items():
            if pp == p and c not in out:
                cl = _cmdline(c)
                if cl is not None:
                    out[c] = cl
                    todo.append(c)
    return out


def compare(ctx, *args, timeout=170):
    """flashload compare, its temp dir under the test's; the processes it
    starts are seen while it runs (so that nothing_left_behind can fail)."""
    out, tmp = ctx.path("report"), ctx.path("tmp")
    os.makedirs(out, exist_ok=True)
    os.makedirs(tmp, exist_ok=True)
    children = {}
    with open(ctx.path("compare.out"), "w+") as so, open(ctx.path("compare.err"), "w+") as se:
        p = subprocess.Popen([FLASHLOAD, "compare", "--out", out] + [str(a) for a in args],
                             stdout=so, stderr=se, text=True, env=dict(os.environ, TMPDIR=tmp))
        seen, deadline = False, time.monotonic() + timeout
        while p.poll() is None:
            if time.monotonic() > deadline:
                p.kill()
                p.wait()
                raise AssertionError("flashload compare ran past %d s" % timeout)
            seen = seen or bool(ours(ctx))
            children.update(descendants(p.pid))
            time.sleep(0.2)
        so.seek(0)
        se.seek(0)
        rc, so, se = p.returncode, so.read(), se.read()
    ctx.compare_children = children
    assert seen or children, "no process of compare's seen (TMPDIR %s)" % tmp
    j = json.load(open(os.path.join(out, "report.json"))) if rc in (0, 1) else None
    return rc, so, se, j, os.path.join(out, "report.html")


def nothing_left_behind(ctx):
    """No process compare started runs on: none naming its temp dir, and
    none of those seen under it while it ran (the same pid with the same
    command line)."""
    assert ours(ctx) == [], ours(ctx)
    alive = [cl for pid, cl in getattr(ctx, "compare_children", {}).items()
             if _cmdline(pid) == cl]
    assert alive == [], alive


def fits_1400(html):
    """Renders html 1400 px wide: no horizontal scrolling, nothing cut."""
    assert CHROMIUM, "chromium is not installed (tools/deps.sh installs it)"
    p = chromium("--window-size=1400,1000", "--virtual-time-budget=3000", "--dump-dom",
                 "file://" + html)
    assert p.returncode == 0, p.stderr[-2000:]
    body = re.search(r"<body[^>]*>", p.stdout).group(0)
    width = int(re.search(r'data-scroll-width="(\d+)"', body).group(1))
    over = int(re.search(r'data-overflow="(\d+)"', body).group(1))
    assert width <= 1400 and over == 0, body
    assert 'data-errors="0"' in body, body
    return p.stdout


def test_compare_locks_in_two_groups_and_the_lock_table(ctx):
    # The two groups only: fairness is test_compare_fairness's (9 s less).
    rc, so, se, j, html = compare(ctx, "--strategies", "lock,redlock,db-lock", "--segments", "1,8",
                                  "--no-two-instances", "--quick", "--connections", 16,
                                  "--stock", 400, "--groups", "contention,forced")
    assert rc == 0, so + se
    print("\n".join("    " + l for l in so.splitlines() if l.strip()))
    # Two groups: ordinary contention first, then every scene under a forced
    # interleaving: each lock held past its lease until a second holder came
    # in (the service counted the meetings), and the fence refused the first.
    lines = so.splitlines()
    plain = lines.index("-- ordinary contention (no fault)")
    fault = [i for i, l in enumerate(lines) if l.startswith("-- forced interleavings")][0]
    assert plain < fault
    for s in ("lock", "redlock", "db-lock"):
        for segs in (1, 8):
            row = [l for l in lines[plain:fault] if re.match(r"%s\s+%d\s+1\s" % (s, segs), l)]
            assert len(row) == 1 and "PASS" in row[0] and "FORCED" not in row[0], (s, segs, so)
        row = [l for l in lines[fault:] if re.match(r"%s\s+1\s+1\s" % s, l)]
        assert row and "FORCED: held past its lease" in row[0] and "PASS" in row[0], (s, so)
        assert re.search(r"waits: [1-9]\d* met a second holder", row[0]), row[0]
    scenes = j["scenes"]
    assert all(sc["ran"] and sc["pass"] and sc["oversold"] == 0 for sc in scenes), scenes
    assert {sc["fault"] for sc in scenes if sc["cs_delay_ms"]} == {True}
    assert {sc["fault"] for sc in scenes if not sc["cs_delay_ms"]} == {False}
    assert [sc["fault"] for sc in scenes] == sorted(sc["fault"] for sc in scenes)
    for sc in scenes:
        if sc["group"] == "forced":
            f = sc["forced"]
            assert f["expect"] == "met" and f["met"] >= 2 and f["why"] == "", sc
            assert sc["fenced"] >= 1 and sc["as_expected"], sc
    # The lock table: a row per lock, every field, measured in this run.
    assert "choosing a lock (measured in this run)" in so
    locks = {l["strategy"]: l for l in j["locks"]}
    assert set(locks) == {"lock", "redlock", "db-lock"}, locks.keys()
    for name, l in locks.items():
        assert set(l) == LOCK_FIELDS, (name, set(l) ^ LOCK_FIELDS)
        assert l["orders_per_s_1seg"] > 0 and l["orders_per_s_8seg"] > 0, l
        assert 0 < l["p50_us"] <= l["p99_us"], l
        assert l["handoff"]["count"] > 0 and l["handoff"]["mean_us"] > 0, l["handoff"]
        for k in PROBES + ("failover_to_replica",):
            assert {"measured", "brief", "note"} <= set(l[k]), (name, k, l[k])
        kill = l["kill_holder"]
        assert kill["measured"] and kill["recover_ms"] > 0 and kill["oversold"] == 0, kill
        assert kill["pass"], kill
        fence = l["pause_past_lease"]
        assert fence["measured"] and fence["fenced"] > 0 and fence["oversold"] == 0, fence
    for name in ("lock", "redlock"):
        for k in ("server_restart", "server_data_lost"):
            p = locks[name][k]
            assert p["measured"] and p["oversold"] == 0 and p["pass"], (name, k, p)
            assert p["down_ms"] >= 0 and p["ok"] > 0, (name, k, p)
    for k in ("server_restart", "server_data_lost", "failover_to_replica"):
        p = locks["db-lock"][k]
        assert not p["measured"] and p["note"].startswith("n/a: ") and p["brief"] == "n/a", p
    for name in ("lock", "redlock"):
        p = locks[name]["failover_to_replica"]
        assert not p["measured"] and p["note"] == "not measured (--no-redis-failures)", p
    assert "stock outage" in locks["lock"]["lock_server"]
    # Terminal and HTML carry the same table.
    table = lines[lines.index("choosing a lock (measured in this run)") + 1:]
    for name in locks:
        assert any(re.match(r"%s\s+\d+\s+\d+\s" % name, l) for l in table), (name, table)
    dom = fits_1400(html)
    assert "Choosing a lock" in dom and dom.count("\u26a1") >= 3, dom[:3000]
    nothing_left_behind(ctx)


def test_compare_fairness(ctx):
    rc, so, se, j, html = compare(ctx, "--groups", "contention,fairness", "--strategies",
                                  "lock,fair-lock,local", "--segments", "1", "--quick",
                                  "--connections", 16, "--stock", 400, "--no-probes")
    assert rc == 0, so + se
    lines = so.splitlines()
    at = lines.index([l for l in lines if l.startswith("fairness, as served")][0])
    print("\n".join("    " + l for l in lines[at:at + 8]))
    fair = [sc for sc in j["scenes"] if sc["group"] == "fairness"]
    assert {(sc["strategy"], sc["fairness"]["scene"], sc["instances"]) for sc in fair} == {
        (s, k, 1 if s == "local" else 2) for s in ("lock", "fair-lock", "local")
        for k in ("queue", "stream")}, fair
    for sc in fair:
        f = sc["fairness"]
        assert sc["ran"] and sc["oversold"] == 0 and sc["as_expected"], sc
        assert f["served"] == f["buyers"] and f["starved"] == 0, sc
        assert sorted(f["service_order"]) == list(range(f["buyers"])), f
        assert f["pairs"] == f["buyers"] * (f["buyers"] - 1) // 2, f
        if sc["strategy"] == "fair-lock":
            # In turn, whichever instance each buyer came to.
            assert f["out_of_order"] == 0 and f["service_order"] == sorted(f["service_order"]), f
    locks = {l["strategy"]: l for l in j["locks"]}
    assert locks["fair-lock"]["fairness"]["queue"]["out_of_order"] == 0, locks["fair-lock"]
    assert locks["fair-lock"]["fairness"]["stream"]["out_of_order"] == 0, locks["fair-lock"]
    table = lines[lines.index("choosing a lock (measured in this run)") + 1:]
    row = [l for l in table if l.startswith("fair-lock ")]
    assert row and " in order " in row[0], table
    dom = fits_1400(html)
    assert "Fairness: arrival order against service order" in dom, dom[:2000]
    assert dom.count('class="fairone"') == len(fair), dom.count('class="fairone"')
    nothing_left_behind(ctx)


def test_compare_reports_a_lock_server_that_cannot_start_as_skipped(ctx):
    # etcd "starts" as /bin/false: it exits at once.
    rc, so, se, j, html = compare(ctx, "--strategies", "lua,etcd", "--segments", "1,8", "--no-crowd",
                                  "--no-two-instances", "--quick", "--connections", 16,
                                  "--stock", 300, "--etcd-bin", "/bin/false",
                                  "--no-redis-failures", "--no-holds")
    assert rc == 1, so + se                   # lua ran and passed, etcd could not run
    etcd_rows = [l for l in so.splitlines() if re.match(r"etcd\s+\d+\s+\d+\s", l)]
    assert len(etcd_rows) == 3, so            # x1, x8 and the pause scene
    for l in etcd_rows:
        assert "skipped: etcd's lock server could not start" in l, l
        assert "PASS" not in l, l
    assert re.search(r"\d+ scenes in \d+ s; 3 skipped \(not run, not passed\): every safe "
                     r"strategy that ran PASSed and every unsafe one broke, but not every "
                     r"scene ran", so), so
    etcd = [sc for sc in j["scenes"] if sc["strategy"] == "etcd"]
    assert len(etcd) == 3 and not any(sc["ran"] for sc in etcd), etcd
    for sc in etcd:
        assert "pass" not in sc and "could not start" in sc["note"], sc
    lock = {l["strategy"]: l for l in j["locks"]}["etcd"]
    assert lock["orders_per_s_1seg"] is None and lock["orders_per_s_8seg"] is None, lock
    for k in PROBES:
        assert not lock[k]["measured"] and "could not start" in lock[k]["note"], (k, lock[k])
        assert lock[k]["brief"] == "skipped", lock[k]
    # etcd fails over by Raft, never to a Redis replica: not applicable.
    fo = lock["failover_to_replica"]
    assert not fo["measured"] and fo["brief"] == "n/a" and "Raft" in fo["note"], fo
    dom = fits_1400(html)
    assert "3 skipped, neither run nor passed" in dom, dom[:3000]
    assert dom.count("etcd's lock server could not start") >= 3
    nothing_left_behind(ctx)


def test_compare_starts_zookeeper_itself(ctx):
    rc, so, se, j, html = compare(ctx, "--strategies", "zookeeper", "--segments", "1,8",
                                  "--quick", "--connections", 16, "--stock", 300,
                                  "--no-probes", "--groups", "contention,forced")
    assert rc == 0, so + se
    zk = [sc for sc in j["scenes"] if sc["strategy"] == "zookeeper"]
    assert [(sc["segments"], sc["fault"]) for sc in zk] == [(1, False), (8, False), (1, True)], zk
    assert all(sc["ran"] and sc["pass"] and sc["oversold"] == 0 for sc in zk), zk
    lock = j["locks"][0]
    assert lock["strategy"] == "zookeeper" and lock["orders_per_s_1seg"] > 0, lock
    assert lock["kill_holder"]["note"] == "not measured (--no-probes)", lock
    print("    " + [l for l in so.splitlines() if l.startswith("zookeeper ")][0])
    nothing_left_behind(ctx)


# The article the comparison's Redis failures and fairness groups name.
ARTICLE = '"Implementation Principles and Best Practices of Distributed Lock"'

FAILURES = [("failover", "unsafe-trust-redis"), ("failover", "lua"), ("failover", "lock"),
            ("clock jump", "unsafe-redlock-no-fence"), ("clock jump", "redlock"),
            ("AOF lost", "unsafe-redlock-no-fence"), ("AOF lost", "redlock"),
            ("member failover", "unsafe-redlock-no-fence"), ("member failover", "redlock")]


def test_compare_redis_failures(ctx):
    """The Redis failures group, every scene, with the shortest scenes of
    the other groups for the same strategies (and no probes). Each unsafe
    version oversells and each of ours does not, every time: the faults
    are caused at the moment they break a lock, not hoped for."""
    rc, so, se, j, html = compare(ctx, "--strategies",
                                  "unsafe-trust-redis,lua,lock,redlock,unsafe-redlock-no-fence",
                                  "--segments", "1", "--no-two-instances", "--quick",
                                  "--connections", 16, "--stock", 300, "--no-probes",
                                  "--no-holds", "--no-crowd", timeout=280)
    print("\n".join("    " + l for l in so.splitlines()
                    if l.startswith(("--", "  ")) or "FAULT" in l))
    assert rc == 0, so + se
    lines = so.splitlines()
    head = [l for l in lines if l.startswith(
        "-- Redis failures (those that break a Redis lock and RedLock, " + ARTICLE + " \u00a74.2)")]
    assert len(head) == 1, so
    scenes = [sc for sc in j["scenes"] if sc["group"] == "redis-failure"]
    assert [(sc["failure"], sc["strategy"]) for sc in scenes] == FAILURES, scenes
    assert j["scenes"][-len(FAILURES):] == scenes            # the group comes last
    for sc in scenes:
        what = (sc["failure"], sc["strategy"], sc["verdict"], sc.get("detail"))
        assert sc["ran"] and sc["as_expected"] and sc["fault"], what
        assert sc["segments"] == 1 and sc["detail"], what
        if sc["unsafe"]:
            assert not sc["pass"] and sc["oversold"] > 0, what
        else:
            assert sc["pass"] and sc["oversold"] == 0 and sc["lost"] == 0, what
        if sc["failure"] == "failover":
            # Sold to the end after the promotion; the time to the next 201.
            assert 500 < sc["recover_ms"] < 30000, what
            assert "primary killed with SIGKILL; replica promoted" in sc["detail"], what
            # As Redis had it: the replica's stock once cut off, less the
            # primary's before the kill.
            missed = int(re.search(r"the primary sold (\d+) more, which the replica missed",
                                   sc["detail"]).group(1))
            assert missed >= 40, what
            if sc["unsafe"]:
                # Every unit the cut-off replica missed is sold again.
                assert sc["oversold"] >= missed, what
                assert sc["sold"] == sc["initial"] + sc["oversold"], what
            else:
                assert sc["sold"] == sc["initial"], what        # sold out, exactly
        else:
            # Two holders at once, seen on the servers: the second took the
            # lock while the first still held a server the fault spared.
            assert re.search(r"a second holder took \w and \w .* which held \w still",
                             sc["detail"]), what
            if sc["unsafe"]:
                assert sc["oversold"] == 1, what     # one unit sold twice
            else:
                assert sc["fenced"] >= 1, what      # one of the two holders refused
    # The lock table's column: lock from the stock's failover, redlock from
    # its member's; the lock table carries the same outcome.
    locks = {l["strategy"]: l for l in j["locks"]}
    lock, red = locks["lock"]["failover_to_replica"], locks["redlock"]["failover_to_replica"]
    assert lock["measured"] and lock["oversold"] == 0 and lock["recover_ms"] > 0, lock
    assert red["measured"] and red["oversold"] == 0 and red["fenced"] >= 1, red
    assert red["brief"].startswith("fenced "), red
    table = lines[lines.index("choosing a lock (measured in this run)") + 1:]
    assert "failover to a replica" in table[0], table[0]
    dom = fits_1400(html)
    assert "Redis failures (" + ARTICLE + " \u00a74.2)" in dom and "failover to a replica" in dom
    nothing_left_behind(ctx)


def set_offset(path, secs):
    """Stores secs in the shim's offset file, as flashload does: through a
    shared mapping of its first 8 bytes."""
    with open(path, "a+b") as f:
        f.truncate(8)
        with mmap.mmap(f.fileno(), 8) as m:
            struct.pack_into("=q", m, 0, secs)


def test_compare_holds(ctx):
    """The holds group (--quick: holds of 1 s, 3 s of load) for lua and db,
    after their contention scenes. The figures are the verifier's: a scene
    PASSes only if every hold ended one way (SQLite), on time, and the
    units that came back were sold again when the scene's shape promised
    it (it does: the stock sells out at once, and the load outlasts a hold
    by holds.c's 2 s margin)."""
    rc, so, se, j, html = compare(ctx, "--strategies", "lua,db", "--segments", "1", "--no-crowd",
                                  "--no-two-instances", "--quick", "--connections", 16,
                                  "--no-probes", "--no-redis-failures", timeout=120)
    print("\n".join("    " + l for l in so.splitlines() if "holds" in l or l.startswith("  ")))
    assert rc == 0, so + se
    lines = so.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("-- holds: ")]
    assert len(head) == 1, so
    for s in ("lua", "db"):
        row = [l for l in lines[head[0]:] if re.match(r"%s\s+1\s+1\s" % s, l)]
        assert len(row) == 1 and "PASS" in row[0] and "[holds of 1 s: 60% pay, 10% cancel, " \
            "30% abandon]" in row[0], (s, so)
        ended = [l for l in lines if re.match(r"  %s\s+1\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+"
                                              r"\d+ms\s+\d+ms$" % s, l)]
        assert len(ended) == 1, (s, so)
    assert "the holds, as they ended (holds of 1 s" in so, so
    scenes = j["scenes"]
    holds = [sc for sc in scenes if sc["group"] == "holds"]
    assert [sc["strategy"] for sc in holds] == ["lua", "db"], scenes
    assert scenes[-2:] == holds                                 # the group comes last
    assert all("holds" not in sc for sc in scenes[:-2]), scenes
    for sc in holds:
        h = sc["holds"]
        what = (sc["strategy"], sc["verdict"], h)
        assert sc["ran"] and sc["pass"] and sc["as_expected"] and not sc["fault"], what
        assert sc["oversold"] == 0 and sc["lost"] == 0 and sc["stock"] == 100, what
        assert h["hold_seconds"] == 1 and h["pay"] == 0.6 and h["cancel"] == 0.1, what
        assert h["confirmed"] + h["cancelled"] + h["expired"] == h["placed"], what
        assert h["still_reserved"] == 0 and h["placed"] == sc["created"], what
        assert h["returned"] == h["cancelled"] + h["expired"], what
        assert h["cancelled"] > 0 and h["expired"] > 0, what     # 10% and 30% of 100 and more
        assert sc["sold"] == h["confirmed"] <= sc["stock"], what  # quantity 1: holds = units
        # Sold out at once, then what came back sold again: checked, and seen.
        assert h["resale_checked"] and 0 < h["resold"] <= h["returned"], what
        assert h["placed"] == sc["stock"] + h["resold"], what
        lag = h["expiry_lag_ms"]
        assert lag["n"] == h["expired"] and 0 <= lag["p50"] <= lag["p99"] <= lag["max"], what
        assert lag["p99"] < 3000, what
    dom = fits_1400(html)
    assert dom.count("holds placed: ") == 2 and "Holds: each order holds its units" in dom, \
        dom[:3000]
    nothing_left_behind(ctx)


def test_clockjump_moves_the_wall_clock_of_a_redis_server(ctx):
    """The clock scene's shim under Debian's redis-server (which does not
    start under libfaketime): a key with a 10 s lease expires as soon as the
    offset file says +60 s, on that server only; in a process under it the
    wall clock moves and the monotonic clock does not."""
    offset = ctx.path("clock.offset")
    set_offset(offset, 0)
    env = dict(os.environ, LD_PRELOAD=os.path.join(harness.BIN, "libclockjump.so"),
               CLOCKJUMP_FILE=offset)
    moved, plain = ctx.redis(env=env), ctx.redis()
    for r in (moved, plain):
        assert r.client().set("lease", "holder", px=10000)
    before = moved.client().time()[0]
    assert abs(before - time.time()) < 2                     # +0: the real clock
    set_offset(offset, 60)
    assert moved.client().time()[0] >= before + 59
    assert moved.client().get("lease") is None               # expired at once
    assert plain.client().get("lease") == "holder" and plain.client().pttl("lease") > 5000
    p = subprocess.run([sys.executable, "-c", "import time; print(time.time(), time.monotonic())"],
                       env=env, capture_output=True, text=True, timeout=30)
    wall, mono = map(float, p.stdout.split())
    assert 58 < wall - time.time() < 62, (wall, time.time())
    assert abs(mono - time.monotonic()) < 2, (mono, time.monotonic())
