/* api.c: the HTTP API of docs/openapi.yaml (docs/api.md), one handler per route
 * (the order routes in orders.c; what they share in api_int.h).
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
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "service/api/api.h"
#include "service/api/api_int.h"
#include "service/api/validate.h"
#include "service/app.h"
#include "service/log.h"
#include "service/ops/health.h"
#include "service/products.h"
#include "service/repair/repair.h"
#include "service/room/room.h"

static void reply_redis_down(http_req *r, svc_app *a, const char *why) {
    atomic_fetch_add(&a->m.redis_errors, 1);
    http_reply_error_with(r, 503, "redis_unavailable", NULL, api_retry, "%s", why);
}

/* --------------------------------------------------------- product answers */

/* A product's waiting room as GET shows it: its settings, and this
 * instance's view of it (room/room.h). */
static json_t *room_json(svc_product *p) {
    svc_room_figures f;
    svc_room_figures_get(p->room, &f);
    json_t *j = json_pack("{s:i, s:I, s:I, s:I, s:f, s:b}", "turn_seconds",
                          svc_room_turn_ms(p->room) / 1000, "rate",
                          (json_int_t)svc_room_fixed_rate(p->room), "issued",
                          (json_int_t)f.issued, "serving", (json_int_t)f.serving,
                          "rate_now", round(f.rate * 10) / 10, "sold_out", f.sold_out_ms > 0);
    long long opens = svc_room_opens_ms(p->room);
    char when[UTC_TIME_LEN + 1];
    if (opens > 0) utc_time_format(opens, when);
    if (j) json_object_set_new(j, "opens_at", opens > 0 ? json_string(when) : json_null());
    return j;
}

/* Answers with the product as GET shows it: SQLite's numbers and the
 * stock store's. A lost Redis copy is rebuilt first. after_write: the
 * answer to a committed create or restock, which must not become an error
 * because Redis lags: the available units then come from SQLite
 * (stock_initial - sold) and "stock_source" says so. d: the connection
 * of the job that answers. */
