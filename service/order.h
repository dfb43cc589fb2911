/* order.h: what the files of the order path share about an order on its
 * way (pipeline.c, strategies.c, answer.c, orderloop.c, lockloop.c,
 * pool.c, dbstrategy.c); private to service/.
 *
 * An svc_order_loop is the order path's state on one event loop: its Redis
 * connection (stock_async), the orders gathered this iteration per SKU,
 * the pending records to clear, and the inbox where the committer hands
 * orders back. */
#ifndef FLASHSALE_SERVICE_ORDER_H
#define FLASHSALE_SERVICE_ORDER_H

#include "service/service.h"

typedef struct svc_order_loop svc_order_loop;
typedef struct svc_lock_q svc_lock_q;

typedef enum svc_phase {
    PH_RESERVE_ONE,    /* pool: read-check-write strategies */
    PH_DB_READ,        /* pool: db-optimistic reads the version */
    PH_LOCK,           /* loop: the `lock` strategy's queue of its segment */
    PH_SCRIPT          /* loop: the `lua` batch */
} svc_phase;

struct svc_order {
    svc_app *a;
    http_req *req;                 /* NULL once answered */
    svc_product *p;
    svc_order_loop *home;              /* where its commit comes back, and it is answered */
    int quantity;
    char order_id[DB_ORDER_ID_LEN + 1];
    char created_at[DB_TIME_LEN + 1];
    char user_id[DB_USER_MAX * 4 + 1];
    char idem_key[DB_KEY_MAX + 1];
    char fingerprint[17];
    stock_req sreq;
    db_job job;
    svc_phase phase;
    int fail;                      /* the refusal to answer once an undo is done */
    int lookup_after_undo;         /* key taken in SQLite: answer as a replay */
    int tries;                     /* db-optimistic: versioned updates tried */
    stock_hold hold;               /* `lock` on a loop: the segment and what its read found */
    int64_t lock_t0_us;            /* ...when it started waiting for the lock */
    svc_lock_q *lq;                    /* ...its segment's queue */
    svc_order *next;
};

/* answer.c: the refusals, one row each in its table. */
typedef enum svc_refusal {
    RF_SOLD_OUT, RF_INSUFFICIENT, RF_LIMIT, RF_KEY_REUSED, RF_IN_PROGRESS, RF_LOCK_TIMEOUT,
    RF_FENCED, RF_CONFLICT, RF_REBUILDING, RF_REDIS_DOWN, RF_REDIS_DOWN_TAKEN, RF_STALE,
    RF_DB_DOWN, RF_DB_UNKNOWN, RF_LOCK_DOWN, RF_COUNT
} svc_refusal;
/* Answers op with refusal rf (n: the number its sentence names; for the
 * 409s also a field of the body) and frees op. */
void svc_refuse(svc_order *op, svc_refusal rf, long long n);
/* Answers op with its order (replayed: 200 and Idempotent-Replayed); the
 * caller frees op. */
void svc_answer_order(svc_order *op, const db_order *o, int replayed);

/* strategies.c: sends op down its strategy's path. */
void svc_strategy_submit(svc_order *op);

/* pipeline.c: the order's job for the committer: its insert, the stock
 * taken as take says (DB_TAKE_NONE: reserved in Redis already), or the
 * lookup of the order a replayed key names. */
void svc_prepare_insert(svc_order *op, db_take take, long long expect_version);
void svc_prepare_lookup(svc_order *op, const char *order_id);
/* pipeline.c: acts on op's reservation result. Returns 1 when op->job is
 * ready for the committer, else op has been answered and freed. */
int svc_order_reserved(svc_order *op);
/* pipeline.c: acts on op's commit (or lookup), on its home loop. */
void svc_order_committed(svc_order *op);
/* pool.c: the pool of threads for strategies that may block. */
void svc_pool_push(svc_pool *s, svc_order *op);

/* dbstrategy.c: `db` to the committer; db-optimistic's read (on a pool
 * thread); a db strategy's commit result, on the order's home loop. */
void svc_db_submit(svc_order *op);
void svc_db_optimistic_read(svc_order *op);
void svc_db_committed(svc_order *op);

/* lockloop.c: the `lock` strategy on the loops. svc_lock_submit routes op to
 * its segment's owner loop (-1: no segment fits one hold; use the pool). */
int svc_lock_submit(svc_app *a, svc_order *op);
svc_lock_q *svc_lock_q_new(svc_order_loop *ol, svc_product *p, int seg);
void svc_lock_q_enqueue(svc_lock_q *q, svc_order *op);
void svc_lock_q_advance(svc_lock_q *q);
svc_lock_q *svc_lock_q_next_ready(svc_lock_q *q);
void svc_lock_q_set_next_ready(svc_lock_q *q, svc_lock_q *next);
svc_product *svc_lock_q_product(const svc_lock_q *q);
int svc_lock_q_segment(const svc_lock_q *q);
/* Has orders not yet answered or handed on. */
int svc_lock_q_busy(const svc_lock_q *q);

/* The loop's stock handle, loop, and index in a->order_loops. */
int svc_order_loop_index(const svc_order_loop *ol);
stock_async *svc_order_loop_stock(svc_order_loop *ol);
loop *svc_order_loop_loop(svc_order_loop *ol);
/* Hands op to its segment's queue on ol (any thread). */
void svc_order_loop_lock(svc_order_loop *ol, svc_order *op);
/* q has an order to start: at the end of this iteration. On ol's thread. */
void svc_order_loop_lock_ready(svc_order_loop *ol, svc_lock_q *q);

/* The calling thread's order loop, or (another thread) one in turn. */
svc_order_loop *svc_order_loop_home(svc_app *a);
/* Queues op for this iteration's reservation batch of its SKU. Any thread. */
void svc_order_loop_reserve(svc_order_loop *ol, svc_order *op);
/* Queues the pending record of a committed order to be cleared (in the
 * next batch's script call, or on its own). On ol's thread. */
void svc_order_loop_clear(svc_order_loop *ol, svc_product *p, const char *order_id);
/* Gives a reservation back (undo.lua), then calls fn. On ol's thread. */
void svc_order_loop_undo(svc_order_loop *ol, const stock_ref *ref, stock_undo_fn *fn, void *ud);
/* The committer hands op back (svc_order_loop_give), then, once per group, wakes
 * the loops that got some (svc_order_loop_give_done). Committer thread only. */
void svc_order_loop_give(svc_order_loop *ol, svc_order *op);
void svc_order_loop_give_done(svc_app *a);

#endif
