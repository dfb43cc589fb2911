/* stores.h: the stores, read directly -- the verifier's own reads of
 * Redis (one server, Sentinel or a Redis Cluster, whose redirections it
 * follows itself: cluster.c) and of the orders' database (SQLite or
 * PostgreSQL: dbread.c).
 *
 * The verifier reads Redis and SQLite itself, by the format users are given
 * (docs/storage.md), with hiredis and its own read-only SQL: a wrong key, a
 * wrong sum or a wrong query in the service's stock/ or db/ code cannot then
 * be wrong the same way in its judge. */
#ifndef FLASHSALE_LOADTEST_STORES_H
#define FLASHSALE_LOADTEST_STORES_H

#include <stddef.h>

#include "loadtest/fl.h"

typedef struct fl_redis fl_redis;

/* A handle for reading the keys under prefix on the Redis at url. It
 * connects on first use and again after an error. NULL with e set when the
 * URL is unusable. */
fl_redis *fl_redis_open(const char *url, const char *prefix, int timeout_ms, fl_err *e);
void fl_redis_close(fl_redis *r);

/* url may be "redis://..." or "unix:..." (one server),
 * "redis-sentinel://[:pw@]host:port[,...]/<master>[?db=N]" (the primary the
 * sentinels name, asked again after an error) or
 * "redis-cluster://[[user]:pw@]host[:port][,host[:port]...]" (a Redis
 * Cluster: each read goes to the node serving the SKU's hash tag, following
 * MOVED, ASK, TRYAGAIN and CLUSTERDOWN; cluster.c). A copy's gen is checked
 * against the run_id of the server that served the read. */

/* Where the reads went: the server that answered the last one, and the
 * cluster's redirections followed so far (all 0 off a cluster). */
typedef struct fl_redis_route {
    char node[300];              /* "host:port" ("unix:<path>" for a socket); "" before a read */
    char run_id[41];             /* that server's run_id */
    unsigned long moved;         /* MOVED followed (the SKU's node then remembered) */
    unsigned long ask;           /* ASK followed (ASKING, one command) */
    unsigned long retried;       /* TRYAGAIN or CLUSTERDOWN waited out */
    unsigned long reconnects;    /* connection errors, each followed by the next seed */
} fl_redis_route;

void fl_redis_route_get(const fl_redis *r, fl_redis_route *out);

typedef enum fl_copy_state {
    FL_COPY_VALID = 0,           /* built for this Redis process; every segment key there */
    FL_COPY_MISSING,             /* no gen key, or a segment key absent */
    FL_COPY_STALE,               /* gen names another Redis process (run_id) */
    FL_COPY_MIXED                /* spread: lanes of different generations (a rebuild half done) */
} fl_copy_state;

/* Where a product's copy lives (docs/storage.md, "On a Redis Cluster"):
 * lanes 0, one slot, the keys <prefix>{<sku>}:...; lanes n > 1, spread:
 * segment i is lane i, a complete one-segment copy under <prefix>{<sku>:<i>}:...,
 * each lane in a slot of its own, read on the node serving it. */

/* The documented rule: a product is spread when r is a Redis Cluster, it
 * has segments > 1 and its strategy is a script one (lua,
 * unsafe-trust-redis). Returns its lanes (= segments), or 0. */
int fl_redis_lanes(const fl_redis *r, const char *strategy, int segments);
/* For a reader that does not know the product's strategy (inspect without
 * SQLite): on a cluster, sku is spread when <prefix>{<sku>}:gen is absent
 * and <prefix>{<sku>:0}:gen exists; its lanes are `segments` when > 1,
 * else counted (lanes 0, 1, ... up to the first without a gen). *lanes 0
 * when not spread. Returns 0, or -1 with e set. */
int fl_redis_find_lanes(fl_redis *r, const char *sku, int segments, int *lanes, fl_err *e);

/* A SKU's stock copy, read in one atomic step (one MGET); a spread one in
 * one MGET per lane (each lane atomic, the sum over lanes not). */
typedef struct fl_stock_copy {
    fl_copy_state state;
    long long gen;               /* the copy's generation (0: none); MIXED: the lowest */
    long long gen_hi;            /* MIXED: the highest lane generation (else gen) */
    long long total;             /* units in all segments (all lanes) */
    int low_seg;                 /* the segment (lane) holding least */
    long long low;               /* its units */
    int stranded;                /* segments the empty bitmap marks that hold units */
    int stranded_seg;            /* the first of them */
    long long stranded_units;    /* the units they hold, which no order can take */
    int lanes;                   /* 0: one slot; n: spread over n lanes */
    int bad_lane;                /* spread, MISSING or STALE: the first lane that is (else -1) */
} fl_stock_copy;

