/* orders.c: the order routes -- POST /v1/orders into the order path, the
 * reads of orders, and a hold's confirm and cancel (holds/holds.h). See
 * api_int.h for what the API's files share. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/utf8.h"
#include "service/api/api_int.h"
#include "service/holds/holds.h"
#include "service/log.h"
#include "service/order/order.h"
#include "service/products.h"
#include "service/room/room.h"

/* ------------------------------------------------------------------- orders */

/* Writes a hold's fields (after "status") at p: the deadline and, once it
 * ended, when and how. Returns the new end. */
static char *hold_fields(char *p, const db_order *o) {
    char t[UTC_TIME_LEN + 1];
    static const char *const WHEN[] = { "confirmed_at", "", "cancelled_at", "expired_at" };
    if (!o->expires_ms) return p;
    utc_time_format(o->expires_ms, t);
    p += sprintf(p, ",\"expires_at\":\"%s\"", t);
    if (o->decided_ms) {
        utc_time_format(o->decided_ms, t);
        p += sprintf(p, ",\"%s\":\"%s\"", WHEN[o->status], t);
    }
    if (o->payment_ref[0]) {
        p += sprintf(p, ",\"payment_ref\":\"");
        p = api_json_escape(p, o->payment_ref);
        *p++ = '"';
    }
    return p;
}

/* Answers with the order. The body is written here rather than through
 * jansson: it is the answer to every order, and its fields are known (ids,
 * SKU and time are plain ASCII by construction). */
static void reply_order(http_req *r, const db_order *o, int status, long long position) {
    char location[64];
    memcpy(location, "/v1/orders/", 11);
    memcpy(location + 11, o->order_id, sizeof o->order_id);
    const char *created[] = { "Location", location, NULL };
    const char *replay[] = { "Location", location, "Idempotent-Replayed", "true", NULL };
    char *body = malloc(352 + strlen(o->sku) + 6 * strlen(o->user_id) +
                        6 * strlen(o->payment_ref));
    if (!body) {
        http_reply_json(r, 500, NULL, NULL);   /* no memory for the body: the fixed 500 */
        return;
    }
    char *p = body;
    p += sprintf(p, "{\"order_id\":\"%s\",\"sku\":\"%s\",\"user_id\":\"", o->order_id, o->sku);
    p = api_json_escape(p, o->user_id);
    p += sprintf(p, "\",\"quantity\":%d,\"status\":\"%s\",\"created_at\":\"%s\"", o->quantity,
                 db_order_status_name(o->status), o->created_at);
    p = hold_fields(p, o);
    if (position > 0) p += sprintf(p, ",\"position\":%lld", position);
    memcpy(p, "}\n", 2);
    p += 2;
    http_reply_take(r, status, "application/json; charset=utf-8", body, (size_t)(p - body),
                    status == 200 ? replay : created);
}

/* The order path's answer as HTTP; position > 0: the room's place it was
 * sold in, said beside the order. */
static void reply_with(http_req *r, const svc_reply *rep, long long position) {
    if (rep->order) {
        reply_order(r, rep->order, rep->status, position);
        return;
    }
    if (rep->body) {
        assert(rep->extra == NULL && rep->retry_after_s == 0);
        http_reply_error_json(r, rep->status, rep->code, rep->body, rep->body_len, NULL);
        return;
    }
    char secs[16];
    const char *retry[] = { "Retry-After", secs, NULL };
    snprintf(secs, sizeof secs, "%d", rep->retry_after_s);
    http_reply_error_with(r, rep->status, rep->code, rep->extra,
                          rep->retry_after_s > 0 ? retry : NULL, "%s", rep->message);
}

/* The order path's answer to an order, as HTTP (ctx: the request). */
static void reply_to_order(void *ctx, const svc_reply *rep) { reply_with(ctx, rep, 0); }

/* An order of a product with a waiting room, in its ticket's turn: its
 * final answer frees its place (room/room.h, svc_room_done). */
typedef struct room_order {
    http_req *r;
    svc_room *room;
    long long position;
} room_order;

