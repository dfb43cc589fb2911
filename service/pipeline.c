/* pipeline.c: the order path, from a validated request to its answer.
 *
 * An order_op carries one request. Where it goes depends on how its
 * product's strategy takes stock (strategies.c says which strategy is
 * which):
 *
 *   script    (`lua`) on the event loop that received the request: the
 *             loop's orders of one iteration are reserved per SKU in one
 *             script call on the loop's own Redis connection (orderloop.c);
 *             the reserved ones go to the committer in one hand-off
 *   rcw       (lock, local, unsafe-*) on a pool thread, one order at a
 *             time, since its strategy may wait for a lock
 *   db        straight to the committer, which takes the stock in the
 *             order's own transaction (db-optimistic reads its version on
 *             a pool thread first)
 *
 *   committer (db/writer.c) commits everything queued as one group (one
 *             fsync), then hands each order back to its home loop: one
 *             wake per loop per group. There the 201 is sent and the
 *             order's pending record is queued to be cleared in the next
 *             script call; or, when the commit failed, the units go back
 *             (undo.lua) before the client hears why.
 *
 * Every refusal is answered from one table (REFUSALS), whichever store
 * refused: the same situation gets the same status, code and sentence. */
#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "service/orderloop.h"

#define OPTIMISTIC_TRIES 20

/* --------------------------------------------------------------- refusals */

typedef enum refusal {
    RF_SOLD_OUT, RF_INSUFFICIENT, RF_LIMIT, RF_KEY_REUSED, RF_IN_PROGRESS, RF_LOCK_TIMEOUT,
    RF_FENCED, RF_CONFLICT, RF_REBUILDING, RF_REDIS_DOWN, RF_REDIS_DOWN_TAKEN, RF_STALE,
    RF_DB_DOWN, RF_DB_UNKNOWN, RF_COUNT
} refusal;

/* One row per situation: status, API code, the outcome counted, and the
 * sentence: %1$s the SKU, %2$lld the number that goes with the situation,
 * %3$d the units asked, %4$lld the per-user limit (positional printf: a
 * sentence naming one of them names every one before it too). */
static const struct {
    int status;
    const char *code;
    outcome out;
    const char *fmt;
} REFUSALS[RF_COUNT] = {
    [RF_SOLD_OUT] = { 409, "sold_out", OUT_SOLD_OUT, "%1$s is sold out." },
    [RF_INSUFFICIENT] = { 409, "insufficient_stock", OUT_INSUFFICIENT,
                          "Only %2$lld of %1$s left; %3$d asked." },
    [RF_LIMIT] = { 409, "per_user_limit", OUT_LIMIT,
                   "This user may buy %1$s up to %4$lld units, has bought %2$lld, and "
                   "asked for %3$d more." },
    [RF_KEY_REUSED] = { 422, "idempotency_key_reused", OUT_KEY_REUSED,
                        "This Idempotency-Key was used for a different request." },
    [RF_IN_PROGRESS] = { 409, "request_in_progress", OUT_IN_PROGRESS,
                         "A request with this Idempotency-Key is still being processed; retry "
                         "shortly." },
    [RF_LOCK_TIMEOUT] = { 429, "lock_timeout", OUT_LOCK_TIMEOUT,
                          "Could not get the lock on %1$s's stock in time; nothing was taken. "
                          "Retry." },
    [RF_FENCED] = { 429, "lock_timeout", OUT_LOCK_TIMEOUT,
                    "The lock on %1$s's stock expired before the write, which was refused "
                    "(fenced); nothing was taken. Retry." },
    [RF_CONFLICT] = { 429, "lock_timeout", OUT_CONFLICT,
                      "The stock of %1$s changed under %2$lld optimistic updates in a row; "
                      "nothing was taken. Retry." },
    [RF_REBUILDING] = { 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE,
                        "The stock of %1$s is being rebuilt from the database (Redis lost it); "
                        "retry shortly." },
    [RF_REDIS_DOWN] = { 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE,
                        "Redis is unavailable; no stock was taken. Retry shortly." },
    [RF_REDIS_DOWN_TAKEN] = { 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE,
                              "Redis is unavailable; the order was not placed, and any stock it "
                              "took is given back. Retry shortly." },
    [RF_STALE] = { 503, "redis_unavailable", OUT_REDIS_UNAVAILABLE,
                   "The stock copy this order was reserved from was rebuilt or expired before "
                   "the order could be committed; nothing was taken. Retry." },
    [RF_DB_DOWN] = { 503, "db_unavailable", OUT_DB_UNAVAILABLE,
                     "The database could not commit the order; nothing was taken. Retry "
                     "shortly." },
    [RF_DB_UNKNOWN] = { 503, "db_unavailable", OUT_DB_UNAVAILABLE,
                        "The database failed while committing the order; check it with "
                        "GET /v1/orders?user_id= before retrying without an Idempotency-Key." },
};

