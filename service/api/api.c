/* api.c: the HTTP API of docs/openapi.yaml (docs/api.md), one handler per route.
 *
 * Handlers run on the HTTP event-loop threads, which must never wait on
 * Redis or SQLite: there they only check the request (all that needs no
 * I/O) and then either answer, hand an order to the order path
 * (order/order.h), or defer the request to an API worker (threadpool.h)
 * that does the reads and writes and answers. /healthz answers from the
 * probes' state.
 *
 * Messages to clients are fixed sentences: the text of a SQLite or Redis
 * error goes to the log (details of an outage are the operator's, and they
 * would make clients' messages change with library versions).
 *
 * Admin writes are honest: SQLite is the truth, so once a product or a
 * restock is committed there the answer is success, even if the Redis copy
 * could not take it (the rebuild loads it from SQLite); and an error is
 * answered only when nothing was applied, or says plainly that the outcome
 * is unknown. A restock may carry an Idempotency-Key so a retry adds once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <assert.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "service/api/api.h"
#include "service/api/validate.h"
#include "service/app.h"
#include "service/holds/holds.h"
#include "service/log.h"
#include "service/ops/health.h"
#include "service/order/order.h"
#include "service/products.h"
#include "service/repair/repair.h"

/* ------------------------------------------------------------------ helpers */

static const char *const RETRY[] = { "Retry-After", "1", NULL };

static void reply_verr(http_req *r, const svc_verr *e) {
    http_reply_error(r, e->status, e->code, "%s", e->message);
}

static void reply_db_down(http_req *r, svc_app *a, const char *doing) {
    atomic_fetch_add(&a->m.db_errors, 1);
    svc_health_poke_db(a->health);
    http_reply_error_with(r, 503, "db_unavailable", NULL, RETRY,
                          "The database is unavailable (%s); nothing was changed. Retry shortly.",
                          doing);
}

static void reply_redis_down(http_req *r, svc_app *a, const char *why) {
    atomic_fetch_add(&a->m.redis_errors, 1);
    http_reply_error_with(r, 503, "redis_unavailable", NULL, RETRY, "%s", why);
}

/* Constant-time comparison: the time taken does not depend on where the
 * strings first differ, so the token cannot be guessed byte by byte. */
static int same_secret(const char *given, const char *want) {
    size_t gl = strlen(given), wl = strlen(want);
    unsigned char diff = (unsigned char)(gl != wl);
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)(want[i] ^ given[i < gl ? i : 0]);
    return diff == 0;
}

/* Admin endpoints need the bearer token when one is configured. */
static int authorized(http_req *r, svc_app *a) {
    if (!a->cfg.admin_token[0]) return 1;
    const char *h;
    /* The scheme is case-insensitive (RFC 9110 11.1), then one or more
     * spaces before the token. */
    if (http_header(r, "Authorization", &h) == 1 && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (same_secret(h, a->cfg.admin_token)) return 1;
    }
    const char *www[] = { "WWW-Authenticate", "Bearer", NULL };
    http_reply_error_with(r, 401, "unauthorized", NULL, www,
                          "This endpoint needs 'Authorization: Bearer <admin token>'.");
    return 0;
}

/* Reads the Idempotency-Key header into key (DB_KEY_MAX + 1 bytes; "" when
 * absent). Answers 400 and returns -1 when it is malformed. */
static int idem_key(http_req *r, char *key) {
    const char *v;
    int rc = http_header(r, "Idempotency-Key", &v);
    key[0] = '\0';
    if (rc == 0) return 0;
    if (rc < 0 || !svc_valid_idem_key(v)) {
        http_reply_error(r, 400, "invalid_field",
                         "The Idempotency-Key header must be sent once, as 1 to 128 visible "
                         "ASCII characters.");
        return -1;
    }
    snprintf(key, DB_KEY_MAX + 1, "%s", v);
    return 0;
}

static void reply_unknown_sku(http_req *r, const char *sku) {
    char clip[80];
    http_reply_error(r, 404, "unknown_sku", "No product has SKU '%s'.",
                     utf8_clip(clip, sizeof clip, sku));
}

/* ---------------------------------------------------------- deferred jobs */

