"""fuzzreplay.py: tests/fuzz/fuzz_request.c's input format and checks, in
Python, so that `make test` replays the request fuzzer's seeds and every
input it ever found (tests/fuzz/regress/request/) against bin/flashsale.

An input is either "RAW\\n" and a byte stream (sent as is, then the write
side closed), or a request: "<METHOD> <TARGET>\\n", header lines, an empty
line, the body (a chunked one sent as one chunk and the last chunk). Build and check exactly as the C harness does; keep the two
in step.
"""
import json
import socket
import time

CODES = {
    "invalid_json", "invalid_field", "missing_field", "bad_request", "unauthorized",
    "not_found", "unknown_sku", "unknown_order", "method_not_allowed", "sold_out",
    "insufficient_stock", "sku_exists", "per_user_limit", "body_too_large",
    "unsupported_media_type", "idempotency_key_reused", "request_in_progress",
    "lock_timeout", "strategy_unavailable", "lock_unavailable", "redis_unavailable",
    "db_unavailable", "shutting_down",
}
MAX_PAD = 70000
ANSWER_WAIT_S = 3.0


def _find_header(lines, name):
    for line in lines:
        if line[:len(name) + 1].lower() == name + b":":
            return line[len(name) + 1:]
    return None


def build(data):
    """The bytes fuzz_request sends for a structured input, and whether the
    request is HEAD; None when the input has no request line."""
    eol = data.find(b"\n")
    if eol < 0:
        return None, False
    line, rest = data[:eol], data[eol + 1:]
    lines = []
    while rest and not rest.startswith(b"\n"):
        e = rest.find(b"\n")
        if e < 0:
            lines.append(rest)
            rest = b""
            break
        lines.append(rest[:e])
        rest = rest[e + 1:]
    body = rest[1:] if rest.startswith(b"\n") else rest
    cl = _find_header(lines, b"content-length")
    te = _find_header(lines, b"transfer-encoding")
    pad = 0
    if cl is not None:
        digits = cl.lstrip(b" \t\r\v\f")
        sign = -1 if digits.startswith(b"-") else 1
        if digits[:1] in (b"+", b"-"):
            digits = digits[1:]
        n = 0
        for c in digits:                 # as parse_ll in fuzz_request.c
            if not 48 <= c <= 57 or n >= 10 ** 12:
                break
            n = n * 10 + c - 48
        want = sign * n
        if want > len(body) and want - len(body) < MAX_PAD:
            pad = want - len(body)
    out = line + b" HTTP/1.1\r\n"
    if _find_header(lines, b"host") is None:
        out += b"Host: fuzz\r\n"
    for l in lines:
        out += l + b"\r\n"
    if cl is None and te is None and body:
        out += b"Content-Length: %d\r\n" % len(body)
    chunked = te is not None and cl is None and te.strip(b" \t\r").lower() == b"chunked"
    out += b"\r\n"
    if chunked and body:
        out += b"%x\r\n" % len(body)
    out += body + b" " * pad
    if chunked:
        out += (b"\r\n" if body else b"") + b"0\r\n\r\n"
    return out, line.startswith(b"HEAD")


class Answer:
    def __init__(self, status, headers, body, head=False):
        self.status, self.headers, self.body, self.head = status, headers, body, head


def _parse(buf, head):
    """One answer from the front of buf: (Answer, rest) or (None, buf)."""
    h, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None, buf
    lines = h.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 "), lines[0]
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(b":")
        headers[k.strip().lower()] = v.strip()
    if head or status in (100, 204, 304):
        return Answer(status, headers, b"", head), rest
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body, p = b"", rest
        while True:
            e = p.find(b"\r\n")
            if e < 0:
                return None, buf
            n = int(p[:e].split(b";")[0], 16)
            if len(p) < e + 2 + n + 2:
                return None, buf
            body += p[e + 2:e + 2 + n]
            p = p[e + 2 + n + 2:]
            if n == 0:
                return Answer(status, headers, body), p
    n = int(headers.get(b"content-length", b"0"))
    if len(rest) < n:
        return None, buf
    return Answer(status, headers, rest[:n]), rest[n:]


def check(a):
    """The promises every answer keeps (as check_answer in the harness)."""
    assert 200 <= a.status <= 599 and a.status != 500, a.status
    b = a.body
    if a.head:
        return
    # Every answer but a HEAD's carries a body: a JSON document or error,
    # libmicrohttpd's own page, or the metrics text.
    assert b or a.status == 204, (a.status, "an answer without a body")
    if b[:1] in (b"{", b"["):
        j = json.loads(b.decode("utf-8"))
        if a.status >= 400:
            assert j.get("error") in CODES, j
            assert isinstance(j.get("message"), str), j
    elif b.startswith(b"<html>"):
        assert a.status in (400, 413, 414, 431, 505), (a.status, b[:80])
    elif b.startswith(b"HTTP/1.1 4"):
        assert a.status in (400, 413), (a.status, b[:80])      # libmicrohttpd's doubled header
    else:
        assert a.status == 200 and b.startswith(b"# HELP"), (a.status, b[:80])


def replay(port, data):
    """Sends one input and checks what comes back. Returns the answers."""
    raw = data.startswith(b"RAW\n")
    if raw:
        payload, head = data[4:], False
    else:
        payload, head = build(data)
        if payload is None:
            return []
    s = socket.create_connection(("127.0.0.1", port))
    # A raw stream is not split into requests here, so the answer to a HEAD
    # in it (Content-Length, no body) reads as if the answers after it were
    # its body: the framing is lost, and the rest is only read to the close.
    raw_head, lost = raw and b"HEAD" in payload, False
    answers, buf = [], b""
    try:
        try:
            s.sendall(payload)
        except OSError:
            pass                       # an early answer may cut the request short
        if raw:
            s.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + ANSWER_WAIT_S
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "no answer and no close within %.0f s: wedged" % ANSWER_WAIT_S
            s.settimeout(left)
            try:
                d = s.recv(65536)
            except ConnectionResetError:
                break
            except socket.timeout:
                raise AssertionError("no answer and no close within %.0f s: wedged" % ANSWER_WAIT_S)
            if not d:
                break
            buf += d
            while not lost:
                a, buf = _parse(buf, head)
                if a is None:
                    break
                if a.status == 100:
                    continue
                if raw_head and a.body.startswith(b"HTTP/1."):
                    lost = True
                    break
                check(a)
                answers.append(a)
            if answers and not raw:
                break
    finally:
        s.close()
    return answers
