"""test_concurrency.py: many buyers at once, and stopping under load.

The invariants are checked from three vantage points: the answers the
clients got, the API's product view, and the SQLite file and Redis keys
read directly."""
import signal
import threading
import time

from harness import Client, db_rows, parallel


def hammer(s, sku, conns, per_conn, qty=1, keys=False):
    """conns threads, each with its own keep-alive connection, send per_conn
    orders. Returns the list of (status, json) answers."""
    def one(i):
        c = Client(s.port)
        out = []
        try:
            for k in range(per_conn):
                hdrs = {"Idempotency-Key": "c%d-%d" % (i, k)} if keys else None
                r = c.post("/v1/orders", {"sku": sku, "user_id": "u%d" % i, "quantity": qty},
                           headers=hdrs)
                out.append((r.status, r.json))
        finally:
            c.close()
        return out
    return [x for batch in parallel(conns, one) for x in batch]


def watch_stock(redis, key, stop):
    """Samples a Redis stock key until stop is set; returns the minimum seen."""
    r = redis.client()
    low = [None]

    def run():
        while not stop.is_set():
            v = r.get(key)
            if v is not None and (low[0] is None or int(v) < low[0]):
                low[0] = int(v)
            time.sleep(0.001)
    t = threading.Thread(target=run)
    t.start()
    return t, low


def test_exactly_the_stock_is_sold(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("hot", 100)
    stop = threading.Event()
    watcher, low = watch_stock(redis, "fs:{hot}:stock:0", stop)
    answers = hammer(s, "hot", conns=200, per_conn=10)
    stop.set()
    watcher.join()
    assert len(answers) == 2000
    created = [j for st, j in answers if st == 201]
    others = {(st, j["error"]) for st, j in answers if st != 201}
    assert len(created) == 100, len(created)
    assert others == {(409, "sold_out")}, others
    ids = [j["order_id"] for j in created]
    assert len(set(ids)) == 100
    p = s.product("hot")
    assert (p["sold"], p["stock_available"], p["stock_initial"]) == (100, 0, 100), p
    rows = db_rows(s.db_path, "SELECT order_id FROM orders WHERE sku='hot'")
    assert sorted(r[0] for r in rows) == sorted(ids)
    assert low[0] is not None and low[0] >= 0, low
    assert redis.client().hlen("fs:{hot}:pending") == 0


def test_multi_unit_orders_and_segments(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("seg", 1000, segments=8)
    answers = hammer(s, "seg", conns=100, per_conn=20, qty=3, keys=True)
    units = sum(j["quantity"] for st, j in answers if st == 201)
    assert units <= 1000
    p = s.product("seg")
    assert p["sold"] == units and p["stock_available"] == 1000 - units, p
    # Never sold out while 3 or more units were left anywhere.
    assert p["stock_available"] < 3, p
    assert sum(p["segment_available"]) == p["stock_available"]
    assert min(p["segment_available"]) >= 0
    assert db_rows(s.db_path, "SELECT sum(quantity) FROM orders")[0][0] == units


def test_sigterm_under_load_commits_every_answered_order(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("drain", 100000)
    answers = []
    lock = threading.Lock()
    stop = threading.Event()

    def buyer(i):
        c = Client(s.port, timeout=10)
        while not stop.is_set():
            try:
                r = c.post("/v1/orders", {"sku": "drain", "user_id": "u%d" % i, "quantity": 1})
            except OSError:
                c.close()
                if s.proc.poll() is not None:
                    return
                continue
            with lock:
                answers.append((r.status, r.json))
            if r.status == 503:
                c.close()
    threads = [threading.Thread(target=buyer, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    s.proc.send_signal(signal.SIGTERM)
    code = s.proc.wait(30)
    stop.set()
    for t in threads:
        t.join()
    assert code == 0, s.logs()
    created = {j["order_id"] for st, j in answers if st == 201}
    assert len(created) > 100, len(created)
    refused = {j["error"] for st, j in answers if st != 201}
    assert refused <= {"shutting_down"}, refused
    rows = {r[0] for r in db_rows(s.db_path, "SELECT order_id FROM orders")}
    assert created <= rows, "answered orders missing from SQLite: %d" % len(created - rows)
    # Orders in flight at the signal completed (their row exists) or were
    # refused before any stock moved; nothing is left reserved.
    assert redis.client().hlen("fs:{drain}:pending") == 0
    s.restart()
    p = s.product("drain")
    assert p["sold"] == len(rows) and p["sold"] + p["stock_available"] == 100000, p
