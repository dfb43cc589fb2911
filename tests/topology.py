"""topology.py: real Redis topologies for flashsale's integration tests,
started the way harness.Redis starts one server (free loopback ports, temp
dirs, every process stopped by PID at the end) -- so that the service is tested
running on the Redis that production runs. harness.Sentinels and
harness.Cluster are these (harness.py was full); tests get them from
ctx.sentinels() and ctx.cluster() (tests/run.py), stopped after each test.

Node: one redis-server (or sentinel) started from a config file in its temp
dir, so what Redis rewrites there (a sentinel's REPLICAOF, a cluster's
nodes.conf) survives a restart, as on a real machine.

Sentinels: a primary, 1-2 replicas and three sentinels (quorum 2,
down-after 1 s) that know each other before the constructor returns.
    url                      redis-sentinel://s1,s2,s3/<name>
    primary / replicas       the data nodes by role, as the sentinels agree
    master_addr(s)           what one sentinel answers: (host, port)
    agreed()                 the port every live sentinel names, or None
    failover()               SENTINEL FAILOVER, then all sentinels agree on
                             the new primary and ROLE says master there
    kill_primary()           SIGKILL; pause_primary()/resume(): SIGSTOP/CONT
    wait_failover(old_port)  a real (voted) failover has happened
    cut_replica(r)           r stops receiving writes, deterministically
    heal_replica(r)          r may sync again
    wait_synced()            every live replica in sync with the primary

  How a replica is made to miss writes (cut_replica): the primary's
  default user loses PSYNC and SYNC (ACL SETUSER default -psync -sync) and
  the replica's link is killed from the replica's side (CLIENT KILL TYPE
  master). The replica reconnects every second and is refused ("NOPERM
  ... 'psync'"), so nothing written after the kill can reach it; it stays a
  replica the sentinels may promote. What does not work: SIGSTOP or DEBUG
  SLEEP on the replica (the stream waits in its socket buffer and is
  applied when it wakes, even after the primary died); killing the link
  alone (the replica resyncs within a second); REPLICAOF NO ONE (no longer
  a replica). CLIENT PAUSE WRITE on the replica also holds the stream back
  (Redis 7.0 pauses the master link too), but that is an implementation
  detail, and the paused replica would refuse writes once promoted.

Cluster: 3 primaries and a replica each (redis-cli --cluster create), node
timeout 1 s, every node agreeing before the constructor returns.
    url                      redis-cluster://every node
    execute(*cmd) get/set    commands that follow MOVED and ASK (ASKING on
                             the same connection), retry TRYAGAIN and
                             CLUSTERDOWN; redirects counts what was followed
    owner(slot) keyslot(k)   the primary serving a slot; CLUSTER KEYSLOT
    primaries() replica_of() the nodes by role
    reshard(src, dst, n)     redis-cli --cluster reshard, non-interactive:
                             moves src's n lowest slots (and their keys) to
                             dst; returns the slots moved
    move_slot(slot, dst)     one slot by hand (SETSLOT IMPORTING/MIGRATING,
                             MIGRATE, SETSLOT NODE), for an exact slot
    fail_over(primary)       CLUSTER FAILOVER FORCE on its replica
    kill_primary(primary)    SIGKILL; its replica is elected (automatic)
    wait_consistent()        every live node has the same slot map, state ok
"""
import os
import subprocess
import tempfile
import time

import harness
from harness import _Server, free_port, wait_until


