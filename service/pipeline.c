/* pipeline.c: the order path, from a validated request to its answer.
 *
 * An order_op carries one request through three hands, none of which ever
 * waits for another request:
 *
 *   HTTP thread   order_submit: suspend the connection, queue the order
 *   Redis stage   (`lua`) take everything queued, reserve it in one
 *                 pipelined round trip, hand the reserved orders to the
 *                 writer, answer the refused ones (sold out, limit...)
 *     or pool     (strategies that may block: lock, local, unsafe-*,
 *                 db-optimistic's read) one order per thread at a time
 *     or neither  (`db`) straight to the writer, which takes the stock in
 *                 the order's own transaction
 *   DB writer     commit a whole group in one transaction, then (on its
 *                 thread, order_batch_done) answer 201 and queue a CONFIRM
 *                 that clears the pending record, or queue an UNDO that
 *                 gives the units back before the client hears 503.
 *
 * The Redis stage also runs CONFIRMs and UNDOs, pipelined the same way.
 * Every stage and pool thread has its own Redis connection. */
#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "service/service.h"

#define STAGE_BATCH 256

#define OPTIMISTIC_TRIES 20

typedef enum phase {
    PH_RESERVE,        /* Redis stage: batched script */
    PH_RESERVE_ONE,    /* pool: read-check-write strategies */
    PH_DB_READ,        /* pool: db-optimistic reads the version */
    PH_CONFIRM,        /* Redis stage: clear pending records */
    PH_UNDO            /* Redis stage: give units back, then answer */
} phase;

struct order_op {
    app *a;
    http_req *req;                 /* NULL once answered */
    product *p;
    int quantity;
    char order_id[DB_ORDER_ID_LEN + 1];
    char created_at[DB_TIME_LEN + 1];
    char user_id[DB_USER_MAX * 4 + 1];
    char idem_key[DB_KEY_MAX + 1];
    char fingerprint[17];
    stock_req sreq;
    db_job job;
    phase phase;
    /* The answer to give once an UNDO is done. */
    int fail_status;
    const char *fail_code;
    outcome fail_outcome;
    char fail_msg[200];
    int lookup_after_undo;         /* key taken in SQLite: answer as a replay */
    int tries;                     /* db-optimistic: versioned updates tried */
    order_op *next;
};

