/* test_lock.c: the lock module against a real redis-server (the runner
 * passes its URL in FLASHSALE_TEST_REDIS): the format, mutual exclusion
 * across 16 threads and 4 processes, release outcomes, reentry, renewal and
 * loss, fencing, wake-up latency and bounded wake-ups, Redlock quorum
 * logic, and incarnations (one server's, Redlock's when some of its servers
 * lose their data) -- several databases and dead ports stand in for
 * servers, FLUSHDB for a server that lost its data; the real multi-server
 * cases are in tests/test_lock.py.
 *
 * Time bounds are generous (a noisy 2-core machine) but each one separates
 * working from broken by a wide margin: e.g. a lost wake-up shows up as a
 * wait of seconds, the bound is a tenth of that. */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "lock/lock.h"
#include "lock/lock_int.h"   /* lock_mu_take: the lock order is asserted */
#include "tests/unit/t.h"
#include "tests/unit/traw.h"

static const char *url;
static char err[600];

static lock_client *client_on(const char *const *urls, int n, int watchdog, int max_backoff,
                              int timeout_ms) {
    lock_options o = { .urls = urls, .nurls = n, .timeout_ms = timeout_ms,
                       .watchdog = watchdog, .max_backoff_ms = max_backoff };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    if (!c) fprintf(stderr, "  lock_client_new: %s\n", err);
    return c;
}

static lock_client *client(int watchdog, int max_backoff) {
    return client_on(&url, 1, watchdog, max_backoff, 1000);
}

static lock_handle *take(lock_client *c, const char *name, int64_t ttl, int64_t wait) {
    lock_handle *h = NULL;
    if (lock_acquire(c, name, ttl, wait, NULL, &h, err, sizeof err) != LOCK_OK)
        fprintf(stderr, "  acquire %s: %s\n", name, err);
    return h;
}

/* ------------------------------------------------------------------ format */

static void test_format(void) {
    lock_client *c = client(0, 0);
    char v[200], want[40];
    traw_cmd("DEL t:fmt {t:fmt}:fence");
    lock_handle *h = take(c, "t:fmt", 5000, 0);
    CHECK(h && lock_fence(h) == 1);
    traw_get("t:fmt", v, sizeof v);
    CHECK(strlen(v) == 34 && strspn(v, "0123456789abcdef") == 32 && !strcmp(v + 32, ":1"));
    long long pttl = traw_int("PTTL %s", "t:fmt");
    CHECK(pttl > 4000 && pttl <= 5000);
    traw_get("{t:fmt}:fence", v, sizeof v);
    CHECK_STR(v, "1");
    CHECK(lock_release(h) == LOCK_RELEASED);
    CHECK(traw_int("EXISTS %s", "t:fmt") == 0);
    /* A name with its own hash tag derives keys in the same slot. */
    h = take(c, "fs:{sku9}:lock:3", 5000, 0);
    CHECK(h != NULL);
    snprintf(want, sizeof want, "%llu", (unsigned long long)lock_fence(h));
    CHECK_STR(traw_get("fs:{sku9}:lock:3:fence", v, sizeof v), want);
    CHECK(lock_release(h) == LOCK_RELEASED);
    /* Names it cannot derive keys for are refused, not crashed on. */
    lock_handle *bad = NULL;
    CHECK(lock_acquire(c, "a{b", 1000, 0, NULL, &bad, err, sizeof err) == LOCK_ERROR && !bad);
    CHECK(lock_acquire(c, "", 1000, 0, NULL, &bad, err, sizeof err) == LOCK_ERROR);
    CHECK(lock_acquire(c, "t:x", 0, 0, NULL, &bad, err, sizeof err) == LOCK_ERROR);
    CHECK(lock_client_error(c, err, sizeof err) == LOCK_ERR_ARG);
    lock_client_free(c);
}

static void test_busy_and_deadline(void) {
    lock_client *c = client(0, 0);
    lock_handle *h = take(c, "t:busy", 10000, 0), *h2 = NULL;
    /* Another owner: wait 0 answers at once. */
    int64_t t0 = clock_mono_ms();
    CHECK(lock_acquire(c, "t:busy", 1000, 0, "other", &h2, err, sizeof err) == LOCK_BUSY && !h2);
    CHECK(clock_mono_ms() - t0 < 200);
    /* With a deadline: not before it, and not long after. */
    t0 = clock_mono_ms();
    CHECK(lock_acquire(c, "t:busy", 1000, 300, "other", &h2, err, sizeof err) == LOCK_BUSY);
    int64_t waited = clock_mono_ms() - t0;
    CHECK(waited >= 295 && waited < 1500);
    CHECK(strstr(err, "held by another") != NULL);
    CHECK(lock_release(h) == LOCK_RELEASED);
    lock_client_free(c);
}

/* --------------------------------------------------------- mutual exclusion */

typedef struct mx {
    lock_client *c;
    const char *name, *counter;
    int iters;
    atomic_int inside, overlaps, failures;
} mx;

/* GET then SET: loses increments unless the lock really excludes. */
static void slow_increment(redisContext *r, const char *key) {
    redisReply *g = redisCommand(r, "GET %s", key);
    long long v = g && g->type == REDIS_REPLY_STRING ? atoll(g->str) : 0;
    if (g) freeReplyObject(g);
    redisReply *s = redisCommand(r, "SET %s %lld", key, v + 1);
    if (s) freeReplyObject(s);
}

static void *mx_worker(void *arg) {
    mx *m = arg;
    redisContext *r = traw_connect(url);
    for (int i = 0; r && i < m->iters; i++) {
        lock_handle *h = NULL;
        if (lock_acquire(m->c, m->name, 5000, 20000, NULL, &h, NULL, 0) != LOCK_OK) {
            atomic_fetch_add(&m->failures, 1);
            continue;
        }
        if (atomic_fetch_add(&m->inside, 1) != 0) atomic_fetch_add(&m->overlaps, 1);
        slow_increment(r, m->counter);
        atomic_fetch_sub(&m->inside, 1);
        if (lock_release(h) != LOCK_RELEASED) atomic_fetch_add(&m->failures, 1);
    }
    if (!r) atomic_fetch_add(&m->failures, 1);
    else redisFree(r);
    return NULL;
}

