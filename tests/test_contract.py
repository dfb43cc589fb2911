"""test_contract.py: docs/openapi.yaml is a real, lint-clean OpenAPI 3.1
document, the service serves it, its error codes are exactly the ones the
C sources emit, its examples match its own schemas, and the response check
every other test runs through (contract.py) does catch a drifting answer."""
import glob
import json
import os
import re
import subprocess

import contract as contract_mod
from contract import Contract, ContractError, contract

ROOT = contract_mod.ROOT
REDOCLY = os.path.join(ROOT, "tools", "node", "node_modules", ".bin", "redocly")


def test_openapi_lint(ctx):
    """Redocly CLI's recommended rules (docs/redocly.yaml): no error, no
    warning."""
    assert os.path.exists(REDOCLY), "Redocly CLI missing: run tools/npm-deps.sh (make test does)"
    env = dict(os.environ, REDOCLY_TELEMETRY="off", REDOCLY_SUPPRESS_UPDATE_NOTICE="true",
               NO_COLOR="1")
    p = subprocess.run([REDOCLY, "lint", "--config", os.path.join(ROOT, "docs", "redocly.yaml"),
                        "--format", "stylish", os.path.join(ROOT, "docs", "openapi.yaml")],
                       capture_output=True, text=True, env=env, timeout=120, cwd=ctx.tmp)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Your API description is valid" in out, out
    assert not re.search(r"\b\d+ (warning|error)s?\b", out), out


def test_openapi_served_is_the_document(ctx):
    s = ctx.service(ctx.redis())
    r = s.get("/openapi.json")
    assert r.status == 200 and r.headers["content-type"].startswith("application/json"), r
    assert r.json == contract().doc
    assert r.json["openapi"].startswith("3.1.")
    assert r.raw.endswith("\n")
    assert "/openapi.json" in r.json["paths"] and "/healthz" in r.json["paths"]


def emitted_error_codes():
    """The error codes the C sources pass to the reply functions (the
    argument after the status), ternaries included, those written into
    fixed JSON answers ("{\"error\":\"...\""), and those of the order
    path's answer table (rows "{ <status>, \"<code>\", ...")."""
    calls = re.compile(r"\b(http_reply_error_with|http_reply_error|answer_error|undo_then_fail|fail)\s*\(")
    codes = set()
    for path in glob.glob(os.path.join(ROOT, "service", "**", "*.c"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "http", "*.c")):
        src = open(path).read()
        codes.update(re.findall(r'\\"error\\":\s*\\"([a-z_]+)\\"', src))
        codes.update(re.findall(r'\{\s*[45]\d\d,\s*"([a-z_]+)"', src))
        for m in calls.finditer(src):
            # The arguments, split at top-level commas.
            depth, args, cur, i = 1, [], "", m.end()
            while depth and i < len(src):
                ch = src[i]
                if ch == '"':
                    j = i + 1
                    while src[j] != '"':
                        j += 2 if src[j] == "\\" else 1
                    cur += src[i:j + 1]
                    i = j + 1
                    continue
                depth += ch in "([{"
                depth -= ch in ")]}"
                if depth and ch == "," and depth == 1:
                    args.append(cur.strip())
                    cur = ""
                elif depth:
                    cur += ch
                i += 1
            args.append(cur.strip())
            if len(args) > 2:
                codes.update(re.findall(r'"([a-z]+(?:_[a-z]+)*)"', args[2]))
    return codes