/* A request handed to an API worker, with everything it needs copied out
 * of the HTTP layer's buffers. */
typedef struct api_job {
    svc_task task;                 /* its place in an API pool's queue */
    svc_app *a;
    http_req *r;
    void (*run)(struct api_job *j);
    char sku[DB_SKU_MAX + 1];
    char key[DB_KEY_MAX + 1];
    char order_id[DB_ORDER_ID_LEN + 1];
    char user[DB_USER_MAX * 4 + 1];
    char after[DB_ORDER_ID_LEN + 1];
    int has_sku, has_user, has_after;
    long long qty;
    long limit;
    int status;                    /* order list: < 0 any */
    db_hold_to to;                 /* confirm or cancel */
    char ref[DB_REF_MAX * 4 + 1];  /* confirm: payment_ref */
    json_t *body;                  /* owned; inputs below point into it */
    svc_product_input product;
    svc_order_input order;
} api_job;

static void run_job(svc_task *t) {
    api_job *j = (api_job *)t;            /* the task is its first member */
    j->run(j);
    json_decref(j->body);
    free(j);
}

/* Which workers a job needs: those that may wait on Redis, or those that
 * only read SQLite. Two pools, so that a stalled Redis (every Redis lane
 * worker waiting out its timeout) cannot hold up order lookups, which
 * never need it. */
typedef enum api_lane { LANE_REDIS, LANE_DB } api_lane;

/* Defers r to an API worker of lane running run(j). Takes j (and j->body). */
static void defer_job(http_req *r, api_job *j, api_lane lane, void (*run)(api_job *j)) {
    j->r = r;
    j->run = run;
    j->task.run = run_job;
    http_defer(r);
    svc_threadpool_submit(lane == LANE_DB ? j->a->api_db : j->a->api, &j->task);
}

static api_job *job_new(http_req *r, svc_app *a, json_t *body) {
    api_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(body);
        http_reply_error_with(r, 503, "shutting_down", NULL, RETRY,
                              "The service is out of memory; retry shortly.");
        return NULL;
    }
    j->a = a;
    j->body = body;
    return j;
}

/* --------------------------------------------------------- product answers */

/* Answers with the product as GET shows it: SQLite's numbers and the
 * stock store's. A lost Redis copy is rebuilt first. after_write: the
 * answer to a committed create or restock, which must not become an error
 * because Redis lags: the available units then come from SQLite
 * (stock_initial - sold) and "stock_source" says so. */
