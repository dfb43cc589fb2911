/* test_stock.c: the stock module against a real redis-server (the runner
 * passes its URL in FLASHSALE_TEST_REDIS): the reserve script's every
 * answer, undo's idempotence, generations, segments, restock, NOSCRIPT,
 * and the `lock` strategy's loop path sharing one lock with the lock
 * module. */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#include "common/loop.h"
#include "common/rconn.h"
#include "lock/lock.h"
#include "stock/stock.h"
#include "tests/unit/t.h"
#include "tests/unit/traw.h"

static const char *url;
static stock_conn *sc;

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
    CHECK(traw_int("GET %s", "fs:{t-ans}:stock:0") == 0);
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
    stock_ref ref = { &p, "u1", "key-u1", NULL };
    int done = 0;
    CHECK(stock_undo(sc, &ref, 1, &done) == 0 && done);
    CHECK(traw_int("GET %s", "fs:{t-undo}:stock:0") == 10);
    CHECK(stock_undo(sc, &ref, 1, &done) == 0 && done);        /* again: no double give-back */
    CHECK(traw_int("GET %s", "fs:{t-undo}:stock:0") == 10);
    /* The key was freed with the undo: the same key reserves anew. */
    CHECK(reserve1(&a) == STOCK_RESERVED);
    CHECK(stock_confirm(sc, &ref, 1) == 0);
    npending = 0;
    CHECK(stock_pending_scan(sc, &p, count_pending, NULL) == 0 && npending == 0);
    CHECK(stock_undo(sc, &ref, 1, &done) == 0);                 /* confirmed: undo is a no-op */
    CHECK(traw_int("GET %s", "fs:{t-undo}:stock:0") == 6);
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
    CHECK(traw_int("GET %s", "fs:{t-rep}:stock:0") == 9);           /* replays took nothing */
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
    stock_ref ref = { &p, "l2", NULL, NULL };
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
    traw_cmd("SET fs:{t-gen}:gen %s", "3:0000000000000000000000000000000000000000");
    stock_req a = req(&p, "g1", "u", 1, NULL, "f");
    CHECK(reserve1(&a) == STOCK_MISSING);
    CHECK(stock_read(sc, &p, &total, NULL) == STOCK_MISSING);
    CHECK(stock_restock(sc, &p, 5) == STOCK_MISSING);
    CHECK(stock_read_gen(sc, &p, &gen) == STOCK_RESERVED && gen == 3);
    CHECK(stock_load(sc, &p, 3, 7, NULL, 0, 0) == 0);           /* other run: reload */
    CHECK(reserve1(&a) == STOCK_RESERVED);
    traw_cmd("DEL %s", "fs:{t-gen}:gen");                              /* data lost */
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
    stock_ref ref = { &p, "s0", NULL, NULL };
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
    traw_cmd("SCRIPT FLUSH%s", "");
    stock_req a = req(&p, "n1", "u", 1, NULL, "f"), b = req(&p, "n2", "u", 1, NULL, "f");
    stock_req *rs[2] = { &a, &b };
    CHECK(stock_reserve(sc, rs, 2) == 0);
    CHECK(a.result == STOCK_RESERVED && b.result == STOCK_RESERVED);
    traw_cmd("SCRIPT FLUSH%s", "");
    stock_ref refs[2] = { { &p, "n1", NULL, NULL }, { &p, "n2", NULL, NULL } };
    int done[2];
    CHECK(stock_undo(sc, refs, 2, done) == 0 && done[0] && done[1]);
    CHECK(traw_int("GET %s", "fs:{t-nos}:stock:0") == 4);
}

extern const char stock_lua_read[], stock_lua_write[];

#define UNNAMED "0000000000000000"

/* The lock strategy's fence: once a holder with token 7 has read a segment,
 * a write by an older holder (token 5, whose lease ran out while it was
 * paused) is refused whole; the newer holder's write goes through. Its
 * tokens are unnamed (no incarnation: rcw.c says why), so the fence stays
 * a plain integer. (Incarnations: tests/unit/test_fence.c.) */
