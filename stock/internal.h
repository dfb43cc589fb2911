/* internal.h: what the stock module's files share; not part of its public
 * face (stock.h), and not to be included from outside stock/.
 *
 * The blocking side's files, each calling only those below it:
 *   spread.c   the public operations a spread product takes lane by lane
 *              (stock_reserve, _confirm, _undo, _return, _read, ...):
 *              on a product's one copy, or on each of its lanes
 *   rcw.c      the read-check-write strategies (stock_reserve_one)
 *   returns.c  giving a hold's units back to one copy; forgetting markers
 *   stock.c    connections, routing, keys, the scripts, and the
 *              operations on one copy (sk_copy_*)
 * The loop side's (async_int.h): lockasync.c above async.c, both calling
 * into stock.c, async.c into spread.c too (sk_lane_parse). */
#ifndef FLASHSALE_STOCK_INTERNAL_H
#define FLASHSALE_STOCK_INTERNAL_H

#include <hiredis/hiredis.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "db/db.h"
#include "stock/stock.h"

/* Cluster: a connection to a node other than the one in use, kept for
 * when a call goes there again. */
typedef struct sk_node {
    rconn_addr addr;
    redisContext *ctx;
    char run_id[41];
} sk_node;

#define SK_PARKED 8               /* cluster nodes kept connected besides the current one */

struct stock_conn {
    rconn_addr addr;              /* connected to (or to connect to) */
    struct rtopo_cluster *cluster;   /* a Redis Cluster: addr, ctx and run_id are the
                                        node serving the SKU of the call in progress
                                        (sk_route); NULL: one server or a primary */
    int routed;                   /* cluster: addr names a node (0: no route known) */
    int redirect;                 /* cluster: the last call was redirected (its
                                     rtopo_verdict: MOVED, ASK, TRYAGAIN, CLUSTERDOWN)
                                     and did not run; 0: it was not */
    sk_node parked[SK_PARKED];
    int nparked;
    struct rtopo_primary *primary;   /* where addr comes from; NULL: fixed */
    unsigned version;             /* primary's version addr was taken at */
    int stale;                    /* the server said it is not the primary (now) */
    char prefix[STOCK_PREFIX_MAX + 1];
    char instance[STOCK_INSTANCE_MAX + 1];
    int timeout_ms;
    long long idem_ttl_ms;
    redisContext *ctx;
    char run_id[41];
    rconn_cmd cmd;
    unsigned char *retry;         /* per request of a pipeline: NOSCRIPT seen */
    size_t retry_cap;
    uint64_t rng;
    struct lock_client *locks[STOCK_LOCKS_COUNT], *locks_frozen[STOCK_LOCKS_COUNT];
    struct db_pool *db_pool;      /* db-lock: the lock table's connections */
    int db_wait_ms;
    int lock_ttl_ms, lock_wait_ms;
    stock_call_observer *observe;
    void *observe_ud;
    char errstr[256];
};

/* Tells the configured observer (if any) that a call of kind k sent at
 * t0_us (clock_mono_us) is over. */
static inline void sk_observe(stock_call_observer *fn, void *ud, stock_call k, int64_t t0_us) {
    if (fn) fn(k, clock_mono_us() - t0_us, ud);
}
/* The start time of a call to be observed: 0 when no one observes. */
static inline int64_t sk_t0(stock_call_observer *fn) { return fn ? clock_mono_us() : 0; }

/* Scripts of the read-check-write strategies (rcw.c), and those the loop
 * side uses (async.c); initialised by sk_scripts_init. */
extern rconn_script sk_read, sk_write, sk_unlock, sk_undo, sk_reserve_batch, sk_lock_read,
    sk_lock_write, sk_lock_pass, sk_lock_line, sk_return, sk_force_enter, sk_forget, sk_room_take,
    sk_room_tick;
/* Builds every script and its SHA1 (once per process). Returns 0, or -1
 * when out of memory (then no script may be used). */
int sk_scripts_init(void);

/* Cluster: points c at the node that serves sku's slot (a no-op on one
 * server). Returns 0, or -1 with c->errstr when no node serves it (known):
 * then stock_conn_ensure fails until a route is found. */
int sk_route(stock_conn *c, const char *sku);
/* Cluster: whether rep is a redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN):
 * then the command did not run, c->redirect says which, and a MOVED is
 * applied to the process's slot map at once. 0 on one server. */
int sk_redirected(stock_conn *c, const redisReply *rep);
/* Before attempt number `attempt` (0, 1, ...) of a call on sku's keys:
 * 1 to make it, c pointed at sku's node (after a pause when the last one
 * was told to try again); 0 when the last attempt is final (not
 * redirected, or RTOPO_RETRIES reached: rtopo.h's policy, as the loops'
 * connections). On one server: once. */
int sk_again(stock_conn *c, const char *sku, int attempt);

/* Drops a failed connection, keeping the reason in c->errstr. */
void sk_drop(stock_conn *c, const char *what);
/* Records in c->errstr that `what` got reply rep where it wanted another;
 * an answer that says this server is not the primary (now) -- READONLY,
 * LOADING, MASTERDOWN -- also drops the connection before the next call,
 * and the primary is looked for again. */
void sk_bad_reply(stock_conn *c, const char *what, const redisReply *rep);
/* Adds "<prefix>{<sku>}:<suffix>" to c->cmd. */
void sk_add_key(stock_conn *c, const char *sku, const char *suffix);
/* Adds the keys of all of p's stock segments, in order. */
void sk_add_segment_keys(stock_conn *c, const stock_product *p);
/* Adds the idempotency record key of idem (or a placeholder for none). */
void sk_add_idem_key(stock_conn *c, const char *sku, const char *idem);
/* A per-connection pseudo-random number, for spreading load. */
uint64_t sk_random(stock_conn *c);
/* Keeps the spec of a reservation's reply (element 2: where its units came
 * from) in r->takes when r wants it. */
