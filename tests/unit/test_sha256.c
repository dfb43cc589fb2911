/* test_sha256.c: SHA-256 and HMAC-SHA-256 (common/sha256.h) against the
 * published test vectors: FIPS 180-4's examples ("abc", the 448-bit
 * message, a million 'a's fed in odd pieces) and RFC 4231's HMAC cases 1,
 * 2, 3, 6 and 7 (6 and 7: a key longer than a block, hashed first). */
#include "common/sha256.h"
#include "tests/unit/t.h"

static void hex(const unsigned char *d, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void digest_is(const char *msg, const char *want) {
    unsigned char d[SHA256_LEN];
    char h[2 * SHA256_LEN + 1];
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, msg, strlen(msg));
    sha256_final(&c, d);
    hex(d, sizeof d, h);
    CHECK_STR(h, want);
}

static void test_sha256_vectors(void) {
    digest_is("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    digest_is("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    digest_is("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* Lengths at the padding's edges (55, 56, 63, 64, 65 bytes), each
     * against the same message fed in one piece and byte by byte. */
    static const struct { int n; const char *want; } edge[] = {
        { 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318" },
        { 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a" },
        { 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34" },
        { 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb" },
        { 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0" },
    };
    for (size_t e = 0; e < sizeof edge / sizeof edge[0]; e++) {
        char m[80];
        memset(m, 'a', (size_t)edge[e].n);
        m[edge[e].n] = '\0';
        digest_is(m, edge[e].want);
        unsigned char d1[SHA256_LEN];
        char h1[2 * SHA256_LEN + 1];
        sha256_ctx c1;
        sha256_init(&c1);
        for (int i = 0; i < edge[e].n; i++) sha256_update(&c1, "a", 1);
        sha256_final(&c1, d1);
        hex(d1, sizeof d1, h1);
        CHECK_STR(h1, edge[e].want);
    }
    /* A million 'a's, in pieces of 7 (across block edges). */
    unsigned char d[SHA256_LEN];
    char h[2 * SHA256_LEN + 1];
    sha256_ctx c;
    sha256_init(&c);
    for (int left = 1000000; left > 0; left -= 7) sha256_update(&c, "aaaaaaa", left < 7 ? (size_t)left : 7);
    sha256_final(&c, d);
    hex(d, sizeof d, h);
    CHECK_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void mac_is(const unsigned char *key, size_t keylen, const char *msg, const char *want) {
    unsigned char d[SHA256_LEN];
    char h[2 * SHA256_LEN + 1];
    hmac_sha256(key, keylen, msg, strlen(msg), d);
    hex(d, sizeof d, h);
    CHECK_STR(h, want);
    /* The same under the key made ready once, twice (it is not used up). */
    hmac_sha256_key k;
    hmac_sha256_key_init(&k, key, keylen);
    for (int i = 0; i < 2; i++) {
        memset(d, 0, sizeof d);
        hmac_sha256_keyed(&k, msg, strlen(msg), d);
        hex(d, sizeof d, h);
        CHECK_STR(h, want);
    }
}

static void test_hmac_rfc4231(void) {
    unsigned char k1[20], k3[20], big[131];
    memset(k1, 0x0b, sizeof k1);
    memset(k3, 0xaa, sizeof k3);
    memset(big, 0xaa, sizeof big);
    mac_is(k1, sizeof k1, "Hi There",
           "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    mac_is((const unsigned char *)"Jefe", 4, "what do ya want for nothing?",
           "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    char m3[51];
    memset(m3, 0xdd, 50);
    m3[50] = '\0';
    mac_is(k3, sizeof k3, m3, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    mac_is(big, sizeof big, "Test Using Larger Than Block-Size Key - Hash Key First",
           "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    mac_is(big, sizeof big,
           "This is a test using a larger than block-size key and a larger than block-size "
           "data. The key needs to be hashed before being used by the HMAC algorithm.",
           "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

static void test_equal(void) {
    unsigned char a[4] = { 1, 2, 3, 4 }, b[4] = { 1, 2, 3, 5 };
    CHECK(sha256_equal(a, a, 4));
    CHECK(!sha256_equal(a, b, 4));
    CHECK(sha256_equal(a, b, 3));
}

int main(int argc, char **argv) {
    static const t_case cases[] = { T(test_sha256_vectors), T(test_hmac_rfc4231), T(test_equal) };
    return t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
