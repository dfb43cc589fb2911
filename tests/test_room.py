"""test_room.py: a product's waiting room (docs/api.md, "Waiting room";
stock/room.h, service/room/room.h) against real Redis and SQLite.

- Tickets and turns: one place per user; an order with another's
  ticket, a forged one or before its turn is refused and takes nothing
  (one without a ticket takes its buyer's place, and hears it); the units left cap the counter (no more places have their
  turn than units left beyond those held); once the stock is gone every
  ticket hears sold_out at once (no store asked).
- Buyers are served in the order they took their places: with a fixed rate
  and more polite buyers than units, the units go to the first arrivals.
- A turn that passes unused is over (409 turn_over), and a new place is at
  the back; it never holds the line.
- Any instance honours any instance's ticket, also after the one that
  issued it was killed (SIGKILL).
- Redis restarted empty mid-line: the instances put the line back where
  they saw it (no position issued again below it), and the books balance."""
import hashlib
import hmac
import json
import threading
import time

import harness
from harness import db_rows, wait_until

J = {"Content-Type": "application/json"}


def error_of(r, status, code):
    assert r.status == status, r
    assert r.json and r.json.get("error") == code, r
    return r.json


def take(s, sku, user):
    r = s.post("/v1/products/%s/tickets" % sku, {"user_id": user})
    assert r.status in (200, 201), r
    return r


def order(s, sku, user, ticket, wait_ms=None):
    """An order with ticket (None: without); wait_ms: how long it may wait
    in the instance for its turn (None: the service's default, 5 s)."""
    body = {"sku": sku, "user_id": user, "quantity": 1}
    if ticket is not None:
        body["ticket"] = ticket
    q = "" if wait_ms is None else "?wait_ms=%d" % wait_ms
    return s.post("/v1/orders" + q, body)


def order_aside(s, sku, user, ticket, wait_ms=None):
    """order() on a connection and thread of its own, started; returns the
    thread and a dict that gets "r", the answer, and "took", its seconds."""
    out = {}

    def run():
        c = harness.Client(s.port)
        t = time.monotonic()
        q = "" if wait_ms is None else "?wait_ms=%d" % wait_ms
        out["r"] = c.post("/v1/orders" + q, {"sku": sku, "user_id": user, "quantity": 1,
                                             "ticket": ticket})
        out["took"] = time.monotonic() - t
        c.close()

    th = threading.Thread(target=run)
    th.start()
    return th, out


def hold_the_path(s, sku, user, ticket):
    """An order of a product whose critical section pauses, aside, once it
    holds the order path (--max-inflight 1): order_aside's pair."""
    th, out = order_aside(s, sku, user, ticket)
    wait_until(lambda: "\nflashsale_orders_inflight 1\n" in s.get("/metrics").raw, 10,
               what="the first order to hold the path")
    return th, out


def buy_in_turn(s, sku, user, ticket, deadline_s=20):
    """A polite buyer: orders, and on not_your_turn comes back after
    retry_after_ms (on a 503, after Retry-After: Redis back from a restart,
    an instance's first beat), until a final answer. Returns it and the
    tries."""
    end = time.monotonic() + deadline_s
    tries = 0
    while True:
        tries += 1
        r = order(s, sku, user, ticket)
        if r.status not in (429, 503):
            return r, tries
        assert time.monotonic() < end, "no turn in %d s: %r" % (deadline_s, r)
        if r.status == 503:
            assert "retry-after" in r.headers, r
            time.sleep(0.1)
            continue
        assert r.json["error"] == "not_your_turn" and "retry-after" in r.headers, r
        assert r.json["position"] > r.json["serving"], r
        time.sleep(r.json["retry_after_ms"] / 1000.0)


def state(s, sku, ticket):
    """Where a ticket stands (None while the instance has not heard the
    room yet: its first beat is at most 50 ms after the product is known)."""
    r = s.get("/v1/products/%s/tickets/%s" % (sku, ticket))
    if r.status == 503:
        return None
    assert r.status in (200, 409), r
    return r.json.get("state") or r.json["error"]


