"""test_hostile.py: requests an attacker (or an unlucky operator) sends, each
against the real service with a real Redis and SQLite. Every finding of the
hostile-input review has a test here that failed before its fix:

1. input that once reached abort() (invalid UTF-8 echoed in messages, or
   valid UTF-8 cut in half by a length limit);
2. a Redis stall must not block the HTTP threads;
3. admin writes are all-or-nothing or honestly answered (restock keys);
4. (health recovering by itself: tests/test_faults.py, database locked);
5. slow clients cannot hold every connection slot (a trickle, or silence
   from the accept on);
6. HTTP framing the service will not guess at (conflicting lengths, header
   names that hide a length, Host, a body on a GET);
7. contract edges: %2F, C1 controls, NUL in queries, unknown query
   arguments, HEAD, stable messages.

What libmicrohttpd answers itself (431, 414, 505, malformed request lines,
a Content-Length that is not a number) is listed in docs/faults.md,
"Hostile requests"; those answers are checked here to be HTTP and to close.
"""
import json
import socket
import time

import harness
from harness import Client, wait_until

# Every error code the API lists (docs/api.md): an answer with any other is
# a defect.
API_CODES = {
    "invalid_json", "invalid_field", "missing_field", "bad_request", "unauthorized",
    "not_found", "unknown_sku", "unknown_order", "method_not_allowed", "sold_out",
    "insufficient_stock", "sku_exists", "per_user_limit", "body_too_large",
    "unsupported_media_type", "idempotency_key_reused", "request_in_progress",
    "lock_timeout", "redis_unavailable", "db_unavailable", "shutting_down", "internal_error",
}


def exchange(port, data, timeout=5.0, src="127.0.0.1"):
    """Sends raw bytes; returns (status, headers, body, closed) of the first
    answer, closed telling whether the server ended the connection."""
    k = socket.socket()
    k.bind((src, 0))
    k.settimeout(timeout)
    k.connect(("127.0.0.1", port))
    k.sendall(data)
    buf, closed = b"", False
    try:
        while True:
            d = k.recv(65536)
            if not d:
                closed = True
                break
            buf += d
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                n = int(cl[0].split(b":")[1]) if cl else 0
                if data.startswith(b"HEAD ") or len(rest) >= n:
                    # Whole answer in: does the server close after it?
                    k.settimeout(0.3)
                    try:
                        closed = k.recv(1) == b""
                    except socket.timeout:
                        closed = False
                    except ConnectionResetError:
                        closed = True          # closed with our bytes unread: a reset
                    break
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    finally:
        k.close()
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines or not lines[0].startswith(b"HTTP/1.1 "):
        return None, {}, body, closed
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        name, _, value = l.partition(b":")
        headers[name.decode().strip().lower()] = value.decode().strip()
    return status, headers, body, closed


def json_error(status, headers, body, want_status=None, want_code=None):
    """Asserts a JSON error answer whose code the API lists; returns it."""
    assert status is not None, body
    assert headers.get("content-type", "").startswith("application/json"), (status, headers, body)
    j = json.loads(body.decode("utf-8"))          # valid UTF-8, valid JSON
    assert j["error"] in API_CODES, j
    assert isinstance(j["message"], str) and j["message"], j
    if want_status:
        assert status == want_status, (status, j)
    if want_code:
        assert j["error"] == want_code, j
    return j


def req(method, target, body=None, headers=()):
    head = b"%s %s HTTP/1.1\r\nHost: t\r\n" % (method, target)
    for h in headers:
        head += h + b"\r\n"
    if body is not None:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + b"\r\n" + (body or b"")


def alive(s):
    assert s.proc.poll() is None, "flashsale died:\n" + s.logs()[-3000:]
    return True


# --------------------------------------------------------------- 1: abort()

