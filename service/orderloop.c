/* orderloop.c: the order path's state on each event loop.
 *
 * Orders of the `lua` strategy that arrive during one loop iteration are
 * queued per SKU; at the end of the iteration (a flush hook) each SKU's
 * queue becomes one reserve_batch.lua call on the loop's own Redis
 * connection, which also clears the pending records of the orders
 * committed since. The reply answers the refused orders at once and hands
 * the reserved ones to the committer in one call.
 *
 * The committer gives orders back through the loop's inbox: one mutex and
 * at most one wake (loop_post) per loop per committed group. Orders
 * submitted from threads that are not loops (an API worker that had to
 * read the product first) come in through the same inbox.
 *
 * Hook order matters: libmicrohttpd's flush (which may read more orders)
 * runs first, then this flush (which writes the batches), then the Redis
 * connection's (which sends what was written): so a batch leaves in the
 * iteration that gathered it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "service/order.h"

/* One SKU's orders and clears on one loop. */
typedef struct sku_queue {
    svc_product *p;
    int inflight;                  /* batches sent, not answered yet */
    svc_order *head, *tail;
    size_t n;
    char (*clear)[DB_ORDER_ID_LEN + 1];
    size_t nclear, capclear;
    int dirty;
    struct sku_queue *next_dirty;
} sku_queue;

/* One script call's orders, until its reply. */
typedef struct batch {
    svc_order_loop *ol;
    sku_queue *q;
    size_t n;
    stock_req *reqs[STOCK_BATCH_MAX];
    svc_order *ops[STOCK_BATCH_MAX];
} batch;

struct svc_order_loop {
    svc_app *a;
    loop *l;
    int index;                     /* in a->order_loops */
    stock_async *sa;
    sku_queue **slots;             /* open addressing by product pointer */
    size_t nslots, used;
    sku_queue *dirty;
    pthread_mutex_t mu;            /* guards the inbox */
    svc_order *in_head, *in_tail;   /* committed, to act on */
    svc_order *res_head, *res_tail; /* to reserve (from other threads) */
    atomic_int posted;             /* task is queued on the loop */
    loop_task task;
    /* The committer's staging, touched by its thread only. */
    svc_order *give_head, *give_tail;
    int give_listed;
    svc_order_loop *give_next;
    svc_lock_q **lqs;                  /* the `lock` queues this loop owns, by (product, segment) */
    size_t nlqs, usedlqs;
    svc_lock_q *lock_ready;            /* queues with an order to start this iteration */
};

/* Batches of one SKU a loop keeps in flight at most: while one is out,
 * orders gather for the next, so batches grow with the load instead of the
 * loop sending one small script call per iteration. Two in flight sold no
 * faster (docs/performance.md), so one keeps the batches largest. */
#define MAX_INFLIGHT 1

static void wake(svc_order_loop *ol);

/* ------------------------------------------------------------ SKU queues */

static size_t slot_of(const svc_order_loop *ol, const svc_product *p) {
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (ol->nslots - 1);
    while (ol->slots[i] && ol->slots[i]->p != p) i = (i + 1) & (ol->nslots - 1);
    return i;
}

/* The queue of p on ol (made on first use), or NULL when out of memory. */
static sku_queue *queue_of(svc_order_loop *ol, svc_product *p) {
    if (ol->used * 2 >= ol->nslots) {
        size_t old = ol->nslots;
        sku_queue **prev = ol->slots;
        sku_queue **bigger = calloc(old * 2, sizeof *bigger);
        if (!bigger) return NULL;
        ol->slots = bigger;
        ol->nslots = old * 2;
        for (size_t i = 0; i < old; i++)
            if (prev[i]) ol->slots[slot_of(ol, prev[i]->p)] = prev[i];
        free(prev);
    }
    size_t i = slot_of(ol, p);
    if (!ol->slots[i]) {
        if (!(ol->slots[i] = calloc(1, sizeof **ol->slots))) return NULL;
        ol->slots[i]->p = p;
        ol->used++;
    }
    return ol->slots[i];
}

static void mark_dirty(svc_order_loop *ol, sku_queue *q) {
    if (q->dirty) return;
    q->dirty = 1;
    q->next_dirty = ol->dirty;
    ol->dirty = q;
}

