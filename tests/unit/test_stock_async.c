/* test_stock_async.c: the stock module's loop side (stock/async.c,
 * stock/lockasync.c) on a loop of its own thread, against the runner's
 * redis-server (and a private one for a stalled server), keys under "ua:":
 * - stock_async_reserve: a batch of one SKU, each request's answer
 *   (RESERVED with gen, SOLD_OUT, INSUFFICIENT, LIMIT, REPLAY of the same or
 *   another fingerprint, in one batch and across batches, MISSING with no
 *   copy or one built for another run_id); per-user limits; several
 *   segments; the units left in Redis exactly the initial ones minus those
 *   reserved (stock_read on a blocking stock_conn);
 * - pending records: created, cleared by a later batch's clear argument
 *   and by stock_async_clear (ids copied);
 * - stock_async_undo: units, user count and key given back once only;
 * - work submitted before the connection is ready (held, then sent in
 *   order), with Redis down (UNAVAILABLE, nothing sent: outcome known),
 *   in flight on a stalled server or at stock_async_free (outcome unknown);
 * - the `lock` strategy: lock_read takes and reads, a second read finds it
 *   held (pttl), stock_lock_check's verdicts, lock_write writes and
 *   releases, release only, the fence refusing a write after the lease
 *   ran out and another holder read (-4, nothing taken), no copy (-3),
 *   the empty-segment hint and stock_pick_segment. */
#include <hiredis/hiredis.h>

#include "common/rconn.h"
#include "stock/stock.h"
#include "tests/unit/t.h"
#include "tests/unit/traw.h"
#include "tests/unit/tloop.h"

static const char *url;
static stock_conn *sc;               /* the blocking side: load and read */
static stock_config cfg;
static tloop TL;
static stock_async *SA;

/* ------------------------------------------------------------- helpers */

/* GET of ua:{sku}:suffix into out ("" when none). */
static const char *raw_get(const char *sku, const char *suffix, char *out, size_t len) {
    char key[STOCK_SKU_MAX + 64];
    snprintf(key, sizeof key, "ua:{%s}:%s", sku, suffix);
    return traw_get(key, out, len);
}
static int pending_has(const char *sku, const char *id) {
    return traw_int("HEXISTS ua:{%s}:pending %s", sku, id) == 1;
}
static long long left(const stock_product *p) {
    long long total = -1;
    CHECK(stock_read(sc, p, &total, NULL) == STOCK_RESERVED);
    return total;
}

static stock_product product(const char *sku, stock_strategy s, int segs, long long limit,
                             long long units) {
    stock_product p;
    CHECK(stock_product_init(&p, sku, s, segs, limit, 0, 0) == 0);
    if (units >= 0) CHECK(stock_load(sc, &p, 1, units, NULL, 0, 1) == 0);
    return p;
}

static stock_req req(const stock_product *p, const char *id, const char *user, int qty,
                     const char *key, const char *fp) {
    return (stock_req){ .product = p, .order_id = id, .user_id = user, .quantity = qty,
                        .idem_key = key, .fingerprint = fp, .available = -1 };
}

/* A callback's record: how often, and what it said. */
typedef struct cb { int calls, res; stock_req **reqs; size_t n; } cb;
static void on_batch(void *ud, stock_req **rs, size_t n) {
    cb *c = ud;
    c->calls++, c->reqs = rs, c->n = n;
}
static void on_done(void *ud, int res) { ((cb *)ud)->calls++, ((cb *)ud)->res = res; }
static int called(void *ud) { return ((cb *)ud)->calls > 0; }
static void nothing(void *ud) { (void)ud; }
/* Waits for c's callback, then lets the loop run once more: it must not come twice. */
static int once(cb *c) {
    int ok = tl_wait(&TL, called, c, 3000);
    tl_call(&TL, nothing, NULL);
    return ok && c->calls == 1;
}

/* One call on the loop: its arguments, and what the call returned. */
typedef struct op {
    stock_async *sa;
    const stock_product *p;
    stock_req **reqs, *r;
    const char *const *ids;
    size_t n, nids, taken;
    stock_ref ref;
    stock_hold *h;
    int ttl, write;
    cb *c;
} op;
static void do_reserve(void *ud) {
    op *o = ud;
    o->taken = stock_async_reserve(o->sa, o->p, o->reqs, o->n, o->ids, o->nids, on_batch, o->c);
}
static void do_clear(void *ud) {
    op *o = ud;
    o->taken = stock_async_clear(o->sa, o->p, o->ids, o->nids);
}
static void do_undo(void *ud) { op *o = ud; stock_async_undo(o->sa, &o->ref, on_done, o->c); }
static void do_lock_read(void *ud) {
    op *o = ud;
    stock_async_lock_read(o->sa, o->r, o->h, o->ttl, on_done, o->c);
}
static void do_lock_write(void *ud) {
    op *o = ud;
    stock_async_lock_write(o->sa, o->r, o->h, o->write, o->c ? on_done : NULL, o->c);
}

/* Reserves rs[0..n) as one batch (clearing ids first); returns the clears
 * taken. Checks that the callback came once, with the batch. */
