/* http.h: the HTTP front of flashsale, on libmicrohttpd.
 *
 * - Runs on the caller's event loops (common/loop.h): one libmicrohttpd
 *   daemon per loop, all listening on one port (SO_REUSEPORT), no thread
 *   per connection, so thousands of idle keep-alive connections cost
 *   memory, not threads, and a handler runs on the loop that also carries
 *   the rest of the request's work.
 * - Routing by method and path pattern ("/v1/products/{}/restock": {} is one
 *   path segment, handed to the handler as a parameter). Routing works on
 *   the path exactly as the client sent it: it is split on '/' first and
 *   each segment is percent-decoded after, so "%2F" is part of a segment,
 *   never a separator. 404 `not_found` for an unknown path, 405
 *   `method_not_allowed` with an Allow header for a known path with another
 *   method; HEAD is served wherever GET is (libmicrohttpd sends no body).
 * - Framing the server will not guess at is refused with 400 `bad_request`
 *   and the connection closed: two Content-Length headers, Content-Length
 *   with Transfer-Encoding (RFC 9112 6.1), Transfer-Encoding on HTTP/1.0
 *   (6.1 again), a transfer coding other than chunked, a header name that is not a token (whitespace before the
 *   colon, a folded line), a missing Host on HTTP/1.1 or two Host headers,
 *   a body on a GET or HEAD, a malformed percent-escape or a NUL byte in
 *   the path.
 * - Request bodies are collected up to a limit (413 `body_too_large`
 *   beyond it, answered as soon as Content-Length tells); a body sent with
 *   a Content-Type other than application/json gets 415.
 * - Slow clients cannot hold connections: a request's head and body must
 *   arrive within request_timeout_ms of its first byte (of the accept, for
 *   a connection's first request) or the connection is closed; an idle
 *   connection is closed after idle_timeout_s; one client may hold at most
 *   max_per_client connections (an IPv4 address, or an IPv6 /64: one
 *   host usually has a whole /64).
 * - Deferred answers: a handler may call http_defer() and answer later from
 *   any thread; the connection is suspended meanwhile and its event-loop
 *   thread serves other connections. (Answers are queued on a later call of
 *   the access handler than the first, which keeps the connection alive.)
 * - An answer can always be given: error messages are made valid UTF-8 and
 *   cut on a character boundary, and an answer that cannot be built (out
 *   of memory, text jansson refuses) becomes a fixed JSON 500
 *   `internal_error`, never an abort.
 *
 * Every error answer has the JSON body {"error": code, "message": text};
 * every JSON body ends with a newline. */
#ifndef FLASHSALE_HTTP_H
#define FLASHSALE_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "common/loop.h"

typedef struct http_server http_server;

/* The rank of the server's loop phase (loop_on_phase): answers handed over
 * during the turn are queued, and requests already buffered (pipelined)
 * are read. Early: the work those requests make (orders) joins the phases
 * after it in the same turn. */
#define HTTP_PHASE_RANK 100
typedef struct http_req http_req;

#define HTTP_MAX_PARAMS 2
#define HTTP_PARAM_MAX 512        /* longest decoded path segment, bytes */

/* A route handler. It must answer (http_reply*) exactly once, now or after
 * http_defer(). params[] holds the {} segments of the pattern, decoded
 * (any bytes but NUL, not necessarily valid UTF-8). */
typedef void http_handler(http_req *req, const char *const *params, void *ud);

typedef struct http_route {
    const char *method;       /* "GET" (also serves HEAD), "POST", ... */
    const char *pattern;      /* "/v1/orders/{}" */
    http_handler *handler;
    int id;                   /* caller's label (metrics), see http_observer */
} http_route;

/* What the observer learns of one answer. error points at the code given
 * to http_reply_error* (or "internal_error" for the fixed 500 answer) and
 * is valid during the call only. */
typedef struct http_answer {
    int route_id;             /* the route's id; -1: no route matched */
    int status;
    const char *error;        /* an error answer's "error" code; NULL otherwise */
    int tag;                  /* the handler's http_tag; -1 when none */
    int64_t micros;           /* from the request's arrival to its answer */
} http_answer;

/* Called once per answered request, on the thread that answered it. It
 * runs on the hot path of every request: keep it to a few atomic adds. */
typedef void http_observer(const http_answer *a, void *ud);