class Node(_Server):
    """One redis-server, or a sentinel, from a config file of its own."""

    def __init__(self, options=(), sentinel=False, port=None, host=None):
        """host: a hosts.Host to run on (its address, a port of its own:
        6379, or 26379 for a sentinel); None: loopback, a free port."""
        import redis  # Debian's python3-redis
        self._redis = redis
        self.sentinel = sentinel
        self.host = host
        self.ip = host.addr if host else "127.0.0.1"
        self.dir = tempfile.mkdtemp(prefix="fs-sentinel-" if sentinel else "fs-node-")
        self.port = port or ((26379 if sentinel else 6379) if host else free_port())
        self.log_path = os.path.join(self.dir, "redis.log")
        self.conf = os.path.join(self.dir, "redis.conf")
        lines = ["port %d" % self.port, "bind %s" % self.ip, 'dir "%s"' % self.dir,
                 'logfile "%s"' % self.log_path]
        if host:   # served to the run's own hosts only (no route leaves them)
            lines.append("protected-mode no")
        if not sentinel:   # no persistence; a full sync without Redis 7's 5 s delay
            lines += ['save ""', "appendonly no", "repl-diskless-sync-delay 0"]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines + list(options)) + "\n")
        self.proc = None
        self._client = None
        self.start()

    def start(self):
        cmd = ["redis-server", self.conf] + (["--sentinel"] if self.sentinel else [])
        if self.host:
            self.proc = self.host.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            harness._live.append(self.proc)
        self._client = None
        wait_until(self._ready, 10, what="redis-server on port %d to answer" % self.port)

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited with %s:\n%s" % (self.proc.returncode,
                                                                      self.logs()[-2000:]))
        try:
            return self.client().ping()
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def restart(self, wipe=False):
        """Kills and starts again from its (possibly rewritten) config."""
        assert not wipe, "a topology node keeps its config"
        if self.proc.poll() is None:
            self.kill()
        self.start()

    def alive(self):
        return self.proc.poll() is None

    def client(self):
        """A client of this node (one per node, kept)."""
        if self._client is None:
            self._client = self._redis.Redis(host=self.ip, port=self.port, socket_timeout=5,
                                             decode_responses=True)
        return self._client

    def _call(self, fn):
        """fn(client), again on a fresh connection if the node closed the
        kept one: a master made a replica drops its clients, and so does a
        node restarted since."""
        try:
            return fn(self.client())
        except self._redis.ConnectionError:
            self._client = None
            return fn(self.client())

    def cmd(self, *args):
        return self._call(lambda c: c.execute_command(*args))

    def role(self):
        """ROLE's first word: master, slave or sentinel (None: no answer)."""
        try:
            return self.cmd("ROLE")[0]
        except Exception:  # noqa: BLE001 - down
            return None

    def info(self, section):
        return self._call(lambda c: c.info(section))

    @property
    def addr(self):
        return "%s:%d" % (self.ip, self.port)

    def __repr__(self):
        return "<Node %s%s>" % (self.addr, " sentinel" if self.sentinel else "")


def _stop_nodes(nodes):
    for n in nodes:
        try:
            n.stop()
        except Exception:  # noqa: BLE001 - stop the others anyway
            pass


# ---------------------------------------------------------------- Sentinel

class Sentinels:
    """A primary, `replicas` replicas and three sentinels watching `name`."""

    def __init__(self, replicas=1, name="mymaster", down_after_ms=1000):
        self.name = name
        self.nodes = []           # data nodes, first the primary at the start
        self.sentinels = []
        try:
            self.nodes.append(Node())
            first = self.nodes[0].port
            for _ in range(replicas):
                self.nodes.append(Node(["replicaof 127.0.0.1 %d" % first]))
            self.wait_synced(first)
            for _ in range(3):
                self.sentinels.append(Node([
                    "sentinel monitor %s 127.0.0.1 %d 2" % (name, first),
                    "sentinel down-after-milliseconds %s %d" % (name, down_after_ms),
                    "sentinel failover-timeout %s 10000" % name], sentinel=True))
            wait_until(self._all_known, 20, step=0.1,
                       what="the sentinels to know each other and the replicas")
        except BaseException:
            self.stop()
            raise

    def _all_known(self):
        want = len(self.nodes) - 1
        for s in self.sentinels:
            if len(s.cmd("SENTINEL", "SENTINELS", self.name)) != 2:
                return False
            reps = s.cmd("SENTINEL", "REPLICAS", self.name)
            ok = [r for r in reps if _fields(r).get("flags") == "slave"]
            if len(ok) != want:
                return False
        return True

    @property
    def url(self):
        return "redis-sentinel://%s/%s" % (",".join(s.addr for s in self.sentinels), self.name)

    def node_at(self, port):
        return next(n for n in self.nodes if n.port == port)

    def master_addr(self, sentinel):
        """What sentinel answers get-master-addr-by-name: (host, port)."""
        host, port = sentinel.cmd("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
        return host, int(port)

    def agreed(self):
        """The port every live sentinel names, or None when they differ."""
        ports = {self.master_addr(s)[1] for s in self.sentinels if s.alive()}
        return ports.pop() if len(ports) == 1 else None

    @property
    def primary(self):
        port = self.agreed()
        assert port is not None, "the sentinels disagree about the primary"
        return self.node_at(port)

    @property
    def replicas(self):
        p = self.primary
        return [n for n in self.nodes if n is not p and n.alive()]

    def wait_synced(self, primary_port=None, timeout=10):
        """Every live replica of the primary has its link up."""
        port = primary_port or self.primary.port

        def synced():
            for n in self.nodes:
                if n.port == port or not n.alive():
                    continue
                rep = n.info("replication")
                if rep.get("master_port") != port or rep.get("master_link_status") != "up":
                    return False
            return True
        wait_until(synced, timeout, step=0.05, what="the replicas to be in sync")

    def _wait_new_primary(self, old_port, timeout):
        def moved():
            port = self.agreed()
            return port if port not in (None, old_port) and \
                self.node_at(port).role() == "master" else None
        return self.node_at(wait_until(moved, timeout, step=0.05,
                                       what="the sentinels to agree on a new primary"))

    def failover(self, timeout=15):
        """SENTINEL FAILOVER (forced: no vote), then every sentinel names
        the new primary, which says master. The old one, if alive, is made
        a replica by the sentinels some 10 s later (wait_synced waits)."""
        old = self.primary.port

        def forced():
            try:
                return self.sentinels[0].cmd("SENTINEL", "FAILOVER", self.name)
            except self._redis_error() as e:
                if "NOGOODSLAVE" in str(e) or "INPROG" in str(e):
                    return False
                raise
        wait_until(forced, 10, step=0.1, what="SENTINEL FAILOVER to be accepted")
        return self._wait_new_primary(old, timeout)

    def kill_primary(self):
        """SIGKILL to the primary; returns it. wait_failover follows."""
        p = self.primary
        p.kill()
        return p

    def pause_primary(self):
        """SIGSTOP to the primary (a stalled one); returns it."""
        p = self.primary
        p.pause()
        return p

    def wait_failover(self, old_port, timeout=20):
        """The sentinels agree on a primary other than old_port (a voted
        failover after kill_primary or pause_primary); returns it."""
        return self._wait_new_primary(old_port, timeout)

    def cut_replica(self, replica):
        """Makes replica miss every write from now on (see the module doc):
        the primary refuses PSYNC and SYNC, the replica's link is killed.
        Another replica keeps its link, unless that drops too meanwhile."""
        p = self.primary
        assert replica is not p
        p.cmd("ACL", "SETUSER", "default", "-psync", "-sync")
        replica.cmd("CLIENT", "KILL", "TYPE", "master")
        wait_until(lambda: replica.info("replication")["master_link_status"] == "down", 5,
                   what="the replica's link to go down")

    def heal_replica(self, replica):
        """Undoes cut_replica: the replica syncs again."""
        self.primary.cmd("ACL", "SETUSER", "default", "+psync", "+sync")
        self.wait_synced()

    def _redis_error(self):
        return self.sentinels[0]._redis.ResponseError

    def stop(self):
        _stop_nodes(self.sentinels + self.nodes)


def _fields(flat):
    """A sentinel's flat [k, v, k, v...] (or a dict) as a dict."""
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[0::2], flat[1::2]))


