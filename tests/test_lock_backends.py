"""test_lock_backends.py: the lock module's ZooKeeper and etcd backends
against real servers (harness.ZooKeeper, harness.Etcd), driven from real
processes (bin/lockcheck), each case run for both backends:

- the API checks of `lockcheck selftest` (busy, waits, reentry, hand-off,
  threads, odd names, the lease kept while held);
- processes exclude each other: every hold logs the interval in which it
  believed it held the lock, and no two intervals overlap; a counter in
  Redis updated by a non-atomic read and a fenced write ends exact; tokens
  strictly increase in the order the holds began;
- a holder killed with SIGKILL frees the lock when its session or lease
  expires, not before, and the next token is larger;
- a holder paused (SIGSTOP) past its lease loses it: the next holder's
  token is larger, the paused one reports the loss when it wakes, and its
  fenced write is refused;
- the lock server killed and restarted mid-run: holders get errors or lose
  their lock, no two believe at once, and the lock works again after;
- restarted with its data gone: holders are told, the lock works again,
  tokens start over lower under a new incarnation, and a fence admits the
  new holder's write and refuses the old one's;
- a wait that times out leaves no node, key or lease behind;
- interop: `etcdctl lock` and our etcd lock exclude each other; a node or
  key deleted from outside is reported lost.

Hand-off latency next to Redis is printed by test_handoff_latency_printed
(bin/lockbench), not asserted. Time bounds are generous (a shared 2-core
machine), each far from what a broken lock would show."""
import os
import signal
import subprocess
import time

import harness
from harness import wait_until

LOCKCHECK = os.path.join(harness.BIN, "lockcheck")
LOCKBENCH = os.path.join(harness.BIN, "lockbench")
EXIT_LOST, EXIT_BUSY = 70, 75


def server(ctx, kind):
    return ctx.zookeeper() if kind == "zk" else ctx.etcd()


def lockcheck(url, mode, *args, **kw):
    """Runs lockcheck to completion; returns the CompletedProcess."""
    return subprocess.run([LOCKCHECK, "--url", url] + list(args) + [mode], capture_output=True,
                          text=True, timeout=kw.pop("timeout", 120), **kw)


def start(ctx, url, mode, *args):
    """Starts lockcheck in the background (killed at cleanup)."""
    p = subprocess.Popen([LOCKCHECK, "--url", url] + list(args) + [mode], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)

    def stop():
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
    ctx.on_cleanup(stop)
    return p


def read_line(p, timeout=30):
    """The next stdout line of a background lockcheck (fails on EOF)."""
    import select
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.1)
        if r:
            line = p.stdout.readline()
            assert line, "lockcheck exited: %s %s" % (p.wait(), p.stderr.read())
            return line.strip()
    raise AssertionError("no line from lockcheck in %ss" % timeout)


def holds_from(paths):
    """[(acquired_us, believed_until_us, token, value, written)] of all logs."""
    holds = []
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                a, b, tok, val, wr = line.split()
                holds.append((int(a), int(b), int(tok), int(val), int(wr)))
    holds.sort()
    return holds


def check_no_overlap_and_tokens(holds):
    """No two belief intervals overlap; tokens increase with start time."""
    latest_end, prev_tok = -1, 0
    for a, b, tok, _, _ in holds:
        assert a > latest_end, "two holders believed at once: %s" % ((a, b, tok),)
        assert tok > prev_tok, "token %d after %d" % (tok, prev_tok)
        latest_end, prev_tok = max(latest_end, b), tok


def loop_workers(ctx, url, redis, n, count, name, extra=(), hold_ms=3, tag=""):
    logs = [ctx.path("%s%s-%d.log" % (name, tag, i)) for i in range(n)]
    procs = [start(ctx, url, "loop", "--name", name, "--count", str(count), "--hold-ms",
                   str(hold_ms), "--ttl", "2000", "--redis", redis.url, "--log", logs[i], *extra)
             for i in range(n)]
    return procs, logs


# ------------------------------------------------------------------ cases

def selftest(ctx, kind):
    srv = server(ctx, kind)
    p = lockcheck(srv.url, "selftest", "--name", "self")
    assert p.returncode == 0, p.stdout + p.stderr
    print("    %s selftest: %s" % (kind, p.stdout.strip()))


def fenced_holds(procs, logs, n):
    """Waits for loop_workers' processes; checks their n holds: no two
    holders at once, tokens rising, every fenced write made, no lost
    update. Returns the holds."""
    for p in procs:
        assert p.wait(180) == 0, p.stdout.read() + p.stderr.read()
    holds = holds_from(logs)
    assert len(holds) == n, len(holds)
    check_no_overlap_and_tokens(holds)
    assert all(w == 1 for *_, w in holds), "a fenced write was refused or not made"
    assert sorted(v for *_, v, _ in holds) == list(range(n))    # no lost update
    return holds