static void test_fenced_write(void) {
    stock_product p = { .sku = "t-fence", .strategy = STOCK_LOCK, .segments = 1 };
    char run_id[41];
    char *read = lock_script_compose(stock_lua_read), *write = lock_script_compose(stock_lua_write);
    CHECK(stock_load(sc, &p, 1, 5, NULL, 0, 1) == 0);
    CHECK(rconn_run_id(traw_conn, run_id) == 0);
    redisReply *r = redisCommand(traw_conn, "EVAL %s 5 fs:{t-fence}:gen fs:{t-fence}:users "
                                 "fs:{t-fence}:idem: fs:{t-fence}:stock:0 fs:{t-fence}:fence:0 "
                                 "%s u 1 7 " UNNAMED, read, run_id);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 5 && r->element[3]->integer == 5 &&
          r->element[4]->integer == 0);
    if (r) freeReplyObject(r);
    CHECK(traw_int("GET %s", "fs:{t-fence}:fence:0") == 7);
    /* The stale holder (token 5) read 5 earlier and now writes 4. */
    const char *write_fmt = "EVAL %s 7 fs:{t-fence}:gen fs:{t-fence}:pending fs:{t-fence}:users "
                            "fs:{t-fence}:idem: fs:{t-fence}:empty fs:{t-fence}:stock:0 "
                            "fs:{t-fence}:fence:0 %s 1 %s u 1 0 %s inst 1000 %s set 0 4 1 %s "
                            UNNAMED " 0";
    r = redisCommand(traw_conn, write_fmt, write, run_id, "stale", "", "", "5");
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == -4);
    if (r) freeReplyObject(r);
    CHECK(traw_int("GET %s", "fs:{t-fence}:stock:0") == 5);                  /* nothing written */
    redisReply *h = redisCommand(traw_conn, "HLEN fs:{t-fence}:pending");
    CHECK(h && h->integer == 0);
    if (h) freeReplyObject(h);
    r = redisCommand(traw_conn, write_fmt, write, run_id, "fresh", "", "", "7");
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == 1);
    if (r) freeReplyObject(r);
    CHECK(traw_int("GET %s", "fs:{t-fence}:stock:0") == 4);
    CHECK(traw_int("GET %s", "fs:{t-fence}:fence:0") == 7);         /* still the old form */
    /* A read by the stale holder now is refused too. */
    r = redisCommand(traw_conn, "EVAL %s 5 fs:{t-fence}:gen fs:{t-fence}:users fs:{t-fence}:idem: "
                     "fs:{t-fence}:stock:0 fs:{t-fence}:fence:0 %s u 1 5 " UNNAMED, read, run_id);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == -4);
    if (r) freeReplyObject(r);
    free(read);
    free(write);
}

/* ------------------------------------------- the loop path's lock, shared */

/* The `lock` strategy's loop path (stock_async_lock_read / _write) on an
 * event loop of its own thread, called from the test's thread one call at
 * a time. */
typedef struct loop_side {
    loop *l;
    stock_async *sa;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    loop_task task;
    int write;                    /* the call: 0 lock_read, 1 lock_write (release only) */
    stock_req *r;
    stock_hold *h;
    int done, res;
} loop_side;

static void *side_main(void *ud) {
    loop_run(((loop_side *)ud)->l);
    return NULL;
}

