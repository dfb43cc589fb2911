/* products.h: the service's cache of products, and finding a product
 * (cache first, then SQLite). */
#ifndef FLASHSALE_SERVICE_PRODUCTS_H
#define FLASHSALE_SERVICE_PRODUCTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "db/db.h"
#include "stock/stock.h"

typedef struct svc_app svc_app;

/* A product as the service caches it. Never freed while the service runs
 * (products cannot be deleted), so pointers to it stay valid. */
typedef struct svc_product {
    char sku[DB_SKU_MAX + 1];
    stock_strategy strategy;
    int segments;
    long long per_user_limit;
    int hold_seconds;              /* 0: orders confirmed at once; else holds */
    stock_product sp;              /* the stock module's view (points into this) */
    atomic_int rebuilding;         /* a rebuild of its Redis copy is queued */
    atomic_int rebuild_forced;     /* ...and must replace even a valid copy */
    _Atomic int64_t soldout_at_us; /* when its store last said "nothing left"
                                      (clock_mono_us; 0: units may be there) */
    atomic_uint_fast64_t changes;  /* its stock or orders changed here (a count) */
    pthread_mutex_t view_mu;       /* guards the four below */
    char *view;                    /* GET /v1/products/{sku}'s last body (owned) */
    size_t view_len;
    int64_t view_at_us;            /* when it was read from the stores (clock_mono_us) */
    uint64_t view_changes;         /* `changes` when it was read */
    struct svc_room *room;         /* its waiting room (service/room/room.h); NULL: none */
    struct svc_product *next;      /* hash chain */
} svc_product;

typedef struct svc_product_cache svc_product_cache;
/* spread: the service runs on a Redis Cluster; a product of a script-kind
 * strategy with segments > 1 is then spread over its slots
 * (stock_product_spread). NULL when out of memory. */
svc_product_cache *svc_product_cache_new(int spread);
void svc_product_cache_free(svc_product_cache *pc);
/* The cached product, or NULL. */
svc_product *svc_product_cache_get(svc_product_cache *pc, const char *sku);
/* Caches p (from the database) unless present; returns the cached one. */
svc_product *svc_product_cache_put(svc_product_cache *pc, const db_product *p);
/* Calls fn for each cached product. */
/* Whether a product known here has a waiting room (an order's door then
 * waits for the product: api/orders.c). */
int svc_product_cache_rooms(svc_product_cache *pc);
void svc_product_cache_each(svc_product_cache *pc, void (*fn)(svc_product *p, void *ud), void *ud);

/* The memory of "sold out" (--soldout-cache-ms): marked by a sold_out
 * answer, forgotten by units coming back on this instance (a restock, an
 * ended hold, a rebuild) and, for the others' returns, by age. */
void svc_product_soldout_mark(svc_product *p);
void svc_product_soldout_clear(svc_product *p);
/* Whether p is known sold out within the last window_us. */
int svc_product_soldout_known(svc_product *p, int64_t window_us);

/* The last product read's body (--product-cache-ms): a malloc'd copy in
 * *out (the caller frees it) when it is younger than max_age_us and
 * nothing changed p on this instance since (an order, a hold's end, a
 * restock: svc_product_changed); 0 when there is none (or no memory). */
int svc_product_view_get(svc_product *p, int64_t max_age_us, char **out, size_t *len);
/* Keeps a copy of body as p's view, read from the stores at read_at_us,
 * when p's `changes` were `changes` (read before the stores were). */
void svc_product_view_put(svc_product *p, const char *body, size_t len, int64_t read_at_us,
                          uint64_t changes);
/* This instance changed p's stock or orders: its view is old. */
static inline void svc_product_changed(svc_product *p) {
    atomic_fetch_add_explicit(&p->changes, 1, memory_order_relaxed);
}
static inline uint64_t svc_product_changes(svc_product *p) {
    return atomic_load_explicit(&p->changes, memory_order_relaxed);
}

/* Finds a product: cache first, then the database, on d (NULL: a
 * connection taken for the read). Returns DB_OK, DB_NOTFOUND, DB_NOCONN
 * (no connection of the budget free in time) or DB_ERROR. */
db_status svc_product_find(svc_app *a, db *d, const char *sku, svc_product **out);

#endif
