/* orderid.c: an order's identity: its id, and its request's fingerprint.
 *
 * Order ids are ULIDs: 48 bits of Unix milliseconds, then 80
 * random bits, in 26 characters of Crockford base32. They sort by time, so
 * "oldest first" paging is an index scan on the id; within one process they
 * strictly increase (same millisecond: the random part is incremented), and
 * across processes 80 random bits make a clash practically impossible.
 * The fingerprint of a request (SKU, user, quantity) tells a replay of an
 * Idempotency-Key from the key's reuse for a different request. */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "service/order/order.h"

static const char B32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t last_ms = -1;
static unsigned char last_rand[10];

/* Adds one to the 80-bit big-endian number r; returns 1 on overflow. */
static int increment(unsigned char r[10]) {
    for (int i = 9; i >= 0; i--)
        if (++r[i] != 0) return 0;
    return 1;
}

static void fill_random(unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got > 0) {
            p += got;
            n -= (size_t)got;
        }
    }
}

void svc_order_id_new(char out[27], int64_t *wall_ms) {
    unsigned char bytes[16];
    pthread_mutex_lock(&mu);
    int64_t ms = clock_wall_ms();
    if (ms <= last_ms) {
        /* Same millisecond, or the wall clock stepped back: keep ids
         * increasing by staying on the last time and counting up. */
        ms = last_ms;
        if (increment(last_rand)) {
            ms = ++last_ms;
            fill_random(last_rand, sizeof last_rand);
        }
    } else {
        last_ms = ms;
        fill_random(last_rand, sizeof last_rand);
    }
    for (int i = 0; i < 6; i++) bytes[i] = (unsigned char)(ms >> (40 - 8 * i));
    memcpy(bytes + 6, last_rand, 10);
    pthread_mutex_unlock(&mu);
    if (wall_ms) *wall_ms = ms;

    /* 128 bits as 26 base32 digits: the first digit carries 3 bits. */
    int bit = -2;   /* 26 * 5 = 130 bits: two leading zero bits */
    for (int i = 0; i < 26; i++, bit += 5) {
        unsigned v = 0;
        for (int k = 0; k < 5; k++) {
            int b = bit + k;
            v <<= 1;
            if (b >= 0) v |= (bytes[b / 8] >> (7 - b % 8)) & 1;
        }
        out[i] = B32[v];
    }
    out[26] = '\0';
}

int svc_order_id_valid(const char *s) {
    size_t n = strlen(s);
    if (n != 26 || s[0] > '7') return 0;
    for (size_t i = 0; i < n; i++)
        if (!memchr(B32, s[i], 32)) return 0;
    return 1;
}

void svc_order_fingerprint(const char *sku, const char *user_id, int quantity, char out[17]) {
    /* FNV-1a over the fields, NUL-separated so "ab"+"c" != "a"+"bc". */
    uint64_t h = 1469598103934665603ULL;
    char qty[16];
    const char *parts[] = { sku, user_id, qty };
    snprintf(qty, sizeof qty, "%d", quantity);
    for (int i = 0; i < 3; i++) {
        for (const unsigned char *p = (const unsigned char *)parts[i]; ; p++) {
            h = (h ^ *p) * 1099511628211ULL;
            if (!*p) break;
        }
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}
