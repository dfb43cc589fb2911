/* stores.c: the verifier's own reads of Redis.
 *
 * flashload is the oracle that judges the service, so it must not look at
 * the service's data through the service's eyes: a wrong key name, a wrong
 * segment sum or a wrong query in stock/ or db/ would then be wrong the same
 * way here, and the bug would pass. This file reads the stores by the format
 * written down for users in docs/storage.md, with plain hiredis (common/
 * only parses the URL and connects) and its own read-only SQL, and it reads
 * only what the verdict needs, so a change of the service's internals that
 * keeps the documented format cannot break it.
 *
 * What it reads, per SKU:
 *   Redis   <prefix>{sku}:gen, :empty and :stock:0..n-1 in one MGET (the
 *           copy's validity, its units, and the bitmap of segments marked
 *           empty), the :pending hash (records, and their "q" units) and
 *           the return markers (the ended holds given back to this copy:
 *           the legacy :returned hash, the :returned:<b> time buckets found
 *           by SCAN, and the :returned:before watermark);
 *           from one server, the primary Sentinel names, or the Redis
 *           Cluster node serving the SKU's hash tag (cluster.c follows the
 *           cluster's redirections, again sharing nothing with rtopo/); the
 *           copy's gen is judged by the run_id of the server that answered;
 *           a product spread over a cluster (fl_redis_lanes) the same way,
 *           lane by lane: <prefix>{sku:i}:gen, :empty and :stock:0 in one
 *           MGET per lane on the node serving lane i, each lane's gen
 *           judged by that node's run_id, the lanes' units summed, their
 *           generations compared; :pending and :returned of every lane.
 * The orders' database is read by dbread.c, by the same rule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#include "common/rconn.h"
#include "loadtest/stores/cluster_int.h"

#define MAX_SEGMENTS 1024        /* the API's limit on segments */

/* ------------------------------------------------------------------- Redis */

#define FL_MAX_SENTINELS 8

struct fl_redis {
    rconn_addr addr;             /* one server, or the primary last found */
    int nsentinels;              /* > 0: a Sentinel-watched primary */
    rconn_addr sentinel[FL_MAX_SENTINELS];
    char master[128];
    char prefix[64];
    int timeout_ms;
    redisContext *ctx;           /* NULL: connect on next use */
    char run_id[41];             /* of the server ctx is connected to */
    fl_cluster *cluster;         /* non-NULL: a Redis Cluster (addr, ctx unused) */
    fl_lane *lane;               /* the lanes of the last spread copy read */
    int nlanes, lane_cap;
};

/* "host:port[,host:port...]/<master>[?db=N][, password before an '@']":
 * a redis-sentinel:// URL after its scheme, read here by the verifier
 * itself (it shares no code with the service's routing). */