static size_t reserve(const stock_product *p, stock_req *rs, size_t n, const char *const *ids,
                      size_t nids) {
    stock_req *ptr[16];
    cb c = { 0 };
    for (size_t i = 0; i < n; i++) ptr[i] = &rs[i];
    op o = { .sa = SA, .p = p, .reqs = ptr, .n = n, .ids = ids, .nids = nids, .c = &c };
    tl_call(&TL, do_reserve, &o);
    CHECK(once(&c) && c.reqs == ptr && c.n == n);
    return o.taken;
}
static int undo(const stock_product *p, const char *id, const char *key) {
    cb c = { 0 };
    op o = { .sa = SA, .ref = { p, id, key }, .c = &c };
    tl_call(&TL, do_undo, &o);
    CHECK(once(&c));
    return c.res;
}
/* A fresh hold's read (a new owner id), or (lock_read_again) the same
 * order's next read, under its owner id: its place in a fair line. */
static int lock_read_as(stock_req *r, stock_hold *h, int seg, int ttl, int again) {
    cb c = { 0 };
    char owner[sizeof h->owner];
    memcpy(owner, h->owner, sizeof owner);
    memset(h, 0, sizeof *h);
    if (again) memcpy(h->owner, owner, sizeof owner);
    h->seg = seg;
    op o = { .sa = SA, .r = r, .h = h, .ttl = ttl, .c = &c };
    tl_call(&TL, do_lock_read, &o);
    CHECK(once(&c));
    return c.res;
}
static int lock_read(stock_req *r, stock_hold *h, int seg, int ttl) {
    return lock_read_as(r, h, seg, ttl, 0);
}
static int lock_read_again(stock_req *r, stock_hold *h, int seg, int ttl) {
    return lock_read_as(r, h, seg, ttl, 1);
}
static int lock_write(stock_req *r, stock_hold *h, int write) {
    cb c = { 0 };
    op o = { .sa = SA, .r = r, .h = h, .write = write, .c = &c };
    tl_call(&TL, do_lock_write, &o);
    CHECK(once(&c));
    return c.res;
}
static void do_inflight(void *ud) { *(int *)ud = stock_async_inflight(SA); }
#define ERRLEN 256
static void do_errstr(void *ud) { snprintf(ud, ERRLEN, "%s", stock_async_errstr(SA)); }
static int idle(void *ud) { return do_inflight(ud), *(int *)ud == 0; }

static void do_new(void *ud) {
    char err[128];
    *(stock_async **)ud = stock_async_new(TL.l, &cfg, err, sizeof err);
}
/* A loop with a stock_async on it, ready unless Redis is down (an undo of
 * nothing waits for the connection; the lock path does not wait). */
static int start(void) {
    if (tl_start(&TL) != 0) return -1;
    SA = NULL;
    tl_call(&TL, do_new, &SA);
    CHECK(SA != NULL);
    if (!SA) return -1;
    stock_product none = { .sku = "a-none", .strategy = STOCK_LUA, .segments = 1 };
    undo(&none, "none", NULL);
    return 0;
}
static void finish(void) {
    tl_stop(&TL);                                         /* then free, as the service does */
    stock_async_free(SA), SA = NULL;
    tl_end(&TL);
}

/* ---------------------------------------------------------- the batches */

static void test_batch_answers(void) {
    if (start() != 0) return;
    stock_product p = product("a-ans", STOCK_LUA, 1, 0, 10);
    stock_req r[7] = {
        req(&p, "o0", "u", 3, NULL, "f"),  req(&p, "o1", "u", 4, "k1", "fpA"),
        req(&p, "o2", "u", 5, NULL, "f"),  req(&p, "o3", "u", 3, "", "f"),
        req(&p, "o4", "u", 1, NULL, "f"),  req(&p, "o5", "u", 9, "k1", "fpA"),
        req(&p, "o6", "u", 1, "k1", "fpB"),
    };
    CHECK(reserve(&p, r, 7, NULL, 0) == 0);
    CHECK(r[0].result == STOCK_RESERVED && r[0].gen == 1);
    CHECK(r[1].result == STOCK_RESERVED && r[1].gen == 1);
    CHECK(r[2].result == STOCK_INSUFFICIENT && r[2].available == 3);
    CHECK(r[3].result == STOCK_RESERVED);
    CHECK(r[4].result == STOCK_SOLD_OUT && r[4].available == 0);
    CHECK(r[5].result == STOCK_REPLAY && r[5].replay_same && !strcmp(r[5].replay_order_id, "o1"));
    CHECK(r[6].result == STOCK_REPLAY && !r[6].replay_same && !strcmp(r[6].replay_order_id, "o1"));
    for (int i = 0; i < 7; i++) CHECK(!r[i].outcome_unknown);
    CHECK(left(&p) == 0);                                 /* 10 - 3 - 4 - 3 */
    CHECK(traw_int("HLEN ua:{%s}:pending%s", "a-ans", "") == 3);
    CHECK(pending_has("a-ans", "o0") && pending_has("a-ans", "o1") && pending_has("a-ans", "o3"));
    char v[128];
    CHECK_STR(raw_get("a-ans", "idem:k1", v, sizeof v), "1|o1|fpA");
    /* Across batches, and after a restock: still the same key's order. */
    CHECK(stock_restock(sc, &p, 5) == STOCK_RESERVED);
    stock_req again[2] = { req(&p, "o7", "u", 1, "k1", "fpA"), req(&p, "o8", "u", 5, NULL, "f") };
    reserve(&p, again, 2, NULL, 0);
    CHECK(again[0].result == STOCK_REPLAY && again[0].replay_same);
    CHECK(again[1].result == STOCK_RESERVED && left(&p) == 0);
    stock_product_free(&p), finish();
}

