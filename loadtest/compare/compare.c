/* compare.c: `flashload compare`: the same load against every stock
 * strategy, so the safe ones can be seen to hold and the unsafe ones to
 * oversell, side by side.
 *
 * The matrix is strategies (every one the service lists at GET
 * /v1/strategies, by default) x segment counts, plus two-instance scenes
 * for `local` (which breaks there) and `lua` (which does not), in four
 * groups. Ordinary contention: no fault, every safe strategy. Forced
 * interleavings: a flaw that needs a particular interleaving is forced,
 * not hoped for, and seen to be forced (FORCED, below); the safe ones run
 * under the same forcing to show that they hold. Redis failures
 * (failures.c), those Alibaba Cloud's "Implementation Principles and Best Practices of Distributed Lock"
 * (section 4.2) says break a Redis lock and RedLock: a failover to a
 * replica that missed the last writes, a Redlock server's clock jumping, a
 * Redlock server losing its last AOF second, a Redlock member failing over
 * -- each with the unsafe version and ours. Holds, as a checkout reserves
 * units until they are paid for: `lua`, `lock` and `db` sell a small stock
 * as holds of a few seconds that buyers pay for, cancel or abandon; the stock sells out, the units
 * that come back are sold again within the scene, and the verifier checks
 * how every hold ended and how late the expiries were. Every scene gets
 * a fresh SKU and is verified like any run; its verdict is then compared
 * with what the strategy is expected to do.
 *
 * Then the "choosing a lock" table: one row per lock, from its scenes and
 * from probes run with faults of their own (probe.c): the holder killed
 * with SIGKILL, the lock server restarted, the lock server restarted
 * empty.
 *
 * Without --target, compare starts a private redis-server, the lock
 * servers (three redis-servers for Redlock, a ZooKeeper, an etcd) and
 * flashsale (a second instance when a scene needs one) with
 * --fault-injection, on free ports in a temp dir, and stops them at the
 * end (world.c). A lock server that cannot start has its scenes skipped,
 * and says why. A scene's figures and briefs are scene.c's. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"
#include "loadtest/stores/stores.h"

#define MAX_SCENES 64

/* The forced interleavings (fault injection: cs_overlap, stock/rcw.c). A
 * holder, after its read and check, waits inside its critical section
 * until a second holder is inside with the same read, or until the bound;
 * the service counts each wait as met or alone, and the scene checks the
 * count: a flaw is shown only when the interleaving that breaks it was
 * seen to happen, and a lock that holds is seen to let no second holder
 * in. Each unsafe strategy runs under the forcing that breaks it and the
 * safe ones under the very same:
 *
 * - a second holder reads the same units: without a lock, unlocked before
 *   the write, or with a lock that excludes nobody across instances
 *   (`local` on two). Both write what they computed from one read. Where
 *   the write takes what it checked (a decrement: check-then-decr,
 *   `local`), only the last units can be sold twice, so those scenes sell
 *   one unit (stock 1): the last unit, read by two holders.
 * - a lease runs out: a second holder comes in only once the first one's
 *   lease has expired (a lease seen expired); both write, or the fence
 *   refuses the first. */
typedef struct force_spec {
    const char *fault;           /* which of the two (above) */
    const char *strategy;
    int instances;
    int last_unit;               /* stock 1 */
    int bound_ms;                /* the longest wait (the product's cs_delay_ms) */
    int ttl_ms;                  /* the lease (0: the service's) */
    int eight;                   /* also with 8 segments */
    int expect;                  /* FL_FORCE_MET or FL_FORCE_ALONE */
    const char *how;             /* the condition, for people ("%d": the lease) */
} force_spec;

static const char SAME_READ[] = "a second holder reads the same units";
static const char LEASE[] = "a lease runs out inside the critical section";

#define LAST_UNIT_BOUND_MS 2000
#define SAME_READ_BOUND_MS 2000

