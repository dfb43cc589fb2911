/* api.c: the HTTP API of ../shared/API.md, one handler per route.
 *
 * Handlers validate, look things up, and answer; orders are handed to the
 * pipeline (pipeline.c). Reads run on the HTTP thread with its own SQLite
 * and Redis connections: they are quick, and readers never wait for the
 * writer in WAL mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "service/service.h"

/* ------------------------------------------------------------------ helpers */

static void reply_verr(http_req *r, const verr *e) {
    http_reply_error(r, e->status, e->code, "%s", e->message);
}

static void reply_db_down(http_req *r, app *a, const char *what) {
    atomic_fetch_add(&a->m.db_errors, 1);
    http_reply_error(r, 503, "db_unavailable", "The database is unavailable (%s). Retry shortly.",
                     what);
}

static void reply_redis_down(http_req *r, app *a, const char *why) {
    const char *retry[] = { "Retry-After", "1", NULL };
    atomic_fetch_add(&a->m.redis_errors, 1);
    http_reply_error_with(r, 503, "redis_unavailable", NULL, retry, "%s", why);
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
static int authorized(http_req *r, app *a) {
    if (!a->cfg.admin_token[0]) return 1;
    const char *h = http_header(r, "Authorization");
    if (h && !strncmp(h, "Bearer ", 7) && same_secret(h + 7, a->cfg.admin_token)) return 1;
    const char *www[] = { "WWW-Authenticate", "Bearer", NULL };
    http_reply_error_with(r, 401, "unauthorized", NULL, www,
                          "This endpoint needs 'Authorization: Bearer <admin token>'.");
    return 0;
}

/* Finds the product named in a path, answering 404/503 when it cannot. */
static product *path_product(http_req *r, app *a, const char *sku) {
    product *p = NULL;
    db_status st = valid_sku(sku) ? app_product(a, sku, &p) : DB_NOTFOUND;
    if (st == DB_NOTFOUND)
        http_reply_error(r, 404, "unknown_sku", "No product has SKU '%.64s'.", sku);
    else if (st != DB_OK)
        reply_db_down(r, a, "reading the product");
    return st == DB_OK ? p : NULL;
}

/* Answers with the product as GET shows it: SQLite's numbers and the
 * stock store's. A lost Redis copy is rebuilt first. */
static void reply_product(http_req *r, app *a, product *p, int status) {
    db *d = app_db(a);
    stock_conn *sc = app_stock(a);
    db_product dp;
    long long total = 0, *seg = calloc((size_t)p->segments, sizeof *seg);
    if (!d || !seg || db_product_get(d, p->sku, &dp) != DB_OK) {
        free(seg);
        reply_db_down(r, a, "reading the product");
        return;
    }
    stock_result res = STOCK_RESERVED;
    if (!stock_strategy_about(p->strategy)->uses_redis) {
        total = seg[0] = dp.db_available;      /* the db strategies keep it in SQLite */
    } else {
        res = sc ? stock_read(sc, &p->sp, &total, seg) : STOCK_UNAVAILABLE;
        if (res == STOCK_MISSING && stock_rebuild(a, d, sc, p, 0) == 0)
            res = stock_read(sc, &p->sp, &total, seg);
    }
    if (res != STOCK_RESERVED) {
        free(seg);
        reply_redis_down(r, a, res == STOCK_MISSING
                                   ? "The Redis stock copy is being rebuilt; retry shortly."
                                   : "Redis is unavailable; the stock cannot be read.");
        return;
    }
    json_t *segs = json_array();
    for (int i = 0; i < p->segments; i++) json_array_append_new(segs, json_integer(seg[i]));
    free(seg);
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:o, s:s}", "sku", dp.sku,
                          "name", dp.name, "strategy", dp.strategy, "segments", dp.segments,
                          "per_user_limit", (json_int_t)dp.per_user_limit, "stock_initial",
                          (json_int_t)dp.stock_initial, "stock_available", (json_int_t)total,
                          "sold", (json_int_t)dp.sold, "segment_available", segs,
                          "created_at", dp.created_at);
    if (dp.cs_delay_ms) json_object_set_new(j, "cs_delay_ms", json_integer(dp.cs_delay_ms));
    if (dp.lock_ttl_ms) json_object_set_new(j, "lock_ttl_ms", json_integer(dp.lock_ttl_ms));
    const stock_strategy_info *si = stock_strategy_about(p->strategy);
    if (si->unsafe) /* said wherever the product is seen, not only in the log */
        json_object_set_new(j, "warning", json_sprintf("UNSAFE: %s oversells by design (%s); "
                                                       "a demonstration, never for a real sale",
                                                       si->name, si->about));
    http_reply_json(r, status, j, NULL);
}

