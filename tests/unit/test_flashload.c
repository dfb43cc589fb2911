/* test_flashload.c: flashload's pure parts: the HTTP response parser (any
 * slicing of the stream, chunked bodies, pipelined responses, framing by
 * close), the latency histogram (bucket edges, percentiles within the
 * promised 3.2%, merging), the zipf sampler, target parsing, compare's
 * scene matrix (three groups: the locks' pause scenes, the Redis failures)
 * and the lock table's cells; for holds, the buyers' decisions and think
 * times, the timer queue they wait in, and the service's timestamps read as
 * Unix ms. No network: the loads against real processes are in
 * tests/test_flashload.py. */
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "db/db.h"
#include "loadtest/compare/compare.h"
#include "loadtest/engine/crowd_int.h"
#include "loadtest/engine/timerq.h"
#include "tests/unit/t.h"

/* The load generator keeps its own copies of the API's limits (it shares no
 * code with the service: loadtest/fl.h); here, where both can be seen, they
 * must agree with the database's: the verifier reads every key and order id
 * the rows may hold. */
_Static_assert(FL_KEY_MAX == DB_KEY_MAX, "flashload's idempotency-key limit is the database's");
_Static_assert(FL_ORDER_ID_LEN == DB_ORDER_ID_LEN, "flashload's order ids are the database's");

static const char SIMPLE[] =
    "HTTP/1.1 201 Created\r\n"
    "Connection: Keep-Alive\r\n"
    "Content-Length: 26\r\n"
    "Content-Type: application/json\r\n"
    "\r\n"
    "{\"order_id\":\"01ABC\",\"q\":1}";

static const char CHUNKED[] =
    "HTTP/1.1 200 OK\r\n"
    "Transfer-Encoding: chunked\r\n"
    "Idempotent-Replayed: true\r\n"
    "\r\n"
    "5;name=value\r\nhello\r\n"
    "1\r\n,\r\n"
    "7\r\n world!\r\n"
    "0\r\n"
    "X-Trailer: yes\r\n"
    "\r\n";

/* Feeds the whole of s in slices of `step` bytes; returns the last status
 * and the bytes consumed in total. */
static int feed_sliced(fl_resp *r, const char *s, size_t len, size_t step, size_t *consumed) {
    size_t off = 0;
    int rc = FL_RESP_MORE;
    *consumed = 0;
    while (off < len) {
        size_t n = len - off < step ? len - off : step, used;
        rc = fl_resp_feed(r, s + off, n, &used);
        *consumed += used;
        if (rc != FL_RESP_MORE) return rc;
        CHECK(used == n);
        off += n;
    }
    return rc;
}

static void test_simple_response(void) {
    fl_resp r;
    fl_resp_init(&r, 4096);
    size_t used;
    CHECK(fl_resp_feed(&r, SIMPLE, sizeof SIMPLE - 1, &used) == FL_RESP_DONE);
    CHECK(used == sizeof SIMPLE - 1);
    CHECK(r.status == 201 && r.keep_alive && !r.replayed && !r.chunked);
    CHECK(r.content_length == 26 && r.body_len == 26);
    CHECK_STR(r.body, "{\"order_id\":\"01ABC\",\"q\":1}");
    char id[32];
    CHECK(fl_json_str(r.body, r.body_len, "order_id", id, sizeof id) == 5);
    CHECK_STR(id, "01ABC");
    fl_resp_free(&r);
}

static void test_every_slicing(void) {
    /* One byte at a time, and every other slice size: same result. */
    for (size_t step = 1; step <= sizeof SIMPLE; step++) {
        fl_resp r;
        fl_resp_init(&r, 4096);
        size_t consumed;
        CHECK(feed_sliced(&r, SIMPLE, sizeof SIMPLE - 1, step, &consumed) == FL_RESP_DONE);
        CHECK(consumed == sizeof SIMPLE - 1);
        CHECK(r.status == 201 && r.body_len == 26);
        CHECK(r.body && !strcmp(r.body, "{\"order_id\":\"01ABC\",\"q\":1}"));
        fl_resp_free(&r);
    }
}

static void test_chunked_any_slicing(void) {
    for (size_t step = 1; step <= sizeof CHUNKED; step++) {
        fl_resp r;
        fl_resp_init(&r, 4096);
        size_t consumed;
        CHECK(feed_sliced(&r, CHUNKED, sizeof CHUNKED - 1, step, &consumed) == FL_RESP_DONE);
        CHECK(consumed == sizeof CHUNKED - 1);
        CHECK(r.status == 200 && r.chunked && r.replayed && r.keep_alive);
        CHECK(r.body && !strcmp(r.body, "hello, world!"));
        CHECK(r.body_total == 13);
        fl_resp_free(&r);
    }
}

static void test_pipelined_responses(void) {
    /* Three responses back to back in one buffer: each ends where it should
     * and the parser, reset, reads the next from the remaining bytes. */
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s%s%s", SIMPLE, CHUNKED,
                     "HTTP/1.1 409 Conflict\r\nContent-Length: 19\r\n\r\n{\"error\":\"sold_out\"}");
    /* The third body is 20 bytes; Content-Length says 19: the last byte is
     * left over, as the start of a fourth response would be. */
    fl_resp r;
    fl_resp_init(&r, 4096);
    size_t off = 0, used;
    int statuses[3];
    for (int i = 0; i < 3; i++) {
        CHECK(fl_resp_feed(&r, buf + off, (size_t)n - off, &used) == FL_RESP_DONE);
        statuses[i] = r.status;
        off += used;
        if (i == 1) CHECK(r.body && !strcmp(r.body, "hello, world!"));
        if (i == 2) CHECK(r.body && !strcmp(r.body, "{\"error\":\"sold_out\""));
        fl_resp_reset(&r);
    }
    CHECK(statuses[0] == 201 && statuses[1] == 200 && statuses[2] == 409);
    CHECK(off == (size_t)n - 1);
    CHECK(fl_resp_feed(&r, buf + off, 1, &used) == FL_RESP_MORE && used == 1);
    CHECK(fl_resp_started(&r));
    fl_resp_free(&r);
}

static void test_pipelined_split_across_reads(void) {
    /* Two responses, split in the middle of the second one's headers. */
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "%s%s", SIMPLE, SIMPLE);
    size_t cut = sizeof SIMPLE - 1 + 20;
    fl_resp r;
    fl_resp_init(&r, 4096);
    size_t used;
    CHECK(fl_resp_feed(&r, buf, cut, &used) == FL_RESP_DONE);
    CHECK(used == sizeof SIMPLE - 1);
    fl_resp_reset(&r);
    CHECK(fl_resp_feed(&r, buf + used, cut - used, &used) == FL_RESP_MORE);
    CHECK(fl_resp_feed(&r, buf + cut, (size_t)n - cut, &used) == FL_RESP_DONE);
    CHECK(used == (size_t)n - cut && r.status == 201 && r.body_len == 26);
    fl_resp_free(&r);
}