static const force_spec FORCED[] = {
    { SAME_READ, "local", 2, 1, LAST_UNIT_BOUND_MS, 0, 0, FL_FORCE_MET,
      "2 instances, a mutex each: the last unit read by a second holder" },
    { SAME_READ, "unsafe-check-then-decr", 1, 1, LAST_UNIT_BOUND_MS, 0, 0, FL_FORCE_MET,
      "no lock: the last unit read by a second holder" },
    { SAME_READ, "unsafe-read-write", 1, 0, SAME_READ_BOUND_MS, 0, 0, FL_FORCE_MET,
      "no lock: a second holder reads the same units" },
    { SAME_READ, "unsafe-unlock-before-write", 1, 0, SAME_READ_BOUND_MS, 0, 0, FL_FORCE_MET,
      "unlocked before the write: a second holder reads the same units" },
    /* The article's pessimistic lock (FL_LOCK_ARTICLE, 3.2.1: SELECT ...
     * FOR UPDATE) and its mistake (on PostgreSQL): the check before the
     * transaction that locks, then the value computed. */
    { SAME_READ, "unsafe-check-outside-tx", 1, 0, SAME_READ_BOUND_MS, 0, 0, FL_FORCE_MET,
      "checked before the transaction that locks the row: a second holder reads the same "
      "units" },
    { SAME_READ, "local", 1, 1, LAST_UNIT_BOUND_MS, 0, 0, FL_FORCE_ALONE,
      "1 instance: the last unit, a second holder waited for" },
    { SAME_READ, "db-for-update", 1, 0, SAME_READ_BOUND_MS / 4, 0, 0, FL_FORCE_ALONE,
      "SELECT ... FOR UPDATE: a second holder waited for, inside the locked transaction" },
    { SAME_READ, "lock", 2, 1, LAST_UNIT_BOUND_MS, 10000, 0, FL_FORCE_ALONE,
      "2 instances: the last unit, a second holder waited for (lease %dms)" },
    /* EXPIRE takes whole seconds. */
    { LEASE, "unsafe-setnx-expire", 1, 0, 4000, 1000, 0, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { LEASE, "unsafe-lock-no-fence", 1, 0, 1000, 100, 0, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { LEASE, "unsafe-redlock-no-fence", 1, 0, 2000, 200, 0, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { LEASE, "lock", 1, 0, 1000, 100, 1, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { LEASE, "redlock", 1, 0, 2000, 200, 0, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { LEASE, "fair-lock", 1, 0, 1000, 100, 0, FL_FORCE_MET,
      "held past its lease (%dms) until the next in line came in" },
    /* A ZooKeeper session is kept alive by the client library's own
     * threads, which a wait of the holding thread does not stop: the wait
     * outlasts the session timeout (200 ms is the server's minimum here),
     * never the session. */
    { LEASE, "zookeeper", 1, 0, 1000, 200, 0, FL_FORCE_ALONE,
      "held past its session timeout (%dms), the session kept alive" },
    /* etcd's leases are whole seconds, and it looks for expired ones about
     * every half second. */
    { LEASE, "etcd", 1, 0, 4000, 1000, 0, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { LEASE, "db-lock", 1, 0, 2000, 200, 0, FL_FORCE_MET,
      "held past its lease (%dms) until a second holder came in" },
    { NULL, NULL, 0, 0, 0, 0, 0, 0, NULL },
};

/* The Redis failures group: which strategies run under which failure (the
 * unsafe version first, then ours). */
typedef struct failure_spec {
    fl_failure kind;
    const char *strategy;
    const char *condition;
} failure_spec;

static const failure_spec FAILURES[] = {
    { FL_FAIL_FAILOVER, "unsafe-trust-redis", "failover to a replica that missed the last sales" },
    { FL_FAIL_FAILOVER, "lua", "failover to a replica that missed the last sales" },
    { FL_FAIL_FAILOVER, "lock", "failover to a replica that missed the last sales and locks" },
    { FL_FAIL_FAILOVER, "fair-lock",
      "failover to a replica that missed the last sales, locks and places in line" },
    { FL_FAIL_CLOCK, "unsafe-redlock-no-fence", "a Redlock server's clock jumped +60s mid-hold" },
    { FL_FAIL_CLOCK, "redlock", "a Redlock server's clock jumped +60s mid-hold" },
    { FL_FAIL_AOF, "unsafe-redlock-no-fence",
      "a Redlock server crashed mid-hold, its AOF (everysec) lost the lock" },
    { FL_FAIL_AOF, "redlock",
      "a Redlock server crashed mid-hold, its AOF (everysec) lost the lock" },
    { FL_FAIL_MEMBER, "unsafe-redlock-no-fence",
      "a Redlock member failed over to a replica without the lock" },
    { FL_FAIL_MEMBER, "redlock", "a Redlock member failed over to a replica without the lock" },
    { FL_FAIL_NONE, NULL, NULL },
};

/* The holds group: the safe strategies that sell holds, one segment each,
 * and what their buyers do (docs/api.md, "Holds"): most pay, some cancel,
 * the rest abandon the hold to expire. */
static const char *const HOLDS[] = { "lua", "lock", "db", NULL };
/* The crowd group's sale: 30,000 buyers in a second, 3,000 units -- past
 * what two instances sell a second here (~14,000 lua orders), so without a
 * room the units go to whoever retries at the right moment. The scene
 * ends when every buyer has a final answer (CROWD_LIMIT_S at most). */
#define CROWD_BUYERS 30000
#define CROWD_RAMP_S 1.0
#define CROWD_LIMIT_S 60
#define CROWD_CONNECTIONS 1024

#define HOLDS_PAY 0.6
#define HOLDS_CANCEL 0.1

void fl_compare_opts_default(fl_compare_opts *o) {
    memset(o, 0, sizeof *o);
    o->segments[0] = 1;
    o->segments[1] = 8;
    o->nsegments = 2;
    o->two_instances = 1;
    o->duration_s = 2;
    o->pause_duration_s = 3;
    o->connections = 64;
    o->threads = 2;
    o->users = 1000;
    o->qty_min = o->qty_max = 1;
    o->stock = 20000;
    o->pause_stock = 10;           /* a few units: a pause scene sells a few per second */
    o->contention = o->forced = 1;
    o->probes = 1;
    o->lock_servers = 1;
    o->redis_failures = 1;
    /* Holds of 2 s on 100 units: sold out in a moment, and the load lasts
     * the hold and 2 s more (holds.c's RESALE_MARGIN_MS), so every unit
     * that comes back is seen sold again. */
    o->holds = 1;
    o->fairness = 1;
    o->crowd = 1;
    o->crowd_buyers = CROWD_BUYERS;
    o->hold_seconds = 2;
    o->holds_duration_s = 5;
    o->holds_stock = 100;
    snprintf(o->out_dir, sizeof o->out_dir, ".");
    snprintf(o->key_prefix, sizeof o->key_prefix, "fs:");
}

/* --------------------------------------------------------------- the matrix */

static fl_scene *add_scene(fl_scene *out, int *n, int max, const char *name, int segments,
                           int instances, int unsafe) {
    if (*n == max) return NULL;
    fl_scene *sc = &out[(*n)++];
    memset(sc, 0, sizeof *sc);
    snprintf(sc->strategy, sizeof sc->strategy, "%s", name);
    sc->segments = segments;
    sc->instances = instances;
    sc->unsafe = unsafe;
    return sc;
}

/* A scene of ordinary contention: no fault. */
static void contention_scene(const fl_compare_opts *o, fl_scene *sc) {
    sc->stock = o->stock;
    sc->duration_s = o->duration_s;
    sc->group = FL_GROUP_CONTENTION;
    if (sc->instances > 1)
        snprintf(sc->condition, sizeof sc->condition, "contention, %d instances", sc->instances);
    else
        snprintf(sc->condition, sizeof sc->condition, "contention");
}

/* A scene under the forcing of fs. */
static void forced_scene(const fl_compare_opts *o, fl_scene *sc, const force_spec *fs) {
    sc->stock = fs->last_unit ? 1 : o->pause_stock;
    sc->duration_s = o->pause_duration_s;
    sc->cs_delay_ms = fs->bound_ms;
    sc->cs_overlap = 2;
    sc->lock_ttl_ms = fs->ttl_ms;
    sc->expect_force = fs->expect;
    sc->fault_name = fs->fault;
    sc->fault = 1;
    sc->group = FL_GROUP_PAUSE;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(sc->condition, sizeof sc->condition, fs->how, fs->ttl_ms);
#pragma GCC diagnostic pop
    /* `local` is only safe inside one process. */
    sc->unsafe = sc->unsafe || (!strcmp(sc->strategy, "local") && sc->instances > 1);
}

/* Whether strategy is named by --strategies. */
static int named(const fl_compare_opts *o, const char *strategy) {
    for (int k = 0; k < o->nstrategies; k++)
        if (!strcmp(o->strategies[k], strategy)) return 1;
    return 0;
}

/* Whether strategy is among those asked for (all, when none is named). */
static int asked_for(const fl_compare_opts *o, const char *strategy) {
    return o->nstrategies == 0 || named(o, strategy);
}

/* Whether a scene of info is wanted: asked for, and, unless named, one
 * the service can run (db-for-update needs PostgreSQL: a comparison on
 * SQLite leaves it out rather than skip it). */
static int wanted(const fl_compare_opts *o, const fl_strategy *info) {
    return asked_for(o, info->name) && (info->available || named(o, info->name));
}

static int has_segments(const fl_compare_opts *o, int segs) {
    for (int k = 0; k < o->nsegments; k++)
        if (o->segments[k] == segs) return 1;
    return 0;
}

/* Fills a scene of the holds group for strategy (one segment, one instance). */
static void holds_scene(const fl_compare_opts *o, fl_scene *sc, const char *strategy) {
    memset(sc, 0, sizeof *sc);
    snprintf(sc->strategy, sizeof sc->strategy, "%s", strategy);
    sc->segments = sc->instances = 1;
    sc->group = FL_GROUP_HOLDS;
    sc->stock = o->holds_stock;
    sc->duration_s = o->holds_duration_s;
    sc->hold_seconds = o->hold_seconds;
    sc->pay = HOLDS_PAY;
    sc->cancel = HOLDS_CANCEL;
    snprintf(sc->condition, sizeof sc->condition, "holds of %d s: %.0f%% pay, %.0f%% cancel, "
             "%.0f%% abandon", sc->hold_seconds, sc->pay * 100, sc->cancel * 100,
             (1 - sc->pay - sc->cancel) * 100);
}

/* The between-hosts group: the unsafe version first, then ours (hosts.c;
 * tools/hosts_scene.py runs each). unsafe-trust-redis trusts whichever
 * copy it reaches, so the old primary of a split brain sells again what
 * the promoted one sells; lua commits an order only under the generation
 * it was reserved in. PostgreSQL runs under Patroni: with synchronous_mode
 * off it promotes a replica that lacks what the leader acknowledged last
 * (the unsafe twin); with it on, only the synchronous standby, which has
 * every COMMIT that returned; a leader cut off is demoted before a
 * replica is promoted; a planned switchover costs a second or two. */
typedef struct between_spec {
    const char *strategy;
    fl_between kind;
    int unsafe;
    double seconds;
    const char *condition;
} between_spec;

static const between_spec BETWEEN[] = {
    { "unsafe-trust-redis", FL_HOSTS_SPLIT, 1, 14,
      "split brain: the Redis primary cut off with 1 of 3 instances, its replica promoted" },
    { "lua", FL_HOSTS_SPLIT, 0, 14,
      "split brain: the Redis primary cut off with 1 of 3 instances, its replica promoted" },
    { "lua", FL_HOSTS_ASYNC, 1, 18,
      "Patroni, synchronous_mode off: the leader cut from its replica 2 s, then its host "
      "killed; Patroni promotes the replica" },
    { "lua", FL_HOSTS_SYNC, 0, 18,
      "Patroni, synchronous_mode on: the leader cut from its standby 2 s, then its host "
      "killed; Patroni promotes the standby" },
    { "lua", FL_HOSTS_CUT, 0, 18,
      "Patroni: the leader cut from etcd and from its standby; instances still reach it" },
    { "lua", FL_HOSTS_SWITCHOVER, 0, 8,
      "Patroni: a planned switchover mid-sale; one instance through HAProxy (GET /primary)" },
    { NULL, FL_HOSTS_NONE, 0, 0, NULL },
};

/* The locks whose fairness is measured (FL_LOCK_ARTICLE, 6.1, counts
 * fairness among what a distributed lock must have), in the lock table's
 * order; db-for-update's row lock where the service runs on PostgreSQL. */
static const char *const FAIR_LOCKS[] = { "lock", "fair-lock", "redlock", "zookeeper", "etcd",
                                          "db-lock", "db-for-update", "local", NULL };

int fl_compare_scenes(const fl_compare_opts *o, const fl_strategy *st, int nst, fl_scene *out,
                      int max) {
    int n = 0;
    fl_scene *sc;
    /* First group: ordinary contention, the safe strategies. An unsafe
     * one's flaw under contention alone would be the scheduler's luck: it
     * is shown under the forcing that breaks it, below. */
    for (int i = 0; i < nst; i++) {
        const fl_strategy *info = &st[i];
        if (!o->contention || !wanted(o, info) || !info->safe) continue;
        int did_one = 0;
        for (int k = 0; k < o->nsegments; k++) {
            if (o->segments[k] > 1 && !info->segments) continue;
            if ((sc = add_scene(out, &n, max, info->name, o->segments[k], 1, 0)))
                contention_scene(o, sc);
            did_one = 1;
        }
        if (!did_one && (sc = add_scene(out, &n, max, info->name, 1, 1, 0)))
            contention_scene(o, sc);
        if (o->two_instances && !strcmp(info->name, "lua") &&
            (sc = add_scene(out, &n, max, info->name, 1, 2, 0)))
            contention_scene(o, sc);
    }
    /* Second group: the forced interleavings, the unsafe ones and the safe
     * ones under the same. unsafe-trust-redis oversells only when Redis
     * loses writes: it has its scenes among the Redis failures. */
    for (const force_spec *fs = FORCED; o->forced && fs->strategy; fs++) {
        const fl_strategy *info = fl_strategy_find(st, nst, fs->strategy);
        if (!info || !wanted(o, info)) continue;
        if (fs->instances > 1 && !o->two_instances) continue;
        if ((sc = add_scene(out, &n, max, info->name, 1, fs->instances, !info->safe)))
            forced_scene(o, sc, fs);
        if (fs->eight && has_segments(o, 8) &&
            (sc = add_scene(out, &n, max, info->name, 8, fs->instances, !info->safe)))
            forced_scene(o, sc, fs);
    }
    /* Third group: the Redis failures, each strategy's scene of each. */
    for (const failure_spec *fs = FAILURES; o->redis_failures && fs->strategy; fs++) {
        const fl_strategy *info = fl_strategy_find(st, nst, fs->strategy);
        if (!info || !wanted(o, info) || n == max) continue;
        fl_scene *sc = &out[n++];
        memset(sc, 0, sizeof *sc);
        snprintf(sc->strategy, sizeof sc->strategy, "%s", info->name);
        sc->segments = sc->instances = 1;
        sc->unsafe = !info->safe;
        sc->fault = 1;
        sc->group = FL_GROUP_FAILURE;
        sc->failure = fs->kind;
        sc->fault_name = fl_failure_title(fs->kind);
        snprintf(sc->condition, sizeof sc->condition, "%s", fs->condition);
    }
    /* Fourth group: holds, sold out and sold again. */
    for (const char *const *h = HOLDS; o->holds && *h; h++) {
        const fl_strategy *info = fl_strategy_find(st, nst, *h);
        if (!info || !info->safe || !wanted(o, info) || n == max) continue;
        holds_scene(o, &out[n++], info->name);
    }
    /* Fifth group: fairness, each lock's two scenes (fairness.c), on two
     * instances but `local`'s, whose mutex is one process's. */
    for (const char *const *f = FAIR_LOCKS; o->fairness && *f; f++) {
        const fl_strategy *info = fl_strategy_find(st, nst, *f);
        if (!info || !wanted(o, info)) continue;
        int inst = !strcmp(*f, "local") ? 1 : 2;
        if (inst > 1 && !o->two_instances) continue;
        for (int kind = FL_FAIR_QUEUE; kind <= FL_FAIR_STREAM; kind++)
            if ((sc = add_scene(out, &n, max, info->name, 1, inst, 0)))
                fl_fair_scene_setup(sc, kind);
    }
    /* Sixth group: a crowd past the order path's capacity, with the
     * waiting room off (a lottery) and on (a queue): `lua`, as the
     * contention's instances. */
    const fl_strategy *lua = fl_strategy_find(st, nst, "lua");
    for (int room = 0; o->crowd && lua && wanted(o, lua) && room < 2; room++)
        if ((sc = add_scene(out, &n, max, "lua", 1, o->two_instances ? 2 : 1, 0))) {
            sc->group = FL_GROUP_CROWD;
            sc->crowd_room = room;
            sc->crowd_buyers = o->crowd_buyers;
            sc->crowd_ramp_s = CROWD_RAMP_S;
            sc->stock = o->crowd_buyers / 10;
            sc->duration_s = CROWD_LIMIT_S;
            snprintf(sc->condition, sizeof sc->condition,
                     "crowd: %d buyers in %g s, a fifth bots, %lld units; waiting room %s",
                     sc->crowd_buyers, CROWD_RAMP_S, sc->stock, room ? "on" : "off");
        }
    /* Seventh group: between hosts, each scene on a deployment of its own
     * (3 instances, PostgreSQL run by Patroni, Sentinel), whatever this
     * run's service. */
    for (const between_spec *b = BETWEEN; o->between_hosts && b->strategy; b++) {
        if (!asked_for(o, b->strategy) || !fl_strategy_find(st, nst, b->strategy)) continue;
        if (o->between_only && !(o->between_only & 1u << b->kind)) continue;
        if (!(sc = add_scene(out, &n, max, b->strategy, 1, 3, b->unsafe))) break;
        sc->stock = 1000000;
        sc->duration_s = b->seconds;
        sc->fault = 1;
        sc->group = FL_GROUP_HOSTS;
        sc->between = b->kind;
        sc->fault_name = fl_between_title(b->kind);
        snprintf(sc->condition, sizeof sc->condition, "%s", b->condition);
    }
    /* Stable: contention first, then the forced interleavings, then the
     * Redis failures, then holds, then fairness, then between hosts. */
    static fl_scene tmp[MAX_SCENES];
    int m = 0;
    for (int g = 0; g < FL_GROUPS; g++)
        for (int i = 0; i < n; i++)
            if (out[i].group == g) tmp[m++] = out[i];
    memcpy(out, tmp, (size_t)n * sizeof *out);
    return n;
}

/* A crowd scene's figures and bins; with the room on, it is as expected
 * only if the room served its line in order -- every buyer answered, 99%
 * of the units to the first S places -- and bots were no better off than
 * polite buyers (x1.5 at most: a small crowd's noise; without the room
 * they get x1.1-x8). The share of the first S *arrivals* is shown, not
 * held to a bound: the order the service saw the buyers in is not quite
 * the order they set out in (1,024 connections, two instances, each
 * taking places in batches), 86-99% here on a busy 2-core box. */
static void crowd_fill(fl_scene_result *res, const fl_run_result *rr) {
    const fl_load_result *l = &rr->load;
    fl_crowd_figures *f = &res->crowd;
    if (fl_crowd_figures_get(l, res->sc.stock, f) != 0) {
        res->as_expected = 0;
        snprintf(res->note, sizeof res->note, "out of memory for the crowd's figures");
        return;
    }
    memset(res->crowd_bins, 0, sizeof res->crowd_bins);
    for (size_t i = 0; i < l->nbuyers; i++) {
        const fl_buyer_rec *b = &l->buyers[i];
        size_t k = (size_t)b->idx * FL_CROWD_BINS / (l->nbuyers ? l->nbuyers : 1);
        if (k >= FL_CROWD_BINS) k = FL_CROWD_BINS - 1;
        res->crowd_bins[k][0]++;
        if (b->outcome == FL_BUYER_GOT) {
            res->crowd_bins[k][1]++;
            res->crowd_bins[k][2] += b->bot;
        }
    }
    if (res->sc.crowd_room && res->as_expected)
        res->as_expected = f->no_final == 0 && f->first_place_share >= 0.99 &&
                           f->bot_ratio <= 1.5;
    res->orders_per_s = f->units_per_s;
}

/* Asks the service for its strategies; every name asked for must be one. */
static int strategies(const fl_compare_opts *o, const fl_target *t, fl_strategy *st, int *nst,
                      fl_err *e) {
    fl_http h;
    fl_http_init(&h, t, o->token, 10000);
    *nst = fl_strategies_get(&h, st, FL_MAX_STRATEGIES, e);
    fl_http_close(&h);
    if (*nst < 0) return -1;
    for (int k = 0; k < o->nstrategies; k++) {
        if (fl_strategy_find(st, *nst, o->strategies[k])) continue;
        char names[400] = "";
        for (int i = 0; i < *nst; i++) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%.31s", i ? ", " : "", st[i].name);
        }
        return fl_errf(e, "--strategies: the service offers no strategy '%s' (it offers: %s)",
                       o->strategies[k], names);
    }
    return 0;
}

/* Whether any Redis failure scene may be wanted (before the service's list
 * of strategies is known). */
static int wants_failures(const fl_compare_opts *o) {
    for (const failure_spec *fs = FAILURES; o->redis_failures && fs->strategy; fs++)
        if (asked_for(o, fs->strategy)) return 1;
    return 0;
}

/* ----------------------------------------------------------------- a scene */

/* The service's flashsale_lock_handoff_seconds of one strategy. */
typedef struct handoff_hist {
    int ok;
    double le[24];
    double cum[24];
    int nb;
    double sum, count;
} handoff_hist;

static void handoff_read(const fl_world *w, const char *strategy, handoff_hist *hh) {
    memset(hh, 0, sizeof *hh);
    fl_http h;
    fl_err e;
    fl_http_init(&h, &w->targets[0], w->token, 10000);
    if (fl_http_request(&h, "GET", "/metrics", NULL, &e) != 200 || !h.resp.body) goto out;
    char want[96];
    int wl = snprintf(want, sizeof want, "flashsale_lock_handoff_seconds_bucket{strategy=\"%s\",le=\"",
                      strategy);
    for (char *line = h.resp.body; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!strncmp(line, want, (size_t)wl) && hh->nb < 24) {
            char *q = line + wl;
            hh->le[hh->nb] = !strncmp(q, "+Inf", 4) ? 1e30 : strtod(q, NULL);
            char *sp = memrchr(line, ' ', nl ? (size_t)(nl - line) : strlen(line));
            if (sp) hh->cum[hh->nb++] = strtod(sp + 1, NULL);
        }
        char k[96];
        int kl = snprintf(k, sizeof k, "flashsale_lock_handoff_seconds_sum{strategy=\"%s\"} ", strategy);
        if (!strncmp(line, k, (size_t)kl)) hh->sum = strtod(line + kl, NULL);
        kl = snprintf(k, sizeof k, "flashsale_lock_handoff_seconds_count{strategy=\"%s\"} ", strategy);
        if (!strncmp(line, k, (size_t)kl)) {
            hh->count = strtod(line + kl, NULL);
            hh->ok = 1;
        }
        line = nl ? nl + 1 : NULL;
    }
out:
    fl_http_close(&h);
}

/* Fills the scene's hand-off figures from two readings of the histogram. */
static void handoff_delta(const handoff_hist *a, const handoff_hist *b, fl_scene_result *res) {
    if (!a->ok || !b->ok || a->nb != b->nb) return;
    double n = b->count - a->count;
    if (n <= 0) return;
    res->handoff_n = (uint64_t)n;
    res->handoff_mean_us = (b->sum - a->sum) / n * 1e6;
    double half = n / 2, prev_cum = 0, prev_le = 0;
    for (int i = 0; i < b->nb; i++) {
        double cum = b->cum[i] - a->cum[i];
        if (cum >= half) {
            double le = b->le[i] > 1e29 ? prev_le * 2 : b->le[i];
            double inb = cum - prev_cum;
            double frac = inb > 0 ? (half - prev_cum) / inb : 1;
            res->handoff_p50_us = (prev_le + (le - prev_le) * frac) * 1e6;
            return;
        }
        prev_cum = cum;
        prev_le = b->le[i];
    }
}

/* Reads what the service counted of a forced scene's waits and holds the
 * scene to it: an interleaving the scene claims but that did not come
 * makes it UNEXPECTED, whatever its verdict, with what was missing. */
static void forcing_check(const fl_vantage *v, const char *sku, fl_scene_result *res) {
    const fl_scene *sc = &res->sc;
    fl_err e = { "" };
    res->forced_met = res->forced_alone = -1;
    fl_redis *r = fl_redis_open(v->redis_url, v->key_prefix, 2000, &e);
    long long met = 0, alone = 0;
    if (!r || fl_redis_forcing(r, sku, &met, &alone, &e)) {
        snprintf(res->forced_why, sizeof res->forced_why,
                 "the forcing's counts could not be read: %.140s", e.msg);
        res->as_expected = 0;
        fl_redis_close(r);
        return;
    }
    fl_redis_close(r);
    res->forced_met = met;
    res->forced_alone = alone;
    if (sc->expect_force == FL_FORCE_MET && met < sc->cs_overlap) {
        snprintf(res->forced_why, sizeof res->forced_why,
                 "not forced: no second holder came inside the critical section with the same "
                 "read (%lld waits ran to their bound alone)", alone);
        res->as_expected = 0;
    } else if (sc->expect_force == FL_FORCE_ALONE && met > 0) {
        snprintf(res->forced_why, sizeof res->forced_why,
                 "a second holder came inside the critical section with the same read while "
                 "the lock was held (%lld waits met one)", met);
        res->as_expected = 0;
    } else if (sc->expect_force == FL_FORCE_MET && !sc->unsafe && res->fenced == 0) {
        /* A fenced lock whose lease ran out with a second holder inside
         * must have refused the first one's write. */
        snprintf(res->forced_why, sizeof res->forced_why,
                 "a second holder came in after the lease ran out (%lld waits met one), yet no "
                 "write was refused by the fence", met);
        res->as_expected = 0;
    }
}

static void scene_run(const fl_compare_opts *o, fl_world *w, const char *tag, int idx, int total,
                      fl_scene_result *res, fl_err *e) {
    static fl_run_opts ro;         /* large: off the stack */
    static fl_run_result rr;
    const fl_scene *sc = &res->sc;
    char why[300];
    if (fl_world_ready(w, sc->strategy, why, sizeof why)) {
        snprintf(res->note, sizeof res->note, "skipped: %.280s", why);
        return;
    }
    if (sc->instances > w->ntargets && w->dir[0]) {
        while (w->nsvc < sc->instances && w->nsvc < 2)
            if (fl_world_add_instance(w, e)) {
                snprintf(res->note, sizeof res->note, "skipped: %.180s", e->msg);
                return;
            }
    }
    if (sc->instances > w->ntargets) {
        snprintf(res->note, sizeof res->note, "skipped: needs %d targets", sc->instances);
        return;
    }
    fl_run_opts_default(&ro);
    fl_load_opts *lo = &ro.load;
    memcpy(lo->targets, w->targets, sizeof lo->targets);
    lo->ntargets = sc->instances;
    lo->connections = o->connections;
    lo->threads = o->threads;
    lo->users = o->users;
    lo->qty_min = o->qty_min;
    lo->qty_max = o->qty_max;
    lo->duration_us = (int64_t)(sc->duration_s * 1e6);
    lo->timeout_us = 30 * 1000000LL;
    if (sc->group == FL_GROUP_CROWD) {
        lo->crowd = (fl_crowd_opts){ .buyers = (uint32_t)sc->crowd_buyers,
                                     .ramp_us = (int64_t)(sc->crowd_ramp_s * 1e6),
                                     .impatient = 0.2, .room = sc->crowd_room };
        lo->connections = CROWD_CONNECTIONS;
        ro.product.room_turn_s = sc->crowd_room ? 30 : 0;
    }
    ro.vantage.api = w->targets[0];
    snprintf(ro.vantage.token, sizeof ro.vantage.token, "%s", w->token);
    snprintf(ro.vantage.redis_url, sizeof ro.vantage.redis_url, "%s", w->redis_url);
    snprintf(ro.vantage.db_path, sizeof ro.vantage.db_path, "%s", w->db_path);
    snprintf(ro.vantage.key_prefix, sizeof ro.vantage.key_prefix, "%s", w->key_prefix);
    ro.settle_ms = 4000;
    ro.progress = o->progress;
    ro.interrupted = o->interrupted;
    char label[96];
    snprintf(label, sizeof label, "[%d/%d %s x%d x%d]", idx, total, sc->strategy, sc->segments,
             sc->instances);
    ro.label = label;
    fl_product_spec *ps = &ro.product;
    snprintf(ps->sku, sizeof ps->sku, "cmp-%s-%s-s%d-i%d%s", tag, sc->strategy, sc->segments,
             sc->instances, sc->fault ? "-f" : sc->hold_seconds ? "-h" :
             sc->group == FL_GROUP_CROWD ? (sc->crowd_room ? "-room" : "-crowd") : "");
    ps->hold_seconds = sc->hold_seconds;
    lo->pay = sc->pay;
    lo->cancel = sc->cancel;
    ps->stock = sc->stock;
    snprintf(ps->strategy, sizeof ps->strategy, "%s", sc->strategy);
    ps->segments = sc->segments;
    ps->cs_delay_ms = sc->cs_delay_ms;
    ps->lock_ttl_ms = sc->lock_ttl_ms;
    ps->cs_overlap = sc->cs_overlap;
    handoff_hist before, after;
    int timed = sc->instances == 1 && !sc->fault && sc->group == FL_GROUP_CONTENTION;
    if (timed) handoff_read(w, sc->strategy, &before);
    if (fl_run(&ro, &rr, e)) {
        snprintf(res->note, sizeof res->note, "skipped: %.180s", e->msg);
        fl_run_result_free(&rr);
        return;
    }
    if (timed) {
        handoff_read(w, sc->strategy, &after);
        handoff_delta(&before, &after, res);
    }
    fl_scene_fill(res, &rr);
    if (sc->group == FL_GROUP_CROWD) crowd_fill(res, &rr);
    fl_run_result_free(&rr);
    if (sc->cs_overlap) forcing_check(&ro.vantage, ps->sku, res);
}

/* A fairness scene: its lock server and instances, then fairness.c. */
static void fair_scene_run(fl_world *w, const char *tag, fl_scene_result *res) {
    const fl_scene *sc = &res->sc;
    char why[300], sku[65];
    fl_err e = { "" };
    if (fl_world_ready(w, sc->strategy, why, sizeof why)) {
        snprintf(res->note, sizeof res->note, "skipped: %.280s", why);
        return;
    }
    while (w->dir[0] && w->nsvc < sc->instances && w->nsvc < 2)
        if (fl_world_add_instance(w, &e)) {
            snprintf(res->note, sizeof res->note, "skipped: %.180s", e.msg);
            return;
        }
    if (sc->instances > w->ntargets) {
        snprintf(res->note, sizeof res->note, "skipped: needs %d targets", sc->instances);
        return;
    }
    snprintf(sku, sizeof sku, "cmp-%s-%s-fair-%s", tag, sc->strategy,
             fl_fair_scene_name(sc->fair_scene));
    if (fl_fair_run(w, sku, res, &e))
        snprintf(res->note, sizeof res->note, "skipped: %.280s", e.msg);
}

/* The fairness group's own table: who was served in turn. */
static void fairness_table(const fl_scene_result *r, int n, FILE *f) {
    int said = 0;
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_FAIRNESS || !s->ran) continue;
        if (!said++)
            fprintf(f, "fairness, as served (pairs of buyers served against their arrival "
                       "order; waits less each one's own hold):\n  %-14s %-7s %5s %8s %14s "
                       "%9s %9s %8s  %s\n", "lock", "scene", "inst", "served", "out of order",
                    "wait p50", "wait max", "starved", "service order (arrival numbers)");
        char oo[32], order[3 * FL_FAIR_MAX + 8] = "";
        snprintf(oo, sizeof oo, "%ld of %ld", s->fair_out_of_order, s->fair_pairs);
        for (int k = 0; k < s->fair_served; k++)
            snprintf(order + strlen(order), sizeof order - strlen(order), "%s%d", k ? " " : "",
                     s->fair_order[k]);
        fprintf(f, "  %-14s %-7s %5d %4d/%-3d %14s %7.0fms %7.0fms %8d  %s\n", s->sc.strategy,
                fl_fair_scene_name(s->sc.fair_scene), s->sc.instances, s->fair_served,
                s->sc.waiters, oo, s->fair_wait_median_ms, s->fair_wait_max_ms, s->fair_starved,
                order);
    }
}

/* The crowd group's own table: who got the units, room off and on. */
static void crowd_table(const fl_scene_result *r, int n, FILE *f) {
    int said = 0;
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_CROWD || !s->ran) continue;
        const fl_crowd_figures *c = &s->crowd;
        if (!said++)
            fprintf(f, "a crowd past capacity (%d buyers in %g s, a fifth bots, %lld units), "
                       "who got the units (to the first S arrivals):\n  %-13s %12s %10s %10s "
                       "%12s %9s %10s\n",
                    s->sc.crowd_buyers, s->sc.crowd_ramp_s, (long long)s->sc.stock,
                    "waiting room", "to first S", "bots x", "units/s", "answer p50",
                    "req p50", "last after");
        char places[96] = "", sent[40] = "";
        if (c->first_sent_share >= 0)
            snprintf(sent, sizeof sent, "first S to send: %.1f%%", 100 * c->first_sent_share);
        if (c->first_place_share >= 0)
            snprintf(places, sizeof places, "  (%s%sfirst S places: %.1f%%)", sent,
                     sent[0] ? ", " : "", 100 * c->first_place_share);
        else if (sent[0])
            snprintf(places, sizeof places, "  (%s)", sent);
        fprintf(f, "  %-13s %11.1f%% %10.2f %10.0f %10.0fms %9.0f %8.2fs%s%s\n",
                s->sc.crowd_room ? "on" : "off", 100 * c->first_share, c->bot_ratio,
                c->units_per_s, c->final_p50_us / 1e3, c->requests_median,
                c->final_after_last_unit_us / 1e6, places,
                c->no_final ? "  (some buyers never answered)" : "");
    }
}