/* n threads on one client (the service's way) do iters increments each. */
static int run_mx(lock_client *c, const char *name, const char *counter, int n, int iters) {
    mx m = { c, name, counter, iters, 0, 0, 0 };
    pthread_t t[32];
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, mx_worker, &m);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return m.overlaps || m.failures ? -1 : 0;
}

static void test_mutex_16_threads(void) {
    lock_client *c = client(1, 0);
    char v[32];
    traw_cmd("DEL t:mx:n");
    CHECK(run_mx(c, "t:mx", "t:mx:n", 16, 100) == 0);
    CHECK_STR(traw_get("t:mx:n", v, sizeof v), "1600");
    lock_stats st;
    lock_client_stats(c, &st);
    CHECK(st.acquired == 1600 && st.released == 1600 && st.errors == 0);
    lock_client_free(c);
}

static void test_mutex_4_processes(void) {
    char v[32];
    pid_t pids[4];
    traw_cmd("DEL t:mxp:n");
    for (int p = 0; p < 4; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            /* Each process its own client, 4 threads: 16 threads in all. */
            lock_client *c = client(1, 0);
            int rc = c ? run_mx(c, "t:mxp", "t:mxp:n", 4, 50) : -1;
            lock_client_free(c);
            redisFree(traw_conn);                                 /* the parent's, inherited */
            _exit(rc ? 1 : 0);
        }
    }
    int ok = 1;
    for (int p = 0; p < 4; p++) {
        int status = 0;
        waitpid(pids[p], &status, 0);
        ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    CHECK(ok);
    CHECK_STR(traw_get("t:mxp:n", v, sizeof v), "800");
}

/* ------------------------------------------------------------------ release */

static void test_release_not_owner(void) {
    lock_client *c = client(0, 0);
    char v[200], mine[200];
    /* Someone else's value under the name: ours is gone, theirs stays. */
    lock_handle *h = take(c, "t:rel", 5000, 0);
    traw_cmd("SET t:rel someone-else PX 5000");
    CHECK(lock_release_ex(h, err, sizeof err) == LOCK_NOT_OWNER);
    CHECK(strstr(err, "not ours") != NULL);
    CHECK_STR(traw_get("t:rel", v, sizeof v), "someone-else");
    traw_cmd("DEL t:rel");
    /* After expiry: the next holder's lock is left alone. */
    lock_handle *a = take(c, "t:rel", 100, 0);
    clock_sleep_ms(200);
    lock_handle *b = NULL;
    CHECK(lock_acquire(c, "t:rel", 5000, 0, "b", &b, err, sizeof err) == LOCK_OK);
    traw_get("t:rel", mine, sizeof mine);
    CHECK(a && b && lock_fence(b) > lock_fence(a));
    CHECK(lock_release(a) == LOCK_NOT_OWNER);
    CHECK_STR(traw_get("t:rel", v, sizeof v), mine);
    CHECK(lock_remaining_ms(b) > 4000);
    CHECK(lock_release(b) == LOCK_RELEASED);
    CHECK(traw_int("EXISTS %s", "t:rel") == 0);
    lock_stats st;
    lock_client_stats(c, &st);
    CHECK(st.not_owner == 2 && st.released == 1);
    lock_client_free(c);
}

static void test_release_unknown(void) {
    /* Redis stops answering (CLIENT PAUSE) longer than the timeout: the
     * release cannot know, says so, and nothing crashes or hangs. */
    lock_client *c = client_on(&url, 1, 0, 0, 150);
    lock_handle *h = take(c, "t:unk", 5000, 0);
    CHECK(h != NULL);
    traw_cmd("CLIENT PAUSE 700 ALL");
    int64_t t0 = clock_mono_ms();
    CHECK(lock_release_ex(h, err, sizeof err) == LOCK_UNKNOWN);
    CHECK(clock_mono_ms() - t0 < 650);
    CHECK(err[0] != '\0');
    clock_sleep_ms(800);
    /* The client recovers: the broken connection was not pooled. */
    h = take(c, "t:unk2", 5000, 0);
    CHECK(h && lock_release(h) == LOCK_RELEASED);
    lock_client_free(c);
}

static void test_redis_down(void) {
    const char *dead = "redis://127.0.0.1:1/0";
    lock_client *c = client_on(&dead, 1, 0, 0, 300);
    lock_handle *h = NULL;
    int64_t t0 = clock_mono_ms();
    CHECK(lock_acquire(c, "t:down", 1000, 2000, NULL, &h, err, sizeof err) == LOCK_ERROR && !h);
    CHECK(clock_mono_ms() - t0 < 1000);
    CHECK(strstr(err, "127.0.0.1:1") && strstr(err, "refused"));
    CHECK(lock_client_error(c, NULL, 0) == LOCK_ERR_IO);
    lock_client_free(c);
}

static void test_connections_recover(void) {
    /* Pooled connections killed while idle (as by a Redis restart) are
     * noticed before use: no error, no "unknown" release. */
    lock_client *c = client(0, 0);
    lock_handle *h = take(c, "t:kill", 5000, 0);
    traw_cmd("CLIENT KILL TYPE normal SKIPME yes");
    clock_sleep_ms(50);
    CHECK(h && lock_release(h) == LOCK_RELEASED);
    traw_cmd("SCRIPT FLUSH");   /* NOSCRIPT: falls back to EVAL */
    h = take(c, "t:kill", 5000, 0);
    CHECK(h && lock_release(h) == LOCK_RELEASED);
    lock_client_free(c);
}

/* ---------------------------------------------------------------- reentry */

typedef struct probe {
    lock_client *c;
    const char *name, *owner;
    lock_status st;
    lock_handle *h;
} probe;

static void *probe_main(void *arg) {
    probe *p = arg;
    p->h = NULL;
    p->st = lock_acquire(p->c, p->name, 5000, 0, p->owner, &p->h, NULL, 0);
    return NULL;
}

/* An acquire from another thread (another owner unless owner is given). */
static lock_status from_other_thread(lock_client *c, const char *name, const char *owner,
                                     lock_handle **h) {
    probe p = { c, name, owner, LOCK_ERROR, NULL };
    pthread_t t;
    pthread_create(&t, NULL, probe_main, &p);
    pthread_join(t, NULL);
    *h = p.h;
    return p.st;
}

