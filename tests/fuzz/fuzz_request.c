/* fuzz_request.c: libFuzzer harness for the whole request surface. Each
 * input is one HTTP request (or a raw byte stream) sent over TCP to the
 * real service running in this process (svc_start: the real router,
 * handlers, pipeline and stores) against a real redis-server this harness
 * starts and a real SQLite file. For every input:
 *
 *   - the process lives (a crash or a sanitizer report ends the fuzzer);
 *   - a well-framed request gets one answer, or the connection is closed,
 *     within ANSWER_WAIT_MS (no wedge);
 *   - every answer is HTTP/1.1; a JSON body parses; an error answer is
 *     {"error": <a code the API lists>, "message": <string>}; a 500
 *     (internal_error: an answer that could not be built) is a finding;
 *     a non-JSON answer is libmicrohttpd's own (400, 413, 414, 431, 505:
 *     docs/faults.md, "Hostile requests");
 *
 * and every BOOKS_EVERY inputs (and at exit) `flashsale audit` must find
 * the stock books balanced: SQLite against itself and Redis against SQLite.
 *
 * Input format (text-like, so seeds and found inputs can be read, and
 * tests/test_fuzz_regress.py replays them against bin/flashsale):
 *
 *   RAW\n<bytes>          the bytes as they are, then the write side closed
 *   <METHOD> <TARGET>\n   one request: this request line (HTTP/1.1 added),
 *   <Name: value>\n ...   header lines as given (Host added if missing),
 *   \n<body>              an empty line, then the body.
 *
 * A body without framing headers gets a Content-Length. A given
 * Content-Length longer than the body is met with padding, and under
 * "Transfer-Encoding: chunked" the body is sent as one valid chunk and the
 * last chunk, so the service never waits for bytes that are not coming
 * (broken chunking is RAW's to try). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>

#include "common/clock.h"
#include "loadtest/client/client.h"
#include "service/app.h"
#include "service/log.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "CHECK failed: %s (%s:%d)\n", #c, \
                                          __FILE__, __LINE__); __builtin_trap(); } } while (0)
#define BOOKS_EVERY 25000
/* An answer (or the close) must come within this. The service's request
 * deadline (30 ms here) ends an input that never completes; the margin is for
 * a starved machine: at 3 s, a run under nice 19 next to busy builds
 * reported a garbage request the deadline closed after 1 s as a wedge,
 * and at 10 s one of 8 side-by-side processes (FUZZ_JOBS=8, next to
 * ZooKeeper and etcd tests) reported a pipelined raw stream that answers
 * in 2 ms alone and in 2,400 runs from 8 clients. A wedge never answers,
 * so a longer wait still catches it. */
#define ANSWER_WAIT_MS 30000
#define MAX_PAD 70000

static const char *const CODES[] = {
    "invalid_json", "invalid_field", "missing_field", "bad_request", "unauthorized",
    "not_found", "unknown_sku", "unknown_order", "method_not_allowed", "sold_out",
    "insufficient_stock", "sku_exists", "per_user_limit", "body_too_large",
    "unsupported_media_type", "idempotency_key_reused", "request_in_progress",
    "lock_timeout", "strategy_unavailable", "lock_unavailable", "redis_unavailable",
    "db_unavailable", "shutting_down", NULL,
};

static svc_app A;
static char tmpdir[64], redis_url[64], db_path[128], audit_bin[600];
static pid_t redis_pid;
static int port;
static uint64_t inputs;

/* ------------------------------------------------------------ the servers */

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &l))
        abort();
    close(s);
    return ntohs(a.sin_port);
}

static void stop_redis(void) {
    if (redis_pid > 0) {
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
        redis_pid = 0;
    }
}

/* A private redis-server, killed with this process even if it crashes. */
static void start_redis(void) {
    int rport = free_port();
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", rport);
    snprintf(redis_url, sizeof redis_url, "redis://127.0.0.1:%d/0", rport);
    redis_pid = fork();
    if (redis_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execlp("redis-server", "redis-server", "--port", portstr, "--bind", "127.0.0.1", "--dir",
               tmpdir, "--save", "", "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
    atexit(stop_redis);
    for (int i = 0; i < 200; i++) {              /* wait for it to listen */
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)rport),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        int ok = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
        close(s);
        if (ok) return;
        clock_sleep_ms(25);
    }
    fprintf(stderr, "fuzz_request: redis-server did not start\n");
    abort();
}

/* ----------------------------------------------------------- one exchange */

static int dial(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK(s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0);
    return s;
}