/* ------------------------------------------------------------------- table */

const char *fl_group_title(int group) {
    switch (group) {
    case FL_GROUP_PAUSE:
        return "forced interleavings (fault injection: a holder waits inside its critical section "
               "until a second one is inside with the same read, or a bound)";
    case FL_GROUP_HOLDS:
        return "holds: sold out, paid, cancelled or expired, the returned units sold again";
    case FL_GROUP_FAIRNESS:
        return "fairness (" FL_LOCK_ARTICLE " \xc2\xa7" "6.1: \"when the lock wakes up, it "
               "does so in sequence\"): buyers arriving in a known order, each holding the "
               "lock a while: who is served in turn";
    case FL_GROUP_CROWD:
        return "a crowd past capacity, a fifth of it bots: the waiting room off (a lottery) "
               "and on (a queue)";
    case FL_GROUP_FAILURE:
        return "Redis failures (those that break a Redis lock and RedLock, " FL_LOCK_ARTICLE
               " \xc2\xa7" "4.2): a failover, a clock jump, a lost AOF second, each forced "
               "mid-hold";
    case FL_GROUP_HOSTS:
        return "between hosts (a network namespace per host, Sentinel, PostgreSQL run by "
               "Patroni): a split brain; Patroni's leader lost, async vs sync; its leader cut "
               "off; a switchover";
    default: return "ordinary contention (no fault)";
    }
}