def test_messages_that_once_aborted(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("lim", 10, per_user_limit=1)
    e = "\u00e9".encode()
    long_user = "a" * 63 + "\u00e9" * 20
    assert s.order("lim", long_user, 1).status == 201
    cases = [
        (req(b"GET", b"/v1/products/%FF"), 404, "unknown_sku"),
        (req(b"GET", b"/v1/products/" + b"%C3%A9" * 300), 404, "unknown_sku"),
        (req(b"GET", b"/v1/products/" + e * 300), 404, "unknown_sku"),
        (req(b"GET", b"/nope/%FF%FE/" + e * 300), 404, "not_found"),
        (req(b"DELETE", b"/v1/products/%FF"), 405, "method_not_allowed"),
        (req(b"DELETE", b"/v1/orders/" + e * 300), 405, "method_not_allowed"),
        (req(b"GET", b"/v1/orders/%FF%00"), 400, "bad_request"),
        (req(b"POST", b"/v1/orders", b'{"' + b"f" * 63 + e + b'":1}'), 400, "invalid_field"),
        (req(b"POST", b"/v1/orders",
             json.dumps({"sku": "lim", "user_id": long_user, "quantity": 1}).encode()),
         409, "per_user_limit"),
        (req(b"POST", b"/v1/products",
             json.dumps({"sku": "x", "stock": 1, "strategy": "s" * 31 + "\u00e9" * 9}).encode()),
         400, "invalid_field"),
        (req(b"POST", b"/v1/orders", b'{"sku": "lim", "user_id": "\xff", "quantity": 1}'),
         400, "invalid_json"),
        (req(b"GET", b"/v1/orders?user_id=%FF"), 400, "invalid_field"),
    ]
    for raw, status, code in cases:
        got = exchange(s.port, raw)
        json_error(*got[:3], want_status=status, want_code=code)
        alive(s)
    assert s.get("/healthz").status == 200


# ---------------------------------------------------------- 2: Redis stall

def test_redis_stall_does_not_block_http_threads(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--threads", "2"])
    s.create_product("rd", 100000)                 # read by the stalled clients
    s.create_product("dbo", 100000, strategy="db")  # never needs Redis
    base = []
    for i in range(20):
        t0 = time.monotonic()
        assert s.order("dbo", "b%d" % i, 1).status == 201
        base.append(time.monotonic() - t0)
    looked_up = s.get("/v1/orders?user_id=b0").json["orders"][0]["order_id"]
    redis.pause()
    stop = time.monotonic() + 4
    reads = []

    def reader(i):
        c = Client(s.port)
        while time.monotonic() < stop:
            t0 = time.monotonic()
            r = c.get("/v1/products/rd")
            reads.append((r.status, time.monotonic() - t0))

    import threading
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)                            # the readers are all waiting now
        during, health, lookups = [], [], []
        c = Client(s.port)
        for i in range(20):
            t0 = time.monotonic()
            assert s.order("dbo", "d%d" % i, 1, client=c).status == 201
            during.append(time.monotonic() - t0)
            t0 = time.monotonic()
            c.get("/healthz")
            health.append(time.monotonic() - t0)
            # Order lookups need SQLite only: their workers are not the
            # ones the stalled product reads hold.
            t0 = time.monotonic()
            assert c.get("/v1/orders/" + looked_up).status == 200
            assert c.get("/v1/orders?user_id=b%d" % i).status == 200
            lookups.append(time.monotonic() - t0)
    finally:
        for t in threads:
            t.join()
        redis.resume()
    base.sort(), during.sort(), health.sort(), lookups.sort()
    harness_figures = ("db orders p50 %.1f ms before, %.1f ms during the stall; /healthz max "
                       "%.1f ms; two order lookups p50 %.1f ms, max %.1f ms" % (
                           base[10] * 1000, during[10] * 1000, health[-1] * 1000,
                           lookups[10] * 1000, lookups[-1] * 1000))
    print("    " + harness_figures)
    assert during[10] < 0.1 and health[-1] < 0.2, harness_figures
    assert lookups[10] < 0.1 and lookups[-1] < 0.5, harness_figures
    assert reads and {st for st, _ in reads} <= {503, 200}, reads[:5]
    assert any(st == 503 for st, _ in reads)       # the reads did hit the stall


# --------------------------------------------------------- 3: admin writes

def test_admin_writes_with_redis_down_are_applied_once(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("ad", 10)
    redis.kill()
    r = s.post("/v1/products", {"sku": "new", "stock": 5})
    assert r.status == 201, r                      # committed in SQLite: created
    assert r.json["stock_available"] == 5 and r.json["stock_source"] == "database", r
    r = s.post("/v1/products", {"sku": "new", "stock": 5})
    assert r.status == 409 and r.json["error"] == "sku_exists", r
    key = {"Idempotency-Key": "rs-1"}
    r1 = s.post("/v1/products/ad/restock", {"quantity": 100}, headers=key)
    r2 = s.post("/v1/products/ad/restock", {"quantity": 100}, headers=key)
    assert r1.status == 200 and r1.json["stock_initial"] == 110, r1
    assert r2.status == 200 and r2.headers.get("idempotent-replayed") == "true", r2
    assert r2.json["stock_initial"] == 110, r2     # added once
    r3 = s.post("/v1/products/ad/restock", {"quantity": 7}, headers=key)
    assert r3.status == 422 and r3.json["error"] == "idempotency_key_reused", r3
    redis.start()                                  # back, empty: rebuilt from SQLite
    p = wait_until(lambda: (lambda r: r.status == 200 and r.json)(s.get("/v1/products/ad")), 10,
                   what="the rebuilt product")
    assert p["stock_initial"] == 110 and p["stock_available"] == 110, p
    assert p["stock_source"] == "redis", p
    assert s.get("/v1/products/new").json["stock_available"] == 5


# ---------------------------------------------------------- 5: slow clients

def test_slow_clients_cannot_hold_every_slot(ctx):
    s = ctx.service(ctx.redis(), args=["--max-connections", "250", "--request-timeout", "2"])
    slow = []
    for _ in range(250):                           # one client address: capped
        k = socket.socket()
        k.bind(("127.0.0.1", 0))
        k.connect(("127.0.0.1", s.port))
        try:
            k.sendall(b"POST /v1/orders HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            pass
        slow.append(k)
    try:
        # Another address is served at once: the first one holds at most a
        # quarter of the slots.
        st, _, body, _ = exchange(s.port, req(b"GET", b"/healthz"), src="127.0.0.2")
        assert st == 200, body
        t0 = time.monotonic()
        open_now = len(slow)
        while open_now and time.monotonic() - t0 < 8:
            open_now = 0
            for k in slow:
                if k.fileno() < 0:
                    continue
                try:
                    k.sendall(b"X")                # a byte now and then, never a request
                    k.settimeout(0.001)
                    if k.recv(1) == b"":
                        k.close()
                        continue
                except socket.timeout:
                    pass
                except OSError:
                    k.close()
                    continue
                open_now += 1
            time.sleep(0.5)
        took = time.monotonic() - t0
        print("    all 250 slow connections closed after %.1f s (deadline 2 s)" % took)
        assert open_now == 0, "%d slow connections still open after %.1f s" % (open_now, took)
        assert s.get("/healthz").status == 200
        m = s.get("/metrics").raw
        assert "flashsale_http_request_timeouts_total" in m, m
    finally:
        for k in slow:
            k.close()


def test_silent_connections_meet_the_request_deadline(ctx):
    """A connection that never sends a byte is held to the request deadline
    from its accept, not to the idle timeout (a minute): a few hundred
    silent clients must not fill --max-connections."""
    s = ctx.service(ctx.redis(), args=["--request-timeout", "2", "--idle-timeout", "60",
                                       "--max-connections", "120",
                                       "--max-connections-per-client", "200"])
    silent = []
    try:
        for _ in range(100):
            k = socket.create_connection(("127.0.0.1", s.port))
            silent.append(k)
        t0 = time.monotonic()
        closed = 0
        while closed < len(silent) and time.monotonic() - t0 < 8:
            closed = 0
            for k in silent:
                k.settimeout(0.001)
                try:
                    if k.recv(1) == b"":
                        closed += 1
                except socket.timeout:
                    pass
                except OSError:
                    closed += 1
            time.sleep(0.2)
        took = time.monotonic() - t0
        print("    %d of 100 silent connections closed after %.1f s (deadline 2 s)" % (closed, took))
        assert closed == len(silent), "%d of %d closed after %.1f s" % (closed, len(silent), took)
        assert took < 5, took
        assert s.get("/healthz").status == 200
    finally:
        for k in silent:
            k.close()


# --------------------------------------------------------------- 6: framing

def test_framing_errors_are_refused_and_closed(ctx):
    s = ctx.service(ctx.redis(), args=["--request-timeout", "2"])
    s.create_product("fr", 10)
    order = b'{"sku":"fr","user_id":"u","quantity":1}'
    cases = [
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n%s" % (len(order), order),
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (len(order), order),
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        # RFC 9112 6.1: HTTP/1.0 has no chunked coding, so a 1.0 request
        # that says Transfer-Encoding is faulty framing; a 1.0 proxy in
        # front would read the chunks as the next request. Nothing is taken.
        b"POST /v1/orders HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(order), order),
    ]
    # Request smuggling through header names: whitespace before the colon
    # (libmicrohttpd keeps "Content-Length " as the name, so the body would
    # be read as the next request) and an obsolete folded line (it joins the
    # continuation onto the name: "Content-Length2"). The pipelined GET
    # hidden in the body must never be answered.
    hidden = b"GET /v1/strategies HTTP/1.1\r\nHost: x\r\n\r\n"
    smuggled = [
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length : %d\r\n\r\n%s"
        % (len(hidden), hidden),
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n %d\r\n\r\n%s"
        % (len(hidden), hidden),
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\tc\r\nContent-Length: %d\r\n\r\n%s"
        % (len(hidden), hidden),
        b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length\t: %d\r\n\r\n%s"
        % (len(hidden), hidden),
    ]
    # RFC 9112 3.2: an HTTP/1.1 request has exactly one Host. A GET or HEAD
    # with a body: the body would otherwise be read as the next request.
    heads = [
        b"GET /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s"
        % (len(hidden), hidden),
        b"HEAD /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s"
        % (len(hidden), hidden),
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(hidden), hidden),
    ]
    for raw in cases + smuggled + heads:
        st, h, body, closed = exchange(s.port, raw)
        if raw.startswith(b"HEAD "):
            assert st == 400 and closed, (raw, st, h)
            continue
        json_error(st, h, body, 400, "bad_request")
        assert closed, raw
        assert b"strategies" not in body, (raw, body)   # the hidden GET got no answer
    # What stays allowed: HTTP/1.0 without Host, a GET with Content-Length: 0,
    # blanks around a value, an empty value.
    for raw in (b"GET /healthz HTTP/1.0\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
                b"GET /healthz HTTP/1.1\r\nHost:  \t a \r\nX-Empty:\r\n\r\n"):
        st, h, body, closed = exchange(s.port, raw)
        assert st == 200, (raw, st, body)
    # Garbage that is no request line at all: libmicrohttpd waits for more;
    # the request deadline ends it.
    for raw in (b"\x00\x01\x02 hello there\r\n\r\n", b"GARBAGE-WITHOUT-NEWLINE"):
        t0 = time.monotonic()
        st, h, body, closed = exchange(s.port, raw, timeout=6)
        assert closed and time.monotonic() - t0 < 4.5, (raw, st, body)
        assert st is None or st >= 400, (raw, st, body)
    p = s.product("fr")
    assert p["sold"] == 0 and p["stock_available"] == 10, p     # nothing got through
    orders = s.get("/v1/orders?sku=fr")
    assert orders.status == 200 and not orders.json["orders"], orders
    alive(s)


def test_libmicrohttpd_own_answers(ctx):
    """What libmicrohttpd answers before any route runs (docs/faults.md,
    "Hostile requests"): its own HTML pages, each closing the connection, and nothing
    sold. If a libmicrohttpd upgrade changes one, this says so."""
    s = ctx.service(ctx.redis(), args=["--request-timeout", "2"])
    s.create_product("mhd", 10)
    cases = [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 40000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 200000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /healthz HTTP/2.5\r\nHost: x\r\n\r\n", 505),
        (b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: abc\r\n\r\n{}", 400),
        (b"POST /v1/orders HTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: 99999999999999999999999\r\n\r\n{}", 413),
        (b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"zz\r\n{}\r\n0\r\n\r\n", 400),
        (b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"ffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", 413),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400),
    ]
    for raw, want in cases:
        st, h, body, closed = exchange(s.port, raw)
        assert st == want and closed, (raw[:60], st, h, body[:200])
    # Too many query arguments for the connection's memory: no answer, and
    # the connection closed at once or, when libmicrohttpd leaves it waiting
    # (it depends on how the bytes arrived), by our 2 s request deadline.
    many = b"&".join(b"a%d=1" % i for i in range(3000))
    for _ in range(6):
        t0 = time.monotonic()
        st, h, body, closed = exchange(s.port, b"GET /v1/products/mhd?" + many +
                                       b" HTTP/1.1\r\nHost: x\r\n\r\n", timeout=8)
        assert closed and time.monotonic() - t0 < 6, (st, body[:200])
        assert st is None or st >= 400, (st, body[:200])
    assert s.product("mhd")["sold"] == 0
    alive(s)


# --------------------------------------------------------- 7: contract edges

def test_contract_edges(ctx):
    s = ctx.service(ctx.redis())
    s.create_product("p1", 10)
    assert s.order("p1", "bob", 1).status == 201
    # An escaped slash is part of a segment, never a separator.
    json_error(*exchange(s.port, req(b"GET", b"/v1/products%2Fp1"))[:3], 404, "not_found")
    json_error(*exchange(s.port, req(b"GET", b"/v1/products/p1%2F"))[:3], 404, "unknown_sku")
    # C1 controls are control characters.
    for user in ("bob\u0085", "\u009b31m", "x\u0080"):
        r = s.post("/v1/orders", {"sku": "p1", "user_id": user, "quantity": 1})
        assert r.status == 400 and r.json["error"] == "invalid_field", (user, r)
    # A NUL in a query value does not end it early; a repeated one is ambiguous.
    for q in ("user_id=bob%00x", "user_id=bob&user_id=eve", "sku=p1%00", "user_id"):
        r = s.get("/v1/orders?" + q)
        assert r.status == 400 and r.json["error"] == "invalid_field", (q, r)
    assert len(s.get("/v1/orders?user_id=bob").json["orders"]) == 1
    # A misspelt or mangled filter is refused, not ignored (which would list
    # every buyer's orders).
    assert s.order("p1", "eve", 1).status == 201
    for q in ("usr_id=bob", "user%00_id=bob", "user_id=bob&x=1", "limit=5&User_id=bob"):
        r = s.get("/v1/orders?" + q)
        assert r.status == 400 and r.json["error"] == "invalid_field", (q, r)
    # HEAD wherever GET is served: same status and headers, no body.
    order_id = s.get("/v1/orders?user_id=bob").json["orders"][0]["order_id"]
    for path in ("/v1/products/p1", "/v1/orders/" + order_id, "/v1/orders?sku=p1",
                 "/v1/strategies", "/healthz", "/metrics", "/v1/products/nope"):
        g = exchange(s.port, req(b"GET", path.encode()))
        h = exchange(s.port, req(b"HEAD", path.encode()))
        assert h[0] == g[0], (path, g[0], h[0])
        assert h[2] == b"" and not h[3], (path, h)
        assert h[1]["content-type"] == g[1]["content-type"], path
    st, hd, body, _ = exchange(s.port, req(b"POST", b"/v1/products/p1"))
    json_error(st, hd, body, 405, "method_not_allowed")
    assert hd["allow"] == "GET, HEAD", hd
    # Two Idempotency-Key headers: refused, not "the first wins".
    st, hd, body, _ = exchange(s.port, req(b"POST", b"/v1/orders",
                                           b'{"sku":"p1","user_id":"k","quantity":1}',
                                           [b"Idempotency-Key: a", b"Idempotency-Key: b"]))
    json_error(st, hd, body, 400, "invalid_field")
    assert s.product("p1")["sold"] == 2                  # bob's and eve's
    # /healthz names states, never a library's error text.
    h = s.get("/healthz").json
    assert h["redis"] in ("ok", "unavailable", "unknown") and h["db"] in ("ok", "unavailable",
                                                                          "unknown"), h
