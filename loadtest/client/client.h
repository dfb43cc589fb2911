/* client.h: flashload's side of the HTTP wire -- how it reads the
 * service's answers and asks it things.
 *
 *   fl_resp      incremental HTTP/1.1 response parser: partial reads,
 *                chunked bodies, pipelined responses (httpresp.c); the
 *                engine feeds it, and so do the fuzz harnesses
 *   fl_target    a service instance, parsed and resolved
 *   fl_http      a blocking keep-alive client for the admin calls and the
 *                API vantage point; products, orders and the strategies as
 *                the service lists them (client.c)
 *
 * It shares no code with the service's http/ module: the judge parses what
 * the service writes on its own. */
#ifndef FLASHSALE_LOADTEST_CLIENT_H
#define FLASHSALE_LOADTEST_CLIENT_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "loadtest/fl.h"

/* ------------------------------------------------------- the response parser */

#define FL_RESP_LINE_MAX 8192      /* longest status or header line */

enum { FL_RESP_ERROR = -1, FL_RESP_MORE = 0, FL_RESP_DONE = 1 };

/* One HTTP/1.x response being read. Feed it bytes as they arrive, in any
 * slicing; it says when a whole response is in, and how many of the bytes
 * were its own, so what follows belongs to the next (pipelined) response. */
typedef struct fl_resp {
    /* What was read. */
    int status;                  /* e.g. 201 */
    int minor;                   /* HTTP/1.<minor> */
    int keep_alive;              /* the connection may carry another request */
    int replayed;                /* Idempotent-Replayed: true */
    int retry_after_s;           /* Retry-After in seconds (-1: none, or a date) */
    int chunked;                 /* Transfer-Encoding: chunked */
    long long content_length;    /* -1: none given */
    char *body;                  /* the first body_max bytes, NUL-terminated */
    size_t body_len;             /* bytes kept in body */
    size_t body_total;           /* bytes of body received */
    size_t body_max;             /* keep at most this many body bytes */
    const char *error;           /* why, after FL_RESP_ERROR */
    int no_body;                 /* caller: the request was HEAD (no body follows) */
    /* Parser state. */
    int state;
    long long left;              /* bytes left of the body or of the chunk */
    size_t body_cap;
    size_t line_len;
    size_t head_bytes;           /* status + header bytes so far (bounded) */
    char line[FL_RESP_LINE_MAX];
} fl_resp;

/* Sets r up to read responses keeping up to body_max body bytes each. */
void fl_resp_init(fl_resp *r, size_t body_max);
/* Makes r ready for the next response (keeps the body buffer). */
void fl_resp_reset(fl_resp *r);
void fl_resp_free(fl_resp *r);
/* Feeds len bytes of the stream. *used gets how many were consumed: all of
 * them with FL_RESP_MORE; up to the response's end with FL_RESP_DONE (the
 * rest is the next response's); unspecified with FL_RESP_ERROR (r->error
 * says why). */
int fl_resp_feed(fl_resp *r, const char *buf, size_t len, size_t *used);
/* The peer closed the connection: FL_RESP_DONE when that ends a body
 * delimited by close, else FL_RESP_ERROR (a truncated response). */
int fl_resp_eof(fl_resp *r);
/* Whether any byte of the current response has been fed. */
int fl_resp_started(const fl_resp *r);

/* The time in "key": "YYYY-MM-DDTHH:MM:SS.mmmZ" (the service's RFC 3339
 * UTC timestamps) found as fl_json_str finds it, in Unix milliseconds; -1
 * when absent or not in that form. */
long long fl_json_time_ms(const char *json, size_t len, const char *key);

/* Finds "key": "<string>" in a flat JSON text (the service's compact
 * answers) and copies the string, unescaped of nothing, into out. Returns
 * its length, or -1 when absent or longer than outlen - 1. */
int fl_json_str(const char *json, size_t len, const char *key, char *out, size_t outlen);

/* ------------------------------------------------------------------ targets */

#define FL_MAX_TARGETS 16