static void reply_product(http_req *r, svc_app *a, svc_product *p, int status, int after_write,
                          const char *const *extra_headers) {
    db *d = svc_thread_db(a);
    stock_conn *sc = svc_thread_stock(a);
    db_product dp;
    long long total = 0, *seg = calloc((size_t)p->segments, sizeof *seg);
    if (!d || !seg || db_product_get(d, p->sku, &dp) != DB_OK) {
        free(seg);
        if (after_write) {
            /* Committed, but not readable back now: say so, not 503. */
            char loc[96];
            snprintf(loc, sizeof loc, "/v1/products/%s", p->sku);
            const char *h[] = { "Location", loc, NULL };
            http_reply_json(r, status, json_pack("{s:s, s:s}", "sku", p->sku, "note",
                                                 "committed; the product could not be read "
                                                 "back just now"), h);
            return;
        }
        reply_db_down(r, a, "reading the product");
        return;
    }
    const stock_strategy_info *si = stock_strategy_about(p->strategy);
    stock_result res = STOCK_RESERVED;
    const char *source = "redis";
    if (!si->uses_redis) {
        source = "database";
        total = seg[0] = dp.db_available;      /* the db strategies keep it in SQLite */
    } else {
        res = sc ? stock_read(sc, &p->sp, &total, seg) : STOCK_UNAVAILABLE;
        if (res == STOCK_MISSING && svc_rebuild(a, d, sc, p, 0) == 0)
            res = stock_read(sc, &p->sp, &total, seg);
        if (res != STOCK_RESERVED && after_write) {
            source = "database";
            total = dp.stock_initial - dp.sold - dp.held;
            if (total < 0) total = 0;
            for (int i = 0; i < p->segments; i++)
                seg[i] = total / p->segments + (i < total % p->segments);
            res = STOCK_RESERVED;
        }
    }
    if (res != STOCK_RESERVED) {
        free(seg);
        reply_redis_down(r, a, res == STOCK_MISSING
                                   ? "The Redis stock copy is being rebuilt; retry shortly."
                                   : "Redis is unavailable; the stock cannot be read. Retry shortly.");
        return;
    }
    json_t *segs = json_array();
    for (int i = 0; i < p->segments; i++) json_array_append_new(segs, json_integer(seg[i]));
    free(seg);
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:I, s:i, s:I, s:I, s:I, s:I, s:o, s:s, s:s}",
                          "sku", dp.sku, "name", dp.name, "strategy", dp.strategy, "segments",
                          dp.segments, "per_user_limit", (json_int_t)dp.per_user_limit,
                          "hold_seconds", dp.hold_seconds, "stock_initial",
                          (json_int_t)dp.stock_initial, "stock_available", (json_int_t)total,
                          "held", (json_int_t)dp.held, "sold", (json_int_t)dp.sold,
                          "segment_available", segs, "stock_source", source, "created_at",
                          dp.created_at);
    if (j && dp.cs_delay_ms) json_object_set_new(j, "cs_delay_ms", json_integer(dp.cs_delay_ms));
    if (j && dp.lock_ttl_ms) json_object_set_new(j, "lock_ttl_ms", json_integer(dp.lock_ttl_ms));
    if (j && si->unsafe) /* said wherever the product is seen, not only in the log */
        json_object_set_new(j, "warning", json_sprintf("UNSAFE: %s oversells by design (%s); "
                                                       "a demonstration, never for a real sale",
                                                       si->name, si->about));
    http_reply_json(r, status, j, extra_headers);
}

/* Finds the product of a job, answering 404/503 when it cannot. */
static svc_product *job_product(api_job *j) {
    svc_product *p = NULL;
    db_status st = svc_product_find(j->a, j->sku, &p);
    if (st == DB_NOTFOUND) reply_unknown_sku(j->r, j->sku);
    else if (st != DB_OK) reply_db_down(j->r, j->a, "reading the product");
    return st == DB_OK ? p : NULL;
}

/* ----------------------------------------------------------------- products */

