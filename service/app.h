/* app.h: the flashsale service as a whole: the parts it wires together,
 * and starting and stopping them (lifecycle.c).
 *
 *   api/      the HTTP routes (api.c) and request validation
 *   order/    the order path: families, committer hand-off, answers
 *   repair/   making Redis agree with SQLite: rebuilds, reconciliation,
 *             undo retries, start-up recovery, audit
 *   holds/    ending holds (confirm, cancel, expiry) and their units' return
 *   ops/      metrics, health probes, the maintenance thread
 *
 * The struct is the wiring: each part's handle, the event loops, the
 * configuration. A part's own state stays behind its handle. */
#ifndef FLASHSALE_SERVICE_APP_H
#define FLASHSALE_SERVICE_APP_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/loop.h"
#include "db/db.h"
#include "db/pool.h"
#include "http/http.h"
#include "service/config.h"
#include "service/ops/metrics.h"
#include "service/order/admission.h"
#include "service/threadpool.h"
#include "stock/stock.h"

typedef struct svc_health svc_health;
typedef struct svc_maint svc_maint;
typedef struct svc_room_beats svc_room_beats;
typedef struct svc_holds svc_holds;
typedef struct svc_repair svc_repair;
typedef struct svc_product_cache svc_product_cache;
struct svc_order_loop;

typedef struct svc_app {
    svc_config cfg;
    char instance_name[96];        /* stable across restarts: host:port */
    char instance_id[112];         /* instance_name#nonce: this run */
    stock_strategy default_strategy;
    stock_config stock_cfg;
    struct rtopo_primary *primary; /* --redis is a Sentinel URL: its primary, followed */
    struct rtopo_cluster *cluster; /* --redis is a cluster's URL: its slot map, followed */
    db_options db_opt;
    db_pool *dbpool;               /* every database connection of the instance */
    http_server *http;             /* NULL when started without a listener */
    atomic_int http_up;            /* http is set: threads started before it may read it */
    loop **loops;                  /* event loops: HTTP and the order path */
    pthread_t *loop_threads;
    int nloops, nrunning;
    db_writer *writer;             /* the committer */
    db *writer_db;                 /* ...and its connection, of dbpool */
    struct svc_order_loop **order_loops;   /* the order path on each loop (order/) */
    struct svc_order_loop *give_touched;   /* the committer's: loops it hands back to */
    svc_threadpool *blocking;      /* the order path's blocking strategies */
    int blocking_stopped;          /* ...stopped by svc_orders_drain, not yet cleared */
    svc_threadpool *api;           /* API work that may wait on Redis (and SQLite) */
    svc_threadpool *api_db;        /* API work that needs SQLite only (order lookups) */
    svc_health *health;
    svc_maint *maint;
    svc_room_beats *room_beats;    /* the waiting rooms' beat (room/beats.h) */
    char room_secret[129];         /* the tickets' secret, once known... */
    atomic_int room_secret_known;  /* ...(set with release once written) */
    svc_holds *holds;              /* holds: expiry and owed returns (holds/) */
    svc_repair *repair;
    svc_product_cache *products;
    svc_metrics m;
    svc_admit adm;                 /* orders in the order path at once (order/) */
    atomic_int shutting_down;
    pthread_key_t tls;             /* per-thread stock connections */
} svc_app;

/* Starts the whole service from a->cfg: recovery, threads, then the HTTP
 * listener (none when cfg.listen is "": the order path alone, as the unit
 * tests drive it). Returns 0; 2 for a configuration error, 1 for one at
 * run time (both with a message in err). A failed start is undone. */
int svc_start(svc_app *a, char *err, size_t errlen);
/* Stops accepting, answers every request in flight, commits, stops every
 * thread and frees what svc_start made. */
void svc_stop(svc_app *a);

/* Reads --redis (a->cfg.redis_url) into a->stock_cfg: one server, or a
 * Sentinel-watched primary, which a thread then follows (a->primary).
 * Returns 0, or -1 with err (a malformed URL, a Redis Cluster). */
int svc_redis_open(svc_app *a, char *err, size_t errlen);
void svc_redis_close(svc_app *a);

/* A database connection of the instance's budget (a->dbpool, db/pool.h;
 * thread_conns.c), for one piece of work: given back with svc_db_give
 * when the work is done. NULL when none could be had within
 * --db-connection-wait-ms: *busy (when given) set when every connection
 * stayed in use (the caller refuses as overloaded), else the database
 * could not be reached (logged, at most once a second). */
db *svc_db_take(svc_app *a, int *busy);
void svc_db_give(svc_app *a, db *d);
/* The calling thread's own Redis connection (opened on first use, closed
 * when the thread ends): no connection is shared between threads. NULL
 * with the error logged when it cannot be opened. */
stock_conn *svc_thread_stock(svc_app *a);
/* Sets up the per-thread connection slots (once, before threads start);
 * undone by svc_thread_conns_free. */
void svc_thread_conns_init(svc_app *a);
void svc_thread_conns_free(svc_app *a);

#endif