static void test_limits_and_segments(void) {
    if (start() != 0) return;
    stock_product p = product("a-lim", STOCK_LUA, 4, 5, -1);
    stock_user_units users[] = { { "alice", 1 } };
    CHECK(stock_load(sc, &p, 1, 20, users, 1, 1) == 0);
    stock_req r[6] = {
        req(&p, "a1", "alice", 3, NULL, "f"), req(&p, "a2", "alice", 2, NULL, "f"),
        req(&p, "b1", "bob", 5, NULL, "f"),   req(&p, "b2", "bob", 1, NULL, "f"),
        req(&p, "c1", "carol", 6, NULL, "f"), req(&p, "d1", "dave", 5, NULL, "f"),
    };
    reserve(&p, r, 6, NULL, 0);
    CHECK(r[0].result == STOCK_RESERVED);
    CHECK(r[1].result == STOCK_LIMIT && r[1].available == 4);
    CHECK(r[2].result == STOCK_RESERVED);
    CHECK(r[3].result == STOCK_LIMIT && r[3].available == 5);
    CHECK(r[4].result == STOCK_LIMIT && r[4].available == 0);
    CHECK(r[5].result == STOCK_RESERVED);                 /* 5 from segments of 5: one or two */
    long long total = -1, seg[4];
    CHECK(stock_read(sc, &p, &total, seg) == STOCK_RESERVED && total == 20 - 13);
    CHECK(seg[0] + seg[1] + seg[2] + seg[3] == 7);
    for (int i = 0; i < 4; i++) CHECK(seg[i] >= 0 && seg[i] <= 5);
    CHECK(traw_int("HGET ua:{%s}:users %s", "a-lim", "alice") == 4);
    CHECK(traw_int("HGET ua:{%s}:users %s", "a-lim", "bob") == 5);
    CHECK(traw_int("HGET ua:{%s}:users %s", "a-lim", "dave") == 5);
    CHECK(traw_int("HEXISTS ua:{%s}:users %s", "a-lim", "carol") == 0);
    stock_product_free(&p);
    /* More than any segment holds: taken across segments; never sold out
     * while units remain. */
    stock_product q = product("a-seg", STOCK_LUA, 8, 0, 10);
    stock_req s[5] = { req(&q, "s0", "u", 3, NULL, "f"), req(&q, "s1", "u", 3, NULL, "f"),
                       req(&q, "s2", "u", 3, NULL, "f"), req(&q, "s3", "u", 3, NULL, "f"),
                       req(&q, "s4", "u", 3, NULL, "f") };
    reserve(&q, s, 5, NULL, 0);
    for (int i = 0; i < 3; i++) CHECK(s[i].result == STOCK_RESERVED);
    for (int i = 3; i < 5; i++) CHECK(s[i].result == STOCK_INSUFFICIENT && s[i].available == 1);
    long long qs[8];
    CHECK(stock_read(sc, &q, &total, qs) == STOCK_RESERVED && total == 1);
    for (int i = 0; i < 8; i++) CHECK(qs[i] >= 0);
    CHECK(undo(&q, "s1", NULL) == 1 && left(&q) == 4);    /* each part back where it was */
    stock_product_free(&q), finish();
}

static void test_missing_copy(void) {
    if (start() != 0) return;
    stock_product p = product("a-miss", STOCK_LUA, 1, 0, -1);   /* never loaded */
    stock_req r[2] = { req(&p, "m1", "u", 1, NULL, "f"), req(&p, "m2", "u", 1, "mk", "f") };
    reserve(&p, r, 2, NULL, 0);
    CHECK(r[0].result == STOCK_MISSING && r[1].result == STOCK_MISSING);
    CHECK(!r[0].outcome_unknown && !r[1].outcome_unknown);
    CHECK(stock_load(sc, &p, 3, 5, NULL, 0, 1) == 0);
    /* A copy built for another Redis process (it restarted): not valid. */
    traw_int("SET ua:{%s}:gen %s", "a-miss", "3:0000000000000000000000000000000000000000");
    reserve(&p, r, 2, NULL, 0);
    CHECK(r[0].result == STOCK_MISSING && r[1].result == STOCK_MISSING);
    char v[64];
    CHECK_STR(raw_get("a-miss", "stock:0", v, sizeof v), "5");   /* nothing taken */
    CHECK(traw_int("HLEN ua:{%s}:pending%s", "a-miss", "") == 0);
    CHECK(stock_load(sc, &p, 3, 5, NULL, 0, 0) == 0);           /* rebuilt for this one */
    reserve(&p, r, 2, NULL, 0);
    CHECK(r[0].result == STOCK_RESERVED && r[0].gen == 3 && r[1].result == STOCK_RESERVED);
    CHECK(left(&p) == 3);
    stock_product_free(&p), finish();
}

