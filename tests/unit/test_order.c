/* test_order.c: the order path without HTTP, against a real redis-server
 * (FLASHSALE_TEST_REDIS) and a real SQLite file.
 *
 * The service is started with no listener (svc_start with cfg.listen ""):
 * the real event loops, committer, repair queue and every family. Orders
 * go in through svc_order_submit, from a thread that runs no loop and from
 * a loop's own thread, and their replies are collected; each family's test
 * then checks the books: 201s == units sold in SQLite == units gone from
 * the stock store, the refusals the contract names, replays, and that the
 * pending records of committed orders are cleared. Also the order state
 * machine's table, move by move. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "service/app.h"
#include "service/log.h"
#include "service/order/order_int.h"
#include "service/products.h"
#include "tests/unit/t.h"
#include "tests/unit/traw.h"

static const char *url;
static char dbpath[256];
static char prefix[32];            /* a run's own keys: "tord<pid>:" */
static svc_app app;
static int started;

/* ------------------------------------------------------------- replies */

#define MAX_REPLIES 4096

typedef struct reply_rec {
    int status;
    char code[40];
    char order_id[DB_ORDER_ID_LEN + 1];
    int quantity;
    int on_loop;                   /* answered on an event loop's thread */
} reply_rec;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static reply_rec replies[MAX_REPLIES];
static int nreplies;

static void on_reply(void *ctx, const svc_reply *r) {
    (void)ctx;
    pthread_mutex_lock(&mu);
    if (nreplies < MAX_REPLIES) {
        reply_rec *rec = &replies[nreplies++];
        rec->status = r->status;
        snprintf(rec->code, sizeof rec->code, "%s", r->code ? r->code : "");
        snprintf(rec->order_id, sizeof rec->order_id, "%s", r->order ? r->order->order_id : "");
        rec->quantity = r->order ? r->order->quantity : 0;
        rec->on_loop = loop_current() != NULL;
    }
    json_decref(r->extra);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void reset_replies(void) {
    pthread_mutex_lock(&mu);
    nreplies = 0;
    pthread_mutex_unlock(&mu);
}

/* Waits until n replies are in (10 s at most); returns how many are. */
static int wait_replies(int n) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&mu);
    while (nreplies < n && pthread_cond_timedwait(&cv, &mu, &until) == 0) {}
    int got = nreplies;
    pthread_mutex_unlock(&mu);
    return got;
}

static int count(int status, const char *code) {
    int n = 0;
    for (int i = 0; i < nreplies; i++)
        if (replies[i].status == status && (!code || !strcmp(replies[i].code, code))) n++;
    return n;
}

static long long units_confirmed(void) {
    long long u = 0;
    for (int i = 0; i < nreplies; i++)
        if (replies[i].status == 201) u += replies[i].quantity;
    return u;
}

/* ------------------------------------------------------------- service */

static int start_service(void) {
    char *argv[] = { "test_order", "--redis", (char *)url, "--db", dbpath, "--threads", "2",
                     "--lock-workers", "4", "--key-prefix", prefix, "--lock-wait-ms", "2000",
                     NULL };
    svc_log_set_level(SVC_LOG_QUIET);
    if (svc_config_load(&app.cfg, (int)(sizeof argv / sizeof argv[0]) - 1, argv) != 0) return -1;
    app.cfg.listen[0] = '\0';                   /* no HTTP: the order path alone */
    char err[512];
    int rc = svc_start(&app, err, sizeof err);
    if (rc != 0) fprintf(stderr, "svc_start: %s\n", err);
    return rc;
}

