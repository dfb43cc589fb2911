/* test_stock.c: the stock module against a real redis-server (the runner
 * passes its URL in FLASHSALE_TEST_REDIS): the reserve script's every
 * answer, undo's idempotence, generations, segments, restock, NOSCRIPT. */
#include <hiredis/hiredis.h>

#include "common/rconn.h"
#include "stock/stock.h"
#include "tests/unit/t.h"

static const char *url;
static redisContext *raw;          /* a plain connection to look and poke */
static stock_conn *sc;

static long long get_ll(const char *key) {
    redisReply *r = redisCommand(raw, "GET %s", key);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -999;
    if (r) freeReplyObject(r);
    return v;
}

static void cmd(const char *fmt, const char *arg) {
    redisReply *r = redisCommand(raw, fmt, arg);
    if (r) freeReplyObject(r);
}

static stock_req req(const stock_product *p, const char *id, const char *user, int qty,
                     const char *key, const char *fp) {
    return (stock_req){ .product = p, .order_id = id, .user_id = user, .quantity = qty,
                        .idem_key = key, .fingerprint = fp };
}

static stock_result reserve1(stock_req *r) {
    stock_req *rs[1] = { r };
    stock_reserve(sc, rs, 1);
    return r->result;
}

static void test_reserve_answers(void) {
    stock_product p = { .sku = "t-ans", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 0 };
    CHECK(stock_load(sc, &p, 1, 5, NULL, 0, 1) == 0);
    stock_req a = req(&p, "o1", "u", 3, NULL, "fp");
    CHECK(reserve1(&a) == STOCK_RESERVED && a.gen == 1);
    stock_req b = req(&p, "o2", "u", 3, NULL, "fp");
    CHECK(reserve1(&b) == STOCK_INSUFFICIENT && b.available == 2);
    stock_req c = req(&p, "o3", "u", 2, NULL, "fp");
    CHECK(reserve1(&c) == STOCK_RESERVED);
    stock_req d = req(&p, "o4", "u", 1, NULL, "fp");
    CHECK(reserve1(&d) == STOCK_SOLD_OUT);
    CHECK(get_ll("fs:{t-ans}:stock:0") == 0);
    long long total;
    CHECK(stock_read(sc, &p, &total, NULL) == STOCK_RESERVED && total == 0);
}

static int npending;
static void count_pending(const stock_pending *rec, void *ud) {
    (void)ud;
    if (!strcmp(rec->order_id, "u1") && rec->quantity == 4 && rec->age_ms >= 0 &&
        rec->age_ms < 60000 && !strcmp(rec->idem_key, "key-u1"))
        npending++;
}

static void test_pending_confirm_undo(void) {
    stock_product p = { .sku = "t-undo", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 2 };
    CHECK(stock_load(sc, &p, 1, 10, NULL, 0, 1) == 0);
    stock_req a = req(&p, "u1", "alice", 4, "key-u1", "fpA");
    CHECK(reserve1(&a) == STOCK_LIMIT && a.available == 0);   /* 4 > limit 2 */
    p.per_user_limit = 0;
    CHECK(reserve1(&a) == STOCK_RESERVED);
    npending = 0;
    CHECK(stock_pending_scan(sc, &p, count_pending, NULL) == 0 && npending == 1);
    stock_ref ref = { &p, "u1", "key-u1" };
    int done = 0;
    CHECK(stock_undo(sc, &ref, 1, &done) == 0 && done);
    CHECK(get_ll("fs:{t-undo}:stock:0") == 10);
    CHECK(stock_undo(sc, &ref, 1, &done) == 0 && done);        /* again: no double give-back */
    CHECK(get_ll("fs:{t-undo}:stock:0") == 10);
    /* The key was freed with the undo: the same key reserves anew. */
    CHECK(reserve1(&a) == STOCK_RESERVED);
    CHECK(stock_confirm(sc, &ref, 1) == 0);
    npending = 0;
    CHECK(stock_pending_scan(sc, &p, count_pending, NULL) == 0 && npending == 0);
    CHECK(stock_undo(sc, &ref, 1, &done) == 0);                 /* confirmed: undo is a no-op */
    CHECK(get_ll("fs:{t-undo}:stock:0") == 6);
}

static void test_replays(void) {
    stock_product p = { .sku = "t-rep", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 0 };
    CHECK(stock_load(sc, &p, 1, 10, NULL, 0, 1) == 0);
    stock_req a = req(&p, "r1", "u", 1, "k", "same");
    CHECK(reserve1(&a) == STOCK_RESERVED);
    stock_req b = req(&p, "r2", "u", 1, "k", "same");
    CHECK(reserve1(&b) == STOCK_REPLAY && b.replay_same && !strcmp(b.replay_order_id, "r1"));
    stock_req c = req(&p, "r3", "u", 2, "k", "other");
    CHECK(reserve1(&c) == STOCK_REPLAY && !c.replay_same);
    CHECK(get_ll("fs:{t-rep}:stock:0") == 9);                    /* replays took nothing */
    /* A new generation forgets the old generation's records. */
    CHECK(stock_load(sc, &p, 2, 9, NULL, 0, 0) == 0);
    CHECK(reserve1(&b) == STOCK_RESERVED && b.gen == 2);
}

