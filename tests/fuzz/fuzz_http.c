/* fuzz_http.c: libFuzzer harness for flashload's incremental HTTP/1.1
 * response parser (loadtest/client/httpresp.c). The load generator
 * trusts it with whatever a server under test sends, in whatever slices
 * recv() hands over, and counts sold units from what it returns, so a
 * misparse is a wrong verdict, not only a crash.
 *
 * Input: five control bytes, then the byte stream a connection receives.
 *   [0]     bit 0: the request was HEAD (no_body); bits 1-2: body_max,
 *           one of 1024 (the engine's), 0, 7, 16 MiB (the client's)
 *   [1..4]  piece lengths, used in turn: a byte below 0x80 gives 1..16
 *           bytes, one above gives up to ~1 KiB
 * The stream is parsed twice, as one read and in those pieces, each time as
 * the engine does it: feed, on a whole response reset and go on with the
 * rest (pipelined responses), and at the end tell the parser the peer
 * closed. Both must give the same responses (status, flags, body, the
 * stream offset where each ends) and the same error; within each, every
 * answer must keep the API's promises (bytes used, body kept, framing). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/client/client.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

typedef struct rec {
    int status, minor, keep_alive, replayed, chunked, via_eof;
    long long content_length;
    size_t body_len, body_total;
    uint64_t body_hash;
    size_t end;                  /* stream offset just after the response */
} rec;

typedef struct outcome {
    rec *r;
    size_t n, cap;
    const char *error;           /* the error that ended the stream, or NULL */
    size_t error_at;             /* responses completed before it */
} outcome;

static uint64_t fnv(const char *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

/* One response is in: check what the API promises about it and record it.
 * s is the whole stream, start and end the response's bytes in it. */
static void done(outcome *o, const fl_resp *r, const char *s, size_t start, size_t end,
                 int via_eof) {
    CHECK(end > start);
    CHECK(r->status >= 200 && r->status <= 999);   /* 1xx heads are skipped */
    CHECK(r->body_total <= end - start);
    CHECK(r->body_len <= r->body_max && r->body_len <= r->body_total);
    CHECK(r->body_len == (r->body_total < r->body_max ? r->body_total : r->body_max));
    if (r->body_len) CHECK(r->body && r->body[r->body_len] == '\0');
    int bodiless = r->no_body || r->status == 204 || r->status == 304;
    if (bodiless) CHECK(r->body_total == 0);
    /* A body not chunked is the last bytes of the response, verbatim. */
    if (!bodiless && !r->chunked) {
        if (r->content_length >= 0) CHECK(r->body_total == (size_t)r->content_length);
        else CHECK(via_eof && !r->keep_alive);
        CHECK(r->body_len == 0 || memcmp(r->body, s + end - r->body_total, r->body_len) == 0);
    }
    if (via_eof) CHECK(!bodiless && !r->chunked && r->content_length < 0);
    if (r->body_len) {           /* what the engine and client do with bodies */
        char out[64];
        int k = fl_json_str(r->body, r->body_len, "order_id", out, sizeof out);
        CHECK(k < (int)sizeof out);
        /* Raw bytes, NULs included: only the closing quote ends the value. */
        if (k >= 0) CHECK(out[k] == '\0' && !memchr(out, '"', (size_t)k));
    }
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 8;
        o->r = realloc(o->r, o->cap * sizeof *o->r);
        CHECK(o->r);
    }
    rec *x = &o->r[o->n++];
    memset(x, 0, sizeof *x);
    x->status = r->status;
    x->minor = r->minor;
    x->keep_alive = r->keep_alive;
    x->replayed = r->replayed;
    x->chunked = r->chunked;
    x->via_eof = via_eof;
    x->content_length = r->content_length;
    x->body_len = r->body_len;
    x->body_total = r->body_total;
    x->body_hash = r->body_len ? fnv(r->body, r->body_len) : 0;
    x->end = end;
}

static size_t piece_len(const uint8_t *ctl, size_t i) {
    uint8_t b = ctl[i % 4];
    return b < 0x80 ? (size_t)(b & 0x0f) + 1 : (size_t)(b & 0x7f) * 8 + 1;
}

/* Parses s[0..n) in pieces (ctl NULL: as one read) into o. */
static void parse(const char *s, size_t n, const uint8_t *ctl, int no_body, size_t body_max,
                  outcome *o) {
    fl_resp r;
    fl_resp_init(&r, body_max);
    r.no_body = no_body;
    size_t off = 0, start = 0, piece = 0;
    while (off < n && !o->error) {
        size_t len = ctl ? piece_len(ctl, piece++) : n;
        if (len > n - off) len = n - off;
        size_t pend = off + len;
        while (off < pend) {     /* one read: may hold several responses */
            size_t used = (size_t)-1;
            int rc = fl_resp_feed(&r, s + off, pend - off, &used);
            if (rc == FL_RESP_ERROR) {
                CHECK(r.error != NULL);
                o->error = r.error;
                o->error_at = o->n;
                break;
            }
            CHECK(used <= pend - off);
            CHECK(fl_resp_started(&r) || rc == FL_RESP_MORE);
            if (rc == FL_RESP_MORE) {
                CHECK(rc == FL_RESP_MORE && used == pend - off);
                off = pend;
                break;
            }
            CHECK(rc == FL_RESP_DONE && used > 0);
            off += used;
            /* Done stays done until reset, and takes nothing more. */
            size_t again = (size_t)-1;
            CHECK(fl_resp_feed(&r, s + off, pend - off, &again) == FL_RESP_DONE && again == 0);
            done(o, &r, s, start, off, 0);
            start = off;
            fl_resp_reset(&r);
            CHECK(!fl_resp_started(&r));
        }
    }
    if (!o->error) {             /* the peer closes */
        int started = fl_resp_started(&r);
        int rc = fl_resp_eof(&r);
        if (rc == FL_RESP_DONE) {
            CHECK(started);
            done(o, &r, s, start, n, 1);
        } else {
            CHECK(rc == FL_RESP_ERROR && r.error != NULL);
            o->error = r.error;
            o->error_at = o->n;
        }
    }
    fl_resp_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const size_t body_maxes[4] = {1024, 0, 7, 16u << 20};
    if (size < 5) return 0;
    int no_body = data[0] & 1;
    size_t body_max = body_maxes[(data[0] >> 1) & 3];
    const char *s = (const char *)data + 5;
    size_t n = size - 5;

    outcome whole = {0}, pieces = {0};
    parse(s, n, NULL, no_body, body_max, &whole);
    parse(s, n, data + 1, no_body, body_max, &pieces);

    /* The slicing of the stream must not change what is read. */
    CHECK(whole.n == pieces.n);
    CHECK(whole.n == 0 || memcmp(whole.r, pieces.r, whole.n * sizeof *whole.r) == 0);
    CHECK((whole.error == NULL) == (pieces.error == NULL));
    if (whole.error) CHECK(strcmp(whole.error, pieces.error) == 0 && whole.error_at == pieces.error_at);
    free(whole.r);
    free(pieces.r);
    return 0;
}
