/* fam_lock.c: the lock family: `lock` orders on the event loops.
 *
 * Each lock (a segment of a product) belongs to one loop, its owner: all
 * orders for that segment go there (through its inbox when submitted
 * elsewhere), into a FIFO, the segment's queue. The head of the FIFO is
 * the one order in the critical section: its lock_read takes the lock and
 * reads; the check runs in C; its lock_write writes (fenced) and releases;
 * and the next order's lock_read goes out right behind that write, on the
 * same connection. Waiting is a queue position and, when another process
 * holds the lock, a timer: no thread waits for a lock.
 *
 *   one order's hold:  lock_read ... check ... lock_write      (2 round trips)
 *   the next order's:                          lock_read ...   (same write)
 *
 * Contention from elsewhere (another instance, or this instance's blocking
 * family, which takes the same locks) shows as "held by another": the head
 * retries after the holder's lease or a short backoff, whichever is first,
 * until its lock wait runs out (429 lock_timeout).
 *
 * A pause in the critical section (fault injection: cs_delay_ms) holds the
 * head there without renewing its lease, as a paused process would; when
 * the lease runs out, the next order may take the lock, and the paused
 * order's write is then refused by the fence (429, nothing taken). A
 * product that forces an interleaving instead (cs_overlap) goes to the
 * blocking family, whose critical section waits for the other holders.
 *
 * An order no one segment can hold (all look empty, or its segment is
 * short, of a product with several segments) is rerouted to the blocking
 * family, which reads every segment and locks the ones it needs (same
 * keys, same locks). Everything here runs on the owner loop's thread.
 *
 * `fair-lock` runs here too, with the lock module's fair line beside each
 * lock (lock/lock.h, FAIRNESS; stock/lockasync.c): an order takes its
 * place in the line with its queue's next call (carried by a lock_read or
 * lock_pass, or one join per queue and turn while the queue waits on
 * another holder or a pause; enqueue), so that it is ahead of every order
 * that came after it, to any instance; the head's lock_read takes the lock
 * only as the head of that line; a holder's write goes with the next
 * order's take (lock_pass), which the lock passes to straight away when it
 * heads the line; the loop keeps its waiting orders' places alive; an
 * order that gives up without the lock leaves it. Within an instance the
 * FIFO already is the arrival order.
 *
 *   fair-lock:  lock_read ... check ... lock_pass: write, hand on, read ...
 *                                                  check ... lock_pass ... */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "service/order/commit.h"
#include "service/order/fam_lock.h"
#include "service/order/orderloop.h"
#include "service/order/pipeline.h"
#include "service/order/reservation.h"

#define RETRY_MIN_MS 1
#define RETRY_MAX_MS 20

typedef enum lq_state { LQ_IDLE, LQ_TAKING, LQ_WAITING, LQ_HOLDING } lq_state;

/* One segment's queue, on its owner loop. */
typedef struct lock_q {
    svc_order_loop *ol;
    svc_product *p;
    int seg;
    svc_order *head, *tail;         /* waiting for the lock, in arrival order */
    svc_order *unplaced;            /* fair-lock: the first of those not yet in the line
                                       (they came while the queue was idle; advance
                                       places them behind the head it starts) */
    svc_order *holder;              /* taking or holding it */
    lq_state state;
    int64_t lease_until_us;        /* LQ_HOLDING: when the holder's lease runs out */
    int64_t released_us;           /* an order released the lock with others queued */
    int ops;                       /* orders here not yet settled (shutdown waits) */
    struct lock_q *next_ready;
    int ready;
    int keep_armed;                /* fair-lock: a keep of its orders' places is due */
    int placing;                   /* fair-lock: in its loop's list of queues to place */
    struct lock_q *next_placing;
} lock_q;

/* The family's state on one loop: the queues it owns, by (product,
 * segment), and those with an order to start this turn. */