static void reply_to_room_order(void *ctx, const svc_reply *rep) {
    room_order *ro = ctx;
    if (rep->status < 500 && rep->status != 429) svc_room_done(ro->room, ro->position);
    reply_with(ro->r, rep, ro->position);
    free(ro);
}

/* The answer past an admission limit (order/admission.h), written once:
 * at the door nothing of the request is parsed; in any case nothing was
 * taken, so the buyer may simply retry. */
static const char OVERLOADED[] =
    "{\"error\":\"overloaded\",\"message\":\"The service has as many orders in progress as "
    "it can answer in time; this one was not taken. Retry after Retry-After seconds.\"}\n";

static void reply_overloaded(http_req *r) {
    const char *h[] = { "Retry-After", "1", NULL };
    http_reply_error_json(r, 503, "overloaded", OVERLOADED, sizeof OVERLOADED - 1, h);
}

/* The same for an order in its ticket's turn: its place keeps its unit
 * until the turn ends, and the room lets in no one else meanwhile, so the
 * path needs this buyer back soon, not in a whole Retry-After second --
 * when every buyer shed came back a second later at once, most were shed
 * again, and a sale past capacity sold in waves a second apart. It comes
 * back after one to two latency targets (jittered: not all at once). */
static void reply_overloaded_in_turn(http_req *r, const svc_app *a, const char *ticket) {
    unsigned char j = 128;
    if (getrandom(&j, 1, GRND_NONBLOCK) != 1) j = 128;
    long long t = a->cfg.latency_target_ms > 0 ? a->cfg.latency_target_ms : 50;
    long long ms = t + t * j / 255;
    json_t *extra = json_pack("{s:I}", "retry_after_ms", (json_int_t)(ms < 50 ? 50 : ms));
    if (extra && ticket) json_object_set_new(extra, "ticket", json_string(ticket));
    http_reply_error_with(r, 503, "overloaded", extra, api_retry, "The service has as many "
                          "orders in progress as it can answer in time; this one was not taken. "
                          "Its ticket keeps its unit until its turn ends: retry after "
                          "retry_after_ms.");
}

/* An order in its place's turn (or of a product without a room), into the
 * order path: api_in_turn_fn. */
static void order_in_turn(svc_app *a, http_req *r, svc_product *p, const svc_order_input *in,
                          const char *key, int door, long long position, const char *ticket) {
    /* door: the instance's limit was left to here (api_order_create), and
     * then its strategy's own limit. */
    if ((door && svc_admit_door(&a->adm)) || svc_admit_shed(&a->adm, p->strategy)) {
        if (position) reply_overloaded_in_turn(r, a, ticket);
        else reply_overloaded(r);
        return;
    }
    room_order *ro = position ? malloc(sizeof *ro) : NULL;
    if (ro) *ro = (room_order){ r, p->room, position };
    http_defer(r);
    /* Out of memory for ro: answered as any order; its place holds its
     * unit until its turn passes. */
    if (svc_order_submit(a, p, in, key, ro ? reply_to_room_order : reply_to_order,
                         ro ? (void *)ro : (void *)r) != 0) {
        free(ro);
        http_reply_error_with(r, 503, "shutting_down", NULL, api_retry,
                              "The service is out of memory; retry shortly.");
    }
}

/* Hands a validated order to the order path, which answers it; wait_ms:
 * how long it may wait for its place's turn, if p has a waiting room. */
static void submit_order(svc_app *a, http_req *r, svc_product *p, const svc_order_input *in,
                         const char *key, int door, long wait_ms) {
    /* A product with a waiting room takes an order in its ticket's turn
     * only (tickets.c): the check is this instance's, from memory. */
    http_tag(r, (int)p->strategy);     /* its latency, by strategy (ops/metrics.c) */
    long long position = 0;
    if (p->room && !(position = api_room_admit(r, a, p, in, key, order_in_turn, wait_ms)))
        return;                         /* answered, or taken on */
    order_in_turn(a, r, p, in, key, door, position, NULL);
}

