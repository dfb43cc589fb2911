"""pgserver.py: throwaway PostgreSQL servers for the tests (harness.Postgres).

Each is a real `postgres` of Debian's postgresql package: a copy of a
cluster fresh from initdb (one per process, _fresh_cluster) in a temp dir,
a free port on 127.0.0.1 and a socket dir of its own, trust
authentication, started as the `postgres` user when the tests run as root
(initdb and postgres refuse root), stopped by the postmaster's PID. About a
second to start here.
"""
import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import harness


def pg_bin():
    """The newest PostgreSQL's bin directory (Debian keeps each version's
    under /usr/lib/postgresql/<version>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise AssertionError("no PostgreSQL server installed (tools/deps.sh installs postgresql)")
    return os.path.dirname(found[-1])


def _as_postgres():
    """A preexec_fn that drops to the postgres user when we are root."""
    if os.getuid() != 0:
        return None
    pw = pwd.getpwnam("postgres")

    def drop():
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    return drop


_FRESH = []         # the data directory _fresh_cluster made, once made


def _fresh_cluster(bin_dir):
    """The data directory of a cluster fresh from initdb, made at this
    process's first call and copied by every server after: the suite
    starts some 25 servers, and initdb took 1.9 s here where a copy takes
    0.6 s. What a server gets is the same but for the cluster's system
    identifier, which the copies share (only replication between clusters
    that are not copies of one another would look at it). Removed at
    exit."""
    if not _FRESH:
        d = tempfile.mkdtemp(prefix="fs-pg-fresh-")
        atexit.register(shutil.rmtree, d, True)
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(d, pw.pw_uid, pw.pw_gid)
        data = os.path.join(d, "data")
        r = subprocess.run([os.path.join(bin_dir, "initdb"), "-D", data, "-U", "postgres",
                            "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "-N"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_as_postgres(), cwd=d, timeout=120)
        if r.returncode != 0:
            raise AssertionError("initdb: %s" % r.stderr[-2000:])
        _FRESH.append(data)
    return _FRESH[0]


class Postgres:
    """A private PostgreSQL server. settings: extra `-c name=value`s.

    host: a hosts.Host to run on (listening on its address, port 5432),
    reachable by every host of the run (pg_hba trusts 10.0.0.0/8, for
    connections and replication); None: 127.0.0.1 and a free port.
    standby_of: a Postgres to copy (pg_basebackup from it, over the
    network) and follow as a streaming standby named `name`; make it
    synchronous with primary.set_sync(name)."""

    def __init__(self, settings=None, port=None, host=None, standby_of=None, name="standby"):
        self.bin = pg_bin()
        self.host = host
        self.ip = host.addr if host else "127.0.0.1"
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="fs-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = port or (5432 if host else harness.free_port())
        self.settings = dict(settings or {})
        self.proc = None
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        if standby_of:
            self._as_user([os.path.join(self.bin, "pg_basebackup"), "-h", standby_of.ip, "-p",
                           str(standby_of.port), "-U", "postgres", "-D", self.data, "-c", "fast",
                           "-X", "stream"])
            with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
                f.write("primary_conninfo = 'host=%s port=%d user=postgres application_name=%s'\n"
                        % (standby_of.ip, standby_of.port, name))
            open(os.path.join(self.data, "standby.signal"), "w").close()
            if os.getuid() == 0:
                pw = pwd.getpwnam("postgres")
                for f in ("postgresql.auto.conf", "standby.signal"):
                    os.chown(os.path.join(self.data, f), pw.pw_uid, pw.pw_gid)
        else:
            self._as_user(["cp", "-a", _fresh_cluster(self.bin), self.data])
            if host:
                with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
                    f.write("host all all 10.0.0.0/8 trust\n"
                            "host replication all 10.0.0.0/8 trust\n")
        self.start()

    def _as_user(self, argv):
        """Runs argv as the postgres user (on this server's host)."""
        drop = _as_postgres()
        pre = self.host.preexec(drop) if self.host else drop
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=pre, cwd=self.dir, timeout=120)
        if r.returncode != 0:
            raise AssertionError("%s: %s" % (os.path.basename(argv[0]), r.stderr[-2000:]))

    def start(self):
        args = [os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port),
                "-k", self.dir, "-c", "listen_addresses=%s" % self.ip, "-c",
                "max_connections=200", "-c", "logging_collector=off"]
        for k, v in self.settings.items():
            args += ["-c", "%s=%s" % (k, v)]
        self.log = open(os.path.join(self.dir, "postgres.log"), "a")
        if self.host:
            self.proc = self.host.popen(args, stdout=self.log, stderr=self.log,
                                        preexec_fn=_as_postgres(), cwd=self.dir)
        else:
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log,
                                         preexec_fn=_as_postgres(), cwd=self.dir)
            harness._live.append(self.proc)
        harness.wait_until(self._ready, 30, step=0.05, what="postgres to accept connections")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("postgres exited with %s:\n%s" % (self.proc.returncode,
                                                                   self.logs()[-3000:]))
        r = subprocess.run(["psql", "-h", self.ip, "-p", str(self.port), "-U", "postgres",
                            "-d", "postgres", "-Atc", "SELECT 1"], capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() == "1"

    def set_sync(self, names):
        """Makes the standbys named (application_name) synchronous: a
        COMMIT returns once one of them has it (synchronous_commit on)."""
        self.psql("ALTER SYSTEM SET synchronous_standby_names = '%s'" % names)
        self.psql("SELECT pg_reload_conf()")

    def promote(self):
        """A standby becomes a primary (pg_promote waits until it is)."""
        assert self.psql("SELECT pg_promote(true, 30)") == [["t"]]

    def replicating(self):
        """{application_name: (state, sync_state)} of its standbys."""
        return {r[0]: (r[1], r[2]) for r in
                self.psql("SELECT application_name, state, sync_state FROM pg_stat_replication")}

    def logs(self):
        try:
            with open(os.path.join(self.dir, "postgres.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def url(self, dbname="postgres"):
        return "postgresql://postgres@%s:%d/%s" % (self.ip, self.port, dbname)

    def psql(self, sql, dbname="postgres"):
        """Runs sql with psql; returns its rows as lists of strings."""
        r = subprocess.run(["psql", "-h", self.ip, "-p", str(self.port), "-U", "postgres",
                            "-d", dbname, "-v", "ON_ERROR_STOP=1", "-AtF", "\t", "-c", sql],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError("psql %r: %s" % (sql, r.stderr))
        return [line.split("\t") for line in r.stdout.splitlines() if line != ""]

    def database(self, name):
        """A new empty database; its URL."""
        self.psql('CREATE DATABASE "%s"' % name)
        return self.url(name)

    def kill(self):
        """SIGKILL of the postmaster: a crash (its backends go with it)."""
        self.proc.kill()
        self.proc.wait()

    def restart(self, mode="fast"):
        """Stops (fast: SIGINT; immediate: SIGQUIT; kill: SIGKILL) and starts
        again on the same port with the same data."""
        if self.proc.poll() is None:
            if mode == "kill":
                self.kill()
            else:
                os.kill(self.proc.pid, signal.SIGINT if mode == "fast" else signal.SIGQUIT)
                self.proc.wait(30)
        # A postmaster killed with SIGKILL leaves its backends to notice; the
        # new one waits until the old shared memory is free.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.start()
                return
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            os.kill(self.proc.pid, signal.SIGINT)          # fast shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)



class PgBouncer:
    """A real PgBouncer (Debian's pgbouncer, 1.18 here) in front of pg, on
    127.0.0.1 and a free port: every database of pg by its own name (the
    `*` fallback), trust auth for the postgres user, pool_mode `mode`
    (session, transaction or statement) and pool_size server connections
    per database. Run as the postgres user (it refuses root), in the
    foreground, stopped by its PID."""

    def __init__(self, pg, mode="transaction", pool_size=20, max_client_conn=2000):
        self.pg = pg
        self.mode = mode
        self.port = harness.free_port()
        self.dir = tempfile.mkdtemp(prefix="fs-pgb-")
        self.ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(self.ini, "w") as f:
            f.write("[databases]\n* = host=%s port=%d\n[pgbouncer]\n"
                    "listen_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\n"
                    "auth_type = trust\nauth_file = %s/users.txt\npool_mode = %s\n"
                    "default_pool_size = %d\nmax_client_conn = %d\nlogfile = %s/pgbouncer.log\n"
                    "admin_users = postgres\n"
                    % (pg.ip, pg.port, self.port, self.dir, mode, pool_size, max_client_conn,
                       self.dir))
        if os.getuid() == 0:
            pw = pwd.getpwnam("postgres")
            for p in [self.dir] + [os.path.join(self.dir, n) for n in os.listdir(self.dir)]:
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self.proc = subprocess.Popen(["pgbouncer", self.ini], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_as_postgres(),
                                     cwd=self.dir)
        harness._live.append(self.proc)
        harness.wait_until(self._ready, 20, step=0.05, what="pgbouncer to accept connections")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("pgbouncer exited with %s:\n%s" % (self.proc.returncode,
                                                                    self.logs()[-3000:]))
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                            "-d", "postgres", "-Atc", "SELECT 1"], capture_output=True, text=True)
        return r.returncode == 0

    def url(self, dbname="postgres"):
        return "postgresql://postgres@127.0.0.1:%d/%s" % (self.port, dbname)

    def show(self, what):
        """SHOW <what> on the admin console: its rows as dicts."""
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                            "-d", "pgbouncer", "-AF", "\t", "-c", "SHOW %s" % what],
                           capture_output=True, text=True, timeout=30)
        lines = [l for l in r.stdout.splitlines() if l and not l.startswith("(")]
        if not lines:
            return []
        head = lines[0].split("\t")
        return [dict(zip(head, l.split("\t"))) for l in lines[1:]]

    def logs(self):
        try:
            with open(os.path.join(self.dir, "pgbouncer.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
