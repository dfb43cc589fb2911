/* test_fence.c: the fence (lock/lock.h, FENCING; lock/lua/format.lua)
 * against a real redis-server (the runner passes its URL in
 * FLASHSALE_TEST_REDIS), first its logic alone -- the old integer form, the
 * newest, an older and an unseen incarnation, the epoch a write carries,
 * the bounded list, an unreadable value -- then lock_fenced_set, then the
 * stock's read-check-write through it: a `redlock` product whose lock
 * server (a database of the test server, FLUSHDB standing for losing its
 * data) starts over sells again at once, and a holder of the old
 * incarnation paused in its critical section is refused when it writes.
 * Why these checks are the safety argument: docs/storage.md, "Locks and
 * fences". */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "lock/lock.h"
#include "stock/stock.h"
#include "tests/unit/t.h"
#include "tests/unit/traw.h"

#define UNNAMED "0000000000000000"
#define I1 "1111111111111111"
#define I2 "2222222222222222"
#define LOCK_DB 11                 /* the stand-in lock server's database */

static const char *url;
static char *probe;                /* format.lua + a body calling its fence functions */

/* ------------------------------------------------------------ the logic */

static const char PROBE_BODY[] =
    "if ARGV[1] == 'admit' then\n"
    "    return lock_fence_admit(KEYS[1], ARGV[2], ARGV[3], ARGV[4] == 'dry') or -1\n"
    "elseif ARGV[1] == 'check' then\n"
    "    return lock_fence_check(KEYS[1], ARGV[2], ARGV[3], ARGV[4]) and 1 or 0\n"
    "end\n"
    "lock_fence_record(KEYS[1], ARGV[2], ARGV[3])\n"
    "return 0\n";

/* lock_fence_admit(key, inc, tok): the epoch, -1 refused, -2 an error. */
static long long admit(const char *key, const char *inc, const char *tok) {
    redisReply *r = redisCommand(traw_conn, "EVAL %s 1 %s admit %s %s -", probe, key, inc, tok);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -2;
    if (r) freeReplyObject(r);
    return v;
}

static long long admit_dry(const char *key, const char *inc, const char *tok) {
    redisReply *r = redisCommand(traw_conn, "EVAL %s 1 %s admit %s %s dry", probe, key, inc, tok);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -2;
    if (r) freeReplyObject(r);
    return v;
}

/* lock_fence_check(key, inc, tok, epoch): 1 may write, 0 not, -2 error. */
static long long check(const char *key, const char *inc, const char *tok, long long epoch) {
    redisReply *r =
        redisCommand(traw_conn, "EVAL %s 1 %s check %s %s %lld", probe, key, inc, tok, epoch);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -2;
    if (r) freeReplyObject(r);
    return v;
}

static void test_old_integer_form(void) {
    char v[300];
    traw_cmd("DEL t:{f}:old");
    /* Missing: epoch 0, the unnamed incarnation, highest 0: admits any. */
    CHECK(check("t:{f}:old", UNNAMED, "1", 0) == 1);
    CHECK(admit("t:{f}:old", UNNAMED, "3") == 0);
    CHECK_STR(traw_get("t:{f}:old", v, sizeof v), "3");
    /* As an older version wrote it: a token below refused, equal passes,
     * above raises -- and the value stays a plain integer. */
    traw_cmd("SET t:{f}:old 10");
    CHECK(admit("t:{f}:old", UNNAMED, "9") == -1);
    CHECK(admit("t:{f}:old", UNNAMED, "10") == 0);
    CHECK(admit("t:{f}:old", UNNAMED, "12") == 0);
    CHECK_STR(traw_get("t:{f}:old", v, sizeof v), "12");
    CHECK(check("t:{f}:old", UNNAMED, "11", 0) == 0);
    CHECK(check("t:{f}:old", UNNAMED, "12", 0) == 1);
    /* A token of a named incarnation is new to it: admitted, it upgrades
     * the value in place, and the unnamed holders are the older ones now,
     * however high their tokens. */
    CHECK(admit("t:{f}:old", I1, "2") == 1);
    CHECK_STR(traw_get("t:{f}:old", v, sizeof v), "1:2:" UNNAMED "," I1);
    CHECK(admit("t:{f}:old", UNNAMED, "100") == -1);
    CHECK(check("t:{f}:old", UNNAMED, "12", 0) == 0);
    CHECK(check("t:{f}:old", I1, "2", 1) == 1);
}

