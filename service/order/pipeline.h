/* pipeline.h: what the families ask of the pipeline; private to
 * service/order/. */
#ifndef FLASHSALE_SERVICE_PIPELINE_H
#define FLASHSALE_SERVICE_PIPELINE_H

#include "service/order/order_int.h"

/* Hands op (RESERVING) to the family of kind instead of its own: a `lock`
 * order that no one segment can hold goes to the blocking family, which
 * reads every segment. Any thread. */
void svc_pipeline_reroute(svc_order *op, stock_kind kind);

/* Runs fn(op) on one of the order path's blocking threads (--lock-workers),
 * where an order may wait for a lock or read SQLite; one order per thread
 * at a time, each thread with its own connections (app.h). Any thread. */
void svc_pipeline_run_blocking(svc_order *op, svc_order_fn *fn);

#endif
