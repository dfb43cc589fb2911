/* httpresp.c: the incremental HTTP/1.1 response parser of flashload.
 *
 * A load generator reads responses in whatever slices the kernel hands
 * over: half a status line, three responses at once, a chunked body split
 * inside its size line. The parser therefore keeps its own state between
 * calls and never assumes a boundary; a line is copied only when it
 * straddles two reads. Body framing follows RFC 9112: no body for 1xx, 204
 * and 304; else chunked, else Content-Length, else until the peer closes.
 * Only the headers flashload needs are interpreted. */
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/utctime.h"
#include "loadtest/client/client.h"

#define HEAD_MAX (64 * 1024)     /* status line and headers, in total */

enum {
    ST_STATUS, ST_HEADERS, ST_BODY_LEN, ST_CHUNK_SIZE, ST_CHUNK_DATA, ST_CHUNK_CRLF,
    ST_TRAILERS, ST_BODY_EOF, ST_DONE
};

void fl_resp_init(fl_resp *r, size_t body_max) {
    memset(r, 0, offsetof(fl_resp, line));
    r->body_max = body_max;
    fl_resp_reset(r);
}

void fl_resp_reset(fl_resp *r) {
    r->status = 0;
    r->minor = 1;
    r->keep_alive = 1;
    r->replayed = 0;
    r->retry_after_s = -1;
    r->chunked = 0;
    r->content_length = -1;
    r->body_len = 0;
    r->body_total = 0;
    if (r->body) r->body[0] = '\0';
    r->error = NULL;
    r->state = ST_STATUS;
    r->left = 0;
    r->line_len = 0;
    r->head_bytes = 0;
}

void fl_resp_free(fl_resp *r) {
    free(r->body);
    r->body = NULL;
    r->body_cap = 0;
}

int fl_resp_started(const fl_resp *r) {
    return r->state != ST_STATUS || r->line_len > 0 || r->head_bytes > 0;
}

static int fl_resp_fail(fl_resp *r, const char *why) {
    r->error = why;
    return FL_RESP_ERROR;
}

/* Keeps body bytes up to body_max; the rest is only counted. */
static int keep_body(fl_resp *r, const char *p, size_t n) {
    r->body_total += n;
    size_t room = r->body_max > r->body_len ? r->body_max - r->body_len : 0;
    if (n > room) n = room;
    if (n == 0) return 0;
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 512;
        while (cap < r->body_len + n + 1) cap *= 2;
        if (cap > r->body_max + 1) cap = r->body_max + 1;
        char *b = realloc(r->body, cap);
        if (!b) return fl_resp_fail(r, "out of memory");
        r->body = b;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}

/* Header value without surrounding blanks. */
static void trim(const char **v, size_t *n) {
    while (*n && (**v == ' ' || **v == '\t')) (*v)++, (*n)--;
    while (*n && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t')) (*n)--;
}

/* Whether the comma-separated list v contains token (case-insensitive). */
static int has_token(const char *v, size_t n, const char *token) {
    size_t tl = strlen(token);
    while (n) {
        const char *comma = memchr(v, ',', n);
        size_t len = comma ? (size_t)(comma - v) : n;
        const char *t = v;
        size_t tn = len;
        trim(&t, &tn);
        if (tn == tl && strncasecmp(t, token, tl) == 0) return 1;
        if (!comma) break;
        n -= len + 1;
        v = comma + 1;
    }
    return 0;
}

static int parse_status(fl_resp *r, const char *l, size_t n) {
    /* "HTTP/1.1 201 Created" */
    if (n < 12 || memcmp(l, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)l[7]) || l[8] != ' ')
        return fl_resp_fail(r, "bad status line");
    if (!isdigit((unsigned char)l[9]) || !isdigit((unsigned char)l[10]) ||
        !isdigit((unsigned char)l[11]) || (n > 12 && l[12] != ' '))
        return fl_resp_fail(r, "bad status code");
    r->minor = l[7] - '0';
    r->status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
    if (r->status < 100) return fl_resp_fail(r, "bad status code");
    r->keep_alive = r->minor >= 1;
    r->state = ST_HEADERS;
    return 0;
}

