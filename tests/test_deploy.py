"""test_deploy.py: what an operator meets before the first order: --version
on every program, the refusal to serve open admin endpoints on a network
address, `make install` into a temp tree, the installed service answering
/healthz, and the systemd unit passing `systemd-analyze verify`."""
import os
import re
import subprocess

import harness
from harness import Client, free_port, wait_until

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PROGRAMS = ("flashsale", "flashload", "flashlock", "lockbench", "mhdhello")


def source_version():
    return subprocess.run([os.path.join(ROOT, "tools", "version.sh")], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_version_on_every_program(ctx):
    want = source_version()
    assert want and want != "unknown", want
    for prog in PROGRAMS:
        p = subprocess.run([os.path.join(harness.BIN, prog), "--version"], capture_output=True,
                           text=True, timeout=10)
        assert p.returncode == 0, (prog, p.stderr)
        # The build's stamp; a build older than the last edit may lack -dirty.
        assert re.fullmatch(r"%s [0-9A-Za-z._-]+\n" % prog, p.stdout), (prog, p.stdout)
        assert p.stdout.split()[1].replace("-dirty", "") == want.replace("-dirty", ""), \
            (prog, p.stdout, want)


def test_version_falls_back_to_the_version_file(ctx):
    """A tarball has no .git: the VERSION file says the version."""
    tree = ctx.path("tarball")
    os.makedirs(os.path.join(tree, "tools"))
    for f in ("tools/version.sh", "VERSION"):
        with open(os.path.join(ROOT, f)) as src, open(os.path.join(tree, f), "w") as dst:
            dst.write(src.read())
    os.chmod(os.path.join(tree, "tools", "version.sh"), 0o755)
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=ctx.tmp)
    out = subprocess.run([os.path.join(tree, "tools", "version.sh")], capture_output=True,
                         text=True, env=env, check=True).stdout.strip()
    assert out == open(os.path.join(ROOT, "VERSION")).read().strip(), out
    gen = os.path.join(tree, "v.c")
    subprocess.run([os.path.join(tree, "tools", "version.sh"), "--c", gen], env=env, check=True)
    assert 'const char flashsale_version[] = "%s";' % out in open(gen).read()


def start(ctx, args, env=None, serves=False):
    """Runs flashsale; returns (exit code, stderr) once it exits, or with
    serves=True the process, left running."""
    redis = ctx.redis()
    cmd = [os.path.join(harness.BIN, "flashsale"), "--redis", redis.url,
           "--db", ctx.path("o.db")] + args
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSALE_")}
    full_env.update(env or {})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=full_env)
    if serves:
        ctx.on_cleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        return None, p
    out, err = p.communicate(timeout=30)
    return p.returncode, err


def test_open_admin_on_a_network_address_is_refused(ctx):
    """Nothing here binds a non-loopback address: the check comes before
    anything is opened, so the allowed cases stop at a bad --strategy,
    which is checked right after it."""
    for listen in ("0.0.0.0:8080", ":8080", "[::]:8080", "192.0.2.1:8080"):
        rc, err = start(ctx, ["--listen", listen])
        assert rc == 2, (listen, rc)
        assert "--admin-token" in err and "--insecure-admin" in err and "loopback" in err, err
        assert len(err.splitlines()) <= 5, err          # a message, not the help
    for args, env in ((["--admin-token", "t"], None),
                      (["--insecure-admin"], None),
                      ([], {"FLASHSALE_INSECURE_ADMIN": "1"}),
                      ([], {"FLASHSALE_ADMIN_TOKEN": "t"})):
        rc, err = start(ctx, ["--listen", "0.0.0.0:8080", "--strategy", "nope"] + args, env)
        assert rc == 2 and "--strategy" in err and "loopback" not in err, (args, env, rc, err)
    # Loopback addresses without a token serve.
    for host in ("localhost", "127.0.0.2"):
        port = free_port()
        _, p = start(ctx, ["--listen", "%s:%d" % (host, port)], serves=True)
        ip = "127.0.0.1" if host == "localhost" else host
        wait_until(lambda: p.poll() is None and _healthz(ip, port), 10,
                   what="flashsale on %s to answer" % host)
        p.terminate()
        assert p.wait(30) == 0
        p.stdout.close()
        p.stderr.close()


def _healthz(host, port):
    """GET /healthz on host (the Client speaks to 127.0.0.1 only)."""
    import http.client
    try:
        c = http.client.HTTPConnection(host, port, timeout=2)
        c.request("GET", "/healthz")
        return c.getresponse().status == 200
    except OSError:
        return False
