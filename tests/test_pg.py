"""test_pg.py: the orders on PostgreSQL (`--db postgresql://...`), against a
real throwaway server per test (harness.Postgres: initdb + postgres on a
free port, stopped by PID).

- every safe strategy sells exactly its stock on one instance and on two
  sharing one server (the books read from the client, the API, Redis and
  the server), and the forced flaws still oversell there;
- holds are paid, cancelled and expired, and flashload's verifier, reading
  the server with its own queries, finds the books exact;
- an instance killed with SIGKILL mid-sale, and PostgreSQL itself
  restarted mid-sale (fast shutdown, and the postmaster killed with
  SIGKILL): every 201 has its row, nothing oversold or leaked, sales
  resume, and `flashsale audit` on the server finds it consistent."""
import json
import os
import re
import subprocess
import threading
import time

import harness
from harness import db_rows, wait_until
from test_faults import Load, assert_books_balance, audit, figures, kill9_mid_sale, settle
from test_flashload import flashload, vantage
from test_strategies import FORCE, assert_exact, forced, hammer, oversold

# A product's sold and held on the server: its row's and its tallies'
# (docs/storage.md, "PostgreSQL").
SOLD = "p.sold+coalesce((SELECT sum(t.sold) FROM product_tallies t WHERE t.sku=p.sku),0)"
HELD = "p.held+coalesce((SELECT sum(t.held) FROM product_tallies t WHERE t.sku=p.sku),0)"

SAFE_PG = [("lua", 1), ("lua", 8), ("lock", 1), ("lock", 8), ("db", 1), ("db-optimistic", 1),
           ("db-lock", 1), ("db-for-update", 1), ("local", 1)]


def pg_db(ctx, name="orders"):
    """A fresh database on a new server; (server, its URL)."""
    pg = ctx.postgres()
    return pg, pg.database(name)


def run_safe_pg(ctx, instances):
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    services = [ctx.service(redis, db=url) for _ in range(instances)]
    s = services[0]
    for strategy, segments in SAFE_PG:
        if instances > 1 and strategy == "local":
            continue                # right on one instance only
        sku = "%s-%d" % (strategy, segments)
        s.create_product(sku, 100, strategy=strategy, segments=segments)
        answers = hammer(services, sku, conns=60, per_conn=12)
        try:
            assert_exact(s, redis, sku, 100, answers, not strategy.startswith("db"))
        except AssertionError as e:
            raise AssertionError("%s x %d segments, %d instance(s) on PostgreSQL: %s"
                                 % (strategy, segments, instances, e))
    # The server holds what the service says: sold == the orders' units.
    for sku, sold, units in db_rows(url, "SELECT p.sku, " + SOLD + ", (SELECT coalesce("
                                    "sum(quantity),0) FROM orders o WHERE o.sku=p.sku)"
                                    " FROM products p"):
        assert sold == units == 100, (sku, sold, units)


def test_pg_safe_strategies_sell_exactly_the_stock(ctx):
    run_safe_pg(ctx, 1)


def test_pg_safe_strategies_over_two_instances(ctx):
    run_safe_pg(ctx, 2)


def test_pg_forced_flaws_still_oversell(ctx):
    """The store does not change what a lock shows: `local` on two
    instances oversells the last unit, on one it does not."""
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    args = ["--fault-injection", "--lock-wait-ms", "10000"]
    a = ctx.service(redis, db=url, args=args)
    b = ctx.service(redis, db=url, args=args)
    a.create_product("loc", 1, strategy="local", **FORCE)
    over, p = oversold(a, "loc", 1, hammer([a, b], "loc", conns=10, per_conn=1))
    met, _ = forced(redis, "loc")
    assert met >= 2 and over > 0, (met, over, p)
    a.create_product("loc1", 1, strategy="local", cs_overlap=2, cs_delay_ms=1000)
    over, p = oversold(a, "loc1", 1, hammer([a], "loc1", conns=10, per_conn=1))
    assert over == 0 and p["sold"] == 1, p


