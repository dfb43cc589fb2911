/* order.h: the order path's face: how the rest of the service hands it an
 * order and hears the answer.
 *
 * An order enters with svc_order_submit and leaves through the reply
 * function the caller gave, exactly once, with what to answer: the order
 * (201, or 200 for a replay of its Idempotency-Key) or a refusal (a status,
 * a stable error code and a sentence). The order path knows nothing of
 * HTTP: the API turns the reply into a response (api/api.c), and the unit
 * tests collect replies directly (tests/unit/test_order.c).
 *
 * Inside (service/order/, see pipeline.c for the map): the order's
 * strategy picks one of four families -- script, lock, blocking, db --
 * which takes the units; the committer commits the order's row in a group;
 * the order is answered on the event loop it came from. */
#ifndef FLASHSALE_SERVICE_ORDER_H
#define FLASHSALE_SERVICE_ORDER_H

#include <stdint.h>
#include <jansson.h>

#include "db/db.h"
#include "service/ops/metrics.h"
#include "stock/stock.h"

typedef struct svc_app svc_app;
typedef struct svc_product svc_product;

/* A validated order request; the strings belong to the caller, who keeps
 * them alive during svc_order_submit only. */
typedef struct svc_order_input {
    const char *sku;
    const char *user_id;
    int quantity;
    const char *ticket;           /* a waiting room's ticket (NULL: none sent); checked
                                     before the order path (api/tickets.c) */
} svc_order_input;

/* What to answer. Exactly one of: order (status 201, or 200 for a replay),
 * or a refusal (code and message). */
typedef struct svc_reply {
    int status;
    svc_outcome outcome;          /* as counted in flashsale_orders_total */
    const db_order *order;        /* the order; valid during the call only */
    const char *code;             /* a refusal's stable API error code */
    const char *message;          /* ...its sentence (NULL when body is given) */
    json_t *extra;                /* ...more fields of its body, or NULL: the callee
                                     takes this reference */
    int retry_after_s;            /* Retry-After seconds to send; 0: none */
    const char *body;             /* a refusal's whole JSON body, written already (code,
                                     message and extra in it; NULL: build it from them) */
    size_t body_len;
} svc_reply;

/* Called once per order, on whichever thread answers it (an event loop, a
 * blocking-family thread), after the outcome was counted. */
typedef void svc_order_reply_fn(void *ctx, const svc_reply *r);

/* Takes over a validated order of product p: reserves, commits and answers
 * it through fn(ctx, ...). Any thread (an event loop's own orders stay on
 * it). Returns 0, or -1 when out of memory: nothing was taken and fn will
 * not be called. */
int svc_order_submit(svc_app *a, svc_product *p, const svc_order_input *in,
                     const char *idem_key, svc_order_reply_fn *fn, void *ctx);

/* The rank of the order path's loop phase (loop_on_phase): the turn's
 * orders become Redis commands (lock queues started, one script call per
 * SKU, the clears of pending records). After the HTTP server's phase,
 * whose requests make the orders; before the stock module's lane clears
 * (which only the clears no batch carried are left for) and the Redis
 * connections' writes (pipeline.c asserts the order). */
#define SVC_ORDERS_PHASE_RANK 200

/* The order path on each of a->loops (in their SVC_ORDERS_PHASE_RANK
 * phase, after the HTTP server's whichever attached first); waiting, with a bound,
 * for the loops' orders and Redis work to be done (at shutdown, with the
 * loops still running); freeing it once the loops stopped. */
int svc_orders_start(svc_app *a, char *err, size_t errlen);
void svc_orders_drain(svc_app *a, int64_t wait_ms);
void svc_orders_free(svc_app *a);
/* The committer's callback (db_writer_start's done): every order of a
 * committed group goes home. On the committer thread. */
void svc_orders_committed(db_job **jobs, size_t n, void *ud);

/* Why strategy s cannot take orders on this instance -- the lock server it
 * needs was not configured ("start flashsale with --zookeeper ...") -- or
 * NULL when it can. */
const char *svc_strategy_unavailable(const svc_app *a, stock_strategy s);
/* The flag that configures the lock server s needs ("--etcd"), or NULL. */
const char *svc_strategy_flag(stock_strategy s);

/* A new order id: 26 characters of Crockford base32 (a ULID): 48 bits of
 * milliseconds then 80 random bits, increasing within this process, so ids
 * sort by creation time. *wall_ms gets the time encoded. Thread-safe. */
void svc_order_id_new(char out[27], int64_t *wall_ms);
/* Whether s looks like an order id (26 base32 characters). */
int svc_order_id_valid(const char *s);
/* Fingerprint of an order request, for idempotent replays: 16 hex chars. */
void svc_order_fingerprint(const char *sku, const char *user_id, int quantity, char out[17]);

#endif
