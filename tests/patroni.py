"""patroni.py: PostgreSQL as operators run it, for the tests and the demo:
a Patroni cluster (Debian's patroni 3.0.2) with etcd as its store, and
HAProxy routing to its leader by Patroni's REST health check (docs/operations.md,
"Patroni decides the failover").

Patroni(...) starts etcd on one host and a Patroni node per host given
(each node a real `patroni` process, run as the postgres user, that
initdb's or pg_basebackup's its PostgreSQL and runs it as its child), on
the hosts of tests/hosts.py: PostgreSQL on <host>:5432, Patroni's REST API
on <host>:8008, etcd on <dcs host>:2379. The first node bootstraps the
cluster; the others clone it. Every process is stopped by its PID.

Settings (the ones docs/operations.md recommends for a flash sale, in the
bootstrap's DCS section): ttl 10 s, loop_wait 2 s, retry_timeout 3 s
(loop_wait + 2 x retry_timeout <= ttl), synchronous_mode on (off: the
unsafe twin, which may promote a replica that lacks acknowledged orders),
use_pg_rewind with wal_log_hints, so a deposed leader rejoins;
wal_retrieve_retry_interval 250 ms, so a promotion is not held up to 5 s.

HAProxy(...) listens on <host>:5000 and sends each new connection to the
node whose GET /primary answers 200 (checked every 500 ms), closing the
connections of a node that stops answering it."""
import json
import os
import pwd
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import harness
import pgserver

PG_PORT = 5432
REST_PORT = 8008
ETCD_PORT = 2379
PROXY_PORT = 5000

# The DCS settings the scenes run with, and docs/operations.md recommends.
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 2, 3


class Etcd:
    """A one-member etcd on host (its client port 2379), Patroni's store."""

    def __init__(self, host):
        self.host = host
        self.dir = tempfile.mkdtemp(prefix="fs-pat-etcd-")
        client = "http://%s:%d" % (host.addr, ETCD_PORT)
        peer = "http://%s:%d" % (host.addr, ETCD_PORT + 1)
        self.log = open(os.path.join(self.dir, "etcd.log"), "a")
        self.proc = host.popen(["etcd", "--name", "dcs", "--data-dir", os.path.join(self.dir, "d"),
                                "--listen-client-urls", client, "--advertise-client-urls", client,
                                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                "--initial-cluster", "dcs=" + peer, "--heartbeat-interval", "50",
                                "--election-timeout", "500"],
                               stdout=self.log, stderr=self.log, cwd=self.dir)
        import hosts
        hosts.listening(host.addr, ETCD_PORT, timeout=30)

    @property
    def endpoint(self):
        return "%s:%d" % (self.host.addr, ETCD_PORT)

    def stop(self):
        harness._stop_proc(self.proc)
        self.log.close()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