def test_error_codes_are_the_emitted_ones(ctx):
    documented = set(contract().doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"])
    emitted = emitted_error_codes()
    assert len(emitted) >= 15, emitted              # the scan found the calls
    assert emitted - documented == set(), "emitted but not documented: %s" % (emitted - documented)
    assert documented - emitted == set(), "documented but never emitted: %s" % (documented - emitted)


def test_examples_match_their_schemas(ctx):
    c = contract()
    examples = c.examples()
    assert len(examples) >= 30, len(examples)
    for where, schema, value in examples:
        c.validate(schema, value, "example of " + where)


def test_the_check_catches_drift(ctx):
    """Answers the document does not describe are refused: the check in
    every test can fail."""
    c = Contract()
    order = {"order_id": "01M819TW2QY0CK6NQ4GVW9RWYH", "sku": "phone-x", "user_id": "u-42",
             "quantity": 1, "status": "confirmed", "created_at": "2026-11-22T09:36:42.071Z"}
    json_h = {"content-type": "application/json; charset=utf-8"}
    loc = dict(json_h, location="/v1/orders/" + order["order_id"])
    c.check("POST", "/v1/orders", 201, loc, json.dumps(order) + "\n")   # as documented
    c.check("GET", "/v1/orders/" + order["order_id"] + "?x=1", 200, json_h,
            json.dumps(order) + "\n")
    c.check("GET", "/v2/none", 404, json_h, '{"error":"not_found","message":"No route."}\n')
    c.check("HEAD", "/healthz", 200, json_h, "")
    bad = [
        ("POST", "/v1/orders", 201, json_h, json.dumps(order), "Location"),
        ("POST", "/v1/orders", 200, loc, json.dumps(order), "Idempotent-Replayed"),
        ("POST", "/v1/orders", 418, loc, json.dumps(order), "418"),
        ("GET", "/v1/orders/X", 200, json_h, json.dumps(dict(order, extra=1)), "extra"),
        ("GET", "/v1/orders/X", 200, json_h, json.dumps(dict(order, quantity="1")), "quantity"),
        ("GET", "/v1/orders/X", 200, {"content-type": "text/html"}, json.dumps(order), "Content-Type"),
        ("GET", "/v1/orders/X", 404, json_h, '{"error":"unknown_sku","message":"m"}', "unknown_order"),
        ("POST", "/v1/orders", 409, json_h, '{"error":"sold_out"}', "message"),
        ("POST", "/v1/orders", 409, json_h, '{"error":"out_of_stock","message":"m"}', "out_of_stock"),
        ("POST", "/v1/orders", 429, json_h, '{"error":"lock_timeout","message":"m"}', "Retry-After"),
        ("DELETE", "/v1/orders", 405, json_h, '{"error":"method_not_allowed","message":"m"}', "Allow"),
        ("GET", "/v2/none", 200, json_h, "{}", "200"),
        ("POST", "/v1/products", 401, json_h, '{"error":"unauthorized","message":"m"}',
         "WWW-Authenticate"),
        ("HEAD", "/healthz", 200, json_h, '{"status":"ok"}', "no body"),
        ("GET", "/healthz", 200, json_h, '{"status":"ok","redis":"ok","db":"down"}', "db"),
        ("GET", "/v1/orders/X", 200, json_h, json.dumps(order), "newline"),
    ]
    for method, url, status, headers, body, needle in bad:
        try:
            c.check(method, url, status, headers, body)
        except ContractError as e:
            assert needle in str(e), (needle, str(e))
            continue
        raise AssertionError("not caught: %s %s %d %s" % (method, url, status, body))


def test_every_test_answer_is_checked(ctx):
    """The harness's Client runs the check on what it receives."""
    s = ctx.service(ctx.redis())
    before = contract().checked
    s.create_product("c", 1)
    s.order("c", "u", 1)
    s.order("c", "u", 1)
    s.get("/nope")
    s.request("PATCH", "/healthz")
    assert contract().checked == before + 5


def test_head_wherever_get(ctx):
    """Every GET path answers HEAD with GET's status and no body; each
    answer passes the document's check for HEAD."""
    s = ctx.service(ctx.redis())
    s.create_product("h", 3)
    oid = s.order("h", "u", 1).json["order_id"]
    for path in ("/v1/products/h", "/v1/products/nope", "/v1/orders/" + oid, "/v1/orders/x",
                 "/v1/orders?sku=h", "/v1/orders?limit=0", "/v1/strategies", "/healthz",
                 "/metrics", "/openapi.json"):
        g = s.get(path)
        h = s.request("HEAD", path)
        assert h.status == g.status and h.raw == "", (path, g, h)
        assert h.headers.get("content-type") == g.headers.get("content-type"), (path, h.headers)
    assert s.request("HEAD", "/v1/products").status == 405      # POST only: no GET, no HEAD