static void side_answer(void *ud, int res) {
    loop_side *s = ud;
    pthread_mutex_lock(&s->mu);
    s->res = res;
    s->done = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* On the loop's thread: sends the call the test asked for. */
static void side_send(loop *l, void *ud) {
    loop_side *s = ud;
    (void)l;
    if (s->write) stock_async_lock_write(s->sa, s->r, s->h, 0, side_answer, s);
    else stock_async_lock_read(s->sa, s->r, s->h, 5000, side_answer, s);
}

/* Runs one call on the loop and returns its res (-99: no answer in 5 s). */
static int side_call(loop_side *s, int write) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    s->write = write;
    s->done = 0;
    s->task = (loop_task){ side_send, s, NULL };
    loop_post(s->l, &s->task);
    pthread_mutex_lock(&s->mu);
    while (!s->done && pthread_cond_timedwait(&s->cv, &s->mu, &until) != ETIMEDOUT) {}
    int res = s->done ? s->res : -99;
    pthread_mutex_unlock(&s->mu);
    return res;
}

static int side_start(loop_side *s, stock_req *r, stock_hold *h) {
    char err[200];
    stock_config cfg = { .redis_url = url, .prefix = "fs:", .timeout_ms = 2000,
                         .instance = "test-loop", .idem_ttl_ms = 60000 };
    *s = (loop_side){ .r = r, .h = h };
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!(s->l = loop_new(err, sizeof err))) goto err;
    if (!(s->sa = stock_async_new(s->l, &cfg, err, sizeof err))) goto err;
    if (pthread_create(&s->thread, NULL, side_main, s) != 0) goto err;
    return 0;
err:
    fprintf(stderr, "  loop side: %s\n", err);
    stock_async_free(s->sa);
    if (s->l) loop_free(s->l);
    return -1;
}

