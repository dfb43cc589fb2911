/* internal.h: what the http module's files share; not part of its public
 * face (http.h), and not to be included from outside http/.
 *
 *   http.c    libmicrohttpd glue: the daemon, the access handler, answers
 *   route.c   the raw path: splitting, percent-decoding, matching routes
 *   conns.c   open connections and the deadlines of slow requests */
#ifndef FLASHSALE_HTTP_INTERNAL_H
#define FLASHSALE_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <microhttpd.h>

#include "http/http.h"

/* ------------------------------------------------------------------ routes */

typedef enum http_match {
    HTTP_MATCH_OK,            /* route i matched */
    HTTP_MATCH_NONE,          /* no route has this path */
    HTTP_MATCH_METHOD,        /* the path exists with other methods (allow[] says which) */
    HTTP_MATCH_BAD_PATH       /* malformed: a bad %-escape, a NUL byte, not absolute */
} http_match;

/* Decodes the percent-escapes of src[0..n) into dst (room for n + 1
 * bytes). Returns the decoded length, or -1 on a malformed escape or an
 * escaped NUL byte. '+' is left alone (it is only a space in queries). */
long http_decode_segment(const char *src, size_t n, char *dst);

/* Finds the route for method and the raw path (no query). On
 * HTTP_MATCH_OK sets *route and fills params (each HTTP_PARAM_MAX + 1
 * bytes); on HTTP_MATCH_METHOD writes the allowed methods ("GET, HEAD,
 * POST") into allow (allowlen bytes). HEAD matches GET routes. */
http_match http_route_find(const http_route *routes, size_t nroutes, const char *method,
                           const char *path, size_t *route,
                           char params[HTTP_MAX_PARAMS][HTTP_PARAM_MAX + 1], char *allow,
                           size_t allowlen);

/* ------------------------------------------------------------- connections */

typedef enum conn_phase {
    CONN_IDLE,                /* between requests */
    CONN_RECEIVING,           /* a request has started arriving: the deadline runs */
    CONN_BUSY                 /* the whole request is in; we are answering it */
} conn_phase;

typedef struct http_conns http_conns;

/* One open connection, as the deadline sweeper sees it. Every field but
 * fd and cs is guarded by cs->mu. */
typedef struct http_conn {
    int fd;
    http_conns *cs;
    conn_phase phase;
    int64_t started_us;              /* when the current request was first seen */
    int64_t closed_seen_us;          /* receiving, and the client had closed its side */
    uint64_t bytes_idle;             /* bytes the kernel had received when it went idle */
    struct http_conn *prev, *next;
} http_conn;

struct http_conns {
    pthread_mutex_t mu;              /* guards the list; held while an fd is used, so
                                        the fd cannot be closed and reused meanwhile */
    http_conn *head;
    pthread_t sweeper;
    int sweeping;
    pthread_cond_t cv;
    int stopping;
    int64_t timeout_us;
    atomic_long timed_out;
};

/* Starts tracking (and, with a timeout, the sweeper thread). */
int http_conns_init(http_conns *cs, unsigned request_timeout_s);
void http_conns_fini(http_conns *cs);
/* A connection opened / closed (libmicrohttpd's notification; the close
 * comes before libmicrohttpd closes the descriptor). */
http_conn *http_conn_opened(http_conns *cs, int fd);
void http_conn_closed(http_conn *c);
/* Phase changes, from the connection's event-loop thread. */
void http_conn_request_seen(http_conn *c);
void http_conn_request_in(http_conn *c);
void http_conn_answered(http_conn *c);

/* --------------------------------------------------------------- requests */

struct http_server {
    struct MHD_Daemon *daemon;
    http_options opt;
    int port;
    int quiesced;
    atomic_long inflight;
    atomic_long connections;
    atomic_long refused;
    http_conns conns;
};

struct http_req {
    http_server *srv;
    struct MHD_Connection *conn;
    http_conn *hc;
    char *target;                 /* the request target as sent (path?query) */
    const char *path;             /* target up to '?', NUL-terminated copy */
    const char *method;
    int64_t t0_us;
    char *body;
    size_t len, cap;
    int started;                  /* the access handler has seen this request */
    int counted;                  /* counted in inflight */
    int too_large;
    int answered;                 /* a response was queued */
    int deferred;
    int fatal;                    /* no answer could be built: close the connection */
    int route_id;
    unsigned status;
    struct MHD_Response *resp;    /* prepared answer, queued by the handler thread */
};

#endif
