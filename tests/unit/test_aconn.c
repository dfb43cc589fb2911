/* test_aconn.c: the non-blocking Redis connection (common/aconn.h) on a
 * loop, against the runner's redis-server (FLASHSALE_TEST_REDIS) and, for
 * the fault cases, a private one of its own (tests/unit/tloop.h):
 * - connecting: not ready at once, the state callback says up once, the
 *   server's run_id, SELECT of the URL's database, a setup error (AUTH
 *   against a server without a password) failing cleanly;
 * - pipelining: 1000 commands sent in one iteration, replies in order,
 *   aconn_inflight, a 4 MB value out and back (partial writes);
 * - scripts: preloaded at connect, EVALSHA after SCRIPT FLUSH (NOSCRIPT:
 *   loaded again and resent), an EVALSHA of a script it does not know;
 * - faults: a server killed with commands in flight, a stalled server
 *   (SIGSTOP: the timeout, then a stalled setup), a closed port, a connect
 *   that never completes, each failing every callback exactly once with
 *   NULL and the state callback down; the retry delays; reconnecting once
 *   the server is back (a new run_id);
 * - aconn_free with commands in flight: each callback once, with NULL;
 *   freed on its running loop, the loop and another connection go on. */
#include <hiredis/hiredis.h>

#include "common/aconn.h"
#include "common/rconn.h"
#include "tests/unit/t.h"
#include "tests/unit/traw.h"
#include "tests/unit/tloop.h"

static const char *url;
static tloop TL;

/* ------------------------------------------------------------ recording */

/* What the callbacks record, on the loop's thread. The counters (ngot,
 * nnull, ups, downs) are touched only there while the loop runs: the
 * checks read the copy in O that calls made there take (snap), since a
 * callback may come at any time (a stalled server killed, a timeout). A
 * reply's record G[i] is read here once a wait (or settle) has seen it
 * come: that call on the loop orders its writes before the reads. */
#define NG 1200
typedef struct got {
    int calls, type, pos;
    long long integer;
    size_t len;
    char str[64];
} got;
static got G[NG];
static int ngot, nnull, ups, downs;
static aconn *C;

static void on_reply(void *ud, redisReply *r) {
    got *g = ud;
    g->calls++;
    g->pos = ngot++;
    if (!r) {
        nnull++;
        g->type = -1;
        return;
    }
    g->type = r->type;
    g->integer = r->type == REDIS_REPLY_ARRAY ? (long long)r->elements : r->integer;
    g->len = r->len;
    if (r->str) snprintf(g->str, sizeof g->str, "%s", r->str);
}

static void on_state(aconn *c, int up, void *ud) {
    (void)c;
    (void)ud;
    if (up) ups++;
    else downs++;
}

static void do_reset(void *ud) {
    (void)ud;
    memset(G, 0, sizeof G);
    ngot = nnull = ups = downs = 0;
}
/* Clears the records: on the loop's thread when it runs. */
static void reset(void) {
    if (TL.running) tl_call(&TL, do_reset, NULL);
    else do_reset(NULL);
}

/* Sends the space-separated words of text; g gets the reply. */
static rconn_cmd cmd;
static int send_words(const char *text, got *g) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    rconn_cmd_reset(&cmd);
    for (char *save, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
        rconn_cmd_adds(&cmd, w);
    return aconn_send(C, &cmd, on_reply, g);
}

static struct {
    rconn_addr a;
    int timeout_ms;
    const rconn_script *const *scripts;
    int nscripts;
    int rc, ready, inflight;
    int ngot, nnull, ups, downs;     /* the counters, as snap copied them */
    char errstr[256], run_id[41];
} O;                                 /* arguments in, results out, of calls on the loop */

/* Copies the counters into O; on the loop's thread. */
static void snap(void) { O.ngot = ngot, O.nnull = nnull, O.ups = ups, O.downs = downs; }

/* Each a tl_fn (run on the loop) or a tl_wait predicate. A predicate
 * snaps the counters as they were when it found its condition true. */
static int is_up(void *ud) { return snap(), ups >= *(int *)ud; }
static int is_down(void *ud) { return snap(), downs >= *(int *)ud; }
static int have(void *ud) { return snap(), ngot >= *(int *)ud; }
static int wait_up(int n) { return tl_wait(&TL, is_up, &n, 3000); }
static int wait_down(int n) { return tl_wait(&TL, is_down, &n, 3000); }
static int wait_got(int n) { return tl_wait(&TL, have, &n, 3000); }