static void side_stop(loop_side *s) {
    loop_stop(s->l);
    pthread_join(s->thread, NULL);
    stock_async_free(s->sa);
    loop_free(s->l);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

typedef struct waiter {
    lock_client *lc;
    const char *name;
    lock_status st;
    lock_handle *h;
} waiter;

static void *waiter_main(void *ud) {
    waiter *w = ud;
    char err[200];
    w->st = lock_acquire(w->lc, w->name, 5000, 5000, NULL, &w->h, err, sizeof err);
    return NULL;
}

static long long zcard(const char *key) {
    redisReply *r = redisCommand(traw_conn, "ZCARD %s", key);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return n;
}

/* The loop path's lock_read/lock_write take and free the lock module's own
 * lock (they are built on its format, lock_script_compose): a lock held
 * through lock.h keeps lock_read out, a lock taken by lock_read keeps
 * lock_acquire out, tokens come from one counter, lock_write's release
 * wakes a lock_acquire waiting on the blocking path, and it never frees a
 * lock that another owner holds. */
static void test_lock_module_and_loop_path_exclude(void) {
    static const char *name = "fs:{t-excl}:lock:0";
    stock_product p = { .sku = "t-excl", .strategy = STOCK_LOCK, .segments = 1 };
    const char *const urls[] = { url };
    lock_options o = { .urls = urls, .nurls = 1, .timeout_ms = 2000 };
    stock_req r = req(&p, "x1", "u", 1, NULL, "f");
    stock_hold h = { .seg = 0 };
    loop_side side;
    lock_handle *lh = NULL;
    char err[200];
    CHECK(stock_load(sc, &p, 1, 5, NULL, 0, 1) == 0);
    lock_client *lc = lock_client_new(&o, err, sizeof err);
    CHECK(lc != NULL);
    if (!lc) return;
    if (side_start(&side, &r, &h) != 0) {
        CHECK(!"the loop side starts");
        lock_client_free(lc);
        return;
    }
    /* The connection comes up in the background: until then lock_read
     * fails at once (-1, nothing sent). */
    int res = -1;
    for (int i = 0; i < 200 && res == -1; i++) {
        res = side_call(&side, 0);
        if (res == -1) usleep(10000);
    }
    CHECK(res == 1);                                    /* free: taken */
    uint64_t loop_token = h.token;
    CHECK(side_call(&side, 1) == 0);                    /* released */

    /* Held through the lock module: lock_read finds it held, takes nothing. */
    CHECK(lock_acquire(lc, name, 5000, 0, NULL, &lh, err, sizeof err) == LOCK_OK);
    CHECK(lh && lock_fence(lh) > loop_token);
    CHECK(side_call(&side, 0) == 0 && h.pttl > 0 && h.pttl <= 5000);
    uint64_t module_token = lh ? lock_fence(lh) : 0;
    CHECK(lh && lock_release(lh) == LOCK_RELEASED);

    /* Held by the loop path: the lock module is kept out... */
    CHECK(side_call(&side, 0) == 1 && h.token > module_token);
    lh = NULL;
    CHECK(lock_acquire(lc, name, 5000, 0, NULL, &lh, err, sizeof err) == LOCK_BUSY && !lh);
    /* ...and a waiter of the blocking path, once queued, is woken by
     * lock_write's release and takes it with a later token. */
    lock_stats before, after;
    lock_client_stats(lc, &before);
    waiter w = { lc, name, LOCK_ERROR, NULL };
    pthread_t wt;
    CHECK(pthread_create(&wt, NULL, waiter_main, &w) == 0);
    for (int i = 0; i < 500 && zcard("fs:{t-excl}:lock:0:waiters") < 1; i++) usleep(2000);
    CHECK(zcard("fs:{t-excl}:lock:0:waiters") == 1);
    CHECK(side_call(&side, 1) == 0);
    pthread_join(wt, NULL);
    lock_client_stats(lc, &after);
    CHECK(w.st == LOCK_OK && w.h && lock_fence(w.h) > h.token);
    CHECK(after.wakeups > before.wakeups);

    /* lock_write's release by a former owner leaves the new holder's lock. */
    CHECK(side_call(&side, 1) == 0);
    redisReply *e = redisCommand(traw_conn, "EXISTS %s", name);
    CHECK(e && e->type == REDIS_REPLY_INTEGER && e->integer == 1);
    if (e) freeReplyObject(e);
    CHECK(w.h && lock_release(w.h) == LOCK_RELEASED);
    side_stop(&side);
    lock_client_free(lc);
}

/* The arithmetic of forgetting: which buckets a raise may delete, and
 * the watermark's two bounds. */
static void test_returned_arithmetic(void) {
    const long long B = STOCK_RETURNED_BUCKET_MS;
    long long first, end;
    stock_returned_span(0, 100 * B + 5, &first, &end);     /* none yet: a day back */
    CHECK(end == 100 && first == 0);
    stock_returned_span(0, 10000 * B, &first, &end);
    CHECK(end == 10000 && first == 10000 - STOCK_RETURNED_LOOKBACK);
    stock_returned_span(40 * B + 1, 43 * B, &first, &end); /* bucket 40 not whole before */
    CHECK(first == 40 && end == 43);                        /* 40, 41, 42: (b+1)*B <= W */
    stock_returned_span(40 * B, 40 * B + B - 1, &first, &end);
    CHECK(first >= end);                                    /* within one bucket: none */
    stock_returned_span(50 * B, 45 * B, &first, &end);      /* W below the old one: none */
    CHECK(first >= end);
    CHECK(stock_returned_watermark(100000, 60000, -1) == 40000);     /* no debt owed */
    CHECK(stock_returned_watermark(100000, 60000, 30000) == 30000);  /* the oldest debt */
    CHECK(stock_returned_watermark(100000, 60000, 50000) == 40000);  /* the keep margin */
    CHECK(stock_returned_watermark(1000, 60000, -1) == 0);
}

/* A return's marker goes to its decision's bucket; forgetting raises the
 * watermark and drops the buckets wholly before it; a repeat of a
 * forgotten return is answered `forgotten` and gives nothing; the legacy
 * hash still stops a repeat. */
static void test_returned_markers_forgotten(void) {
    const long long B = STOCK_RETURNED_BUCKET_MS;
    stock_product p = { .sku = "t-fgt", .strategy = STOCK_LUA, .segments = 1 };
    traw_cmd("DEL %s", "fs:{t-fgt}:returned:before");
    traw_cmd("DEL %s", "fs:{t-fgt}:returned:1000");
    traw_cmd("DEL %s", "fs:{t-fgt}:returned:1001");
    CHECK(stock_load(sc, &p, 1, 0, NULL, 0, 1) == 0);
    long long t1 = 1000 * B + 7, t2 = 1001 * B + 3;
    stock_return_req r = { .product = &p, .order_id = "r1", .user_id = "u", .takes = "",
                           .quantity = 2, .reserve_gen = 1, .return_gen = 1, .decided_ms = t1 };
    CHECK(stock_return(sc, &r, 1) == 0 && r.given && r.result == STOCK_RESERVED);
    stock_return_req r2 = r;
    r2.order_id = "r2";
    r2.decided_ms = t2;
    CHECK(stock_return(sc, &r2, 1) == 0 && r2.given);
    CHECK(traw_int("GET %s", "fs:{t-fgt}:stock:0") == 4);
    redisReply *h = redisCommand(traw_conn, "HGET fs:{t-fgt}:returned:1000 r1");
    CHECK(h && h->type == REDIS_REPLY_STRING && atoll(h->str) == t1);
    if (h) freeReplyObject(h);
    CHECK(stock_return(sc, &r, 1) == 0 && !r.given && r.result == STOCK_RESERVED);

    long long forgot = -1;
    CHECK(stock_returned_forget(sc, &p, 1001 * B + 5, &forgot) == 0 && forgot == 1);
    CHECK(traw_int("GET %s", "fs:{t-fgt}:returned:before") == 1001 * B + 5);
    h = redisCommand(traw_conn, "EXISTS fs:{t-fgt}:returned:1000 fs:{t-fgt}:returned:1001");
    CHECK(h && h->type == REDIS_REPLY_INTEGER && h->integer == 1);   /* 1001 is not whole */
    if (h) freeReplyObject(h);
    long long w = 0;
    CHECK(stock_returned_mark(sc, &p, &w) == 0 && w == 1001 * B + 5);
    CHECK(stock_returned_forget(sc, &p, 5, &forgot) == 0 && forgot == 0);   /* never lowers */
    CHECK(traw_int("GET %s", "fs:{t-fgt}:returned:before") == 1001 * B + 5);

    /* A repeat of r1, its marker forgotten: nothing given, and said so. */
    CHECK(stock_return(sc, &r, 1) == 0 && !r.given && r.forgotten && r.result != STOCK_RESERVED);
    /* r2 is decided before the watermark too. */
    CHECK(stock_return(sc, &r2, 1) == 0 && !r2.given && r2.forgotten);
    CHECK(traw_int("GET %s", "fs:{t-fgt}:stock:0") == 4);

    /* A legacy marker ("1" in `returned`) stops a return decided later. */
    traw_cmd("HSET fs:{t-fgt}:returned %s 1", "r3");
    stock_return_req r3 = r;
    r3.order_id = "r3";
    r3.decided_ms = 1002 * B;
    CHECK(stock_return(sc, &r3, 1) == 0 && !r3.given && !r3.forgotten &&
          r3.result == STOCK_RESERVED);
    CHECK(traw_int("GET %s", "fs:{t-fgt}:stock:0") == 4);
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
        T(test_noscript_fallback), T(test_fenced_write), T(test_lock_module_and_loop_path_exclude),
        T(test_returned_arithmetic), T(test_returned_markers_forgotten), T(test_unreachable),
    };
    char err[200];
    url = traw_open();
    stock_config cfg = { .redis_url = url, .prefix = "fs:", .timeout_ms = 2000,
                         .instance = "test-instance", .idem_ttl_ms = 60000 };
    sc = stock_conn_new(&cfg, err, sizeof err);
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    stock_conn_free(sc);
    traw_close();
    return rc;
}