static int sentinel_parse(fl_redis *r, const char *rest, char *err, size_t errlen) {
    char buf[1024], *at, *slash, *q;
    snprintf(buf, sizeof buf, "%s", rest);
    char *hosts = buf;
    if ((at = strrchr(buf, '@'))) {
        *at = '\0';
        const char *pw = buf[0] == ':' ? buf + 1 : strchr(buf, ':') ? strchr(buf, ':') + 1 : buf;
        snprintf(r->addr.password, sizeof r->addr.password, "%.*s", (int)sizeof r->addr.password - 1, pw);
        hosts = at + 1;
    }
    if (!(slash = strchr(hosts, '/')) || !slash[1]) {
        snprintf(err, errlen, "a redis-sentinel:// URL ends in /<master name>");
        return -1;
    }
    *slash = '\0';
    if ((q = strchr(slash + 1, '?'))) {
        *q = '\0';
        if (strncmp(q + 1, "db=", 3)) {
            snprintf(err, errlen, "unknown option '%s'", q + 1);
            return -1;
        }
        r->addr.db = atoi(q + 4);
    }
    snprintf(r->master, sizeof r->master, "%s", slash + 1);
    for (char *save = NULL, *h = strtok_r(hosts, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        char one[300];
        if (r->nsentinels == FL_MAX_SENTINELS) {
            snprintf(err, errlen, "more than %d sentinels", FL_MAX_SENTINELS);
            return -1;
        }
        snprintf(one, sizeof one, "redis://%s%s", h, strchr(h, ':') ? "" : ":26379");
        if (rconn_parse(one, &r->sentinel[r->nsentinels], err, errlen)) return -1;
        r->nsentinels++;
    }
    if (!r->nsentinels) {
        snprintf(err, errlen, "no sentinel in the URL");
        return -1;
    }
    return 0;
}

/* Asks the sentinels in turn for the primary, and takes the first answer
 * that ROLE confirms. */
static int sentinel_ask(fl_redis *r, char *err, size_t errlen) {
    snprintf(err, errlen, "no sentinel named a primary of '%s'", r->master);
    for (int i = 0; i < r->nsentinels; i++) {
        char e[200];
        redisContext *c = rconn_connect(&r->sentinel[i], r->timeout_ms, e, sizeof e);
        if (!c) continue;
        redisReply *a = redisCommand(c, "SENTINEL get-master-addr-by-name %s", r->master);
        redisFree(c);
        if (!a || a->type != REDIS_REPLY_ARRAY || a->elements != 2 ||
            a->element[0]->type != REDIS_REPLY_STRING || a->element[1]->type != REDIS_REPLY_STRING) {
            if (a) freeReplyObject(a);
            continue;
        }
        rconn_addr at = r->addr;
        snprintf(at.host, sizeof at.host, "%s", a->element[0]->str);
        at.port = atoi(a->element[1]->str);
        freeReplyObject(a);
        if (!(c = rconn_connect(&at, r->timeout_ms, e, sizeof e))) continue;
        redisReply *role = redisCommand(c, "ROLE");
        int master = role && role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
                     role->element[0]->type == REDIS_REPLY_STRING &&
                     !strcmp(role->element[0]->str, "master");
        if (role) freeReplyObject(role);
        redisFree(c);
        if (master) {
            r->addr = at;
            return 0;
        }
    }
    return -1;
}

fl_redis *fl_redis_open(const char *url, const char *prefix, int timeout_ms, fl_err *e) {
    char err[256];
    fl_redis *r = calloc(1, sizeof *r);
    if (!r) {
        fl_errf(e, "out of memory");
        return NULL;
    }
    r->timeout_ms = timeout_ms > 0 ? timeout_ms : 2000;
    if (!strncmp(url, "redis-cluster:", 14)) {
        r->cluster = fl_cluster_open(url, r->timeout_ms, err, sizeof err);
        if (!r->cluster) {
            fl_errf(e, "redis %s: %s", url, err);
            free(r);
            return NULL;
        }
    } else if ((!strncmp(url, "redis-sentinel://", 17) ? sentinel_parse(r, url + 17, err, sizeof err)
                                                        : rconn_parse(url, &r->addr, err, sizeof err))) {
        fl_errf(e, "redis %s: %s", url, err);
        free(r);
        return NULL;
    }
    snprintf(r->prefix, sizeof r->prefix, "%s", prefix && prefix[0] ? prefix : "fs:");
    return r;
}

void fl_redis_close(fl_redis *r) {
    if (!r) return;
    if (r->ctx) redisFree(r->ctx);
    fl_cluster_close(r->cluster);
    free(r->lane);
    free(r);
}

void fl_redis_route_get(const fl_redis *r, fl_redis_route *out) {
    if (r->cluster) {
        fl_cluster_route(r->cluster, out);
        return;
    }
    memset(out, 0, sizeof *out);
    if (!r->run_id[0]) return;         /* no read yet */
    if (r->addr.path[0]) snprintf(out->node, sizeof out->node, "unix:%.290s", r->addr.path);
    else snprintf(out->node, sizeof out->node, "%.256s:%d", r->addr.host, r->addr.port);
    memcpy(out->run_id, r->run_id, sizeof out->run_id);
}

/* Drops the connection after a failure, so the next call starts afresh
 * (Redis may have restarted: its run_id is then read again). */
static int redis_fail(fl_redis *r, const char *what, fl_err *e) {
    fl_errf(e, "redis %s: %s", what, r->ctx && r->ctx->err ? r->ctx->errstr : "connection lost");
    if (r->ctx) redisFree(r->ctx);
    r->ctx = NULL;
    return -1;
}

static int redis_ensure(fl_redis *r, fl_err *e) {
    char err[256];
    if (r->ctx) return 0;
    if (r->nsentinels && sentinel_ask(r, err, sizeof err)) return fl_errf(e, "redis: %s", err);
    r->ctx = rconn_connect(&r->addr, r->timeout_ms, err, sizeof err);
    if (!r->ctx) return fl_errf(e, "redis: %s", err);
    if (rconn_run_id(r->ctx, r->run_id)) return redis_fail(r, "INFO server", e);
    return 0;
}

/* Runs argv, whose keys are all sku's, on the server that holds them: the
 * one server, the primary the sentinels name, or the cluster node serving
 * sku's hash tag. Returns the reply (an error reply included) with *run_id
 * pointing at the run_id of the server that sent it (valid until the next
 * call); NULL with e set when no server answered (a lost connection is
 * dropped, so the next call starts afresh). */
static redisReply *redis_call(fl_redis *r, const char *sku, int argc, const char **argv,
                              const char **run_id, fl_err *e) {
    if (r->cluster) {
        char err[400];
        redisReply *rep = fl_cluster_call(r->cluster, sku, argc, argv, run_id, err, sizeof err);
        if (!rep) fl_errf(e, "redis %s: %s", argv[0], err);
        return rep;
    }
    if (redis_ensure(r, e)) return NULL;
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, NULL);
    if (!rep) {
        redis_fail(r, argv[0], e);
        return NULL;
    }
    *run_id = r->run_id;
    return rep;
}

