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
#include <sys/socket.h>
#include <microhttpd.h>

#include "common/loop.h"
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

/* ----------------------------------------------------------------- clients */

/* Open connections per client address, across every daemon of a server
 * (libmicrohttpd's own per-IP limit counts one daemon only, and the kernel
 * does not spread one client's connections evenly over the daemons). */
typedef struct http_client_key {
    unsigned char len;               /* 4 (IPv4) or 8 (an IPv6 /64) bytes; 0: an empty slot */
    unsigned char addr[16];
} http_client_key;

typedef struct http_clients {
    pthread_mutex_t mu;
    unsigned cap;                    /* per address; 0: no cap */
    size_t size, used;               /* open addressing: slots, slots in use */
    http_client_key *keys;
    unsigned *counts;
} http_clients;

int http_clients_init(http_clients *cl, unsigned cap);
void http_clients_fini(http_clients *cl);
/* Takes a slot for addr: 1 when it is under the cap, 0 when not. */
int http_clients_take(http_clients *cl, const struct sockaddr *addr);
/* Gives back the slot taken for key. */
void http_clients_give(http_clients *cl, const http_client_key *key);
/* The key of addr. */
void http_client_key_of(const struct sockaddr *addr, http_client_key *key);

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
    http_client_key client;          /* the slot it holds in the per-client count */
    struct http_req *req;            /* the request being read or answered (its thread only) */
    uint64_t bytes_idle;             /* bytes the kernel had received when it went idle */
    struct http_conn *prev, *next;
} http_conn;

struct http_conns {
    pthread_mutex_t mu;              /* guards the list and the phases */
    http_conn *head;
    int64_t timeout_us;              /* 0: no request deadline */
    int64_t next_sweep_us, recheck_us;
    int recheck;                     /* a close awaits its second look */
    atomic_long timed_out;
};

/* Starts tracking the connections of one daemon. */
void http_conns_init(http_conns *cs, unsigned request_timeout_ms);
void http_conns_fini(http_conns *cs);
/* The daemon's loop timer: sweeps when due (see conns.c). */
void http_conns_tick(http_conns *cs);
/* A connection opened / closed (libmicrohttpd's notification; the close
 * comes before libmicrohttpd closes the descriptor). */
http_conn *http_conn_opened(http_conns *cs, int fd);
void http_conn_closed(http_conn *c);
/* Phase changes, from the connection's event-loop thread. */
void http_conn_request_seen(http_conn *c);
void http_conn_request_in(http_conn *c);
void http_conn_answered(http_conn *c);

/* --------------------------------------------------------------- requests */

/* One libmicrohttpd daemon, driven by one event loop. */
typedef struct http_daemon {
    struct http_server *srv;
    struct MHD_Daemon *d;
    loop *l;
    http_conns conns;
    loop_task quiesce_task;
    int kicked;                      /* resumed on the loop: run in its phase */
    atomic_int kick_posted;          /* resumed elsewhere: kick_task is queued */
    loop_task kick_task;
} http_daemon;

struct http_server {
    http_daemon *daemons;
    int ndaemons;
    http_options opt;
    int port;
    int quiesced;
    atomic_int quiesced_n;
    atomic_long inflight;
    atomic_long connections;
    atomic_long closed;            /* connections closed, ever */
    atomic_long refused;
    atomic_long refused_per_client;
    http_clients clients;
};

struct http_req {
    http_server *srv;
    http_daemon *hd;              /* the daemon (and loop) of its connection */
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
    int deferred;                 /* http_defer was called (the handler's thread) */
    atomic_int dstate;            /* a deferred request's hand-over, see http.c */
    int fatal;                    /* no answer could be built: close the connection */
    int route_id;
    int tag;                      /* http_tag's, for the observer; -1: none */
    unsigned status;
    const char *error;            /* the error code answered (static strings), or NULL */
    struct MHD_Response *resp;    /* prepared answer, queued by the handler thread */
    char small_target[192];       /* target and body, when they fit: no allocation */
    char small_body[256];
};

#endif
