/* lockcheck_main.c: bin/lockcheck, the lock module driven from real
 * processes, for tests/test_lock_backends.py: any kind of lock server
 * (redis://, zk://, etcd://) behind the same calls.
 *
 *   loop      take NAME --count times; inside each hold, check for --hold-ms
 *             that the lock is still believed held (not lost, lease left)
 *             and, with --redis, do a non-atomic read-increment-write of a
 *             counter in Redis whose write is fenced by the lock's token.
 *             One line per hold goes to --log (O_APPEND, one write each):
 *               <acquired_us> <believed_until_us> <token> <value> <written>
 *             acquired_us is taken after lock_acquire returned and
 *             believed_until_us before the last check that still found the
 *             lock held (CLOCK_MONOTONIC, shared by all processes), so the
 *             interval is inside the real belief: two intervals that overlap
 *             mean two holders believed at once. written: 1 accepted, 0
 *             refused by the fence, -1 no write (lock no longer believed,
 *             or no --redis).
 *   hold      take NAME and keep it until SIGTERM/SIGINT (or --hold-ms).
 *             Prints "held TOKEN MS_LEFT INCARNATION" (16 hex digits),
 *             then "lost CODE REASON" if the lock is
 *             lost; at the end, with --redis, one fenced write with its
 *             token ("write accepted" / "write refused HIGHEST"), then
 *             "release RESULT". With --log, one line as loop writes (the
 *             belief checked every 50 ms). Exit 0, or 70 if lost.
 *   try       one acquire: prints "held TOKEN MS INCARNATION" (then releases)
 *             or "busy".
 *             Exit 0 held, 75 busy, 69 error.
 *   selftest  checks of the API against the server at --url, printing
 *             "N passed, N failed" (exit 1 on failures).
 *
 * Usage: lockcheck --url URL [--url URL...] [options] MODE | --version */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "common/version.h"
#include "lock/lock.h"

#define EXIT_ERROR 69
#define EXIT_LOST 70
#define EXIT_BUSY 75

typedef struct opts {
    const char *urls[16];
    int nurls;
    const char *name, *redis, *log;
    int64_t ttl_ms, wait_ms, hold_ms;
    int timeout_ms, watchdog, count;
    double seconds;
} opts;

static lock_client *client_for(const opts *o, int watchdog) {
    char err[600];
    lock_options lo = { .urls = o->urls, .nurls = o->nurls, .timeout_ms = o->timeout_ms,
                         .watchdog = watchdog };
    lock_client *c = lock_client_new(&lo, err, sizeof err);
    if (!c) fprintf(stderr, "lockcheck: %s\n", err);
    return c;
}

/* A lock client on the --redis URL, for fenced writes (NULL without one). */
static lock_client *redis_writer(const opts *o) {
    char err[600];
    if (!o->redis) return NULL;
    lock_options lo = { .urls = &o->redis, .nurls = 1, .timeout_ms = o->timeout_ms };
    lock_client *c = lock_client_new(&lo, err, sizeof err);
    if (!c) fprintf(stderr, "lockcheck: --redis: %s\n", err);
    return c;
}

static redisContext *redis_raw(const opts *o) {
    rconn_addr a;
    char err[300];
    if (!o->redis || rconn_parse(o->redis, &a, err, sizeof err)) return NULL;
    return rconn_connect(&a, o->timeout_ms, err, sizeof err);
}

static int believed(const lock_handle *h) { return !lock_lost(h) && lock_remaining_ms(h) > 0; }

/* ------------------------------------------------------------------- loop */

