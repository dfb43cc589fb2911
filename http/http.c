/* http.c: libmicrohttpd server, framing checks, bodies, JSON answers. See
 * http.h.
 *
 * libmicrohttpd reports a request's line first (the URI log callback: we
 * keep the target exactly as sent, for routing), then calls the access
 * handler several times: once when the headers are in (we only check the
 * framing and set up then: a response queued in that first call makes
 * libmicrohttpd close the connection, which is what a framing error
 * wants), once per piece of body, and once more when the body is
 * complete; that last call routes and answers. A deferred request is
 * suspended and resumed by http_reply from another thread; the handler is
 * then called again and queues the prepared response.
 *
 * Nothing a client sends can make an answer impossible: messages are
 * cleaned to valid UTF-8 before jansson sees them, and when an answer
 * still cannot be built the fixed FALLBACK body is sent instead. Only a
 * failure to allocate even that closes the connection without an answer. */
#include "http/http.h"

#include <arpa/inet.h>
#include <assert.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "http/internal.h"

#define JSON_TYPE "application/json; charset=utf-8"

/* The answer when the real one cannot be built. It may replace the answer
 * to a request that took effect (an order committed, then no memory for its
 * 201), so it must not say that nothing changed. */
static const char FALLBACK[] =
    "{\"error\":\"internal_error\",\"message\":\"The answer could not be built, so "
    "whether the request took effect is not known: look it up, or retry it with the same "
    "Idempotency-Key.\"}\n";

/* ------------------------------------------------------------ request data */

const char *http_method(const http_req *r) { return r->method; }
const char *http_path(const http_req *r) { return r->path; }

/* Counts the values of name of the given kind. */
typedef struct count_ctx {
    const char *name;
    int n;
} count_ctx;

static enum MHD_Result count_value(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    count_ctx *c = cls;
    (void)kind;
    (void)value;
    if (key && !strcasecmp(key, c->name)) c->n++;
    return MHD_YES;
}

static int count_values(struct MHD_Connection *conn, enum MHD_ValueKind kind, const char *name) {
    count_ctx c = { name, 0 };
    MHD_get_connection_values(conn, kind, count_value, &c);
    return c.n;
}

/* Looks up name once, refusing repeats and embedded NUL bytes. */
static int lookup(const http_req *r, enum MHD_ValueKind kind, const char *name,
                  const char **value) {
    const char *v = NULL;
    size_t len = 0;
    *value = NULL;
    if (MHD_lookup_connection_value_n(r->conn, kind, name, strlen(name), &v, &len) != MHD_YES)
        return 0;
    if (!v || strlen(v) != len || count_values(r->conn, kind, name) != 1) return -1;
    *value = v;
    return 1;
}

int http_header(const http_req *r, const char *name, const char **value) {
    return lookup(r, MHD_HEADER_KIND, name, value);
}

int http_query(const http_req *r, const char *name, const char **value) {
    int rc = lookup(r, MHD_GET_ARGUMENT_KIND, name, value);
    if (rc == 1 && !utf8_valid(*value, strlen(*value))) {
        *value = NULL;
        return -1;
    }
    return rc;
}

typedef struct known_ctx {
    const char *const *known;
    const char *unknown;
} known_ctx;

static enum MHD_Result check_known(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    known_ctx *c = cls;
    (void)kind;
    (void)value;
    for (size_t i = 0; key && c->known[i]; i++)
        if (!strcmp(key, c->known[i])) return MHD_YES;
    c->unknown = key ? key : "";
    return MHD_NO;
}

int http_query_only(const http_req *r, const char *const *known, const char **unknown) {
    known_ctx c = { known, NULL };
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, check_known, &c);
    *unknown = c.unknown;
    return c.unknown ? -1 : 0;
}

const char *http_body(const http_req *r, size_t *len) {
    *len = r->len;
    return r->body ? r->body : "";
}