static void test_reentrancy(void) {
    lock_client *c = client(0, 0);
    lock_handle *a = take(c, "t:re", 5000, 0), *b = take(c, "t:re", 5000, 0), *o = NULL;
    CHECK(a && b && a != b && lock_fence(a) == lock_fence(b));
    CHECK(from_other_thread(c, "t:re", NULL, &o) == LOCK_BUSY && !o);
    CHECK(lock_release(b) == LOCK_RELEASED);
    CHECK(traw_int("EXISTS %s", "t:re") == 1);              /* still held */
    CHECK(from_other_thread(c, "t:re", NULL, &o) == LOCK_BUSY);
    CHECK(lock_release(a) == LOCK_RELEASED);
    CHECK(traw_int("EXISTS %s", "t:re") == 0);              /* freed by the last */
    CHECK(from_other_thread(c, "t:re", NULL, &o) == LOCK_OK && o);
    CHECK(lock_release(o) == LOCK_RELEASED);
    /* An explicit owner re-enters from another thread. */
    lock_handle *j = NULL;
    CHECK(lock_acquire(c, "t:re", 5000, 0, "job-7", &j, err, sizeof err) == LOCK_OK);
    CHECK(from_other_thread(c, "t:re", "job-7", &o) == LOCK_OK && o);
    CHECK(from_other_thread(c, "t:re", "job-8", &a) == LOCK_BUSY);
    CHECK(lock_release(j) == LOCK_RELEASED && traw_int("EXISTS %s", "t:re") == 1);
    CHECK(lock_release(o) == LOCK_RELEASED && traw_int("EXISTS %s", "t:re") == 0);
    lock_stats st;
    lock_client_stats(c, &st);
    CHECK(st.reentered == 2);
    lock_client_free(c);
}

static void test_reentry_after_loss(void) {
    lock_client *c = client(0, 0);
    lock_handle *a = take(c, "t:rel2", 5000, 0), *b = NULL;
    traw_cmd("DEL t:rel2");
    CHECK(lock_acquire(c, "t:rel2", 5000, 0, NULL, &b, err, sizeof err) == LOCK_ERROR && !b);
    CHECK(a && lock_lost(a) && lock_remaining_ms(a) <= 0);
    CHECK(lock_err(a, err, sizeof err) == LOCK_ERR_LOST);
    CHECK(lock_release(a) == LOCK_NOT_OWNER);
    b = take(c, "t:rel2", 5000, 0);                         /* a fresh hold now */
    CHECK(b && lock_release(b) == LOCK_RELEASED);
    lock_client_free(c);
}

/* --------------------------------------------------------- leases, renewal */

static void test_remaining_ms(void) {
    lock_client *c = client(0, 0);
    lock_handle *h = take(c, "t:rem", 500, 0);
    int64_t r0 = lock_remaining_ms(h);
    CHECK(r0 <= 500 - 7 && r0 > 350);                       /* drift: 5 + 2 ms */
    clock_sleep_ms(200);
    int64_t r1 = lock_remaining_ms(h);
    CHECK(r1 < r0 - 150 && r1 > 100);
    clock_sleep_ms(400);
    CHECK(lock_remaining_ms(h) < 0 && !lock_lost(h));      /* no watchdog: nobody looked */
    CHECK(lock_release(h) == LOCK_NOT_OWNER);
    lock_client_free(c);
}

static void test_watchdog_renews(void) {
    lock_client *c = client(1, 0);
    char v[200];
    lock_handle *h = take(c, "t:wd", 300, 0);
    CHECK(h != NULL);
    traw_get("t:wd", v, sizeof v);
    clock_sleep_ms(1300);                                   /* four TTLs */
    char now[200];
    CHECK_STR(traw_get("t:wd", now, sizeof now), v);
    CHECK(!lock_lost(h) && lock_remaining_ms(h) > 0 && lock_remaining_ms(h) <= 300);
    lock_stats st;
    lock_client_stats(c, &st);
    CHECK(st.renewals >= 6);
    CHECK(lock_release(h) == LOCK_RELEASED);
    lock_client_free(c);
}

typedef struct lost_probe {
    atomic_int calls;
    int64_t at_ms;
    int release_inside;
    lock_release_result rel;
} lost_probe;

static void on_lost(lock_handle *h, void *ud) {
    lost_probe *p = ud;
    p->at_ms = clock_mono_ms();
    if (lock_lost(h) && p->release_inside) p->rel = lock_release(h);
    atomic_fetch_add(&p->calls, 1);
}

static void test_lost_callback(void) {
    lock_client *c = client(1, 0);
    lost_probe p = { 0, 0, 0, LOCK_UNKNOWN };
    lock_handle *h = take(c, "t:lost", 300, 0);
    lock_on_lost(h, on_lost, &p);
    clock_sleep_ms(400);
    CHECK(atomic_load(&p.calls) == 0 && !lock_lost(h));
    int64_t t0 = clock_mono_ms();
    traw_cmd("DEL t:lost");
    for (int i = 0; i < 200 && !atomic_load(&p.calls); i++) clock_sleep_ms(10);
    CHECK(atomic_load(&p.calls) == 1 && lock_lost(h));
    CHECK(p.at_ms - t0 < 100 + 500);                        /* ttl/3 + scheduling margin */
    CHECK(lock_err(h, err, sizeof err) == LOCK_ERR_LOST && strstr(err, "gone"));
    CHECK(lock_remaining_ms(h) <= 0);
    CHECK(lock_release(h) == LOCK_NOT_OWNER);
    /* A callback that releases its own handle. */
    lost_probe q = { 0, 0, 1, LOCK_UNKNOWN };
    h = take(c, "t:lost", 300, 0);
    lock_on_lost(h, on_lost, &q);
    traw_cmd("SET t:lost intruder PX 5000");                    /* taken by another */
    for (int i = 0; i < 200 && !atomic_load(&q.calls); i++) clock_sleep_ms(10);
    CHECK(atomic_load(&q.calls) == 1 && q.rel == LOCK_NOT_OWNER);
    char v[64];
    CHECK_STR(traw_get("t:lost", v, sizeof v), "intruder");
    /* Registered after the loss: called at once. */
    lost_probe r = { 0, 0, 0, LOCK_UNKNOWN };
    traw_cmd("DEL t:lost");
    h = take(c, "t:lost", 300, 0);
    traw_cmd("DEL t:lost");
    for (int i = 0; i < 200 && !lock_lost(h); i++) clock_sleep_ms(10);
    lock_on_lost(h, on_lost, &r);
    CHECK(atomic_load(&r.calls) == 1);
    lock_release(h);
    lock_client_free(c);
}

