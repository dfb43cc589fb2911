"""test_pgscale.py: many instances on one PostgreSQL, as it runs in
production -- the connection budget (--db-max-connections) and PgBouncer
in front of the server -- against real servers (harness.Postgres,
harness.PgBouncer: Debian's pgbouncer 1.18), stopped by PID.

- ten instances share a server with PostgreSQL's default max_connections
  (100) while they sell a `lua`, a `db-lock` and a `db-for-update` product
  at once: each keeps to its budget, psql connects at every moment, and
  flashload's verifier passes for every product;
- a budget spent makes work wait a bounded time, then the order is
  answered 503 overloaded (Retry-After), nothing taken, and /metrics
  counts the waits;
- behind PgBouncer in transaction pooling, the service says it is pooled
  and every safe strategy, holds too, sells with the verifier's PASS (no
  named statement or session setting to lose between transactions), and
  the committer's groups tell each left-out order apart as they do
  straight (unit/test_db's writer cases through the pool); in
  session pooling with fewer server connections than the instances want,
  every request is answered within a bound; statement pooling is refused
  at start, naming the setting."""
import os
import re
import subprocess
import threading
import time

import harness
from harness import wait_until
from test_flashload import flashload


def targets(services):
    out = []
    for s in services:
        out += ["--target", "http://127.0.0.1:%d" % s.port]
    return out


def metrics(s, *names):
    """The values of series of s's /metrics (full lines' names and labels),
    all from one scrape: figures that move together (a connection going
    from in use to idle) are read at one moment."""
    r = s.get("/metrics")
    assert r.status == 200, r
    got = {}
    for line in r.raw.splitlines():
        for name in names:
            if line.startswith(name + " "):
                got[name] = float(line.split()[-1])
    missing = [n for n in names if n not in got]
    assert not missing, "no %s in /metrics" % missing
    return [got[n] for n in names]


def metric(s, name):
    """The value of one series of s's /metrics (a full line's name and labels)."""
    return metrics(s, name)[0]


def sell(args, out, key):
    rc, o, e = flashload(*args, timeout=180)
    out[key] = (rc, o, e)


