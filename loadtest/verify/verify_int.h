/* verify_int.h: what the verifier's files share, and nobody else: the
 * verdict's bookkeeping (verdict.c) and the checks of holds (holds.c),
 * which verify.c calls. Not part of verify.h: these are the verifier's
 * insides, free to change with it.
 *
 * The files call downwards only: verify.c -> holds.c -> verdict.c. */
#ifndef FLASHSALE_VERIFY_INT_H
#define FLASHSALE_VERIFY_INT_H

#include "loadtest/stores/stores.h"
#include "loadtest/verify/verify.h"

/* ------------------------------------------------------------ the verdict */

/* Records a broken invariant, seen from vantage, of the given size. */
void fl_violate(fl_verdict *vd, const char *vantage, long long size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Adds to the notes: what could not be checked, and why. */
void fl_note(fl_verdict *vd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Keeps v if it is the lowest stock seen so far. */
void fl_see_stock(fl_verdict *vd, long long v);
/* Whether order id existed before the run (b may be NULL: none did). */
int fl_baseline_has(const fl_baseline *b, const char *id);

/* ------------------------------------------------------------------ holds */

/* A hold as SQLite has it at the end. */
typedef struct fl_hold_rec {
    fl_order_id order_id;
    char state;                  /* 'r' reserved, 'c' confirmed, 'x' cancelled, 'e' expired */
    int quantity;
    int this_run;                /* made by this run's buyers (not before it) */
    long long gen, expires_ms, decided_ms;
} fl_hold_rec;

/* The holds of the product under test, as the client, SQLite and Redis
 * know them. Everything is inert when `on` is 0 (a product without holds):
 * the checks of such a product are exactly what they were before holds. */
typedef struct fl_holds {
    int on;                      /* the product has holds */
    const fl_verify_in *in;
    fl_decision_rec *dec;        /* the buyers' decisions, sorted by order id */
    size_t ndec;
    long long paid_units;        /* units of the confirms answered 200 */
    long long unknown_units;     /* units of confirms sent without an answer */
    /* SQLite's holds (fl_holds_on_hold), sorted by id once read. */
    fl_hold_rec *rows;
    size_t nrows, cap;
    long long late_confirms, early_expiries, owed, wrong_refs;
    fl_order_id late_eg, early_eg, ref_eg;
    long long first_end_ms;      /* earliest end (cancel, expiry) of this run's holds; 0 none */
    long long *lags;             /* this run's expiries: decided_ms - expires_ms */
    size_t nlags, caplags;
} fl_holds;

/* One vantage point's order rows, as holds see them. */
typedef struct fl_hold_rows {
    long long disagree;          /* rows in a state the buyers' answers rule out */
    char disagree_eg[120];
    long long no_hold;           /* rows of the product without a hold (SQLite) */
    long long reserved;          /* rows still reserved */
    long long units_every;       /* every row's units, whatever its state */
    long long after_end;         /* units of rows made after the first hold ended */
} fl_hold_rows;

/* Sets hx up for the product (hold_seconds > 0: on) from the load's
 * decisions. Returns 0, or -1 out of memory. */
int fl_holds_init(fl_holds *hx, const fl_verify_in *in, int hold_seconds);
void fl_holds_free(fl_holds *hx);
/* Whether state counts as sold: confirmed, or an order without a hold. */
int fl_holds_sold_state(const char *state);
/* Whether state holds units for its buyer (sold or reserved): what the
 * per-user limit counts. */
int fl_holds_counts_for_limit(const char *state);
/* Whether order id was confirmed by a 200 to its buyer's payment. */
int fl_holds_paid(const fl_holds *hx, const char *id);

/* Waits until the holds have settled (nothing held, no hold reserved or
 * owing its units to Redis), at most hold_seconds + settle_ms, with a
 * progress line a second when asked; *p is the product as last read.
 * Returns 0, or -1 with e set when the product cannot be read. */
int fl_holds_settle(const fl_holds *hx, fl_http *h, fl_product *p, fl_verdict *vd, fl_err *e);
/* The client's checks: paid units within the stock, no confirm answered
 * 200 at or after its deadline. */
void fl_holds_check_client(const fl_holds *hx, long long run_stock, fl_verdict *vd);
/* Takes one order row of a vantage point into hr (this_run: not before). */
void fl_holds_row(const fl_holds *hx, fl_hold_rows *hr, const char *id, int qty,
                  const char *state, int this_run);
/* The checks of one vantage point's rows; sold: that vantage point's
 * units sold by this run. */
void fl_holds_check_rows(const fl_holds *hx, const fl_hold_rows *hr, const char *vantage,
                         long long sold, fl_verdict *vd);
/* Takes one SQLite hold (this_run: not before the run). */
void fl_holds_on_hold(fl_holds *hx, const fl_hold_row *h, int this_run);
/* SQLite's holds, once read: deadlines, owed returns, the expiry lag, and
 * the units sold again (hr: SQLite's rows). */
void fl_holds_check_db(fl_holds *hx, const fl_hold_rows *hr, const fl_db_sku *dp,
                       fl_verdict *vd);
/* Redis's return markers against SQLite's holds: only ended holds given
 * back, and every ended hold of this copy's generation given back, or
 * decided before the forgetting watermark (c: the copy as read; of a
 * spread one, the markers are the union over its lanes). */
void fl_holds_check_returned(const fl_holds *hx, fl_redis *rd, const fl_stock_copy *c,
                             fl_verdict *vd);

#endif