typedef struct http_options {
    const char *listen;           /* "host:port"; port 0 picks a free one */
    loop **loops;                 /* the event loops to serve on (their threads run them) */
    int nloops;
    unsigned max_connections;     /* beyond it new connections are refused */
    unsigned max_per_client;      /* connections one address may hold; 0: no cap */
    size_t conn_memory;           /* libmicrohttpd's memory per connection (request head,
                                   * read and write buffers), bytes; 0: 16 KiB. A head
                                   * larger than about this is refused (431) */
    unsigned idle_timeout_s;      /* an idle connection is closed after it */
    unsigned request_timeout_ms;  /* a started request must be in by then; 0: none */
    size_t max_body;              /* 413 beyond it */
    const http_route *routes;
    size_t nroutes;
    http_observer *observer;      /* optional */
    void *ud;                     /* passed to handlers and the observer */
} http_options;

/* Starts listening and serving. NULL with a message in err on failure. */
http_server *http_start(const http_options *o, char *err, size_t errlen);
/* The TCP port it listens on. */
int http_port(const http_server *s);
/* Stops accepting new connections; requests already in progress go on.
 * The loops must be running. */
void http_quiesce(http_server *s);
/* Requests received and not yet answered (deferred ones included). */
long http_inflight(const http_server *s);
/* Open connections; connections closed since the start. */
long http_connections(const http_server *s);
long http_closed(const http_server *s);
/* Connections refused because max_connections were open. */
long http_refused(const http_server *s);
/* Connections refused because their address held max_per_client. */
long http_refused_per_client(const http_server *s);
/* Connections closed because a request did not arrive in time. */
long http_timed_out(const http_server *s);
/* Stops the server: call once no request is deferred and the loops have
 * stopped. Frees s. */
void http_stop(http_server *s);

/* Request data. Valid until the request is answered; read it on the
 * handler's thread (copy what a deferred answer needs). */
const char *http_method(const http_req *r);
/* The path as the client sent it (still percent-encoded, no query). */
const char *http_path(const http_req *r);
/* A request header: returns 1 and sets *value when present once, 0 when
 * absent, -1 when it is malformed (sent twice, or holding a NUL byte). */
int http_header(const http_req *r, const char *name, const char **value);
/* A query argument, URL-decoded: 1 and *value when present once, 0 when
 * absent, -1 when malformed (repeated, a NUL byte, invalid UTF-8). */
int http_query(const http_req *r, const char *name, const char **value);
/* Whether every query argument's name is one of known (NULL-terminated):
 * 0 if so; else -1 with *unknown pointing at the first other name (valid
 * until the request is answered). A misspelt filter must not widen what a
 * query returns. */
int http_query_only(const http_req *r, const char *const *known, const char **unknown);
/* The body (NUL-terminated) and its length. */
const char *http_body(const http_req *r, size_t *len);
/* Parses the body as a JSON object. On failure answers 400 invalid_json and
 * returns NULL. */
json_t *http_body_json(http_req *r);

/* Answering. extra_headers: NULL or a NULL-terminated list of alternating
 * names and values. Any thread may answer a deferred request. */
void http_reply(http_req *r, int status, const char *content_type, const char *body,
                size_t len, const char *const *extra_headers);
/* Answers with body, taking it over (it was malloc'd; libmicrohttpd frees
 * it with free() once sent): no copy. */
void http_reply_take(http_req *r, int status, const char *content_type, char *body,
                     size_t len, const char *const *extra_headers);
/* Answers with the JSON encoding of body (a reference is stolen; NULL, as
 * from a json_pack that failed, answers 500 internal_error). */
void http_reply_json(http_req *r, int status, json_t *body, const char *const *extra_headers);
/* Answers {"error": code, "message": <formatted>}; the message is made
 * valid UTF-8 (invalid bytes become U+FFFD) and cut on a character
 * boundary. */
void http_reply_error(http_req *r, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Answers an error whose JSON body the caller wrote (len bytes, copied):
 * {"error": code, "message": ..., ...}, as the ones above write it, for an
 * answer so frequent that building it with jansson shows (a sold-out
 * order). code is a string literal: it labels the answer in the metrics. */
void http_reply_error_json(http_req *r, int status, const char *code, const char *body,
                           size_t len, const char *const *extra_headers);
/* Answers an error with more fields merged into the body (reference stolen). */
void http_reply_error_with(http_req *r, int status, const char *code, json_t *extra,
                           const char *const *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Labels r for the observer with a small number of the caller's (the
 * service: the order's strategy), passed on as http_answer.tag. */
void http_tag(http_req *r, int tag);

/* The handler will answer later, from any thread. Call before handing the
 * request to another thread; calling it again (a thread that was handed a
 * deferred request hands it on) does nothing. */
void http_defer(http_req *r);

#endif
