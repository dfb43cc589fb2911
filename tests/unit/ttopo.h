/* ttopo.h: real Redis topologies for the C unit tests, built from
 * tloop.h's private redis-servers (free loopback ports, temp dirs, killed
 * by PID, never outliving the test):
 * - a Cluster of n primaries (no replicas: quick), made by
 *   `redis-cli --cluster create`, node timeout 500 ms (tc_start);
 * - a primary, a replica and three sentinels watching them as "mymaster",
 *   down-after 1 s (ts_start), and more sentinels on demand
 *   (ts_start_sentinel: e.g. one that watches the replica, a stale one);
 * - tq: one command on a fresh connection to a loopback port;
 * - mk_*: hand-made replies, for the malformed answers parsers must refuse.
 *
 * Header-only; every function static. */
#ifndef FLASHSALE_TTOPO_H
#define FLASHSALE_TTOPO_H

#include <stdarg.h>
#include <hiredis/hiredis.h>

#include "tests/unit/tloop.h"

/* One command (as redisCommand: %s, %d, %b for binary) on a new connection to
 * 127.0.0.1:port with a 2 s timeout: the reply (freeReplyObject), or NULL. */
static inline redisReply *tq(int port, const char *fmt, ...) {
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = NULL;
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        va_list ap;
        va_start(ap, fmt);
        r = redisvCommand(c, fmt, ap);
        va_end(ap);
    }
    if (c) redisFree(c);
    return r;
}

static inline int tq_vhas(int port, const char *want, const char *fmt, va_list ap) {
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = NULL;
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) r = redisvCommand(c, fmt, ap);
    int ok = r && r->str && strstr(r->str, want) != NULL;
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    return ok;
}

/* Whether the answer to fmt on port is a string (bulk, status or error)
 * containing want. */
static inline int tq_has(int port, const char *want, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int tq_has(int port, const char *want, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int ok = tq_vhas(port, want, fmt, ap);
    va_end(ap);
    return ok;
}

/* Polls tq_has(port, want, fmt...) every 20 ms for up to ms: 1 or 0. */
static inline int tq_wait(int ms, int port, const char *want, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int tq_wait(int ms, int port, const char *want, const char *fmt, ...) {
    for (int64_t until = clock_mono_ms() + ms; clock_mono_ms() < until; clock_sleep_ms(20)) {
        va_list ap;
        va_start(ap, fmt);
        int ok = tq_vhas(port, want, fmt, ap);
        va_end(ap);
        if (ok) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------- Cluster */

#define TC_MAX 6

typedef struct tcluster {
    int n;
    tredis node[TC_MAX];
} tcluster;

/* Starts n (3..6) cluster nodes and makes them one cluster of n primaries.
 * Returns 0 once every node says cluster_state:ok, or -1. */
static inline int tc_start(tcluster *c, int n) {
    static const char *const extra[] = { "--cluster-enabled", "yes", "--cluster-node-timeout",
                                         "500", NULL };
    char cmd[512];
    size_t used;
    c->n = n;
    used = (size_t)snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < n; i++) {
        if (tr_start_ext(&c->node[i], NULL, extra)) return -1;
        used += (size_t)snprintf(cmd + used, sizeof cmd - used, " 127.0.0.1:%d",
                                 c->node[i].port);
    }
    snprintf(cmd + used, sizeof cmd - used, " --cluster-yes >%s/create.log 2>&1",
             c->node[0].dir);
    if (system(cmd) != 0) return -1;
    for (int i = 0; i < n; i++)
        if (!tq_wait(5000, c->node[i].port, "cluster_state:ok", "CLUSTER INFO")) return -1;
    return 0;
}

static inline void tc_cleanup(tcluster *c) {
    for (int i = 0; i < TC_MAX; i++) tr_cleanup(&c->node[i]);
}

/* ------------------------------------------------------------ Sentinel */

typedef struct tsentinels {
    tredis primary, replica;
    tredis s[3];
    char url[256];          /* redis-sentinel://...the three.../mymaster */
} tsentinels;

/* Starts a sentinel watching 127.0.0.1:master_port as name (quorum 2,
 * down-after down_after_ms), its config in its own temp dir. 0 or -1. */
static inline int ts_start_sentinel(tredis *s, int master_port, const char *name,
                                    int down_after_ms) {
    static const char *const extra[] = { "--sentinel", NULL };
    char conf[128];
    snprintf(s->dir, sizeof s->dir, "/tmp/fs-unit-sentinel-XXXXXX");
    if (!mkdtemp(s->dir)) return -1;
    snprintf(conf, sizeof conf, "%s/sentinel.conf", s->dir);
    FILE *f = fopen(conf, "w");
    if (!f) return -1;
    fprintf(f, "sentinel monitor %s 127.0.0.1 %d 2\n"
            "sentinel down-after-milliseconds %s %d\n"
            "sentinel failover-timeout %s 10000\n", name, master_port, name, down_after_ms,
            name);
    fclose(f);
    return tr_start_ext(s, conf, extra);
}

/* Starts the primary, its replica (returns once it is in sync) and three
 * sentinels. 0 or -1. */
static inline int ts_start(tsentinels *t) {
    char port[16];
    /* No 5 s wait before a full sync (the default of Redis 7). */
    const char *extra[] = { "--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", port,
                            NULL };
    const char *first[] = { "--repl-diskless-sync-delay", "0", NULL };
    if (tr_start_ext(&t->primary, NULL, first)) return -1;
    snprintf(port, sizeof port, "%d", t->primary.port);
    if (tr_start_ext(&t->replica, NULL, extra)) return -1;
    if (!tq_wait(5000, t->replica.port, "master_link_status:up", "INFO replication"))
        return -1;
    for (int i = 0; i < 3; i++)
        if (ts_start_sentinel(&t->s[i], t->primary.port, "mymaster", 1000)) return -1;
    snprintf(t->url, sizeof t->url, "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d"
             "/mymaster", t->s[0].port, t->s[1].port, t->s[2].port);
    return 0;
}

static inline void ts_cleanup(tsentinels *t) {
    for (int i = 0; i < 3; i++) tr_cleanup(&t->s[i]);
    tr_cleanup(&t->replica);
    tr_cleanup(&t->primary);
}

/* ------------------------------------------------ hand-made answers */

/* Replies built by hand, for what no real server sends (malformed
 * answers) but the parsers must refuse; freed with freeReplyObject. */
static inline redisReply *mk(int type) {
    redisReply *r = calloc(1, sizeof *r);
    r->type = type;
    return r;
}
static inline redisReply *mk_int(long long v) {
    redisReply *r = mk(REDIS_REPLY_INTEGER);
    r->integer = v;
    return r;
}
static inline redisReply *mk_str(int type, const char *s) {
    redisReply *r = mk(type);
    r->str = strdup(s);
    r->len = strlen(s);
    return r;
}
static inline redisReply *mk_arr(int n, ...) {
    redisReply *r = mk(REDIS_REPLY_ARRAY);
    va_list ap;
    r->elements = (size_t)n;
    r->element = calloc((size_t)n, sizeof *r->element);
    va_start(ap, n);
    for (int i = 0; i < n; i++) r->element[i] = va_arg(ap, redisReply *);
    va_end(ap);
    return r;
}
#endif