static void test_framing_by_close_and_no_body(void) {
    fl_resp r;
    fl_resp_init(&r, 4096);
    size_t used;
    /* No length, not chunked: the body runs to the end of the connection. */
    const char *eof = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it";
    CHECK(fl_resp_feed(&r, eof, strlen(eof), &used) == FL_RESP_MORE);
    CHECK(!r.keep_alive);
    CHECK(fl_resp_eof(&r) == FL_RESP_DONE);
    CHECK(r.body && !strcmp(r.body, "all of it"));
    /* 204 and 304 have no body, whatever the headers say. */
    fl_resp_reset(&r);
    const char *nc = "HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n";
    CHECK(fl_resp_feed(&r, nc, strlen(nc), &used) == FL_RESP_DONE && used == strlen(nc));
    /* HTTP/1.0 closes unless it says keep-alive; Connection: close closes. */
    fl_resp_reset(&r);
    const char *h10 = "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
    CHECK(fl_resp_feed(&r, h10, strlen(h10), &used) == FL_RESP_DONE && !r.keep_alive);
    fl_resp_reset(&r);
    const char *h10ka = "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n";
    CHECK(fl_resp_feed(&r, h10ka, strlen(h10ka), &used) == FL_RESP_DONE && r.keep_alive);
    fl_resp_reset(&r);
    const char *close = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                        "Content-Length: 2\r\n\r\n{}";
    CHECK(fl_resp_feed(&r, close, strlen(close), &used) == FL_RESP_DONE);
    CHECK(r.status == 503 && !r.keep_alive);
    /* 100 Continue is skipped: the final response follows. */
    fl_resp_reset(&r);
    const char *cont = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}";
    CHECK(fl_resp_feed(&r, cont, strlen(cont), &used) == FL_RESP_DONE);
    CHECK(r.status == 201 && used == strlen(cont));
    fl_resp_free(&r);
}

static void test_truncated_and_malformed(void) {
    fl_resp r;
    fl_resp_init(&r, 4096);
    size_t used;
    /* A connection closed mid-body is an error, not a response. */
    const char *part = "HTTP/1.1 201 Created\r\nContent-Length: 50\r\n\r\n{\"order";
    CHECK(fl_resp_feed(&r, part, strlen(part), &used) == FL_RESP_MORE);
    CHECK(fl_resp_eof(&r) == FL_RESP_ERROR && r.error);
    /* Closed before anything: also an error, but not "started". */
    fl_resp_reset(&r);
    CHECK(!fl_resp_started(&r));
    CHECK(fl_resp_eof(&r) == FL_RESP_ERROR);
    const char *bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_resp_reset(&r);
        int rc = fl_resp_feed(&r, bad[i], strlen(bad[i]), &used);
        if (rc != FL_RESP_ERROR) fprintf(stderr, "  accepted: %s\n", bad[i]);
        CHECK(rc == FL_RESP_ERROR && r.error);
    }
    /* A header line longer than the parser keeps. */
    fl_resp_reset(&r);
    const char *head = "HTTP/1.1 200 OK\r\nX-Long: ";
    CHECK(fl_resp_feed(&r, head, strlen(head), &used) == FL_RESP_MORE);
    static char filler[FL_RESP_LINE_MAX + 10];
    memset(filler, 'a', sizeof filler);
    CHECK(fl_resp_feed(&r, filler, sizeof filler, &used) == FL_RESP_ERROR);
    fl_resp_free(&r);
}

static void test_body_kept_up_to_max(void) {
    fl_resp r;
    fl_resp_init(&r, 8);
    size_t used;
    CHECK(fl_resp_feed(&r, SIMPLE, sizeof SIMPLE - 1, &used) == FL_RESP_DONE);
    CHECK(r.body_len == 8 && r.body_total == 26);
    CHECK(r.body && !strcmp(r.body, "{\"order_"));
    fl_resp_free(&r);
    fl_resp_init(&r, 0);         /* keep nothing, still frame correctly */
    CHECK(fl_resp_feed(&r, SIMPLE, sizeof SIMPLE - 1, &used) == FL_RESP_DONE);
    CHECK(r.body_len == 0 && r.body_total == 26 && used == sizeof SIMPLE - 1);
    fl_resp_free(&r);
}

static void test_json_str(void) {
    char out[16];
    const char *j = "{\"message\": \"order_id\", \"order_id\" : \"X1\", \"error\":\"sold_out\"}";
    CHECK(fl_json_str(j, strlen(j), "order_id", out, sizeof out) == 2);
    CHECK_STR(out, "X1");
    CHECK(fl_json_str(j, strlen(j), "error", out, sizeof out) == 8);
    CHECK_STR(out, "sold_out");
    CHECK(fl_json_str(j, strlen(j), "missing", out, sizeof out) == -1);
    CHECK(fl_json_str(j, strlen(j), "error", out, 4) == -1);    /* does not fit */
    const char *num = "{\"quantity\":3}";
    CHECK(fl_json_str(num, strlen(num), "quantity", out, sizeof out) == -1);
}

/* ----------------------------------------------------------------- histogram */

static void test_hist_buckets(void) {
    /* Every bucket's low edge maps back to it, edges increase, and no bucket
     * is wider than 1/32 of its values. */
    uint64_t prev = 0;
    for (unsigned i = 0; i < FL_HIST_BUCKETS; i++) {
        uint64_t lo = fl_hist_bucket_low(i);
        CHECK(fl_hist_index(lo) == i);
        if (i) CHECK(lo > prev);
        if (i + 1 < FL_HIST_BUCKETS && i >= FL_HIST_SUB) {
            uint64_t next = fl_hist_bucket_low(i + 1);
            CHECK((double)(next - lo) / (double)lo <= 1.0 / FL_HIST_SUB + 1e-12);
            CHECK(fl_hist_index(next - 1) == i);
        }
        prev = lo;
    }
    CHECK(fl_hist_index(0) == 0 && fl_hist_index(31) == 31 && fl_hist_index(32) == 32);
    CHECK(fl_hist_index(UINT64_MAX) == FL_HIST_BUCKETS - 1);
}