static int parse_header(fl_resp *r, const char *l, size_t n) {
    const char *colon = memchr(l, ':', n);
    if (!colon || colon == l) return fl_resp_fail(r, "bad header line");
    size_t nl = (size_t)(colon - l);
    const char *v = colon + 1;
    size_t vn = n - nl - 1;
    trim(&v, &vn);
    if (nl == 14 && strncasecmp(l, "Content-Length", 14) == 0) {
        long long cl = 0;
        if (vn == 0 || vn > 15) return fl_resp_fail(r, "bad Content-Length");
        for (size_t i = 0; i < vn; i++) {
            if (!isdigit((unsigned char)v[i])) return fl_resp_fail(r, "bad Content-Length");
            cl = cl * 10 + (v[i] - '0');
        }
        if (r->content_length >= 0 && r->content_length != cl)
            return fl_resp_fail(r, "conflicting Content-Length");
        r->content_length = cl;
    } else if (nl == 17 && strncasecmp(l, "Transfer-Encoding", 17) == 0) {
        if (has_token(v, vn, "chunked")) r->chunked = 1;
    } else if (nl == 10 && strncasecmp(l, "Connection", 10) == 0) {
        if (has_token(v, vn, "close")) r->keep_alive = 0;
        else if (has_token(v, vn, "keep-alive")) r->keep_alive = 1;
    } else if (nl == 19 && strncasecmp(l, "Idempotent-Replayed", 19) == 0) {
        r->replayed = vn == 4 && strncasecmp(v, "true", 4) == 0;
    } else if (nl == 11 && strncasecmp(l, "Retry-After", 11) == 0) {
        long long s = 0;                  /* delay-seconds only (not an HTTP date) */
        size_t i = 0;
        for (; i < vn && i < 9 && v[i] >= '0' && v[i] <= '9'; i++) s = s * 10 + (v[i] - '0');
        r->retry_after_s = i > 0 && i == vn ? (int)s : -1;
    }
    return 0;
}

/* The empty line after the headers: decides how the body is framed. */
static int end_of_headers(fl_resp *r) {
    if (r->status < 200) {        /* 100 Continue and friends: another head follows */
        int minor = r->minor;
        fl_resp_reset(r);
        r->minor = minor;
        return 0;
    }
    if (r->no_body || r->status == 204 || r->status == 304) {
        r->state = ST_DONE;
    } else if (r->chunked) {
        r->state = ST_CHUNK_SIZE;
    } else if (r->content_length >= 0) {
        r->left = r->content_length;
        r->state = r->left ? ST_BODY_LEN : ST_DONE;
    } else {
        r->keep_alive = 0;       /* the body ends when the connection does */
        r->state = ST_BODY_EOF;
    }
    return 0;
}

static int parse_chunk_size(fl_resp *r, const char *l, size_t n) {
    long long size = 0;
    size_t i = 0;
    for (; i < n && isxdigit((unsigned char)l[i]); i++) {
        if (size > (1LL << 40)) return fl_resp_fail(r, "chunk too large");
        int c = tolower((unsigned char)l[i]);
        size = size * 16 + (isdigit(c) ? c - '0' : c - 'a' + 10);
    }
    if (i == 0) return fl_resp_fail(r, "bad chunk size");
    while (i < n && (l[i] == ' ' || l[i] == '\t')) i++;
    if (i < n && l[i] != ';') return fl_resp_fail(r, "bad chunk size");
    r->left = size;
    r->state = size ? ST_CHUNK_DATA : ST_TRAILERS;
    return 0;
}

/* One complete line (without its CR LF) in the current state. */
static int fl_resp_on_line(fl_resp *r, const char *l, size_t n) {
    switch (r->state) {
    case ST_STATUS:
        return parse_status(r, l, n);
    case ST_HEADERS:
        return n == 0 ? end_of_headers(r) : parse_header(r, l, n);
    case ST_CHUNK_SIZE:
        return parse_chunk_size(r, l, n);
    case ST_CHUNK_CRLF:
        if (n != 0) return fl_resp_fail(r, "chunk not followed by CRLF");
        r->state = ST_CHUNK_SIZE;
        return 0;
    case ST_TRAILERS:
        if (n == 0) r->state = ST_DONE;
        return 0;
    default:
        assert(!"fl_resp_on_line in a body state");
        return fl_resp_fail(r, "internal error");
    }
}

static int line_state(int st) {
    return st == ST_STATUS || st == ST_HEADERS || st == ST_CHUNK_SIZE || st == ST_CHUNK_CRLF ||
           st == ST_TRAILERS;
}