typedef struct lock_loop {
    lock_q **qs;
    size_t nqs, used;
    lock_q *ready;
    lock_q *placing;               /* fair-lock: queues with orders to place this turn */
} lock_loop;

/* What this family keeps with an order it holds (order_int.h's fam_data). */
typedef struct lock_data {
    stock_hold hold;               /* the segment, and what its read found */
    int64_t t0_us;                 /* when it started waiting for the lock */
    lock_q *q;                     /* its segment's queue */
    int placed;                    /* fair-lock: has a place in the line (to leave) */
} lock_data;
SVC_FAM_DATA_FITS(lock_data);
#define LOCK(op) (*SVC_FAM_DATA(op, lock_data))

static lock_loop *locks_of(const svc_order_loop *ol) {
    assert(svc_order_loop_owned(ol));
    return svc_order_loop_state(ol, &svc_family_lock);
}

/* --------------------------------------------------------------- helpers */

static int ttl_of(const svc_order *op) {
    const stock_product *sp = &op->p->sp;
    return sp->lock_ttl_ms > 0 ? sp->lock_ttl_ms : op->a->cfg.lock_ttl_ms;
}

static void count_lock(svc_order *op, int outcome) {
    svc_histogram_observe(&op->a->m.lock_acquire, clock_mono_us() - LOCK(op).t0_us);
    atomic_fetch_add(&op->a->m.lock_outcomes[outcome], 1);
}

/* Marks q to go on with its next order at the end of this turn (not at
 * once: a failure reported synchronously must not recurse). */
static void ready(lock_q *q) {
    if (q->ready) return;
    lock_loop *ll = locks_of(q->ol);
    q->ready = 1;
    q->next_ready = ll->ready;
    ll->ready = q;
}

/* The holder's release goes out: with orders queued behind it, the next
 * one's acquire completes a hand-off (flashsale_lock_handoff_seconds). */
static void releasing(lock_q *q) {
    q->released_us = q->head ? clock_mono_us() : 0;
}

static void handed_off(lock_q *q, svc_order *op) {
    if (!q->released_us || LOCK(op).t0_us > q->released_us) return;
    svc_histogram_observe(&op->a->m.lock_handoff[op->p->sp.strategy],
                          clock_mono_us() - q->released_us);
    q->released_us = 0;
}

static void next_holder(lock_q *q) {
    q->holder = NULL;
    q->state = LQ_IDLE;
    if (q->head) ready(q);
}

#define KEEP_CHUNK 256

static void arm_keep(lock_q *q);

/* Every third of a place's lease while orders of q wait in line: their
 * places kept alive (the head's own lock_read keeps its place). */
static void keep_tick(loop *l, void *ud) {
    lock_q *q = ud;
    const stock_hold *holds[KEEP_CHUNK];
    int n = 0, any = 0;
    (void)l;
    q->keep_armed = 0;
    for (svc_order *op = q->head; op; op = op->next) {
        if (!LOCK(op).placed) continue;
        any = 1;
        holds[n++] = &LOCK(op).hold;
        if (n == KEEP_CHUNK) {
            stock_async_lock_keep(svc_order_loop_stock(q->ol), &q->p->sp, q->seg, holds, n);
            n = 0;
        }
    }
    if (n) stock_async_lock_keep(svc_order_loop_stock(q->ol), &q->p->sp, q->seg, holds, n);
    if (any) arm_keep(q);
}

static void arm_keep(lock_q *q) {
    if (q->keep_armed) return;
    if (loop_after(svc_order_loop_loop(q->ol), STOCK_FAIR_LEASE_MS / 3, keep_tick, q) == 0)
        q->keep_armed = 1;
}

/* The queue's unplaced orders, in order, into the line (after the head's
 * lock_read, which went out first), in calls of up to KEEP_CHUNK. */