def test_pg_for_update_and_its_unsafe_twin(ctx):
    """The pessimistic lock of Alibaba Cloud's distributed lock article: db-for-update locks the product's row
    with SELECT ... FOR UPDATE in the order's own transaction, so a second
    buyer can never be inside with the same read (the forcing waits for
    one in vain); unsafe-check-outside-tx reads and checks before the
    transaction that locks, and two buyers of one read both sell."""
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    args = ["--fault-injection", "--lock-wait-ms", "10000"]
    a = ctx.service(redis, db=url, args=args)
    b = ctx.service(redis, db=url, args=args)
    a.create_product("fu", 5, strategy="db-for-update", cs_overlap=2, cs_delay_ms=300)
    over, p = oversold(a, "fu", 5, hammer([a, b], "fu", conns=10, per_conn=1))
    met, alone = forced(redis, "fu")
    assert met == 0 and alone == 5 and over == 0 and p["sold"] == 5, (met, alone, p)
    assert db_rows(url, "SELECT db_available, " + SOLD + " FROM products p WHERE sku='fu'") == \
        [(0, 5)]
    a.create_product("late", 5, strategy="unsafe-check-outside-tx", **FORCE)
    over, p = oversold(a, "late", 5, hammer([a, b], "late", conns=10, per_conn=1))
    met, alone = forced(redis, "late")
    assert met >= 2 and over > 0, (met, alone, over, p)
    assert p["warning"].startswith("UNSAFE: unsafe-check-outside-tx oversells"), p


def test_pg_compare_and_the_database_rows_of_the_lock_table(ctx):
    """`flashload compare --db postgresql://...` (what `make demo-pg` runs)
    on the database's own strategies: each safe one passes, the unsafe twin
    oversells under its forcing, and the "choosing a lock" table has a row
    for each -- db-for-update's holder killed with SIGKILL is measured (the
    server ends the dead client's transaction: nothing taken), the others'
    n/a with the reason -- in report.json and report.html, fitting 1400 px."""
    from test_compare_locks import LOCK_FIELDS, compare, fits_1400, nothing_left_behind
    pg, url = pg_db(ctx)
    rc, so, se, j, html = compare(ctx, "--db", url, "--strategies",
                                  "db,db-optimistic,db-lock,db-for-update,unsafe-check-outside-tx",
                                  "--segments", "1", "--no-two-instances", "--quick",
                                  "--connections", 16, "--stock", 300, "--no-redis-failures",
                                  "--no-holds", timeout=240)
    print("\n".join("    " + l for l in so.splitlines() if l.strip()))
    assert rc == 0, so + se
    for sc in j["scenes"]:
        what = (sc["strategy"], sc["group"], sc.get("verdict"))
        assert sc["ran"] and sc["as_expected"], what
        assert (sc["oversold"] > 0) == (sc["strategy"] == "unsafe-check-outside-tx"), what
    locks = {l["strategy"]: l for l in j["locks"]}
    assert set(locks) == {"db", "db-optimistic", "db-lock", "db-for-update"}, locks.keys()
    for name, l in locks.items():
        assert set(l) == LOCK_FIELDS, (name, set(l) ^ LOCK_FIELDS)
        assert l["orders_per_s_1seg"] > 0 and 0 < l["p50_us"] <= l["p99_us"], l
        assert "PostgreSQL" in l["lock_server"], l
        for k in ("server_restart", "server_data_lost", "failover_to_replica"):
            assert not l[k]["measured"] and l[k]["note"].startswith("n/a: "), (name, k, l[k])
            assert "PostgreSQL" in l[k]["note"], (name, k, l[k])
    for name in ("db-lock", "db-for-update"):
        kill = locks[name]["kill_holder"]
        assert kill["measured"] and kill["pass"] and kill["oversold"] == 0, (name, kill)
        assert "sold 1, left 4" in kill["note"], (name, kill)
    assert "no lease" in locks["db-for-update"]["kill_holder"]["note"]
    fu = locks["db-for-update"]["pause_past_lease"]
    assert not fu["measured"] and re.search(r"0 oversold, 0 of \d+ waits met", fu["note"]), fu
    for name in ("db", "db-optimistic"):
        assert locks[name]["kill_holder"]["note"].startswith("n/a: no lock is held"), locks[name]
    table = so.splitlines()
    table = table[table.index("choosing a lock (measured in this run)") + 1:]
    for name in locks:
        assert any(re.match(r"%s\s+\d+\s" % re.escape(name), l) for l in table), (name, table)
    fits_1400(html)
    nothing_left_behind(ctx)

