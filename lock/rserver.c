/* rserver.c: the Redis servers of a lock client -- one server, or a
 * primary that a Sentinel watches, followed across failovers -- their
 * pooled connections, the embedded scripts, and lock_run, which runs one
 * script call on every server at once (pipelined, all servers in
 * parallel). redis.c builds the lock on top. */
#include "lock/redis_int.h"
#include "rtopo/rtopo.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"

extern const char lock_lua_format[], lock_lua_acquire[], lock_lua_release[],
    lock_lua_extend[], lock_lua_settle[], lock_lua_fence[], lock_lua_fair_acquire[],
    lock_lua_fair_release[], lock_lua_fair_leave[];

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
    script_on_format(LOCK_S_FAIR_ACQUIRE, "fair_acquire", lock_lua_fair_acquire);
    script_on_format(LOCK_S_FAIR_RELEASE, "fair_release", lock_lua_fair_release);
    script_on_format(LOCK_S_FAIR_LEAVE, "fair_leave", lock_lua_fair_leave);
}

/* Builds the scripts and their SHA1s (once per process). Returns 0, or -1
 * when out of memory. */
int lock_scripts_ready(void) {
    pthread_once(&scripts_once, scripts_init);
    return scripts_nomem ? -1 : 0;
}

const rconn_script *lock_script(lock_script_id id) {
    assert(id >= 0 && id < LOCK_S_COUNT);
    pthread_once(&scripts_once, scripts_init);
    assert(scripts[id].src);       /* a client exists: scripts_ready passed */
    return &scripts[id];
}

/* ---------------------------------------------------------------- servers */

/* ------------------------------------------------------------ the pools */

/* Closes every connection of p (pool_mu held, or no other thread left). */
static void idle_close(lock_idle *p) {
    for (int k = 0; k < p->n; k++) redisFree(p->v[k]);
    p->n = 0;
}

/* An idle pooled connection is dead if it has anything to read: Redis
 * closed it (restart, timeout, CLIENT KILL) while it sat in the pool.
 * Finding out now keeps "unknown" results for real mid-command failures. */
static int conn_alive(redisContext *ctx) {
    struct pollfd p = { ctx->fd, POLLIN, 0 };
    return !ctx->err && poll(&p, 1, 0) == 0;
}

/* The newest connection of p still alive, or NULL; the dead ones met are
 * closed (pool_mu held: a poll that does not wait). */
static redisContext *idle_take(lock_idle *p) {
    assert(lock_mu_holds(LOCK_RANK_POOL));
    while (p->n > 0) {
        redisContext *ctx = p->v[--p->n];
        if (conn_alive(ctx)) return ctx;
        redisFree(ctx);
    }
    return NULL;
}

/* Keeps ctx in p; closes it when p cannot grow. */
static void idle_put(lock_idle *p, redisContext *ctx) {
    assert(lock_mu_holds(LOCK_RANK_POOL));
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 8;
        redisContext **v = realloc(p->v, sizeof *v * (size_t)cap);
        if (!v) {
            redisFree(ctx);
            return;
        }
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = ctx;
}

/* ---------------------------------------------------------------- servers */

/* A Sentinel's primary is followed across failovers through rtopo_primary,
 * a cluster's slots through rtopo_cluster. */