json_t *http_body_json(http_req *r) {
    json_error_t jerr;
    json_t *j = json_loadb(r->body ? r->body : "", r->len, JSON_REJECT_DUPLICATES, &jerr);
    if (!j) {
        http_reply_error(r, 400, "invalid_json", "The body is not valid JSON: %s (line %d, column %d).",
                         jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        http_reply_error(r, 400, "invalid_json", "The body must be a JSON object.");
        return NULL;
    }
    return j;
}

/* ---------------------------------------------------------------- answering */

/* A deferred request's hand-over (r->dstate). The connection is suspended
 * only when the handler returns without an answer: most sold-out answers
 * and cached reads come back before that, on the handler's own thread, and
 * a suspension costs libmicrohttpd two epoll_ctl calls and another pass.
 * The answer and the handler's return race through one compare-and-swap:
 *   DS_HANDED    -> DS_ANSWERED    the answer came first: the handler
 *                                  queues it as it returns;
 *   DS_HANDED    -> DS_SUSPENDED   the handler returned first, having
 *                                  suspended: the answer resumes. */
enum { DS_HANDED = 1, DS_ANSWERED, DS_SUSPENDED };

/* A resumed connection is processed only when libmicrohttpd runs (its
 * wake-up does not reach our epoll in external mode): at the end of this
 * iteration on the daemon's own loop, else through a task on that loop. */
static void kick(http_daemon *hd) {
    if (loop_current() == hd->l) {
        hd->kicked = 1;
        loop_again(hd->l);                     /* in case its phase has run already */
    } else if (!atomic_exchange(&hd->kick_posted, 1)) {
        loop_post(hd->l, &hd->kick_task);
    }
}

static void on_kick(loop *l, void *ud) {
    http_daemon *hd = ud;
    (void)l;
    atomic_store(&hd->kick_posted, 0);
    MHD_run(hd->d);
}

/* Queues the prepared response: on the handler's thread directly, else by
 * resuming the suspended connection so its thread queues it. */
static void deliver(http_req *r) {
    http_server *s = r->srv;
    if (s->opt.observer) {
        http_answer ans = { r->route_id, (int)r->status, r->error, r->tag,
                            clock_mono_us() - r->t0_us };
        s->opt.observer(&ans, s->opt.ud);
    }
    if (r->deferred) {
        /* Answered before its handler returned (on its own thread, or by a
         * quick worker): the handler queues it, no suspension needed. */
        int st = DS_HANDED;
        if (atomic_compare_exchange_strong(&r->dstate, &st, DS_ANSWERED)) return;
        assert(st == DS_SUSPENDED);
        /* Once resumed, the connection's loop may answer and free r at any
         * moment: nothing of r is read after this. */
        http_daemon *hd = r->hd;
        MHD_resume_connection(r->conn);
        kick(hd);
    }
}

/* Prepares the fixed 500 answer; without memory even for that, the
 * connection is closed unanswered (r->fatal). */
static void prepare_fallback(http_req *r) {
    r->status = 500;
    r->error = "internal_error";
    r->resp = MHD_create_response_from_buffer(sizeof FALLBACK - 1, (void *)FALLBACK,
                                              MHD_RESPMEM_PERSISTENT);
    if (!r->resp) {
        r->fatal = 1;
        return;
    }
    if (MHD_add_response_header(r->resp, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE) != MHD_YES) {
        MHD_destroy_response(r->resp);
        r->resp = NULL;
        r->fatal = 1;
    }
}

static void reply_fallback(http_req *r) {
    prepare_fallback(r);
    deliver(r);
}

/* Prepares the response of r from an MHD response made of the body. */
/* Adds the headers to r's response and delivers it; the fallback when
 * that cannot be done. */
static void finish_reply(http_req *r, int status, const char *content_type,
                         const char *const *extra_headers) {
    r->status = (unsigned)status;
    int ok = r->resp != NULL &&
             MHD_add_response_header(r->resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type) == MHD_YES;
    for (size_t i = 0; ok && extra_headers && extra_headers[i]; i += 2)
        ok = MHD_add_response_header(r->resp, extra_headers[i], extra_headers[i + 1]) == MHD_YES;
    if (!ok) {
        if (r->resp) MHD_destroy_response(r->resp);
        r->resp = NULL;
        prepare_fallback(r);
    }
    deliver(r);
}

void http_reply(http_req *r, int status, const char *content_type, const char *body,
                size_t len, const char *const *extra_headers) {
    assert(r->resp == NULL && !r->fatal);
    r->resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    finish_reply(r, status, content_type, extra_headers);
}

void http_reply_error_json(http_req *r, int status, const char *code, const char *body,
                           size_t len, const char *const *extra_headers) {
    r->error = code;
    http_reply(r, status, JSON_TYPE, body, len, extra_headers);
}

void http_reply_take(http_req *r, int status, const char *content_type, char *body,
                     size_t len, const char *const *extra_headers) {
    assert(r->resp == NULL && !r->fatal);
    r->resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r->resp) free(body);
    finish_reply(r, status, content_type, extra_headers);
}