static void reply_product(http_req *r, svc_app *a, db *d, svc_product *p, int status,
                          int after_write, const char *const *extra_headers) {
    int64_t read_at = clock_mono_us();        /* the figures are at least this recent, */
    uint64_t changes = svc_product_changes(p);   /* and no older than these changes */
    stock_conn *sc = svc_thread_stock(a);
    db_product dp;
    long long total = 0, *seg = calloc((size_t)p->segments, sizeof *seg);
    if (!seg || db_product_get(d, p->sku, &dp) != DB_OK) {
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
        api_reply_db_down(r, a, "reading the product");
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
    if (j && dp.cs_overlap) json_object_set_new(j, "cs_overlap", json_integer(dp.cs_overlap));
    if (j && p->room) json_object_set_new(j, "waiting_room", room_json(p));
    if (j && si->unsafe) /* said wherever the product is seen, not only in the log */
        json_object_set_new(j, "warning", json_sprintf("UNSAFE: %s oversells by design (%s); "
                                                       "a demonstration, never for a real sale",
                                                       si->name, si->about));
    char *text = j && status == 200 && !after_write && a->cfg.product_cache_ms > 0
                     ? json_dumps(j, JSON_COMPACT) : NULL;
    size_t len = text ? strlen(text) : 0;
    char *body = text ? realloc(text, len + 2) : NULL;
    if (!body) {                              /* not kept: answered as any JSON */
        free(text);
        http_reply_json(r, status, j, extra_headers);
        return;
    }
    json_decref(j);
    memcpy(body + len, "\n", 2);
    svc_product_view_put(p, body, len + 1, read_at, changes);   /* the next reads, for a moment */
    http_reply_take(r, status, "application/json; charset=utf-8", body, len + 1, extra_headers);
}

/* Finds the product of a job (on d), answering 404/503 when it cannot. */
static svc_product *job_product(api_job *j, db *d) {
    svc_product *p = NULL;
    db_status st = svc_product_find(j->a, d, j->sku, &p);
    if (st == DB_NOTFOUND) api_reply_unknown_sku(j->r, j->sku);
    else if (st != DB_OK) api_reply_db_failed(j->r, j->a, st == DB_NOCONN, "reading the product");
    return st == DB_OK ? p : NULL;
}

/* ----------------------------------------------------------------- products */

/* Runs job on a connection of the instance's, answering 503 when none
 * can be had. */
static void with_db(api_job *j, void (*job)(api_job *j, db *d), const char *doing) {
    int busy = 0;
    db *d = svc_db_take(j->a, &busy);
    if (!d) {
        api_reply_db_failed(j->r, j->a, busy, doing);
        return;
    }
    job(j, d);
    svc_db_give(j->a, d);
}

static void product_create_on(api_job *j, db *d) {
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
    dp.cs_overlap = (int)in->cs_overlap;
    dp.room_turn_ms = (int)in->room_turn_ms;
    dp.room_rate = in->room_rate;
    dp.room_opens_ms = in->room_opens_ms;
    utc_time_format(clock_wall_ms(), dp.created_at);

    db_status st = db_product_insert(d, &dp);
    if (st == DB_EXISTS) {
        http_reply_error(r, 409, "sku_exists", "A product with SKU '%s' exists already.", dp.sku);
        return;
    }
    if (st != DB_OK) {
        svc_log(SVC_LOG_ERROR, "create product %s: %s", dp.sku, db_errstr(d));
        /* A failed commit may still have landed: look before answering. */
        db_status seen = db_product_get(d, dp.sku, &now);
        if (seen == DB_OK && now.stock_initial == dp.stock_initial &&
            !strcmp(now.strategy, dp.strategy) && now.segments == dp.segments) {
            st = DB_OK;                        /* it did: carry on as created */
        } else if (seen == DB_NOTFOUND) {
            api_reply_db_down(r, a, "creating the product");
            return;
        } else {
            atomic_fetch_add(&a->m.db_errors, 1);
            http_reply_error_with(r, 503, "db_unavailable", NULL, api_retry,
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
    reply_product(r, a, d, p, 201, 1, h);
}

static void product_create_job(api_job *j) { with_db(j, product_create_on, "creating the product"); }

static void product_create(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    svc_verr e;
    (void)params;
    if (!api_authorized(r, a)) return;
    json_t *body = http_body_json(r);
    if (!body) return;
    api_job *j = api_job_new(r, a, body);
    if (!j) return;
    if (svc_validate_product(body, stock_strategy_about(a->default_strategy)->name,
                             a->cfg.fault_injection, &j->product, &e) != 0) {
        api_reply_verr(r, &e);
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
    api_defer(r, j, LANE_REDIS, product_create_job);
}

static void product_get_on(api_job *j, db *d) {
    svc_product *p = job_product(j, d);
    if (p) reply_product(j->r, j->a, d, p, 200, 0, NULL);
}

static void product_get_job(api_job *j) { with_db(j, product_get_on, "reading the product"); }

static void product_get(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    svc_product *p;
    char *body;
    size_t len;
    if (!svc_valid_sku(params[0])) {
        api_reply_unknown_sku(r, params[0]);
        return;
    }
    /* Read from the stores less than --product-cache-ms ago: the same body,
     * from here (the page a flash sale's buyers refresh without end). */
    if (a->cfg.product_cache_ms > 0 && (p = svc_product_cache_get(a->products, params[0])) &&
        svc_product_view_get(p, (int64_t)a->cfg.product_cache_ms * 1000, &body, &len)) {
        http_reply_take(r, 200, "application/json; charset=utf-8", body, len, NULL);
        return;
    }
    api_job *j = api_job_new(r, a, NULL);
    if (!j) return;
    snprintf(j->sku, sizeof j->sku, "%s", params[0]);
    api_defer(r, j, LANE_REDIS, product_get_job);
}

/* The restock is in SQLite: make the Redis copy take it (or rebuild it). */
static void restock_redis(svc_app *a, db *d, svc_product *p, long long qty, int committed_unseen) {
    svc_product_changed(p);
    svc_product_soldout_clear(p);             /* units came: this instance sells at once */
    stock_conn *sc = svc_thread_stock(a);
    if (!stock_strategy_about(p->strategy)->uses_redis) return;
    /* Whether Redis took the units is unknown after an error, and after a
     * commit we did not see succeed we do not know the units are not in
     * already: a rebuild from SQLite makes the copy exact either way. */
    if (!committed_unseen && sc && stock_restock(sc, &p->sp, qty) == STOCK_RESERVED) return;
    if (!sc || svc_rebuild(a, d, sc, p, 1) != 0) svc_repair_request_forced_rebuild(a->repair, p);
}

static void product_restock_on(api_job *j, db *d) {
    svc_app *a = j->a;
    http_req *r = j->r;
    svc_product *p = job_product(j, d);
    if (!p) return;
    db_product dp;
    int replayed = 0, unseen = 0;
    db_status st = db_product_restock(d, p->sku, j->qty, j->key, &dp, &replayed);
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
        api_reply_unknown_sku(r, p->sku);
        return;
    case DB_DUPKEY:
        http_reply_error(r, 422, "idempotency_key_reused",
                         "This Idempotency-Key was used for a different restock.");
        return;
    case DB_UNKNOWN:
        svc_log(SVC_LOG_ERROR, "restock %s: %s", p->sku, db_errstr(d));
        atomic_fetch_add(&a->m.db_errors, 1);
        http_reply_error_with(r, 503, "db_unavailable", NULL, api_retry,
                              "The database failed while committing the restock, and whether it "
                              "was applied is not known. %s",
                              j->key[0] ? "Retry with the same Idempotency-Key: it adds the units "
                                          "at most once."
                                        : "Send restocks with an Idempotency-Key to retry them "
                                          "safely; check stock_initial before retrying this one.");
        return;
    default:
        svc_log(SVC_LOG_ERROR, "restock %s: %s", p->sku, db_errstr(d));
        api_reply_db_down(r, a, "restocking");
        return;
    }
    const char *replay_hdr[] = { "Idempotent-Replayed", "true", NULL };
    if (!replayed) {
        restock_redis(a, d, p, j->qty, unseen);
        svc_log(SVC_LOG_INFO, "product %s restocked: +%lld units", p->sku, j->qty);
    }
    reply_product(r, a, d, p, 200, 1, replayed ? replay_hdr : NULL);
}

static void product_restock_job(api_job *j) { with_db(j, product_restock_on, "restocking"); }

static void product_restock(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    long long qty;
    svc_verr e;
    char key[DB_KEY_MAX + 1];
    if (!api_authorized(r, a) || api_idem_key(r, key) != 0) return;
    if (!svc_valid_sku(params[0])) {
        api_reply_unknown_sku(r, params[0]);
        return;
    }
    json_t *body = http_body_json(r);
    if (!body) return;
    int bad = svc_validate_restock(body, &qty, &e);
    json_decref(body);
    if (bad) {
        api_reply_verr(r, &e);
        return;
    }
    api_job *j = api_job_new(r, a, NULL);
    if (!j) return;
    snprintf(j->sku, sizeof j->sku, "%s", params[0]);
    memcpy(j->key, key, sizeof j->key);
    j->qty = qty;
    api_defer(r, j, LANE_REDIS, product_restock_job);
}

/* --------------------------------------------------------------- strategies */

/* Every strategy this build offers, so clients (flashload among them) learn
 * the list from the service instead of keeping a copy that can drift: what
 * servers each needs, and whether this instance has them. */
static void strategy_list(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    (void)params;
    json_t *list = json_array();
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        const stock_strategy_info *si = stock_strategy_about((stock_strategy)s);
        const char *why = svc_strategy_unavailable(a, (stock_strategy)s);
        json_t *needs = json_array();
        if (si->uses_redis) json_array_append_new(needs, json_string("redis"));
        /* A lock server of its own, which a flag configures (the service's
         * own Redis is "redis" above; the database's lock table needs none). */
        const stock_lock_server_info *li = stock_lock_server_about(si->locks);
        if (li->flag) json_array_append_new(needs, json_string(li->name));
        if (si->row_locks) json_array_append_new(needs, json_string("postgresql"));
        json_t *o = json_pack("{s:s, s:b, s:b, s:o, s:b, s:s}", "name", si->name, "safe",
                              !si->unsafe, "segments", si->segments_ok, "needs", needs,
                              "available", why == NULL, "description", si->about);
        if (o && why) json_object_set_new(o, "unavailable_reason", json_string(why));
        json_array_append_new(list, o);
    }
    http_reply_json(r, 200, json_pack("{s:o}", "strategies", list), NULL);
}

/* --------------------------------------------------------------- operations */

/* Written without jansson: the probe every load balancer sends, as cheap
 * as an answer can be. The instance id holds the host name, made valid
 * UTF-8 before it is escaped. */
static void healthz(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    svc_health_view v;
    char id[sizeof a->instance_id], body[160 + 6 * sizeof id], *p = body;
    (void)params;
    svc_health_read(a->health, &v);
    int up = v.redis == HEALTH_OK && v.db == HEALTH_OK;
    const char *status = atomic_load(&a->shutting_down) ? "shutting_down" : up ? "ok" : "unavailable";
    utf8_clean(id, sizeof id, a->instance_id, strlen(a->instance_id));
    p += sprintf(p, "{\"status\":\"%s\",\"redis\":\"%s\",\"db\":\"%s\",\"instance\":\"", status,
                 svc_health_state_name(v.redis), svc_health_state_name(v.db));
    p = api_json_escape(p, id);
    p += sprintf(p, "\",\"checked_ms_ago\":{\"redis\":%lld,\"db\":%lld}}\n",
                 (long long)v.redis_age_ms, (long long)v.db_age_ms);
    assert((size_t)(p - body) < sizeof body);
    http_reply(r, strcmp(status, "ok") ? 503 : 200, "application/json; charset=utf-8", body,
               (size_t)(p - body), strcmp(status, "ok") ? api_retry : NULL);
}

static void metrics_route(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    char *text;
    size_t len;
    (void)params;
    if (svc_metrics_render(a, &text, &len) != 0) {
        http_reply_error_with(r, 503, "shutting_down", NULL, api_retry,
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
    { "POST", "/v1/products/{}/tickets", api_ticket_take, ROUTE_TICKET_TAKE },
    { "GET", "/v1/products/{}/tickets/{}", api_ticket_get, ROUTE_TICKET_GET },
    { "POST", "/v1/orders", api_order_create, ROUTE_ORDER_CREATE },
    { "GET", "/v1/orders", api_order_list, ROUTE_ORDER_LIST },
    { "GET", "/v1/orders/{}", api_order_get, ROUTE_ORDER_GET },
    { "POST", "/v1/orders/{}/confirm", api_order_confirm, ROUTE_ORDER_CONFIRM },
    { "POST", "/v1/orders/{}/cancel", api_order_cancel, ROUTE_ORDER_CANCEL },
    { "GET", "/v1/strategies", strategy_list, ROUTE_STRATEGIES },
    { "GET", "/healthz", healthz, ROUTE_HEALTHZ },
    { "GET", "/metrics", metrics_route, ROUTE_METRICS },
    { "GET", "/openapi.json", openapi_route, ROUTE_OPENAPI },
};
const size_t svc_api_nroutes = sizeof svc_api_routes / sizeof svc_api_routes[0];