/* A product in SQLite, cached, with its stock copy in Redis. */
static svc_product *product(const char *sku, const char *strategy, int segments, long long stock,
                            long long limit) {
    db_product dp = { 0 };
    snprintf(dp.sku, sizeof dp.sku, "%s", sku);
    snprintf(dp.name, sizeof dp.name, "%s", sku);
    snprintf(dp.strategy, sizeof dp.strategy, "%s", strategy);
    dp.segments = segments;
    dp.per_user_limit = limit;
    dp.stock_initial = stock;
    utc_time_format(clock_wall_ms(), dp.created_at);
    db *d = svc_db_take(&app, NULL);
    db_status st = d ? db_product_insert(d, &dp) : DB_ERROR;
    svc_db_give(&app, d);
    if (st != DB_OK) return NULL;
    svc_product *p = svc_product_cache_put(app.products, &dp);
    stock_conn *sc = svc_thread_stock(&app);
    if (p && stock_strategy_about(p->strategy)->uses_redis &&
        stock_load(sc, &p->sp, 1, stock, NULL, 0, 1) != 0)
        return NULL;
    return p;
}

static void submit(svc_product *p, const char *user, int qty, const char *key) {
    svc_order_input in = { p->sku, user, qty, NULL };
    int rc = svc_order_submit(&app, p, &in, key, on_reply, NULL);
    CHECK(rc == 0);
}

/* What the stores say after the orders: SQLite's sold, Redis's units. */
static long long sold_in_db(const char *sku) {
    db_product dp;
    db *d = svc_db_take(&app, NULL);
    long long sold = d && db_product_get(d, sku, &dp) == DB_OK ? dp.sold : -1;
    svc_db_give(&app, d);
    return sold;
}

static long long left_in_redis(svc_product *p) {
    long long total = -1;
    stock_result r = stock_read(svc_thread_stock(&app), &p->sp, &total, NULL);
    return r == STOCK_RESERVED ? total : -1;
}

static void count_pending(const stock_pending *rec, void *ud) {
    (void)rec;
    (*(int *)ud)++;
}

/* Pending records of p left in Redis, once the loops had time to clear
 * them (up to 2 s). */
static int pending_left(svc_product *p) {
    int n = 0;
    for (int i = 0; i < 100; i++) {
        n = 0;
        if (stock_pending_scan(svc_thread_stock(&app), &p->sp, count_pending, &n) != 0) return -1;
        if (n == 0) break;
        clock_sleep_ms(20);
    }
    return n;
}

/* Checks the books of a sale of `stock` units to `orders` buyers of one
 * unit each: exactly the stock sold, once, and the rest refused sold out. */
static void check_sale(svc_product *p, long long stock, int orders) {
    CHECK(wait_replies(orders) == orders);
    long long sold = units_confirmed();
    CHECK(sold == stock);
    CHECK(count(201, NULL) == stock);
    CHECK(count(409, "sold_out") + count(409, "insufficient_stock") == orders - stock);
    CHECK(sold_in_db(p->sku) == stock);
    if (stock_strategy_about(p->strategy)->uses_redis) {
        CHECK(left_in_redis(p) == 0);
        CHECK(pending_left(p) == 0);
    }
    for (int i = 0; i < nreplies; i++) CHECK(replies[i].status == 201 || replies[i].status == 409);
}

/* Submits `orders` one-unit orders from this thread (no loop: through the
 * loops' inboxes) and checks the books. */
static void sale(const char *sku, const char *strategy, int segments, long long stock,
                 int orders) {
    svc_product *p = product(sku, strategy, segments, stock, 0);
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    char user[32];
    for (int i = 0; i < orders; i++) {
        snprintf(user, sizeof user, "u%d", i);
        submit(p, user, 1, NULL);
    }
    check_sale(p, stock, orders);
}

/* --------------------------------------------------------------- states */

