"""test_metrics.py: GET /metrics against a real service, Prometheus' own
tools on it (promtool check metrics, promtool test rules), and the rules of
deploy/prometheus/.

Every series of docs/metrics.md is made to exist with a value the test can
predict: orders of several strategies (created, refused, replayed, 404,
400, 405, 503), a db-optimistic product under contention (its retries run
out: optimistic_conflict, not lock_timeout), a pending reservation left by a
live and then a dead instance, and an oversell made by writing to Redis
behind the service's back.
"""
import os
import re
import shutil
import subprocess
import time

import harness
from harness import wait_until

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RULES = os.path.join(ROOT, "deploy", "prometheus")
SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, ((label, value), ...)): value} of every sample, and the set
    of families by their TYPE line."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = SERIES.match(line)
        assert m, "not a sample line: %r" % line
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def summed(samples, name, **labels):
    """The sum of name's samples whose labels include labels."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def scrape(s):
    r = s.get("/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4"), r
    return r.raw


def promtool(*args, stdin=None):
    return subprocess.run(["promtool"] + list(args), input=stdin, capture_output=True,
                          text=True, timeout=120)


def flashload(*args):
    p = subprocess.run([os.path.join(harness.BIN, "flashload")] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def check_histograms(samples, types):
    """Every histogram's buckets rise with le, end at +Inf == _count."""
    for name, kind in types.items():
        if kind != "histogram":
            continue
        series = {}
        for (n, ls), v in samples.items():
            if n == name + "_bucket":
                d = dict(ls)
                le = d.pop("le")
                series.setdefault(tuple(sorted(d.items())), []).append(
                    (float("inf") if le == "+Inf" else float(le), v))
        assert series, name
        for ls, buckets in series.items():
            buckets.sort()
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), (name, ls, buckets)
            assert buckets[-1][0] == float("inf"), (name, ls)
            assert value(samples, name + "_count", **dict(ls)) == counts[-1], (name, ls)