void sk_req_takes(stock_req *r, const redisReply *rep);
/* Returns a zeroed flag per request of a pipeline of n (c's buffer). */
unsigned char *sk_retry_flags(stock_conn *c, size_t n);
/* Runs c->cmd (safe to repeat), retrying once on a connection broken while idle. */
redisReply *sk_run_idempotent(stock_conn *c, const char *what);
/* Element i of an array reply as an integer / a string ("" when absent). */
long long sk_elem_int(const redisReply *r, size_t i);
const char *sk_elem_str(const redisReply *r, size_t i);
/* A call of reserve_batch.lua, the order step of both sides: the loops'
 * batches (async.c) and the blocking side's single orders (stock.c). */
typedef struct sk_batch {
    const char *prefix, *instance;   /* the connection's (stock_config) */
    long long idem_ttl_ms;
    const stock_product *p;          /* the product of every order */
    stock_req *const *reqs;          /* the orders (n >= 1) */
    size_t n;
    char *const *ids;                /* committed orders whose pending records go */
    size_t nids;
    const char *run_id;              /* the copy to trust: the connection's server's; "*": any */
    long long first;                 /* segment to try first (0 .. segments-1) */
} sk_batch;
/* Writes b's call into cmd (reset first): EVALSHA with its keys and args. */
void sk_batch_build(rconn_cmd *cmd, const sk_batch *b);
/* Turns an order's answer from reserve_batch.lua -- its entry of the
 * reply: {1, gen, spec}, {2, order_id, fp}, {0, 0}, {-1, available},
 * {-2, bought}, {-3} -- into r's result (and r->takes when r wants it).
 * Clears outcome_unknown: an answer came. Returns 0, or -1 when rep is no
 * such answer (NULL, an error: the script aborted, nothing it did stays):
 * then r is UNAVAILABLE. */
int sk_reserve_decode(stock_req *r, const redisReply *rep);
/* A read-check-write strategy's check of the idempotency record it read
 * (stock.h: "<generation>|<order_id>|<fingerprint>"): when it is r's key's
 * record of generation gen, fills r's replay fields and returns 1; else 0
 * (none, or one an older copy left). */
int sk_idem_replay(stock_req *r, const char *idem, long long gen);

/* How the read-check-write strategies lock a segment (rcw.c), named by the
 * strategy table (stock.c). */
extern const struct sk_rcw_lock sk_lock_local, sk_lock_setnx_expire, sk_lock_set_nx_px,
    sk_lock_module, sk_lock_module_unfenced, sk_lock_db_table;

/* One copy (stock.c; sk_copy_return: returns.c): the public operation of
 * the same name (stock.h) on products without lanes -- one product, or
 * each of the n -- untimed (the public one tells the observer). On one
 * server the n go in one pipeline; on a cluster each goes to its SKU's
 * node, following redirects. Results as the public operation's. spread.c
 * calls them, for a product of one copy and for each lane of a spread
 * one. */
int sk_copy_reserve(stock_conn *c, stock_req **reqs, size_t n);
int sk_copy_confirm(stock_conn *c, const stock_ref *refs, size_t n);
int sk_copy_undo(stock_conn *c, const stock_ref *refs, size_t n, int *done);
/* (n > 0) */
int sk_copy_return(stock_conn *c, stock_return_req *reqs, size_t n);
stock_result sk_copy_read(stock_conn *c, const stock_product *p, long long *total,
                          long long *seg);
stock_result sk_copy_read_gen(stock_conn *c, const stock_product *p, long long *gen);
int sk_copy_load(stock_conn *c, const stock_product *p, long long gen, long long available,
                 const stock_user_units *users, size_t nusers, int force);
stock_result sk_copy_restock(stock_conn *c, const stock_product *p, long long qty);
int sk_copy_pending_scan(stock_conn *c, const stock_product *p,
                         void (*fn)(const stock_pending *rec, void *ud), void *ud);

/* Frees a lane of a spread product (stock_product_spread), its SKU too
 * (stock.c, beside stock_product_free). */
void sk_lane_free(stock_product *lane);
/* Spread products (spread.c): the next "<lane>:<units>" of takes at *t
 * (moved past it): the lane, with *units; -1 at the end. */
int sk_lane_parse(const stock_product *p, const char **t, int *units);

/* The local hint of empty segments (a bit per segment). */
struct stock_hint {
    int nwords;
    uint64_t words[];
};
int sk_hint_empty(const stock_product *p, int seg);
void sk_hint_set(const stock_product *p, int seg, int empty);

/* Where this module meets the database's: the service checks a request's
 * SKU, user id and order id against db.h's limits and hands them here,
 * where keys, buffers and scripts are sized by stock.h's. Each must take
 * whatever the other lets in (and the reconciliation reads SQLite's rows
 * back into Redis keys). */
_Static_assert(DB_SKU_MAX == STOCK_SKU_MAX, "a SKU: db.h and stock.h must agree");
_Static_assert(DB_ORDER_ID_LEN == STOCK_ORDER_ID_MAX, "an order id: db.h and stock.h must agree");
_Static_assert(DB_USER_MAX * 4 == STOCK_USER_MAX,
               "a user id: DB_USER_MAX characters of up to 4 UTF-8 bytes each, STOCK_USER_MAX bytes");

#endif
