/* api_int.h: what the API's files share; private to service/api/.
 *
 *   api.c      products, strategies, health, metrics, the route table
 *   orders.c   orders: create, read, list, and a hold's confirm and cancel
 *   tickets.c  a waiting room's tickets, and an order's turn
 *   jobs.c     the helpers below: shared answers, deferring to a worker
 *
 * A handler runs on an HTTP loop thread and never waits on a store: what
 * needs Redis or SQLite is deferred to an API worker as an api_job. */
#ifndef FLASHSALE_SERVICE_API_INT_H
#define FLASHSALE_SERVICE_API_INT_H

#include <jansson.h>

#include "db/holds.h"
#include "http/http.h"
#include "service/api/validate.h"
#include "service/app.h"
#include "service/threadpool.h"

/* A request handed to an API worker, with everything it needs copied out
 * of the HTTP layer's buffers. */
typedef struct api_job {
    svc_task task;                 /* its place in an API pool's queue */
    svc_app *a;
    http_req *r;
    void (*run)(struct api_job *j);
    char sku[DB_SKU_MAX + 1];
    char key[DB_KEY_MAX + 1];
    char order_id[DB_ORDER_ID_LEN + 1];
    char user[DB_USER_MAX * 4 + 1];
    char after[DB_ORDER_ID_LEN + 1];
    int has_sku, has_user, has_after;
    long long qty;
    long limit;
    int status;                    /* order list: < 0 any */
    db_hold_to to;                 /* confirm or cancel */
    char ref[DB_REF_MAX * 4 + 1];  /* confirm: payment_ref; a ticket */
    json_t *body;                  /* owned; inputs below point into it */
    svc_product_input product;
    svc_order_input order;
} api_job;

/* Which workers a job needs: those that may wait on Redis, or those that
 * only read SQLite. Two pools, so that a stalled Redis (every Redis lane
 * worker waiting out its timeout) cannot hold up order lookups, which
 * never need it. */
typedef enum api_lane { LANE_REDIS, LANE_DB } api_lane;

/* Appends s (valid UTF-8) to p as the inside of a JSON string, escaping
 * quotes, backslashes and control characters; room for 6 x strlen(s)
 * bytes. Returns the new end. For the bodies written without jansson:
 * the answers given most (an order, /healthz). */
char *api_json_escape(char *p, const char *s);

/* "Retry-After: 1", as extra headers. */
extern const char *const api_retry[];

void api_reply_verr(http_req *r, const svc_verr *e);
/* 503 db_unavailable ("... (doing); nothing was changed"), counted. */
void api_reply_db_down(http_req *r, svc_app *a, const char *doing);
/* 503 overloaded: every database connection of the instance stayed in use
 * (svc_db_take's busy); nothing was changed. */
void api_reply_db_busy(http_req *r, const char *doing);
/* One of the two: busy (a take's, or a status DB_NOCONN): api_reply_db_busy;
 * else api_reply_db_down. */
void api_reply_db_failed(http_req *r, svc_app *a, int busy, const char *doing);
void api_reply_unknown_sku(http_req *r, const char *sku);
/* Admin endpoints: 1 when the bearer token matches (or none is configured);
 * else answers 401 and returns 0. */
int api_authorized(http_req *r, svc_app *a);
/* Reads the Idempotency-Key header into key (DB_KEY_MAX + 1 bytes; "" when
 * absent). Answers 400 and returns -1 when it is malformed. */
int api_idem_key(http_req *r, char *key);
/* A job for r, owning body; NULL (503 answered, body freed) when out of
 * memory. */
api_job *api_job_new(http_req *r, svc_app *a, json_t *body);
/* Defers r to an API worker of lane running run(j). Takes j (and j->body). */
void api_defer(http_req *r, api_job *j, api_lane lane, void (*run)(api_job *j));

/* The order routes (orders.c). */
void api_order_create(http_req *r, const char *const *params, void *ud);
void api_order_get(http_req *r, const char *const *params, void *ud);
void api_order_list(http_req *r, const char *const *params, void *ud);
void api_order_confirm(http_req *r, const char *const *params, void *ud);
void api_order_cancel(http_req *r, const char *const *params, void *ud);

/* A waiting room's routes, and an order's turn (tickets.c). */
void api_ticket_take(http_req *r, const char *const *params, void *ud);
void api_ticket_get(http_req *r, const char *const *params, void *ud);
/* How an order of p in the turn of position enters the order path
 * (orders.c), past the door when door (an instance with a room checks it
 * after the turn). ticket: the place's ticket when the buyer sent none
 * (told it if the order is shed), else NULL. Any thread. */
typedef void api_in_turn_fn(svc_app *a, http_req *r, svc_product *p, const svc_order_input *in,
                            const char *key, int door, long long position, const char *ticket);
/* The request's ?wait_ms= (0..10000: how long a ticket or an order may
 * wait for its place's turn) into *ms: 0 (*ms unchanged when absent), or
 * -1 with r answered 400 invalid_field. */
int api_wait_ms(http_req *r, long *ms);
/* An order of p, which has a room: its ticket's position (> 0) when the
 * ticket is its buyer's and in its turn; else 0: r answered (403, 409,
 * 429 with Retry-After, 503), or taken on. Taken on: an order without a
 * ticket takes its buyer's place (an API worker's call) and in its turn
 * goes on through go (with key, NULL: none); an order whose place's turn
 * has not come waits for it up to wait_ms (> 0; the beat thread then
 * sends it on through go, or answers it sold out) and is answered 429
 * (with the ticket, when the buyer sent none) when wait_ms is 0 or
 * passes first. */
long long api_room_admit(http_req *r, svc_app *a, svc_product *p, const svc_order_input *in,
                         const char *key, api_in_turn_fn *go, long wait_ms);

#endif
