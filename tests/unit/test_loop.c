/* test_loop.c: the event loop (common/loop.h), promise by promise:
 * - watches on pipes and an eventfd fire with the right events, fd and ud;
 *   changing the events or the callback, 0 keeping a watch quiet (even on a
 *   hung-up pipe), unwatching (also from another watch's callback in the
 *   same iteration), a hang-up reported as both events, errors returned;
 * - loop_after: order by due time (FIFO among equal ones), never early,
 *   0 meaning the next iteration; loop_every: period kept, bad periods
 *   refused;
 * - phase hooks: after the events of an iteration, once, phase by phase
 *   in rank order and in registration order within a phase (a hook
 *   registered later in an earlier phase runs first), also after an
 *   iteration that only ran timers; one added from a running phase runs
 *   this turn when its phase is not past, else next turn; bad
 *   this turn when its phase is not past, also a phase of a new rank;
 *   bad registrations refused (no fn, a rank out of range, a full phase,
 *   a new rank past the loop's room, which a forgotten phase gives back);
 *   loop_again, also from an early phase; loop_forget (an owner's timers
 *   and hooks go, also from inside a hook);
 * - loop_post from many threads: every task exactly once, on the loop's
 *   thread (loop_current), a task may re-post or free itself;
 * - loop_stop from another thread; loop_free running tasks not yet run;
 *   loop_data / loop_set_data;
 * - loop_turn_us: the last whole turn's length, its events and hooks, the
 *   wait in epoll_wait not counted.
 * Most cases run the loop on a thread of its own (tests/unit/tloop.h). */
#include <errno.h>
#include <stdatomic.h>
#include <sys/eventfd.h>

#include "tests/unit/t.h"
#include "tests/unit/tloop.h"

/* Ranks for the phase cases, spaced as the service's modules space theirs
 * (the loop knows none of them). */
enum { LOOP_PHASE_HTTP = 100, LOOP_PHASE_ORDERS = 200, LOOP_PHASE_CLEARS = 300,
       LOOP_PHASE_SENDS = 900 };

static tloop TL;                      /* the loop of the running case */

/* A watch callback's record: calls, last events / fd / ud seen; drain:
 * read what is there. Written by on_io on the loop's thread, and read only
 * there: the checks look at a copy (seen) taken there, as a watch on a
 * descriptor that stays ready (a pipe's write end, an eventfd not drained)
 * goes on being called while this thread looks. */
typedef struct rec { int n; unsigned ev; int fd; void *ud; int drain; } rec;
static rec seen;                      /* a record as copied on the loop's thread */

static void on_io(loop *l, int fd, unsigned events, void *ud) {
    rec *r = ud;
    char buf[64];
    (void)l;
    r->n++, r->ev = events, r->fd = fd, r->ud = ud;
    if (r->drain && read(fd, buf, sizeof buf) < 0) {}
}

/* An argument block for calls made on the loop's thread (n: a count read there). */
static struct { int fd; unsigned events; rec *r; int rc, err, n; } W;

static void do_watch(void *ud) {
    (void)ud;
    errno = 0;
    W.rc = loop_watch(TL.l, W.fd, W.events, on_io, W.r);
    W.err = errno;
    W.n = W.r ? W.r->n : 0;
}
static int watch(int fd, unsigned events, rec *r) {
    W.fd = fd, W.events = events, W.r = r;
    tl_call(&TL, do_watch, NULL);
    return W.rc;
}
static void do_unwatch(void *ud) { (void)ud; loop_unwatch(TL.l, W.fd); }
static void unwatch(int fd) { W.fd = fd; tl_call(&TL, do_unwatch, NULL); }
static void do_count(void *ud) { seen = *(rec *)ud, W.n = seen.n, W.events = seen.ev; }
/* r->n as seen on the loop's thread (the whole record in seen), after ms
 * of letting it run. */
static int count_after(rec *r, int ms) {
    clock_sleep_ms(ms);
    tl_call(&TL, do_count, r);
    return W.n;
}
/* (Copies the record into seen once it was called: its ev, fd and ud are
 * then those of a call.) */
static int called(void *ud) { return ((rec *)ud)->n > 0 && (seen = *(rec *)ud, 1); }
static int want_n;
static int reached(void *ud) { return ((rec *)ud)->n >= want_n; }
/* Whether r gets to exactly n calls (waited for, then no more after 5 ms). */
static int wait_n(rec *r, int n) {
    want_n = n;
    return tl_wait(&TL, reached, r, 2000) && count_after(r, 5) == n;
}

