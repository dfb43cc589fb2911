/* cluster.c: the verifier's own way around a Redis Cluster.
 *
 * flashload reads the service's Redis by docs/storage.md and shares no code
 * with the service's routing (rtopo/, stock/): a wrong slot, a missed
 * redirection or a stale slot map there must not be wrong the same way
 * here. So this file does the simplest thing that is always right: it asks
 * the cluster instead of computing. A command goes to the node last seen
 * serving the SKU (or to a seed), and the answer says where to go:
 *
 *   -MOVED <slot> <host>:<port>  the slot lives there: go, resend, and
 *                                remember that node for the SKU;
 *   -ASK <slot> <host>:<port>    the slot is moving and the key is already
 *                                there: ASKING, then the command on that
 *                                node, this once (not remembered);
 *   -TRYAGAIN, -CLUSTERDOWN      a move half done (some of the keys moved),
 *                                a failover under way: wait 50 ms, resend
 *                                (40 sends in all at most);
 *   a connection error           forget the node, start again from the
 *                                next seed (each seed once at most).
 *
 * No slot hashing is needed: every key of one SKU carries the hash tag
 * {<sku>} (docs/storage.md), so a read of one SKU goes to one node and the
 * SKU itself names the route; a product spread over the cluster's lanes
 * has a hash tag per lane, {<sku>:<i>}, and stores.c reads each lane with
 * "<sku>:<i>" as the route's name, as if it were a SKU of its own.
 * Connections are kept per node address (a small cache); each has the
 * run_id of its server (INFO server, read when it opens), since a stock
 * copy's gen (a lane's too) is valid only against the run_id of the node
 * that served the read. */
#include "loadtest/stores/cluster_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rconn.h"

#define MAX_SEEDS 16
#define MAX_NODES 32             /* connections kept; the least used one goes */
#define MAX_ROUTES 256           /* SKUs (or lanes) whose node is remembered */
#define MAX_SENDS 40             /* sends of one command, redirections included */
#define RETRY_MS 50              /* wait after TRYAGAIN, CLUSTERDOWN */
#define DEFAULT_PORT 6379

typedef struct node {
    char host[256];
    int port;                    /* 0: a free entry */
    redisContext *ctx;           /* NULL: not connected */
    char run_id[41];
    unsigned long used;          /* when last used, for eviction */
} node;

typedef struct route {
    char sku[129];
    char host[256];
    int port;
} route;

struct fl_cluster {
    char seed_host[MAX_SEEDS][256];
    int seed_port[MAX_SEEDS];
    int nseeds, seed_at;         /* the seed a call without a route starts at */
    char user[128], password[256];
    int timeout_ms;
    node nodes[MAX_NODES];
    unsigned long tick;
    route routes[MAX_ROUTES];
    int nroutes, next_route;
    fl_redis_route seen;         /* the last answer's node, redirections counted */
};

/* ------------------------------------------------------------------ the URL */

/* "[user]:password@" before the last '@' of s, into c. Returns what
 * follows, or NULL with err set. */
static const char *fl_cluster_parse_auth(fl_cluster *c, const char *s, char *err, size_t errlen) {
    const char *at = strrchr(s, '@');
    if (!at) return s;
    const char *colon = memchr(s, ':', (size_t)(at - s));
    size_t ulen = colon ? (size_t)(colon - s) : 0, plen = colon ? (size_t)(at - colon - 1) : 0;
    if (!colon) {
        snprintf(err, errlen, "bad credentials (want [user]:password@ before the addresses)");
        return NULL;
    }
    if (ulen >= sizeof c->user || plen >= sizeof c->password) {
        snprintf(err, errlen, "user or password too long");
        return NULL;
    }
    memcpy(c->user, s, ulen);
    memcpy(c->password, colon + 1, plen);
    return at + 1;
}

/* A port, 1..65535, of exactly n digits. Returns it, or -1. */
static int parse_port(const char *s, size_t n) {
    long v = 0;
    if (n == 0 || n > 5) return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= 65535 ? (int)v : -1;
}

/* "host[:port]" or "[v6addr][:port]", n bytes at s, into host and *port.
 * Returns 0, or -1. */
