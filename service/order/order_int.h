/* order_int.h: one order on its way through the order path, and its
 * states; private to service/order/.
 *
 * An svc_order carries one order request from svc_order_submit to its
 * answer. Where it is is its `state`, one field, changed only by
 * svc_order_to, which asserts that the move is one the path makes:
 *
 *   from         to                  when
 *   NEW          RESERVING           handed to its strategy's family
 *   RESERVING    RESERVING           moved to another family (a `lock` order
 *                                    no one segment can hold goes blocking)
 *                COMMITTING          units taken: its row goes to the committer
 *                LOOKING_UP          its key was used: find that order
 *                ANSWERED            refused (sold out, limit, lock timeout, ...)
 *   COMMITTING   ANSWERED            committed (201), or refused by the database
 *                UNDOING             the commit failed: units go back first
 *                LOOKING_UP          the key is in SQLite already (db family)
 *                RESERVING           db-optimistic: the version moved, read again
 *                MARKING             the COMMIT's outcome unknown: the order is
 *                                    marked to be revoked before its 503
 *   UNDOING      ANSWERED            units back: the refusal is answered
 *                LOOKING_UP          units back: answered as a replay of the
 *                                    order the key names
 *   LOOKING_UP   ANSWERED            the replay (200) or the refusal
 *   MARKING      ANSWERED            the mark written (or not): 503
 *
 * One owner at a time: the thread that moved it last, until it hands the
 * order on (to a family's queue, the committer, a loop's inbox). One free:
 * answering it (svc_order_answer, svc_order_refuse) frees it. */
#ifndef FLASHSALE_SERVICE_ORDER_INT_H
#define FLASHSALE_SERVICE_ORDER_INT_H

#include <assert.h>
#include <stdint.h>

#include "service/app.h"
#include "service/order/order.h"
#include "service/products.h"
#include "service/threadpool.h"

typedef struct svc_order svc_order;
typedef struct svc_order_loop svc_order_loop;
typedef struct svc_family svc_family;

typedef enum svc_order_state {
    SVC_ORDER_NEW,
    SVC_ORDER_RESERVING,
    SVC_ORDER_COMMITTING,
    SVC_ORDER_LOOKING_UP,
    SVC_ORDER_UNDOING,
    SVC_ORDER_MARKING,
    SVC_ORDER_ANSWERED,
    SVC_ORDER_STATES
} svc_order_state;

/* The refusals, one row each in order.c's table: status, code, sentence. */
typedef enum svc_refusal {
    RF_SOLD_OUT, RF_INSUFFICIENT, RF_LIMIT, RF_KEY_REUSED, RF_IN_PROGRESS, RF_LOCK_TIMEOUT,
    RF_FENCED, RF_CONFLICT, RF_REBUILDING, RF_REDIS_DOWN, RF_REDIS_DOWN_TAKEN, RF_STALE,
    RF_DB_DOWN, RF_DB_UNKNOWN, RF_LOCK_DOWN, RF_DB_BUSY, RF_COUNT,
    RF_LOOKUP = RF_COUNT          /* UNDOING only: not a refusal; look the key's order up */
} svc_refusal;

/* Room for what a family keeps with an order it holds (svc_order.fam_data):
 * the lock family's is the largest (a stock_hold, two words and a flag). Each
 * family names its own struct and asserts that it fits (SVC_FAM_DATA_FITS):
 * the area is inline in the order, as it was as a union of the families'
 * structs, so a family's field is at a fixed offset from the order, no
 * allocation and no pointer more on the order path; but the core no longer
 * knows any family's fields (as Linux's sk_buff.cb for each protocol). */
#define SVC_FAM_DATA_MAX 264
#define SVC_FAM_DATA_ALIGN 8
/* op's family area as the family's struct t (only op's family uses it). */
#define SVC_FAM_DATA(op, t) ((t *)(void *)(op)->fam_data)
#define SVC_FAM_DATA_FITS(t)                                                                  \
    _Static_assert(sizeof(t) <= SVC_FAM_DATA_MAX && _Alignof(t) <= SVC_FAM_DATA_ALIGN,        \
                   #t " must fit svc_order.fam_data: raise SVC_FAM_DATA_MAX")

/* What to do with an order when it reaches a loop (orderloop.c's inbox). */
typedef void svc_order_fn(svc_order *op);

struct svc_order {
    svc_order_state state;
    svc_app *a;
    svc_product *p;
    const svc_family *fam;         /* the family taking its units */
    svc_order_loop *home;          /* the loop its commit comes back to */
    svc_order_reply_fn *reply;     /* its answer goes there */
    void *reply_ctx;
    int quantity;
    int64_t t_in_us;               /* when it was admitted (admission.h)... */
    int64_t door_us;               /* ...how long it may have waited to be read before... */
    stock_strategy adm_strategy;   /* ...under which strategy's limit */
    char order_id[DB_ORDER_ID_LEN + 1];
    char created_at[UTC_TIME_LEN + 1];
    int64_t expires_ms;            /* a hold's deadline (0: confirmed at once) */
    char user_id[DB_USER_MAX * 4 + 1];
    char idem_key[DB_KEY_MAX + 1];
    char fingerprint[17];
    stock_req sreq;                /* a Redis family's reservation */
    db_job job;                    /* COMMITTING / LOOKING_UP: the committer's job */
    svc_refusal undo_then;         /* UNDOING: what to answer once the units are back */
    long long undo_avail;          /* ...and the figure it names (RF_LIMIT: bought) */
    svc_order_fn *arrive;          /* run when it reaches a loop's inbox, or a
                                      blocking thread */
    svc_task task;                 /* its place in the blocking threads' queue */
    svc_order *next;               /* the one list it is on at a time */
    /* What its family keeps with it while it holds the order, as the
     * family's own struct (SVC_FAM_DATA); not initialised: the family's
     * submit sets what it reads. */
    _Alignas(SVC_FAM_DATA_ALIGN) unsigned char fam_data[SVC_FAM_DATA_MAX];
};

/* Whether the path moves an order from state `from` to `to` (the table
 * above). */
int svc_order_may(svc_order_state from, svc_order_state to);
/* Moves op to state to, asserting the move is one of the table's. */
static inline void svc_order_to(svc_order *op, svc_order_state to) {
    assert(svc_order_may(op->state, to));
    op->state = to;
}
const char *svc_order_state_name(svc_order_state s);

/* Answers op with refusal rf (n: the number its sentence names -- units
 * left, units bought, tries; for the 409s also a field of the body), then
 * frees it. */
void svc_order_refuse(svc_order *op, svc_refusal rf, long long n);
/* Answers an order of p, which is known sold out, 409 sold_out through
 * fn(ctx) without making an order (svc_order_submit's shortcut). */
void svc_order_refuse_soldout(svc_app *a, svc_product *p, svc_order_reply_fn *fn, void *ctx);
/* Answers op with its order o (replayed: 200, else 201), then frees it. */
void svc_order_answer(svc_order *op, const db_order *o, int replayed);
/* The status and code rf answers (for tests and docs). */
int svc_refusal_status(svc_refusal rf);
const char *svc_refusal_code(svc_refusal rf);

/* A new order in state NEW for p and in (fields copied), answered through
 * fn(ctx); NULL when out of memory. */
svc_order *svc_order_new(svc_app *a, svc_product *p, const svc_order_input *in,
                         const char *idem_key, svc_order_reply_fn *fn, void *ctx);

#endif
