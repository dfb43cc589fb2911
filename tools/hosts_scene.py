#!/usr/bin/python3
"""hosts_scene.py: one scene of the "between hosts" group, for `flashload
compare --groups between-hosts` (which runs this once per scene).

    tools/hosts_scene.py --bin DIR --scene SCENE --out FILE [--strategy S]
                         [--seconds N]

SCENE is one of
    split-brain     the Redis split brain (tests/hosts.py split_brain):
                    --strategy sells (lua, or unsafe-trust-redis: its
                    unsafe twin, which trusts whatever copy it reaches)
    async-standby   PostgreSQL run by Patroni with synchronous_mode off: the
                    leader cut from its replica 2 s, then its host killed,
                    the replica promoted (hosts.patroni_kill): acknowledged
                    orders lost -- the unsafe twin of
    sync-standby    the same with synchronous_mode on: nothing lost
    leader-cut      Patroni's leader cut from etcd and its standby, demoted,
                    the standby promoted (hosts.patroni_cut): nothing lost
    switchover      a planned Patroni switchover, one instance through
                    HAProxy (hosts.patroni_switchover): a second or two

Each scene is a deployment of its own, made and removed here: one network
namespace per host (tests/hosts.py: Redis primary and replica, three
sentinels, two PostgreSQL nodes run by Patroni with etcd (tests/patroni.py),
HAProxy, three instances of DIR/flashsale, DIR/flashload on a host of its own), the fault cut in the router between
them while orders flow. Needs root. Progress goes to stderr.

FILE gets {"run": flashload's --json of the load (null: it did not
finish), "rc": its exit status, "fault": {"ok": whether the fault came as
the scene says, "why": what was missing}, "figures": {...}, "detail":
what was done and seen, in words}. Exits 0 when FILE was written, 2 on a
usage error or when the deployment could not be made (FILE then has
"error")."""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

SCENES = ("split-brain", "async-standby", "sync-standby", "leader-cut", "switchover")


