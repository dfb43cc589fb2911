/* validate.c: checks of request bodies and identifiers, as the API states
 * them. Each failure names the field, so a client knows what to fix.
 * Unknown fields are refused too: a misspelt "segmnets" must not silently
 * create a product with one segment. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/utctime.h"
#include "common/utf8.h"
#include "service/api/validate.h"
#include "db/db.h"

static int fail(svc_verr *e, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(svc_verr *e, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    e->status = status;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int svc_valid_sku(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return n >= 1 && n <= DB_SKU_MAX;
}

/* Counts the characters of s, refusing invalid UTF-8 and control
 * characters: C0, DEL and C1 (U+0080..U+009F, two bytes C2 80..C2 9F),
 * which terminals and log viewers act on. Returns -1 on either. */
static long utf8_chars(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t left = strlen(s);
    long n = 0;
    while (left) {
        size_t l = utf8_char_len(p, left);
        if (l == 0 || *p < 0x20 || *p == 0x7f || (p[0] == 0xC2 && p[1] < 0xA0)) return -1;
        p += l;
        left -= l;
        n++;
    }
    return n;
}

int svc_valid_user_id(const char *s) {
    long n = utf8_chars(s);
    return n >= 1 && n <= DB_USER_MAX;
}

int svc_valid_idem_key(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x21 || (unsigned char)s[n] > 0x7e) return 0;
    return n >= 1 && n <= DB_KEY_MAX;
}

/* Refuses fields not in the allowed list. */
static int known_fields(json_t *body, const char *const *allowed, svc_verr *e) {
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) {
        int ok = 0;
        for (size_t i = 0; allowed[i]; i++) ok |= !strcmp(k, allowed[i]);
        if (!ok) {
            char clip[80];
            return fail(e, 400, "invalid_field", "Unknown field '%s'.",
                        utf8_clip(clip, sizeof clip, k));
        }
    }
    return 0;
}

/* Reads an integer field in lo..hi. Returns 1 if present, 0 if absent, -1
 * on error. */
static int int_field(json_t *body, const char *name, long long lo, long long hi, long long *out,
                     svc_verr *e) {
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v))
        return fail(e, 400, "invalid_field", "'%s' must be an integer.", name);
    long long n = json_integer_value(v);
    if (n < lo || n > hi)
        return fail(e, 400, "invalid_field", "'%s' must be between %lld and %lld, not %lld.", name,
                    lo, hi, n);
    *out = n;
    return 1;
}

/* Reads a string field; returns 1 if present, 0 if absent, -1 on error. */
static int str_field(json_t *body, const char *name, const char **out, svc_verr *e) {
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return fail(e, 400, "invalid_field", "'%s' must be a string.", name);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(e, 400, "invalid_field", "'%s' must not contain NUL characters.", name);
    *out = json_string_value(v);
    return 1;
}

static int sku_field(json_t *body, const char **out, svc_verr *e) {
    int rc = str_field(body, "sku", out, e);
    if (rc < 0) return -1;
    if (rc == 0) return fail(e, 400, "missing_field", "'sku' is required.");
    if (!svc_valid_sku(*out))
        return fail(e, 400, "invalid_field",
                    "'sku' must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'.");
    return 0;
}

int svc_validate_order(json_t *body, svc_order_input *in, svc_verr *e) {
    static const char *const allowed[] = { "sku", "user_id", "quantity", "ticket", NULL };
    long long qty = 0;
    int rc;
    memset(in, 0, sizeof *in);
    if (known_fields(body, allowed, e) || sku_field(body, &in->sku, e)) return -1;
    if ((rc = str_field(body, "user_id", &in->user_id, e)) < 0) return -1;
    if (rc == 0) return fail(e, 400, "missing_field", "'user_id' is required.");
    if (!svc_valid_user_id(in->user_id))
        return fail(e, 400, "invalid_field",
                    "'user_id' must be 1 to 128 characters, without control characters.");
    if ((rc = int_field(body, "quantity", 1, SVC_ORDER_QTY_MAX, &qty, e)) < 0) return -1;
    if (rc == 0) return fail(e, 400, "missing_field", "'quantity' is required.");
    in->quantity = (int)qty;
    if (str_field(body, "ticket", &in->ticket, e) < 0) return -1;
    if (in->ticket && (!in->ticket[0] || strlen(in->ticket) > SVC_ROOM_TICKET_MAX))
        return fail(e, 400, "invalid_field", "'ticket' must be a ticket as POST "
                    "/v1/products/{sku}/tickets hands out (at most %d characters).",
                    SVC_ROOM_TICKET_MAX);
    return 0;
}