int lock_server_open(lock_redis *r, int i, const char *url, char *err, size_t errlen) {
    lock_server *s = &r->servers[i];
    rtopo_spec spec;
    char d[280];
    if (rtopo_parse(url, &spec, err, errlen)) return -1;
    if (spec.kind == RTOPO_CLUSTER) {
        /* A lock's keys share its name's slot (lock_keys_make): each call
         * goes to the primary serving that slot (run_cluster). */
        s->cluster = rtopo_cluster_start(&spec, r->timeout_ms, err, errlen);
        if (!s->cluster) return -1;
    } else if (spec.kind == RTOPO_SENTINEL) {
        s->primary = rtopo_primary_start(&spec, r->timeout_ms, err, errlen);
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

void lock_server_close(lock_server *s) {
    idle_close(&s->idle);
    free(s->idle.v);
    for (int n = 0; n < s->nnodes; n++) {
        idle_close(&s->nodes[n].idle);
        free(s->nodes[n].idle.v);
    }
    free(s->nodes);
    rtopo_cluster_stop(s->cluster);
    rtopo_primary_stop(s->primary);
    pthread_mutex_destroy(&s->pool_mu);
}

/* With pool_mu held: when the primary moved, takes its new address and
 * closes the idle connections to the old one. */
static void follow_primary(lock_server *s) {
    assert(lock_mu_holds(LOCK_RANK_POOL));
    if (!s->primary || rtopo_primary_version(s->primary) == s->version) return;
    rconn_addr a;
    unsigned v = rtopo_primary_get(s->primary, &a);
    if (!v) return;
    s->addr = a;
    s->version = v;
    s->down_until_us = 0;
    idle_close(&s->idle);
}

unsigned lock_server_addr(lock_server *s, rconn_addr *out) {
    /* A cluster: any primary hears every PUBLISH (pub/sub is cluster-wide);
     * the subscriber stays with it until its connection breaks. */
    if (s->cluster) return rtopo_cluster_route(s->cluster, 0, out) ? 1 : 0;
    lock_mu_take(&s->pool_mu, LOCK_RANK_POOL);
    follow_primary(s);
    *out = s->addr;
    unsigned v = s->primary ? s->version : 1;
    lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
    return v;
}

void lock_server_suspect(lock_server *s, unsigned version) {
    if (s->cluster) rtopo_cluster_suspect(s->cluster);
    if (s->primary) rtopo_primary_suspect(s->primary, version);
}

/* ---------------------------------------------------------- connections */

void lock_set_cloexec(redisContext *ctx) {
    /* A command run by flashlock must not inherit (and keep open) the
     * connections of the process that holds its lock. */
    int fl = fcntl(ctx->fd, F_GETFD);
    if (fl >= 0) fcntl(ctx->fd, F_SETFD, fl | FD_CLOEXEC);
}


static void mark_down(lock_server *s, const char *why) {
    lock_mu_take(&s->pool_mu, LOCK_RANK_POOL);
    s->down_until_us = clock_mono_us() + LOCK_DOWN_MS * 1000;
    snprintf(s->down_err, sizeof s->down_err, "%.190s", why);
    lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
}

/* A new connection to a with the scripts loaded, or NULL with e. */
static redisContext *connect_loaded(lock_redis *r, const rconn_addr *a, char *e, size_t elen) {
    const rconn_script *all[LOCK_S_COUNT];
    for (int i = 0; i < LOCK_S_COUNT; i++) all[i] = lock_script((lock_script_id)i);
    redisContext *ctx = rconn_connect(a, r->timeout_ms, e, elen);
    if (!ctx) return NULL;
    lock_set_cloexec(ctx);
    if (rconn_script_load(ctx, all, LOCK_S_COUNT, e, elen)) {
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

static redisContext *server_connect(lock_redis *r, lock_server *s, unsigned *version,
                                    char *err, size_t errlen) {
    char e[200];
    rconn_addr addr;
    redisContext *ctx = NULL;
    if (!(*version = lock_server_addr(s, &addr))) {
        snprintf(e, sizeof e, "no primary found yet through Sentinel");
        goto err;
    }
    if (!(ctx = connect_loaded(r, &addr, e, sizeof e))) goto err;
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
static redisContext *server_get(lock_redis *r, lock_server *s, unsigned *version, char *err,
                                size_t errlen) {
    lock_mu_take(&s->pool_mu, LOCK_RANK_POOL);
    follow_primary(s);
    *version = s->primary ? s->version : 1;
    redisContext *ctx = idle_take(&s->idle);
    if (ctx) {
        lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
        return ctx;
    }
    if (clock_mono_us() < s->down_until_us) {
        snprintf(err, errlen, "%s: %s (not retried for %d ms)", s->desc, s->down_err,
                 LOCK_DOWN_MS);
        lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
        return NULL;
    }
    lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
    return server_connect(r, s, version, err, errlen);
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
    lock_mu_take(&s->pool_mu, LOCK_RANK_POOL);
    if (s->primary && s->version != version) redisFree(ctx);
    else idle_put(&s->idle, ctx);
    lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
}

/* ------------------------------------------------------ a cluster's nodes */

/* The pool of a cluster's node a, made on first use.
 * Returns NULL when out of memory. */
static lock_node *node_of(lock_server *s, const rconn_addr *a) {
    assert(lock_mu_holds(LOCK_RANK_POOL));
    for (int n = 0; n < s->nnodes; n++)
        if (s->nodes[n].addr.port == a->port && !strcmp(s->nodes[n].addr.host, a->host))
            return &s->nodes[n];
    if (s->nnodes == s->nodecap) {
        int cap = s->nodecap ? s->nodecap * 2 : 8;
        lock_node *p = realloc(s->nodes, sizeof *p * (size_t)cap);
        if (!p) return NULL;
        s->nodes = p;
        s->nodecap = cap;
    }
    lock_node *nd = &s->nodes[s->nnodes++];
    memset(nd, 0, sizeof *nd);
    nd->addr = *a;
    return nd;
}

/* Borrows a connection to the cluster node a: an idle one still alive, or
 * a new one (a node that cannot be reached has the map reloaded). NULL with
 * err. */
static redisContext *node_get(lock_redis *r, lock_server *s, const rconn_addr *a, char *err,
                              size_t errlen) {
    char e[200];
    lock_mu_take(&s->pool_mu, LOCK_RANK_POOL);
    lock_node *nd = node_of(s, a);
    redisContext *ctx = nd ? idle_take(&nd->idle) : NULL;
    lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
    if (ctx) return ctx;
    if (nd) ctx = connect_loaded(r, a, e, sizeof e);
    if (!ctx) {
        if (!nd) snprintf(e, sizeof e, "out of memory");
        rtopo_cluster_suspect(s->cluster);
        snprintf(err, errlen, "%s: node %.100s:%d: %.190s", s->desc, a->host, a->port, e);
    }
    return ctx;
}

/* Returns a borrowed connection to the cluster node a (a broken one is
 * closed instead). */
static void node_put(lock_server *s, const rconn_addr *a, redisContext *ctx) {
    if (!ctx) return;
    if (ctx->err) {
        redisFree(ctx);
        return;
    }
    lock_mu_take(&s->pool_mu, LOCK_RANK_POOL);
    lock_node *nd = node_of(s, a);
    if (nd) idle_put(&nd->idle, ctx);
    else redisFree(ctx);
    lock_mu_drop(&s->pool_mu, LOCK_RANK_POOL);
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

/* Keeps r's error, when it is the server's first, as the reason for rs. */
static void keep_error(lock_replies *rs, int si, const lock_server *s, const redisReply *r) {
    if (r->type == REDIS_REPLY_ERROR && !rs->err[si][0])
        snprintf(rs->err[si], sizeof rs->err[si], "%.120s: %.250s", s->desc, r->str);
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
        } else {
            keep_error(rs, si, s, r);
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
        keep_error(rs, si, s, r);
        LOCK_REPLY(rs, i, si) = r;
    }
}

/* ------------------------------------------------------ a cluster's calls */

/* Where one call of a cluster run goes and how it stands. */
typedef struct routed {
    int slot;
    int ask;                      /* the last answer was ASK: once to `to`, after ASKING */
    rconn_addr to;                /* this round's node */
    int node;                     /* index into the round's nodes */
    int noscript;                 /* answered NOSCRIPT: redone by EVAL on the same node */
} routed;

/* The slot of a call: that of its first key (all of a lock's keys share
 * it, lock_keys_make). */
static int call_slot(const lock_call *call) {
    int k = call->script < LOCK_S_COUNT ? 3 : 1;   /* EVALSHA sha nkeys KEY / ZREM KEY */
    if (call->cmd.argc <= k) return 0;
    return rtopo_slot(call->cmd.buf + call->cmd.off[k], call->cmd.len[k]);
}

/* Reads the replies of the calls in[0..n) from one node (sent in that
 * order, each after an ASKING where it was asked), deciding for each:
 * answered (into rs), or to be sent again (*again; *pause_ms raised to what
 * the answer asks). After a connection failure the rest stay unanswered:
 * they may have run. */
static void read_routed(lock_server *s, lock_call *calls, routed *rt, const int *in, int n,
                        lock_replies *rs, int si, redisContext **ctx, int *again, int *nagain,
                        int *pause_ms) {
    int noscript = 0;
    for (int j = 0; j < n && *ctx; j++) {
        int i = in[j];
        redisReply *rep = NULL;
        if (rt[i].ask && redisGetReply(*ctx, (void **)&rep) == REDIS_OK) {   /* ASKING's +OK */
            freeReplyObject(rep);
            rep = NULL;
        }
        if (redisGetReply(*ctx, (void **)&rep) != REDIS_OK) {
            fail_server(rs, si, s, ctx, "reply");
            rtopo_cluster_suspect(s->cluster);
            break;
        }
        rtopo_redirect rd;
        rtopo_verdict v = rconn_is_noscript(rep) ? RTOPO_OK : rtopo_classify(rep, &rd);
        int pause = rtopo_retry_pause_ms(v);   /* rtopo.h's policy: -1, it ran */
        rt[i].ask = 0;
        if (v == RTOPO_MOVED) rtopo_cluster_moved(s->cluster, &rd);
        if (v == RTOPO_CLUSTERDOWN || v == RTOPO_REDISCOVER) rtopo_cluster_suspect(s->cluster);
        if (v == RTOPO_ASK) {
            rt[i].ask = 1;
            memset(&rt[i].to, 0, sizeof rt[i].to);
            snprintf(rt[i].to.host, sizeof rt[i].to.host, "%s", rd.host);
            rt[i].to.port = rd.port;
            pause = 0;                    /* followed at once, with ASKING */
        }
        if (pause >= 0) {
            /* It did not run: send it again. The last such answer is kept
             * for the reason, should the tries run out. */
            if (*pause_ms < pause) *pause_ms = pause;
            snprintf(rs->err[si], sizeof rs->err[si], "%.120s: %.250s", s->desc,
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "redirected");
            freeReplyObject(rep);
            again[(*nagain)++] = i;
            continue;
        }
        if (rconn_is_noscript(rep)) {
            freeReplyObject(rep);
            rt[i].noscript = noscript = 1;
            continue;
        }
        keep_error(rs, si, s, rep);
        LOCK_REPLY(rs, i, si) = rep;
    }
    for (int j = 0; noscript && *ctx && j < n; j++) {
        int i = in[j];
        if (!rt[i].noscript) continue;
        rt[i].noscript = 0;
        redisReply *rep = eval_fallback(*ctx, &calls[i]);
        if (!rep) {
            fail_server(rs, si, s, ctx, "reply");
            return;
        }
        keep_error(rs, si, s, rep);
        LOCK_REPLY(rs, i, si) = rep;
    }
}

/* Runs the calls on cluster server si: each to the primary serving its
 * slot, the calls of one node pipelined, every node's at once; what a
 * node redirects (MOVED, ASK), or cannot serve yet (TRYAGAIN, CLUSTERDOWN,
 * a replica's READONLY), is sent again where the cluster now says, after
 * the pause rtopo.h's policy gives it, up to RTOPO_RETRIES more rounds.
 * Replies land in rs as lock_run's do. Returns 0, or -1 when out of
 * memory. */
static int run_cluster(lock_redis *r, lock_call *calls, int ncalls, lock_replies *rs, int si) {
    lock_server *s = &r->servers[si];
    routed *rt = calloc((size_t)ncalls, sizeof *rt);
    int *todo = malloc(sizeof *todo * (size_t)ncalls * 3);
    if (!rt || !todo) {
        free(rt);
        free(todo);
        return -1;
    }
    int *again = todo + ncalls, *in = todo + 2 * ncalls;
    int ntodo = ncalls;
    for (int i = 0; i < ncalls; i++) {
        todo[i] = i;
        rt[i].slot = call_slot(&calls[i]);
    }
    enum { MAXNODES = 64 };
    rconn_addr at[MAXNODES];
    redisContext *ctx[MAXNODES];
    for (int round = 0; ntodo > 0; round++) {
        if (round > RTOPO_RETRIES) {
            char last[sizeof rs->err[si]];
            snprintf(last, sizeof last, "%s", rs->err[si]);
            snprintf(rs->err[si], sizeof rs->err[si], "%.300s (still redirected after %d tries)",
                     last[0] ? last : s->desc, RTOPO_RETRIES + 1);
            break;
        }
        /* Route this round's calls; a slot nobody serves waits for the map. */
        int nnodes = 0, nagain = 0, pause_ms = -1;
        for (int j = 0; j < ntodo; j++) {
            int i = todo[j];
            rt[i].node = -1;
            if (!rt[i].ask && !rtopo_cluster_route(s->cluster, rt[i].slot, &rt[i].to)) {
                snprintf(rs->err[si], sizeof rs->err[si], "%.120s: no node serves slot %d yet",
                         s->desc, rt[i].slot);
                rtopo_cluster_suspect(s->cluster);
                again[nagain++] = i;
                pause_ms = RTOPO_RETRY_PAUSE_MS;
                continue;
            }
            int n = 0;
            while (n < nnodes &&
                   !(at[n].port == rt[i].to.port && !strcmp(at[n].host, rt[i].to.host)))
                n++;
            if (n == MAXNODES) {          /* more nodes than any real cluster: next round */
                again[nagain++] = i;
                continue;
            }
            if (n == nnodes) at[nnodes++] = rt[i].to;
            rt[i].node = n;
        }
        /* Send each node its calls (a node that cannot be reached: they did
         * not run, so they go again once the map has moved on)... */
        for (int n = 0; n < nnodes; n++) {
            int done = 0;
            ctx[n] = node_get(r, s, &at[n], rs->err[si], sizeof rs->err[si]);
            for (int j = 0; j < ntodo; j++) {
                int i = todo[j];
                if (rt[i].node != n) continue;
                if (!ctx[n]) {
                    rt[i].node = -1;
                    rt[i].ask = 0;
                    again[nagain++] = i;
                    if (pause_ms < RTOPO_RETRY_PAUSE_MS) pause_ms = RTOPO_RETRY_PAUSE_MS;
                    continue;
                }
                if ((rt[i].ask && redisAppendCommand(ctx[n], "ASKING") != REDIS_OK) ||
                    rconn_cmd_append(ctx[n], &calls[i].cmd))
                    fail_server(rs, si, s, &ctx[n], "send");
            }
            while (ctx[n] && !done)
                if (redisBufferWrite(ctx[n], &done) == REDIS_ERR)
                    fail_server(rs, si, s, &ctx[n], "send");
        }
        /* ...then read each node's answers in the order sent. */
        for (int n = 0; n < nnodes; n++) {
            if (!ctx[n]) continue;
            int nin = 0;
            for (int j = 0; j < ntodo; j++)
                if (rt[todo[j]].node == n) in[nin++] = todo[j];
            read_routed(s, calls, rt, in, nin, rs, si, &ctx[n], again, &nagain, &pause_ms);
            node_put(s, &at[n], ctx[n]);
        }
        memcpy(todo, again, sizeof *todo * (size_t)nagain);
        ntodo = nagain;
        if (ntodo && pause_ms > 0) clock_sleep_ms(pause_ms);
    }
    free(rt);
    free(todo);
    return 0;
}

int lock_run(lock_redis *r, lock_call *calls, int ncalls, unsigned mask, lock_replies *rs) {
    redisContext *ctx[LOCK_MAX_SERVERS] = { 0 };
    unsigned version[LOCK_MAX_SERVERS] = { 0 };
    lock_pipe_guard g;
    memset(rs, 0, sizeof *rs);
    rs->ncalls = ncalls;
    rs->nservers = r->nservers;
    rs->r = calloc((size_t)ncalls * (size_t)r->nservers, sizeof *rs->r);
    if (!rs->r) return -1;
    lock_nosigpipe_begin(&g);
    for (int i = 0; i < r->nservers; i++) {
        if (!(mask & (1u << i))) continue;
        if (r->servers[i].cluster) {    /* its own rounds, while the others' replies come */
            if (run_cluster(r, calls, ncalls, rs, i)) snprintf(rs->err[i], sizeof rs->err[i],
                                                               "out of memory");
            continue;
        }
        ctx[i] = server_get(r, &r->servers[i], &version[i], rs->err[i], sizeof rs->err[i]);
        if (ctx[i]) send_all(calls, ncalls, rs, i, &r->servers[i], &ctx[i]);
    }
    for (int i = 0; i < r->nservers; i++) {
        if (!ctx[i]) continue;
        read_all(calls, ncalls, rs, i, &r->servers[i], &ctx[i]);
        if (!ctx[i] || (rs->stale & (1u << i))) {
            lock_server_suspect(&r->servers[i], version[i]);
            if (ctx[i]) redisFree(ctx[i]);
            continue;
        }
        server_put(&r->servers[i], ctx[i], version[i]);
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

void lock_replies_why(const lock_redis *r, const lock_replies *rs, unsigned mask, char *buf,
                      size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->nservers && used + 1 < len; i++) {
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