/* Counts the order's outcome and takes its request, to be answered by the
 * caller. Counted first, so a client that has its answer finds it counted
 * in /metrics. */
static http_req *finish(order_op *op, outcome o) {
    http_req *r = op->req;
    atomic_fetch_add(&op->p->outcomes[o], 1);
    op->req = NULL;
    return r;
}

/* Answers op with refusal rf (n: the number its sentence names; for the
 * 409s also a field of the body) and frees op. */
static void refuse(order_op *op, refusal rf, long long n) {
    const char *retry[] = { "Retry-After", "1", NULL };
    json_t *extra = NULL;
    if (rf == RF_SOLD_OUT || rf == RF_INSUFFICIENT)
        extra = json_pack("{s:I}", "available", (json_int_t)(n > 0 ? n : 0));
    else if (rf == RF_LIMIT)
        extra = json_pack("{s:I, s:I}", "per_user_limit", (json_int_t)op->p->per_user_limit,
                          "bought", (json_int_t)n);
    if (REFUSALS[rf].out == OUT_REDIS_UNAVAILABLE) atomic_fetch_add(&op->a->m.redis_errors, 1);
    if (REFUSALS[rf].out == OUT_DB_UNAVAILABLE) atomic_fetch_add(&op->a->m.db_errors, 1);
    int status = REFUSALS[rf].status;
    http_reply_error_with(finish(op, REFUSALS[rf].out), status, REFUSALS[rf].code, extra,
                          status == 503 || status == 429 || rf == RF_IN_PROGRESS ? retry : NULL,
                          REFUSALS[rf].fmt, op->p->sku, n, op->quantity,
                          (long long)op->p->per_user_limit);
    free(op);
}

/* Appends s to p as the body of a JSON string; returns the new end. The
 * user id is the one field that may need escaping (it is valid UTF-8,
 * checked on the way in, and is copied as such). */
static char *json_escape(char *p, const char *s) {
    static const char HEX[] = "0123456789abcdef";
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *p++ = '\\';
            *p++ = (char)*c;
        } else if (*c < 0x20) {
            memcpy(p, "\\u00", 4);
            p[4] = HEX[*c >> 4];
            p[5] = HEX[*c & 15];
            p += 6;
        } else {
            *p++ = (char)*c;
        }
    }
    return p;
}

/* Answers with the order. The body is written here rather than through
 * jansson: it is the answer to every order, and its fields are known (ids,
 * SKU and time are plain ASCII by construction). */
static void answer_order(order_op *op, const db_order *o, int replayed) {
    char location[64];
    memcpy(location, "/v1/orders/", 11);
    memcpy(location + 11, o->order_id, sizeof o->order_id);
    const char *created[] = { "Location", location, NULL };
    const char *replay[] = { "Location", location, "Idempotent-Replayed", "true", NULL };
    http_req *r = finish(op, replayed ? OUT_REPLAYED : OUT_CREATED);
    char *body = malloc(160 + strlen(o->sku) + 6 * strlen(o->user_id));
    if (!body) {
        http_reply_json(r, 503, NULL, NULL);          /* the fixed 500 answer */
        return;
    }
    char *p = body;
    p += sprintf(p, "{\"order_id\":\"%s\",\"sku\":\"%s\",\"user_id\":\"", o->order_id, o->sku);
    p = json_escape(p, o->user_id);
    p += sprintf(p, "\",\"quantity\":%d,\"status\":\"confirmed\",\"created_at\":\"%s\"}\n",
                 o->quantity, o->created_at);
    http_reply_take(r, replayed ? 200 : 201, "application/json; charset=utf-8", body,
                    (size_t)(p - body), replayed ? replay : created);
}

/* ------------------------------------------------------------ db hand-off */

