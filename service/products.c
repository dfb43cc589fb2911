/* products.c: the service's cache of products, and finding a product
 * (cache first, then SQLite). Products are immutable in
 * what the order path needs (strategy, segments, limit) and are never
 * deleted, so an entry, once cached, is valid for the life of the process
 * and readers need only a shared lock to find it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/room/room.h"

#define BUCKETS 1024

struct svc_product_cache {
    int spread;                    /* spread script-kind products over a cluster's slots */
    atomic_int rooms;              /* products here with a waiting room (never fewer) */
    pthread_rwlock_t lock;
    svc_product *bucket[BUCKETS];
};

static unsigned hash(const char *s) {
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h % BUCKETS;
}

svc_product_cache *svc_product_cache_new(int spread) {
    svc_product_cache *pc = calloc(1, sizeof *pc);
    if (pc) pthread_rwlock_init(&pc->lock, NULL);
    if (pc) pc->spread = spread;
    return pc;
}

void svc_product_cache_free(svc_product_cache *pc) {
    if (!pc) return;
    for (int i = 0; i < BUCKETS; i++) {
        svc_product *p = pc->bucket[i];
        while (p) {
            svc_product *next = p->next;
            stock_product_free(&p->sp);
            svc_room_free(p->room);
            pthread_mutex_destroy(&p->view_mu);
            free(p->view);
            free(p);
            p = next;
        }
    }
    pthread_rwlock_destroy(&pc->lock);
    free(pc);
}

static svc_product *find(svc_product_cache *pc, const char *sku) {
    for (svc_product *p = pc->bucket[hash(sku)]; p; p = p->next)
        if (!strcmp(p->sku, sku)) return p;
    return NULL;
}

svc_product *svc_product_cache_get(svc_product_cache *pc, const char *sku) {
    pthread_rwlock_rdlock(&pc->lock);
    svc_product *p = find(pc, sku);
    pthread_rwlock_unlock(&pc->lock);
    return p;
}

svc_product *svc_product_cache_put(svc_product_cache *pc, const db_product *dp) {
    stock_strategy s;
    if (stock_strategy_parse(dp->strategy, &s) != 0) {
        svc_log(SVC_LOG_ERROR, "product %s has strategy '%s', which this build does not offer",
                dp->sku, dp->strategy);
        return NULL;
    }
    pthread_rwlock_wrlock(&pc->lock);
    svc_product *p = find(pc, dp->sku);
    if (!p && (p = calloc(1, sizeof *p)) != NULL) {
        snprintf(p->sku, sizeof p->sku, "%s", dp->sku);
        p->strategy = s;
        p->segments = dp->segments;
        p->per_user_limit = dp->per_user_limit;
        p->hold_seconds = dp->hold_seconds;
        if (stock_product_init(&p->sp, p->sku, s, dp->segments, dp->per_user_limit,
                               dp->cs_delay_ms, dp->lock_ttl_ms) != 0 ||
            (pc->spread && dp->segments > 1 &&
             stock_strategy_about(s)->kind == STOCK_KIND_SCRIPT &&
             stock_product_spread(&p->sp) != 0)) {
            stock_product_free(&p->sp);
            free(p);
            pthread_rwlock_unlock(&pc->lock);
            return NULL;
        }
        p->sp.cs_overlap = dp->cs_overlap;
        if (dp->room_turn_ms > 0 &&
            !(p->room = svc_room_new(dp->room_turn_ms, dp->room_rate, SVC_ROOM_RATE_INITIAL,
                                     dp->room_opens_ms))) {
            stock_product_free(&p->sp);
            free(p);
            pthread_rwlock_unlock(&pc->lock);
            return NULL;
        }
        if (p->room) atomic_fetch_add_explicit(&pc->rooms, 1, memory_order_relaxed);
        pthread_mutex_init(&p->view_mu, NULL);
        unsigned h = hash(p->sku);
        p->next = pc->bucket[h];
        pc->bucket[h] = p;
    }
    pthread_rwlock_unlock(&pc->lock);
    return p;
}

int svc_product_cache_rooms(svc_product_cache *pc) {
    return atomic_load_explicit(&pc->rooms, memory_order_relaxed) > 0;
}

void svc_product_cache_each(svc_product_cache *pc, void (*fn)(svc_product *p, void *ud), void *ud) {
    pthread_rwlock_rdlock(&pc->lock);
    for (int i = 0; i < BUCKETS; i++)
        for (svc_product *p = pc->bucket[i]; p; p = p->next) fn(p, ud);
    pthread_rwlock_unlock(&pc->lock);
}

void svc_product_soldout_mark(svc_product *p) {
    atomic_store_explicit(&p->soldout_at_us, clock_mono_us(), memory_order_relaxed);
    if (p->room) svc_room_note_sold_out(p->room);   /* its room tells every waiting buyer */
}

void svc_product_soldout_clear(svc_product *p) {
    atomic_store_explicit(&p->soldout_at_us, 0, memory_order_relaxed);
    if (p->room) svc_room_note_units(p->room);      /* the room opens again */
}

int svc_product_soldout_known(svc_product *p, int64_t window_us) {
    int64_t at = atomic_load_explicit(&p->soldout_at_us, memory_order_relaxed);
    return at != 0 && clock_mono_us() - at < window_us;
}

int svc_product_view_get(svc_product *p, int64_t max_age_us, char **out, size_t *len) {
    int got = 0;
    pthread_mutex_lock(&p->view_mu);
    if (p->view && clock_mono_us() - p->view_at_us < max_age_us &&
        p->view_changes == svc_product_changes(p) && (*out = malloc(p->view_len))) {
        memcpy(*out, p->view, p->view_len);
        *len = p->view_len;
        got = 1;
    }
    pthread_mutex_unlock(&p->view_mu);
    return got;
}

void svc_product_view_put(svc_product *p, const char *body, size_t len, int64_t read_at_us,
                          uint64_t changes) {
    char *copy = malloc(len);
    if (!copy) return;                        /* no view: the next read asks the stores */
    memcpy(copy, body, len);
    pthread_mutex_lock(&p->view_mu);
    if (read_at_us >= p->view_at_us) {        /* never replace a newer read */
        free(p->view);
        p->view = copy;
        p->view_len = len;
        p->view_at_us = read_at_us;
        p->view_changes = changes;
        copy = NULL;
    }
    pthread_mutex_unlock(&p->view_mu);
    free(copy);
}

db_status svc_product_find(svc_app *a, db *d, const char *sku, svc_product **out) {
    *out = svc_product_cache_get(a->products, sku);
    if (*out) return DB_OK;
    int busy = 0;
    db *own = d ? NULL : svc_db_take(a, &busy);
    db_product dp;
    if (!d && !(d = own)) return busy ? DB_NOCONN : DB_ERROR;
    db_status st = db_product_get(d, sku, &dp);
    svc_db_give(a, own);
    if (st != DB_OK) return st;
    *out = svc_product_cache_put(a->products, &dp);
    return *out ? DB_OK : DB_ERROR;
}