void http_reply_json(http_req *r, int status, json_t *body, const char *const *extra_headers) {
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    size_t len = text ? strlen(text) : 0;
    char *nl = text ? realloc(text, len + 2) : NULL;
    if (!nl) {
        free(text);
        reply_fallback(r);
        return;
    }
    nl[len] = '\n';          /* so curl's output does not run into the prompt */
    nl[len + 1] = '\0';
    http_reply_take(r, status, JSON_TYPE, nl, len + 1, extra_headers);
}

static void reply_error_v(http_req *r, int status, const char *code, json_t *extra,
                          const char *const *extra_headers, const char *fmt, va_list ap) {
    char raw[512], msg[512];
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
    utf8_clean(msg, sizeof msg, raw, len);
    json_t *j = json_pack("{s:s, s:s}", "error", code, "message", msg);
    if (j && extra) json_object_update_missing(j, extra);
    json_decref(extra);
    r->error = code;             /* the callers' codes are string literals */
    http_reply_json(r, status, j, extra_headers);
}

void http_reply_error(http_req *r, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(r, status, code, NULL, NULL, fmt, ap);
    va_end(ap);
}

void http_reply_error_with(http_req *r, int status, const char *code, json_t *extra,
                           const char *const *extra_headers, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(r, status, code, extra, extra_headers, fmt, ap);
    va_end(ap);
}

void http_tag(http_req *r, int tag) { r->tag = tag; }

void http_defer(http_req *r) {
    if (r->deferred) return;                   /* handed on again */
    assert(!r->resp);
    r->deferred = 1;
    atomic_store(&r->dstate, DS_HANDED);
}

/* ------------------------------------------------------------------ routing */

static void route(http_req *r) {
    const http_options *o = &r->srv->opt;
    char params[HTTP_MAX_PARAMS][HTTP_PARAM_MAX + 1];
    const char *pv[HTTP_MAX_PARAMS + 1] = { params[0], params[1], NULL };
    char allow[64], method[40], path[300];
    size_t i;
    switch (http_route_find(o->routes, o->nroutes, r->method, r->path, &i, params, allow,
                            sizeof allow)) {
    case HTTP_MATCH_OK:
        r->route_id = o->routes[i].id;
        o->routes[i].handler(r, pv, o->ud);
        return;
    case HTTP_MATCH_METHOD: {
        const char *h[] = { "Allow", allow, NULL };
        http_reply_error_with(r, 405, "method_not_allowed", NULL, h,
                              "%s is not allowed on %s; allowed: %s.",
                              utf8_clip(method, sizeof method, r->method),
                              utf8_clip(path, sizeof path, r->path), allow);
        return;
    }
    case HTTP_MATCH_BAD_PATH:
        http_reply_error(r, 400, "bad_request",
                         "The path %s is malformed (a bad %%-escape, an escaped NUL byte, or "
                         "not an absolute path).", utf8_clip(path, sizeof path, r->path));
        return;
    case HTTP_MATCH_NONE:
        break;
    }
    http_reply_error(r, 404, "not_found", "No route for %s %s.",
                     utf8_clip(method, sizeof method, r->method),
                     utf8_clip(path, sizeof path, r->path));
}