def test_room_tickets_turns_and_sold_out(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    p = s.create_product("drop", 5, waiting_room={"turn_seconds": 30, "rate": 20})
    assert p["waiting_room"]["turn_seconds"] == 30 and p["waiting_room"]["rate"] == 20, p
    users = ["u%d" % i for i in range(12)]
    tickets = {}
    for i, u in enumerate(users):
        r = take(s, "drop", u)
        assert r.status == 201 and r.json["position"] == i + 1, r
        tickets[u] = r.json["ticket"]
    # One place per user: asked again, the same ticket (200).
    again = take(s, "drop", "u3")
    assert again.status == 200 and again.json["ticket"] == tickets["u3"], again
    # An order without a ticket takes its buyer's place -- the one it has --
    # and, before its turn, hears it as its ticket; nothing taken.
    told = error_of(order(s, "drop", "u11", None, wait_ms=0), 429, "not_your_turn")
    assert told["position"] == 12 and told["ticket"] == tickets["u11"], told
    # Refused, and nothing taken: another's ticket, a forged one, too early.
    error_of(order(s, "drop", "u1", tickets["u0"]), 403, "invalid_ticket")
    forged = tickets["u9"][:-1] + ("0" if tickets["u9"][-1] != "0" else "1")
    error_of(order(s, "drop", "u9", forged), 403, "invalid_ticket")
    error_of(s.get("/v1/products/drop/tickets/" + forged), 403, "invalid_ticket")
    early = error_of(order(s, "drop", "u11", tickets["u11"], wait_ms=0), 429, "not_your_turn")
    assert early["position"] == 12 and early["estimated_wait_ms"] > 0, early
    assert s.product("drop")["stock_available"] == 5
    # The units cap the counter: five places hold the five units, and no
    # later place has its turn while they do, however long the rate runs.
    time.sleep(1.0)                          # 20 orders/s: 20 places' worth of time
    assert s.product("drop")["waiting_room"]["serving"] == 5, s.product("drop")
    error_of(order(s, "drop", "u5", tickets["u5"], wait_ms=0), 429, "not_your_turn")
    # The first five buy in their turns; then the room is sold out.
    answers = {}
    for u in users[:5]:
        answers[u], _ = buy_in_turn(s, "drop", u, tickets[u])
        assert answers[u].status == 201, answers[u]
    got = sorted(users[:5])
    # Sold out: every ticket, old or new, hears so at once.
    wait_until(lambda: state(s, "drop", tickets["u0"]) == "sold_out", 2,
               what="the room to hear sold out")
    error_of(s.post("/v1/products/drop/tickets", {"user_id": "late"}), 409, "sold_out")
    error_of(order(s, "drop", "u11", tickets["u11"]), 409, "sold_out")
    p = s.settled_product("drop")
    assert p["sold"] == 5 and p["stock_available"] == 0 and p["waiting_room"]["sold_out"], p
    rows = db_rows(s.db_path, "SELECT user_id FROM orders WHERE sku='drop'")
    assert sorted(r[0] for r in rows) == got


def utc(t):
    """A wall-clock time (seconds since the epoch) as the API writes it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int(t * 1000 % 1000)


def test_room_pre_queue_is_drawn_at_the_opening(ctx):
    """A sale with an opening time: before it, an order or a ticket is
    answered 429 sale_not_open (when to come back; nothing taken, no place
    issued), the buyer kept in the pre-queue; at the opening, the
    pre-queue gets the first places, in an order drawn from each user id
    under the room's secret -- not the order they came in, nor changed by
    asking again, the same on every instance -- and a buyer who comes
    after the opening is behind them all."""
    redis = ctx.redis()
    a, b = ctx.service(redis), ctx.service(redis)
    opens = time.time() + 3
    p = a.create_product("gala", 100, waiting_room={"turn_seconds": 30, "rate": 5,
                                                    "opens_at": utc(opens)})
    assert p["waiting_room"]["opens_at"] == utc(opens), p
    early = ["e%02d" % i for i in range(40)]
    for i, u in enumerate(early):               # in this order, alternating instances
        s = (a, b)[i % 2]
        r = order(s, "gala", u, None) if i % 3 else s.post("/v1/products/gala/tickets",
                                                           {"user_id": u})
        e = error_of(r, 429, "sale_not_open")
        assert e["opens_at"] == utc(opens) and e["pre_queue"] is True, e
        assert opens * 1000 - time.time() * 1000 - 1000 < e["retry_after_ms"] <= \
            opens * 1000 - time.time() * 1000 + 600, e
        assert "retry-after" in r.headers, r
    # Asking again, on the other instance, changes nothing.
    for u in early[:10]:
        error_of(order(b, "gala", u, None), 429, "sale_not_open")
    # Nor on the same one, which answers from memory for a second after
    # Redis said so (the first ask may be past that second: from Redis).
    k0 = places_known(a)
    for _ in range(3):
        e = error_of(order(a, "gala", "e00", None), 429, "sale_not_open")
        assert e["pre_queue"] is True and e["opens_at"] == utc(opens), e
    assert places_known(a) - k0 >= 2
    assert a.product("gala")["waiting_room"]["issued"] == 0
    assert a.product("gala")["stock_available"] == 100
    assert redis.client().zcard("fs:{gala}:room:pre") == 40
    wait_until(lambda: time.time() > opens + 0.05, 5, step=0.05, what="the opening")
    # After the opening: the early ones hold places 1..40, drawn; a buyer
    # who came now has 41 though it asks before some of them.
    late = take(a, "gala", "late")
    assert late.status == 201 and late.json["position"] == 41, late
    places = {}
    for i, u in enumerate(reversed(early)):
        r = take((a, b)[i % 2], "gala", u)
        assert r.status == 201, r
        places[u] = r.json["position"]
        assert take((b, a)[i % 2], "gala", u).json["position"] == places[u]   # one place
    assert sorted(places.values()) == list(range(1, 41)), places
    by_place = [u for u, _ in sorted(places.items(), key=lambda kv: kv[1])]
    assert by_place != early and by_place != list(reversed(early)), by_place
    # The places are the order of the draws, each the first 48 bits of
    # HMAC-SHA-256("pre|sku|user") under the secret both instances share.
    rc = redis.client()
    secret = rc.get("fs:{room-secret}:key").encode()
    drawn = {u: int.from_bytes(hmac.new(secret, ("pre|gala|" + u).encode(),
                                        hashlib.sha256).digest()[:6], "big") for u in early}
    assert sorted(early, key=drawn.get) == by_place
    assert rc.zrange("fs:{gala}:room:pre", 0, -1, withscores=True) == \
        [(u, float(drawn[u])) for u in by_place]
    # The first in the drawn order buys in its turn (rate 5/s: soon).
    first = by_place[0]
    r, _ = buy_in_turn(a, "gala", first, None)
    assert r.status == 201 and r.json["position"] == 1, r
    rows = db_rows(a.db_path, "SELECT user_id FROM orders WHERE sku='gala'")
    assert [x[0] for x in rows] == [first]


def test_room_opening_time_is_checked(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    for bad in ("tomorrow", "2026-13-01T00:00:00Z", "2026-04-31T00:00:00Z",
                "2026-12-05T10:00:00", "2026-12-05T10:00:00.5Z", 1796515872769,
                "2026-+1-05T10:00:00Z", "2026-12- 5T10:00:00Z", "2026-12-5T10:00:00Z",
                " 2026-12-05T10:00:00Z", "2026-12-05 10:00:00Z", "1999-12-31T23:59:59Z"):
        r = s.post("/v1/products", {"sku": "bad", "name": "x", "stock": 1,
                                    "waiting_room": {"opens_at": bad}})
        e = error_of(r, 400, "invalid_field")
        assert "opens_at" in e["message"], e
    # In the past: on sale at once, no pre-queue.
    p = s.create_product("past", 2, waiting_room={"opens_at": "2020-01-01T00:00:00Z"})
    assert p["waiting_room"]["opens_at"] == "2020-01-01T00:00:00.000Z", p
    wait_until(lambda: s.product("past")["waiting_room"]["rate_now"] > 0, 5,
               what="the room's first beat")
    assert take(s, "past", "x").json["position"] == 1
    # No opening: null.
    assert s.create_product("now", 1, waiting_room=True)["waiting_room"]["opens_at"] is None


def test_room_that_keeps_up_sells_in_one_request(ctx):
    """A room whose rate is above its arrivals gives a place its turn in
    the call that takes it (room_take.lua moves the counter too): an order
    without a ticket is sold at once, one request a buyer, its 201 saying
    its place; past the units, an order hears sold_out."""
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("open", 3, waiting_room={"turn_seconds": 30, "rate": 100000})
    wait_until(lambda: s.product("open")["waiting_room"]["rate_now"] > 0, 5,
               what="the room's first beat")
    time.sleep(0.1)
    for i in range(3):
        r = s.order("open", "o%d" % i)
        assert r.status == 201 and r.json["position"] == i + 1, r
        # The next beat (50 ms) tells the room this place is done: till
        # then its unit counts as held (and, sold, as gone: the cap by the
        # units errs low, never high).
        time.sleep(0.12)
    wait_until(lambda: s.order("open", "late").status == 409, 2, what="sold_out")
    error_of(s.order("open", "late2"), 409, "sold_out")
    rows = db_rows(s.db_path, "SELECT user_id FROM orders WHERE sku='open'")
    assert sorted(r[0] for r in rows) == ["o0", "o1", "o2"]


def test_room_units_go_to_the_first_arrivals(ctx):
    """Polite buyers, each asking when the room says to: the units go to
    the first arrivals exactly, and each buyer needs few requests."""
    s = ctx.service(ctx.redis())
    s.create_product("queue", 6, waiting_room={"rate": 25})
    users = ["q%02d" % i for i in range(15)]
    tickets = {u: take(s, "queue", u).json["ticket"] for u in users}
    results, tries = {}, {}

    def buyer(u):
        c = harness.Client(s.port)
        r = c.post("/v1/products/queue/tickets", {"user_id": u})
        n = 1
        while r.status == 503 or (r.status == 200 and r.json["state"] == "waiting"):
            time.sleep(r.json["retry_after_ms"] / 1000.0 if r.status == 200 else 0.05)
            r = c.get("/v1/products/queue/tickets/" + tickets[u])
            n += 1
        if r.status == 200:
            r = c.post("/v1/orders", {"sku": "queue", "user_id": u, "quantity": 1,
                                      "ticket": tickets[u]})
            n += 1
        results[u], tries[u] = r, n
        c.close()

    harness.parallel(len(users), lambda i: buyer(users[i]))
    winners = sorted(u for u, r in results.items() if r.status == 201)
    assert winners == users[:6], {u: (r.status, r.json) for u, r in results.items()}
    assert all(results[u].status == 409 and results[u].json["error"] == "sold_out"
               for u in users[6:]), results
    print("    15 polite buyers, 6 units at 25 orders/s: the first 6 bought; requests per "
          "buyer median %d, most %d" % (sorted(tries.values())[7], max(tries.values())))


def test_room_turn_over_never_holds_the_line(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("brief", 10, waiting_room={"turn_seconds": 1, "rate": 1000})
    t1 = take(s, "brief", "gone").json
    t2 = take(s, "brief", "here").json
    wait_until(lambda: state(s, "brief", t2["ticket"]) == "your_turn", 3, what="the turns")
    assert order(s, "brief", "here", t2["ticket"]).status == 201
    time.sleep(1.3)                          # "gone" never came: its turn passes
    over = error_of(order(s, "brief", "gone", t1["ticket"]), 409, "turn_over")
    assert over["position"] == t1["position"], over
    st = s.get("/v1/products/brief/tickets/" + t1["ticket"])
    assert st.status == 200 and st.json["state"] == "turn_over", st
    # A new place, at the back, and its turn comes.
    again = take(s, "brief", "gone")
    assert again.status == 201 and again.json["position"] > t2["position"], again
    r, _ = buy_in_turn(s, "brief", "gone", again.json["ticket"])
    assert r.status == 201, r


def places_known(s):
    """flashsale_room_places_known_total of s."""
    for line in s.get("/metrics").raw.splitlines():
        if line.startswith("flashsale_room_places_known_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no flashsale_room_places_known_total")


def test_room_place_asked_again_from_memory(ctx):
    """A user who asks for its place again -- a ticket asked for again, an
    order sent without its ticket -- hears it from the instance that
    handed it out, from memory while its turn is not over (no Redis
    call: the metric counts them), the same place Redis would give back;
    another instance asks Redis the first time and gives the same place.
    A place whose turn is over is not given back from memory (above)."""
    redis = ctx.redis()
    db = ctx.path("orders.db")
    a = ctx.service(redis, db)
    b = ctx.service(redis, db)
    a.create_product("again", 10, waiting_room={"rate": 1})
    ts = [take(a, "again", "u%d" % i).json for i in range(20)]
    last = ts[-1]
    assert [t["position"] for t in ts] == list(range(1, 21)), ts
    k0 = places_known(a)
    for _ in range(3):
        r = take(a, "again", "u19")
        assert r.status == 200 and r.json["ticket"] == last["ticket"], r
        assert r.json["state"] == "waiting" and r.json["position"] == 20, r
    told = error_of(order(a, "again", "u19", None, wait_ms=0), 429, "not_your_turn")
    assert told["ticket"] == last["ticket"] and told["position"] == 20, told
    assert places_known(a) - k0 == 4
    # b never handed it out: Redis gives the same place back, once.
    kb = places_known(b)
    r = take(b, "again", "u19")
    assert r.status == 200 and r.json["position"] == 20, r
    assert places_known(b) == kb
    r = take(b, "again", "u19")
    assert r.status == 200 and r.json["position"] == 20 and places_known(b) == kb + 1, r
    # A new user is never answered from memory: a new place, at the back.
    r = take(a, "again", "u20")
    assert r.status == 201 and r.json["position"] == 21, r


def test_room_any_instance_honours_any_ticket(ctx):
    redis = ctx.redis()
    db = ctx.path("orders.db")
    a = ctx.service(redis, db)
    b = ctx.service(redis, db)
    a.create_product("two", 4, waiting_room={"rate": 50})
    ta = [take(a, "two", "a%d" % i).json for i in range(3)]
    tb = [take(b, "two", "b%d" % i).json for i in range(3)]
    positions = sorted(t["position"] for t in ta + tb)
    assert positions == list(range(1, 7)), positions      # one line, no position twice
    a.kill()                                               # SIGKILL: a's tickets live on
    r, _ = buy_in_turn(b, "two", "a0", ta[0]["ticket"])
    assert r.status == 201, r
    r, _ = buy_in_turn(b, "two", "b0", tb[0]["ticket"])
    assert r.status == 201, r
    error_of(order(b, "two", "b1", ta[1]["ticket"]), 403, "invalid_ticket")
    p = b.settled_product("two")
    assert p["sold"] == 2 and p["stock_available"] == 2, p


def test_room_redis_restarted_empty_mid_line(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("lost", 20, waiting_room={"rate": 5})
    first = [take(s, "lost", "x%d" % i).json for i in range(8)]
    wait_until(lambda: s.product("lost")["waiting_room"]["serving"] >= 2, 3, what="a turn")
    serving = s.product("lost")["waiting_room"]["serving"]
    r, _ = buy_in_turn(s, "lost", "x0", first[0]["ticket"])
    assert r.status == 201, r
    redis.restart(wipe=True)                 # the line, the stock copy and the secret: gone
    # The instance puts the line back where it saw it: a new place is past
    # every place issued, the counter does not go back, old tickets stand.
    wait_until(lambda: s.post("/v1/products/lost/tickets", {"user_id": "after"}).status == 201,
               10, what="a place after the restart")
    after = take(s, "lost", "after").json
    assert after["position"] > 8, after
    assert s.product("lost")["waiting_room"]["serving"] >= serving
    r, _ = buy_in_turn(s, "lost", "x1", first[1]["ticket"])
    assert r.status == 201, r
    p = s.settled_product("lost")
    assert p["sold"] == 2 and p["stock_available"] == 18, p
    assert redis.client().hget("fs:{lost}:room", "seq") is not None


def test_room_settings_are_checked(ctx):
    s = ctx.service(ctx.redis())
    for bad in ({"turn_seconds": 0}, {"turn_seconds": 3601}, {"rate": -1}, {"speed": 3}, 7, "yes"):
        error_of(s.post("/v1/products", {"sku": "bad", "stock": 1, "waiting_room": bad}), 400,
                 "invalid_field" if bad != {"speed": 3} else "invalid_field")
    p = s.create_product("plain", 3, waiting_room=False)
    assert "waiting_room" not in p
    error_of(s.post("/v1/products/plain/tickets", {"user_id": "u"}), 409, "no_waiting_room")
    error_of(s.post("/v1/products/nope/tickets", {"user_id": "u"}), 404, "unknown_sku")
    d = s.create_product("dflt", 3, waiting_room=True)
    assert d["waiting_room"]["turn_seconds"] == 30 and d["waiting_room"]["rate"] == 0, d
    error_of(s.post("/v1/products/dflt/tickets", {"user": "u"}), 400, "invalid_field")
    error_of(s.post("/v1/products/dflt/tickets", {}), 400, "missing_field")
    error_of(s.post("/v1/products/dflt/tickets", {"user_id": ""}), 400, "invalid_field")


# ------------------------------------------------------------ a crowd

def crowd(ctx, s, redis, sku, *extra):
    """flashload's crowd against s; (its JSON, stdout)."""
    from test_flashload import flashload, vantage
    out = ctx.path("%s.json" % sku)
    rc, so, se = flashload(*vantage(s, redis), "--sku", sku, "--json", out, "--connections",
                           128, *extra, timeout=180)
    assert rc == 0 and "verdict    PASS" in so, so + se
    j = json.load(open(out))
    return j["crowd"], so


def test_crowd_in_arrival_order_with_the_room(ctx):
    """The same crowd (3,000 buyers over half a second, a fifth of them bots,
    500 units) with the room off and on: both verified; with the room on,
    every buyer has a final answer, the units go to the first arrivals
    (a few may go a little later: a buyer whose turn came may be slower
    than the next), and bots get no more than polite buyers. The room
    off is the lottery's figure beside it."""
    redis = ctx.redis()
    s = ctx.service(redis)
    common = ("--crowd", 3000, "--ramp", 0.5, "--impatient", 0.2, "--stock", 500)
    off, _ = crowd(ctx, s, redis, "lottery", *common)
    on, so = crowd(ctx, s, redis, "queue", *common, "--waiting-room")
    for c in (off, on):
        assert c["buyers"] == 3000 and c["winners"] == 500, c
    assert on["no_final"] == 0 and on["waiting_room"], on
    # Buyers early in the line wait in the instance, their order held until
    # its turn (one request, not one per retry); without a room, none.
    assert off["long_polls"] == 0 and held(s) > 0, (off["long_polls"], held(s))
    assert on["first_s_share"] >= 0.98, on
    # The order the buyers left flashload in, and how late: a buyer goes
    # out when due and a connection is free, never before it arrives. The
    # crowd's clock starts once the service has answered on every
    # connection (a request on a connection still in the listen queue
    # waits behind requests on taken ones: buyers out of their order).
    for c in (off, on):
        assert 0 <= c["first_sent_share"] <= 1, c
        assert 0 <= c["send_lag_p50_ms"] <= c["send_lag_p99_ms"], c
        assert c["connections_warmed"] == c["connections"] > 0 and c["start_ms"] > 0, c
    assert on["bot_ratio"] <= 1.3, on
    assert len(on["outcomes"]) == 3000 and on["outcomes"].count("g") == 500, on["outcomes"][:80]
    assert "fairness" in so and "bots" in so, so
    print("    room off: %.1f%% of the units to the first 500, bots x%.2f, %.0f units/s; "
          "room on: %.1f%% (%.1f%% to the first 500 to send, flashload's lag p99 %.0f ms), "
          "bots x%.2f, %.0f units/s, requests per buyer median %d, "
          "last answer %.0f ms after the last unit"
          % (100 * off["first_s_share"], off["bot_ratio"], off["units_per_s"],
             100 * on["first_s_share"], 100 * on["first_sent_share"], on["send_lag_p99_ms"],
             on["bot_ratio"], on["units_per_s"],
             on["requests_median"], on["final_after_last_unit_ms"]))


def test_crowd_before_the_opening_is_drawn(ctx):
    """A crowd (2,000 buyers over a second, a fifth of them bots, 200
    units) at a sale that opens half a second in (`flashload
    --room-opens-in`): the first half waits in the pre-queue, hammered by
    its bots meanwhile; verified; every buyer has a final answer; the
    units go to pre-queued buyers in the order of their draws -- so not
    to the first 200 arrivals (with a plain room: >= 95%, above) -- and
    the pre-queue's places are the line's first."""
    redis = ctx.redis()
    s = ctx.service(redis)
    c, so = crowd(ctx, s, redis, "opening", "--crowd", 2000, "--ramp", 1, "--impatient", 0.2,
                  "--stock", 200, "--waiting-room", "--room-opens-in", 0.5)
    assert c["buyers"] == 2000 and c["winners"] == 200 and c["no_final"] == 0, c
    assert "sale_not_open" in so, so
    pre = redis.client().zcard("fs:{opening}:room:pre")
    assert pre >= 400, pre                  # about a half arrived before the opening
    # The winners are drawn from the pre-queue: about 200 / pre of the
    # first 200 arrivals win, not all.
    assert c["first_s_share"] < 0.6, c
    outcomes = c["outcomes"]                # by arrival rank
    assert all(o != "g" for o in outcomes[pre + 200:]), outcomes
    print("    %d pre-queued of 2,000; %.1f%% of the units to the first 200 arrivals; bots x%.2f"
          % (pre, 100 * c["first_s_share"], c["bot_ratio"]))


def test_room_failover_to_a_replica_that_missed_places(ctx):
    """Sentinel: ten places the replica has, ten it misses (cut off), then
    the primary killed and the stale replica promoted. The instance puts
    the line back where it saw it: a new place is past all twenty (never a
    position twice), the counter does not go back, a ticket the new
    primary never heard of still buys in its turn, and the books
    balance. (The consequence of a place lost, written in
    docs/waiting-room.md: its user may take another, at the back.)"""
    topo = ctx.sentinels(replicas=1)
    s = ctx.service(topo.url)
    s.create_product("fo", 50, waiting_room={"rate": 1000})
    p, r = topo.primary, topo.replicas[0]
    first = [take(s, "fo", "a%d" % i).json for i in range(10)]
    assert p.cmd("WAIT", 1, 2000) == 1                   # the replica has these ten
    topo.cut_replica(r)
    missed = [take(s, "fo", "b%d" % i).json for i in range(10)]
    assert [t["position"] for t in first + missed] == list(range(1, 21))
    wait_until(lambda: s.product("fo")["waiting_room"]["serving"] >= 20, 3, what="their turns")
    assert p.cmd("WAIT", 1, 300) == 0                    # ...the replica missed them
    old = topo.kill_primary()
    assert topo.wait_failover(old.port) is r
    after = None
    for _ in range(200):                                 # the instance finds the new primary
        a = s.post("/v1/products/fo/tickets", {"user_id": "after"})
        if a.status in (200, 201):
            after = a.json
            break
        time.sleep(0.05)
    assert after and after["position"] == 21, after      # past every place issued
    assert s.product("fo")["waiting_room"]["serving"] >= 20
    for t, u in ((missed[5], "b5"), (first[0], "a0")):
        got, _ = buy_in_turn(s, "fo", u, t["ticket"])
        assert got.status == 201, got
    p2 = s.settled_product("fo")
    assert p2["sold"] == 2 and p2["stock_available"] == 48, p2


def test_room_long_poll_answers_when_the_turn_comes(ctx):
    """GET a ticket with ?wait_ms: a waiting ticket is answered when its
    turn comes (within a beat or two of the counter reaching it), not at
    the wait's end; one that stays waiting is answered at the wait's end,
    still waiting; the room selling out answers it at once. wait_ms out of
    range, or another query argument: 400."""
    s = ctx.service(ctx.redis())
    s.create_product("lp", 3, waiting_room={"rate": 10})
    ts = [take(s, "lp", "l%d" % i).json for i in range(8)]
    wait_until(lambda: state(s, "lp", ts[0]["ticket"]) == "your_turn", 3, what="the first turn")
    # Position 4 at 10 places a second: its turn in about 0.3 s, not 3 s.
    t0 = time.monotonic()
    r = s.get("/v1/products/lp/tickets/%s?wait_ms=3000" % ts[3]["ticket"])
    took = time.monotonic() - t0
    # The units cap the counter at 3 (positions 1-3 hold them): 4 waits.
    assert r.status == 200 and r.json["state"] == "waiting" and took >= 2.9, (r, took)
    for i in range(3):
        got, _ = buy_in_turn(s, "lp", "l%d" % i, ts[i]["ticket"])
        assert got.status == 201, got
    # Sold out: a long poll hears so at once.
    t0 = time.monotonic()
    r = s.get("/v1/products/lp/tickets/%s?wait_ms=5000" % ts[5]["ticket"])
    assert r.status == 409 and r.json["error"] == "sold_out", r
    assert time.monotonic() - t0 < 1.5, time.monotonic() - t0
    # Its turn coming: answered then.
    s.create_product("lp2", 100, waiting_room={"rate": 5})
    tk = [take(s, "lp2", "m%d" % i).json for i in range(6)]
    wait_until(lambda: state(s, "lp2", tk[0]["ticket"]) == "your_turn", 3, what="a turn")
    t0 = time.monotonic()
    r = s.get("/v1/products/lp2/tickets/%s?wait_ms=5000" % tk[5]["ticket"])
    took = time.monotonic() - t0
    assert r.status == 200 and r.json["state"] == "your_turn", r
    assert took < 4.0, took                    # ~1 s at 5 places a second, never the 5 s
    for bad in ("wait_ms=-1", "wait_ms=10001", "wait_ms=x", "wait=5"):
        error_of(s.get("/v1/products/lp2/tickets/%s?%s" % (tk[5]["ticket"], bad)), 400,
                 "invalid_field")


def held(s):
    """flashsale_room_orders_held_total of s."""
    for line in s.get("/metrics").raw.splitlines():
        if line.startswith("flashsale_room_orders_held_total "):
            return float(line.split()[1])
    raise AssertionError("no flashsale_room_orders_held_total")


def test_room_order_waits_in_the_instance_for_its_turn(ctx):
    """An order out of its place's turn waits in the instance for it (the
    order's long poll: --room-order-wait-ms, an order's ?wait_ms=N): sold
    when its turn comes, with one request -- with a ticket, and without one
    (its place taken by the order); answered where it stands (429 and its
    ticket) when its wait ends first; sold_out at once when the room sells
    out; answered (429) at once when the instance shuts down, not held to
    its wait. wait_ms out of range: 400, nothing taken."""
    s = ctx.service(ctx.redis())
    s.create_product("hw", 100, waiting_room={"rate": 5})
    tk = [take(s, "hw", "h%d" % i).json for i in range(4)]
    wait_until(lambda: state(s, "hw", tk[0]["ticket"]) == "your_turn", 3, what="a turn")
    t0 = time.monotonic()
    r = order(s, "hw", "h3", tk[3]["ticket"])      # place 4, at 5 places a second
    took = time.monotonic() - t0
    assert r.status == 201 and r.json["position"] == 4, r
    assert took < 4.0, took
    r = order(s, "hw", "h9", None)                 # takes place 5, waits for it
    assert r.status == 201 and r.json["position"] == 5, r
    for i in range(20):                            # places 6-25: 4 s of line
        take(s, "hw", "x%d" % i)
    t0 = time.monotonic()
    late = error_of(order(s, "hw", "late", None, wait_ms=300), 429, "not_your_turn")
    took = time.monotonic() - t0
    assert late["position"] == 26 and late["ticket"] and took >= 0.29, (late, took)
    for bad in ("wait_ms=-1", "wait_ms=10001", "wait_ms=x"):
        r = s.post("/v1/orders?" + bad, {"sku": "hw", "user_id": "bad", "quantity": 1})
        error_of(r, 400, "invalid_field")
    assert held(s) >= 2                            # "late", and "h9" or "h3" at least
    assert s.settled_product("hw")["sold"] == 2

    # Sold out: an order held for its turn hears so at once.
    s.create_product("hs", 2, waiting_room={"rate": 10})
    ts = [take(s, "hs", "s%d" % i).json["ticket"] for i in range(4)]
    wait_until(lambda: state(s, "hs", ts[1]) == "your_turn", 3, what="the second turn")
    before = held(s)
    th, out = order_aside(s, "hs", "s3", ts[3])
    wait_until(lambda: held(s) > before, 3, what="the order to be held")
    t0 = time.monotonic()
    for i in range(2):
        assert order(s, "hs", "s%d" % i, ts[i]).status == 201
    th.join()
    r = out["r"]
    assert r.status == 409 and r.json["error"] == "sold_out", r
    assert time.monotonic() - t0 < 1.5, time.monotonic() - t0

    # Shutting down: a held order is answered at once (429, where it
    # stands), not at its wait's end.
    s.create_product("hz", 1, waiting_room={"rate": 10})
    tz = [take(s, "hz", "z%d" % i).json["ticket"] for i in range(2)]
    before = held(s)
    th, out = order_aside(s, "hz", "z1", tz[1], wait_ms=10000)
    wait_until(lambda: held(s) > before, 3, what="the order to be held")
    assert s.stop() == 0
    th.join()
    r = out["r"]
    assert r.status == 429 and r.json["error"] == "not_your_turn", r
    assert out["took"] < 5.0, out["took"]


def test_room_held_order_waits_out_a_full_path(ctx):
    """An order held for its turn whose turn comes while the order path is
    full waits on in the instance, beat by beat within its wait, instead
    of being shed (503) for its buyer to come back: sold once the path has
    room, with one request."""
    s = ctx.service(ctx.redis(), args=["--max-inflight", "1", "--fault-injection"])
    s.create_product("full", 5, strategy="lock", cs_delay_ms=1500, lock_ttl_ms=5000,
                     waiting_room={"rate": 2})
    ts = [take(s, "full", "f%d" % i).json["ticket"] for i in range(3)]
    wait_until(lambda: state(s, "full", ts[0]) == "your_turn", 5, what="the first turn")
    t, first = hold_the_path(s, "full", "f0", ts[0])
    assert state(s, "full", ts[2]) == "waiting"    # place 3: its turn in about a second
    r = order(s, "full", "f2", ts[2])               # held; its turn comes with the path full
    t.join()
    assert first["r"].status == 201, first["r"]
    assert r.status == 201 and r.json["position"] == 3, r
    p = s.settled_product("full")
    assert (p["sold"], p["stock_available"]) == (2, 3), p


def test_room_in_turn_order_past_the_limit_comes_back_soon(ctx):
    """Past the instance's admission limit, an order in its ticket's turn
    is refused (503 overloaded, nothing taken) and told to come back within
    one to two latency targets (retry_after_ms), not in a Retry-After
    second: its place keeps its unit. An order out of its turn still hears
    its place (429 not_your_turn), not overloaded: the room's check comes
    before the door when a product has a room."""
    s = ctx.service(ctx.redis(), args=["--max-inflight", "1", "--fault-injection"])
    s.create_product("busy", 5, strategy="lock", cs_delay_ms=1500, lock_ttl_ms=5000,
                     waiting_room={"rate": 4})
    ts = [take(s, "busy", "b%d" % i).json["ticket"] for i in range(5)]
    # Two units: the counter never passes place 2 while they are held, so
    # place 5 waits however slow the box (the units cap the counter).
    s.create_product("late", 2, waiting_room={"rate": 10})
    far = [take(s, "late", "f%d" % i).json["ticket"] for i in range(5)]
    wait_until(lambda: state(s, "busy", ts[1]) == "your_turn", 5, what="the second turn")
    t, first = hold_the_path(s, "busy", "b0", ts[0])
    shed = error_of(order(s, "busy", "b1", ts[1]), 503, "overloaded")
    assert 100 <= shed["retry_after_ms"] <= 200, shed      # the target (100 ms) to twice it
    early = error_of(order(s, "late", "f4", far[4], wait_ms=0), 429, "not_your_turn")
    assert early["position"] == 5, early
    t.join()
    assert first["r"].status == 201, first["r"]
    got, _ = buy_in_turn(s, "busy", "b1", ts[1])
    assert got.status == 201, got
    p = s.settled_product("busy")
    assert (p["sold"], p["stock_available"]) == (2, 3), p