static void test_state_moves(void) {
    enum { N = SVC_ORDER_NEW, R = SVC_ORDER_RESERVING, C = SVC_ORDER_COMMITTING,
           L = SVC_ORDER_LOOKING_UP, U = SVC_ORDER_UNDOING, M = SVC_ORDER_MARKING,
           A = SVC_ORDER_ANSWERED };
    static const int allowed[][2] = {
        { N, R }, { R, R }, { R, C }, { R, L }, { R, A }, { C, A }, { C, U }, { C, L }, { C, R },
        { U, A }, { U, L }, { L, A }, { C, M }, { M, A },
    };
    int n = 0;
    for (int from = 0; from < SVC_ORDER_STATES; from++) {
        for (int to = 0; to < SVC_ORDER_STATES; to++) {
            int want = 0;
            for (size_t k = 0; k < sizeof allowed / sizeof allowed[0]; k++)
                want |= allowed[k][0] == from && allowed[k][1] == to;
            if (svc_order_may((svc_order_state)from, (svc_order_state)to) != want) {
                fprintf(stderr, "  move %s -> %s: %s\n", svc_order_state_name(from),
                        svc_order_state_name(to), want ? "refused" : "allowed");
                CHECK(0);
            }
            n += want;
        }
    }
    CHECK(n == 14);
    /* Nothing leaves ANSWERED; nothing skips the reservation. */
    CHECK(!svc_order_may(SVC_ORDER_ANSWERED, SVC_ORDER_RESERVING));
    CHECK(!svc_order_may(SVC_ORDER_NEW, SVC_ORDER_ANSWERED));
    CHECK(!svc_order_may(SVC_ORDER_LOOKING_UP, SVC_ORDER_UNDOING));
    CHECK(!svc_order_may(SVC_ORDER_STATES, SVC_ORDER_NEW));
    CHECK_STR(svc_order_state_name(SVC_ORDER_UNDOING), "undoing");
    /* The refusal table: the contract's statuses and codes. */
    CHECK(svc_refusal_status(RF_SOLD_OUT) == 409);
    CHECK_STR(svc_refusal_code(RF_SOLD_OUT), "sold_out");
    CHECK(svc_refusal_status(RF_KEY_REUSED) == 422);
    CHECK(svc_refusal_status(RF_FENCED) == 429);
    CHECK_STR(svc_refusal_code(RF_FENCED), "lock_timeout");
    CHECK_STR(svc_refusal_code(RF_STALE), "redis_unavailable");
    CHECK(svc_refusal_status(RF_LOCK_DOWN) == 503);
    for (int rf = 0; rf < RF_COUNT; rf++) {
        int s = svc_refusal_status((svc_refusal)rf);
        CHECK(s == 409 || s == 422 || s == 429 || s == 503);
        CHECK(svc_refusal_code((svc_refusal)rf)[0] != '\0');
    }
}

/* ------------------------------------------------------------- families */

static void test_script_family(void) {
    sale("t-lua", "lua", 1, 50, 80);
    /* Answered on the loops, where the commits come back; a sold-out
     * remembered (--soldout-cache-ms) is answered at once, on the thread
     * that submitted the order. */
    for (int i = 0; i < nreplies; i++)
        CHECK(replies[i].on_loop || (replies[i].status == 409 && !strcmp(replies[i].code,
                                                                         "sold_out")));
    sale("t-lua-seg", "lua", 4, 40, 60);
}

/* Orders submitted on a loop's own thread stay there (no inbox). */
typedef struct on_loop_job {
    loop_task task;
    svc_product *p;
    int n;
} on_loop_job;

static void submit_on_loop(loop *l, void *ud) {
    on_loop_job *j = ud;
    char user[32];
    (void)l;
    CHECK(loop_current() != NULL);
    for (int i = 0; i < j->n; i++) {
        snprintf(user, sizeof user, "l%d", i);
        submit(j->p, user, 1, NULL);
    }
}

static void test_submit_on_a_loop(void) {
    svc_product *p = product("t-onloop", "lua", 1, 30, 0);
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    static on_loop_job j;
    j = (on_loop_job){ .task = { submit_on_loop, &j, NULL }, .p = p, .n = 45 };
    loop_post(app.loops[0], &j.task);
    check_sale(p, 30, 45);
}