static void test_watch_pipe(void) {
    int p[2];
    CHECK(pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0);
    CHECK(tl_start(&TL) == 0);
    rec a = { .drain = 1 }, b = { .drain = 1 }, w = { 0 };
    /* A pipe's write end is writable at once. */
    CHECK(watch(p[1], LOOP_WRITE, &w) == 0);
    CHECK(tl_wait(&TL, called, &w, 1000));
    CHECK(seen.ev == LOOP_WRITE && seen.fd == p[1] && seen.ud == &w);
    CHECK(watch(p[1], 0, &w) == 0);                   /* quiet from now on */
    int n = W.n;
    CHECK(count_after(&w, 20) == n);
    /* Readable when a byte is written; the callback drains it (level
     * triggered: without draining it would fire again). */
    CHECK(watch(p[0], LOOP_READ, &a) == 0);
    CHECK(count_after(&a, 10) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK(tl_wait(&TL, called, &a, 1000));
    CHECK(seen.ev == LOOP_READ && seen.fd == p[0] && seen.ud == &a);
    CHECK(count_after(&a, 10) == 1);
    /* The same fd again: the new callback and ud replace the old. */
    CHECK(watch(p[0], LOOP_READ, &b) == 0);
    CHECK(write(p[1], "y", 1) == 1);
    CHECK(tl_wait(&TL, called, &b, 1000));
    CHECK(count_after(&a, 10) == 1 && count_after(&b, 0) == 1);
    /* Quiet (0): a byte waiting does not fire it; watching again does. */
    CHECK(watch(p[0], 0, &b) == 0);
    CHECK(write(p[1], "z", 1) == 1);
    CHECK(count_after(&b, 20) == 1);
    CHECK(watch(p[0], LOOP_READ, &b) == 0);
    CHECK(wait_n(&b, 2));
    /* Unwatched: nothing more, twice is harmless, and it can come back. */
    unwatch(p[0]);
    unwatch(p[0]);
    CHECK(write(p[1], "w", 1) == 1);
    CHECK(count_after(&b, 20) == 2);
    CHECK(watch(p[0], LOOP_READ, &b) == 0);
    CHECK(wait_n(&b, 3));
    /* A hang-up is reported as both events, so whichever the owner waits
     * on, it finds out; a quiet watch stays quiet even then. */
    unwatch(p[1]);
    close(p[1]);
    want_n = 4;
    CHECK(tl_wait(&TL, reached, &b, 2000));
    count_after(&b, 0);
    CHECK(W.events == (LOOP_READ | LOOP_WRITE));
    CHECK(watch(p[0], 0, &b) == 0);
    n = W.n;
    CHECK(count_after(&b, 30) == n);
    unwatch(p[0]);
    tl_end(&TL), close(p[0]);
}

static void test_watch_eventfd_and_errors(void) {
    CHECK(tl_start(&TL) == 0);
    int e = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    rec r = { .drain = 0 };
    CHECK(watch(e, LOOP_READ, &r) == 0);
    uint64_t one = 1, v;
    CHECK(write(e, &one, sizeof one) == sizeof one);
    CHECK(tl_wait(&TL, called, &r, 1000));
    CHECK(seen.ev == LOOP_READ && seen.fd == e);    /* (called again until drained) */
    CHECK(read(e, &v, sizeof v) == sizeof v && v == 1);   /* drained here: no more calls */
    int n = count_after(&r, 5);
    CHECK(count_after(&r, 20) == n);
    unwatch(e);
    close(e);
    /* A descriptor far above the others: the table grows to it. */
    int p[2];
    CHECK(pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0);
    int high = dup3(p[0], 3000, O_CLOEXEC);
    CHECK(high == 3000);
    rec h = { .drain = 1 };
    CHECK(watch(high, LOOP_READ, &h) == 0);
    CHECK(write(p[1], "x", 1) == 1);
    CHECK(tl_wait(&TL, called, &h, 1000) && seen.fd == 3000);
    unwatch(high);
    close(high);
    /* Errors are returned with errno, nothing else happens. */
    CHECK(watch(-1, LOOP_READ, &h) == -1 && W.err == EBADF);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);       /* epoll refuses files */
    CHECK(watch(devnull, LOOP_READ, &h) == -1 && W.err == EPERM);
    unwatch(devnull);
    close(devnull);
    CHECK(watch(p[0], LOOP_READ, &h) == 0);                    /* the loop still works */
    n = count_after(&h, 0);
    CHECK(write(p[1], "y", 1) == 1);
    CHECK(wait_n(&h, n + 1));
    unwatch(p[0]);
    tl_end(&TL);
    close(p[0]), close(p[1]);
}

