/* fam_script.c: the script family: `lua` orders, batched per SKU on the
 * event loop that received them.
 *
 * Orders that arrive during one loop turn are queued per SKU; at the end
 * of the turn (the family's flush) each SKU's queue becomes one
 * reserve_batch.lua call on the loop's own Redis connection, which also
 * clears the pending records of that SKU's orders committed since
 * (reservation.c keeps those). The reply answers the refused orders at
 * once and hands the reserved ones to the committer in one call.
 *
 * An order submitted from a thread that runs no loop (an API worker that
 * had to read the product first) comes in through its home loop's inbox. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/order/commit.h"
#include "service/order/fam_script.h"
#include "service/order/orderloop.h"
#include "service/order/pipeline.h"
#include "service/order/reservation.h"

/* Batches of one SKU a loop keeps in flight at most: while one is out,
 * orders gather for the next, so batches grow with the load instead of the
 * loop sending one small script call per turn. Two in flight sold no
 * faster (docs/performance.md), so one keeps the batches largest. */
#define MAX_INFLIGHT 1

/* One SKU's orders on one loop. */
typedef struct sku_queue {
    svc_product *p;
    int inflight;                  /* batches sent, not answered yet */
    svc_order *head, *tail;
    size_t n;
    int dirty;
    struct sku_queue *next_dirty;
} sku_queue;

/* The family's state on one loop. */
typedef struct script_loop {
    svc_order_loop *ol;
    sku_queue **slots;             /* open addressing by product pointer */
    size_t nslots, used;
    sku_queue *dirty;
    int held;                      /* orders queued or in a batch */
} script_loop;

/* One script call's orders, until its reply. */
typedef struct batch {
    script_loop *sl;
    sku_queue *q;
    size_t n;
    stock_req *reqs[STOCK_BATCH_MAX];
    svc_order *ops[STOCK_BATCH_MAX];
} batch;

static script_loop *script_of(const svc_order_loop *ol) {
    assert(svc_order_loop_owned(ol));
    return svc_order_loop_state(ol, &svc_family_script);
}

/* ------------------------------------------------------------ SKU queues */

static size_t slot_of(const script_loop *sl, const svc_product *p) {
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (sl->nslots - 1);
    while (sl->slots[i] && sl->slots[i]->p != p) i = (i + 1) & (sl->nslots - 1);
    return i;
}

/* The queue of p (made on first use), or NULL when out of memory. */
static sku_queue *queue_of(script_loop *sl, svc_product *p) {
    if (sl->used * 2 >= sl->nslots) {
        size_t old = sl->nslots;
        sku_queue **prev = sl->slots, **bigger = calloc(old * 2, sizeof *bigger);
        if (!bigger) return NULL;
        sl->slots = bigger;
        sl->nslots = old * 2;
        for (size_t i = 0; i < old; i++)
            if (prev[i]) sl->slots[slot_of(sl, prev[i]->p)] = prev[i];
        free(prev);
    }
    size_t i = slot_of(sl, p);
    if (!sl->slots[i]) {
        if (!(sl->slots[i] = calloc(1, sizeof **sl->slots))) return NULL;
        sl->slots[i]->p = p;
        sl->used++;
    }
    return sl->slots[i];
}

static void mark_dirty(script_loop *sl, sku_queue *q) {
    if (q->dirty) return;
    q->dirty = 1;
    q->next_dirty = sl->dirty;
    sl->dirty = q;
}

/* On the home loop: queue op for this turn's batch of its SKU. */
static void enqueue(svc_order *op) {
    script_loop *sl = script_of(op->home);
    sku_queue *q = queue_of(sl, op->p);
    if (!q) {
        op->sreq.result = STOCK_UNAVAILABLE;
        op->sreq.outcome_unknown = 0;
        svc_reservation_result(op);           /* answers 503, nothing taken */
        return;
    }
    op->next = NULL;
    if (q->tail) q->tail->next = op;
    else q->head = op;
    q->tail = op;
    q->n++;
    sl->held++;
    mark_dirty(sl, q);
}

