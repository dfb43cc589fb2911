"""test_build.py: the module boundaries the build enforces.

tools/layering.py refuses an include that breaks the modules' allowed
arrows (it runs before every compile); each module is its own archive and
each program links only the archives it may use. Checked here on the real
tree and binaries, and on a copy of the tree with a forbidden include put
in on purpose."""
import os
import re
import shutil
import subprocess

import harness

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LAYERING = os.path.join(ROOT, "tools", "layering.py")
MODULES = ("common", "rtopo", "http", "db", "lock", "stock", "service", "loadtest")


def not_archived():
    """The Makefile's NOT_ARCHIVED: sources built into no archive (an
    LD_PRELOAD shim), as paths from the root."""
    text = open(os.path.join(ROOT, "Makefile")).read()
    return set(re.search(r"^NOT_ARCHIVED\s*:=(.*)$", text, re.M).group(1).split())


def build_dir():
    """build/<variant> of the binaries under test ($FLASHSALE_BIN)."""
    b = os.path.abspath(harness.BIN)
    return os.path.join(ROOT, "build", "rel") if b == os.path.join(ROOT, "bin") else \
        os.path.dirname(b)


def symbols(program):
    """Names of every symbol of bin/<program>, defined or not."""
    out = subprocess.run(["nm", os.path.join(harness.BIN, program)], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def service_symbols(names, prefixes=("db_", "stock_", "lock_", "rtopo_")):
    return sorted(n for n in names if n.startswith(prefixes))


def test_flashload_carries_no_service_code(ctx):
    # The check can see them: the service does carry its modules.
    assert len(service_symbols(symbols("flashsale"), ("db_",))) > 10
    assert len(service_symbols(symbols("flashsale"), ("stock_",))) > 10
    for prog in ("flashload", "mhdhello"):
        assert service_symbols(symbols(prog)) == [], prog
    # flashlock is the lock module on common/: no stock or database code.
    assert service_symbols(symbols("flashlock"), ("db_", "stock_")) == []
    assert service_symbols(symbols("flashlock"), ("lock_",)) != []


def test_one_archive_per_module_with_its_own_scripts(ctx):
    members = {}
    for m in MODULES:
        out = subprocess.run(["ar", "t", os.path.join(build_dir(), "lib%s.a" % m)],
                             capture_output=True, text=True, check=True).stdout.split()
        assert len(out) == len(set(out)), (m, out)        # no two members of one name
        members[m] = out
    assert "client.o" in members["lock"] and "client.o" in members["loadtest"]
    # Each archive carries its own Lua scripts and no other module's.
    lua = {m: [o for o in objs if o.startswith("lua_")] for m, objs in members.items()}
    want = {m: ["lua_%s.o" % m] if os.path.isdir(os.path.join(ROOT, m, "lua")) else []
            for m in MODULES}
    assert lua == want, lua
    assert want["stock"] and want["lock"] and not want["loadtest"], want
    # Each archive holds exactly its module's C files (programs and the
    # Makefile's NOT_ARCHIVED aside), and the generated objects the module
    # owns (the Makefile's GEN_<module>).
    generated = {"common": ["version.o"], "service": ["openapi.o"]}
    alone = not_archived()
    assert alone == {"loadtest/clockjump.c"}, alone
    for m in MODULES:
        sources = [os.path.relpath(os.path.join(d, f), ROOT)
                   for d, _, files in os.walk(os.path.join(ROOT, m)) for f in files]
        want = sorted([os.path.basename(f)[:-2] + ".o" for f in sources
                       if f.endswith(".c") and not f.endswith("_main.c") and f not in alone]
                      + generated.get(m, []))
        assert sorted(o for o in members[m] if not o.startswith("lua_")) == want, (m, members[m])


def copy_tree(dst):
    """The modules' sources, as layering.py reads them."""
    for m in MODULES:
        shutil.copytree(os.path.join(ROOT, m), os.path.join(dst, m),
                        ignore=shutil.ignore_patterns("*.lua", "*.md", "*.py", "*.mk"))


def layering(root):
    p = subprocess.run(["/usr/bin/python3", LAYERING, root], capture_output=True, text=True)
    return p.returncode, p.stderr


def insert_include(path, include):
    """Adds an #include after the file's first one."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r'(#include "[^"]+"\n)', r'\1#include "%s"\n' % include, text, count=1)
    with open(path, "w") as f:
        f.write(text)


def test_layering_rejects_forbidden_includes(ctx):
    assert layering(ROOT) == (0, "")
    tree = ctx.path("tree")
    copy_tree(tree)
    assert layering(tree) == (0, "")

    # The judge may not lean on the service's database code...
    insert_include(os.path.join(tree, "loadtest", "run.c"), "db/db.h")
    rc, err = layering(tree)
    assert rc == 1, err
    line = err.splitlines()[0]
    assert re.match(r'loadtest/run\.c:\d+: #include "db/db\.h": layering rule broken: '
                    r'loadtest -> db is not an allowed arrow \(loadtest may include only '
                    r'loadtest, common; tools/layering\.py\)$', line), err
    assert err.splitlines()[-1] == \
        "layering: 1 forbidden include (the allowed arrows are in tools/layering.py)", err

    # ...a lower layer may not reach up...
    insert_include(os.path.join(tree, "lock", "lock.c"), "stock/stock.h")
    # ...and a private header stays inside its module, even along an allowed arrow.
    insert_include(os.path.join(tree, "service", "api", "api.c"), "stock/internal.h")
    insert_include(os.path.join(tree, "stock", "stock.c"), "lock/lock_int.h")
    rc, err = layering(tree)
    assert rc == 1, err
    assert "lock -> stock is not an allowed arrow" in err, err
    assert re.search(r'service/api/api\.c:\d+: #include "stock/internal\.h": stock/internal\.h is '
                     r'private to stock/', err), err
    assert re.search(r'stock/stock\.c:\d+: #include "lock/lock_int\.h": lock/lock_int\.h is '
                     r'private to lock/', err), err
    assert "4 forbidden includes" in err, err

    # Angle brackets are no way around it: -I. finds <db/db.h> in the tree.
    tree3 = ctx.path("tree3")
    copy_tree(tree3)
    with open(os.path.join(tree3, "loadtest", "verify", "verify.c")) as f:
        text = f.read()
    with open(os.path.join(tree3, "loadtest", "verify", "verify.c"), "w") as f:
        f.write("#include <stdio.h>\n#include <db/db.h>\n" + text)
    rc, err = layering(tree3)
    assert rc == 1, err
    assert re.match(r'loadtest/verify/verify\.c:2: #include <db/db\.h>: layering rule broken: '
                    r'loadtest -> db is not an allowed arrow', err), err
    assert "1 forbidden include" in err, err

    # What a module may use is fine: service on stock's public header.
    tree2 = ctx.path("tree2")
    copy_tree(tree2)
    insert_include(os.path.join(tree2, "service", "api", "api.c"), "stock/stock.h")
    assert layering(tree2) == (0, "")


def test_families_and_folder_private_headers(ctx):
    """The order path's families meet only through their interface, and a
    folder's private header stays in its folder."""
    tree = ctx.path("tree")
    copy_tree(tree)
    order = os.path.join(tree, "service", "order")
    # A family reaching into another family...
    insert_include(os.path.join(order, "fam_script.c"), "service/order/fam_lock.h")
    # ...the rest of the service naming a family...
    insert_include(os.path.join(tree, "service", "lifecycle.c"), "service/order/fam_db.h")
    # ...and a folder's private header used from another folder of the module.
    insert_include(os.path.join(tree, "service", "api", "api.c"), "service/order/order_int.h")
    rc, err = layering(tree)
    assert rc == 1, err
    assert re.search(r'service/order/fam_script\.c:\d+: #include "service/order/fam_lock\.h": '
                     r'a strategy family may not include another family\'s header', err), err
    assert re.search(r'service/lifecycle\.c:\d+: #include "service/order/fam_db\.h": only '
                     r'service/order/pipeline\.c, which holds the table of families', err), err
    assert re.search(r'service/api/api\.c:\d+: #include "service/order/order_int\.h": '
                     r'service/order/order_int\.h is private to service/order/', err), err
    assert "3 forbidden includes" in err, err
    # The table and a family's own header are fine, in either spelling.
    tree2 = ctx.path("tree2")
    copy_tree(tree2)
    insert_include(os.path.join(tree2, "service", "order", "fam_db.c"), "fam_db.h")
    insert_include(os.path.join(tree2, "service", "order", "commit.c"), "order_int.h")
    assert layering(tree2) == (0, "")


def test_rtopo_layering(ctx):
    """rtopo (Redis topologies) sits on common/ under the lock, stock and
    the service; the load generator may not use it (the judge shares no
    Redis routing with what it judges), nor may rtopo reach up."""
    tree = ctx.path("tree")
    copy_tree(tree)
    for user in (("lock", "lock.c"), ("stock", "stock.c"), ("service", "api", "api.c")):
        insert_include(os.path.join(tree, *user), "rtopo/rtopo.h")
    assert layering(tree) == (0, "")
    insert_include(os.path.join(tree, "loadtest", "run.c"), "rtopo/rtopo.h")
    insert_include(os.path.join(tree, "rtopo", "url.c"), "lock/lock.h")
    insert_include(os.path.join(tree, "lock", "lock.c"), "rtopo/internal.h")
    rc, err = layering(tree)
    assert rc == 1, err
    assert re.search(r'loadtest/run\.c:\d+: #include "rtopo/rtopo\.h": layering rule broken: '
                     r'loadtest -> rtopo is not an allowed arrow', err), err
    assert re.search(r'rtopo/url\.c:\d+: #include "lock/lock\.h": layering rule broken: '
                     r'rtopo -> lock is not an allowed arrow \(rtopo may include only rtopo, '
                     r'common', err), err
    assert "rtopo/internal.h is private to rtopo/" in err, err
    assert "3 forbidden includes" in err, err


CALLS = os.path.join(ROOT, "tools", "calls.py")


def calls_except():
    """The Makefile's CALLS_EXCEPT: the folders whose circle is known and
    being taken apart, which `make test` does not check yet."""
    text = open(os.path.join(ROOT, "Makefile")).read()
    return re.search(r"^CALLS_EXCEPT\s*:=(.*)$", text, re.M).group(1).split()


def calls(build, *args, env=None):
    return subprocess.run(["/usr/bin/python3", CALLS, build] + list(args), capture_output=True,
                          text=True, env=env)


def test_no_folder_calls_itself_in_a_circle(ctx):
    """tools/calls.py on the real objects: no circle in any folder of any
    module but those the Makefile excepts (CALLS_EXCEPT); on a tree made to
    have circles, it finds each by default, in any module (stock/, not only
    service/), leaves out an excepted folder and what is under it, and
    counts a call through a table of function pointers (an interface) as
    none."""
    build = build_dir()
    skip = [a for f in calls_except() for a in ("--except", f)]
    p = calls(build, *skip)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    # It sees the folders of every module: their objects are where it looks.
    for obj in (("service", "order", "pipeline.o"), ("stock", "spread.o"), ("db", "writer.o"),
                ("loadtest", "compare", "compare.o"), ("lock", "lock.o"), ("rtopo", "cluster.o"),
                ("http", "http.o"), ("common", "loop.o")):
        assert os.path.exists(os.path.join(build, *obj)), obj
    # A synthetic tree: in stock/ and service/x/, a.c and b.c call each
    # other; in stock/, c.c only registers d's function in a table that e.c
    # reads; lock/ and lock/y/ have circles of their own; an object whose
    # source is gone (stock/gone.o) and one of a generated source (gen/)
    # are not the tree's.
    pair = {
        "a.c": "void b_fn(void); void a_fn(void) { b_fn(); }\n",
        "b.c": "void a_fn(void); void b_fn(void) { a_fn(); }\n",
    }
    table = {
        "c.c": "void c_fn(void) {}\n",
        "d.c": "void c_fn(void); void (*const d_table[])(void) = { c_fn };\n"
               "void d_fn(void) {}\n",
        "e.c": "extern void (*const d_table[])(void); void d_fn(void);\n"
               "void e_fn(void) { d_fn(); }\n",
    }
    root = ctx.path("calls")
    for where, src in ((("stock",), dict(pair, **table)), (("service", "x"), pair),
                       (("lock",), pair), (("lock", "y"), pair), (("gen",), pair)):
        folder = os.path.join(root, *where)
        os.makedirs(folder)
        for name, text in src.items():
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(text)
            subprocess.run(["cc", "-c", "-o", path[:-2] + ".o", path], check=True)
    os.remove(os.path.join(root, "gen", "a.c"))
    os.remove(os.path.join(root, "gen", "b.c"))
    shutil.copy(os.path.join(root, "stock", "a.o"), os.path.join(root, "stock", "gone.o"))
    env = dict(os.environ, FLASHSALE_CALLS_ROOT=root)

    def circle(folder):
        return "%s/: a.c, b.c call each other in a circle (tools/calls.py)" % folder

    p = calls(root, env=env)
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines() == [circle("lock"), circle("lock/y"), circle("service/x"),
                                     circle("stock")], p.stderr
    p = calls(root, "--except", "lock", env=env)
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines() == [circle("service/x"), circle("stock")], p.stderr
    p = calls(root, "--except", "lock", "--except", "service", "--except", "stock", env=env)
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
    p = calls(root, "stock", env=env)
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines() == [circle("stock")], p.stderr
    p = calls(root, "--no-such-option", env=env)
    assert p.returncode == 2, p.stderr