/* The holds group's own table: how the holds of each scene ended. */
static void holds_table(const fl_scene_result *r, int n, FILE *f) {
    int said = 0;
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_HOLDS || !s->ran) continue;
        const fl_holds_verdict *h = &s->verdict.holds;
        if (!said++)
            fprintf(f, "the holds, as they ended (%s):\n  %-10s %8s %7s %9s %9s %7s %8s %6s %8s "
                       "%8s\n", s->sc.condition, "strategy", "segments", "placed", "confirmed",
                    "cancelled", "expired", "returned", "resold", "lag p50", "lag p99");
        fprintf(f, "  %-10s %8d %7llu %9lld %9lld %7lld %8lld %6lld %6lldms %6lldms\n",
                s->sc.strategy, s->sc.segments, (unsigned long long)s->created, h->confirmed,
                h->cancelled, h->expired, h->cancelled + h->expired, h->resold, h->lag_p50_ms,
                h->lag_p99_ms);
    }
}

void fl_compare_table(const fl_scene_result *r, int n, FILE *f) {
    fprintf(f, "%-27s %8s %9s %9s %8s %8s %6s %8s %9s %5s  %s\n", "strategy", "segments",
            "instances", "orders/s", "p50", "p99", "sold", "oversold", "min stock", "lost",
            "verdict");
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (i == 0 || s->sc.group != r[i - 1].sc.group)
            fprintf(f, "-- %s\n", fl_group_title(s->sc.group));
        if (!s->ran) {
            fprintf(f, "%-27s %8d %9d  %s%s\n", s->sc.strategy, s->sc.segments, s->sc.instances,
                    s->note, s->sc.fault ? "  [FAULT]" : "");
            continue;
        }
        char p50[16], p99[16], rate[24], forced[200];
        fl_fmt_us(s->p50_us, p50, sizeof p50);
        fl_fmt_us(s->p99_us, p99, sizeof p99);
        snprintf(rate, sizeof rate, s->orders_per_s < 10 ? "%.1f" : "%.0f", s->orders_per_s);
        fl_forced_brief(s, forced, sizeof forced);
        fprintf(f, "%-27s %8d %9d %9s %8s %8s %6lld %8lld %9lld %5lld  %s%s%s%s  [%s%s%s]\n",
                s->sc.strategy, s->sc.segments, s->sc.instances, rate, p50, p99,
                s->verdict.sold, s->verdict.oversold, s->verdict.min_stock, s->verdict.lost,
                s->verdict_line, s->as_expected ? "" : "  << UNEXPECTED",
                s->forced_why[0] ? ": " : "", s->forced_why,
                s->sc.cs_overlap ? "FORCED: " : s->sc.fault ? "FAULT: " : "", s->sc.condition,
                forced);
    }
    /* What each Redis failure did, in words: once for the scenes that
     * shared it word for word. */
    int said = 0;
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_FAILURE || !s->ran || !s->detail[0]) continue;
        int j = i;
        char who[200] = "";
        for (; j < n && r[j].sc.failure == s->sc.failure && r[j].ran &&
               !strcmp(r[j].detail, s->detail);
             j++)
            snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s", j > i ? ", " : "",
                     r[j].sc.strategy);
        if (!said++) fprintf(f, "the Redis failures, as done and seen:\n");
        fprintf(f, "  %s (%s; %.0f s): %s\n", fl_failure_name(s->sc.failure), who,
                s->sc.duration_s, s->detail);
        i = j - 1;
    }
    said = 0;
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_HOSTS || !s->ran || !s->detail[0]) continue;
        if (!said++) fprintf(f, "between hosts, as done and seen:\n");
        fprintf(f, "  %s (%s%s; %.0f s of load): %s\n", fl_between_name(s->sc.between),
                s->sc.strategy, s->sc.unsafe ? ", unsafe" : "", s->sc.duration_s, s->detail);
    }
    holds_table(r, n, f);
    fairness_table(r, n, f);
    crowd_table(r, n, f);
}