static void test_replays(void) {
    svc_product *p = product("t-replay", "lua", 1, 10, 0);
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    submit(p, "alice", 2, "key-1");
    CHECK(wait_replies(1) == 1);
    submit(p, "alice", 2, "key-1");                /* the same request: a replay */
    CHECK(wait_replies(2) == 2);
    submit(p, "alice", 3, "key-1");                /* another request, same key */
    CHECK(wait_replies(3) == 3);
    CHECK(replies[0].status == 201);
    CHECK(replies[1].status == 200);
    CHECK_STR(replies[1].order_id, replies[0].order_id);
    CHECK(replies[2].status == 422);
    CHECK_STR(replies[2].code, "idempotency_key_reused");
    CHECK(sold_in_db(p->sku) == 2);
    CHECK(left_in_redis(p) == 8);
}

static void test_per_user_limit(void) {
    svc_product *p = product("t-limit", "lua", 2, 100, 3);
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    for (int i = 0; i < 5; i++) submit(p, "bob", 1, NULL);
    CHECK(wait_replies(5) == 5);
    CHECK(count(201, NULL) == 3);
    CHECK(count(409, "per_user_limit") == 2);
    CHECK(sold_in_db(p->sku) == 3);
    CHECK(left_in_redis(p) == 97);
}

static void test_lock_family(void) {
    sale("t-lock", "lock", 1, 25, 40);
    sale("t-lock-seg", "lock", 4, 40, 70);
    /* Orders bigger than any one segment holds: the lock family hands them
     * to the blocking family, which reads every segment. */
    svc_product *p = product("t-lock-big", "lock", 4, 8, 0);
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    submit(p, "carol", 5, NULL);
    submit(p, "dave", 5, NULL);
    CHECK(wait_replies(2) == 2);
    CHECK(count(201, NULL) == 1);
    CHECK(count(409, "insufficient_stock") == 1);
    CHECK(sold_in_db(p->sku) == 5);
    CHECK(left_in_redis(p) == 3);
    CHECK(pending_left(p) == 0);
}

static void test_blocking_family(void) {
    sale("t-local", "local", 1, 20, 35);
    sale("t-dblock", "db-lock", 2, 15, 25);
}

static void test_db_family(void) {
    sale("t-db", "db", 1, 30, 50);
    sale("t-dbopt", "db-optimistic", 1, 12, 20);
}

/* A lost stock copy: the order is refused 503 and the copy rebuilt from
 * SQLite by the repair queue, after which the sale goes on exactly. */
static void test_missing_copy_is_rebuilt(void) {
    svc_product *p = product("t-lost", "lua", 1, 10, 0);
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    submit(p, "erin", 4, NULL);
    CHECK(wait_replies(1) == 1);
    char key[128];
    stock_key(key, sizeof key, prefix, p->sku, "gen");
    redisContext *raw = traw_connect(url);
    CHECK(raw != NULL);
    if (!raw) return;
    redisReply *r = redisCommand(raw, "DEL %s", key);
    if (r) freeReplyObject(r);
    redisFree(raw);
    submit(p, "erin", 1, NULL);
    CHECK(wait_replies(2) == 2);
    CHECK(replies[1].status == 503);
    CHECK_STR(replies[1].code, "redis_unavailable");
    /* The repair queue rebuilds it as stock_initial - sold = 6. */
    long long left = -1;
    for (int i = 0; i < 100 && left != 6; i++) {
        clock_sleep_ms(20);
        left = left_in_redis(p);
    }
    CHECK(left == 6);
    submit(p, "erin", 6, NULL);
    CHECK(wait_replies(3) == 3);
    CHECK(replies[2].status == 201);
    CHECK(sold_in_db(p->sku) == 10);
}

/* A copy whose generation is behind SQLite's (a rebuild began a new
 * generation but could not load Redis: the copy still looks valid for the
 * running Redis) sells nothing that can commit; the first order refused
 * that way asks for the copy to be loaded again, and sales resume. */
