/* holds.h: holds in the flashsale database -- the decisions that end them,
 * and the two scans that keep them moving. Its whole public face; it works
 * on a connection of db.h, and its table, `holds`, is part of the schema
 * (docs/storage.md, "holds").
 *
 * A hold is an order of a product with hold_seconds > 0: inserted RESERVED
 * by db_order_insert (its units counted in products.held), then moved
 * exactly once to CONFIRMED, CANCELLED or EXPIRED by db_hold_decide. The
 * database decides: the move is a conditional update of a RESERVED row, so
 * of two instances (or a confirm and an expiry) racing for one hold, one
 * changes the row and the other finds it decided.
 *
 * Units come back exactly once. A hold of a `db` strategy gets them back in
 * the deciding transaction (products.db_available). A hold whose stock is
 * a Redis copy is left owing them: the decision records the stock
 * generation it was made under (return_gen), the caller gives the units
 * back to the copy of that generation (stock_return, idempotent per order)
 * and then clears the debt (db_hold_returned). A caller that dies in
 * between leaves the debt for db_hold_owing, which any instance scans. */
#ifndef FLASHSALE_DB_HOLDS_H
#define FLASHSALE_DB_HOLDS_H

#include <stdint.h>

#include "db/db.h"

/* How a hold may end. */
typedef enum db_hold_to { DB_HOLD_CONFIRM, DB_HOLD_CANCEL, DB_HOLD_EXPIRE } db_hold_to;

/* A decision asked for, and what came of it. */
typedef struct db_decision {
    /* in */
    const char *order_id;
    db_hold_to to;
    int64_t now_ms;             /* the deciding clock (wall, Unix ms): a hold is
                                   expired at and after its deadline */
    const char *user_id;        /* cancel by the buyer: must be the order's (else
                                   DB_NOTFOUND); NULL: admin */
    const char *payment_ref;    /* confirm: recorded with it (NULL: none) */
    int stock_in_db;            /* the product's stock is products.db_available */
    /* out */
    int changed;                /* this call moved the hold (else it was decided
                                   before, or is not a hold) */
    db_order order;             /* the order, in its state after the call */
    long long return_gen;       /* > 0: its units are owed to the Redis copy of
                                   this generation (stock_return), then
                                   db_hold_returned */
    long long reserve_gen;      /* the generation it was reserved under */
    char takes[8192];           /* where its units came from ("" when unknown) */
} db_decision;

/* Decides one hold inside the caller's open write transaction. A hold
 * whose deadline has passed (now_ms >= expires_ms) can only expire: a
 * confirm or cancel of it expires it (changed, order.status EXPIRED), and
 * its caller answers 409 order_expired. DB_OK (see changed and
 * order.status); DB_NOTFOUND: no such order (or not the buyer's);
 * DB_BUSY/DB_ERROR: the transaction is no longer usable. An order that is
 * not a hold is CONFIRMED and never changes. */
db_status db_hold_decide_in(db *d, db_decision *dc);
/* The same in a transaction of its own (committed before it returns).
 * DB_UNKNOWN: the COMMIT failed and may have landed. */
db_status db_hold_decide(db *d, db_decision *dc);

/* Whether any reserved hold's deadline is at or before now_ms: a read (by
 * the holds_due index) that spares an idle sweep the write lock. 1, 0, or
 * -1 on error. */
int db_hold_any_due(db *d, int64_t now_ms);

/* A hold ended by an expiry sweep. */
typedef struct db_expired {
    char order_id[DB_ORDER_ID_LEN + 1];
    char sku[DB_SKU_MAX + 1];
    int quantity;
    int64_t expires_ms;
    long long reserve_gen;      /* the generation it was reserved under */
    long long return_gen;       /* > 0: its units are owed to that Redis copy */
    char *takes;                /* where they came from (malloc'd; db_expired_free) */
} db_expired;

/* Inside the caller's open write transaction: ends up to max reserved holds
 * whose deadline is at or before now_ms, earliest first, as EXPIRED (one
 * UPDATE, by the holds_due index), and takes their units out of
 * products.held (one UPDATE per product; the db strategies' back into
 * db_available, and out of their buyers' counts). Fills out[0..*n). */
db_status db_hold_expire_due(db *d, int64_t now_ms, int max, db_expired *out, size_t *n);
void db_expired_free(db_expired *e, size_t n);

/* A debt of units, cleared once they are back (db_hold_returned). */
typedef struct db_debt {
    const char *order_id;
    long long gen;
} db_debt;

/* ------------------------------------------------------ through the committer
 *
 * The same, in w's next group commit (one fsync with the orders around
 * them, and no second writer on the file to wait for), waiting for it:
 * never on the writer's own thread. Results as above; DB_UNKNOWN: the
 * group's COMMIT failed and may have landed. */
db_status db_writer_decide(db_writer *w, db_decision *dc);
db_status db_writer_expire(db_writer *w, int64_t now_ms, int max, db_expired *out, size_t *n);
db_status db_writer_returned(db_writer *w, const db_debt *debts, size_t n);

/* A hold whose units are owed to a Redis copy. */
typedef struct db_owed {
    char order_id[DB_ORDER_ID_LEN + 1];
    char sku[DB_SKU_MAX + 1];
    char user_id[DB_USER_MAX * 4 + 1];
    int quantity;
    long long reserve_gen, return_gen;
    const char *takes;          /* valid during the callback */
    db_order_status status;     /* CANCELLED or EXPIRED */
    int64_t decided_ms;         /* the deciding clock (db_decision.now_ms, or the
                                   expiry sweep's now_ms) */
} db_owed;

/* Calls fn for up to max holds still owing units whose decision is at or
 * before decided_before_ms (by the holds_returning index). */
db_status db_hold_owing(db *d, int64_t decided_before_ms, int max,
                        void (*fn)(const db_owed *o, void *ud), void *ud);

/* The decision time of sku's oldest hold still owing units, in
 * *decided_ms; -1 when none owes any. (Return markers older than it may
 * be forgotten: stock_returned_forget.) */
db_status db_hold_oldest_owed(db *d, const char *sku, int64_t *decided_ms);

/* Units of reserved holds, over every product. */
db_status db_hold_units(db *d, long long *held);

/* Units of sku's holds still owed to a Redis copy. */
db_status db_hold_owed_units(db *d, const char *sku, long long *units);

/* Clears the debt of order_id for generation gen (its units are back, or a
 * rebuild counted them), in a transaction of its own unless one is open. */
db_status db_hold_returned(db *d, const char *order_id, long long gen);

#endif