/* ------------------------------------------------------------------ fencing */

typedef struct fence_run {
    const char *name;
    atomic_uint_fast64_t last;
    atomic_int bad;
} fence_run;

static void *fence_worker(void *arg) {
    fence_run *f = arg;
    lock_client *c = client(0, 0);   /* a client each: as separate processes */
    for (int i = 0; c && i < 25; i++) {
        lock_handle *h = NULL;
        if (lock_acquire(c, f->name, 5000, 20000, NULL, &h, NULL, 0) != LOCK_OK) {
            atomic_fetch_add(&f->bad, 1);
            continue;
        }
        /* In lock order, each token must beat the one before. */
        if (lock_fence(h) <= atomic_load(&f->last)) atomic_fetch_add(&f->bad, 1);
        atomic_store(&f->last, lock_fence(h));
        lock_release(h);
    }
    lock_client_free(c);
    return NULL;
}

static void test_fence_increasing(void) {
    fence_run f = { "t:fence", 0, 0 };
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, fence_worker, &f);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    CHECK(atomic_load(&f.bad) == 0 && atomic_load(&f.last) >= 200);
}

/* lock_fenced_set with unnamed tokens (incarnation 0): the plain-integer
 * fence of old (incarnations: tests/unit/test_fence.c). */
static int fset(lock_client *c, uint64_t token, const char *v, uint64_t *hi) {
    return lock_fenced_set(c, "t:{res}:fence", "t:{res}:value", token, 0, v, strlen(v), hi, err,
                           sizeof err);
}

static void test_fenced_set(void) {
    lock_client *c = client(0, 0);
    char v[64];
    uint64_t hi = 0;
    traw_cmd("DEL t:{res}:fence t:{res}:value");
    CHECK(fset(c, 5, "a", &hi) == 1);
    CHECK(fset(c, 3, "stale", &hi) == 0);
    CHECK(hi == 5);
    CHECK_STR(traw_get("t:{res}:value", v, sizeof v), "a");
    CHECK(fset(c, 5, "b", &hi) == 1);
    CHECK(fset(c, 9, "c", &hi) == 1);
    CHECK_STR(traw_get("t:{res}:value", v, sizeof v), "c");
    CHECK_STR(traw_get("t:{res}:fence", v, sizeof v), "9");
    traw_cmd("DEL t:{res}:fence");
    traw_cmd("HSET t:{res}:fence f v");                           /* a Redis error, reported */
    CHECK(fset(c, 10, "x", &hi) == -1);
    CHECK(strstr(err, "WRONGTYPE") != NULL);
    CHECK_STR(traw_get("t:{res}:value", v, sizeof v), "c");
    lock_client_free(c);
}

/* ---------------------------------------------------------------- wake-ups */

typedef struct waiter_run {
    lock_client *c;
    const char *name;
    int64_t wait_ms;
    atomic_int got;
    atomic_int_fast64_t got_at_us;
    lock_handle *_Atomic h;
    int release_after_ms;         /* >= 0: hold that long, then release */
    _Atomic uint64_t ticket;      /* lock_ticket of the hold */
} waiter_run;

static void *waiter_main(void *arg) {
    waiter_run *w = arg;
    lock_handle *h = NULL;
    if (lock_acquire(w->c, w->name, 20000, w->wait_ms, NULL, &h, NULL, 0) == LOCK_OK) {
        atomic_store(&w->got_at_us, clock_mono_us());
        atomic_store(&w->ticket, lock_ticket(h));
        if (w->release_after_ms < 0) atomic_store(&w->h, h);   /* kept: the test releases it */
        atomic_fetch_add(&w->got, 1);
        if (w->release_after_ms >= 0) {
            clock_sleep_ms(w->release_after_ms);
            lock_release(h);
        }
    }
    return NULL;
}

static void test_wakeup_latency(void) {
    /* Backoff up to 10 s: only the release notice can wake the waiter soon. */
    lock_client *c = client(0, 10000);
    int64_t lat[5];
    for (int i = 0; i < 5; i++) {
        lock_handle *h = NULL;
        CHECK(lock_acquire(c, "t:wake", 20000, 0, "holder", &h, err, sizeof err) == LOCK_OK);
        waiter_run w = { c, "t:wake", 30000, 0, 0, NULL, 0, 0 };
        pthread_t t;
        pthread_create(&t, NULL, waiter_main, &w);
        clock_sleep_ms(700);                                /* its backoff is past 256 ms now */
        int64_t rel = clock_mono_us();
        lock_release(h);
        pthread_join(t, NULL);
        lat[i] = atomic_load(&w.got) ? (atomic_load(&w.got_at_us) - rel) / 1000 : 99999;
    }
    int64_t worst = 0, under = 0;
    for (int i = 0; i < 5; i++) {
        if (lat[i] > worst) worst = lat[i];
        under += lat[i] < 20;
    }
    fprintf(stderr, "  hand-off latency ms: %lld %lld %lld %lld %lld\n", (long long)lat[0],
            (long long)lat[1], (long long)lat[2], (long long)lat[3], (long long)lat[4]);
    CHECK(under >= 3 && worst < 150);
    lock_stats st;
    lock_client_stats(c, &st);
    CHECK(st.wakeups >= 5);
    lock_client_free(c);
}

static void test_free_lock_noticed(void) {
    /* Holders that never publish (expiry, other libraries, a DEL): the
     * waiter sees the lock free within min(PTTL, backoff), not at its
     * deadline. */
    lock_client *c = client(0, 0);
    lock_handle *h = NULL;
    traw_cmd("SET t:quiet foreign PX 400");
    int64_t t0 = clock_mono_ms();
    CHECK(lock_acquire(c, "t:quiet", 5000, 10000, NULL, &h, err, sizeof err) == LOCK_OK);
    int64_t waited = clock_mono_ms() - t0;
    CHECK(waited >= 350 && waited < 400 + 300);
    lock_release(h);
    traw_cmd("SET t:quiet foreign");                             /* no TTL at all */
    waiter_run w = { c, "t:quiet", 10000, 0, 0, NULL, 0, 0 };
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    clock_sleep_ms(500);
    int64_t del = clock_mono_us();
    traw_cmd("DEL t:quiet");
    pthread_join(t, NULL);
    CHECK(atomic_load(&w.got) == 1);
    CHECK((atomic_load(&w.got_at_us) - del) / 1000 < 200 + 300);   /* max backoff 200 */
    lock_client_free(c);
}

