/* family.h: the strategy-family interface; private to service/order/.
 *
 * Every stock strategy belongs to one family, which takes an order's units
 * the way that strategy does, where it must run (the stock module's
 * stock_kind says which; pipeline.c's table maps kinds to families):
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
 * goes back through svc_pipeline_reroute). Its hooks:
 *
 *   submit     takes an order in state RESERVING. Any thread; the order's
 *              home loop is set.
 *   committed  the order's commit is back (state COMMITTING), on its home
 *              loop: answer it, or give its units back and refuse.
 *   loop_start / loop_flush / loop_busy / loop_free
 *              the family's state on each event loop (NULL: it keeps none):
 *              made before the loop runs; flushed once per loop turn, after
 *              the turn's events, to send what the turn gathered (in the
 *              order of pipeline.c's FLUSH list); asked, on the loop, whether
 *              it holds orders or work not yet done (shutdown waits); freed
 *              once the loop stopped. */
#ifndef FLASHSALE_SERVICE_FAMILY_H
#define FLASHSALE_SERVICE_FAMILY_H

#include "service/order/order_int.h"

struct svc_family {
    const char *name;
    void (*submit)(svc_order *op);
    void (*committed)(svc_order *op);
    int (*loop_start)(svc_order_loop *ol, char *err, size_t errlen);
    void (*loop_flush)(svc_order_loop *ol);
    int (*loop_busy)(svc_order_loop *ol);
    void (*loop_free)(svc_order_loop *ol);
};

#endif