class Scratch:
    """What World needs of a test's context: a temp dir, and what to stop
    when the scene ends (in reverse)."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="fs-hosts-")
        self._cleanup = []
        self.services = []
        self.last_service = None

    def path(self, name):
        return os.path.join(self.tmp, name)

    def on_cleanup(self, fn):
        self._cleanup.append(fn)

    def close(self):
        for fn in reversed(self._cleanup):
            try:
                fn()
            except Exception:  # noqa: BLE001 - the rest must stop too
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def say(msg):
    print("    hosts: " + msg, file=sys.stderr, flush=True)


# The deployment each scene runs on: World's standby, and whether app2
# reaches the database through HAProxy.
WORLDS = {"split-brain": (None, False), "async-standby": ("patroni-async", False),
          "sync-standby": ("patroni", False), "leader-cut": ("patroni", False),
          "switchover": ("patroni", True)}


def run(a, ctx):
    """Makes the deployment, runs the scene; the result dict."""
    import hosts
    standby, proxy = WORLDS[a.scene]
    t = time.monotonic()
    w = hosts.World(ctx, standby=standby, haproxy=proxy, via_proxy=(1,) if proxy else ())
    say("%d hosts up in %.1f s (Redis + 3 sentinels, PostgreSQL%s, 3 instances)"
        % (len(hosts.HOSTS), time.monotonic() - t,
           " run by Patroni%s" % (", synchronous_mode %s" % ("on" if standby == "patroni"
                                                             else "off"))
           if standby else ""))
    out = ctx.path("run.json")
    sku = "hosts-%s-%s-%x" % (a.scene, a.strategy, os.getpid() & 0xffff)
    fault = {"ok": True, "why": ""}
    rc, so, se, seen = -1, "", "", {}
    try:
        if a.scene == "split-brain":
            say("cutting redis1 + app1 from the rest while %s sells for %d s" % (a.strategy,
                                                                                a.seconds))
            rc, so, se, seen = hosts.split_brain(w, out, sku, a.strategy, seconds=a.seconds)
            if seen.get("old_commands", 0) <= 0:
                fault = {"ok": False, "why": "app1 ran nothing on the old primary: no split brain"}
        elif a.scene in ("async-standby", "sync-standby"):
            say("cutting the leader from its replica 2 s, then killing its host, while lua "
                "sells for %d s" % a.seconds)
            rc, so, se, seen = hosts.patroni_kill(w, out, sku, seconds=a.seconds, cut_first=2.0)
        elif a.scene == "leader-cut":
            say("cutting the leader from etcd and its standby while lua sells for %d s"
                % a.seconds)
            rc, so, se, seen = hosts.patroni_cut(w, out, sku, seconds=a.seconds)
            if seen.get("writable_after", 0) > 0:
                fault = {"ok": False, "why": "the old leader took writes %.1f s after its "
                                             "demotion" % seen["writable_after"]}
        else:
            say("a switchover while lua sells for %d s (app2 through HAProxy)" % a.seconds)
            rc, so, se, seen = hosts.patroni_switchover(w, out, sku, seconds=a.seconds)
    except AssertionError as e:
        fault = {"ok": False, "why": str(e)[:300]}
    try:
        j = json.load(open(out))
    except (OSError, ValueError):
        j = None
    if j is None and fault["ok"]:
        fault = {"ok": False, "why": "flashload wrote no result (rc %d): %s"
                                     % (rc, (se or so).strip()[-300:])}
    if a.scene == "split-brain" and "promoted" in seen:
        detail = ("redis2 promoted %.1f s after the cut; app1 ran %d commands on the old primary "
                  "in the next 4 s; the old primary a replica %.1f s after the cut"
                  % (seen["promoted"], seen.get("old_commands", 0), seen.get("healed", -1)))
    elif a.scene in ("async-standby", "sync-standby") and "promoted" in seen:
        detail = ("%s cut from its %s 2 s, then killed (SIGKILL of Patroni and PostgreSQL); "
                  "Patroni promoted the other %.1f s after the kill"
                  % (seen["leader"], "replica" if a.scene == "async-standby"
                     else "synchronous standby", seen["promoted"]))
    elif a.scene == "leader-cut" and "promoted" in seen:
        detail = ("%s cut from etcd and its standby: demoted %.1f s after the cut, the other "
                  "promoted after %.1f s, writable after its demotion %.1f s"
                  % (seen["leader"], seen["demoted"], seen["promoted"], seen["writable_after"]))
    elif a.scene == "switchover" and "switchover" in seen:
        detail = "switchover from %s in %.1f s" % (seen["leader"], seen["switchover"])
    else:
        detail = "the fault did not complete"
    if j is not None:
        detail += "; longest without a 201 %.0f ms" % (j.get("max_sale_gap_ms") or -1)
    return {"scene": a.scene, "strategy": a.strategy, "run": j, "rc": rc, "fault": fault,
            "figures": seen, "detail": detail}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--scene", required=True, choices=SCENES)
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="lua")
    p.add_argument("--seconds", type=int, default=14)
    a = p.parse_args()
    if a.scene != "split-brain" and a.strategy != "lua":
        p.error("the PostgreSQL scenes sell with lua")
    os.environ["FLASHSALE_BIN"] = os.path.abspath(a.bin)
    import harness
    import hosts
    why = hosts.Net.why_not()
    if why:
        json.dump({"error": why}, open(a.out, "w"))
        return 2
    ctx = Scratch()
    try:
        res = run(a, ctx)
    except Exception as e:  # noqa: BLE001 - said in FILE, whatever it was
        res = {"error": "the deployment could not be made: %s" % str(e)[:400]}
    finally:
        ctx.close()
        harness.stop_all()
    json.dump(res, open(a.out, "w"), indent=2)
    return 2 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
