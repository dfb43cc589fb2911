/* test_http.c: the http module's pure parts: the raw-path router and the
 * per-client connection count (a table with backward-shift deletion). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "http/internal.h"
#include "tests/unit/t.h"

static void h(http_req *r, const char *const *p, void *ud) { (void)r; (void)p; (void)ud; }

static const http_route ROUTES[] = {
    { "POST", "/v1/products", h, 0 },
    { "GET", "/v1/products/{}", h, 1 },
    { "POST", "/v1/products/{}/restock", h, 2 },
    { "GET", "/v1/orders", h, 3 },
};

static http_match find(const char *method, const char *path, size_t *i, char *p0, char *allow) {
    char params[HTTP_MAX_PARAMS][HTTP_PARAM_MAX + 1];
    http_match m = http_route_find(ROUTES, 4, method, path, i, params, allow, 64);
    if (m == HTTP_MATCH_OK) strcpy(p0, params[0]);
    return m;
}

static void test_routes(void) {
    size_t i;
    char p0[HTTP_PARAM_MAX + 1], allow[64];
    CHECK(find("GET", "/v1/products/a%2Fb", &i, p0, allow) == HTTP_MATCH_OK && i == 1);
    CHECK_STR(p0, "a/b");                          /* decoded after splitting */
    CHECK(find("GET", "/v1/products%2Fa", &i, p0, allow) == HTTP_MATCH_NONE);
    CHECK(find("HEAD", "/v1/products/x", &i, p0, allow) == HTTP_MATCH_OK && i == 1);
    CHECK(find("POST", "/v1/products/x/restock", &i, p0, allow) == HTTP_MATCH_OK && i == 2);
    CHECK(find("DELETE", "/v1/products/x", &i, p0, allow) == HTTP_MATCH_METHOD);
    CHECK_STR(allow, "GET, HEAD");
    CHECK(find("GET", "/v1/products", &i, p0, allow) == HTTP_MATCH_METHOD);
    CHECK_STR(allow, "POST");
    CHECK(find("GET", "/v1/products/%00", &i, p0, allow) == HTTP_MATCH_BAD_PATH);
    CHECK(find("GET", "/v1/products/%G1", &i, p0, allow) == HTTP_MATCH_BAD_PATH);
    CHECK(find("GET", "/v1/products/%4", &i, p0, allow) == HTTP_MATCH_BAD_PATH);
    CHECK(find("GET", "*", &i, p0, allow) == HTTP_MATCH_BAD_PATH);
    CHECK(find("GET", "/v1//products", &i, p0, allow) == HTTP_MATCH_NONE);
    CHECK(find("GET", "/v1/products/", &i, p0, allow) == HTTP_MATCH_NONE);
    char longp[3000] = "/v1/products/";
    for (int k = 0; k < 900; k++) strcat(longp, "%41");
    CHECK(find("GET", longp, &i, p0, allow) == HTTP_MATCH_OK && strlen(p0) == HTTP_PARAM_MAX);
}

static struct sockaddr_in v4(unsigned a) {
    struct sockaddr_in s = { .sin_family = AF_INET };
    s.sin_addr.s_addr = htonl(a);
    return s;
}

static void test_clients(void) {
    http_clients cl;
    CHECK(http_clients_init(&cl, 3) == 0);
    struct sockaddr_in a = v4(0x7f000001);
    http_client_key ka;
    http_client_key_of((struct sockaddr *)&a, &ka);
    for (int k = 0; k < 3; k++) CHECK(http_clients_take(&cl, (struct sockaddr *)&a));
    CHECK(!http_clients_take(&cl, (struct sockaddr *)&a));     /* the cap */
    http_clients_give(&cl, &ka);
    CHECK(http_clients_take(&cl, (struct sockaddr *)&a));
    /* Many addresses: growth, and deletion that keeps every probe run whole. */
    for (unsigned x = 1; x <= 5000; x++) {
        struct sockaddr_in b = v4(0x0a000000 + x);
        CHECK(http_clients_take(&cl, (struct sockaddr *)&b));
        CHECK(http_clients_take(&cl, (struct sockaddr *)&b));
    }
    for (unsigned x = 1; x <= 5000; x += 2) {                   /* every other one leaves */
        struct sockaddr_in b = v4(0x0a000000 + x);
        http_client_key kb;
        http_client_key_of((struct sockaddr *)&b, &kb);
        http_clients_give(&cl, &kb);
        http_clients_give(&cl, &kb);
    }
    int wrong = 0;
    for (unsigned x = 1; x <= 5000; x++) {
        struct sockaddr_in b = v4(0x0a000000 + x);
        /* Those still holding two take one more (3) then are capped; those
         * that left start again from none. */
        int got = 0;
        while (got < 5 && http_clients_take(&cl, (struct sockaddr *)&b)) got++;
        wrong += got != (x % 2 ? 3 : 1);
    }
    CHECK(wrong == 0);
    CHECK(cl.used == 5001);
    http_clients_fini(&cl);
    /* No cap: nothing counted, nothing refused. */
    CHECK(http_clients_init(&cl, 0) == 0);
    for (int k = 0; k < 100; k++) CHECK(http_clients_take(&cl, (struct sockaddr *)&a));
    CHECK(cl.used == 0);
    http_clients_fini(&cl);
}

TEST_MAIN(T(test_routes), T(test_clients))
