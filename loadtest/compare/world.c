/* world.c: the world a `flashload compare` runs in: the processes it
 * starts (a private redis-server, the lock servers -- Redlock's three
 * redis-servers, a ZooKeeper, an etcd -- and one or two instances of
 * flashsale, on free ports in a temp dir) or the services it was given,
 * and the progress line its parts tell the time left by.
 *
 * A file of its own below compare.c, because the probes of the lock table
 * (probe.c) work in the same world -- they wait for a lock server, start
 * a second instance -- and the world must not be compare.c's: the
 * comparison calls the probes, never the other way round. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"

/* ------------------------------------------------------------- the services */

static const char *const SERVICE_ARGS[] = { "--fault-injection", "--key-prefix", "fs:",
                                            "--pending-timeout-ms", "3000", "--lock-wait-ms",
                                            "1000", NULL };

static const char *const LS_STRATEGY[FL_LS_COUNT] = { "redlock", "zookeeper", "etcd" };

/* The lock server a strategy needs (FL_LS_COUNT: none of those): its
 * own, or the one whose lock an unsafe variant takes without the fence. */
static int server_of(const char *strategy) {
    for (int i = 0; i < FL_LS_COUNT; i++)
        if (!strcmp(LS_STRATEGY[i], strategy)) return i;
    return !strcmp(strategy, "unsafe-redlock-no-fence") ? FL_LS_REDLOCK : FL_LS_COUNT;
}

fl_lockserver *fl_world_server(fl_world *w, const char *strategy) {
    int i = server_of(strategy);
    return i < FL_LS_COUNT ? &w->ls[i] : NULL;
}

int fl_world_ready(fl_world *w, const char *strategy, char *why, size_t len) {
    fl_lockserver *ls = fl_world_server(w, strategy);
    if (!ls || !w->lock_servers) return 0;    /* none needed, or the given services' own */
    for (int i = 0; i < ls->n && ls->state == 0; i++) {
        fl_err e = { "" };
        int ms = !strcmp(strategy, "zookeeper") ? 90000 : 20000;
        if (ls->p[i].pid <= 0 || fl_proc_wait(&ls->p[i], ms, &e)) {
            ls->state = -1;
            snprintf(ls->why, sizeof ls->why, "%.290s", e.msg[0] ? e.msg : "not started");
        }
    }
    if (ls->state == 0) ls->state = 1;
    if (ls->state < 0) {
        snprintf(why, len, "%s's lock server could not start: %.200s", strategy, ls->why);
        return -1;
    }
    return 0;
}

/* Spawns the lock servers (without waiting: a JVM takes its time) and
 * builds the services' flags for those that could be spawned. A server
 * that fails later is found by fl_world_ready, before its first scene. */
static void spawn_lock_servers(const fl_compare_opts *o, fl_world *w) {
    int na = 0;
    for (int i = 0; SERVICE_ARGS[i]; i++) w->svc_args[na++] = SERVICE_ARGS[i];
    for (int k = 0; k < FL_LS_COUNT; k++) {
        fl_lockserver *ls = &w->ls[k];
        ls->strategy = LS_STRATEGY[k];
        ls->n = k == FL_LS_REDLOCK ? FL_REDLOCK_N : 1;
        fl_proc_kind kind = k == FL_LS_REDLOCK ? FL_PROC_REDIS_AOF
                            : k == FL_LS_ZOOKEEPER ? FL_PROC_ZOOKEEPER : FL_PROC_ETCD;
        const char *bin = k == FL_LS_ZOOKEEPER && o->java_bin[0] ? o->java_bin
                          : k == FL_LS_ETCD && o->etcd_bin[0]    ? o->etcd_bin : NULL;
        char *flag = w->args[k];
        flag[0] = '\0';
        for (int i = 0; i < ls->n; i++) {
            char dir[400];
            fl_err e = { "" };
            snprintf(dir, sizeof dir, "%s/%s%d", w->dir, ls->strategy, i);
            if (fl_server_spawn(kind, dir, bin, &ls->p[i], &e)) {
                ls->state = -1;
                snprintf(ls->why, sizeof ls->why, "%.290s", e.msg);
                break;
            }
            size_t used = strlen(flag), ul = strlen(ls->p[i].url);
            if (used + ul + 2 > sizeof w->args[k]) break;     /* cannot happen: 3 short URLs */
            if (i) flag[used++] = ',';
            memcpy(flag + used, ls->p[i].url, ul + 1);
        }
        if (ls->state < 0) continue;
        w->svc_args[na++] = k == FL_LS_REDLOCK ? "--redlock" : k == FL_LS_ZOOKEEPER ? "--zookeeper"
                                                                                   : "--etcd";
        w->svc_args[na++] = flag;
    }
    w->svc_args[na] = NULL;
}

