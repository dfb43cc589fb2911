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
and the database, and the load generator, which judges the service, stands
alone on common/ so that no bug of the service can be shared by its judge.

    service  -> http, stock, lock, db, common
    stock    -> lock, db, common
    lock     -> common
    db       -> common
    http     -> common
    loadtest -> common
    common   -> (nothing)

A module's private header (internal.h, or any *_int.h, e.g. stock/internal.h,
lock/lock_int.h) is for that module's own files only.

Usage: tools/layering.py [ROOT]   ROOT: the source tree (default: this one)
Exit 0 when every include obeys; 1 with one line per offending include."""
import os
import re
import sys

ALLOWED = {
    "common": (),
    "http": ("common",),
    "db": ("common",),
    "lock": ("common",),
    "stock": ("lock", "db", "common"),
    "service": ("http", "stock", "lock", "db", "common"),
    "loadtest": ("common",),
}

# Both spellings: the compiler finds a project header by <db/db.h> too
# (through -I.), so the angle brackets must not be a way around the rules.
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


def private(header):
    """Whether a header is its module's private one."""
    name = os.path.basename(header)
    return name == "internal.h" or name.endswith("_int.h")


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
            target = inc.split("/")[0] if "/" in inc else module
            allowed = ALLOWED[module]
            if target == module:
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
                           (inc, target, target))
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