static void submit(svc_order *op) { svc_order_loop_run(op->home, op, enqueue); }

/* --------------------------------------------------------------- batches */

static void batch_done(void *ud, stock_req **reqs, size_t n) {
    batch *b = ud;
    script_loop *sl = b->sl;
    svc_order *ready[STOCK_BATCH_MAX];
    size_t nr = 0;
    (void)reqs;
    assert(svc_order_loop_owned(sl->ol));
    /* The next batch of this SKU may go: what gathered meanwhile. */
    if (--b->q->inflight < MAX_INFLIGHT && b->q->n) mark_dirty(sl, b->q);
    sl->held -= (int)n;
    for (size_t i = 0; i < n; i++) {
        svc_order *op = b->ops[i];
        if (op->sreq.result == STOCK_SPREAD) {
            /* A spread product's order no one lane holds: taken in steps
             * over the lanes on a blocking thread (stock_reserve). */
            svc_pipeline_reroute(op, STOCK_KIND_RCW);
            continue;
        }
        if (svc_reservation_result(op)) ready[nr++] = op;
    }
    svc_commit_send_many(svc_order_loop_app(sl->ol), ready, nr);
    free(b);
}

/* Sends what q gathered, in batches, each carrying the SKU's waiting
 * clears of pending records. */
static void send_queue(script_loop *sl, sku_queue *q) {
    const char *ids[STOCK_BATCH_MAX * 4];
    svc_app *a = svc_order_loop_app(sl->ol);
    while (q->n > 0 && q->inflight < MAX_INFLIGHT) {
        batch *b = malloc(sizeof *b);
        if (!b) break;                        /* retried at the next flush */
        b->sl = sl;
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
        size_t nc = svc_pending_peek(sl->ol, q->p, ids, sizeof ids / sizeof ids[0]);
        atomic_fetch_add(&a->m.reserve_batches, 1);
        atomic_fetch_add(&a->m.reserve_orders, b->n);
        size_t taken = stock_async_reserve(svc_order_loop_stock(sl->ol), &q->p->sp, b->reqs, b->n,
                                           ids, nc, batch_done, b);
        svc_pending_drop(sl->ol, q->p, taken);
    }
}

/* End of a loop turn: every SKU touched in it goes out. */
static void flush(svc_order_loop *ol) {
    script_loop *sl = script_of(ol);
    while (sl->dirty) {
        sku_queue *q = sl->dirty;
        sl->dirty = q->next_dirty;
        q->dirty = 0;
        send_queue(sl, q);
        /* Left over: orders that found no memory for a batch (batch_done
         * marks a queue again when its batch in flight comes back). */
        if (q->n && q->inflight < MAX_INFLIGHT) {
            mark_dirty(sl, q);
            break;
        }
    }
}

/* ------------------------------------------------------------- lifecycle */

static int script_loop_start(svc_order_loop *ol, char *err, size_t errlen) {
    script_loop *sl = calloc(1, sizeof *sl);
    if (!sl || !(sl->slots = calloc(16, sizeof *sl->slots))) {
        free(sl);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    sl->ol = ol;
    sl->nslots = 16;
    svc_order_loop_set_state(ol, &svc_family_script, sl);
    return 0;
}

static int script_loop_busy(svc_order_loop *ol) {
    script_loop *sl = script_of(ol);
    return sl->held > 0 || sl->dirty != NULL;
}

static void script_loop_free(svc_order_loop *ol) {
    script_loop *sl = svc_order_loop_state(ol, &svc_family_script);
    if (!sl) return;
    for (size_t k = 0; k < sl->nslots; k++) free(sl->slots[k]);
    free(sl->slots);
    free(sl);
    svc_order_loop_set_state(ol, &svc_family_script, NULL);
}

svc_family svc_family_script = {
    .name = "script",
    .kinds = 1u << STOCK_KIND_SCRIPT,
    .submit = submit,
    .committed = svc_reservation_committed,
    .loop_start = script_loop_start,
    .loop_flush = flush,
    .loop_busy = script_loop_busy,
    .loop_free = script_loop_free,
};