/* Two descriptors ready in the same iteration; whichever callback runs
 * first unwatches the other, which must then not be called. */
static int pa[2], pb[2], unwatch_calls;
static void unwatch_other(loop *l, int fd, unsigned events, void *ud) {
    char c;
    (void)events, (void)ud;
    unwatch_calls++;
    if (read(fd, &c, 1) < 0) {}
    loop_unwatch(l, fd == pa[0] ? pb[0] : pa[0]);
}
static void arm_both(void *ud) {
    (void)ud;
    loop_watch(TL.l, pa[0], LOOP_READ, unwatch_other, NULL);
    loop_watch(TL.l, pb[0], LOOP_READ, unwatch_other, NULL);
    if (write(pa[1], "a", 1) < 0 || write(pb[1], "b", 1) < 0) unwatch_calls = 100;
}
static void read_calls(void *ud) { *(int *)ud = unwatch_calls; }
static int some_call(void *ud) { (void)ud; return unwatch_calls > 0; }

static void test_unwatch_during_dispatch(void) {
    CHECK(pipe2(pa, O_NONBLOCK | O_CLOEXEC) == 0 && pipe2(pb, O_NONBLOCK | O_CLOEXEC) == 0);
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, arm_both, NULL);          /* both readable before the next epoll_wait */
    CHECK(tl_wait(&TL, some_call, NULL, 2000));
    clock_sleep_ms(20);
    int n = -1;
    tl_call(&TL, read_calls, &n);
    CHECK(n == 1);
    tl_end(&TL);
    for (int i = 0; i < 2; i++) close(pa[i]), close(pb[i]);
}

/* ------------------------------------------------------------------ timers */

#define NT 200
static struct {
    int64_t t0_us, at_us[8];
    char log[NT + 8];
    int n, order[NT], norder, sync_ran;  /* sync_ran: a 0 ms timer ran inside loop_after */
} A;
static int timer_ids[NT];

static void fire(loop *l, void *ud) {
    int id = *(int *)ud;
    (void)l;
    if (A.n < 8) A.at_us[id] = clock_mono_us() - A.t0_us;
    A.log[A.n++] = (char)('A' + id);
}
static void set_five(void *ud) {
    (void)ud;
    static const int ms[] = { 30, 20, 10, 10, 0 };   /* A .. E */
    A.t0_us = clock_mono_us();
    for (int i = 0; i < 5; i++) {
        timer_ids[i] = i;
        CHECK(loop_after(TL.l, ms[i], fire, &timer_ids[i]) == 0);
    }
    A.sync_ran = A.n;
}
static int five_done(void *ud) { (void)ud; return A.n >= 5; }

static void fire_many(loop *l, void *ud) {
    (void)l;
    A.order[A.norder++] = *(int *)ud;
}
static int ms_of(int i) { return (i * 7 % 11) * 5; }   /* 0 .. 50 in steps of 5, shuffled */
static int64_t due_lo[NT], due_hi[NT];                   /* bounds of each one's due time */
static void set_many(void *ud) {
    (void)ud;
    for (int i = 0; i < NT; i++) {
        timer_ids[i] = i;
        due_lo[i] = clock_mono_us() + ms_of(i) * 1000;
        loop_after(TL.l, ms_of(i), fire_many, &timer_ids[i]);
        due_hi[i] = clock_mono_us() + ms_of(i) * 1000;
    }
}
static int many_done(void *ud) { (void)ud; return A.norder >= NT; }

static void test_after(void) {
    memset(&A, 0, sizeof A);
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, set_five, NULL);
    CHECK(A.sync_ran == 0);                             /* 0 ms: not inside the call */
    CHECK(tl_wait(&TL, five_done, NULL, 2000));
    CHECK_STR(A.log, "ECDBA");                          /* by due time, FIFO among equals */
    static const int ms[] = { 30, 20, 10, 10, 0 };
    for (int i = 0; i < 5; i++) {
        CHECK(A.at_us[i] >= ms[i] * 1000);              /* never early */
        CHECK(A.at_us[i] < ms[i] * 1000 + 500000);      /* and not much late */
    }
    /* Many at once: a heap that keeps the order (same delay: as added;
     * else never one that was surely due later before one due earlier). */
    tl_call(&TL, set_many, NULL);
    CHECK(tl_wait(&TL, many_done, NULL, 3000));
    int bad = 0;
    for (int k = 1; k < NT; k++) {
        int a = A.order[k - 1], b = A.order[k];
        bad += ms_of(a) == ms_of(b) ? a > b : due_hi[b] < due_lo[a];
    }
    CHECK(bad == 0);
    tl_end(&TL);
}

