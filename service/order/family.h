/* family.h: the strategy-family interface; private to service/order/.
 *
 * Every stock strategy belongs to one family, which takes an order's units
 * the way that strategy does, where it must run (the stock module's
 * stock_kind says which; each family names the kinds it serves, and
 * pipeline.c's one table, FAMILIES, lists the families):
 *
 *   script    fam_script.c   `lua`: batched per SKU on the request's own
 *                            loop, one script call per batch
 *   lock      fam_lock.c     `lock`: queued on the loop that owns the
 *                            segment's lock, two round trips per order
 *   blocking  fam_blocking.c the read-check-write strategies that may wait
 *                            for a lock (redlock, zookeeper, etcd, db-lock,
 *                            local, unsafe-*): one order per thread
 *   db        fam_db.c       `db`, `db-optimistic`: the units are taken in
 *                            the order's own SQLite transaction
 *
 * A family owns all of its state; the pipeline calls it only through this
 * table, and no family calls another (an order one family cannot serve
 * goes back through svc_pipeline_reroute). Where its state lives:
 *
 *   per loop   behind its slot in each order loop (svc_order_loop_state,
 *              by its index), made and freed by its loop hooks;
 *   per order  in the order's fam_data area, as a struct of its own that
 *              it asserts fits (SVC_FAM_DATA_FITS, order_int.h).
 *
 * Its hooks: the required ones in every family; the optional ones NULL
 * when it keeps no per-loop state (the pipeline skips a NULL hook):
 *
 *   submit     (required) takes an order in state RESERVING. Any thread;
 *              the order's home loop is set.
 *   committed  (required) the order's commit is back (state COMMITTING),
 *              on its home loop: answer it, or give its units back and
 *              refuse.
 *   loop_start (optional) makes its state on a loop, before the loop runs.
 *   loop_flush (optional) once per loop turn, in the loop's
 *              SVC_ORDERS_PHASE_RANK phase (order.h), after the turn's events:
 *              sends what the turn gathered. The families flush in the
 *              order of FAMILIES.
 *   loop_busy  (optional) asked on the loop whether it holds orders or
 *              work not yet done (shutdown waits while one does).
 *   loop_free  (optional) frees its state on a loop, once the loop
 *              stopped. */
#ifndef FLASHSALE_SERVICE_FAMILY_H
#define FLASHSALE_SERVICE_FAMILY_H

#include "service/order/order_int.h"

struct svc_family {
    const char *name;
    unsigned kinds;                /* the stock_kinds it serves: 1u << kind each */
    int index;                     /* its place in FAMILIES, set by svc_orders_start
                                      (as nginx sets a module's ctx_index): the
                                      slot of its per-loop state */
    void (*submit)(svc_order *op);
    void (*committed)(svc_order *op);
    int (*loop_start)(svc_order_loop *ol, char *err, size_t errlen);
    void (*loop_flush)(svc_order_loop *ol);
    int (*loop_busy)(svc_order_loop *ol);
    void (*loop_free)(svc_order_loop *ol);
};

#endif
