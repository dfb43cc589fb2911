"""harness.py: real processes for flashsale's tests.

Redis: a private redis-server on a free port in a temp dir (no persistence
unless asked), stopped at the end even when a test fails.
ZooKeeper and etcd: a standalone server of each (Debian's zookeeper and
etcd-server), likewise on free loopback ports in temp dirs, for the lock
module's other backends; same kill/restart/pause helpers.
Service: bin/flashsale on a free port against that Redis and a fresh SQLite
file, with a small HTTP client. Nothing is mocked: a fault test kills,
stops or restarts the real process.

Sentinel and Cluster: real topologies (a primary, replicas and three
sentinels; three primaries with a replica each) in tests/topology.py,
reachable here as harness.Sentinels and harness.Cluster.

Every answer the Client receives is checked against docs/openapi.yaml
(contract.py): a status, body or required header the document does not
describe fails the test that received it.
"""
import base64
import http.client
import json
import os
import random
import re
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
# Whether the programs are the ThreadSanitizer build (make test-tsan:
# build/tsan/bin). It makes them 5-15x slower, so the few tests that bound
# a time our own threads spend (a hand-off's latency, a lock server's
# answer read within --redis-timeout-ms) give them more room.
TSAN = os.path.basename(os.path.dirname(os.path.abspath(BIN))) == "tsan"
_live = []          # processes to stop at exit, whatever happens


class Skip(Exception):
    """Raised by a test that cannot run here; its text says why. The
    runner reports it as skipped, with the reason: never as passed."""


_ports_given = set()
_port_rng = random.Random(os.getpid() ^ time.time_ns())