def test_pg_verifier_and_idempotency_on_two_instances(ctx):
    """flashload's run over two instances on one server, with idempotency
    keys replayed and a per-user limit: the verifier, reading the server
    itself, passes."""
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    a = ctx.service(redis, db=url)
    b = ctx.service(redis, db=url)
    for strategy in ("lua", "db"):
        rc, so, se = flashload("--target", "http://127.0.0.1:%d" % a.port,
                               "--target", "http://127.0.0.1:%d" % b.port,
                               "--redis", redis.url, "--db", url, "--sku", "v-" + strategy,
                               "--strategy", strategy, "--stock", 1200, "--requests", 3000,
                               "--connections", 32, "--users", 300, "--quantity", "1-3",
                               "--per-user-limit", 30, "--idempotency", "--retry", 0.2)
        assert rc == 0, so + se
        assert re.search(r"verdict    PASS \(checked: client, api, (redis, )?postgresql\)", so), so


def test_pg_holds_and_the_books_balance(ctx):
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    s = ctx.service(redis, db=url, args=["--admin-token", "t0ken"])
    for sku, strategy, stock in (("hold-lua", "lua", 200), ("hold-db", "db", 100),
                                 ("hold-lock", "lock", 100)):
        out = ctx.path(sku + ".json")
        rc, so, se = flashload(*vantage(s, redis), "--admin-token", "t0ken", "--sku", sku,
                               "--strategy", strategy, "--stock", stock, "--hold-seconds", 2,
                               "--pay", 0.6, "--cancel", 0.1, "--duration", 3,
                               "--connections", 16, "--json", out)
        assert rc == 0, so + se
        h = json.load(open(out))["holds"]
        states = dict(db_rows(url, "SELECT state, count(*) FROM holds WHERE sku=? GROUP BY state",
                              (sku,)))
        assert "reserved" not in states and h["owed"] == 0, (states, h)
        assert states.get("confirmed", 0) == h["confirmed"], (states, h)
        assert h["resold"] > 0 and h["resale_checked"], h
        sold, held, initial = db_rows(url, "SELECT " + SOLD + ", " + HELD + ", stock_initial "
                                      "FROM products p WHERE sku=?", (sku,))[0]
        assert held == 0 and sold == h["confirmed_units"], (sold, held, h)
    rc, out = audit(redis, url)
    assert rc == 0, out


def test_pg_audit_repairs_the_counts(ctx):
    """Counts that disagree with the order rows (a products row and a tally
    row tampered with, a db product's available too) are found by `flashsale
    audit` and set from the rows by `--repair`; then the audit passes and
    the service sells the rest exactly."""
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    services = [ctx.service(redis, db=url) for _ in range(2)]
    s = services[0]
    for sku, strategy in (("r-lua", "lua"), ("r-db", "db")):
        s.create_product(sku, 100, strategy=strategy)
        hammer(services, sku, conns=8, per_conn=5)
    for t in services:
        t.stop()
    pg.psql("UPDATE products SET sold=sold+7 WHERE sku='r-lua';"
            " INSERT INTO product_tallies VALUES('r-lua', 424242, 3, 2);"
            " UPDATE products SET db_available=db_available-5, held=held+1 WHERE sku='r-db'",
            dbname="orders")
    rc, out = audit(redis, url)
    assert rc == 1 and out.count("DISCREPANCY") >= 2, out
    rc, out = audit(redis, url, repair=True)
    assert "repaired: sold and held set to 40 and 0" in out, out
    rc, out = audit(redis, url)
    assert rc == 0, out
    for sku, sold, held in db_rows(url, "SELECT p.sku, " + SOLD + ", " + HELD +
                                   " FROM products p ORDER BY sku"):
        assert (sold, held) == (40, 0), (sku, sold, held)
    t = ctx.service(redis, db=url)
    for sku in ("r-lua", "r-db"):
        answers = hammer([t], sku, conns=8, per_conn=12)
        assert sum(1 for st, _ in answers if st == 201) == 60, answers
        p = t.product(sku)
        assert (p["sold"], p["held"], p["stock_available"]) == (100, 0, 0), p