static void do_new(void *ud) {
    (void)ud;
    C = aconn_new(TL.l, &O.a, O.timeout_ms, O.scripts, O.nscripts, on_state, NULL);
}
static void do_connect(void *ud) {
    (void)ud;
    O.rc = aconn_connect(C);
    O.ready = aconn_ready(C);
    snap();
}
static void do_look(void *ud) {
    (void)ud;
    O.ready = aconn_ready(C);
    O.inflight = aconn_inflight(C);
    snprintf(O.errstr, sizeof O.errstr, "%s", aconn_errstr(C));
    snprintf(O.run_id, sizeof O.run_id, "%s", aconn_run_id(C));
    snap();
}
static void look(void) { tl_call(&TL, do_look, NULL); }
/* Lets the loop run ms, then looks: what it did until then (a callback
 * coming twice, or at all) is seen from here, in G and O. */
static void settle(int ms) {
    clock_sleep_ms(ms);
    look();
}
static int connect_now(void) {
    tl_call(&TL, do_connect, NULL);
    return O.rc;
}
static void do_send(void *ud) { O.rc = send_words(ud, &G[0]), snap(); }
/* Sends text on the loop; its reply goes to G[0]. Returns aconn_send's. */
static int send1(const char *text) {
    tl_call(&TL, do_send, (void *)text);
    return O.rc;
}

/* A loop running a new connection to u; 0 when it became ready. */
static int start(const char *u, int timeout_ms, const rconn_script *const *s, int ns, int wait) {
    char err[128];
    reset();
    CHECK(rconn_parse(u, &O.a, err, sizeof err) == 0);
    O.timeout_ms = timeout_ms, O.scripts = s, O.nscripts = ns;
    if (tl_start(&TL) != 0) return -1;
    tl_call(&TL, do_new, NULL);
    CHECK(C != NULL);
    if (!C) return -1;
    CHECK(connect_now() == 0 || !wait);
    CHECK(!O.ready);                                 /* non-blocking: not yet */
    return wait && !wait_up(1) ? -1 : 0;
}
/* Stops the loop, then frees the connection (as the service does). */
static void finish(void) {
    tl_stop(&TL);
    aconn_free(C);
    C = NULL;
    tl_end(&TL);
}

/* ------------------------------------------------------------ the cases */

static void send_pushes(void *ud) {
    (void)ud;
    char t[64];
    send_words("DEL ua:list", &G[0]);
    for (int i = 0; i < 1000; i++) {
        snprintf(t, sizeof t, "RPUSH ua:list %d", i);
        send_words(t, &G[1 + i]);
    }
    O.inflight = aconn_inflight(C);                  /* all in flight: written at the flush */
}

static char *big;
static void send_big(void *ud) {
    (void)ud;
    rconn_cmd_reset(&cmd);
    rconn_cmd_adds(&cmd, "SET");
    rconn_cmd_adds(&cmd, "ua:big");
    rconn_cmd_add(&cmd, big, 4 << 20);
    O.rc = aconn_send(C, &cmd, on_reply, &G[0]);
    O.rc |= send_words("GET ua:big", &G[1]);
    O.rc |= send_words("STRLEN ua:big", &G[2]);
}

static void test_connect_and_pipeline(void) {
    if (start(url, 2000, NULL, 0, 1) != 0) {
        CHECK(!"connected");
        finish();
        return;
    }
    char rid[41];
    CHECK(rconn_run_id(traw_conn, rid) == 0);
    look();
    CHECK(O.ready && O.inflight == 0);
    CHECK_STR(O.run_id, rid);
    CHECK(connect_now() == 0 && O.ups == 1);         /* ready: nothing new */
    tl_call(&TL, send_pushes, NULL);
    CHECK(O.inflight == 1001);
    CHECK(wait_got(1001));
    int in_order = 1;
    for (int i = 0; i < 1000; i++)
        in_order &= G[1 + i].calls == 1 && G[1 + i].type == REDIS_REPLY_INTEGER &&
                    G[1 + i].integer == i + 1 && G[1 + i].pos == i + 1;
    CHECK(in_order);
    CHECK(O.nnull == 0);
    look();
    CHECK(O.inflight == 0);
    CHECK(traw_int("LLEN %s", "ua:list") == 1000);
    redisReply *r = redisCommand(traw_conn, "LINDEX ua:list 999");
    CHECK(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "999"));
    if (r) freeReplyObject(r);
    /* 4 MB out and back: more than one write and one read. */
    reset();
    big = malloc(4 << 20);
    for (int i = 0; i < 4 << 20; i++) big[i] = (char)('a' + i % 26);
    tl_call(&TL, send_big, NULL);
    CHECK(O.rc == 0);
    CHECK(wait_got(3));
    CHECK(G[0].type == REDIS_REPLY_STATUS && !strcmp(G[0].str, "OK"));
    CHECK(G[1].type == REDIS_REPLY_STRING && G[1].len == 4u << 20 && !strncmp(G[1].str, "abcdef", 6));
    CHECK(G[2].type == REDIS_REPLY_INTEGER && G[2].integer == 4 << 20);
    free(big);
    finish();
    traw_int("DEL %s", "ua:big");
}

