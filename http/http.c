/* http.c: libmicrohttpd server, routing, bodies, JSON answers. See http.h.
 *
 * libmicrohttpd calls the access handler several times per request: once
 * when the headers are in (we only set up the request then: a response
 * queued in that first call makes libmicrohttpd close the connection), once
 * per piece of body, and once more when the body is complete; that last
 * call routes and answers. A deferred request is suspended and resumed by
 * http_reply from another thread; the handler is then called again and
 * queues the prepared response. */
#include "http/http.h"

#include <arpa/inet.h>
#include <assert.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <microhttpd.h>

#include "common/clock.h"

struct http_server {
    struct MHD_Daemon *daemon;
    http_options opt;
    int port;
    int quiesced;
    atomic_long inflight;
    atomic_long connections;
    atomic_long refused;
};

struct http_req {
    http_server *srv;
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    int64_t t0_us;
    char *body;
    size_t len, cap;
    int too_large;
    int answered;                 /* a response was queued */
    int deferred;
    int route_id;
    unsigned status;
    struct MHD_Response *resp;    /* prepared answer, queued by the handler thread */
};

/* ------------------------------------------------------------ request data */

const char *http_method(const http_req *r) { return r->method; }
const char *http_path(const http_req *r) { return r->url; }

const char *http_header(const http_req *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *http_query(const http_req *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
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

/* Queues the prepared response: on the handler's thread directly, else by
 * resuming the suspended connection so its thread queues it. */
static void deliver(http_req *r) {
    http_server *s = r->srv;
    if (s->opt.observer)
        s->opt.observer(r->route_id, (int)r->status, clock_mono_us() - r->t0_us, s->opt.ud);
    if (r->deferred) MHD_resume_connection(r->conn);
}

void http_reply(http_req *r, int status, const char *content_type, const char *body,
                size_t len, const char *const *extra_headers) {
    assert(r->resp == NULL);
    r->resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    r->status = (unsigned)status;
    if (!r->resp) abort();   /* out of memory: nothing sensible to answer */
    MHD_add_response_header(r->resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    for (size_t i = 0; extra_headers && extra_headers[i]; i += 2)
        MHD_add_response_header(r->resp, extra_headers[i], extra_headers[i + 1]);
    deliver(r);
}

void http_reply_json(http_req *r, int status, json_t *body, const char *const *extra_headers) {
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) abort();
    http_reply(r, status, "application/json; charset=utf-8", text, strlen(text), extra_headers);
    free(text);
}

static void reply_error_v(http_req *r, int status, const char *code, json_t *extra,
                          const char *const *extra_headers, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    json_t *j = json_pack("{s:s, s:s}", "error", code, "message", msg);
    if (extra) {
        json_object_update_missing(j, extra);
        json_decref(extra);
    }
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

void http_defer(http_req *r) {
    assert(!r->deferred && !r->resp);
    r->deferred = 1;
    /* Suspend before the request can reach another thread, so that an
     * answer can never race ahead of the suspension. */
    MHD_suspend_connection(r->conn);
}

/* ------------------------------------------------------------------ routing */

/* Matches path against pattern; {} matches one non-empty segment, which is
 * copied into params (each of cap bytes). */
static int match(const char *pattern, const char *path, char params[][256], int *np) {
    *np = 0;
    while (*pattern && *path) {
        if (pattern[0] == '{' && pattern[1] == '}') {
            size_t n = strcspn(path, "/");
            if (n == 0 || n >= 256 || *np == HTTP_MAX_PARAMS) return 0;
            memcpy(params[*np], path, n);
            params[(*np)++][n] = '\0';
            path += n;
            pattern += 2;
        } else if (*pattern++ != *path++) {
            return 0;
        }
    }
    return *pattern == '\0' && *path == '\0';
}

static void route(http_req *r) {
    const http_options *o = &r->srv->opt;
    char params[HTTP_MAX_PARAMS][256];
    const char *pv[HTTP_MAX_PARAMS + 1] = { params[0], params[1], NULL };
    char allow[64] = "";
    int np;
    for (size_t i = 0; i < o->nroutes; i++) {
        if (!match(o->routes[i].pattern, r->url, params, &np)) continue;
        if (strcmp(o->routes[i].method, r->method) == 0) {
            r->route_id = o->routes[i].id;
            o->routes[i].handler(r, pv, o->ud);
            return;
        }
        if (!strstr(allow, o->routes[i].method) && strlen(allow) + 8 < sizeof allow) {
            if (allow[0]) strcat(allow, ", ");
            strcat(allow, o->routes[i].method);
        }
    }
    if (allow[0]) {
        const char *h[] = { "Allow", allow, NULL };
        http_reply_error_with(r, 405, "method_not_allowed", NULL, h,
                              "%s is not allowed on %s; allowed: %s.", r->method, r->url, allow);
    } else {
        http_reply_error(r, 404, "not_found", "No route for %s %s.", r->method, r->url);
    }
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
    r->answered = 1;
    enum MHD_Result rc = MHD_queue_response(r->conn, r->status, r->resp);
    MHD_destroy_response(r->resp);
    r->resp = NULL;
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    http_server *s = cls;
    http_req *r = *con_cls;
    (void)version;
    if (!r) {
        /* First call: headers only. Answering here would close the
         * connection, so just set up (except for a body we will refuse). */
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = s;
        r->conn = conn;
        r->url = url;
        r->method = method;
        r->route_id = -1;
        r->t0_us = clock_mono_us();
        *con_cls = r;
        atomic_fetch_add(&s->inflight, 1);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) {
            http_reply_error(r, 413, "body_too_large", "The body is larger than %zu bytes.",
                             s->opt.max_body);
            return queue(r);
        }
        return MHD_YES;
    }
    if (r->answered) {                             /* refused early: discard */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->too_large) return MHD_YES;          /* discard the rest */
        if (r->len + n > s->opt.max_body) {
            r->too_large = 1;
            free(r->body);
            r->body = NULL;
            r->len = 0;
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 512;
            while (cap < r->len + n + 1) cap *= 2;
            char *b = realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = '\0';
        return MHD_YES;
    }
    if (r->resp) return queue(r);                  /* a deferred answer is ready */
    if (r->deferred) return MHD_YES;               /* resumed without an answer: wait */
    if (r->too_large)
        http_reply_error(r, 413, "body_too_large", "The body is larger than %zu bytes.",
                         s->opt.max_body);
    else if (r->len > 0 && !json_content_type(MHD_lookup_connection_value(
                               conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)))
        http_reply_error(r, 415, "unsupported_media_type",
                         "The body must be application/json.");
    else
        route(r);
    if (r->deferred) return MHD_YES;
    assert(r->resp != NULL);   /* every handler answers or defers */
    return queue(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    http_server *s = cls;
    http_req *r = *con_cls;
    (void)conn;
    (void)toe;
    if (!r) return;
    if (r->resp) MHD_destroy_response(r->resp);
    free(r->body);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->inflight, 1);
}

/* Past the connection limit, a new connection is closed at once: the client
 * sees it refused instead of waiting in the kernel's accept queue (which is
 * what libmicrohttpd's own limit does: it stops accepting). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len) {
    http_server *s = cls;
    (void)addr;
    (void)len;
    if (atomic_load(&s->connections) < (long)s->opt.max_connections) return MHD_YES;
    atomic_fetch_add(&s->refused, 1);
    return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe) {
    http_server *s = cls;
    (void)conn;
    (void)socket_ctx;
    atomic_fetch_add(&s->connections, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
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

http_server *http_start(const http_options *o, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve_listen(o->listen, &ss, &sl, err, errlen)) return NULL;
    http_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->opt = *o;
    if (!s->opt.max_connections) s->opt.max_connections = 16384;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ITC | MHD_USE_TURBO;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, 0, on_accept, s, on_request, s,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(o->threads > 0 ? o->threads : 2),
        /* Room above our own limit, so on_accept sees and refuses excess. */
        MHD_OPTION_CONNECTION_LIMIT, s->opt.max_connections + 1024u,
        MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, errlen, "cannot listen on %s (address in use, or too many threads?)",
                 o->listen);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : 0;
    return s;
}

int http_port(const http_server *s) { return s->port; }
long http_inflight(const http_server *s) { return atomic_load(&s->inflight); }
long http_connections(const http_server *s) { return atomic_load(&s->connections); }
long http_refused(const http_server *s) { return atomic_load(&s->refused); }

void http_quiesce(http_server *s) {
    if (s->quiesced) return;
    s->quiesced = 1;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_stop(http_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    free(s);
}