/* A body is JSON when no Content-Type says otherwise. */
static int json_content_type(const char *ct) {
    if (!ct) return 1;
    while (*ct == ' ') ct++;
    size_t n = strcspn(ct, "; ");
    return n == 16 && strncasecmp(ct, "application/json", 16) == 0;
}

/* ---------------------------------------------------------- access handler */

static enum MHD_Result queue(http_req *r) {
    if (r->fatal || !r->resp) return MHD_NO;        /* nothing to send: close */
    r->answered = 1;
    enum MHD_Result rc = MHD_queue_response(r->conn, r->status, r->resp);
    MHD_destroy_response(r->resp);
    r->resp = NULL;
    return rc;
}

/* The handler of a deferred request returned: queue its answer if it came
 * already, else suspend the connection until it comes. */
static enum MHD_Result defer_return(http_req *r) {
    if (atomic_load(&r->dstate) == DS_ANSWERED) return queue(r);
    MHD_suspend_connection(r->conn);
    int st = DS_HANDED;
    if (atomic_compare_exchange_strong(&r->dstate, &st, DS_SUSPENDED)) return MHD_YES;
    /* Answered between the look and the suspension: resume at once, and
     * libmicrohttpd's next pass calls the handler, which queues it. */
    assert(st == DS_ANSWERED);
    MHD_resume_connection(r->conn);
    kick(r->hd);
    return MHD_YES;
}

/* Answers a framing error at once and closes the connection after it: the
 * rest of the stream cannot be trusted to start where we think it does. */
static enum MHD_Result refuse_framing(http_req *r, const char *why) {
    const char *close_hdr[] = { "Connection", "close", NULL };
    http_reply_error_with(r, 400, "bad_request", NULL, close_hdr, "%s", why);
    return queue(r);
}

/* Whether the request declares a body: a Content-Length other than 0. */
static int has_length(struct MHD_Connection *conn) {
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    return cl && strtoull(cl, NULL, 10) > 0;
}

/* RFC 9110 5.6.2: a header name is a token. */
static int is_token(const char *s) {
    static const char EXTRA[] = "!#$%&'*+-.^_`|~";
    if (!*s) return 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c && strchr(EXTRA, c))))
            return 0;
    }
    return 1;
}

/* Whether libmicrohttpd (0.9.75) joined a folded line (obs-fold, RFC 9112
 * 5.2) onto this header. It parses "Name: value" in place in its read
 * buffer, so a name is followed by its NUL, then the blanks it skipped,
 * then the value; a continuation line is appended to the *name*, which it
 * moves elsewhere to make room ("Content-Length:\r\n 2" arrives as a
 * header "Content-Length2" with an empty value, and the body's length is
 * lost). A name not right before its value has been moved: folded. */
static int folded(const char *key, const char *value) {
    if (!value) return 1;
    const char *end = key + strlen(key) + 1;
    if (value < end || value - end > 256) return 1;
    for (const char *p = end; p < value; p++)
        if (*p != ' ' && *p != '\t') return 1;
    return 0;
}

typedef struct header_scan {
    int bad_name;            /* a name that is not a token, or a folded line */
    int hosts;               /* Host headers */
} header_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    header_scan *h = cls;
    (void)kind;
    if (!key || !is_token(key) || folded(key, value)) h->bad_name = 1;
    else if (!strcasecmp(key, "Host")) h->hosts++;
    return MHD_YES;
}