static int parse_hostport(const char *s, size_t n, char *host, size_t hostcap, int *port) {
    const char *h = s, *hend, *colon = NULL, *end = s + n;
    if (n && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || close == s + 1 || (close + 1 < end && close[1] != ':')) return -1;
        h = s + 1;
        hend = close;
        if (close + 1 < end) colon = close + 1;
    } else {
        colon = memchr(s, ':', n);
        hend = colon ? colon : end;
        if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1))) return -1;
    }
    size_t hl = (size_t)(hend - h);
    if (hl == 0 || hl >= hostcap || memchr(h, ' ', hl)) return -1;
    *port = colon ? parse_port(colon + 1, (size_t)(end - colon - 1)) : DEFAULT_PORT;
    if (*port < 0) return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    return 0;
}

/* The seed list "host[:port][,host[:port]...]" up to end. */
static int parse_seeds(fl_cluster *c, const char *p, const char *end, char *err, size_t errlen) {
    if (p == end) {
        snprintf(err, errlen, "no node address after redis-cluster://");
        return -1;
    }
    for (int i = 1;; i++) {
        const char *comma = memchr(p, ',', (size_t)(end - p)), *e = comma ? comma : end;
        if (c->nseeds == MAX_SEEDS) {
            snprintf(err, errlen, "more than %d node addresses", MAX_SEEDS);
            return -1;
        }
        if (e == p) {
            snprintf(err, errlen, "node address %d of the list is empty", i);
            return -1;
        }
        if (parse_hostport(p, (size_t)(e - p), c->seed_host[c->nseeds],
                           sizeof c->seed_host[0], &c->seed_port[c->nseeds])) {
            snprintf(err, errlen, "bad node address '%.*s' (want host[:port], port 1-65535, "
                     "[v6addr] for IPv6)", (int)(e - p), p);
            return -1;
        }
        c->nseeds++;
        if (!comma) return 0;
        p = comma + 1;
    }
}

/* What may follow the list: nothing or a lone '/'. */
static int parse_tail(const char *p, char *err, size_t errlen) {
    if (!*p || !strcmp(p, "/")) return 0;
    if (strstr(p, "db=") || (p[0] == '/' && p[1] >= '0' && p[1] <= '9'))
        snprintf(err, errlen, "a database given, but a Redis Cluster has only database 0");
    else
        snprintf(err, errlen, "unexpected '%s' after the node addresses", p);
    return -1;
}

fl_cluster *fl_cluster_open(const char *url, int timeout_ms, char *err, size_t errlen) {
    size_t sl = strlen(FL_CLUSTER_SCHEME);
    if (strncmp(url, FL_CLUSTER_SCHEME, sl)) {
        snprintf(err, errlen, "not a %s URL", FL_CLUSTER_SCHEME);
        return NULL;
    }
    fl_cluster *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 2000;
    const char *p = fl_cluster_parse_auth(c, url + sl, err, errlen);
    const char *end = p ? p + strcspn(p, "/?") : NULL;
    if (!p || parse_seeds(c, p, end, err, errlen) || parse_tail(end, err, errlen)) {
        free(c);
        return NULL;
    }
    return c;
}

/* -------------------------------------------------------------------- nodes */

static void node_drop(node *n) {
    if (n->ctx) redisFree(n->ctx);
    n->ctx = NULL;
    n->run_id[0] = '\0';
}

void fl_cluster_close(fl_cluster *c) {
    if (!c) return;
    for (int i = 0; i < MAX_NODES; i++) node_drop(&c->nodes[i]);
    free(c);
}

/* The entry of host:port, made (in a free entry, else in place of the one
 * used longest ago) when there is none. Never NULL. */
static node *fl_cluster_node_get(fl_cluster *c, const char *host, int port) {
    node *victim = &c->nodes[0];
    for (int i = 0; i < MAX_NODES; i++) {
        node *n = &c->nodes[i];
        if (n->port == port && !strcmp(n->host, host)) return n;
        if (victim->port && (!n->port || n->used < victim->used)) victim = n;
    }
    node_drop(victim);
    snprintf(victim->host, sizeof victim->host, "%s", host);
    victim->port = port;
    return victim;
}

/* Connects n if it is not, with the URL's credentials, and reads its
 * run_id. Returns 0, or -1 with err set (n left unconnected). */