/* A service instance: "http://host:port" (a trailing path is ignored). */
typedef struct fl_target {
    char url[300];
    char host[256];
    int port;
    char hostport[300];          /* the Host header */
    struct sockaddr_storage addr;
    socklen_t addrlen;
} fl_target;

/* Parses and resolves url. Returns 0, or -1 with e set. */
int fl_target_parse(const char *url, fl_target *t, fl_err *e);

/* ------------------------------------------------------ the blocking client */

/* One keep-alive connection for admin calls and reads; reconnects once
 * when the server has closed it meanwhile. */
typedef struct fl_http {
    fl_target t;
    int fd;
    int timeout_ms;
    char token[256];             /* admin bearer token ("" none) */
    fl_resp resp;                /* the last answer */
} fl_http;

int fl_http_init(fl_http *h, const fl_target *t, const char *token, int timeout_ms);
void fl_http_close(fl_http *h);
/* Sends one request (body may be NULL) and reads the answer into h->resp.
 * Returns the status, or -1 with e set on a transport error. */
int fl_http_request(fl_http *h, const char *method, const char *path, const char *body,
                    fl_err *e);

/* A product as GET /v1/products/{sku} shows it. */
typedef struct fl_product {
    char sku[65];
    char strategy[32];
    int segments;
    long long per_user_limit;
    long long stock_initial, stock_available, sold;
    long long min_segment;       /* lowest of segment_available */
    int hold_seconds;            /* 0: no holds (absent: an older service) */
    long long held;              /* units of reserved holds */
} fl_product;

/* What a run creates. */
typedef struct fl_product_spec {
    char sku[65];
    long long stock;
    char strategy[32];           /* "" : the service's default */
    int segments;
    long long per_user_limit;
    int cs_delay_ms;             /* fault injection (0: not sent) */
    int lock_ttl_ms;             /* fault injection (0: not sent) */
    int cs_overlap;              /* fault injection: holders the critical section waits
                                    for, cs_delay_ms at most (0: not sent) */
    int hold_seconds;            /* holds (0: not sent) */
    int room_turn_s;             /* > 0: a waiting room, turns this long (0: none) */
    long long room_rate;         /* ...admitting this many orders/s (0: measured) */
    long long room_opens_in_ms;  /* ...opening this long after its creation (0: at once;
                                    the host's clock: Redis on the same host) */
} fl_product_spec;

/* POST /v1/products. Returns 0, or -1 with the service's answer in e. */
int fl_product_create(fl_http *h, const fl_product_spec *s, fl_err *e);
/* GET /v1/products/{sku}: 0, or -1 with e set. */
int fl_product_get(fl_http *h, const char *sku, fl_product *p, fl_err *e);
/* Calls fn for every order of sku (GET /v1/orders?sku=, all pages).
 * Returns the number of orders, or -1 with e set. */
long fl_orders_each(fl_http *h, const char *sku, fl_row_fn fn, void *ud, fl_err *e);

/* -------------------------------------------------------------- strategies */

#define FL_MAX_STRATEGIES 32

/* A stock strategy as GET /v1/strategies describes it: flashload keeps no
 * list of its own, so it offers exactly what the service it drives does. */
typedef struct fl_strategy {
    char name[32];
    int safe;                    /* 0: oversells by design (a demonstration) */
    int segments;                /* takes segments > 1 */
    int in_redis;                /* "redis" among its needs: its stock copy lives there */
    int available;               /* this instance can run it now */
    char reason[160];            /* why not, when it cannot */
} fl_strategy;

/* GET /v1/strategies into out[0..max). Returns how many, or -1 with e set. */
int fl_strategies_get(fl_http *h, fl_strategy *out, int max, fl_err *e);
/* The strategy named name among s[0..n), or NULL. */
const fl_strategy *fl_strategy_find(const fl_strategy *s, int n, const char *name);
/* Looks name up on the service. Returns 0 with *out filled, or -1 with e set
 * (the service cannot be asked, or offers no such strategy). */
int fl_strategy_lookup(fl_http *h, const char *name, fl_strategy *out, fl_err *e);

#endif