def exclusion(ctx, kind):
    """4 processes x 15 holds; each hold a non-atomic fenced increment."""
    srv, redis = server(ctx, kind), ctx.redis()
    fenced_holds(*loop_workers(ctx, srv.url, redis, 4, 15, "excl"), 60)
    assert redis.client().get("lockcheck:{excl}:counter") == "60"


def kill9(ctx, kind):
    """A killed holder keeps others out until its session/lease expires."""
    srv = server(ctx, kind)
    holder = start(ctx, srv.url, "hold", "--name", "k9", "--ttl", "1000")
    first = read_line(holder)
    assert first.startswith("held "), first
    tok1 = int(first.split()[1])
    holder.kill()
    killed = time.monotonic()
    holder.wait()
    busy = lockcheck(srv.url, "try", "--name", "k9", "--wait", "0")
    assert busy.returncode == EXIT_BUSY, busy.stdout + busy.stderr
    got = lockcheck(srv.url, "try", "--name", "k9", "--wait", "15000")
    freed = time.monotonic() - killed
    assert got.returncode == 0, got.stdout + got.stderr
    assert int(got.stdout.split()[1]) > tok1
    # ZooKeeper: the session expires 1000 ms (+ a tick) after its last
    # ping; etcd: the lease 1 s after its last keepalive, seen by etcd's
    # expiry loop within 0.5 s more. A broken recipe waits forever or
    # takes it at once.
    assert 0.25 < freed < 5.0, freed
    print("    %s: SIGKILLed holder's lock taken over after %.2f s (ttl 1 s)" % (kind, freed))


def paused(ctx, kind):
    """A holder stopped past its lease loses it; its write is refused."""
    srv, redis = server(ctx, kind), ctx.redis()
    a = start(ctx, srv.url, "hold", "--name", "pz", "--ttl", "1000", "--redis", redis.url)
    tok1 = int(read_line(a).split()[1])
    a.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    b = start(ctx, srv.url, "hold", "--name", "pz", "--ttl", "5000", "--redis", redis.url)
    line = read_line(b, timeout=30)
    assert line.startswith("held "), line
    tok2 = int(line.split()[1])
    took = time.monotonic() - stopped
    assert tok2 > tok1 and took < 10, (tok1, tok2, took)
    b.send_signal(signal.SIGTERM)
    assert read_line(b) == "write accepted"
    assert b.wait(30) == 0
    a.send_signal(signal.SIGCONT)
    lost = read_line(a, timeout=10)          # reported when it wakes
    assert lost.startswith("lost "), lost
    a.send_signal(signal.SIGTERM)
    assert read_line(a) == "write refused %d" % tok2
    rel = read_line(a)
    assert rel.startswith("release not-owner"), rel
    assert a.wait(30) == EXIT_LOST
    print("    %s: paused holder lost the lock after %.2f s; told '%s'" % (kind, took, lost))


def restart(ctx, kind):
    """The server killed and restarted (same data) twice while 3 processes
    loop on short holds and a fourth holds 800 ms at a time: once down for
    1 s (within the 2 s leases), once for 3 s while a fifth process holds
    the lock with a 1 s lease (which it must lose)."""
    srv, redis = server(ctx, kind), ctx.redis()
    extra = ("--timeout", "500", "--seconds", "120")
    procs, logs = loop_workers(ctx, srv.url, redis, 3, 40, "rs", extra)
    lprocs, llogs = loop_workers(ctx, srv.url, redis, 1, 6, "rs", extra, hold_ms=800, tag="long")
    procs, logs = procs + lprocs, logs + llogs
    wait_until(lambda: len(holds_from(logs)) >= 15 and holds_from(llogs), 60,
               what="holds before the restart")
    srv.kill()
    time.sleep(1.0)
    srv.restart()
    wait_until(lambda: len(holds_from(logs)) >= 40, 60, what="holds after the restart")
    logs.append(ctx.path("rs-holder.log"))
    holder = start(ctx, srv.url, "hold", "--name", "rs", "--ttl", "1000", "--timeout", "300",
                   "--log", logs[-1])
    first = read_line(holder)
    assert first.startswith("held "), first
    srv.kill()
    time.sleep(3.0)
    srv.restart()
    told = read_line(holder, timeout=20)
    assert told.startswith("lost "), told
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(30) == EXIT_LOST
    outs = []
    for p in procs:
        rc = p.wait(180)
        outs.append(p.stdout.read().strip())
        assert rc == 0, (rc, outs[-1], p.stderr.read())
    holds = holds_from(logs)
    assert len(holds) == 127, len(holds)
    check_no_overlap_and_tokens(holds)
    # Every accepted fenced write came from a holder that believed it held
    # the lock; none of them lost another's update.
    accepted = sorted(v for *_, v, w in holds if w == 1)
    assert len(accepted) == len(set(accepted)), "two accepted writes read the same value"
    assert redis.client().get("lockcheck:{rs}:counter") == str(len(accepted))
    assert lockcheck(srv.url, "try", "--name", "rs", "--wait", "5000").returncode == 0
    errors = sum(int(o.split("errors=")[1].split()[0]) for o in outs)
    lost = sum(int(o.split("lost=")[1].split()[0]) for o in outs)
    print("    %s restarts: 127 holds, %d acquire errors, %d holds lost by the loops, %d "
          "writes accepted; the 1 s holder told '%s'" % (kind, errors, lost, len(accepted), told))