static void product_create_job(api_job *j) {
    svc_app *a = j->a;
    http_req *r = j->r;
    const svc_product_input *in = &j->product;
    db_product dp = { 0 }, now;
    snprintf(dp.sku, sizeof dp.sku, "%s", in->sku);
    snprintf(dp.name, sizeof dp.name, "%s", in->name);
    snprintf(dp.strategy, sizeof dp.strategy, "%s", in->strategy);
    dp.segments = in->segments;
    dp.per_user_limit = in->per_user_limit;
    dp.hold_seconds = (int)in->hold_seconds;
    dp.stock_initial = in->stock;
    dp.cs_delay_ms = (int)in->cs_delay_ms;
    dp.lock_ttl_ms = (int)in->lock_ttl_ms;
    db_format_time(clock_wall_ms(), dp.created_at);

    db *d = svc_thread_db(a);
    db_status st = d ? db_product_insert(d, &dp) : DB_ERROR;
    if (st == DB_EXISTS) {
        http_reply_error(r, 409, "sku_exists", "A product with SKU '%s' exists already.", dp.sku);
        return;
    }
    if (st != DB_OK) {
        svc_log(SVC_LOG_ERROR, "create product %s: %s", dp.sku, d ? db_errstr(d) : "no database");
        /* A failed commit may still have landed: look before answering. */
        db_status seen = d ? db_product_get(d, dp.sku, &now) : DB_ERROR;
        if (seen == DB_OK && now.stock_initial == dp.stock_initial &&
            !strcmp(now.strategy, dp.strategy) && now.segments == dp.segments) {
            st = DB_OK;                        /* it did: carry on as created */
        } else if (seen == DB_NOTFOUND) {
            reply_db_down(r, a, "creating the product");
            return;
        } else {
            atomic_fetch_add(&a->m.db_errors, 1);
            http_reply_error_with(r, 503, "db_unavailable", NULL, RETRY,
                                  "The database failed while creating the product, and whether "
                                  "it was created is not known; GET /v1/products/%s to see.",
                                  dp.sku);
            return;
        }
    }
    char loc[96];
    snprintf(loc, sizeof loc, "/v1/products/%s", dp.sku);
    const char *h[] = { "Location", loc, NULL };
    svc_product *p = svc_product_cache_put(a->products, &dp);
    if (!p) {
        /* Committed, but no memory to cache it: it is created all the same
         * (the first order or read loads it from SQLite), and says so. */
        svc_log(SVC_LOG_ERROR, "create product %s: committed, not cached (out of memory)", dp.sku);
        http_reply_json(r, 201, json_pack("{s:s, s:s}", "sku", dp.sku, "note",
                                          "committed; the product could not be read back just "
                                          "now"), h);
        return;
    }
    const stock_strategy_info *si = stock_strategy_about(p->strategy);
    if (si->unsafe)
        svc_log(SVC_LOG_WARN, "product %s uses %s, which OVERSELLS by design (a demonstration): %s",
                p->sku, si->name, si->about);
    svc_log(SVC_LOG_INFO, "product %s created: %lld units, strategy %s, %d segment(s)", p->sku,
            dp.stock_initial, si->name, p->segments);
    /* The product exists once SQLite has it. If Redis cannot take the
     * stock now, the first order or read rebuilds it from SQLite. */
    stock_conn *sc = svc_thread_stock(a);
    if (si->uses_redis && (!sc || stock_load(sc, &p->sp, 1, dp.stock_initial, NULL, 0, 1) < 0)) {
        svc_log(SVC_LOG_WARN, "product %s: stock not loaded into Redis yet (%s)", p->sku,
                sc ? stock_conn_errstr(sc) : "no connection");
        svc_repair_request_rebuild(a->repair, p);
    }
    reply_product(r, a, p, 201, 1, h);
}

static void product_create(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    svc_verr e;
    (void)params;
    if (!authorized(r, a)) return;
    json_t *body = http_body_json(r);
    if (!body) return;
    api_job *j = job_new(r, a, body);
    if (!j) return;
    if (svc_validate_product(body, stock_strategy_about(a->default_strategy)->name,
                             a->cfg.fault_injection, &j->product, &e) != 0) {
        reply_verr(r, &e);
        json_decref(body);
        free(j);
        return;
    }
    stock_strategy s;
    const char *why = stock_strategy_parse(j->product.strategy, &s) == 0
                          ? svc_strategy_unavailable(a, s) : NULL;
    if (why) {
        http_reply_error(r, 400, "strategy_unavailable", "'strategy' '%s' needs a lock server "
                         "this instance was not given (%s): %s.", j->product.strategy,
                         svc_strategy_flag(s), why);
        json_decref(body);
        free(j);
        return;
    }
    defer_job(r, j, LANE_REDIS, product_create_job);
}

static void product_get_job(api_job *j) {
    svc_product *p = job_product(j);
    if (p) reply_product(j->r, j->a, p, 200, 0, NULL);
}

static void product_get(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    if (!svc_valid_sku(params[0])) {
        reply_unknown_sku(r, params[0]);
        return;
    }
    api_job *j = job_new(r, a, NULL);
    if (!j) return;
    snprintf(j->sku, sizeof j->sku, "%s", params[0]);
    defer_job(r, j, LANE_REDIS, product_get_job);
}

/* The restock is in SQLite: make the Redis copy take it (or rebuild it). */
static void restock_redis(svc_app *a, db *d, svc_product *p, long long qty, int committed_unseen) {
    stock_conn *sc = svc_thread_stock(a);
    if (!stock_strategy_about(p->strategy)->uses_redis) return;
    /* Whether Redis took the units is unknown after an error, and after a
     * commit we did not see succeed we do not know the units are not in
     * already: a rebuild from SQLite makes the copy exact either way. */
    if (!committed_unseen && sc && stock_restock(sc, &p->sp, qty) == STOCK_RESERVED) return;
    if (!sc || svc_rebuild(a, d, sc, p, 1) != 0) svc_repair_request_forced_rebuild(a->repair, p);
}

