/* orderloop.h: the order path's state on one event loop; private to
 * service/order/.
 *
 * An order loop is what the order path keeps on each event loop (common/
 * loop.h): the loop's own Redis connection (stock_async), the per-loop
 * state of the families that keep some (a slot each, by the family's
 * index, as nginx keeps its modules' ctx: this file knows no family's
 * state), the pending records to clear (reservation.c's), and an inbox
 * through which other threads hand it
 * orders: the committer handing back a committed group, an API worker
 * submitting an order, another loop passing a `lock` order to the loop
 * that owns its lock. An order arrives with the function to run on it
 * (svc_order.arrive).
 *
 * Everything of an order loop but the inbox and the committer's staging
 * belongs to its loop's thread: svc_order_loop_owned asserts it. */
#ifndef FLASHSALE_SERVICE_ORDERLOOP_H
#define FLASHSALE_SERVICE_ORDERLOOP_H

#include "common/loop.h"
#include "service/order/order_int.h"

/* Slots for the families' per-loop state: at least as many as pipeline.c's
 * FAMILIES (it asserts so). */
#define SVC_FAMILY_SLOTS 8

/* A new order loop on l (index: its place among a->loops). The Redis
 * connection comes with svc_order_loop_connect; its writes go out in the
 * connections' phase (ACONN_PHASE_RANK), after the order path's. */
svc_order_loop *svc_order_loop_new(svc_app *a, loop *l, int index, char *err, size_t errlen);
int svc_order_loop_connect(svc_order_loop *ol, char *err, size_t errlen);
/* Frees ol (its loop stopped; the families and reservation.c freed their
 * state). */
void svc_order_loop_free(svc_order_loop *ol);

/* The calling thread's order loop, or NULL on a thread that runs none. */
svc_order_loop *svc_order_loop_current(void);
/* Whether the calling thread is ol's (for assert). */
int svc_order_loop_owned(const svc_order_loop *ol);

loop *svc_order_loop_loop(const svc_order_loop *ol);
svc_app *svc_order_loop_app(const svc_order_loop *ol);
int svc_order_loop_index(const svc_order_loop *ol);
/* The loop's Redis connection. On ol's thread. */
stock_async *svc_order_loop_stock(svc_order_loop *ol);
/* fam's per-loop state, in the slot of its index (family.h). On ol's
 * thread, or before the loop runs or after it stopped. */
void *svc_order_loop_state(const svc_order_loop *ol, const svc_family *fam);
void svc_order_loop_set_state(svc_order_loop *ol, const svc_family *fam, void *state);
/* The pending records to clear (reservation.c's state on this loop). */
void *svc_order_loop_pending(const svc_order_loop *ol);
void svc_order_loop_set_pending(svc_order_loop *ol, void *state);

/* Runs fn(op) on ol's thread: at once when called there, else through the
 * inbox (one wake for what arrives together). Any thread. */
void svc_order_loop_run(svc_order_loop *ol, svc_order *op, svc_order_fn *fn);

/* The committer's hand-back: stages op (its arrive already set) for ol,
 * listing ol in *touched; svc_order_loop_give_done then moves each touched
 * loop's staging into its inbox with one wake. Committer thread only:
 * *touched and the staging are its own. */
void svc_order_loop_give(svc_order_loop **touched, svc_order_loop *ol, svc_order *op);
void svc_order_loop_give_done(svc_order_loop **touched);

/* Asks ol's thread whether it still has work: busy(ol, ud) there, or
 * Redis commands in flight on its connection. Returns 1 busy, 0 idle, -1
 * not answered yet (ask again); a question already asked is not asked
 * twice. Any thread but ol's; the loops still run. */
int svc_order_loop_busy(svc_order_loop *ol, int (*busy)(svc_order_loop *ol, void *ud), void *ud);

#endif
