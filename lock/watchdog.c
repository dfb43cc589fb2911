/* watchdog.c: one background thread per client renews every held lock at
 * ttl/3, in pipelined batches (all servers at once), and reports a lock it
 * finds gone -- or whose lease ran out while Redis could not be reached --
 * through lock_lost() and the handles' on_lost callbacks. A renewal is the
 * backend's check, given a batch of holds at once (Redis: one pipelined
 * round of extend.lua on every server; etcd: a lease keepalive and a look at
 * the key per hold); ZooKeeper sessions keep themselves. A renewal that
 * merely failed (I/O) is retried soon; only a definite "not ours" or the
 * end of the lease by the monotonic clock counts as lost. */
#include "lock/lock_int.h"

#include <assert.h>
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

/* Collects up to RENEW_BATCH entries due for renewal and pins them.
 * Returns how many; *next is when the next one falls due. */
static int collect(lock_client *c, due *d, int64_t now, int64_t *next) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
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

/* Applies one entry's renewal outcome: renewed from start,
 * found gone, or unknown (why). */
static void apply(lock_client *c, const due *d, lock_check outcome, int64_t start,
                  const char *why) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
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

/* Renews the n pinned entries through the backend's check, in one batch,
 * and applies the results. */
static void renew(lock_client *c, due *d, lock_checking *k, int n) {
    assert(!lock_mu_holds(LOCK_RANK_CLIENT));
    for (int i = 0; i < n; i++)
        k[i] = (lock_checking){ .hold = d[i].e->hold, .ttl_ms = d[i].ttl_ms, .start_us = -1 };
    int64_t asked = clock_mono_us();
    c->be->check(c, k, n);
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    for (int i = 0; i < n; i++) {
        apply(c, &d[i], k[i].outcome, k[i].start_us >= 0 ? k[i].start_us : asked, k[i].why);
        lock_entry_unref(d[i].e);
    }
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
}

static void *watchdog_main(void *arg) {
    lock_client *c = arg;
    due *d = calloc(RENEW_BATCH, sizeof *d);
    lock_checking *k = calloc(RENEW_BATCH, sizeof *k);
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    while (!c->stopping) {
        int64_t next = INT64_MAX;
        int n = d && k ? collect(c, d, clock_mono_us(), &next) : 0;
        if (n == 0) {
            lock_cond_wait_until(&c->wd_cv, &c->mu,
                                 d && k ? next : clock_mono_us() + RETRY_MAX_US);
            if (!d) d = calloc(RENEW_BATCH, sizeof *d);
            if (!k) k = calloc(RENEW_BATCH, sizeof *k);
            continue;
        }
        lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
        renew(c, d, k, n);
        lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    }
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    free(k);
    free(d);
    return NULL;
}

int lock_watchdog_ensure(lock_client *c) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    if (c->wd_started) return 0;
    if (c->stopping || lock_thread_start(&c->wd_thread, watchdog_main, c)) return -1;
    c->wd_started = 1;
    return 0;
}

void lock_watchdog_stop(lock_client *c) {
    assert(!lock_mu_holds(LOCK_RANK_CLIENT));
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    c->stopping = 1;
    int started = c->wd_started;
    pthread_cond_broadcast(&c->wd_cv);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    if (started) pthread_join(c->wd_thread, NULL);
}