static void product_restock_job(api_job *j) {
    svc_app *a = j->a;
    http_req *r = j->r;
    svc_product *p = job_product(j);
    if (!p) return;
    db *d = svc_thread_db(a);
    db_product dp;
    int replayed = 0, unseen = 0;
    db_status st = d ? db_product_restock(d, p->sku, j->qty, j->key, &dp, &replayed) : DB_ERROR;
    if (st == DB_UNKNOWN && j->key[0]) {
        /* The commit failed in a way that may have landed: the key says. */
        db_status was = db_restock_state(d, j->key);
        st = was == DB_OK ? DB_OK : was == DB_NOTFOUND ? DB_ERROR : DB_UNKNOWN;
        unseen = st == DB_OK;
    }
    switch (st) {
    case DB_OK:
        break;
    case DB_NOTFOUND:
        reply_unknown_sku(r, p->sku);
        return;
    case DB_DUPKEY:
        http_reply_error(r, 422, "idempotency_key_reused",
                         "This Idempotency-Key was used for a different restock.");
        return;
    case DB_UNKNOWN:
        svc_log(SVC_LOG_ERROR, "restock %s: %s", p->sku, db_errstr(d));
        atomic_fetch_add(&a->m.db_errors, 1);
        http_reply_error_with(r, 503, "db_unavailable", NULL, RETRY,
                              "The database failed while committing the restock, and whether it "
                              "was applied is not known. %s",
                              j->key[0] ? "Retry with the same Idempotency-Key: it adds the units "
                                          "at most once."
                                        : "Send restocks with an Idempotency-Key to retry them "
                                          "safely; check stock_initial before retrying this one.");
        return;
    default:
        if (d) svc_log(SVC_LOG_ERROR, "restock %s: %s", p->sku, db_errstr(d));
        reply_db_down(r, a, "restocking");
        return;
    }
    const char *replay_hdr[] = { "Idempotent-Replayed", "true", NULL };
    if (!replayed) {
        restock_redis(a, d, p, j->qty, unseen);
        svc_log(SVC_LOG_INFO, "product %s restocked: +%lld units", p->sku, j->qty);
    }
    reply_product(r, a, p, 200, 1, replayed ? replay_hdr : NULL);
}

static void product_restock(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    long long qty;
    svc_verr e;
    char key[DB_KEY_MAX + 1];
    if (!authorized(r, a) || idem_key(r, key) != 0) return;
    if (!svc_valid_sku(params[0])) {
        reply_unknown_sku(r, params[0]);
        return;
    }
    json_t *body = http_body_json(r);
    if (!body) return;
    int bad = svc_validate_restock(body, &qty, &e);
    json_decref(body);
    if (bad) {
        reply_verr(r, &e);
        return;
    }
    api_job *j = job_new(r, a, NULL);
    if (!j) return;
    snprintf(j->sku, sizeof j->sku, "%s", params[0]);
    memcpy(j->key, key, sizeof j->key);
    j->qty = qty;
    defer_job(r, j, LANE_REDIS, product_restock_job);
}

/* ------------------------------------------------------------------- orders */

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

/* Writes a hold's fields (after "status") at p: the deadline and, once it
 * ended, when and how. Returns the new end. */
static char *hold_fields(char *p, const db_order *o) {
    char t[DB_TIME_LEN + 1];
    static const char *const WHEN[] = { "confirmed_at", "", "cancelled_at", "expired_at" };
    if (!o->expires_ms) return p;
    db_format_time(o->expires_ms, t);
    p += sprintf(p, ",\"expires_at\":\"%s\"", t);
    if (o->decided_ms) {
        db_format_time(o->decided_ms, t);
        p += sprintf(p, ",\"%s\":\"%s\"", WHEN[o->status], t);
    }
    if (o->payment_ref[0]) {
        p += sprintf(p, ",\"payment_ref\":\"");
        p = json_escape(p, o->payment_ref);
        *p++ = '"';
    }
    return p;
}

/* Answers with the order. The body is written here rather than through
 * jansson: it is the answer to every order, and its fields are known (ids,
 * SKU and time are plain ASCII by construction). */