# ----------------------------------------------------------------- Cluster

class Cluster:
    """`primaries` primaries with `replicas` replicas each."""

    def __init__(self, primaries=3, replicas=1, node_timeout_ms=1000):
        self.nodes = []
        self.redirects = {"MOVED": 0, "ASK": 0, "TRYAGAIN": 0, "CLUSTERDOWN": 0}
        try:
            # repl-ping-replica-period 1: a replica shows in CLUSTER SLOTS once
            # its offset is past 0 (Redis 7), which a primary with no writes
            # moves only by its pings to replicas, every 10 s by default.
            opts = ["cluster-enabled yes", "cluster-config-file nodes.conf",
                    "repl-ping-replica-period 1",
                    "cluster-node-timeout %d" % node_timeout_ms]
            # A node's cluster bus listens on its port + 10000: both free.
            self.nodes = [Node(opts, port=harness.free_port_pair(10000))
                          for _ in range(primaries * (1 + replicas))]
            p = subprocess.run(["redis-cli", "--cluster", "create"] +
                               [n.addr for n in self.nodes] +
                               ["--cluster-replicas", str(replicas), "--cluster-yes"],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stdout + p.stderr
            self.wait_consistent(primaries=primaries, replicas=replicas)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self):
        return "redis-cluster://" + ",".join(n.addr for n in self.nodes)

    def live(self):
        return [n for n in self.nodes if n.alive()]

    def node_at(self, port):
        return next(n for n in self.nodes if n.port == port)

    def node_id(self, node):
        return node.cmd("CLUSTER", "MYID")

    def slot_map(self, node):
        """node's view: [(lo, hi, primary port, sorted replica ports)]."""
        return sorted((e[0], e[1], e[2][1], tuple(sorted(r[1] for r in e[3:])))
                      for e in node.cmd("CLUSTER", "SLOTS"))

    def wait_consistent(self, primaries=None, replicas=None, timeout=20):
        """Every live node: cluster_state ok, the same slot map covering
        all slots (served by `primaries` primaries with `replicas` replicas
        each, when given), its replicas in sync."""
        def agreed():
            maps = set()
            for n in self.live():
                if "cluster_state:ok" not in n.cmd("CLUSTER", "INFO"):
                    return False
                maps.add(tuple(self.slot_map(n)))
            if len(maps) != 1:
                return False
            m = maps.pop()
            owners = {e[2] for e in m}
            if sum(e[1] - e[0] + 1 for e in m) != 16384 or \
                    (primaries and len(owners) != primaries) or \
                    (replicas is not None and any(len(e[3]) != replicas for e in m)):
                return False
            for n in self.live():
                if n.port not in owners and \
                        n.info("replication").get("master_link_status") != "up":
                    return False
            return True
        wait_until(agreed, timeout, step=0.1, what="the cluster nodes to agree")

    def keyslot(self, key):
        return int(self.live()[0].cmd("CLUSTER", "KEYSLOT", key))

    def owner(self, slot):
        for lo, hi, port, _ in self.slot_map(self.live()[0]):
            if lo <= slot <= hi:
                return self.node_at(port)
        return None

    def primaries(self):
        return sorted({self.node_at(e[2]) for e in self.slot_map(self.live()[0])},
                      key=lambda n: n.port)

    def replica_of(self, primary):
        ports = [r for e in self.slot_map(self.live()[0]) if e[2] == primary.port for r in e[3]]
        return self.node_at(ports[0]) if ports else None

    # -- commands that follow the cluster's redirections

    def execute(self, *args):
        """Runs args on the node serving its key, starting anywhere and
        following MOVED and ASK; retries TRYAGAIN, CLUSTERDOWN and a dead
        node (up to 5 s)."""
        redis = self.nodes[0]._redis
        node, asking = self.live()[0], False
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if asking:
                    pipe = node.client().pipeline(transaction=False)
                    pipe.execute_command("ASKING")
                    pipe.execute_command(*args)
                    return pipe.execute()[1]
                return node.cmd(*args)
            except redis.ResponseError as e:
                word, _, rest = str(e).partition(" ")
                if word not in self.redirects:
                    raise
                self.redirects[word] += 1
                asking = word == "ASK"
                if word in ("MOVED", "ASK"):
                    node = self.node_at(int(rest.split(" ")[1].rsplit(":", 1)[1]))
                else:
                    time.sleep(0.05)
            except redis.ConnectionError:
                node, asking = self.live()[0], False
                time.sleep(0.05)
        raise AssertionError("%r: no answer within 5 s" % (args,))

    def get(self, key):
        return self.execute("GET", key)

    def set(self, key, value):
        return self.execute("SET", key, value)

    # -- changing the cluster

    def reshard(self, src, dst, nslots, timeout=60):
        """redis-cli --cluster reshard: src's nslots lowest slots and their
        keys to dst. Returns the slots moved, once every node agrees."""
        before = {s: e[2] for e in self.slot_map(src) for s in range(e[0], e[1] + 1)}
        p = subprocess.run(["redis-cli", "--cluster", "reshard", src.addr,
                            "--cluster-from", self.node_id(src), "--cluster-to", self.node_id(dst),
                            "--cluster-slots", str(nslots), "--cluster-yes"],
                           capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        self.wait_consistent()
        after = {s: e[2] for e in self.slot_map(src) for s in range(e[0], e[1] + 1)}
        return sorted(s for s in after if after[s] != before.get(s))

    def move_slot(self, slot, dst):
        """Moves one slot and its keys to dst by hand; SETSLOT NODE goes to
        the primaries (a replica refuses it). Nothing when dst has it."""
        src = self.owner(slot)
        if src is dst:
            return
        sid, did = self.node_id(src), self.node_id(dst)
        dst.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", sid)
        src.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", did)
        while True:
            keys = src.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.cmd("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
        for n in self.live():
            if n.role() == "master":
                n.cmd("CLUSTER", "SETSLOT", slot, "NODE", did)
        self.wait_consistent()

    def fail_over(self, primary, timeout=20):
        """CLUSTER FAILOVER FORCE on primary's replica; returns the replica,
        the primary of primary's slots once every live node agrees."""
        rep = self.replica_of(primary)
        assert rep is not None, "no replica of %r" % primary
        rep.cmd("CLUSTER", "FAILOVER", "FORCE")
        wait_until(lambda: rep.role() == "master", timeout, step=0.05,
                   what="the replica to be promoted")
        self.wait_consistent(timeout=timeout)
        return rep

    def kill_primary(self, primary, timeout=20):
        """SIGKILL to primary; returns its replica once the cluster elected
        it and every live node agrees."""
        rep = self.replica_of(primary)
        primary.kill()
        wait_until(lambda: rep.role() == "master", timeout, step=0.05,
                   what="the replica to be elected")
        self.wait_consistent(timeout=timeout)
        return rep

    def stop(self):
        _stop_nodes(self.nodes)