static void test_bounded_wakeups(void) {
    /* 12 waiters, one release: one is woken, not twelve. */
    enum { N = 12 };
    lock_client *c = client(0, 10000);
    lock_handle *h = NULL;
    waiter_run w[N];
    pthread_t t[N];
    traw_cmd("DEL {t:herd}:waiters");
    CHECK(lock_acquire(c, "t:herd", 20000, 0, "holder", &h, err, sizeof err) == LOCK_OK);
    for (int i = 0; i < N; i++) {
        w[i] = (waiter_run){ c, "t:herd", 30000, 0, 0, NULL, -1, 0 };
        pthread_create(&t[i], NULL, waiter_main, &w[i]);
    }
    for (int i = 0; i < 300 && traw_int("ZCARD %s", "{t:herd}:waiters") < N; i++)
        clock_sleep_ms(10);
    CHECK(traw_int("ZCARD %s", "{t:herd}:waiters") == N);
    clock_sleep_ms(1000);
    lock_stats before, after;
    lock_client_stats(c, &before);
    lock_release(h);
    clock_sleep_ms(300);
    lock_client_stats(c, &after);
    int got = 0;
    for (int i = 0; i < N; i++) got += atomic_load(&w[i].got);
    CHECK(got == 1);
    CHECK(after.wakeups - before.wakeups == 1);
    /* Then hand the lock down the queue: each release wakes the next. */
    for (int k = 1; k < N; k++) {
        lock_handle *holder = NULL;
        for (int i = 0; i < N && !holder; i++) holder = atomic_exchange(&w[i].h, NULL);
        CHECK(holder != NULL);
        if (!holder) break;
        int64_t t0 = clock_mono_ms();
        lock_release(holder);
        int now = got;
        while (now == got && clock_mono_ms() - t0 < 2000) {
            clock_sleep_ms(1);
            now = 0;
            for (int i = 0; i < N; i++) now += atomic_load(&w[i].got);
        }
        CHECK(now == got + 1);
        got = now;
    }
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < N; i++)
        if (atomic_load(&w[i].h)) lock_release(atomic_load(&w[i].h));
    lock_client_stats(c, &after);
    CHECK(after.wakeups - before.wakeups == N);
    CHECK(traw_int("EXISTS %s", "{t:herd}:waiters") == 0);
    lock_client_free(c);
}

/* ------------------------------------------------------------------ fair */

static lock_client *fair_client(int lease_ms) {
    lock_options o = { .urls = &url, .nurls = 1, .timeout_ms = 1000, .fair = 1,
                       .waiter_lease_ms = lease_ms };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    if (!c) fprintf(stderr, "  lock_client_new: %s\n", err);
    return c;
}

/* A place in a fair lock's queue for a waiter that never calls (lock.h,
 * FAIRNESS: the keys): what a stopped waiter leaves behind. */
static void ghost(const char *base, const char *who, long long score, long long due_ms,
                  int listens) {
    redisReply *t = redisCommand(traw_conn, "TIME");
    long long now = t && t->type == REDIS_REPLY_ARRAY ? atoll(t->element[0]->str) * 1000 +
                                                            atoll(t->element[1]->str) / 1000
                                                      : 0;
    if (t) freeReplyObject(t);
    traw_cmd("ZADD %s:fair %lld %s", base, score, who);
    traw_cmd("ZADD %s:fair:due %lld %s", base, now + due_ms, who);
    if (listens == 1) traw_cmd("SADD %s:fair:sub %s", base, who);
    if (listens == 2) traw_cmd("SADD %s:fair:sub ~%s", base, who);   /* on a cluster */
}

static void test_fair_newcomer_waits_its_turn(void) {
    /* A free lock with a waiter in line: a newcomer does not take it, not
     * with a try (wait 0) and not within a wait shorter than the waiter's
     * place; once that place lapses (the waiter never came), it does. An
     * unfair client takes it at once: the fairness is the queue's. */
    lock_client *c = fair_client(1000), *u = client(0, 0);
    lock_handle *h = NULL;
    traw_cmd("DEL t:fair {t:fair}:fair {t:fair}:fair:due {t:fair}:fair:sub");
    ghost("{t:fair}", "ghost", 1, 1500, 0);
    CHECK(lock_acquire(c, "t:fair", 5000, 0, NULL, &h, err, sizeof err) == LOCK_BUSY && !h);
    CHECK(lock_acquire(c, "t:fair", 5000, 300, NULL, &h, err, sizeof err) == LOCK_BUSY && !h);
    CHECK(traw_int("ZCARD %s", "{t:fair}:fair") == 1);          /* it left the line again */
    int64_t t0 = clock_mono_ms();
    CHECK(lock_acquire(c, "t:fair", 5000, 5000, NULL, &h, err, sizeof err) == LOCK_OK);
    int64_t took = clock_mono_ms() - t0;
    CHECK(took > 500 && took < 2500);                            /* the ghost's place lapsed */
    CHECK(traw_int("ZCARD %s", "{t:fair}:fair") == 0);
    lock_release(h);
    h = NULL;
    ghost("{t:fair}", "ghost", 1, 5000, 0);
    CHECK(lock_acquire(u, "t:fair", 5000, 0, NULL, &h, err, sizeof err) == LOCK_OK);
    lock_release(h);
    traw_cmd("DEL {t:fair}:fair {t:fair}:fair:due {t:fair}:fair:sub");
    lock_client_free(c);
    lock_client_free(u);
}