/* ----------------------------------------------------------------- products */

static void product_create(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    product_input in;
    verr e;
    (void)params;
    if (!authorized(r, a)) return;
    json_t *body = http_body_json(r);
    if (!body) return;
    if (validate_product(body, stock_strategy_about(a->default_strategy)->name,
                         a->cfg.fault_injection, &in, &e) != 0) {
        reply_verr(r, &e);
        json_decref(body);
        return;
    }
    db_product dp = { 0 };
    snprintf(dp.sku, sizeof dp.sku, "%s", in.sku);
    snprintf(dp.name, sizeof dp.name, "%s", in.name);
    snprintf(dp.strategy, sizeof dp.strategy, "%s", in.strategy);
    dp.segments = in.segments;
    dp.per_user_limit = in.per_user_limit;
    dp.stock_initial = in.stock;
    dp.cs_delay_ms = (int)in.cs_delay_ms;
    dp.lock_ttl_ms = (int)in.lock_ttl_ms;
    db_format_time(clock_wall_ms(), dp.created_at);
    json_decref(body);

    db *d = app_db(a);
    db_status st = d ? db_product_insert(d, &dp) : DB_ERROR;
    if (st == DB_EXISTS) {
        http_reply_error(r, 409, "sku_exists", "A product with SKU '%s' exists already.", dp.sku);
        return;
    }
    if (st != DB_OK) {
        reply_db_down(r, a, d ? db_errstr(d) : "cannot open");
        return;
    }
    product *p = product_cache_put(a->products, &dp);
    if (!p) {
        reply_db_down(r, a, "caching the product");
        return;
    }
    const stock_strategy_info *si = stock_strategy_about(p->strategy);
    if (si->unsafe)
        log_msg(LOG_WARN, "product %s uses %s, which OVERSELLS by design (a demonstration): %s",
                p->sku, si->name, si->about);
    log_msg(LOG_INFO, "product %s created: %lld units, strategy %s, %d segment(s)", p->sku,
            dp.stock_initial, si->name, p->segments);
    /* The product exists once SQLite has it. If Redis cannot take the
     * stock now, the first order or read rebuilds it from SQLite. */
    stock_conn *sc = app_stock(a);
    if (si->uses_redis && (!sc || stock_load(sc, &p->sp, 1, dp.stock_initial, NULL, 0, 1) < 0)) {
        log_msg(LOG_WARN, "product %s: stock not loaded into Redis yet (%s)", p->sku,
                sc ? stock_conn_errstr(sc) : "no connection");
        maint_request_rebuild(a->maint, p);
    }
    reply_product(r, a, p, 201);
}

static void product_get(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    product *p = path_product(r, a, params[0]);
    if (p) reply_product(r, a, p, 200);
}

