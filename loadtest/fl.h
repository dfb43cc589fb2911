/* fl.h: what every part of flashload shares -- its errors, the order ids
 * and keys it sends and reads, and the shape of an order row as any store
 * lists it.
 *
 * flashload (bin/flashload) is the load generator and invariant verifier
 * of flashsale: it drives thousands of buyers at the service and then
 * checks, from four vantage points, that no unit was sold twice and none
 * vanished. It is split the way the service is, one folder per part, each
 * with one header that is its whole face:
 *
 *   client/   the HTTP wire: a response parser (partial reads, chunked and
 *             pipelined answers), a blocking client for the admin calls and
 *             the API vantage point, the products and strategies as the
 *             service lists them (client.h)
 *   engine/   the load: one epoll loop per thread, closed or open loop, a
 *             crowd of buyers (engine.h); its latency histogram (hist.h),
 *             buyers' choices (buyers.h) and decisions due later (timerq.h)
 *   stores/   the verifier's own reads of Redis (one server, Sentinel,
 *             Cluster) and of the orders' database, by the format in
 *             docs/storage.md, never through the service's code (stores.h)
 *   verify/   the invariants from every vantage point, of holds too, and
 *             the verdict (verify.h); the same reads without a load:
 *             `flashload inspect` (inspect.h)
 *   run.h     one run: product, load, sampling, progress, verdict
 *   procs.h   the processes flashload starts: redis-server, the service,
 *             the lock servers, Sentinel-watched servers
 *   compare/  `flashload compare`: the scenes (scene.h), the matrix, its
 *             table, report.json and report.html (compare.h)
 *
 * Errors are reported in an fl_err the caller passes in; nothing keeps
 * global mutable state, so several runs may follow each other in one
 * process (compare does). Every global name starts with fl_ (FL_), so that
 * none reads like one of the service's. */
#ifndef FLASHSALE_LOADTEST_FL_H
#define FLASHSALE_LOADTEST_FL_H

#include <stddef.h>

/* The API's limits the load generator builds and reads by (its own copies:
 * it shares no code with the service; tests/unit/test_flashload.c checks
 * they agree with the database's). */
#define FL_KEY_MAX 128           /* longest idempotency key (the API's limit) */
#define FL_ORDER_ID_LEN 26       /* an order id: 26 characters (a ULID; the API's) */
typedef char fl_order_id[FL_ORDER_ID_LEN + 1];

/* ------------------------------------------------------------------ errors */

typedef struct fl_err {
    char msg[512];
} fl_err;

/* Writes a message into e (NULL: ignored). Returns -1, for `return fl_errf(..)`. */
int fl_errf(fl_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The order of two order ids (NUL-terminated strings, e.g. fl_order_id
 * elements), for qsort and bsearch. */
int fl_order_id_cmp(const void *a, const void *b);

/* An order as a store lists it; state is the order's status (confirmed,
 * reserved, cancelled, expired), or "" for an order SQLite keeps no hold of
 * (which is confirmed). */
typedef void (*fl_row_fn)(const char *order_id, const char *user_id, int quantity,
                          const char *idem_key, const char *state, void *ud);

#endif