static void test_limit_counts(void) {
    stock_product p = { .sku = "t-lim", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 3 };
    stock_user_units users[] = { { "bob", 2 } };
    CHECK(stock_load(sc, &p, 1, 10, users, 1, 1) == 0);
    stock_req a = req(&p, "l1", "bob", 2, NULL, "f");
    CHECK(reserve1(&a) == STOCK_LIMIT && a.available == 2);
    stock_req b = req(&p, "l2", "bob", 1, NULL, "f");
    CHECK(reserve1(&b) == STOCK_RESERVED);
    stock_ref ref = { &p, "l2", NULL };
    int done;
    CHECK(stock_undo(sc, &ref, 1, &done) == 0 && done);        /* gives the count back too */
    CHECK(reserve1(&b) == STOCK_RESERVED);
}

static void test_generation_and_run_id(void) {
    stock_product p = { .sku = "t-gen", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 0 };
    CHECK(stock_load(sc, &p, 3, 10, NULL, 0, 1) == 0);
    CHECK(stock_load(sc, &p, 3, 99, NULL, 0, 0) == 1);          /* same generation: left alone */
    CHECK(stock_load(sc, &p, 2, 99, NULL, 0, 0) == 1);          /* older: left alone */
    long long total, gen;
    CHECK(stock_read(sc, &p, &total, NULL) == STOCK_RESERVED && total == 10);
    CHECK(stock_read_gen(sc, &p, &gen) == STOCK_RESERVED && gen == 3);
    /* A copy built for another Redis process (a restart) is not valid. */
    cmd("SET fs:{t-gen}:gen %s", "3:0000000000000000000000000000000000000000");
    stock_req a = req(&p, "g1", "u", 1, NULL, "f");
    CHECK(reserve1(&a) == STOCK_MISSING);
    CHECK(stock_read(sc, &p, &total, NULL) == STOCK_MISSING);
    CHECK(stock_restock(sc, &p, 5) == STOCK_MISSING);
    CHECK(stock_read_gen(sc, &p, &gen) == STOCK_RESERVED && gen == 3);
    CHECK(stock_load(sc, &p, 3, 7, NULL, 0, 0) == 0);           /* other run: reload */
    CHECK(reserve1(&a) == STOCK_RESERVED);
    cmd("DEL %s", "fs:{t-gen}:gen");                              /* data lost */
    CHECK(reserve1(&a) == STOCK_MISSING);
    CHECK(stock_read_gen(sc, &p, &gen) == STOCK_RESERVED && gen == 0);
}

static void test_segments(void) {
    stock_product p = { .sku = "t-seg", .strategy = STOCK_LUA, .segments = 8, .per_user_limit = 0 };
    CHECK(stock_load(sc, &p, 1, 10, NULL, 0, 1) == 0);
    long long seg[8], total;
    CHECK(stock_read(sc, &p, &total, seg) == STOCK_RESERVED && total == 10);
    CHECK(seg[0] == 2 && seg[1] == 2 && seg[2] == 1 && seg[7] == 1);
    /* Quantity 3 is more than any segment holds: taken across segments, and
     * never "sold out" while 3 remain in total. */
    int sold = 0;
    char id[16];
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof id, "s%d", i);
        stock_req r = req(&p, id, "u", 3, NULL, "f");
        stock_result res = reserve1(&r);
        if (res == STOCK_RESERVED) sold += 3;
        else CHECK(res == STOCK_INSUFFICIENT && r.available == 10 - sold);
    }
    CHECK(sold == 9);
    CHECK(stock_read(sc, &p, &total, seg) == STOCK_RESERVED && total == 1);
    for (int i = 0; i < 8; i++) CHECK(seg[i] >= 0);
    /* Undo of a cross-segment order puts each part back where it came from. */
    stock_ref ref = { &p, "s0", NULL };
    int done;
    CHECK(stock_undo(sc, &ref, 1, &done) == 0 && done);
    CHECK(stock_read(sc, &p, &total, seg) == STOCK_RESERVED && total == 4);
    CHECK(stock_restock(sc, &p, 12) == STOCK_RESERVED);
    CHECK(stock_read(sc, &p, &total, seg) == STOCK_RESERVED && total == 16);
    for (int i = 0; i < 8; i++) CHECK(seg[i] >= 1 && seg[i] <= 3);
}

static void test_noscript_fallback(void) {
    stock_product p = { .sku = "t-nos", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 0 };
    CHECK(stock_load(sc, &p, 1, 4, NULL, 0, 1) == 0);
    cmd("SCRIPT FLUSH%s", "");
    stock_req a = req(&p, "n1", "u", 1, NULL, "f"), b = req(&p, "n2", "u", 1, NULL, "f");
    stock_req *rs[2] = { &a, &b };
    CHECK(stock_reserve(sc, rs, 2) == 0);
    CHECK(a.result == STOCK_RESERVED && b.result == STOCK_RESERVED);
    cmd("SCRIPT FLUSH%s", "");
    stock_ref refs[2] = { { &p, "n1", NULL }, { &p, "n2", NULL } };
    int done[2];
    CHECK(stock_undo(sc, refs, 2, done) == 0 && done[0] && done[1]);
    CHECK(get_ll("fs:{t-nos}:stock:0") == 4);
}

