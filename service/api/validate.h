/* validate.h: checking what clients send, before anything runs: SKUs,
 * user ids, idempotency keys and the request bodies. Each check returns a
 * stable error code and a sentence for the client. */
#ifndef FLASHSALE_SERVICE_VALIDATE_H
#define FLASHSALE_SERVICE_VALIDATE_H

#include <jansson.h>

#include "service/order/order.h"

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

/* Checks a POST /v1/orders body. Strings point into body. Returns 0 or -1
 * with e filled. */
int svc_validate_order(json_t *body, svc_order_input *in, svc_verr *e);

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
} svc_product_input;

/* Checks a POST /v1/products body; default_strategy fills a missing
 * "strategy"; fault_injection allows cs_delay_ms and lock_ttl_ms. */
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
