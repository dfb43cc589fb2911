#!/usr/bin/python3
"""bench_patroni.py: what a Patroni failover costs a sale, measured (make
bench-patroni; docs/operations.md, "Patroni decides the failover"). Needs root (network namespaces).

One deployment of tests/hosts.py (Redis primary, replica and 3 sentinels;
two PostgreSQL nodes run by Patroni 3.0 with etcd, synchronous_mode on,
ttl 10 s, loop_wait 2 s, retry_timeout 3 s; HAProxy; three instances, app2
through HAProxy, the others by the libpq multi-host URL; flashload on a
host of its own), and on it, round after round, each verified by
flashload:

  switchover  a planned switchover mid-sale (Patroni's REST API, as
              patronictl calls it): the longest time without a 201
  kill        the leader's host killed (SIGKILL of Patroni, PostgreSQL and
              its backends): the seconds to a new leader, the longest time
              without a 201; then the node started again, and the cluster
              waited for (its rejoin, by pg_rewind)
  cut         the leader cut from etcd and from its standby (the instances
              still reach it): the seconds to its demotion and to the new
              leader, whether it was seen taking writes after its demotion,
              the longest time without a 201; then healed and waited for

Prints each run, then medians and maxima, and its goals with met /
NOT met: switchover <= 2 s without a 201; the leader's host killed <= ttl
+ 2 s; the cut leader never writable after its demotion; 0 lost and 0
oversold in every run.

Usage: bench_patroni.py BIN [--rounds N] [--scenes switchover,kill,cut]"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--scenes", default="switchover,kill,cut")
    o = ap.parse_args()
    os.environ["FLASHSALE_BIN"] = os.path.abspath(o.bin)
    import harness
    import hosts
    import hosts_scene
    import patroni
    why = hosts.Net.why_not()
    if why:
        print("bench_patroni: " + why, file=sys.stderr)
        return 2
    scenes = o.scenes.split(",")
    ctx = hosts_scene.Scratch()
    res = {s: [] for s in scenes}
    try:
        w = hosts.World(ctx, standby="patroni", haproxy=True, via_proxy=(1,))
        print("cluster up in %.1f s" % w.patroni.bootstrap_s, file=sys.stderr, flush=True)
        for rnd in range(o.rounds):
            for scene in scenes:
                w.patroni.wait_healthy(120)
                out = ctx.path("%s-%d.json" % (scene, rnd))
                sku = "b-%s-%d" % (scene, rnd)
                if scene == "switchover":
                    rc, so, se, seen = hosts.patroni_switchover(w, out, sku)
                elif scene == "kill":
                    rc, so, se, seen = hosts.patroni_kill(w, out, sku)
                    dead = w.patroni.node(seen["leader"])
                    t = time.monotonic()
                    dead.start()
                    w.patroni.wait_healthy(120)
                    seen["rejoined"] = time.monotonic() - t
                else:
                    rc, so, se, seen = hosts.patroni_cut(w, out, sku)
                    t = time.monotonic()
                    w.patroni.wait_healthy(120)
                    seen["rejoined"] = time.monotonic() - t
                j = json.load(open(out))
                v = j["verdict"]
                seen.update(gap_ms=j["max_sale_gap_ms"] or 0, pass_=v["pass"] and rc == 0,
                            lost=v["lost"], oversold=v["oversold"], created=j["created"])
                res[scene].append(seen)
                print("round %2d %-10s %s" % (rnd + 1, scene, json.dumps(
                    {k: round(x, 2) if isinstance(x, float) else x for k, x in seen.items()})),
                    flush=True)
    finally:
        ctx.close()
        harness.stop_all()

    def fig(rows, k):
        xs = [r[k] for r in rows if k in r]
        return (statistics.median(xs), max(xs)) if xs else (float("nan"), float("nan"))
    print("\nmedian / max over %d rounds:" % o.rounds)
    for s, rows in res.items():
        keys = [k for k in ("gap_ms", "switchover", "promoted", "demoted", "writable_after",
                            "rejoined") if any(k in r for r in rows)]
        print("  %-10s %s; PASS %d of %d" % (s, ", ".join(
            "%s %.2f / %.2f" % ((k,) + fig(rows, k)) for k in keys),
            sum(r["pass_"] for r in rows), len(rows)))
    print("\ngoals (a Patroni failover):")
    goals = []
    if res.get("switchover"):
        goals.append(("switchover: most time without a 201 (s)",
                      max(r["gap_ms"] for r in res["switchover"]) / 1000, 2.0))
    if res.get("kill"):
        goals.append(("leader killed: most time without a 201 (s)",
                      max(r["gap_ms"] for r in res["kill"]) / 1000, patroni.TTL + 2.0))
    if res.get("cut"):
        goals.append(("cut leader: seconds writable after demotion",
                      max(r["writable_after"] for r in res["cut"]), 0.0))
    for name, v, want in goals:
        print("  %-46s %6.2f  (<= %.1f) %s" % (name, v, want, "met" if v <= want else "NOT met"))
    bad = sum(1 for rows in res.values() for r in rows
              if not r["pass_"] or r["lost"] or r["oversold"])
    print("  %-46s %6d  (0)     %s" % ("runs with a loss, an oversell or no PASS", bad,
                                       "met" if not bad else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
