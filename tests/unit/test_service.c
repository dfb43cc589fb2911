/* test_service.c: unit tests of the service's pure parts: validation of
 * identifiers and bodies, fingerprints, order ids, key naming, Redis URLs
 * and script hashing. */
#include <jansson.h>
#include <pthread.h>

#include "common/rconn.h"
#include "common/utf8.h"
#include "service/api/validate.h"
#include "service/order/order.h"
#include "stock/stock.h"
#include "tests/unit/t.h"

static void test_sku(void) {
    CHECK(svc_valid_sku("phone-x"));
    CHECK(svc_valid_sku("A.b_c-9"));
    CHECK(svc_valid_sku("x"));
    char long64[65], long65[66];
    memset(long64, 'a', 64); long64[64] = 0;
    memset(long65, 'a', 65); long65[65] = 0;
    CHECK(svc_valid_sku(long64));
    CHECK(!svc_valid_sku(long65));
    CHECK(!svc_valid_sku(""));
    CHECK(!svc_valid_sku("phone x"));
    CHECK(!svc_valid_sku("phone/x"));
    CHECK(!svc_valid_sku("{tag}"));
    CHECK(!svc_valid_sku("caf\xc3\xa9"));
}

static void test_user_and_key(void) {
    CHECK(svc_valid_user_id("u-42"));
    CHECK(svc_valid_user_id("jos\xc3\xa9 \xe2\x9c\x93"));
    CHECK(!svc_valid_user_id(""));
    CHECK(!svc_valid_user_id("a\nb"));
    char u128[129 * 2], u129[130];
    for (int i = 0; i < 128; i++) { u128[2 * i] = (char)0xc3; u128[2 * i + 1] = (char)0xa9; }
    u128[256] = 0;
    CHECK(svc_valid_user_id(u128));           /* 128 characters, 256 bytes */
    memset(u129, 'u', 129); u129[129] = 0;
    CHECK(!svc_valid_user_id(u129));
    CHECK(!svc_valid_user_id("bob\xc2\x85"));          /* C1: NEL */
    CHECK(!svc_valid_user_id("\xc2\x9b""31m"));         /* C1: CSI, a terminal escape */
    CHECK(svc_valid_user_id("\xc2\xa0x"));              /* U+00A0 is not a control */
    CHECK(!svc_valid_user_id("bad\xff"));               /* not UTF-8 (a query value) */
    CHECK(!svc_valid_user_id("\xed\xa0\x80"));         /* a surrogate */
    CHECK(!svc_valid_user_id("a\x7f"));
    CHECK(svc_valid_idem_key("k1"));
    CHECK(svc_valid_idem_key("~!@#$%^&*()"));
    CHECK(!svc_valid_idem_key(""));
    CHECK(!svc_valid_idem_key("has space"));
    CHECK(!svc_valid_idem_key("caf\xc3\xa9"));
}

static json_t *J(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j) fprintf(stderr, "bad test JSON: %s\n", text);
    return j;
}

/* Validates an order body and returns the error code ("" when valid). */
static const char *order_code(const char *text, svc_order_input *in) {
    static svc_verr e;
    json_t *j = J(text);
    const char *code = svc_validate_order(j, in, &e) == 0 ? "" : e.code;
    json_decref(j);
    return code;
}

static void test_order_body(void) {
    svc_order_input in;
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":3}", &in), "");
    CHECK(in.quantity == 3);
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1000}", &in), "");
    CHECK_STR(order_code("{\"user_id\":\"u\",\"quantity\":1}", &in), "missing_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"quantity\":1}", &in), "missing_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\"}", &in), "missing_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":0}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":-1}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1001}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1.5}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":\"1\"}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":9223372036854775807}", &in),
              "invalid_field");
    CHECK_STR(order_code("{\"sku\":7,\"user_id\":\"u\",\"quantity\":1}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a b\",\"user_id\":\"u\",\"quantity\":1}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"\",\"quantity\":1}", &in), "invalid_field");
    CHECK_STR(order_code("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1,\"x\":1}", &in),
              "invalid_field");
}

/* The fast order-body reader (svc_validate_order_fast) against jansson and
 * svc_validate_order: whatever it takes, the slow path takes with the same
 * values. Returns whether it took text. */