def test_pg_kill9_of_an_instance_mid_sale(ctx):
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    kill9_mid_sale(ctx, redis, url)


def restarted_mid_sale(ctx, mode):
    """PostgreSQL stopped (mode: fast shutdown, or the postmaster killed
    with SIGKILL) and started again while buyers order: every 201 has its
    row, nothing oversold or leaked, and sales resume."""
    redis = ctx.redis()
    pg, url = pg_db(ctx)
    s = ctx.service(redis, db=url)
    initial = 100000
    for strategy in ("lua", "db"):
        sku = "r-" + strategy
        s.create_product(sku, initial, strategy=strategy)
        load = Load([s], sku, buyers=16, keys=sku + "-")
        time.sleep(1.0)
        t_down = time.monotonic()
        pg.restart(mode)
        t_up = time.monotonic()
        wait_until(lambda: load.first_201_after(t_up) is not None, 30,
                   what="a sale after PostgreSQL came back")
        time.sleep(0.5)
        load.finish()
        settle(redis, sku)
        figures(ctx, strategy=strategy, down_s="%.2f" % (t_up - t_down),
                next_201_after_up_s="%.2f" % load.first_201_after(t_up),
                refused={"%d %s" % c for c in load.codes()})
        assert_books_balance(s, redis, sku, initial, load, ctx=ctx)
    rc, out = audit(redis, url)
    assert rc == 0, out


def test_pg_restarted_mid_sale_fast_shutdown(ctx):
    restarted_mid_sale(ctx, "fast")


def test_pg_postmaster_killed_mid_sale(ctx):
    restarted_mid_sale(ctx, "kill")