/* On the loop's thread: queue op for this iteration's batch. */
static void enqueue(svc_order_loop *ol, svc_order *op) {
    sku_queue *q = queue_of(ol, op->p);
    if (!q) {
        op->sreq.result = STOCK_UNAVAILABLE;
        op->sreq.outcome_unknown = 0;
        svc_order_reserved(op);                   /* answers 503, nothing taken */
        return;
    }
    op->next = NULL;
    if (q->tail) q->tail->next = op;
    else q->head = op;
    q->tail = op;
    q->n++;
    mark_dirty(ol, q);
}

void svc_order_loop_clear(svc_order_loop *ol, svc_product *p, const char *order_id) {
    sku_queue *q = queue_of(ol, p);
    if (!q) return;                           /* reconciliation clears it */
    if (q->nclear == q->capclear) {
        size_t cap = q->capclear ? q->capclear * 2 : 64;
        void *c = realloc(q->clear, cap * sizeof *q->clear);
        if (!c) return;
        q->clear = c;
        q->capclear = cap;
    }
    snprintf(q->clear[q->nclear++], sizeof q->clear[0], "%s", order_id);
    mark_dirty(ol, q);
}

/* --------------------------------------------------------------- batches */

static void mark_dirty(svc_order_loop *ol, sku_queue *q);

static void batch_done(void *ud, stock_req **reqs, size_t n) {
    batch *b = ud;
    db_job *jobs[STOCK_BATCH_MAX];
    size_t nj = 0;
    (void)reqs;
    /* The next batch of this SKU may go: what gathered meanwhile. */
    if (--b->q->inflight < MAX_INFLIGHT && b->q->n) mark_dirty(b->ol, b->q);
    for (size_t i = 0; i < n; i++)
        if (svc_order_reserved(b->ops[i])) jobs[nj++] = &b->ops[i]->job;
    db_writer_submit_many(b->ol->a->writer, jobs, nj);
    free(b);
}

/* Removes the first k clears of q (the call took them). */
static void drop_clears(sku_queue *q, size_t k) {
    if (k == 0) return;
    memmove(q->clear, q->clear + k, (q->nclear - k) * sizeof *q->clear);
    q->nclear -= k;
}

/* Sends what q gathered: its orders in batches (each carrying clears),
 * then the clears left over on their own. */
static void send_queue(svc_order_loop *ol, sku_queue *q) {
    const char *ids[STOCK_BATCH_MAX * 4];
    while (q->n > 0 && q->inflight < MAX_INFLIGHT) {
        batch *b = malloc(sizeof *b);
        if (!b) break;                        /* retried at the next flush */
        b->ol = ol;
        b->q = q;
        q->inflight++;
        b->n = 0;
        while (q->head && b->n < STOCK_BATCH_MAX) {
            svc_order *op = q->head;
            q->head = op->next;
            b->ops[b->n] = op;
            b->reqs[b->n++] = &op->sreq;
        }
        if (!q->head) q->tail = NULL;
        q->n -= b->n;
        size_t nc = q->nclear < sizeof ids / sizeof ids[0] ? q->nclear : sizeof ids / sizeof ids[0];
        for (size_t i = 0; i < nc; i++) ids[i] = q->clear[i];
        atomic_fetch_add(&ol->a->m.reserve_batches, 1);
        atomic_fetch_add(&ol->a->m.reserve_orders, b->n);
        size_t taken = stock_async_reserve(ol->sa, &q->p->sp, b->reqs, b->n, ids, nc, batch_done, b);
        drop_clears(q, taken);
    }
    while (q->nclear > 0) {
        size_t nc = q->nclear < sizeof ids / sizeof ids[0] ? q->nclear : sizeof ids / sizeof ids[0];
        for (size_t i = 0; i < nc; i++) ids[i] = q->clear[i];
        size_t taken = stock_async_clear(ol->sa, &q->p->sp, ids, nc);
        if (!taken) {
            q->nclear = 0;                    /* not now: reconciliation clears them */
            break;
        }
        drop_clears(q, taken);
    }
}

/* End of an iteration: every SKU touched in it goes out. */
static void flush(loop *l, void *ud) {
    svc_order_loop *ol = ud;
    (void)l;
    /* Lock queues first: an order they start may fail at once and start
     * the next, which comes back on this list. */
    while (ol->lock_ready) {
        svc_lock_q *q = ol->lock_ready;
        ol->lock_ready = svc_lock_q_next_ready(q);
        svc_lock_q_advance(q);
    }
    while (ol->dirty) {
        sku_queue *q = ol->dirty;
        ol->dirty = q->next_dirty;
        q->dirty = 0;
        send_queue(ol, q);
        /* Left over: clears that did not fit (out of memory), or orders
         * waiting for a batch in flight (batch_done marks the queue again). */
        if (q->nclear || (q->n && q->inflight < MAX_INFLIGHT)) mark_dirty(ol, q);
        if (q->dirty) break;
    }
}