/* The seconds a scene is expected to take (measured here: a `make demo`
 * of 44 scenes and 13 probes in 172 s): its load, then the verifier; a
 * Redis failure's scenes share one fault. */
static double scene_weight(const fl_scene *sc) {
    switch (sc->group) {
    case FL_GROUP_FAILURE:
        return sc->failure == FL_FAIL_MEMBER ? 4.5 : sc->failure == FL_FAIL_FAILOVER ? 2 : 1.8;
    case FL_GROUP_HOLDS: return sc->duration_s + 1;
    case FL_GROUP_FAIRNESS: return sc->duration_s + 0.2;
    case FL_GROUP_CROWD: return sc->crowd_room ? 5 : 4;
    /* The deployment (~4 s; Patroni's ~8 more), the load, the split brain's
     * heal (a demoted leader's rejoin is not waited for), the verifier. */
    case FL_GROUP_HOSTS: return sc->duration_s + (sc->between == FL_HOSTS_SPLIT ? 13 : 16);
    default: return sc->duration_s + 0.3;
    }
}

/* The probes fl_lock_rows will run, in expected seconds. */
static double probes_weight(const fl_compare_opts *o, const fl_world *w, const fl_strategy *st,
                            int nst) {
    static const char *const SERVER[] = { "redlock", "zookeeper", "etcd", "lock", "fair-lock" };
    double sum = 0;
    if (!o->probes || !o->contention || !w->dir[0]) return 0;
    for (int i = 0; i < 5; i++)
        if (asked_for(o, SERVER[i]) && fl_strategy_find(st, nst, SERVER[i]))
            sum += FL_ETA_PROBE_KILL + 2 * FL_ETA_PROBE_SERVER;
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "db-for-update" : "db-lock";
        const fl_strategy *info = fl_strategy_find(st, nst, name);
        if (info && info->available && asked_for(o, name)) sum += FL_ETA_PROBE_KILL;
    }
    return sum;
}