/* loop_after(0) from a timer: the next iteration (a flush between). */
static char seq[32];
static int nseq, seq_armed;
static void seq_flush(loop *l, void *ud) {
    (void)l, (void)ud;
    if (seq_armed && nseq < 30) seq[nseq++] = 'F';
}
static void seq_b(loop *l, void *ud) {
    (void)l, (void)ud;
    seq[nseq++] = 'B';
    seq_armed = 0;
}
static void seq_a(loop *l, void *ud) {
    (void)ud;
    seq[nseq++] = 'A';
    loop_after(l, 0, seq_b, NULL);
}
static void seq_start(void *ud) {
    (void)ud;
    nseq = 0;
    seq_armed = 1;
    loop_on_phase(TL.l, LOOP_PHASE_SENDS, seq_flush, NULL);
    seq[nseq++] = 'T';
    loop_after(TL.l, 0, seq_a, NULL);
}
static int seq_done(void *ud) { (void)ud; return !seq_armed; }

static void test_after_zero_is_next_iteration(void) {
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, seq_start, NULL);
    CHECK(tl_wait(&TL, seq_done, NULL, 1000));
    seq[nseq] = '\0';
    CHECK_STR(seq, "TFAFB");
    tl_end(&TL);
}

static int64_t ticks[64];
static int nticks;
static void tick(loop *l, void *ud) {
    (void)l, (void)ud;
    if (nticks < 64) ticks[nticks++] = clock_mono_us();
}
static void set_every(void *ud) {
    int *rc = ud;
    nticks = 0;
    rc[0] = loop_every(TL.l, 10, tick, NULL);
    rc[1] = loop_every(TL.l, 0, tick, NULL);
    rc[2] = loop_every(TL.l, -5, tick, NULL);
}
static void read_ticks(void *ud) { *(int *)ud = nticks; }

static void test_every(void) {
    CHECK(tl_start(&TL) == 0);
    int rc[3];
    int64_t t0 = clock_mono_us();
    tl_call(&TL, set_every, rc);
    CHECK(rc[0] == 0 && rc[1] == -1 && rc[2] == -1);
    clock_sleep_ms(125);
    int n = 0;
    tl_call(&TL, read_ticks, &n);
    CHECK(n >= 2 && n <= 13);                   /* every 10 ms, in about 125 ms */
    if (n < 2 || n > 13) fprintf(stderr, "  %d ticks\n", n);
    CHECK(n > 0 && ticks[0] - t0 >= 9000);      /* the first one period after */
    for (int i = 1; i < n; i++) CHECK(ticks[i] - ticks[i - 1] >= 9000);
    tl_end(&TL);
}

/* ------------------------------------------------------------ phase hooks */

static char flog[64];
static int nflog, pq[2][2];
static void hook(loop *l, void *ud) {
    (void)l;
    if (nflog < 60) flog[nflog++] = *(const char *)ud;
}
static void pipe_ev(loop *l, int fd, unsigned events, void *ud) {
    char c;
    (void)l, (void)events;
    if (read(fd, &c, 1) == 1 && nflog < 60) flog[nflog++] = *(const char *)ud;
}
static void set_hooks(void *ud) {
    (void)ud;
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_ORDERS, hook, "1") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_ORDERS, hook, "2") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_ORDERS, hook, "3") == 0);
    loop_watch(TL.l, pq[0][0], LOOP_READ, pipe_ev, "p");
    loop_watch(TL.l, pq[1][0], LOOP_READ, pipe_ev, "q");
}
static void write_both(void *ud) {
    (void)ud;
    nflog = 0;
    flog[nflog++] = 'T';
    if (write(pq[0][1], "x", 1) < 0 || write(pq[1][1], "x", 1) < 0) flog[nflog++] = '!';
}
static char got_flog[16];
static int flog_full(void *ud) {
    (void)ud;
    if (nflog < 9) return 0;
    memcpy(got_flog, flog, 9);                 /* before this iteration's own hooks */
    return 1;
}