static void prepare_lookup(order_op *op, const char *order_id) {
    memset(&op->job, 0, sizeof op->job);
    op->job.kind = DB_JOB_LOOKUP;
    snprintf(op->job.order.order_id, sizeof op->job.order.order_id, "%s", order_id);
    snprintf(op->job.order.idem_key, sizeof op->job.order.idem_key, "%s", op->idem_key);
}

/* Prepares the order's insert. take says how it gets its stock: DB_TAKE_NONE
 * when Redis reserved it already (under op->sreq.gen). Field by field, the
 * strings by their length: this runs for every order. */
static void prepare_insert(order_op *op, db_take take, long long expect_version) {
    db_job *j = &op->job;
    db_order *o = &j->order;
    j->kind = DB_JOB_INSERT;
    j->take = take;
    j->per_user_limit = take == DB_TAKE_NONE ? 0 : op->p->per_user_limit;
    j->expect_version = expect_version;
    j->status = DB_OK;
    j->available = 0;
    j->next = NULL;
    memcpy(o->order_id, op->order_id, sizeof o->order_id);
    memcpy(o->sku, op->p->sku, strlen(op->p->sku) + 1);
    memcpy(o->user_id, op->user_id, strlen(op->user_id) + 1);
    o->quantity = op->quantity;
    memcpy(o->idem_key, op->idem_key, strlen(op->idem_key) + 1);
    memcpy(o->created_at, op->created_at, sizeof o->created_at);
    o->gen = op->sreq.gen;
}

/* -------------------------------------------------------- reservation results */

int order_reserved(order_op *op) {
    const stock_req *r = &op->sreq;
    switch (r->result) {
    case STOCK_RESERVED:
        prepare_insert(op, DB_TAKE_NONE, 0);
        return 1;
    case STOCK_REPLAY:
        if (!r->replay_same) {
            refuse(op, RF_KEY_REUSED, 0);
            return 0;
        }
        prepare_lookup(op, r->replay_order_id);   /* answered once the db has looked */
        return 1;
    case STOCK_SOLD_OUT:
        refuse(op, RF_SOLD_OUT, 0);
        return 0;
    case STOCK_INSUFFICIENT:
        refuse(op, RF_INSUFFICIENT, r->available);
        return 0;
    case STOCK_LIMIT:
        refuse(op, RF_LIMIT, r->available);
        return 0;
    case STOCK_MISSING:
        maint_request_rebuild(op->a->maint, op->p);
        refuse(op, RF_REBUILDING, 0);
        return 0;
    case STOCK_LOCK_TIMEOUT:
        refuse(op, RF_LOCK_TIMEOUT, 0);
        return 0;
    case STOCK_FENCED:
        refuse(op, RF_FENCED, 0);
        return 0;
    case STOCK_UNAVAILABLE:
        if (r->outcome_unknown) {
            /* Redis may have run the script before the connection broke.
             * The order is never committed (it goes no further), and the
             * units go back by maintenance's undo retries (a no-op if the
             * script did not run): trying the undo here first would make
             * the client wait a second timeout on a Redis that just failed
             * to answer one. */
            maint_retry_undo(op->a->maint, op->p, op->order_id, op->idem_key);
            refuse(op, RF_REDIS_DOWN_TAKEN, 0);
        } else {
            refuse(op, RF_REDIS_DOWN, 0);
        }
        return 0;
    }
    assert(!"unknown stock result");
    return 0;
}

/* --------------------------------------------------------------- commits */

static int same_request(const order_op *op, const db_order *o) {
    return !strcmp(o->sku, op->p->sku) && !strcmp(o->user_id, op->user_id) &&
           o->quantity == op->quantity;
}

/* A replay's lookup is done. */
static void looked_up(order_op *op) {
    const db_job *j = &op->job;
    if (j->status == DB_OK && same_request(op, &j->order)) {
        answer_order(op, &j->order, 1);
        free(op);
    } else if (j->status == DB_OK) {
        refuse(op, RF_KEY_REUSED, 0);
    } else if (j->status == DB_NOTFOUND) {
        refuse(op, RF_IN_PROGRESS, 0);
    } else {
        health_poke_db(op->a->health);
        refuse(op, RF_DB_DOWN, 0);
    }
}

