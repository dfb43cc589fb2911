/* maint.c: the maintenance thread.
 *
 * - Heartbeat: <prefix>instance:<id> with a short TTL, so other instances
 *   can tell a live owner of a pending record from a dead one.
 * - Rebuilds (rebuild.c) of the Redis copies found missing, queued here.
 * - Sweeps: the pending records of dead owners settled (reconcile.c).
 * - Undo retries: reservations whose undo failed (Redis down) are retried
 *   until Redis answers. */
#include <assert.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "service/service.h"

#define HEARTBEAT_TTL_MS 5000
#define SWEEP_EVERY_MS 2000

typedef struct orphan {
    svc_product *p;
    char order_id[DB_ORDER_ID_LEN + 1];
    char idem_key[DB_KEY_MAX + 1];
    struct orphan *next;
} orphan;

struct svc_maint {
    svc_app *a;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    svc_product **rebuild;             /* queued rebuilds */
    size_t nrebuild, caprebuild;
    orphan *orphans;
    uint64_t errors_seen;          /* redis + db errors at the last sweep */
    int trims_left;                /* sweeps that still trim (see trim_after_errors) */
};

/* ------------------------------------------------------------------- thread */

void svc_maint_request_forced_rebuild(svc_maint *m, svc_product *p) {
    atomic_store(&p->rebuild_forced, 1);   /* before queueing: seen by its run */
    svc_maint_request_rebuild(m, p);
}

void svc_maint_request_rebuild(svc_maint *m, svc_product *p) {
    if (atomic_exchange(&p->rebuilding, 1)) return;   /* already queued */
    pthread_mutex_lock(&m->mu);
    if (m->nrebuild == m->caprebuild) {
        size_t cap = m->caprebuild ? m->caprebuild * 2 : 16;
        svc_product **v = realloc(m->rebuild, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&m->mu);
            atomic_store(&p->rebuilding, 0);
            return;
        }
        m->rebuild = v;
        m->caprebuild = cap;
    }
    m->rebuild[m->nrebuild++] = p;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

void svc_maint_retry_undo(svc_maint *m, svc_product *p, const char *order_id,
                          const char *idem_key) {
    orphan *o = calloc(1, sizeof *o);
    if (!o) return;   /* the sweeper settles it after the pending timeout */
    o->p = p;
    snprintf(o->order_id, sizeof o->order_id, "%s", order_id);
    snprintf(o->idem_key, sizeof o->idem_key, "%s", idem_key ? idem_key : "");
    pthread_mutex_lock(&m->mu);
    o->next = m->orphans;
    m->orphans = o;
    pthread_mutex_unlock(&m->mu);
}

static void run_rebuilds(svc_maint *m, db *d, stock_conn *sc) {
    pthread_mutex_lock(&m->mu);
    size_t n = m->nrebuild;
    svc_product **todo = malloc((n ? n : 1) * sizeof *todo);
    if (todo) {
        if (n) memcpy(todo, m->rebuild, n * sizeof *todo);
        m->nrebuild = 0;
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&todo[i]->rebuilding, 0);
        int force = atomic_exchange(&todo[i]->rebuild_forced, 0);
        if (svc_rebuild(m->a, d, sc, todo[i], force) != 0) {
            if (force) svc_maint_request_forced_rebuild(m, todo[i]);
            else svc_maint_request_rebuild(m, todo[i]);
        }
    }
    free(todo);
}

static void run_orphans(svc_maint *m, stock_conn *sc) {
    pthread_mutex_lock(&m->mu);
    orphan *list = m->orphans;
    m->orphans = NULL;
    pthread_mutex_unlock(&m->mu);
    while (list) {
        orphan *o = list;
        list = o->next;
        stock_ref ref = { &o->p->sp, o->order_id, o->idem_key };
        int done = 0;
        int rc = stock_undo(sc, &ref, 1, &done);
        if (rc == 0 && done) {
            free(o);
            continue;
        }
        /* Still failing: keep it for later. When Redis itself failed, keep
         * the rest too, untried: one timeout per orphan would hold up the
         * heartbeat behind a stalled Redis. */
        pthread_mutex_lock(&m->mu);
        o->next = m->orphans;
        m->orphans = o;
        if (rc != 0) {
            orphan *last = list;
            while (last && last->next) last = last->next;
            if (last) {
                last->next = m->orphans;
                m->orphans = list;
            }
            list = NULL;
        }
        pthread_mutex_unlock(&m->mu);
    }
}

/* An outage of Redis or the database makes every thread answer a burst of
 * 503s, and glibc keeps the memory they freed: RSS stepped up ~10 MB at the
 * soak's first Redis outage and 1-2 MB at each next one, with valgrind
 * finding every byte freed. Trimming at the sweeps during an outage and
 * just after it returns that memory (soak, 6 restarts in 200 s: 41 MB at
 * the end without, 34 MB with a trim at every sweep); in steady state, with
 * no errors, nothing is trimmed, so the hot path never meets it. */
static void trim_after_errors(svc_maint *m) {
    uint64_t errors = atomic_load(&m->a->m.redis_errors) + atomic_load(&m->a->m.db_errors);
    if (errors != m->errors_seen) {
        m->errors_seen = errors;
        m->trims_left = 2;
    }
    if (m->trims_left > 0) {
        m->trims_left--;
        malloc_trim(0);
    }
}

static void *maint_main(void *arg) {
    svc_maint *m = arg;
    pthread_setname_np(pthread_self(), "fs-maint");
    svc_app *a = m->a;
    char err[256];
    db *d = db_open(a->cfg.db_path, &a->db_opt, err, sizeof err);
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    int64_t next_beat = 0, next_sweep = clock_mono_ms() + SWEEP_EVERY_MS;
    assert(sc != NULL);
    if (!d) svc_log(SVC_LOG_ERROR, "maintenance: %s", err);
    pthread_mutex_lock(&m->mu);
    while (!m->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (m->nrebuild == 0) pthread_cond_timedwait(&m->cv, &m->mu, &until);
        pthread_mutex_unlock(&m->mu);
        int64_t now = clock_mono_ms();
        if (now >= next_beat) {
            stock_heartbeat(sc, HEARTBEAT_TTL_MS);
            next_beat = now + 1000;
        }
        if (d) {
            run_rebuilds(m, d, sc);
            if (now >= next_sweep) {
                svc_reconcile(a, d, sc, 1);
                next_sweep = now + SWEEP_EVERY_MS;
                trim_after_errors(m);
            }
        }
        run_orphans(m, sc);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    run_orphans(m, sc);   /* a last try for undos that failed during shutdown */
    stock_conn_free(sc);
    db_close(d);
    return NULL;
}

svc_maint *svc_maint_start(svc_app *a, char *err, size_t errlen) {
    svc_maint *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->a = a;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    if (pthread_create(&m->thread, NULL, maint_main, m) != 0) {
        snprintf(err, errlen, "cannot start the maintenance thread");
        free(m);
        return NULL;
    }
    return m;
}

void svc_maint_stop(svc_maint *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    while (m->orphans) {
        orphan *o = m->orphans;
        m->orphans = o->next;
        svc_log(SVC_LOG_WARN, "reservation %s of %s left for reconciliation (Redis unreachable)",
                o->order_id, o->p->sku);
        free(o);
    }
    free(m->rebuild);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}
