/* client.c: the lock client's plumbing: its servers and their pooled
 * connections, the embedded scripts, running one script on every server at
 * once, key names, errors and counters. lock.c builds the lock on top. */
#include "lock/lock_int.h"
#include "rtopo/rtopo.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

extern const char lock_lua_format[], lock_lua_acquire[], lock_lua_release[],
    lock_lua_extend[], lock_lua_settle[], lock_lua_fence[];

/* ------------------------------------------------------------------ scripts */

static rconn_script scripts[LOCK_S_COUNT];
static int scripts_nomem;      /* composing one failed: clients are refused */
static pthread_once_t scripts_once = PTHREAD_ONCE_INIT;

char *lock_script_compose(const char *body) {
    size_t nf = strlen(lock_lua_format), nb = strlen(body);
    char *src = malloc(nf + nb + 1);
    if (!src) return NULL;
    memcpy(src, lock_lua_format, nf);
    memcpy(src + nf, body, nb + 1);
    return src;
}

/* A script that touches the lock: format.lua's functions, then body. The
 * text lives as long as the process (the descriptor points at it). */
static void script_on_format(lock_script_id id, const char *name, const char *body) {
    char *src = lock_script_compose(body);
    if (!src) {
        scripts_nomem = 1;
        return;
    }
    rconn_script_init(&scripts[id], name, src);
}

static void scripts_init(void) {
    script_on_format(LOCK_S_ACQUIRE, "acquire", lock_lua_acquire);
    script_on_format(LOCK_S_RELEASE, "release", lock_lua_release);
    script_on_format(LOCK_S_EXTEND, "extend", lock_lua_extend);
    script_on_format(LOCK_S_SETTLE, "settle", lock_lua_settle);
    /* The fence is the protected side's, but its format (incarnations,
     * tokens) is written in format.lua too, beside the lock's. */
    script_on_format(LOCK_S_FENCE, "fence", lock_lua_fence);
}

/* Builds the scripts and their SHA1s (once per process). Returns 0, or -1
 * when out of memory. */
static int scripts_ready(void) {
    pthread_once(&scripts_once, scripts_init);
    return scripts_nomem ? -1 : 0;
}

const rconn_script *lock_script(lock_script_id id) {
    assert(id >= 0 && id < LOCK_S_COUNT);
    pthread_once(&scripts_once, scripts_init);
    assert(scripts[id].src);       /* a client exists: scripts_ready passed */
    return &scripts[id];
}

/* -------------------------------------------------------------------- names */

/* The first '{' and the first '}' after it, with something between: what
 * Redis Cluster hashes instead of the whole key. */
static int has_hash_tag(const char *name) {
    const char *open = strchr(name, '{');
    if (!open) return 0;
    const char *close = strchr(open + 1, '}');
    return close && close > open + 1;
}

int lock_keys_make(const char *name, lock_keys *k, char *err, size_t errlen) {
    char base[LOCK_NAME_MAX + 3];
    size_t n = strlen(name);
    if (n == 0 || n > LOCK_NAME_MAX) {
        snprintf(err, errlen, "lock name must be 1 to %d bytes", LOCK_NAME_MAX);
        return -1;
    }
    if (has_hash_tag(name)) {
        snprintf(base, sizeof base, "%s", name);
    } else if (!strchr(name, '{') && !strchr(name, '}')) {
        /* "{name}:x" hashes like "name": the derived keys share its slot. */
        snprintf(base, sizeof base, "{%s}", name);
    } else {
        snprintf(err, errlen, "lock name '%.60s' has braces but no {hash tag}", name);
        return -1;
    }
    k->name = name;
    snprintf(k->fence, sizeof k->fence, "%s:fence", base);
    snprintf(k->queue, sizeof k->queue, "%s:waiters", base);
    snprintf(k->wake, sizeof k->wake, "%s:wake:", base);
    snprintf(k->incarnation, sizeof k->incarnation, "%s:incarnation", base);
    return 0;
}

/* -------------------------------------------------------------------- misc */

int64_t lock_drift_us(int64_t ttl_ms) { return ttl_ms * 10 + 2000; }

