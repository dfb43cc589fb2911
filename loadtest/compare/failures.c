/* failures.c: the third group of `flashload compare`, "Redis failures":
 * the failures Alibaba Cloud's "Implementation Principles and Best Practices of Distributed Lock"
 * (section 4.2) says break a Redis lock and Redlock -- a failover to a
 * replica that missed the lock, an AOF second lost in a crash, a clock
 * jump -- each forced at the moment that breaks them, each run once with
 * the unsafe version (expected to oversell) and once with ours (0
 * oversold), verified like every scene.
 *
 *   failover  the stock's Redis is a primary, a replica and three
 *             sentinels. Sales; the replica cut off from replication;
 *             more sales, which it misses (the decrements, the pending
 *             records, the `lock` strategy's locks and fence); the primary
 *             killed with SIGKILL; the sentinels promote the replica; sales
 *             to the end. unsafe-trust-redis sells the missed units again;
 *             lua and lock rebuild the copy from SQLite (the copy names the
 *             run_id that built it). Measured: kill -> next 201. (4.2)
 *   clock     Redlock on servers A, B, C; C under our clock shim
 *             (bin/libclockjump.so, clockjump.c). B is down while the
 *             holder takes the lock (it gets A and C), then back;
 *             C's wall clock jumps a minute forward while the holder pauses
 *             inside its critical section (the pause shorter than the lease:
 *             only the clock breaks it). The lock expires on C, and a
 *             second holder gets B and C. (4.2.4)
 *   aof       C is down while the holder takes the lock (it gets A and B),
 *             then back; B, `appendfsync everysec`, crashes mid-hold:
 *             killed with SIGKILL, its append-only file cut back to where
 *             it ended before the hold (what a machine crash leaves of the
 *             last second; a killed process alone loses nothing, its
 *             writes are in the page cache), started again. It forgets the
 *             lock; a second holder gets B and C. (4.2.2)
 *   member    Redlock's member A is itself a primary with a replica and
 *             sentinels. The replica is cut off, C is down; the holder
 *             takes A and B; A's primary is killed and the replica, which
 *             never saw the lock, promoted (SENTINEL FAILOVER at once, so
 *             that the promotion comes inside the pause whatever the
 *             sentinels' election does; the failover scene times an
 *             automatic one); C is back: a second holder gets A and C.
 *             (4.2.3; and the lock table's "failover to a replica" for
 *             Redlock)
 *
 * One server is down while the first holder takes the lock (B, C, C in
 * the clock, aof and member scenes), so that the holder has exactly the
 * other two: with all three up, two orders racing for the free lock may
 * split the servers, and which two the winner holds would be luck.
 *
 * With two holders at once, the unfenced write of the first (set from its
 * read, as the seed's code does) overwrites the second's: one unit sold
 * twice. The fenced one is refused (429), nothing oversold.
 *
 * The second holder counts only when seen while the first still holds a
 * server the fault left alone (A; B in the member scene): the two held the
 * lock at once. A fault that did not come as planned (no promotion, a
 * second holder only after the first let go) makes the scenes unexpected,
 * whatever their verdicts.
 *
 * The interleaving is forced, not hoped for: each scene's load (a closed
 * loop of two connections for the Redlock scenes, an open loop for the
 * failover) runs on a thread of its own through fl_run, one per strategy,
 * all at once, while this thread watches the lock keys on each server and
 * causes the fault at the moment it must come. Faults come from this
 * thread only: a server started here lives as long as flashload
 * (PR_SET_PDEATHSIG follows the thread that forked).
 *
 * The group has a world of its own, started when compare starts (the
 * sentinels get to know each other meanwhile) and used by nothing else:
 * two Sentinel-watched primaries with a replica each ("flstock", the
 * stock's; "fllock", Redlock's member A), three sentinels, Redlock's B and
 * C (append-only files), and one flashsale on them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"

#define STOCK_NAME "flstock"
#define LOCK_NAME "fllock"
#define READY_WAIT_MS 40000        /* the sentinels learn of each other by hellos every 2 s */
/* failover: units, and sales before and while the replica is cut off */
#define FO_STOCK 200
#define FO_BEFORE 40
#define FO_WHILE_CUT 40
#define FO_RATE 100                /* orders/s per SKU: the phases last ~0.4 s each */
#define FO_PROMOTE_WAIT_MS 30000
/* the Redlock scenes: a pause shorter than the lease, so that only the
 * fault can end the lock early; long enough for the fault to come first */
#define RL_STOCK 10
#define RL_PAUSE_MS 2500
#define RL_TTL_MS 10000
#define RL_JUMP_S 60               /* C's clock, each time: past any lease */
#define MB_PAUSE_MS 7000           /* the member scene waits for a failover inside it */
#define MB_TTL_MS 20000
#define MB_PROMOTE_WAIT_MS 4000    /* SENTINEL FAILOVER: ~1 s; inside the pause's 75% */
#define HOLD_WAIT_MS 10000         /* for a holder to take the lock */
#define FORGET_WAIT_MS 2000        /* for the server the fault was for to forget the lock */
#define SECOND_WAIT_MS 10000       /* for the second holder, after the fault */
#define BASE_AFTER_MS 100          /* 201s this soon after the fault were in flight before it */
#define FAULT_LIMIT_MS 30000       /* a run stops this long after the fault, whatever happens */