/* Consumes one line-oriented piece of p[0..n): returns bytes used. */
static long feed_line(fl_resp *r, const char *p, size_t n) {
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) + 1 : n;
    if (r->state == ST_STATUS || r->state == ST_HEADERS || r->state == ST_TRAILERS) {
        r->head_bytes += take;
        if (r->head_bytes > HEAD_MAX) return fl_resp_fail(r, "response head too large");
    }
    if (!nl) {                    /* a partial line: keep it for the next read */
        if (r->line_len + n > sizeof r->line) return fl_resp_fail(r, "line too long");
        memcpy(r->line + r->line_len, p, n);
        r->line_len += n;
        return (long)n;
    }
    const char *l = p;
    size_t ln = take - 1;
    /* The limit holds for every line, not only for one split across reads:
     * else a long header is accepted or refused depending on where recv()
     * happened to cut the stream (caught by the whole-vs-pieces check of
     * tests/fuzz/fuzz_http.c). */
    if (r->line_len + ln > sizeof r->line) return fl_resp_fail(r, "line too long");
    if (r->line_len) {            /* finish the line begun in an earlier read */
        memcpy(r->line + r->line_len, p, ln);
        l = r->line;
        ln += r->line_len;
        r->line_len = 0;
    }
    if (ln && l[ln - 1] == '\r') ln--;
    if (fl_resp_on_line(r, l, ln) != 0) return FL_RESP_ERROR;
    return (long)take;
}

int fl_resp_feed(fl_resp *r, const char *buf, size_t len, size_t *used) {
    size_t off = 0;
    *used = 0;
    if (r->state == ST_DONE) return FL_RESP_DONE;
    while (off < len) {
        long n;
        if (line_state(r->state)) {
            n = feed_line(r, buf + off, len - off);
            if (n < 0) return FL_RESP_ERROR;
        } else if (r->state == ST_BODY_EOF) {
            n = (long)(len - off);
            if (keep_body(r, buf + off, (size_t)n)) return FL_RESP_ERROR;
        } else {                  /* ST_BODY_LEN or ST_CHUNK_DATA */
            size_t k = len - off;
            if ((long long)k > r->left) k = (size_t)r->left;
            if (keep_body(r, buf + off, k)) return FL_RESP_ERROR;
            r->left -= (long long)k;
            n = (long)k;
            if (r->left == 0)
                r->state = r->state == ST_BODY_LEN ? ST_DONE : ST_CHUNK_CRLF;
        }
        off += (size_t)n;
        if (r->state == ST_DONE) break;
    }
    *used = off;
    return r->state == ST_DONE ? FL_RESP_DONE : FL_RESP_MORE;
}

int fl_resp_eof(fl_resp *r) {
    if (r->state == ST_BODY_EOF) {
        r->state = ST_DONE;
        return FL_RESP_DONE;
    }
    if (r->state == ST_DONE) return FL_RESP_DONE;
    return fl_resp_fail(r, fl_resp_started(r) ? "connection closed mid-response"
                                      : "connection closed before the response");
}

int fl_json_str(const char *json, size_t len, const char *key, char *out, size_t outlen) {
    size_t kl = strlen(key);
    const char *end = json + len;
    for (const char *p = json; p + kl + 2 <= end; p++) {
        p = memchr(p, '"', (size_t)(end - p));
        if (!p || p + kl + 2 > end) return -1;
        if (memcmp(p + 1, key, kl) != 0 || p[kl + 1] != '"') continue;
        const char *q = p + kl + 2;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
        if (q >= end || *q != ':') continue;
        q++;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
        if (q >= end || *q != '"') return -1;     /* not a string value */
        q++;
        const char *close = memchr(q, '"', (size_t)(end - q));
        if (!close) return -1;
        size_t n = (size_t)(close - q);
        if (n + 1 > outlen) return -1;
        memcpy(out, q, n);
        out[n] = '\0';
        return (int)n;
    }
    return -1;
}

long long fl_json_time_ms(const char *json, size_t len, const char *key) {
    char t[40];
    int64_t ms;
    int n = fl_json_str(json, len, key, t, sizeof t);
    if (n < 0 || utc_time_parse(t, (size_t)n, &ms) != 0) return -1;
    return ms;
}
