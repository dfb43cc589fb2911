/* client.c: a blocking connection that takes a command to where it must
 * run, on any of the three topologies, for tools and tests (the service's
 * own connections use the pieces of rtopo.h directly).
 *
 * One connection per node, opened on first use. A redirection, TRYAGAIN,
 * CLUSTERDOWN or an answer saying "not the primary" means the command did
 * not run, so it is sent again after routing again (MOVED: the map takes
 * the new owner; CLUSTERDOWN, READONLY: the map is reloaded; Sentinel: the
 * primary is found again). A connection that fails after the command went
 * out is another matter: the command may have run, so it is not resent.
 * See rtopo.h for the contract. */
#include "rtopo/rtopo.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "rtopo/internal.h"

/* The retry budget is rtopo.h's (RTOPO_CLIENT_*), beside the service's. */
#define TRIES RTOPO_CLIENT_TRIES
#define FIRST_PAUSE_MS RTOPO_CLIENT_PAUSE_MS
#define MAX_PAUSE_MS RTOPO_CLIENT_PAUSE_MAX_MS

typedef struct node_conn {
    rconn_addr addr;
    redisContext *c;
} node_conn;

struct rtopo_client {
    rtopo_spec spec;
    int timeout_ms;
    rtopo_slotmap *map;          /* CLUSTER */
    rconn_addr primary;          /* SENTINEL: found; SINGLE: the server */
    int have_primary;
    node_conn *conns;
    int nconns;
};

rtopo_client *rtopo_client_new(const rtopo_spec *spec, int timeout_ms) {
    rtopo_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    assert(spec->nseeds >= 1);
    c->spec = *spec;
    c->timeout_ms = timeout_ms;
    if (spec->kind == RTOPO_CLUSTER && !(c->map = rtopo_slotmap_new())) {
        free(c);
        return NULL;
    }
    if (spec->kind == RTOPO_SINGLE) {
        c->primary = spec->seeds[0];
        c->have_primary = 1;
    }
    return c;
}

void rtopo_client_free(rtopo_client *c) {
    if (!c) return;
    for (int i = 0; i < c->nconns; i++)
        if (c->conns[i].c) redisFree(c->conns[i].c);
    free(c->conns);
    rtopo_slotmap_free(c->map);
    free(c);
}

/* ------------------------------------------------------- connections */

static node_conn *find_conn(rtopo_client *c, const rconn_addr *a) {
    for (int i = 0; i < c->nconns; i++)
        if (c->conns[i].addr.port == a->port && !strcmp(c->conns[i].addr.host, a->host) &&
            !strcmp(c->conns[i].addr.path, a->path))
            return &c->conns[i];
    node_conn *n = realloc(c->conns, sizeof *n * (size_t)(c->nconns + 1));
    if (!n) return NULL;
    c->conns = n;
    n = &c->conns[c->nconns++];
    n->addr = *a;
    n->c = NULL;
    return n;
}

/* An open connection to a, or NULL with err. */
static redisContext *conn_to(rtopo_client *c, const rconn_addr *a, char *err, size_t errlen) {
    node_conn *n = find_conn(c, a);
    if (!n) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!n->c) n->c = rconn_connect(a, c->timeout_ms, err, errlen);
    return n->c;
}

static void drop_conn(rtopo_client *c, redisContext *ctx) {
    for (int i = 0; i < c->nconns; i++)
        if (c->conns[i].c == ctx) {
            redisFree(ctx);
            c->conns[i].c = NULL;
        }
}

/* ------------------------------------------------------------ routing */

/* Where a command on key goes now: 0 with *a, or -1 with err. */
static int route(rtopo_client *c, const char *key, size_t keylen, rconn_addr *a, char *err,
                 size_t errlen) {
    assert(!c->map == (c->spec.kind != RTOPO_CLUSTER));      /* the map is a cluster's */
    if (c->spec.kind != RTOPO_CLUSTER) {
        assert(c->have_primary || c->spec.kind == RTOPO_SENTINEL);  /* a server is never lost */
        if (!c->have_primary &&
            rtopo_sentinel_discover(&c->spec, c->timeout_ms, &c->primary, err, errlen))
            return -1;
        c->have_primary = 1;
        *a = c->primary;
        return 0;
    }
    if (rtopo_slotmap_served(c->map) == 0 &&
        rtopo_slotmap_load(c->map, &c->spec, c->timeout_ms, err, errlen))
        return -1;
    int slot = key ? rtopo_slot(key, keylen) : 0;
    const rtopo_shard *s = rtopo_slotmap_lookup(c->map, slot);
    if (!s) {
        snprintf(err, errlen, "no node serves slot %d", slot);
        return -1;
    }
    *a = s->primary;
    return 0;
}