static void test_hist_percentiles(void) {
    static fl_hist h;
    fl_hist_reset(&h);
    CHECK(fl_hist_percentile(&h, 99) == 0);
    for (uint64_t v = 1; v <= 100000; v++) fl_hist_record(&h, v);
    CHECK(h.count == 100000 && h.min == 1 && h.max == 100000);
    const double ps[] = { 1, 50, 90, 99, 99.9 };
    for (int i = 0; i < 5; i++) {
        double want = ps[i] * 1000;
        double got = (double)fl_hist_percentile(&h, ps[i]);
        if (fabs(got - want) / want > 1.0 / FL_HIST_SUB)
            fprintf(stderr, "  p%g: got %.0f want %.0f\n", ps[i], got, want);
        CHECK(fabs(got - want) / want <= 1.0 / FL_HIST_SUB);
    }
    CHECK(fl_hist_percentile(&h, 100) == 100000);
    CHECK(fl_hist_percentile(&h, 0) == 1);
    CHECK(fabs(fl_hist_mean(&h) - 50000.5) < 1e-6);
    /* Small values are exact. */
    fl_hist_reset(&h);
    for (int i = 0; i < 90; i++) fl_hist_record(&h, 7);
    for (int i = 0; i < 10; i++) fl_hist_record(&h, 20);
    CHECK(fl_hist_percentile(&h, 50) == 7 && fl_hist_percentile(&h, 90) == 7);
    CHECK(fl_hist_percentile(&h, 91) == 20 && fl_hist_percentile(&h, 99.9) == 20);
    /* A single huge outlier is reported as the exact max, not a bucket edge. */
    fl_hist_record(&h, 123456789);
    CHECK(fl_hist_percentile(&h, 100) == 123456789 && h.max == 123456789);
    CHECK(fl_hist_percentile(&h, 99.99) <= 123456789);
}

static void test_hist_merge(void) {
    static fl_hist a, b, all;
    fl_hist_reset(&a);
    fl_hist_reset(&b);
    fl_hist_reset(&all);
    fl_rng rng;
    fl_rng_seed(&rng, 42);
    for (int i = 0; i < 50000; i++) {
        uint64_t v = 1 + fl_rng_below(&rng, 2000000);
        fl_hist_record(i % 3 ? &a : &b, v);
        fl_hist_record(&all, v);
    }
    fl_hist_merge(&a, &b);
    CHECK(a.count == all.count && a.sum == all.sum && a.min == all.min && a.max == all.max);
    CHECK(memcmp(a.b, all.b, sizeof a.b) == 0);
    CHECK(fl_hist_percentile(&a, 99) == fl_hist_percentile(&all, 99));
    static fl_hist empty;
    fl_hist_reset(&empty);
    fl_hist_merge(&a, &empty);     /* merging nothing changes nothing */
    CHECK(a.min == all.min && a.count == all.count);
}

/* ------------------------------------------------------------ zipf, targets */

static void test_zipf_shape(void) {
    fl_zipf z;
    fl_rng rng;
    fl_rng_seed(&rng, 7);
    const double exps[] = { 0.5, 1.0, 1.5 };
    for (int e = 0; e < 3; e++) {
        fl_zipf_init(&z, 100, exps[e]);
        static uint64_t count[101];
        memset(count, 0, sizeof count);
        const int n = 400000;
        for (int i = 0; i < n; i++) {
            uint64_t k = fl_zipf_next(&z, &rng);
            CHECK(k >= 1 && k <= 100);
            if (k >= 1 && k <= 100) count[k]++;
        }
        /* P(1)/P(2) = 2^s and P(1)/P(4) = 4^s, within sampling noise. */
        double r12 = (double)count[1] / (double)count[2], r14 = (double)count[1] / (double)count[4];
        if (fabs(r12 / pow(2, exps[e]) - 1) > 0.05 || fabs(r14 / pow(4, exps[e]) - 1) > 0.07)
            fprintf(stderr, "  s=%g: P1/P2 %.3f (want %.3f), P1/P4 %.3f (want %.3f)\n", exps[e],
                    r12, pow(2, exps[e]), r14, pow(4, exps[e]));
        CHECK(fabs(r12 / pow(2, exps[e]) - 1) <= 0.05);
        CHECK(fabs(r14 / pow(4, exps[e]) - 1) <= 0.07);
        CHECK(count[100] > 0);
    }
    fl_zipf_init(&z, 1, 1.0);      /* one user: always rank 1 */
    for (int i = 0; i < 100; i++) CHECK(fl_zipf_next(&z, &rng) == 1);
}

static void test_rng_bounds(void) {
    fl_rng rng;
    fl_rng_seed(&rng, 1);
    uint64_t seen[10] = { 0 };
    for (int i = 0; i < 100000; i++) {
        uint64_t v = fl_rng_below(&rng, 10);
        CHECK(v < 10);
        if (v < 10) seen[v]++;
        double u = fl_rng_unit(&rng);
        CHECK(u >= 0 && u < 1);
    }
    for (int i = 0; i < 10; i++) CHECK(seen[i] > 9000 && seen[i] < 11000);
}

/* ------------------------------------------------------------------- holds */

static void test_decide_shares(void) {
    fl_rng rng;
    fl_rng_seed(&rng, 7);
    int n[3] = { 0, 0, 0 };
    for (int i = 0; i < 100000; i++) {
        int d = fl_decide(&rng, 0.6, 0.1);
        CHECK(d == FL_ABANDON || d == FL_PAY || d == FL_CANCEL);
        if (d >= 0 && d <= 2) n[d]++;
    }
    CHECK(n[FL_PAY] > 59000 && n[FL_PAY] < 61000);
    CHECK(n[FL_CANCEL] > 9400 && n[FL_CANCEL] < 10600);
    CHECK(n[FL_ABANDON] > 29000 && n[FL_ABANDON] < 31000);
    for (int i = 0; i < 1000; i++) {
        CHECK(fl_decide(&rng, 0, 0) == FL_ABANDON);
        CHECK(fl_decide(&rng, 1, 0) == FL_PAY);
        CHECK(fl_decide(&rng, 0, 1) == FL_CANCEL);
    }
}

static void test_think_within_the_hold(void) {
    fl_rng rng;
    fl_rng_seed(&rng, 9);
    double sum = 0;
    int64_t max = 0;
    for (int i = 0; i < 100000; i++) {
        int64_t t = fl_think_us(&rng, 2);
        CHECK(t >= 0 && t < 1600000);            /* within 80% of a 2 s hold */
        sum += (double)t;
        if (t > max) max = t;
    }
    CHECK(fabs(sum / 100000 - 800000) < 10000);  /* uniform: the mean is half of it */
    CHECK(max > 1590000);
    CHECK(fl_think_us(&rng, 0) == 0);
}

