/* pipeline.c: the order path, from a validated request to its answer.
 *
 *   submit      svc_order_submit (here): the order is made (order.c) and
 *               given to its strategy's family (the one of FAMILIES below
 *               that serves the stock module's stock_kind of the strategy)
 *   reserve     the family takes the units:
 *                 script    fam_script.c    batched per SKU on its loop
 *                 lock      fam_lock.c      on the loop owning the lock
 *                 blocking  fam_blocking.c  on a blocking thread
 *                 db        fam_db.c        in the commit itself
 *               a Redis reservation's result becomes a commit or a
 *               refusal in reservation.c
 *   commit      the committer (db/writer.c) commits what is queued as one
 *               group; commit.c sends each order home, one wake per loop
 *   answer      on its home loop the family answers it (order.c), and a
 *               Redis family's pending record is cleared, or its units
 *               given back first (reservation.c)
 *
 * In each event loop turn's SVC_ORDERS_PHASE_RANK phase (common/loop.h) the
 * families flush, in the order of FAMILIES (the lock family first: an
 * order it starts may fail at once and let the next start; then the script
 * batches, which carry their SKU's clears of pending records), then the
 * clears left over (reservation.c); the Redis connections' phase, later in
 * the same turn, has the Redis connections send what they wrote: a batch
 * leaves in the turn that gathered it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/aconn.h"
#include "common/clock.h"
#include "http/http.h"
#include "service/order/commit.h"
#include "service/order/fam_blocking.h"
#include "service/order/fam_db.h"
#include "service/order/fam_lock.h"
#include "service/order/fam_script.h"
#include "service/order/orderloop.h"
#include "service/order/pipeline.h"
#include "service/order/reservation.h"

/* The families: the one table the pipeline walks, in the order their loop
 * hooks run (family.h). The lock family flushes first (an order it starts
 * may fail at once and let the next one start in the same turn), then the
 * script family (whose batches carry their SKU's clears of pending
 * records, before reservation.c's flush sends the ones left); the others
 * keep no per-loop state. Each family names the stock kinds it serves
 * (stock_strategy_about(s)->kind; the stock module's table says each
 * strategy's kind, name, safety, segments and the lock server it needs). */
static svc_family *const FAMILIES[] = {
    &svc_family_lock,
    &svc_family_script,
    &svc_family_blocking,
    &svc_family_db,
};
#define NFAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])
_Static_assert(NFAMILIES <= SVC_FAMILY_SLOTS, "raise SVC_FAMILY_SLOTS (orderloop.h)");

/* The family of each stock kind, made from FAMILIES once (index_families):
 * finding an order's family stays one index. */
static const svc_family *by_kind[STOCK_KIND_COUNT];
static pthread_once_t indexed = PTHREAD_ONCE_INIT;

/* Gives each family its index (the slot of its per-loop state) and fills
 * by_kind, asserting that every kind has exactly one family. */
static void index_families(void) {
    for (size_t i = 0; i < NFAMILIES; i++) {
        svc_family *f = FAMILIES[i];
        assert(f->submit && f->committed);
        f->index = (int)i;
        for (int k = 0; k < STOCK_KIND_COUNT; k++) {
            if (!(f->kinds & 1u << k)) continue;
            assert(!by_kind[k]);
            by_kind[k] = f;
        }
    }
    for (int k = 0; k < STOCK_KIND_COUNT; k++) assert(by_kind[k]);
}

static const svc_family *family_of(stock_kind k) {
    assert(k < STOCK_KIND_COUNT && by_kind[k]);
    return by_kind[k];
}

/* ------------------------------------------------------------------ submit */

/* The calling thread's order loop, or (another thread) one in turn. */
static svc_order_loop *home_for(svc_app *a) {
    static atomic_uint turn;
    svc_order_loop *ol = svc_order_loop_current();
    if (ol) return ol;
    return a->order_loops[atomic_fetch_add(&turn, 1) % (unsigned)a->nloops];
}

int svc_order_submit(svc_app *a, svc_product *p, const svc_order_input *in,
                     const char *idem_key, svc_order_reply_fn *fn, void *ctx) {
    /* Sold out a moment ago: the answer the store would give, from memory.
     * Not for a key (it may be a replay, answered 200) nor with a per-user
     * limit (a buyer at it is told per_user_limit first). */
    if (a->cfg.soldout_cache_ms > 0 && (!idem_key || !idem_key[0]) && p->per_user_limit == 0 &&
        svc_product_soldout_known(p, (int64_t)a->cfg.soldout_cache_ms * 1000)) {
        svc_order_refuse_soldout(a, p, fn, ctx);
        return 0;
    }
    svc_order *op = svc_order_new(a, p, in, idem_key, fn, ctx);
    if (!op) return -1;
    op->home = home_for(a);
    op->fam = family_of(stock_strategy_about(p->strategy)->kind);
    svc_order_to(op, SVC_ORDER_RESERVING);
    op->fam->submit(op);
    return 0;
}

void svc_pipeline_reroute(svc_order *op, stock_kind kind) {
    const svc_family *to = family_of(kind);
    assert(to != op->fam);
    svc_order_to(op, SVC_ORDER_RESERVING);
    op->fam = to;
    to->submit(op);
}

static void run_task(svc_task *t) {
    svc_order *op = (svc_order *)((char *)t - offsetof(svc_order, task));
    svc_order_fn *fn = op->arrive;
    op->arrive = NULL;
    fn(op);
}