struct fl_failworld {
    char dir[300];
    fl_proc stock[2];            /* flstock's data nodes: primary, replica (at the start) */
    fl_proc lockm[2];            /* fllock's: Redlock's member A */
    fl_proc sent[3];
    fl_proc rl[2];               /* Redlock's B and C; C under bin/libclockjump.so if there */
    int clockjump;               /* C's clock can be moved */
    char clockjump_why[200];
    char offset_file[400];       /* C's clock offset */
    int64_t clock_s;             /* C's offset now */
    fl_proc svc;
    fl_target target;
    char svc_bin[400];
    char sentinel_url[300], redlock[400], db[400];
    int state;                   /* 0 spawned, 1 ready, -1 cannot run */
    char why[300];
};

/* ------------------------------------------------------------ the world */

static int spawn_all(fl_failworld *f, fl_err *e) {
    char sub[400], extra[1200];
    fl_proc *data[2] = { f->stock, f->lockm };
    for (int m = 0; m < 2; m++) {
        snprintf(sub, sizeof sub, "%s/%s0", f->dir, m ? LOCK_NAME : STOCK_NAME);
        if (fl_conf_spawn(FL_PROC_REDIS_NODE, sub, NULL, &data[m][0], e)) return -1;
        snprintf(sub, sizeof sub, "%s/%s1", f->dir, m ? LOCK_NAME : STOCK_NAME);
        snprintf(extra, sizeof extra, "replicaof 127.0.0.1 %d\n", data[m][0].port);
        if (fl_conf_spawn(FL_PROC_REDIS_NODE, sub, extra, &data[m][1], e)) return -1;
    }
    /* Quorum 2 of 3; a primary silent for 1 s is down (tests/topology.py's).
     * A sentinel whose failover failed (an election without a majority, no
     * replica it deems good yet) tries again only after twice the failover
     * timeout: 3 s keeps that retry at 6 s (with 10 s, we saw a promotion
     * take 22 s on a busy machine), and a failover needs ~1 s from its
     * election to the promotion it waits for. */
    int len = 0;
    for (int m = 0; m < 2; m++) {
        const char *name = m ? LOCK_NAME : STOCK_NAME;
        len += snprintf(extra + len, sizeof extra - (size_t)len,
                        "sentinel monitor %s 127.0.0.1 %d 2\n"
                        "sentinel down-after-milliseconds %s 1000\n"
                        "sentinel failover-timeout %s 3000\n",
                        name, data[m][0].port, name, name);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(sub, sizeof sub, "%s/sentinel%d", f->dir, i);
        if (fl_conf_spawn(FL_PROC_SENTINEL, sub, extra, &f->sent[i], e)) return -1;
    }
    snprintf(sub, sizeof sub, "%s/redlockB", f->dir);
    if (fl_server_spawn(FL_PROC_REDIS_AOF, sub, NULL, &f->rl[0], e)) return -1;
    snprintf(sub, sizeof sub, "%s/redlockC", f->dir);
    snprintf(f->offset_file, sizeof f->offset_file, "%s/redlockC.clockjump", f->dir);
    fl_err fe = { "" };
    f->clockjump = fl_clockjump_spawn(sub, f->offset_file, &f->rl[1], &fe) == 0;
    if (!f->clockjump) {
        /* The clock scene cannot run; the others can, on a plain server. */
        snprintf(f->clockjump_why, sizeof f->clockjump_why, "%.190s", fe.msg);
        if (fl_server_spawn(FL_PROC_REDIS_AOF, sub, NULL, &f->rl[1], e)) return -1;
    }
    snprintf(f->sentinel_url, sizeof f->sentinel_url,
             "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/%s", f->sent[0].port,
             f->sent[1].port, f->sent[2].port, STOCK_NAME);
    /* --redlock splits at commas: member A names one sentinel. */
    snprintf(f->redlock, sizeof f->redlock,
             "redis-sentinel://127.0.0.1:%d/%s,redis://127.0.0.1:%d/0,redis://127.0.0.1:%d/0",
             f->sent[0].port, LOCK_NAME, f->rl[0].port, f->rl[1].port);
    if (!f->db[0]) snprintf(f->db, sizeof f->db, "%s/orders.db", f->dir);
    return 0;
}

fl_failworld *fl_failures_spawn(const char *dir, const char *service_bin, const char *db) {
    fl_failworld *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    fl_err e = { "" };
    if (db && db[0]) snprintf(f->db, sizeof f->db, "%s", db);
    snprintf(f->dir, sizeof f->dir, "%.200s/failures", dir);
    snprintf(f->svc_bin, sizeof f->svc_bin, "%s", service_bin);
    mkdir(f->dir, 0755);
    if (spawn_all(f, &e)) {
        f->state = -1;
        snprintf(f->why, sizeof f->why, "could not start its servers: %.250s", e.msg);
    }
    return f;
}

void fl_failures_down(fl_failworld *f) {
    if (!f) return;
    fl_proc_stop(&f->svc, 30000);
    for (int i = 0; i < 3; i++) fl_proc_stop(&f->sent[i], 5000);
    for (int i = 0; i < 2; i++) {
        fl_proc_stop(&f->stock[i], 5000);
        fl_proc_stop(&f->lockm[i], 5000);
        fl_proc_stop(&f->rl[i], 5000);
    }
    free(f);
}