static void test_pending_cleared(void) {
    if (start() != 0) return;
    stock_product p = product("a-clr", STOCK_LUA, 1, 0, 10);
    stock_req r[3] = { req(&p, "c1", "u", 1, NULL, "f"), req(&p, "c2", "u", 1, NULL, "f"),
                       req(&p, "c3", "u", 1, NULL, "f") };
    reserve(&p, r, 3, NULL, 0);
    CHECK(traw_int("HLEN ua:{%s}:pending%s", "a-clr", "") == 3);
    /* The committed ones go with the next batch, before it reserves. */
    const char *ids[] = { "c1", "c2" };
    stock_req r4 = req(&p, "c4", "u", 2, NULL, "f");
    CHECK(reserve(&p, &r4, 1, ids, 2) == 2);
    CHECK(r4.result == STOCK_RESERVED);
    CHECK(!pending_has("a-clr", "c1") && !pending_has("a-clr", "c2"));
    CHECK(pending_has("a-clr", "c3") && pending_has("a-clr", "c4"));
    const char *more[] = { "c3", "never-there" };
    op o = { .sa = SA, .p = &p, .ids = more, .nids = 2 };
    tl_call(&TL, do_clear, &o);
    CHECK(o.taken == 2);
    int n = -1;
    CHECK(tl_wait(&TL, idle, &n, 3000));
    CHECK(!pending_has("a-clr", "c3") && pending_has("a-clr", "c4"));
    CHECK(left(&p) == 10 - 5);                            /* clearing gives nothing back */
    stock_product_free(&p), finish();
}

static void test_undo_once(void) {
    if (start() != 0) return;
    stock_product p = product("a-undo", STOCK_LUA, 1, 10, 10);
    stock_req a = req(&p, "u1", "alice", 4, "uk", "fp");
    reserve(&p, &a, 1, NULL, 0);
    CHECK(a.result == STOCK_RESERVED && left(&p) == 6);
    CHECK(traw_int("HGET ua:{%s}:users %s", "a-undo", "alice") == 4);
    CHECK(undo(&p, "u1", "uk") == 1);
    CHECK(left(&p) == 10 && !pending_has("a-undo", "u1"));
    CHECK(traw_int("HEXISTS ua:{%s}:users %s", "a-undo", "alice") == 0);
    CHECK(traw_int("EXISTS ua:{%s}:idem:%s", "a-undo", "uk") == 0);
    CHECK(undo(&p, "u1", "uk") == 1 && left(&p) == 10);   /* settled: nothing added again */
    CHECK(undo(&p, "never", NULL) == 1 && left(&p) == 10);
    /* The key was freed with the undo: it reserves anew. */
    stock_req b = req(&p, "u2", "alice", 2, "uk", "fp");
    reserve(&p, &b, 1, NULL, 0);
    CHECK(b.result == STOCK_RESERVED && left(&p) == 8);
    /* Committed (its pending record cleared): an undo gives nothing back. */
    const char *ids[] = { "u2" };
    op o = { .sa = SA, .p = &p, .ids = ids, .nids = 1 };
    tl_call(&TL, do_clear, &o);
    CHECK(undo(&p, "u2", "uk") == 1 && left(&p) == 8);
    stock_product_free(&p), finish();
}

/* ------------------------------------------------------ connection states */

static stock_product held_p;
static stock_req held_r;
static stock_req *held_rs[1] = { &held_r };
static cb held_cb, held_undo_cb;
static char held_id[8];
static void submit_before_ready(void *ud) {
    int *seen = ud;
    char err[128];
    SA = stock_async_new(TL.l, &cfg, err, sizeof err);
    const char *ids[] = { held_id };
    snprintf(held_id, sizeof held_id, "h0");
    seen[0] = (int)stock_async_reserve(SA, &held_p, held_rs, 1, ids, 1, on_batch, &held_cb);
    snprintf(held_id, sizeof held_id, "XX");              /* the ids were copied */
    stock_ref ref = { &held_p, "h1", NULL, NULL };
    stock_async_undo(SA, &ref, on_done, &held_undo_cb);   /* behind it, in order */
    seen[1] = held_cb.calls + held_undo_cb.calls;
    seen[2] = stock_async_inflight(SA);
}