static int fast_agrees(const char *text, size_t len) {
    svc_order_fast f;
    if (!svc_validate_order_fast(text, len, &f)) return 0;
    json_error_t je;
    svc_verr e;
    svc_order_input in;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    CHECK(j != NULL && json_is_object(j));
    if (!j) {
        fprintf(stderr, "fast took what jansson refuses: ");
        for (size_t i = 0; i < len; i++)
            fprintf(stderr, (unsigned char)text[i] >= 0x20 && (unsigned char)text[i] < 0x7f ? "%c"
                            : "\\x%02x", (unsigned char)text[i]);
        fprintf(stderr, "\n");
        return 1;
    }
    int ok = svc_validate_order(j, &in, &e) == 0;
    CHECK(ok);
    if (ok) {
        CHECK_STR(f.in.sku, in.sku);
        CHECK_STR(f.in.user_id, in.user_id);
        CHECK(f.in.quantity == in.quantity);
    }
    json_decref(j);
    return 1;
}

static int fast_takes(const char *text) { return fast_agrees(text, strlen(text)); }

static void test_order_body_fast(void) {
    CHECK(fast_takes("{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":3}"));
    CHECK(fast_takes(" {\r\n \"quantity\" : 1000 ,\t\"user_id\":\"\xc3\xa9t\xc3\xa9\", \"sku\":\"s-1.x_\"}\n"));
    /* Left to jansson: valid but escaped, or an error for it to word. */
    static const char *const slow[] = {
        "{\"sku\":\"a\",\"user_id\":\"u\\\"v\",\"quantity\":3}",   /* an escape */
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":3,\"sku\":\"b\"}", /* twice */
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":3,\"x\":1}",
        "{\"sku\":\"a\",\"user_id\":\"u\"}", "{}", "[]", "",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":0}",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1001}",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":01}",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":-1}",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1.0}",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1e2}",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":\"1\"}",
        "{\"sku\":\"a b\",\"user_id\":\"u\",\"quantity\":1}",
        "{\"sku\":\"a\",\"user_id\":\"\",\"quantity\":1}",
        "{\"sku\":\"a\",\"user_id\":\"\xff\",\"quantity\":1}",      /* not UTF-8 */
        "{\"sku\":\"a\",\"user_id\":\"\xc2\x85\",\"quantity\":1}",  /* C1 control */
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1} x",
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1,}",
        "\xef\xbb\xbf{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1}",  /* a BOM */
        "{\"sku\":\"a\",\"user_id\":\"u\",\"quantity\":1",
    };
    for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++) CHECK(!fast_takes(slow[i]));
    char nul[] = "{\"sku\":\"a\",\"user_id\":\"u\0v\",\"quantity\":1}";
    CHECK(!fast_agrees(nul, sizeof nul - 1));
    /* Mutations of a valid body (a byte changed, dropped or doubled): what
     * the fast reader takes, jansson and the validation take the same. */
    static const char base[] = "{\"sku\": \"p-1\", \"user_id\": \"u\xc3\xa9\", \"quantity\": 12}";
    static const char alphabet[] = "{}[]\",: \t\n\\0123456789-+.eEuxskqyt\x80\xc3\xff\x01";
    unsigned seed = 12345, taken = 0;
    char buf[sizeof base + 2];
    for (int it = 0; it < 200000; it++) {
        seed = seed * 1103515245u + 12345u;
        size_t at = (seed >> 8) % (sizeof base - 1), n = sizeof base - 1;
        memcpy(buf, base, n);
        char c = alphabet[(seed >> 20) % (sizeof alphabet - 1)];
        switch ((seed >> 28) % 3) {
        case 0: buf[at] = c; break;
        case 1: memmove(buf + at, buf + at + 1, n - at - 1); n--; break;
        default: memmove(buf + at + 1, buf + at, n - at); buf[at] = c; n++; break;
        }
        taken += (unsigned)fast_agrees(buf, n);
    }
    CHECK(taken > 1000);          /* many mutants are still valid bodies (spaces, digits) */
}

/* Validates a product body; in->name is copied out before the JSON goes. */
static const char *product_code(const char *text, svc_product_input *in) {
    static svc_verr e;
    static char name[512];
    json_t *j = J(text);
    const char *code = svc_validate_product(j, "lua", 0, in, &e) == 0 ? "" : e.code;
    snprintf(name, sizeof name, "%s", code[0] || !in->name ? "" : in->name);
    in->name = name;
    in->sku = in->strategy = NULL;
    json_decref(j);
    return code;
}

