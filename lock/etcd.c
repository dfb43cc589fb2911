/* etcd.c: the etcd backend (etcd://host:port[,host:port...][/prefix]):
 * etcd's own lock recipe (the one behind its concurrency.Mutex, the v3lock
 * service and `etcdctl lock`) spoken to etcd's v3 JSON gateway over HTTP
 * with libcurl and jansson -- Debian packages no C client for etcd v3.
 * lock.h documents the format on the server; this file is the how.
 *
 * One acquire: grant a lease of the ttl (whole seconds, at least etcd's
 * minimum), then one transaction creates <prefix><name>/<lease hex> with
 * that lease if absent (create_revision == 0) and reads the first key
 * under <prefix><name>/ by create revision. If that is ours, we hold the
 * lock; else we look for the key created just before ours (max create
 * revision = ours - 1) and watch only that one for its deletion, then look
 * again. The token is our key's create revision. While waiting, our lease
 * is kept alive every ttl/3 (the wait is cut in such slices); once held,
 * the client's watchdog keeps it alive (lock_options.watchdog), exactly
 * as it renews a Redis lease. Giving up revokes the lease, which deletes
 * the key; a release deletes the key in a transaction that checks it is
 * still ours (same create revision), then revokes the lease.
 *
 * HTTP. Every request is a POST of one JSON object with a deadline of
 * timeout_ms (curl's own timeouts); watches are streams of JSON lines read
 * until the event we wait for, the deadline or the next keepalive. Easy
 * handles (and their keep-alive connections) are pooled. Several
 * endpoints are tried in turn when one refuses connections. */
#include "lock/lock_int.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"

#define ETCD_MAX_ENDPOINTS 8
#define ETCD_PREFIX_MAX 400
#define ETCD_BODY_MAX (8 << 20)    /* a reply larger than this is refused */
#define ETCD_POOL_MAX 64           /* idle easy handles kept */
#define ETCD_INCARNATION "%incarnation"   /* the cluster's: lock.h, INCARNATIONS */
#define ETCD_CREATE_TRIES 3        /* a create that found no incarnation makes one, tries again */

typedef struct etcd_backend {
    lock_client *c;
    char endpoints[ETCD_MAX_ENDPOINTS][200];   /* "http://host:port" */
    int nendpoints;
    atomic_int current;           /* the endpoint that last answered */
    char prefix[ETCD_PREFIX_MAX]; /* "" or "locks/" */
    char desc[ETCD_MAX_ENDPOINTS * 200 + ETCD_PREFIX_MAX];
    char value[200];              /* what each key holds: who made it */
    int timeout_ms;
    struct curl_slist *headers;
    pthread_mutex_t mu;           /* the pool */
    CURL **idle;
    int nidle;
} etcd_backend;

/* One hold: the key, its lease and its create revision (the token). */
typedef struct etcd_hold {
    lock_hold base;
    int64_t lease;
    int64_t rev;
    int64_t ttl_s;
    char key[];                   /* <prefix><name>/<lease hex> */
} etcd_hold;


/* ----------------------------------------------------------------- base64 */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* A new NUL-terminated base64 of n bytes, or NULL. */
static char *b64_encode(const char *s, size_t n) {
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* Decodes the base64 string s into out (at most cap bytes). Returns the
 * length, or -1 when s is not base64 or does not fit. */
static long b64_decode(const char *s, char *out, size_t cap) {
    size_t n = 0;
    unsigned v = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *p = strchr(b64, *s);
        if (!p) return -1;
        v = v << 6 | (unsigned)(p - b64);
        if ((bits += 6) >= 8) {
            bits -= 8;
            if (n == cap) return -1;
            out[n++] = (char)(v >> bits & 0xff);
        }
    }
    return (long)n;
}

/* ------------------------------------------------------------------- JSON */

/* An int64 field, which the gateway writes as a string (absent = 0, the
 * proto3 default it leaves out). */
static int64_t jint(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    if (json_is_integer(v)) return (int64_t)json_integer_value(v);
    if (json_is_string(v)) return strtoll(json_string_value(v), NULL, 10);
    return 0;
}

static json_t *jstr64(int64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%" PRId64, v);
    return json_string(b);
}

/* A base64 JSON string of n bytes of s (or of the C string s, n = -1). */
static json_t *jbytes(const char *s, long n) {
    char *e = b64_encode(s, n < 0 ? strlen(s) : (size_t)n);
    json_t *j = e ? json_string(e) : NULL;
    free(e);
    return j;
}

