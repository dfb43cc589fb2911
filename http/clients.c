/* clients.c: open connections per client, for the per-client cap. A
 * client is an IPv4 address or an IPv6 /64.
 *
 * An open-addressing table (linear probing, deletion by backward shift) of
 * address -> count, under one mutex: touched once when a connection is
 * accepted and once when it closes, never per request. It grows when half
 * full; addresses whose count drops to zero leave it. */
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>

#include "http/internal.h"

void http_client_key_of(const struct sockaddr *addr, http_client_key *key) {
    memset(key, 0, sizeof *key);
    if (addr && addr->sa_family == AF_INET) {
        key->len = 4;
        memcpy(key->addr, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    } else if (addr && addr->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)addr)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {        /* ::ffff:a.b.c.d is an IPv4 client */
            key->len = 4;
            memcpy(key->addr, a6->s6_addr + 12, 4);
        } else {
            /* One IPv6 host usually has a whole /64 to pick addresses
             * from: counting per address would let it take every slot. */
            key->len = 8;
            memcpy(key->addr, a6->s6_addr, 8);
        }
    }
}

static size_t hash(const http_client_key *k) {
    size_t h = 1469598103934665603ULL;
    for (int i = 0; i < k->len; i++) h = (h ^ k->addr[i]) * 1099511628211ULL;
    return h;
}

static int same(const http_client_key *a, const http_client_key *b) {
    return a->len == b->len && !memcmp(a->addr, b->addr, a->len);
}

int http_clients_init(http_clients *cl, unsigned cap) {
    memset(cl, 0, sizeof *cl);
    pthread_mutex_init(&cl->mu, NULL);
    cl->cap = cap;
    cl->size = 256;
    cl->keys = calloc(cl->size, sizeof *cl->keys);
    cl->counts = calloc(cl->size, sizeof *cl->counts);
    return cl->keys && cl->counts ? 0 : -1;
}

void http_clients_fini(http_clients *cl) {
    free(cl->keys);
    free(cl->counts);
    pthread_mutex_destroy(&cl->mu);
}

/* The slot of k, or the empty one where it would go. */
static size_t find(const http_clients *cl, const http_client_key *k) {
    size_t i = hash(k) & (cl->size - 1);
    while (cl->keys[i].len && !same(&cl->keys[i], k)) i = (i + 1) & (cl->size - 1);
    return i;
}

static int grow(http_clients *cl) {
    http_clients bigger = *cl;
    bigger.size = cl->size * 2;
    bigger.keys = calloc(bigger.size, sizeof *bigger.keys);
    bigger.counts = calloc(bigger.size, sizeof *bigger.counts);
    if (!bigger.keys || !bigger.counts) {
        free(bigger.keys);
        free(bigger.counts);
        return -1;
    }
    for (size_t i = 0; i < cl->size; i++) {
        if (!cl->keys[i].len) continue;
        size_t j = find(&bigger, &cl->keys[i]);
        bigger.keys[j] = cl->keys[i];
        bigger.counts[j] = cl->counts[i];
    }
    free(cl->keys);
    free(cl->counts);
    cl->keys = bigger.keys;
    cl->counts = bigger.counts;
    cl->size = bigger.size;
    return 0;
}

/* Removes slot i, shifting later entries of its probe run back so that
 * lookups never stop at a hole. Under cl->mu. */
static void drop_locked(http_clients *cl, size_t i) {
    size_t mask = cl->size - 1, j = i;
    cl->keys[i].len = 0;
    cl->used--;
    for (;;) {
        j = (j + 1) & mask;
        if (!cl->keys[j].len) return;
        size_t home = hash(&cl->keys[j]) & mask;
        /* Move j back to i when its home is not in (i, j] (cyclically). */
        if ((i <= j) ? (home <= i || home > j) : (home <= i && home > j)) {
            cl->keys[i] = cl->keys[j];
            cl->counts[i] = cl->counts[j];
            cl->keys[j].len = 0;
            i = j;
        }
    }
}

int http_clients_take(http_clients *cl, const struct sockaddr *addr) {
    http_client_key k;
    int ok;
    http_client_key_of(addr, &k);
    if (!cl->cap || !k.len) return 1;          /* no cap, or not an IP client */
    pthread_mutex_lock(&cl->mu);
    if (cl->used * 2 >= cl->size && grow(cl) != 0) {
        pthread_mutex_unlock(&cl->mu);
        return 1;                              /* no memory to count: do not refuse */
    }
    size_t i = find(cl, &k);
    if (!cl->keys[i].len) {
        cl->keys[i] = k;
        cl->counts[i] = 0;
        cl->used++;
    }
    ok = cl->counts[i] < cl->cap;
    if (ok) cl->counts[i]++;
    pthread_mutex_unlock(&cl->mu);
    return ok;
}

void http_clients_give(http_clients *cl, const http_client_key *key) {
    if (!cl->cap || !key->len) return;
    pthread_mutex_lock(&cl->mu);
    size_t i = find(cl, key);
    if (cl->keys[i].len && cl->counts[i] > 0 && --cl->counts[i] == 0) drop_locked(cl, i);
    pthread_mutex_unlock(&cl->mu);
}
