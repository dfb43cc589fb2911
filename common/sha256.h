/* sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for signing
 * what the service hands a client and must know again from any instance
 * (a waiting room's tickets). Small and self-contained: the libraries the
 * service links have no digest of their own to lend. Not for passwords
 * and not constant-time in its inputs' lengths; sha256_equal compares two
 * digests in time independent of where they differ. */
#ifndef FLASHSALE_SHA256_H
#define FLASHSALE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

typedef struct sha256_ctx {
    uint32_t h[8];
    uint64_t len;                 /* bytes so far */
    unsigned char buf[64];
    size_t nbuf;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, unsigned char out[SHA256_LEN]);

/* HMAC-SHA-256 of msg under key. */
void hmac_sha256(const void *key, size_t keylen, const void *msg, size_t msglen,
                 unsigned char out[SHA256_LEN]);

/* A key made ready once (its padded blocks hashed): each HMAC under it
 * then costs the message's blocks and two more, not four more. */
typedef struct hmac_sha256_key {
    sha256_ctx inner, outer;
} hmac_sha256_key;

void hmac_sha256_key_init(hmac_sha256_key *k, const void *key, size_t keylen);
void hmac_sha256_keyed(const hmac_sha256_key *k, const void *msg, size_t msglen,
                       unsigned char out[SHA256_LEN]);

/* 1 when the first n bytes of a and b are equal; the time taken does not
 * depend on where they differ. */
int sha256_equal(const unsigned char *a, const unsigned char *b, size_t n);

#endif