/* The data node of pair d whose port is port, or NULL. */
static fl_proc *fl_failures_node_at(fl_proc *d, int port) {
    for (int i = 0; i < 2; i++)
        if (d[i].pid > 0 && d[i].port == port) return &d[i];
    return NULL;
}

/* The pair's primary as every sentinel names it and ROLE confirms, with
 * its replica (in sync) when want_replica; NULL when not so. */
static fl_proc *primary_of(fl_failworld *f, fl_proc *d, const char *name, int want_replica,
                           fl_proc **replica) {
    fl_proc *p = fl_failures_node_at(d, fl_sentinel_master(f->sent, 3, name));
    if (!p || !fl_is_master(p->port)) return NULL;
    fl_proc *r = p == &d[0] ? &d[1] : &d[0];
    if (replica) *replica = r;
    if (want_replica && (r->pid <= 0 || fl_replica_of(r->port, p->port) != 1)) return NULL;
    return p;
}

/* Everything serves, the sentinels know each other and each primary's
 * replica, the service is up. Once; 0, or -1 with f->why. */
static int fl_failures_serving(fl_failworld *f) {
    if (f->state) return f->state > 0 ? 0 : -1;
    fl_err e = { "" };
    fl_proc *all[] = { &f->stock[0], &f->stock[1], &f->lockm[0], &f->lockm[1], &f->sent[0],
                       &f->sent[1], &f->sent[2], &f->rl[0], &f->rl[1] };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (fl_proc_wait(all[i], 20000, &e)) goto fail;
    int64_t until = clock_mono_ms() + READY_WAIT_MS;
    while (!(primary_of(f, f->stock, STOCK_NAME, 1, NULL) &&
             primary_of(f, f->lockm, LOCK_NAME, 1, NULL) &&
             fl_sentinels_know(f->sent, 3, STOCK_NAME, 1) &&
             fl_sentinels_know(f->sent, 3, LOCK_NAME, 1))) {
        if (clock_mono_ms() > until) {
            fl_errf(&e, "the sentinels did not agree on the primaries and their replicas within "
                        "%d s; see %s", READY_WAIT_MS / 1000, f->dir);
            goto fail;
        }
        clock_sleep_ms(50);
    }
    const char *args[] = { "--fault-injection", "--key-prefix", "fs:", "--pending-timeout-ms",
                           "3000", "--lock-wait-ms", "1000", "--redlock", f->redlock, NULL };
    if (fl_service_start(f->svc_bin, f->dir, f->sentinel_url, f->db, args, &f->svc, &e) ||
        fl_target_parse(f->svc.url, &f->target, &e))
        goto fail;
    f->state = 1;
    return 0;
fail:
    f->state = -1;
    snprintf(f->why, sizeof f->why, "%.290s", e.msg);
    return -1;
}

/* Creates a scene's product; the service may not have found the primary
 * through the sentinels yet at its first, so a refusal is retried a while. */
static int create(fl_failworld *f, const fl_compare_opts *o, const fl_product_spec *ps,
                  fl_err *e) {
    fl_http h;
    fl_http_init(&h, &f->target, o->token, 10000);
    int rc = -1;
    for (int64_t until = clock_mono_ms() + 10000;; clock_sleep_ms(100))
        if (!(rc = fl_product_create(&h, ps, e)) || clock_mono_ms() > until) break;
    fl_http_close(&h);
    return rc;
}

/* ------------------------------------------------------ runs on threads */

/* One scene's load and verification, on a thread of its own (fl_run),
 * told by this thread when the fault came and when to stop. */
typedef struct frun {
    fl_scene_result *res;
    fl_run_opts ro;
    fl_run_result rr;
    fl_err e;
    int rc;
    pthread_t th;
    int started;
    int sell_out;                /* stop at the first 409 after the fault */
    atomic_int stop;             /* stop issuing now */
    atomic_int ended;            /* fl_run returned */
    _Atomic int64_t fault_ms;    /* when the fault came (0: not yet) */
    _Atomic int64_t first_ms;    /* the first 201 after it (0: none yet) */
    _Atomic uint64_t c201;
    /* the tick's own */
    int have_base;
    uint64_t base201, base409;
    char sku[65];
    char key[128];               /* its lock's key on a Redlock server */
    char stock_key[128];         /* its stock copy's key (one segment) */
    long long cut_stock;         /* failover: units left on the replica once cut off */
    long long kill_stock;        /* ...and on the primary just before the kill */
    char h1[128];                /* the first holder's id */
    int first_seen, second_seen; /* holders_seen saw the first, the second holder */
    int overlap;                 /* ...and the second while the first held it still */
    char label[112];
} frun;

/* fl_run's tick: publishes the 201s, times the first 201 after the fault
 * (those answered within BASE_AFTER_MS of it were in flight before), and
 * says when to stop. */
static int frun_tick(void *ud, const fl_progress *p) {
    frun *r = ud;
    atomic_store(&r->c201, p->c201);
    int64_t fault = atomic_load(&r->fault_ms), now = clock_mono_ms();
    if (fault) {
        if (!r->have_base && now >= fault + BASE_AFTER_MS) {
            r->have_base = 1;
            r->base201 = p->c201;
            r->base409 = p->c409;
        } else if (r->have_base) {
            if (!atomic_load(&r->first_ms) && p->c201 > r->base201) atomic_store(&r->first_ms, now);
            if (r->sell_out && p->c409 > r->base409) return 1;
        }
        if (now - fault > FAULT_LIMIT_MS) return 1;
    }
    return atomic_load(&r->stop);
}

