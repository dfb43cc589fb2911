/* products.c: the service's cache of products. Products are immutable in
 * what the order path needs (strategy, segments, limit) and are never
 * deleted, so an entry, once cached, is valid for the life of the process
 * and readers need only a shared lock to find it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/service.h"

#define BUCKETS 1024

struct product_cache {
    pthread_rwlock_t lock;
    product *bucket[BUCKETS];
};

static unsigned hash(const char *s) {
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h % BUCKETS;
}

product_cache *product_cache_new(void) {
    product_cache *pc = calloc(1, sizeof *pc);
    if (pc) pthread_rwlock_init(&pc->lock, NULL);
    return pc;
}

void product_cache_free(product_cache *pc) {
    if (!pc) return;
    for (int i = 0; i < BUCKETS; i++) {
        product *p = pc->bucket[i];
        while (p) {
            product *next = p->next;
            stock_product_free(&p->sp);
            free(p);
            p = next;
        }
    }
    pthread_rwlock_destroy(&pc->lock);
    free(pc);
}

static product *find(product_cache *pc, const char *sku) {
    for (product *p = pc->bucket[hash(sku)]; p; p = p->next)
        if (!strcmp(p->sku, sku)) return p;
    return NULL;
}

product *product_cache_get(product_cache *pc, const char *sku) {
    pthread_rwlock_rdlock(&pc->lock);
    product *p = find(pc, sku);
    pthread_rwlock_unlock(&pc->lock);
    return p;
}

product *product_cache_put(product_cache *pc, const db_product *dp) {
    stock_strategy s;
    if (stock_strategy_parse(dp->strategy, &s) != 0) {
        log_msg(LOG_ERROR, "product %s has strategy '%s', which this build does not offer",
                dp->sku, dp->strategy);
        return NULL;
    }
    pthread_rwlock_wrlock(&pc->lock);
    product *p = find(pc, dp->sku);
    if (!p && (p = calloc(1, sizeof *p)) != NULL) {
        snprintf(p->sku, sizeof p->sku, "%s", dp->sku);
        p->strategy = s;
        p->segments = dp->segments;
        p->per_user_limit = dp->per_user_limit;
        if (stock_product_init(&p->sp, p->sku, s, dp->segments, dp->per_user_limit,
                               dp->cs_delay_ms, dp->lock_ttl_ms) != 0) {
            free(p);
            pthread_rwlock_unlock(&pc->lock);
            return NULL;
        }
        unsigned h = hash(p->sku);
        p->next = pc->bucket[h];
        pc->bucket[h] = p;
    }
    pthread_rwlock_unlock(&pc->lock);
    return p;
}

void product_cache_each(product_cache *pc, void (*fn)(product *p, void *ud), void *ud) {
    pthread_rwlock_rdlock(&pc->lock);
    for (int i = 0; i < BUCKETS; i++)
        for (product *p = pc->bucket[i]; p; p = p->next) fn(p, ud);
    pthread_rwlock_unlock(&pc->lock);
}
