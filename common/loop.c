/* loop.c: the epoll event loop (see loop.h).
 *
 * Watched descriptors live in a table indexed by fd (descriptors are small
 * integers), so dispatching an event is an index, not a search. Timers and
 * phase hooks are few and fixed, in small arrays. A phase is a rank and its
 * hooks; the phases stay where they were made (a hook may add one while
 * the phases run), and `order` lists them by rank. The posted-task queue is
 * a mutex-guarded list plus an eventfd; `notified` makes posters write the
 * eventfd only once until the loop has drained the queue. */
#include "common/loop.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"

#define MAX_TIMERS 16
#define MAX_PHASES 8          /* distinct ranks on one loop */
#define MAX_PHASE_HOOKS 8     /* per phase: the Redis writes' holds one per connection */
#define MAX_EVENTS 256

typedef struct watch {
    loop_io_fn *fn;
    void *ud;
    unsigned events;
    int active;
} watch;

typedef struct timer {
    int64_t period_ms, next_ms;
    loop_fn *fn;
    void *ud;
} timer;

/* A one-shot timer (loop_after), kept in a binary min-heap by due time. */
typedef struct oneshot {
    int64_t due_us;
    uint64_t seq;                     /* FIFO among equal due times */
    loop_fn *fn;
    void *ud;
} oneshot;

typedef struct hook {
    loop_fn *fn;
    void *ud;
} hook;

/* The hooks of one rank, in registration order (fn NULL: forgotten). */
typedef struct phase {
    int rank;
    int nhooks;
    hook hooks[MAX_PHASE_HOOKS];
} phase;

struct loop {
    int epfd, evfd;
    watch *watches;
    int nwatches;                     /* size of the table */
    timer timers[MAX_TIMERS];
    int ntimers;
    phase phases[MAX_PHASES];         /* in the order they were made */
    int order[MAX_PHASES];            /* indexes into phases, by rank */
    int nphases;
    pthread_mutex_t mu;               /* guards head, tail */
    loop_task *head, *tail;
    atomic_int notified;              /* the eventfd was written since the last drain */
    atomic_int stopping;
    int again;                        /* next epoll_wait does not block */
    int forgot;                       /* loop_forget left holes in timers / phases */
    oneshot *heap;                    /* one-shot timers */
    size_t nheap, capheap;
    uint64_t seq;
    void *data;
    atomic_int running;               /* loop_run is between its first and last turn */
    int64_t turn_us;                  /* the last whole turn's length (loop_turn_us) */
};

static __thread loop *current;

loop *loop_current(void) { return current; }
int64_t loop_turn_us(const loop *l) { return l->turn_us; }
int loop_owned(const loop *l) { return current == l || !atomic_load(&l->running); }

void loop_set_data(loop *l, void *data) {
    assert(loop_owned(l));
    l->data = data;
}
void *loop_data(const loop *l) { return l->data; }

static void drain(loop *l, int fd, unsigned events, void *ud);

loop *loop_new(char *err, size_t errlen) {
    loop *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&l->mu, NULL);
    if (l->epfd < 0 || l->evfd < 0 || loop_watch(l, l->evfd, LOOP_READ, drain, NULL) != 0) {
        snprintf(err, errlen, "event loop: %s", strerror(errno));
        loop_free(l);
        return NULL;
    }
    return l;
}

/* Runs every posted task; more may be posted meanwhile (they run next). */
static void run_tasks(loop *l) {
    pthread_mutex_lock(&l->mu);
    loop_task *t = l->head;
    l->head = l->tail = NULL;
    pthread_mutex_unlock(&l->mu);
    while (t) {
        loop_task *next = t->next;   /* fn may reuse or free t */
        t->fn(l, t->ud);
        t = next;
    }
}

void loop_free(loop *l) {
    if (!l) return;
    run_tasks(l);
    free(l->heap);
    if (l->epfd >= 0) close(l->epfd);
    if (l->evfd >= 0) close(l->evfd);
    pthread_mutex_destroy(&l->mu);
    free(l->watches);
    free(l);
}

static int grow(loop *l, int fd) {
    if (fd < l->nwatches) return 0;
    int n = l->nwatches ? l->nwatches : 64;
    while (n <= fd) n *= 2;
    watch *w = realloc(l->watches, (size_t)n * sizeof *w);
    if (!w) return -1;
    memset(w + l->nwatches, 0, (size_t)(n - l->nwatches) * sizeof *w);
    l->watches = w;
    l->nwatches = n;
    return 0;
}

