#!/usr/bin/python3
"""layering.py: the module boundaries of flashsale, checked on every build.

Each module directory may include its own headers and the public headers of
the modules this allow-list says it may use, and nothing else. `make` runs
this before compiling anything (and `make test` again, through
tests/test_build.py), so an include that breaks the layering fails the build
with a line naming the file, the include and the rule. The archives follow
the same arrows (the Makefile's LINK_<program> lines), so what may not be
included cannot be linked either.

The arrows point down: the service sits on everything, stock on the lock
and the database, the lock and stock on rtopo (where a Redis command goes
on one server, Sentinel or Cluster), and the load generator, which judges
the service, stands alone on common/ so that no bug of the service can be
shared by its judge: not even its Redis routing.

    service  -> http, stock, lock, rtopo, db, common
    stock    -> rtopo, lock, db, common
    lock     -> rtopo, common
    rtopo    -> common
    db       -> common
    http     -> common
    loadtest -> common
    common   -> (nothing)

A private header (internal.h, or any *_int.h, e.g. stock/internal.h,
lock/lock_int.h, service/order/order_int.h) is for the files of its own
folder only: a module's, or a part of a module's (service/order/).

The service's order path has one file per strategy family
(service/order/fam_<family>.c, its face fam_<family>.h) behind one
interface (service/order/family.h): a family may not include another
family's header, and only the pipeline (service/order/pipeline.c), which
holds the table of families, includes them all. (No two files of a folder
may call each other in a circle either: tools/calls.py checks that on the
objects.)

Usage: tools/layering.py [ROOT]   ROOT: the source tree (default: this one)
Exit 0 when every include obeys; 1 with one line per offending include."""
import os
import re
import sys

ALLOWED = {
    "common": (),
    "http": ("common",),
    "db": ("common",),
    "rtopo": ("common",),
    "lock": ("rtopo", "common"),
    "stock": ("rtopo", "lock", "db", "common"),
    "service": ("http", "stock", "lock", "rtopo", "db", "common"),
    "loadtest": ("common",),
}

# Both spellings: the compiler finds a project header by <db/db.h> too
# (through -I.), so the angle brackets must not be a way around the rules.
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


def private(header):
    """Whether a header is its folder's private one."""
    name = os.path.basename(header)
    return name == "internal.h" or name.endswith("_int.h")


FAMILY = re.compile(r"^fam_(\w+)\.[ch]$")
FAMILY_TABLE = "service/order/pipeline.c"


def family_offence(rel, inc):
    """Why rel may not include inc (a family's header), or None."""
    m = FAMILY.match(os.path.basename(inc))
    if not m or os.path.dirname(inc) != "service/order":
        return None
    if rel == FAMILY_TABLE:
        return None
    own = FAMILY.match(os.path.basename(rel))
    if own and os.path.dirname(rel) == "service/order":
        if own.group(1) == m.group(1):
            return None
        return ("a strategy family may not include another family's header (families "
                "meet only through service/order/family.h; tools/layering.py)")
    return ("only %s, which holds the table of families, includes a family's header "
            "(tools/layering.py)" % FAMILY_TABLE)


def check_file(root, module, rel):
    """The offences of one source file, as printable lines."""
    out = []
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1) or m.group(2)
            if m.group(2) is not None:
                # <...>: a system header, unless it names one of ours.
                if "/" not in inc or not os.path.exists(os.path.join(root, inc)):
                    continue
                where = '%s:%d: #include <%s>: ' % (rel, lineno, inc)
            else:
                where = '%s:%d: #include "%s": ' % (rel, lineno, inc)
            # "x.h" without a directory is found next to the including file.
            if "/" not in inc:
                inc = os.path.join(os.path.dirname(rel), inc)
            target = inc.split("/")[0]
            allowed = ALLOWED[module]
            if target == module:
                why = family_offence(rel, inc)
                if why:
                    out.append(where + why)
                elif private(inc) and os.path.dirname(inc) != os.path.dirname(rel):
                    out.append(where + "%s is private to %s/; only the files there may "
                               "include it" % (inc, os.path.dirname(inc)))
                continue
            if target not in ALLOWED:
                out.append(where + "%s is not a module; %s may include only %s" %
                           (target, module, ", ".join((module,) + allowed)))
            elif target not in allowed:
                out.append(where + "layering rule broken: %s -> %s is not an allowed arrow "
                           "(%s may include only %s; tools/layering.py)" %
                           (module, target, module, ", ".join((module,) + allowed)))
            elif private(inc):
                out.append(where + "%s is private to %s/; only %s's own files may include it" %
                           (inc, os.path.dirname(inc), os.path.dirname(inc)))
    return out


def check_tree(root):
    """Every offence under root, in file order."""
    out = []
    for module in sorted(ALLOWED):
        top = os.path.join(root, module)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith((".c", ".h")):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    out += check_file(root, module, rel)
    return out


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..")
    offences = check_tree(root)
    for line in offences:
        print(line, file=sys.stderr)
    if offences:
        print("layering: %d forbidden include%s (the allowed arrows are in tools/layering.py)" %
              (len(offences), "" if len(offences) == 1 else "s"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
