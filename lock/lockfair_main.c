/* lockfair_main.c: bin/lockfair, a lock's fairness measured (Alibaba
 * Cloud's "Implementation Principles and Best Practices of Distributed
 * Lock", 6.1: "when the lock wakes up, it does so in sequence"). Waiters arrive
 * at a lock in a known order, each on a client of its own (as separate
 * processes would be), each holds it a while once it has it; the order
 * they were served in is set against the order they arrived in:
 *
 *   queue    a holder takes the lock first; the waiters arrive gap-ms
 *            apart while it is held; then it lets go, and each waiter
 *            holds it hold-ms in turn: who is served first?
 *   stream   no first holder: the waiters keep arriving gap-ms apart,
 *            faster than the lock is handed on (gap-ms < hold-ms), so the
 *            queue grows while it is served: the case in which an unfair
 *            lock lets a newcomer in ahead of those waiting, again and
 *            again, and one of them starves.
 *
 * Per run it counts the pairs of waiters served out of arrival order (of
 * all pairs of served waiters), the median and longest wait (from a
 * waiter's call to its holding the lock) and the waiters that starved
 * (not served within wait-ms). With --fair it also counts, from each
 * hold's ticket (lock_ticket: the order the server saw the places taken
 * in), the pairs served out of ticket order -- the lock's own disorder --
 * and the pairs that reached the server out of arrival order (a thread
 * scheduled late: the way to the server, which no lock can mend). --json
 * prints one JSON object per run, with the service order ("order":
 * arrival indices, served first first).
 *
 * Usage: lockfair --url URL [--url URL]... [--fair] [--scene queue|stream]
 *                 [--waiters N] [--gap-ms G] [--hold-ms H] [--wait-ms W]
 *                 [--runs R] [--name NAME] [--json] | --version
 * Exit status: 0 when every run served every waiter in arrival order,
 * 1 when some run did not, 2 on an error, 64 on bad usage. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/version.h"
#include "lock/lock.h"

#define MAX_WAITERS 200

static void sleep_us(int64_t us) {
    if (us <= 0) return;
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0) {}
}
#define TTL_MS 10000

typedef struct opts {
    const char *urls[LOCK_MAX_SERVERS];
    int nurls;
    int fair, json, stream;
    int waiters, gap_ms, hold_ms, wait_ms, runs;
    const char *name;
} opts;

/* One waiter: when it called and when it held, both monotonic. */
typedef struct waiter {
    const opts *o;
    int index;                   /* arrival order */
    const char *name;            /* the run's lock */
    lock_client *c;
    int64_t start_us;            /* when to call */
    int64_t arrive_us, got_us;   /* got_us 0: not served */
    uint64_t ticket;             /* fair: its place's ticket, the server's arrival order
                                  * (0: took the lock without a place) */
    lock_status st;
    char err[200];
} waiter;

static void *waiter_run(void *arg) {
    waiter *w = arg;
    /* A client's first call connects (and loads its scripts, opens its
     * session): done first, on a name of its own, so that the call below
     * reaches the server when the waiter arrives. */
    char warm[LOCK_NAME_MAX + 1];
    lock_handle *hw = NULL;
    snprintf(warm, sizeof warm, "%.*s:warm:%d", LOCK_NAME_MAX - 20, w->name, w->index);
    if (lock_acquire(w->c, warm, TTL_MS, 0, NULL, &hw, NULL, 0) == LOCK_OK) lock_release(hw);
    int64_t now = clock_mono_us();
    if (w->start_us > now) sleep_us(w->start_us - now);
    lock_handle *h = NULL;
    w->arrive_us = clock_mono_us();
    w->st = lock_acquire(w->c, w->name, TTL_MS, w->o->wait_ms, NULL, &h, w->err,
                         sizeof w->err);
    if (w->st != LOCK_OK) return NULL;
    w->got_us = clock_mono_us();
    w->ticket = lock_ticket(h);
    sleep_us((int64_t)w->o->hold_ms * 1000);
    lock_release(h);
    return NULL;
}