static void test_held_until_ready(void) {
    held_p = product("a-held", STOCK_LUA, 1, 0, 10);
    stock_req h0 = req(&held_p, "h0", "u", 1, NULL, "f");
    SA = NULL;
    CHECK(tl_start(&TL) == 0);
    /* h0 reserved by the blocking side, to be cleared by the held batch. */
    stock_req *one[1] = { &h0 };
    CHECK(stock_reserve(sc, one, 1) == 0 && h0.result == STOCK_RESERVED);
    held_r = req(&held_p, "h1", "u", 2, NULL, "f");
    int seen[3] = { -1, -1, -1 };
    tl_call(&TL, submit_before_ready, seen);
    CHECK(seen[0] == 1 && seen[1] == 0 && seen[2] == 0);  /* held: nothing sent yet */
    CHECK(once(&held_cb) && once(&held_undo_cb));
    CHECK(held_r.result == STOCK_RESERVED && held_undo_cb.res == 1);
    CHECK(!pending_has("a-held", "h0") && !pending_has("a-held", "h1"));
    CHECK(left(&held_p) == 9);                            /* h1 reserved, then undone */
    stock_product_free(&held_p);
    finish();
}

static void test_redis_down(void) {
    char u[64];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", tr_free_port());   /* nothing listens */
    stock_config down = cfg;
    down.redis_url = u;
    down.timeout_ms = 300;
    stock_config keep = cfg;
    cfg = down;
    int ok = start() == 0;
    cfg = keep;
    if (!ok) return;
    stock_product p = product("a-down", STOCK_LUA, 1, 0, -1);
    stock_req r = req(&p, "d1", "u", 1, NULL, "f");
    reserve(&p, &r, 1, NULL, 0);                          /* too soon to retry: failed at once */
    CHECK(r.result == STOCK_UNAVAILABLE && !r.outcome_unknown);
    clock_sleep_ms(120);
    r = req(&p, "d2", "u", 1, "dk", "f");
    reserve(&p, &r, 1, NULL, 0);                          /* held, then the connect failed */
    CHECK(r.result == STOCK_UNAVAILABLE && !r.outcome_unknown);
    CHECK(undo(&p, "d1", NULL) == 0);                     /* not known given back */
    const char *ids[] = { "d1" };
    op o = { .sa = SA, .p = &p, .ids = ids, .nids = 1 };
    tl_call(&TL, do_clear, &o);
    CHECK(o.taken == 1);                                  /* taken; left to reconciliation */
    stock_hold h;
    r = req(&p, "d3", "u", 1, NULL, "f");
    CHECK(lock_read(&r, &h, 0, 1000) == -1 && r.result == STOCK_UNAVAILABLE && !r.outcome_unknown);
    char why[ERRLEN];
    tl_call(&TL, do_errstr, why);                         /* SA is the loop's: read there */
    CHECK(strstr(why, "connect") != NULL);
    stock_product_free(&p), finish();
}

static stock_req free_r;
static stock_req *free_rs[1] = { &free_r };
static cb free_cb, free_held_cb;
static void free_with_work(void *ud) {
    stock_product *p = ud;
    char err[128];
    stock_async *fresh = stock_async_new(TL.l, &cfg, err, sizeof err);
    stock_async_reserve(fresh, p, free_rs, 1, NULL, 0, on_batch, &free_held_cb);
    stock_async_free(fresh);                              /* held work: never sent */
}
/* stock_async_inflight and free_cb.calls, both read on the loop's thread:
 * the timeout may call free_cb there at any time. */
static void inflight_and_calls(void *ud) {
    ((int *)ud)[0] = stock_async_inflight(SA), ((int *)ud)[1] = free_cb.calls;
}

static void test_stalled_and_freed(void) {
    tredis R = { 0 };
    CHECK(tr_start(&R) == 0);
    stock_config keep = cfg, own = cfg;
    own.redis_url = R.url;
    own.timeout_ms = 150;
    char err[128];
    stock_conn *keep_sc = sc;
    redisContext *keep_raw = traw_conn;
    sc = stock_conn_new(&own, err, sizeof err);
    traw_conn = redisConnect("127.0.0.1", R.port);
    cfg = own;
    if (!R.pid || !sc || start() != 0) goto out;
    stock_product p = product("a-stall", STOCK_LUA, 1, 0, 10);
    stock_req r = req(&p, "s1", "u", 1, NULL, "f");
    reserve(&p, &r, 1, NULL, 0);
    CHECK(r.result == STOCK_RESERVED);
    /* Sent to a server that stalls: the timeout; it may have run. */
    tr_pause(&R, 1);
    r = req(&p, "s2", "u", 1, NULL, "f");
    int64_t t0 = clock_mono_ms();
    reserve(&p, &r, 1, NULL, 0);
    CHECK(r.result == STOCK_UNAVAILABLE && r.outcome_unknown);
    CHECK(clock_mono_ms() - t0 >= 150);
    /* Held work at stock_async_free fails with nothing sent. */
    free_r = req(&p, "s3", "u", 1, NULL, "f");
    tl_call(&TL, free_with_work, &p);
    CHECK(free_held_cb.calls == 1 && free_r.result == STOCK_UNAVAILABLE && !free_r.outcome_unknown);
    tr_pause(&R, 0);
    clock_sleep_ms(170);                                  /* one timeout more, then reconnect */
    r = req(&p, "s4", "u", 1, NULL, "f");
    reserve(&p, &r, 1, NULL, 0);
    CHECK(r.result == STOCK_RESERVED);
    /* In flight at stock_async_free: failed, outcome unknown. */
    tr_pause(&R, 1);
    free_r = req(&p, "s5", "u", 1, NULL, "f");
    op o = { .sa = SA, .p = &p, .reqs = free_rs, .n = 1, .c = &free_cb };
    tl_call(&TL, do_reserve, &o);
    int n[2] = { 0, -1 };
    tl_call(&TL, inflight_and_calls, n);
    CHECK(n[0] == 1 && n[1] == 0);
    finish();
    CHECK(free_cb.calls == 1 && free_r.result == STOCK_UNAVAILABLE && free_r.outcome_unknown);
    tr_pause(&R, 0);
    clock_sleep_ms(50);                                   /* what it had read, it ran */
    long long ran = pending_has("a-stall", "s2") + pending_has("a-stall", "s5");
    CHECK(left(&p) == 10 - 2 - ran);                      /* s1, s4, and those that ran */
    CHECK(pending_has("a-stall", "s1") && pending_has("a-stall", "s4"));
    CHECK(!pending_has("a-stall", "s3"));                 /* never sent */
    stock_product_free(&p);
out:
    if (SA) finish();
    stock_conn_free(sc);
    if (traw_conn) redisFree(traw_conn);
    sc = keep_sc;
    traw_conn = keep_raw;
    cfg = keep;
    tr_cleanup(&R);
}