class Node:
    """One Patroni node: its config, its process, its PostgreSQL's data."""

    def __init__(self, cluster, name, host):
        self.cluster = cluster
        self.name = name
        self.host = host
        self.addr = host.addr
        self.dir = tempfile.mkdtemp(prefix="fs-pat-%s-" % name)
        self.data = os.path.join(self.dir, "data")
        self.config = os.path.join(self.dir, "patroni.json")
        self.log_path = os.path.join(self.dir, "patroni.log")
        self.proc = None
        self._write_config()

    def _write_config(self):
        c = self.cluster
        subnet = "10.0.0.0/8"
        cfg = {
            "scope": c.scope, "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": "%s:%d" % (self.addr, REST_PORT),
                        "connect_address": "%s:%d" % (self.addr, REST_PORT)},
            "etcd3": {"hosts": [c.etcd.endpoint]},
            "bootstrap": {
                "dcs": {"ttl": c.ttl, "loop_wait": c.loop_wait, "retry_timeout": c.retry_timeout,
                        "maximum_lag_on_failover": c.max_lag,
                        "synchronous_mode": c.sync,
                        "postgresql": {"use_pg_rewind": True, "parameters": {
                            "wal_log_hints": "on", "max_connections": 100,
                            "wal_level": "replica", "hot_standby": "on", "max_wal_senders": 10,
                            "max_replication_slots": 10, "wal_keep_size": "128MB",
                            # A standby whose primary died retries it every
                            # this long, and PostgreSQL 15 notices a promote
                            # only when the wait ends (default 5 s: seen as
                            # 5 s between Patroni's promote and the first
                            # write, docs/operations.md).
                            "wal_retrieve_retry_interval": "250ms"}}},
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host all all %s trust" % subnet,
                           "host replication all %s trust" % subnet]},
            "postgresql": {
                "listen": "%s:%d" % (self.addr, PG_PORT),
                "connect_address": "%s:%d" % (self.addr, PG_PORT),
                "data_dir": self.data, "bin_dir": pgserver.pg_bin(),
                "pgpass": os.path.join(self.dir, "pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "x"},
                                   "replication": {"username": "postgres", "password": "x"},
                                   "rewind": {"username": "postgres", "password": "x"}},
                "parameters": {"unix_socket_directories": self.dir}},
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False,
                     "nosync": False},
        }
        with open(self.config, "w") as f:
            json.dump(cfg, f, indent=1)
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            for p in (self.dir, self.config):
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def start(self):
        self.log = open(self.log_path, "a")
        if os.getuid() == 0:
            os.chown(self.log_path, pwd.getpwnam("postgres").pw_uid, -1)
        env = dict(os.environ, HOME=self.dir, PATH=pgserver.pg_bin() + ":" + os.environ["PATH"])
        self.proc = self.host.popen(["patroni", self.config], stdout=self.log,
                                    stderr=subprocess.STDOUT, cwd=self.dir, env=env,
                                    preexec_fn=pgserver._as_postgres())

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                pid = int(f.readline())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def kill(self):
        """SIGKILL of Patroni and of its PostgreSQL (the postmaster and
        every backend: the host's processes die at once), and of anything
        else Patroni runs (a pg_rewind, a pg_basebackup): Patroni is stopped
        first, so that it starts nothing more, and its descendants are
        listed before it dies (its orphans would no longer be)."""
        pm = self.postmaster_pid()
        kids = []
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            kids = _children(self.proc.pid)
            self.proc.kill()
            self.proc.wait()
        for pid in ([pm] + _children(pm) if pm else []) + kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def rest(self, path, body=None, timeout=3, method=None):
        """A call of the node's REST API: (status, decoded JSON or text)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("http://%s:%d%s" % (self.addr, REST_PORT, path), data=data,
                                     headers={"Content-Type": "application/json"},
                                     method=method or ("POST" if body is not None else "GET"))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read().decode()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def psql(self, sql, dbname="postgres", timeout=10):
        """Runs sql on this node's PostgreSQL (from the observer): its rows,
        or None when it cannot be reached."""
        r = subprocess.run(["psql", "-h", self.addr, "-p", str(PG_PORT), "-U", "postgres", "-d",
                            dbname, "-AtF", "\t", "-c", sql], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            return None
        return [line.split("\t") for line in r.stdout.splitlines() if line]

    def in_recovery(self):
        rows = self.psql("SELECT pg_is_in_recovery()", timeout=5)
        return None if rows is None else rows[0][0] == "t"

    def logs(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def _children(pid):
    """Every descendant of pid (by /proc)."""
    kids, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as f:
                found = [int(x) for x in f.read().split()]
        except OSError:
            found = []
        kids += found
        todo += found
    return kids


class Patroni:
    """A Patroni cluster: etcd on dcs_host, a node per (name, host) in
    nodes (started together: the one that takes the initialize key in
    etcd runs initdb, the others clone it). sync: synchronous_mode (a COMMIT
    returns once the synchronous standby has it; Patroni promotes only
    that standby). max_lag: maximum_lag_on_failover (bytes a replica may
    lag and still be promoted: the unsafe twin raises it so that a lagging
    replica is promoted)."""

    def __init__(self, dcs_host, nodes, sync=True, ttl=TTL, loop_wait=LOOP_WAIT,
                 retry_timeout=RETRY_TIMEOUT, max_lag=1048576, scope="flashsale"):
        self.scope = scope
        self.sync = sync
        self.ttl, self.loop_wait, self.retry_timeout = ttl, loop_wait, retry_timeout
        self.max_lag = max_lag
        self.etcd = Etcd(dcs_host)
        self.nodes = [Node(self, name, host) for name, host in nodes]
        t = time.monotonic()
        for n in self.nodes:                 # one wins the initialize key; the others clone it
            n.start()
        self.wait_healthy(90)
        self.bootstrap_s = time.monotonic() - t

    def node(self, name):
        return next(n for n in self.nodes if n.name == name)

    def members(self):
        """The cluster as Patroni's REST API says (any node that answers):
        {name: {"role", "state", ...}}, or {} when none answers."""
        for n in self.nodes:
            try:
                status, j = n.rest("/cluster", timeout=2)
            except OSError:
                continue
            if status == 200 and isinstance(j, dict):
                return {m["name"]: m for m in j.get("members", [])}
        return {}

    def leader(self):
        """The node Patroni names leader, running, or None."""
        for name, m in self.members().items():
            if m.get("role") == "leader" and m.get("state") == "running":
                return self.node(name)
        return None

    def healthy(self):
        """A running leader and every other node running and streaming from
        it (with sync: one of them its synchronous standby)."""
        ms = self.members()
        if len(ms) != len(self.nodes):
            return False
        roles = [m.get("role") for m in ms.values()]
        if roles.count("leader") != 1 or any(m.get("state") not in ("running", "streaming")
                                             for m in ms.values()):
            return False
        return not self.sync or "sync_standby" in roles

    def wait_healthy(self, timeout=60):
        harness.wait_until(self.healthy, timeout, step=0.2,
                           what="the Patroni cluster to be healthy (%s)" % self.members())

    def switchover(self, candidate):
        """A planned switchover to candidate through the leader's REST API;
        returns once Patroni says it is done."""
        leader = self.leader()
        status, j = leader.rest("/switchover", {"leader": leader.name,
                                               "candidate": candidate.name}, timeout=60)
        if status != 200:
            raise AssertionError("switchover: %s %s" % (status, j))

    def configure(self, **settings):
        """Changes the cluster's dynamic configuration (PATCH /config, as
        `patronictl edit-config` does), e.g. synchronous_mode=False."""
        status, j = self.leader().rest("/config", settings, timeout=10, method="PATCH")
        if status != 200:
            raise AssertionError("PATCH /config: %s %s" % (status, j))
        self.sync = settings.get("synchronous_mode", self.sync)

    def db_url(self, dbname):
        """The libpq multi-host URL that finds the leader."""
        return "postgresql://postgres@%s/%s?target_session_attrs=read-write" % (
            ",".join("%s:%d" % (n.addr, PG_PORT) for n in self.nodes), dbname)

    def stop(self):
        """Ends the cluster for good: its nodes killed (SIGKILL; their
        data is thrown away with them), not shut down -- a clean shutdown
        only waits (9.6 s here for a node rejoining after a cut)."""
        for n in self.nodes:
            n.kill()
        self.etcd.stop()
        import shutil
        for n in self.nodes:
            shutil.rmtree(n.dir, ignore_errors=True)


class HAProxy:
    """HAProxy on host:5000 in front of cluster's nodes, routing to the one
    whose Patroni answers GET /primary with 200."""

    def __init__(self, host, cluster):
        self.host = host
        self.dir = tempfile.mkdtemp(prefix="fs-haproxy-")
        self.cfg = os.path.join(self.dir, "haproxy.cfg")
        servers = "".join("    server %s %s:%d check port %d\n" % (n.name, n.addr, PG_PORT,
                                                                   REST_PORT)
                          for n in cluster.nodes)
        with open(self.cfg, "w") as f:
            f.write("global\n    maxconn 4000\n"
                    "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n"
                    "    timeout server 30m\n    timeout check 1s\n"
                    "listen postgres\n    bind %s:%d\n    option httpchk GET /primary\n"
                    "    http-check expect status 200\n"
                    "    default-server inter 500ms fall 2 rise 1 on-marked-down "
                    "shutdown-sessions\n%s" % (host.addr, PROXY_PORT, servers))
        self.log = open(os.path.join(self.dir, "haproxy.log"), "a")
        self.proc = host.popen(["haproxy", "-f", self.cfg, "-db"], stdout=self.log,
                               stderr=self.log, cwd=self.dir)
        import hosts
        hosts.listening(host.addr, PROXY_PORT, timeout=20)
        harness.wait_until(self._routes, 20, step=0.1, what="haproxy to find the leader")

    def _routes(self):
        """Whether connections through it reach a primary only. Four in a
        row: HAProxy starts with every server up until its checks fail
        (fall 2, a second), and meanwhile sends every other connection to
        the replica -- one connection reaching the leader proved nothing,
        and an instance started then met a read-only server ("cannot
        execute CREATE TABLE in a read-only transaction", 2026-12-05)."""
        return all(self._reaches_primary() for _ in range(4))

    def _reaches_primary(self):
        r = subprocess.run(["psql", "-h", self.host.addr, "-p", str(PROXY_PORT), "-U", "postgres",
                            "-d", "postgres", "-Atc", "SELECT pg_is_in_recovery()"],
                           capture_output=True, text=True, timeout=10)
        return r.returncode == 0 and r.stdout.strip() == "f"

    def db_url(self, dbname):
        return "postgresql://postgres@%s:%d/%s" % (self.host.addr, PROXY_PORT, dbname)

    def stop(self):
        harness._stop_proc(self.proc)
        self.log.close()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)