/* The first key-value of a range response (NULL if none). */
static const json_t *first_kv(const json_t *range) {
    return json_array_get(json_object_get(range, "kvs"), 0);
}

/* ------------------------------------------------------------------- HTTP */

typedef struct body {
    char *p;
    size_t n, cap;
    int overflow;
} body;

static size_t body_add(body *b, const char *data, size_t n) {
    if (b->n + n + 1 > ETCD_BODY_MAX) {
        b->overflow = 1;
        return 0;                 /* aborts the transfer */
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = '\0';
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud) {
    return body_add(ud, data, size * nmemb);
}

static long ms_until(int64_t until_us);

/* A command run by flashlock (fork + exec) must not inherit our sockets. */
static int on_socket(void *ud, curl_socket_t fd, curlsocktype purpose) {
    (void)ud;
    (void)purpose;
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    return CURL_SOCKOPT_OK;
}

/* Sets h up to POST json to url, until until_us at most, each piece of the
 * reply going to fn(..., ud): the options every request shares. */
static void handle_setup(etcd_backend *b, CURL *h, const char *url, const char *json,
                         int64_t until_us, curl_write_callback fn, void *ud) {
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fn);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, ud);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, b->headers);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, on_socket);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms_until(until_us));
    long ct = ms_until(until_us);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ct < b->timeout_ms ? ct : (long)b->timeout_ms);
}

static CURL *handle_get(etcd_backend *b) {
    lock_mu_take(&b->mu, LOCK_RANK_BACKEND);
    CURL *h = b->nidle > 0 ? b->idle[--b->nidle] : NULL;
    lock_mu_drop(&b->mu, LOCK_RANK_BACKEND);
    if (h) curl_easy_reset(h);    /* keeps its connection */
    else h = curl_easy_init();
    return h;
}

static void handle_put(etcd_backend *b, CURL *h) {
    lock_mu_take(&b->mu, LOCK_RANK_BACKEND);
    if (b->nidle < ETCD_POOL_MAX) {
        b->idle[b->nidle++] = h;
        h = NULL;
    }
    lock_mu_drop(&b->mu, LOCK_RANK_BACKEND);
    if (h) curl_easy_cleanup(h);
}

/* A request's start: req (consumed) as JSON in *json (the caller frees it)
 * and a handle for it. Returns the handle, or NULL (err: out of memory;
 * *json NULL). */
static CURL *request_start(etcd_backend *b, json_t *req, char **json, char *err, size_t errlen) {
    *json = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    CURL *h = *json ? handle_get(b) : NULL;
    if (!h) {
        free(*json);
        *json = NULL;
        snprintf(err, errlen, "out of memory");
    }
    return h;
}

/* Milliseconds from now until until_us, at least 1. */
static long ms_until(int64_t until_us) {
    int64_t ms = (until_us - clock_mono_us() + 999) / 1000;
    return ms < 1 ? 1 : (long)ms;
}

/* POSTs req (consumed) to path on an endpoint, until until_us at most.
 * Returns 0 with the reply object in *out (the "result" of a streamed
 * reply), -1 on I/O (err), or -2 when etcd answered with an error (err;
 * *grpc_code set, if given). */