/* A db strategy's order came back refused: nothing was reserved in Redis,
 * so there is nothing to give back. */
static void db_refused(order_op *op) {
    const db_job *j = &op->job;
    switch (j->status) {
    case DB_NOSTOCK:
        refuse(op, j->available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, j->available);
        return;
    case DB_LIMIT:
        refuse(op, RF_LIMIT, j->available);
        return;
    case DB_CONFLICT:
        if (op->tries < OPTIMISTIC_TRIES) {
            op->phase = PH_DB_READ;       /* read the new version, try again */
            stage_push(op->a->pool, op);
            return;
        }
        refuse(op, RF_CONFLICT, op->tries);
        return;
    case DB_DUPKEY:
        prepare_lookup(op, "");           /* answer as a replay of the key's order */
        db_writer_submit(op->a->writer, &op->job);
        return;
    default:
        health_poke_db(op->a->health);
        refuse(op, j->status == DB_UNKNOWN ? RF_DB_UNKNOWN : RF_DB_DOWN, 0);
        return;
    }
}

/* The units of a reservation that will not commit are back (or will be,
 * by maintenance's retries): now answer as the commit failed. */
static void undone(void *ud, int done) {
    order_op *op = ud;
    if (!done) maint_retry_undo(op->a->maint, op->p, op->order_id, op->idem_key);
    if (op->lookup_after_undo) {
        /* The key names an order already in SQLite (its Redis record was
         * lost): answer as a replay of that order. */
        op->lookup_after_undo = 0;
        prepare_lookup(op, "");
        db_writer_submit(op->a->writer, &op->job);
        return;
    }
    refuse(op, op->fail, 0);
}

static void undo_then_refuse(order_op *op, refusal rf) {
    stock_ref ref = { &op->p->sp, op->order_id, op->idem_key };
    op->fail = rf;
    order_loop_undo(op->home, &ref, undone, op);
}

void order_committed(order_op *op) {
    if (op->job.kind == DB_JOB_LOOKUP) {
        looked_up(op);
        return;
    }
    if (op->job.take != DB_TAKE_NONE) {          /* a db strategy's own take */
        if (op->job.status != DB_OK) {
            db_refused(op);
            return;
        }
        answer_order(op, &op->job.order, 0);
        free(op);                                /* no pending record to clear */
        return;
    }
    switch (op->job.status) {
    case DB_OK:
        answer_order(op, &op->job.order, 0);
        order_loop_clear(op->home, op->p, op->order_id);
        free(op);
        return;
    case DB_DUPKEY:
        op->lookup_after_undo = 1;
        undo_then_refuse(op, RF_KEY_REUSED);
        return;
    case DB_UNKNOWN:
        /* Whether it committed is unknown: the pending record stays, and
         * reconciliation settles it against the database later. */
        health_poke_db(op->a->health);
        refuse(op, RF_DB_UNKNOWN, 0);
        return;
    case DB_STALE:
        undo_then_refuse(op, RF_STALE);
        return;
    default:
        health_poke_db(op->a->health);
        undo_then_refuse(op, RF_DB_DOWN);
        return;
    }
}

/* The committer's callback, on its thread: every order goes home. */
void order_batch_done(db_job **jobs, size_t n, void *ud) {
    app *a = ud;
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        order_op *op = (order_op *)((char *)jobs[i] - offsetof(order_op, job));
        failed |= jobs[i]->kind == DB_JOB_INSERT &&
                  (jobs[i]->status == DB_ERROR || jobs[i]->status == DB_BUSY);
        order_loop_give(op->home, op);
    }
    order_loop_give_done(a);
    static _Atomic int64_t last_log_us;
    if (failed && clock_mono_us() - atomic_load(&last_log_us) > 1000000) {
        atomic_store(&last_log_us, clock_mono_us());
        log_msg(LOG_ERROR, "database: group commit failed (orders answered 503, stock given back)");
    }
}

/* ------------------------------------------------------------------ submit */