static void test_newest_older_unseen(void) {
    char v[300];
    traw_cmd("DEL t:{f}:inc");
    CHECK(admit("t:{f}:inc", I1, "5") == 1);
    CHECK_STR(traw_get("t:{f}:inc", v, sizeof v), "1:5:" UNNAMED "," I1);
    /* The newest incarnation: tokens compare as they always did. */
    CHECK(admit("t:{f}:inc", I1, "4") == -1);
    CHECK(admit("t:{f}:inc", I1, "5") == 1);
    CHECK(admit("t:{f}:inc", I1, "7") == 1);
    CHECK_STR(traw_get("t:{f}:inc", v, sizeof v), "1:7:" UNNAMED "," I1);
    CHECK(check("t:{f}:inc", I1, "5", 1) == 0);      /* 7 read after 5: 5 may not write */
    CHECK(check("t:{f}:inc", I1, "7", 1) == 1);
    /* An unseen incarnation (its server lost its data: token 1) is
     * admitted and is the newest from now on; the epoch goes up. */
    CHECK(admit_dry("t:{f}:inc", I2, "1") == 2);
    CHECK_STR(traw_get("t:{f}:inc", v, sizeof v), "1:7:" UNNAMED "," I1);   /* dry: unchanged */
    CHECK(admit("t:{f}:inc", I2, "1") == 2);
    CHECK_STR(traw_get("t:{f}:inc", v, sizeof v), "2:1:" UNNAMED "," I1 "," I2);
    /* The old incarnation's holders are refused, reads and writes, however
     * high their tokens; the new one's write goes through. */
    CHECK(check("t:{f}:inc", I1, "7", 1) == 0);
    CHECK(admit("t:{f}:inc", I1, "1000") == -1);
    CHECK(admit_dry("t:{f}:inc", I1, "1000") == -1);
    CHECK(check("t:{f}:inc", I2, "1", 2) == 1);
    /* ...and a write says which epoch its read was admitted at. */
    CHECK(check("t:{f}:inc", I2, "1", 1) == 0);
    redisReply *r = redisCommand(traw_conn, "EVAL %s 1 t:{f}:inc record %s 3 -", probe, I2);
    if (r) freeReplyObject(r);
    CHECK_STR(traw_get("t:{f}:inc", v, sizeof v), "2:3:" UNNAMED "," I1 "," I2);
}

static void test_bounded_list(void) {
    char v[400], inc[17], first[17];
    traw_cmd("DEL t:{f}:many");
    /* Twelve incarnations, one after the other: the last 8 are kept. */
    for (int i = 1; i <= 12; i++) {
        snprintf(inc, sizeof inc, "%016x", 0xa0 + i);
        CHECK(admit("t:{f}:many", inc, "1") == i);
        if (i == 1) snprintf(first, sizeof first, "%s", inc);
    }
    traw_get("t:{f}:many", v, sizeof v);
    CHECK(!strncmp(v, "12:1:", 5) && strlen(v) == 5 + 8 * 17 - 1);
    CHECK(strstr(v, first) == NULL && strstr(v, "00000000000000a5,") == v + 5);
    /* One still in the list is refused... */
    CHECK(admit("t:{f}:many", "00000000000000a5", "99") == -1);
    /* ...one dropped from it would be taken for a new one (its holder
     * would have outlived eight losses), but its write still carries the
     * epoch of its first read, so the re-admission lets that one through
     * no more than any other new holder's read would. */
    CHECK(admit("t:{f}:many", first, "1") == 13);
    CHECK(check("t:{f}:many", first, "1", 1) == 0);
    CHECK(check("t:{f}:many", first, "1", 13) == 1);
}