static void test_select_and_setup_error(void) {
    char u[128];
    rconn_addr a;
    char err[128];
    CHECK(rconn_parse(url, &a, err, sizeof err) == 0);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/7", a.port);
    if (start(u, 2000, NULL, 0, 1) == 0) {
        CHECK(send1("SET ua:db7 seven") == 0);
        CHECK(wait_got(1) && G[0].type == REDIS_REPLY_STATUS);
        redisReply *r = redisCommand(traw_conn, "SELECT 7");
        if (r) freeReplyObject(r);
        r = redisCommand(traw_conn, "GET ua:db7");
        CHECK(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "seven"));
        if (r) freeReplyObject(r);
        r = redisCommand(traw_conn, "SELECT 0");
        if (r) freeReplyObject(r);
        CHECK(traw_int("EXISTS %s", "ua:db7") == 0);
    }
    finish();
    /* AUTH refused by the server: the setup fails, down, never up. */
    snprintf(u, sizeof u, "redis://:wrong@127.0.0.1:%d/0", a.port);
    start(u, 2000, NULL, 0, 0);
    CHECK(wait_down(1));
    look();
    CHECK(O.ups == 0 && O.downs == 1 && !O.ready);
    CHECK(strstr(O.errstr, "redis setup") != NULL);
    CHECK(connect_now() == -1);                      /* too soon after a failure */
    CHECK(send1("PING") == -1);
    settle(20);
    CHECK(O.ngot == 0);
    finish();
}

static rconn_script s_incr, s_echo, s_unknown;
static const rconn_script *scripts[2] = { &s_incr, &s_echo };

static void evalsha(const rconn_script *s, const char *key, const char *arg, got *g) {
    rconn_cmd_evalsha(&cmd, s, key ? 1 : 0);
    if (key) rconn_cmd_adds(&cmd, key);
    rconn_cmd_adds(&cmd, arg);
    aconn_send(C, &cmd, on_reply, g);
}
static void send_mixed(void *ud) {
    (void)ud;
    evalsha(&s_incr, "ua:sk", "10", &G[0]);
    send_words("GET ua:sk", &G[1]);
    evalsha(&s_echo, NULL, "hello", &G[2]);
    evalsha(&s_incr, "ua:sk", "100", &G[3]);
    send_words("PING", &G[4]);
}
static void send_incr5(void *ud) { (void)ud, evalsha(&s_incr, "ua:sk", "5", &G[0]); }
static void send_unknown(void *ud) { (void)ud, evalsha(&s_unknown, NULL, "x", &G[0]); }