struct stage {
    app *a;
    pthread_t *threads;
    int nthreads;
    int blocking;                  /* a pool: one op at a time per thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    order_op *head, *tail;
    int stopping;
};

/* ---------------------------------------------------------------- answers */

/* Counts the order's outcome and takes its request, to be answered by the
 * caller. Counted first, so a client that has its answer finds it counted
 * in /metrics. */
static http_req *finish(order_op *op, outcome o) {
    http_req *r = op->req;
    atomic_fetch_add(&op->p->outcomes[o], 1);
    op->req = NULL;
    return r;
}

static void answer_error(order_op *op, int status, const char *code, outcome o, json_t *extra,
                         const char *msg) {
    const char *retry[] = { "Retry-After", "1", NULL };
    http_reply_error_with(finish(op, o), status, code, extra, status == 503 ? retry : NULL, "%s",
                          msg);
}

static json_t *order_json(const db_order *o) {
    return json_pack("{s:s, s:s, s:s, s:i, s:s, s:s}", "order_id", o->order_id, "sku", o->sku,
                     "user_id", o->user_id, "quantity", o->quantity, "status", "confirmed",
                     "created_at", o->created_at);
}

static void answer_order(order_op *op, const db_order *o, int replayed) {
    char location[64];
    snprintf(location, sizeof location, "/v1/orders/%s", o->order_id);
    const char *created[] = { "Location", location, NULL };
    const char *replay[] = { "Location", location, "Idempotent-Replayed", "true", NULL };
    http_reply_json(finish(op, replayed ? OUT_REPLAYED : OUT_CREATED), replayed ? 200 : 201,
                    order_json(o), replayed ? replay : created);
}

/* ------------------------------------------------------------------ queue */

static void stage_push_list(stage *s, order_op *first, order_op *last) {
    if (!first) return;
    last->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = first;
    else s->head = first;
    s->tail = last;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void stage_push(stage *s, order_op *op) { stage_push_list(s, op, op); }

/* Queues op to give its units back, then answer with the failure given. */
static void undo_then_fail(order_op *op, int status, const char *code, outcome o,
                           const char *msg) {
    op->phase = PH_UNDO;
    op->fail_status = status;
    op->fail_code = code;
    op->fail_outcome = o;
    snprintf(op->fail_msg, sizeof op->fail_msg, "%s", msg);
    stage_push(op->a->stage, op);
}

static void submit_lookup(order_op *op, const char *order_id) {
    memset(&op->job, 0, sizeof op->job);
    op->job.kind = DB_JOB_LOOKUP;
    snprintf(op->job.order.order_id, sizeof op->job.order.order_id, "%s", order_id);
    snprintf(op->job.order.idem_key, sizeof op->job.order.idem_key, "%s", op->idem_key);
    db_writer_submit(op->a->writer, &op->job);
}

/* Prepares the order's insert. take says how it gets its stock: DB_TAKE_NONE
 * when Redis reserved it already (under op->sreq.gen). */
static void prepare_insert(order_op *op, db_take take, long long expect_version) {
    db_order *o = &op->job.order;
    memset(&op->job, 0, sizeof op->job);
    op->job.kind = DB_JOB_INSERT;
    op->job.take = take;
    op->job.per_user_limit = take == DB_TAKE_NONE ? 0 : op->p->per_user_limit;
    op->job.expect_version = expect_version;
    memcpy(o->order_id, op->order_id, sizeof o->order_id);
    snprintf(o->sku, sizeof o->sku, "%s", op->p->sku);
    memcpy(o->user_id, op->user_id, sizeof o->user_id);
    o->quantity = op->quantity;
    memcpy(o->idem_key, op->idem_key, sizeof o->idem_key);
    memcpy(o->created_at, op->created_at, sizeof o->created_at);
    o->gen = op->sreq.gen;
}

/* Hands the order to the writer thread. */
static void submit_insert(order_op *op, db_take take, long long expect_version) {
    prepare_insert(op, take, expect_version);
    db_writer_submit(op->a->writer, &op->job);
}

/* ------------------------------------------------------------------ submit */

void order_submit(app *a, http_req *req, product *p, const order_input *in,
                  const char *idem_key) {
    order_op *op = calloc(1, sizeof *op);
    int64_t wall_ms;
    if (!op) {
        http_reply_error(req, 503, "shutting_down", "The service is out of memory.");
        return;
    }
    op->a = a;
    op->req = req;
    op->p = p;
    op->quantity = in->quantity;
    order_id_new(op->order_id, &wall_ms);
    db_format_time(wall_ms, op->created_at);
    snprintf(op->user_id, sizeof op->user_id, "%s", in->user_id);
    snprintf(op->idem_key, sizeof op->idem_key, "%s", idem_key ? idem_key : "");
    order_fingerprint(p->sku, in->user_id, in->quantity, op->fingerprint);
    op->sreq = (stock_req){ .product = &p->sp, .order_id = op->order_id, .user_id = op->user_id,
                            .quantity = op->quantity, .idem_key = op->idem_key,
                            .fingerprint = op->fingerprint };
    http_defer(req);
    switch (stock_strategy_about(p->strategy)->kind) {
    case STOCK_KIND_SCRIPT:
        op->phase = PH_RESERVE;
        stage_push(a->stage, op);
        break;
    case STOCK_KIND_RCW:
        op->phase = PH_RESERVE_ONE;
        stage_push(a->pool, op);
        break;
    case STOCK_KIND_DB_OPTIMISTIC:
        op->phase = PH_DB_READ;
        stage_push(a->pool, op);
        break;
    case STOCK_KIND_DB:
        submit_insert(op, DB_TAKE_CONDITIONAL, 0);
        break;
    }
}

/* ----------------------------------------------------------- Redis stage */

/* Acts on the result of one reservation. Returns 1 when the order was
 * reserved and is the caller's to commit; else it has been dealt with. */
static int reserved(order_op *op) {
    const stock_req *r = &op->sreq;
    char msg[200];
    switch (r->result) {
    case STOCK_RESERVED:
        prepare_insert(op, DB_TAKE_NONE, 0);
        return 1;
    case STOCK_REPLAY:
        if (r->replay_same) {
            submit_lookup(op, r->replay_order_id);
        } else {
            answer_error(op, 422, "idempotency_key_reused", OUT_KEY_REUSED, NULL,
                         "This Idempotency-Key was used for a different request.");
            free(op);
        }
        return 0;
    case STOCK_SOLD_OUT:
        snprintf(msg, sizeof msg, "%s is sold out.", op->p->sku);
        answer_error(op, 409, "sold_out", OUT_SOLD_OUT, json_pack("{s:i}", "available", 0), msg);
        break;
    case STOCK_INSUFFICIENT:
        snprintf(msg, sizeof msg, "Only %lld of %s left; %d asked.", r->available, op->p->sku,
                 op->quantity);
        answer_error(op, 409, "insufficient_stock", OUT_INSUFFICIENT,
                     json_pack("{s:I}", "available", (json_int_t)r->available), msg);
        break;
    case STOCK_LIMIT: {
        char clip[80];
        snprintf(msg, sizeof msg, "User %s may buy at most %lld of %s and has bought %lld.",
                 utf8_clip(clip, sizeof clip, op->user_id), op->p->per_user_limit, op->p->sku, r->available);
        answer_error(op, 409, "per_user_limit", OUT_LIMIT,
                     json_pack("{s:I, s:I}", "per_user_limit", (json_int_t)op->p->per_user_limit,
                               "bought", (json_int_t)r->available),
                     msg);
        break;
    }
    case STOCK_MISSING:
        maint_request_rebuild(op->a->maint, op->p);
        snprintf(msg, sizeof msg,
                 "The stock of %s is being rebuilt from the database (Redis lost it); retry shortly.",
                 op->p->sku);
        answer_error(op, 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE, NULL, msg);
        break;
    case STOCK_LOCK_TIMEOUT:
    case STOCK_FENCED: {
        const char *retry[] = { "Retry-After", "1", NULL };
        if (r->result == STOCK_LOCK_TIMEOUT)
            snprintf(msg, sizeof msg, "Could not get the lock on %s's stock in time; nothing was "
                     "taken. Retry.", op->p->sku);
        else
            snprintf(msg, sizeof msg, "The lock on %s's stock expired before the write, which was "
                     "refused (fenced); nothing was taken. Retry.", op->p->sku);
        http_reply_error_with(finish(op, OUT_LOCK_TIMEOUT), 429, "lock_timeout", NULL, retry, "%s",
                              msg);
        break;
    }
    case STOCK_UNAVAILABLE:
        atomic_fetch_add(&op->a->m.redis_errors, 1);
        if (r->outcome_unknown) {
            /* Redis may have run the script before the connection broke.
             * The order is never committed (it goes no further), and the
             * units go back by maintenance's undo retries (a no-op if the
             * script did not run): trying the undo here first would make
             * the client wait a second timeout on a Redis that just failed
             * to answer one. */
            maint_retry_undo(op->a->maint, op->p, op->order_id, op->idem_key);
            answer_error(op, 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE, NULL,
                         "Redis is unavailable; the order was not placed, and any stock it "
                         "took is given back. Retry shortly.");
            break;
        }
        answer_error(op, 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE, NULL,
                     "Redis is unavailable; no stock was taken. Retry shortly.");
        break;
    }
    free(op);
    return 0;
}

static stock_ref ref_of(const order_op *op) {
    return (stock_ref){ &op->p->sp, op->order_id, op->idem_key };
}

static size_t after_commit(db_job **jobs, size_t n, order_op **confirm);
static void run_confirms(app *a, stock_conn *sc, order_op **ops, size_t n);

/* Reserves a batch in one round trip, commits the reserved orders as one
 * group right here (no hand-off to the writer thread), answers them, and
 * clears their pending records. */
static void run_reserves(app *a, stock_conn *sc, order_op **ops, size_t n) {
    stock_req *reqs[STAGE_BATCH];
    db_job *jobs[STAGE_BATCH];
    order_op *confirm[STAGE_BATCH];
    size_t nj = 0;
    for (size_t i = 0; i < n; i++) reqs[i] = &ops[i]->sreq;
    stock_reserve(sc, reqs, n);
    for (size_t i = 0; i < n; i++)
        if (reserved(ops[i])) jobs[nj++] = &ops[i]->job;
    if (nj == 0) return;
    db_writer_commit_now(a->writer, jobs, nj);
    size_t nc = after_commit(jobs, nj, confirm);
    if (nc) run_confirms(a, sc, confirm, nc);
}

static void run_confirms(app *a, stock_conn *sc, order_op **ops, size_t n) {
    assert(n > 0 && n <= STAGE_BATCH);
    stock_ref refs[n];
    for (size_t i = 0; i < n; i++) refs[i] = ref_of(ops[i]);
    /* On failure the records stay; the sweeper finds the orders committed
     * and clears them. */
    if (stock_confirm(sc, refs, n) != 0) atomic_fetch_add(&a->m.redis_errors, 1);
    for (size_t i = 0; i < n; i++) free(ops[i]);
}

static void run_undos(app *a, stock_conn *sc, order_op **ops, size_t n) {
    stock_ref refs[STAGE_BATCH];
    int done[STAGE_BATCH];
    for (size_t i = 0; i < n; i++) refs[i] = ref_of(ops[i]);
    if (stock_undo(sc, refs, n, done) != 0) atomic_fetch_add(&a->m.redis_errors, 1);
    for (size_t i = 0; i < n; i++) {
        order_op *op = ops[i];
        if (!done[i]) maint_retry_undo(a->maint, op->p, op->order_id, op->idem_key);
        if (op->lookup_after_undo) {
            /* The key names an order already in SQLite (its Redis record
             * was lost): answer as a replay of that order. */
            op->lookup_after_undo = 0;
            submit_lookup(op, "");
            continue;
        }
        answer_error(op, op->fail_status, op->fail_code, op->fail_outcome, NULL, op->fail_msg);
        free(op);
    }
}

static size_t take(stage *s, order_op **out) {
    size_t n = 0, max = s->blocking ? 1 : STAGE_BATCH;
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
    while (s->head && n < max) {
        out[n++] = s->head;
        s->head = s->head->next;
    }
    if (!s->head) s->tail = NULL;
    else pthread_cond_signal(&s->cv);   /* more left: wake a sibling */
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* -------------------------------------------------------------- the pool */

/* db-optimistic, step one: read the stock and its version (outside any
 * transaction, as an application would), then let the writer try the
 * versioned update. */
static void optimistic_read(order_op *op) {
    db *d = app_db(op->a);
    long long available = 0, version = 0;
    char msg[160];
    if (!d || db_stock_read(d, op->p->sku, &available, &version) != DB_OK) {
        atomic_fetch_add(&op->a->m.db_errors, 1);
        answer_error(op, 503, "db_unavailable", OUT_DB_UNAVAILABLE, NULL,
                     "The database is unavailable. Retry shortly.");
        free(op);
        return;
    }
    if (available < op->quantity) {
        if (available > 0)
            snprintf(msg, sizeof msg, "Only %lld of %s left; %d asked.", available, op->p->sku,
                     op->quantity);
        else
            snprintf(msg, sizeof msg, "%s is sold out.", op->p->sku);
        answer_error(op, 409, available ? "insufficient_stock" : "sold_out",
                     available ? OUT_INSUFFICIENT : OUT_SOLD_OUT,
                     json_pack("{s:I}", "available", (json_int_t)available), msg);
        free(op);
        return;
    }
    op->tries++;
    submit_insert(op, DB_TAKE_OPTIMISTIC, version);
}

/* Runs one read-check-write reservation, which may wait for a lock. */
static void reserve_one(app *a, stock_conn *sc, order_op *op) {
    stock_reserve_one(sc, &op->sreq);
    const stock_req *r = &op->sreq;
    if (r->lock_wait_us >= 0) {
        histogram_observe(&a->m.lock_acquire, r->lock_wait_us);
        int o = r->result == STOCK_LOCK_TIMEOUT ? 1
              : r->result == STOCK_UNAVAILABLE && !r->outcome_unknown ? 2 : 0;
        atomic_fetch_add(&a->m.lock_outcomes[o], 1);
    }
    if (reserved(op)) db_writer_submit(a->writer, &op->job);
}

static void *pool_main(void *arg) {
    stage *s = arg;
    pthread_setname_np(pthread_self(), "fs-pool");
    app *a = s->a;
    char err[256];
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    order_op *op;
    assert(sc != NULL);
    while (take(s, &op) > 0) {
        if (op->phase == PH_DB_READ) optimistic_read(op);
        else reserve_one(a, sc, op);
    }
    stock_conn_free(sc);
    return NULL;
}

/* Answers a batch 503 without trying Redis (see stage_main). */
static void refuse_reserves(order_op **ops, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ops[i]->sreq.result = STOCK_UNAVAILABLE;
        ops[i]->sreq.outcome_unknown = 0;
        int to_commit = reserved(ops[i]);
        assert(!to_commit);
        (void)to_commit;
    }
}

static void *stage_main(void *arg) {
    stage *s = arg;
    pthread_setname_np(pthread_self(), "fs-redis");
    app *a = s->a;
    char err[256];
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    order_op *batch[STAGE_BATCH], *reserve[STAGE_BATCH], *confirm[STAGE_BATCH], *undo[STAGE_BATCH];
    int was_down = 0;
    /* After a batch failed by timing out (a stalled Redis), reservations are
     * refused at once for one timeout before Redis is tried again. Without
     * it every batch queued behind a stalled one waits a full timeout of its
     * own; with it no order waits much longer than one timeout for its 503.
     * A quick failure (connection refused: Redis restarting) opens no such
     * window, so recovery is not delayed. */
    int64_t refuse_until_ms = 0;
    const int64_t timeout_ms = a->stock_cfg.timeout_ms;
    assert(sc != NULL);   /* the configuration was checked at start */
    size_t n;
    while ((n = take(s, batch)) > 0) {
        size_t nr = 0, nc = 0, nu = 0;
        for (size_t i = 0; i < n; i++) {
            switch (batch[i]->phase) {
            case PH_RESERVE: reserve[nr++] = batch[i]; break;
            case PH_CONFIRM: confirm[nc++] = batch[i]; break;
            case PH_UNDO: undo[nu++] = batch[i]; break;
            default: assert(!"pool work on the Redis stage");
            }
        }
        uint64_t errors = atomic_load(&a->m.redis_errors);
        if (nr && clock_mono_ms() < refuse_until_ms) {
            refuse_reserves(reserve, nr);
        } else if (nr) {
            atomic_fetch_add(&a->m.reserve_batches, 1);
            atomic_fetch_add(&a->m.reserve_orders, nr);
            int64_t t0 = clock_mono_ms();
            run_reserves(a, sc, reserve, nr);
            int64_t took = clock_mono_ms() - t0;
            if (atomic_load(&a->m.redis_errors) != errors && took >= timeout_ms / 2)
                refuse_until_ms = t0 + took + timeout_ms;
        }
        if (nu) run_undos(a, sc, undo, nu);
        if (nc) run_confirms(a, sc, confirm, nc);
        int down = atomic_load(&a->m.redis_errors) != errors;
        if (down && !was_down) log_msg(LOG_ERROR, "redis: %s", stock_conn_errstr(sc));
        if (!down && was_down) log_msg(LOG_INFO, "redis: reachable again");
        was_down = down;
    }
    stock_conn_free(sc);
    return NULL;
}

stage *stage_start(app *a, int threads, int blocking, char *err, size_t errlen) {
    stage *s = calloc(1, sizeof *s);
    if (!s || !(s->threads = calloc((size_t)threads, sizeof *s->threads))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->a = a;
    s->blocking = blocking;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (s->nthreads = 0; s->nthreads < threads; s->nthreads++) {
        if (pthread_create(&s->threads[s->nthreads], NULL, blocking ? pool_main : stage_main,
                           s) != 0) {
            snprintf(err, errlen, "cannot start %s threads", blocking ? "pool" : "Redis stage");
            stage_stop(s);
            return NULL;
        }
    }
    return s;
}

void stage_stop(stage *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++) pthread_join(s->threads[i], NULL);
    assert(s->head == NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->threads);
    free(s);
}

/* ------------------------------------------------------------- DB writer */

static int same_request(const order_op *op, const db_order *o) {
    return !strcmp(o->sku, op->p->sku) && !strcmp(o->user_id, op->user_id) &&
           o->quantity == op->quantity;
}

static void looked_up(order_op *op) {
    const db_job *j = &op->job;
    if (j->status == DB_OK) {
        if (same_request(op, &j->order)) answer_order(op, &j->order, 1);
        else answer_error(op, 422, "idempotency_key_reused", OUT_KEY_REUSED, NULL,
                          "This Idempotency-Key was used for a different request.");
    } else if (j->status == DB_NOTFOUND) {
        const char *retry[] = { "Retry-After", "1", NULL };
        http_reply_error_with(finish(op, OUT_IN_PROGRESS), 409, "request_in_progress", NULL, retry,
                              "A request with this Idempotency-Key is still being processed; "
                              "retry shortly.");
    } else {
        atomic_fetch_add(&op->a->m.db_errors, 1);
        answer_error(op, 503, "db_unavailable", OUT_DB_UNAVAILABLE, NULL,
                     "The database is unavailable. Retry shortly.");
    }
    free(op);
}

/* The answer to a db strategy's refusal: nothing was reserved in Redis, so
 * there is nothing to give back. */
static void db_refused(order_op *op) {
    const db_job *j = &op->job;
    char msg[200];
    switch (j->status) {
    case DB_NOSTOCK:
        if (j->available <= 0) snprintf(msg, sizeof msg, "%s is sold out.", op->p->sku);
        else snprintf(msg, sizeof msg, "Only %lld of %s left; %d asked.", j->available, op->p->sku,
                      op->quantity);
        answer_error(op, 409, j->available > 0 ? "insufficient_stock" : "sold_out",
                     j->available > 0 ? OUT_INSUFFICIENT : OUT_SOLD_OUT,
                     json_pack("{s:I}", "available", (json_int_t)(j->available > 0 ? j->available : 0)),
                     msg);
        break;
    case DB_LIMIT: {
        char clip[80];
        snprintf(msg, sizeof msg, "User %s may buy at most %lld of %s and has bought %lld.",
                 utf8_clip(clip, sizeof clip, op->user_id), op->p->per_user_limit, op->p->sku, j->available);
        answer_error(op, 409, "per_user_limit", OUT_LIMIT,
                     json_pack("{s:I, s:I}", "per_user_limit", (json_int_t)op->p->per_user_limit,
                               "bought", (json_int_t)j->available),
                     msg);
        break;
    }
    case DB_CONFLICT:
        if (op->tries < OPTIMISTIC_TRIES) {
            op->phase = PH_DB_READ;       /* read the new version, try again */
            stage_push(op->a->pool, op);
            return;
        }
        snprintf(msg, sizeof msg, "The stock of %s changed under %d optimistic updates in a row; "
                 "nothing was taken. Retry.", op->p->sku, op->tries);
        {
            const char *retry[] = { "Retry-After", "1", NULL };
            http_reply_error_with(finish(op, OUT_LOCK_TIMEOUT), 429, "lock_timeout", NULL, retry,
                                  "%s", msg);
        }
        break;
    case DB_DUPKEY:
        submit_lookup(op, "");            /* answer as a replay of the key's order */
        return;
    default:
        atomic_fetch_add(&op->a->m.db_errors, 1);
        answer_error(op, 503, "db_unavailable", OUT_DB_UNAVAILABLE, NULL,
                     j->status == DB_UNKNOWN
                         ? "The database failed while committing the order; check it with "
                           "GET /v1/orders?user_id= before retrying without an Idempotency-Key."
                         : "The database could not commit the order; nothing was taken. Retry shortly.");
        break;
    }
    free(op);
}

/* Acts on the commit of one order; returns op if it is to be confirmed. */
static order_op *committed(order_op *op) {
    if (op->job.take != DB_TAKE_NONE) {
        if (op->job.status != DB_OK) {
            db_refused(op);
            return NULL;
        }
        answer_order(op, &op->job.order, 0);
        free(op);                          /* no pending record to clear */
        return NULL;
    }
    switch (op->job.status) {
    case DB_OK:
        answer_order(op, &op->job.order, 0);
        op->phase = PH_CONFIRM;
        return op;
    case DB_DUPKEY:
        op->lookup_after_undo = 1;
        undo_then_fail(op, 0, NULL, OUT_REPLAYED, "");
        return NULL;
    case DB_UNKNOWN:
        /* Whether it committed is unknown: the pending record stays, and
         * reconciliation settles it against the database later. */
        atomic_fetch_add(&op->a->m.db_errors, 1);
        answer_error(op, 503, "db_unavailable", OUT_DB_UNAVAILABLE, NULL,
                     "The database failed while committing the order; check it with "
                     "GET /v1/orders?user_id= before retrying without an Idempotency-Key.");
        free(op);
        return NULL;
    case DB_STALE:
        undo_then_fail(op, 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE,
                       "The stock copy this order was reserved from was rebuilt or expired "
                       "before the order could be committed; nothing was taken. Retry.");
        return NULL;
    default:
        atomic_fetch_add(&op->a->m.db_errors, 1);
        undo_then_fail(op, 503, "db_unavailable", OUT_DB_UNAVAILABLE,
                       "The database could not commit the order; nothing was taken. Retry shortly.");
        return NULL;
    }
}

/* Acts on a committed group: answers every order, and fills confirm with
 * the ones whose pending records are to be cleared. Returns their number. */
static size_t after_commit(db_job **jobs, size_t n, order_op **confirm) {
    size_t nc = 0;
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        order_op *op = (order_op *)((char *)jobs[i] - offsetof(order_op, job));
        if (jobs[i]->kind == DB_JOB_LOOKUP) {
            looked_up(op);
            continue;
        }
        failed |= jobs[i]->status == DB_ERROR || jobs[i]->status == DB_BUSY;
        order_op *c = committed(op);
        if (c) confirm[nc++] = c;
    }
    if (failed && n) {
        order_op *first = (order_op *)((char *)jobs[0] - offsetof(order_op, job));
        health_poke_db(first->a->health);
    }
    static _Atomic int64_t last_log_us;
    if (failed && clock_mono_us() - atomic_load(&last_log_us) > 1000000) {
        atomic_store(&last_log_us, clock_mono_us());
        log_msg(LOG_ERROR, "database: group commit failed (orders answered 503, stock given back)");
    }
    return nc;
}

void order_batch_done(db_job **jobs, size_t n, void *ud) {
    app *a = ud;
    order_op *confirm[n];
    size_t nc = after_commit(jobs, n, confirm);
    if (nc == 0) return;
    /* One push for the whole group's confirms. */
    for (size_t i = 0; i + 1 < nc; i++) confirm[i]->next = confirm[i + 1];
    stage_push_list(a->stage, confirm[0], confirm[nc - 1]);
}
