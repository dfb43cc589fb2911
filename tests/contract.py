"""contract.py: checks an HTTP answer against docs/openapi.yaml.

The harness's Client calls check() on every response it receives, so every
integration test also tests the document: an answer whose status the
document does not list for that method and path, whose body does not match
the schema of that status (and content type), or that lacks a header the
document marks required, fails the test that received it. Requests that
match no operation are held to the document's x-flashsale-other-answers
(404 for an unknown path, 405 for a known path with another method), and
any answer its operation does not list, to the ones any request may get
(400 bad_request, 413, 415, 500).

Schemas are JSON Schema 2020-12 (OpenAPI 3.1), checked with Debian's
python3-jsonschema; $refs resolve inside the document.
"""
import json
import os
import re
import sys
import urllib.parse

import jsonschema  # Debian's python3-jsonschema

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import openapi_json  # noqa: E402

DOC_PATH = os.path.join(ROOT, "docs", "openapi.yaml")
METHODS = ("get", "head", "post", "put", "patch", "delete", "options", "trace")


class ContractError(AssertionError):
    pass


class Contract:
    def __init__(self, path=DOC_PATH):
        self.doc = openapi_json.load(path)
        self.resolver = jsonschema.RefResolver.from_schema(self.doc)
        self.paths = []
        for template, item in self.doc["paths"].items():
            rx = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
            self.paths.append((re.compile(rx), template, item))
        # Literal paths before templated ones, as a router would.
        self.paths.sort(key=lambda p: p[1].count("{"))
        self._validators = {}
        self.checked = 0

    # ------------------------------------------------------------ helpers

    def deref(self, obj):
        while isinstance(obj, dict) and "$ref" in obj:
            ref = obj["$ref"]
            if not ref.startswith("#/"):
                raise ContractError("only local $refs are supported: " + ref)
            obj = self.doc
            for part in ref[2:].split("/"):
                obj = obj[part.replace("~1", "/").replace("~0", "~")]
        return obj

    def validate(self, schema, value, what):
        key = json.dumps(schema, sort_keys=True)
        v = self._validators.get(key)
        if v is None:
            v = jsonschema.Draft202012Validator(schema, resolver=self.resolver)
            self._validators[key] = v
        errors = sorted(v.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            raise ContractError("%s: at %s: %s" % (what, where, e.message))

    def operation(self, method, path):
        """(responses, description) for a request: its operation's, or
        x-flashsale-other-answers' for an unknown path or method; either
        way with the answers any request may get behind them."""
        other = self.doc["x-flashsale-other-answers"]
        for rx, template, item in self.paths:
            if rx.match(path):
                op = item.get(method.lower())
                if op:
                    return dict(other["any-request"], **op["responses"]), \
                        "%s %s" % (method, template)
                return (dict(other["any-request"], **other["unknown-method"]),
                        "%s %s (a method the path does not serve)" % (method, template))
        return (dict(other["any-request"], **other["unknown-path"]),
                "%s %s (no such path)" % (method, path))

    # -------------------------------------------------------------- check

    def check(self, method, url, status, headers, body):
        """Raises ContractError when the answer is not one the document
        describes. headers: lower-cased names; body: the text."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        responses, what = self.operation(method, path)
        resp = responses.get(str(status)) or responses.get("%dXX" % (status // 100)) \
            or responses.get("default")
        if resp is None:
            raise ContractError("%s: status %d is not in docs/openapi.yaml (documented: %s); body: %.300s"
                                % (what, status, ", ".join(sorted(responses)), body))
        resp = self.deref(resp)
        what = "%s -> %d" % (what, status)
        for name, h in (resp.get("headers") or {}).items():
            h = self.deref(h)
            value = headers.get(name.lower())
            if value is None:
                if h.get("required"):
                    raise ContractError("%s: required header %s missing (headers: %s)"
                                        % (what, name, sorted(headers)))
                continue
            if "schema" in h:
                self.validate(h["schema"], value, "%s: header %s" % (what, name))
        content = resp.get("content")
        if method.upper() == "HEAD" or not content:
            if body:
                raise ContractError("%s: the document describes no body, got %.200s" % (what, body))
            self.checked += 1
            return
        ctype = headers.get("content-type", "")
        base = ctype.split(";")[0].strip().lower()
        media = content.get(base)
        if media is None:
            raise ContractError("%s: Content-Type %r, documented: %s" % (what, ctype, ", ".join(content)))
        if "schema" in media:
            if base == "application/json":
                try:
                    value = json.loads(body)
                except ValueError:
                    raise ContractError("%s: the body is not JSON: %.200s" % (what, body)) from None
            else:
                value = body
            self.validate(media["schema"], value, "%s: body %.300s" % (what, body))
        if base == "application/json" and not body.endswith("\n"):
            raise ContractError("%s: the JSON body does not end with a newline (curl's output "
                                "would run into the prompt): %.200s" % (what, body))
        self.checked += 1

    def examples(self):
        """Every (where, schema, example) the document gives, so a test can
        check the examples against their own schemas."""
        out = []
        for template, item in self.doc["paths"].items():
            for method in METHODS:
                op = item.get(method)
                if not op:
                    continue
                bodies = [("request", (op.get("requestBody") or {}).get("content") or {})]
                for status, resp in op["responses"].items():
                    bodies.append((status, self.deref(resp).get("content") or {}))
                for label, content in bodies:
                    for ctype, media in content.items():
                        where = "%s %s %s %s" % (method.upper(), template, label, ctype)
                        if "example" in media:
                            out.append((where, media["schema"], media["example"]))
                        for name, ex in (media.get("examples") or {}).items():
                            out.append((where + " " + name, media["schema"], self.deref(ex)["value"]))
        for name, schema in self.doc["components"]["schemas"].items():
            if "example" in schema:
                out.append(("schema " + name, schema, schema["example"]))
        return out


_contract = None


def contract():
    """The document, loaded once per process."""
    global _contract
    if _contract is None:
        _contract = Contract()
    return _contract
