/* client.c: flashload's blocking HTTP client and the API calls it makes
 * outside the load: creating the product, reading it (the API vantage
 * point, also sampled while the load runs) and listing its orders.
 *
 * These calls are few, so one blocking keep-alive connection with socket
 * timeouts is enough; the responses go through the same parser as the
 * load's (httpresp.c), with room for a full page of orders. */
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "common/utctime.h"
#include "loadtest/client/client.h"

#define BODY_MAX (16 * 1024 * 1024)   /* a page of 1000 orders is ~250 KiB */

/* ------------------------------------------------------------------ targets */

int fl_target_parse(const char *url, fl_target *t, fl_err *e) {
    memset(t, 0, sizeof *t);
    if (strlen(url) >= sizeof t->url) return fl_errf(e, "target URL too long: %.60s...", url);
    snprintf(t->url, sizeof t->url, "%s", url);
    const char *p = url;
    if (!strncasecmp(p, "http://", 7)) p += 7;
    else if (strstr(p, "://")) return fl_errf(e, "target %s: only http:// is supported", url);
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof t->host) return fl_errf(e, "target %s: no host", url);
    memcpy(t->host, p, hl);
    t->host[hl] = '\0';
    p += hl;
    t->port = 80;
    if (*p == ':') {
        char *end;
        long port = strtol(p + 1, &end, 10);
        if (end == p + 1 || port < 1 || port > 65535 || (*end && *end != '/'))
            return fl_errf(e, "target %s: bad port", url);
        t->port = (int)port;
    }
    snprintf(t->hostport, sizeof t->hostport, "%s:%d", t->host, t->port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%d", t->port);
    int rc = getaddrinfo(t->host, port, &hints, &ai);
    if (rc != 0 || !ai) return fl_errf(e, "target %s: %s", url, gai_strerror(rc));
    memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
    t->addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* ------------------------------------------------------------------- client */

int fl_http_init(fl_http *h, const fl_target *t, const char *token, int timeout_ms) {
    memset(h, 0, offsetof(fl_http, resp));
    h->t = *t;
    h->fd = -1;
    h->timeout_ms = timeout_ms > 0 ? timeout_ms : 10000;
    snprintf(h->token, sizeof h->token, "%s", token ? token : "");
    fl_resp_init(&h->resp, BODY_MAX);
    return 0;
}

void fl_http_close(fl_http *h) {
    if (h->fd >= 0) close(h->fd);
    h->fd = -1;
    fl_resp_free(&h->resp);
}

static int connect_timeout(fl_http *h, fl_err *e) {
    int fd = socket(h->t.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fl_errf(e, "socket: %s", strerror(errno));
    int rc = connect(fd, (struct sockaddr *)&h->t.addr, h->t.addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd pfd = { fd, POLLOUT, 0 };
        int err = 0;
        socklen_t len = sizeof err;
        if (poll(&pfd, 1, h->timeout_ms) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
            close(fd);
            return fl_errf(e, "connect to %s: %s", h->t.hostport,
                           err ? strerror(err) : "timed out");
        }
    } else if (rc != 0) {
        int err = errno;
        close(fd);
        return fl_errf(e, "connect to %s: %s", h->t.hostport, strerror(err));
    }
    int flags = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &flags, sizeof flags);
    h->fd = fd;
    return 0;
}

/* Waits until fd is ready for ev, within the timeout. */
static int wait_fd(fl_http *h, short ev) {
    struct pollfd pfd = { h->fd, ev, 0 };
    int rc;
    do rc = poll(&pfd, 1, h->timeout_ms);
    while (rc < 0 && errno == EINTR);
    return rc == 1 ? 0 : -1;
}

static int fl_http_send_all(fl_http *h, const char *buf, size_t len) {
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(h->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n > 0) off += (size_t)n;
        else if (n < 0 && errno == EAGAIN) {
            if (wait_fd(h, POLLOUT)) return -1;
        } else if (!(n < 0 && errno == EINTR)) {
            return -1;
        }
    }
    return 0;
}

/* Reads one response. Returns 0, 1 when the connection was closed before
 * any byte of it (a stale keep-alive connection: worth one retry), -1. */
static int read_response(fl_http *h, fl_err *e) {
    char buf[16384];
    fl_resp_reset(&h->resp);
    for (;;) {
        ssize_t n = recv(h->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EAGAIN) {
            if (wait_fd(h, POLLIN)) return fl_errf(e, "%s: no answer within %d ms", h->t.hostport,
                                                   h->timeout_ms);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (!fl_resp_started(&h->resp)) return 1;
            if (n == 0 && fl_resp_eof(&h->resp) == FL_RESP_DONE) return 0;
            return fl_errf(e, "%s: connection lost mid-answer", h->t.hostport);
        }
        size_t used;
        int rc = fl_resp_feed(&h->resp, buf, (size_t)n, &used);
        if (rc == FL_RESP_ERROR)
            return fl_errf(e, "%s: bad answer: %s", h->t.hostport, h->resp.error);
        if (rc == FL_RESP_DONE) return 0;
    }
}