def data_loss(ctx, kind):
    """The server restarts with its data gone: the holder learns it lost
    the lock; new holders work; tokens start over, lower, but under a new
    incarnation, which a fence admits at once and orders after the old
    one: the new holder's fenced write goes through (its token is below
    the one the fence saw), the old holder's is refused."""
    srv, redis = server(ctx, kind), ctx.redis()
    warm = lockcheck(srv.url, "loop", "--name", "dl", "--count", "5", "--ttl", "2000")
    assert warm.returncode == 0, warm.stderr
    # A holder of the old incarnation writes through the fence first.
    first = start(ctx, srv.url, "hold", "--name", "dl", "--ttl", "2000", "--redis", redis.url)
    tok0 = int(read_line(first).split()[1])
    first.send_signal(signal.SIGTERM)
    assert read_line(first) == "write accepted"
    assert first.wait(30) == 0
    a = start(ctx, srv.url, "hold", "--name", "dl", "--ttl", "2000", "--redis", redis.url)
    held = read_line(a).split()
    tok1, inc1 = int(held[1]), held[3]
    assert tok1 > tok0 and len(inc1) == 16, held
    srv.restart(wipe=True)
    lost = read_line(a, timeout=20)
    assert lost.startswith("lost "), lost
    t0 = time.monotonic()
    b = start(ctx, srv.url, "hold", "--name", "dl", "--ttl", "2000", "--redis", redis.url,
              "--wait", "10000")
    held = read_line(b, timeout=30).split()
    took = time.monotonic() - t0
    tok2, inc2 = int(held[1]), held[3]
    assert tok2 < tok1, (tok1, tok2)            # why tokens alone cannot fence this
    assert inc2 != inc1, (inc1, inc2)
    b.send_signal(signal.SIGTERM)
    assert read_line(b) == "write accepted"     # a new incarnation: admitted
    assert b.wait(30) == 0
    a.send_signal(signal.SIGTERM)
    assert read_line(a) == "write refused %d" % tok2   # the old one: refused
    assert a.wait(30) == EXIT_LOST
    print("    %s lost its data: holder told '%s'; token went from %d (incarnation %s) to %d "
          "(incarnation %s), taken %.2f s after asking; the new holder's fenced write accepted, "
          "the old one's refused" % (kind, lost, tok1, inc1, tok2, inc2, took))


def timed_out_wait(ctx, kind):
    """A wait that times out leaves nothing behind; a release neither."""
    srv = server(ctx, kind)
    holder = start(ctx, srv.url, "hold", "--name", "tw", "--ttl", "5000")
    assert read_line(holder).startswith("held ")
    before = leftovers(srv, kind, "tw")
    assert len([x for x in before if not str(x).startswith("lease")]) == 1, before
    for wait in ("0", "300"):
        t0 = time.monotonic()
        busy = lockcheck(srv.url, "try", "--name", "tw", "--wait", wait)
        assert busy.returncode == EXIT_BUSY, busy.stdout + busy.stderr
        assert time.monotonic() - t0 >= int(wait) / 1000
        assert leftovers(srv, kind, "tw") == before
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(30) == 0
    assert leftovers(srv, kind, "tw") == []


def leftovers(srv, kind, name):
    """What is on the server for the lock name: ephemeral nodes (ZooKeeper)
    or keys and leases (etcd)."""
    if kind == "zk":
        return [p for p in srv.ephemerals() if p.startswith("/locks/%s/" % name)]
    keys = srv.keys(name.encode() + b"/")
    return sorted([k for k, _, _ in keys]) + ["lease %d" % x for x in srv.leases()]


# ----------------------------------------------------------- the tests