static int send_all(int s, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(s, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;                   /* the service closed early: allowed */
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int is_code(const char *c) {
    for (int i = 0; CODES[i]; i++)
        if (!strcmp(CODES[i], c)) return 1;
    return 0;
}

/* The promises every answer keeps. Returns 0 when the reader lost the
 * framing of a raw stream (raw_head, below), 1 otherwise. */
static int check_answer(const fl_resp *r, int head, int raw_head) {
    CHECK(r->minor == 1);
    CHECK(r->status >= 200 && r->status <= 599);
    CHECK(r->status != 500);                     /* an answer could not be built */
    const char *b = r->body ? r->body : "";
    /* A raw stream is not parsed into requests here, so an answer to a HEAD
     * in it (Content-Length, no body: RFC 9110) reads as if the answers
     * after it were its body. Found by the fuzzer as a false finding. */
    if (raw_head && !head && !strncmp(b, "HTTP/1.", 7)) return 0;
    if (head) return 1;
    /* Every answer but a HEAD's carries a body: a JSON document or error,
     * libmicrohttpd's own page, or the metrics text. */
    CHECK(r->body_total > 0 || r->status == 204);
    if (r->body_total == 0) return 1;
    CHECK(r->body_len == r->body_total);         /* body_max is large enough */
    if (b[0] == '{' || b[0] == '[') {
        json_error_t e;
        json_t *j = json_loadb(b, r->body_len, 0, &e);
        CHECK(j != NULL);
        if (r->status >= 400) {
            const char *code = json_string_value(json_object_get(j, "error"));
            CHECK(code && is_code(code));
            CHECK(json_is_string(json_object_get(j, "message")));
        }
        json_decref(j);
    } else if (!strncmp(b, "<html>", 6)) {        /* libmicrohttpd's own */
        CHECK(r->status == 400 || r->status == 413 || r->status == 414 || r->status == 431 ||
              r->status == 505);
    } else if (!strncmp(b, "HTTP/1.1 4", 10)) {
        /* libmicrohttpd 0.9.75's answer to a Content-Length it cannot
         * read writes its status line and headers twice (docs/faults.md,
         * "Hostile requests"): the second copy reads as the body. */
        CHECK(r->status == 400 || r->status == 413);
    } else {
        CHECK(r->status == 200 && !strncmp(b, "# HELP", 6));    /* /metrics */
    }
    return 1;
}

/* Whether the service answers a fresh GET /healthz within ANSWER_WAIT_MS:
 * its loops are alive. */
static int service_answers(void) {
    static const char probe[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char c;
    int s = dial(), ok = 0;
    if (send_all(s, probe, sizeof probe - 1) == 0) {
        struct pollfd pfd = { s, POLLIN, 0 };
        ok = poll(&pfd, 1, ANSWER_WAIT_MS) == 1 && recv(s, &c, 1, 0) == 1;
    }
    close(s);
    return ok;
}

/* Reads answers until raw is 0 and one final answer is in, or the service
 * closes. Fails (a wedge) if neither happens within ANSWER_WAIT_MS, or,
 * when the service meanwhile answers a fresh request (a starved machine,
 * not a wedge: seen at load average 8-11, never alone), within twice
 * that. A raw
 * stream that holds a HEAD (raw_head) may lose its framing: the rest is
 * then only read until the close. */
static void read_answers(int s, int raw, int head, int raw_head) {
    int lost = 0, waited_again = 0;
    fl_resp r;
    char buf[16384];
    int64_t deadline = clock_mono_ms() + ANSWER_WAIT_MS;
    fl_resp_init(&r, 1 << 20);
    r.no_body = head;
    for (;;) {
        struct pollfd pfd = { s, POLLIN, 0 };
        int left = (int)(deadline - clock_mono_ms());
        if (left <= 0 || poll(&pfd, 1, left) != 1) {            /* wedged? */
            /* What the machine was doing, to tell a wedge from starvation. */
            if (system("cat /proc/loadavg /proc/pressure/cpu /proc/pressure/io >&2")) {}
            CHECK(!waited_again && service_answers());
            fprintf(stderr, "fuzz_request: no answer in %d ms but the service answers: "
                            "waiting once more (starved machine?)\n", ANSWER_WAIT_MS);
            waited_again = 1;
            deadline = clock_mono_ms() + ANSWER_WAIT_MS;
            continue;
        }
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n <= 0) {                                          /* closed */
            if (!lost && fl_resp_started(&r) && fl_resp_eof(&r) == FL_RESP_DONE)
                check_answer(&r, head, raw_head);
            break;
        }
        size_t off = 0;
        while (!lost && off < (size_t)n) {
            size_t used;
            int rc = fl_resp_feed(&r, buf + off, (size_t)n - off, &used);
            CHECK(rc != FL_RESP_ERROR);
            off += used;
            if (rc != FL_RESP_DONE) continue;
            if (r.status != 100) {
                lost = !check_answer(&r, head, raw_head);
                if (!raw) goto out;
            }
            fl_resp_reset(&r);
            r.no_body = head;
        }
    }
out:
    fl_resp_free(&r);
}

/* Finds header name (case-insensitive) among the lines of h[0..n). */
static const char *find_header(const char *h, size_t n, const char *name) {
    size_t nl = strlen(name);
    for (const char *p = h; p < h + n;) {
        const char *eol = memchr(p, '\n', (size_t)(h + n - p));
        size_t ll = eol ? (size_t)(eol - p) : (size_t)(h + n - p);
        if (ll > nl && !strncasecmp(p, name, nl) && p[nl] == ':') return p + nl + 1;
        p += ll + 1;
    }
    return NULL;
}

/* strtoll on v[0..end): blanks, a sign, then digits (0 when none). */
static long long parse_ll(const char *v, const char *end) {
    long long n = 0;
    int neg = 0;
    while (v < end && strchr(" \t\r\v\f", *v) && *v) v++;
    if (v < end && (*v == '+' || *v == '-')) neg = *v++ == '-';
    while (v < end && *v >= '0' && *v <= '9' && n < 1000000000000LL) n = n * 10 + (*v++ - '0');
    return neg ? -n : n;
}

/* Whether a Transfer-Encoding value (the rest of its header line) is
 * "chunked", as libmicrohttpd reads it: whitespace around, any case, and
 * cut at a NUL byte (it stores values as C strings). Read otherwise, the
 * body of "chunked\0..." went out unchunked and every such input waited
 * out the request deadline: a tenth of a run's time went to them. */
static int is_chunked(const char *v, const char *end) {
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    const char *eol = memchr(v, '\n', (size_t)(end - v));
    size_t n = (size_t)((eol ? eol : end) - v);
    const char *nul = memchr(v, '\0', n);
    if (nul) n = (size_t)(nul - v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r')) n--;
    return n == 7 && !strncasecmp(v, "chunked", 7);
}

/* Builds the request of a structured input into out (malloc'd). */
static char *build(const uint8_t *d, size_t n, size_t *len, int *head) {
    const char *in = (const char *)d, *end = in + n;
    const char *eol = memchr(in, '\n', n);
    if (!eol) return NULL;
    const char *hdrs = eol + 1, *blank = hdrs;
    while (blank < end && *blank != '\n') {              /* header lines end at "\n\n" */
        const char *e = memchr(blank, '\n', (size_t)(end - blank));
        blank = e ? e + 1 : end;
    }
    size_t hlen = (size_t)(blank - hdrs);
    const char *body = blank < end ? blank + 1 : end;
    size_t blen = (size_t)(end - body);
    const char *cl = find_header(hdrs, hlen, "content-length");
    const char *te = find_header(hdrs, hlen, "transfer-encoding");
    size_t pad = 0;
    if (cl) {
        long long want = parse_ll(cl, hdrs + hlen);
        if (want > (long long)blen && want - (long long)blen < MAX_PAD) pad = (size_t)want - blen;
    }
    *head = eol - in >= 4 && !memcmp(in, "HEAD", 4);
    int chunked = te && !cl && is_chunked(te, hdrs + hlen);
    size_t cap = (size_t)(eol - in) + hlen * 2 + blen + pad + 128;
    char *out = malloc(cap), *p = out;
    CHECK(out != NULL);
    memcpy(p, in, (size_t)(eol - in));
    p += eol - in;
    p += sprintf(p, " HTTP/1.1\r\n");
    if (!find_header(hdrs, hlen, "host")) p += sprintf(p, "Host: fuzz\r\n");
    for (const char *q = hdrs; q < blank;) {             /* each line, CRLF-ended */
        const char *e = memchr(q, '\n', (size_t)(blank - q));
        size_t ll = e ? (size_t)(e - q) : (size_t)(blank - q);
        memcpy(p, q, ll);
        p += ll;
        *p++ = '\r';
        *p++ = '\n';
        q += ll + 1;
    }
    if (!cl && !te && blen) p += sprintf(p, "Content-Length: %zu\r\n", blen);
    p += sprintf(p, "\r\n");
    if (chunked && blen) p += sprintf(p, "%zx\r\n", blen);
    memcpy(p, body, blen);
    p += blen;
    memset(p, ' ', pad);
    p += pad;
    if (chunked) p += sprintf(p, "%s0\r\n\r\n", blen ? "\r\n" : "");
    *len = (size_t)(p - out);
    return out;
}

/* ------------------------------------------------------------------ books */

static void books_balance(void) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s audit --redis %s --db %s >%s/audit.out 2>&1", audit_bin,
             redis_url, db_path, tmpdir);
    /* Confirms of the last orders run just after their answers: settle. */
    for (int i = 0; i < 40; i++) {
        if (system(cmd) == 0) return;
        clock_sleep_ms(50);
    }
    snprintf(cmd, sizeof cmd, "cat %s/audit.out >&2", tmpdir);
    if (system(cmd) != 0) {}
    fprintf(stderr, "fuzz_request: the stock books do not balance (above)\n");
    __builtin_trap();
}

/* At the end of a run whose books balanced: the service stopped and its
 * files removed (tmpfs is memory). A failed run traps before this and
 * leaves them to be read. */
static void at_exit(void) {
    char cmd[128];
    books_balance();
    svc_stop(&A);
    stop_redis();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) {}
}

