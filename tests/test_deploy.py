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
PROGRAMS = ("flashsale", "flashload", "flashlock", "lockbench", "lockcheck", "mhdhello")


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


def variant():
    """The build variant whose programs the tests run (Makefile layout:
    bin/ for rel, build/<variant>/bin otherwise)."""
    b = os.path.realpath(harness.BIN)
    if b == os.path.realpath(os.path.join(ROOT, "bin")):
        return "rel"
    return os.path.basename(os.path.dirname(b))


def make_install(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    p = subprocess.run(["make", "-C", ROOT, "VARIANT=" + variant()] + list(args),
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_make_install_tree_runs(ctx):
    """make install DESTDIR=<tmp> lays out a tree whose flashsale serves."""
    dest = ctx.path("dest")
    make_install("install", "DESTDIR=" + dest, "PREFIX=/usr/local")
    usr = os.path.join(dest, "usr", "local")
    for prog, flag in (("flashsale", "listen"), ("flashload", "target"), ("flashlock", "wait")):
        exe = os.path.join(usr, "bin", prog)
        assert os.stat(exe).st_mode & 0o777 == 0o755, exe
        man = open(os.path.join(usr, "share", "man", "man1", prog + ".1")).read()
        assert ".SH NAME" in man and ".SH DESCRIPTION" in man, prog
        assert "\\-\\-" + flag in man, (prog, flag)      # its --help, as roff
        v = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
        assert v.returncode == 0 and v.stdout.startswith(prog + " "), v
    doc = os.path.join(usr, "share", "doc", "flashsale")
    assert open(os.path.join(doc, "openapi.yaml")).read() == \
        open(os.path.join(ROOT, "docs", "openapi.yaml")).read()
    for f in ("api.md", "metrics.md", "README.md", "flashsale.env.example"):
        assert os.path.getsize(os.path.join(doc, f)) > 0, f
    # The installed README's links lead to installed files.
    links = set(re.findall(r"\]\(([^)#:]+\.(?:md|yaml))(?:#[^)]*)?\)",
                           open(os.path.join(doc, "README.md")).read()))
    assert links, "no relative links in the README"
    for link in links:
        assert os.path.isfile(os.path.join(doc, link)), link
    # The Prometheus rules, installed beside their tests and example config,
    # still pass those tests there.
    rules = subprocess.run(
        ["promtool", "test", "rules", os.path.join(doc, "prometheus", "flashsale.rules_test.yml")],
        capture_output=True, text=True, timeout=120)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    unit = open(os.path.join(usr, "lib", "systemd", "system", "flashsale.service")).read()
    assert "\nExecStart=/usr/local/bin/flashsale\n" in unit, unit
    assert "\nEnvironmentFile=-/etc/flashsale/flashsale.env\n" in unit, unit
    for hardening in ("DynamicUser=yes", "StateDirectory=flashsale", "ProtectSystem=strict",
                      "PrivateTmp=yes", "NoNewPrivileges=yes", "Restart=on-failure"):
        assert "\n" + hardening + "\n" in unit, hardening
    envfile = os.path.join(dest, "etc", "flashsale", "flashsale.env")
    assert os.stat(envfile).st_mode & 0o777 == 0o600
    # A second install keeps an operator's edits to the environment file.
    with open(envfile, "a") as f:
        f.write("FLASHSALE_ADMIN_TOKEN=kept\n")
    assert "keeping" in make_install("install", "DESTDIR=" + dest)
    assert "FLASHSALE_ADMIN_TOKEN=kept" in open(envfile).read()

    # The installed service, configured as the unit would (its environment
    # file's variables), against a private Redis.
    redis = ctx.redis()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHSALE_")}
    env.update(FLASHSALE_LISTEN="127.0.0.1:%d" % port, FLASHSALE_REDIS=redis.url,
               FLASHSALE_DB=ctx.path("installed.db"))
    log = open(ctx.path("installed.log"), "w")
    p = subprocess.Popen([os.path.join(usr, "bin", "flashsale")], stdout=log, stderr=log, env=env)
    ctx.on_cleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
    c = Client(port, timeout=10)

    def healthy():
        assert p.poll() is None, open(ctx.path("installed.log")).read()
        try:
            return c.get("/healthz").status == 200
        except OSError:
            c.close()
            return False
    wait_until(healthy, 20, what="the installed flashsale to answer /healthz")
    assert c.get("/openapi.json").status == 200
    c.close()
    p.terminate()
    assert p.wait(30) == 0
    log.close()

    make_install("uninstall", "DESTDIR=" + dest)
    assert not os.path.exists(os.path.join(usr, "bin", "flashsale"))
    assert not os.path.exists(os.path.join(usr, "lib", "systemd", "system", "flashsale.service"))
    assert os.path.exists(envfile)


def test_systemd_unit_verifies(ctx):
    """systemd-analyze verify on the unit as installed: installed under a
    temp PREFIX (so ExecStart names a binary that exists) and with the man
    pages it installed on MANPATH (so Documentation=man:flashsale(1) is
    checked too)."""
    prefix = ctx.path("root/usr/local")
    make_install("install", "PREFIX=" + prefix, "SYSCONFDIR=" + ctx.path("root/etc"))
    unit = os.path.join(prefix, "lib", "systemd", "system", "flashsale.service")
    assert "\nExecStart=%s/bin/flashsale\n" % prefix in open(unit).read()
    env = dict(os.environ, MANPATH=os.path.join(prefix, "share", "man"))
    p = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), p.stdout + p.stderr
    # The unit as shipped names /usr/local/bin/flashsale, which verify
    # checks: refused where no such file exists, so the check is real.
    if not os.path.exists("/usr/local/bin/flashsale"):
        p = subprocess.run(["systemd-analyze", "verify",
                            os.path.join(ROOT, "deploy", "systemd", "flashsale.service")],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode != 0 and "/usr/local/bin/flashsale" in p.stderr, p.stderr
    s = subprocess.run(["systemd-analyze", "security", "--offline=yes", unit],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for flashsale.service: ([\d.]+) (\w+)", s.stdout)
    assert m, s.stdout[-2000:] + s.stderr
    print("    systemd-analyze security: exposure %s %s" % m.groups())
    assert float(m.group(1)) <= 2.0, s.stdout
