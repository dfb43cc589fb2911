/* orderloop.h: what pipeline.c and orderloop.c share about an order on
 * its way; private to service/ (service.h is the module's face).
 *
 * An order_loop is the order path's state on one event loop: its Redis
 * connection (stock_async), the orders gathered this iteration per SKU,
 * the pending records to clear, and the inbox where the committer hands
 * orders back. */
#ifndef FLASHSALE_ORDERLOOP_H
#define FLASHSALE_ORDERLOOP_H

#include "service/service.h"

typedef struct order_loop order_loop;

typedef enum phase {
    PH_RESERVE_ONE,    /* pool: read-check-write strategies */
    PH_DB_READ         /* pool: db-optimistic reads the version */
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
    order_op *next;
};

/* pipeline.c: acts on op's reservation result. Returns 1 when op->job is
 * ready for the committer, else op has been answered and freed. */
int order_reserved(order_op *op);
/* pipeline.c: acts on op's commit (or lookup), on its home loop. */
void order_committed(order_op *op);
/* pipeline.c: the pool of threads for strategies that may block. */
void stage_push(stage *s, order_op *op);

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