/* ------------------------------------------------------------ lock queues */

stock_async *svc_order_loop_stock(svc_order_loop *ol) { return ol->sa; }
int svc_order_loop_index(const svc_order_loop *ol) { return ol->index; }
loop *svc_order_loop_loop(svc_order_loop *ol) { return ol->l; }

static size_t lq_slot(const svc_order_loop *ol, const svc_product *p, int seg) {
    uintptr_t h = (uintptr_t)p * 31 + (uintptr_t)seg;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (ol->nlqs - 1);
    while (ol->lqs[i] &&
           (svc_lock_q_product(ol->lqs[i]) != p || svc_lock_q_segment(ol->lqs[i]) != seg))
        i = (i + 1) & (ol->nlqs - 1);
    return i;
}

/* The queue of (p, seg) on ol, made on first use; NULL when out of memory. */
static svc_lock_q *lq_of(svc_order_loop *ol, svc_product *p, int seg) {
    if (ol->usedlqs * 2 >= ol->nlqs) {
        size_t old = ol->nlqs;
        svc_lock_q **prev = ol->lqs, **bigger = calloc(old ? old * 2 : 16, sizeof *bigger);
        if (!bigger) return NULL;
        ol->lqs = bigger;
        ol->nlqs = old ? old * 2 : 16;
        for (size_t i = 0; i < old; i++)
            if (prev[i])
                ol->lqs[lq_slot(ol, svc_lock_q_product(prev[i]), svc_lock_q_segment(prev[i]))] =
                    prev[i];
        free(prev);
    }
    size_t i = lq_slot(ol, p, seg);
    if (!ol->lqs[i]) {
        if (!(ol->lqs[i] = svc_lock_q_new(ol, p, seg))) return NULL;
        ol->usedlqs++;
    }
    return ol->lqs[i];
}

/* On the owner's thread: into its segment's queue. */
static void lock_enqueue(svc_order_loop *ol, svc_order *op) {
    svc_lock_q *q = lq_of(ol, op->p, op->hold.seg);
    if (!q) {
        op->phase = PH_RESERVE_ONE;           /* no memory here: the pool takes it */
        svc_pool_push(op->a->pool, op);
        return;
    }
    svc_lock_q_enqueue(q, op);
}

void svc_order_loop_lock_ready(svc_order_loop *ol, svc_lock_q *q) {
    svc_lock_q_set_next_ready(q, ol->lock_ready);
    ol->lock_ready = q;
}

void svc_order_loop_lock(svc_order_loop *ol, svc_order *op) {
    op->phase = PH_LOCK;
    if (loop_current() == ol->l) {
        lock_enqueue(ol, op);
        return;
    }
    op->next = NULL;
    pthread_mutex_lock(&ol->mu);
    if (ol->res_tail) ol->res_tail->next = op;
    else ol->res_head = op;
    ol->res_tail = op;
    pthread_mutex_unlock(&ol->mu);
    wake(ol);
}

void svc_order_loop_undo(svc_order_loop *ol, const stock_ref *ref, stock_undo_fn *fn, void *ud) {
    stock_async_undo(ol->sa, ref, fn, ud);
}

/* ----------------------------------------------------------------- inbox */

/* The loop's task: what other threads handed over. */
static void drain_inbox(loop *l, void *ud) {
    svc_order_loop *ol = ud;
    (void)l;
    atomic_store(&ol->posted, 0);             /* before taking: a later give posts again */
    pthread_mutex_lock(&ol->mu);
    svc_order *in = ol->in_head, *res = ol->res_head;
    ol->in_head = ol->in_tail = ol->res_head = ol->res_tail = NULL;
    pthread_mutex_unlock(&ol->mu);
    while (res) {
        svc_order *next = res->next;
        if (res->phase == PH_LOCK) lock_enqueue(ol, res);
        else enqueue(ol, res);
        res = next;
    }
    while (in) {
        svc_order *next = in->next;
        svc_order_committed(in);
        in = next;
    }
}

static void wake(svc_order_loop *ol) {
    if (!atomic_exchange(&ol->posted, 1)) loop_post(ol->l, &ol->task);
}