static void test_copy_behind_sqlite_is_reloaded(void) {
    svc_product *p = product("t-behind", "lua", 2, 20, 0);
    db_product dp;
    CHECK(p != NULL);
    if (!p) return;
    reset_replies();
    submit(p, "gina", 2, NULL);
    CHECK(wait_replies(1) == 1 && replies[0].status == 201);
    db *d = svc_db_take(&app, NULL);
    CHECK(d && db_product_new_gen(d, p->sku, 0, &dp, NULL, NULL) == DB_OK);  /* SQLite only */
    svc_db_give(&app, d);
    submit(p, "gina", 1, NULL);
    CHECK(wait_replies(2) == 2);
    CHECK(replies[1].status == 503);
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        clock_sleep_ms(20);
        submit(p, "gina", 1, NULL);
        CHECK(wait_replies(3 + i) == 3 + i);
        ok = replies[2 + i].status == 201;
    }
    CHECK(ok);
    CHECK(sold_in_db(p->sku) == 3);
    CHECK(left_in_redis(p) == 17);
}

/* A start that fails half way (the database cannot be opened, after the
 * lock clients, the product cache and the repair queue were made) undoes
 * itself: everything it made is freed (the sanitizer build's leak check
 * and valgrind see the rest), and the same struct starts cleanly after. */
static void test_failed_start_is_undone(void) {
    static svc_app other;
    char err[512];
    char *argv[] = { "test_order", "--redis", (char *)url, "--db",
                     "/nonexistent-dir/orders.db", "--threads", "1", NULL };
    CHECK(svc_config_load(&other.cfg, (int)(sizeof argv / sizeof argv[0]) - 1, argv) == 0);
    other.cfg.listen[0] = '\0';
    CHECK(svc_start(&other, err, sizeof err) == 1);
    CHECK(strstr(err, "nonexistent-dir") != NULL);
    CHECK(other.products == NULL && other.repair == NULL && other.writer == NULL &&
          other.loops == NULL);
    snprintf(other.cfg.db_path, sizeof other.cfg.db_path, "%s.other", dbpath);
    CHECK(svc_start(&other, err, sizeof err) == 0);
    svc_stop(&other);
    char p[300];
    snprintf(p, sizeof p, "%s.other", dbpath);
    unlink(p);
    snprintf(p, sizeof p, "%s.other-wal", dbpath);
    unlink(p);
    snprintf(p, sizeof p, "%s.other-shm", dbpath);
    unlink(p);
}

static void test_stop(void) {
    if (!started) return;
    svc_stop(&app);
    started = 0;
    /* Stopped means stopped: the threads are gone and what they held freed
     * (valgrind and the sanitizer build check the rest). */
    CHECK(app.loops == NULL && app.order_loops == NULL && app.writer == NULL);
}

static void setup(void) {
    url = getenv("FLASHSALE_TEST_REDIS");
    if (!url) url = "redis://127.0.0.1:6379/0";
    snprintf(dbpath, sizeof dbpath, "/tmp/test_order_%d.db", (int)getpid());
    snprintf(prefix, sizeof prefix, "tord%d:", (int)getpid());
    if (start_service() != 0) {
        fprintf(stderr, "cannot start the service\n");
        exit(1);
    }
    started = 1;
}

static void cleanup(void) {
    char p[300];
    unlink(dbpath);
    snprintf(p, sizeof p, "%s-wal", dbpath);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", dbpath);
    unlink(p);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_state_moves), T(test_script_family), T(test_submit_on_a_loop), T(test_replays),
        T(test_per_user_limit), T(test_lock_family), T(test_blocking_family), T(test_db_family),
        T(test_missing_copy_is_rebuilt), T(test_copy_behind_sqlite_is_reloaded),
        T(test_failed_start_is_undone), T(test_stop),
    };
    setup();
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    if (started) svc_stop(&app);
    cleanup();
    return rc;
}
