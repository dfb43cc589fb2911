/* reservation.c: a Redis reservation's result, and the end of its pending
 * record: cleared once its order is committed, or its units given back.
 *
 * Clears wait per loop and per SKU: the script family carries a SKU's
 * waiting clears in its next script call (svc_pending_peek/drop), and
 * what is left at the end of a loop turn goes out as one HDEL per SKU
 * (svc_pending_loop_flush). A clear that cannot be sent (out of memory,
 * Redis down) is left to reconciliation, which finds the order committed
 * and clears the record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/ops/health.h"
#include "service/order/commit.h"
#include "service/order/reservation.h"
#include "service/log.h"
#include "service/repair/repair.h"

/* ------------------------------------------------------------------ results */

int svc_reservation_result(svc_order *op) {
    const stock_req *r = &op->sreq;
    assert(op->state == SVC_ORDER_RESERVING);
    switch (r->result) {
    case STOCK_RESERVED:
        svc_commit_prepare_insert(op, DB_TAKE_NONE, 0);
        return 1;
    case STOCK_REPLAY:
        if (!r->replay_same) {
            svc_order_refuse(op, RF_KEY_REUSED, 0);
            return 0;
        }
        svc_commit_prepare_lookup(op, r->replay_order_id);   /* answered once the db looked */
        return 1;
    case STOCK_SOLD_OUT:
        svc_order_refuse(op, RF_SOLD_OUT, 0);
        return 0;
    case STOCK_INSUFFICIENT:
        svc_order_refuse(op, RF_INSUFFICIENT, r->available);
        return 0;
    case STOCK_LIMIT:
        svc_order_refuse(op, RF_LIMIT, r->available);
        return 0;
    case STOCK_MISSING:
        svc_repair_request_rebuild(op->a->repair, op->p);
        svc_order_refuse(op, RF_REBUILDING, 0);
        return 0;
    case STOCK_LOCK_TIMEOUT:
        svc_order_refuse(op, RF_LOCK_TIMEOUT, 0);
        return 0;
    case STOCK_FENCED:
        svc_order_refuse(op, RF_FENCED, 0);
        return 0;
    case STOCK_LOCK_DOWN:
        svc_order_refuse(op, RF_LOCK_DOWN, 0);
        return 0;
    case STOCK_SPREAD:
        /* The script family reroutes these before (fam_script.c): only a
         * family that cannot take in steps could get here. */
        assert(!"a spread order not rerouted");
        svc_order_refuse(op, RF_INSUFFICIENT, r->available);
        return 0;
    case STOCK_UNAVAILABLE:
        if (r->outcome_unknown) {
            /* Redis may have run the script before the connection broke.
             * The order is never committed (it goes no further), and the
             * units go back by the repair queue's undo retries (a no-op if
             * the script did not run): trying the undo here first would
             * make the client wait a second timeout on a Redis that just
             * failed to answer one. */
            svc_repair_retry_undo(op->a->repair, op->p, op->order_id, op->idem_key);
            svc_order_refuse(op, RF_REDIS_DOWN_TAKEN, 0);
        } else {
            svc_order_refuse(op, RF_REDIS_DOWN, 0);
        }
        return 0;
    }
    assert(!"unknown stock result");
    return 0;
}

/* ------------------------------------------------------------------ undo */

/* The units of a reservation that will not commit are back (or will be,
 * by the repair queue's retries): now answer as the commit failed. */
static void undone(void *ud, int done) {
    svc_order *op = ud;
    assert(op->state == SVC_ORDER_UNDOING);
    if (!done) svc_repair_retry_undo(op->a->repair, op->p, op->order_id, op->idem_key);
    if (op->undo_then == RF_LOOKUP) {
        /* The key names an order already in SQLite (its Redis record was
         * lost): answer as a replay of that order. */
        svc_commit_prepare_lookup(op, "");
        svc_commit_send(op);
        return;
    }
    svc_order_refuse(op, op->undo_then, op->undo_avail);
}