static void test_fair_gone_listener_dropped_at_release(void) {
    /* A waiter that said it listens but whose channel has no subscriber any
     * more (its process died) is dropped by the release at once, and the
     * one behind it is woken: no wait for its place to lapse. */
    lock_client *c = fair_client(1000), *w = fair_client(1000);
    lock_handle *h = NULL;
    traw_cmd("DEL t:gone {t:gone}:fair {t:gone}:fair:due {t:gone}:fair:sub");
    CHECK(lock_acquire(c, "t:gone", 10000, 0, NULL, &h, err, sizeof err) == LOCK_OK);
    ghost("{t:gone}", "dead", 0, 60000, 1);                     /* ahead of everyone */
    waiter_run r = { w, "t:gone", 10000, 0, 0, NULL, 0, 0 };
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &r);
    for (int i = 0; i < 300 && traw_int("ZCARD %s", "{t:gone}:fair") < 2; i++) clock_sleep_ms(10);
    CHECK(traw_int("ZCARD %s", "{t:gone}:fair") == 2);
    clock_sleep_ms(100);
    int64_t t0 = clock_mono_us();
    lock_release(h);
    pthread_join(t, NULL);
    CHECK(atomic_load(&r.got) == 1);
    CHECK(atomic_load(&r.got_at_us) - t0 < 300000);
    CHECK(traw_int("EXISTS %s", "{t:gone}:fair") == 0);
    lock_client_free(c);
    lock_client_free(w);
}

static void test_fair_far_listener_woken_not_dropped(void) {
    /* On a cluster a waiter listens where a PUBLISH cannot count it (the
     * '~' mark): the release wakes it all the same, and does not take the
     * PUBLISH's count of 0 for its death: it keeps its place to its due. */
    lock_client *c = fair_client(1000);
    lock_handle *h = NULL;
    traw_cmd("DEL t:far {t:far}:fair {t:far}:fair:due {t:far}:fair:sub");
    redisContext *s = redisConnect(traw_conn->tcp.host, traw_conn->tcp.port);
    CHECK(s && !s->err);
    if (!s || s->err) {
        if (s) redisFree(s);
        lock_client_free(c);
        return;
    }
    redisReply *rep = redisCommand(s, "SUBSCRIBE {t:far}:wake:far");
    CHECK(rep && rep->type == REDIS_REPLY_ARRAY);
    if (rep) freeReplyObject(rep);
    CHECK(lock_acquire(c, "t:far", 10000, 0, NULL, &h, err, sizeof err) == LOCK_OK);
    ghost("{t:far}", "far", 0, 60000, 2);
    lock_release(h);
    struct timeval tv = { 2, 0 };
    redisSetTimeout(s, tv);
    rep = NULL;
    CHECK(redisGetReply(s, (void **)&rep) == REDIS_OK && rep && rep->type == REDIS_REPLY_ARRAY &&
          rep->elements == 3 && !strcmp(rep->element[2]->str, "released"));   /* woken */
    if (rep) freeReplyObject(rep);
    redisFree(s);
    CHECK(traw_int("ZCARD %s", "{t:far}:fair") == 1);          /* and kept: nobody counted */
    CHECK(lock_acquire(c, "t:far", 10000, 0, NULL, &h, err, sizeof err) == LOCK_BUSY && !h);
    traw_cmd("DEL t:far {t:far}:fair {t:far}:fair:due {t:far}:fair:sub");
    lock_client_free(c);
}

static void test_fair_order_across_clients(void) {
    /* Ten waiters on clients of their own (connected first), each arriving
     * once the one before it is in line, at a held lock, each holding
     * 10 ms: served in arrival order, each woken by the one before it (one
     * wake-up per release, no herd). */
    enum { N = 10 };
    lock_client *holder = fair_client(0), *cs[N];
    waiter_run r[N];
    pthread_t t[N];
    lock_handle *h = NULL;
    traw_cmd("DEL t:order {t:order}:fair {t:order}:fair:due {t:order}:fair:sub");
    CHECK(lock_acquire(holder, "t:order", 10000, 0, NULL, &h, err, sizeof err) == LOCK_OK);
    CHECK(lock_ticket(h) == 0);                  /* a free lock, taken without a place */
    for (int i = 0; i < N; i++) {
        lock_handle *w = NULL;
        cs[i] = fair_client(0);
        if (lock_acquire(cs[i], "t:order:warm", 1000, 0, NULL, &w, err, sizeof err) == LOCK_OK)
            lock_release(w);
    }
    for (int i = 0; i < N; i++) {
        r[i] = (waiter_run){ cs[i], "t:order", 10000, 0, 0, NULL, 10, 0 };
        pthread_create(&t[i], NULL, waiter_main, &r[i]);
        for (int k = 0; k < 500 && traw_int("ZCARD %s", "{t:order}:fair") < i + 1; k++)
            clock_sleep_ms(2);
    }
    CHECK(traw_int("ZCARD %s", "{t:order}:fair") == N);
    lock_release(h);
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    uint64_t wakeups = 0;
    for (int i = 0; i < N; i++) {
        lock_stats st;
        lock_client_stats(cs[i], &st);
        wakeups += st.wakeups;
        CHECK(atomic_load(&r[i].got) == 1);
        if (i) CHECK(atomic_load(&r[i].got_at_us) > atomic_load(&r[i - 1].got_at_us));
        /* The tickets are the places, rising in arrival order. */
        if (i) CHECK(atomic_load(&r[i].ticket) > atomic_load(&r[i - 1].ticket));
        CHECK(atomic_load(&r[i].ticket) > 0);
        lock_client_free(cs[i]);
    }
    /* No herd: a release wakes the head only (a head may also find the lock
     * by its own re-check first, which is not a wake-up). */
    CHECK(wakeups >= 1 && wakeups <= N);
    lock_client_free(holder);
}

static void test_fair_refused_with_redlock(void) {
    const char *two[2] = { url, url };
    lock_options o = { .urls = two, .nurls = 2, .fair = 1 };
    CHECK(lock_client_new(&o, err, sizeof err) == NULL && strstr(err, "Redlock"));
}

/* ------------------------------------------------------------------ Redlock */

static void url_db(char *out, size_t len, int db) {  /* out: >= 300 bytes */
    rconn_addr a;
    char e[100];
    rconn_parse(url, &a, e, sizeof e);
    snprintf(out, len, "redis://%.200s:%d/%d", a.host, a.port, db);
}

