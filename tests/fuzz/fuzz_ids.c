/* fuzz_ids.c: libFuzzer harness for the identifiers the service parses from
 * untrusted text: order ids (paths, ?after=), Idempotency-Key headers,
 * SKUs, user ids, and Redis URLs (flags and environment). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rconn.h"
#include "service/api/validate.h"
#include "service/order/order.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    size_t n = strlen(s);
    if (svc_order_id_valid(s) && n != 26) __builtin_trap();
    if (svc_valid_idem_key(s)) {
        if (n < 1 || n > 128) __builtin_trap();
        for (size_t i = 0; i < n; i++)
            if (s[i] < 0x21 || s[i] > 0x7e) __builtin_trap();
    }
    if (svc_valid_sku(s) && (n < 1 || n > 64 || strpbrk(s, "{}: /"))) __builtin_trap();
    (void)svc_valid_user_id(s);
    rconn_addr a;
    char err[200], desc[400];
    if (rconn_parse(s, &a, err, sizeof err) == 0) {
        rconn_describe(&a, desc, sizeof desc);
        if (!a.path[0] && (a.port < 1 || a.port > 65535 || !a.host[0])) __builtin_trap();
    }
    free(s);
    return 0;
}
