"""test_verifier.py: flashload's verifier judges the stores by itself.

flashload reads Redis and SQLite by the format documented for users
(docs/storage.md), with hiredis and its own read-only SQL, never through
the service's stock/ and db/ code. These tests change the stores on purpose
in ways the service's own reads do not notice, and show that the verifier
does, while the same load on an untouched product PASSes.

Why the empty-segment bitmap: `<prefix>{sku}:empty` promises that a
segment whose bit is set holds nothing, so stock/lua/reserve_batch.lua skips it
without reading it. The service's own read of the stock (stock_read, behind
GET /v1/products/{sku} and `flashsale audit`) sums the segment keys and
never looks at the bitmap. A bit set over a segment that still holds units
therefore strands them: every buyer is told "sold out" while the API shows
them available, and every sum still balances (sold + available == stock,
nothing lost, nothing oversold). A verifier that read Redis through
stock_read, as flashload used to, summed the same keys the same way and
passed such a run; only a reader that knows the documented format and
checks the bitmap's promise on its own sees it. The second test does the
same for SQLite: an order both committed and voided (two states the
service's tombstone rule keeps exclusive) reads as a plain committed order
through the service, which looks for the order row first."""
import re
import sqlite3

import harness
from harness import db_rows
from test_flashload import flashload, run_in_background, vantage

SEGMENTS = 4
STOCK = 400          # 100 units per segment


def verdict_lines(out):
    """The violations flashload printed, as (vantage, text) pairs."""
    return re.findall(r"^  \[(\w+)\] (.*)$", out, re.M)


def test_stranded_stock_is_caught_though_the_service_sees_nothing_wrong(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    for sku in ("clean", "strand"):
        s.create_product(sku, STOCK, segments=SEGMENTS)
    # Segment 2 of "strand" is marked empty while it holds its 100 units.
    r = redis.client()
    assert r.get("fs:{strand}:stock:2") == "100"
    r.setbit("fs:{strand}:empty", 2, 1)

    runs = {}
    for sku in ("clean", "strand"):
        runs[sku] = flashload(*vantage(s, redis), "--no-create", "--sku", sku,
                              "--requests", 600, "--connections", 8, "--users", 600)

    # The untouched product sells out and PASSes from every vantage point.
    rc, so, se = runs["clean"]
    assert rc == 0, so + se
    assert "verdict    PASS (checked: client, api, redis, sqlite)" in so, so
    assert s.product("clean")["sold"] == STOCK

    # The service's own view of the tampered one: every unit accounted for,
    # 100 of them shown as available -- and yet a buyer is told sold out.
    p = s.product("strand")
    assert (p["sold"], p["stock_available"]) == (300, 100), p
    assert p["segment_available"][2] == 100, p
    o = s.order("strand", user="late-buyer")
    assert o.status == 409 and o.json["error"] == "sold_out", o

    # The verifier sees the stranded units, and only those: the client, API
    # and SQLite checks all hold, as they did for the old verifier.
    rc, so, se = runs["strand"]
    assert rc == 1, so + se
    assert "verdict    FAIL" in so, so
    assert ("redis", "100 units stranded: 1 segment marked empty in the bitmap still holds "
            "units (first: segment 2); no order can take them") in verdict_lines(so), so
    assert {v for v, _ in verdict_lines(so)} == {"redis"}, so
    assert db_rows(s.db_path, "SELECT sum(quantity) FROM orders WHERE sku='strand'")[0][0] == 300


def test_an_order_both_committed_and_voided_is_caught(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    wait = run_in_background(vantage(s, redis) + ["--sku", "both", "--stock", 100000,
                                                  "--rate", 200, "--duration", 2,
                                                  "--connections", 4])
    harness.wait_until(lambda: db_rows(s.db_path, "SELECT count(*) FROM orders "
                                                  "WHERE sku='both'")[0][0] >= 5,
                       20, what="orders to be committed")
    con = sqlite3.connect(s.db_path, timeout=10)
    with con:
        oid = con.execute("SELECT min(order_id) FROM orders WHERE sku='both'").fetchone()[0]
        con.execute("INSERT INTO voided_orders(order_id, sku, reason, voided_at) "
                    "VALUES (?, 'both', 'tampered', '2026-01-01T00:00:00.000Z')", (oid,))
    con.close()
    rc, so, se = wait()
    # The service still shows it as a confirmed order.
    got = s.get("/v1/orders/" + oid)
    assert got.status == 200 and got.json["status"] == "confirmed", got
    assert rc == 1, so + se
    assert verdict_lines(so) == [("sqlite", "1 orders are both committed and voided")], so