/* Checks the request head (RFC 9112 sections 3.2, 5 and 6). Returns NULL
 * when the request can be read, else why not.
 *
 * A header name that is not a token is refused, not guessed at: with
 * whitespace before the colon ("Content-Length : 5") libmicrohttpd keeps
 * the name with the space, and an obsolete line folding is joined onto the
 * header, so in both cases the body's length would be read one way here
 * and another way by a proxy in front (request smuggling). */
static const char *framing_problem(struct MHD_Connection *conn, const char *method,
                                   const char *version) {
    header_scan h = { 0, 0 };
    MHD_get_connection_values(conn, MHD_HEADER_KIND, scan_header, &h);
    if (h.bad_name)
        return "A header name is malformed (whitespace before the colon, a folded line, or "
               "a character a header name cannot hold).";
    int http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
    if (h.hosts > 1) return "The request has more than one Host header.";
    if (http11 && h.hosts == 0) return "An HTTP/1.1 request must have a Host header.";
    int ncl = count_values(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int nte = count_values(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (ncl > 1) return "The request has more than one Content-Length header.";
    if (ncl && nte) return "The request has both Content-Length and Transfer-Encoding.";
    if (nte > 1) return "The request has more than one Transfer-Encoding header.";
    /* HTTP/1.0 has no transfer codings: a 1.0 hop in front of us would read
     * the chunks as the next request, so the framing is faulty (RFC 9112
     * 6.1), whatever the coding says. */
    if (nte && version && !strcmp(version, MHD_HTTP_VERSION_1_0))
        return "An HTTP/1.0 request cannot carry Transfer-Encoding.";
    if (nte) {
        const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_TRANSFER_ENCODING);
        if (!te || strcasecmp(te, "chunked") != 0)
            return "The only transfer coding accepted is chunked.";
    }
    /* GET and HEAD mean nothing with a body (RFC 9110 9.3.1): refusing one
     * keeps a body from being read as the next request. */
    if ((!strcmp(method, "GET") || !strcmp(method, "HEAD")) && (nte || has_length(conn)))
        return "A GET or HEAD request cannot carry a body.";
    return NULL;
}

static http_req *req_new(http_daemon *hd, const char *target) {
    http_server *s = hd->srv;
    http_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    size_t n = strlen(target), pl = strcspn(target, "?");
    /* Most targets fit the request itself: no allocation of their own. */
    r->target = n + pl + 2 <= sizeof r->small_target ? r->small_target : malloc(n + pl + 2);
    if (!r->target) {
        free(r);
        return NULL;
    }
    memcpy(r->target, target, n + 1);
    memcpy(r->target + n + 1, target, pl);       /* the path, as its own string */
    r->target[n + 1 + pl] = '\0';
    r->path = r->target + n + 1;
    r->srv = s;
    r->hd = hd;
    r->route_id = -1;
    r->tag = -1;
    r->t0_us = clock_mono_us();
    return r;
}

static void req_free(http_req *r) {
    if (r->resp) MHD_destroy_response(r->resp);
    if (r->body != r->small_body) free(r->body);
    if (r->target != r->small_target) free(r->target);
    free(r);
}

/* A request libmicrohttpd handed us (URI log) but will never report
 * completed: some of its error paths (a request line whose arguments do
 * not fit the connection's memory, found by the fuzzer) end the request
 * without the completion callback. Freed when the connection goes on or
 * closes. Never a deferred one: a suspended connection does no I/O, so
 * libmicrohttpd cannot drop it, and the service stops only with none. */
static void req_abandoned(http_server *s, http_req *r) {
    if (r->deferred) return;                   /* (kept, rather than freed under a worker) */
    if (r->counted) atomic_fetch_sub(&s->inflight, 1);
    req_free(r);
}

/* libmicrohttpd's request-line report: the target before it decodes it. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
    http_daemon *hd0 = cls;
    http_server *s = hd0->srv;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *hc = ci ? ci->socket_context : NULL;
    http_req *r = req_new(hd0, uri ? uri : "");
    if (hc) {
        http_conn_request_seen(hc);
        if (hc->req) req_abandoned(s, hc->req);    /* never completed by libmicrohttpd */
        hc->req = r;
    }
    return r;
}