static void test_timerq_pops_in_time_order(void) {
    fl_timerq q = { 0 };
    fl_rng rng;
    fl_rng_seed(&rng, 3);
    CHECK(fl_timerq_peek(&q) == NULL);
    size_t pushed = 0, popped = 0;
    int64_t last = -1;
    /* Pushes and pops interleaved: every pop is the earliest left, and
     * nothing is lost or duplicated (user carries the push's number). */
    char *seen = calloc(5000, 1);
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 100; i++) {
            fl_due d = { .at = (int64_t)fl_rng_below(&rng, 1000000) + round * 10000,
                         .user = (uint32_t)pushed, .action = FL_PAY };
            CHECK(fl_timerq_push(&q, &d) == 0);
            pushed++;
        }
        last = -1;
        for (int i = 0; i < 60; i++) {
            const fl_due *top = fl_timerq_peek(&q);
            fl_due d;
            fl_timerq_pop(&q, &d);
            CHECK(top != NULL && d.at >= last);
            last = d.at;
            CHECK(d.user < 5000 && !seen[d.user]);
            if (d.user < 5000) seen[d.user] = 1;
            popped++;
        }
    }
    last = -1;
    while (fl_timerq_peek(&q)) {
        fl_due d;
        fl_timerq_pop(&q, &d);
        CHECK(d.at >= last && d.user < 5000 && !seen[d.user]);
        last = d.at;
        if (d.user < 5000) seen[d.user] = 1;
        popped++;
    }
    CHECK(pushed == 5000 && popped == 5000 && q.n == 0);
    free(seen);
    fl_timerq_free(&q);
    CHECK(fl_timerq_peek(&q) == NULL);
}

/* What libc's timegm says, for the expected values. */
static long long civil_ms(int y, int mo, int d, int h, int mi, int s, int ms) {
    struct tm tm = { .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                     .tm_min = mi, .tm_sec = s };
    return (long long)timegm(&tm) * 1000 + ms;
}

static void test_json_time_ms(void) {
    const char *j = "{\"created_at\":\"2026-11-22T09:36:42.071Z\",\"expires_at\": "
                    "\"2024-02-29T23:59:59.999Z\",\"a\":\"1970-01-01T00:00:00.000Z\","
                    "\"b\":\"2000-03-01T00:00:00.001Z\",\"c\":\"2026-11-22T09:36:42Z\","
                    "\"d\":\"2026-11-22T09:36:42.071+01:00\",\"e\":\"2026-13-22T09:36:42.071Z\","
                    "\"f\":7}";
    size_t n = strlen(j);
    CHECK(fl_json_time_ms(j, n, "created_at") == civil_ms(2026, 11, 22, 9, 36, 42, 71));
    CHECK(fl_json_time_ms(j, n, "expires_at") == civil_ms(2024, 2, 29, 23, 59, 59, 999));
    CHECK(fl_json_time_ms(j, n, "a") == -1);     /* before 2000: not a time of the service */
    CHECK(fl_json_time_ms(j, n, "b") == civil_ms(2000, 3, 1, 0, 0, 0, 1));
    CHECK(fl_json_time_ms(j, n, "c") == civil_ms(2026, 11, 22, 9, 36, 42, 0));   /* no ms */
    CHECK(fl_json_time_ms(j, n, "d") == -1);     /* not UTC */
    CHECK(fl_json_time_ms(j, n, "e") == -1);     /* month 13 */
    CHECK(fl_json_time_ms(j, n, "f") == -1);     /* not a string */
    CHECK(fl_json_time_ms(j, n, "missing") == -1);
}

static void test_target_parse(void) {
    fl_target t;
    fl_err e;
    CHECK(fl_target_parse("http://127.0.0.1:8080", &t, &e) == 0);
    CHECK(t.port == 8080 && !strcmp(t.host, "127.0.0.1") && !strcmp(t.hostport, "127.0.0.1:8080"));
    CHECK(fl_target_parse("127.0.0.1:9/ignored/path", &t, &e) == 0 && t.port == 9);
    CHECK(fl_target_parse("http://localhost", &t, &e) == 0 && t.port == 80);
    CHECK(fl_target_parse("https://127.0.0.1:1", &t, &e) == -1 && strstr(e.msg, "http://"));
    CHECK(fl_target_parse("http://127.0.0.1:99999", &t, &e) == -1);
    CHECK(fl_target_parse("http://:80", &t, &e) == -1);
    char key[64];
    fl_key_string("ab12", 42, key, sizeof key);
    CHECK_STR(key, "fl-ab12-42");
}

/* A strategy list as GET /v1/strategies gives it. */
static void strategy(fl_strategy *s, const char *name, int safe) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->safe = safe;
    s->segments = 1;
    s->available = 1;
}

static void test_compare_scenes_in_two_groups(void) {
    static fl_compare_opts o;
    fl_strategy st[5];
    strategy(&st[0], "lua", 1);
    strategy(&st[1], "lock", 1);
    strategy(&st[2], "etcd", 1);
    strategy(&st[3], "unsafe-lock-no-fence", 0);
    strategy(&st[4], "unsafe-read-write", 0);
    fl_compare_opts_default(&o);
    o.two_instances = 0;
    o.redis_failures = 0;
    o.holds = o.crowd = 0;
    fl_scene sc[64];
    int n = fl_compare_scenes(&o, st, 5, sc, 64);
    /* Contention, the safe ones only: lua, lock, etcd x1 x8. Then forced:
     * unsafe-read-write (a second holder, same read), then the leases:
     * unsafe-lock-no-fence, lock x1 x8, etcd. */
    CHECK(n == 11);
    int first_fault = -1;
    for (int i = 0; i < n; i++) {
        if (sc[i].fault && first_fault < 0) first_fault = i;
        if (first_fault >= 0) CHECK(sc[i].fault);           /* one group, after the other */
        CHECK(sc[i].fault == (sc[i].cs_delay_ms > 0));
        CHECK(sc[i].fault == (sc[i].cs_overlap == 2));      /* every fault here is forced */
        CHECK(!sc[i].unsafe || sc[i].fault);                /* no unsafe one left to luck */
        if (sc[i].unsafe) CHECK(sc[i].segments == 1 && sc[i].expect_force == FL_FORCE_MET);
    }
    CHECK(first_fault == 6);
    CHECK_STR(sc[0].strategy, "lua");
    CHECK(!strcmp(sc[2].strategy, "lock") && sc[2].segments == 1 && !sc[2].fault);
    CHECK_STR(sc[2].condition, "contention");
    CHECK(!strcmp(sc[6].strategy, "unsafe-read-write") && sc[6].stock == o.pause_stock);
    CHECK(!strcmp(sc[7].strategy, "unsafe-lock-no-fence") && sc[7].lock_ttl_ms == 100);
    /* The safe lock under the very same forcing as its unsafe twin. */
    CHECK(!strcmp(sc[8].strategy, "lock") && sc[8].lock_ttl_ms == sc[7].lock_ttl_ms &&
          sc[8].cs_delay_ms == sc[7].cs_delay_ms && sc[8].expect_force == FL_FORCE_MET);
    CHECK(!strcmp(sc[9].strategy, "lock") && sc[9].segments == 8);
    CHECK(!strcmp(sc[10].strategy, "etcd") && sc[10].lock_ttl_ms == 1000 &&
          sc[10].cs_delay_ms > 2 * sc[10].lock_ttl_ms);
    CHECK_STR(sc[10].condition, "held past its lease (1000ms) until a second holder came in");
    CHECK(sc[10].stock == o.pause_stock && sc[10].duration_s == o.pause_duration_s);
    /* --strategies keeps a lock's forced scene only when the lock is asked for. */
    snprintf(o.strategies[0], sizeof o.strategies[0], "lua");
    o.nstrategies = 1;
    n = fl_compare_scenes(&o, st, 5, sc, 64);
    CHECK(n == 2 && !sc[0].fault && !sc[1].fault);
    /* `local` on two instances oversells only at the sell-out, both
     * instances' holders reading the last unit: forced, one unit on sale;
     * on one instance, under the same forcing, no second holder comes. */
    fl_strategy loc[1];
    strategy(&loc[0], "local", 1);
    fl_compare_opts_default(&o);
    o.redis_failures = o.holds = o.fairness = 0;
    n = fl_compare_scenes(&o, loc, 1, sc, 64);
    CHECK(n == 4);
    CHECK(!strcmp(sc[2].strategy, "local") && sc[2].instances == 2 && sc[2].unsafe);
    CHECK(sc[2].fault && sc[2].cs_overlap == 2 && sc[2].stock == 1 &&
          sc[2].expect_force == FL_FORCE_MET);
    CHECK_STR(sc[2].condition, "2 instances, a mutex each: the last unit read by a second holder");
    CHECK(!strcmp(sc[3].strategy, "local") && sc[3].instances == 1 && !sc[3].unsafe &&
          sc[3].stock == 1 && sc[3].cs_delay_ms == sc[2].cs_delay_ms &&
          sc[3].expect_force == FL_FORCE_ALONE);
    CHECK(sc[0].instances == 1 && !sc[0].fault && !sc[0].unsafe);
}

