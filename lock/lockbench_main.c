/* lockbench_main.c: bin/lockbench, the figures behind `make bench-lock`:
 *
 *   1. uncontended acquire+release per second (one thread; then 4 threads
 *      on 4 names through one client), next to a PING round trip;
 *   2. contended hand-off latency -- from the holder's release to the next
 *      waiter holding -- with 8 waiters, for this lock (waiters woken by the
 *      release) and, in the same run, for the tryLock of the article "Using redis to
 *      implement a distributed lock service in Java" (SET NX, sleep
 *      100 ms, try again; compare-and-delete release).
 *
 * In the contended runs each of 9 threads loops: acquire, hold 1 ms, note
 * the time, release, then step aside until another thread holds the lock
 * (so the releaser never re-takes its own lock and every hand-off goes to
 * one of the 8 waiters). The number of threads waiting at each release is
 * measured and printed.
 *
 * With --url (zk://... or etcd://..., repeatable) the same figures are
 * taken for those lock servers too, each next to Redis: uncontended
 * acquire+release and the contended hand-off with a client per thread
 * (separate processes' view). --handoff-only prints just the hand-offs.
 *
 * Usage: lockbench --redis URL [--url URL]... [--seconds S] [--handoff-only] | --version */
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "common/version.h"
#include "lock/lock.h"

#define THREADS 9               /* one holding, up to 8 waiting */
#define HOLD_MS 1
#define MAX_SAMPLES 100000

#define MAX_URLS 8

typedef struct bench {
    const char *url;
    const char *others[MAX_URLS];   /* --url: other kinds of lock server */
    int nothers;
    int handoff_only;
    double seconds;
} bench;

/* ----------------------------------------------------------- uncontended */

typedef struct loop_arg {
    lock_client *c;
    char name[64];
    int64_t until_us;
    long ops, errors;
} loop_arg;

static void *uncontended_loop(void *arg) {
    loop_arg *l = arg;
    while (clock_mono_us() < l->until_us) {
        lock_handle *h = NULL;
        if (lock_acquire(l->c, l->name, 10000, 0, NULL, &h, NULL, 0) != LOCK_OK ||
            lock_release(h) != LOCK_RELEASED)
            l->errors++;
        else
            l->ops++;
    }
    return NULL;
}

/* Runs n threads, each on its own name, for the given time; returns ops/s. */
static double uncontended(lock_client *c, int n, double seconds, long *errors) {
    loop_arg l[8];
    pthread_t t[8];
    int64_t start = clock_mono_us(), until = start + (int64_t)(seconds * 1e6);
    for (int i = 0; i < n; i++) {
        l[i] = (loop_arg){ c, "", until, 0, 0 };
        snprintf(l[i].name, sizeof l[i].name, "bench:{u%d}", i);
        pthread_create(&t[i], NULL, uncontended_loop, &l[i]);
    }
    long ops = 0;
    *errors = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        ops += l[i].ops;
        *errors += l[i].errors;
    }
    return ops / ((clock_mono_us() - start) / 1e6);
}

/* The same two round trips without the library: the SET NX PX and
 * Lua compare-and-delete, in microseconds per pair. */
static double plain_pair_us(redisContext *r) {
    int64_t t0 = clock_mono_us();
    for (int i = 0; i < 2000; i++) {
        redisReply *x = redisCommand(r, "SET bench:{plain} v NX PX 10000");
        if (x) freeReplyObject(x);
        x = redisCommand(r, "EVAL %s 1 bench:{plain} v",
                         "if redis.call('get',KEYS[1])==ARGV[1] then "
                         "return redis.call('del',KEYS[1]) else return 0 end");
        if (x) freeReplyObject(x);
    }
    return (clock_mono_us() - t0) / 2000.0;
}

static double ping_us(redisContext *r) {
    int64_t t0 = clock_mono_us();
    for (int i = 0; i < 2000; i++) {
        redisReply *p = redisCommand(r, "PING");
        if (p) freeReplyObject(p);
    }
    return (clock_mono_us() - t0) / 2000.0;
}

