/* order.h: what the files of the order path share about an order on its
 * way (pipeline.c, strategies.c, answer.c, orderloop.c, lockloop.c,
 * pool.c, dbstrategy.c); private to service/.
 *
 * An order_loop is the order path's state on one event loop: its Redis
 * connection (stock_async), the orders gathered this iteration per SKU,
 * the pending records to clear, and the inbox where the committer hands
 * orders back. */
#ifndef FLASHSALE_SERVICE_ORDER_H
#define FLASHSALE_SERVICE_ORDER_H

#include "service/service.h"

typedef struct order_loop order_loop;
typedef struct lock_q lock_q;

typedef enum phase {
    PH_RESERVE_ONE,    /* pool: read-check-write strategies */
    PH_DB_READ,        /* pool: db-optimistic reads the version */
    PH_LOCK,           /* loop: the `lock` strategy's queue of its segment */
    PH_SCRIPT          /* loop: the `lua` batch */
} phase;

struct order_op {
    app *a;
    http_req *req;                 /* NULL once answered */
    product *p;
    order_loop *home;              /* where its commit comes back, and it is answered */
    int quantity;
    char order_id[DB_ORDER_ID_LEN + 1];
    char created_at[DB_TIME_LEN + 1];
    char user_id[DB_USER_MAX * 4 + 1];
    char idem_key[DB_KEY_MAX + 1];
    char fingerprint[17];
    stock_req sreq;
    db_job job;
    phase phase;
    int fail;                      /* the refusal to answer once an undo is done */
    int lookup_after_undo;         /* key taken in SQLite: answer as a replay */
    int tries;                     /* db-optimistic: versioned updates tried */
    stock_hold hold;               /* `lock` on a loop: the segment and what its read found */
    int64_t lock_t0_us;            /* ...when it started waiting for the lock */
    lock_q *lq;                    /* ...its segment's queue */
    order_op *next;
};

/* answer.c: the refusals, one row each in its table. */
typedef enum refusal {
    RF_SOLD_OUT, RF_INSUFFICIENT, RF_LIMIT, RF_KEY_REUSED, RF_IN_PROGRESS, RF_LOCK_TIMEOUT,
    RF_FENCED, RF_CONFLICT, RF_REBUILDING, RF_REDIS_DOWN, RF_REDIS_DOWN_TAKEN, RF_STALE,
    RF_DB_DOWN, RF_DB_UNKNOWN, RF_COUNT
} refusal;
/* Answers op with refusal rf (n: the number its sentence names; for the
 * 409s also a field of the body) and frees op. */
void refuse(order_op *op, refusal rf, long long n);
/* Answers op with its order (replayed: 200 and Idempotent-Replayed); the
 * caller frees op. */
void answer_order(order_op *op, const db_order *o, int replayed);

/* strategies.c: sends op down its strategy's path. */
void strategy_submit(order_op *op);

/* pipeline.c: the order's job for the committer: its insert, the stock
 * taken as take says (DB_TAKE_NONE: reserved in Redis already), or the
 * lookup of the order a replayed key names. */
void prepare_insert(order_op *op, db_take take, long long expect_version);
void prepare_lookup(order_op *op, const char *order_id);
/* pipeline.c: acts on op's reservation result. Returns 1 when op->job is
 * ready for the committer, else op has been answered and freed. */
int order_reserved(order_op *op);
/* pipeline.c: acts on op's commit (or lookup), on its home loop. */
void order_committed(order_op *op);
/* pool.c: the pool of threads for strategies that may block. */
void stage_push(stage *s, order_op *op);

/* dbstrategy.c: `db` to the committer; db-optimistic's read (on a pool
 * thread); a db strategy's commit result, on the order's home loop. */
void db_submit(order_op *op);
void db_optimistic_read(order_op *op);
void db_committed(order_op *op);

/* lockloop.c: the `lock` strategy on the loops. lock_submit routes op to
 * its segment's owner loop (-1: no segment fits one hold; use the pool). */
int lock_submit(app *a, order_op *op);
lock_q *lock_q_new(order_loop *ol, product *p, int seg);
void lock_q_enqueue(lock_q *q, order_op *op);
void lock_q_advance(lock_q *q);
lock_q *lock_q_next_ready(lock_q *q);
void lock_q_set_next_ready(lock_q *q, lock_q *next);
product *lock_q_product(const lock_q *q);
int lock_q_segment(const lock_q *q);
/* Has orders not yet answered or handed on. */
int lock_q_busy(const lock_q *q);

/* The loop's stock handle, loop, and index in a->order_loops. */
int order_loop_index(const order_loop *ol);
stock_async *order_loop_stock(order_loop *ol);
loop *order_loop_loop(order_loop *ol);
/* Hands op to its segment's queue on ol (any thread). */
void order_loop_lock(order_loop *ol, order_op *op);
/* q has an order to start: at the end of this iteration. On ol's thread. */
void order_loop_lock_ready(order_loop *ol, lock_q *q);

/* The calling thread's order loop, or (another thread) one in turn. */
order_loop *order_loop_home(app *a);
/* Queues op for this iteration's reservation batch of its SKU. Any thread. */
void order_loop_reserve(order_loop *ol, order_op *op);
/* Queues the pending record of a committed order to be cleared (in the
 * next batch's script call, or on its own). On ol's thread. */
void order_loop_clear(order_loop *ol, product *p, const char *order_id);
/* Gives a reservation back (undo.lua), then calls fn. On ol's thread. */
void order_loop_undo(order_loop *ol, const stock_ref *ref, stock_undo_fn *fn, void *ud);
/* The committer hands op back (order_loop_give), then, once per group, wakes
 * the loops that got some (order_loop_give_done). Committer thread only. */
void order_loop_give(order_loop *ol, order_op *op);
void order_loop_give_done(app *a);

#endif
