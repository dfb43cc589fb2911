/* order.c: an order's life: made, moved from state to state, answered and
 * freed, all here.
 *
 * Every answer to an order comes from this file: refusals from one table
 * (REFUSALS), whichever store refused (Redis or SQLite) and whichever
 * strategy ran, so the same situation gets the same status, error code and
 * sentence; the order itself as a db_order the caller's reply function
 * turns into a body. Both count the outcome first (a client that has its
 * answer finds it counted in /metrics), then reply, then free the order:
 * this is the one place an order is freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/loop.h"
#include "service/order/order_int.h"

/* ------------------------------------------------------------------ states */

#define TO(s) (1u << (s))

/* The moves of order_int.h's table: ALLOWED[from] has bit `to` set. */
static const unsigned ALLOWED[SVC_ORDER_STATES] = {
    [SVC_ORDER_NEW] = TO(SVC_ORDER_RESERVING),
    [SVC_ORDER_RESERVING] = TO(SVC_ORDER_RESERVING) | TO(SVC_ORDER_COMMITTING) |
                            TO(SVC_ORDER_LOOKING_UP) | TO(SVC_ORDER_ANSWERED),
    [SVC_ORDER_COMMITTING] = TO(SVC_ORDER_ANSWERED) | TO(SVC_ORDER_UNDOING) |
                             TO(SVC_ORDER_LOOKING_UP) | TO(SVC_ORDER_RESERVING) |
                             TO(SVC_ORDER_MARKING),
    [SVC_ORDER_UNDOING] = TO(SVC_ORDER_ANSWERED) | TO(SVC_ORDER_LOOKING_UP),
    [SVC_ORDER_LOOKING_UP] = TO(SVC_ORDER_ANSWERED),
    [SVC_ORDER_MARKING] = TO(SVC_ORDER_ANSWERED),
    [SVC_ORDER_ANSWERED] = 0,
};

int svc_order_may(svc_order_state from, svc_order_state to) {
    return from < SVC_ORDER_STATES && to < SVC_ORDER_STATES && (ALLOWED[from] & TO(to)) != 0;
}

const char *svc_order_state_name(svc_order_state s) {
    static const char *const NAMES[SVC_ORDER_STATES] = {
        "new", "reserving", "committing", "looking-up", "undoing", "marking", "answered",
    };
    return s < SVC_ORDER_STATES ? NAMES[s] : "?";
}

/* ------------------------------------------------------------------- birth */

svc_order *svc_order_new(svc_app *a, svc_product *p, const svc_order_input *in,
                         const char *idem_key, svc_order_reply_fn *fn, void *ctx) {
    /* Not calloc: the op is 1.6 KB, mostly string room, and every field
     * is set here or before it is read. */
    svc_order *op = malloc(sizeof *op);
    int64_t wall_ms;
    if (!op) return NULL;
    op->state = SVC_ORDER_NEW;
    op->a = a;
    op->p = p;
    op->fam = NULL;
    op->home = NULL;
    op->reply = fn;
    op->reply_ctx = ctx;
    op->quantity = in->quantity;
    op->t_in_us = clock_mono_us();
    /* What its buyer waited before it was read: the loop's last turn, as
     * far as it knows (admission.h, "the wait to be read"). */
    loop *l = loop_current();
    op->door_us = l ? loop_turn_us(l) : 0;
    op->adm_strategy = p->strategy;
    svc_admit_enter(&a->adm, op->adm_strategy, op->t_in_us);
    op->undo_then = RF_COUNT;
    op->undo_avail = 0;
    op->arrive = NULL;
    op->next = NULL;
    op->job.kind = DB_JOB_INSERT;
    svc_order_id_new(op->order_id, &wall_ms);
    utc_time_format(wall_ms, op->created_at);
    op->expires_ms = p->hold_seconds > 0 ? wall_ms + (int64_t)p->hold_seconds * 1000 : 0;
    /* Validated lengths: a user id is at most 128 characters (512 bytes),
     * a key at most 128 bytes. */
    size_t ul = strlen(in->user_id), kl = idem_key ? strlen(idem_key) : 0;
    assert(ul < sizeof op->user_id && kl < sizeof op->idem_key);
    memcpy(op->user_id, in->user_id, ul + 1);
    memcpy(op->idem_key, idem_key ? idem_key : "", kl + 1);
    svc_order_fingerprint(p->sku, in->user_id, in->quantity, op->fingerprint);
    op->sreq = (stock_req){ .product = &p->sp, .order_id = op->order_id, .user_id = op->user_id,
                            .quantity = op->quantity, .idem_key = op->idem_key,
                            .fingerprint = op->fingerprint,
                            .want_takes = p->hold_seconds > 0 || p->sp.lanes };
    return op;
}

/* ----------------------------------------------------------------- answers */

/* One row per situation: status, API code, the outcome counted, and the
 * sentence: %1$s the SKU, %2$lld the number that goes with the situation,
 * %3$d the units asked, %4$lld the per-user limit (positional printf: a
 * sentence naming one of them names every one before it too). */