static void place_the_rest(lock_q *q) {
    stock_hold *holds[KEEP_CHUNK];
    int n = 0;
    for (svc_order *op = q->unplaced; op; op = op->next) {
        holds[n++] = &LOCK(op).hold;
        LOCK(op).placed = 1;
        if (n == KEEP_CHUNK) {
            stock_async_lock_join(svc_order_loop_stock(q->ol), &q->p->sp, q->seg, holds, n);
            n = 0;
        }
    }
    if (n) stock_async_lock_join(svc_order_loop_stock(q->ol), &q->p->sp, q->seg, holds, n);
    if (q->unplaced) arm_keep(q);
    q->unplaced = NULL;
}

/* A fair-lock order that gives up without the lock leaves its line. */
static void leave_line(lock_q *q, svc_order *op) {
    if (!LOCK(op).placed) return;
    LOCK(op).placed = 0;
    stock_async_lock_leave(svc_order_loop_stock(q->ol), &op->sreq, &LOCK(op).hold);
}

/* The op leaves the queue: answered (a refusal), or, reserved or a replay
 * to look up, handed to the committer. */
static void settle(svc_order *op) {
    lock_q *q = LOCK(op).q;
    q->ops--;
    LOCK(op).q = NULL;
    if (svc_reservation_result(op)) svc_commit_send(op);
}

/* ----------------------------------------------------------------- write */

static void written(void *ud, int res) {
    svc_order *op = ud;
    (void)res;
    settle(op);                                /* RESERVED, FENCED, MISSING, UNAVAILABLE */
}

static void taken(void *ud, int res);

/* The next order to take q's lock, out of the queue (one whose lock wait
 * ran out is answered so, 429); NULL when none is left. */
static svc_order *pop_next(lock_q *q) {
    while (q->head) {
        svc_order *op = q->head;
        if (!(q->head = op->next)) q->tail = NULL;
        if (q->unplaced == op) q->unplaced = op->next;
        if ((clock_mono_us() - LOCK(op).t0_us) / 1000 >= op->a->cfg.lock_wait_ms) {
            count_lock(op, 1);
            leave_line(q, op);
            op->sreq.result = STOCK_LOCK_TIMEOUT;
            settle(op);
            continue;
        }
        return op;
    }
    return NULL;
}

/* fair-lock: the orders that came behind the next holder and are not in
 * the line yet, into behind[] (up to KEEP_CHUNK): they go into it with
 * its lock_read, after it (no call of their own). Returns how many. */
static int take_unplaced(lock_q *q, stock_hold *behind[KEEP_CHUNK]) {
    int n = 0;
    for (svc_order *o = q->unplaced; o && n < KEEP_CHUNK; o = o->next, n++) {
        behind[n] = &LOCK(o).hold;
        LOCK(o).placed = 1;
        q->unplaced = o->next;
    }
    if (n) arm_keep(q);
    return n;
}

/* The holder op's fenced write (write 1, fn written) or its release only
 * (0, NULL: op is answered already), and the next holder right behind
 * it, on the same connection. fair-lock hands the lock on in the same
 * call (lock_pass.lua: the release wakes the head of the line, and the
 * head's take is in it); `lock` sends the next order's lock_read at the
 * end of this turn (advance), whoever comes first then takes the lock. */
static void hand_on(lock_q *q, svc_order *op, int write, stock_lock_fn *fn) {
    stock_async *sa = svc_order_loop_stock(q->ol);
    svc_order *next = NULL;
    releasing(q);
    if (q->holder == op && op->p->sp.strategy == STOCK_FAIR_LOCK) next = pop_next(q);
    if (!next) {
        stock_async_lock_write(sa, &op->sreq, &LOCK(op).hold, write, fn, fn ? op : NULL);
        if (q->holder == op) next_holder(q);
        return;
    }
    stock_hold *behind[KEEP_CHUNK];
    q->holder = next;
    q->state = LQ_TAKING;
    int n = take_unplaced(q, behind);
    stock_async_lock_pass(sa, &op->sreq, &LOCK(op).hold, write, fn, fn ? op : NULL, &next->sreq,
                          &LOCK(next).hold, ttl_of(next), behind, n, taken, next);
}

