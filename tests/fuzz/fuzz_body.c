/* fuzz_body.c: libFuzzer harness for request body decoding and validation:
 * the bytes of a POST body go through the same JSON parse as the service
 * (jansson, duplicate keys refused) and then through every body validator.
 * The first byte picks the endpoint, so one corpus covers all three. An
 * order body the fast reader (svc_validate_order_fast) takes must be one
 * jansson and svc_validate_order take too, with the same values. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <jansson.h>

#include "service/api/validate.h"
#include "service/order/order.h"

/* The fast reader agrees with the slow path on what it takes. */
static void check_fast(const char *body, size_t len) {
    svc_order_fast f;
    if (!svc_validate_order_fast(body, len, &f)) return;
    json_error_t jerr;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    svc_order_input in;
    svc_verr e;
    if (!j || !json_is_object(j) || svc_validate_order(j, &in, &e) != 0) __builtin_trap();
    if (strcmp(in.sku, f.in.sku) || strcmp(in.user_id, f.in.user_id) ||
        in.quantity != f.in.quantity)
        __builtin_trap();
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] % 3 == 0) check_fast((const char *)data + 1, size - 1);
    json_error_t jerr;
    json_t *j = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, &jerr);
    if (!j) return 0;
    svc_verr e;
    if (json_is_object(j)) {
        switch (data[0] % 3) {
        case 0: {
            svc_order_input in;
            if (svc_validate_order(j, &in, &e) == 0) {
                /* What the service then relies on. */
                if (!svc_valid_sku(in.sku) || !svc_valid_user_id(in.user_id) || in.quantity < 1 ||
                    in.quantity > SVC_ORDER_QTY_MAX)
                    __builtin_trap();
                char fp[17];
                svc_order_fingerprint(in.sku, in.user_id, in.quantity, fp);
                if (strlen(fp) != 16) __builtin_trap();
            }
            break;
        }
        case 1: {
            svc_product_input in;
            if (svc_validate_product(j, "lua", data[0] & 4, &in, &e) == 0) {
                if (!svc_valid_sku(in.sku) || in.stock < 0 || in.stock > 1000000000 ||
                    in.segments < 1 || in.segments > STOCK_MAX_SEGMENTS || in.per_user_limit < 0)
                    __builtin_trap();
            }
            break;
        }
        default: {
            long long q;
            if (svc_validate_restock(j, &q, &e) == 0 && (q < 1 || q > 1000000000)) __builtin_trap();
        }
        }
    }
    json_decref(j);
    return 0;
}
