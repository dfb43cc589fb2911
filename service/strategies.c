/* strategies.c: where each strategy's orders run: the one table that says.
 *
 * The stock module describes a strategy (stock_strategy_about: its name,
 * whether it oversells, whether it may be segmented, where its lock
 * lives); this table is the service's side: the path an order of that
 * strategy takes, and so the files that hold it. A new strategy is a row
 * here plus its stock code. A strategy whose lock server was not given
 * (--redlock, --zookeeper, --etcd) is listed but unavailable. */
#include <assert.h>

#include "service/order.h"

typedef enum path {
    PATH_LOOP_BATCH,   /* orderloop.c, stock/async.c: batched per SKU on the
                          request's own loop, one script call per batch */
    PATH_LOOP_LOCK,    /* lockloop.c, stock/lockasync.c: queued on the loop
                          that owns the segment's lock, two round trips */
    PATH_POOL,         /* pool.c, stock/rcw.c: one order per pool thread,
                          which may wait for a lock */
    PATH_DB,           /* dbstrategy.c, db/db.c: taken in the order's own
                          SQLite transaction by the committer */
    PATH_DB_OPTIMISTIC /* dbstrategy.c: version read on a pool thread, then
                          a versioned update by the committer */
} path;

static const path PATHS[STOCK_STRATEGY_COUNT] = {
    [STOCK_LUA] = PATH_LOOP_BATCH,
    [STOCK_LOCK] = PATH_LOOP_LOCK,
    [STOCK_REDLOCK] = PATH_POOL,
    [STOCK_ZOOKEEPER] = PATH_POOL,
    [STOCK_ETCD] = PATH_POOL,
    [STOCK_DB_LOCK] = PATH_POOL,
    [STOCK_DB] = PATH_DB,
    [STOCK_DB_OPTIMISTIC] = PATH_DB_OPTIMISTIC,
    [STOCK_LOCAL] = PATH_POOL,
    [STOCK_UNSAFE_READ_WRITE] = PATH_POOL,
    [STOCK_UNSAFE_CHECK_THEN_DECR] = PATH_POOL,
    [STOCK_UNSAFE_SETNX_EXPIRE] = PATH_POOL,
    [STOCK_UNSAFE_LOCK_NO_FENCE] = PATH_POOL,
    [STOCK_UNSAFE_UNLOCK_BEFORE_WRITE] = PATH_POOL,
};

/* The flag that configures each lock server, by stock_lock_server; NULL:
 * always there (the service's own Redis, the database). */
static const char *const FLAGS[STOCK_LOCKS_COUNT] = {
    [STOCK_LOCKS_REDLOCK] = "--redlock",
    [STOCK_LOCKS_ZOOKEEPER] = "--zookeeper",
    [STOCK_LOCKS_ETCD] = "--etcd",
};

const char *svc_strategy_flag(stock_strategy s) {
    return FLAGS[stock_strategy_about(s)->locks];
}

const char *svc_strategy_unavailable(const svc_app *a, stock_strategy s) {
    static const char *const WHY[STOCK_LOCKS_COUNT] = {
        [STOCK_LOCKS_REDLOCK] = "start flashsale with --redlock URL,URL,URL (independent "
                                "redis-servers)",
        [STOCK_LOCKS_ZOOKEEPER] = "start flashsale with --zookeeper zk://host:port",
        [STOCK_LOCKS_ETCD] = "start flashsale with --etcd etcd://host:port",
    };
    stock_lock_server srv = stock_strategy_about(s)->locks;
    return FLAGS[srv] && !a->stock_cfg.locks[srv] ? WHY[srv] : NULL;
}

void svc_strategy_submit(svc_order *op) {
    stock_strategy s = op->p->strategy;
    assert(s >= 0 && s < STOCK_STRATEGY_COUNT);
    switch (PATHS[s]) {
    case PATH_LOOP_BATCH:
        svc_order_loop_reserve(op->home, op);
        return;
    case PATH_LOOP_LOCK:
        if (svc_lock_submit(op->a, op) == 0) return;
        /* No one segment can hold the order: the pool reads them all. */
        op->phase = PH_RESERVE_ONE;
        svc_pool_push(op->a->pool, op);
        return;
    case PATH_POOL:
        op->phase = PH_RESERVE_ONE;
        svc_pool_push(op->a->pool, op);
        return;
    case PATH_DB:
        svc_db_submit(op);
        return;
    case PATH_DB_OPTIMISTIC:
        op->phase = PH_DB_READ;
        svc_pool_push(op->a->pool, op);
        return;
    }
    assert(!"a strategy without a path");
}