int loop_watch(loop *l, int fd, unsigned events, loop_io_fn *fn, void *ud) {
    assert(loop_owned(l));
    if (fd < 0 || grow(l, fd) != 0) {
        errno = fd < 0 ? EBADF : ENOMEM;
        return -1;
    }
    watch *w = &l->watches[fd];
    struct epoll_event ev = { .events = ((events & LOOP_READ) ? EPOLLIN : 0) |
                                        ((events & LOOP_WRITE) ? EPOLLOUT : 0),
                              .data.fd = fd };
    if (w->active && w->events == events) {
        w->fn = fn;
        w->ud = ud;
        return 0;
    }
    /* A quiet watch (events 0) is kept out of epoll, which reports a
     * hang-up or an error whatever events were asked for (and, level
     * triggered, again every iteration: a closed peer would spin the loop
     * calling a callback that asked for nothing). */
    int in_epoll = w->active && w->events != 0;
    if (events) {
        if (epoll_ctl(l->epfd, in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) return -1;
    } else if (in_epoll) {
        if (epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL) != 0) return -1;
    } else if (!w->active) {
        /* Refused as epoll would refuse it (a bad descriptor, a file). */
        if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return -1;
        epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    }
    *w = (watch){ fn, ud, events, 1 };
    return 0;
}

void loop_unwatch(loop *l, int fd) {
    assert(loop_owned(l));
    if (fd < 0 || fd >= l->nwatches || !l->watches[fd].active) return;
    if (l->watches[fd].events) epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    l->watches[fd].active = 0;
}

int loop_every(loop *l, int64_t period_ms, loop_fn *fn, void *ud) {
    assert(loop_owned(l));
    assert(l->ntimers >= 0 && l->ntimers <= MAX_TIMERS);
    if (l->ntimers == MAX_TIMERS || period_ms <= 0) return -1;
    l->timers[l->ntimers++] = (timer){ period_ms, clock_mono_ms() + period_ms, fn, ud };
    return 0;
}

void loop_again(loop *l) {
    assert(loop_owned(l));
    l->again = 1;
}

static int before(const oneshot *a, const oneshot *b) {
    return a->due_us < b->due_us || (a->due_us == b->due_us && a->seq < b->seq);
}