/* The product was not cached: look it up off the HTTP thread. */
static void order_create_job(api_job *j) {
    svc_product *p = NULL;
    db_status st = svc_product_find(j->a, NULL, j->order.sku, &p);
    if (st == DB_NOTFOUND) api_reply_unknown_sku(j->r, j->order.sku);
    else if (st != DB_OK) api_reply_db_failed(j->r, j->a, st == DB_NOCONN, "reading the product");
    else submit_order(j->a, j->r, p, &j->order, j->key[0] ? j->key : NULL,
                      svc_product_cache_rooms(j->a->products), j->limit);
}

void api_order_create(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    svc_order_input in;
    svc_verr e;
    char key[DB_KEY_MAX + 1];
    (void)params;
    if (atomic_load(&a->shutting_down)) {
        const char *h[] = { "Connection", "close", "Retry-After", "1", NULL };
        http_reply_error_with(r, 503, "shutting_down", NULL, h,
                              "The service is shutting down; retry on another instance.");
        return;
    }
    /* The door first, before any parsing -- unless a product here has a
     * waiting room: then an order's room check comes before the door (an
     * order out of its turn is told its place, not "overloaded"; one in
     * its turn is told to come back soon: reply_overloaded_in_turn). */
    int door = svc_product_cache_rooms(a->products);
    if (!door && svc_admit_door(&a->adm)) {
        reply_overloaded(r);
        return;
    }
    if (api_idem_key(r, key) != 0) return;
    /* How long an order may wait for its place's turn: read only where
     * a product has a room (door), not on the plain order path. */
    long wait_ms = a->cfg.room_order_wait_ms;
    if (door && api_wait_ms(r, &wait_ms) != 0) return;
    size_t blen;
    const char *raw = http_body(r, &blen);
    svc_order_fast f;                  /* the common body, without a jansson tree */
    svc_product *p;
    if (svc_validate_order_fast(raw, blen, &f) && (p = svc_product_cache_get(a->products, f.in.sku))) {
        submit_order(a, r, p, &f.in, key[0] ? key : NULL, door, wait_ms);
        return;
    }
    json_t *body = http_body_json(r);
    if (!body) return;
    if (svc_validate_order(body, &in, &e) != 0) {
        api_reply_verr(r, &e);
        json_decref(body);
        return;
    }
    p = svc_product_cache_get(a->products, in.sku);
    if (p) {
        submit_order(a, r, p, &in, key[0] ? key : NULL, door, wait_ms);
        json_decref(body);
        return;
    }
    api_job *j = api_job_new(r, a, body);
    if (!j) return;
    j->order = in;                     /* its strings point into body, which j owns */
    j->limit = wait_ms;
    memcpy(j->key, key, sizeof j->key);
    api_defer(r, j, LANE_DB, order_create_job);
}

static json_t *order_json(const db_order *o) {
    char t[UTC_TIME_LEN + 1];
    static const char *const WHEN[] = { "confirmed_at", "", "cancelled_at", "expired_at" };
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s}", "order_id", o->order_id, "sku",
                          o->sku, "user_id", o->user_id, "quantity", o->quantity, "status",
                          db_order_status_name(o->status), "created_at", o->created_at);
    if (!j || !o->expires_ms) return j;
    utc_time_format(o->expires_ms, t);
    json_object_set_new(j, "expires_at", json_string(t));
    if (o->decided_ms) {
        utc_time_format(o->decided_ms, t);
        json_object_set_new(j, WHEN[o->status], json_string(t));
    }
    if (o->payment_ref[0]) json_object_set_new(j, "payment_ref", json_string(o->payment_ref));
    return j;
}

/* ------------------------------------------------------------- holds' ends */

/* The answer to a confirm or cancel: the order when it is in the state
 * asked for (now or before), else 409 naming the state it is in. */