def _ephemeral_low():
    """The lowest port the kernel gives outgoing connections (0: unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port_pair(offset):
    """A port P for a server that also binds P + offset (a Redis Cluster
    node's bus is its port + 10000): both free, both below the ephemeral
    range, neither given before in this run, and both marked given."""
    low = _ephemeral_low() or 32768
    for _ in range(400):
        want = _port_rng.randrange(10000, low - offset)
        if want in _ports_given or want + offset in _ports_given:
            continue
        ok = True
        for p in (want, want + offset):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            _ports_given.update((want, want + offset))
            return want
    raise RuntimeError("no free port pair found")


def free_port():
    """A loopback port nothing is bound to, for a server to listen on.

    Chosen below the kernel's ephemeral range: bind(0) picks from that
    range, where every outgoing connection of the tests takes its local
    port too, so one of them could hold the port by the time the server
    binds it (an etcd start failed so: "bind: address already in use").
    Never the same port twice in a run, so a server that is down for a
    restart keeps its port."""
    low = _ephemeral_low()
    for _ in range(200):
        want = _port_rng.randrange(10000, low) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", want))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise AssertionError("no free loopback port found")


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
    """A private redis-server. persist=True turns AOF on (appendfsync always);
    env: its environment (None: ours)."""

    def __init__(self, persist=False, port=None, unix_socket=False, env=None):
        import redis  # Debian's python3-redis
        self._redis = redis
        self.dir = tempfile.mkdtemp(prefix="fs-redis-")
        self.port = port or free_port()
        self.persist = persist
        self.socket = os.path.join(self.dir, "redis.sock") if unix_socket else None
        self.env = env
        self.proc = None
        self.start()

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--save", "", "--logfile", os.path.join(self.dir, "redis.log"),
                "--appendonly", "yes" if self.persist else "no", "--appendfsync", "always"]
        if self.socket:
            args += ["--unixsocket", self.socket, "--unixsocketperm", "700"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=self.env)
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

    def restart(self, wipe=False):
        """Kills and starts again on the same port; wipe=True deletes the
        append-only file first (the server lost its data: without persist
        it has none to keep anyway)."""
        if self.proc.poll() is None:
            self.kill()
        if wipe:
            for name in os.listdir(self.dir):
                if name.startswith("appendonly"):
                    path = os.path.join(self.dir, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
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


def _stop_proc(proc):
    """SIGCONT (in case it is paused), SIGTERM, then SIGKILL after 5 s."""
    if proc and proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Server:
    """What the lock servers share: kill, restart (same data, or wiped),
    pause and resume by PID, stop and remove the temp dir."""

    def kill(self):
        """SIGKILL: the server keeps only what it wrote to its data dir."""
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.proc.kill()
        self.proc.wait()

    def restart(self, wipe=False):
        """Kills and starts again on the same port; wipe=True starts with an
        empty data dir (the server lost its data)."""
        if self.proc.poll() is None:
            self.kill()
        if wipe:
            shutil.rmtree(self.data, ignore_errors=True)
            os.makedirs(self.data)
        self.start()

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        _stop_proc(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


# Debian's zookeeper.jar names its dependencies in its manifest; log4j and
# its slf4j binding are added so the server logs to a file.
ZK_CLASSPATH = ":".join(p for p in ["/usr/share/java/zookeeper.jar",
                                    "/usr/share/java/slf4j-log4j12.jar",
                                    "/usr/share/java/log4j-1.2.jar"] if os.path.exists(p))


class ZooKeeper(_Server):
    """A standalone ZooKeeper from Debian's zookeeper package (needs a JRE),
    on a free loopback port, its data in a temp dir. tickTime 100 ms and
    minSessionTimeout 200 ms let tests use short sessions; the admin server
    (Jetty on 8080) is off; four-letter words are on (ruok, dump).
    Containers are checked every second, not every minute."""

    def __init__(self, port=None):
        self.dir = tempfile.mkdtemp(prefix="fs-zk-")
        self.data = os.path.join(self.dir, "data")
        os.makedirs(self.data)
        self.port = port or free_port()
        self.log_path = os.path.join(self.dir, "zookeeper.log")
        self.cfg = os.path.join(self.dir, "zoo.cfg")
        with open(self.cfg, "w") as f:
            f.write("tickTime=100\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"
                    "minSessionTimeout=200\nmaxSessionTimeout=60000\n"
                    "admin.enableServer=false\n4lw.commands.whitelist=*\n"
                    "maxClientCnxns=0\n" % (self.data, self.port))
        with open(os.path.join(self.dir, "log4j.properties"), "w") as f:
            f.write("log4j.rootLogger=INFO, F\nlog4j.appender.F=org.apache.log4j.FileAppender\n"
                    "log4j.appender.F.File=%s\nlog4j.appender.F.layout="
                    "org.apache.log4j.PatternLayout\nlog4j.appender.F.layout.ConversionPattern="
                    "%%d %%p %%c{1}: %%m%%n\n" % self.log_path)
        self.proc = None
        self.start()

    def start(self):
        # C1 only and a serial GC: a JVM that starts fast on a busy 2-core box.
        cmd = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dzookeeper.admin.enableServer=false", "-Dznode.container.checkIntervalMs=1000",
               "-Dlog4j.configuration=file:" + os.path.join(self.dir, "log4j.properties"),
               "-cp", ZK_CLASSPATH, "org.apache.zookeeper.server.ZooKeeperServerMain", self.cfg]
        out = open(os.path.join(self.dir, "stdout.log"), "a")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=out, cwd=self.dir)
        out.close()
        _live.append(self.proc)
        wait_until(self._ready, 90, step=0.1, what="zookeeper to answer ruok")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("zookeeper exited with %s:\n%s" % (self.proc.returncode,
                                                                   self.logs()[-3000:]))
        return self.four("ruok") == "imok" and "Mode: standalone" in self.four("srvr")

    def four(self, word):
        """A four-letter word's answer ("" when the server does not answer)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(word.encode())
                out = b""
                while True:
                    d = s.recv(65536)
                    if not d:
                        return out.decode(errors="replace")
                    out += d
        except OSError:
            return ""

    def ephemerals(self):
        """Every ephemeral node (full paths), from the dump word."""
        dump = self.four("dump")
        part = dump.split("ephemeral nodes dump:", 1)[-1].split("Connections dump:", 1)[0]
        return sorted(line.strip() for line in part.splitlines() if line.startswith("\t/"))

    def cli(self, *args):
        """Runs one zkCli.sh command; returns its stdout."""
        p = subprocess.run(["/usr/share/zookeeper/bin/zkCli.sh", "-server",
                            "127.0.0.1:%d" % self.port] + list(args),
                           capture_output=True, text=True, timeout=60)
        return p.stdout

    @property
    def url(self):
        return "zk://127.0.0.1:%d/locks" % self.port


class Etcd(_Server):
    """A single-member etcd from Debian's etcd-server on free loopback client
    and peer ports, its data in a temp dir. A short election timeout makes
    its smallest lease 1 s (the default allows 2 s) and a restart quick."""

    def __init__(self, port=None):
        self.dir = tempfile.mkdtemp(prefix="fs-etcd-")
        self.data = os.path.join(self.dir, "data")
        os.makedirs(self.data)
        self.port = port or free_port()
        self.peer_port = free_port()
        self.log_path = os.path.join(self.dir, "etcd.log")
        self.proc = None
        self.start()

    def start(self):
        peer = "http://127.0.0.1:%d" % self.peer_port
        client = "http://127.0.0.1:%d" % self.port
        cmd = ["etcd", "--name", "fs", "--data-dir", self.data,
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", "fs=" + peer, "--initial-cluster-state", "new",
               "--heartbeat-interval", "50", "--election-timeout", "500"]
        out = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=out, cwd=self.dir)
        out.close()
        _live.append(self.proc)
        wait_until(self._ready, 30, step=0.05, what="etcd to be healthy")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("etcd exited with %s:\n%s" % (self.proc.returncode,
                                                              self.logs()[-3000:]))
        try:
            return self.call("/v3/kv/range", {"key": _b64(b"\0")}, timeout=1) is not None
        except OSError:
            return False

    def call(self, path, body, timeout=5):
        """POSTs body (JSON) to the v3 gateway; returns the decoded reply."""
        import urllib.request
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path),
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())

    def keys(self, prefix):
        """[(key, create_revision, lease)] of every key under prefix (bytes)."""
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        r = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return [(base64.b64decode(kv["key"]), int(kv.get("create_revision", 0)),
                 int(kv.get("lease", 0))) for kv in r.get("kvs", [])]

    def leases(self):
        """Ids of the leases etcd holds."""
        r = self.call("/v3/lease/leases", {})
        return sorted(int(x["ID"]) for x in r.get("leases", []))

    def etcdctl(self, *args, **kw):
        """Runs etcdctl (v3) against this server; returns the CompletedProcess."""
        env = dict(os.environ, ETCDCTL_API="3")
        return subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % self.port] +
                              list(args), capture_output=True, text=True, env=env,
                              timeout=kw.pop("timeout", 60), **kw)

    @property
    def url(self):
        return "etcd://127.0.0.1:%d" % self.port


