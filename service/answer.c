/* answer.c: every answer to an order, from one place.
 *
 * Refusals come from one table (REFUSALS), whichever store refused (Redis
 * or SQLite) and whichever strategy ran: the same situation gets the same
 * status, error code and sentence. The order itself is answered by
 * svc_answer_order, its body written by hand (it is every order's answer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/order.h"


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
                        "The database failed while committing the order; check it with "
                        "GET /v1/orders?user_id= before retrying without an Idempotency-Key." },
    [RF_LOCK_DOWN] = { 503, "lock_unavailable", OUT_LOCK_UNAVAILABLE,
                       "The lock server of %1$s's strategy is unavailable (or not configured on "
                       "this instance); nothing was taken. Retry shortly." },
};

/* Counts the order's outcome under its strategy and takes its request, to
 * be answered by the caller. Counted first, so a client that has its
 * answer finds it counted in /metrics. */
static http_req *finish(svc_order *op, svc_outcome o) {
    http_req *r = op->req;
    atomic_fetch_add_explicit(&op->a->m.orders[op->p->strategy][o], 1, memory_order_relaxed);
    op->req = NULL;
    return r;
}

/* Answers op with refusal rf (n: the number its sentence names; for the
 * 409s also a field of the body) and frees op. */
void svc_refuse(svc_order *op, svc_refusal rf, long long n) {
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
void svc_answer_order(svc_order *op, const db_order *o, int replayed) {
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