static int node_ready(fl_cluster *c, node *n, char *err, size_t errlen) {
    n->used = ++c->tick;
    if (n->ctx) return 0;
    rconn_addr a;
    char e[256];
    memset(&a, 0, sizeof a);
    snprintf(a.host, sizeof a.host, "%s", n->host);
    a.port = n->port;
    memcpy(a.user, c->user, sizeof a.user);
    memcpy(a.password, c->password, sizeof a.password);
    if (!(n->ctx = rconn_connect(&a, c->timeout_ms, e, sizeof e))) {
        snprintf(err, errlen, "%.100s:%d: %.150s", n->host, n->port, e);
        return -1;
    }
    if (rconn_run_id(n->ctx, n->run_id)) {
        snprintf(err, errlen, "%.100s:%d: INFO server: %.120s", n->host, n->port,
                 n->ctx->err ? n->ctx->errstr : "no run_id in the answer");
        node_drop(n);
        return -1;
    }
    return 0;
}

/* Sends argv on n, after ASKING when asking. Returns the reply (ASKING's
 * own when that was refused), or NULL on a connection error. */
static redisReply *node_send(node *n, int asking, int argc, const char **argv) {
    redisReply *ask = NULL, *rep = NULL;
    if (asking && redisAppendCommand(n->ctx, "ASKING") != REDIS_OK) return NULL;
    if (redisAppendCommandArgv(n->ctx, argc, argv, NULL) != REDIS_OK) return NULL;
    if (asking && redisGetReply(n->ctx, (void **)&ask) != REDIS_OK) return NULL;
    if (redisGetReply(n->ctx, (void **)&rep) != REDIS_OK) {
        if (ask) freeReplyObject(ask);
        return NULL;
    }
    if (ask && ask->type == REDIS_REPLY_ERROR) {
        freeReplyObject(rep);
        return ask;
    }
    if (ask) freeReplyObject(ask);
    return rep;
}

/* ------------------------------------------------------------------- routes */

static route *route_find(fl_cluster *c, const char *sku) {
    for (int i = 0; i < c->nroutes; i++)
        if (!strcmp(c->routes[i].sku, sku)) return &c->routes[i];
    return NULL;
}

/* Remembers n as the node serving sku (a SKU too long to keep is not). */
static void route_set(fl_cluster *c, const char *sku, const node *n) {
    route *r = route_find(c, sku);
    if (!r && strlen(sku) >= sizeof r->sku) return;
    if (!r) {
        r = &c->routes[c->nroutes < MAX_ROUTES ? c->nroutes++ : c->next_route];
        if (c->nroutes == MAX_ROUTES) c->next_route = (c->next_route + 1) % MAX_ROUTES;
        snprintf(r->sku, sizeof r->sku, "%s", sku);
    }
    snprintf(r->host, sizeof r->host, "%s", n->host);
    r->port = n->port;
}

static void route_forget(fl_cluster *c, const char *sku) {
    route *r = route_find(c, sku);
    if (r) r->port = 0;
}

/* Where a call for sku starts: its remembered node, else the seed now in
 * turn. */
static node *route_start(fl_cluster *c, const char *sku) {
    const route *r = route_find(c, sku);
    if (r && r->port) return fl_cluster_node_get(c, r->host, r->port);
    return fl_cluster_node_get(c, c->seed_host[c->seed_at], c->seed_port[c->seed_at]);
}

/* --------------------------------------------------------------- the answer */

typedef enum { ANSWER, MOVED, ASK, RETRY } answer_kind;

static int fl_cluster_starts(const redisReply *r, const char *word) {
    size_t n = strlen(word);
    return r->len >= n && !strncmp(r->str, word, n) && (r->len == n || r->str[n] == ' ');
}

static answer_kind fl_cluster_kind_of(const redisReply *r) {
    if (r->type != REDIS_REPLY_ERROR || !r->str) return ANSWER;
    if (fl_cluster_starts(r, "MOVED")) return MOVED;
    if (fl_cluster_starts(r, "ASK")) return ASK;
    if (fl_cluster_starts(r, "TRYAGAIN") || fl_cluster_starts(r, "CLUSTERDOWN")) return RETRY;
    return ANSWER;
}

/* The "<host>:<port>" of "MOVED|ASK <slot> <host>:<port>" into host and
 * *port; an empty host (a node that does not know its own address) is
 * from's, the node that answered. Returns 0, or -1 when unreadable. */