/* The thread of one run: fl_run, then says it ended. */
static void *frun_main(void *arg) {
    frun *r = arg;
    r->rc = fl_run(&r->ro, &r->rr, &r->e);
    atomic_store(&r->ended, 1);
    return NULL;
}

/* Sets r up for res's scene on the product ps (already created). An open
 * loop at rate (0: closed loop) on conns connections. */
static void frun_init(frun *r, fl_failworld *f, const fl_compare_opts *o, fl_scene_result *res,
                      const fl_product_spec *ps, int conns, double rate, int settle_ms) {
    memset(r, 0, sizeof *r);
    r->res = res;
    snprintf(r->sku, sizeof r->sku, "%s", ps->sku);
    snprintf(r->key, sizeof r->key, "fs:{%s}:lock:0", ps->sku);
    snprintf(r->stock_key, sizeof r->stock_key, "fs:{%s}:stock:0", ps->sku);
    fl_run_opts *ro = &r->ro;
    fl_run_opts_default(ro);
    fl_load_opts *lo = &ro->load;
    lo->targets[0] = f->target;
    lo->ntargets = 1;
    lo->connections = conns;
    lo->threads = 1;
    lo->rate = rate;
    lo->users = o->users;
    lo->qty_min = lo->qty_max = 1;
    lo->duration_us = 120 * 1000000LL;         /* the tick ends it */
    lo->timeout_us = 30 * 1000000LL;
    ro->vantage.api = f->target;
    snprintf(ro->vantage.token, sizeof ro->vantage.token, "%s", o->token);
    snprintf(ro->vantage.redis_url, sizeof ro->vantage.redis_url, "%s", f->sentinel_url);
    snprintf(ro->vantage.db_path, sizeof ro->vantage.db_path, "%s", f->db);
    snprintf(ro->vantage.key_prefix, sizeof ro->vantage.key_prefix, "fs:");
    ro->create = 0;
    ro->product = *ps;
    ro->settle_ms = settle_ms;
    ro->sample_ms = 20;
    ro->tick = frun_tick;
    ro->tick_ud = r;
    snprintf(r->label, sizeof r->label, "[%s %s]", res->sc.strategy, ps->sku);
    ro->label = r->label;
    ro->progress = o->progress;
    ro->interrupted = o->interrupted;
}

/* Starts each run's thread; a run whose thread cannot start has ended,
 * with the reason. */
static void runs_start(frun *r, int n) {
    for (int i = 0; i < n; i++) {
        r[i].started = pthread_create(&r[i].th, NULL, frun_main, &r[i]) == 0;
        if (!r[i].started) {
            r[i].rc = fl_errf(&r[i].e, "cannot start a thread");
            atomic_store(&r[i].ended, 1);
        }
    }
}

/* Tells every run to issue nothing more (those in flight finish). */
static void runs_stop(frun *r, int n) {
    for (int i = 0; i < n; i++) atomic_store(&r[i].stop, 1);
}

/* Tells every run when the fault came (monotonic ms). */
static void runs_fault(frun *r, int n, int64_t at) {
    for (int i = 0; i < n; i++) atomic_store(&r[i].fault_ms, at);
}

/* Waits for every run to end and fills each scene's result. */
static void runs_join(frun *r, int n) {
    for (int i = 0; i < n; i++) {
        if (r[i].started) pthread_join(r[i].th, NULL);
        fl_scene_result *res = r[i].res;
        if (r[i].rc) {
            snprintf(res->note, sizeof res->note, "skipped: %.280s", r[i].e.msg);
        } else {
            fl_scene_fill(res, &r[i].rr);
            int64_t fault = atomic_load(&r[i].fault_ms), first = atomic_load(&r[i].first_ms);
            res->recover_ms = fault && first ? first - fault : -1;
        }
        fl_run_result_free(&r[i].rr);
    }
}

/* Whether some run has ended already (an error, an interrupt). */
static int runs_ended(frun *r, int n) {
    for (int i = 0; i < n; i++)
        if (atomic_load(&r[i].ended)) return 1;
    return 0;
}

/* Polls cond every 10 ms until it holds (0), the time runs out or a run
 * ends (-1). */
static int fl_failures_wait_for(int (*cond)(frun *r, int n, void *ud), frun *r, int n, void *ud,
                    int timeout_ms) {
    for (int64_t until = clock_mono_ms() + timeout_ms; clock_mono_ms() < until;
         clock_sleep_ms(10)) {
        if (cond(r, n, ud)) return 0;
        if (runs_ended(r, n)) return -1;
    }
    return cond(r, n, ud) ? 0 : -1;
}

/* Every run has at least its target 201s (ud: uint64_t[n]). */
static int sold_at_least(frun *r, int n, void *ud) {
    const uint64_t *want = ud;
    for (int i = 0; i < n; i++)
        if (atomic_load(&r[i].c201) < want[i]) return 0;
    return 1;
}

/* Each run's stock copy, read on the server at port (*ud), into
 * r->kill_stock; 1 when every run's has FO_WHILE_CUT units fewer than the
 * cut-off replica's (r->cut_stock): sold since the cut, missed by it. */