/* -------------------------------------------------------- the lock path */

static void test_lock_read_write(void) {
    if (start() != 0) return;
    stock_product p = product("a-lock", STOCK_LOCK, 1, 0, 10);
    stock_req r1 = req(&p, "l1", "alice", 3, NULL, "f"), r2 = req(&p, "l2", "bob", 1, NULL, "f");
    stock_hold h1, h2;
    CHECK(lock_read(&r1, &h1, 0, 2000) == 1);
    CHECK(h1.token >= 1 && h1.gen == 1 && h1.units == 10 && h1.bought == 0 && !h1.idem[0]);
    CHECK(strlen(h1.owner) == 32);
    char v[128], want[128];
    snprintf(want, sizeof want, "%s:%llu", h1.owner, (unsigned long long)h1.token);
    CHECK_STR(raw_get("a-lock", "lock:0", v, sizeof v), want);
    long long pttl = traw_int("PTTL ua:{%s}:lock:%s", "a-lock", "0");
    CHECK(pttl > 0 && pttl <= 2000);
    CHECK(traw_int("GET ua:{%s}:fence:%s", "a-lock", "0") == (long long)h1.token);   /* raised */
    /* Held: another order's read finds it so, with the lease left. */
    CHECK(lock_read(&r2, &h2, 0, 2000) == 0);
    CHECK(h2.pttl > 0 && h2.pttl <= 2000);
    CHECK(stock_lock_check(&r1, &h1) == STOCK_RESERVED);
    CHECK(lock_write(&r1, &h1, 1) == 1);
    CHECK(r1.result == STOCK_RESERVED && r1.gen == 1 && !r1.outcome_unknown);
    CHECK(left(&p) == 7 && pending_has("a-lock", "l1"));
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-lock", "0") == 0);              /* released */
    /* Free again: the next holder reads what was written, a newer token. */
    CHECK(lock_read(&r2, &h2, 0, 2000) == 1 && h2.units == 7 && h2.token > h1.token);
    CHECK(lock_write(&r2, &h2, 0) == 0);                  /* release only */
    CHECK(left(&p) == 7 && !pending_has("a-lock", "l2"));
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-lock", "0") == 0);
    /* A release with no callback (the order was answered already). */
    CHECK(lock_read(&r2, &h2, 0, 2000) == 1);
    op o = { .sa = SA, .r = &r2, .h = &h2, .write = 0 };
    tl_call(&TL, do_lock_write, &o);
    int n = -1;
    CHECK(tl_wait(&TL, idle, &n, 3000));
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-lock", "0") == 0 && left(&p) == 7);
    stock_product_free(&p), finish();
}