def _b64(b):
    return base64.b64encode(b).decode()


class LockServers:
    """The lock server(s) one lock strategy of the service needs, already
    started: three Redis servers for `redlock`, a ZooKeeper for
    `zookeeper`, an etcd for `etcd`, nothing for `db-lock` (its lock table
    is in the service's SQLite file). `args` are the service's flags that
    name them; `holder(name, db_path)` says who holds the lock `name` now,
    read from the server itself."""

    def __init__(self, strategy, servers):
        self.strategy = strategy
        self.servers = list(servers)
        if strategy == "redlock":
            self.args = ["--redlock", ",".join(r.url for r in self.servers)]
        elif strategy in ("zookeeper", "etcd"):
            self.args = ["--" + strategy, self.servers[0].url]
        else:
            self.args = []

    def holder(self, name, db_path=None):
        """Who holds the lock `name` now, as the server names the hold (the
        Redis value a majority has, the lowest ZooKeeper node, the etcd key
        with the lowest create revision, the lock table row's owner), or
        None when it is free."""
        if self.strategy == "redlock":
            values = []
            for r in self.servers:
                try:
                    values.append(r.client().get(name))
                except Exception:  # noqa: BLE001 - a server down holds nothing
                    pass
            for v in set(values) - {None}:
                if values.count(v) >= len(self.servers) // 2 + 1:
                    return v
            return None
        if self.strategy == "zookeeper":
            nodes = [n for n in self.servers[0].ephemerals() if n.startswith("/locks/%s/" % name)]
            return min(nodes, key=lambda n: n.rsplit("lock-", 1)[-1]) if nodes else None
        if self.strategy == "etcd":
            keys = self.servers[0].keys(name.encode() + b"/")
            return min(keys, key=lambda k: k[1])[0] if keys else None
        rows = db_rows(db_path, "SELECT owner FROM locks WHERE name=?", (name,))
        return rows[0][0] if rows else None

    def holds(self, name, db_path=None):
        return self.holder(name, db_path) is not None

    def restart(self, wipe=False):
        """Restarts every server; wipe=True: each comes back empty."""
        for s in self.servers:
            s.restart(wipe=wipe)


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

    def __init__(self, port, timeout=30, host="127.0.0.1"):
        self.port = port
        self.host = host
        self.timeout = timeout
        self.conn = None

    def request(self, method, path, body=None, headers=None, raw=None):
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        hdrs = {k: v for k, v in hdrs.items() if v is not None}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
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
    """bin/flashsale against a Redis URL and a SQLite file or a PostgreSQL
    URL; its log beside the file, or in log_dir. host: a hosts.Host to run
    on (listening on its address, port 8080); None: 127.0.0.1."""

    def __init__(self, redis_url, db_path, args=(), env=None, port=None, prefix="fs:",
                 wait=True, log_dir=None, host=None):
        self.host = host
        self.ip = host.addr if host else "127.0.0.1"
        self.port = port or (8080 if host else free_port())
        self.db_path = db_path
        self.redis_url = redis_url
        self.prefix = prefix
        self.args = list(args)
        self.env = env
        if "://" in db_path:
            self.log_path = os.path.join(log_dir or tempfile.gettempdir(),
                                         "flashsale.%s.%d.log" % (self.ip, self.port))
        else:
            self.log_path = db_path + ".%d.log" % self.port
        self.proc = None
        self.start(wait)

    def start(self, wait=True):
        cmd = [os.path.join(BIN, "flashsale"), "--listen", "%s:%d" % (self.ip, self.port),
               "--redis", self.redis_url, "--db", self.db_path, "--key-prefix", self.prefix,
               "--redis-timeout-ms", "500", "--pending-timeout-ms", "3000"] + self.args
        # The service reads its flags' FLASHSALE_* twins: a developer's own
        # (an admin token in the shell) must not change what a test runs.
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSALE_")}
        env.update(self.env or {})
        self.log = open(self.log_path, "a")
        if self.host:
            self.proc = self.host.popen(cmd, stdout=self.log, stderr=self.log, env=env)
        else:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env)
            _live.append(self.proc)
        self.client = Client(self.port, host=self.ip)
        if wait:
            wait_until(self._up, 20, what="flashsale to listen")

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError("flashsale exited with %s:\n%s" % (self.proc.returncode,
                                                                    self.logs()))
        try:
            with socket.create_connection((self.ip, self.port), timeout=1):
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

    # --product-cache-ms (its default): an instance answers a product read
    # of the stores again for this long (docs/api.md, "How old a product
    # read may be"), and a change made through another instance does not
    # end it.
    PRODUCT_VIEW_S = 0.05

    def settled_product(self, sku):
        """The product as the stores have it now, for the books once nothing
        is in flight: after the view of an earlier read has aged out. That
        read may have been made while something was in flight -- between
        another instance's decision of a hold (held down in SQLite) and its
        return to Redis, say -- and counted units in neither place."""
        time.sleep(self.PRODUCT_VIEW_S + 0.01)
        return self.product(sku)

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
    """Reads the service's database directly (a second vantage point): a
    SQLite file, or a PostgreSQL server's database by its URL (with psql;
    ? parameters, numbers come back as int)."""
    if path.startswith("postgresql://") or path.startswith("postgres://"):
        return _pg_rows(path, sql, args)
    con = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def _pg_literal(v):
    if v is None:
        return "NULL"
    if isinstance(v, (int, float)):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