/* -------------------------------------------------------------- contended */

/* A lock under test: take (blocking until had or the run ends), give back. */
typedef struct scheme {
    const char *label;
    void *(*setup)(const char *url, void *shared);
    int (*take)(void *self, int64_t until_us);
    void (*give)(void *self);
    void (*teardown)(void *self);
} scheme;

typedef struct run {
    const scheme *s;
    const char *label;
    const char *url;
    void *shared;
    int64_t until_us;
    atomic_int_fast64_t released_at_us;   /* 0: no release to time yet */
    atomic_int waiting;
    atomic_long handoffs, waiters_sum;
    pthread_mutex_t mu;           /* guards samples, holders */
    pthread_cond_t taken;         /* another thread took the lock */
    long holders;                 /* how many times the lock was taken */
    int64_t *samples;
    int nsamples;
    atomic_int errors;
} run;

/* A new holder: records the hand-off time and lets the releaser go on. */
static void took(run *r, int64_t handoff_us) {
    pthread_mutex_lock(&r->mu);
    if (handoff_us >= 0 && r->nsamples < MAX_SAMPLES) r->samples[r->nsamples++] = handoff_us;
    r->holders++;
    pthread_cond_broadcast(&r->taken);
    pthread_mutex_unlock(&r->mu);
}

/* Waits (1 s at most) until a thread other than the releaser holds it. */
static void step_aside(run *r, long seen) {
    pthread_mutex_lock(&r->mu);
    int64_t until = clock_mono_us() + 1000000;
    while (r->holders == seen && clock_mono_us() < until && clock_mono_us() < r->until_us) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->taken, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
}

static void *contend(void *arg) {
    run *r = arg;
    void *self = r->s->setup(r->url, r->shared);
    if (!self) {
        atomic_fetch_add(&r->errors, 1);
        return NULL;
    }
    while (clock_mono_us() < r->until_us) {
        atomic_fetch_add(&r->waiting, 1);
        int got = r->s->take(self, r->until_us);
        atomic_fetch_sub(&r->waiting, 1);
        if (!got) continue;
        int64_t now = clock_mono_us();
        int64_t rel = atomic_exchange(&r->released_at_us, 0);
        took(r, rel ? now - rel : -1);
        clock_sleep_ms(HOLD_MS);
        atomic_fetch_add(&r->waiters_sum, atomic_load(&r->waiting));
        atomic_fetch_add(&r->handoffs, 1);
        pthread_mutex_lock(&r->mu);
        long seen = r->holders;
        pthread_mutex_unlock(&r->mu);
        atomic_store(&r->released_at_us, clock_mono_us());
        r->s->give(self);
        step_aside(r, seen);
    }
    r->s->teardown(self);
    return NULL;
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void report(const run *r, double seconds) {
    if (r->nsamples == 0) {
        printf("  %-44s no hand-offs measured (errors: %d)\n", r->label, atomic_load(&r->errors));
        return;
    }
    int64_t *s = r->samples;
    qsort(s, (size_t)r->nsamples, sizeof *s, cmp64);
    int n = r->nsamples;
    printf("  %-44s p50 %8.2f ms  p99 %8.2f ms  max %8.2f ms  %5d hand-offs (%.0f/s), "
           "%.1f waiting per release%s\n",
           r->label, s[n / 2] / 1000.0, s[(n * 99) / 100] / 1000.0, s[n - 1] / 1000.0, n,
           n / seconds, (double)r->waiters_sum / (double)(r->handoffs ? r->handoffs : 1),
           atomic_load(&r->errors) ? " (with errors)" : "");
}

static void contended(const scheme *s, const char *label, const char *url, void *shared,
                      double seconds) {
    run r = { .s = s, .label = label ? label : s->label, .url = url, .shared = shared };
    pthread_t t[THREADS];
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.taken, NULL);
    atomic_init(&r.released_at_us, 0);
    r.samples = calloc(MAX_SAMPLES, sizeof *r.samples);
    r.until_us = clock_mono_us() + (int64_t)(seconds * 1e6);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, contend, &r);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    report(&r, seconds);
    free(r.samples);
    pthread_cond_destroy(&r.taken);
    pthread_mutex_destroy(&r.mu);
}

