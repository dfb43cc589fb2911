/* lock.c: the public calls on a lock -- acquire (reentry first, then the
 * backend's acquire), the handles, release -- the same for every kind of
 * server. See lock.h for the contract and the format; the backends (redis.c,
 * zk.c, etcd.c) do the server side, held.c keeps the holds. */
#include "lock/lock_int.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"

/* ------------------------------------------------------------------ reentry */

/* Adds h to the hold e and re-arms the lease from start_us
 * (< 0: the lease is left as it is). */
static void add_handle(lock_entry *e, lock_client *c, lock_handle *h, int64_t start_us,
                       int64_t ttl_ms) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    assert(!e->released && e->count >= 1 && e->refs > e->count);  /* held, pinned by reentry */
    h->c = c;
    h->e = e;
    h->next = e->handles;
    e->handles = h;
    e->count++;
    e->refs++;
    if (start_us < 0) return;
    e->ttl_ms = ttl_ms;
    atomic_store(&e->lease_end_us, start_us + ttl_ms * 1000 - lock_drift_us(ttl_ms));
    e->next_renew_us = start_us + ttl_ms * 1000 / 3;
}

/* An acquire of a name this owner already holds: the server must still
 * have it, which the backend's check finds out (and renews the lease: to
 * ttl_ms where the backend re-arms, else to the length it granted).
 * Returns LOCK_OK (h is now a handle of the hold), LOCK_ERROR (*code, err),
 * or LOCK_BUSY meaning "not held: acquire normally". */
static lock_status reenter(lock_client *c, const char *name, const char *owner, int64_t ttl_ms,
                           lock_handle *h, lock_errcode *code, char *err, size_t errlen) {
    *code = LOCK_ERR_LOST;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    lock_entry *e = lock_table_find(c, name, owner);
    if (!e) {
        lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
        return LOCK_BUSY;
    }
    if (atomic_load(&e->lost)) {
        lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
        snprintf(err, errlen, "%s: this owner holds it but it was lost; release that handle first",
                 name);
        return LOCK_ERROR;
    }
    e->refs++;
    int64_t ttl = c->be->rearms ? ttl_ms : e->ttl_ms;
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);

    lock_checking k = { .hold = e->hold, .ttl_ms = ttl, .start_us = -1 };
    c->be->check(c, &k, 1);
    int in_time = k.start_us < 0 ||
                  clock_mono_us() < k.start_us + ttl * 1000 - lock_drift_us(ttl);
    lock_status st = LOCK_ERROR;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    if (k.outcome == LOCK_CHECK_OURS && in_time && !atomic_load(&e->lost)) {
        add_handle(e, c, h, k.start_us, ttl);
        st = LOCK_OK;
    } else if (k.outcome == LOCK_CHECK_GONE || atomic_load(&e->lost)) {
        lock_entry_mark_lost(c, e, LOCK_ERR_LOST, "reentry found the lock gone");
        snprintf(err, errlen, "%s: this owner held it but it is gone (expired or taken)", name);
    } else {
        *code = k.code;
        snprintf(err, errlen, "%s", k.outcome == LOCK_CHECK_OURS
                                        ? "the reentry was confirmed too late" : k.why);
    }
    lock_entry_unref(e);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    return st;
}

/* ------------------------------------------------------------------ acquire */

static lock_status fail(lock_client *c, lock_errcode code, const char *msg, char *err,
                        size_t errlen) {
    if (err != msg) snprintf(err, errlen, "%s", msg);
    lock_set_error(c, code, msg);
    atomic_fetch_add(&c->st.errors, 1);
    return LOCK_ERROR;
}

/* Puts a fresh hold into the table and hands out its first handle. e's
 * name and hold are set by the caller. */
