"""harness.py: real processes for flashsale's tests.

Redis: a private redis-server on a free port in a temp dir (no persistence
unless asked), stopped at the end even when a test fails.
Service: bin/flashsale on a free port against that Redis and a fresh SQLite
file, with a small HTTP client. Nothing is mocked: a fault test kills,
stops or restarts the real process.

Every answer the Client receives is checked against docs/openapi.yaml
(contract.py): a status, body or required header the document does not
describe fails the test that received it.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time

from contract import contract

BIN = os.environ.get("FLASHSALE_BIN", os.path.join(os.path.dirname(__file__), "..", "bin"))
_live = []          # processes to stop at exit, whatever happens


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout=10.0, step=0.02, what="condition"):
    """Polls pred until it returns truthy; raises after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(step)


class Redis:
    """A private redis-server. persist=True turns AOF on (appendfsync always)."""

    def __init__(self, persist=False, port=None, unix_socket=False):
        import redis  # Debian's python3-redis
        self._redis = redis
        self.dir = tempfile.mkdtemp(prefix="fs-redis-")
        self.port = port or free_port()
        self.persist = persist
        self.socket = os.path.join(self.dir, "redis.sock") if unix_socket else None
        self.proc = None
        self.start()

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--save", "", "--logfile", os.path.join(self.dir, "redis.log"),
                "--appendonly", "yes" if self.persist else "no", "--appendfsync", "always"]
        if self.socket:
            args += ["--unixsocket", self.socket, "--unixsocketperm", "700"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _live.append(self.proc)
        wait_until(self._ping, 10, what="redis-server to answer")

    def _ping(self):
        try:
            return self.client().ping()
        except Exception:
            return False

    @property
    def url(self):
        return "redis://127.0.0.1:%d/0" % self.port

    def client(self):
        return self._redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                                 decode_responses=True)

    def kill(self):
        """SIGKILL: Redis loses what it did not persist."""
        self.proc.kill()
        self.proc.wait()

    def restart(self):
        if self.proc.poll() is None:
            self.kill()
        self.start()

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.raw = body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def __repr__(self):
        return "<%d %s>" % (self.status, self.raw[:300])


class Client:
    """One keep-alive HTTP/1.1 connection (not thread-safe: one per thread)."""

    def __init__(self, port, timeout=30):
        self.port = port
        self.timeout = timeout
        self.conn = None

    def request(self, method, path, body=None, headers=None, raw=None):
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        hdrs = {k: v for k, v in hdrs.items() if v is not None}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=hdrs)
                r = self.conn.getresponse()
                body = r.read().decode()
                resp = Response(r.status, {k.lower(): v for k, v in r.getheaders()}, body)
                contract().check(method, path, resp.status, resp.headers, body)
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return resp
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server closed while idle.
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None

    # Shorthands
    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)


class Service:
    """bin/flashsale against a Redis URL and a SQLite file."""

    def __init__(self, redis_url, db_path, args=(), env=None, port=None, prefix="fs:",
                 wait=True):
        self.port = port or free_port()
        self.db_path = db_path
        self.redis_url = redis_url
        self.prefix = prefix
        self.args = list(args)
        self.env = env
        self.log_path = db_path + ".%d.log" % self.port
        self.proc = None
        self.start(wait)

    def start(self, wait=True):
        cmd = [os.path.join(BIN, "flashsale"), "--listen", "127.0.0.1:%d" % self.port,
               "--redis", self.redis_url, "--db", self.db_path, "--key-prefix", self.prefix,
               "--redis-timeout-ms", "500", "--pending-timeout-ms", "3000"] + self.args
        env = dict(os.environ)
        env.update(self.env or {})
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env)
        _live.append(self.proc)
        self.client = Client(self.port)
        if wait:
            wait_until(self._up, 20, what="flashsale to listen")

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError("flashsale exited with %s:\n%s" % (self.proc.returncode,
                                                                    self.logs()))
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def logs(self):
        with open(self.log_path) as f:
            return f.read()

    def request(self, *a, **kw):
        return self.client.request(*a, **kw)

    def get(self, *a, **kw):
        return self.client.get(*a, **kw)

    def post(self, *a, **kw):
        return self.client.post(*a, **kw)

    def create_product(self, sku, stock, **fields):
        body = {"sku": sku, "name": sku.title(), "stock": stock}
        body.update(fields)
        r = self.post("/v1/products", body, headers=fields.pop("headers", None))
        assert r.status == 201, r
        return r.json

    def order(self, sku, user="u1", qty=1, key=None, client=None):
        c = client or self.client
        return c.post("/v1/orders", {"sku": sku, "user_id": user, "quantity": qty},
                      headers={"Idempotency-Key": key} if key else None)

    def product(self, sku):
        r = self.get("/v1/products/" + sku)
        assert r.status == 200, r
        return r.json

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Stops the service; returns its exit code."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("flashsale did not stop within %ds" % timeout)
        self.log.close()
        return self.proc.returncode

    def kill(self):
        self.client.close()
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def restart(self, wait=True):
        if self.proc.poll() is None:
            self.stop()
        self.start(wait)


def db_rows(path, sql, args=()):
    """Reads the service's SQLite file directly (a second vantage point)."""
    con = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def parallel(n, fn):
    """Runs fn(i) on n threads; returns the results, re-raising the first error."""
    results = [None] * n
    errors = []

    def run(i):
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def stop_all():
    for p in _live:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.kill()
            p.wait()