/* The fairness group: each lock's queue and stream scenes, one segment, on
 * two instances but local's, after the other groups; a strategy that is no
 * lock has none, and --no-two-instances leaves only local's. */
static void test_compare_scenes_fairness(void) {
    static fl_compare_opts o;
    fl_strategy st[4];
    strategy(&st[0], "lua", 1);
    strategy(&st[1], "lock", 1);
    strategy(&st[2], "fair-lock", 1);
    strategy(&st[3], "local", 1);
    fl_compare_opts_default(&o);
    o.redis_failures = o.holds = o.forced = o.crowd = 0;
    CHECK(o.fairness == 1);                              /* on by default */
    fl_scene sc[64];
    int n = fl_compare_scenes(&o, st, 4, sc, 64);
    int fair = 0, first = -1;
    for (int i = 0; i < n; i++) {
        if (sc[i].group != FL_GROUP_FAIRNESS) {
            CHECK(first < 0);                            /* after the contention group */
            continue;
        }
        if (first < 0) first = i;
        CHECK(strcmp(sc[i].strategy, "lua") != 0);
        CHECK(sc[i].segments == 1 && !sc[i].fault && !sc[i].unsafe);
        CHECK(sc[i].instances == (!strcmp(sc[i].strategy, "local") ? 1 : 2));
        CHECK(sc[i].fair_scene == (fair % 2 ? FL_FAIR_STREAM : FL_FAIR_QUEUE));
        CHECK(sc[i].waiters >= 2 && sc[i].waiters <= FL_FAIR_MAX && sc[i].gap_ms > 0);
        CHECK(sc[i].stock == sc[i].waiters && sc[i].cs_delay_ms > 0);
        /* The queue's line forms at once; the stream's slowly. */
        if (sc[i].fair_scene == FL_FAIR_QUEUE) CHECK(sc[i].gap_ms * 3 < sc[i].cs_delay_ms);
        else CHECK(sc[i].gap_ms < sc[i].cs_delay_ms && sc[i].gap_ms * 2 > sc[i].cs_delay_ms);
        fair++;
    }
    CHECK(fair == 6);
    CHECK_STR(sc[first].strategy, "lock");
    o.two_instances = 0;
    n = fl_compare_scenes(&o, st, 4, sc, 64);
    fair = 0;
    for (int i = 0; i < n; i++)
        if (sc[i].group == FL_GROUP_FAIRNESS) fair += !strcmp(sc[i].strategy, "local") ? 1 : 100;
    CHECK(fair == 2);
}

/* The third group: each Redis failure with its unsafe version first, then
 * ours, after every other scene, one segment, one instance; a strategy the
 * service does not offer, or not asked for, has none. */
static void test_compare_scenes_redis_failures(void) {
    static fl_compare_opts o;
    fl_strategy st[6];
    strategy(&st[0], "lua", 1);
    strategy(&st[1], "lock", 1);
    strategy(&st[2], "redlock", 1);
    strategy(&st[3], "unsafe-trust-redis", 0);
    strategy(&st[4], "unsafe-redlock-no-fence", 0);
    strategy(&st[5], "etcd", 1);
    fl_compare_opts_default(&o);
    o.two_instances = 0;
    o.holds = o.fairness = o.crowd = 0;                  /* their own tests */
    CHECK(o.redis_failures == 1);                        /* on by default */
    fl_scene sc[64];
    int n = fl_compare_scenes(&o, st, 6, sc, 64);
    int first = -1, count = 0;
    for (int i = 0; i < n; i++) {
        if (sc[i].group != FL_GROUP_FAILURE) {
            CHECK(first < 0);                                /* the group comes last */
            CHECK(strcmp(sc[i].strategy, "unsafe-trust-redis") != 0);   /* no contention scene */
            continue;
        }
        if (first < 0) first = i;
        count++;
        CHECK(sc[i].fault && sc[i].failure != FL_FAIL_NONE && sc[i].segments == 1 &&
              sc[i].instances == 1 && sc[i].condition[0]);
        CHECK(sc[i].unsafe == !strncmp(sc[i].strategy, "unsafe-", 7));
    }
    CHECK(count == 9);
    const char *want[9][2] = { { "failover", "unsafe-trust-redis" }, { "failover", "lua" },
                               { "failover", "lock" }, { "clock jump", "unsafe-redlock-no-fence" },
                               { "clock jump", "redlock" }, { "AOF lost", "unsafe-redlock-no-fence" },
                               { "AOF lost", "redlock" },
                               { "member failover", "unsafe-redlock-no-fence" },
                               { "member failover", "redlock" } };
    for (int k = 0; k < 9 && first >= 0; k++) {
        CHECK_STR(fl_failure_name(sc[first + k].failure), want[k][0]);
        CHECK_STR(sc[first + k].strategy, want[k][1]);
    }
    /* --strategies: only the failures of the strategies named. */
    snprintf(o.strategies[0], sizeof o.strategies[0], "unsafe-trust-redis");
    o.nstrategies = 1;
    n = fl_compare_scenes(&o, st, 6, sc, 64);
    CHECK(n == 1 && sc[0].failure == FL_FAIL_FAILOVER && sc[0].unsafe);
    /* --no-redis-failures: none, and unsafe-trust-redis has nothing to show. */
    o.redis_failures = 0;
    CHECK(fl_compare_scenes(&o, st, 6, sc, 64) == 0);
}

