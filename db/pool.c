/* pool.c: the connection budget (pool.h).
 *
 * One mutex guards the counts and the idle stack; connections are opened
 * and closed outside it (an open may wait seconds for a server that does
 * not answer), their slot counted in `open` meanwhile, so the budget holds
 * whoever is opening. The idle stack is last-in first-out: the connection
 * used most recently is used again (its statements prepared, its pages
 * warm), and the ones at the bottom age out. */
#include "db/pool.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "db/db_int.h"

struct db_pool {
    char *target;
    db_options opt;
    int max;
    _Atomic int idle_ms;          /* db_pool_set_idle */
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* a connection was given back, or a slot freed */
    db **idle;                    /* [0, nidle): the top is the most recent */
    int64_t *idle_since;          /* when each was given back (monotonic ms) */
    int nidle;
    int open, in_use, waiting;
    db_pool_stats st;             /* the counters (st.max .. st.waiting are filled on read) */
};

db_pool *db_pool_new(const char *target, const db_options *opt, int max, char *err,
                     size_t errlen) {
    assert(max >= 1);
    db_pool *p = calloc(1, sizeof *p);
    pthread_condattr_t ca;
    if (!p || !(p->target = strdup(target)) || !(p->idle = calloc((size_t)max, sizeof *p->idle)) ||
        !(p->idle_since = calloc((size_t)max, sizeof *p->idle_since))) {
        if (p) {
            free(p->target);
            free(p->idle);
        }
        free(p);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->opt = *opt;
    p->max = max;
    p->idle_ms = DB_POOL_IDLE_MS;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    return p;
}

void db_pool_free(db_pool *p) {
    if (!p) return;
    assert(p->in_use == 0 && p->waiting == 0);    /* every taker gave back */
    for (int i = 0; i < p->nidle; i++) db_close(p->idle[i]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->idle);
    free(p->idle_since);
    free(p->target);
    free(p);
}

/* Moves the connections idle since before `before` out of the stack into
 * out[] (the bottom of the stack is the oldest), for the caller to close
 * once it has let go of the mutex: at most AGED_MAX. Returns how many. */
#define AGED_MAX 64

static int take_aged(db_pool *p, int64_t before, db **out) {
    int n = 0;
    while (n < p->nidle && n < AGED_MAX && p->idle_since[n] < before) n++;
    if (n == 0) return 0;
    memcpy(out, p->idle, (size_t)n * sizeof *out);
    memmove(p->idle, p->idle + n, (size_t)(p->nidle - n) * sizeof *p->idle);
    memmove(p->idle_since, p->idle_since + n, (size_t)(p->nidle - n) * sizeof *p->idle_since);
    p->nidle -= n;
    p->open -= n;
    p->st.closed += (uint64_t)n;
    return n;
}

static void close_all(db **ds, int n) {
    for (int i = 0; i < n; i++) db_close(ds[i]);
}

static void deadline_of(struct timespec *ts, int wait_ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += wait_ms / 1000;
    ts->tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

db_status db_pool_take(db_pool *p, int wait_ms, db **out, char *err, size_t errlen) {
    struct timespec until;
    int64_t waited_from = 0;
    int timed_out = 0;
    *out = NULL;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->nidle > 0) {
            *out = p->idle[--p->nidle];
            break;
        }
        if (p->open < p->max) {
            p->open++;                       /* the slot is held while it opens */
            break;
        }
        if (timed_out || wait_ms <= 0) {
            p->st.timeouts++;
            if (waited_from) p->st.wait_us += (uint64_t)(clock_mono_us() - waited_from);
            pthread_mutex_unlock(&p->mu);
            snprintf(err, errlen, "all %d database connections of this instance stayed in use "
                     "for %d ms (--db-max-connections)", p->max, wait_ms > 0 ? wait_ms : 0);
            return DB_NOCONN;
        }
        if (!waited_from) {
            waited_from = clock_mono_us();
            p->st.waits++;
            deadline_of(&until, wait_ms);
        }
        p->waiting++;
        int rc = pthread_cond_timedwait(&p->cv, &p->mu, &until);
        p->waiting--;
        assert(rc == 0 || rc == ETIMEDOUT);
        timed_out = rc == ETIMEDOUT;
    }
    p->in_use++;
    if (waited_from) p->st.wait_us += (uint64_t)(clock_mono_us() - waited_from);
    assert(p->in_use <= p->open && p->open <= p->max);
    db *fresh = *out;
    pthread_mutex_unlock(&p->mu);
    if (fresh) goto taken;
    db_status st;
    if ((*out = db_open_st(p->target, &p->opt, &st, err, errlen)) != NULL) {
        pthread_mutex_lock(&p->mu);
        p->st.opened++;
        pthread_mutex_unlock(&p->mu);
        goto taken;
    }
    pthread_mutex_lock(&p->mu);              /* the slot back: another may try */
    p->open--;
    p->in_use--;
    p->st.failures++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return st;
taken:
    pthread_mutex_lock(&p->mu);
    p->st.takes++;
    pthread_mutex_unlock(&p->mu);
    return DB_OK;
}

void db_pool_give(db_pool *p, db *d) {
    db *aged[AGED_MAX];
    int naged;
    if (!d) return;
    /* What a taker may leave behind: an open transaction (an error left
     * it), a lock wait of its own (the lock table sets one). */
    if (d->drv->in_tx(d)) db_rollback(d);
    d->drv->wait_ms(d, p->opt.busy_timeout_ms > 0 ? p->opt.busy_timeout_ms : 2000);
    int64_t now = clock_mono_ms();
    pthread_mutex_lock(&p->mu);
    assert(p->in_use > 0 && p->nidle < p->max);
    p->in_use--;
    p->idle[p->nidle] = d;
    p->idle_since[p->nidle++] = now;
    naged = take_aged(p, now - p->idle_ms, aged);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    close_all(aged, naged);
}

void db_pool_trim(db_pool *p) {
    db *aged[AGED_MAX];
    int naged;
    do {
        pthread_mutex_lock(&p->mu);
        naged = take_aged(p, clock_mono_ms() - p->idle_ms, aged);
        if (naged) pthread_cond_broadcast(&p->cv);   /* slots freed */
        pthread_mutex_unlock(&p->mu);
        close_all(aged, naged);
    } while (naged == AGED_MAX);
}

void db_pool_set_idle(db_pool *p, int idle_ms) {
    assert(idle_ms >= 0);
    p->idle_ms = idle_ms;
}

const char *db_pool_target(const db_pool *p) { return p->target; }

const db_options *db_pool_options(const db_pool *p) { return &p->opt; }

void db_pool_get_stats(db_pool *p, db_pool_stats *out) {
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->max = p->max;
    out->open = p->open;
    out->in_use = p->in_use;
    out->waiting = p->waiting;
    pthread_mutex_unlock(&p->mu);
}