static int missed_enough(frun *r, int n, void *ud) {
    int port = *(const int *)ud;
    for (int i = 0; i < n; i++) {
        char v[32];
        if (fl_rget(port, r[i].stock_key, v, sizeof v) != 1) return 0;
        r[i].kill_stock = atoll(v);
        if (r[i].cut_stock - r[i].kill_stock < FO_WHILE_CUT) return 0;
    }
    return 1;
}

/* The lock servers a condition reads (ports; 0: none). */
typedef struct holders {
    int same[3];                 /* one holder has the lock on same[0] and... */
    int need;                    /* ...on this many of same[] in all... */
    int second;                  /* ...the first holder (0) or another (1)... */
    int witness;                 /* ...while this one holds the first's still (second only) */
} holders;

/* Who holds r's lock on the server at port: 1 with the holder's id in out
 * (a lock's value is "<id>:<token>", the token each server's own: see
 * lock/lua/format.lua), 0 when no one, -1 when the server does not answer. */
static int holder_at(const frun *r, int port, char *out, size_t len) {
    int rc = fl_rget(port, r->key, out, len);
    char *colon = rc == 1 ? strrchr(out, ':') : NULL;
    if (colon) *colon = '\0';
    return rc;
}

/* Whether one holder has r's lock on h->same[0] and on h->need servers
 * of h->same in all: 1 with its id in out, else 0. (Two orders that race
 * for a free lock may each get some servers: the winner has a majority,
 * not always every server.) */
static int held_on(const frun *r, const holders *h, char *out, size_t len) {
    char v[128];
    int have = 0;
    if (holder_at(r, h->same[0], out, len) != 1) return 0;
    for (int k = 0; k < 3 && h->same[k]; k++)
        have += holder_at(r, h->same[k], v, sizeof v) == 1 && !strcmp(out, v);
    return have >= h->need;
}

/* Each run's lock is held by one holder on every server of ud->same: its
 * first holder (kept in r->h1), or with ud->second another one; then r->h1,
 * read after it on ud->witness, says whether the first had not let go yet
 * -- the two held the lock at once (r->overlap). A run's holder, once
 * seen, stays seen: the runs' holders come and go at their own times. */
static int holders_seen(frun *r, int n, void *ud) {
    const holders *h = ud;
    int all = 1;
    for (int i = 0; i < n; i++) {
        char v[128], w[128];
        int *seen = h->second ? &r[i].second_seen : &r[i].first_seen;
        if (*seen) continue;
        if (!held_on(&r[i], h, v, sizeof v) || (h->second && !strcmp(v, r[i].h1))) {
            all = 0;
            continue;
        }
        *seen = 1;
        if (!h->second) snprintf(r[i].h1, sizeof r[i].h1, "%s", v);
        else r[i].overlap = holder_at(&r[i], h->witness, w, sizeof w) == 1 &&
                            !strcmp(w, r[i].h1);
    }
    return all;
}

/* No run's first holder has its lock on the server at port (*ud) any
 * more: the fault made that server forget it (another may hold it). */