/* The fenced write, then the next holder right behind it. */
static void write_now(lock_q *q, svc_order *op) {
    hand_on(q, op, 1, written);
}

/* The injected pause is over: write (the fence decides whether it still
 * may). The op stayed alive: nothing answers it before its write. */
static void pause_over(loop *l, void *ud) {
    svc_order *op = ud;
    (void)l;
    write_now(LOCK(op).q, op);
}

/* The head's lease ran out while it paused: the next order may take the
 * lock; the paused one's write will meet the fence. */
static void lease_over(loop *l, void *ud) {
    lock_q *q = ud;
    (void)l;
    if (q->state == LQ_HOLDING && clock_mono_us() >= q->lease_until_us) next_holder(q);
}

/* ------------------------------------------------------------------ read */

static void retry(loop *l, void *ud);

static void send_read(lock_q *q) {
    svc_order *op = q->holder;
    stock_hold *behind[KEEP_CHUNK];
    int n = take_unplaced(q, behind);
    q->state = LQ_TAKING;
    stock_async_lock_read_joining(svc_order_loop_stock(q->ol), &op->sreq, &LOCK(op).hold,
                                  ttl_of(op), behind, n, taken, op);
}

/* Another process holds the lock: try again after its lease or a short
 * backoff, whichever comes first, within the order's lock wait. */
static void wait_for_lock(lock_q *q, svc_order *op) {
    int64_t waited_ms = (clock_mono_us() - LOCK(op).t0_us) / 1000;
    if (waited_ms >= op->a->cfg.lock_wait_ms) {
        count_lock(op, 1);
        leave_line(q, op);
        op->sreq.result = STOCK_LOCK_TIMEOUT;
        settle(op);
        next_holder(q);
        return;
    }
    unsigned char j = 0;
    if (getrandom(&j, 1, GRND_NONBLOCK) != 1) j = 128;
    int64_t delay = RETRY_MIN_MS + (int64_t)j * (RETRY_MAX_MS - RETRY_MIN_MS) / 255;
    if (LOCK(op).hold.pttl >= 0 && LOCK(op).hold.pttl < delay) delay = LOCK(op).hold.pttl;
    q->state = LQ_WAITING;
    if (q->unplaced) place_the_rest(q);         /* not to wait for the retry */
    if (loop_after(svc_order_loop_loop(q->ol), delay, retry, q) != 0) send_read(q);
}

static void retry(loop *l, void *ud) {
    lock_q *q = ud;
    (void)l;
    if (q->state == LQ_WAITING && q->holder) send_read(q);
}

static void taken(void *ud, int res) {
    svc_order *op = ud;
    lock_q *q = LOCK(op).q;
    stock_req *r = &op->sreq;
    if (res == 0) {                            /* held by another (fair: or first in line) */
        LOCK(op).placed = op->p->sp.strategy == STOCK_FAIR_LOCK;
        wait_for_lock(q, op);
        return;
    }
    if (res != -1) LOCK(op).placed = 0;        /* taken, or no copy: lock_read took it out */
    if (res < 0) {                             /* no valid copy, or Redis failed */
        leave_line(q, op);
        count_lock(op, 2);
        settle(op);                            /* 503 (and a rebuild when MISSING) */
        next_holder(q);
        return;
    }
    count_lock(op, 0);
    handed_off(q, op);
    stock_result verdict = stock_lock_check(r, &LOCK(op).hold);
    if (verdict != STOCK_RESERVED) {
        hand_on(q, op, 0, NULL);
        if (verdict == STOCK_INSUFFICIENT && op->p->segments > 1) {
            /* This segment is short: the blocking family reads them all. */
            q->ops--;
            LOCK(op).q = NULL;
            svc_pipeline_reroute(op, STOCK_KIND_RCW);
            return;
        }
        r->result = verdict;
        settle(op);
        return;
    }
    int pause = op->p->sp.cs_delay_ms;
    if (pause <= 0) {
        write_now(q, op);
        return;
    }
    /* Fault injection: a pause of 75%..125% of cs_delay_ms inside the
     * critical section, the lease not renewed meanwhile. */
    unsigned char j = 128;
    if (getrandom(&j, 1, GRND_NONBLOCK) != 1) j = 128;
    q->state = LQ_HOLDING;
    if (q->unplaced) place_the_rest(q);         /* not to wait for the pause */
    q->lease_until_us = clock_mono_us() + (int64_t)ttl_of(op) * 1000;
    loop *l = svc_order_loop_loop(q->ol);
    if (loop_after(l, pause * (192 + (int)j / 2) / 256, pause_over, op) != 0) {
        write_now(q, op);
        return;
    }
    loop_after(l, ttl_of(op), lease_over, q);
}

