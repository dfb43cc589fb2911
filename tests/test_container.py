"""test_container.py: the service inside a container's CPU limit
(docs/performance.md, "Inside a CPU quota").

A real cgroup CPU quota, made here (root): a group of its own under this
machine's cgroup v1 cpu hierarchy (or v2's, where that is what is
mounted) with a quota, the service started inside it. Where no group can
be made, the tests say why and are skipped, never passed."""
import json
import os
import re
import subprocess
import time

import harness
from test_overload import metrics


def _cpu_hierarchy():
    """(directory where a child group can be made, 'v1' or 'v2'), or None
    with why."""
    if os.geteuid() != 0:
        return None, "needs root (a cgroup of its own)"
    if os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        return ("/sys/fs/cgroup/cpu", "v1"), None
    if "cpu" in open("/sys/fs/cgroup/cgroup.controllers").read().split() \
            if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else False:
        return ("/sys/fs/cgroup", "v2"), None
    return None, "no cgroup cpu controller mounted here"


class CpuGroup:
    """A cgroup with a CPU quota of `cpus`, removed by close()."""

    def __init__(self, cpus):
        where, why = _cpu_hierarchy()
        if why:
            raise harness.Skip(why)
        base, self.version = where
        self.dir = os.path.join(base, "fs-test-%d-%d" % (os.getpid(), time.monotonic_ns()))
        os.mkdir(self.dir)
        period = 100000
        if self.version == "v1":
            with open(os.path.join(self.dir, "cpu.cfs_period_us"), "w") as f:
                f.write(str(period))
            with open(os.path.join(self.dir, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(int(cpus * period)))
        else:
            with open(os.path.join(self.dir, "cpu.max"), "w") as f:
                f.write("%d %d" % (int(cpus * period), period))

    def enter(self):
        """A preexec function: the child moves itself into the group."""
        procs = os.path.join(self.dir, "cgroup.procs")

        def move():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        return move

    def close(self):
        for _ in range(50):                   # empty once its processes are reaped
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


class InGroup:
    """What harness.Service takes as its host: runs it inside a CpuGroup,
    on 127.0.0.1."""

    def __init__(self, group):
        self.group = group
        self.addr = "127.0.0.1"

    def popen(self, argv, **kw):
        import subprocess
        p = subprocess.Popen(argv, preexec_fn=self.group.enter(), **kw)
        harness._live.append(p)
        return p


def service_in(ctx, redis, cpus, args=()):
    g = CpuGroup(cpus)
    ctx.on_cleanup(g.close)
    s = harness.Service(redis.url, ctx.path("orders.db"), args=list(args), log_dir=ctx.tmp,
                        host=InGroup(g), port=harness.free_port())
    ctx.on_cleanup(lambda: s.proc.poll() is None and s.kill())
    ctx.services.append(s)
    return s, g


def cpu_line(s):
    """The start's line on CPUs (logged once it listens)."""
    harness.wait_until(lambda: "CPUs it may use" in s.logs(), 10, what="the CPU line")
    return re.search(r"CPUs it may use: (.*)", s.logs()).group(1)


def test_threads_follow_the_cpu_quota(ctx):
    """Under a quota of half a core the service starts one HTTP thread, not
    one per CPU of the machine, and says where the quota came from; under
    1.5 cores, two (rounded up, at most the CPUs it may run on); --threads
    still decides when given. It sells as usual in the group."""
    r = ctx.redis()
    s, g = service_in(ctx, r, 0.5)
    line = cpu_line(s)
    print("    0.5 CPU: " + line)
    assert line.startswith("1 (CPU quota 0.50 in ") and g.dir in line, line
    assert "HTTP threads 1" in line and "(as set)" not in line, line
    assert "commit gap 1000 us" in line, line        # paced: CPU runs out first here
    assert " 1 HTTP threads" in s.logs()
    s.create_product("q-half", 50)
    assert s.order("q-half", "u1").status == 201
    s.kill()

    s2, _ = service_in(ctx, r, 1.5)
    line = cpu_line(s2)
    allowed = int(re.search(r"(\d+) CPUs allowed", line).group(1))
    assert line.startswith("%d (CPU quota 1.50" % min(2, allowed)), line
    s2.kill()

    s3, _ = service_in(ctx, r, 0.5, args=["--threads", "3"])
    line = cpu_line(s3)
    assert "HTTP threads 3 (as set)" in line and " 3 HTTP threads" in s3.logs(), line


def test_the_quotas_freezes_are_measured(ctx):
    """Under half a core, loaded past what it can do for 3 s: the kernel
    freezes the process for part of each period, and the service reads how
    long from the quota's own cpu.stat for its operator
    (flashsale_cpu_throttled_seconds_total: rate() over it is the share
    frozen), the same figure the kernel's file says. The verifier passes."""
    r = ctx.redis()
    s, g = service_in(ctx, r, 0.5)
    assert "commit gap 1000 us" in cpu_line(s)
    out = ctx.path("load.json")

    def frozen_s():
        return metrics(s)["flashsale_cpu_throttled_seconds_total"]

    def stat_s():
        with open(os.path.join(g.dir, "cpu.stat")) as f:
            m = re.search(r"^(throttled_time|throttled_usec) (\d+)", f.read(), re.M)
        return int(m.group(2)) / (1e9 if m.group(1) == "throttled_time" else 1e6)

    before = frozen_s()
    p = subprocess.run([os.path.join(harness.BIN, "flashload"),
                        "--target", "http://127.0.0.1:%d" % s.port, "--redis", r.url,
                        "--db", s.db_path, "--sku", "frozen", "--stock", "100000000",
                        "--connections", "256", "--duration", "3", "--users", "50000",
                        "--quiet", "--json", out],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr           # the verifier's PASS
    res = json.load(open(out))
    assert res["created"] > 0 and res["verdict"]["lost"] == 0, res["verdict"]
    after, kernel = frozen_s(), stat_s()
    print("    frozen %.2f s of the 3 s of load (the quota's cpu.stat: %.2f s in all)"
          % (after - before, kernel))
    # Closed loop past half a core: frozen a good part of most periods.
    assert after - before > 0.3, (before, after)
    # The kernel's own count, read after the scrape: at least as much.
    assert after <= kernel + 1e-6, (after, kernel)