/* The fourth group, holds: lua, lock and db, in that order, after every
 * other scene, one segment, one instance, no fault; a hold short enough,
 * and a load long enough, that returned units are sold again (the hold
 * and holds.c's 2 s resale margin); never an unsafe strategy (the service
 * refuses hold_seconds for them); none with --no-holds. */
static void test_compare_scenes_holds(void) {
    static fl_compare_opts o;
    fl_strategy st[6];
    strategy(&st[0], "lua", 1);
    strategy(&st[1], "lock", 1);
    strategy(&st[2], "db", 1);
    strategy(&st[3], "etcd", 1);
    strategy(&st[4], "unsafe-read-write", 0);
    strategy(&st[5], "unsafe-lock-no-fence", 0);
    fl_compare_opts_default(&o);
    o.two_instances = 0;
    o.redis_failures = o.crowd = 0;
    CHECK(o.holds == 1);                                 /* on by default */
    fl_scene sc[64];
    int n = fl_compare_scenes(&o, st, 6, sc, 64);
    int first = -1, count = 0;
    for (int i = 0; i < n; i++) {
        if (sc[i].group != FL_GROUP_HOLDS) {
            CHECK(first < 0 && !sc[i].hold_seconds);     /* the group comes last */
            continue;
        }
        if (first < 0) first = i;
        count++;
        CHECK(!sc[i].fault && !sc[i].unsafe && sc[i].cs_delay_ms == 0);
        CHECK(sc[i].segments == 1 && sc[i].instances == 1);
        CHECK(sc[i].hold_seconds == o.hold_seconds && sc[i].hold_seconds > 0);
        CHECK(sc[i].stock == o.holds_stock && sc[i].duration_s == o.holds_duration_s);
        CHECK(sc[i].duration_s > sc[i].hold_seconds + 2);
        CHECK(sc[i].pay == 0.6 && sc[i].cancel == 0.1);
        CHECK_STR(sc[i].condition, "holds of 2 s: 60% pay, 10% cancel, 30% abandon");
    }
    CHECK(count == 3 && first == n - 3);
    if (first >= 0) {
        CHECK_STR(sc[first].strategy, "lua");
        CHECK_STR(sc[first + 1].strategy, "lock");
        CHECK_STR(sc[first + 2].strategy, "db");
    }
    /* A service that called lua unsafe would not get a holds scene for it. */
    st[0].safe = 0;
    n = fl_compare_scenes(&o, st, 6, sc, 64);
    count = 0;
    for (int i = 0; i < n; i++) {
        if (sc[i].group != FL_GROUP_HOLDS) continue;
        CHECK(strcmp(sc[i].strategy, "lua") != 0);
        count++;
    }
    CHECK(count == 2 && !strcmp(sc[n - 2].strategy, "lock") && !strcmp(sc[n - 1].strategy, "db"));
    st[0].safe = 1;
    /* --strategies: only the holds of the strategies named. */
    snprintf(o.strategies[0], sizeof o.strategies[0], "db");
    o.nstrategies = 1;
    n = fl_compare_scenes(&o, st, 6, sc, 64);
    CHECK(n == 3 && sc[2].group == FL_GROUP_HOLDS && !strcmp(sc[2].strategy, "db"));
    /* --no-holds: none. */
    o.holds = 0;
    n = fl_compare_scenes(&o, st, 6, sc, 64);
    CHECK(n == 2 && sc[0].group == FL_GROUP_CONTENTION && sc[1].group == FL_GROUP_CONTENTION);
}

/* A holds scene's figures, as the table and report.html say them: every
 * end counted, returned = cancelled + expired; nothing for other scenes. */
static void test_holds_brief(void) {
    static fl_scene_result r;
    char out[400];
    memset(&r, 0, sizeof r);
    r.ran = 1;
    fl_holds_brief(&r, out, sizeof out);
    CHECK_STR(out, "");                                  /* no holds */
    r.sc.hold_seconds = 2;
    r.created = 170;
    r.verdict.holds.confirmed = 100;
    r.verdict.holds.cancelled = 20;
    r.verdict.holds.expired = 50;
    r.verdict.holds.resold = 66;
    r.verdict.holds.resale_checked = 1;
    r.verdict.holds.lag_p50_ms = 40;
    r.verdict.holds.lag_p99_ms = 105;
    fl_holds_brief(&r, out, sizeof out);
    CHECK_STR(out, "170 holds placed: 100 confirmed, 20 cancelled, 50 expired, 0 still "
                   "reserved; 70 returned, 66 units resold (checked); expiry lag p50 40 ms, "
                   "p99 105 ms");
    r.ran = 0;
    fl_holds_brief(&r, out, sizeof out);
    CHECK_STR(out, "");                                  /* skipped: nothing to say */
}

static void test_probe_cells(void) {
    fl_probe p;
    char out[160];
    memset(&p, 0, sizeof p);
    snprintf(p.note, sizeof p.note, "n/a: no lock server");
    fl_probe_fmt(&p, FL_PROBE_RESTART, out, sizeof out);
    CHECK_STR(out, "n/a");
    snprintf(p.note, sizeof p.note, "skipped: etcd's lock server could not start");
    fl_probe_fmt(&p, FL_PROBE_KILL, out, sizeof out);
    CHECK_STR(out, "skipped");                /* never "passed" */
    p.ran = 1;
    p.pass = 1;
    p.recover_ms = 1470;
    fl_probe_fmt(&p, FL_PROBE_KILL, out, sizeof out);
    CHECK_STR(out, "1.47s, 0 oversold");
    p.refused = 9;
    p.refused_ms = 600;
    fl_probe_fmt(&p, FL_PROBE_RESTART, out, sizeof out);
    CHECK_STR(out, "refused 0.6s, 0 oversold");
    p.recover_ms = -1;
    p.waited_ms = 6020;
    fl_probe_fmt(&p, FL_PROBE_WIPE, out, sizeof out);
    CHECK_STR(out, "no 201 in 6s after, 0 oversold");
    p.recover_ms = 20;
    p.fenced = 24;
    fl_probe_fmt(&p, FL_PROBE_WIPE, out, sizeof out);
    CHECK_STR(out, "refused 0.6s (24 fenced), 0 oversold");
    p.still_refusing = 1;
    fl_probe_fmt(&p, FL_PROBE_WIPE, out, sizeof out);
    CHECK_STR(out, "refused > 1s (probe's end) (24 fenced), 0 oversold");
    fl_probe_fmt(&p, FL_PROBE_FENCE, out, sizeof out);
    CHECK_STR(out, "fenced 24, 0 oversold");
    p.oversold = 3;
    p.pass = 0;
    fl_probe_fmt(&p, FL_PROBE_FENCE, out, sizeof out);
    CHECK_STR(out, "NOT fenced, OVERSOLD 3");
    p.oversold = 0;
    p.pass = 1;
    p.fenced = 0;
    fl_probe_fmt(&p, FL_PROBE_FENCE, out, sizeof out);
    CHECK_STR(out, "lock kept, 0 oversold");     /* a pause the lock outlived (ZooKeeper) */
    /* Failover to a replica: lock's time to sell again; Redlock's fence. */
    p.recover_ms = 2410;
    fl_probe_fmt(&p, FL_PROBE_FAILOVER, out, sizeof out);
    CHECK_STR(out, "2.41s, 0 oversold");
    p.fenced = 1;
    fl_probe_fmt(&p, FL_PROBE_FAILOVER, out, sizeof out);
    CHECK_STR(out, "fenced 1, 0 oversold");
    p.oversold = 1;
    p.pass = 0;
    fl_probe_fmt(&p, FL_PROBE_FAILOVER, out, sizeof out);
    CHECK_STR(out, "NOT safe, OVERSOLD 1");
    p.ran = 0;
    snprintf(p.note, sizeof p.note, "n/a: no Redis replica to fail over to");
    fl_probe_fmt(&p, FL_PROBE_FAILOVER, out, sizeof out);
    CHECK_STR(out, "n/a");
}