static void test_flush_order(void) {
    CHECK(pipe2(pq[0], O_NONBLOCK) == 0 && pipe2(pq[1], O_NONBLOCK) == 0);
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, set_hooks, NULL);
    tl_call(&TL, write_both, NULL);
    CHECK(tl_wait(&TL, flog_full, NULL, 2000));
    const char *got = got_flog;
    /* The task's iteration, then one with both pipes' events: each ends
     * with every hook once, in the order they were added. */
    CHECK(!strcmp(got, "T123pq123") || !strcmp(got, "T123qp123"));
    if (strcmp(got, "T123pq123") && strcmp(got, "T123qp123")) fprintf(stderr, "  log: %s\n", got);
    tl_end(&TL);
    for (int i = 0; i < 2; i++) close(pq[i][0]), close(pq[i][1]);
}

/* A turn whose hook sleeps 30 ms is told as at least that long; the idle
 * wait after it (the loop blocks in epoll_wait) is not counted. */
static int slow_left;
static void slow_hook(loop *l, void *ud) {
    (void)l, (void)ud;
    if (slow_left > 0 && slow_left--) usleep(30000);
}
static void set_slow(void *ud) {
    (void)ud;
    slow_left = 1;
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_SENDS, slow_hook, NULL) == 0);
}
static void read_turn(void *ud) { *(int64_t *)ud = loop_turn_us(TL.l); }

static void test_turn_length(void) {
    int64_t turn = -1;
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, set_slow, NULL);              /* its own turn: the hook sleeps there */
    tl_call(&TL, read_turn, &turn);            /* read in the next, of the one before */
    CHECK(turn >= 30000);
    usleep(100000);                            /* idle: the loop waits, no turn runs */
    tl_call(&TL, read_turn, &turn);
    CHECK(turn >= 0 && turn < 30000);          /* the last turn: short, the wait not in it */
    tl_end(&TL);
}

/* Work a timer callback gathers goes out in that iteration's phases, not
 * once some later event wakes the loop. */
static int64_t work_at, flushed_at;
static void noop(loop *l, void *ud) { (void)l, (void)ud; }
static void gather(loop *l, void *ud) { (void)l, (void)ud; work_at = clock_mono_us(); }
static void send_out(loop *l, void *ud) {
    (void)l, (void)ud;
    if (work_at && !flushed_at) flushed_at = clock_mono_us();
}
static void set_timer_work(void *ud) {
    (void)ud;
    work_at = flushed_at = 0;
    loop_every(TL.l, 1000, noop, NULL);          /* the loop sleeps up to 1 s */
    loop_on_phase(TL.l, LOOP_PHASE_SENDS, send_out, NULL);
    loop_after(TL.l, 5, gather, NULL);
}
static void read_times(void *ud) { ((int64_t *)ud)[0] = work_at, ((int64_t *)ud)[1] = flushed_at; }

static void test_flush_after_timer(void) {
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, set_timer_work, NULL);
    clock_sleep_ms(300);                        /* nothing wakes the loop meanwhile */
    int64_t t[2];
    tl_call(&TL, read_times, t);                /* (runs before this wake-up's flush) */
    CHECK(t[0] != 0 && t[1] >= t[0]);
    if (!t[1]) fprintf(stderr, "  no flush after the timer's work until woken\n");
    tl_end(&TL);
}

/* loop_again: the next iteration does not wait; without it, it does. From
 * the first phase too (the phases after it still run in that turn). */
static int again_iters, again_left;
static int again_phase;
static int64_t again_at[4];
static void again_hook(loop *l, void *ud) {
    (void)ud;
    again_iters++;
    if (again_left > 0) {
        again_at[3 - again_left] = clock_mono_us();
        if (--again_left > 0) loop_again(l);
    }
}
static void set_again(void *ud) {
    (void)ud;
    loop_every(TL.l, 1000, noop, NULL);
    loop_on_phase(TL.l, again_phase, again_hook, NULL);
}
static void arm_again(void *ud) { (void)ud, again_iters = 0, again_left = 3; }
static void read_again(void *ud) { *(int *)ud = again_iters; }

static void again_in(int phase) {
    again_phase = phase;
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, set_again, NULL);
    clock_sleep_ms(5);
    tl_call(&TL, arm_again, NULL);
    clock_sleep_ms(150);
    int iters = 0;
    tl_call(&TL, read_again, &iters);
    CHECK(iters == 3);                          /* the task's, then two asked for, no more */
    CHECK(again_at[2] - again_at[0] < 500000);  /* not the 1 s the loop would sleep */
    tl_end(&TL);
}