void svc_pipeline_run_blocking(svc_order *op, svc_order_fn *fn) {
    op->arrive = fn;
    op->task.run = run_task;
    svc_threadpool_submit(op->a->blocking, &op->task);
}

/* ---------------------------------------------------------------- commits */

void svc_orders_committed(db_job **jobs, size_t n, void *ud) {
    svc_app *a = ud;
    assert(db_writer_on_thread(a->writer));
    svc_commit_done(jobs, n, &a->give_touched);
}

/* ------------------------------------------------------------- the loops */

/* The phases of a turn on the service's loops, each module's own rank: the
 * HTTP server reads the requests that make orders, the order path turns
 * them into commands, the stock module's lane clears take what no batch
 * carried, and the connections write it all: one turn's work leaves in
 * that turn. */
_Static_assert(HTTP_PHASE_RANK < SVC_ORDERS_PHASE_RANK &&
               SVC_ORDERS_PHASE_RANK < STOCK_CLEARS_PHASE_RANK &&
               STOCK_CLEARS_PHASE_RANK < ACONN_PHASE_RANK,
               "the loop phases' order: HTTP, orders, lane clears, writes");

/* The loop's SVC_ORDERS_PHASE_RANK phase: the families send what the turn
 * gathered, then the clears of pending records no batch carried. */
static void flush(loop *l, void *ud) {
    svc_order_loop *ol = ud;
    (void)l;
    for (size_t i = 0; i < NFAMILIES; i++)
        if (FAMILIES[i]->loop_flush) FAMILIES[i]->loop_flush(ol);
    svc_pending_loop_flush(ol);
}

static int loop_busy(svc_order_loop *ol, void *ud) {
    (void)ud;
    for (size_t i = 0; i < NFAMILIES; i++)
        if (FAMILIES[i]->loop_busy && FAMILIES[i]->loop_busy(ol)) return 1;
    return svc_pending_loop_busy(ol);
}

int svc_orders_start(svc_app *a, char *err, size_t errlen) {
    pthread_once(&indexed, index_families);
    a->blocking_stopped = 0;
    if (!(a->blocking = svc_threadpool_start("fs-blocking", a->cfg.lock_workers, err, errlen)))
        return -1;
    if (!(a->order_loops = calloc((size_t)a->nloops, sizeof *a->order_loops))) goto oom;
    for (int i = 0; i < a->nloops; i++) {
        svc_order_loop *ol = svc_order_loop_new(a, a->loops[i], i, err, errlen);
        if (!(a->order_loops[i] = ol)) return -1;
        for (size_t k = 0; k < NFAMILIES; k++)
            if (FAMILIES[k]->loop_start && FAMILIES[k]->loop_start(ol, err, errlen) != 0)
                return -1;
        if (svc_pending_loop_start(ol, err, errlen) != 0) return -1;
        /* Before the Redis connections' phase, whichever was registered
         * first: the batches written here leave in this turn. */
        if (loop_on_phase(a->loops[i], SVC_ORDERS_PHASE_RANK, flush, ol) != 0) {
            snprintf(err, errlen, "cannot attach the order path to its event loop");
            return -1;
        }
        if (svc_order_loop_connect(ol, err, errlen) != 0) return -1;
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

void svc_orders_drain(svc_app *a, int64_t wait_ms) {
    /* The blocking threads first: their orders go to the committer. The
     * handle is cleared by svc_orders_free, once the loops have stopped. */
    svc_threadpool_stop(a->blocking);
    a->blocking_stopped = 1;
    if (!a->order_loops) return;
    /* Then ask each loop, on its own thread, until all are idle. */
    for (int64_t t0 = clock_mono_ms();;) {
        int busy = 0;
        for (int i = 0; i < a->nloops; i++)
            if (a->order_loops[i] && svc_order_loop_busy(a->order_loops[i], loop_busy, NULL) != 0)
                busy = 1;
        if (!busy || clock_mono_ms() - t0 >= wait_ms) break;
        clock_sleep_ms(5);
    }
}

void svc_orders_free(svc_app *a) {
    for (int i = 0; a->order_loops && i < a->nloops; i++) {
        svc_order_loop *ol = a->order_loops[i];
        if (!ol) continue;
        for (size_t k = 0; k < NFAMILIES; k++)
            if (FAMILIES[k]->loop_free) FAMILIES[k]->loop_free(ol);
        svc_pending_loop_free(ol);
        svc_order_loop_free(ol);
    }
    free(a->order_loops);
    a->order_loops = NULL;
    if (!a->blocking_stopped) svc_threadpool_stop(a->blocking);
    a->blocking = NULL;
    a->blocking_stopped = 0;
}

/* ------------------------------------------------------------ strategies */

/* The lock server a strategy needs, its flag and its hint: its row in the
 * lock servers' table (stock_lock_server_about). */
const char *svc_strategy_flag(stock_strategy s) {
    return stock_lock_server_about(stock_strategy_about(s)->locks)->flag;
}

const char *svc_strategy_unavailable(const svc_app *a, stock_strategy s) {
    stock_lock_server srv = stock_strategy_about(s)->locks;
    const stock_lock_server_info *li = stock_lock_server_about(srv);
    if (stock_strategy_about(s)->row_locks && !db_target_row_locks(a->cfg.db_path))
        return "this strategy locks the product's row with SELECT ... FOR UPDATE, which SQLite "
               "does not have: start flashsale with --db postgresql://...";
    return li->flag && !a->stock_cfg.locks[srv] ? li->hint : NULL;
}