static void test_lock_check(void) {
    stock_product p = product("a-chk", STOCK_LOCK, 1, 5, -1), q = product("a-chk3", STOCK_LOCK, 3, 0, -1);
    stock_req r = req(&p, "c1", "u", 2, NULL, "fp1");
    stock_hold h = { .gen = 2, .units = 5 };
    h.bought = 4;
    CHECK(stock_lock_check(&r, &h) == STOCK_LIMIT && r.available == 4);
    h.bought = 0, h.units = 0;
    CHECK(stock_lock_check(&r, &h) == STOCK_SOLD_OUT && r.available == 0);
    h.units = 1;
    CHECK(stock_lock_check(&r, &h) == STOCK_INSUFFICIENT && r.available == 1);
    h.units = 5;
    CHECK(stock_lock_check(&r, &h) == STOCK_RESERVED);
    snprintf(h.idem, sizeof h.idem, "2|o9|fp1");          /* a key's record, but r has no key */
    CHECK(stock_lock_check(&r, &h) == STOCK_RESERVED);
    r.idem_key = "k";
    CHECK(stock_lock_check(&r, &h) == STOCK_REPLAY && r.replay_same &&
          !strcmp(r.replay_order_id, "o9"));
    snprintf(h.idem, sizeof h.idem, "2|o9|fp2");
    CHECK(stock_lock_check(&r, &h) == STOCK_REPLAY && !r.replay_same);
    snprintf(h.idem, sizeof h.idem, "1|o9|fp1");          /* an older generation's */
    CHECK(stock_lock_check(&r, &h) == STOCK_RESERVED);
    stock_req s = req(&q, "c2", "u", 2, NULL, "f");
    stock_hold e = { .gen = 1, .units = 0 };
    CHECK(stock_lock_check(&s, &e) == STOCK_INSUFFICIENT && s.available == 0);   /* others may have */
    stock_product_free(&p);
    stock_product_free(&q);
    /* What the read brings back: the key's record and the user's count. */
    if (start() != 0) return;
    stock_product k = product("a-lkey", STOCK_LOCK, 1, 3, 10);
    stock_req a = req(&k, "k1", "zoe", 2, "lk", "fpL");
    stock_hold ha;
    CHECK(lock_read(&a, &ha, 0, 2000) == 1 && stock_lock_check(&a, &ha) == STOCK_RESERVED);
    CHECK(lock_write(&a, &ha, 1) == 1 && left(&k) == 8);
    stock_req b = req(&k, "k2", "zoe", 2, "lk", "fpL");
    CHECK(lock_read(&b, &ha, 0, 2000) == 1);
    CHECK(ha.bought == 2 && !strcmp(ha.idem, "1|k1|fpL"));
    CHECK(stock_lock_check(&b, &ha) == STOCK_REPLAY && b.replay_same &&
          !strcmp(b.replay_order_id, "k1"));
    b.idem_key = NULL;                                    /* the same user, no key: the limit */
    CHECK(stock_lock_check(&b, &ha) == STOCK_LIMIT && b.available == 2);
    CHECK(lock_write(&b, &ha, 0) == 0 && left(&k) == 8);
    stock_product_free(&k), finish();
}

static void test_lock_fence(void) {
    if (start() != 0) return;
    stock_product p = product("a-fence", STOCK_LOCK, 1, 0, 10);
    stock_req a = req(&p, "fa", "u", 2, NULL, "f"), b = req(&p, "fb", "u", 3, NULL, "f");
    stock_hold ha, hb;
    CHECK(lock_read(&a, &ha, 0, 50) == 1);                /* a 50 ms lease ... */
    clock_sleep_ms(80);                                   /* ... runs out */
    CHECK(lock_read(&b, &hb, 0, 2000) == 1 && hb.token > ha.token && hb.units == 10);
    CHECK(stock_lock_check(&a, &ha) == STOCK_RESERVED);   /* a does not know */
    CHECK(lock_write(&a, &ha, 1) == -4);
    CHECK(a.result == STOCK_FENCED && !a.outcome_unknown);
    CHECK(left(&p) == 10 && !pending_has("a-fence", "fa"));   /* nothing taken */
    char v[128];
    CHECK(!strncmp(raw_get("a-fence", "lock:0", v, sizeof v), hb.owner, 32));   /* b's still */
    CHECK(lock_write(&b, &hb, 1) == 1 && b.result == STOCK_RESERVED && left(&p) == 7);
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-fence", "0") == 0);
    stock_product_free(&p), finish();
}

static void test_lock_missing_and_hint(void) {
    if (start() != 0) return;
    stock_product p = product("a-lmiss", STOCK_LOCK, 1, 0, -1);   /* no copy */
    stock_req r = req(&p, "m1", "u", 1, NULL, "f");
    stock_hold h;
    CHECK(lock_read(&r, &h, 0, 2000) == -3 && r.result == STOCK_MISSING);
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-lmiss", "0") == 0);  /* not taken */
    CHECK(stock_load(sc, &p, 1, 10, NULL, 0, 1) == 0);
    CHECK(lock_read(&r, &h, 0, 2000) == 1);
    CHECK(stock_load(sc, &p, 2, 10, NULL, 0, 1) == 0);             /* rebuilt meanwhile */
    CHECK(lock_write(&r, &h, 1) == -3 && r.result == STOCK_MISSING);
    CHECK(left(&p) == 10 && !pending_has("a-lmiss", "m1"));
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-lmiss", "0") == 0);  /* released all the same */
    stock_product_free(&p);
    /* A read that finds a segment empty marks it in the hint, and
     * stock_pick_segment then passes it over. */
    stock_product q = product("a-hint", STOCK_LOCK, 2, 0, 1);      /* 1 unit: 1 and 0 */
    CHECK(stock_pick_segment(&q, 1, 0, 1) == 1);
    stock_req s = req(&q, "n1", "u", 1, NULL, "f");
    CHECK(lock_read(&s, &h, 1, 2000) == 1 && h.units == 0);
    CHECK(stock_lock_check(&s, &h) == STOCK_INSUFFICIENT && s.available == 0);
    CHECK(lock_write(&s, &h, 0) == 0);
    for (uint64_t x = 0; x < 4; x++) CHECK(stock_pick_segment(&q, x, 0, 1) == 0);
    stock_product_free(&q), finish();
}

