/* validate.h: checking what clients send, before anything runs: SKUs,
 * user ids, idempotency keys and the request bodies. Each check returns a
 * stable error code and a sentence for the client. */
#ifndef FLASHSALE_SERVICE_VALIDATE_H
#define FLASHSALE_SERVICE_VALIDATE_H

#include <jansson.h>

#include "service/order/order.h"
#include "service/room/room.h"

/* What was wrong with a request: an API error code, the field, a message. */
typedef struct svc_verr {
    int status;
    const char *code;
    char message[256];
} svc_verr;

int svc_valid_sku(const char *s);
/* 1..128 characters of valid UTF-8, no control characters (C0, DEL, C1). */
int svc_valid_user_id(const char *s);
/* 1..128 visible ASCII characters. */
int svc_valid_idem_key(const char *s);

#define SVC_ORDER_QTY_MAX 1000    /* the most units one order may take */

/* Checks a POST /v1/orders body. Strings point into body. Returns 0 or -1
 * with e filled. */
int svc_validate_order(json_t *body, svc_order_input *in, svc_verr *e);

/* The order body as nearly every client sends it, read without jansson:
 * one flat object of "sku", "user_id" and "quantity", each once, and
 * maybe a "ticket", strings without escapes, a plain integer, all valid. */
typedef struct svc_order_fast {
    svc_order_input in;            /* its strings point into the buffers below */
    char sku[DB_SKU_MAX + 1];
    char user_id[4 * DB_USER_MAX + 1];
    char ticket[SVC_ROOM_TICKET_MAX + 1];
} svc_order_fast;

/* Returns 1 with f->in filled when body[0..len) is such a body, which
 * svc_validate_order would accept with the same values; 0 for anything
 * else, valid or not (an escape, a duplicate, an error...): then parse it
 * with jansson and let svc_validate_order decide and word the error. A
 * sold-out answer costs about 15 us of CPU here, and jansson's tree for
 * the body was 1.2 of them. */
int svc_validate_order_fast(const char *body, size_t len, svc_order_fast *f);

typedef struct svc_product_input {
    const char *sku;
    const char *name;
    const char *strategy;     /* NULL: the service default */
    int segments;
    long long stock;
    long long per_user_limit;
    long long hold_seconds;   /* 0: confirmed at once; else holds */
    long long cs_delay_ms;    /* fault injection only */
    long long lock_ttl_ms;    /* fault injection only */
    long long cs_overlap;     /* fault injection only */
    long long room_turn_ms;   /* > 0: a waiting room (waiting_room), turns this long */
    long long room_rate;      /* ...admitting this many orders/s (0: measured) */
    long long room_opens_ms;  /* ...opening then (ms since the epoch; 0: at once) */
} svc_product_input;

/* Checks the body of POST /v1/products/{sku}/tickets ({"user_id": ...}):
 * 0 with *user_id pointing into body, or -1 with e filled. */
int svc_validate_ticket_request(json_t *body, const char **user_id, svc_verr *e);

/* Checks a POST /v1/products body; default_strategy fills a missing
 * "strategy"; fault_injection allows cs_delay_ms, lock_ttl_ms and cs_overlap. */
int svc_validate_product(json_t *body, const char *default_strategy, int fault_injection,
                         svc_product_input *in, svc_verr *e);
/* Checks the body of a confirm ({"payment_ref": 1..128 characters},
 * optional) or a cancel ({"user_id": ...}, optional for an admin): the
 * fields it has point into body (NULL when absent). An empty body (NULL)
 * is fine. */
int svc_validate_decision(json_t *body, int confirm, const char **payment_ref,
                          const char **user_id, svc_verr *e);
/* Checks a restock body: {"quantity": 1..10^9}. */
int svc_validate_restock(json_t *body, long long *qty, svc_verr *e);

#endif