/* Forgets what routed to the wrong place: the primary, or the map. */
static void forget(rtopo_client *c) {
    char ignored[256];
    if (c->spec.kind == RTOPO_SENTINEL) c->have_primary = 0;
    if (c->spec.kind == RTOPO_CLUSTER)
        rtopo_slotmap_load(c->map, &c->spec, c->timeout_ms, ignored, sizeof ignored);
}

/* Sends argv on ctx, after ASKING when asking; NULL on an I/O error. */
static redisReply *send_cmd(redisContext *ctx, int asking, int argc, const char **argv,
                            const size_t *argvlen) {
    void *r = NULL;
    if (!asking) return redisCommandArgv(ctx, argc, argv, argvlen);
    if (redisAppendCommand(ctx, "ASKING") != REDIS_OK ||
        redisAppendCommandArgv(ctx, argc, argv, argvlen) != REDIS_OK ||
        redisGetReply(ctx, &r) != REDIS_OK)
        return NULL;
    freeReplyObject(r);         /* ASKING's +OK */
    r = NULL;
    if (redisGetReply(ctx, &r) != REDIS_OK) return NULL;
    return r;
}

static void pause_for(int *pause_ms) {
    clock_sleep_ms(*pause_ms);
    if (*pause_ms < MAX_PAUSE_MS) *pause_ms *= 2;
}

redisReply *rtopo_client_run(rtopo_client *c, const char *key, size_t keylen, int argc,
                             const char **argv, const size_t *argvlen, char *err,
                             size_t errlen) {
    rtopo_redirect rd;
    rconn_addr a;
    int asking = 0, pause_ms = FIRST_PAUSE_MS;
    char why[512] = "no attempt";
    for (int t = 0; t < TRIES; t++) {
        if (!asking && route(c, key, keylen, &a, why, sizeof why)) {
            forget(c);
            pause_for(&pause_ms);
            continue;
        }
        redisContext *ctx = conn_to(c, &a, why, sizeof why);
        if (!ctx) {                  /* not sent: route again and retry */
            asking = 0;
            forget(c);
            pause_for(&pause_ms);
            continue;
        }
        redisReply *r = send_cmd(ctx, asking, argc, argv, argvlen);
        asking = 0;
        if (!r) {
            snprintf(err, errlen, "%s:%d: %s (the command may or may not have run)", a.host,
                     a.port, ctx->errstr);
            drop_conn(c, ctx);
            forget(c);
            return NULL;
        }
        rtopo_verdict v = rtopo_classify(r, &rd);
        if (v == RTOPO_OK || v == RTOPO_ERROR ||
            (c->spec.kind != RTOPO_CLUSTER && v != RTOPO_REDISCOVER))
            return r;         /* redirections from a server we do not route by slot */
        assert(c->spec.kind == RTOPO_CLUSTER || v == RTOPO_REDISCOVER);
        snprintf(why, sizeof why, "%s:%d: %.*s", a.host, a.port,
                 (int)(r->len > 200 ? 200 : r->len), r->str);
        freeReplyObject(r);
        switch (v) {
        case RTOPO_OK:
        case RTOPO_ERROR:
            break;
        case RTOPO_MOVED:
            if (rtopo_slotmap_moved(c->map, &c->spec, &rd)) forget(c);
            break;
        case RTOPO_ASK:
            rtopo_node_addr(&c->spec, rd.host, rd.port, &a);
            asking = 1;
            break;
        case RTOPO_TRYAGAIN:
            pause_for(&pause_ms);
            break;
        case RTOPO_CLUSTERDOWN:
        case RTOPO_REDISCOVER:
            forget(c);
            pause_for(&pause_ms);
            break;
        }
    }
    snprintf(err, errlen, "gave up after %d attempts; last: %s", TRIES, why);
    return NULL;
}