int svc_validate_ticket_request(json_t *body, const char **user_id, svc_verr *e) {
    static const char *const allowed[] = { "user_id", NULL };
    int rc;
    if (known_fields(body, allowed, e)) return -1;
    if ((rc = str_field(body, "user_id", user_id, e)) < 0) return -1;
    if (rc == 0) return fail(e, 400, "missing_field", "'user_id' is required.");
    if (!svc_valid_user_id(*user_id))
        return fail(e, 400, "invalid_field",
                    "'user_id' must be 1 to 128 characters, without control characters.");
    return 0;
}

/* ------------------------------------------------- the order body, at speed */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* A JSON string at p without escapes or control characters, copied into
 * dst (cap bytes with its NUL); the end of it, or NULL when it is not one
 * (or does not fit). */
static const char *plain_string(const char *p, const char *end, char *dst, size_t cap) {
    if (p >= end || *p != '"') return NULL;
    const char *s = ++p;
    for (; p < end && *p != '"'; p++)
        if (*p == '\\' || (unsigned char)*p < 0x20) return NULL;
    if (p >= end || (size_t)(p - s) >= cap) return NULL;
    memcpy(dst, s, (size_t)(p - s));
    dst[p - s] = '\0';
    return p + 1;
}

/* Up to four digits (SVC_ORDER_QTY_MAX has four) without a leading zero
 * (what follows is the caller's to check: a '.' or an 'e' is not the ','
 * or '}' it wants). */
static const char *small_int(const char *p, const char *end, long *out) {
    const char *s = p;
    long n = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (p - s == 4 || (p > s && *s == '0')) return NULL;
        n = n * 10 + (*p - '0');
    }
    if (p == s) return NULL;
    *out = n;
    return p;
}

int svc_validate_order_fast(const char *body, size_t len, svc_order_fast *f) {
    const char *p = skip_ws(body, body + len), *end = body + len;
    char key[16];
    unsigned seen = 0;
    long qty = 0;
    if (p >= end || *p++ != '{') return 0;
    for (;;) {
        p = skip_ws(p, end);
        if (!(p = plain_string(p, end, key, sizeof key))) return 0;
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':') return 0;
        p = skip_ws(p, end);
        if (!strcmp(key, "sku") && !(seen & 1)) {
            seen |= 1;
            p = plain_string(p, end, f->sku, sizeof f->sku);
        } else if (!strcmp(key, "user_id") && !(seen & 2)) {
            seen |= 2;
            p = plain_string(p, end, f->user_id, sizeof f->user_id);
        } else if (!strcmp(key, "quantity") && !(seen & 4)) {
            seen |= 4;
            p = small_int(p, end, &qty);
        } else if (!strcmp(key, "ticket") && !(seen & 8)) {
            seen |= 8;
            p = plain_string(p, end, f->ticket, sizeof f->ticket);
            if (p && !f->ticket[0]) return 0;   /* empty: jansson's path words it */
        } else {
            return 0;                /* another field, or one twice: jansson's to word */
        }
        if (!p || (p = skip_ws(p, end)) >= end) return 0;
        if (*p == '}') break;
        if (*p++ != ',') return 0;
    }
    if (skip_ws(p + 1, end) != end || (seen & 7) != 7) return 0;
    if (!svc_valid_sku(f->sku) || !svc_valid_user_id(f->user_id) || qty < 1 ||
        qty > SVC_ORDER_QTY_MAX)
        return 0;
    f->in = (svc_order_input){ .sku = f->sku, .user_id = f->user_id, .quantity = (int)qty,
                               .ticket = seen & 8 ? f->ticket : NULL };
    return 1;
}