/* The hash tag of sku's copy: "<sku>" (one slot: lane < 0) or "<sku>:<lane>"
 * (lane `lane` of a spread product). It also names the cluster route. */
static void tag_of(const char *sku, int lane, char *buf, size_t len) {
    if (lane < 0) snprintf(buf, len, "%s", sku);
    else snprintf(buf, len, "%s:%d", sku, lane);
}

/* "<prefix>{<tag>}:<suffix>[:<idx>]", the one shape of every per-SKU key. */
static char *tag_key(const fl_redis *r, const char *tag, const char *suffix, int idx) {
    char buf[512];
    if (idx >= 0) snprintf(buf, sizeof buf, "%s{%s}:%s:%d", r->prefix, tag, suffix, idx);
    else snprintf(buf, sizeof buf, "%s{%s}:%s", r->prefix, tag, suffix);
    return strdup(buf);
}

static char *sku_key(const fl_redis *r, const char *sku, const char *suffix, int idx) {
    return tag_key(r, sku, suffix, idx);
}

int fl_redis_lanes(const fl_redis *r, const char *strategy, int segments) {
    if (!r || !r->cluster || segments < 2 || segments > MAX_SEGMENTS || !strategy) return 0;
    /* The script strategies: one atomic script per order, which the
     * service runs unchanged on each lane (docs/storage.md). */
    return !strcmp(strategy, "lua") || !strcmp(strategy, "unsafe-trust-redis") ? segments : 0;
}