def test_migrate_from_sqlite(ctx):
    """`flashsale migrate --from orders.db --to postgresql://...` copies a
    sale's books into an empty database in one transaction: a copy that
    fails leaves the target empty and runs again; the target's audit
    passes; the service on the server goes on where SQLite stopped (the
    stock, the holds, a replayed key's original order); a second copy into
    the now non-empty target is refused."""
    redis = ctx.redis()
    lite = ctx.path("orders.db")
    token = ["--admin-token", "t0ken"]
    s = ctx.service(redis, db=lite, args=token)
    auth = {"Authorization": "Bearer t0ken"}
    for sku, strategy in (("m-lua", "lua"), ("m-db", "db"), ("m-lock", "lock")):
        r = s.post("/v1/products", {"sku": sku, "stock": 50, "strategy": strategy,
                                    "per_user_limit": 5}, headers=auth)
        assert r.status == 201, r
        hammer([s], sku, conns=8, per_conn=4)
    r = s.post("/v1/products", {"sku": "m-hold", "stock": 20, "strategy": "lua",
                                "hold_seconds": 600}, headers=auth)
    assert r.status == 201, r
    held = [s.order("m-hold", user="h%d" % i).json["order_id"] for i in range(4)]
    assert s.post("/v1/orders/%s/confirm" % held[0], {}, headers=auth).status == 200
    assert s.post("/v1/orders/%s/cancel" % held[1], {"user_id": "h1"}).status == 200
    first = s.order("m-lua", user="k", key="key-1")
    assert first.status == 201, first
    r = s.post("/v1/products/m-db/restock", {"quantity": 7}, headers=dict(auth, **{
        "Idempotency-Key": "restock-1"}))
    assert r.status == 200, r
    before = {p: s.product(p) for p in ("m-lua", "m-db", "m-lock", "m-hold")}
    s.stop()
    pg, url = pg_db(ctx)
    exe = os.path.join(harness.BIN, "flashsale")

    def migrate():
        return subprocess.run([exe, "migrate", "--from", lite, "--to", url, "--redis", redis.url,
                               "--pending-timeout-ms", "3000"], capture_output=True, text=True,
                              timeout=120)
    # A copy that fails half way (a restock key the target already has)
    # leaves nothing of the sale behind.
    db_open = subprocess.run([exe, "migrate", "--from", lite, "--to", url, "--no-audit"],
                             capture_output=True, text=True, timeout=60)
    assert db_open.returncode == 0, db_open.stderr          # creates and fills the schema
    pg.psql("TRUNCATE products, orders, holds, voided_orders, user_units, restocks, lock_fences;"
            " INSERT INTO restocks VALUES('restock-1','x',1,'t')", dbname="orders")
    bad = migrate()
    assert bad.returncode == 2 and "restocks" in bad.stderr + bad.stdout, bad
    assert pg.psql("SELECT count(*) FROM products", dbname="orders") == [["0"]]
    assert pg.psql("SELECT count(*) FROM orders", dbname="orders") == [["0"]]
    pg.psql("DELETE FROM restocks", dbname="orders")
    ok = migrate()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "audit: consistent" in ok.stdout, ok.stdout
    for table in ("products", "orders", "holds", "user_units", "restocks"):
        assert "%s: " % table in ok.stderr, ok.stderr
    again = migrate()
    assert again.returncode == 2 and "not empty" in again.stderr, again
    # The service goes on, on the server, where it stopped.
    t = ctx.service(redis, db=url, args=token)
    for sku, p in before.items():
        q = t.product(sku)
        for k in ("stock_initial", "sold", "held", "stock_available"):
            assert q[k] == p[k], (sku, k, p, q)
    replay = t.order("m-lua", user="k", key="key-1")
    assert replay.status == 200 and replay.json["order_id"] == first.json["order_id"], replay
    assert t.post("/v1/orders/%s/confirm" % held[2], {}, headers=auth).status == 200
    assert t.post("/v1/orders/%s/confirm" % held[1], {}, headers=auth).status == 409
    hammer([t], "m-db", conns=8, per_conn=10)
    p = t.product("m-db")
    assert p["sold"] + p["stock_available"] == before["m-db"]["stock_initial"], p
    rows = db_rows(url, "SELECT count(*), coalesce(sum(quantity),0) FROM orders WHERE sku=?",
                   ("m-db",))[0]
    assert rows[1] == p["sold"], (rows, p)
    rc, out = audit(redis, url)
    assert rc == 0, out


def test_bench_pg_runs_and_reports_its_goals(ctx):
    """make bench-pg's script, in its quick mode: every figure measured
    (pgbench and the service, verified by flashload), every goal printed
    with met or NOT met. What it reaches is the benchmark's to say."""
    r = subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(__file__), "..",
                                                          "loadtest", "bench_pg.py"),
                        harness.BIN, "--quick"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("pgbench hot row c=64", "pgbench insert c=64", "lua on postgresql c=64",
                 "lua on sqlite c=64", "db on postgresql c=64",
                 "lua on postgresql, 2 instances c=64"):
        m = re.search(r"^  %s\s+(\d+)" % re.escape(name), r.stdout, re.M)
        assert m and int(m.group(1)) > 0, (name, r.stdout)
    assert len(re.findall(r"\(>= [\d.]+\) (met|NOT met)$", r.stdout, re.M)) == 4, r.stdout
    print("\n".join("    " + l for l in r.stdout.splitlines() if l.strip()))