def test_metrics_of_a_busy_service_pass_promtool(ctx):
    redis = ctx.redis()
    s = ctx.service(redis)
    strategies = [x["name"] for x in s.get("/v1/strategies").json["strategies"]]
    sent = {}
    for sku, strategy in (("lu", "lua"), ("lo", "lock"), ("db", "db"), ("op", "db-optimistic"),
                          ("lc", "local"), ("rw", "unsafe-read-write")):
        s.create_product(sku, 3, strategy=strategy, per_user_limit=2)
        codes = [s.order(sku, "a", 2).status, s.order(sku, "a", 1).status,      # 201, limit
                 s.order(sku, "b", 2).status, s.order(sku, "c", 1).status]      # 409s
        assert codes == [201, 409, 409, 201], (strategy, codes)
        sent[strategy] = 4
    assert s.order("lu", "k", 1, key="key-1").status == 409          # sold out, keyed
    s.create_product("lu2", 10)
    assert s.order("lu2", "k", 1, key="key-2").status == 201
    assert s.order("lu2", "k", 1, key="key-2").status == 200         # replayed
    assert s.order("lu2", "k", 2, key="key-2").status == 422         # key reused
    sent["lua"] += 4
    assert s.order("nope", "a", 1).status == 404
    assert s.post("/v1/orders", raw="{", headers={"Content-Type": "application/json"}).status == 400
    assert s.request("DELETE", "/v1/orders").status == 405
    redis.kill()                                                      # and a 503
    r = s.order("lu2", "a", 1)
    assert r.status == 503 and r.json["error"] == "redis_unavailable", r
    sent["lua"] += 1

    text = scrape(s)
    lint = promtool("check", "metrics", stdin=text)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr
    samples, types = parse(text)
    check_histograms(samples, types)

    # Responses by exact status and error code. Per product: 201, 409
    # per_user_limit, 409 insufficient_stock (2 asked, 1 left), 201.
    want = {("201", "none"): 13, ("200", "none"): 1, ("409", "per_user_limit"): 6,
            ("409", "sold_out"): 1, ("409", "insufficient_stock"): 6,
            ("422", "idempotency_key_reused"): 1, ("404", "unknown_sku"): 1,
            ("400", "invalid_json"): 1, ("503", "redis_unavailable"): 1}
    got = {(dict(ls)["status"], dict(ls)["code"]): v for (n, ls), v in samples.items()
           if n == "flashsale_http_responses_total" and dict(ls)["route"] == "order_create"}
    assert got == want, got
    # A method no route has is answered before routing.
    assert value(samples, "flashsale_http_responses_total", route="unrouted", status="405",
                 code="method_not_allowed") == 1

    # Per strategy: every order that reached its strategy is counted once by
    # outcome and timed once; every strategy of the table has its series.
    for strategy in strategies:
        n = summed(samples, "flashsale_orders_total", strategy=strategy)
        assert n == sent.get(strategy, 0), (strategy, n)
        assert value(samples, "flashsale_order_duration_seconds_count", strategy=strategy) == n
        assert value(samples, "flashsale_oversold_units", strategy=strategy) == 0
    assert value(samples, "flashsale_orders_total", strategy="lua", outcome="replayed") == 1
    assert value(samples, "flashsale_orders_total", strategy="lua",
                 outcome="redis_unavailable") == 1
    assert {dict(ls)["strategy"] for (n, ls) in samples if n == "flashsale_orders_total"} == \
        set(strategies)

    # The stores' timings.
    for call in ("reserve_batch", "clear", "lock_read", "lock_write", "rcw", "other"):
        assert value(samples, "flashsale_redis_call_duration_seconds_count", call=call) > 0, call
    created = summed(samples, "flashsale_orders_total", outcome="created")
    assert value(samples, "flashsale_db_commit_duration_seconds_count") > 0
    assert value(samples, "flashsale_db_commit_group_orders_sum") >= created
    assert value(samples, "flashsale_db_commit_group_orders_count") == \
        value(samples, "flashsale_db_commit_duration_seconds_count")

    # Build and process.
    version = subprocess.run([os.path.join(harness.BIN, "flashsale"), "--version"],
                             capture_output=True, text=True).stdout.split()[1]
    assert value(samples, "flashsale_build_info", version=version) == 1, version
    assert value(samples, "process_resident_memory_bytes") > 1 << 20
    assert value(samples, "process_virtual_memory_bytes") > value(samples,
                                                                  "process_resident_memory_bytes")
    assert 5 < value(samples, "process_open_fds") < value(samples, "process_max_fds")
    assert value(samples, "process_cpu_seconds_total") > 0
    assert abs(value(samples, "process_start_time_seconds") - time.time()) < 600
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds",
                 "process_virtual_memory_bytes", "process_start_time_seconds"):
        assert types[name] == "gauge", name
    assert types["process_cpu_seconds_total"] == "counter"

    # No label names a SKU, a user or an order.
    assert not re.search(r'\b(sku|user|user_id|order_id)="', text), text
    assert "lu2" not in text

    # docs/metrics.md lists every family rendered, and nothing else.
    doc = open(os.path.join(ROOT, "docs", "metrics.md")).read()
    documented = set(re.findall(r"^\| `((?:flashsale|process)_[a-z_]+)`", doc, re.M))
    assert documented == set(types), ("undocumented: %s; documented, not rendered: %s"
                                      % (set(types) - documented, documented - set(types)))


def test_optimistic_retries_running_out_are_not_lock_timeouts(ctx):
    """db-optimistic under contention: the client gets 429 lock_timeout (the
    contract's code), the metrics say optimistic_conflict."""
    redis = ctx.redis()
    s = ctx.service(redis)
    rc, so, se = flashload("--target", "http://127.0.0.1:%d" % s.port, "--sku", "opt",
                           "--strategy", "db-optimistic", "--stock", 100000, "--duration", 2,
                           "--connections", 48, "--no-verify", "--quiet")
    assert rc == 0, so + se
    samples, _ = parse(scrape(s))
    conflicts = value(samples, "flashsale_orders_total", strategy="db-optimistic",
                      outcome="optimistic_conflict")
    assert conflicts > 0, so                       # 48 buyers on one row: retries run out
    assert value(samples, "flashsale_orders_total", strategy="db-optimistic",
                 outcome="lock_timeout") == 0
    assert value(samples, "flashsale_http_responses_total", route="order_create", status="429",
                 code="lock_timeout") == conflicts
    assert summed(samples, "flashsale_lock_acquires_total") == 0    # no lock was involved