int fl_world_add_instance(fl_world *w, fl_err *e) {
    if (w->nsvc == 2) return fl_errf(e, "at most two instances");
    fl_proc *p = &w->svc[w->nsvc];
    if (fl_service_start(w->service_bin, w->dir, w->redis_url, w->db_path, w->svc_args, p, e))
        return -1;
    w->nsvc++;
    return fl_target_parse(p->url, &w->targets[w->ntargets++], e);
}

/* Whether any scene wanted needs a lock server of its own. */
static int wants_lock_servers(const fl_compare_opts *o) {
    if (!o->lock_servers) return 0;
    if (o->nstrategies == 0) return 1;
    for (int k = 0; k < o->nstrategies; k++)
        if (server_of(o->strategies[k]) < FL_LS_COUNT) return 1;
    return 0;
}

int fl_world_up(const fl_compare_opts *o, fl_world *w, int failures, fl_err *e) {
    memset(w, 0, sizeof *w);
    snprintf(w->token, sizeof w->token, "%s", o->token);
    snprintf(w->service_bin, sizeof w->service_bin, "%s", o->service_bin);
    if (o->ntargets) {
        memcpy(w->targets, o->targets, sizeof w->targets);
        w->ntargets = o->ntargets;
        snprintf(w->redis_url, sizeof w->redis_url, "%s", o->redis_url);
        snprintf(w->db_path, sizeof w->db_path, "%s", o->db_path);
        snprintf(w->key_prefix, sizeof w->key_prefix, "%s", o->key_prefix);
        return 0;
    }
    if (access(o->service_bin, X_OK) != 0)
        return fl_errf(e, "no service binary at %s (build it, or give --flashsale or --target)",
                       o->service_bin);
    /* Under $TMPDIR, as mkdtemp(1) does: a caller (a test) can tell its
     * own servers from those of another comparison on the machine. */
    const char *tmp = getenv("TMPDIR");
    snprintf(w->dir, sizeof w->dir, "%.200s/flashload-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(w->dir)) {
        int err = errno;
        w->dir[0] = '\0';
        return fl_errf(e, "cannot make a temp dir under %s: %s", tmp && tmp[0] ? tmp : "/tmp",
                       strerror(err));
    }
    snprintf(w->key_prefix, sizeof w->key_prefix, "fs:");
    /* Its own SQLite file, or the database --db names (a PostgreSQL
     * server's: every scene's orders on it). */
    if (o->db_path[0]) snprintf(w->db_path, sizeof w->db_path, "%s", o->db_path);
    else snprintf(w->db_path, sizeof w->db_path, "%s/orders.db", w->dir);
    w->lock_servers = wants_lock_servers(o);
    if (w->lock_servers) spawn_lock_servers(o, w);
    else {
        int na = 0;
        for (int i = 0; SERVICE_ARGS[i]; i++) w->svc_args[na++] = SERVICE_ARGS[i];
        w->svc_args[na] = NULL;
    }
    if (fl_redis_start(w->dir, &w->redis, e)) return -1;
    snprintf(w->redis_url, sizeof w->redis_url, "%s", w->redis.url);
    /* Started now, used last: their sentinels learn of each other
     * meanwhile. */
    if (failures && !(w->fail = fl_failures_spawn(w->dir, o->service_bin, o->db_path)))
        return fl_errf(e, "out of memory");
    return fl_world_add_instance(w, e);
}

void fl_world_down(fl_world *w, int keep) {
    fl_failures_down(w->fail);
    w->fail = NULL;
    for (int i = w->nsvc - 1; i >= 0; i--) fl_proc_stop(&w->svc[i], 30000);
    for (int k = 0; k < FL_LS_COUNT; k++)
        for (int i = 0; i < w->ls[k].n; i++) fl_proc_stop(&w->ls[k].p[i], 10000);
    fl_proc_stop(&w->redis, 5000);
    if (!w->dir[0]) return;
    if (keep) fprintf(stderr, "flashload compare: logs kept in %s\n", w->dir);
    else fl_rmtree(w->dir);
}

/* ------------------------------------------------------------- progress */

static void fmt_clock(double secs, char *out, size_t len) {
    long s = secs > 0 && secs < 1e9 ? (long)(secs + 0.5) : 0;
    snprintf(out, len, "%ld:%02ld", s / 60, s % 60);
}

void fl_eta_step(fl_eta *e, double weight, char *out, size_t len) {
    e->done += weight;
    double elapsed = (clock_mono_ms() - e->t0_ms) / 1000.0, left = e->planned - e->done;
    char a[48], b[48];
    fmt_clock(elapsed, a, sizeof a);
    if (left < 0.5 || e->done <= 0) {
        snprintf(out, len, "%s elapsed", a);
        return;
    }
    fmt_clock(elapsed / e->done * left, b, sizeof b);
    snprintf(out, len, "%s elapsed, about %s left", a, b);
}