static int post(etcd_backend *b, const char *path, json_t *req, int64_t until_us, json_t **out,
                int *grpc_code, char *err, size_t errlen) {
    *out = NULL;
    char *json;
    CURL *h = request_start(b, req, &json, err, errlen);
    if (!h) return -1;
    body bd = { 0 };
    CURLcode cc = CURLE_COULDNT_CONNECT;
    long status = 0;
    int ep = atomic_load(&b->current);
    for (int tried = 0; tried < b->nendpoints && cc == CURLE_COULDNT_CONNECT; tried++) {
        char url[300];
        if (clock_mono_us() >= until_us) {
            cc = CURLE_OPERATION_TIMEDOUT;
            break;
        }
        snprintf(url, sizeof url, "%s%s", b->endpoints[(ep + tried) % b->nendpoints], path);
        bd.n = 0;
        bd.overflow = 0;
        handle_setup(b, h, url, json, until_us, on_body, &bd);
        cc = curl_easy_perform(h);
        if (cc == CURLE_OK) atomic_store(&b->current, (ep + tried) % b->nendpoints);
    }
    if (cc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    handle_put(b, h);
    free(json);
    if (cc != CURLE_OK) {
        snprintf(err, errlen, "%s: %s%s", b->desc, curl_easy_strerror(cc),
                 bd.overflow ? " (reply too large)" : "");
        free(bd.p);
        return -1;
    }
    json_error_t je;
    json_t *r = bd.p ? json_loadb(bd.p, bd.n, 0, &je) : NULL;
    if (!json_is_object(r)) {
        snprintf(err, errlen, "%s: HTTP %ld with %s", b->desc, status,
                 bd.p ? "a reply that is not a JSON object" : "no reply");
        json_decref(r);
        free(bd.p);
        return -1;
    }
    free(bd.p);
    json_t *e = json_object_get(r, "error");
    if (e || status != 200) {
        const char *msg = json_string_value(json_object_get(r, "message"));
        if (!msg) msg = json_string_value(e);
        if (!msg && json_is_object(e)) msg = json_string_value(json_object_get(e, "message"));
        snprintf(err, errlen, "%s: %s (HTTP %ld)", b->desc, msg ? msg : "error", status);
        if (grpc_code) {
            *grpc_code = (int)jint(r, "code");
            if (!*grpc_code && json_is_object(e)) *grpc_code = (int)jint(e, "grpc_code");
        }
        json_decref(r);
        return -2;
    }
    json_t *res = json_object_get(r, "result");
    if (json_is_object(res)) {
        json_incref(res);
        json_decref(r);
        r = res;
    }
    *out = r;
    return 0;
}

/* ----------------------------------------------------------------- watch */

/* What a watch stream brought: the awaited deletion, or the end of the
 * watch by the server (cancelled, compacted): either way, look again. */
typedef struct watch_state {
    body buf;
    size_t used;                  /* bytes of buf already parsed */
    int event;
    char why[200];
} watch_state;

/* Parses the complete lines of the stream so far. Returns 1 once there is
 * reason to look again. */
static int watch_parse(watch_state *w) {
    for (;;) {
        char *nl = memchr(w->buf.p + w->used, '\n', w->buf.n - w->used);
        if (!nl) return 0;
        json_error_t je;
        json_t *m = json_loadb(w->buf.p + w->used, (size_t)(nl - w->buf.p) - w->used, 0, &je);
        w->used = (size_t)(nl - w->buf.p) + 1;
        json_t *r = json_object_get(m, "result");
        int again = 0;
        if (!json_is_object(r)) {
            snprintf(w->why, sizeof w->why, "watch stream: %s", m ? "error" : "not JSON");
            again = 1;
        } else if (json_is_true(json_object_get(r, "canceled")) || jint(r, "compact_revision")) {
            snprintf(w->why, sizeof w->why, "watch cancelled");
            again = 1;
        } else {
            json_t *ev;
            size_t i;
            json_array_foreach(json_object_get(r, "events"), i, ev) {
                const char *t = json_string_value(json_object_get(ev, "type"));
                if (t && !strcmp(t, "DELETE")) again = 1;
            }
        }
        json_decref(m);
        if (again) return 1;
    }
}

static size_t on_watch(char *data, size_t size, size_t nmemb, void *ud) {
    watch_state *w = ud;
    size_t n = size * nmemb;
    if (body_add(&w->buf, data, n) != n) return 0;
    if (watch_parse(w)) {
        w->event = 1;
        return 0;                 /* enough: end the stream */
    }
    if (w->used > 65536) {        /* drop what was parsed */
        memmove(w->buf.p, w->buf.p + w->used, w->buf.n - w->used);
        w->buf.n -= w->used;
        w->used = 0;
    }
    return n;
}

/* Watches key (base64) from revision from for a deletion, until until_us.
 * Returns 1 (deleted, or the watch ended: look again), 0 (until_us came)
 * or -1 (err). */
static int watch_delete(etcd_backend *b, const char *key64, int64_t from, int64_t until_us,
                        char *err, size_t errlen) {
    json_t *req = json_pack("{s:{s:s,s:o}}", "create_request", "key", key64, "start_revision",
                            jstr64(from));
    char *json;
    CURL *h = request_start(b, req, &json, err, errlen);
    if (!h) return -1;
    watch_state w = { 0 };
    char url[300];
    snprintf(url, sizeof url, "%s/v3/watch", b->endpoints[atomic_load(&b->current)]);
    handle_setup(b, h, url, json, until_us, on_watch, &w);
    CURLcode cc = curl_easy_perform(h);
    /* A stream cut short keeps nothing worth reusing. */
    curl_easy_cleanup(h);
    free(json);
    free(w.buf.p);
    if (w.event) return 1;
    if (cc == CURLE_OPERATION_TIMEDOUT && clock_mono_us() >= until_us - 1000) return 0;
    snprintf(err, errlen, "%s: watch: %s", b->desc,
             cc == CURLE_OK ? "the stream ended" : curl_easy_strerror(cc));
    return -1;
}

/* ----------------------------------------------------------------- leases */

/* Grants a lease of ttl_s seconds. Returns 0 (*id, *granted_s), or -1. */
static int lease_grant(etcd_backend *b, int64_t ttl_s, int64_t *id, int64_t *granted_s,
                       char *err, size_t errlen) {
    json_t *r;
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    if (post(b, "/v3/lease/grant", json_pack("{s:o}", "TTL", jstr64(ttl_s)), until, &r, NULL,
             err, errlen))
        return -1;
    *id = jint(r, "ID");
    *granted_s = jint(r, "TTL");
    json_decref(r);
    if (*id <= 0 || *granted_s <= 0) {
        snprintf(err, errlen, "%s: lease grant answered without a lease", b->desc);
        return -1;
    }
    return 0;
}

/* Keeps lease id alive once. Returns 1 (alive), 0 (gone: expired or
 * revoked) or -1 (err). */
static int lease_keepalive(etcd_backend *b, int64_t id, char *err, size_t errlen) {
    json_t *r;
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    if (post(b, "/v3/lease/keepalive", json_pack("{s:o}", "ID", jstr64(id)), until, &r, NULL, err,
             errlen))
        return -1;
    int alive = jint(r, "TTL") > 0;
    json_decref(r);
    if (!alive) snprintf(err, errlen, "%s: lease %" PRIx64 " is gone", b->desc, (uint64_t)id);
    return alive;
}

/* Revokes lease id, deleting its keys (best effort; a lease already gone
 * counts as revoked). Returns 0 or -1. */
static int lease_revoke(etcd_backend *b, int64_t id) {
    json_t *r;
    char err[300];
    int code = 0;
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    int rc = post(b, "/v3/lease/revoke", json_pack("{s:o}", "ID", jstr64(id)), until, &r, &code,
                  err, sizeof err);
    json_decref(r);
    return rc == 0 || (rc == -2 && code == 5) ? 0 : -1;   /* 5: NotFound */
}

/* ------------------------------------------------------------------ locks */

/* A range request over the name's keys: "<prefix><name>/" up to (not
 * including) "<prefix><name>0". */
static json_t *range_of(const char *pfx, size_t pl, const char *order, int64_t max_rev) {
    char *end = malloc(pl + 1);
    if (!end) return NULL;
    memcpy(end, pfx, pl);
    end[pl - 1] = '0';            /* '/' + 1 */
    end[pl] = '\0';
    json_t *r = json_pack("{s:o,s:o,s:s,s:s,s:s}", "key", jbytes(pfx, (long)pl), "range_end",
                          jbytes(end, (long)pl), "sort_order", order, "sort_target", "CREATE",
                          "limit", "1");
    free(end);
    if (r && max_rev > 0) json_object_set_new(r, "max_create_revision", jstr64(max_rev));
    return r;
}

/* The incarnation in a range response of the incarnation key: its id, or 0
 * when there is no such key (or it holds something else). */
static uint64_t incarnation_of(const json_t *range) {
    const json_t *kv = first_kv(range);
    const char *v64 = kv ? json_string_value(json_object_get(kv, "value")) : NULL;
    char v[32];
    long n = v64 ? b64_decode(v64, v, sizeof v) : -1;
    return n > 0 ? lock_incarnation_parse(v, (size_t)n) : 0;
}

/* Stores a new incarnation if the cluster has none (a txn: only if absent,
 * so of two at once one wins). Returns 0 or -1 (err). */
static int make_incarnation(etcd_backend *b, char *err, size_t errlen) {
    char hex[17];
    uint64_t id = lock_incarnation_new();
    if (!id) {
        snprintf(err, errlen, "getrandom failed");
        return -1;
    }
    lock_incarnation_hex(id, hex);
    json_t *r, *key = jbytes(ETCD_INCARNATION, -1);
    json_t *req = json_pack("{s:[{s:O,s:s,s:s,s:s}],s:[{s:{s:O,s:o}}]}", "compare", "key", key,
                            "result", "EQUAL", "target", "CREATE", "create_revision", "0",
                            "success", "request_put", "key", key, "value", jbytes(hex, -1));
    json_decref(key);
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    if (!req) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (post(b, "/v3/kv/txn", req, until, &r, NULL, err, errlen)) return -1;
    json_decref(r);
    return 0;
}

/* The first txn: our key, created only if absent and only if the cluster
 * has an incarnation, with the lease; then the first key of the name and
 * the incarnation, read in the same txn as the create, so that the token
 * (our key's create revision) and *inc are of the same data. Returns 1
 * (ours is first), 0 (not first; *rev set), -2 (no incarnation: nothing
 * created), -1 (err). */
static int create_key(etcd_backend *b, const etcd_hold *h, size_t pl, int64_t *rev,
                      uint64_t *inc, char *err, size_t errlen) {
    json_t *r, *key = jbytes(h->key, -1), *ikey = jbytes(ETCD_INCARNATION, -1);
    json_t *owner = range_of(h->key, pl, "ASCEND", 0);
    json_t *req = json_pack(
        "{s:[{s:O,s:s,s:s,s:s},{s:O,s:s,s:s,s:s}],"
        "s:[{s:{s:O,s:o,s:o}},{s:O},{s:{s:O}}],s:[{s:{s:O}},{s:O},{s:{s:O}}]}",
        "compare", "key", key, "result", "EQUAL", "target", "CREATE", "create_revision", "0",
        "key", ikey, "result", "GREATER", "target", "CREATE", "create_revision", "0",
        "success", "request_put", "key", key, "value", jbytes(b->value, -1), "lease",
        jstr64(h->lease), "request_range", owner, "request_range", "key", ikey,
        "failure", "request_range", "key", key, "request_range", owner, "request_range", "key",
        ikey);
    json_decref(key);
    json_decref(ikey);
    json_decref(owner);
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    if (!req) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (post(b, "/v3/kv/txn", req, until, &r, NULL, err, errlen)) return -1;
    json_t *rs = json_object_get(r, "responses");
    *inc = incarnation_of(json_object_get(json_array_get(rs, 2), "response_range"));
    if (!*inc) {
        json_decref(r);
        return -2;
    }
    if (json_is_true(json_object_get(r, "succeeded")))
        *rev = jint(json_object_get(r, "header"), "revision");
    else
        *rev = jint(first_kv(json_object_get(json_array_get(rs, 0), "response_range")),
                    "create_revision");
    const json_t *first =
        first_kv(json_object_get(json_array_get(rs, 1), "response_range"));
    int64_t first_rev = first ? jint(first, "create_revision") : 0;
    json_decref(r);
    if (*rev <= 0) {
        snprintf(err, errlen, "%s: the create transaction gave no revision", b->desc);
        return -1;
    }
    return !first || first_rev == *rev;
}

/* Looks for the key created just before ours, and checks ours is there.
 * Returns 1 (none before: ours holds), 0 (*pred64 = its key in base64,
 * *seen = the revision of this look), -1 (err). */
static int find_pred(etcd_backend *b, const etcd_hold *h, size_t pl, char **pred64,
                     int64_t *seen, char *err, size_t errlen) {
    json_t *r;
    json_t *req = json_pack("{s:[{s:o},{s:{s:o}}]}", "success", "request_range",
                            range_of(h->key, pl, "DESCEND", h->rev - 1), "request_range", "key",
                            jbytes(h->key, -1));
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    if (!req) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (post(b, "/v3/kv/txn", req, until, &r, NULL, err, errlen)) return -1;
    json_t *rs = json_object_get(r, "responses");
    const json_t *pred = first_kv(json_object_get(json_array_get(rs, 0), "response_range"));
    const json_t *own = first_kv(json_object_get(json_array_get(rs, 1), "response_range"));
    int rc = 1;
    if (!own || jint(own, "create_revision") != h->rev) {
        snprintf(err, errlen, "%s: our key %s vanished while waiting (lease expired?)", b->desc,
                 h->key);
        rc = -1;
    } else if (pred) {
        const char *k = json_string_value(json_object_get(pred, "key"));
        *pred64 = k ? strdup(k) : NULL;
        *seen = jint(json_object_get(r, "header"), "revision");
        rc = *pred64 ? 0 : -1;
        if (rc) snprintf(err, errlen, "%s: a key without a name", b->desc);
    }
    json_decref(r);
    return rc;
}

static etcd_hold *hold_new(etcd_backend *b, const char *name, int64_t lease) {
    size_t n = strlen(b->prefix) + strlen(name) + 1 + 16 + 1;
    etcd_hold *h = calloc(1, sizeof *h + n);
    if (!h) return NULL;
    h->base.be = &lock_backend_etcd;
    h->lease = lease;
    snprintf(h->key, n, "%s%s/%" PRIx64, b->prefix, name, (uint64_t)lease);
    return h;
}

/* Waits for our turn: watch the key before ours, in slices that end in
 * time to keep our lease alive. Returns LOCK_OK, LOCK_BUSY or LOCK_ERROR;
 * *gone = 1 with LOCK_ERROR when our lease expired while we waited (a
 * keepalive late past a short ttl on a busy host: etcd answered, so the
 * server is not what failed, and the caller may queue again). */
static lock_status wait_turn(etcd_backend *b, etcd_hold *h, size_t pl, int64_t *lease_start,
                             int64_t deadline_us, int *gone, char *err, size_t errlen) {
    *gone = 0;
    for (;;) {
        char *pred = NULL;
        int64_t seen = 0;
        int rc = find_pred(b, h, pl, &pred, &seen, err, errlen);
        if (rc != 0) return rc == 1 ? LOCK_OK : LOCK_ERROR;
        for (;;) {
            int64_t now = clock_mono_us();
            if (now >= deadline_us) {
                free(pred);
                return LOCK_BUSY;
            }
            int64_t renew_at = *lease_start + h->ttl_s * 1000000 / 3;
            if (now >= renew_at) {
                int64_t sent = clock_mono_us();
                int alive = lease_keepalive(b, h->lease, err, errlen);
                if (alive != 1) {
                    *gone = alive == 0;
                    free(pred);
                    return LOCK_ERROR;
                }
                *lease_start = sent;
                continue;
            }
            int64_t until = deadline_us < renew_at ? deadline_us : renew_at;
            int w = watch_delete(b, pred, seen + 1, until, err, errlen);
            if (w < 0) {
                free(pred);
                return LOCK_ERROR;
            }
            if (w == 1) break;    /* look again */
        }
        free(pred);
    }
}

/* One place in the queue: a lease, our key under it, and the wait for the
 * keys before ours. Returns as wait_turn (*gone likewise); on LOCK_OK *out
 * is filled, else nothing is left behind. */
static lock_status queue_once(etcd_backend *b, const char *name, int64_t ttl_ms,
                              int64_t deadline_us, lock_took *out, lock_errcode *code,
                              int *gone, char *err, size_t errlen) {
    int64_t lease, granted;
    *gone = 0;
    int64_t start = clock_mono_us();
    if (lease_grant(b, (ttl_ms + 999) / 1000, &lease, &granted, err, errlen)) return LOCK_ERROR;
    etcd_hold *h = hold_new(b, name, lease);
    if (!h) {
        lease_revoke(b, lease);
        *code = LOCK_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    h->ttl_s = granted;
    size_t pl = strlen(b->prefix) + strlen(name) + 1;   /* "<prefix><name>/" */
    uint64_t inc = 0;
    int first = -2;
    for (int tries = 0; first == -2 && tries < ETCD_CREATE_TRIES; tries++) {
        first = create_key(b, h, pl, &h->rev, &inc, err, errlen);
        if (first == -2 && make_incarnation(b, err, errlen)) first = -1;
    }
    if (first == -2) snprintf(err, errlen, "%s: the incarnation key %s keeps vanishing", b->desc,
                              ETCD_INCARNATION);
    lock_status st = first < 0 ? LOCK_ERROR : first ? LOCK_OK : LOCK_BUSY;
    if (st == LOCK_BUSY && clock_mono_us() < deadline_us)
        st = wait_turn(b, h, pl, &start, deadline_us, gone, err, errlen);
    if (st != LOCK_OK) {
        lease_revoke(b, lease);   /* deletes our key: nothing left behind */
        free(h);
        return st;
    }
    out->hold = &h->base;
    out->fence = (uint64_t)h->rev;
    out->incarnation = inc;
    out->start_us = start;
    out->ttl_ms = granted * 1000;
    out->lease_src = NULL;
    return LOCK_OK;
}

/* A waiter whose lease expired queues again at the back, a bounded number
 * of times, while its deadline lasts. */
#define ETCD_REQUEUES 3

static lock_status etcd_acquire(lock_client *c, const char *name, int64_t ttl_ms,
                                int64_t deadline_us, lock_took *out, lock_errcode *code,
                                char *err, size_t errlen) {
    etcd_backend *b = c->bstate;
    *code = LOCK_ERR_IO;
    atomic_fetch_add(&c->st.attempts, 1);
    lock_status st;
    int gone = 0;
    for (int i = 0;; i++) {
        st = queue_once(b, name, ttl_ms, deadline_us, out, code, &gone, err, errlen);
        if (!gone || i == ETCD_REQUEUES || clock_mono_us() >= deadline_us) break;
    }
    if (gone && st == LOCK_ERROR && clock_mono_us() >= deadline_us) st = LOCK_BUSY;
    return st;
}

/* Renewal and reentry: keep the lease alive, then check the key is ours. */
static lock_check check_one(etcd_backend *b, lock_hold *base, int64_t *start_us, char *err,
                            size_t errlen) {
    etcd_hold *h = (etcd_hold *)base;
    int64_t sent = clock_mono_us();
    int alive = lease_keepalive(b, h->lease, err, errlen);
    if (alive != 1) return alive == 0 ? LOCK_CHECK_GONE : LOCK_CHECK_UNKNOWN;
    json_t *r;
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    if (post(b, "/v3/kv/range", json_pack("{s:o}", "key", jbytes(h->key, -1)), until, &r, NULL,
             err, errlen))
        return LOCK_CHECK_UNKNOWN;
    const json_t *kv = first_kv(r);
    int ours = kv && jint(kv, "create_revision") == h->rev;
    json_decref(r);
    if (!ours) {
        snprintf(err, errlen, "%.150s: our key %.200s is gone", b->desc, h->key);
        return LOCK_CHECK_GONE;
    }
    *start_us = sent;
    return LOCK_CHECK_OURS;
}

static void etcd_check(lock_client *c, lock_checking *each, int n) {
    for (int i = 0; i < n; i++) {
        each[i].why[0] = '\0';
        each[i].start_us = -1;
        each[i].code = LOCK_ERR_IO;
        each[i].outcome = check_one(c->bstate, each[i].hold, &each[i].start_us, each[i].why,
                                    sizeof each[i].why);
    }
}

static lock_release_result etcd_release(lock_client *c, lock_hold *base, char *err,
                                        size_t errlen) {
    etcd_backend *b = c->bstate;
    etcd_hold *h = (etcd_hold *)base;
    json_t *r, *key = jbytes(h->key, -1);
    json_t *req = json_pack("{s:[{s:O,s:s,s:s,s:o}],s:[{s:{s:O}}]}", "compare", "key", key,
                            "result", "EQUAL", "target", "CREATE", "create_revision",
                            jstr64(h->rev), "success", "request_delete_range", "key", key);
    json_decref(key);
    int64_t until = clock_mono_us() + (int64_t)b->timeout_ms * 1000;
    lock_release_result res = LOCK_UNKNOWN;
    if (!req) {
        snprintf(err, errlen, "out of memory");
    } else if (post(b, "/v3/kv/txn", req, until, &r, NULL, err, errlen) == 0) {
        res = json_is_true(json_object_get(r, "succeeded")) ? LOCK_RELEASED : LOCK_NOT_OWNER;
        if (res == LOCK_NOT_OWNER)
            snprintf(err, errlen, "%s: our key %s is gone (lease expired?)", b->desc, h->key);
        json_decref(r);
    }
    lease_revoke(b, h->lease);
    return res;
}

static void etcd_hold_free(lock_hold *h) { free(h); }

static void etcd_stop(lock_client *c) { (void)c; }

static void etcd_destroy(lock_client *c) {
    etcd_backend *b = c->bstate;
    if (!b) return;
    for (int i = 0; i < b->nidle; i++) curl_easy_cleanup(b->idle[i]);
    free(b->idle);
    curl_slist_free_all(b->headers);
    pthread_mutex_destroy(&b->mu);
    free(b);
    c->bstate = NULL;
}

static int etcd_open(lock_client *c, const lock_options *o, char *err, size_t errlen);

const lock_backend lock_backend_etcd = {
    .name = "etcd",
    .kind = "etcd (etcd://)",
    .scheme = "etcd://",
    .max_urls = 1,
    .urls_hint = "",
    .watchdog_renews = 1,
    .rearms = 0,
    .open = etcd_open,
    .acquire = etcd_acquire,
    .check = etcd_check,
    .release = etcd_release,
    .held = NULL,
    .hold_free = etcd_hold_free,
    .stats = NULL,
    .stop = etcd_stop,
    .destroy = etcd_destroy,
};

/* ------------------------------------------------------------------ setup */

static CURLcode curl_init_rc;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* Splits "etcd://h:p[,h:p...][/prefix]" into endpoints and prefix. */
static int parse_url(etcd_backend *b, const char *url, char *err, size_t errlen) {
    const char *h = url + 7;      /* after "etcd://" */
    const char *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    const char *p = h;
    while (p < h + hl) {
        const char *end = memchr(p, ',', (size_t)(h + hl - p));
        size_t n = end ? (size_t)(end - p) : (size_t)(h + hl - p);
        const char *colon = n ? memrchr(p, ':', n) : NULL;
        if (!colon || colon == p || colon + 1 == p + n || b->nendpoints == ETCD_MAX_ENDPOINTS ||
            n > 150 || strspn(colon + 1, "0123456789") < (size_t)(p + n - colon - 1)) {
            snprintf(err, errlen, "lock: etcd:// server '%.*s' is not host:port (at most %d)",
                     (int)(n > 100 ? 100 : n), p, ETCD_MAX_ENDPOINTS);
            return -1;
        }
        snprintf(b->endpoints[b->nendpoints++], sizeof b->endpoints[0], "http://%.*s", (int)n, p);
        p += n + (end ? 1 : 0);
        if (end && p == h + hl) b->nendpoints = 0;   /* a trailing comma */
    }
    if (b->nendpoints == 0) {
        snprintf(err, errlen, "lock: etcd:// URL needs host:port[,host:port...]: '%.100s'", url);
        return -1;
    }
    const char *pfx = slash ? slash + 1 : "";
    size_t n = strlen(pfx);
    while (n && pfx[n - 1] == '/') n--;
    if (n + 2 > sizeof b->prefix) {
        snprintf(err, errlen, "lock: etcd:// prefix too long");
        return -1;
    }
    snprintf(b->prefix, sizeof b->prefix, "%.*s%s", (int)n, pfx, n ? "/" : "");
    return 0;
}

/* One etcd:// URL: the cluster's endpoints and a key prefix. */
static int etcd_open(lock_client *c, const lock_options *o, char *err, size_t errlen) {
    const char *url = o->urls[0];
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        snprintf(err, errlen, "lock: libcurl: %s", curl_easy_strerror(curl_init_rc));
        return -1;
    }
    etcd_backend *b = calloc(1, sizeof *b);
    if (!b || !(b->idle = calloc(ETCD_POOL_MAX, sizeof *b->idle))) {
        free(b);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (parse_url(b, url, err, errlen)) {
        free(b->idle);
        free(b);
        return -1;
    }
    if (!(b->headers = curl_slist_append(NULL, "Content-Type: application/json"))) {
        snprintf(err, errlen, "out of memory");
        free(b->idle);
        free(b);
        return -1;
    }
    char host[100] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(b->value, sizeof b->value, "flashsale-lock host=%s pid=%ld", host, (long)getpid());
    size_t d = (size_t)snprintf(b->desc, sizeof b->desc, "etcd");
    for (int i = 0; i < b->nendpoints && d < sizeof b->desc; i++)
        d += (size_t)snprintf(b->desc + d, sizeof b->desc - d, "%s%s", i ? "," : " ",
                              b->endpoints[i] + 7);
    if (b->prefix[0] && d < sizeof b->desc)
        snprintf(b->desc + d, sizeof b->desc - d, " prefix %s", b->prefix);
    b->c = c;
    b->timeout_ms = c->timeout_ms;
    atomic_init(&b->current, 0);
    pthread_mutex_init(&b->mu, NULL);
    c->bstate = b;
    return 0;
}