/* This lock, all threads on one client (as the service uses it). */
typedef struct lk { lock_client *c; lock_handle *h; int own; } lk;

static void *lk_setup_shared(const char *url, void *shared) {
    (void)url;
    lk *l = calloc(1, sizeof *l);
    if (l) l->c = shared;
    return l;
}

static void *lk_setup_own(const char *url, void *shared) {
    (void)shared;
    char err[300];
    lock_options o = { .urls = &url, .nurls = 1 };
    lk *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->c = lock_client_new(&o, err, sizeof err);
    l->own = 1;
    if (!l->c) {
        free(l);
        return NULL;
    }
    return l;
}

static int lk_take(void *self, int64_t until_us) {
    lk *l = self;
    int64_t wait = (until_us - clock_mono_us()) / 1000;
    return wait > 0 &&
           lock_acquire(l->c, "bench:{handoff}", 10000, wait, NULL, &l->h, NULL, 0) == LOCK_OK;
}

static void lk_give(void *self) { lock_release(((lk *)self)->h); }

static void lk_teardown(void *self) {
    lk *l = self;
    if (l->own) lock_client_free(l->c);
    free(l);
}

/* The tryLock of "Using redis to implement a distributed lock service in
 * Java": SET NX (with an expiry), else sleep 100 ms and retry.
 * Each poller starts at a random phase: started together they would poll
 * in lockstep and every hand-off would take the full 100 ms. */
typedef struct poll_lock { redisContext *r; char value[64]; int started; } poll_lock;

static void *poll_setup(const char *url, void *shared) {
    (void)shared;
    rconn_addr a;
    char err[200];
    poll_lock *p = calloc(1, sizeof *p);
    if (!p || rconn_parse(url, &a, err, sizeof err) || !(p->r = rconn_connect(&a, 2000, err, sizeof err))) {
        free(p);
        return NULL;
    }
    snprintf(p->value, sizeof p->value, "%p-%lld", (void *)p, (long long)clock_mono_us());
    return p;
}

static int poll_take(void *self, int64_t until_us) {
    poll_lock *p = self;
    if (!p->started) {
        p->started = 1;
        clock_sleep_ms(rand_r(&(unsigned){ (unsigned)clock_mono_us() }) % 100);
    }
    while (clock_mono_us() < until_us) {
        redisReply *r = redisCommand(p->r, "SET bench:{poll} %s NX PX 10000", p->value);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        if (ok) return 1;
        clock_sleep_ms(100);
    }
    return 0;
}

static void poll_give(void *self) {
    poll_lock *p = self;
    redisReply *r = redisCommand(p->r,
        "EVAL %s 1 bench:{poll} %s",
        "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end",
        p->value);
    if (r) freeReplyObject(r);
}

static void poll_teardown(void *self) {
    poll_lock *p = self;
    redisFree(p->r);
    free(p);
}

/* The kind of lock server a URL names, for labels. */
static const char *kind_of(const char *url) {
    return !strncmp(url, "zk://", 5) ? "zookeeper" : !strncmp(url, "etcd://", 7) ? "etcd" : "redis";
}

/* The figures for one other lock server, next to Redis's. */
static void other_server(const bench *b, const char *url, const scheme *own) {
    char err[300], label[64];
    lock_options o = { .urls = &url, .nurls = 1 };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    if (!c) {
        printf("  %s: %s\n", kind_of(url), err);
        return;
    }
    if (!b->handoff_only) {
        long e;
        double one = uncontended(c, 1, b->seconds, &e);
        printf("%s (%s) uncontended acquire+release, 1 thread: %.0f /s (%.2f ms each)%s\n",
               kind_of(url), url, one, one > 0 ? 1e3 / one : 0.0, e ? " (with errors)" : "");
    }
    snprintf(label, sizeof label, "%s: a client per thread", kind_of(url));
    contended(own, label, url, NULL, b->seconds);
    lock_client_free(c);
}

