/* client.c: the lock client -- which backend serves it (a table, by URL
 * scheme), making and freeing it, its last error and its counters. What a
 * lock does is lock.c's; what a server does is its backend's. */
#include "lock/lock_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every kind of lock server, chosen by the URL's scheme; the one without a
 * scheme (Redis: redis://, rediss://, redis-sentinel://, host:port) last,
 * as the default. */
static const lock_backend *const BACKENDS[] = {
    &lock_backend_zk,
    &lock_backend_etcd,
    &lock_backend_redis,
};
#define NBACKENDS (sizeof BACKENDS / sizeof BACKENDS[0])

/* The backend serving url. */
static const lock_backend *backend_of(const char *url) {
    for (size_t i = 0; i < NBACKENDS; i++)
        if (!BACKENDS[i]->scheme || !strncmp(url, BACKENDS[i]->scheme, strlen(BACKENDS[i]->scheme)))
            return BACKENDS[i];
    return NULL;   /* unreachable: the last has no scheme */
}

/* One kind of server per client, and no more URLs than it takes. Returns
 * the backend, or NULL with err. */
static const lock_backend *pick_backend(const lock_options *o, char *err, size_t errlen) {
    const lock_backend *be = backend_of(o->urls[0] ? o->urls[0] : "");
    for (int i = 0; i < o->nurls; i++) {
        if (!o->urls[i]) {
            snprintf(err, errlen, "lock: URL %d is NULL", i + 1);
            return NULL;
        }
        const lock_backend *k = backend_of(o->urls[i]);
        if (k != be) {
            snprintf(err, errlen,
                     "lock: one client serves one kind of server: %s and %s URLs mixed (%.100s)",
                     be->kind, k->kind, o->urls[i]);
            return NULL;
        }
    }
    if (o->nurls > be->max_urls) {
        snprintf(err, errlen, "lock: give %s one URL%s, not %d", be->kind, be->urls_hint,
                 o->nurls);
        return NULL;
    }
    return be;
}

/* Frees what lock_client_new made, once its threads and holds are gone. */
static void client_destroy(lock_client *c) {
    if (c->bstate) c->be->destroy(c);
    pthread_cond_destroy(&c->cb_cv);
    pthread_cond_destroy(&c->wd_cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

lock_client *lock_client_new(const lock_options *o, char *err, size_t errlen) {
    if (!o || !o->urls || o->nurls < 1 || o->nurls > LOCK_MAX_SERVERS) {
        snprintf(err, errlen, "lock: need 1 to %d Redis URLs, or one zk:// or etcd:// URL",
                 LOCK_MAX_SERVERS);
        return NULL;
    }
    const lock_backend *be = pick_backend(o, err, errlen);
    if (!be) return NULL;
    lock_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->be = be;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 1000;
    c->watchdog = o->watchdog != 0;
    pthread_mutex_init(&c->mu, NULL);
    lock_cond_init(&c->wd_cv);
    lock_cond_init(&c->cb_cv);
    if (be->open(c, o, err, errlen)) {
        c->bstate = NULL;
        client_destroy(c);
        return NULL;
    }
    return c;
}

void lock_client_free(lock_client *c) {
    if (!c) return;
    lock_watchdog_stop(c);
    c->be->stop(c);
    lock_entries_drop_all(c);
    client_destroy(c);
}

lock_errcode lock_client_error(lock_client *c, char *buf, size_t len) {
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    lock_errcode code = c->err;
    if (buf && len) snprintf(buf, len, "%s", c->errstr);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    return code;
}

void lock_client_stats(lock_client *c, lock_stats *o) {
    memset(o, 0, sizeof *o);
    o->acquired = atomic_load(&c->st.acquired);
    o->busy = atomic_load(&c->st.busy);
    o->errors = atomic_load(&c->st.errors);
    o->reentered = atomic_load(&c->st.reentered);
    o->attempts = atomic_load(&c->st.attempts);
    o->wakeups = atomic_load(&c->st.wakeups);
    o->timeouts = atomic_load(&c->st.timeouts);
    o->renewals = atomic_load(&c->st.renewals);
    o->renew_errors = atomic_load(&c->st.renew_errors);
    o->lost = atomic_load(&c->st.lost);
    o->released = atomic_load(&c->st.released);
    o->not_owner = atomic_load(&c->st.not_owner);
    o->unknown = atomic_load(&c->st.unknown);
    o->keyspace_wakeups = atomic_load(&c->st.keyspace_wakeups);
    o->requeued = atomic_load(&c->st.requeued);
    if (c->be->stats) c->be->stats(c, o);
}