def test_pending_backlog_comes_from_the_sweep(ctx):
    """A reservation left by another instance: counted with its age while
    that instance lives, settled (and gone from the gauge) once it dies."""
    redis = ctx.redis()
    s = ctx.service(redis, args=["--pending-timeout-ms", "60000"])
    s.create_product("bk", 10)
    r = redis.client()
    owner = "elsewhere:1#00000001"
    r.set("fs:instance:" + owner, "1", px=60000)
    sec, usec = r.time()
    born = sec * 1000 + usec // 1000 - 7000                      # reserved 7 s ago
    r.decrby("fs:{bk}:stock:0", 1)
    r.hset("fs:{bk}:pending", "01M819TW2QY0CK6NQ4GVW9RWYH",
           "2|1|%d|0|0:1|%d:%s2:u90:" % (born, len(owner), owner))

    def backlog():
        samples, _ = parse(scrape(s))
        return (value(samples, "flashsale_pending_reservations"),
                value(samples, "flashsale_pending_oldest_age_seconds"),
                value(samples, "flashsale_pending_sweep_timestamp_seconds"), samples)

    n, age, swept, samples = wait_until(lambda: (lambda b: b if b[0] == 1 else None)(backlog()),
                                        15, 0.2, "the sweep to count the reservation")
    assert 7 <= age < 30, age
    assert abs(swept - time.time()) < 10, swept
    assert value(samples, "flashsale_pending_timeout_seconds") == 60
    r.delete("fs:instance:" + owner)                             # its owner dies
    wait_until(lambda: backlog()[0] == 0, 15, 0.2, "the reservation to be settled")
    samples = backlog()[3]
    assert value(samples, "flashsale_pending_oldest_age_seconds") == 0
    assert value(samples, "flashsale_reconciled_total", result="given_back") == 1
    assert s.product("bk")["stock_available"] == 10              # its unit is back


def test_oversell_is_reported_by_strategy(ctx):
    """Units put into the Redis copy behind the service's back are sold
    beyond the stock: flashsale_oversold_units says how many, and of which
    strategy (the alert FlashsaleOversold fires on it)."""
    redis = ctx.redis()
    s = ctx.service(redis)
    s.create_product("ov", 2)
    s.create_product("ok", 2, strategy="lock")
    redis.client().set("fs:{ov}:stock:0", 7)                     # 5 units that do not exist
    assert [s.order("ov", "u%d" % i, 1).status for i in range(8)] == [201] * 7 + [409]
    assert s.order("ok", "a", 2).status == 201

    def oversold():
        samples, _ = parse(scrape(s))
        return samples if value(samples, "flashsale_oversold_units", strategy="lua") else None
    samples = wait_until(oversold, 15, 0.2, "the sweep to see the oversell")
    assert value(samples, "flashsale_oversold_units", strategy="lua") == 5
    assert value(samples, "flashsale_oversold_units", strategy="lock") == 0


def test_metric_tables_match_the_contract(ctx):
    """The statuses and error codes metrics.c labels are exactly those of
    docs/openapi.yaml: a new one in the API has a series of its own, not
    "other"."""
    from contract import contract
    doc = contract().doc
    src = open(os.path.join(ROOT, "service", "ops", "metrics.c")).read()
    table = re.search(r"STATUSES\[SVC_NSTATUS\] = \{(.*?)\};", src, re.S).group(1)
    statuses = {int(x) for x in re.findall(r"\d+", table)} - {0}
    documented = set()
    for item in doc["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and "responses" in op:
                documented |= {int(k) for k in op["responses"] if k.isdigit()}
    for answers in doc["x-flashsale-other-answers"].values():     # 404, 405, 413, 415, 500
        documented |= {int(k) for k in answers if k.isdigit()}
    assert statuses == documented, (statuses ^ documented)
    table = re.search(r"ERRORS\[\] = \{(.*?)\};", src, re.S).group(1)
    errors = re.findall(r'"([a-z_]+)"', table)
    enum = doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
    assert errors[0] == "none" and errors[-1] == "other", errors
    assert sorted(errors[1:-1]) == sorted(enum), set(errors[1:-1]) ^ set(enum)


def test_prometheus_rules(ctx):
    """The shipped configuration and rules load, their unit tests pass, and
    those tests can fail: the same tests against rules with a threshold
    changed do."""
    p = promtool("check", "config", os.path.join(RULES, "prometheus.yml"))
    assert p.returncode == 0, p.stdout + p.stderr
    p = promtool("test", "rules", os.path.join(RULES, "flashsale.rules_test.yml"))
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    broken = ctx.path("rules")
    shutil.copytree(RULES, broken)
    path = os.path.join(broken, "flashsale.rules.yml")
    text = open(path).read()
    assert "> 0.25" in text
    open(path, "w").write(text.replace("> 0.25", "> 0.75"))
    p = promtool("test", "rules", os.path.join(broken, "flashsale.rules_test.yml"))
    assert p.returncode != 0 and "FlashsaleOrderLatencyHigh" in p.stdout + p.stderr, \
        p.stdout + p.stderr
