#!/usr/bin/python3
"""calls.py: no two files of one folder call each other in a circle.

The files of one folder of a module (stock/, db/, service/order/, ...)
are read as layers: a file may call the functions of the files below it,
never of one that (through others) calls it back. A circle of calls means
no file of it can be read, tested or changed alone -- which is what the
order path was before its families got one interface.

Read off the compiled objects, not the sources: `nm` says which functions
each object defines (T) and which it needs (U). File A calls file B when A
needs a function B defines. A callback handed over as data (a family's
vtable, a function pointer registered with a loop) is a data reference, not
a call, so an interface table does not make a circle -- that is the point
of having one.

Usage: tools/calls.py BUILD_DIR [--except FOLDER]... [FOLDER...]
  BUILD_DIR: build/<variant> (objects mirror the source tree under it)
  FOLDER:    source folders to check (default: every folder under BUILD_DIR
             with objects of sources that exist -- each module's: common/,
             rtopo/, db/, stock/, lock/, http/, loadtest/, service/ and
             their folders -- and tests/unit/, whose programs link alone)
  --except:  a folder not to check, nor any folder under it: one whose
             circle is known and being taken apart (the Makefile's
             CALLS_EXCEPT says which, and why)
Exit 0 when no folder has a circle; 1 with one line per circle found."""
import os
import subprocess
import sys

# The source tree (whose files say which objects are current); a test may
# point it elsewhere.
ROOT = os.environ.get("FLASHSALE_CALLS_ROOT",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def symbols(obj):
    """(defined functions, needed symbols) of one object file."""
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, needed = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            needed.add(parts[1])
    return defined, needed


def call_graph(objs):
    """{file: set of files it calls} among the objects of one folder."""
    syms = {o: symbols(o) for o in objs}
    graph = {}
    for a, (_, needed) in syms.items():
        graph[a] = {b for b, (defined, _) in syms.items() if b != a and needed & defined}
    return graph


def circles(graph):
    """The strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def objects(build, folder):
    """The objects of folder whose sources exist (a removed file's object
    may linger; a generated source, build/<variant>/gen/, is no folder of
    the tree), programs' mains aside."""
    d = os.path.join(build, folder)
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.endswith(".o") and not f.endswith("_main.o") and
                  os.path.exists(os.path.join(ROOT, folder, f[:-2] + ".c")))


def folders(build):
    """Every folder under build that has objects of sources that exist."""
    found = []
    for dirpath, _, _ in os.walk(build):
        folder = os.path.relpath(dirpath, build)
        if folder != "." and objects(build, folder):
            found.append(folder)
    return sorted(found)


def under(folder, top):
    """Whether folder is top or a folder under it."""
    return folder == top or folder.startswith(top + "/")


def check(build, wanted):
    offences = []
    for folder in wanted:
        for comp in circles(call_graph(objects(build, folder))):
            names = [os.path.basename(o)[:-2] + ".c" for o in comp]
            offences.append("%s/: %s call each other in a circle (tools/calls.py)" %
                            (folder, ", ".join(names)))
    return offences


def main(argv):
    build, args = (argv[1], argv[2:]) if len(argv) > 1 else (None, [])
    named, skip = [], []
    while build and args:
        a = args.pop(0)
        if a == "--except" and args:
            skip.append(args.pop(0).strip("/"))
        elif a.startswith("-"):
            build = None                      # not an option of ours
        else:
            named.append(a.strip("/"))
    if not build:
        print(__doc__, file=sys.stderr)
        return 2
    wanted = [f for f in named or folders(build) if not any(under(f, s) for s in skip)]
    offences = check(build, wanted)
    for line in offences:
        print(line, file=sys.stderr)
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