static void test_unreadable_value(void) {
    traw_cmd("SET t:{f}:bad %s", "1:2");            /* neither form */
    CHECK(admit("t:{f}:bad", I1, "5") == -2);  /* an error: nothing admitted */
    CHECK(check("t:{f}:bad", I1, "5", 1) == -2);
    char v[40];
    CHECK_STR(traw_get("t:{f}:bad", v, sizeof v), "1:2");
}

/* ---------------------------------------------------- lock_fenced_set */

static void test_fenced_set_incarnations(void) {
    const char *urls[1] = { url };
    char err[300], v[200];
    lock_options o = { .urls = urls, .nurls = 1, .timeout_ms = 1000 };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    uint64_t hi = 0, i1 = 0x1111111111111111ULL, i2 = 0x2222222222222222ULL;
    traw_cmd("DEL t:{fs}:fence t:{fs}:value");
    CHECK(lock_fenced_set(c, "t:{fs}:fence", "t:{fs}:value", 50, i1, "a", 1, &hi, err,
                          sizeof err) == 1);
    CHECK(lock_fenced_set(c, "t:{fs}:fence", "t:{fs}:value", 40, i1, "b", 1, &hi, err,
                          sizeof err) == 0 && hi == 50);
    /* Lost its data: token 1 of a new incarnation is written. */
    CHECK(lock_fenced_set(c, "t:{fs}:fence", "t:{fs}:value", 1, i2, "c", 1, &hi, err,
                          sizeof err) == 1);
    CHECK(lock_fenced_set(c, "t:{fs}:fence", "t:{fs}:value", 60, i1, "d", 1, &hi, err,
                          sizeof err) == 0 && hi == 1);
    CHECK_STR(traw_get("t:{fs}:value", v, sizeof v), "c");
    lock_client_free(c);
}

/* ------------------------------------------------- the stock, through it */

static lock_client *lock_server(void) {
    rconn_addr a;
    char err[300], u[300];
    rconn_parse(url, &a, err, sizeof err);
    snprintf(u, sizeof u, "redis://%.200s:%d/%d", a.host, a.port, LOCK_DB);
    const char *urls[1] = { u };
    lock_options o = { .urls = urls, .nurls = 1, .timeout_ms = 1000 };
    return lock_client_new(&o, err, sizeof err);
}

static void lose_lock_data(void) {
    traw_cmd("SELECT %d", LOCK_DB), traw_cmd("FLUSHDB"), traw_cmd("SELECT 0");
}

static stock_conn *conn(lock_client *lc) {
    char err[200];
    stock_config cfg = { .redis_url = url, .prefix = "fs:", .timeout_ms = 2000,
                         .instance = "test-fence", .idem_ttl_ms = 60000, .lock_ttl_ms = 5000,
                         .lock_wait_ms = 3000 };
    cfg.locks[STOCK_LOCKS_REDLOCK] = lc;
    return stock_conn_new(&cfg, err, sizeof err);
}

static stock_result order(stock_conn *sc, const stock_product *p, const char *id) {
    stock_req r = { .product = p, .order_id = id, .user_id = "u", .quantity = 1,
                    .fingerprint = "f" };
    stock_reserve_one(sc, &r);
    return r.result;
}

static long long left(stock_conn *sc, const stock_product *p) {
    long long total = -1;
    stock_read(sc, p, &total, NULL);
    return total;
}