/* fair-lock's pass: a write (or a release) and the next order's read in
 * one call; the lock handed straight to the next order only when it heads
 * the line (or the line is empty). */
static stock_req *pass_rn;
static stock_hold *pass_hn;
static cb *pass_nc;
static void do_lock_pass(void *ud) {
    op *o = ud;
    stock_async_lock_pass(o->sa, o->r, o->h, o->write, o->c ? on_done : NULL, o->c, pass_rn,
                          pass_hn, 2000, NULL, 0, on_done, pass_nc);
}
static void lock_pass(stock_req *r, stock_hold *h, int write, cb *c, stock_req *rn,
                      stock_hold *hn, int seg, cb *nc) {
    char owner[sizeof hn->owner];
    memcpy(owner, hn->owner, sizeof owner);          /* its place in line, if any */
    memset(hn, 0, sizeof *hn);
    memcpy(hn->owner, owner, sizeof owner);
    hn->seg = seg;
    pass_rn = rn, pass_hn = hn, pass_nc = nc;
    op o = { .sa = SA, .r = r, .h = h, .write = write, .c = c };
    tl_call(&TL, do_lock_pass, &o);
    CHECK(once(nc));
    CHECK(!c || c->calls == 1);
}

static void test_lock_pass(void) {
    if (start() != 0) return;
    stock_product p = product("a-pass", STOCK_FAIR_LOCK, 1, 0, 10);
    stock_req r1 = req(&p, "p1", "u1", 3, NULL, "f"), r2 = req(&p, "p2", "u2", 1, NULL, "f"),
              r3 = req(&p, "p3", "u3", 1, NULL, "f"), r4 = req(&p, "p4", "u4", 1, NULL, "f");
    stock_hold h1, h2 = { 0 }, h3, h4 = { 0 }, hx;
    char v[128], want[128];
    CHECK(lock_read(&r1, &h1, 0, 2000) == 1);
    CHECK(lock_read(&r2, &hx, 0, 2000) == 0);              /* r2 waits: the head of the line */
    CHECK(traw_int("ZCARD ua:{%s}:%s", "a-pass", "lock:0:fair") == 1);
    /* r1 writes and hands the lock to r2, the head, in the same call. */
    cb c1 = { 0 }, c2 = { 0 };
    memcpy(h2.owner, hx.owner, sizeof h2.owner);
    lock_pass(&r1, &h1, 1, &c1, &r2, &h2, 0, &c2);
    CHECK(c1.res == 1 && r1.result == STOCK_RESERVED && pending_has("a-pass", "p1"));
    CHECK(c2.res == 1 && h2.units == 7 && h2.token == h1.token + 1);
    snprintf(want, sizeof want, "%s:%llu", hx.owner, (unsigned long long)h2.token);
    CHECK_STR(raw_get("a-pass", "lock:0", v, sizeof v), want);        /* r2's, never free */
    CHECK(traw_int("ZCARD ua:{%s}:%s", "a-pass", "lock:0:fair") == 0);
    CHECK(traw_int("GET ua:{%s}:fence:%s", "a-pass", "0") == (long long)h2.token);
    /* r3 comes and waits; r2's release cannot hand the lock to r4, which
     * is behind r3 in the line: freed, r3 (the head) takes it next. */
    CHECK(lock_read(&r3, &h3, 0, 2000) == 0);
    cb c4 = { 0 };
    lock_pass(&r2, &h2, 0, NULL, &r4, &h4, 0, &c4);
    CHECK(c4.res == 0 && !pending_has("a-pass", "p2"));
    CHECK(traw_int("EXISTS ua:{%s}:lock:%s", "a-pass", "0") == 0);    /* free, for r3 */
    CHECK(traw_int("ZRANK ua:{%s}:lock:0:fair %s", "a-pass", h4.owner) == 1);
    CHECK(lock_read_again(&r4, &h4, 0, 2000) == 0);        /* not its turn */
    CHECK(lock_read_again(&r3, &h3, 0, 2000) == 1 && h3.units == 7);
    CHECK(lock_write(&r3, &h3, 1) == 1 && left(&p) == 6);
    CHECK(lock_read_again(&r4, &h4, 0, 2000) == 1 && h4.units == 6);
    CHECK(lock_write(&r4, &h4, 0) == 0);
    stock_product_free(&p), finish();
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_batch_answers), T(test_limits_and_segments), T(test_missing_copy),
        T(test_pending_cleared), T(test_undo_once), T(test_held_until_ready),
        T(test_redis_down), T(test_stalled_and_freed), T(test_lock_read_write),
        T(test_lock_check), T(test_lock_fence), T(test_lock_missing_and_hint),
        T(test_lock_pass),
    };
    char err[200];
    url = traw_open();
    signal(SIGPIPE, SIG_IGN);
    cfg = (stock_config){ .redis_url = url, .prefix = "ua:", .timeout_ms = 2000,
                          .instance = "unit-async", .idem_ttl_ms = 60000 };
    sc = stock_conn_new(&cfg, err, sizeof err);
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    stock_conn_free(sc);
    traw_close();
    return rc;
}
