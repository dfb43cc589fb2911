"""test_overload.py: the admission limit of the order path (--max-inflight),
against a real service, Redis and SQLite.

- With the path full, an order is answered 503 `overloaded` with
  Retry-After, before its body is read (a malformed one gets the same
  answer, not a 400); nothing is taken, the order already in the path is
  answered 201, and the next one gets in.
- A burst far past a small fixed limit: some orders are shed, flashload
  counts them as shed (not as errors) and its verifier passes; the books
  balance (stock_initial == available + sold; every 201 is a row and
  every row a 201); /metrics counts each shed once, shows the limit, and
  no order left in flight.
- Each strategy has its own adaptive limit: a lock strategy whose orders
  wait a second each, with more buyers than its floor, is shed at its
  own limit while the orders of a `lua` product on the same instance go
  on unshed (one limit for all would have shed both).
- Every connection held by an order and the path slowing: the adaptive
  limit stays under the connections (a limit past them sheds nothing
  while the buyers beyond them wait in their clients).
- The default is adaptive and within its bounds, and the other memory
  bound, --connection-memory-kib, refuses a request head past it with 431.

No timing is asserted: which orders are shed depends on the machine; that
some are, and that none is lost, does not.
"""
import json
import os
import re
import socket
import subprocess
import threading

import harness
from harness import wait_until

SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', re.M)


def metrics(s):
    """{name or name{labels}: value} of s's /metrics."""
    r = s.get("/metrics")
    assert r.status == 200, r
    return {(m.group(1) + ("{%s}" % m.group(2) if m.group(2) else "")): float(m.group(3))
            for m in SERIES.finditer(r.raw)}


def admission(m):
    """The admission series of m (shorter assertion messages)."""
    return {k: v for k, v in m.items() if "admission" in k or "shed" in k or "inflight" in k
            or k == SHED_503}


SHED_503 = 'flashsale_http_responses_total{route="order_create",status="503",code="overloaded"}'