def _pg_rows(url, sql, args):
    parts = sql.split("?")
    if len(parts) != len(args) + 1:
        raise AssertionError("db_rows: %d ? for %d arguments" % (len(parts) - 1, len(args)))
    text = parts[0] + "".join(_pg_literal(a) + p for a, p in zip(args, parts[1:]))
    r = subprocess.run(["psql", url, "-X", "-v", "ON_ERROR_STOP=1", "-AtF", "\t", "-c",
                        "SET default_transaction_read_only=on; " + text],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("psql: %s" % r.stderr)
    rows = []
    for line in r.stdout.splitlines():
        if line == "SET":
            continue
        rows.append(tuple(int(c) if re.fullmatch(r"-?\d+", c) else (None if c == "" else c)
                          for c in line.split("\t")))
    return rows


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


def __getattr__(name):
    """harness.Sentinels, harness.Cluster, harness.Node: the topologies of
    tests/topology.py (its own file: this one was full), and
    harness.Postgres and harness.PgBouncer (tests/pgserver.py), loaded on first use so either
    module may be imported first."""
    if name in ("Sentinels", "Cluster", "Node"):
        import topology
        return getattr(topology, name)
    if name in ("Postgres", "PgBouncer"):
        import pgserver
        return getattr(pgserver, name)
    raise AttributeError("module 'harness' has no attribute %r" % name)
