/* util.c: the helpers every file of the lock module uses: condition
 * variables on the monotonic clock, threads started with signals blocked,
 * SIGPIPE guards, randomness and incarnation ids, the lease drift, the
 * client's last error -- and the lock-order check, which asserts on every
 * mutex taken that lock_int.h's LOCKING ORDER holds. */
#include "lock/lock_int.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ------------------------------------------------------------ lock order */

#ifndef NDEBUG
/* How many mutexes of each rank the calling thread holds. */
static _Thread_local int held_ranks[LOCK_RANK_COUNT];
#endif

void lock_mu_take(pthread_mutex_t *mu, lock_rank rank) {
#ifndef NDEBUG
    assert(rank > 0 && rank < LOCK_RANK_COUNT);
    /* Taking a mutex ranked at or below one held inverts the order, which
     * another thread taking them the documented way would deadlock on. */
    for (int k = rank; k < LOCK_RANK_COUNT; k++) assert(held_ranks[k] == 0);
    held_ranks[rank]++;
#else
    (void)rank;
#endif
    pthread_mutex_lock(mu);
}

void lock_mu_drop(pthread_mutex_t *mu, lock_rank rank) {
#ifndef NDEBUG
    assert(held_ranks[rank] > 0);
    held_ranks[rank]--;
#else
    (void)rank;
#endif
    pthread_mutex_unlock(mu);
}

int lock_mu_holds(lock_rank rank) {
#ifndef NDEBUG
    return held_ranks[rank] > 0;
#else
    (void)rank;
    return 1;
#endif
}

/* -------------------------------------------------------------------- misc */

int64_t lock_drift_us(int64_t ttl_ms) { return ttl_ms * 10 + 2000; }

void lock_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

void lock_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_us) {
    if (until_us == INT64_MAX) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts = { until_us / 1000000, (until_us % 1000000) * 1000 };
    pthread_cond_timedwait(cv, mu, &ts);
}

int lock_random(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

uint64_t lock_incarnation_new(void) {
    uint64_t id = 0;
    while (id == 0)
        if (lock_random(&id, sizeof id)) return 0;
    return id;
}

uint64_t lock_incarnation_parse(const char *s, size_t len) {
    uint64_t id = 0;
    if (!s || len != 16) return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return 0;
        id = id << 4 | (uint64_t)d;
    }
    return id;
}

void lock_incarnation_hex(uint64_t id, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)id);
}

int lock_thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void lock_nosigpipe_begin(lock_pipe_guard *g) {
    sigset_t pipe, pending;
    struct sigaction sa;
    /* Most servers ignore SIGPIPE: one query then, instead of four calls. */
    g->active = !(sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN);
    if (!g->active) return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    g->pending_before = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

void lock_nosigpipe_end(lock_pipe_guard *g) {
    sigset_t pipe, pending;
    if (!g->active) return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    if (!g->pending_before && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = { 0, 0 };
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {}
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

lock_errcode lock_set_error(lock_client *c, lock_errcode code, const char *msg) {
    lock_mu_take(&c->mu, LOCK_RANK_CLIENT);
    c->err = code;
    snprintf(c->errstr, sizeof c->errstr, "%s", msg);
    lock_mu_drop(&c->mu, LOCK_RANK_CLIENT);
    return code;
}