/* ------------------------------------------------------------- the queue */

/* Starts the queue's next orders (the family's flush, once per turn). */
static void advance(lock_q *q) {
    q->ready = 0;
    while (q->state == LQ_IDLE && q->head) {
        svc_order *op = pop_next(q);
        if (!op) break;
        q->holder = op;
        send_read(q);                          /* may finish at once (Redis down) */
    }
    place_the_rest(q);
}

static size_t q_slot(const lock_loop *ll, const svc_product *p, int seg) {
    uintptr_t h = (uintptr_t)p * 31 + (uintptr_t)seg;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (ll->nqs - 1);
    while (ll->qs[i] && (ll->qs[i]->p != p || ll->qs[i]->seg != seg)) i = (i + 1) & (ll->nqs - 1);
    return i;
}

/* The queue of (p, seg) on ol, made on first use; NULL when out of memory. */
static lock_q *queue_of(svc_order_loop *ol, svc_product *p, int seg) {
    lock_loop *ll = locks_of(ol);
    if (ll->used * 2 >= ll->nqs) {
        size_t old = ll->nqs;
        lock_q **prev = ll->qs, **bigger = calloc(old ? old * 2 : 16, sizeof *bigger);
        if (!bigger) return NULL;
        ll->qs = bigger;
        ll->nqs = old ? old * 2 : 16;
        for (size_t i = 0; i < old; i++)
            if (prev[i]) ll->qs[q_slot(ll, prev[i]->p, prev[i]->seg)] = prev[i];
        free(prev);
    }
    size_t i = q_slot(ll, p, seg);
    if (!ll->qs[i]) {
        lock_q *q = calloc(1, sizeof *q);
        if (!q) return NULL;
        q->ol = ol;
        q->p = p;
        q->seg = seg;
        ll->qs[i] = q;
        ll->used++;
    }
    return ll->qs[i];
}

/* On the owner loop: into its segment's queue. */
static void enqueue(svc_order *op) {
    svc_order_loop *ol = svc_order_loop_current();
    lock_q *q = queue_of(ol, op->p, LOCK(op).hold.seg);
    if (!q) {
        svc_pipeline_reroute(op, STOCK_KIND_RCW);   /* no memory here: the blocking family */
        return;
    }
    LOCK(op).q = q;
    op->next = NULL;
    q->ops++;
    /* fair-lock: an order takes its place in the line with its queue's
     * next call to Redis, behind the orders before it, so the line has this
     * instance's orders in their FIFO's order: an idle queue's lock_read in
     * this turn's advance; a queue whose call is in flight, the lock_read
     * or lock_pass its reply sends (within a round trip: no call of its
     * own); a queue waiting for another holder or paused in its critical
     * section, one join at the end of this turn. */
    if (op->p->sp.strategy == STOCK_FAIR_LOCK) {
        if (!q->unplaced) q->unplaced = op;
        if (q->state != LQ_IDLE && q->state != LQ_TAKING && !q->placing) {
            lock_loop *ll = locks_of(ol);
            q->placing = 1;
            q->next_placing = ll->placing;
            ll->placing = q;
        }
    }
    if (q->tail) q->tail->next = op;
    else q->head = op;
    q->tail = op;
    if (q->state == LQ_IDLE) ready(q);
}