static void request(const char *text) {
    size_t len;
    int head, s = dial();
    char *req = build((const uint8_t *)text, strlen(text), &len, &head);
    CHECK(req && send_all(s, req, len) == 0);
    read_answers(s, 0, head, 0);
    close(s);
    free(req);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char err[512];
    const char *bin = getenv("FLASHSALE_BIN");
    (void)argc;
    (void)argv;
    snprintf(audit_bin, sizeof audit_bin, "%s/flashsale", bin ? bin : "bin");
    if (access(audit_bin, X_OK) != 0) {
        fprintf(stderr, "fuzz_request: needs %s (make; or set FLASHSALE_BIN)\n", audit_bin);
        abort();
    }
    /* On tmpfs when there is one: every order's commit waits for its
     * fsync, which on a disk made the harness wait, idle, for most of each
     * input (100 inputs a second). The code path is the same; only the
     * disk is faster, and power loss is not what this harness tests. */
    snprintf(tmpdir, sizeof tmpdir, "%s/fuzz-request-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(tmpdir)) abort();
    snprintf(db_path, sizeof db_path, "%s/orders.db", tmpdir);
    signal(SIGPIPE, SIG_IGN);
    start_redis();
    char *args[] = { "flashsale", "--listen", "127.0.0.1:0", "--redis", redis_url, "--db", db_path,
                     "--threads", "2", "--api-workers", "2", "--lock-workers", "4",
                     "--request-timeout", "1", "--redis-timeout-ms", "1000", NULL };
    if (svc_config_load(&A.cfg, (int)(sizeof args / sizeof args[0]) - 1, args) != 0) abort();
    /* An input that never completes its request (a Content-Length with no
     * body, garbage without an end) waits for this deadline: at 1 s such
     * inputs, which the corpus keeps, made most of the run's time. */
    A.cfg.request_timeout_ms = 30;
    svc_log_set_level(SVC_LOG_QUIET);
    if (svc_start(&A, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_request: %s\n", err);
        abort();
    }
    port = http_port(A.http);
    /* Products of several strategies for the orders to find. */
    request("POST /v1/products\n\n{\"sku\":\"p1\",\"stock\":1000000}");
    request("POST /v1/products\n\n{\"sku\":\"seg\",\"stock\":1000,\"segments\":4}");
    request("POST /v1/products\n\n{\"sku\":\"lim\",\"stock\":1000,\"per_user_limit\":2}");
    request("POST /v1/products\n\n{\"sku\":\"dbp\",\"stock\":1000,\"strategy\":\"db\"}");
    request("POST /v1/products\n\n{\"sku\":\"lk\",\"stock\":1000,\"strategy\":\"lock\"}");
    request("POST /v1/products\n\n{\"sku\":\"dl\",\"stock\":1000,\"strategy\":\"db-lock\"}");
    atexit(at_exit);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int s = dial();
    if (size >= 4 && !memcmp(data, "RAW\n", 4)) {
        send_all(s, (const char *)data + 4, size - 4);
        shutdown(s, SHUT_WR);                   /* nothing more: the service must finish */
        read_answers(s, 1, 0, memmem(data + 4, size - 4, "HEAD", 4) != NULL);
    } else {
        size_t len;
        int head;
        char *req = build(data, size, &len, &head);
        if (req && send_all(s, req, len) == 0) read_answers(s, 0, head, 0);
        free(req);
    }
    close(s);
    if (++inputs % BOOKS_EVERY == 0) books_balance();
    return 0;
}
