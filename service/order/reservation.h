/* reservation.h: a reservation in Redis, from its result to its pending
 * record's end; private to service/order/.
 *
 * The three Redis families (script, lock, blocking) take units in Redis
 * under a pending record (stock.h), then commit the order. What follows is
 * the same for all three and lives here: a reservation's result becomes a
 * commit or a refusal; a committed order's pending record is cleared (in
 * the next script call of its SKU on the loop, or on its own); a commit
 * that failed gives the units back (undo.lua) before the refusal. */
#ifndef FLASHSALE_SERVICE_RESERVATION_H
#define FLASHSALE_SERVICE_RESERVATION_H

#include "service/order/order_int.h"
#include "service/order/orderloop.h"

/* Acts on op->sreq's result (op RESERVING). Returns 1 when op is ready for
 * the committer (COMMITTING, or LOOKING_UP for a replay), else 0: op was
 * answered (and freed). Any thread. */
int svc_reservation_result(svc_order *op);
/* The Redis families' `committed`: 201 and the pending record queued to be
 * cleared, or the units given back and the refusal. On op's home loop. */
void svc_reservation_committed(svc_order *op);

/* The pending records of committed orders waiting to be cleared, per loop.
 * On the loop's thread (start: before it runs; free: after it stopped). */
int svc_pending_loop_start(svc_order_loop *ol, char *err, size_t errlen);
void svc_pending_loop_free(svc_order_loop *ol);
/* Whether clears are waiting. */
int svc_pending_loop_busy(svc_order_loop *ol);
/* Sends the clears waiting, as HDELs: after the script family's flush,
 * which takes its SKUs' clears into its own calls first. */
void svc_pending_loop_flush(svc_order_loop *ol);
/* Points ids[0..) at up to max of p's waiting clears; returns how many.
 * They stay until svc_pending_drop(ol, p, k) removes the first k. */
size_t svc_pending_peek(svc_order_loop *ol, const svc_product *p, const char **ids, size_t max);
void svc_pending_drop(svc_order_loop *ol, const svc_product *p, size_t k);

#endif