static void reply_order(http_req *r, const db_order *o, int status) {
    char location[64];
    memcpy(location, "/v1/orders/", 11);
    memcpy(location + 11, o->order_id, sizeof o->order_id);
    const char *created[] = { "Location", location, NULL };
    const char *replay[] = { "Location", location, "Idempotent-Replayed", "true", NULL };
    char *body = malloc(320 + strlen(o->sku) + 6 * strlen(o->user_id) +
                        6 * strlen(o->payment_ref));
    if (!body) {
        http_reply_json(r, 500, NULL, NULL);   /* no memory for the body: the fixed 500 */
        return;
    }
    char *p = body;
    p += sprintf(p, "{\"order_id\":\"%s\",\"sku\":\"%s\",\"user_id\":\"", o->order_id, o->sku);
    p = json_escape(p, o->user_id);
    p += sprintf(p, "\",\"quantity\":%d,\"status\":\"%s\",\"created_at\":\"%s\"", o->quantity,
                 db_order_status_name(o->status), o->created_at);
    p = hold_fields(p, o);
    memcpy(p, "}\n", 2);
    p += 2;
    http_reply_take(r, status, "application/json; charset=utf-8", body, (size_t)(p - body),
                    status == 200 ? replay : created);
}

/* The order path's answer to an order, as HTTP (ctx: the request). */
static void reply_to_order(void *ctx, const svc_reply *rep) {
    http_req *r = ctx;
    if (rep->order) {
        reply_order(r, rep->order, rep->status);
        return;
    }
    char secs[16];
    const char *retry[] = { "Retry-After", secs, NULL };
    snprintf(secs, sizeof secs, "%d", rep->retry_after_s);
    http_reply_error_with(r, rep->status, rep->code, rep->extra,
                          rep->retry_after_s > 0 ? retry : NULL, "%s", rep->message);
}

/* Hands a validated order to the order path, which answers it. */
static void submit_order(svc_app *a, http_req *r, svc_product *p, const svc_order_input *in,
                         const char *key) {
    http_tag(r, (int)p->strategy);     /* its latency, by strategy (ops/metrics.c) */
    http_defer(r);
    if (svc_order_submit(a, p, in, key, reply_to_order, r) != 0)
        http_reply_error_with(r, 503, "shutting_down", NULL, RETRY,
                              "The service is out of memory; retry shortly.");
}

/* The product was not cached: look it up off the HTTP thread. */
static void order_create_job(api_job *j) {
    svc_product *p = NULL;
    db_status st = svc_product_find(j->a, j->order.sku, &p);
    if (st == DB_NOTFOUND) reply_unknown_sku(j->r, j->order.sku);
    else if (st != DB_OK) reply_db_down(j->r, j->a, "reading the product");
    else submit_order(j->a, j->r, p, &j->order, j->key[0] ? j->key : NULL);
}

static void order_create(http_req *r, const char *const *params, void *ud) {
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
    if (idem_key(r, key) != 0) return;
    json_t *body = http_body_json(r);
    if (!body) return;
    if (svc_validate_order(body, &in, &e) != 0) {
        reply_verr(r, &e);
        json_decref(body);
        return;
    }
    svc_product *p = svc_product_cache_get(a->products, in.sku);
    if (p) {
        submit_order(a, r, p, &in, key[0] ? key : NULL);
        json_decref(body);
        return;
    }
    api_job *j = job_new(r, a, body);
    if (!j) return;
    j->order = in;                     /* its strings point into body, which j owns */
    memcpy(j->key, key, sizeof j->key);
    defer_job(r, j, LANE_DB, order_create_job);
}