/* First call of a request: headers in, body not yet. */
static enum MHD_Result on_headers(http_server *s, http_req *r, const char *version) {
    const char *why = framing_problem(r->conn, r->method, version);
    if (why) return refuse_framing(r, why);
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) {
        http_reply_error(r, 413, "body_too_large", "The body is larger than %zu bytes.",
                         s->opt.max_body);
        return queue(r);
    }
    return MHD_YES;
}

/* A piece of body: kept up to max_body, the rest discarded. */
static enum MHD_Result on_body(http_server *s, http_req *r, const char *data, size_t n) {
    if (r->too_large) return MHD_YES;
    if (r->len + n > s->opt.max_body) {
        r->too_large = 1;
        if (r->body != r->small_body) free(r->body);
        r->body = NULL;
        r->len = r->cap = 0;
        return MHD_YES;
    }
    if (!r->body && n + 1 <= sizeof r->small_body) {    /* the usual order body */
        r->body = r->small_body;
        r->cap = sizeof r->small_body;
    }
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 512;
        while (cap < r->len + n + 1) cap *= 2;
        char *b = r->body == r->small_body ? malloc(cap) : realloc(r->body, cap);
        if (!b) return MHD_NO;
        if (r->body == r->small_body) memcpy(b, r->small_body, r->len);
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = '\0';
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    http_server *s = ((http_daemon *)cls)->srv;
    http_req *r = *con_cls;
    if (!r && !(r = *con_cls = req_new(cls, url))) return MHD_NO;
    if (!r->started) {
        r->started = 1;
        r->conn = conn;
        r->method = method;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r->hc = ci ? ci->socket_context : NULL;
        r->counted = 1;
        atomic_fetch_add(&s->inflight, 1);
        return on_headers(s, r, version);
    }
    if (r->answered) {                             /* refused early: discard */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return on_body(s, r, upload_data, n);
    }
    if (r->resp || r->fatal) return queue(r);      /* a deferred answer is ready */
    if (r->deferred) return MHD_YES;               /* resumed without an answer: wait */
    http_conn_request_in(r->hc);
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
    if (r->too_large)
        http_reply_error(r, 413, "body_too_large", "The body is larger than %zu bytes.",
                         s->opt.max_body);
    else if (r->len > 0 && !json_content_type(ct))
        http_reply_error(r, 415, "unsupported_media_type", "The body must be application/json.");
    else
        route(r);
    if (r->deferred) return defer_return(r);
    assert(r->resp != NULL || r->fatal);   /* every handler answers or defers */
    return queue(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    http_server *s = ((http_daemon *)cls)->srv;
    http_req *r = *con_cls;
    (void)toe;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *hc = ci ? ci->socket_context : NULL;
    if (hc) {
        http_conn_answered(hc);
        if (hc->req == r) hc->req = NULL;
    }
    if (!r) return;
    if (r->counted) atomic_fetch_sub(&s->inflight, 1);
    req_free(r);
    *con_cls = NULL;
}

/* Past the connection limit, a new connection is closed at once: the client
 * sees it refused instead of waiting in the kernel's accept queue (which is
 * what libmicrohttpd's own limit does: it stops accepting). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len) {
    http_server *s = ((http_daemon *)cls)->srv;
    (void)len;
    if (atomic_load(&s->connections) >= (long)s->opt.max_connections) {
        atomic_fetch_add(&s->refused, 1);
        return MHD_NO;
    }
    /* The slot is given back when the connection closes (on_connection). */
    if (!http_clients_take(&s->clients, addr)) {
        atomic_fetch_add(&s->refused_per_client, 1);
        return MHD_NO;
    }
    return MHD_YES;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe) {
    http_daemon *hd = cls;
    http_server *s = hd->srv;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->connections, 1);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ca =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        http_client_key key;
        http_client_key_of(ca ? ca->client_addr : NULL, &key);
        http_conn *c = ci ? http_conn_opened(&hd->conns, ci->connect_fd) : NULL;
        if (c) c->client = key;
        else http_clients_give(&s->clients, &key);   /* untracked: do not hold its slot */
        *socket_ctx = c;
    } else {
        atomic_fetch_sub(&s->connections, 1);
        atomic_fetch_add(&s->closed, 1);
        http_conn *c = *socket_ctx;
        if (c) {
            http_clients_give(&s->clients, &c->client);
            if (c->req) req_abandoned(s, c->req);
        }
        http_conn_closed(c);
        *socket_ctx = NULL;
    }
}