/* The room's "opens_at": absent or null (open at once), else a time. */
static int opens_field(json_t *w, long long *out, svc_verr *e) {
    json_t *v = json_object_get(w, "opens_at");
    int64_t ms = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) || utc_time_parse(json_string_value(v), json_string_length(v), &ms))
        return fail(e, 400, "invalid_field", "'opens_at' must be a UTC time as "
                    "YYYY-MM-DDTHH:MM:SS.mmmZ (the milliseconds may be left out).");
    *out = ms;
    return 1;
}

/* "waiting_room": true (the defaults), false or null (none), or an object
 * of "turn_seconds" (1..3600, default 30), "rate" (orders/s, all
 * instances; 0: measured) and "opens_at" (the sale's opening). */
static int room_field(json_t *body, svc_product_input *in, svc_verr *e) {
    static const char *const allowed[] = { "turn_seconds", "rate", "opens_at", NULL };
    json_t *w = json_object_get(body, "waiting_room");
    long long turn = 30;
    if (!w || json_is_null(w) || json_is_false(w)) return 0;
    if (json_is_object(w)) {
        if (known_fields(w, allowed, e) || int_field(w, "turn_seconds", 1, 3600, &turn, e) < 0 ||
            int_field(w, "rate", 0, 10000000, &in->room_rate, e) < 0 ||
            opens_field(w, &in->room_opens_ms, e) < 0) {
            char inner[sizeof e->message];
            snprintf(inner, sizeof inner, "%s", e->message);
            return fail(e, 400, e->code, "'waiting_room': %s", inner);
        }
    } else if (!json_is_true(w)) {
        return fail(e, 400, "invalid_field", "'waiting_room' must be true, false, or an object "
                    "of 'turn_seconds' (1 to 3600), 'rate' (orders a second; 0: measured) and "
                    "'opens_at' (the sale's opening, a UTC time).");
    }
    in->room_turn_ms = turn * 1000;
    return 0;
}

