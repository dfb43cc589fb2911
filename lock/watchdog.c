/* watchdog.c: one background thread per client renews every held lock at
 * ttl/3, in pipelined batches (all servers at once), and reports a lock it
 * finds gone -- or whose lease ran out while Redis could not be reached --
 * through lock_lost() and the handles' on_lost callbacks. A renewal that
 * merely failed (I/O) is retried soon; only a definite "not ours" or the
 * end of the lease by the monotonic clock counts as lost. For an etcd
 * client a renewal is the backend's check (a lease keepalive and a look at
 * the key), one hold at a time; ZooKeeper sessions keep themselves. */
#include "lock/lock_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define RENEW_BATCH 128
#define RETRY_MAX_US 100000     /* a failed renewal is retried within this */

/* What one renewal round needs of an entry, copied under c->mu. */
typedef struct due {
    lock_entry *e;
    int64_t ttl_ms;
} due;

/* Collects up to RENEW_BATCH entries due for renewal and pins them (c->mu
 * held). Returns how many; *next is when the next one falls due. */
static int collect(lock_client *c, due *d, int64_t now, int64_t *next) {
    int n = 0;
    *next = INT64_MAX;
    for (lock_entry *e = c->all; e; e = e->next) {
        if (atomic_load(&e->lost)) continue;
        if (e->next_renew_us > now) {
            if (e->next_renew_us < *next) *next = e->next_renew_us;
            continue;
        }
        if (n == RENEW_BATCH) {
            *next = now;
            break;
        }
        e->refs++;
        d[n].e = e;
        d[n].ttl_ms = e->ttl_ms;
        n++;
    }
    return n;
}

/* Applies one entry's renewal outcome (c->mu held): renewed from start,
 * found gone, or unknown (why). */
static void apply(lock_client *c, const due *d, lock_check outcome, int64_t start,
                  const char *why) {
    lock_entry *e = d->e;
    if (e->released || atomic_load(&e->lost)) return;
    int64_t now = clock_mono_us();
    int64_t lease_end = start + d->ttl_ms * 1000 - lock_drift_us(d->ttl_ms);
    if (outcome == LOCK_CHECK_OURS && now < lease_end) {
        atomic_store(&e->lease_end_us, lease_end);
        e->next_renew_us = start + d->ttl_ms * 1000 / 3;
        atomic_fetch_add(&c->st.renewals, 1);
        return;
    }
    if (outcome == LOCK_CHECK_GONE) {
        lock_entry_mark_lost(c, e, LOCK_ERR_LOST,
                             "renewal found the lock gone (expired, deleted or taken by another)");
        return;
    }
    char msg[700];
    if (outcome == LOCK_CHECK_OURS) why = "the renewal was confirmed too late";
    atomic_fetch_add(&c->st.renew_errors, 1);
    if (now >= atomic_load(&e->lease_end_us)) {
        snprintf(msg, sizeof msg, "lease ran out while renewal failed: %s", why);
        lock_entry_mark_lost(c, e, LOCK_ERR_IO, msg);
        return;
    }
    e->err = LOCK_ERR_IO;
    snprintf(e->errstr, sizeof e->errstr, "renewal failed (retrying): %.160s", why);
    int64_t retry = d->ttl_ms * 100;   /* ttl/10, in microseconds */
    e->next_renew_us = now + (retry < RETRY_MAX_US ? retry : RETRY_MAX_US);
}

/* The Redis outcome of call i: a quorum renewed, enough said no, or unknown. */
static lock_check redis_outcome(lock_client *c, const lock_replies *rs, int i, unsigned all) {
    lock_tally t = lock_tally_int(rs, i, all);
    if (t.ok >= c->quorum) return LOCK_CHECK_OURS;
    if (t.no > c->nservers - c->quorum) return LOCK_CHECK_GONE;
    return LOCK_CHECK_UNKNOWN;
}

/* Renews the n pinned entries of a backend client, one check each. */
static void renew_backend(lock_client *c, due *d, int n) {
    for (int i = 0; i < n; i++) {
        char why[600] = "";
        int64_t start = clock_mono_us();
        lock_check r = c->be->check(c, d[i].e->hold, &start, why, sizeof why);
        pthread_mutex_lock(&c->mu);
        apply(c, &d[i], r, start, why);
        lock_entry_unref(d[i].e);
        pthread_mutex_unlock(&c->mu);
    }
}

/* Renews the n pinned entries (c->mu not held) and applies the results. */
static void renew(lock_client *c, due *d, int n) {
    if (c->be) {
        renew_backend(c, d, n);
        return;
    }
    lock_call *calls = calloc((size_t)n, sizeof *calls);
    lock_replies rs = { 0 };
    unsigned all = (1u << c->nservers) - 1;
    int64_t start = clock_mono_us();
    for (int i = 0; calls && i < n; i++) {
        rconn_cmd_init(&calls[i].cmd);
        lock_call_start(&calls[i], LOCK_S_EXTEND, 1);
        rconn_cmd_adds(&calls[i].cmd, d[i].e->name);
        rconn_cmd_adds(&calls[i].cmd, d[i].e->id);
        rconn_cmd_addll(&calls[i].cmd, d[i].ttl_ms);
    }
    int ran = calls && lock_run(c, calls, n, all, &rs) == 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        if (ran) {
            lock_check r = redis_outcome(c, &rs, i, all);
            char why[600] = "";
            if (r == LOCK_CHECK_UNKNOWN) lock_replies_why(c, &rs, all, why, sizeof why);
            apply(c, &d[i], r, start, why);
        } else {
            d[i].e->next_renew_us = clock_mono_us() + RETRY_MAX_US;   /* out of memory */
        }
        lock_entry_unref(d[i].e);
    }
    pthread_mutex_unlock(&c->mu);
    if (ran) lock_replies_free(&rs);
    for (int i = 0; calls && i < n; i++) rconn_cmd_free(&calls[i].cmd);
    free(calls);
}

static void *watchdog_main(void *arg) {
    lock_client *c = arg;
    due *d = calloc(RENEW_BATCH, sizeof *d);
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        int64_t next;
        int n = d ? collect(c, d, clock_mono_us(), &next) : 0;
        if (n == 0) {
            lock_cond_wait_until(&c->wd_cv, &c->mu, d ? next : clock_mono_us() + RETRY_MAX_US);
            if (!d) d = calloc(RENEW_BATCH, sizeof *d);
            continue;
        }
        pthread_mutex_unlock(&c->mu);
        renew(c, d, n);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    free(d);
    return NULL;
}

int lock_watchdog_ensure(lock_client *c) {
    if (c->wd_started) return 0;
    if (c->stopping || lock_thread_start(&c->wd_thread, watchdog_main, c)) return -1;
    c->wd_started = 1;
    return 0;
}

void lock_watchdog_stop(lock_client *c) {
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    int started = c->wd_started;
    pthread_cond_broadcast(&c->wd_cv);
    pthread_mutex_unlock(&c->mu);
    if (started) pthread_join(c->wd_thread, NULL);
}