static const struct {
    int status;
    const char *code;
    svc_outcome out;
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
    [RF_FENCED] = { 429, "lock_timeout", OUT_FENCED,
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
                        "The database did not confirm the order's commit in time; the order "
                        "is revoked once it answers, and nothing is taken. Retry shortly." },
    [RF_LOCK_DOWN] = { 503, "lock_unavailable", OUT_LOCK_UNAVAILABLE,
                       "The lock server of %1$s's strategy is unavailable (or not configured on "
                       "this instance); nothing was taken. Retry shortly." },
    [RF_DB_BUSY] = { 503, "overloaded", OUT_DB_BUSY,
                     "Every database connection of this instance stayed in use; the order "
                     "was not taken. Retry after Retry-After seconds." },
};

int svc_refusal_status(svc_refusal rf) {
    assert(rf < RF_COUNT);
    return REFUSALS[rf].status;
}

const char *svc_refusal_code(svc_refusal rf) {
    assert(rf < RF_COUNT);
    return REFUSALS[rf].code;
}

/* Writes a sold-out refusal's body into buf (cap bytes) and points r at
 * it: the same JSON the error path builds, without building it (a SKU is
 * [A-Za-z0-9._-], nothing to escape). */
static void sold_out_body(svc_reply *r, const svc_product *p, char *buf, size_t cap) {
    static const char HEAD[] = "{\"error\":\"sold_out\",\"message\":\"",
                      TAIL[] = " is sold out.\",\"available\":0}\n";
    size_t n = strlen(p->sku);
    assert(sizeof HEAD - 1 + n + sizeof TAIL - 1 < cap);
    (void)cap;
    memcpy(buf, HEAD, sizeof HEAD - 1);
    memcpy(buf + sizeof HEAD - 1, p->sku, n);
    memcpy(buf + sizeof HEAD - 1 + n, TAIL, sizeof TAIL);
    r->body = buf;
    r->body_len = sizeof HEAD - 1 + n + sizeof TAIL - 1;
}

/* The one free of an order, and of what its reservation kept; its place
 * in the order path is given back (admission.h). */
static void order_free(svc_order *op) {
    svc_admit_leave(&op->a->adm, op->adm_strategy, clock_mono_us() - op->t_in_us + op->door_us);
    free(op->sreq.takes);
    free(op);
}

/* Counts the order's outcome under its strategy and moves it to ANSWERED:
 * counted first, so a client that has its answer finds it counted. */
static void finish(svc_order *op, svc_outcome o) {
    atomic_fetch_add_explicit(&op->a->m.orders[op->p->strategy][o], 1, memory_order_relaxed);
    svc_order_to(op, SVC_ORDER_ANSWERED);
}

void svc_order_refuse(svc_order *op, svc_refusal rf, long long n) {
    char message[320];
    assert(rf < RF_COUNT);
    svc_reply r = { .status = REFUSALS[rf].status, .outcome = REFUSALS[rf].out,
                    .code = REFUSALS[rf].code, .message = message };
    char body[160];
    if (rf == RF_SOLD_OUT)              /* the spike's commonest answer: no jansson */
        sold_out_body(&r, op->p, body, sizeof body);
    else if (rf == RF_INSUFFICIENT)
        r.extra = json_pack("{s:I}", "available", (json_int_t)(n > 0 ? n : 0));
    else if (rf == RF_LIMIT)
        r.extra = json_pack("{s:I, s:I}", "per_user_limit", (json_int_t)op->p->per_user_limit,
                            "bought", (json_int_t)n);
    if (r.status == 503 || r.status == 429 || rf == RF_IN_PROGRESS) r.retry_after_s = 1;
    if (r.outcome == OUT_REDIS_UNAVAILABLE) atomic_fetch_add(&op->a->m.redis_errors, 1);
    if (r.outcome == OUT_DB_UNAVAILABLE) atomic_fetch_add(&op->a->m.db_errors, 1);
    snprintf(message, sizeof message, REFUSALS[rf].fmt, op->p->sku, n, op->quantity,
             (long long)op->p->per_user_limit);
    if (rf == RF_SOLD_OUT) svc_product_soldout_mark(op->p);   /* the store said: nothing left */
    finish(op, r.outcome);
    op->reply(op->reply_ctx, &r);
    order_free(op);
}

void svc_order_refuse_soldout(svc_app *a, svc_product *p, svc_order_reply_fn *fn, void *ctx) {
    char body[160];
    svc_reply r = { .status = 409, .outcome = OUT_SOLD_OUT, .code = "sold_out" };
    sold_out_body(&r, p, body, sizeof body);   /* the message is in it */
    atomic_fetch_add_explicit(&a->m.orders[p->strategy][OUT_SOLD_OUT], 1, memory_order_relaxed);
    fn(ctx, &r);
}

void svc_order_answer(svc_order *op, const db_order *o, int replayed) {
    if (!replayed) svc_product_changed(op->p);  /* a product read here shows it */
    svc_reply r = { .status = replayed ? 200 : 201,
                    .outcome = replayed ? OUT_REPLAYED : OUT_CREATED, .order = o };
    finish(op, r.outcome);
    op->reply(op->reply_ctx, &r);
    order_free(op);
}