int svc_validate_product(json_t *body, const char *default_strategy, int fault_injection,
                         svc_product_input *in, svc_verr *e) {
    static const char *const allowed[] = { "sku", "name", "stock", "strategy", "segments",
                                           "per_user_limit", "hold_seconds", "cs_delay_ms",
                                           "lock_ttl_ms", "cs_overlap", "waiting_room", NULL };
    long long segments = 1;
    int rc;
    memset(in, 0, sizeof *in);
    if (known_fields(body, allowed, e) || sku_field(body, &in->sku, e)) return -1;
    in->name = in->sku;
    if (str_field(body, "name", &in->name, e) < 0) return -1;
    long n = utf8_chars(in->name);
    if (n < 1 || n > DB_NAME_MAX)
        return fail(e, 400, "invalid_field",
                    "'name' must be 1 to 256 characters, without control characters.");
    if ((rc = int_field(body, "stock", 0, 1000000000, &in->stock, e)) < 0) return -1;
    if (rc == 0) return fail(e, 400, "missing_field", "'stock' is required.");
    in->strategy = default_strategy;
    if (str_field(body, "strategy", &in->strategy, e) < 0) return -1;
    stock_strategy s;
    if (stock_strategy_parse(in->strategy, &s) != 0) {
        char clip[48];
        return fail(e, 400, "invalid_field", "'strategy' '%s' is not one this service offers "
                    "(GET /v1/strategies lists them).", utf8_clip(clip, sizeof clip, in->strategy));
    }
    if (int_field(body, "segments", 1, STOCK_MAX_SEGMENTS, &segments, e) < 0) return -1;
    in->segments = (int)segments;
    if (segments > 1 && !stock_strategy_about(s)->segments_ok)
        return fail(e, 400, "invalid_field",
                    "'segments' > 1 is not offered for '%s': SQLite lets one writer in at a time, "
                    "so splitting the stock row spreads nothing.", in->strategy);
    if (int_field(body, "per_user_limit", 0, 1000000000, &in->per_user_limit, e) < 0) return -1;
    if (int_field(body, "hold_seconds", 0, 86400, &in->hold_seconds, e) < 0) return -1;
    if (in->hold_seconds > 0 && stock_strategy_about(s)->unsafe)
        return fail(e, 400, "invalid_field",
                    "'hold_seconds' > 0 is not offered for '%s': the unsafe strategies exist to "
                    "show overselling, and a hold's units could not come back exactly once.",
                    in->strategy);
    int rc1 = int_field(body, "cs_delay_ms", 0, 60000, &in->cs_delay_ms, e);
    int rc2 = rc1 < 0 ? -1 : int_field(body, "lock_ttl_ms", 10, 600000, &in->lock_ttl_ms, e);
    int rc3 = rc1 < 0 || rc2 < 0 ? -1 : int_field(body, "cs_overlap", 0, 64, &in->cs_overlap, e);
    if (rc1 < 0 || rc2 < 0 || rc3 < 0) return -1;
    if ((rc1 || rc2 || rc3) && !fault_injection)
        return fail(e, 400, "invalid_field",
                    "'%s' needs a service started with --fault-injection.",
                    rc1 ? "cs_delay_ms" : rc2 ? "lock_ttl_ms" : "cs_overlap");
    if (in->cs_overlap == 1 || (in->cs_overlap > 1 && in->cs_delay_ms == 0))
        return fail(e, 400, "invalid_field",
                    "'cs_overlap' is the number of holders to wait for, 2 or more, and needs "
                    "'cs_delay_ms', the longest wait.");
    if (room_field(body, in, e)) return -1;
    stock_kind kind = stock_strategy_about(s)->kind;
    if (in->cs_overlap > 1 && kind != STOCK_KIND_RCW && kind != STOCK_KIND_LOCK &&
        kind != STOCK_KIND_DB_FOR_UPDATE)
        return fail(e, 400, "invalid_field",
                    "'cs_overlap' is for the strategies with a critical section in the service "
                    "(a lock, or none: read, check, write); '%s' has none.", in->strategy);
    return 0;
}

int svc_validate_decision(json_t *body, int confirm, const char **payment_ref,
                          const char **user_id, svc_verr *e) {
    static const char *const for_confirm[] = { "payment_ref", NULL };
    static const char *const for_cancel[] = { "user_id", NULL };
    *payment_ref = *user_id = NULL;
    if (!body) return 0;
    if (known_fields(body, confirm ? for_confirm : for_cancel, e)) return -1;
    if (confirm) {
        if (str_field(body, "payment_ref", payment_ref, e) < 0) return -1;
        long n = *payment_ref ? utf8_chars(*payment_ref) : 1;
        if (n < 1 || n > DB_REF_MAX)
            return fail(e, 400, "invalid_field", "'payment_ref' must be 1 to 128 characters, "
                        "without control characters.");
        return 0;
    }
    if (str_field(body, "user_id", user_id, e) < 0) return -1;
    if (*user_id && !svc_valid_user_id(*user_id))
        return fail(e, 400, "invalid_field", "'user_id' must be 1 to 128 characters of UTF-8, "
                    "without control characters.");
    return 0;
}

int svc_validate_restock(json_t *body, long long *qty, svc_verr *e) {
    static const char *const allowed[] = { "quantity", NULL };
    int rc;
    if (known_fields(body, allowed, e)) return -1;
    if ((rc = int_field(body, "quantity", 1, 1000000000, qty, e)) < 0) return -1;
    if (rc == 0) return fail(e, 400, "missing_field", "'quantity' is required.");
    return 0;
}