/* ------------------------------------------------------------- routing */

/* The loop that owns segment seg of p: segments are dealt round the loops
 * from a per-product start, so that each loop owns some of a segmented
 * product's locks. */
static int owner_of(const svc_app *a, const svc_product *p, int seg) {
    uintptr_t h = (uintptr_t)p;
    h = (h ^ (h >> 17)) * 0x9E3779B97F4A7C15ull;
    return (int)(((h >> 24) + (unsigned)seg) % (unsigned)a->nloops);
}

/* Picks a segment and sends op to its owner loop: one this thread's loop
 * owns when there is one with stock, so the order stays on its thread. */
static void submit(svc_order *op) {
    svc_app *a = op->a;
    svc_product *p = op->p;
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd) rnd = (uint64_t)clock_mono_us();
    int seg = -1, n = a->nloops, home = svc_order_loop_index(op->home);
    if (p->sp.cs_overlap > 0) {
        /* Fault injection's forcing of an interleaving waits inside the
         * critical section for other holders (stock/rcw.c): the blocking
         * family runs it, on the same keys, locks and fence. */
        svc_pipeline_reroute(op, STOCK_KIND_RCW);
        return;
    }
    if (p->segments >= n)
        seg = stock_pick_segment(&p->sp, rnd, ((home - owner_of(a, p, 0)) % n + n) % n, n);
    if (seg < 0) seg = stock_pick_segment(&p->sp, rnd, 0, 1);
    if (seg < 0) {
        svc_pipeline_reroute(op, STOCK_KIND_RCW);   /* all look empty: the full read decides */
        return;
    }
    LOCK(op).hold.seg = seg;
    LOCK(op).hold.owner[0] = '\0';             /* made at its first call */
    LOCK(op).placed = 0;
    LOCK(op).t0_us = clock_mono_us();
    svc_order_loop_run(a->order_loops[owner_of(a, p, seg)], op, enqueue);
}

/* ------------------------------------------------------------- lifecycle */

static void flush(svc_order_loop *ol) {
    lock_loop *ll = locks_of(ol);
    while (ll->ready) {
        lock_q *q = ll->ready;
        ll->ready = q->next_ready;
        advance(q);
    }
    /* fair-lock: the orders that came this turn to queues busy with an
     * order, into the line behind it, one call per queue. */
    while (ll->placing) {
        lock_q *q = ll->placing;
        ll->placing = q->next_placing;
        q->placing = 0;
        place_the_rest(q);
    }
}

static int lock_loop_start(svc_order_loop *ol, char *err, size_t errlen) {
    lock_loop *ll = calloc(1, sizeof *ll);
    if (!ll) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    svc_order_loop_set_state(ol, &svc_family_lock, ll);
    return 0;
}

static int lock_loop_busy(svc_order_loop *ol) {
    lock_loop *ll = locks_of(ol);
    if (ll->ready) return 1;
    for (size_t k = 0; k < ll->nqs; k++)
        if (ll->qs[k] && ll->qs[k]->ops > 0) return 1;
    return 0;
}

static void lock_loop_free(svc_order_loop *ol) {
    lock_loop *ll = svc_order_loop_state(ol, &svc_family_lock);
    if (!ll) return;
    for (size_t k = 0; k < ll->nqs; k++) free(ll->qs[k]);
    free(ll->qs);
    free(ll);
    svc_order_loop_set_state(ol, &svc_family_lock, NULL);
}

svc_family svc_family_lock = {
    .name = "lock",
    .kinds = 1u << STOCK_KIND_LOCK,
    .submit = submit,
    .committed = svc_reservation_committed,
    .loop_start = lock_loop_start,
    .loop_flush = flush,
    .loop_busy = lock_loop_busy,
    .loop_free = lock_loop_free,
};