static void test_product_body(void) {
    svc_product_input in;
    CHECK_STR(product_code("{\"sku\":\"p\",\"name\":\"P\",\"stock\":10}", &in), "");
    CHECK(in.segments == 1 && in.stock == 10 && in.per_user_limit == 0);
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":0,\"segments\":1024,\"strategy\":\"lua\","
                           "\"per_user_limit\":2}", &in), "");
    CHECK_STR(in.name, "p");
    CHECK(in.segments == 1024 && in.per_user_limit == 2);
    CHECK_STR(product_code("{\"sku\":\"p\"}", &in), "missing_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":-1}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1000000001}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"segments\":0}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"segments\":1025}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"strategy\":\"magic\"}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"name\":\"\"}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"segmnets\":4}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"strategy\":\"db\",\"segments\":2}", &in),
              "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"strategy\":\"lock\",\"segments\":2}", &in), "");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"cs_delay_ms\":5}", &in), "invalid_field");
    CHECK_STR(product_code("{\"sku\":\"p\",\"stock\":1,\"lock_ttl_ms\":50}", &in), "invalid_field");
    long long q;
    svc_verr e;
    json_t *j = J("{\"quantity\":5}");
    CHECK(svc_validate_restock(j, &q, &e) == 0 && q == 5);
    json_decref(j);
    j = J("{\"quantity\":0}");
    CHECK(svc_validate_restock(j, &q, &e) != 0 && !strcmp(e.code, "invalid_field"));
    json_decref(j);
}

static void test_fingerprint(void) {
    char a[17], b[17], c[17], d[17];
    svc_order_fingerprint("sku", "user", 1, a);
    svc_order_fingerprint("sku", "user", 1, b);
    svc_order_fingerprint("sku", "user", 2, c);
    svc_order_fingerprint("skuu", "ser", 1, d);
    CHECK_STR(a, b);
    CHECK(strcmp(a, c) != 0);
    CHECK(strcmp(a, d) != 0);
    CHECK(strlen(a) == 16);
}

static void test_order_ids_increase(void) {
    char prev[27] = "", id[27];
    int64_t ms;
    for (int i = 0; i < 100000; i++) {
        svc_order_id_new(id, &ms);
        CHECK(svc_order_id_valid(id));
        if (strcmp(prev, id) >= 0) {
            CHECK(strcmp(prev, id) < 0);
            break;
        }
        memcpy(prev, id, sizeof id);
    }
    CHECK(!svc_order_id_valid("01M818STFFTPCACA913QWDW15"));     /* 25 chars */
    CHECK(!svc_order_id_valid("01M818STFFTPCACA913QWDW15I"));    /* I is not base32 */
    CHECK(!svc_order_id_valid("81M818STFFTPCACA913QWDW159"));    /* > 128 bits */
}

static void test_order_id_time(void) {
    char id[27];
    int64_t ms;
    svc_order_id_new(id, &ms);
    /* The first 10 characters are the 48-bit millisecond time. */
    int64_t decoded = 0;
    const char *b32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    for (int i = 0; i < 10; i++) decoded = decoded * 32 + (strchr(b32, id[i]) - b32);
    CHECK(decoded == ms);
}

#define IDS_PER_THREAD 20000
static char thread_ids[4][IDS_PER_THREAD][27];
static void *make_ids(void *arg) {
    char (*out)[27] = arg;
    for (int i = 0; i < IDS_PER_THREAD; i++) svc_order_id_new(out[i], NULL);
    return NULL;
}
static int cmp_id(const void *a, const void *b) { return strcmp(a, b); }

static void test_order_ids_unique_across_threads(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, make_ids, thread_ids[i]);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    qsort(thread_ids, 4 * IDS_PER_THREAD, 27, cmp_id);
    char (*all)[27] = (char (*)[27])thread_ids;
    int dups = 0;
    for (int i = 1; i < 4 * IDS_PER_THREAD; i++) dups += !strcmp(all[i - 1], all[i]);
    CHECK(dups == 0);
}

static void test_keys(void) {
    char buf[128];
    CHECK(stock_key(buf, sizeof buf, "fs:", "phone-x", "stock:0") > 0);
    CHECK_STR(buf, "fs:{phone-x}:stock:0");
    CHECK(stock_key(buf, sizeof buf, "", "a", "gen") > 0);
    CHECK_STR(buf, "{a}:gen");
    CHECK(stock_key(buf, 8, "fs:", "phone-x", "gen") == -1);
}

