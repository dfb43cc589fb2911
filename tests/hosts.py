"""hosts.py: a small network of hosts on this machine, for the faults that
happen between machines (docs/operations.md, "Running flashsale on many
hosts").

Net() makes one network namespace per host and one for a router between
them; each host has one veth link to the router, its own address
(10.N.i.2 on link i) and a route to the run's 10.N.0.0/16 through the
router, and no other route: nothing it sends can leave the namespaces
this run made. The test process itself (the observer: it creates
products, reads the databases, checks) reaches the hosts over a link of
its own (10.N.0.2), which is never cut.

A partition is cut in the router, where the packets pass: a policy rule
per direction (`ip rule add blackhole from A to B`) drops what A sends B
silently, as a broken network does -- no error comes back, a connection
waits for its timeouts. cut() checks that it cut: a TCP connection from
one side to a port listening on the other must not get through
(`assert_cut`), so a rule that cut nothing fails the test.

A process runs on a host by entering its namespace between fork and exec
(setns(2) in a preexec function), so the PID the test holds is the
process's own and is what it stops. Needs root (`ip netns`); `Net.why_not()`
says why not when the tests cannot run here.
"""
import ctypes
import ipaddress
import os
import random
import socket
import subprocess
import time

import harness

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _ip(*args, ns=None, check=True):
    cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


