/* slotmap.c: which primary serves each of the 16384 cluster slots, read
 * from CLUSTER SLOTS, and what a node's answer means for routing (MOVED,
 * ASK, TRYAGAIN, CLUSTERDOWN, READONLY, ...).
 *
 * CLUSTER SLOTS rather than CLUSTER SHARDS: it answers on every Redis with
 * cluster support (3.0 on; SHARDS is 7.0 only) and names, per range of
 * slots, the primary first and then its replicas, which is all routing
 * needs. Everything in the answer is checked before the map changes: a
 * malformed answer leaves the map as it was.
 * See rtopo.h for the contract. */
#include "rtopo/rtopo.h"

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtopo/internal.h"

struct rtopo_slotmap {
    int16_t owner[RTOPO_SLOTS];    /* index into shards, -1: nobody */
    int nshards, cap;
    rtopo_shard *shards;
};

rtopo_slotmap *rtopo_slotmap_new(void) {
    rtopo_slotmap *m = calloc(1, sizeof *m);
    if (m) memset(m->owner, 0xff, sizeof m->owner);
    return m;
}

static void clear_shards(rtopo_slotmap *m) {
    for (int i = 0; i < m->nshards; i++) free(m->shards[i].replicas);
    free(m->shards);
    m->shards = NULL;
    m->nshards = m->cap = 0;
}

void rtopo_slotmap_free(rtopo_slotmap *m) {
    if (!m) return;
    clear_shards(m);
    free(m);
}

/* The shard whose primary is host:port, or -1. */
static int find_shard(const rtopo_slotmap *m, const char *host, int port) {
    for (int i = 0; i < m->nshards; i++)
        if (m->shards[i].primary.port == port && !strcmp(m->shards[i].primary.host, host))
            return i;
    return -1;
}

/* A new shard with primary host:port (no replicas yet): its index, or -1. */
static int add_shard(rtopo_slotmap *m, const rtopo_spec *spec, const char *host, int port) {
    assert(find_shard(m, host, port) < 0);     /* one shard per primary */
    if (m->nshards == m->cap) {
        int cap = m->cap ? m->cap * 2 : 8;
        rtopo_shard *s = realloc(m->shards, sizeof *s * (size_t)cap);
        if (!s) return -1;
        m->shards = s;
        m->cap = cap;
    }
    rtopo_shard *s = &m->shards[m->nshards];
    memset(s, 0, sizeof *s);
    rtopo_node_addr(spec, host, port, &s->primary);
    return m->nshards++;
}

/* ------------------------------------------------ reading CLUSTER SLOTS */

/* A node of an entry: [host, port, id?, ...]. host "" is the node asked;
 * "?" (an endpoint the node does not know) is left out: *port = 0. */
static int read_node(const redisReply *n, const char *asked, char *host, size_t cap, int *port,
                     char id[41]) {
    if (n->type != REDIS_REPLY_ARRAY || n->elements < 2 ||
        n->element[0]->type != REDIS_REPLY_STRING || n->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    const redisReply *h = n->element[0];
    long long p = n->element[1]->integer;
    id[0] = '\0';
    if (n->elements > 2 && n->element[2]->type == REDIS_REPLY_STRING)
        rtopo_copy(id, 41, n->element[2]->str, n->element[2]->len);
    if (h->len == 1 && h->str[0] == '?') {
        *port = 0;
        return 0;
    }
    if (p < 1 || p > 65535 || memchr(h->str, '\0', h->len)) return -1;
    *port = (int)p;
    if (h->len == 0) return rtopo_copy(host, cap, asked, strlen(asked));
    return rtopo_copy(host, cap, h->str, h->len);
}

static int add_replica(rtopo_shard *s, const rtopo_spec *spec, const char *host, int port) {
    for (int i = 0; i < s->nreplicas; i++)
        if (s->replicas[i].port == port && !strcmp(s->replicas[i].host, host)) return 0;
    rconn_addr *r = realloc(s->replicas, sizeof *r * (size_t)(s->nreplicas + 1));
    if (!r) return -1;
    s->replicas = r;
    rtopo_node_addr(spec, host, port, &r[s->nreplicas++]);
    return 0;
}

/* One entry [start, end, primary, replica...] into m. */
static int read_entry(rtopo_slotmap *m, const rtopo_spec *spec, const char *asked,
                      const redisReply *e, char *err, size_t errlen) {
    char host[256], id[41];
    int port, shard;
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER)
        goto bad;
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    if (lo < 0 || hi < lo || hi >= RTOPO_SLOTS) goto bad;
    if (read_node(e->element[2], asked, host, sizeof host, &port, id)) goto bad;
    if (!port) return 0;           /* a primary nobody can reach: unserved */
    shard = find_shard(m, host, port);
    if (shard < 0 && (shard = add_shard(m, spec, host, port)) < 0) goto oom;
    assert(shard < m->nshards);
    memcpy(m->shards[shard].id, id, sizeof id);
    for (size_t i = 3; i < e->elements; i++) {
        if (read_node(e->element[i], asked, host, sizeof host, &port, id)) goto bad;
        if (port && add_replica(&m->shards[shard], spec, host, port)) goto oom;
    }
    for (long long s = lo; s <= hi; s++) m->owner[s] = (int16_t)shard;
    return 0;
bad:
    snprintf(err, errlen, "malformed CLUSTER SLOTS answer");
    return -1;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

int rtopo_slotmap_set(rtopo_slotmap *m, const rtopo_spec *spec, const char *asked_host,
                      const redisReply *r, char *err, size_t errlen) {
    rtopo_slotmap *n = rtopo_slotmap_new();
    if (!n) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        snprintf(err, errlen, "CLUSTER SLOTS: %s", r && r->type == REDIS_REPLY_ERROR ? r->str :
                 "not an array");
        goto err;
    }
    for (size_t i = 0; i < r->elements; i++)
        if (read_entry(n, spec, asked_host, r->element[i], err, errlen)) goto err;
    if (rtopo_slotmap_served(n) == 0) {
        snprintf(err, errlen, "CLUSTER SLOTS: no slot is served");
        goto err;
    }
    clear_shards(m);
    *m = *n;
    free(n);
    return 0;
err:
    rtopo_slotmap_free(n);
    return -1;
}