void lock_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

void lock_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_us) {
    if (until_us == INT64_MAX) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts = { until_us / 1000000, (until_us % 1000000) * 1000 };
    pthread_cond_timedwait(cv, mu, &ts);
}

int lock_random(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

uint64_t lock_incarnation_new(void) {
    uint64_t id = 0;
    while (id == 0)
        if (lock_random(&id, sizeof id)) return 0;
    return id;
}

uint64_t lock_incarnation_parse(const char *s, size_t len) {
    uint64_t id = 0;
    if (!s || len != 16) return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return 0;
        id = id << 4 | (uint64_t)d;
    }
    return id;
}

void lock_incarnation_hex(uint64_t id, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)id);
}

int lock_thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void lock_nosigpipe_begin(lock_pipe_guard *g) {
    sigset_t pipe, pending;
    struct sigaction sa;
    /* Most servers ignore SIGPIPE: one query then, instead of four calls. */
    g->active = !(sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN);
    if (!g->active) return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    g->pending_before = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

void lock_nosigpipe_end(lock_pipe_guard *g) {
    sigset_t pipe, pending;
    if (!g->active) return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    if (!g->pending_before && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = { 0, 0 };
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {}
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

lock_errcode lock_set_error(lock_client *c, lock_errcode code, const char *msg) {
    pthread_mutex_lock(&c->mu);
    c->err = code;
    snprintf(c->errstr, sizeof c->errstr, "%s", msg);
    pthread_mutex_unlock(&c->mu);
    return code;
}

lock_errcode lock_client_error(lock_client *c, char *buf, size_t len) {
    pthread_mutex_lock(&c->mu);
    lock_errcode code = c->err;
    if (buf && len) snprintf(buf, len, "%s", c->errstr);
    pthread_mutex_unlock(&c->mu);
    return code;
}

void lock_client_stats(lock_client *c, lock_stats *o) {
    o->acquired = atomic_load(&c->st.acquired);
    o->busy = atomic_load(&c->st.busy);
    o->errors = atomic_load(&c->st.errors);
    o->reentered = atomic_load(&c->st.reentered);
    o->attempts = atomic_load(&c->st.attempts);
    o->wakeups = atomic_load(&c->st.wakeups);
    o->timeouts = atomic_load(&c->st.timeouts);
    o->renewals = atomic_load(&c->st.renewals);
    o->renew_errors = atomic_load(&c->st.renew_errors);
    o->lost = atomic_load(&c->st.lost);
    o->released = atomic_load(&c->st.released);
    o->not_owner = atomic_load(&c->st.not_owner);
    o->unknown = atomic_load(&c->st.unknown);
    o->keyspace_wakeups = atomic_load(&c->st.keyspace_wakeups);
    lock_waker_stats(c, o);
}

/* ------------------------------------------------------------------ client */

/* The kind of server a URL names, by its scheme. */
static lock_kind url_kind(const char *url) {
    if (!strncmp(url, "zk://", 5)) return LOCK_KIND_ZK;
    if (!strncmp(url, "etcd://", 7)) return LOCK_KIND_ETCD;
    return LOCK_KIND_REDIS;
}

static const char *kind_name(lock_kind k) {
    return k == LOCK_KIND_ZK ? "ZooKeeper (zk://)" : k == LOCK_KIND_ETCD ? "etcd (etcd://)"
                                                                         : "Redis";
}

/* ---------------------------------------------------------------- servers */

/* Sets up Redis server i from its URL: one server, or a primary a
 * Sentinel watches (followed across failovers: rtopo_primary). Returns 0,
 * or -1 with err. */
static int server_open(lock_client *c, lock_server *s, int i, const lock_options *o, char *err,
                       size_t errlen) {
    rtopo_spec spec;
    char d[280];
    (void)c;
    if (rtopo_parse(o->urls[i], &spec, err, errlen)) return -1;
    if (spec.kind == RTOPO_CLUSTER) {
        snprintf(err, errlen, "a lock lives on one Redis primary; a redis-cluster:// URL "
                 "is not one");
        return -1;
    }
    if (spec.kind == RTOPO_SENTINEL) {
        s->primary = rtopo_primary_start(&spec, o->timeout_ms > 0 ? o->timeout_ms : 1000, err,
                                         errlen);
        if (!s->primary) return -1;
        s->version = rtopo_primary_get(s->primary, &s->addr);
    } else {
        s->addr = spec.seeds[0];
    }
    snprintf(s->desc, sizeof s->desc, "redis %s", rtopo_describe(&spec, d, sizeof d));
    s->index = i;
    pthread_mutex_init(&s->pool_mu, NULL);
    return 0;
}

static void server_close(lock_server *s) {
    for (int k = 0; k < s->nidle; k++) redisFree(s->idle[k]);
    free(s->idle);
    rtopo_primary_stop(s->primary);
    pthread_mutex_destroy(&s->pool_mu);
}

/* With pool_mu held: when the primary moved, takes its new address and
 * closes the idle connections to the old one. */
static void follow_primary(lock_server *s) {
    if (!s->primary || rtopo_primary_version(s->primary) == s->version) return;
    rconn_addr a;
    unsigned v = rtopo_primary_get(s->primary, &a);
    if (!v) return;
    s->addr = a;
    s->version = v;
    s->down_until_us = 0;
    for (int k = 0; k < s->nidle; k++) redisFree(s->idle[k]);
    s->nidle = 0;
}

unsigned lock_server_addr(lock_server *s, rconn_addr *out) {
    pthread_mutex_lock(&s->pool_mu);
    follow_primary(s);
    *out = s->addr;
    unsigned v = s->primary ? s->version : 1;
    pthread_mutex_unlock(&s->pool_mu);
    return v;
}

void lock_server_suspect(lock_server *s, unsigned version) {
    if (s->primary) rtopo_primary_suspect(s->primary, version);
}

/* One kind of server per client; ZooKeeper and etcd take one URL (a
 * ZooKeeper ensemble is listed inside it). Returns 0 or -1 (err). */
static int check_kinds(const lock_options *o, lock_kind *kind, char *err, size_t errlen) {
    *kind = url_kind(o->urls[0] ? o->urls[0] : "");
    for (int i = 0; i < o->nurls; i++) {
        if (!o->urls[i]) {
            snprintf(err, errlen, "lock: URL %d is NULL", i + 1);
            return -1;
        }
        lock_kind k = url_kind(o->urls[i]);
        if (k != *kind) {
            snprintf(err, errlen,
                     "lock: one client serves one kind of server: %s and %s URLs mixed (%.100s)",
                     kind_name(*kind), kind_name(k), o->urls[i]);
            return -1;
        }
    }
    if (*kind != LOCK_KIND_REDIS && o->nurls != 1) {
        snprintf(err, errlen, "lock: give %s one URL%s, not %d", kind_name(*kind),
                 *kind == LOCK_KIND_ZK ? " (list an ensemble's servers inside it: "
                                         "zk://h1:p1,h2:p2/path)" : "", o->nurls);
        return -1;
    }
    return 0;
}

lock_client *lock_client_new(const lock_options *o, char *err, size_t errlen) {
    unsigned char rnd[8];
    lock_kind kind;
    if (!o || !o->urls || o->nurls < 1 || o->nurls > LOCK_MAX_SERVERS) {
        snprintf(err, errlen, "lock: need 1 to %d Redis URLs, or one zk:// or etcd:// URL",
                 LOCK_MAX_SERVERS);
        return NULL;
    }
    if (check_kinds(o, &kind, err, errlen)) return NULL;
    if (scripts_ready()) {          /* SHA1s computed now, not on a hot path */
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (lock_random(rnd, sizeof rnd)) {
        snprintf(err, errlen, "lock: getrandom: %s", strerror(errno));
        return NULL;
    }
    lock_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; kind == LOCK_KIND_REDIS && i < o->nurls; i++) {
        if (server_open(c, &c->servers[i], i, o, err, errlen) != 0) {
            for (int k = 0; k < i; k++) server_close(&c->servers[k]);
            free(c);
            return NULL;
        }
    }
    c->kind = kind;
    c->nservers = kind == LOCK_KIND_REDIS ? o->nurls : 0;
    c->quorum = o->nurls / 2 + 1;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 1000;
    c->watchdog = o->watchdog != 0;
    c->max_backoff_ms = o->max_backoff_ms > 0 ? o->max_backoff_ms : 200;
    for (int i = 0; i < 8; i++) sprintf(c->cid + 2 * i, "%02x", rnd[i]);
    pthread_mutex_init(&c->mu, NULL);
    lock_cond_init(&c->wd_cv);
    lock_cond_init(&c->cb_cv);
    pthread_mutex_init(&c->waker.mu, NULL);
    lock_cond_init(&c->waker.state_cv);
    c->waker.efd = -1;
    int rc = 0;
    if (kind == LOCK_KIND_ZK) rc = lock_zk_open(c, o->urls[0], err, errlen);
    else if (kind == LOCK_KIND_ETCD) rc = lock_etcd_open(c, o->urls[0], err, errlen);
    if (rc) {
        lock_client_destroy(c);
        return NULL;
    }
    return c;
}

/* Frees what lock_client_new made; the threads and held locks are gone. */
void lock_client_destroy(lock_client *c) {
    if (c->be) c->be->destroy(c);
    for (int i = 0; i < c->nservers; i++) server_close(&c->servers[i]);
    pthread_cond_destroy(&c->waker.state_cv);
    pthread_mutex_destroy(&c->waker.mu);
    pthread_cond_destroy(&c->cb_cv);
    pthread_cond_destroy(&c->wd_cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---------------------------------------------------------- connections */

void lock_set_cloexec(redisContext *ctx) {
    /* A command run by flashlock must not inherit (and keep open) the
     * connections of the process that holds its lock. */
    int fl = fcntl(ctx->fd, F_GETFD);
    if (fl >= 0) fcntl(ctx->fd, F_SETFD, fl | FD_CLOEXEC);
}

/* An idle pooled connection is dead if it has anything to read: Redis
 * closed it (restart, timeout, CLIENT KILL) while it sat in the pool.
 * Finding out now keeps "unknown" results for real mid-command failures. */
static int conn_alive(redisContext *ctx) {
    struct pollfd p = { ctx->fd, POLLIN, 0 };
    return !ctx->err && poll(&p, 1, 0) == 0;
}

static void mark_down(lock_server *s, const char *why) {
    pthread_mutex_lock(&s->pool_mu);
    s->down_until_us = clock_mono_us() + LOCK_DOWN_MS * 1000;
    snprintf(s->down_err, sizeof s->down_err, "%.190s", why);
    pthread_mutex_unlock(&s->pool_mu);
}

static redisContext *server_connect(lock_client *c, lock_server *s, unsigned *version,
                                    char *err, size_t errlen) {
    char e[200];
    const rconn_script *all[LOCK_S_COUNT];
    rconn_addr addr;
    for (int i = 0; i < LOCK_S_COUNT; i++) all[i] = lock_script((lock_script_id)i);
    redisContext *ctx = NULL;
    if (!(*version = lock_server_addr(s, &addr))) {
        snprintf(e, sizeof e, "no primary found yet through Sentinel");
        goto err;
    }
    ctx = rconn_connect(&addr, c->timeout_ms, e, sizeof e);
    if (!ctx) goto err;
    lock_set_cloexec(ctx);
    if (rconn_script_load(ctx, all, LOCK_S_COUNT, e, sizeof e)) {
        redisFree(ctx);
        goto err;
    }
    return ctx;
err:
    mark_down(s, e);
    lock_server_suspect(s, *version);
    snprintf(err, errlen, "%s: %.190s", s->desc, e);
    return NULL;
}

/* Borrows a connection to s: an idle one that is still alive, or a new one.
 * Returns NULL with a reason in err; a server that just refused is not
 * tried again for LOCK_DOWN_MS, so a dead Redlock member costs nothing. */
static redisContext *server_get(lock_client *c, lock_server *s, unsigned *version, char *err,
                                size_t errlen) {
    pthread_mutex_lock(&s->pool_mu);
    follow_primary(s);
    *version = s->primary ? s->version : 1;
    while (s->nidle > 0) {
        redisContext *ctx = s->idle[--s->nidle];
        pthread_mutex_unlock(&s->pool_mu);
        if (conn_alive(ctx)) return ctx;
        redisFree(ctx);
        pthread_mutex_lock(&s->pool_mu);
    }
    if (clock_mono_us() < s->down_until_us) {
        snprintf(err, errlen, "%s: %s (not retried for %d ms)", s->desc, s->down_err,
                 LOCK_DOWN_MS);
        pthread_mutex_unlock(&s->pool_mu);
        return NULL;
    }
    pthread_mutex_unlock(&s->pool_mu);
    return server_connect(c, s, version, err, errlen);
}

/* Returns a borrowed connection, taken when s's primary was of version;
 * a broken one, or one to a primary that has moved since, is closed
 * instead. */
static void server_put(lock_server *s, redisContext *ctx, unsigned version) {
    if (!ctx) return;
    if (ctx->err) {
        redisFree(ctx);
        return;
    }
    pthread_mutex_lock(&s->pool_mu);
    if (s->primary && s->version != version) {
        pthread_mutex_unlock(&s->pool_mu);
        redisFree(ctx);
        return;
    }
    if (s->nidle == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        redisContext **p = realloc(s->idle, sizeof *p * (size_t)cap);
        if (!p) {
            pthread_mutex_unlock(&s->pool_mu);
            redisFree(ctx);
            return;
        }
        s->idle = p;
        s->cap = cap;
    }
    s->idle[s->nidle++] = ctx;
    pthread_mutex_unlock(&s->pool_mu);
}

/* ------------------------------------------------------------ script calls */

void lock_call_start(lock_call *call, lock_script_id script, int nkeys) {
    call->script = script;
    rconn_cmd_evalsha(&call->cmd, lock_script(script), nkeys);
}

/* EVAL of the source with call's keys and arguments, leaving call->cmd as
 * it is (rconn_cmd_run_script rewrites it, and one call goes to several
 * servers). */
static redisReply *eval_fallback(redisContext *ctx, const lock_call *call) {
    enum { MAXARGS = 16 };
    const char *argv[MAXARGS];
    size_t len[MAXARGS];
    const rconn_cmd *cmd = &call->cmd;
    const rconn_script *s = lock_script(call->script);
    assert(cmd->argc <= MAXARGS);
    argv[0] = "EVAL";
    len[0] = 4;
    argv[1] = s->src;
    len[1] = strlen(s->src);
    for (int i = 2; i < cmd->argc; i++) {
        argv[i] = cmd->buf + cmd->off[i];
        len[i] = cmd->len[i];
    }
    return redisCommandArgv(ctx, cmd->argc, argv, len);
}

static void fail_server(lock_replies *rs, int si, lock_server *s, redisContext **ctx,
                        const char *what) {
    snprintf(rs->err[si], sizeof rs->err[si], "%.120s: %s: %.200s", s->desc, what,
             (*ctx)->errstr[0] ? (*ctx)->errstr : "connection lost");
    redisFree(*ctx);
    *ctx = NULL;
}

/* A reply that says the server is not the primary (READONLY, LOADING, ...):
 * its connection goes, and the primary is looked for again. */
static int not_primary(const lock_server *s, const redisReply *r) {
    return s->primary && r && r->type == REDIS_REPLY_ERROR &&
           rtopo_classify(r, NULL) == RTOPO_REDISCOVER;
}

/* Sends every call to one server without waiting for replies. */
static void send_all(lock_call *calls, int ncalls, lock_replies *rs, int si, lock_server *s,
                     redisContext **ctx) {
    int done = 0;
    for (int i = 0; i < ncalls; i++) {
        if (rconn_cmd_append(*ctx, &calls[i].cmd)) {
            fail_server(rs, si, s, ctx, "send");
            return;
        }
    }
    while (!done) {
        if (redisBufferWrite(*ctx, &done) == REDIS_ERR) {
            fail_server(rs, si, s, ctx, "send");
            return;
        }
    }
}

/* Reads one server's replies; NOSCRIPT answers (Redis lost its script
 * cache) are redone by EVAL once the pipeline is drained. */
static void read_all(lock_call *calls, int ncalls, lock_replies *rs, int si, lock_server *s,
                     redisContext **ctx) {
    int noscript = 0;
    for (int i = 0; i < ncalls; i++) {
        redisReply *r = NULL;
        if (redisGetReply(*ctx, (void **)&r) != REDIS_OK) {
            fail_server(rs, si, s, ctx, "reply");
            return;
        }
        if (rconn_is_noscript(r)) {
            freeReplyObject(r);
            r = NULL;
            noscript = 1;
        } else if (r->type == REDIS_REPLY_ERROR && !rs->err[si][0]) {
            snprintf(rs->err[si], sizeof rs->err[si], "%.120s: %.250s", s->desc, r->str);
        }
        if (not_primary(s, r)) rs->stale |= 1u << si;
        LOCK_REPLY(rs, i, si) = r;
    }
    for (int i = 0; noscript && i < ncalls; i++) {
        if (LOCK_REPLY(rs, i, si)) continue;
        redisReply *r = eval_fallback(*ctx, &calls[i]);
        if (!r) {
            fail_server(rs, si, s, ctx, "reply");
            return;
        }
        if (r->type == REDIS_REPLY_ERROR && !rs->err[si][0])
            snprintf(rs->err[si], sizeof rs->err[si], "%.120s: %.250s", s->desc, r->str);
        LOCK_REPLY(rs, i, si) = r;
    }
}

int lock_run(lock_client *c, lock_call *calls, int ncalls, unsigned mask, lock_replies *rs) {
    redisContext *ctx[LOCK_MAX_SERVERS] = { 0 };
    unsigned version[LOCK_MAX_SERVERS] = { 0 };
    lock_pipe_guard g;
    memset(rs, 0, sizeof *rs);
    rs->ncalls = ncalls;
    rs->nservers = c->nservers;
    rs->r = calloc((size_t)ncalls * (size_t)c->nservers, sizeof *rs->r);
    if (!rs->r) return -1;
    lock_nosigpipe_begin(&g);
    for (int i = 0; i < c->nservers; i++) {
        if (!(mask & (1u << i))) continue;
        ctx[i] = server_get(c, &c->servers[i], &version[i], rs->err[i], sizeof rs->err[i]);
        if (ctx[i]) send_all(calls, ncalls, rs, i, &c->servers[i], &ctx[i]);
    }
    for (int i = 0; i < c->nservers; i++) {
        if (!ctx[i]) continue;
        read_all(calls, ncalls, rs, i, &c->servers[i], &ctx[i]);
        if (!ctx[i] || (rs->stale & (1u << i))) {
            lock_server_suspect(&c->servers[i], version[i]);
            if (ctx[i]) redisFree(ctx[i]);
            continue;
        }
        server_put(&c->servers[i], ctx[i], version[i]);
    }
    lock_nosigpipe_end(&g);
    return 0;
}

void lock_replies_free(lock_replies *rs) {
    if (!rs->r) return;
    for (int i = 0; i < rs->ncalls * rs->nservers; i++)
        if (rs->r[i]) freeReplyObject(rs->r[i]);
    free(rs->r);
    rs->r = NULL;
}

void lock_replies_why(const lock_client *c, const lock_replies *rs, unsigned mask, char *buf,
                      size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->nservers && used + 1 < len; i++) {
        if (!(mask & (1u << i)) || !rs->err[i][0]) continue;
        int n = snprintf(buf + used, len - used, "%s%s", used ? "; " : "", rs->err[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
    if (!buf[0]) snprintf(buf, len, "no answer");
}

lock_tally lock_tally_int(const lock_replies *rs, int call, unsigned mask) {
    lock_tally t = { 0, 0, 0 };
    for (int i = 0; i < rs->nservers; i++) {
        if (!(mask & (1u << i))) continue;
        const redisReply *r = LOCK_REPLY(rs, call, i);
        if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) t.ok++;
        else if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 0) t.no++;
        else t.io++;
    }
    return t;
}