int fl_http_request(fl_http *h, const char *method, const char *path, const char *body,
                    fl_err *e) {
    size_t blen = body ? strlen(body) : 0;
    size_t cap = strlen(path) + sizeof h->t.hostport + sizeof h->token + blen + 256;
    char *req = malloc(cap);
    if (!req) return fl_errf(e, "out of memory");
    char auth[300] = "";
    if (h->token[0]) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", h->token);
    int n = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: %s\r\n%s", method, path, h->t.hostport,
                     auth);
    if (body)
        n += snprintf(req + n, cap - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    n += snprintf(req + n, cap - (size_t)n, "\r\n");
    if (body) memcpy(req + n, body, blen);
    size_t len = (size_t)n + blen;
    int rc = -1;
    h->resp.no_body = !strcmp(method, "HEAD");
    for (int attempt = 0; attempt < 2; attempt++) {
        if (h->fd < 0 && connect_timeout(h, e)) break;
        if (fl_http_send_all(h, req, len) == 0) {
            rc = read_response(h, e);
            if (rc == 0) break;
        }
        close(h->fd);
        h->fd = -1;
        if (rc < 0) break;         /* a real failure, not a stale connection */
        rc = -1;
        fl_errf(e, "%s: connection closed before the answer", h->t.hostport);
    }
    free(req);
    if (rc != 0) return -1;
    if (!h->resp.keep_alive) {
        close(h->fd);
        h->fd = -1;
    }
    return h->resp.status;
}

/* ------------------------------------------------------------- API calls */

/* The service's error answer, for messages. */
static void api_error(fl_http *h, const char *what, fl_err *e) {
    char code[64] = "?", msg[300] = "";
    const char *b = h->resp.body ? h->resp.body : "";
    fl_json_str(b, h->resp.body_len, "error", code, sizeof code);
    fl_json_str(b, h->resp.body_len, "message", msg, sizeof msg);
    fl_errf(e, "%s: %d %s: %s", what, h->resp.status, code, msg);
}

int fl_product_create(fl_http *h, const fl_product_spec *s, fl_err *e) {
    json_t *j = json_pack("{s:s, s:s, s:I, s:i, s:I}", "sku", s->sku, "name", s->sku, "stock",
                          (json_int_t)s->stock, "segments", s->segments > 0 ? s->segments : 1,
                          "per_user_limit", (json_int_t)s->per_user_limit);
    if (!j) return fl_errf(e, "out of memory");
    if (s->strategy[0]) json_object_set_new(j, "strategy", json_string(s->strategy));
    if (s->cs_delay_ms) json_object_set_new(j, "cs_delay_ms", json_integer(s->cs_delay_ms));
    if (s->lock_ttl_ms) json_object_set_new(j, "lock_ttl_ms", json_integer(s->lock_ttl_ms));
    if (s->cs_overlap) json_object_set_new(j, "cs_overlap", json_integer(s->cs_overlap));
    if (s->hold_seconds) json_object_set_new(j, "hold_seconds", json_integer(s->hold_seconds));
    if (s->room_turn_s) {
        json_t *w = json_pack("{s:i, s:I}", "turn_seconds", s->room_turn_s, "rate",
                              (json_int_t)s->room_rate);
        if (w && s->room_opens_in_ms > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long long ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + s->room_opens_in_ms;
            char when[UTC_TIME_LEN + 1];
            utc_time_format(ms, when);
            json_object_set_new(w, "opens_at", json_string(when));
        }
        json_object_set_new(j, "waiting_room", w);
    }
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!body) return fl_errf(e, "out of memory");
    int st = fl_http_request(h, "POST", "/v1/products", body, e);
    free(body);
    if (st < 0) return -1;
    if (st != 201) {
        char what[120];
        snprintf(what, sizeof what, "creating product %s", s->sku);
        api_error(h, what, e);
        return -1;
    }
    return 0;
}

static long long jint(json_t *o, const char *k) {
    return json_integer_value(json_object_get(o, k));
}