/* One lane of the last spread copy fl_redis_stock read. */
typedef struct fl_lane {
    char node[300];              /* the node that answered its MGET */
    char run_id[41];             /* that node's run_id */
    fl_copy_state state;         /* VALID, MISSING or STALE, judged by that run_id */
    long long gen;               /* its generation (0: no gen key) */
    int has_stock;               /* its stock:0 key exists */
    long long units;             /* stock:0 */
} fl_lane;

/* Reads the copy of sku, which has `segments` segments (1..1024), laid
 * out as `lanes` says (fl_redis_lanes). Returns 0, or -1 with e set when
 * Redis could not be read. */
int fl_redis_stock(fl_redis *r, const char *sku, int segments, int lanes, fl_stock_copy *out,
                   fl_err *e);
/* Lane i of the last spread copy read: 0, or -1 when there is none. */
int fl_redis_lane(const fl_redis *r, int i, fl_lane *out);
/* Why c is not valid, in words ("its gen names another Redis process",
 * "lane 2's gen names another Redis process", ...) into buf. */
const char *fl_copy_why(const fl_stock_copy *c, char *buf, size_t len);
/* What fault injection's forcing of an interleaving counted for sku
 * (docs/storage.md, "cs"): waits that ended with the holders asked for
 * inside the critical section with the same read (met), and waits that
 * ran to their bound (alone). 0 (both 0 when nothing was forced), or -1
 * with e set. */
int fl_redis_forcing(fl_redis *r, const char *sku, long long *met, long long *alone, fl_err *e);
/* Counts sku's pending records and the units they hold out (field "q"),
 * over every lane of a spread one (an order taken in steps has a record
 * in each lane it took from: each counts). A record without a readable
 * "q" counts as a record of no units and in *unreadable. Returns 0, or -1
 * with e set. */
int fl_redis_pending(fl_redis *r, const char *sku, int lanes, long long *records,
                     long long *units, long long *unreadable, fl_err *e);
/* The order ids of sku's return markers (ended holds whose units were
 * given back to this copy: the legacy `returned` hash and the time buckets
 * `returned:<b>`; of a spread one, the union over its lanes), sorted and
 * distinct, into *ids (the caller frees); and in *before_ms (may be NULL)
 * the forgetting watermark `returned:before` (the lowest of the lanes'; 0:
 * none): the markers of holds decided before it may be gone. Returns 0, or
 * -1 with e set. */
int fl_redis_returned(fl_redis *r, const char *sku, int lanes, fl_order_id **ids, size_t *n,
                      long long *before_ms, fl_err *e);

/* The orders' database a --db names: a libpq URI (postgresql://... or
 * postgres://...), else a SQLite file. */
int fl_db_is_server(const char *path);
/* The vantage point's name in verdicts: "postgresql" or "sqlite". */
const char *fl_db_vantage(const char *path);

/* What the orders' database holds for one SKU, read in one read
 * transaction (dbread.c). */
typedef struct fl_db_sku {
    char strategy[32];
    int segments;
    long long per_user_limit;
    long long stock_initial, sold;
    long long stock_gen;
    long long db_available;      /* the db strategies' stock */
    long long voided_committed;  /* orders both committed and voided */
    int schema_version;          /* SQLite's PRAGMA user_version; PostgreSQL's flashsale_schema */
    int hold_seconds;            /* schema 6 on; 0 before */
    long long held;
    const char *vantage;         /* fl_db_vantage of where it was read */
} fl_db_sku;

/* A row of `holds` (schema 6), as fl_db_read hands it over. */
typedef struct fl_hold_row {
    const char *order_id;
    int quantity;
    long long gen;               /* the stock generation it was reserved under */
    long long expires_ms;
    const char *state;           /* reserved, confirmed, cancelled, expired */
    long long decided_ms;        /* -1: NULL (still reserved) */
    const char *payment_ref;     /* "" : NULL */
    int owes;                    /* return_gen IS NOT NULL: units not yet back in Redis */
} fl_hold_row;

/* Opens path (a file or a server) read-only and, in one snapshot, reads
 * sku's product row,
 * calls hold (unless NULL; schema 6 on) for each of its holds, then fn for
 * each of its orders in order_id order. Returns 1 when read, 0 when the
 * file has no such SKU, -1 with e set (no such file, not the documented
 * schema, I/O). */
int fl_db_read(const char *path, const char *sku, fl_db_sku *out,
                   void (*hold)(const fl_hold_row *h, void *ud), fl_row_fn fn, void *ud,
                   fl_err *e);
/* The holds of sku still reserved, and those owing their units to Redis
 * (return_gen set), read-only in one snapshot: how far the holds are from
 * settled. Both 0 before schema 6. Returns 0, or -1 with e set. */
int fl_db_holds_open(const char *path, const char *sku, long long *reserved, long long *owed,
                         fl_err *e);

#endif
