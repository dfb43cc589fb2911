"""test_api.py: every route and error code of the API, against the real
service, a real redis-server and a real SQLite file."""
import json
import os
import re
import time

from harness import db_rows, Client

ID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def error_of(r, status, code):
    assert r.status == status, r
    assert r.json and r.json.get("error") == code, r
    assert isinstance(r.json.get("message"), str) and r.json["message"], r
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers


def test_product_create_get(ctx):
    s = ctx.service(ctx.redis())
    r = s.post("/v1/products", {"sku": "phone-x", "name": "Phone X", "stock": 100})
    assert r.status == 201, r
    p = r.json
    assert p["sku"] == "phone-x" and p["name"] == "Phone X" and p["strategy"] == "lua"
    assert p["segments"] == 1 and p["per_user_limit"] == 0
    assert p["stock_initial"] == 100 and p["stock_available"] == 100 and p["sold"] == 0
    assert "warning" not in p                            # only the unsafe ones warn
    assert p["segment_available"] == [100]
    assert s.product("phone-x") == p
    error_of(s.post("/v1/products", {"sku": "phone-x", "stock": 5}), 409, "sku_exists")
    error_of(s.get("/v1/products/nope"), 404, "unknown_sku")
    error_of(s.get("/v1/products/bad%20sku"), 404, "unknown_sku")
    seg = s.create_product("seg", 10, segments=4, per_user_limit=3)
    assert seg["segment_available"] == [3, 3, 2, 2] and seg["stock_available"] == 10
    assert seg["per_user_limit"] == 3