def _ip_batch(lines, ns=None, check=True):
    """Runs ip commands (each a list of words, without "ip") in one ip
    process, in namespace ns: a host's setup is some ten commands, and a
    process each cost a Net 2 s. check=False: every line is tried
    (-force), whatever failed."""
    cmd = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if not check else []) + \
        ["-batch", "-"]
    r = subprocess.run(cmd, input="".join(" ".join(w) + "\n" for w in lines),
                       capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


CLONE_NEWUTS = 0x04000000


def _enter(ns, hostname):
    """A preexec function: the child joins network namespace ns, and gets
    a UTS namespace of its own named hostname -- two instances on two hosts
    must not share a host name, which names an instance (its pending
    records, and whether a record is its own previous run's)."""
    path = "/run/netns/" + ns
    name = hostname.encode()

    def enter():
        fd = os.open(path, os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns " + path)
        finally:
            os.close(fd)
        if _libc.unshare(CLONE_NEWUTS) != 0 or _libc.sethostname(name, len(name)) != 0:
            raise OSError(ctypes.get_errno(), "unshare/sethostname " + hostname)
    return enter


class Host:
    """One host of a Net: its namespace and its address."""

    def __init__(self, net, name, index):
        self.net = net
        self.name = name
        self.ns = "%s-%s" % (net.tag, name)
        self.addr = str(net.base + (index << 8) + 2)

    def preexec(self, then=None):
        """A preexec function that enters this host, then runs then()."""
        enter = _enter(self.ns, self.ns)

        def both():
            enter()
            if then:
                then()
        return both

    def popen(self, argv, **kw):
        """Starts argv on this host (stopped at exit like every process of
        the harness)."""
        p = subprocess.Popen(argv, preexec_fn=self.preexec(kw.pop("preexec_fn", None)), **kw)
        harness._live.append(p)
        return p

    def run(self, argv, timeout=60, **kw):
        """Runs argv on this host to the end; its CompletedProcess."""
        return subprocess.run(argv, preexec_fn=self.preexec(), capture_output=True, text=True,
                              timeout=timeout, **kw)

    def can_connect(self, addr, port, timeout=1.0):
        """Whether a TCP connection from this host to addr:port gets
        through within timeout."""
        return self.connect_probe(addr, port, timeout)()

    def connect_probe(self, addr, port, timeout=1.0):
        """Starts a TCP connection from this host to addr:port; returns a
        function that waits for it and says whether it got through within
        timeout (so that several can be under way at once)."""
        p = subprocess.Popen(["timeout", "%.1f" % timeout, "bash", "-c",
                              "exec 3<>/dev/tcp/%s/%d" % (addr, port)],
                             preexec_fn=self.preexec(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)

        def got_through():
            try:
                return p.wait(timeout + 10) == 0
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise
        return got_through

    def __repr__(self):
        return "<host %s %s>" % (self.name, self.addr)


class Net:
    """Hosts named by names, joined by a router; see the module's text."""

    @staticmethod
    def why_not():
        """Why hosts cannot be made here (None: they can)."""
        if os.geteuid() != 0:
            return "needs root (network namespaces): run as root, as CI does"
        if subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
            return "needs iproute2's ip (tools/deps.sh installs it)"
        return None

    def __init__(self, names):
        why = Net.why_not()
        if why:
            raise AssertionError(why)
        self.tag = "fs%x" % random.Random(os.getpid() ^ time.time_ns()).randrange(1 << 20)
        self.base = self._free_net()
        self.router = self.tag + "-r"
        self.hosts = {}
        self.links = []                   # router-side link names, to delete
        self.cuts = {}                    # (a, b) -> rule preference
        self._pref = 1000
        self._made = []                   # namespaces made, to delete
        self._observer_link = None
        try:
            for i, name in enumerate(names, start=1):
                self.hosts[name] = Host(self, name, i)
            self._make([None] + [self.hosts[name] for name in names])   # None: the observer
            _ip("netns", "exec", self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name):
        return self.hosts[name]

    def _free_net(self):
        """A 10.N.0.0/16 that no route of this machine's overlaps."""
        routes = _ip("-4", "route", "show", "table", "all").stdout.split("\n")
        taken = []
        for line in routes:
            word = line.split(" ", 1)[0]
            if word and word[0].isdigit():
                try:
                    taken.append(ipaddress.ip_network(word, strict=False))
                except ValueError:
                    pass
        rng = random.Random(os.getpid() ^ time.time_ns())
        for _ in range(100):
            net = ipaddress.ip_network("10.%d.0.0/16" % rng.randrange(100, 250))
            if not any(net.overlaps(t) for t in taken):
                return net.network_address
        raise AssertionError("no free 10.N.0.0/16 for the hosts")

    def _make(self, hosts):
        """The router's namespace and each host's, and link i for hosts[i]
        (None: the observer's, in our own namespace): the router's end
        10.N.i.1, the host's 10.N.i.2, a route to 10.N.0.0/16 through the
        router. One ip process per namespace (_ip_batch)."""
        here, router = [], [["link", "set", "lo", "up"]]
        for ns in [self.router] + [h.ns for h in hosts if h]:
            here.append(["netns", "add", ns])
            self._made.append(ns)
        ends = []
        for i, host in enumerate(hosts):
            r_end, h_end = "%sr%d" % (self.tag, i), "%sh%d" % (self.tag, i)
            ends.append(h_end)
            here.append(["link", "add", r_end, "type", "veth", "peer", "name", h_end])
            self.links.append(r_end)
            here.append(["link", "set", r_end, "netns", self.router])
            if host:
                here.append(["link", "set", h_end, "netns", host.ns])
            else:
                self._observer_link = h_end
            router.append(["addr", "add", "%s/24" % (self.base + (i << 8) + 1), "dev", r_end])
            router.append(["link", "set", r_end, "up"])
        _ip_batch(here)
        _ip_batch(router, ns=self.router)
        for i, (host, h_end) in enumerate(zip(hosts, ends)):
            _ip_batch(([["link", "set", "lo", "up"]] if host else []) + [
                ["addr", "add", "%s/24" % (self.base + (i << 8) + 2), "dev", h_end],
                ["link", "set", h_end, "up"],
                ["route", "add", "%s/16" % self.base, "via", str(self.base + (i << 8) + 1)]],
                ns=host.ns if host else None)

    # ------------------------------------------------------------ partitions

    def cut(self, a, b, port=None, check=True):
        """Cuts host a from host b, both ways. port: one that listens on
        b, to check that a can no longer reach it (and the other way round
        when b's listener is a's: pass check=False to skip)."""
        for x, y in ((a, b), (b, a)):
            if (x.name, y.name) in self.cuts:
                continue
            self._pref += 1
            _ip("rule", "add", "blackhole", "from", x.addr, "to", y.addr, "pref",
                str(self._pref), ns=self.router)
            self.cuts[(x.name, y.name)] = self._pref
        if check and port:
            self.assert_cut(a, b, port)

    def heal(self, a=None, b=None):
        """Heals the cut between a and b (both ways), or every cut."""
        for key in list(self.cuts):
            if a is None or set(key) == {a.name, b.name}:
                _ip("rule", "del", "pref", str(self.cuts.pop(key)), ns=self.router)

    def assert_cut(self, a, b, port):
        self.assert_cuts([(a, b, port)])

    def assert_cuts(self, checks):
        """Fails unless, for each (a, b, port) of checks, a TCP connection
        from a to b's port gets nowhere within 1 s. The checks run at once:
        each waits out its timeout (a blackhole answers nothing), and four
        in a row held a fault's next step 4 s."""
        probes = [a.connect_probe(b.addr, port, timeout=1.0) for a, b, port in checks]
        reached = [probe() for probe in probes]
        for (a, b, port), r in zip(checks, reached):
            if r:
                raise AssertionError("%s still reaches %s:%d after the cut" % (a, b, port))

    def close(self):
        """Deletes what was made (processes on the hosts are the caller's
        to stop first: a namespace lives on while a process is in it)."""
        if self.links:
            _ip_batch([["link", "del", r_end] for r_end in self.links], ns=self.router,
                      check=False)
        if self._observer_link:
            _ip("link", "del", self._observer_link, check=False)
        if self._made:
            _ip_batch([["netns", "del", ns] for ns in reversed(self._made)], check=False)
        self._made = []
        self.links = []


def listening(addr, port, timeout=20):
    """Waits until addr:port accepts connections (from the observer)."""
    def up():
        try:
            with socket.create_connection((addr, port), timeout=0.5):
                return True
        except OSError:
            return False
    harness.wait_until(up, timeout, step=0.05, what="%s:%d to listen" % (addr, port))


# --------------------------------------------------------------- a deployment

TOKEN = "hosts-t0ken"       # the instances listen on addresses other hosts reach
HOSTS = ("redis1", "redis2", "sent1", "sent2", "sent3", "pg1", "pg2", "app1", "app2", "app3",
         "load", "dcs", "proxy")


class World:
    """The deployment the tests fault, each part on a host of its own:

        redis1, redis2     the Redis primary and its replica
        sent1..sent3       three sentinels (quorum 2, down-after 1 s)
        pg1, pg2           the PostgreSQL primary and, when asked, a
                           standby (standby "sync": synchronous; "async")
                           -- or, standby "patroni" / "patroni-async", a
                           Patroni node on each (tests/patroni.py), with
        dcs                etcd, Patroni's store, and
        proxy              HAProxy routing to Patroni's leader (haproxy=True)
        app1..app3         flashsale instances (`apps` of them)
        load               where flashload runs

    The instances reach the stock through the sentinels and the orders
    through a multi-host URL naming pg1 then pg2 (target_session_attrs=
    read-write: whichever is the primary); those whose index is in
    via_proxy (0: app1) through HAProxy instead."""

    def __init__(self, ctx, apps=3, standby=None, service_args=(), redis_opts=(), haproxy=False,
                 via_proxy=()):
        self.ctx = ctx
        self.net = Net(HOSTS)
        ctx.on_cleanup(self.net.close)           # after every process (cleanups run in reverse)
        self.redis = []
        self.sentinels = []
        self.apps = []
        self.pg_standby = None
        import topology
        n = self.net
        self.redis.append(self._node(topology.Node(list(redis_opts), host=n["redis1"])))
        self.redis.append(self._node(topology.Node(
            ["replicaof %s 6379" % n["redis1"].addr] + list(redis_opts), host=n["redis2"])))
        harness.wait_until(lambda: self.redis[1].info("replication").get("master_link_status")
                           == "up", 10, what="the replica to sync")
        for name in ("sent1", "sent2", "sent3"):
            self.sentinels.append(self._node(topology.Node([
                "sentinel monitor mymaster %s 6379 2" % n["redis1"].addr,
                "sentinel down-after-milliseconds mymaster 1000",
                "sentinel failover-timeout mymaster 10000"], sentinel=True, host=n[name])))
        # The sentinels find each other by their hello messages (every 2 s)
        # while the database starts; they are waited for before the
        # instances, which need them.
        self.patroni = self.proxy = None
        if standby and standby.startswith("patroni"):
            import patroni
            self.patroni = patroni.Patroni(n["dcs"], [("pg1", n["pg1"]), ("pg2", n["pg2"])],
                                           sync=standby == "patroni",
                                           max_lag=1 << 40 if standby != "patroni" else 1048576)
            ctx.on_cleanup(self.patroni.stop)
            self.pg = None
            harness.wait_until(self._patroni_db, 30, step=0.2,
                               what="the database on every Patroni node")
            if haproxy:
                self.proxy = patroni.HAProxy(n["proxy"], self.patroni)
                ctx.on_cleanup(self.proxy.stop)
        else:
            self.pg = pgserver_postgres(host=n["pg1"])
            ctx.on_cleanup(self.pg.stop)
        if standby and not self.patroni:
            self.pg_standby = pgserver_postgres(host=n["pg2"], standby_of=self.pg, name="pg2")
            ctx.on_cleanup(self.pg_standby.stop)
            if standby == "sync":
                self.pg.set_sync("pg2")
                harness.wait_until(lambda: self.pg.replicating().get("pg2", ("", ""))[1] ==
                                   "sync", 20, what="pg2 to be a synchronous standby")
        if self.pg:
            self.pg.psql("CREATE DATABASE flashsale")
        harness.wait_until(self._sentinels_know, 20, step=0.1,
                           what="the sentinels to know each other and the replica")
        self.db_url = "postgresql://postgres@%s:5432,%s:5432/flashsale?target_session_attrs=" \
                      "read-write" % (n["pg1"].addr, n["pg2"].addr)
        self.redis_url = "redis-sentinel://%s/mymaster" % ",".join(s.addr for s in self.sentinels)
        for i in range(apps):
            url = self.proxy.db_url("flashsale") if i in via_proxy else self.db_url
            self.apps.append(ctx_service(ctx, self.redis_url, url,
                                         host=n["app%d" % (i + 1)],
                                         args=["--admin-token", TOKEN] + list(service_args)))

    def _patroni_db(self):
        """Creates the database on the leader: whether every node has it now.
        A replica must have replayed it too: libpq does not try the next
        host of a URL after a server's "database does not exist", so an
        instance that meets such a replica first cannot start."""
        leader = self.patroni.leader()
        if not leader:
            return False
        has = [n.psql("SELECT 1 FROM pg_database WHERE datname = 'flashsale'") == [["1"]]
               for n in self.patroni.nodes]
        if all(has):
            return True
        if not has[self.patroni.nodes.index(leader)]:
            leader.psql("CREATE DATABASE flashsale")
        return False

    def _node(self, node):
        self.ctx.on_cleanup(node.stop)
        return node

    def _sentinels_know(self):
        for s in self.sentinels:
            if len(s.cmd("SENTINEL", "SENTINELS", "mymaster")) != 2:
                return False
            reps = s.cmd("SENTINEL", "REPLICAS", "mymaster")
            if len(reps) != 1 or "s_down" in str(reps):
                return False
        return True

    def primary_addr(self):
        """The Redis primary every live sentinel names, or None."""
        seen = set()
        for s in self.sentinels:
            try:
                seen.add(tuple(s.cmd("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")))
            except Exception:  # noqa: BLE001 - a sentinel we cannot reach does not vote here
                pass
        return seen.pop()[0] if len(seen) == 1 else None

    def flashload_bg(self, *args, json_path=None):
        """flashload started on the load host (as flashload() runs it);
        returns (Popen, json path). finish() waits for it."""
        argv = self._flashload_argv(args)
        if json_path:
            argv += ["--json", json_path]
        p = self.net["load"].popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        return p

    @staticmethod
    def finish(p, timeout=180):
        so, se = p.communicate(timeout=timeout)
        return p.returncode, so, se

    def _flashload_argv(self, args):
        argv = [os.path.join(harness.BIN, "flashload")]
        for a in self.apps:
            argv += ["--target", "http://%s:%d" % (a.ip, a.port)]
        return argv + ["--redis", self.redis_url, "--db", self.db_url, "--admin-token",
                       TOKEN] + [str(a) for a in args]

    def flashload(self, *args, timeout=180):
        """bin/flashload on the load host against every instance, the
        verifier reading the sentinels and the database itself."""
        r = self.net["load"].run(self._flashload_argv(args), timeout=timeout)
        return r.returncode, r.stdout, r.stderr


def pgserver_postgres(**kw):
    import pgserver
    return pgserver.Postgres(**kw)


def ctx_service(ctx, redis_url, db_url, host, args=()):
    s = harness.Service(redis_url, db_url, log_dir=ctx.tmp, host=host, args=args)
    ctx.on_cleanup(lambda: s.proc.poll() is None and s.kill())
    ctx.last_service = s
    ctx.services.append(s)
    return s


# ------------------------------------------------------------ the scenes
# Shared by tests/test_hosts.py and tools/hosts_scene.py (which `flashload
# compare --groups between-hosts` runs, one scene per call).

LOAD = ("--stock", 1000000, "--connections", 24, "--users", 2000, "--quantity", "1-2",
        "--timeout", 30)


def load_under_fault(w, out, sku, strategy, fault, seconds=10, fault_at=2.0, load=LOAD):
    """flashload on the load host for `seconds` on sku while fault(w) runs
    `fault_at` s in (on this thread; it heals what it cut before it
    returns). The run's JSON goes to out. Returns (rc, stdout, stderr);
    what fault(w) raised is raised once the load has ended."""
    p = w.flashload_bg("--sku", sku, "--strategy", strategy, "--duration", seconds, *load,
                       json_path=out)
    try:
        time.sleep(fault_at)
        fault(w)
    finally:
        rc, so, se = w.finish(p)
    return rc, so, se


def commands_run(node):
    """How many commands the node has run, but the observer's own (INFO,
    ROLE, PING) and replication's: what clients asked of it."""
    stats = node.info("commandstats")
    ours = ("cmdstat_info", "cmdstat_role", "cmdstat_ping", "cmdstat_replconf", "cmdstat_psync")
    return sum(v["calls"] for k, v in stats.items() if k not in ours)


def split_brain(w, out, sku, strategy, seconds=14):
    """The split brain in which Jepsen saw Redis lose acknowledged writes:
    the Redis primary (redis1) is cut from the sentinels, the replica and
    every instance but app1, which is cut from the rest instead; the
    sentinels promote redis2 and app2, app3 sell from it while app1 goes on
    selling from the old primary for 4 s (the buyers reach every instance). Then the network heals and the
    old primary is made a replica (its writes since the cut thrown away).

    Returns (rc, stdout, stderr, seen): seen has promoted (s from the cut),
    old_commands (what app1 ran on the old primary meanwhile: more than 0,
    or there was no split brain) and healed (s from the cut to the old
    primary a replica). Raises AssertionError when a cut did not cut or
    the sentinels did not promote."""
    n = w.net
    minority = [n["redis1"], n["app1"]]
    majority = [n[h] for h in ("redis2", "sent1", "sent2", "sent3", "app2", "app3")]
    seen = {}

    def fault(w):
        t = time.monotonic()
        for a in minority:
            for b in majority:
                n.cut(a, b, check=False)
        # The buyers (the load host) still reach every instance, app1 too,
        # as buyers on the internet would; only the old primary is out of
        # their verifier's reach.
        n.cut(n["load"], n["redis1"], check=False)
        n.assert_cuts([(n[a], n[b], port) for a, b, port in (
            ("app1", "redis2", 6379), ("app1", "sent1", 26379), ("app2", "redis1", 6379),
            ("load", "redis1", 6379))])
        harness.wait_until(lambda: w.primary_addr() == n["redis2"].addr, 20, step=0.1,
                           what="the sentinels to promote redis2")
        seen["promoted"] = time.monotonic() - t
        # app1 still reaches the old primary, which still takes writes: the
        # split brain, seen as app1's commands still run there.
        assert w.redis[0].role() == "master", "the old primary is no longer a primary"
        before = commands_run(w.redis[0])
        time.sleep(4)                      # both sides sell
        seen["old_commands"] = commands_run(w.redis[0]) - before
        n.heal()
        harness.wait_until(lambda: w.redis[0].role() == "slave", 30, step=0.1,
                           what="the old primary to be made a replica")
        seen["healed"] = time.monotonic() - t
    rc, so, se = load_under_fault(w, out, sku, strategy, fault, seconds=seconds)
    return rc, so, se, seen


# --------------------------------------------- PostgreSQL run by Patroni
# w made with standby "patroni" (synchronous_mode) or "patroni-async".

def _new_leader(w, old, timeout=60):
    """Waits until Patroni names a running leader other than old; the
    seconds it took."""
    t = time.monotonic()
    harness.wait_until(lambda: (w.patroni.leader() or old) is not old, timeout, step=0.1,
                       what="Patroni to elect a leader other than %s" % old.name)
    return time.monotonic() - t


def patroni_kill(w, out, sku, seconds=16, cut_first=0.0, strategy="lua"):
    """Under load: the leader's host killed (SIGKILL of Patroni, of its
    PostgreSQL and every backend), after cut_first s cut from its replica
    (0: no cut; with synchronous_mode the cut stops every COMMIT, without
    it the replica falls behind what the leader acknowledges). Patroni
    promotes the replica once the dead leader's key expires (ttl). The
    killed node stays down. Returns (rc, stdout, stderr, seen): seen has
    leader (the killed node's name), promoted (s from the kill to another
    leader running)."""
    n = w.net
    seen = {}

    def fault(w):
        old = w.patroni.leader()
        other = next(x for x in w.patroni.nodes if x is not old)
        seen["leader"] = old.name
        if cut_first:
            n.cut(old.host, other.host, port=5432)
            time.sleep(cut_first)
        old.kill()
        seen["promoted"] = _new_leader(w, old)
        n.heal()
    rc, so, se = load_under_fault(w, out, sku, strategy, fault, seconds=seconds)
    return rc, so, se, seen


def patroni_cut(w, out, sku, seconds=18, strategy="lua"):
    """Under load: the leader cut from etcd and from its replica; the
    instances (and the observer) still reach it. Its Patroni cannot renew
    the leader key and, retry_timeout later, demotes it: Patroni 3.0 stops
    its PostgreSQL and keeps it down while etcd is out of reach. The
    replica is promoted once the key expires (ttl). Meanwhile a COMMIT on
    the old leader waits for its synchronous standby in vain: the instances
    cancel it and answer 503 (it committed there, and is revoked on the new
    leader). Then the network heals and the old leader rejoins. Returns
    (rc, stdout, stderr, seen): seen has leader, demoted (s from the cut to
    the old leader no longer taking writes: down, or read-only), promoted
    (s to another leader), writable_after (s the old leader was seen
    taking writes again before the heal, polled every 100 ms: 0)."""
    n = w.net
    seen = {}

    def writable(node):
        return node.in_recovery() is False      # None: it does not answer

    def fault(w):
        old = w.patroni.leader()
        other = next(x for x in w.patroni.nodes if x is not old)
        seen["leader"] = old.name
        t = time.monotonic()
        n.cut(old.host, n["dcs"], port=2379, check=False)
        n.cut(old.host, other.host, port=5432)
        n.assert_cut(old.host, n["dcs"], 2379)
        harness.wait_until(lambda: not writable(old), 30, step=0.1,
                           what="Patroni to demote %s" % old.name)
        seen["demoted"] = time.monotonic() - t
        seen["writable_after"] = 0.0
        promoted = None
        # Until the other is promoted (within twice the ttl, whatever the
        # load's length), and at least to 4 s before the load ends.
        limit = 2 * w.patroni.ttl + 10
        while (promoted is None and time.monotonic() - t < limit) or \
                time.monotonic() - t < seconds - 4:
            if writable(old):
                seen["writable_after"] += 0.1
            if promoted is None and (w.patroni.leader() or old) is not old:
                promoted = seen["promoted"] = time.monotonic() - t
            time.sleep(0.1)
        if promoted is None:
            raise AssertionError("Patroni did not promote %s within %.0f s" % (other.name,
                                                                              limit))
        n.heal()
    rc, so, se = load_under_fault(w, out, sku, strategy, fault, seconds=seconds)
    return rc, so, se, seen


def patroni_switchover(w, out, sku, seconds=8, strategy="lua"):
    """Under load: a planned switchover (Patroni's REST API, as
    `patronictl switchover` calls it) from the leader to its synchronous
    standby. Returns (rc, stdout, stderr, seen): seen has leader (the old),
    switchover (s the call took)."""
    seen = {}

    def fault(w):
        old = w.patroni.leader()
        other = next(x for x in w.patroni.nodes if x is not old)
        seen["leader"] = old.name
        t = time.monotonic()
        w.patroni.switchover(other)
        seen["switchover"] = time.monotonic() - t
    rc, so, se = load_under_fault(w, out, sku, strategy, fault, seconds=seconds)
    return rc, so, se, seen