static json_t *order_json(const db_order *o) {
    char t[DB_TIME_LEN + 1];
    static const char *const WHEN[] = { "confirmed_at", "", "cancelled_at", "expired_at" };
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s}", "order_id", o->order_id, "sku",
                          o->sku, "user_id", o->user_id, "quantity", o->quantity, "status",
                          db_order_status_name(o->status), "created_at", o->created_at);
    if (!j || !o->expires_ms) return j;
    db_format_time(o->expires_ms, t);
    json_object_set_new(j, "expires_at", json_string(t));
    if (o->decided_ms) {
        db_format_time(o->decided_ms, t);
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
        http_reply_error_with(j->r, 503, "shutting_down", NULL, RETRY,
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
        http_reply_error_with(j->r, 503, "db_unavailable", NULL, RETRY,
                              "The database failed while committing; whether the order changed "
                              "is not known. Retry: a confirm or cancel is safe to repeat.");
    } else {
        reply_db_down(j->r, j->a, "deciding the order");
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
        reply_verr(r, &e);
        json_decref(body);
        return;
    }
    if ((to == DB_HOLD_CONFIRM || !user) && !authorized(r, a)) {
        json_decref(body);
        return;
    }
    api_job *j = job_new(r, a, body);
    if (!j) return;
    snprintf(j->order_id, sizeof j->order_id, "%s", order_id);
    j->to = to;
    if (ref) snprintf(j->ref, sizeof j->ref, "%s", ref);
    if ((j->has_user = user != NULL)) snprintf(j->user, sizeof j->user, "%s", user);
    defer_job(r, j, LANE_REDIS, decide_job);
}

static void order_confirm(http_req *r, const char *const *params, void *ud) {
    decide(r, params[0], ud, DB_HOLD_CONFIRM);
}

static void order_cancel(http_req *r, const char *const *params, void *ud) {
    decide(r, params[0], ud, DB_HOLD_CANCEL);
}

static void order_get_job(api_job *j) {
    db_order o;
    db *d = svc_thread_db(j->a);
    db_status st = d ? db_order_get(d, j->order_id, &o) : DB_ERROR;
    if (st == DB_NOTFOUND)
        http_reply_error(j->r, 404, "unknown_order", "No order has id '%s'.", j->order_id);
    else if (st != DB_OK)
        reply_db_down(j->r, j->a, "reading the order");
    else
        http_reply_json(j->r, 200, order_json(&o), NULL);
}

static void order_get(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    char clip[80];
    if (!svc_order_id_valid(params[0])) {
        http_reply_error(r, 404, "unknown_order", "No order has id '%s'.",
                         utf8_clip(clip, sizeof clip, params[0]));
        return;
    }
    api_job *j = job_new(r, a, NULL);
    if (!j) return;
    snprintf(j->order_id, sizeof j->order_id, "%s", params[0]);
    defer_job(r, j, LANE_DB, order_get_job);
}

static void append_order(const db_order *o, void *ud) {
    json_t *one = order_json(o);
    if (one) json_array_append_new(ud, one);
}

static void order_list_job(api_job *j) {
    db *d = svc_thread_db(j->a);
    json_t *orders = json_array();
    int more = 0;
    if (!d || !orders ||
        db_order_list(d, j->has_sku ? j->sku : NULL, j->has_user ? j->user : NULL, j->status,
                      j->has_after ? j->after : NULL, (int)j->limit, append_order, orders,
                      &more) != DB_OK) {
        json_decref(orders);
        reply_db_down(j->r, j->a, "listing orders");
        return;
    }
    size_t n = json_array_size(orders);
    json_t *next = more && n ? json_copy(json_object_get(json_array_get(orders, n - 1), "order_id"))
                             : json_null();
    http_reply_json(j->r, 200, json_pack("{s:o, s:o}", "orders", orders, "next", next), NULL);
}

static void order_list(http_req *r, const char *const *params, void *ud) {
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
    api_job *j = job_new(r, a, NULL);
    if (!j) return;
    if ((j->has_sku = hs == 1)) snprintf(j->sku, sizeof j->sku, "%s", sku);
    if ((j->has_user = hu == 1)) snprintf(j->user, sizeof j->user, "%s", user);
    if ((j->has_after = ha == 1)) snprintf(j->after, sizeof j->after, "%s", after);
    j->limit = limit;
    j->status = st;
    defer_job(r, j, LANE_DB, order_list_job);
}

/* --------------------------------------------------------------- strategies */

/* Every strategy this build offers, so clients (flashload among them) learn
 * the list from the service instead of keeping a copy that can drift: what
 * servers each needs, and whether this instance has them. */