/* The revoke mark of an order whose COMMIT's outcome is unknown is written
 * (done), or Redis did not say so (the repair queue writes it first). */
static void marked(void *ud, int done) {
    svc_order *op = ud;
    assert(op->state == SVC_ORDER_MARKING);
    if (!done)
        svc_log(SVC_LOG_WARN, "order %s of %s: its revoke mark not written (Redis did not say "
                "so); the repair queue writes it", op->order_id, op->p->sku);
    svc_repair_revoke(op->a->repair, op->p, op->order_id, op->idem_key, 0, done);
    svc_order_refuse(op, RF_DB_UNKNOWN, 0);
}

/* Gives op's units back, then answers `then` (a refusal, or RF_LOOKUP). */
static void undo_then(svc_order *op, svc_refusal then) {
    stock_ref ref = { &op->p->sp, op->order_id, op->idem_key, op->sreq.takes };
    svc_order_to(op, SVC_ORDER_UNDOING);
    op->undo_then = then;
    stock_async_undo(svc_order_loop_stock(op->home), &ref, undone, op);
}

static void clear_later(svc_order_loop *ol, svc_product *p, const char *order_id);

void svc_reservation_committed(svc_order *op) {
    assert(svc_order_loop_owned(op->home) && op->job.take == DB_TAKE_NONE);
    switch (op->job.status) {
    case DB_OK:
        if (op->p->sp.lanes)
            stock_async_clear_spread(svc_order_loop_stock(op->home), &op->p->sp, op->order_id,
                                     op->sreq.takes);
        else
            clear_later(op->home, op->p, op->order_id);
        svc_order_answer(op, &op->job.order, 0);
        return;
    case DB_LIMIT:
        /* A spread product: SQLite found the buyer over the limit. */
        op->undo_avail = op->job.available;
        undo_then(op, RF_LIMIT);
        return;
    case DB_DUPKEY:
        undo_then(op, RF_LOOKUP);
        return;
    case DB_UNKNOWN:
        /* Whether it committed is unknown, and the buyer is told 503: the
         * order is revoked once the database answers, and only then are
         * its units (the pending record stays until) given back. The mark
         * goes to Redis before the 503: should this instance die before
         * the revoke, another's sweep finds the mark and revokes the order
         * rather than keep its row. Marked later, by the repair thread, a
         * kill in between left rows beside 503s. */
        svc_health_poke_db(op->a->health);
        svc_order_to(op, SVC_ORDER_MARKING);
        stock_async_revoke_mark(svc_order_loop_stock(op->home), &op->p->sp, op->order_id,
                                marked, op);
        return;
    case DB_STALE:
        /* Reserved from a copy of an older generation: usually a rebuild
         * raced this order, and the copy is current again; if it is not
         * (a rebuild that could not load Redis), the repair queue loads it. */
        svc_repair_request_rebuild(op->a->repair, op->p);
        undo_then(op, RF_STALE);
        return;
    default:
        svc_health_poke_db(op->a->health);
        undo_then(op, RF_DB_DOWN);
        return;
    }
}

/* ---------------------------------------------------------- pending clears */

/* One SKU's clears waiting on one loop. */
typedef struct clears {
    const svc_product *p;
    char (*id)[DB_ORDER_ID_LEN + 1];
    size_t n, cap;
    int dirty;
    struct clears *next_dirty;
} clears;

typedef struct pending {
    clears **slots;                /* open addressing by product pointer */
    size_t nslots, used;
    clears *dirty;
} pending;

static pending *pending_of(const svc_order_loop *ol) {
    assert(svc_order_loop_owned(ol));
    return svc_order_loop_pending(ol);
}

static size_t slot_of(const pending *pd, const svc_product *p) {
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (pd->nslots - 1);
    while (pd->slots[i] && pd->slots[i]->p != p) i = (i + 1) & (pd->nslots - 1);
    return i;
}