int loop_after(loop *l, int64_t ms, loop_fn *fn, void *ud) {
    assert(loop_owned(l));
    if (l->nheap == l->capheap) {
        size_t cap = l->capheap ? l->capheap * 2 : 64;
        oneshot *h = realloc(l->heap, cap * sizeof *h);
        if (!h) return -1;
        l->heap = h;
        l->capheap = cap;
    }
    size_t i = l->nheap++;
    oneshot t = { clock_mono_us() + ms * 1000, l->seq++, fn, ud };
    while (i > 0 && before(&t, &l->heap[(i - 1) / 2])) {     /* sift up */
        l->heap[i] = l->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    l->heap[i] = t;
    return 0;
}

static oneshot pop_oneshot(loop *l) {
    assert(l->nheap > 0 && l->nheap <= l->capheap);
    oneshot top = l->heap[0], last = l->heap[--l->nheap];
    size_t i = 0;
    for (;;) {                                                 /* sift down */
        size_t c = 2 * i + 1;
        if (c >= l->nheap) break;
        if (c + 1 < l->nheap && before(&l->heap[c + 1], &l->heap[c])) c++;
        if (!before(&l->heap[c], &last)) break;
        l->heap[i] = l->heap[c];
        i = c;
    }
    if (l->nheap) l->heap[i] = last;
    return top;
}

/* Asserts what the phase table keeps true: ranks in range, each made
 * once, `order` sorted by rank, no phase over its room. */
static void phases_check(const loop *l) {
    assert(l->nphases >= 0 && l->nphases <= MAX_PHASES);
    for (int k = 0; k < l->nphases; k++) {
        const phase *ph = &l->phases[l->order[k]];
        assert(l->order[k] >= 0 && l->order[k] < l->nphases);
        assert(ph->rank >= 0 && ph->rank <= LOOP_RANK_MAX);
        assert(ph->nhooks >= 0 && ph->nhooks <= MAX_PHASE_HOOKS);
        assert(k == 0 || l->phases[l->order[k - 1]].rank < ph->rank);
        (void)ph;
    }
}

/* The phase of rank `rank`, made (and put in order) if there is none yet;
 * NULL when the loop holds as many phases as it can. */
static phase *phase_of(loop *l, int rank) {
    int k = 0;
    while (k < l->nphases && l->phases[l->order[k]].rank < rank) k++;
    if (k < l->nphases && l->phases[l->order[k]].rank == rank) return &l->phases[l->order[k]];
    if (l->nphases == MAX_PHASES) return NULL;
    memmove(&l->order[k + 1], &l->order[k], (size_t)(l->nphases - k) * sizeof l->order[0]);
    l->order[k] = l->nphases;
    l->phases[l->nphases] = (phase){ .rank = rank };
    return &l->phases[l->nphases++];
}

int loop_on_phase(loop *l, int rank, loop_fn *fn, void *ud) {
    assert(loop_owned(l));
    if (!fn || rank < 0 || rank > LOOP_RANK_MAX) {
        errno = EINVAL;
        return -1;
    }
    phase *ph = phase_of(l, rank);
    if (!ph || ph->nhooks == MAX_PHASE_HOOKS) {
        errno = ENOSPC;
        return -1;
    }
    ph->hooks[ph->nhooks++] = (hook){ fn, ud };
    phases_check(l);
    return 0;
}

/* Entries are only marked here (fn NULL): loop_forget may be called while
 * run_timers or run_phases walk these arrays. They are closed up at the
 * top of the next iteration (compact). */
void loop_forget(loop *l, void *ud) {
    assert(loop_owned(l));
    for (int i = 0; i < l->ntimers; i++)
        if (l->timers[i].ud == ud) l->timers[i].fn = NULL, l->forgot = 1;
    for (int p = 0; p < l->nphases; p++)
        for (int i = 0; i < l->phases[p].nhooks; i++)
            if (l->phases[p].hooks[i].ud == ud) l->phases[p].hooks[i].fn = NULL, l->forgot = 1;
    for (size_t i = 0; i < l->nheap; i++)
        if (l->heap[i].ud == ud) l->heap[i].fn = NULL;      /* popped unrun when due */
}

/* Closes up what loop_forget marked, between turns (no phase runs): the
 * hooks left keep their order, and a phase left without hooks is undone,
 * so that its room serves another rank. */
static void compact(loop *l) {
    int n = 0;
    assert(l->ntimers <= MAX_TIMERS);
    for (int i = 0; i < l->ntimers; i++)
        if (l->timers[i].fn) l->timers[n++] = l->timers[i];
    l->ntimers = n;
    int renum[MAX_PHASES];                    /* a phase's new index (-1: undone) */
    int kept[MAX_PHASES], nkept = 0;          /* the new `order` */
    for (int p = 0; p < l->nphases; p++) {
        phase *ph = &l->phases[p];
        n = 0;
        for (int i = 0; i < ph->nhooks; i++)
            if (ph->hooks[i].fn) ph->hooks[n++] = ph->hooks[i];
        ph->nhooks = n;
    }
    int np = 0;
    for (int p = 0; p < l->nphases; p++) {
        renum[p] = l->phases[p].nhooks ? np : -1;
        if (l->phases[p].nhooks) l->phases[np++] = l->phases[p];
    }
    for (int k = 0; k < l->nphases; k++)
        if (renum[l->order[k]] >= 0) kept[nkept++] = renum[l->order[k]];
    assert(nkept == np);
    memcpy(l->order, kept, (size_t)nkept * sizeof kept[0]);
    l->nphases = np;
    l->forgot = 0;
    phases_check(l);
}

void loop_post(loop *l, loop_task *t) {
    assert(t && t->fn);
    t->next = NULL;
    pthread_mutex_lock(&l->mu);
    if (l->tail) l->tail->next = t;
    else l->head = t;
    l->tail = t;
    pthread_mutex_unlock(&l->mu);
    if (atomic_exchange(&l->notified, 1) == 0) {
        uint64_t one = 1;
        if (write(l->evfd, &one, sizeof one) < 0) {}   /* EAGAIN: already readable */
    }
}

static void drain(loop *l, int fd, unsigned events, void *ud) {
    uint64_t n;
    (void)events;
    (void)ud;
    if (read(fd, &n, sizeof n) < 0) {}
    /* Cleared before the tasks are taken: a post after this point writes
     * the eventfd again, so none is left waiting unseen. */
    atomic_store(&l->notified, 0);
    run_tasks(l);
}

void loop_stop(loop *l) {
    atomic_store(&l->stopping, 1);
    uint64_t one = 1;                          /* wakes epoll_wait */
    if (write(l->evfd, &one, sizeof one) < 0) {}
}

/* Step 1 of a turn: runs due timers; returns the milliseconds until the
 * next one (-1: none). When one ran, the turn's epoll_wait does not block
 * (loop_again): what a timer gathered (a command sent, a lock retried)
 * goes out in this turn's phases, not once some later event or timer wakes
 * the loop. */
static int run_timers(loop *l) {
    int64_t now_us = clock_mono_us();
    /* One-shot timers due now (those they add run next time round). */
    size_t due = 0;
    for (size_t i = 0; i < l->nheap; i++) due += l->heap[i].due_us <= now_us;
    while (due-- > 0 && l->nheap && l->heap[0].due_us <= now_us) {
        oneshot t = pop_oneshot(l);
        if (!t.fn) continue;                                   /* forgotten */
        t.fn(l, t.ud);
        l->again = 1;
    }
    int64_t now = clock_mono_ms(), wait = -1;
    for (int i = 0; i < l->ntimers; i++) {
        timer *t = &l->timers[i];
        if (!t->fn) continue;                                  /* forgotten */
        if (now >= t->next_ms) {
            t->fn(l, t->ud);
            l->again = 1;
            now = clock_mono_ms();
            t->next_ms = now + t->period_ms;
        }
        int64_t left = t->next_ms - now;
        if (wait < 0 || left < wait) wait = left;
    }
    if (l->nheap) {
        int64_t left = (l->heap[0].due_us - clock_mono_us() + 999) / 1000;
        if (left < 0) left = 0;
        if (wait < 0 || left < wait) wait = left;
    }
    return (int)wait;
}

/* Steps 2 and 3: waits up to wait_ms (-1: no limit) for events, then
 * calls each ready descriptor's callback (the eventfd's runs the posted
 * tasks). Returns when the wait ended (clock_mono_us): the turn starts
 * there (loop_turn_us). */
static int64_t run_events(loop *l, struct epoll_event *evs, int wait_ms) {
    int n = epoll_wait(l->epfd, evs, MAX_EVENTS, wait_ms);
    int64_t woke = clock_mono_us();
    assert(n <= MAX_EVENTS);
    for (int i = 0; i < n; i++) {
        int fd = evs[i].data.fd;
        if (fd >= l->nwatches || !l->watches[fd].active || !l->watches[fd].events)
            continue;                          /* unwatched or made quiet meanwhile */
        /* A hang-up or error is reported as both, so whichever side the
         * owner waits on finds out. */
        unsigned e = evs[i].events;
        unsigned ev = ((e & (EPOLLIN | EPOLLHUP | EPOLLERR)) ? LOOP_READ : 0) |
                      ((e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) ? LOOP_WRITE : 0);
        l->watches[fd].fn(l, fd, ev, l->watches[fd].ud);
    }
    return woke;
}

/* The first phase of a rank above `above` (-1: the lowest), or NULL. */
static const phase *phase_after(const loop *l, int above) {
    for (int k = 0; k < l->nphases; k++)
        if (l->phases[l->order[k]].rank > above) return &l->phases[l->order[k]];
    return NULL;
}

/* Step 4: the phases, by rank, each one's hooks in the order they were
 * registered. The next phase is looked up by rank after each one and a
 * phase's count is read at every step (a phase never moves once made), so
 * a hook added to the running phase or a later one -- a new rank among
 * them -- runs in this turn; one forgotten meanwhile (fn NULL) is
 * skipped. */
static void run_phases(loop *l) {
    int done = -1;
    for (const phase *ph; (ph = phase_after(l, done)) != NULL; done = ph->rank) {
        assert(ph->rank > done);
        for (int i = 0; i < ph->nhooks; i++)
            if (ph->hooks[i].fn) ph->hooks[i].fn(l, ph->hooks[i].ud);
    }
}

void loop_run(loop *l) {
    struct epoll_event evs[MAX_EVENTS];
    /* One thread runs a loop, and a thread runs one loop (loop_current). */
    assert(current == NULL && !atomic_load(&l->running));
    current = l;
    atomic_store(&l->running, 1);
    while (!atomic_load(&l->stopping)) {
        if (l->forgot) compact(l);
        int wait = run_timers(l);                  /* 1. timers */
        if (l->again) wait = 0;
        l->again = 0;
        int64_t woke = run_events(l, evs, wait);   /* 2. wait, 3. events (and tasks) */
        run_phases(l);                             /* 4. phases */
        l->turn_us = clock_mono_us() - woke;
    }
    atomic_store(&l->running, 0);
    current = NULL;
}