/* Asks the node at a for the map. */
static int load_from(rtopo_slotmap *m, const rtopo_spec *spec, const rconn_addr *a,
                     int timeout_ms, char *err, size_t errlen) {
    char why[384];
    redisContext *c = rconn_connect(a, timeout_ms, why, sizeof why);
    redisReply *r = NULL;
    int rc = -1;
    if (!c) goto out;
    r = redisCommand(c, "CLUSTER SLOTS");
    if (!r) snprintf(why, sizeof why, "CLUSTER SLOTS: %s", c->errstr);
    else rc = rtopo_slotmap_set(m, spec, a->host, r, why, sizeof why);
out:
    if (rc) snprintf(err, errlen, "%s:%d: %s", a->host, a->port, why);
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    return rc;
}

int rtopo_slotmap_load(rtopo_slotmap *m, const rtopo_spec *spec, int timeout_ms, char *err,
                       size_t errlen) {
    int n = m->nshards, tried = 0;
    rconn_addr *known = n ? malloc(sizeof *known * (size_t)n) : NULL;
    if (n && !known) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) known[i] = m->shards[i].primary;
    for (int i = 0; i < n + spec->nseeds; i++, tried++) {
        const rconn_addr *a = i < n ? &known[i] : &spec->seeds[i - n];
        if (load_from(m, spec, a, timeout_ms, err, errlen) == 0) {
            free(known);
            return 0;
        }
    }
    free(known);
    if (!tried) snprintf(err, errlen, "no cluster node to ask");
    return -1;
}

const rtopo_shard *rtopo_slotmap_lookup(const rtopo_slotmap *m, int slot) {
    if (slot < 0 || slot >= RTOPO_SLOTS || m->owner[slot] < 0) return NULL;
    assert(m->owner[slot] < m->nshards);    /* an owner is an index into shards */
    return &m->shards[m->owner[slot]];
}

int rtopo_slotmap_nshards(const rtopo_slotmap *m) { return m->nshards; }

const rtopo_shard *rtopo_slotmap_shard(const rtopo_slotmap *m, int i) {
    return i >= 0 && i < m->nshards ? &m->shards[i] : NULL;
}

int rtopo_slotmap_served(const rtopo_slotmap *m) {
    int n = 0;
    for (int s = 0; s < RTOPO_SLOTS; s++) n += m->owner[s] >= 0;
    return n;
}

int rtopo_slotmap_moved(rtopo_slotmap *m, const rtopo_spec *spec, const rtopo_redirect *rd) {
    if (rd->slot < 0 || rd->slot >= RTOPO_SLOTS) return -1;
    int i = find_shard(m, rd->host, rd->port);
    if (i < 0 && (i = add_shard(m, spec, rd->host, rd->port)) < 0) return -1;
    assert(i < m->nshards);
    m->owner[rd->slot] = (int16_t)i;
    return 0;
}

/* -------------------------------------------------- reading an answer */

static int starts(const redisReply *r, const char *word) {
    size_t n = strlen(word);
    return r->len >= n && !memcmp(r->str, word, n) && (r->len == n || r->str[n] == ' ');
}

/* "MOVED <slot> <host:port>" / "ASK ..." after the word: into *rd. */
static int read_redirect(const char *s, size_t n, rtopo_redirect *rd) {
    const char *sp = memchr(s, ' ', n);
    long slot = 0;
    if (!sp || sp == s || sp - s > 5) return -1;
    for (const char *p = s; p < sp; p++) {
        if (*p < '0' || *p > '9') return -1;
        slot = slot * 10 + (*p - '0');
    }
    if (slot >= RTOPO_SLOTS) return -1;
    rd->slot = (int)slot;
    const char *hp = sp + 1;
    size_t hn = n - (size_t)(hp - s);
    return rtopo_hostport(hp, hn, 0, rd->host, sizeof rd->host, &rd->port);
}

rtopo_verdict rtopo_classify(const redisReply *r, rtopo_redirect *rd) {
    rtopo_redirect tmp;
    if (!r) return RTOPO_REDISCOVER;
    if (r->type != REDIS_REPLY_ERROR) return RTOPO_OK;
    if (!rd) rd = &tmp;
    if (!r->str) return RTOPO_ERROR;
    if (starts(r, "MOVED") || starts(r, "ASK")) {
        int moved = r->str[0] == 'M';
        size_t skip = moved ? 6 : 4;
        if (r->len <= skip || read_redirect(r->str + skip, r->len - skip, rd)) return RTOPO_ERROR;
        return moved ? RTOPO_MOVED : RTOPO_ASK;
    }
    if (starts(r, "TRYAGAIN")) return RTOPO_TRYAGAIN;
    if (starts(r, "CLUSTERDOWN")) return RTOPO_CLUSTERDOWN;
    if (starts(r, "READONLY") || starts(r, "LOADING") || starts(r, "MASTERDOWN"))
        return RTOPO_REDISCOVER;
    return RTOPO_ERROR;
}