static void reply_decision(http_req *r, const db_decision *dc) {
    db_order_status want = dc->to == DB_HOLD_CONFIRM ? DB_ORDER_CONFIRMED : DB_ORDER_CANCELLED;
    const db_order *o = &dc->order;
    if (o->status == want) {
        http_reply_json(r, 200, order_json(o), NULL);
        return;
    }
    static const char *const WHY[] = {
        "Order %s is confirmed (paid): it cannot be cancelled.", "",
        "Order %s was cancelled: its units went back on sale.",
        "Order %s expired at its deadline: its units went back on sale.",
    };
    assert(o->status != DB_ORDER_RESERVED);     /* a decision always ends a reserved hold */
    http_reply_error_with(r, 409,
                          o->status == DB_ORDER_EXPIRED     ? "order_expired"
                          : o->status == DB_ORDER_CANCELLED ? "order_cancelled"
                                                            : "order_confirmed",
                          json_pack("{s:o}", "order", order_json(o)), NULL, WHY[o->status],
                          o->order_id);
}

static void decide_job(api_job *j) {
    db_decision *dc = calloc(1, sizeof *dc);
    if (!dc) {
        http_reply_error_with(j->r, 503, "shutting_down", NULL, api_retry,
                              "The service is out of memory; retry shortly.");
        return;
    }
    dc->order_id = j->order_id;
    dc->to = j->to;
    dc->user_id = j->has_user ? j->user : NULL;
    dc->payment_ref = j->ref[0] ? j->ref : NULL;
    db_status st = svc_hold_decide(j->a, dc);
    if (st == DB_OK) {
        reply_decision(j->r, dc);
    } else if (st == DB_NOTFOUND) {
        http_reply_error(j->r, 404, "unknown_order", "No order has id '%s'.", j->order_id);
    } else if (st == DB_UNKNOWN) {
        atomic_fetch_add(&j->a->m.db_errors, 1);
        http_reply_error_with(j->r, 503, "db_unavailable", NULL, api_retry,
                              "The database failed while committing; whether the order changed "
                              "is not known. Retry: a confirm or cancel is safe to repeat.");
    } else {
        api_reply_db_failed(j->r, j->a, st == DB_NOCONN, "deciding the order");
    }
    free(dc);
}

/* POST /v1/orders/{id}/confirm (admin: the payment system) and
 * /v1/orders/{id}/cancel (the buyer, naming itself; or admin). */
static void decide(http_req *r, const char *order_id, svc_app *a, db_hold_to to) {
    char clip[80];
    const char *ref = NULL, *user = NULL;
    size_t len = 0;
    svc_verr e;
    json_t *body = NULL;
    if (!svc_order_id_valid(order_id)) {
        http_reply_error(r, 404, "unknown_order", "No order has id '%s'.",
                         utf8_clip(clip, sizeof clip, order_id));
        return;
    }
    http_body(r, &len);
    if (len > 0 && !(body = http_body_json(r))) return;
    if (svc_validate_decision(body, to == DB_HOLD_CONFIRM, &ref, &user, &e) != 0) {
        api_reply_verr(r, &e);
        json_decref(body);
        return;
    }
    if ((to == DB_HOLD_CONFIRM || !user) && !api_authorized(r, a)) {
        json_decref(body);
        return;
    }
    api_job *j = api_job_new(r, a, body);
    if (!j) return;
    snprintf(j->order_id, sizeof j->order_id, "%s", order_id);
    j->to = to;
    if (ref) snprintf(j->ref, sizeof j->ref, "%s", ref);
    if ((j->has_user = user != NULL)) snprintf(j->user, sizeof j->user, "%s", user);
    api_defer(r, j, LANE_REDIS, decide_job);
}

void api_order_confirm(http_req *r, const char *const *params, void *ud) {
    decide(r, params[0], ud, DB_HOLD_CONFIRM);
}

void api_order_cancel(http_req *r, const char *const *params, void *ud) {
    decide(r, params[0], ud, DB_HOLD_CANCEL);
}

static void order_get_job(api_job *j) {
    db_order o;
    int busy = 0;
    db *d = svc_db_take(j->a, &busy);
    db_status st = d ? db_order_get(d, j->order_id, &o) : DB_ERROR;
    svc_db_give(j->a, d);
    if (st == DB_NOTFOUND)
        http_reply_error(j->r, 404, "unknown_order", "No order has id '%s'.", j->order_id);
    else if (st != DB_OK)
        api_reply_db_failed(j->r, j->a, busy, "reading the order");
    else
        http_reply_json(j->r, 200, order_json(&o), NULL);
}