/* ---------------------------------------------------------------- lifecycle */

static int resolve_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *sl,
                          char *err, size_t errlen) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host) {
        snprintf(err, errlen, "bad listen address '%s' (want host:port)", listen);
        return -1;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    if (host[0] == '[') {     /* [::1]:8080 */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *res;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "listen address '%s': %s", listen, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sl = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* The daemon's epoll descriptor is readable: connections are ready. */
static void on_ready(loop *l, int fd, unsigned events, void *ud) {
    http_daemon *hd = ud;
    (void)l;
    (void)fd;
    (void)events;
    MHD_run(hd->d);
}

/* The loop's HTTP_PHASE_RANK phase, after the turn's events: libmicrohttpd may
 * have work it did not get to (its timeout is then 0) without its
 * descriptor being readable again, and answers handed over this turn
 * (kick) are queued. Before the order path's phase: the orders of requests
 * read here join this turn's batches. */
static void on_phase(loop *l, void *ud) {
    http_daemon *hd = ud;
    MHD_UNSIGNED_LONG_LONG t;
    if (hd->kicked) {
        hd->kicked = 0;
        MHD_run(hd->d);
    }
    for (int i = 0; i < 4 && MHD_get_timeout(hd->d, &t) == MHD_YES && t == 0; i++)
        MHD_run(hd->d);
    /* Still more (pipelined requests in its buffer): another iteration
     * soon, after the other loop work, instead of the next timer tick. */
    if (MHD_get_timeout(hd->d, &t) == MHD_YES && t == 0) loop_again(l);
}

/* Timer: idle timeouts (libmicrohttpd's) and request deadlines (ours). */
static void on_tick(loop *l, void *ud) {
    http_daemon *hd = ud;
    (void)l;
    MHD_run(hd->d);
    http_conns_tick(&hd->conns);
}

/* Starts daemon i on hd->l, listening on ss (port 0 for the first: the
 * kernel picks; the others then share the port it picked). */
static int start_daemon(http_server *s, http_daemon *hd, struct sockaddr_storage *ss,
                        char *err, size_t errlen) {
    const http_options *o = &s->opt;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | MHD_USE_TURBO;
    if (ss->ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    http_conns_init(&hd->conns, o->request_timeout_ms);
    hd->d = MHD_start_daemon(
        flags, 0, on_accept, hd, on_request, hd,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)ss,
        /* SO_REUSEPORT: every loop listens on the port; the kernel spreads
         * new connections over them. */
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
        /* Room above our own limit, so on_accept sees and refuses excess. */
        MHD_OPTION_CONNECTION_LIMIT, s->opt.max_connections + 1024u,
        MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s,
        /* Each connection's pool, zeroed at every request: 16 KiB by
         * default instead of libmicrohttpd's 32 (docs/performance.md,
         * "Memory"): half the memory an idle connection holds, half the
         * zeroing per answer. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->opt.conn_memory,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, hd,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, hd,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, hd,
        MHD_OPTION_END);
    if (!hd->d) {
        snprintf(err, errlen, "cannot listen on %s (address in use?)", o->listen);
        return -1;
    }
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(hd->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!ep || loop_watch(hd->l, ep->epoll_fd, LOOP_READ, on_ready, hd) != 0 ||
        loop_on_phase(hd->l, HTTP_PHASE_RANK, on_phase, hd) != 0 || loop_every(hd->l, 20, on_tick, hd) != 0) {
        snprintf(err, errlen, "cannot attach the HTTP daemon to its event loop");
        return -1;
    }
    return 0;
}

http_server *http_start(const http_options *o, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    socklen_t sl;
    if (o->nloops < 1 || resolve_listen(o->listen, &ss, &sl, err, errlen)) return NULL;
    http_server *s = calloc(1, sizeof *s);
    if (!s || !(s->daemons = calloc((size_t)o->nloops, sizeof *s->daemons))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->opt = *o;
    if (!s->opt.max_connections) s->opt.max_connections = 16384;
    if (!s->opt.conn_memory) s->opt.conn_memory = 16 * 1024;
    s->ndaemons = o->nloops;
    if (http_clients_init(&s->clients, o->max_per_client) != 0) {
        free(s->daemons);
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < s->ndaemons; i++) {
        http_daemon *hd = &s->daemons[i];
        hd->srv = s;
        hd->l = o->loops[i];
        hd->kick_task = (loop_task){ on_kick, hd, NULL };
        if (start_daemon(s, hd, &ss, err, errlen) != 0) {
            http_stop(s);
            return NULL;
        }
        if (i == 0) {                  /* the port the others share */
            const union MHD_DaemonInfo *info =
                MHD_get_daemon_info(hd->d, MHD_DAEMON_INFO_BIND_PORT);
            s->port = info ? info->port : 0;
            if (ss.ss_family == AF_INET6) ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)s->port);
            else ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)s->port);
        }
    }
    (void)sl;
    return s;
}