svc_order_loop *svc_order_loop_home(svc_app *a) {
    static atomic_uint turn;
    loop *l = loop_current();
    if (l && loop_data(l)) return loop_data(l);
    return a->order_loops[atomic_fetch_add(&turn, 1) % (unsigned)a->nloops];
}

void svc_order_loop_reserve(svc_order_loop *ol, svc_order *op) {
    op->phase = PH_SCRIPT;
    if (loop_current() == ol->l) {
        enqueue(ol, op);
        return;
    }
    op->next = NULL;
    pthread_mutex_lock(&ol->mu);
    if (ol->res_tail) ol->res_tail->next = op;
    else ol->res_head = op;
    ol->res_tail = op;
    pthread_mutex_unlock(&ol->mu);
    wake(ol);
}

void svc_order_loop_give(svc_order_loop *ol, svc_order *op) {
    svc_app *a = ol->a;
    op->next = NULL;
    if (ol->give_tail) ol->give_tail->next = op;
    else ol->give_head = op;
    ol->give_tail = op;
    if (!ol->give_listed) {
        ol->give_listed = 1;
        ol->give_next = a->give_touched;
        a->give_touched = ol;
    }
}

void svc_order_loop_give_done(svc_app *a) {
    while (a->give_touched) {
        svc_order_loop *ol = a->give_touched;
        a->give_touched = ol->give_next;
        ol->give_listed = 0;
        pthread_mutex_lock(&ol->mu);
        if (ol->in_tail) ol->in_tail->next = ol->give_head;
        else ol->in_head = ol->give_head;
        ol->in_tail = ol->give_tail;
        pthread_mutex_unlock(&ol->mu);
        ol->give_head = ol->give_tail = NULL;
        wake(ol);
    }
}

/* ------------------------------------------------------------- lifecycle */

int svc_order_loops_start(svc_app *a, char *err, size_t errlen) {
    if (!(a->order_loops = calloc((size_t)a->nloops, sizeof *a->order_loops))) goto oom;
    for (int i = 0; i < a->nloops; i++) {
        svc_order_loop *ol = calloc(1, sizeof *ol);
        if (!ol) goto oom;
        a->order_loops[i] = ol;
        ol->index = i;
        ol->a = a;
        ol->l = a->loops[i];
        ol->nslots = 16;
        if (!(ol->slots = calloc(ol->nslots, sizeof *ol->slots))) goto oom;
        pthread_mutex_init(&ol->mu, NULL);
        ol->task = (loop_task){ drain_inbox, ol, NULL };
        /* This flush before the Redis connection's (created next): the
         * batches it writes then leave in the same iteration. */
        if (loop_on_flush(ol->l, flush, ol) != 0) {
            snprintf(err, errlen, "cannot attach the order path to its event loop");
            return -1;
        }
        if (!(ol->sa = stock_async_new(ol->l, &a->stock_cfg, err, errlen))) return -1;
        loop_set_data(ol->l, ol);
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* Whether the loops still have Redis work in flight or queued. Read from
 * another thread while the loops run: a hint for waiting, never a verdict. */
static int busy(svc_app *a) {
    for (int i = 0; i < a->nloops; i++) {
        svc_order_loop *ol = a->order_loops[i];
        if (ol && (ol->dirty || ol->lock_ready || stock_async_inflight(ol->sa) > 0)) return 1;
        for (size_t k = 0; ol && k < ol->nlqs; k++)
            if (ol->lqs[k] && svc_lock_q_busy(ol->lqs[k])) return 1;
    }
    return 0;
}

void svc_order_loops_drain(svc_app *a, int64_t wait_ms) {
    for (int64_t waited = 0; waited < wait_ms && a->order_loops && busy(a); waited += 5)
        clock_sleep_ms(5);
}

void svc_order_loops_free(svc_app *a) {
    for (int i = 0; a->order_loops && i < a->nloops; i++) {
        svc_order_loop *ol = a->order_loops[i];
        if (!ol) continue;
        stock_async_free(ol->sa);
        for (size_t k = 0; k < ol->nslots; k++) {
            if (!ol->slots[k]) continue;
            free(ol->slots[k]->clear);
            free(ol->slots[k]);
        }
        free(ol->slots);
        for (size_t k = 0; k < ol->nlqs; k++) free(ol->lqs[k]);
        free(ol->lqs);
        pthread_mutex_destroy(&ol->mu);
        free(ol);
    }
    free(a->order_loops);
    a->order_loops = NULL;
}