int fl_product_get(fl_http *h, const char *sku, fl_product *p, fl_err *e) {
    char path[128];
    snprintf(path, sizeof path, "/v1/products/%s", sku);
    /* A 503 is the service's Redis mid-failover (or a rebuild), or its
     * database's (a Patroni leader's key takes its ttl, 10 s, to expire):
     * the figures come once it is back, so wait for them a while (30 s)
     * rather than end a run -- or a verdict -- on it. */
    int st = fl_http_request(h, "GET", path, NULL, e);
    for (int tries = 0; st == 503 && tries < 150; tries++) {
        usleep(200000);
        st = fl_http_request(h, "GET", path, NULL, e);
    }
    if (st < 0) return -1;
    if (st != 200) {
        api_error(h, "reading the product", e);
        return -1;
    }
    json_error_t je;
    json_t *j = json_loadb(h->resp.body ? h->resp.body : "", h->resp.body_len, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return fl_errf(e, "reading the product: not a JSON object");
    }
    memset(p, 0, sizeof *p);
    snprintf(p->sku, sizeof p->sku, "%s", sku);
    const char *strategy = json_string_value(json_object_get(j, "strategy"));
    snprintf(p->strategy, sizeof p->strategy, "%s", strategy ? strategy : "");
    p->segments = (int)jint(j, "segments");
    p->per_user_limit = jint(j, "per_user_limit");
    p->stock_initial = jint(j, "stock_initial");
    p->stock_available = jint(j, "stock_available");
    p->sold = jint(j, "sold");
    p->hold_seconds = (int)jint(j, "hold_seconds");
    p->held = jint(j, "held");
    json_t *segs = json_object_get(j, "segment_available");
    p->min_segment = p->stock_available;
    for (size_t i = 0; i < json_array_size(segs); i++) {
        long long v = json_integer_value(json_array_get(segs, i));
        if (i == 0 || v < p->min_segment) p->min_segment = v;
    }
    json_decref(j);
    return 0;
}

long fl_orders_each(fl_http *h, const char *sku, fl_row_fn fn, void *ud, fl_err *e) {
    char after[40] = "";
    long total = 0;
    for (int page = 0; page < 1000000; page++) {
        char path[200];
        snprintf(path, sizeof path, "/v1/orders?sku=%s&limit=1000%s%s", sku,
                 after[0] ? "&after=" : "", after);
        int st = fl_http_request(h, "GET", path, NULL, e);
        if (st < 0) return -1;
        if (st != 200) {
            api_error(h, "listing orders", e);
            return -1;
        }
        json_error_t je;
        json_t *j = json_loadb(h->resp.body ? h->resp.body : "", h->resp.body_len, 0, &je);
        json_t *orders = json_object_get(j, "orders");
        if (!json_is_array(orders)) {
            json_decref(j);
            return fl_errf(e, "listing orders: no \"orders\" array (%s)", je.text);
        }
        for (size_t i = 0; i < json_array_size(orders); i++) {
            json_t *o = json_array_get(orders, i);
            const char *id = json_string_value(json_object_get(o, "order_id"));
            const char *user = json_string_value(json_object_get(o, "user_id"));
            const char *key = json_string_value(json_object_get(o, "idempotency_key"));
            const char *state = json_string_value(json_object_get(o, "status"));
            fn(id ? id : "", user ? user : "", (int)jint(o, "quantity"), key ? key : "",
               state ? state : "", ud);
            total++;
        }
        const char *next = json_string_value(json_object_get(j, "next"));
        snprintf(after, sizeof after, "%s", next ? next : "");
        json_decref(j);
        if (!after[0]) return total;
    }
    return fl_errf(e, "listing orders: too many pages");
}

/* ------------------------------------------------------------ strategies */

int fl_strategies_get(fl_http *h, fl_strategy *out, int max, fl_err *e) {
    int st = fl_http_request(h, "GET", "/v1/strategies", NULL, e);
    if (st < 0) return -1;
    if (st != 200) {
        api_error(h, "listing the strategies", e);
        return -1;
    }
    json_error_t je;
    json_t *j = json_loadb(h->resp.body ? h->resp.body : "", h->resp.body_len, 0, &je);
    json_t *list = json_object_get(j, "strategies");
    if (!json_is_array(list)) {
        json_decref(j);
        return fl_errf(e, "listing the strategies: no \"strategies\" array");
    }
    int n = 0;
    for (size_t i = 0; i < json_array_size(list) && n < max; i++) {
        json_t *s = json_array_get(list, i);
        const char *name = json_string_value(json_object_get(s, "name"));
        if (!name || strlen(name) >= sizeof out[n].name) continue;
        fl_strategy *o = &out[n++];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", name);
        o->safe = json_is_true(json_object_get(s, "safe"));
        o->segments = json_is_true(json_object_get(s, "segments"));
        /* Absent means available: a service that cannot tell runs them all. */
        o->available = !json_is_false(json_object_get(s, "available"));
        const char *reason = json_string_value(json_object_get(s, "unavailable_reason"));
        snprintf(o->reason, sizeof o->reason, "%s", reason ? reason : "");
        json_t *needs = json_object_get(s, "needs");
        for (size_t k = 0; k < json_array_size(needs); k++) {
            const char *need = json_string_value(json_array_get(needs, k));
            if (need && !strcmp(need, "redis")) o->in_redis = 1;
        }
    }
    json_decref(j);
    return n;
}

const fl_strategy *fl_strategy_find(const fl_strategy *s, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

int fl_strategy_lookup(fl_http *h, const char *name, fl_strategy *out, fl_err *e) {
    fl_strategy all[FL_MAX_STRATEGIES];
    int n = fl_strategies_get(h, all, FL_MAX_STRATEGIES, e);
    if (n < 0) return -1;
    const fl_strategy *s = fl_strategy_find(all, n, name);
    if (!s) return fl_errf(e, "the service lists no strategy '%s'", name);
    *out = *s;
    return 0;
}