static void test_again(void) {
    again_in(LOOP_PHASE_SENDS);
    again_in(LOOP_PHASE_HTTP);
}

/* loop_forget: the timers and hooks of one owner go, from inside a hook
 * too (the rest keep their order); an owner's one-shot timer never runs. */
static const char K1[] = "1", K2[] = "2", K3[] = "3", K4[] = "4", KC[] = "c";
static char fglog[64];
static int nfg, fg_b_ticks, fg_armed;
static void fg_hook(loop *l, void *ud) {
    char c = *(const char *)ud;
    if (!fg_armed || nfg >= 60) return;
    fglog[nfg++] = c;
    if (c == '1' && fg_armed == 1) loop_forget(l, (void *)K2), fg_armed = 2;
}
static void fg_tick(loop *l, void *ud) { (void)l, (void)ud, fg_b_ticks++; }
static void fg_fire(loop *l, void *ud) {
    (void)l;
    if (nfg < 60) fglog[nfg++] = *(const char *)ud;
}
static void fg_set(void *ud) {
    (void)ud;
    loop_on_phase(TL.l, LOOP_PHASE_HTTP, fg_hook, (void *)K1);
    loop_on_phase(TL.l, LOOP_PHASE_ORDERS, fg_hook, (void *)K2);
    loop_on_phase(TL.l, LOOP_PHASE_ORDERS, fg_hook, (void *)K3);
    loop_every(TL.l, 1, fg_tick, (void *)K2);
    loop_after(TL.l, 20, fg_fire, (void *)K2);
    loop_after(TL.l, 20, fg_fire, (void *)KC);
}
static void fg_arm(void *ud) { (void)ud, nfg = 0, fg_b_ticks = 0, fg_armed = 1; }
static void fg_add(void *ud) {
    (void)ud;
    loop_on_phase(TL.l, LOOP_PHASE_SENDS, fg_hook, (void *)K4);
    nfg = 0;
}
static void fg_read(void *ud) { memcpy(ud, fglog, (size_t)nfg), ((char *)ud)[nfg] = '\0'; }

static void test_forget(void) {
    char got[64];
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, fg_set, NULL);
    tl_call(&TL, fg_arm, NULL);
    clock_sleep_ms(60);
    tl_call(&TL, fg_read, got);
    CHECK(!strncmp(got, "13", 2));                /* "2" forgotten by "1", in that walk */
    CHECK(strchr(got, '2') == NULL && strchr(got, 'c') != NULL);
    CHECK(fg_b_ticks <= 1);                       /* its timer stopped with it */
    tl_call(&TL, fg_add, NULL);
    clock_sleep_ms(5);
    tl_call(&TL, fg_read, got);
    CHECK(!strncmp(got, "134", 3));               /* the rest, in order, and the new one */
    tl_end(&TL);
}

/* The phases run in rank order whatever the order of registration
 * (a hook registered later in an earlier phase runs first), and in
 * registration order within one phase. A hook added from a running phase
 * runs in this turn when its phase is the running one or a later one, and
 * from the next turn when its phase is already past. */
static char plog[128];
static int nplog, p_armed, p_added;
static void p_hook(loop *l, void *ud) {
    (void)l;
    if (p_armed && nplog < 120) plog[nplog++] = *(const char *)ud;
}
static void p_adder(loop *l, void *ud) {
    (void)ud;
    if (!p_armed || p_added) return;
    p_added = 1;                                /* once */
    plog[nplog++] = '+';
    loop_on_phase(l, LOOP_PHASE_HTTP, p_hook, "e");       /* past: next turn */
    loop_on_phase(l, LOOP_PHASE_CLEARS, p_hook, "n");     /* running: this turn */
    loop_on_phase(l, LOOP_PHASE_SENDS, p_hook, "l");      /* later: this turn */
    loop_on_phase(l, 500, p_hook, "m");                   /* a new rank, later: this turn */
    loop_on_phase(l, 50, p_hook, "f");                    /* a new rank, past: next turn */
}
static void p_set(void *ud) {
    (void)ud;
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_SENDS, p_hook, "S") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_CLEARS, p_hook, "C") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_ORDERS, p_hook, "O") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_HTTP, p_hook, "H") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_SENDS, p_hook, "s") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_HTTP, p_hook, "h") == 0);
    CHECK(loop_on_phase(TL.l, LOOP_PHASE_ORDERS, p_hook, "o") == 0);
}
static void p_arm(void *ud) {
    (void)ud;
    nplog = 0;
    p_armed = 1;
    plog[nplog++] = '|';                         /* this task's turn starts the log */
}
static void p_add(void *ud) {
    (void)ud;
    loop_on_phase(TL.l, LOOP_PHASE_CLEARS, p_adder, NULL);
    nplog = 0;
    p_armed = 1;
}
static void p_read(void *ud) {
    memcpy(ud, plog, (size_t)nplog);
    ((char *)ud)[nplog] = '\0';
    p_armed = 0;
}

