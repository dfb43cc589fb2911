/* health.c: what /healthz reports, measured by probes, not remembered.
 *
 * Two prober threads, one per dependency, each with its own connection
 * (the database's one of the instance's budget, db/pool.h, kept): Redis
 * is PINGed, and SQLite gets a small real write transaction (it fails
 * as an order's commit would: database locked past a short wait, disk full,
 * file read-only). Each keeps its latest result and when it completed.
 * /healthz reads that state and never waits on a dependency itself; a
 * result older than a few probe periods counts as unknown (the prober is
 * stuck on a dependency that does not answer).
 *
 * A failed order commit asks for an immediate database probe, so a failure
 * shows at once; recovery shows at the next probe that succeeds, with no
 * order needed to clear it (a load balancer routing by /healthz sends none). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "service/app.h"
#include "service/log.h"
#include "service/ops/health.h"

#define PROBE_EVERY_MS 500
#define DB_PROBE_BUSY_MS 250

typedef enum probe_kind { PROBE_REDIS, PROBE_DB } probe_kind;

typedef struct prober {
    svc_health *h;
    probe_kind kind;
    pthread_t thread;
    int started;
    _Atomic int ok;                /* the latest completed probe succeeded */
    _Atomic int64_t at_ms;         /* when it completed (monotonic); 0: none yet */
    _Atomic int poke;              /* probe again now */
} prober;

struct svc_health {
    svc_app *a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    prober probe[2];
};

/* One probe; logs when the state changes, with the detail clients never see. */
static void probe_once(prober *p, db **d, stock_conn *sc) {
    svc_app *a = p->h->a;
    char err[256] = "";
    int ok;
    if (p->kind == PROBE_REDIS) {
        ok = sc && stock_ping(sc) == 0;
        if (!ok) snprintf(err, sizeof err, "%s", sc ? stock_conn_errstr(sc) : "no connection");
    } else {
        /* Its connection is the prober's own for the instance's life (one
         * of the budget's, taken once it can be opened): a probe never
         * waits behind the order path for one, so a busy instance is not
         * reported as a database that is down. */
        if (!*d && db_pool_take(a->dbpool, DB_PROBE_BUSY_MS, d, err, sizeof err) == DB_OK)
            db_set_lock_wait(*d, a->db_opt.busy_timeout_ms < DB_PROBE_BUSY_MS
                                     ? a->db_opt.busy_timeout_ms : DB_PROBE_BUSY_MS);
        ok = *d && db_probe(*d) == DB_OK;
        if (!ok && *d) snprintf(err, sizeof err, "%s", db_errstr(*d));
    }
    int was = atomic_exchange(&p->ok, ok);
    int first = atomic_load(&p->at_ms) == 0;
    atomic_store(&p->at_ms, clock_mono_ms());
    const char *what = p->kind == PROBE_REDIS ? "redis" : "database";
    if (!ok && (was || first)) svc_log(SVC_LOG_ERROR, "health: %s unavailable: %s", what, err);
    if (ok && !was && !first) svc_log(SVC_LOG_INFO, "health: %s available again", what);
}

static void *prober_main(void *arg) {
    prober *p = arg;
    svc_health *h = p->h;
    char err[256];
    pthread_setname_np(pthread_self(), p->kind == PROBE_REDIS ? "fs-health-rd" : "fs-health-db");
    stock_conn *sc = p->kind == PROBE_REDIS ? stock_conn_new(&h->a->stock_cfg, err, sizeof err)
                                            : NULL;
    db *d = NULL;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        pthread_mutex_unlock(&h->mu);
        probe_once(p, &d, sc);
        pthread_mutex_lock(&h->mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += PROBE_EVERY_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!h->stopping && !atomic_exchange(&p->poke, 0) &&
               pthread_cond_timedwait(&h->cv, &h->mu, &until) == 0) {}
    }
    pthread_mutex_unlock(&h->mu);
    stock_conn_free(sc);
    db_pool_give(h->a->dbpool, d);
    return NULL;
}

/* A result this old means the prober is stuck waiting on its dependency. */
static int64_t stale_after_ms(const svc_app *a) {
    int timeout = a->cfg.redis_timeout_ms > DB_PROBE_BUSY_MS ? a->cfg.redis_timeout_ms
                                                             : DB_PROBE_BUSY_MS;
    return 3 * PROBE_EVERY_MS + 2 * timeout;
}

svc_health *svc_health_start(svc_app *a, char *err, size_t errlen) {
    svc_health *h = calloc(1, sizeof *h);
    pthread_condattr_t ca;
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->a = a;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < 2; i++) {
        prober *p = &h->probe[i];
        p->h = h;
        p->kind = i == 0 ? PROBE_REDIS : PROBE_DB;
        if (pthread_create(&p->thread, NULL, prober_main, p) != 0) {
            snprintf(err, errlen, "cannot start the health threads");
            svc_health_stop(h);
            return NULL;
        }
        p->started = 1;
    }
    /* The first results before serving, so /healthz means something from
     * the first request on (bounded: a dead dependency fails its probe
     * within its timeout). */
    int64_t until = clock_mono_ms() + stale_after_ms(a);
    while ((!atomic_load(&h->probe[0].at_ms) || !atomic_load(&h->probe[1].at_ms)) &&
           clock_mono_ms() < until)
        clock_sleep_ms(2);
    return h;
}

void svc_health_stop(svc_health *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < 2; i++)
        if (h->probe[i].started) pthread_join(h->probe[i].thread, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

void svc_health_poke_db(svc_health *h) {
    if (!h || atomic_exchange(&h->probe[PROBE_DB].poke, 1)) return;
    pthread_mutex_lock(&h->mu);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static svc_health_state state_of(const prober *p, int64_t now, int64_t stale, int64_t *age) {
    int64_t at = atomic_load(&p->at_ms);
    *age = at ? now - at : -1;
    if (!at || now - at > stale) return HEALTH_UNKNOWN;
    return atomic_load(&p->ok) ? HEALTH_OK : HEALTH_DOWN;
}

void svc_health_read(const svc_health *h, svc_health_view *v) {
    int64_t now = clock_mono_ms(), stale = stale_after_ms(h->a);
    v->redis = state_of(&h->probe[PROBE_REDIS], now, stale, &v->redis_age_ms);
    v->db = state_of(&h->probe[PROBE_DB], now, stale, &v->db_age_ms);
}

const char *svc_health_state_name(svc_health_state s) {
    return s == HEALTH_OK ? "ok" : s == HEALTH_DOWN ? "unavailable" : "unknown";
}