void order_submit(app *a, http_req *req, product *p, const order_input *in,
                  const char *idem_key) {
    /* Not calloc: the op is 1.6 KB, mostly string room, and every field
     * is set below or before it is read. */
    order_op *op = malloc(sizeof *op);
    int64_t wall_ms;
    if (!op) {
        const char *retry[] = { "Retry-After", "1", NULL };
        http_reply_error_with(req, 503, "shutting_down", NULL, retry,
                              "The service is out of memory; retry shortly.");
        return;
    }
    op->a = a;
    op->req = req;
    op->p = p;
    op->home = order_loop_home(a);
    op->quantity = in->quantity;
    op->phase = PH_RESERVE_ONE;
    op->fail = 0;
    op->lookup_after_undo = 0;
    op->tries = 0;
    op->next = NULL;
    op->job.kind = DB_JOB_INSERT;
    order_id_new(op->order_id, &wall_ms);
    db_format_time(wall_ms, op->created_at);
    /* Validated lengths: a user id is at most 128 characters (512 bytes),
     * a key at most 128 bytes. */
    size_t ul = strlen(in->user_id), kl = idem_key ? strlen(idem_key) : 0;
    assert(ul < sizeof op->user_id && kl < sizeof op->idem_key);
    memcpy(op->user_id, in->user_id, ul + 1);
    memcpy(op->idem_key, idem_key ? idem_key : "", kl + 1);
    order_fingerprint(p->sku, in->user_id, in->quantity, op->fingerprint);
    op->sreq = (stock_req){ .product = &p->sp, .order_id = op->order_id, .user_id = op->user_id,
                            .quantity = op->quantity, .idem_key = op->idem_key,
                            .fingerprint = op->fingerprint };
    http_defer(req);
    switch (stock_strategy_about(p->strategy)->kind) {
    case STOCK_KIND_SCRIPT:
        order_loop_reserve(op->home, op);
        break;
    case STOCK_KIND_RCW:
        /* `lock`: on the loops, two round trips and no thread waiting;
         * the others here (and `lock` orders no one segment can hold) on
         * the pool. */
        if (p->strategy == STOCK_LOCK && lock_submit(a, op) == 0) break;
        op->phase = PH_RESERVE_ONE;
        stage_push(a->pool, op);
        break;
    case STOCK_KIND_DB_OPTIMISTIC:
        op->phase = PH_DB_READ;
        stage_push(a->pool, op);
        break;
    case STOCK_KIND_DB:
        prepare_insert(op, DB_TAKE_CONDITIONAL, 0);
        db_writer_submit(a->writer, &op->job);
        break;
    }
}

/* -------------------------------------------------------------- the pool */

/* Strategies that may block run here, one order per thread at a time. */
struct stage {
    app *a;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    order_op *head, *tail;
    int stopping;
};

void stage_push(stage *s, order_op *op) {
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static order_op *take(stage *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
    order_op *op = s->head;
    if (op && !(s->head = op->next)) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return op;
}

/* db-optimistic, step one: read the stock and its version (outside any
 * transaction, as an application would), then let the committer try the
 * versioned update. */
static void optimistic_read(order_op *op) {
    db *d = app_db(op->a);
    long long available = 0, version = 0;
    if (!d || db_stock_read(d, op->p->sku, &available, &version) != DB_OK) {
        health_poke_db(op->a->health);
        refuse(op, RF_DB_DOWN, 0);
        return;
    }
    if (available < op->quantity) {
        refuse(op, available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, available);
        return;
    }
    op->tries++;
    prepare_insert(op, DB_TAKE_OPTIMISTIC, version);
    db_writer_submit(op->a->writer, &op->job);
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
    if (order_reserved(op)) db_writer_submit(a->writer, &op->job);
}

static void *pool_main(void *arg) {
    stage *s = arg;
    pthread_setname_np(pthread_self(), "fs-pool");
    app *a = s->a;
    char err[256];
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    order_op *op;
    assert(sc != NULL);   /* the configuration was checked at start */
    while ((op = take(s)) != NULL) {
        if (op->phase == PH_DB_READ) optimistic_read(op);
        else reserve_one(a, sc, op);
    }
    stock_conn_free(sc);
    return NULL;
}

stage *stage_start(app *a, int threads, char *err, size_t errlen) {
    stage *s = calloc(1, sizeof *s);
    if (!s || !(s->threads = calloc((size_t)threads, sizeof *s->threads))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->a = a;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (s->nthreads = 0; s->nthreads < threads; s->nthreads++) {
        if (pthread_create(&s->threads[s->nthreads], NULL, pool_main, s) != 0) {
            snprintf(err, errlen, "cannot start the pool's threads");
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