static void test_redlock_quorum(void) {
    /* Databases 1-3 of the test server stand in for three servers (their
     * keys are separate; pub/sub is shared, which only adds notices). */
    char u[3][300];
    const char *urls[3] = { u[0], u[1], u[2] };
    for (int i = 0; i < 3; i++) url_db(u[i], sizeof u[i], i + 1);
    lock_client *c = client_on(urls, 3, 1, 0, 500);
    for (int i = 1; i <= 3; i++) traw_cmd("SELECT %d", i), traw_cmd("FLUSHDB");
    traw_cmd("SELECT 2");
    traw_cmd("SET {t:rl}:fence 100");                            /* one server far ahead */
    lock_handle *h = take(c, "t:rl", 600, 0);
    CHECK(h && lock_fence(h) == 101);
    /* The agreed token is written back everywhere the lock was taken. */
    char v[200];
    for (int i = 1; i <= 3; i++) {
        traw_cmd("SELECT %d", i);
        CHECK_STR(traw_get("{t:rl}:fence", v, sizeof v), "101");
        CHECK(strstr(traw_get("t:rl", v, sizeof v), ":101") != NULL);
    }
    /* One server loses it: still held (2 of 3), renewals go on. */
    traw_cmd("SELECT 1");
    traw_cmd("DEL t:rl");
    clock_sleep_ms(700);
    CHECK(!lock_lost(h) && lock_remaining_ms(h) > 0);
    lock_handle *o = NULL;
    CHECK(lock_acquire(c, "t:rl", 600, 0, "other", &o, err, sizeof err) == LOCK_BUSY);
    /* A second one: no majority left, the watchdog calls it lost. */
    traw_cmd("SELECT 2");
    traw_cmd("DEL t:rl");
    for (int i = 0; i < 100 && !lock_lost(h); i++) clock_sleep_ms(10);
    CHECK(lock_lost(h));
    CHECK(lock_release(h) == LOCK_NOT_OWNER);
    /* A split (one server held by another) is undone everywhere. */
    traw_cmd("SELECT 3");
    traw_cmd("DEL t:rl");
    traw_cmd("SET t:rl foreign PX 5000");
    traw_cmd("SELECT 2");
    traw_cmd("SET t:rl foreign PX 5000");
    CHECK(lock_acquire(c, "t:rl", 600, 0, NULL, &o, err, sizeof err) == LOCK_BUSY);
    traw_cmd("SELECT 1");
    CHECK(traw_int("EXISTS %s", "t:rl") == 0);
    traw_cmd("SELECT 0");
    lock_client_free(c);
}

static void test_redlock_dead_servers(void) {
    char u[300], u2[300];
    url_db(u, sizeof u, 4);
    url_db(u2, sizeof u2, 5);
    const char *one_dead[3] = { u, "redis://127.0.0.1:1/0", u2 };
    const char *two_dead[3] = { "redis://127.0.0.1:1/0", u, "redis://127.0.0.1:2/0" };
    lock_client *c = client_on(one_dead, 3, 0, 0, 300);
    lock_handle *h = take(c, "t:rld", 2000, 0);
    CHECK(h && lock_release(h) == LOCK_RELEASED);
    lock_client_free(c);
    c = client_on(two_dead, 3, 0, 0, 300);
    int64_t t0 = clock_mono_ms();
    CHECK(lock_acquire(c, "t:rld", 2000, 1000, NULL, &h, err, sizeof err) == LOCK_ERROR);
    CHECK(clock_mono_ms() - t0 < 1000 && strstr(err, "quorum"));
    CHECK(lock_client_error(c, NULL, 0) == LOCK_ERR_QUORUM);
    traw_cmd("SELECT 4");
    CHECK(traw_int("EXISTS %s", "t:rld") == 0);              /* undone on the live one */
    traw_cmd("SELECT 0");
    lock_client_free(c);
}

/* ------------------------------------------------------------ incarnations */

/* The incarnation stored on database db for the lock "t:inc" (0: none). */
static uint64_t stored_incarnation(int db) {
    char v[64];
    traw_cmd("SELECT %d", db);
    traw_get("{t:inc}:incarnation", v, sizeof v);
    traw_cmd("SELECT 0");
    return strlen(v) == 16 ? strtoull(v, NULL, 16) : 0;
}

/* Takes "t:inc" (while ones listed in busy hold a foreign lock there, so
 * the quorum is the others); returns (incarnation, token) and releases. */
static uint64_t take_inc(lock_client *c, const int *busy, int nbusy, uint64_t *token) {
    for (int i = 0; i < nbusy; i++)
        traw_cmd("SELECT %d", busy[i]), traw_cmd("SET t:inc foreign PX 5000");
    traw_cmd("SELECT 0");
    lock_handle *h = take(c, "t:inc", 2000, 0);
    uint64_t inc = h ? lock_incarnation(h) : 0;
    *token = h ? lock_fence(h) : 0;
    if (h) lock_release(h);
    for (int i = 0; i < nbusy; i++) traw_cmd("SELECT %d", busy[i]), traw_cmd("DEL t:inc");
    traw_cmd("SELECT 0");
    return inc;
}

static void test_incarnation_one_server(void) {
    char u[300];
    const char *urls[1] = { u };
    url_db(u, sizeof u, 6);
    traw_cmd("SELECT 6"), traw_cmd("FLUSHDB"), traw_cmd("SELECT 0");
    lock_client *c = client_on(urls, 1, 0, 0, 1000);
    uint64_t t1, t2, t3;
    /* The first acquire stores its proposal; later ones read it back. */
    uint64_t i1 = take_inc(c, NULL, 0, &t1), i2 = take_inc(c, NULL, 0, &t2);
    CHECK(i1 != 0 && i1 == i2 && i1 == stored_incarnation(6) && t2 == t1 + 1);
    /* The server loses its data: its counter starts over, with a new id. */
    traw_cmd("SELECT 6"), traw_cmd("FLUSHDB"), traw_cmd("SELECT 0");
    uint64_t i3 = take_inc(c, NULL, 0, &t3);
    CHECK(t3 == 1 && i3 != 0 && i3 != i1 && i3 == stored_incarnation(6));
    /* Something unreadable stored there is replaced, not trusted. */
    traw_cmd("SELECT 6"), traw_cmd("SET {t:inc}:incarnation zz"), traw_cmd("SELECT 0");
    uint64_t i4 = take_inc(c, NULL, 0, &t3);
    CHECK(i4 != 0 && i4 != i3 && i4 == stored_incarnation(6));
    lock_client_free(c);
}