int http_port(const http_server *s) { return s->port; }
long http_inflight(const http_server *s) { return atomic_load(&s->inflight); }
long http_connections(const http_server *s) { return atomic_load(&s->connections); }
long http_closed(const http_server *s) { return atomic_load(&s->closed); }
long http_refused(const http_server *s) { return atomic_load(&s->refused); }
long http_refused_per_client(const http_server *s) { return atomic_load(&s->refused_per_client); }
long http_timed_out(const http_server *s) {
    long n = 0;
    for (int i = 0; i < s->ndaemons; i++) n += atomic_load(&s->daemons[i].conns.timed_out);
    return n;
}

/* On a daemon's own loop: stop accepting (libmicrohttpd's listen socket is
 * in the epoll set that loop is polling). */
static void quiesce_one(loop *l, void *ud) {
    http_daemon *hd = ud;
    (void)l;
    MHD_socket fd = MHD_quiesce_daemon(hd->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    atomic_fetch_add(&hd->srv->quiesced_n, 1);
}

void http_quiesce(http_server *s) {
    if (s->quiesced) return;
    s->quiesced = 1;
    for (int i = 0; i < s->ndaemons; i++) {
        s->daemons[i].quiesce_task = (loop_task){ quiesce_one, &s->daemons[i], NULL };
        loop_post(s->daemons[i].l, &s->daemons[i].quiesce_task);
    }
    while (atomic_load(&s->quiesced_n) < s->ndaemons) clock_sleep_ms(1);
}

void http_stop(http_server *s) {
    if (!s) return;
    for (int i = 0; i < s->ndaemons; i++) {
        http_daemon *hd = &s->daemons[i];
        if (!hd->d) continue;
        MHD_stop_daemon(hd->d);
        http_conns_fini(&hd->conns);
    }
    http_clients_fini(&s->clients);
    free(s->daemons);
    free(s);
}
