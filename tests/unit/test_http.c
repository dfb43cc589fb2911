/* test_http.c: the http module: the raw-path router, the per-client
 * connection count (a table with backward-shift deletion, IPv6 per /64),
 * and, over a live server on an event loop, the fixed 500 answer when
 * an answer cannot be built. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

static struct sockaddr_in6 v6(const char *text) {
    struct sockaddr_in6 s = { .sin6_family = AF_INET6 };
    inet_pton(AF_INET6, text, &s.sin6_addr);
    return s;
}

/* One IPv6 host picks addresses from a whole /64: the cap is per /64. An
 * IPv4-mapped address counts as the IPv4 client it is. */
static void test_clients_ipv6(void) {
    http_clients cl;
    CHECK(http_clients_init(&cl, 2) == 0);
    struct sockaddr_in6 a = v6("2001:db8:1:2::1"), b = v6("2001:db8:1:2:ffff::7"),
                        c = v6("2001:db8:1:2:abcd:1:2:3"), other = v6("2001:db8:1:3::1");
    CHECK(http_clients_take(&cl, (struct sockaddr *)&a));
    CHECK(http_clients_take(&cl, (struct sockaddr *)&b));
    CHECK(!http_clients_take(&cl, (struct sockaddr *)&c));      /* same /64: capped */
    CHECK(http_clients_take(&cl, (struct sockaddr *)&other));   /* the next /64 is not */
    struct sockaddr_in6 m = v6("::ffff:10.1.2.3");
    struct sockaddr_in four = v4(0x0a010203);
    CHECK(http_clients_take(&cl, (struct sockaddr *)&m));
    CHECK(http_clients_take(&cl, (struct sockaddr *)&four));
    CHECK(!http_clients_take(&cl, (struct sockaddr *)&four));   /* mapped + plain: one client */
    http_client_key km, kf;
    http_client_key_of((struct sockaddr *)&m, &km);
    http_client_key_of((struct sockaddr *)&four, &kf);
    CHECK(km.len == 4 && kf.len == 4 && !memcmp(km.addr, kf.addr, 4));
    http_clients_fini(&cl);
}

/* ------------------------------------------------- answers that cannot be built */

static int fail_allocs;            /* jansson's allocations fail while set */

static void *maybe_malloc(size_t n) { return fail_allocs ? NULL : malloc(n); }

/* A handler whose JSON answer cannot be built: no memory for jansson. */
static void oom_answer(http_req *r, const char *const *p, void *ud) {
    (void)p;
    (void)ud;
    fail_allocs = 1;
    http_reply_error(r, 409, "sold_out", "No units left of '%s'.", "x");
    fail_allocs = 0;
}

/* A handler handing over a json_pack that failed (NULL). */
static void null_answer(http_req *r, const char *const *p, void *ud) {
    (void)p;
    (void)ud;
    http_reply_json(r, 200, NULL, NULL);
}

static const http_route LIVE[] = {
    { "GET", "/oom", oom_answer, 0 },
    { "GET", "/null", null_answer, 1 },
};

static void *run_loop(void *l) {
    loop_run(l);
    return NULL;
}

/* GET path on port: the whole answer (one request, then the server's
 * Content-Length decides the end). */
static void get(int port, const char *path, char *out, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = v4(0x7f000001);
    a.sin_port = htons((unsigned short)port);
    size_t n = 0;
    out[0] = '\0';
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        char req[128];
        int len = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
        if (write(fd, req, (size_t)len) == len) {
            struct timeval tv = { 5, 0 };
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t k;
            while (n + 1 < cap && (k = read(fd, out + n, cap - 1 - n)) > 0) {
                n += (size_t)k;
                out[n] = '\0';
                const char *body = strstr(out, "\r\n\r\n"), *cl = strstr(out, "Content-Length: ");
                if (body && cl && strlen(body + 4) >= (size_t)atoi(cl + 16)) break;
            }
        }
    }
    close(fd);
}

/* The fixed 500: a well-formed JSON error that does not claim nothing
 * happened (it may stand in for the answer to an order that committed). */
static void test_answer_that_cannot_be_built(void) {
    char err[256], got[4096];
    loop *l = loop_new(err, sizeof err);
    CHECK(l != NULL);
    if (!l) return;
    http_options o = { .listen = "127.0.0.1:0", .loops = &l, .nloops = 1, .max_connections = 16,
                       .idle_timeout_s = 5, .request_timeout_ms = 5000, .max_body = 1024,
                       .routes = LIVE, .nroutes = 2 };
    http_server *s = http_start(&o, err, sizeof err);
    CHECK(s != NULL);
    if (!s) return;
    json_set_alloc_funcs(maybe_malloc, free);
    pthread_t t;
    pthread_create(&t, NULL, run_loop, l);
    const char *paths[] = { "/oom", "/null" };
    for (int i = 0; i < 2; i++) {
        get(http_port(s), paths[i], got, sizeof got);
        CHECK(strncmp(got, "HTTP/1.1 500 ", 13) == 0);
        CHECK(strstr(got, "Content-Type: application/json") != NULL);
        CHECK(strstr(got, "{\"error\":\"internal_error\",\"message\":\"") != NULL);
        CHECK(strstr(got, "not known") != NULL);
        CHECK(strstr(got, "nothing was changed") == NULL);
    }
    loop_stop(l);
    pthread_join(t, NULL);
    json_set_alloc_funcs(malloc, free);
    http_stop(s);
    loop_free(l);
}

TEST_MAIN(T(test_routes), T(test_clients), T(test_clients_ipv6),
          T(test_answer_that_cannot_be_built))