/* lock.c, settle: what a Redlock token's incarnation is when some of its
 * servers lose their data. Databases 7-9 are servers A, B, C. */
static void test_redlock_incarnation(void) {
    char u[3][300];
    const char *urls[3] = { u[0], u[1], u[2] };
    for (int i = 0; i < 3; i++) url_db(u[i], sizeof u[i], 7 + i);
    for (int i = 7; i <= 9; i++) traw_cmd("SELECT %d", i), traw_cmd("FLUSHDB");
    traw_cmd("SELECT 0");
    lock_client *c = client_on(urls, 3, 0, 0, 1000);
    uint64_t t1, t2, t3, t4, t5, t6;
    const int a_busy[1] = { 7 }, c_busy[1] = { 9 };
    /* All new: they all store the try's proposal, and agree on it. */
    uint64_t r = take_inc(c, NULL, 0, &t1);
    CHECK(r && stored_incarnation(7) == r && stored_incarnation(8) == r &&
          stored_incarnation(9) == r);
    /* C held by another: A and B decide, C lags behind (counter 1). */
    uint64_t r2 = take_inc(c, c_busy, 1, &t2);
    CHECK(r2 == r && t2 == t1 + 1);
    /* B loses its data. With A held by another, the quorum is B (new, so
     * it stores this try's proposal) and C (still r, its counter at t1):
     * they differ, so the token gets a new incarnation, settled on both.
     * Without it, the token would be max(1, t1 + 1) = t2 again: the token
     * of the earlier holder, under the same incarnation. */
    traw_cmd("SELECT 8"), traw_cmd("FLUSHDB"), traw_cmd("SELECT 0");
    uint64_t r3 = take_inc(c, a_busy, 1, &t3);
    CHECK(r3 && r3 != r && t3 == t2);
    CHECK(stored_incarnation(8) == r3 && stored_incarnation(9) == r3 && stored_incarnation(7) == r);
    /* All three answer: A still says r, so again they differ: a new one, on
     * all three now, above every token so far. */
    uint64_t r4 = take_inc(c, NULL, 0, &t4);
    CHECK(r4 && r4 != r && r4 != r3 && t4 == t3 + 1);
    CHECK(stored_incarnation(7) == r4 && stored_incarnation(8) == r4 &&
          stored_incarnation(9) == r4);
    /* From here they agree: the incarnation stays, tokens go up. */
    uint64_t r5 = take_inc(c, c_busy, 1, &t5);
    CHECK(r5 == r4 && t5 == t4 + 1);
    /* A majority (A and B) loses its data: A and B agree on this try's
     * proposal, C (held by another) does not answer: a new incarnation
     * whose tokens start over. */
    traw_cmd("SELECT 7"), traw_cmd("FLUSHDB");
    traw_cmd("SELECT 8"), traw_cmd("FLUSHDB"), traw_cmd("SELECT 0");
    uint64_t r6 = take_inc(c, c_busy, 1, &t6);
    CHECK(r6 && r6 != r4 && t6 == 1);
    lock_client_free(c);
}

/* -------------------------------------------------------------------- misc */

static void test_free_with_held_locks(void) {
    lock_client *c = client(1, 0);
    lock_handle *h = take(c, "t:leak", 5000, 0);
    CHECK(h != NULL);
    lock_client_free(c);                                    /* releases it */
    CHECK(traw_int("EXISTS %s", "t:leak") == 0);
}

/* Runs fn in a child; returns the signal that ended it (0: it exited). */
static int child_signal(void (*fn)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* The expected assertion message is not a failure to read. */
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        fn();
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static pthread_mutex_t mu_a = PTHREAD_MUTEX_INITIALIZER, mu_b = PTHREAD_MUTEX_INITIALIZER;

static void in_order(void) {
    lock_mu_take(&mu_a, LOCK_RANK_CLIENT);
    lock_mu_take(&mu_b, LOCK_RANK_BACKEND);
    lock_mu_drop(&mu_b, LOCK_RANK_BACKEND);
    lock_mu_drop(&mu_a, LOCK_RANK_CLIENT);
}

static void inverted(void) {
    lock_mu_take(&mu_b, LOCK_RANK_POOL);
    lock_mu_take(&mu_a, LOCK_RANK_CLIENT);    /* client.mu under a pool_mu: asserts */
}

static void same_rank_twice(void) {
    lock_mu_take(&mu_a, LOCK_RANK_BACKEND);
    lock_mu_take(&mu_b, LOCK_RANK_BACKEND);   /* two backend mutexes at once: asserts */
}

/* lock_int.h's LOCKING ORDER is checked where mutexes are taken: taken in
 * order passes, inverted (or two of one rank) stops the process at once,
 * before it could deadlock against a thread taking them the right way. */
static void test_lock_order_asserted(void) {
    CHECK(child_signal(in_order) == 0);
    CHECK(child_signal(inverted) == SIGABRT);
    CHECK(child_signal(same_rank_twice) == SIGABRT);
    CHECK(!lock_mu_holds(LOCK_RANK_CLIENT));
}

static const t_case cases[] = {
    T(test_format), T(test_busy_and_deadline), T(test_mutex_16_threads),
    T(test_mutex_4_processes), T(test_release_not_owner), T(test_release_unknown),
    T(test_redis_down), T(test_connections_recover), T(test_reentrancy),
    T(test_reentry_after_loss), T(test_remaining_ms), T(test_watchdog_renews),
    T(test_lost_callback), T(test_fence_increasing), T(test_fenced_set),
    T(test_wakeup_latency), T(test_free_lock_noticed), T(test_bounded_wakeups),
    T(test_fair_newcomer_waits_its_turn), T(test_fair_gone_listener_dropped_at_release),
    T(test_fair_far_listener_woken_not_dropped),
    T(test_fair_order_across_clients), T(test_fair_refused_with_redlock),
    T(test_redlock_quorum), T(test_redlock_dead_servers), T(test_incarnation_one_server),
    T(test_redlock_incarnation), T(test_free_with_held_locks), T(test_lock_order_asserted),
};

int main(int argc, char **argv) {
    url = traw_open();
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    traw_close();
    return rc;
}