def test_order_create_get_list(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("phone-x", 100)
    r = s.order("phone-x", "u-42", 2)
    assert r.status == 201, r
    o = r.json
    assert ID_RE.match(o["order_id"]), o
    assert TIME_RE.match(o["created_at"]), o
    assert (o["sku"], o["user_id"], o["quantity"], o["status"]) == ("phone-x", "u-42", 2, "confirmed")
    assert r.headers["location"] == "/v1/orders/" + o["order_id"]
    assert s.get("/v1/orders/" + o["order_id"]).json == o
    error_of(s.get("/v1/orders/01M818STFFTPCACA913QWDW159"), 404, "unknown_order")
    error_of(s.get("/v1/orders/not-an-id"), 404, "unknown_order")
    p = s.product("phone-x")
    assert (p["sold"], p["stock_available"]) == (2, 98), p
    # The row is in SQLite, read directly.
    assert db_rows(s.db_path, "SELECT sku, user_id, quantity FROM orders WHERE order_id=?",
                   (o["order_id"],)) == [("phone-x", "u-42", 2)]

    ids = [o["order_id"]] + [s.order("phone-x", "u-%d" % i).json["order_id"] for i in range(6)]
    page = s.get("/v1/orders?sku=phone-x&limit=3").json
    assert [x["order_id"] for x in page["orders"]] == ids[:3] and page["next"] == ids[2]
    page = s.get("/v1/orders?sku=phone-x&limit=3&after=" + page["next"]).json
    assert [x["order_id"] for x in page["orders"]] == ids[3:6] and page["next"] == ids[5]
    page = s.get("/v1/orders?sku=phone-x&limit=3&after=" + page["next"]).json
    assert [x["order_id"] for x in page["orders"]] == ids[6:] and page["next"] is None
    mine = s.get("/v1/orders?user_id=u-42").json["orders"]
    assert [x["order_id"] for x in mine] == [o["order_id"]]
    assert s.get("/v1/orders?sku=other").json == {"orders": [], "next": None}
    error_of(s.get("/v1/orders?limit=0"), 400, "invalid_field")
    error_of(s.get("/v1/orders?limit=1001"), 400, "invalid_field")
    error_of(s.get("/v1/orders?limit=x"), 400, "invalid_field")
    error_of(s.get("/v1/orders?after=zzz"), 400, "invalid_field")
    error_of(s.get("/v1/orders?sku=a%20b"), 400, "invalid_field")


def test_idempotent_replay(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("phone-x", 10)
    s.create_product("other", 10)
    r1 = s.order("phone-x", "u1", 2, key="k1")
    assert r1.status == 201
    r2 = s.order("phone-x", "u1", 2, key="k1")
    assert r2.status == 200 and r2.headers.get("idempotent-replayed") == "true", r2
    assert r2.json == r1.json
    error_of(s.order("phone-x", "u1", 3, key="k1"), 422, "idempotency_key_reused")
    error_of(s.order("phone-x", "u2", 2, key="k1"), 422, "idempotency_key_reused")
    # The same key on another SKU: caught by SQLite, its units given back.
    error_of(s.order("other", "u1", 2, key="k1"), 422, "idempotency_key_reused")
    assert s.product("other")["stock_available"] == 10
    p = s.product("phone-x")
    assert (p["sold"], p["stock_available"]) == (2, 8), p
    assert db_rows(s.db_path, "SELECT count(*) FROM orders")[0][0] == 1
    error_of(s.order("phone-x", "u1", 1, key="bad key"), 400, "invalid_field")
    error_of(s.order("phone-x", "u1", 1, key="x" * 129), 400, "invalid_field")


def test_per_user_limit(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("lim", 100, per_user_limit=2)
    assert s.order("lim", "alice", 1).status == 201
    assert s.order("lim", "alice", 1).status == 201
    r = s.order("lim", "alice", 1)
    error_of(r, 409, "per_user_limit")
    assert r.json["bought"] == 2 and r.json["per_user_limit"] == 2
    error_of(s.order("lim", "bob", 3), 409, "per_user_limit")
    assert s.order("lim", "bob", 2).status == 201
    p = s.product("lim")
    assert (p["sold"], p["stock_available"]) == (4, 96), p


def test_sold_out_and_insufficient(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("few", 3)
    assert s.order("few", "a", 2).status == 201
    r = s.order("few", "b", 2)
    error_of(r, 409, "insufficient_stock")
    assert r.json["available"] == 1
    assert s.order("few", "c", 1).status == 201
    r = s.order("few", "d", 1)
    error_of(r, 409, "sold_out")
    p = s.product("few")
    assert (p["sold"], p["stock_available"]) == (3, 0), p
    s.create_product("none", 0)
    error_of(s.order("none", "a", 1), 409, "sold_out")


def test_bad_input_changes_nothing(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("phone-x", 10)
    c = s.client
    bad_orders = [
        ('{"sku": "phone-x", "user_id": "u", "quantity": 1', "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ("", "invalid_json"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": "1"}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": 5, "quantity": 1}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": 0}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": -3}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": 1001}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": 99999999999999999}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": 1.5}', "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": null}', "missing_field"),
        ('{"sku": "phone x", "user_id": "u", "quantity": 1}', "invalid_field"),
        ('{"sku": "%s", "user_id": "u", "quantity": 1}' % ("a" * 65), "invalid_field"),
        ('{"user_id": "u", "quantity": 1}', "missing_field"),
        ('{"sku": "phone-x", "quantity": 1}', "missing_field"),
        ('{"sku": "phone-x", "user_id": "%s", "quantity": 1}' % ("u" * 129), "invalid_field"),
        ('{"sku": "phone-x", "user_id": "u", "quantity": 1, "price": 0}', "invalid_field"),
        ('{"sku": "phone-x", "sku": "x", "user_id": "u", "quantity": 1}', "invalid_json"),
    ]
    for raw, code in bad_orders:
        r = c.request("POST", "/v1/orders", raw=raw)
        assert r.status == 400 and r.json["error"] == code, (raw, r)
        assert r.json["message"], r
    error_of(s.order("ghost", "u", 1), 404, "unknown_sku")
    big = json.dumps({"sku": "phone-x", "user_id": "u" * 100, "quantity": 1, "pad": "x" * 70000})
    error_of(c.request("POST", "/v1/orders", raw=big), 413, "body_too_large")
    error_of(c.request("POST", "/v1/orders", raw='{"sku":"phone-x","user_id":"u","quantity":1}',
                       headers={"Content-Type": "text/plain"}), 415, "unsupported_media_type")
    # A missing Content-Type is read as JSON.
    assert c.request("POST", "/v1/orders", raw='{"sku":"phone-x","user_id":"u","quantity":1}',
                     headers={"Content-Type": None}).status == 201
    r = c.request("DELETE", "/v1/orders")
    error_of(r, 405, "method_not_allowed")
    assert "POST" in r.headers["allow"] and "GET" in r.headers["allow"], r.headers
    error_of(c.request("PUT", "/v1/products/phone-x"), 405, "method_not_allowed")
    error_of(c.get("/v2/nothing"), 404, "not_found")
    error_of(c.get("/v1/orders/"), 404, "not_found")
    bad_products = [
        ({"sku": "p1"}, "missing_field"),
        ({"sku": "p1", "stock": -1}, "invalid_field"),
        ({"sku": "p1", "stock": 10 ** 9 + 1}, "invalid_field"),
        ({"sku": "p1", "stock": "5"}, "invalid_field"),
        ({"sku": "p1", "stock": 5, "segments": 0}, "invalid_field"),
        ({"sku": "p1", "stock": 5, "segments": 1025}, "invalid_field"),
        ({"sku": "p1", "stock": 5, "strategy": "magic"}, "invalid_field"),
        ({"sku": "p1", "stock": 5, "per_user_limit": -1}, "invalid_field"),
        ({"sku": "p 1", "stock": 5}, "invalid_field"),
        ({"stock": 5}, "missing_field"),
    ]
    for body, code in bad_products:
        r = s.post("/v1/products", body)
        assert r.status == 400 and r.json["error"] == code, (body, r)
    error_of(s.post("/v1/products/phone-x/restock", {"quantity": 0}), 400, "invalid_field")
    error_of(s.post("/v1/products/phone-x/restock", {}), 400, "missing_field")
    error_of(s.post("/v1/products/ghost/restock", {"quantity": 1}), 404, "unknown_sku")
    # Nothing moved: one order (the one without Content-Type), one product.
    p = s.product("phone-x")
    assert (p["sold"], p["stock_available"], p["stock_initial"]) == (1, 9, 10), p
    assert db_rows(s.db_path, "SELECT count(*) FROM orders")[0][0] == 1
    assert db_rows(s.db_path, "SELECT count(*) FROM products")[0][0] == 1
    # The connection survives all of that, and a fresh one still works.
    assert Client(s.port).get("/healthz").status == 200


def test_admin_token(ctx):
    s = ctx.service(ctx.redis(), args=["--admin-token", "s3cret"])
    body = {"sku": "a", "stock": 5}
    r = s.post("/v1/products", body)
    error_of(r, 401, "unauthorized")
    error_of(s.post("/v1/products", body, headers={"Authorization": "Bearer wrong"}), 401,
             "unauthorized")
    error_of(s.post("/v1/products", body, headers={"Authorization": "Bearer s3cre"}), 401,
             "unauthorized")
    auth = {"Authorization": "Bearer s3cret"}
    assert s.post("/v1/products", body, headers=auth).status == 201
    error_of(s.post("/v1/products/a/restock", {"quantity": 1}), 401, "unauthorized")
    assert s.post("/v1/products/a/restock", {"quantity": 1}, headers=auth).status == 200
    assert s.order("a", "u", 1).status == 201            # orders need no token
    assert "s3cret" not in s.logs()


def test_restock(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("r", 2, segments=3)
    assert s.order("r", "a", 2).status == 201
    error_of(s.order("r", "a", 1), 409, "sold_out")
    r = s.post("/v1/products/r/restock", {"quantity": 7})
    assert r.status == 200, r
    p = r.json
    assert p["stock_initial"] == 9 and p["stock_available"] == 7 and p["sold"] == 2
    assert sorted(p["segment_available"]) == [2, 2, 3], p
    assert s.order("r", "b", 7).status == 201          # taken across segments
    error_of(s.order("r", "b", 1), 409, "sold_out")


def test_healthz_and_metrics(ctx):
    s = ctx.service(ctx.redis())
    r = s.get("/healthz")
    assert r.status == 200 and r.json["status"] == "ok", r
    assert r.json["redis"] == "ok" and r.json["db"] == "ok"
    s.create_product("m", 1)
    s.order("m", "a", 1)
    s.order("m", "b", 1)
    r = s.get("/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain"), r
    t = r.raw
    assert 'flashsale_orders_total{strategy="lua",outcome="created"} 1' in t, t
    assert 'flashsale_orders_total{strategy="lua",outcome="sold_out"} 1' in t, t
    assert 'flashsale_http_request_duration_seconds_bucket{route="order_create",le="+Inf"} 2' in t
    assert "sku=" not in t, t                   # no per-SKU series (docs/metrics.md)
    for family in ("flashsale_lock_acquire_duration_seconds_count", "flashsale_redis_errors_total",
                   "flashsale_db_errors_total", "flashsale_http_inflight"):
        assert family in t, family
    sqlite_mem = int(re.search(r"^flashsale_sqlite_memory_bytes (\d+)$", t, re.M).group(1))
    assert sqlite_mem > 0, t                # the open connections hold page caches


def test_restart_keeps_orders_and_stock(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("keep", 50, per_user_limit=5)
    ids = [s.order("keep", "u%d" % (i % 3), 1, key="k%d" % i).json["order_id"] for i in range(10)]
    assert s.stop() == 0
    s.restart()
    p = s.product("keep")
    assert (p["sold"], p["stock_available"]) == (10, 40), p
    assert [o["order_id"] for o in s.get("/v1/orders?sku=keep").json["orders"]] == ids
    r = s.order("keep", "u0", 1, key="k0")          # replay after restart
    assert r.status == 200 and r.json["order_id"] == ids[0], r
    assert s.order("keep", "u0", 1).status == 201      # u0 had 4
    error_of(s.order("keep", "u0", 1), 409, "per_user_limit")


def test_pending_reconciliation_at_start(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("rec", 10)
    committed = s.order("rec", "a", 2).json["order_id"]
    assert s.stop() == 0
    r = redis.client()
    # A reservation whose order never reached SQLite (its owner died), and a
    # stray record of an order that did commit, as a crash can leave them.
    r.decrby("fs:{rec}:stock:0", 3)
    r.hset("fs:{rec}:pending", "01ZZZZZZZZZZZZZZZZZZZZZZZZ", json.dumps(
        {"q": 3, "u": "ghost", "k": "", "i": "deadhost:1#00000000", "t": int(time.time() * 1000),
         "s": "0:3", "l": 0}))
    r.hset("fs:{rec}:pending", committed, json.dumps(
        {"q": 2, "u": "a", "k": "", "i": "deadhost:1#00000000", "t": int(time.time() * 1000),
         "s": "0:2", "l": 0}))
    assert int(r.get("fs:{rec}:stock:0")) == 5
    s.restart()
    assert r.hlen("fs:{rec}:pending") == 0
    p = s.product("rec")
    assert (p["sold"], p["stock_available"]) == (2, 8), p
    assert db_rows(s.db_path, "SELECT order_id FROM voided_orders") == [("01ZZZZZZZZZZZZZZZZZZZZZZZZ",)]
    assert "settled" in s.logs()


def test_redis_data_loss_rebuilds_from_sqlite(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("lost", 20, per_user_limit=3)
    for i in range(5):
        assert s.order("lost", "u%d" % (i % 2), 1).status == 201
    redis.restart()                      # no persistence: everything is gone
    # The first order notices and is refused while the copy is rebuilt...
    r = s.order("lost", "u9", 1)
    assert r.status in (201, 503), r
    if r.status == 503:
        assert r.json["error"] == "redis_unavailable"
    # ...and then service resumes by itself, from SQLite's numbers.
    from harness import wait_until
    wait_until(lambda: s.order("lost", "u8", 1).status == 201, 10, what="orders to resume")
    p = s.product("lost")
    assert p["stock_initial"] == p["sold"] + p["stock_available"], p
    assert p["sold"] == db_rows(s.db_path, "SELECT sum(quantity) FROM orders WHERE sku='lost'")[0][0]
    # The per-user counts were rebuilt too: u0 had 3 (orders 0, 2, 4).
    error_of(s.order("lost", "u0", 1), 409, "per_user_limit")
    assert redis.client().get("fs:{lost}:gen").startswith("2:"), "a new generation"


def test_redis_down_then_back(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("down", 10)
    assert s.order("down", "a", 1).status == 201
    redis.kill()
    t0 = time.monotonic()
    r = s.order("down", "b", 1)
    took = time.monotonic() - t0
    error_of(r, 503, "redis_unavailable")
    assert took < 2.0, took
    from harness import wait_until
    # Health is probed every 0.5 s: it turns within a probe and a timeout.
    h = wait_until(lambda: (lambda h: h.status == 503 and h)(s.get("/healthz")), 3,
                   what="/healthz to see Redis down")
    assert h.json["redis"] == "unavailable" and h.json["db"] == "ok", h
    assert h.headers.get("retry-after") == "1", h.headers
    redis.start()                         # back, empty
    wait_until(lambda: s.order("down", "c", 1).status == 201, 10, what="recovery")
    wait_until(lambda: s.get("/healthz").status == 200, 3, what="/healthz to recover")
    p = s.product("down")
    assert (p["sold"], p["stock_available"]) == (2, 8), p


def test_redis_unix_socket(ctx):
    redis = ctx.redis(unix_socket=True)
    s = ctx.service("unix:" + redis.socket)
    s.create_product("u", 3)
    assert s.order("u", "a", 3).status == 201
    assert s.product("u")["stock_available"] == 0


def test_help_and_bad_flags(ctx):
    import subprocess
    import harness
    exe = harness.BIN + "/flashsale"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--listen", "--redis", "--db", "--strategy", "--admin-token", "--threads",
                 "--key-prefix", "FLASHSALE_REDIS", "FLASHSALE_ADMIN_TOKEN", "lua"):
        assert flag in out.stdout, flag
    bad = subprocess.run([exe, "--threads", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "threads" in bad.stderr
    bad = subprocess.run([exe, "--redis", "http://x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "redis" in bad.stderr.lower()
    bad = subprocess.run([exe, "--strategy", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2
    # A usage error is one line saying what and where the help is, not the help.
    for args, says in ((["--bogus"], "unknown or ambiguous option '--bogus'"),
                       (["-x"], "unknown option '-x'"), (["--listen"], "--listen needs a value"),
                       (["audit", "--bogus"], "unknown or ambiguous option '--bogus'")):
        bad = subprocess.run([exe] + args, capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stdout == "", (args, bad)
        assert bad.stderr == "flashsale: %s (see flashsale --help)\n" % says, (args, bad.stderr)


def test_strategies_list(ctx):
    s = ctx.service(ctx.redis())
    r = s.get("/v1/strategies")
    assert r.status == 200, r
    by_name = {x["name"]: x for x in r.json["strategies"]}
    assert {"lua", "lock", "db", "db-optimistic", "local"} <= set(by_name), by_name
    assert by_name["lua"]["safe"] and by_name["lua"]["segments"]
    assert by_name["lua"]["needs"] == ["redis"] and by_name["lua"]["available"]
    assert by_name["db"]["needs"] == [] and not by_name["db"]["segments"]
    # Without --redlock, --zookeeper or --etcd, their strategies are listed
    # but unavailable, and say which flag would make them available.
    for name, flag in (("redlock", "--redlock"), ("zookeeper", "--zookeeper"),
                       ("etcd", "--etcd")):
        x = by_name[name]
        assert not x["available"] and flag in x["unavailable_reason"], x
        assert x["needs"] == ["redis", name], x
    assert by_name["db-lock"]["available"] and by_name["db-lock"]["needs"] == ["redis"]
    for name, x in by_name.items():
        assert x["safe"] == (not name.startswith("unsafe-")), x
        assert x["description"], x
        assert ("unavailable_reason" in x) == (not x["available"]), x
        # Every available strategy can be chosen for a product; the others
        # are refused, naming the flag, and nothing is created.
        created = s.post("/v1/products", {"sku": "s-" + name, "stock": 1, "strategy": name})
        if x["available"]:
            assert created.status == 201 and created.json["strategy"] == name, created
        else:
            assert created.status == 400, created
            assert created.json["error"] == "strategy_unavailable", created
            need = x["needs"][-1]
            flag = "--db postgresql://" if need == "postgresql" else "--" + need
            assert flag in created.json["message"], created
            assert s.get("/v1/products/s-" + name).status == 404


def readme_strategy_table():
    """The rows of README.md's "Stock strategies" table: name -> (safe,
    segments, needs), as its columns write them."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Stock strategies\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([a-z0-9-]+)` \| (yes|no) \| (1\.\.N|1) \| ([^|]+) \|", line)
        if m:
            assert m.group(1) not in rows, "README lists %s twice" % m.group(1)
            needs = [] if m.group(4).strip() == "-" else [x.strip() for x in m.group(4).split(",")]
            rows[m.group(1)] = (m.group(2) == "yes", m.group(3) == "1..N", needs)
    return rows


def test_readme_strategy_table(ctx):
    """The README's strategy table lists exactly the strategies the service
    offers, each with what GET /v1/strategies says of it (safe, segments,
    needs): a strategy added, renamed or changed cannot leave the newcomer's
    first page behind. Its `how` and `verdict` columns are prose, checked by
    the tests of each strategy."""
    readme = readme_strategy_table()
    s = ctx.service(ctx.redis())
    r = s.get("/v1/strategies")
    assert r.status == 200, r
    served = {x["name"]: (x["safe"], x["segments"], x["needs"]) for x in r.json["strategies"]}
    assert set(readme) == set(served), ("README's table against GET /v1/strategies",
                                        sorted(set(readme) - set(served)),
                                        sorted(set(served) - set(readme)))
    for name, row in served.items():
        assert readme[name] == row, (name, "README", readme[name], "service", row)


def test_product_reads_are_at_most_50ms_old(ctx):
    """GET /v1/products/{sku} is answered again from memory for
    --product-cache-ms (50 ms) after a read of the stores; a change made on
    the same instance shows at once, one made on another instance within
    that bound."""
    redis = ctx.redis()
    db = ctx.path("orders.db")
    s1, s2 = ctx.service(redis, db=db), ctx.service(redis, db=db)
    s1.create_product("pc", 10)
    assert s2.product("pc")["stock_available"] == 10
    assert s2.order("pc", "a").status == 201
    assert s2.product("pc")["stock_available"] == 9          # its own write: at once
    assert s1.product("pc")["stock_available"] == 9
    assert s2.order("pc", "b").status == 201                  # on s2: s1's view is old
    t0 = time.time()
    harness_wait = __import__("harness").wait_until
    harness_wait(lambda: s1.product("pc")["stock_available"] == 8, 2, step=0.005,
                 what="s1 to see s2's order")
    waited = time.time() - t0
    print("    s1 saw the order placed on s2 %.0f ms later" % (waited * 1000))
    assert waited < 1.0, waited