static lock_client *client_for(const opts *o, char *err, size_t errlen) {
    lock_options lo = { .urls = o->urls, .nurls = o->nurls, .timeout_ms = 1000,
                        .watchdog = 1, .fair = o->fair };
    return lock_client_new(&lo, err, errlen);
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static waiter *by_got_sort;
static int cmp_got(const void *a, const void *b) {
    const waiter *x = &by_got_sort[*(const int *)a], *y = &by_got_sort[*(const int *)b];
    return x->got_us < y->got_us ? -1 : x->got_us > y->got_us;
}

/* One run of the scene. Returns the pairs out of order (>= 0), or -1 on an
 * error (said on stderr). */
static long one_run(const opts *o, int run) {
    waiter *w = calloc((size_t)o->waiters, sizeof *w);
    pthread_t *t = calloc((size_t)o->waiters, sizeof *t);
    lock_client *holder_c = NULL;
    lock_handle *held = NULL;
    long bad = -1;
    char err[300], name[LOCK_NAME_MAX + 1];
    /* A {tag} in o->name stays; else the run's name is its own tag, so that
     * the warm-up names (name:warm:i) share its slot on a cluster. */
    snprintf(name, sizeof name, strchr(o->name, '{') ? "%s:%d" : "{%s:%d}", o->name, run);
    if (!w || !t) goto out;
    for (int i = 0; i < o->waiters; i++) {
        w[i].o = o;
        w[i].name = name;
        w[i].index = i;
        if (!(w[i].c = client_for(o, err, sizeof err))) {
            fprintf(stderr, "lockfair: %s\n", err);
            goto out;
        }
    }
    if (!o->stream) {
        if (!(holder_c = client_for(o, err, sizeof err)) ||
            lock_acquire(holder_c, name, TTL_MS, 5000, NULL, &held, err, sizeof err) !=
                LOCK_OK) {
            fprintf(stderr, "lockfair: the first holder: %s\n", err);
            goto out;
        }
    }
    int64_t t0 = clock_mono_us() + 300000;   /* every client warm by then */
    int started = 0;
    for (int i = 0; i < o->waiters; i++) {
        w[i].start_us = t0 + (int64_t)i * o->gap_ms * 1000;
        if (pthread_create(&t[i], NULL, waiter_run, &w[i]) != 0) break;
        started++;
    }
    if (held) {   /* everyone has arrived: let go */
        sleep_us(t0 + (int64_t)o->waiters * o->gap_ms * 1000 + 50000 - clock_mono_us());
        lock_release(held);
    }
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
    if (started < o->waiters) {
        fprintf(stderr, "lockfair: could not start a thread\n");
        goto out;
    }
    /* The service order, and the pairs served against arrival order. */
    int served = 0, starved = 0, errors = 0;
    int order[MAX_WAITERS];
    int64_t waits[MAX_WAITERS];
    for (int i = 0; i < o->waiters; i++) {
        if (w[i].st == LOCK_OK) {
            order[served] = i;
            waits[served++] = w[i].got_us - w[i].arrive_us;
        } else if (w[i].st == LOCK_BUSY) {
            starved++;
        } else {
            errors++;
            fprintf(stderr, "lockfair: waiter %d: %s\n", i, w[i].err);
        }
    }
    by_got_sort = w;
    qsort(order, (size_t)served, sizeof order[0], cmp_got);
    long pairs = (long)served * (served - 1) / 2;
    /* A fair lock's tickets tell whose fault a pair out of arrival order
     * is: served against the tickets is the lock's own; tickets against
     * the arrivals are the way to the server (a thread scheduled late, a
     * slow connection), which no lock can see. Pairs of two served
     * waiters with tickets only. */
    long by_ticket = 0, reached = 0;
    bad = 0;
    for (int a = 0; a < served; a++)
        for (int b = a + 1; b < served; b++) {
            const waiter *x = &w[order[a]], *y = &w[order[b]];   /* x served first */
            if (order[a] > order[b]) bad++;   /* b arrived earlier, a was served first */
            if (!x->ticket || !y->ticket) continue;
            if (x->ticket > y->ticket) by_ticket++;
            if ((x->index < y->index) != (x->ticket < y->ticket)) reached++;
        }
    qsort(waits, (size_t)served, sizeof waits[0], cmp64);
    double med = served ? waits[served / 2] / 1000.0 : 0, max = served ? waits[served - 1] / 1000.0 : 0;
    if (o->json) {
        printf("{\"scene\":\"%s\",\"run\":%d,\"fair\":%d,\"waiters\":%d,\"gap_ms\":%d,"
               "\"hold_ms\":%d,\"served\":%d,\"pairs\":%ld,\"out_of_order\":%ld,"
               "\"out_of_ticket_order\":%ld,\"reached_out_of_order\":%ld,"
               "\"wait_median_ms\":%.1f,\"wait_max_ms\":%.1f,\"starved\":%d,\"errors\":%d,"
               "\"order\":[",
               o->stream ? "stream" : "queue", run, o->fair, o->waiters, o->gap_ms, o->hold_ms,
               served, pairs, bad, by_ticket, reached, med, max, starved, errors);
        for (int i = 0; i < served; i++) printf("%s%d", i ? "," : "", order[i]);
        printf("]}\n");
    } else {
        printf("%s run %d: %d served, %ld of %ld pairs out of arrival order, wait median %.0f ms,"
               " longest %.0f ms, %d starved (not served within %d ms)%s",
               o->stream ? "stream" : "queue", run, served, bad, pairs, med, max, starved,
               o->wait_ms, errors ? ", with errors" : "");
        if (o->fair)
            printf("; by tickets: %ld pairs served out of ticket order, %ld reached the server"
                   " out of arrival order", by_ticket, reached);
        printf("\n");
    }
    if (errors) bad = -1;
    else if (starved) bad += 1;      /* a starved waiter is served out of order, if ever */
out:
    for (int i = 0; w && i < o->waiters; i++) lock_client_free(w[i].c);
    lock_client_free(holder_c);
    free(w);
    free(t);
    return bad;
}

static void usage(FILE *f) {
    fputs("usage: lockfair --url URL [--url URL]... [--fair] [--scene queue|stream]\n"
          "                [--waiters N] [--gap-ms G] [--hold-ms H] [--wait-ms W] [--runs R]\n"
          "                [--name NAME] [--json] | --version\n", f);
}

int main(int argc, char **argv) {
    char name[64];
    snprintf(name, sizeof name, "lockfair:%ld", (long)time(NULL));
    opts o = { .waiters = 30, .gap_ms = 15, .hold_ms = 40, .wait_ms = 30000, .runs = 1,
               .name = name };
    static const struct option longs[] = {
        { "url", required_argument, 0, 'u' },    { "fair", no_argument, 0, 'f' },
        { "scene", required_argument, 0, 's' },  { "waiters", required_argument, 0, 'n' },
        { "gap-ms", required_argument, 0, 'g' }, { "hold-ms", required_argument, 0, 'H' },
        { "wait-ms", required_argument, 0, 'w' }, { "runs", required_argument, 0, 'r' },
        { "name", required_argument, 0, 'N' },   { "json", no_argument, 0, 'j' },
        { "version", no_argument, 0, 'V' },      { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 } };
    int ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case 'u':
            if (o.nurls == LOCK_MAX_SERVERS) return 64;
            o.urls[o.nurls++] = optarg;
            break;
        case 'f': o.fair = 1; break;
        case 's':
            if (strcmp(optarg, "queue") && strcmp(optarg, "stream")) {
                usage(stderr);
                return 64;
            }
            o.stream = !strcmp(optarg, "stream");
            break;
        case 'n': o.waiters = atoi(optarg); break;
        case 'g': o.gap_ms = atoi(optarg); break;
        case 'H': o.hold_ms = atoi(optarg); break;
        case 'w': o.wait_ms = atoi(optarg); break;
        case 'r': o.runs = atoi(optarg); break;
        case 'N': o.name = optarg; break;
        case 'j': o.json = 1; break;
        case 'V': printf("lockfair %s\n", flashsale_version); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 64;
        }
    }
    if (!o.nurls || o.waiters < 2 || o.waiters > MAX_WAITERS || o.gap_ms < 0 || o.hold_ms < 0 ||
        o.wait_ms < 1 || o.runs < 1) {
        usage(stderr);
        return 64;
    }
    int rc = 0;
    for (int r = 1; r <= o.runs; r++) {
        long bad = one_run(&o, r);
        if (bad < 0) return 2;
        if (bad > 0) rc = 1;
        fflush(stdout);
    }
    return rc;
}