static int run_loop(const opts *o) {
    lock_client *c = client_for(o, o->watchdog);
    lock_client *w = redis_writer(o);
    redisContext *r = redis_raw(o);
    int fd = o->log ? open(o->log, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
    if (!c || (o->redis && (!w || !r)) || (o->log && fd < 0)) {
        fprintf(stderr, "lockcheck: loop: cannot set up (client, --redis or --log)\n");
        return EXIT_ERROR;
    }
    char fence_key[300], counter_key[300], err[600];
    snprintf(fence_key, sizeof fence_key, "lockcheck:{%s}:fence", o->name);
    snprintf(counter_key, sizeof counter_key, "lockcheck:{%s}:counter", o->name);
    int64_t end = o->seconds > 0 ? clock_mono_us() + (int64_t)(o->seconds * 1e6) : INT64_MAX;
    long held = 0, busy = 0, errors = 0, lost = 0, refused = 0, accepted = 0;
    while (held < o->count && clock_mono_us() < end) {
        lock_handle *h;
        lock_status st = lock_acquire(c, o->name, o->ttl_ms, o->wait_ms, NULL, &h, err, sizeof err);
        if (st != LOCK_OK) {
            if (st == LOCK_BUSY) busy++;
            else if (errors++ < 5) fprintf(stderr, "lockcheck: acquire: %s\n", err);
            if (st == LOCK_ERROR) clock_sleep_ms(50);
            continue;
        }
        int64_t t0 = clock_mono_us(), last = -1;
        uint64_t token = lock_fence(h);
        long long value = -1;
        int written = -1;
        if (believed(h)) last = t0;
        if (r) {
            redisReply *x = redisCommand(r, "GET %s", counter_key);
            value = x && x->type == REDIS_REPLY_STRING ? atoll(x->str) : 0;
            if (x) freeReplyObject(x);
        }
        for (int64_t until = t0 + o->hold_ms * 1000;;) {
            int64_t t = clock_mono_us();
            if (!believed(h)) break;
            last = t;
            if (t >= until) break;
            clock_sleep_ms(1);
        }
        if (w && believed(h)) {
            char v[32];
            int n = snprintf(v, sizeof v, "%lld", value + 1);
            written = lock_fenced_set(w, fence_key, counter_key, token, lock_incarnation(h), v,
                                      (size_t)n, NULL, err, sizeof err);
            if (written < 0) fprintf(stderr, "lockcheck: fenced write: %s\n", err);
            accepted += written == 1;
            refused += written == 0;
        }
        lost += lock_lost(h) != 0;
        lock_release(h);
        held++;
        if (fd >= 0 && last >= 0) {
            char line[200];
            int n = snprintf(line, sizeof line, "%" PRId64 " %" PRId64 " %" PRIu64 " %lld %d\n",
                             t0, last, token, value, written);
            if (write(fd, line, (size_t)n) != n) errors++;
        }
    }
    printf("done held=%ld busy=%ld errors=%ld lost=%ld accepted=%ld refused=%ld\n", held, busy,
           errors, lost, accepted, refused);
    if (fd >= 0) close(fd);
    if (r) redisFree(r);
    lock_client_free(w);
    lock_client_free(c);
    return held == o->count ? 0 : EXIT_ERROR;
}

/* ------------------------------------------------------------------- hold */

static const char *release_name(lock_release_result r) {
    return r == LOCK_RELEASED ? "released" : r == LOCK_NOT_OWNER ? "not-owner" : "unknown";
}

static atomic_int hold_lost;

static void on_lost(lock_handle *h, void *ud) {
    (void)ud;
    char why[300];
    lock_errcode code = lock_err(h, why, sizeof why);
    atomic_store(&hold_lost, 1);
    printf("lost %d %s\n", (int)code, why);
    fflush(stdout);
}

static int run_hold(const opts *o, const sigset_t *sigs) {
    char err[600];
    lock_client *c = client_for(o, o->watchdog);
    lock_client *w = redis_writer(o);
    if (!c || (o->redis && !w)) return EXIT_ERROR;
    lock_handle *h;
    lock_status st = lock_acquire(c, o->name, o->ttl_ms, o->wait_ms, NULL, &h, err, sizeof err);
    if (st != LOCK_OK) {
        printf("%s %s\n", st == LOCK_BUSY ? "busy" : "error", err);
        lock_client_free(w);
        lock_client_free(c);
        return st == LOCK_BUSY ? EXIT_BUSY : EXIT_ERROR;
    }
    int64_t t0 = clock_mono_us(), last = believed(h) ? t0 : -1;
    printf("held %" PRIu64 " %" PRId64 " %016" PRIx64 "\n", lock_fence(h), lock_remaining_ms(h),
           lock_incarnation(h));
    fflush(stdout);
    lock_on_lost(h, on_lost, NULL);
    int64_t until = o->hold_ms > 0 ? clock_mono_us() + o->hold_ms * 1000 : INT64_MAX;
    while (clock_mono_us() < until) {
        struct timespec ts = { 0, 50 * 1000000 };
        int64_t t = clock_mono_us();
        if (last >= 0 && believed(h)) last = t;
        if (sigtimedwait(sigs, NULL, &ts) > 0) break;
    }
    if (o->log && last >= 0) {
        int fd = open(o->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        char line[200];
        int n = snprintf(line, sizeof line, "%" PRId64 " %" PRId64 " %" PRIu64 " -1 -1\n", t0,
                         last, lock_fence(h));
        if (fd < 0 || write(fd, line, (size_t)n) != n) fprintf(stderr, "lockcheck: --log failed\n");
        if (fd >= 0) close(fd);
    }
    if (w) {
        uint64_t highest = 0;
        char v[64];
        int n = snprintf(v, sizeof v, "holder-%ld", (long)getpid());
        int rc = lock_fenced_set(w, "lockcheck:{hold}:fence", "lockcheck:{hold}:value",
                                 lock_fence(h), lock_incarnation(h), v, (size_t)n, &highest, err,
                                 sizeof err);
        if (rc == 1) printf("write accepted\n");
        else if (rc == 0) printf("write refused %" PRIu64 "\n", highest);
        else printf("write error %s\n", err);
    }
    int was_lost = lock_lost(h);
    lock_release_result rr = lock_release_ex(h, err, sizeof err);
    printf("release %s %s\n", release_name(rr), err);
    fflush(stdout);
    lock_client_free(w);
    lock_client_free(c);
    return was_lost || atomic_load(&hold_lost) ? EXIT_LOST : 0;
}

/* -------------------------------------------------------------------- try */

static int run_try(const opts *o) {
    char err[600];
    lock_client *c = client_for(o, o->watchdog);
    if (!c) return EXIT_ERROR;
    lock_handle *h;
    int64_t t0 = clock_mono_us();
    lock_status st = lock_acquire(c, o->name, o->ttl_ms, o->wait_ms, NULL, &h, err, sizeof err);
    double ms = (clock_mono_us() - t0) / 1000.0;
    int rc = 0;
    if (st == LOCK_OK) {
        printf("held %" PRIu64 " %.1f %016" PRIx64 "\n", lock_fence(h), ms, lock_incarnation(h));
        lock_release(h);
    } else {
        printf("%s %.1f %s\n", st == LOCK_BUSY ? "busy" : "error", ms, err);
        rc = st == LOCK_BUSY ? EXIT_BUSY : EXIT_ERROR;
    }
    lock_client_free(c);
    return rc;
}

/* --------------------------------------------------------------- selftest */

static int passed, failed;
static char err[600];

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (cond) {                                                                     \
            passed++;                                                                   \
        } else {                                                                        \
            failed++;                                                                   \
            fprintf(stderr, "  %s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,    \
                    __LINE__, #cond, err);                                              \
        }                                                                               \
    } while (0)

static lock_handle *take(lock_client *c, const char *name, int64_t ttl, int64_t wait,
                         const char *owner) {
    lock_handle *h = NULL;
    if (lock_acquire(c, name, ttl, wait, owner, &h, err, sizeof err) != LOCK_OK) return NULL;
    return h;
}

typedef struct mutex_arg {
    lock_client *c;
    const char *name;
    atomic_int *inside;
    long *counter;
    atomic_int overlaps, errors;
} mutex_arg;

static void *mutex_worker(void *arg) {
    mutex_arg *m = arg;
    char e[300];
    for (int i = 0; i < 15; i++) {
        lock_handle *h;
        if (lock_acquire(m->c, m->name, 5000, 20000, NULL, &h, e, sizeof e) != LOCK_OK) {
            atomic_fetch_add(&m->errors, 1);
            continue;
        }
        if (atomic_fetch_add(m->inside, 1) != 0) atomic_fetch_add(&m->overlaps, 1);
        long v = *m->counter;      /* a non-atomic increment: the lock protects it */
        clock_sleep_ms(1);
        *m->counter = v + 1;
        atomic_fetch_sub(m->inside, 1);
        if (lock_release(h) != LOCK_RELEASED) atomic_fetch_add(&m->errors, 1);
    }
    return NULL;
}

typedef struct handoff_arg {
    lock_client *c;
    const char *name;
    int64_t got_us;
    uint64_t fence;
} handoff_arg;

static void *handoff_waiter(void *arg) {
    handoff_arg *a = arg;
    char e[300];
    lock_handle *h;
    if (lock_acquire(a->c, a->name, 5000, 10000, "waiter", &h, e, sizeof e) == LOCK_OK) {
        a->got_us = clock_mono_us();
        a->fence = lock_fence(h);
        lock_release(h);
    }
    return NULL;
}

static int run_selftest(const opts *o) {
    lock_client *c = client_for(o, 1);
    if (!c) return EXIT_ERROR;
    const char *n = o->name;
    char name2[300];

    /* Acquire, busy, wait past a holder, release. */
    lock_handle *a = take(c, n, 3000, 0, "a");
    CHECK(a && lock_fence(a) > 0 && !lock_lost(a));
    CHECK(a && lock_remaining_ms(a) > 0 && lock_remaining_ms(a) <= 60000);
    lock_handle *b = take(c, n, 3000, 0, "b");
    CHECK(!b);
    int64_t t0 = clock_mono_us();
    CHECK(lock_acquire(c, n, 3000, 300, "b", &b, err, sizeof err) == LOCK_BUSY && !b);
    int64_t waited = clock_mono_us() - t0;
    CHECK(waited >= 290000 && waited < 3000000);
    uint64_t fa = a ? lock_fence(a) : 0, ia = a ? lock_incarnation(a) : 0;
    CHECK(a && lock_release(a) == LOCK_RELEASED);
    b = take(c, n, 3000, 0, "b");
    CHECK(b && lock_fence(b) > fa);
    uint64_t inc = b ? lock_incarnation(b) : 0;
    CHECK(b && inc != 0 && inc == ia);
    CHECK(b && lock_release(b) == LOCK_RELEASED);

    /* Reentry: one hold, counted. */
    lock_handle *r1 = take(c, n, 3000, 0, "re"), *r2 = take(c, n, 3000, 0, "re");
    CHECK(r1 && r2 && r1 != r2 && lock_fence(r1) == lock_fence(r2));
    CHECK(r1 && lock_release(r1) == LOCK_RELEASED);
    CHECK(!take(c, n, 3000, 0, "other"));
    CHECK(r2 && lock_release(r2) == LOCK_RELEASED);
    lock_handle *x = take(c, n, 3000, 0, "other");
    CHECK(x != NULL);
    if (x) lock_release(x);

    /* Tokens strictly increase, within one incarnation of the server's data. */
    uint64_t prev = 0;
    int increasing = 1;
    for (int i = 0; i < 5; i++) {
        lock_handle *h = take(c, n, 3000, 0, NULL);
        if (!h || lock_fence(h) <= prev || lock_incarnation(h) != inc) increasing = 0;
        if (h) prev = lock_fence(h);
        if (h) lock_release(h);
    }
    CHECK(increasing && inc != 0);

    /* A waiter is handed the lock when the holder releases it, promptly. */
    lock_handle *hold = take(c, n, 5000, 0, "holder");
    handoff_arg ha = { c, n, 0, 0 };
    pthread_t t;
    pthread_create(&t, NULL, handoff_waiter, &ha);
    clock_sleep_ms(300);
    CHECK(ha.got_us == 0);                        /* still waiting */
    int64_t released = clock_mono_us();
    uint64_t fh = hold ? lock_fence(hold) : 0;
    CHECK(hold && lock_release(hold) == LOCK_RELEASED);
    pthread_join(t, NULL);
    CHECK(ha.got_us > 0 && ha.fence > fh);
    CHECK(ha.got_us - released < 2000000);
    fprintf(stderr, "  hand-off to one waiter: %.1f ms\n", (ha.got_us - released) / 1000.0);

    /* Threads exclude each other. */
    atomic_int inside = 0;
    long counter = 0;
    mutex_arg m = { c, n, &inside, &counter, 0, 0 };
    pthread_t ts[6];
    for (int i = 0; i < 6; i++) pthread_create(&ts[i], NULL, mutex_worker, &m);
    for (int i = 0; i < 6; i++) pthread_join(ts[i], NULL);
    CHECK(counter == 90 && atomic_load(&m.overlaps) == 0 && atomic_load(&m.errors) == 0);

    /* Names are opaque bytes: these are all different locks. */
    const char *odd[] = { "x/y", "x%2Fy", ".", "..", "sp ace", "caf\xc3\xa9", "{tag}:k", "a\x01" };
    lock_handle *oh[8];
    int all = 1;
    for (int i = 0; i < 8; i++) {
        snprintf(name2, sizeof name2, "%s-%s", n, odd[i]);
        oh[i] = take(c, name2, 3000, 0, NULL);
        all &= oh[i] != NULL;
    }
    CHECK(all);
    for (int i = 0; i < 8; i++)
        if (oh[i]) CHECK(lock_release(oh[i]) == LOCK_RELEASED);

    /* Redis-only calls refuse clearly on the other kinds; on Redis (one
     * server, a Sentinel's primary, a cluster: keys of one slot) the
     * fenced write is made. A bad argument is refused. */
    int redis_kind = strncmp(o->urls[0], "zk://", 5) && strncmp(o->urls[0], "etcd://", 7);
    if (redis_kind)
        CHECK(lock_fenced_set(c, "{selftest}:fence", "{selftest}:k", 1, 0, "v", 1, NULL, err,
                              sizeof err) >= 0);
    else
        CHECK(lock_fenced_set(c, "f", "k", 1, 0, "v", 1, NULL, err, sizeof err) == -1 &&
              strstr(err, "redis://"));
    CHECK(lock_acquire(c, "", 1000, 0, NULL, &x, err, sizeof err) == LOCK_ERROR && !x);

    /* The lease is kept while held (watchdog, or a ZooKeeper session). */
    lock_handle *kept = take(c, n, 1000, 0, NULL);
    int stayed = kept != NULL;
    for (int i = 0; kept && i < 25; i++) {
        clock_sleep_ms(100);
        stayed &= believed(kept);
    }
    CHECK(stayed);
    CHECK(kept && lock_release(kept) == LOCK_RELEASED);

    lock_stats st;
    lock_client_stats(c, &st);
    CHECK(st.acquired >= 20 && st.lost == 0 && st.unknown == 0);

    /* One kind of server per client; bad URLs are refused with a reason. */
    const char *mixed[2] = { o->urls[0], redis_kind ? "zk://127.0.0.1:1" : "redis://127.0.0.1:1/0" };
    lock_options lo = { .urls = mixed, .nurls = 2, .timeout_ms = 500 };
    lock_client *bad = lock_client_new(&lo, err, sizeof err);
    CHECK(!bad && strstr(err, "one kind"));
    const char *two[2] = { "zk://127.0.0.1:1", "zk://127.0.0.1:2" };
    lo.urls = two;
    CHECK(!(bad = lock_client_new(&lo, err, sizeof err)) && strstr(err, "one URL"));
    const char *urls_bad[] = { "zk://", "zk://host", "zk://h:1,", "zk://h:x", "zk://h:1/a//b",
                               "zk://h:1/a/..", "zk://h:1/a b", "etcd://", "etcd://h",
                               "etcd://h:1,", "etcd:///p" };
    for (size_t i = 0; i < sizeof urls_bad / sizeof *urls_bad; i++) {
        lo.urls = &urls_bad[i];
        lo.nurls = 1;
        err[0] = '\0';
        bad = lock_client_new(&lo, err, sizeof err);
        CHECK(!bad && err[0]);
        if (bad) fprintf(stderr, "  accepted bad URL %s\n", urls_bad[i]);
        lock_client_free(bad);
    }

    lock_client_free(c);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* ------------------------------------------------------------------- main */

static void usage(void) {
    fprintf(stderr,
            "usage: lockcheck --url URL [--url URL...] [--name N] [--ttl MS] [--wait MS]\n"
            "                 [--timeout MS] [--watchdog 0|1] [--count N] [--hold-ms MS]\n"
            "                 [--redis URL] [--log FILE] [--seconds S] loop|hold|try|selftest\n"
            "       lockcheck --version\n");
}

int main(int argc, char **argv) {
    opts o = { .name = "lockcheck", .ttl_ms = 2000, .wait_ms = -1, .timeout_ms = 1000,
               .watchdog = 1, .count = 10, .hold_ms = 0 };
    static const struct option lo[] = {
        { "url", required_argument, 0, 'u' },      { "name", required_argument, 0, 'n' },
        { "ttl", required_argument, 0, 't' },      { "wait", required_argument, 0, 'w' },
        { "timeout", required_argument, 0, 'T' },  { "watchdog", required_argument, 0, 'W' },
        { "count", required_argument, 0, 'c' },    { "hold-ms", required_argument, 0, 'H' },
        { "redis", required_argument, 0, 'r' },    { "log", required_argument, 0, 'l' },
        { "seconds", required_argument, 0, 's' },  { "version", no_argument, 0, 'V' },
        { 0, 0, 0, 0 }
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "u:n:t:w:", lo, NULL)) != -1) {
        switch (ch) {
        case 'u':
            if (o.nurls == 16) return 64;
            o.urls[o.nurls++] = optarg;
            break;
        case 'n': o.name = optarg; break;
        case 't': o.ttl_ms = atoll(optarg); break;
        case 'w': o.wait_ms = atoll(optarg); break;
        case 'T': o.timeout_ms = atoi(optarg); break;
        case 'W': o.watchdog = atoi(optarg); break;
        case 'c': o.count = atoi(optarg); break;
        case 'H': o.hold_ms = atoll(optarg); break;
        case 'r': o.redis = optarg; break;
        case 'l': o.log = optarg; break;
        case 's': o.seconds = atof(optarg); break;
        case 'V': printf("lockcheck %s\n", flashsale_version); return 0;
        default: usage(); return 64;
        }
    }
    if (optind != argc - 1 || o.nurls == 0) {
        usage();
        return 64;
    }
    const char *mode = argv[optind];
    /* SIGTERM/SIGINT are taken with sigtimedwait (hold); blocked before any
     * thread starts, so no thread of the libraries gets them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    if (!strcmp(mode, "hold")) pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "loop")) return run_loop(&o);
    if (!strcmp(mode, "hold")) return run_hold(&o, &sigs);
    if (!strcmp(mode, "try")) return run_try(&o);
    if (!strcmp(mode, "selftest")) return run_selftest(&o);
    usage();
    return 64;
}