int main(int argc, char **argv) {
    bench b = { .seconds = 3.0 };
    static const struct option opts[] = { { "redis", required_argument, 0, 'r' },
                                          { "url", required_argument, 0, 'u' },
                                          { "seconds", required_argument, 0, 's' },
                                          { "handoff-only", no_argument, 0, 'H' },
                                          { "version", no_argument, 0, 'V' },
                                          { 0, 0, 0, 0 } };
    int ch;
    while ((ch = getopt_long(argc, argv, "r:u:s:", opts, NULL)) != -1) {
        if (ch == 'r') b.url = optarg;
        else if (ch == 'u' && b.nothers < MAX_URLS) b.others[b.nothers++] = optarg;
        else if (ch == 's') b.seconds = atof(optarg);
        else if (ch == 'H') b.handoff_only = 1;
        else if (ch == 'V') {
            printf("lockbench %s\n", flashsale_version);
            return 0;
        }
        else return 64;
    }
    if (!b.url || b.seconds <= 0) {
        fprintf(stderr, "usage: lockbench --redis URL [--url zk://...|etcd://...]... "
                        "[--seconds S] [--handoff-only] | --version\n");
        return 64;
    }
    char err[300];
    lock_options o = { .urls = &b.url, .nurls = 1 };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    rconn_addr a;
    redisContext *r = NULL;
    if (c && !rconn_parse(b.url, &a, err, sizeof err)) r = rconn_connect(&a, 2000, err, sizeof err);
    if (!c || !r) {
        fprintf(stderr, "lockbench: %s\n", err);
        return 1;
    }
    static const scheme shared = { "lock (wake-up), one client, 9 threads", lk_setup_shared,
                                   lk_take, lk_give, lk_teardown };
    static const scheme own = { "lock (wake-up), a client per thread", lk_setup_own, lk_take,
                                lk_give, lk_teardown };
    static const scheme polling = { "polling tryLock (SET NX, sleep 100 ms)", poll_setup,
                                    poll_take, poll_give, poll_teardown };
    if (b.handoff_only) {
        printf("contended hand-off, release -> next holder, %d threads (1 holding, up to %d "
               "waiting), hold %d ms, %.1f s each:\n", THREADS, THREADS - 1, HOLD_MS, b.seconds);
        contended(&own, "redis: a client per thread", b.url, NULL, b.seconds);
        for (int i = 0; i < b.nothers; i++) other_server(&b, b.others[i], &own);
        redisFree(r);
        lock_client_free(c);
        return 0;
    }
    long e1, e4;
    printf("lock benchmark against %s (%.1f s per figure)\n", b.url, b.seconds);
    printf("uncontended (PING round trip %.1f us):\n", ping_us(r));
    double one = uncontended(c, 1, b.seconds, &e1);
    double four = uncontended(c, 4, b.seconds, &e4);
    printf("  acquire+release, 1 thread                    %9.0f /s  (%.1f us each)%s\n", one,
           1e6 / one, e1 ? " (with errors)" : "");
    printf("  (no library: SET NX PX + Lua DEL, 1 thread    %8.1f us each)\n", plain_pair_us(r));
    printf("  acquire+release, 4 threads, 4 names, 1 client %8.0f /s%s\n", four,
           e4 ? " (with errors)" : "");
    printf("contended hand-off, release -> next holder, %d threads (1 holding, up to %d "
           "waiting), hold %d ms:\n", THREADS, THREADS - 1, HOLD_MS);
    contended(&shared, NULL, b.url, c, b.seconds);
    contended(&own, NULL, b.url, NULL, b.seconds);
    contended(&polling, NULL, b.url, NULL, b.seconds * 1.5);
    lock_stats st;
    lock_client_stats(c, &st);
    printf("shared client: %llu wake-ups by notice, %llu by backoff/PTTL timeout\n",
           (unsigned long long)st.wakeups, (unsigned long long)st.timeouts);
    for (int i = 0; i < b.nothers; i++) other_server(&b, b.others[i], &own);
    redisFree(r);
    lock_client_free(c);
    return 0;
}