static void test_phase_order(void) {
    char got[128];
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, p_set, NULL);
    tl_call(&TL, p_arm, NULL);
    tl_call(&TL, p_read, got);                  /* the next turn's task reads */
    CHECK_STR(got, "|HhOoCSs");
    /* An adder in CLEARS, after C: n (CLEARS) and l (SENDS) run in this
     * turn, e (HTTP) from the next. */
    tl_call(&TL, p_add, NULL);
    tl_call(&TL, p_read, got);
    CHECK_STR(got, "HhOoC+nmSsl");
    tl_call(&TL, p_arm, NULL);
    tl_call(&TL, p_read, got);
    CHECK_STR(got, "|fHheOoCnmSsl");
    tl_end(&TL);
}

/* Refused: no function, a phase that does not exist, a phase full (the
 * others still take hooks). */
static void phase_refusals(void *ud) {
    int *ok = ud;
    *ok = 1;
    errno = 0;
    *ok &= loop_on_phase(TL.l, LOOP_PHASE_HTTP, NULL, NULL) == -1 && errno == EINVAL;
    errno = 0;
    *ok &= loop_on_phase(TL.l, LOOP_RANK_MAX + 1, noop, NULL) == -1 && errno == EINVAL;
    errno = 0;
    *ok &= loop_on_phase(TL.l, -1, noop, NULL) == -1 && errno == EINVAL;
    int n = 0;
    while (n < 100 && loop_on_phase(TL.l, LOOP_PHASE_CLEARS, noop, NULL) == 0) n++;
    *ok &= n > 0 && n < 100 && errno == ENOSPC;
    *ok &= loop_on_phase(TL.l, LOOP_PHASE_SENDS, noop, NULL) == 0;
    int ranks = 0;                              /* new ranks, until the loop holds no more */
    while (ranks < 100 && loop_on_phase(TL.l, 1 + ranks, noop, NULL) == 0) ranks++;
    *ok &= ranks > 0 && ranks < 100 && errno == ENOSPC;
    *ok &= loop_on_phase(TL.l, LOOP_PHASE_SENDS, noop, NULL) == 0;     /* an old rank: yes */
    loop_forget(TL.l, NULL);                    /* every noop above: room again next turn */
}
static void phase_room(void *ud) {
    *(int *)ud = loop_on_phase(TL.l, LOOP_PHASE_CLEARS, noop, NULL) |
                 loop_on_phase(TL.l, 777, noop, NULL);          /* a rank's room is back */
}

static void test_phase_refusals(void) {
    int ok = 0, rc = -1;
    CHECK(tl_start(&TL) == 0);
    tl_call(&TL, phase_refusals, &ok);
    CHECK(ok);
    tl_call(&TL, phase_room, &rc);
    CHECK(rc == 0);
    tl_end(&TL);
}

/* ------------------------------------------------------------------ tasks */

#define NTHREADS 8
#define PER_THREAD 4000
static unsigned char ran[NTHREADS * PER_THREAD];
static loop_task tasks[NTHREADS * PER_THREAD];
static int total_ran, wrong_thread, reposts, freed;
static pthread_t loop_thread;
static pthread_barrier_t go;

static void task_fn(loop *l, void *ud) {
    size_t i = (size_t)(uintptr_t)ud;
    if (loop_current() != l || !pthread_equal(pthread_self(), loop_thread)) wrong_thread++;
    ran[i]++;
    total_ran++;
}
static void *poster(void *arg) {
    int t = (int)(intptr_t)arg;
    pthread_barrier_wait(&go);
    for (int k = 0; k < PER_THREAD; k++) {
        size_t i = (size_t)t * PER_THREAD + (size_t)k;
        tasks[i] = (loop_task){ task_fn, (void *)(uintptr_t)i, NULL };
        loop_post(TL.l, &tasks[i]);
    }
    return NULL;
}
static int all_ran(void *ud) { (void)ud; return total_ran >= NTHREADS * PER_THREAD; }
static void repost(loop *l, void *ud) {
    loop_task *t = ud;
    if (++reposts < 100) loop_post(l, t);       /* fn may reuse its task */
}
static void self_free(loop *l, void *ud) {
    (void)l;
    free(ud);                                   /* ... or free it */
    freed++;
}
static int reposts_done(void *ud) { (void)ud; return reposts >= 100 && freed; }