static int forgot(frun *r, int n, void *ud) {
    int port = *(const int *)ud;
    for (int i = 0; i < n; i++) {
        char v[128];
        int rc = holder_at(&r[i], port, v, sizeof v);
        if (rc < 0 || (rc == 1 && !strcmp(v, r[i].h1))) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ the scenes */

static void product(fl_product_spec *ps, const char *tag, const fl_scene *sc, const char *what,
                    long long stock, int pause_ms, int ttl_ms) {
    memset(ps, 0, sizeof *ps);
    snprintf(ps->sku, sizeof ps->sku, "cmp-%s-%s-%s", tag, sc->strategy, what);
    snprintf(ps->strategy, sizeof ps->strategy, "%s", sc->strategy);
    ps->stock = stock;
    ps->segments = 1;
    ps->cs_delay_ms = pause_ms;
    ps->lock_ttl_ms = ttl_ms;
}

/* Marks every scene of the batch skipped, saying why. */
static void skip_all(fl_scene_result *res, int n, const char *why) {
    for (int i = 0; i < n; i++) {
        res[i].ran = 0;
        snprintf(res[i].note, sizeof res[i].note, "skipped: %.280s", why);
    }
}

/* The fault was not caused as the scenes say (their runs were verified
 * all the same): none of them is as expected, whatever its verdict, since
 * none tested what it claims. */
static void not_forced(frun *r, int n) {
    for (int i = 0; i < n; i++) r[i].res->as_expected = 0;
}

/* Gives every scene the same account of what was done. */
static void detail_all(frun *r, int n, const char *text) {
    for (int i = 0; i < n; i++)
        if (r[i].res->ran) snprintf(r[i].res->detail, sizeof r[i].res->detail, "%s", text);
}

/* Fills the words of the failover scenes: what was done, when (t_kill 0:
 * nothing, for the reason in what; t_promoted 0: no promotion), and each
 * run's stock on the replica once cut off and on the primary before the
 * kill, as Redis had them. */
static void failover_detail(const frun *r, fl_scene_result *res, int n, const char *what,
                            int64_t t_kill, int64_t t_promoted) {
    for (int i = 0; i < n; i++) {
        if (!res[i].ran) continue;
        if (!t_kill) {
            snprintf(res[i].detail, sizeof res[i].detail, "no failover: %.300s", what);
            continue;
        }
        char next[64] = "no 201 after it", after[48] = "";
        if (res[i].recover_ms >= 0)
            snprintf(next, sizeof next, "next 201 %.2f s after the kill", res[i].recover_ms / 1e3);
        if (t_promoted)
            snprintf(after, sizeof after, " (promoted after %.2f s)", (t_promoted - t_kill) / 1e3);
        snprintf(res[i].detail, sizeof res[i].detail,
                 "replica cut off with %lld units left; the primary sold %lld more, which the "
                 "replica missed; primary killed with SIGKILL; %s; %s%s", r[i].cut_stock,
                 r[i].cut_stock - r[i].kill_stock,
                 t_promoted ? "replica promoted" : "NO promotion within 30 s", next, after);
        size_t cl = strlen(res[i].sc.condition);
        if (res[i].recover_ms >= 0)
            snprintf(res[i].sc.condition + cl, sizeof res[i].sc.condition - cl,
                     "; next 201 %.2fs after the kill", res[i].recover_ms / 1e3);
    }
}

/* The failover scenes, res[0..n) at once, each on its own product: sales
 * until FO_BEFORE, the replica cut off, FO_WHILE_CUT more (as the stock
 * copies on the replica and the primary say), the primary
 * killed, sales to the end once the sentinels promote the replica. */
static void failover_scenes(fl_failworld *f, const fl_compare_opts *o, const char *tag,
                            fl_scene_result *res, int n, frun *r) {
    fl_err e = { "" };
    fl_proc *replica = NULL, *primary = primary_of(f, f->stock, STOCK_NAME, 1, &replica);
    if (!primary) {
        skip_all(res, n, "the stock's primary has no replica in sync");
        return;
    }
    for (int i = 0; i < n; i++) {
        fl_product_spec ps;
        product(&ps, tag, &res[i].sc, "failover", FO_STOCK, 0, 0);
        if (create(f, o, &ps, &e)) {
            skip_all(res, n, e.msg);
            return;
        }
        frun_init(&r[i], f, o, &res[i], &ps, 8, FO_RATE, 10000);
        r[i].sell_out = 1;
    }
    char what[400] = "";
    uint64_t want[4];
    int64_t t_kill = 0, t_promoted = 0;
    runs_start(r, n);
    for (int i = 0; i < n; i++) want[i] = FO_BEFORE;
    if (fl_failures_wait_for(sold_at_least, r, n, want, 20000)) {
        snprintf(what, sizeof what, "not %d sold before the cut within 20 s", FO_BEFORE);
        goto out;
    }
    /* The replica has every write so far; from the cut on, none. */
    if (fl_replica_wait(primary->port, 5000, &e) ||
        fl_replica_cut(primary->port, replica->port, &e)) {
        snprintf(what, sizeof what, "the replica could not be cut off: %.300s", e.msg);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char v[32];
        if (fl_rget(replica->port, r[i].stock_key, v, sizeof v) != 1) {
            snprintf(what, sizeof what, "no stock copy on the replica");
            goto out;
        }
        r[i].cut_stock = atoll(v);
    }
    if (fl_failures_wait_for(missed_enough, r, n, &primary->port, 20000)) {
        snprintf(what, sizeof what, "not %d more sold while cut off within 20 s", FO_WHILE_CUT);
        goto out;
    }
    t_kill = clock_mono_ms();
    fl_proc_kill(primary);
    runs_fault(r, n, t_kill);
    for (int64_t until = t_kill + FO_PROMOTE_WAIT_MS; clock_mono_ms() < until; clock_sleep_ms(20))
        if (primary_of(f, f->stock, STOCK_NAME, 0, NULL) == replica) {
            t_promoted = clock_mono_ms();
            break;
        }
out:
    if (!t_promoted) runs_stop(r, n);            /* else each stops once sold out */
    runs_join(r, n);
    if (!t_promoted) not_forced(r, n);
    failover_detail(r, res, n, what, t_kill, t_promoted);
}

/* Waits until the sentinel the service asks for Redlock's member A (the
 * first) names rep, and rep says it is a primary; 0, or -1 at until. */
static int promoted(fl_failworld *f, const fl_proc *rep, int64_t until) {
    for (;; clock_sleep_ms(20)) {
        if (fl_sentinel_master(f->sent, 1, LOCK_NAME) == rep->port && fl_is_master(rep->port))
            return 0;
        if (clock_mono_ms() > until) return -1;
    }
}

/* Causes a Redlock scene's fault, the first holder holding the lock: the
 * server that was down back and C's clock a minute on (clock); C back and
 * B crashed, its append-only file cut back to mark (aof); A's primary
 * killed and its replica lrep promoted, C back (member). *down_ms: how
 * long B (aof) or A (member) was out; *gone_ms: how old the mark was when
 * B crashed (aof). 0, or -1 with e set. */
static int cause(fl_failworld *f, fl_failure kind, fl_proc *A, const fl_proc *lrep,
                 const fl_aof_mark *mark, int64_t *gone_ms, int64_t *down_ms, fl_err *e) {
    fl_proc *B = &f->rl[0], *C = &f->rl[1];
    if (kind == FL_FAIL_CLOCK) {
        f->clock_s += RL_JUMP_S;
        return fl_server_start_again(B, e) || fl_clockjump_set(f->offset_file, f->clock_s, e)
                   ? -1 : 0;
    }
    if (kind == FL_FAIL_AOF) {
        if (fl_server_start_again(C, e)) return -1;
        *gone_ms = clock_mono_ms() - mark->at_ms;
        return fl_servers_crash(B, 1, mark, down_ms, e);
    }
    /* The sentinels are told to fail over at once (SENTINEL FAILOVER: no
     * wait for down-after, no election that a split vote could put off by
     * twice the failover timeout), so the promotion comes well inside the
     * holder's pause; the failover scene times an automatic one. C comes
     * back meanwhile: until the promotion, the waiting orders find the
     * lock busy on B rather than no quorum. */
    int64_t t_kill = clock_mono_ms();
    fl_proc_kill(A);
    if (fl_sentinel_failover(f->sent[0].port, LOCK_NAME, 5000, e) ||
        fl_server_start_again(C, e))
        return -1;
    if (promoted(f, lrep, t_kill + MB_PROMOTE_WAIT_MS))
        return fl_errf(e, "the replica was not promoted within %d s", MB_PROMOTE_WAIT_MS / 1000);
    *down_ms = clock_mono_ms() - t_kill;
    return 0;
}

/* Fills the words of a Redlock scene: what was done, when (took: the
 * first holder seen, ms after the start, -1 none; forgot: the server the
 * fault was for seen without its lock; second: the second holder seen, ms
 * after the first, -1 none, the reason in why). */
static void redlock_detail(fl_failure kind, int64_t took, int forgot, int64_t gone_ms,
                           int64_t down_ms, int64_t second, const char *why, char *out,
                           size_t len) {
    int member = kind == FL_FAIL_MEMBER;
    if (took < 0) {
        snprintf(out, len, "%s", why);
        return;
    }
    if (kind == FL_FAIL_CLOCK)
        snprintf(out, len, "B down while the holder took A and C (%.2f s in); B back, C's clock "
                 "jumped +%d s%s", took / 1e3, RL_JUMP_S,
                 forgot ? ": the lock expired on C only" : "");
    else if (kind == FL_FAIL_AOF)
        snprintf(out, len, "C down while the holder took A and B (%.2f s in); C back, B killed "
                 "with SIGKILL, its append-only file cut back to where it ended %.2f s before, "
                 "restarted (down %.2f s)%s", took / 1e3, gone_ms / 1e3, down_ms / 1e3,
                 forgot ? ": it forgot the lock" : "");
    else if (forgot)
        snprintf(out, len, "A's replica cut off and C down; the holder took A and B (%.2f s in); "
                 "A's primary killed with SIGKILL, C back, the replica (without the lock) "
                 "promoted by SENTINEL FAILOVER %.2f s after the kill", took / 1e3, down_ms / 1e3);
    else
        snprintf(out, len, "A's replica cut off and C down; the holder took A and B (%.2f s in); "
                 "A's primary killed with SIGKILL", took / 1e3);
    size_t l = strlen(out);
    if (second >= 0)
        snprintf(out + l, len - l, "; a second holder took %s %.2f s after the first, which "
                 "held %s still (inside its ~%d ms pause, lease %d ms)",
                 member ? "A and C" : "B and C", second / 1e3, member ? "B" : "A",
                 member ? MB_PAUSE_MS : RL_PAUSE_MS, member ? MB_TTL_MS : RL_TTL_MS);
    else snprintf(out + l, len - l, "; %s", why);
}

/* The Redlock scenes. A is fllock's primary, B and C the plain servers. */
static void redlock_scenes(fl_failworld *f, const fl_compare_opts *o, const char *tag,
                           fl_failure kind, fl_scene_result *res, int n, frun *r) {
    fl_err e = { "" };
    int member = kind == FL_FAIL_MEMBER;
    fl_proc *lrep = NULL, *A = primary_of(f, f->lockm, LOCK_NAME, member, &lrep);
    fl_proc *B = &f->rl[0], *C = &f->rl[1];
    const char *what = kind == FL_FAIL_CLOCK ? "clock" : kind == FL_FAIL_AOF ? "aof" : "member";
    fl_aof_mark mark;
    memset(&mark, 0, sizeof mark);
    if (kind == FL_FAIL_CLOCK && !f->clockjump) {
        skip_all(res, n, f->clockjump_why);
        return;
    }
    if (!A) {
        skip_all(res, n, member ? "Redlock's member A has no replica in sync"
                                : "Redlock's member A has no primary");
        return;
    }
    for (int i = 0; i < n; i++) {
        fl_product_spec ps;
        product(&ps, tag, &res[i].sc, what, RL_STOCK, member ? MB_PAUSE_MS : RL_PAUSE_MS,
                member ? MB_TTL_MS : RL_TTL_MS);
        if (create(f, o, &ps, &e)) {
            skip_all(res, n, e.msg);
            return;
        }
        frun_init(&r[i], f, o, &res[i], &ps, 2, 0, 4000);
    }
    /* Before the hold: where B's append-only file ends, A's replica cut
     * off, and who is down while the first holder takes the lock. */
    if ((kind == FL_FAIL_AOF && fl_aof_mark_take(B, &mark, &e)) ||
        (member && fl_replica_cut(A->port, lrep->port, &e))) {
        skip_all(res, n, e.msg);
        return;
    }
    fl_proc_kill(kind == FL_FAIL_CLOCK ? B : C);
    char why[200] = "";
    int64_t t0 = clock_mono_ms(), t_held = 0, t_second = 0, down_ms = 0, gone_ms = 0;
    int freed_seen = 0;
    runs_start(r, n);
    /* The first holder on A and C (clock), A and B (aof, member); the
     * second on the servers the fault freed, while the first still holds a
     * server the fault left alone (the witness). */
    holders first = { { A->port, kind == FL_FAIL_CLOCK ? C->port : B->port, 0 }, 2, 0, 0 };
    holders second = { { member ? lrep->port : B->port, C->port, 0 }, 2, 1,
                       member ? B->port : A->port };
    if (fl_failures_wait_for(holders_seen, r, n, &first, HOLD_WAIT_MS)) {
        snprintf(why, sizeof why, "no first holder within %d s", HOLD_WAIT_MS / 1000);
        goto out;
    }
    t_held = clock_mono_ms();
    if (cause(f, kind, A, lrep, &mark, &gone_ms, &down_ms, &e)) goto fault_failed;
    /* Seen, not assumed: the server the fault was for has forgotten the
     * first holder's lock (C's copy expired; B's lost; A's new primary
     * never had it). */
    int freed = kind == FL_FAIL_CLOCK ? C->port : kind == FL_FAIL_AOF ? B->port : lrep->port;
    if (fl_failures_wait_for(forgot, r, n, &freed, FORGET_WAIT_MS)) {
        fl_errf(&e, "the lock was still on the server the fault was for after %d s",
                FORGET_WAIT_MS / 1000);
        goto fault_failed;
    }
    freed_seen = 1;
    runs_fault(r, n, clock_mono_ms());
    if (fl_failures_wait_for(holders_seen, r, n, &second, SECOND_WAIT_MS)) {
        snprintf(why, sizeof why, "no second holder within %d s of the fault",
                 SECOND_WAIT_MS / 1000);
        goto out;
    }
    t_second = clock_mono_ms();
    for (int i = 0; i < n; i++)
        if (!r[i].overlap) {
            snprintf(why, sizeof why, "the second holder came after the first had let go: the "
                     "fault came too late");
            t_second = 0;
        }
    goto out;
fault_failed:
    snprintf(why, sizeof why, "the fault could not be caused: %.160s", e.msg);
out:
    runs_stop(r, n);                  /* the holders in flight finish; nothing new starts */
    runs_join(r, n);
    /* Whatever happened, every server runs again for what follows. */
    fl_proc *down[] = { B, C };
    for (int i = 0; i < 2; i++)
        if (down[i]->pid <= 0 && fl_server_start_again(down[i], &e))
            fprintf(stderr, "flashload compare: %s\n", e.msg);
    char text[400];
    redlock_detail(kind, t_held ? t_held - t0 : -1, freed_seen, gone_ms, down_ms,
                   t_second ? t_second - t_held : -1, why, text, sizeof text);
    detail_all(r, n, text);
    for (int i = 0; i < n; i++) res[i].recover_ms = -1;    /* a holder's 201 is no recovery */
    if (!t_second) not_forced(r, n);
}

int fl_failures_ready(fl_failworld *f, const fl_compare_opts *o, char *why, size_t len) {
    if (!f) {
        snprintf(why, len, "the Redis failures need the services compare starts itself");
        return -1;
    }
    (void)o;
    if (fl_failures_serving(f)) {
        snprintf(why, len, "the Redis failures' servers: %.250s", f->why);
        return -1;
    }
    return 0;
}

void fl_failures_run(fl_failworld *f, const fl_compare_opts *o, const char *tag,
                     fl_scene_result *res, int n) {
    static frun runs[4];               /* large: off the stack */
    char why[320];
    if (n > 4) n = 4;
    if (fl_failures_ready(f, o, why, sizeof why)) {
        skip_all(res, n, why);
        return;
    }
    fl_failure kind = res[0].sc.failure;
    int64_t t0 = clock_mono_ms();
    if (kind == FL_FAIL_FAILOVER) failover_scenes(f, o, tag, res, n, runs);
    else redlock_scenes(f, o, tag, kind, res, n, runs);
    /* No set duration: the batch's, from its products to its verdicts. */
    for (int i = 0; i < n; i++) res[i].sc.duration_s = (clock_mono_ms() - t0) / 1e3;
}

/* ---------------------------------------------------------------- names */

const char *fl_failure_title(fl_failure kind) {
    switch (kind) {
    case FL_FAIL_FAILOVER: return "a failover to a replica that missed the last sales";
    case FL_FAIL_CLOCK: return "a Redlock server's clock jumps";
    case FL_FAIL_AOF: return "a Redlock server loses its last AOF second";
    case FL_FAIL_MEMBER: return "a Redlock member fails over to a replica without the lock";
    default: return NULL;
    }
}

const char *fl_failure_name(fl_failure kind) {
    switch (kind) {
    case FL_FAIL_FAILOVER: return "failover";
    case FL_FAIL_CLOCK: return "clock jump";
    case FL_FAIL_AOF: return "AOF lost";
    case FL_FAIL_MEMBER: return "member failover";
    default: return "none";
    }
}