/* p's clears on this loop, made on first use (make: 0 finds only); NULL
 * when there are none, or out of memory. */
static clears *clears_of(pending *pd, const svc_product *p, int make) {
    if (make && pd->used * 2 >= pd->nslots) {
        size_t old = pd->nslots;
        clears **prev = pd->slots, **bigger = calloc(old * 2, sizeof *bigger);
        if (!bigger) return NULL;
        pd->slots = bigger;
        pd->nslots = old * 2;
        for (size_t i = 0; i < old; i++)
            if (prev[i]) pd->slots[slot_of(pd, prev[i]->p)] = prev[i];
        free(prev);
    }
    size_t i = slot_of(pd, p);
    if (!pd->slots[i] && make) {
        if (!(pd->slots[i] = calloc(1, sizeof **pd->slots))) return NULL;
        pd->slots[i]->p = p;
        pd->used++;
    }
    return pd->slots[i];
}

static void clear_later(svc_order_loop *ol, svc_product *p, const char *order_id) {
    pending *pd = pending_of(ol);
    clears *c = clears_of(pd, p, 1);
    if (!c) return;                           /* reconciliation clears it */
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        void *grown = realloc(c->id, cap * sizeof *c->id);
        if (!grown) return;
        c->id = grown;
        c->cap = cap;
    }
    snprintf(c->id[c->n++], sizeof c->id[0], "%s", order_id);
    if (!c->dirty) {
        c->dirty = 1;
        c->next_dirty = pd->dirty;
        pd->dirty = c;
    }
}

size_t svc_pending_peek(svc_order_loop *ol, const svc_product *p, const char **ids, size_t max) {
    clears *c = clears_of(pending_of(ol), p, 0);
    size_t n = c ? (c->n < max ? c->n : max) : 0;
    for (size_t i = 0; i < n; i++) ids[i] = c->id[i];
    return n;
}

void svc_pending_drop(svc_order_loop *ol, const svc_product *p, size_t k) {
    clears *c = clears_of(pending_of(ol), p, 0);
    if (!c || k == 0) return;
    assert(k <= c->n);
    memmove(c->id, c->id + k, (c->n - k) * sizeof *c->id);
    c->n -= k;
}

void svc_pending_loop_flush(svc_order_loop *ol) {
    pending *pd = pending_of(ol);
    const char *ids[1024];
    while (pd->dirty) {
        clears *c = pd->dirty;
        pd->dirty = c->next_dirty;
        c->dirty = 0;
        while (c->n > 0) {
            size_t n = svc_pending_peek(ol, c->p, ids, sizeof ids / sizeof ids[0]);
            size_t taken = stock_async_clear(svc_order_loop_stock(ol), &c->p->sp, ids, n);
            if (!taken) {
                c->n = 0;                     /* not now: reconciliation clears them */
                break;
            }
            svc_pending_drop(ol, c->p, taken);
        }
    }
}

int svc_pending_loop_busy(svc_order_loop *ol) { return pending_of(ol)->dirty != NULL; }

int svc_pending_loop_start(svc_order_loop *ol, char *err, size_t errlen) {
    pending *pd = calloc(1, sizeof *pd);
    if (!pd || !(pd->slots = calloc(16, sizeof *pd->slots))) {
        free(pd);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pd->nslots = 16;
    svc_order_loop_set_pending(ol, pd);
    return 0;
}

void svc_pending_loop_free(svc_order_loop *ol) {
    pending *pd = svc_order_loop_pending(ol);
    if (!pd) return;
    for (size_t i = 0; i < pd->nslots; i++) {
        if (!pd->slots[i]) continue;
        free(pd->slots[i]->id);
        free(pd->slots[i]);
    }
    free(pd->slots);
    free(pd);
    svc_order_loop_set_pending(ol, NULL);
}