static void test_retry_after(void) {
    static const char *const R[] = {
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: Fri, 31 Dec 1999 23:59:59 GMT\r\n"
        "Content-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    };
    const int want[] = { 2, -1, -1 };
    fl_resp r;
    fl_resp_init(&r, 64);
    for (int i = 0; i < 3; i++) {
        size_t used;
        fl_resp_reset(&r);
        CHECK(fl_resp_feed(&r, R[i], strlen(R[i]), &used) == FL_RESP_DONE);
        CHECK(r.retry_after_s == want[i]);
    }
    fl_resp_free(&r);
}

/* The crowd group: two lua scenes, the room off then on, after the
 * fairness group; none without lua, or with --groups leaving it out. */
static void test_compare_scenes_crowd(void) {
    static fl_compare_opts o;
    fl_strategy st[2];
    strategy(&st[0], "lua", 1);
    strategy(&st[1], "lock", 1);
    fl_compare_opts_default(&o);
    o.redis_failures = o.holds = o.forced = 0;
    CHECK(o.crowd == 1);                                 /* on by default */
    fl_scene sc[64];
    int n = fl_compare_scenes(&o, st, 2, sc, 64);
    CHECK(n >= 2 && sc[n - 2].group == FL_GROUP_CROWD && sc[n - 1].group == FL_GROUP_CROWD);
    CHECK(sc[n - 3].group == FL_GROUP_FAIRNESS);
    for (int i = n - 2; i < n; i++) {
        CHECK_STR(sc[i].strategy, "lua");
        CHECK(sc[i].crowd_room == i - (n - 2) && sc[i].instances == 2 && !sc[i].fault);
        CHECK(sc[i].crowd_buyers > 3 * sc[i].stock && sc[i].crowd_ramp_s > 0);
    }
    strategy(&st[0], "luaX", 1);
    n = fl_compare_scenes(&o, st, 2, sc, 64);
    for (int i = 0; i < n; i++) CHECK(sc[i].group != FL_GROUP_CROWD);
}

/* A crowd's figures from buyers made by hand: 6 buyers, stock 3; the
 * winners are ranks 0, 3 and 1 (in that order of their 201s), rank 3 a
 * bot, at places 1, 5 and 3, and rank 3 sent before ranks 1 and 2; rank 5
 * never heard (nor sent, nor had a place). */
static void test_crowd_figures(void) {
    fl_buyer_rec b[6] = {
        { 0, 0, FL_BUYER_GOT, 2, 1, 1, 0, 100000, 0 },
        { 1, 0, FL_BUYER_GOT, 3, 0, 3, 10000, 300000, 35000 },
        { 2, 1, FL_BUYER_SOLD_OUT, 9, 0, 2, 20000, 400000, 50000 },
        { 3, 1, FL_BUYER_GOT, 7, 0, 5, 30000, 200000, 31000 },
        { 4, 0, FL_BUYER_SOLD_OUT, 2, 1, 4, 40000, 900000, 40000 },
        { 5, 0, FL_BUYER_NONE, 1, 0, 0, 50000, -1, -1 },
    };
    fl_load_result r;
    memset(&r, 0, sizeof r);
    r.buyers = b;
    r.nbuyers = 6;
    fl_crowd_figures f;
    CHECK(fl_crowd_figures_get(&r, 3, &f) == 0);
    CHECK(f.buyers == 6 && f.bots == 2 && f.winners == 3 && f.bot_winners == 1);
    CHECK(f.first_share > 0.66 && f.first_share < 0.67);   /* ranks 0 and 1 of 0..2 */
    CHECK(f.first_place_share > 0.66 && f.first_place_share < 0.67);   /* places 1 and 3 */
    /* Sent in the order 0, 3, 1, 4, 2 (5 never): the first 3 to send all won. */
    CHECK(f.first_sent_share == 1.0);
    CHECK(f.send_lag_p50_us == 1000 && f.send_lag_p99_us == 30000);   /* 0 25 30 1 0 ms */
    CHECK(f.pairs == 3 && f.out_of_order == 1);            /* served 0, 3, 1: (3, 1) */
    CHECK(f.bot_units == 0.5 && f.polite_units == 0.5 && f.bot_ratio == 1.0);
    CHECK(f.no_final == 1);
    CHECK(f.requests == 24 && f.polls == 2);
    CHECK(f.first_unit_us == 100000 && f.last_unit_us == 300000);
    CHECK(f.final_after_last_unit_us == 600000);           /* rank 4 heard at 0.9 s */
    CHECK(f.units_per_s > 9.99 && f.units_per_s < 10.01);  /* 2 more units in 0.2 s */
    CHECK(f.requests == 24 && f.requests_median == 3);
}

/* With a room the service may hold an order for its turn, which keeps its
 * connection: a crowd's order may wait so only on a connection free for
 * waiting (half the thread's), else it asks to be answered now
 * (?wait_ms=0); without a room it asks nothing. */
static void test_crowd_orders_wait_on_free_connections_only(void) {
    fl_crowd_opts o = { .buyers = 3, .ramp_us = 0, .impatient = 0, .room = 1 };
    fl_crowd_part p;
    char buf[1024];
    CHECK(fl_crowd_part_init(&p, &o, 0, 1, 1, 2, 0) == 0);     /* 2 connections: 1 waits */
    fl_crowd_part_start(&p, 0);
    CHECK(p.poll_cap == 1);
    uint32_t a = fl_crowd_pop(&p), b = fl_crowd_pop(&p), c = fl_crowd_pop(&p);
    /* A first order asks to be answered at once: its place is not known. */
    fl_crowd_build(&p, a, "sku", "h:1", buf, sizeof buf, 1);
    CHECK(strncmp(buf, "POST /v1/orders?wait_ms=0 HTTP/1.1", 34) == 0 && p.polls == 0);
    fl_crowd_lost(&p, a, 2);
    /* With a ticket: on the connection free for waiting, then no more. */
    snprintf(p.b[b].ticket, sizeof p.b[b].ticket, "t1.2");
    snprintf(p.b[c].ticket, sizeof p.b[c].ticket, "t1.3");
    size_t n = fl_crowd_build(&p, b, "sku", "h:1", buf, sizeof buf, 1);
    CHECK(n > 0 && strncmp(buf, "POST /v1/orders HTTP/1.1", 24) == 0 && p.polls == 1);
    fl_crowd_build(&p, c, "sku", "h:1", buf, sizeof buf, 1);
    CHECK(strncmp(buf, "POST /v1/orders?wait_ms=0 HTTP/1.1", 34) == 0 && p.polls == 1);
    fl_crowd_lost(&p, b, 2);                                        /* its connection is free */
    CHECK(p.polls == 0);
    fl_crowd_lost(&p, c, 2);
    uint32_t d = fl_crowd_pop(&p);
    if (!p.b[d].ticket[0]) d = fl_crowd_pop(&p);
    fl_crowd_build(&p, d, "sku", "h:1", buf, sizeof buf, 2);
    CHECK(strncmp(buf, "POST /v1/orders HTTP/1.1", 24) == 0 && p.polls == 1);
    fl_crowd_part_free(&p);
    o.room = 0;
    CHECK(fl_crowd_part_init(&p, &o, 0, 1, 1, 2, 0) == 0);
    fl_crowd_part_start(&p, 0);
    fl_crowd_build(&p, fl_crowd_pop(&p), "sku", "h:1", buf, sizeof buf, 1);
    CHECK(strncmp(buf, "POST /v1/orders HTTP/1.1", 24) == 0 && p.polls == 0);
    fl_crowd_part_free(&p);
}

/* With connections kept for the waiting (--crowd-hold), the others carry
 * only requests answered at once, at most regular_cap out: past it, the
 * next buyer whose request would be answered at once waits for one of
 * them (next_at says none is due), while one that may wait goes on a
 * connection kept for it. */
static void test_crowd_hold_keeps_the_regular_connections(void) {
    fl_crowd_opts o = { .buyers = 3, .ramp_us = 0, .impatient = 0, .room = 1, .hold = 1 };
    fl_crowd_part p;
    char buf[1024];
    CHECK(fl_crowd_part_init(&p, &o, 0, 1, 1, 2, 1) == 0);     /* 1 for answers, 1 kept */
    fl_crowd_part_start(&p, 0);
    CHECK(p.poll_cap == 1 && p.regular_cap == 1);
    uint32_t a = fl_crowd_pop(&p);
    fl_crowd_build(&p, a, "sku", "h:1", buf, sizeof buf, 1);   /* a first order: at once */
    CHECK(p.regular == 1 && p.polls == 0);
    CHECK(fl_crowd_next_at(&p) == INT64_MAX);         /* the next (no ticket) must wait */
    /* Its ticket makes the next one a buyer that may wait: it may go. */
    p.b[p.heap[0].i].ticket[0] = 't';
    CHECK(fl_crowd_next_at(&p) == 0);
    uint32_t b = fl_crowd_pop(&p);
    fl_crowd_build(&p, b, "sku", "h:1", buf, sizeof buf, 1);
    CHECK(strncmp(buf, "POST /v1/orders HTTP/1.1", 24) == 0 && p.polls == 1 && p.regular == 1);
    CHECK(fl_crowd_next_at(&p) == INT64_MAX);         /* the third: no ticket, none free */
    fl_crowd_lost(&p, a, 2);                          /* a regular connection free again */
    CHECK(p.regular == 0 && fl_crowd_next_at(&p) <= 2);
    fl_crowd_lost(&p, b, 2);
    CHECK(p.polls == 0 && p.regular == 0);
    fl_crowd_part_free(&p);
}

/* A buyer's place is the one its answers say: a shed in its turn (503)
 * tells its ticket without the position, and the 201 of its order with
 * that ticket says the position it was sold in. */
static void test_crowd_place_from_the_201(void) {
    fl_crowd_opts o = { .buyers = 1, .ramp_us = 0, .impatient = 0, .room = 1 };
    fl_crowd_part p;
    char buf[1024];
    static char shed[] = "{\"error\":\"overloaded\",\"message\":\"m\",\"retry_after_ms\":60,"
                         "\"ticket\":\"t1.7.1.aa.bb\"}";
    static char sold[] = "{\"order_id\":\"o\",\"sku\":\"s\",\"user_id\":\"u0\",\"quantity\":1,"
                         "\"status\":\"confirmed\",\"created_at\":\"t\",\"position\":7}";
    CHECK(fl_crowd_part_init(&p, &o, 0, 1, 1, 2, 0) == 0);
    fl_crowd_part_start(&p, 0);
    uint32_t a = fl_crowd_pop(&p);
    fl_crowd_build(&p, a, "sku", "h:1", buf, sizeof buf, 1);
    fl_resp r = { .status = 503, .retry_after_s = 1, .body = shed, .body_len = strlen(shed) };
    fl_crowd_answer(&p, a, &r, 2);
    CHECK(strcmp(p.b[a].ticket, "t1.7.1.aa.bb") == 0 && p.b[a].position == 0);
    fl_crowd_build(&p, fl_crowd_pop(&p), "sku", "h:1", buf, sizeof buf, 3);
    r = (fl_resp){ .status = 201, .retry_after_s = -1, .body = sold, .body_len = strlen(sold) };
    fl_crowd_answer(&p, a, &r, 4);
    CHECK(p.b[a].outcome == FL_BUYER_GOT && p.b[a].position == 7);
    fl_crowd_part_free(&p);
}

TEST_MAIN(T(test_simple_response), T(test_every_slicing), T(test_chunked_any_slicing),
          T(test_pipelined_responses), T(test_pipelined_split_across_reads),
          T(test_framing_by_close_and_no_body), T(test_truncated_and_malformed),
          T(test_body_kept_up_to_max), T(test_json_str), T(test_hist_buckets),
          T(test_hist_percentiles), T(test_hist_merge), T(test_zipf_shape), T(test_rng_bounds),
          T(test_decide_shares), T(test_think_within_the_hold), T(test_timerq_pops_in_time_order),
          T(test_json_time_ms),
          T(test_target_parse), T(test_compare_scenes_in_two_groups),
          T(test_compare_scenes_redis_failures), T(test_compare_scenes_holds),
          T(test_compare_scenes_fairness),
          T(test_holds_brief), T(test_probe_cells), T(test_crowd_figures), T(test_compare_scenes_crowd),
          T(test_retry_after), T(test_crowd_orders_wait_on_free_connections_only),
          T(test_crowd_hold_keeps_the_regular_connections), T(test_crowd_place_from_the_201))