extern const char stock_lua_read[], stock_lua_write[];

/* The lock strategy's fence: once a holder with token 7 has read a segment,
 * a write by an older holder (token 5, whose lease ran out while it was
 * paused) is refused whole; the newer holder's write goes through. */
static void test_fenced_write(void) {
    stock_product p = { .sku = "t-fence", .strategy = STOCK_LOCK, .segments = 1 };
    char run_id[41];
    CHECK(stock_load(sc, &p, 1, 5, NULL, 0, 1) == 0);
    CHECK(rconn_run_id(raw, run_id) == 0);
    redisReply *r = redisCommand(raw, "EVAL %s 5 fs:{t-fence}:gen fs:{t-fence}:users "
                                 "fs:{t-fence}:idem: fs:{t-fence}:stock:0 fs:{t-fence}:fence:0 "
                                 "%s u 1 7", stock_lua_read, run_id);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 4 && r->element[3]->integer == 5);
    if (r) freeReplyObject(r);
    CHECK(get_ll("fs:{t-fence}:fence:0") == 7);
    /* The stale holder (token 5) read 5 earlier and now writes 4. */
    const char *write_fmt = "EVAL %s 7 fs:{t-fence}:gen fs:{t-fence}:pending fs:{t-fence}:users "
                            "fs:{t-fence}:idem: fs:{t-fence}:empty fs:{t-fence}:stock:0 "
                            "fs:{t-fence}:fence:0 %s 1 %s u 1 0 %s inst 1000 %s set 0 4 1 %s";
    r = redisCommand(raw, write_fmt, stock_lua_write, run_id, "stale", "", "", "5");
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == -4);
    if (r) freeReplyObject(r);
    CHECK(get_ll("fs:{t-fence}:stock:0") == 5);                  /* nothing written */
    redisReply *h = redisCommand(raw, "HLEN fs:{t-fence}:pending");
    CHECK(h && h->integer == 0);
    if (h) freeReplyObject(h);
    r = redisCommand(raw, write_fmt, stock_lua_write, run_id, "fresh", "", "", "7");
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == 1);
    if (r) freeReplyObject(r);
    CHECK(get_ll("fs:{t-fence}:stock:0") == 4);
    /* A read by the stale holder now is refused too. */
    r = redisCommand(raw, "EVAL %s 5 fs:{t-fence}:gen fs:{t-fence}:users fs:{t-fence}:idem: "
                     "fs:{t-fence}:stock:0 fs:{t-fence}:fence:0 %s u 1 5", stock_lua_read, run_id);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == -4);
    if (r) freeReplyObject(r);
}

static void test_unreachable(void) {
    stock_config cfg = { .redis_url = "redis://127.0.0.1:1/0", .prefix = "fs:", .timeout_ms = 200,
                         .instance = "test" };
    char err[200];
    stock_conn *bad = stock_conn_new(&cfg, err, sizeof err);
    CHECK(bad != NULL);
    stock_product p = { .sku = "t-x", .strategy = STOCK_LUA, .segments = 1, .per_user_limit = 0 };
    stock_req a = req(&p, "x1", "u", 1, NULL, "f");
    stock_req *rs[1] = { &a };
    CHECK(stock_reserve(bad, rs, 1) == -1);
    CHECK(a.result == STOCK_UNAVAILABLE && !a.outcome_unknown);  /* never sent */
    CHECK(strstr(stock_conn_errstr(bad), "connect") != NULL);
    stock_conn_free(bad);
    cfg.redis_url = "nonsense://x";
    CHECK(stock_conn_new(&cfg, err, sizeof err) == NULL);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_reserve_answers), T(test_pending_confirm_undo), T(test_replays),
        T(test_limit_counts), T(test_generation_and_run_id), T(test_segments),
        T(test_noscript_fallback), T(test_fenced_write), T(test_unreachable),
    };
    char err[200];
    rconn_addr a;
    url = getenv("FLASHSALE_TEST_REDIS");
    if (!url) {
        fprintf(stderr, "FLASHSALE_TEST_REDIS is not set (run through tests/run.py)\n");
        printf("0 passed, 1 failed\n");
        return 1;
    }
    if (rconn_parse(url, &a, err, sizeof err) || !(raw = rconn_connect(&a, 2000, err, sizeof err))) {
        fprintf(stderr, "redis: %s\n", err);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    stock_config cfg = { .redis_url = url, .prefix = "fs:", .timeout_ms = 2000,
                         .instance = "test-instance", .idem_ttl_ms = 60000 };
    sc = stock_conn_new(&cfg, err, sizeof err);
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    stock_conn_free(sc);
    redisFree(raw);
    return rc;
}