static void test_scripts_noscript(void) {
    rconn_script_init(&s_incr, "incr", "return redis.call('INCRBY', KEYS[1], ARGV[1])");
    rconn_script_init(&s_echo, "echo", "return ARGV[1]");
    rconn_script_init(&s_unknown, "unknown", "return 'never loaded ' .. ARGV[1]");
    traw_int("SCRIPT FLUSH%s", "");
    traw_int("DEL %s", "ua:sk");
    if (start(url, 2000, scripts, 2, 1) != 0) {
        finish();
        return;
    }
    redisReply *r = redisCommand(traw_conn, "SCRIPT EXISTS %s %s", s_incr.sha, s_echo.sha);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->integer == 1 &&
          r->element[1]->integer == 1);            /* loaded by the setup */
    if (r) freeReplyObject(r);
    tl_call(&TL, send_incr5, NULL);
    CHECK(wait_got(1) && G[0].type == REDIS_REPLY_INTEGER && G[0].integer == 5);
    /* The server forgets its scripts: each EVALSHA answered NOSCRIPT is
     * loaded again and resent; its caller sees only the real answer. (Not
     * in the order sent, though: the GET and PING behind them ran, and are
     * answered, before the resent scripts - the GET sees "5".) */
    traw_int("SCRIPT FLUSH%s", "");
    reset();
    tl_call(&TL, send_mixed, NULL);
    CHECK(wait_got(5));
    settle(20);
    for (int i = 0; i < 5; i++) CHECK(G[i].calls == 1);
    CHECK(G[0].type == REDIS_REPLY_INTEGER && G[0].integer == 15);
    CHECK(G[3].type == REDIS_REPLY_INTEGER && G[3].integer == 115);
    CHECK(G[2].type == REDIS_REPLY_STRING && !strcmp(G[2].str, "hello"));
    CHECK(G[4].type == REDIS_REPLY_STATUS && !strcmp(G[4].str, "PONG"));
    CHECK(G[1].type == REDIS_REPLY_STRING);          /* "15" in send order; "5" if resent later */
    CHECK(traw_int("GET %s", "ua:sk") == 115);
    CHECK(O.nnull == 0);
    look();
    CHECK(O.ready && O.inflight == 0);
    /* A script it was never given: NOSCRIPT again after the reload; the
     * caller gets that error once, not an endless resend. */
    reset();
    tl_call(&TL, send_unknown, NULL);
    CHECK(wait_got(1));
    settle(20);
    CHECK(G[0].calls == 1 && G[0].type == REDIS_REPLY_ERROR && !strncmp(G[0].str, "NOSCRIPT", 8));
    look();
    CHECK(O.ready && O.inflight == 0);
    finish();
}

static void send_pings(void *ud) {
    for (int i = 0; i < *(int *)ud; i++) send_words("PING", &G[i]);
}
static int all_once(int n) {
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= G[i].calls == 1 && G[i].type == -1 && G[i].pos == i;
    return ok;
}

static void test_server_killed_and_back(void) {
    tredis R = { 0 };
    CHECK(tr_start(&R) == 0);
    if (!R.pid || start(R.url, 1000, NULL, 0, 1) != 0) {
        finish();
        tr_cleanup(&R);
        return;
    }
    look();
    char rid1[41];
    snprintf(rid1, sizeof rid1, "%s", O.run_id);
    /* Commands in flight (the server stalled), then it dies. */
    tr_pause(&R, 1);
    int n = 20;
    tl_call(&TL, send_pings, &n);
    clock_sleep_ms(20);
    look();
    CHECK(O.inflight == 20 && O.ngot == 0);
    tr_kill(&R);
    CHECK(wait_down(1));
    CHECK(wait_got(20));
    settle(10);
    CHECK(O.nnull == 20 && all_once(20));            /* each once, NULL, in order */
    look();
    CHECK(!O.ready && O.inflight == 0 && O.downs == 1 && O.errstr[0]);
    CHECK(send1("PING") == -1);                      /* down: refused, not called */
    CHECK(connect_now() == -1);                      /* 100 ms after a failure */
    clock_sleep_ms(120);
    connect_now();                                   /* nothing listens: refused */
    CHECK(wait_down(2));
    look();
    CHECK(O.ups == 1 && strstr(O.errstr, "connect") != NULL);
    /* Back on the same port: a new process, a new run_id. */
    int port = R.port;
    CHECK(tr_start(&R) == 0 && R.port == port);
    clock_sleep_ms(120);
    CHECK(connect_now() == 0);
    CHECK(wait_up(2));
    look();
    CHECK(O.ready && strlen(O.run_id) == 40 && strcmp(O.run_id, rid1) != 0);
    reset();
    CHECK(send1("PING") == 0 && wait_got(1) && !strcmp(G[0].str, "PONG"));
    finish();
    tr_cleanup(&R);
}

static void test_stalled_server_times_out(void) {
    tredis R = { 0 };
    CHECK(tr_start(&R) == 0);
    if (!R.pid || start(R.url, 100, NULL, 0, 1) != 0) {
        finish();
        tr_cleanup(&R);
        return;
    }
    tr_pause(&R, 1);
    int n = 3;
    int64_t t0 = clock_mono_ms();
    tl_call(&TL, send_pings, &n);
    CHECK(wait_got(3));
    int64_t took = clock_mono_ms() - t0;
    CHECK(took >= 100 && took < 1500);               /* the timeout, checked every 50 ms */
    CHECK(O.nnull == 3 && all_once(3) && O.downs == 1);
    look();
    CHECK(strstr(O.errstr, "no reply within 100 ms") != NULL);
    CHECK(connect_now() == -1);                      /* a stalled server: one timeout more */
    clock_sleep_ms(120);
    /* The kernel still accepts the connection; the setup gets no answer. */
    CHECK(connect_now() == 0);
    CHECK(wait_down(2));
    CHECK(O.ups == 1);
    tr_pause(&R, 0);
    clock_sleep_ms(120);
    CHECK(connect_now() == 0);
    CHECK(wait_up(2));
    reset();
    CHECK(send1("PING") == 0 && wait_got(1) && !strcmp(G[0].str, "PONG"));
    finish();
    tr_cleanup(&R);
}