static void strategy_list(http_req *r, const char *const *params, void *ud) {
    static const char *const SERVER[STOCK_LOCKS_COUNT] = {
        [STOCK_LOCKS_REDLOCK] = "redlock", [STOCK_LOCKS_ZOOKEEPER] = "zookeeper",
        [STOCK_LOCKS_ETCD] = "etcd",
    };
    svc_app *a = ud;
    (void)params;
    json_t *list = json_array();
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        const stock_strategy_info *si = stock_strategy_about((stock_strategy)s);
        const char *why = svc_strategy_unavailable(a, (stock_strategy)s);
        json_t *needs = json_array();
        if (si->uses_redis) json_array_append_new(needs, json_string("redis"));
        if (SERVER[si->locks]) json_array_append_new(needs, json_string(SERVER[si->locks]));
        json_t *o = json_pack("{s:s, s:b, s:b, s:o, s:b, s:s}", "name", si->name, "safe",
                              !si->unsafe, "segments", si->segments_ok, "needs", needs,
                              "available", why == NULL, "description", si->about);
        if (o && why) json_object_set_new(o, "unavailable_reason", json_string(why));
        json_array_append_new(list, o);
    }
    http_reply_json(r, 200, json_pack("{s:o}", "strategies", list), NULL);
}

/* --------------------------------------------------------------- operations */

static void healthz(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    svc_health_view v;
    (void)params;
    svc_health_read(a->health, &v);
    int up = v.redis == HEALTH_OK && v.db == HEALTH_OK;
    const char *status = atomic_load(&a->shutting_down) ? "shutting_down" : up ? "ok" : "unavailable";
    http_reply_json(r, strcmp(status, "ok") ? 503 : 200,
                    json_pack("{s:s, s:s, s:s, s:s, s:{s:I, s:I}}", "status", status, "redis",
                              svc_health_state_name(v.redis), "db", svc_health_state_name(v.db),
                              "instance", a->instance_id, "checked_ms_ago", "redis",
                              (json_int_t)v.redis_age_ms, "db", (json_int_t)v.db_age_ms),
                    strcmp(status, "ok") ? RETRY : NULL);
}

static void metrics_route(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    char *text;
    size_t len;
    (void)params;
    if (svc_metrics_render(a, &text, &len) != 0) {
        http_reply_error_with(r, 503, "shutting_down", NULL, RETRY,
                              "The service is out of memory; retry shortly.");
        return;
    }
    http_reply_take(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
}

/* docs/openapi.yaml as JSON, embedded at build time (Makefile, gen/openapi.c),
 * so an instance serves the contract of the very build that answers. */
extern const char docs_openapi_json[];

static void openapi_route(http_req *r, const char *const *params, void *ud) {
    (void)params;
    (void)ud;
    http_reply(r, 200, "application/json; charset=utf-8", docs_openapi_json,
               strlen(docs_openapi_json), NULL);
}

const http_route svc_api_routes[] = {
    { "POST", "/v1/products", product_create, ROUTE_PRODUCT_CREATE },
    { "GET", "/v1/products/{}", product_get, ROUTE_PRODUCT_GET },
    { "POST", "/v1/products/{}/restock", product_restock, ROUTE_PRODUCT_RESTOCK },
    { "POST", "/v1/orders", order_create, ROUTE_ORDER_CREATE },
    { "GET", "/v1/orders", order_list, ROUTE_ORDER_LIST },
    { "GET", "/v1/orders/{}", order_get, ROUTE_ORDER_GET },
    { "POST", "/v1/orders/{}/confirm", order_confirm, ROUTE_ORDER_CONFIRM },
    { "POST", "/v1/orders/{}/cancel", order_cancel, ROUTE_ORDER_CANCEL },
    { "GET", "/v1/strategies", strategy_list, ROUTE_STRATEGIES },
    { "GET", "/healthz", healthz, ROUTE_HEALTHZ },
    { "GET", "/metrics", metrics_route, ROUTE_METRICS },
    { "GET", "/openapi.json", openapi_route, ROUTE_OPENAPI },
};
const size_t svc_api_nroutes = sizeof svc_api_routes / sizeof svc_api_routes[0];