def test_full_path_sheds_at_the_door(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--max-inflight", "1", "--fault-injection"])
    # A `lock` product whose critical section pauses: one order holds the
    # path (of one) for about a second.
    s.create_product("slow", 10, strategy="lock", cs_delay_ms=1000, lock_ttl_ms=5000)
    first = {}

    def order_a():
        c = harness.Client(s.port)
        first["r"] = s.order("slow", user="a", client=c)
        c.close()

    t = threading.Thread(target=order_a)
    t.start()
    wait_until(lambda: metrics(s)["flashsale_orders_inflight"] == 1, 10,
               what="the first order to be in the path")
    r = s.order("slow", user="b")
    assert r.status == 503 and r.json["error"] == "overloaded", r
    assert r.headers["retry-after"] == "1", r.headers
    assert r.json["message"], r
    # Shed before the body is read: a malformed one gets the same answer.
    bad = s.request("POST", "/v1/orders", raw="{not json")
    assert bad.status == 503 and bad.json["error"] == "overloaded", bad
    t.join()
    assert first["r"].status == 201, first["r"]
    r = s.order("slow", user="c")                       # the path is free again
    assert r.status == 201, r
    m = metrics(s)
    assert m["flashsale_orders_shed_total"] == 2, m["flashsale_orders_shed_total"]
    assert m[SHED_503] == 2
    assert m["flashsale_order_admission_limit"] == 1
    assert m["flashsale_orders_inflight"] == 0
    # Nothing of b's order was taken: two sold, eight left.
    p = s.product("slow")
    assert (p["sold"], p["stock_available"]) == (2, 8), p
    users = {row[0] for row in harness.db_rows(s.db_path, "SELECT user_id FROM orders")}
    assert users == {"a", "c"}, users


def test_burst_past_a_small_limit_loses_nothing(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--max-inflight", "4"])
    out = ctx.path("burst.json")
    p = subprocess.run([os.path.join(harness.BIN, "flashload"),
                        "--target", "http://127.0.0.1:%d" % s.port, "--redis", redis.url,
                        "--db", s.db_path, "--sku", "burst", "--stock", "100000",
                        "--connections", "64", "--duration", "2", "--users", "5000",
                        "--quiet", "--json", out],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr              # the verifier's PASS
    res = json.load(open(out))
    assert res["verdict"]["pass"] and res["verdict"]["lost"] == 0, res["verdict"]
    assert res["shed"] > 0, p.stdout                           # 64 buyers, 4 places
    assert "overloaded" not in res["codes"], res["codes"]      # shed, not an error
    assert res["status"]["503"] == res["shed"], res["status"]
    assert res["transport_errors"] == 0, res
    assert re.search(r"^goodput .* %d shed \(503 overloaded" % res["shed"], p.stdout, re.M), \
        p.stdout
    # The books balance: every 201 a row, every row a 201, nothing lost.
    prod = s.product("burst")
    assert prod["sold"] == res["created"], (prod, res["created"])
    assert prod["stock_initial"] == prod["stock_available"] + prod["sold"] + prod["held"], prod
    rows = harness.db_rows(s.db_path, "SELECT COUNT(*), COALESCE(SUM(quantity), 0) FROM orders "
                           "WHERE sku = 'burst'")[0]
    assert rows == (res["created"], res["created"]), rows
    m = metrics(s)
    assert m["flashsale_orders_shed_total"] == res["shed"]      # each counted once
    assert m[SHED_503] == res["shed"]
    assert m["flashsale_order_admission_limit"] == 4
    wait_until(lambda: metrics(s)["flashsale_orders_inflight"] == 0, 10,
               what="no order left in the path")


def test_default_limit_is_adaptive_and_bounded(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--max-connections", "1000"])
    s.create_product("p", 1000)
    for i in range(40):
        assert s.order("p", user="u%d" % i).status == 201
    m = metrics(s)
    assert 128 <= m["flashsale_order_admission_limit"] <= 1000, \
        m["flashsale_order_admission_limit"]
    assert m["flashsale_orders_shed_total"] == 0
    assert m["flashsale_order_admission_latency_target_seconds"] == 0.1


def test_limit_stays_under_the_connections_it_fills(ctx):
    """Every connection waiting on an order and the path past half its
    target: the clients can send no more, and a limit that grew past the
    connections could never shed (their buyers would queue in the
    clients, unseen). The limit is held under the connections instead.
    Commits paced 60 ms apart keep the path's p90 at 54 ms or more (past
    half of a 90 ms target, and under it on an unhurried box, where the
    time rule alone grows the limit: to 617 over 300 connections in 3 s
    before the bound; a box slow enough to pass the target shrinks it
    by time too)."""
    redis = ctx.redis()
    conns = 300
    s = ctx.service(redis, args=["--order-latency-target-ms", "90", "--commit-gap-us", "60000"])
    out = ctx.path("held.json")
    p = subprocess.run([os.path.join(harness.BIN, "flashload"),
                        "--target", "http://127.0.0.1:%d" % s.port, "--redis", redis.url,
                        "--db", s.db_path, "--sku", "held", "--stock", "1000000",
                        "--connections", str(conns), "--duration", "3", "--users", "100000",
                        "--quiet", "--json", out],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr              # the verifier's PASS
    res = json.load(open(out))
    assert res["verdict"]["pass"] and res["verdict"]["lost"] == 0, res["verdict"]
    m = metrics(s)
    limit = m['flashsale_strategy_admission_limit{strategy="lua"}']
    p90 = m['flashsale_strategy_admission_latency_seconds{strategy="lua"}']
    print("    %d connections, p90 %.0f ms: limit %d, %d shed of %d" %
          (conns, p90 * 1000, limit, res["shed"], res["created"] + res["shed"]))
    # Held to 0.9 of them, at most x1.1 (x1.5 after a window under half the
    # target) before the next held window caps it again: under 1.4x; the
    # time rule alone stops only at twice the peak in flight (600).
    assert limit < 1.4 * conns, admission(m)


def test_a_slow_strategy_is_shed_at_its_own_limit(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--fault-injection", "--lock-wait-ms", "1000"])
    # Every order of `slow` holds its SKU's one lock for 200 ms, so with
    # 170 buyers most wait the whole second for it and get 429: a second
    # in the path each, ten times the target. Its limit falls to its floor
    # (128) and the buyers past it are shed.
    s.create_product("slow", 100000, strategy="lock", cs_delay_ms=200, lock_ttl_ms=5000)
    s.create_product("fast", 100000, strategy="lua")
    stop = threading.Event()
    counts = {"slow": {}, "fast": {}}
    mu = threading.Lock()

    def buyer(sku, i):
        c = harness.Client(s.port, timeout=30)
        n = 0
        while not stop.is_set():
            n += 1
            st = s.order(sku, user="%s-%d-%d" % (sku, i, n), client=c).status
            with mu:
                counts[sku][st] = counts[sku].get(st, 0) + 1
        c.close()

    threads = [threading.Thread(target=buyer, args=("slow", i)) for i in range(170)]
    threads += [threading.Thread(target=buyer, args=("fast", i)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: counts["slow"].get(503, 0) >= 50, 60,
                   what="the slow strategy's buyers to be shed at its limit")
        fast_before = dict(counts["fast"])
        m = admission(metrics(s))
        stop.wait(2)                       # both loads go on, the limit held
    finally:
        stop.set()
        for t in threads:
            t.join()
    fast = counts["fast"]
    # The lua product's buyers were never shed, and sold all along.
    assert fast.get(503, 0) == 0, counts
    assert fast.get(201, 0) > fast_before.get(201, 0) > 0, (fast_before, fast)
    assert set(counts["slow"]) <= {201, 429, 503}, counts
    assert 128 <= m['flashsale_strategy_admission_limit{strategy="lock"}'] < 170, m
    assert m['flashsale_strategy_admission_limit{strategy="lua"}'] >= 128, m
    assert m['flashsale_strategy_orders_shed_total{strategy="lock"}'] > 0, m
    assert 'flashsale_strategy_orders_shed_total{strategy="lua"}' not in m \
        or m['flashsale_strategy_orders_shed_total{strategy="lua"}'] == 0, m
    # The door's limit: both strategies' limits and the room for one more.
    assert m["flashsale_order_admission_limit"] >= 128 * 3, m
    m = admission(metrics(s))
    shed = sum(v for k, v in m.items() if k.startswith("flashsale_strategy_orders_shed_total"))
    assert m["flashsale_orders_shed_total"] >= shed == counts["slow"][503], (shed, counts)
    assert m[SHED_503] == counts["slow"][503]
    wait_until(lambda: metrics(s)["flashsale_orders_inflight"] == 0, 10,
               what="no order left in the path")
    # Nothing of a shed or refused order was taken: the books balance.
    for sku in ("slow", "fast"):
        p = s.product(sku)
        assert p["sold"] == counts[sku].get(201, 0), (sku, p, counts)
        assert p["stock_initial"] == p["stock_available"] + p["sold"] + p["held"], p


def test_connection_memory_bounds_the_request_head(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--connection-memory-kib", "8"])
    ok = s.get("/healthz", headers={"X-Pad": "a" * 2000})
    assert ok.status == 200, ok
    k = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 12000 + b"\r\n\r\n")
    head = k.recv(100)
    k.close()
    assert head.startswith(b"HTTP/1.1 431"), head