/* Whether <prefix>{<tag>}:gen exists: 1, 0, or -1 with e set. */
static int gen_exists(fl_redis *r, const char *tag, fl_err *e) {
    char *k = tag_key(r, tag, "gen", -1);
    if (!k) return fl_errf(e, "out of memory");
    const char *argv[] = { "EXISTS", k }, *run_id;
    redisReply *rep = redis_call(r, tag, 2, argv, &run_id, e);
    int rc = -1;
    if (rep && rep->type == REDIS_REPLY_INTEGER) rc = rep->integer > 0;
    else if (rep) fl_errf(e, "redis EXISTS %s: %s", k,
                          rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    if (rep) freeReplyObject(rep);
    free(k);
    return rc;
}

int fl_redis_forcing(fl_redis *r, const char *sku, long long *met, long long *alone, fl_err *e) {
    char *k = sku_key(r, sku, "cs", -1);
    if (!k) return fl_errf(e, "out of memory");
    const char *argv[] = { "HMGET", k, "met", "alone" }, *run_id;
    redisReply *rep = redis_call(r, sku, 4, argv, &run_id, e);
    int rc = -1;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
        *met = rep->element[0]->type == REDIS_REPLY_STRING ? atoll(rep->element[0]->str) : 0;
        *alone = rep->element[1]->type == REDIS_REPLY_STRING ? atoll(rep->element[1]->str) : 0;
        rc = 0;
    } else if (rep) {
        fl_errf(e, "redis HMGET %s: %s", k,
                rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    }
    if (rep) freeReplyObject(rep);
    free(k);
    return rc;
}

int fl_redis_find_lanes(fl_redis *r, const char *sku, int segments, int *lanes, fl_err *e) {
    char tag[96];
    *lanes = 0;
    if (!r->cluster) return 0;
    int one = gen_exists(r, sku, e);
    if (one) return one < 0 ? -1 : 0;
    tag_of(sku, 0, tag, sizeof tag);
    int first = gen_exists(r, tag, e);
    if (first <= 0) return first;
    if (segments > 1) {
        *lanes = segments > MAX_SEGMENTS ? MAX_SEGMENTS : segments;
        return 0;
    }
    int n = 1;
    for (; n < MAX_SEGMENTS; n++) {
        tag_of(sku, n, tag, sizeof tag);
        int has = gen_exists(r, tag, e);
        if (has < 0) return -1;
        if (!has) break;
    }
    *lanes = n;
    return 0;
}

/* Whether bit i of a Redis bitmap is set (SETBIT order: bit 0 is the most
 * significant bit of the first byte). */
static int bit_set(const redisReply *bm, int i) {
    if (!bm || bm->type != REDIS_REPLY_STRING || (size_t)(i / 8) >= bm->len) return 0;
    return ((unsigned char)bm->str[i / 8] & (0x80u >> (i % 8))) != 0;
}

/* The state a gen reply gives a copy (or lane) read from run_id's server,
 * and its generation into *gen. */
static fl_copy_state gen_state(const redisReply *g, const char *run_id, long long *gen) {
    *gen = 0;
    if (g->type != REDIS_REPLY_STRING) return FL_COPY_MISSING;
    const char *colon = strchr(g->str, ':');
    *gen = strtoll(g->str, NULL, 10);
    return colon && !strcmp(colon + 1, run_id) ? FL_COPY_VALID : FL_COPY_STALE;
}

/* Fills out from the MGET reply {gen, empty, stock:0 .. stock:n-1} sent by
 * the server whose run_id is run_id. */
static void read_copy(const char *run_id, const redisReply *rep, int n, fl_stock_copy *out) {
    const redisReply *empty = rep->element[1];
    memset(out, 0, sizeof *out);
    out->stranded_seg = -1;
    out->bad_lane = -1;
    out->state = gen_state(rep->element[0], run_id, &out->gen);
    out->gen_hi = out->gen;
    int seen = 0;
    for (int i = 0; i < n; i++) {
        const redisReply *s = rep->element[2 + i];
        if (s->type != REDIS_REPLY_STRING) {
            if (out->state == FL_COPY_VALID) out->state = FL_COPY_MISSING;
            continue;
        }
        long long v = strtoll(s->str, NULL, 10);
        out->total += v;
        if (!seen++ || v < out->low) {
            out->low = v;
            out->low_seg = i;
        }
        /* A set bit promises the segment holds nothing: reserve_batch.lua then
         * skips it without reading it, so units under a set bit are lost
         * to every buyer while every sum still counts them. */
        if (v > 0 && bit_set(empty, i)) {
            if (!out->stranded++) out->stranded_seg = i;
            out->stranded_units += v;
        }
    }
}

/* Room for n lanes in r->lane. */
static int lanes_room(fl_redis *r, int n, fl_err *e) {
    if (n <= r->lane_cap) return 0;
    fl_lane *l = realloc(r->lane, (size_t)n * sizeof *l);
    if (!l) return fl_errf(e, "out of memory");
    r->lane = l;
    r->lane_cap = n;
    return 0;
}

/* Lane i of sku: its gen, empty and stock:0 in one MGET on the node serving
 * {sku:i}, judged by that node's run_id. Returns 0, or -1 with e set.
 * (`empty` is read with the rest, but a lane is a copy of one segment,
 * whose bit reserve_batch.lua never consults: it strands nothing, and is not
 * judged.) */
static int read_lane(fl_redis *r, const char *sku, int i, fl_lane *l, fl_err *e) {
    char tag[96];
    tag_of(sku, i, tag, sizeof tag);
    char *argv[4] = { strdup("MGET"), tag_key(r, tag, "gen", -1), tag_key(r, tag, "empty", -1),
                      tag_key(r, tag, "stock", 0) };
    int rc = -1;
    memset(l, 0, sizeof *l);
    if (!argv[0] || !argv[1] || !argv[2] || !argv[3]) {
        fl_errf(e, "out of memory");
        goto out;
    }
    const char *run_id = "";
    redisReply *rep = redis_call(r, tag, 4, (const char **)argv, &run_id, e);
    if (!rep) goto out;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 3) {
        fl_redis_route rt;
        l->state = gen_state(rep->element[0], run_id, &l->gen);
        const redisReply *s = rep->element[2];
        if (s->type == REDIS_REPLY_STRING) {
            l->has_stock = 1;
            l->units = strtoll(s->str, NULL, 10);
        } else if (l->state == FL_COPY_VALID) {
            l->state = FL_COPY_MISSING;
        }
        snprintf(l->run_id, sizeof l->run_id, "%s", run_id);
        fl_redis_route_get(r, &rt);
        snprintf(l->node, sizeof l->node, "%s", rt.node);
        rc = 0;
    } else {
        fl_errf(e, "redis MGET {%s}: %s", tag,
                rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    }
    freeReplyObject(rep);
out:
    for (int k = 0; k < 4; k++) free(argv[k]);
    return rc;
}

/* A spread copy: every lane read on its own node, the units summed, the
 * copy valid only when every lane is (its gen naming the run_id of the
 * node serving it) and all lanes are of one generation. */
static int read_spread(fl_redis *r, const char *sku, int lanes, fl_stock_copy *out, fl_err *e) {
    memset(out, 0, sizeof *out);
    out->lanes = lanes;
    out->bad_lane = out->stranded_seg = -1;
    r->nlanes = 0;
    if (lanes_room(r, lanes, e)) return -1;
    int seen = 0, gens = 0;
    for (int i = 0; i < lanes; i++) {
        fl_lane *l = &r->lane[i];
        if (read_lane(r, sku, i, l, e)) return -1;
        r->nlanes = i + 1;
        if (l->has_stock) {
            out->total += l->units;
            if (!seen++ || l->units < out->low) {
                out->low = l->units;
                out->low_seg = i;
            }
        }
        if (l->state != FL_COPY_VALID && out->bad_lane < 0) {
            out->state = l->state;
            out->bad_lane = i;
        }
        if (l->gen) {
            if (!gens++ || l->gen < out->gen) out->gen = l->gen;
            if (l->gen > out->gen_hi) out->gen_hi = l->gen;
        }
    }
    /* One copy is lanes of one generation: lanes of two are a rebuild
     * half done, and no valid copy. */
    if (out->state == FL_COPY_VALID && out->gen != out->gen_hi) out->state = FL_COPY_MIXED;
    return 0;
}

int fl_redis_stock(fl_redis *r, const char *sku, int segments, int lanes, fl_stock_copy *out,
                   fl_err *e) {
    if (segments < 1 || segments > MAX_SEGMENTS)
        return fl_errf(e, "redis: %d segments is not a valid count", segments);
    if (lanes) {
        if (lanes < 1 || lanes > MAX_SEGMENTS)
            return fl_errf(e, "redis: %d lanes is not a valid count", lanes);
        return read_spread(r, sku, lanes, out, e);
    }
    int argc = segments + 3, rc = -1;
    char **argv = calloc((size_t)argc, sizeof *argv);
    if (!argv) return fl_errf(e, "out of memory");
    argv[0] = strdup("MGET");
    argv[1] = sku_key(r, sku, "gen", -1);
    argv[2] = sku_key(r, sku, "empty", -1);
    for (int i = 0; i < segments; i++) argv[3 + i] = sku_key(r, sku, "stock", i);
    for (int i = 0; i < argc; i++)
        if (!argv[i]) {
            fl_errf(e, "out of memory");
            goto out;
        }
    const char *run_id = "";
    redisReply *rep = redis_call(r, sku, argc, (const char **)argv, &run_id, e);
    if (!rep) goto out;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == (size_t)argc - 1) {
        read_copy(run_id, rep, segments, out);
        rc = 0;
    } else {
        fl_errf(e, "redis MGET: %s", rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    }
    freeReplyObject(rep);
out:
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
    return rc;
}

int fl_redis_lane(const fl_redis *r, int i, fl_lane *out) {
    if (i < 0 || i >= r->nlanes) return -1;
    *out = r->lane[i];
    return 0;
}

const char *fl_copy_why(const fl_stock_copy *c, char *buf, size_t len) {
    if (c->state == FL_COPY_MIXED)
        snprintf(buf, len, "its lanes are of generations %lld to %lld: a rebuild half done",
                 c->gen, c->gen_hi);
    else if (c->lanes && c->state == FL_COPY_STALE)
        snprintf(buf, len, "lane %d's gen names another Redis process", c->bad_lane);
    else if (c->lanes && c->state == FL_COPY_MISSING)
        snprintf(buf, len, "lane %d's gen or stock key is missing", c->bad_lane);
    else if (c->state == FL_COPY_STALE)
        snprintf(buf, len, "its gen names another Redis process");
    else if (c->state == FL_COPY_MISSING)
        snprintf(buf, len, "a gen or stock key is missing");
    else
        snprintf(buf, len, "valid");
    return buf;
}

/* The units a pending record holds out: its q, in format 2 ("2|<q>|...")
 * or in the JSON of format 1 (docs/storage.md). -1 when unreadable. */
static long long record_units(const redisReply *v) {
    if (v->type != REDIS_REPLY_STRING) return -1;
    if (v->len > 2 && v->str[0] == '2' && v->str[1] == '|') {
        char *end;
        long long q = strtoll(v->str + 2, &end, 10);
        return end > v->str + 2 && *end == '|' && q > 0 ? q : -1;
    }
    json_error_t je;
    json_t *j = json_loadb(v->str, v->len, 0, &je);
    json_t *q = json_object_get(j, "q");
    long long units = json_is_integer(q) ? json_integer_value(q) : -1;
    json_decref(j);
    return units;
}

/* The pending hash under tag, added to the counts. Returns 0, or -1 with e
 * set. */
static int fl_redis_pending_of(fl_redis *r, const char *tag, long long *records, long long *units,
                      long long *unreadable, fl_err *e) {
    char cursor[32] = "0";
    char *key = tag_key(r, tag, "pending", -1);
    if (!key) return fl_errf(e, "out of memory");
    int rc = -1;
    do {
        const char *argv[] = { "HSCAN", key, cursor, "COUNT", "500" }, *run_id;
        redisReply *rep = redis_call(r, tag, 5, argv, &run_id, e);
        if (!rep) goto out;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY) {
            fl_errf(e, "redis HSCAN %s: %s", key,
                    rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
            freeReplyObject(rep);
            goto out;
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        const redisReply *kv = rep->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) {
            long long q = record_units(kv->element[i + 1]);
            (*records)++;
            if (q < 0) (*unreadable)++;
            else *units += q;
        }
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
    rc = 0;
out:
    free(key);
    return rc;
}

int fl_redis_pending(fl_redis *r, const char *sku, int lanes, long long *records,
                     long long *units, long long *unreadable, fl_err *e) {
    char tag[96];
    *records = *units = *unreadable = 0;
    for (int i = lanes ? 0 : -1; i < lanes; i++) {
        tag_of(sku, i, tag, sizeof tag);
        if (fl_redis_pending_of(r, tag, records, units, unreadable, e)) return -1;
    }
    return 0;
}

/* Appends the order-id fields of one HSCAN page to *ids; -1 out of memory. */
static int add_fields(const redisReply *kv, fl_order_id **ids, size_t *n, size_t *cap) {
    for (size_t i = 0; i + 1 < kv->elements; i += 2) {
        const redisReply *f = kv->element[i];
        if (f->type != REDIS_REPLY_STRING || f->len != FL_ORDER_ID_LEN)
            continue;                                  /* not an order id */
        if (*n == *cap) {
            size_t c = *cap ? *cap * 2 : 256;
            void *p = realloc(*ids, c * sizeof **ids);
            if (!p) return -1;
            *ids = p;
            *cap = c;
        }
        memcpy((*ids)[*n], f->str, FL_ORDER_ID_LEN);
        (*ids)[(*n)++][FL_ORDER_ID_LEN] = '\0';
    }
    return 0;
}

/* Reads one HSCAN page of key (under tag) from *cursor (which it advances)
 * into *ids. Returns 0, or -1 with e set. */
static int returned_page(fl_redis *r, const char *tag, const char *key, char *cursor,
                         size_t cursor_len, fl_order_id **ids, size_t *n, size_t *cap, fl_err *e) {
    const char *argv[] = { "HSCAN", key, cursor, "COUNT", "1000" }, *run_id;
    redisReply *rep = redis_call(r, tag, 5, argv, &run_id, e);
    if (!rep) return -1;
    int rc = -1;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING || rep->element[1]->type != REDIS_REPLY_ARRAY)
        fl_errf(e, "redis HSCAN %s: %s", key,
                rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    else if (add_fields(rep->element[1], ids, n, cap))
        fl_errf(e, "out of memory");
    else
        rc = 0;
    if (rc == 0) snprintf(cursor, cursor_len, "%s", rep->element[0]->str);
    freeReplyObject(rep);
    return rc;
}

/* The fields of the hash key (under tag), appended to *ids. Returns 0, or
 * -1 with e set. */
static int hash_ids(fl_redis *r, const char *tag, const char *key, fl_order_id **ids, size_t *n,
                    size_t *cap, fl_err *e) {
    char cursor[32] = "0";
    int rc = 0;
    for (long page = 0; page < 10000000; page++) {      /* HSCAN ends: a bound all the same */
        rc = returned_page(r, tag, key, cursor, sizeof cursor, ids, n, cap, e);
        if (rc || !strcmp(cursor, "0")) break;
    }
    return rc;
}

/* One key a SCAN for "<prefix>{tag}:returned:*" found: a bucket of markers
 * (read into *ids) or the watermark (into *before). */
static int returned_key(fl_redis *r, const char *tag, const redisReply *k, fl_order_id **ids,
                        size_t *n, size_t *cap, long long *before, fl_err *e) {
    if (k->type != REDIS_REPLY_STRING) return 0;
    const char *last = strrchr(k->str, ':');
    if (!last) return 0;
    if (!strcmp(last, ":before")) {
        const char *argv[] = { "GET", k->str }, *run_id;
        redisReply *rep = redis_call(r, tag, 2, argv, &run_id, e);
        if (!rep) return -1;
        if (rep->type == REDIS_REPLY_STRING) *before = strtoll(rep->str, NULL, 10);
        freeReplyObject(rep);
        return 0;
    }
    if (!last[1] || strspn(last + 1, "0123456789") != strlen(last + 1)) return 0;
    return hash_ids(r, tag, k->str, ids, n, cap, e);
}

/* The markers under tag -- the legacy `returned` hash and the time
 * buckets `returned:<b>` (the service's stock/lua/return.lua) -- appended
 * to *ids, and the forgetting watermark `returned:before` in *before (0:
 * none). The buckets are found by SCAN (their names follow the decisions'
 * times), on the node serving tag's slot. SCAN names no key, so it follows
 * no ASK: while the slot migrates, buckets already moved are not seen (a
 * reader may then count markers missing). It runs first, so that the node
 * said to serve the copy is the one the legacy hash's HSCAN, a key's
 * command, was answered by. Returns 0, or -1 with e set. */
static int returned_of(fl_redis *r, const char *tag, fl_order_id **ids, size_t *n, size_t *cap,
                       long long *before, fl_err *e) {
    char *key = tag_key(r, tag, "returned", -1), pattern[600], cursor[32] = "0";
    if (!key) return fl_errf(e, "out of memory");
    int rc = 0, k = 0;
    /* The pattern: the legacy key's text, glob characters escaped, + ":*". */
    for (const char *c = key; *c && k < (int)sizeof pattern - 4; c++) {
        if (strchr("*?[]\\", *c)) pattern[k++] = '\\';
        pattern[k++] = *c;
    }
    memcpy(pattern + k, ":*", 3);
    *before = 0;
    for (long page = 0; !rc && page < 10000000; page++) {
        const char *argv[] = { "SCAN", cursor, "MATCH", pattern, "COUNT", "1000" }, *run_id;
        redisReply *rep = redis_call(r, tag, 6, argv, &run_id, e);
        if (!rep) {
            rc = -1;
            break;
        }
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = fl_errf(e, "redis SCAN %s: %s", pattern,
                         rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        } else {
            snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
            for (size_t i = 0; !rc && i < rep->element[1]->elements; i++)
                rc = returned_key(r, tag, rep->element[1]->element[i], ids, n, cap, before, e);
        }
        freeReplyObject(rep);
        if (!strcmp(cursor, "0")) break;
    }
    if (!rc) rc = hash_ids(r, tag, key, ids, n, cap, e);
    free(key);
    return rc;
}

int fl_redis_returned(fl_redis *r, const char *sku, int lanes, fl_order_id **ids, size_t *n,
                      long long *before_ms, fl_err *e) {
    char tag[96];
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    if (before_ms) *before_ms = -1;
    for (int i = lanes ? 0 : -1; i < lanes; i++) {
        long long before = 0;
        tag_of(sku, i, tag, sizeof tag);
        int rc = returned_of(r, tag, ids, n, &cap, &before, e);
        if (before_ms && (*before_ms < 0 || before < *before_ms)) *before_ms = before;
        if (rc) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return -1;
        }
    }
    if (*n > 1) qsort(*ids, *n, sizeof **ids, fl_order_id_cmp);
    /* An order taken in steps was given back to each lane it took from:
     * one id each. */
    size_t k = *n ? 1 : 0;
    for (size_t i = 1; i < *n; i++)
        if (strcmp((*ids)[i], (*ids)[k - 1])) memcpy((*ids)[k++], (*ids)[i], sizeof **ids);
    *n = k;
    return 0;
}