def test_ten_instances_share_a_default_postgresql(ctx):
    """PostgreSQL's default max_connections (100, three of them kept for
    superusers): ten instances at the default budget (8) hold at most 80,
    whatever they sell, and the server still takes psql."""
    redis = ctx.redis()
    pg = ctx.postgres(settings={"max_connections": 100})
    url = pg.database("orders")
    services = [None] * 10

    def start(i):
        services[i] = ctx.service(redis, db=url)
    threads = [threading.Thread(target=start, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(services), services
    verify = ["--redis", redis.url, "--db", url, "--quiet"]
    runs = {}
    loads = [threading.Thread(target=sell, args=(
        targets(services) + verify + ["--strategy", strategy, "--stock", str(stock),
                                      "--connections", "60", "--duration", "3"], runs, strategy))
        for strategy, stock in (("lua", 100000), ("db-lock", 200), ("db-for-update", 2000))]
    for t in loads:
        t.start()
    refused, peak, tries = [], 0, 0
    while any(t.is_alive() for t in loads):
        r = subprocess.run(["psql", "-h", pg.ip, "-p", str(pg.port), "-U", "postgres", "-d",
                            "postgres", "-Atc", "SELECT count(*) FROM pg_stat_activity WHERE "
                            "datname = 'orders' AND application_name = 'flashsale'"],
                           capture_output=True, text=True, timeout=30)
        tries += 1
        if r.returncode != 0:
            refused.append(r.stderr.strip())
        else:
            peak = max(peak, int(r.stdout))
        time.sleep(0.05)
    for t in loads:
        t.join()
    for strategy, (rc, out, err) in runs.items():
        assert rc == 0 and "PASS" in out, (strategy, rc, out[-1500:], err[-1500:])
        assert int(re.search(r"status\s+201: (\d+)", out).group(1)) > 0, (strategy, out)
    assert tries >= 5 and not refused, (tries, refused[:3])
    assert 10 <= peak <= 80, peak            # the instances' (the verifiers' come on top)
    print("    %d psql connects during the sale, none refused; the instances held at most %d "
          "connections" % (tries, peak))
    for s in services:
        in_use, idle, most = metrics(s, 'flashsale_db_connections{state="in_use"}',
                                     'flashsale_db_connections{state="idle"}',
                                     "flashsale_db_connections_max")
        assert 2 <= in_use + idle <= 8 and most == 8, (in_use, idle, most)
        assert "too many clients" not in s.logs(), s.logs()[-2000:]


def test_a_spent_budget_waits_a_bounded_time_and_takes_nothing(ctx):
    """Three connections, two kept (committer, health probe): db-for-update
    orders whose transactions pause 400 ms in their critical section queue
    for the third; past --db-connection-wait-ms they are answered 503
    overloaded with Retry-After at once, nothing taken, and counted."""
    redis = ctx.redis()
    pg = ctx.postgres()
    url = pg.database("orders")
    s = ctx.service(redis, db=url, args=["--fault-injection", "--db-max-connections", "3",
                                         "--db-connection-wait-ms", "200"])
    s.create_product("slow", 50, strategy="db-for-update", cs_delay_ms=400)
    answers = []

    def buy(i):
        t0 = time.monotonic()
        r = s.order("slow", user="u%d" % i, client=harness.Client(s.port))
        answers.append((r.status, r.json.get("error") if r.status != 201 else None,
                        r.headers.get("retry-after"), time.monotonic() - t0))
    threads = [threading.Thread(target=buy, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [a for a in answers if a[0] == 201]
    busy = [a for a in answers if a[0] == 503]
    assert ok and busy and len(ok) + len(busy) == 8, answers
    for status, code, retry, took in busy:
        assert code == "overloaded" and retry == "1" and took < 2.0, answers
    p = s.settled_product("slow")
    assert p["sold"] == len(ok) and p["stock_available"] == 50 - len(ok), (p, answers)
    assert metric(s, "flashsale_db_connection_wait_timeouts_total") >= len(busy)
    assert metric(s, "flashsale_db_connection_waits_total") >= len(busy)
    assert metric(s, 'flashsale_orders_total{strategy="db-for-update",'
                     'outcome="db_connections_busy"}') == len(busy)


# The safe strategies a pooler must carry, with holds on one of them.
POOLED = [("lua", 1, 0), ("lua", 4, 0), ("lock", 1, 0), ("db", 1, 0), ("db-optimistic", 1, 0),
          ("db-lock", 1, 0), ("db-for-update", 1, 0), ("lua", 1, 2)]


def test_transaction_pooling_sells_every_safe_strategy(ctx):
    """PgBouncer's transaction pooling lends a server connection for one
    transaction: a named statement or a SET would stay behind with it. The
    instances see the pooler (the key PgBouncer gives at connect is not
    the backend's) and keep nothing in the session; two of them, over a
    pool of 4 server connections, sell every safe strategy exactly."""
    redis = ctx.redis()
    pg = ctx.postgres()
    url = pg.database("orders")
    bouncer = ctx.pgbouncer(pg, mode="transaction", pool_size=4)
    a = ctx.service(redis, db=bouncer.url("orders"), args=["--admin-token", "t"])
    b = ctx.service(redis, db=bouncer.url("orders"), args=["--admin-token", "t"])
    for s in (a, b):
        assert "reached through a pooler" in s.logs(), s.logs()
    threads, runs = {}, {}
    for strategy, segments, hold in POOLED:            # all at once: the pool shared by all
        sku = "%s-%d-%d" % (strategy, segments, hold)
        args = targets([a, b]) + ["--redis", redis.url, "--db", url, "--quiet", "--sku", sku,
                                  "--strategy", strategy, "--segments", str(segments),
                                  "--stock", "300", "--connections", "8", "--duration", "2",
                                  "--admin-token", "t"]
        if hold:
            args += ["--hold-seconds", str(hold), "--pay", "0.5", "--cancel", "0.2"]
        threads[sku] = threading.Thread(target=sell, args=(args, runs, sku))
    for t in threads.values():
        t.start()
    for t in threads.values():
        t.join()
    for sku in threads:
        rc, out, err = runs[sku]
        assert rc == 0 and "PASS" in out, (sku, rc, out[-2000:], err[-2000:], a.logs()[-2000:])
    assert metric(a, "flashsale_db_connect_failures_total") == 0
    for s in (a, b):
        log = s.logs()
        assert "does not exist" not in log and "already exists" not in log, log[-3000:]
    # The server never saw more than the pool's connections for 'orders'.
    pools = [p for p in bouncer.show("POOLS") if p.get("database") == "orders"]
    assert pools and all(p.get("pool_mode") == "transaction" for p in pools), pools
    # A direct instance is not pooled: named statements, as before.
    c = ctx.service(redis, db=url)
    assert "reached through a pooler" not in c.logs()


def test_group_commits_through_a_transaction_pool(ctx):
    """The committer's groups through PgBouncer in transaction pooling, as
    unit/test_db checks them straight: a group whose orders a key another
    order holds and a stale copy leave out, beside two SKUs' orders (the
    insert's function takes the SKUs' locks; whose key it was is asked
    after the COMMIT), groups of thousands, and paced groups."""
    pg = ctx.postgres()
    pg.database("unit")
    bouncer = ctx.pgbouncer(pg, mode="transaction", pool_size=4)
    env = dict(os.environ, FLASHSALE_TEST_PG=bouncer.url("unit"))
    r = subprocess.run([os.path.join(harness.BIN, "tests", "test_db"), "test_writer"], env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for case in ("test_writer_groups", "test_writer_group_left_out", "test_writer_paced"):
        assert "ok   postgresql: " + case in out, out


def test_session_pooling_short_of_servers_answers_every_request(ctx):
    """Session pooling lends a server connection for a client's whole
    session: with fewer than the instance opens, the last ones wait for a
    server. Each wait has a bound (the answer deadline, --db-busy-timeout-
    ms + --db-commit-timeout-ms): every request gets an answer, and what
    was sold is exact."""
    redis = ctx.redis()
    pg = ctx.postgres()
    url = pg.database("orders")
    bouncer = ctx.pgbouncer(pg, mode="session", pool_size=3)
    s = ctx.service(redis, db=bouncer.url("orders"),
                    args=["--db-busy-timeout-ms", "500", "--db-commit-timeout-ms", "1000"])
    assert "reached through a pooler" in s.logs()
    rc, out, err = flashload("--target", "http://127.0.0.1:%d" % s.port, "--redis", redis.url,
                             "--db", url, "--quiet", "--strategy", "db-for-update", "--stock",
                             "1000", "--connections", "32", "--duration", "3", "--timeout", "6",
                             timeout=120)
    assert rc == 0 and "PASS" in out, (rc, out[-2000:], err[-2000:], s.logs()[-2000:])
    assert not re.search(r"^transport ", out, re.M), out      # every request answered in 6 s
    assert int(re.search(r"status\s+201: (\d+)", out).group(1)) > 0, out


def test_start_waits_for_a_standby_to_be_promoted(ctx):
    """An instance (re)started mid-failover, while its database is still a
    standby, does not exit at once (a supervisor's start limit could then
    give up on it): it tries again about once a second, saying why, and
    starts once the standby is promoted. Past --db-start-wait-ms it gives
    up, exit 1; a failure that stays (statement pooling, below) exits at
    once."""
    primary = ctx.postgres()
    primary.database("orders")
    standby = ctx.postgres(standby_of=primary)
    wait_until(lambda: standby.psql("SELECT pg_is_in_recovery()") == [["t"]], 20,
               what="the standby in recovery")
    redis = ctx.redis()
    quick = ctx.service(redis, standby.url("orders"), args=["--db-start-wait-ms", "1500"],
                        wait=False)
    t0 = time.monotonic()
    rc = quick.proc.wait(30)
    took = time.monotonic() - t0
    log = quick.logs()
    assert rc == 1 and 1.4 <= took < 15, (rc, took, log)
    assert "takes no writes" in log and "--db-start-wait-ms" in log, log
    s = ctx.service(redis, standby.url("orders"), args=["--db-start-wait-ms", "60000"],
                    wait=False)
    wait_until(lambda: s.logs().count("cannot open it yet") >= 2, 20, what="tries logged")
    assert s.proc.poll() is None, s.logs()
    t0 = time.monotonic()
    standby.promote()
    wait_until(s._up, 30, what="flashsale to listen once the standby is promoted")
    print("    waited on the standby, logged %d tries; listening %.1f s after the promotion"
          % (s.logs().count("cannot open it yet"), time.monotonic() - t0))
    assert "database: opened at try" in s.logs(), s.logs()
    r = s.post("/v1/products", {"sku": "after-promote", "stock": 5, "strategy": "lua"})
    assert r.status == 201, r
    r = s.post("/v1/orders", {"sku": "after-promote", "user_id": "u1", "quantity": 1})
    assert r.status == 201, r


def test_statement_pooling_is_refused_at_start(ctx):
    """A pooler in statement mode cannot carry a transaction: the service
    does not start half-working; it exits naming the setting."""
    pg = ctx.postgres()
    pg.database("orders")
    bouncer = ctx.pgbouncer(pg, mode="statement")
    redis = ctx.redis()
    s = harness.Service(redis.url, bouncer.url("orders"), wait=False, log_dir=ctx.tmp)
    t0 = time.monotonic()
    rc = s.proc.wait(30)
    assert rc != 0 and time.monotonic() - t0 < 10, rc      # not tried again
    log = s.logs()
    assert "pool_mode" in log and "statement" in log, log