static void test_stock_sells_on_after_lock_data_lost(void) {
    lock_client *lc = lock_server();
    stock_conn *sc = conn(lc);
    stock_product p = { .sku = "t-lost", .strategy = STOCK_REDLOCK, .segments = 1 };
    char v[300];
    lose_lock_data();
    CHECK(stock_load(sc, &p, 1, 10, NULL, 0, 1) == 0);
    /* A fence as an older version left it: a plain integer, high. */
    traw_cmd("SET fs:{t-lost}:fence:redlock:0 %s", "999999");
    CHECK(order(sc, &p, "l1") == STOCK_RESERVED);
    CHECK(order(sc, &p, "l2") == STOCK_RESERVED);
    traw_get("fs:{t-lost}:fence:redlock:0", v, sizeof v);
    CHECK(!strncmp(v, "1:2:" UNNAMED ",", 4 + 17));
    /* The lock server loses its data: its tokens start over at 1, under a
     * new incarnation, which the fence admits at once. */
    lose_lock_data();
    CHECK(order(sc, &p, "l3") == STOCK_RESERVED);
    traw_get("fs:{t-lost}:fence:redlock:0", v, sizeof v);
    CHECK(!strncmp(v, "2:1:" UNNAMED ",", 4 + 17) && strlen(v) == 4 + 3 * 17 - 1);
    CHECK(left(sc, &p) == 7);
    stock_conn_free(sc);
    lock_client_free(lc);
}

typedef struct stale_run {
    lock_client *lc;
    const stock_product *p;
    stock_result result;
} stale_run;

static void *stale_holder(void *arg) {
    stale_run *s = arg;
    stock_conn *sc = conn(s->lc);
    s->result = order(sc, s->p, "stale");
    stock_conn_free(sc);
    return NULL;
}

static void test_stale_holder_across_incarnations(void) {
    lock_client *lc = lock_server();
    stock_conn *sc = conn(lc);
    stock_product p = { .sku = "t-stale", .strategy = STOCK_REDLOCK, .segments = 1 };
    stock_product paused = p;
    paused.cs_delay_ms = 800;
    lose_lock_data();
    CHECK(stock_load(sc, &p, 1, 5, NULL, 0, 1) == 0);
    CHECK(order(sc, &p, "s0") == STOCK_RESERVED);
    /* A takes the lock, reads (admitted), and pauses in its critical
     * section; meanwhile the lock server loses its data, A's lock with it,
     * and B takes the lock anew -- token 1 of a new incarnation -- reads
     * and sells. A's write, after B's read, is refused. */
    stale_run a = { lc, &paused, STOCK_UNAVAILABLE };
    pthread_t t;
    pthread_create(&t, NULL, stale_holder, &a);
    char v[100];
    for (int i = 0; i < 200; i++) {
        traw_cmd("SELECT %d", LOCK_DB);
        traw_get("fs:{t-stale}:lock:0", v, sizeof v);
        traw_cmd("SELECT 0");
        if (v[0]) break;
        clock_sleep_ms(5);
    }
    CHECK(v[0] != '\0');
    clock_sleep_ms(150);                      /* A is past its read, in the pause */
    lose_lock_data();
    int64_t t0 = clock_mono_ms();
    CHECK(order(sc, &p, "fresh") == STOCK_RESERVED);
    CHECK(clock_mono_ms() - t0 < 500);        /* B did not wait for A's lock: it is gone */
    pthread_join(t, NULL);
    CHECK(a.result == STOCK_FENCED);
    CHECK(left(sc, &p) == 3);                 /* s0 and fresh; A took nothing */
    stock_conn_free(sc);
    lock_client_free(lc);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_old_integer_form), T(test_newest_older_unseen), T(test_bounded_list),
        T(test_unreadable_value), T(test_fenced_set_incarnations),
        T(test_stock_sells_on_after_lock_data_lost), T(test_stale_holder_across_incarnations),
    };
    url = traw_open();
    probe = lock_script_compose(PROBE_BODY);
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    free(probe);
    traw_close();
    return rc;
}