static int redirect_target(const redisReply *r, const node *from, char *host, size_t cap,
                           int *port) {
    const char *sp = strchr(r->str, ' ');
    const char *addr = sp ? strchr(sp + 1, ' ') : NULL;
    const char *colon = addr ? strrchr(addr + 1, ':') : NULL;
    if (!colon || (*port = parse_port(colon + 1, strlen(colon + 1))) < 0) return -1;
    size_t hl = (size_t)(colon - addr - 1);
    if (hl >= cap) return -1;
    if (hl == 0) {
        snprintf(host, cap, "%s", from->host);
        return 0;
    }
    memcpy(host, addr + 1, hl);
    host[hl] = '\0';
    return 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ a call */

/* One call's way through the cluster. */
typedef struct walk {
    node *home;                  /* the node believed to serve the SKU */
    node *to;                    /* where the next send goes: home, or ASK's node */
    int asking;
    int dead, dead_max;          /* connection errors in a row; how many end the call */
    char last[300];              /* the last trouble, for the final error */
} walk;

/* After a connection error on w->to: forget it and the route, move on to
 * the next seed when it was the seed in turn. Returns -1 once every seed
 * (and the remembered node) failed in a row. */
static int walk_lost(fl_cluster *c, walk *w, const char *sku) {
    node *n = w->to;
    if (n->port == c->seed_port[c->seed_at] && !strcmp(n->host, c->seed_host[c->seed_at]))
        c->seed_at = (c->seed_at + 1) % c->nseeds;
    node_drop(n);
    route_forget(c, sku);
    c->seen.reconnects++;
    if (++w->dead >= w->dead_max) return -1;
    w->home = w->to = route_start(c, sku);
    w->asking = 0;
    return 0;
}

/* Follows a MOVED, ASK, TRYAGAIN or CLUSTERDOWN reply. Returns 0, or -1
 * when the redirection cannot be read. */
static int walk_redirect(fl_cluster *c, walk *w, answer_kind k, const redisReply *rep) {
    char host[256];
    int port;
    snprintf(w->last, sizeof w->last, "%.100s:%d answered %.150s", w->to->host, w->to->port,
             rep->str);
    if (k == RETRY) {
        c->seen.retried++;
        w->to = w->home;
        w->asking = 0;
        sleep_ms(RETRY_MS);
        return 0;
    }
    if (redirect_target(rep, w->to, host, sizeof host, &port)) return -1;
    node *n = fl_cluster_node_get(c, host, port);
    if (k == MOVED) {
        c->seen.moved++;
        w->home = n;
    } else {
        c->seen.ask++;
    }
    w->to = n;
    w->asking = k == ASK;
    return 0;
}

/* The answer of w->to: remembered as sku's node unless it came by ASK. */
static redisReply *walk_done(fl_cluster *c, walk *w, const char *sku, redisReply *rep,
                             const char **run_id) {
    if (!w->asking) route_set(c, sku, w->to);
    snprintf(c->seen.node, sizeof c->seen.node, "%s:%d", w->to->host, w->to->port);
    memcpy(c->seen.run_id, w->to->run_id, sizeof c->seen.run_id);
    *run_id = w->to->run_id;
    return rep;
}

redisReply *fl_cluster_call(fl_cluster *c, const char *sku, int argc, const char **argv,
                            const char **run_id, char *err, size_t errlen) {
    const route *r = route_find(c, sku);
    walk w = { .asking = 0, .dead = 0, .dead_max = c->nseeds + (r && r->port), .last = "" };
    w.home = w.to = route_start(c, sku);
    for (int sends = 0; sends < MAX_SENDS; sends++) {
        redisReply *rep = NULL;
        int lost = node_ready(c, w.to, w.last, sizeof w.last);
        if (!lost && !(rep = node_send(w.to, w.asking, argc, argv))) {
            snprintf(w.last, sizeof w.last, "%.100s:%d: %.120s", w.to->host, w.to->port,
                     w.to->ctx->errstr[0] ? w.to->ctx->errstr : "connection lost");
            lost = 1;
        }
        if (lost) {
            if (walk_lost(c, &w, sku)) {
                snprintf(err, errlen, "no node of the cluster answered (last: %s)", w.last);
                return NULL;
            }
            continue;
        }
        w.dead = 0;
        answer_kind k = fl_cluster_kind_of(rep);
        if (k == ANSWER) return walk_done(c, &w, sku, rep, run_id);
        int bad = walk_redirect(c, &w, k, rep);
        if (bad) snprintf(err, errlen, "unreadable redirection '%s'", rep->str);
        freeReplyObject(rep);
        if (bad) return NULL;
    }
    snprintf(err, errlen, "no answer for {%s} after %d sends (last: %s)", sku, MAX_SENDS, w.last);
    return NULL;
}

void fl_cluster_route(const fl_cluster *c, fl_redis_route *out) { *out = c->seen; }