static void hold(lock_client *c, const char *owner, uint64_t fence, uint64_t incarnation,
                 int64_t start_us, int64_t ttl_ms, lock_entry *e, lock_handle *h) {
    assert(e->count == 0 && !e->handles);      /* fresh: not in the table yet */
    snprintf(e->owner, sizeof e->owner, "%s", owner);
    e->fence = fence;
    e->incarnation = incarnation;
    e->ttl_ms = ttl_ms;
    atomic_init(&e->lease_end_us, start_us + ttl_ms * 1000 - lock_drift_us(ttl_ms));
    atomic_init(&e->lost, 0);
    e->next_renew_us = start_us + ttl_ms * 1000 / 3;
    e->count = 1;
    e->refs = 1;
    e->handles = h;
    h->c = c;
    h->e = e;
    int renew = c->watchdog && c->be->watchdog_renews;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    lock_table_insert(c, e);
    if (renew && lock_watchdog_ensure(c) == 0) pthread_cond_signal(&c->wd_cv);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    if (e->hold && c->be->held) c->be->held(c, e->hold);
}

lock_status lock_acquire(lock_client *c, const char *name, int64_t ttl_ms, int64_t wait_ms,
                         const char *owner, lock_handle **out, char *err, size_t errlen) {
    char scratch[256], me[64];
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (out) *out = NULL;
    if (!c) {
        snprintf(err, errlen, "no lock client");
        return LOCK_ERROR;
    }
    if (!name || !out || ttl_ms < 3 || ttl_ms > (1LL << 40))
        return fail(c, LOCK_ERR_ARG, "lock_acquire: need a name, a handle pointer and ttl_ms >= 3",
                    err, errlen);
    if (owner && (!owner[0] || strlen(owner) > LOCK_OWNER_MAX))
        return fail(c, LOCK_ERR_ARG, "lock_acquire: owner must be 1 to 200 bytes", err, errlen);
    size_t n = strlen(name);
    if (n == 0 || n > LOCK_NAME_MAX) {
        snprintf(err, errlen, "lock name must be 1 to %d bytes", LOCK_NAME_MAX);
        return fail(c, LOCK_ERR_ARG, err, err, errlen);
    }
    if (!owner) {
        snprintf(me, sizeof me, "%ld:%ld", (long)getpid(), (long)syscall(SYS_gettid));
        owner = me;
    }
    int64_t start = clock_mono_us();
    int64_t deadline = wait_ms < 0 ? INT64_MAX : start + wait_ms * 1000;
    lock_entry *e = calloc(1, sizeof *e);
    lock_handle *h = calloc(1, sizeof *h);
    if (!e || !h) {
        free(e);
        free(h);
        return fail(c, LOCK_ERR_NOMEM, "out of memory", err, errlen);
    }
    lock_errcode code;
    lock_status st = reenter(c, name, owner, ttl_ms, h, &code, err, errlen);
    if (st != LOCK_BUSY) {
        free(e);
        if (st == LOCK_OK) {
            atomic_fetch_add(&c->st.reentered, 1);
            atomic_fetch_add(&c->st.acquired, 1);
            *out = h;
            return LOCK_OK;
        }
        free(h);
        return fail(c, code, err, err, errlen);
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    code = LOCK_ERR_IO;
    lock_took t = { 0 };
    st = c->be->acquire(c, name, ttl_ms, deadline, &t, &code, err, errlen);
    if (st == LOCK_OK) {
        e->hold = t.hold;
        e->lease_src = t.lease_src;
        e->ticket = t.ticket;
        hold(c, owner, t.fence, t.incarnation, t.start_us, t.ttl_ms, e, h);
    }
    if (st == LOCK_OK) {
        atomic_fetch_add(&c->st.acquired, 1);
        *out = h;
        return LOCK_OK;
    }
    free(e);
    free(h);
    if (st == LOCK_ERROR) return fail(c, code, err, err, errlen);
    atomic_fetch_add(&c->st.busy, 1);
    snprintf(err, errlen, "%s is held by another (waited %lld ms)", name,
             (long long)((clock_mono_us() - start) / 1000));
    return LOCK_BUSY;
}

/* ------------------------------------------------------------------ handles */

uint64_t lock_fence(const lock_handle *h) { return h ? h->e->fence : 0; }

uint64_t lock_incarnation(const lock_handle *h) { return h ? h->e->incarnation : 0; }

uint64_t lock_ticket(const lock_handle *h) { return h ? h->e->ticket : 0; }

int64_t lock_remaining_ms(const lock_handle *h) {
    if (!h || atomic_load(&h->e->lost)) return 0;
    const atomic_int_fast64_t *end = h->e->lease_src ? h->e->lease_src : &h->e->lease_end_us;
    int64_t left = atomic_load(end) - clock_mono_us();
    return left >= 0 ? left / 1000 : -((-left + 999) / 1000);
}

int lock_lost(const lock_handle *h) { return h ? atomic_load(&h->e->lost) : 1; }

const char *lock_name(const lock_handle *h) { return h ? h->e->name : ""; }

lock_errcode lock_err(const lock_handle *h, char *buf, size_t len) {
    if (!h) return LOCK_ERR_ARG;
    lock_client *c = h->c;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    lock_errcode code = h->e->err;
    if (buf && len) snprintf(buf, len, "%s", h->e->errstr);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    return code;
}

void lock_on_lost(lock_handle *h, void (*fn)(lock_handle *h, void *ud), void *ud) {
    if (!h) return;
    lock_client *c = h->c;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    h->on_lost = fn;
    h->ud = ud;
    /* Lost before anyone listened: tell now, so the loss is never missed. */
    if (fn && atomic_load(&h->e->lost) && !h->notified) {
        lock_entry *e = h->e;
        e->refs++;
        lock_handle_notify(c, h);
        lock_entry_unref(e);
    }
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
}

/* Takes h off its entry. Returns 1 if it was the last handle:
 * the entry is then out of the table and the caller must free the lock. */
static int detach(lock_client *c, lock_handle *h) {
    assert(lock_mu_holds(LOCK_RANK_CLIENT));
    lock_entry *e = h->e;
    assert(!e->released && e->count >= 1);    /* in the table while it has handles */
    lock_handle **pp = &e->handles;
    while (*pp && *pp != h) pp = &(*pp)->next;
    assert(*pp == h);
    *pp = h->next;
    e->count--;
    if (e->count > 0) return 0;
    lock_table_remove(c, e);
    return 1;
}

lock_release_result lock_release_ex(lock_handle *h, char *err, size_t errlen) {
    char scratch[8];
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (!h) {
        snprintf(err, errlen, "no handle");
        return LOCK_UNKNOWN;
    }
    lock_client *c = h->c;
    lock_entry *e = h->e;
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    /* Its lost callback may be running on another thread: let it finish. */
    while (h->in_cb && !pthread_equal(h->cb_thread, pthread_self()))
        pthread_cond_wait(&c->cb_cv, &c->mu);
    int last = detach(c, h);
    int lost = atomic_load(&e->lost);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);

    lock_release_result res;
    if (!last) {
        res = lost ? LOCK_NOT_OWNER : LOCK_RELEASED;
        if (lost) snprintf(err, errlen, "%s was lost", e->name);
    } else {
        res = c->be->release(c, e->hold, err, errlen);
        if (res == LOCK_UNKNOWN) lock_set_error(c, LOCK_ERR_IO, err);
    }
    atomic_fetch_add(res == LOCK_RELEASED ? &c->st.released
                     : res == LOCK_NOT_OWNER ? &c->st.not_owner : &c->st.unknown, 1);
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    int deferred = h->in_cb;
    if (deferred) h->free_after_cb = 1;
    lock_entry_unref(e);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    if (!deferred) free(h);
    return res;
}

lock_release_result lock_release(lock_handle *h) { return lock_release_ex(h, NULL, 0); }