static void test_redis_urls(void) {
    rconn_addr a;
    char err[200];
    CHECK(rconn_parse("redis://127.0.0.1:6380/2", &a, err, sizeof err) == 0);
    CHECK_STR(a.host, "127.0.0.1");
    CHECK(a.port == 6380 && a.db == 2 && !a.path[0]);
    CHECK(rconn_parse("redis://localhost", &a, err, sizeof err) == 0);
    CHECK(a.port == 6379 && a.db == 0);
    CHECK(rconn_parse("redis://:secret@h:1/0", &a, err, sizeof err) == 0);
    CHECK_STR(a.password, "secret");
    CHECK(rconn_parse("redis://bob:pw@h:1", &a, err, sizeof err) == 0);
    CHECK_STR(a.user, "bob");
    CHECK_STR(a.password, "pw");
    CHECK(rconn_parse("unix:/tmp/redis.sock", &a, err, sizeof err) == 0);
    CHECK_STR(a.path, "/tmp/redis.sock");
    CHECK(rconn_parse("unix:///tmp/r.sock?db=3", &a, err, sizeof err) == 0);
    CHECK_STR(a.path, "/tmp/r.sock");
    CHECK(a.db == 3);
    CHECK(rconn_parse("http://h:1", &a, err, sizeof err) != 0);
    CHECK(rconn_parse("redis://h:99999", &a, err, sizeof err) != 0);
    CHECK(rconn_parse("redis://h:1/x", &a, err, sizeof err) != 0);
    CHECK(rconn_parse("", &a, err, sizeof err) != 0);
    CHECK(rconn_parse("unix:relative", &a, err, sizeof err) != 0);
}

static void test_script_sha(void) {
    rconn_script s;
    rconn_script_init(&s, "one", "return 1");
    /* The SHA1 Redis gives SCRIPT LOAD "return 1". */
    CHECK_STR(s.sha, "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
    rconn_script_init(&s, "abc", "abc");
    CHECK_STR(s.sha, "a9993e364706816aba3e25717850c26c9cd0d89d");
    char big[1000];
    memset(big, 'a', sizeof big - 1);
    big[999] = 0;
    rconn_script_init(&s, "big", big);   /* crosses several 64-byte blocks */
    CHECK_STR(s.sha, "d8e4b5c1594d2e9c1c4154eb8ea5715cfe9dd055");
}

/* common/utf8: what jansson accepts, and repairs that keep it so. */
static void test_utf8(void) {
    char out[16];
    CHECK(utf8_valid("caf\xc3\xa9", 5));
    CHECK(!utf8_valid("\xff", 1));
    CHECK(!utf8_valid("\xc3", 1));                  /* cut in half */
    CHECK(!utf8_valid("\xc0\xaf", 2));              /* overlong '/' */
    CHECK(!utf8_valid("\xf4\x90\x80\x80", 4));      /* above U+10FFFF */
    CHECK(utf8_clean(out, sizeof out, "a\xff""b", 3) == 5);
    CHECK_STR(out, "a\xef\xbf\xbd""b");
    /* Too long: cut on a character boundary, marked with "...". */
    utf8_clean(out, 8, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 8);
    CHECK_STR(out, "\xc3\xa9\xc3\xa9...");
    CHECK(utf8_valid(out, strlen(out)));
    utf8_clean(out, 4, "abcdef", 6);
    CHECK_STR(out, "...");
    utf8_clean(out, 8, "abc\xc3", 4);             /* a trailing half character */
    CHECK_STR(out, "abc\xef\xbf\xbd");
    for (unsigned cap = 4; cap < 16; cap++) {      /* every cut stays valid */
        utf8_clean(out, cap, "\xe2\x9c\x93\xf0\x9f\x98\x80\xc3\xa9zz\xe2\x9c", 14);
        CHECK(strlen(out) < cap && utf8_valid(out, strlen(out)));
    }
}

TEST_MAIN(T(test_sku), T(test_user_and_key), T(test_utf8), T(test_order_body),
          T(test_order_body_fast), T(test_product_body),
          T(test_fingerprint), T(test_order_ids_increase), T(test_order_id_time),
          T(test_order_ids_unique_across_threads), T(test_keys), T(test_redis_urls),
          T(test_script_sha))