static void make_tag(char *tag, size_t len) {
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (unsigned)clock_mono_us();
    snprintf(tag, len, "%04x", r & 0xffff);
}

int fl_compare(const fl_compare_opts *o, fl_err *e) {
    static fl_scene scenes[MAX_SCENES];
    static fl_scene_result res[MAX_SCENES];
    static fl_lock_row rows[FL_LOCK_ROWS];
    static fl_world w;
    fl_strategy st[FL_MAX_STRATEGIES];
    int nst, n, nrows = 0;
    int rc = -1;
    if (fl_world_up(o, &w, wants_failures(o), e)) goto out;
    if (strategies(o, &w.targets[0], st, &nst, e)) goto out;
    n = fl_compare_scenes(o, st, nst, scenes, MAX_SCENES);
    if (n == 0) {
        fl_errf(e, "no scene to run (check --strategies and --segments)");
        goto out;
    }
    char tag[16];
    make_tag(tag, sizeof tag);
    fprintf(stderr, "flashload compare: %d scenes, %d connections each, services at %s%s\n", n,
            o->connections, w.targets[0].url, w.dir[0] ? " (our own)" : "");
    int64_t t0 = clock_mono_ms();
    int ran = 0, unexpected = 0, skipped = 0;
    w.eta = (fl_eta){ t0, probes_weight(o, &w, st, nst), 0 };
    for (int i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].sc = scenes[i];
        res[i].recover_ms = -1;
        res[i].sale_gap_us = -1;
        w.eta.planned += scene_weight(&scenes[i]);
    }
    for (int i = 0, j; i < n; i = j) {
        /* The scenes of one Redis failure run together, under one fault. */
        const fl_scene *sc = &scenes[i];
        for (j = i + 1; sc->group == FL_GROUP_FAILURE && j < n &&
                        scenes[j].group == FL_GROUP_FAILURE && scenes[j].failure == sc->failure;
             j++) {}
        const fl_strategy *info = fl_strategy_find(st, nst, sc->strategy);
        fl_err se = { "" };
        if (o->interrupted && atomic_load(o->interrupted)) {
            for (int k = i; k < j; k++)
                snprintf(res[k].note, sizeof res[k].note, "skipped: interrupted");
        } else if (sc->group == FL_GROUP_FAILURE) {
            /* Its own service, whose lock servers are always there. */
            fl_failures_run(w.fail, o, tag, &res[i], j - i);
        } else if (sc->group == FL_GROUP_HOSTS) {
            /* Its own deployment, on its own hosts. */
            fl_hosts_run(o, &res[i]);
        } else if (info && !info->available) {
            snprintf(res[i].note, sizeof res[i].note, "skipped: the service cannot run it%s%.150s",
                     info->reason[0] ? ": " : "", info->reason);
        } else if (sc->group == FL_GROUP_FAIRNESS) {
            fair_scene_run(&w, tag, &res[i]);
        } else {
            scene_run(o, &w, tag, i + 1, n, &res[i], &se);
        }
        for (int k = i; k < j; k++) {
            char eta[64];
            fl_eta_step(&w.eta, scene_weight(&scenes[k]), eta, sizeof eta);
            if (!res[k].ran) {
                skipped++;
                fprintf(stderr, "[%d/%d] %s x%d x%d: %s  (%s)\n", k + 1, n, scenes[k].strategy,
                        scenes[k].segments, scenes[k].instances, res[k].note, eta);
                continue;
            }
            ran++;
            unexpected += !res[k].as_expected;
            fprintf(stderr, "[%d/%d] %-27s x%d x%d  %7.0f orders/s  %s%s%s%s%s  (%s)\n", k + 1, n,
                    scenes[k].strategy, scenes[k].segments, scenes[k].instances,
                    res[k].orders_per_s, res[k].verdict_line,
                    res[k].as_expected ? "" : "  << UNEXPECTED", res[k].forced_why[0] ? ": " : "",
                    res[k].forced_why, scenes[k].cs_overlap ? "  [forced]"
                                       : scenes[k].fault ? "  [fault]" : "", eta);
            if (res[k].detail[0]) fprintf(stderr, "        %s\n", res[k].detail);
        }
    }
    if (w.eta.planned - w.eta.done >= 1) {
        char eta[64];
        fl_eta_step(&w.eta, 0, eta, sizeof eta);
        fprintf(stderr, "choosing a lock: the probes (a holder killed with SIGKILL, each lock "
                        "server restarted, and restarted empty)  (%s)\n", eta);
    }
    /* The lock table stands on the contention scenes. */
    if (o->contention) nrows = fl_lock_rows(o, &w, tag, st, nst, res, n, rows);
    printf("\n");
    fl_compare_table(res, n, stdout);
    char skip_note[64] = "";
    if (skipped) snprintf(skip_note, sizeof skip_note, "; %d skipped (not run, not passed)", skipped);
    printf("\n%d scenes in %.0f s%s: %s\n", ran, (clock_mono_ms() - t0) / 1000.0, skip_note,
           !ran ? "none ran"
           : unexpected ? "some did not come out as expected (marked above)"
           : skipped    ? "every safe strategy that ran PASSed and every unsafe one broke, "
                          "but not every scene ran"
                        : "every safe strategy that ran PASSed and every unsafe one broke, as "
                          "expected");
    if (nrows) {
        printf("\nchoosing a lock (measured in this run)\n");
        fl_lock_table(rows, nrows, stdout);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/report.json", o->out_dir);
    if (fl_report_json(o, res, n, rows, nrows, path, e)) goto out;
    snprintf(path, sizeof path, "%s/report.html", o->out_dir);
    if (fl_report_html(o, res, n, rows, nrows, path, e)) goto out;
    char abs[PATH_MAX];
    printf("report: %s\n", realpath(path, abs) ? abs : path);
    /* A scene that could not run showed nothing: the comparison did not
     * do what it was asked, whatever the others showed. */
    rc = ran && !unexpected && !skipped ? 0 : 1;
out:
    fl_world_down(&w, rc < 0);
    return rc;
}