static void test_post_from_threads(void) {
    CHECK(tl_start(&TL) == 0);
    loop_thread = TL.th;
    pthread_t th[NTHREADS];
    pthread_barrier_init(&go, NULL, NTHREADS);
    for (int t = 0; t < NTHREADS; t++) pthread_create(&th[t], NULL, poster, (void *)(intptr_t)t);
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&go);
    CHECK(tl_wait(&TL, all_ran, NULL, 5000));
    int once = 1;
    for (size_t i = 0; i < sizeof ran; i++) once &= ran[i] == 1;
    CHECK(once);
    CHECK(total_ran == NTHREADS * PER_THREAD);
    CHECK(wrong_thread == 0);
    CHECK(loop_current() == NULL);              /* not on this thread */
    static loop_task again;
    again = (loop_task){ repost, &again, NULL };
    loop_post(TL.l, &again);
    loop_task *heap = malloc(sizeof *heap);
    *heap = (loop_task){ self_free, heap, NULL };
    loop_post(TL.l, heap);
    CHECK(tl_wait(&TL, reposts_done, NULL, 2000));
    CHECK(reposts == 100 && freed == 1);
    tl_end(&TL);
}

static atomic_int after_run_current = -1;
static void *run_and_look(void *l) {
    loop_run(l);
    atomic_store(&after_run_current, loop_current() == NULL);
    return NULL;
}
static void *stopper(void *l) {
    loop_stop(l);
    return NULL;
}

static void test_stop_from_another_thread(void) {
    char err[128];
    loop *l = loop_new(err, sizeof err);
    CHECK(l != NULL);
    if (!l) return;
    pthread_t th, st;
    pthread_create(&th, NULL, run_and_look, l);
    clock_sleep_ms(20);                          /* in epoll_wait, no timer: forever */
    int64_t t0 = clock_mono_us();
    pthread_create(&st, NULL, stopper, l);
    pthread_join(st, NULL);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    int joined = pthread_timedjoin_np(th, NULL, &until) == 0;
    CHECK(joined);
    if (!joined) return;                         /* leave it: it is stuck */
    CHECK(clock_mono_us() - t0 < 1000000);
    CHECK(atomic_load(&after_run_current) == 1);
    loop_free(l);
}

static int free_ran[3];
static void count_free(loop *l, void *ud) {
    (void)l;
    free_ran[(intptr_t)ud]++;
}

static void test_free_runs_pending_and_data(void) {
    char err[128];
    int x, y;
    loop *l = loop_new(err, sizeof err);
    CHECK(l != NULL);
    if (!l) return;
    CHECK(loop_data(l) == NULL);
    loop_set_data(l, &x);
    CHECK(loop_data(l) == &x);
    loop_set_data(l, &y);
    CHECK(loop_data(l) == &y);
    loop_task t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = (loop_task){ count_free, (void *)(intptr_t)i, NULL };
        loop_post(l, &t[i]);                     /* never run: the loop never ran */
    }
    CHECK(free_ran[0] == 0);
    loop_free(l);
    CHECK(free_ran[0] == 1 && free_ran[1] == 1 && free_ran[2] == 1);
    /* Posted after the loop stopped, before it is freed: run by loop_free. */
    CHECK(tl_start(&TL) == 0);
    tl_stop(&TL);
    t[0] = (loop_task){ count_free, (void *)(intptr_t)0, NULL };
    loop_post(TL.l, &t[0]);
    CHECK(free_ran[0] == 1);
    tl_end(&TL);
    CHECK(free_ran[0] == 2 && free_ran[1] == 1);
}

TEST_MAIN(T(test_watch_pipe), T(test_watch_eventfd_and_errors), T(test_unwatch_during_dispatch),
          T(test_after), T(test_after_zero_is_next_iteration), T(test_every), T(test_flush_order), T(test_turn_length),
          T(test_flush_after_timer), T(test_phase_order), T(test_phase_refusals), T(test_again), T(test_forget), T(test_post_from_threads),
          T(test_stop_from_another_thread), T(test_free_runs_pending_and_data))