def test_zk_selftest(ctx):
    selftest(ctx, "zk")


def test_etcd_selftest(ctx):
    selftest(ctx, "etcd")


def test_zk_processes_exclude_each_other(ctx):
    exclusion(ctx, "zk")


def test_etcd_processes_exclude_each_other(ctx):
    exclusion(ctx, "etcd")


def test_zk_kill9_holder_frees_lock(ctx):
    kill9(ctx, "zk")


def test_etcd_kill9_holder_frees_lock(ctx):
    kill9(ctx, "etcd")


def test_zk_paused_holder_loses_lock(ctx):
    paused(ctx, "zk")


def test_etcd_paused_holder_loses_lock(ctx):
    paused(ctx, "etcd")


def test_zk_server_restart(ctx):
    restart(ctx, "zk")


def test_etcd_server_restart(ctx):
    restart(ctx, "etcd")


def test_zk_server_loses_data(ctx):
    data_loss(ctx, "zk")


def test_etcd_server_loses_data(ctx):
    data_loss(ctx, "etcd")


def test_zk_timed_out_wait_leaves_nothing(ctx):
    timed_out_wait(ctx, "zk")


def test_etcd_timed_out_wait_leaves_nothing(ctx):
    timed_out_wait(ctx, "etcd")


def test_zk_node_deleted_from_outside_is_lost(ctx):
    zk = ctx.zookeeper()
    a = start(ctx, zk.url, "hold", "--name", "del", "--ttl", "5000")
    assert read_line(a).startswith("held ")
    (node,) = zk.ephemerals()
    assert node.startswith("/locks/del/_c_") and "-lock-" in node, node
    zk.cli("delete", node)
    lost = read_line(a, timeout=20)
    assert lost.startswith("lost ") and "deleted" in lost, lost
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == EXIT_LOST


def test_etcd_key_deleted_from_outside_is_lost(ctx):
    etcd = ctx.etcd()
    a = start(ctx, etcd.url, "hold", "--name", "del", "--ttl", "1000")
    assert read_line(a).startswith("held ")
    ((key, _, _),) = etcd.keys(b"del/")
    p = etcd.etcdctl("del", key.decode())
    assert p.returncode == 0, p.stderr
    lost = read_line(a, timeout=20)          # the next renewal finds it gone
    assert lost.startswith("lost "), lost
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == EXIT_LOST


def test_etcd_interop_with_etcdctl_lock(ctx):
    """`etcdctl lock NAME` and our lock on NAME exclude each other: the
    same keys (NAME/<lease hex>), the same order (create revision)."""
    etcd = ctx.etcd()
    env = dict(os.environ, ETCDCTL_API="3")
    theirs = subprocess.Popen(["etcdctl", "--endpoints", "127.0.0.1:%d" % etcd.port, "lock",
                               "shared", "--", "sleep", "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    ctx.on_cleanup(lambda: theirs.poll() is None and theirs.kill())
    wait_until(lambda: etcd.keys(b"shared/"), 10, what="etcdctl to hold the lock")
    assert lockcheck(etcd.url, "try", "--name", "shared", "--wait", "0").returncode == EXIT_BUSY
    t0 = time.monotonic()
    got = lockcheck(etcd.url, "try", "--name", "shared", "--wait", "10000")
    assert got.returncode == 0, got.stdout + got.stderr
    assert theirs.wait(10) == 0 and time.monotonic() - t0 > 1.0
    ours = start(ctx, etcd.url, "hold", "--name", "shared", "--ttl", "5000")
    assert read_line(ours).startswith("held ")
    blocked = subprocess.Popen(["etcdctl", "--endpoints", "127.0.0.1:%d" % etcd.port, "lock",
                                "shared", "--", "true"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    ctx.on_cleanup(lambda: blocked.poll() is None and blocked.kill())
    time.sleep(1.0)
    assert blocked.poll() is None            # waits for us
    ours.send_signal(signal.SIGTERM)
    assert ours.wait(30) == 0
    assert blocked.wait(15) == 0


def test_handoff_latency_printed(ctx):
    """bin/lockbench's contended hand-off for Redis, ZooKeeper and etcd
    side by side (printed, not asserted: a shared machine)."""
    redis, zk, etcd = ctx.redis(), ctx.zookeeper(), ctx.etcd()
    p = subprocess.run([LOCKBENCH, "--redis", redis.url, "--url", zk.url, "--url", etcd.url,
                        "--seconds", "1", "--handoff-only"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    print("\n".join("    " + line for line in p.stdout.splitlines()))
    for label in ("redis", "zookeeper", "etcd"):
        assert label in p.stdout, p.stdout