static void product_restock(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    long long qty;
    verr e;
    if (!authorized(r, a)) return;
    product *p = path_product(r, a, params[0]);
    if (!p) return;
    json_t *body = http_body_json(r);
    if (!body) return;
    int bad = validate_restock(body, &qty, &e);
    json_decref(body);
    if (bad) {
        reply_verr(r, &e);
        return;
    }
    db *d = app_db(a);
    db_product dp;
    if (!d || db_product_restock(d, p->sku, qty, &dp) != DB_OK) {
        reply_db_down(r, a, d ? db_errstr(d) : "cannot open");
        return;
    }
    /* SQLite counts the units now. If Redis does not take them (missing
     * copy, or an error that leaves it unknown whether it did), a rebuild
     * from SQLite makes the copy exact again. */
    stock_conn *sc = app_stock(a);
    if (stock_strategy_about(p->strategy)->uses_redis &&
        (!sc || stock_restock(sc, &p->sp, qty) != STOCK_RESERVED) &&
        (!sc || stock_rebuild(a, d, sc, p, 1) != 0))
        maint_request_forced_rebuild(a->maint, p);
    log_msg(LOG_INFO, "product %s restocked: +%lld units", p->sku, qty);
    reply_product(r, a, p, 200);
}

/* ------------------------------------------------------------------- orders */

static void order_create(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    order_input in;
    verr e;
    product *p;
    (void)params;
    if (atomic_load(&a->shutting_down)) {
        const char *h[] = { "Connection", "close", "Retry-After", "1", NULL };
        http_reply_error_with(r, 503, "shutting_down", NULL, h,
                              "The service is shutting down; retry on another instance.");
        return;
    }
    const char *key = http_header(r, "Idempotency-Key");
    if (key && !valid_idem_key(key)) {
        http_reply_error(r, 400, "invalid_field",
                         "The Idempotency-Key header must be 1 to 128 visible ASCII characters.");
        return;
    }
    json_t *body = http_body_json(r);
    if (!body) return;
    if (validate_order(body, &in, &e) != 0) {
        reply_verr(r, &e);
        json_decref(body);
        return;
    }
    db_status st = app_product(a, in.sku, &p);
    if (st == DB_NOTFOUND)
        http_reply_error(r, 404, "unknown_sku", "No product has SKU '%s'.", in.sku);
    else if (st != DB_OK)
        reply_db_down(r, a, "reading the product");
    else
        order_submit(a, r, p, &in, key);
    json_decref(body);
}

static void order_get(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    db_order o;
    db *d = app_db(a);
    db_status st = order_id_valid(params[0]) ? (d ? db_order_get(d, params[0], &o) : DB_ERROR)
                                             : DB_NOTFOUND;
    if (st == DB_NOTFOUND) {
        http_reply_error(r, 404, "unknown_order", "No order has id '%.64s'.", params[0]);
        return;
    }
    if (st != DB_OK) {
        reply_db_down(r, a, "reading the order");
        return;
    }
    http_reply_json(r, 200,
                    json_pack("{s:s, s:s, s:s, s:i, s:s, s:s}", "order_id", o.order_id, "sku",
                              o.sku, "user_id", o.user_id, "quantity", o.quantity, "status",
                              "confirmed", "created_at", o.created_at),
                    NULL);
}

static void append_order(const db_order *o, void *ud) {
    json_array_append_new(ud, json_pack("{s:s, s:s, s:s, s:i, s:s, s:s}", "order_id",
                                        o->order_id, "sku", o->sku, "user_id", o->user_id,
                                        "quantity", o->quantity, "status", "confirmed",
                                        "created_at", o->created_at));
}

static void order_list(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    const char *sku = http_query(r, "sku"), *user = http_query(r, "user_id");
    const char *after = http_query(r, "after"), *lim = http_query(r, "limit");
    long limit = 100;
    char *end;
    (void)params;
    if (sku && !valid_sku(sku)) {
        http_reply_error(r, 400, "invalid_field", "'sku' is not a valid SKU.");
        return;
    }
    if (user && !valid_user_id(user)) {
        http_reply_error(r, 400, "invalid_field", "'user_id' is not a valid user id.");
        return;
    }
    if (after && !order_id_valid(after)) {
        http_reply_error(r, 400, "invalid_field", "'after' must be an order id.");
        return;
    }
    if (lim && (limit = strtol(lim, &end, 10), end == lim || *end || limit < 1 || limit > 1000)) {
        http_reply_error(r, 400, "invalid_field", "'limit' must be an integer from 1 to 1000.");
        return;
    }
    db *d = app_db(a);
    json_t *orders = json_array();
    int more = 0;
    if (!d || db_order_list(d, sku, user, after, (int)limit, append_order, orders, &more) != DB_OK) {
        json_decref(orders);
        reply_db_down(r, a, "listing orders");
        return;
    }
    size_t n = json_array_size(orders);
    json_t *next = more && n ? json_copy(json_object_get(json_array_get(orders, n - 1), "order_id"))
                             : json_null();
    http_reply_json(r, 200, json_pack("{s:o, s:o}", "orders", orders, "next", next), NULL);
}