static void test_connect_fails_cleanly(void) {
    char u[64];
    int port = tr_free_port();
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", port);
    start(u, 500, NULL, 0, 0);                       /* nothing listens there */
    CHECK(wait_down(1));
    look();
    CHECK(O.ups == 0 && !O.ready && strstr(O.errstr, "connect") != NULL);
    CHECK(connect_now() == -1);
    CHECK(send1("PING") == -1);
    finish();
    /* A listener that never accepts, its backlog full: the connect hangs,
     * and times out. */
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), filler = -1;
    port = tr_free_port();
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(ls, (struct sockaddr *)&a, sizeof a) == 0 && listen(ls, 0) == 0);
    filler = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(connect(filler, (struct sockaddr *)&a, sizeof a) == 0);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", port);
    int64_t t0 = clock_mono_ms();
    start(u, 200, NULL, 0, 0);
    CHECK(wait_down(1));
    int64_t took = clock_mono_ms() - t0;
    look();
    CHECK(O.ups == 0 && strstr(O.errstr, "timed out") != NULL);
    CHECK(took >= 200 && took < 1500);
    CHECK(connect_now() == -1);                      /* one timeout more before the next */
    finish();
    close(filler);
    close(ls);
}

static void send_blocked(void *ud) {
    (void)ud;
    send_words("BLPOP ua:never 5", &G[0]);           /* the server answers nothing behind it */
    for (int i = 1; i <= 10; i++) send_words("PING", &G[i]);
}

static void test_free_with_work_in_flight(void) {
    if (start(url, 2000, NULL, 0, 1) != 0) {
        finish();
        return;
    }
    tl_call(&TL, send_blocked, NULL);
    clock_sleep_ms(30);
    look();
    CHECK(O.inflight == 11 && O.ngot == 0);
    tl_stop(&TL);                                    /* joined: the counters are ours */
    aconn_free(C);                                   /* every callback, NULL, in order */
    C = NULL;
    CHECK(ngot == 11 && nnull == 11 && all_once(11));
    CHECK(downs == 0);                               /* no state callback from a free */
    tl_end(&TL);
    aconn_free(NULL);
}

/* Freed on its running loop (aconn.h: on the loop's thread): its hook and
 * timer go with it (loop_forget); another connection there goes on. */
static aconn *C2;
static void free_first(void *ud) {
    (void)ud;
    send_words("BLPOP ua:never 5", &G[0]);           /* in flight when freed */
    aconn_free(C);
    C = C2;                                          /* the second one from here */
    O.rc = send_words("PING", &G[1]);
}
static void new_second(void *ud) {
    (void)ud;
    C2 = aconn_new(TL.l, &O.a, 2000, NULL, 0, on_state, NULL);
    aconn_connect(C2);
}

static void test_free_on_running_loop(void) {
    if (start(url, 2000, NULL, 0, 1) != 0) {
        finish();
        return;
    }
    tl_call(&TL, new_second, NULL);
    CHECK(wait_up(2));
    tl_call(&TL, free_first, NULL);
    CHECK(O.rc == 0 && G[0].calls == 1 && G[0].type == -1);
    CHECK(wait_got(2) && G[1].type == REDIS_REPLY_STATUS && !strcmp(G[1].str, "PONG"));
    clock_sleep_ms(120);                             /* the first one's timer would have run */
    reset();
    CHECK(send1("PING") == 0 && wait_got(1) && !strcmp(G[0].str, "PONG"));
    finish();
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_connect_and_pipeline), T(test_select_and_setup_error), T(test_scripts_noscript),
        T(test_server_killed_and_back), T(test_stalled_server_times_out),
        T(test_connect_fails_cleanly), T(test_free_with_work_in_flight),
        T(test_free_on_running_loop),
    };
    url = traw_open();
    signal(SIGPIPE, SIG_IGN);
    rconn_cmd_init(&cmd);
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    rconn_cmd_free(&cmd);
    traw_close();
    return rc;
}