void api_order_get(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    char clip[80];
    if (!svc_order_id_valid(params[0])) {
        http_reply_error(r, 404, "unknown_order", "No order has id '%s'.",
                         utf8_clip(clip, sizeof clip, params[0]));
        return;
    }
    api_job *j = api_job_new(r, a, NULL);
    if (!j) return;
    snprintf(j->order_id, sizeof j->order_id, "%s", params[0]);
    api_defer(r, j, LANE_DB, order_get_job);
}

static void append_order(const db_order *o, void *ud) {
    json_t *one = order_json(o);
    if (one) json_array_append_new(ud, one);
}

static void order_list_job(api_job *j) {
    int busy = 0;
    db *d = svc_db_take(j->a, &busy);
    json_t *orders = json_array();
    int more = 0;
    if (!d || !orders ||
        db_order_list(d, j->has_sku ? j->sku : NULL, j->has_user ? j->user : NULL, j->status,
                      j->has_after ? j->after : NULL, (int)j->limit, append_order, orders,
                      &more) != DB_OK) {
        json_decref(orders);
        if (d) svc_log(SVC_LOG_WARN, "listing orders: %s", db_errstr(d));
        svc_db_give(j->a, d);
        api_reply_db_failed(j->r, j->a, busy, "listing orders");
        return;
    }
    svc_db_give(j->a, d);
    size_t n = json_array_size(orders);
    json_t *next = more && n ? json_copy(json_object_get(json_array_get(orders, n - 1), "order_id"))
                             : json_null();
    http_reply_json(j->r, 200, json_pack("{s:o, s:o}", "orders", orders, "next", next), NULL);
}

void api_order_list(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    static const char *const KNOWN[] = { "sku", "user_id", "status", "after", "limit", NULL };
    const char *sku, *user, *after, *lim, *other, *status;
    char clip[80];
    if (http_query_only(r, KNOWN, &other) != 0) {
        /* "?usr_id=bob" must not list everyone's orders. */
        http_reply_error(r, 400, "invalid_field",
                         "Unknown query argument '%s'; this route takes sku, user_id, status, "
                         "after and limit.", utf8_clip(clip, sizeof clip, other));
        return;
    }
    int hs = http_query(r, "sku", &sku), hu = http_query(r, "user_id", &user);
    int ha = http_query(r, "after", &after), hl = http_query(r, "limit", &lim);
    int hst = http_query(r, "status", &status), st = -1;
    if (hst < 0 || (hst && (st = db_order_status_parse(status)) < 0)) {
        http_reply_error(r, 400, "invalid_field", "'status' must be one of reserved, confirmed, "
                         "cancelled, expired (given once).");
        return;
    }
    long limit = 100;
    char *end;
    (void)params;
    if (hs < 0 || (hs && !svc_valid_sku(sku))) {
        http_reply_error(r, 400, "invalid_field", "'sku' is not a valid SKU (given once).");
        return;
    }
    if (hu < 0 || (hu && !svc_valid_user_id(user))) {
        http_reply_error(r, 400, "invalid_field",
                         "'user_id' is not a valid user id (given once, 1 to 128 characters of "
                         "UTF-8 without control characters or NUL).");
        return;
    }
    if (ha < 0 || (ha && !svc_order_id_valid(after))) {
        http_reply_error(r, 400, "invalid_field", "'after' must be an order id (given once).");
        return;
    }
    if (hl < 0 ||
        (hl && (limit = strtol(lim, &end, 10), end == lim || *end || limit < 1 || limit > 1000))) {
        http_reply_error(r, 400, "invalid_field", "'limit' must be an integer from 1 to 1000.");
        return;
    }
    api_job *j = api_job_new(r, a, NULL);
    if (!j) return;
    if ((j->has_sku = hs == 1)) snprintf(j->sku, sizeof j->sku, "%s", sku);
    if ((j->has_user = hu == 1)) snprintf(j->user, sizeof j->user, "%s", user);
    if ((j->has_after = ha == 1)) snprintf(j->after, sizeof j->after, "%s", after);
    j->limit = limit;
    j->status = st;
    api_defer(r, j, LANE_DB, order_list_job);
}