/* --------------------------------------------------------------- strategies */

/* Every strategy this build offers, so clients (flashload among them) learn
 * the list from the service instead of keeping a copy that can drift. */
static void strategy_list(http_req *r, const char *const *params, void *ud) {
    (void)params;
    (void)ud;
    json_t *list = json_array();
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        const stock_strategy_info *si = stock_strategy_about((stock_strategy)s);
        json_t *needs = json_array();
        if (si->uses_redis) json_array_append_new(needs, json_string("redis"));
        json_array_append_new(list, json_pack("{s:s, s:b, s:b, s:o, s:b, s:s}", "name", si->name,
                                              "safe", !si->unsafe, "segments", si->segments_ok,
                                              "needs", needs, "available", 1,
                                              "description", si->about));
    }
    http_reply_json(r, 200, json_pack("{s:o}", "strategies", list), NULL);
}

/* --------------------------------------------------------------- operations */

static void healthz(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    (void)params;
    stock_conn *sc = app_stock(a);
    db *d = app_db(a);
    db_writer_stats ws;
    db_writer_get_stats(a->writer, &ws);
    char redis[160] = "ok", dbs[160] = "ok";
    if (!sc || stock_ping(sc) != 0)
        snprintf(redis, sizeof redis, "unavailable: %s", sc ? stock_conn_errstr(sc) : "no connection");
    if (!d || db_ping(d) != DB_OK)
        snprintf(dbs, sizeof dbs, "unavailable: %s", d ? db_errstr(d) : "cannot open");
    else if (ws.last_failed)
        snprintf(dbs, sizeof dbs, "failing: the last commit failed");
    int down = strcmp(redis, "ok") || strcmp(dbs, "ok");
    const char *status = atomic_load(&a->shutting_down) ? "shutting_down" : down ? "unavailable" : "ok";
    http_reply_json(r, strcmp(status, "ok") ? 503 : 200,
                    json_pack("{s:s, s:s, s:s, s:s}", "status", status, "redis", redis, "db", dbs,
                              "instance", a->instance_id),
                    NULL);
}

static void metrics_route(http_req *r, const char *const *params, void *ud) {
    app *a = ud;
    char *text;
    size_t len;
    (void)params;
    metrics_render(a, &text, &len);
    http_reply(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
    free(text);
}

const http_route api_routes[] = {
    { "POST", "/v1/products", product_create, ROUTE_PRODUCT_CREATE },
    { "GET", "/v1/products/{}", product_get, ROUTE_PRODUCT_GET },
    { "POST", "/v1/products/{}/restock", product_restock, ROUTE_PRODUCT_RESTOCK },
    { "POST", "/v1/orders", order_create, ROUTE_ORDER_CREATE },
    { "GET", "/v1/orders", order_list, ROUTE_ORDER_LIST },
    { "GET", "/v1/orders/{}", order_get, ROUTE_ORDER_GET },
    { "GET", "/v1/strategies", strategy_list, ROUTE_STRATEGIES },
    { "GET", "/healthz", healthz, ROUTE_HEALTHZ },
    { "GET", "/metrics", metrics_route, ROUTE_METRICS },
};
const size_t api_nroutes = sizeof api_routes / sizeof api_routes[0];
