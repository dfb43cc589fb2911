/* loadtest.h: flashload, the load generator and invariant verifier of
 * flashsale, as bin/flashload and the tests use it.
 *
 * A flash sale is only proven correct if someone counts. flashload drives
 * thousands of buyers at the service and then checks, from four vantage
 * points, that no unit was sold twice and none vanished:
 *
 *   fl_resp      incremental HTTP/1.1 response parser: partial reads,
 *                chunked bodies, pipelined responses (httpresp.c)
 *   fl_hist      log-bucket latency histogram, ~3% resolution, mergeable (hist.c)
 *   fl_zipf      zipf sampler in O(1) memory, for choosing buyers (buyers.c)
 *   fl_timerq    a min-heap of the buyers' decisions on their holds, due
 *                later: pay, cancel (timerq.c)
 *   fl_engine    the load: one epoll loop per thread, non-blocking keep-alive
 *                connections, closed loop or open loop at a fixed rate with
 *                latency from each request's scheduled time (engine.c)
 *   fl_http      a blocking HTTP client for the admin calls and the API
 *                vantage point (client.c)
 *   fl_strategy  the strategies, as the service lists them (client.c)
 *   fl_redis,    the verifier's own reads of Redis and SQLite, by the format
 *   fl_sqlite    in docs/storage.md, never through the service's code (stores.c;
 *                a Redis Cluster's redirections: cluster.c)
 *   fl_verify    the invariants: client, API, Redis and SQLite (verify.c),
 *                and those of holds (holds.c); the verdict (verdict.c)
 *   fl_inspect   the stores' invariants of given SKUs, no load (inspect.c)
 *   fl_run       one run: product, load, sampling, progress, verdict (run.c)
 *   fl_compare   the strategy matrix, its table, report.json and the
 *                self-contained report.html (compare.c, report.c; the
 *                processes it runs in: world.c; a scene's figures: scene.c)
 *   fl_proc      private redis-server and flashsale processes, and for the
 *                Redis failures group: Sentinel-watched redis-servers, a
 *                redis-server whose wall clock can jump (bin/libclockjump.so,
 *                clockjump.c), a crash that loses the end of an append-only
 *                file (procs.c)
 *
 * Errors are reported in an fl_err the caller passes in; nothing here keeps
 * global mutable state, so several runs may follow each other in one
 * process (compare does). */
#ifndef FLASHSALE_LOADTEST_H
#define FLASHSALE_LOADTEST_H

#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

/* The API's limits the load generator builds and reads by (its own copies:
 * it shares no code with the service; tests/unit/test_flashload.c checks
 * they agree with the database's). */
#define FL_KEY_MAX 128           /* longest idempotency key (the API's limit) */
#define FL_ORDER_ID_LEN 26       /* an order id: 26 characters (a ULID; the API's) */
typedef char fl_order_id[FL_ORDER_ID_LEN + 1];

/* ------------------------------------------------------------------ errors */

typedef struct fl_err {
    char msg[512];
} fl_err;

/* Writes a message into e (NULL: ignored). Returns -1, for `return fl_errf(..)`. */
int fl_errf(fl_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------- the response parser */

#define FL_RESP_LINE_MAX 8192      /* longest status or header line */

enum { FL_RESP_ERROR = -1, FL_RESP_MORE = 0, FL_RESP_DONE = 1 };

/* One HTTP/1.x response being read. Feed it bytes as they arrive, in any
 * slicing; it says when a whole response is in, and how many of the bytes
 * were its own, so what follows belongs to the next (pipelined) response. */
typedef struct fl_resp {
    /* What was read. */
    int status;                  /* e.g. 201 */
    int minor;                   /* HTTP/1.<minor> */
    int keep_alive;              /* the connection may carry another request */
    int replayed;                /* Idempotent-Replayed: true */
    int retry_after_s;           /* Retry-After in seconds (-1: none, or a date) */
    int chunked;                 /* Transfer-Encoding: chunked */
    long long content_length;    /* -1: none given */
    char *body;                  /* the first body_max bytes, NUL-terminated */
    size_t body_len;             /* bytes kept in body */
    size_t body_total;           /* bytes of body received */
    size_t body_max;             /* keep at most this many body bytes */
    const char *error;           /* why, after FL_RESP_ERROR */
    int no_body;                 /* caller: the request was HEAD (no body follows) */
    /* Parser state. */
    int state;
    long long left;              /* bytes left of the body or of the chunk */
    size_t body_cap;
    size_t line_len;
    size_t head_bytes;           /* status + header bytes so far (bounded) */
    char line[FL_RESP_LINE_MAX];
} fl_resp;

/* Sets r up to read responses keeping up to body_max body bytes each. */
void fl_resp_init(fl_resp *r, size_t body_max);
/* Makes r ready for the next response (keeps the body buffer). */
void fl_resp_reset(fl_resp *r);
void fl_resp_free(fl_resp *r);
/* Feeds len bytes of the stream. *used gets how many were consumed: all of
 * them with FL_RESP_MORE; up to the response's end with FL_RESP_DONE (the
 * rest is the next response's); unspecified with FL_RESP_ERROR (r->error
 * says why). */
int fl_resp_feed(fl_resp *r, const char *buf, size_t len, size_t *used);
/* The peer closed the connection: FL_RESP_DONE when that ends a body
 * delimited by close, else FL_RESP_ERROR (a truncated response). */
int fl_resp_eof(fl_resp *r);
/* Whether any byte of the current response has been fed. */
int fl_resp_started(const fl_resp *r);

/* The time in "key": "YYYY-MM-DDTHH:MM:SS.mmmZ" (the service's RFC 3339
 * UTC timestamps) found as fl_json_str finds it, in Unix milliseconds; -1
 * when absent or not in that form. */
long long fl_json_time_ms(const char *json, size_t len, const char *key);

/* Finds "key": "<string>" in a flat JSON text (the service's compact
 * answers) and copies the string, unescaped of nothing, into out. Returns
 * its length, or -1 when absent or longer than outlen - 1. */
int fl_json_str(const char *json, size_t len, const char *key, char *out, size_t outlen);

/* ---------------------------------------------------------------- histogram */

#define FL_HIST_SUB_BITS 5                         /* 32 sub-buckets: <= 3.2% error */
#define FL_HIST_SUB (1u << FL_HIST_SUB_BITS)
#define FL_HIST_MAX_BITS 40                        /* up to 2^40 us (12 days) */
#define FL_HIST_BUCKETS ((FL_HIST_MAX_BITS - FL_HIST_SUB_BITS + 1) * FL_HIST_SUB)

/* Latencies in microseconds: exact below 32 us, then 32 buckets per power
 * of two. Recording is an index computation and an increment. */
typedef struct fl_hist {
    uint64_t count;
    uint64_t sum;
    uint64_t min, max;           /* exact */
    uint64_t b[FL_HIST_BUCKETS];
} fl_hist;

void fl_hist_reset(fl_hist *h);
void fl_hist_record(fl_hist *h, uint64_t us);
/* Adds src's observations to dst. */
void fl_hist_merge(fl_hist *dst, const fl_hist *src);
/* The value at percentile p (0..100): the upper edge of the bucket holding
 * that rank, never above the exact max. 0 when empty. */
uint64_t fl_hist_percentile(const fl_hist *h, double p);
double fl_hist_mean(const fl_hist *h);
/* Bucket index of a value, and the smallest value of a bucket (for tests). */
unsigned fl_hist_index(uint64_t us);
uint64_t fl_hist_bucket_low(unsigned idx);

/* ------------------------------------------------------------------- buyers */

/* A small fast generator (xoshiro-like quality is not needed: splitmix64). */
typedef struct fl_rng {
    uint64_t s;
} fl_rng;

void fl_rng_seed(fl_rng *r, uint64_t seed);
uint64_t fl_rng_next(fl_rng *r);
/* Uniform in [0, n). */
uint64_t fl_rng_below(fl_rng *r, uint64_t n);
/* Uniform in [0, 1). */
double fl_rng_unit(fl_rng *r);

/* Zipf over 1..n with exponent s > 0 (rejection-inversion, Hörmann and
 * Derflinger): rank k has probability proportional to 1/k^s. */
typedef struct fl_zipf {
    uint64_t n;
    double s;
    double h_x1, h_n, s_param;
} fl_zipf;

void fl_zipf_init(fl_zipf *z, uint64_t n, double s);
/* A rank in 1..n. */
uint64_t fl_zipf_next(const fl_zipf *z, fl_rng *r);

/* What a buyer does with a hold (a reserved order): nothing (abandons it:
 * it expires), pays (the payment system confirms it) or cancels it. */
enum { FL_ABANDON = 0, FL_PAY = 1, FL_CANCEL = 2 };

#define FL_THINK_SHARE 0.8       /* a buyer decides within this share of the hold */

/* FL_PAY with probability pay, FL_CANCEL with probability cancel, else
 * FL_ABANDON (pay + cancel <= 1). */
int fl_decide(fl_rng *r, double pay, double cancel);
/* How long a buyer thinks before paying or cancelling a hold of
 * hold_seconds: uniform in [0, FL_THINK_SHARE * hold_seconds), in us. */
int64_t fl_think_us(fl_rng *r, int hold_seconds);

/* ------------------------------------------------------- decisions due later */

/* A buyer's decision on one hold, to be sent at `at`. */
typedef struct fl_due {
    int64_t at;                  /* monotonic us */
    fl_order_id order_id;
    uint8_t action;              /* FL_PAY, FL_CANCEL */
    uint16_t qty;
    uint32_t user;
} fl_due;

/* A binary min-heap by `at`: push and pop in O(log n), the earliest in O(1).
 * One per load thread, touched only by it. Zeroed: empty. */
typedef struct fl_timerq {
    fl_due *h;
    size_t n, cap;
} fl_timerq;

/* Adds d. Returns 0, or -1 out of memory (d is not added). */
int fl_timerq_push(fl_timerq *q, const fl_due *d);
/* The earliest entry, or NULL when empty. */
const fl_due *fl_timerq_peek(const fl_timerq *q);
/* Removes the earliest entry into *out (q must not be empty). */
void fl_timerq_pop(fl_timerq *q, fl_due *out);
void fl_timerq_free(fl_timerq *q);

/* ------------------------------------------------------------------ targets */

#define FL_MAX_TARGETS 16

/* A service instance: "http://host:port" (a trailing path is ignored). */
typedef struct fl_target {
    char url[300];
    char host[256];
    int port;
    char hostport[300];          /* the Host header */
    struct sockaddr_storage addr;
    socklen_t addrlen;
} fl_target;

/* Parses and resolves url. Returns 0, or -1 with e set. */
int fl_target_parse(const char *url, fl_target *t, fl_err *e);

/* -------------------------------------------------------------- the engine */

#define FL_NO_KEY UINT64_MAX
#define FL_TICKET_MAX 96          /* a waiting room's ticket, as the service writes it */

/* A crowd (crowd.c): instead of connections that each order again and
 * again, `buyers` people who arrive over a ramp, in order (buyer i is user
 * u<i>, the i-th to arrive), each trying until it has a unit or is told
 * sold out. A polite buyer waits as it is told (Retry-After, a ticket's
 * retry_after_ms); an impatient one (a bot) asks again at once. With
 * `room`, each buyer first takes a place in the product's waiting room and
 * orders with its ticket. Each buys one unit. */
typedef struct fl_crowd_opts {
    uint32_t buyers;             /* > 0: the load is this crowd */
    int64_t ramp_us;             /* arrivals spread evenly over it (0: all at once) */
    double impatient;            /* share of the buyers who are bots */
    int room;                    /* take a ticket first */
} fl_crowd_opts;

enum { FL_BUYER_NONE, FL_BUYER_GOT, FL_BUYER_SOLD_OUT, FL_BUYER_REFUSED };

/* One buyer of a crowd, as the run saw it (times from the start, us). */
typedef struct fl_buyer_rec {
    uint32_t idx;                /* arrival rank: 0 came first */
    uint8_t bot;
    uint8_t outcome;             /* FL_BUYER_* (NONE: no final answer by the end) */
    uint16_t requests;
    uint32_t position;           /* its place in the waiting room (0: none) */
    int64_t arrive_us;
    int64_t final_us;            /* its final answer (-1: none) */
} fl_buyer_rec;

/* What the engine sends and how. */
typedef struct fl_load_opts {
    fl_target targets[FL_MAX_TARGETS];
    int ntargets;
    int connections;             /* in total, spread over targets and threads */
    int threads;                 /* event loops, each with its own connections */
    int64_t duration_us;         /* stop issuing after this long (0: no limit) */
    uint64_t requests;           /* stop issuing after this many (0: no limit) */
    double rate;                 /* open loop: requests/s in total; 0: closed loop */
    int64_t timeout_us;          /* an answer later than this is a transport error */
    int64_t goodput_us;          /* a 201 within this counts as goodput (250 ms) */
    int64_t late_us;             /* an answer after this is counted late (1 s) */
    int connect_burst;           /* connects in progress at once per thread */
    /* What a request is. */
    const char *get_path;        /* set: GET this path (a ceiling test), no orders */
    const char *sku;
    uint32_t users;              /* buyers u0 .. u<users-1> */
    double zipf_s;               /* 0: uniform; else zipf exponent */
    int qty_min, qty_max;
    int idem;                    /* send an Idempotency-Key with each order */
    double retry;                /* share of orders that replay an earlier key */
    char key_tag[24];            /* makes this run's keys unique */
    uint64_t seed;
    /* Holds: the product's hold_seconds (0: its orders are confirmed at
     * once); after each 201 a buyer pays (a confirm with `token`) or cancels
     * (as the buyer) after thinking (fl_think_us), or abandons the hold. */
    int hold_seconds;
    double pay, cancel;          /* shares of the 201s; the rest abandon */
    char token[256];             /* admin bearer token for the confirms ("" none) */
    fl_crowd_opts crowd;         /* buyers > 0: a crowd (then users, zipf, qty, idem,
                                    retry, holds and rate are not used) */
} fl_load_opts;

/* Defaults: 64 connections, 2 threads, 10 s timeout, 1000 uniform users,
 * quantity 1, no keys. */
void fl_load_opts_default(fl_load_opts *o);

/* A 201 (or a replay's 200) as the client saw it. */
typedef struct fl_order_rec {
    fl_order_id order_id;
    uint16_t qty;
    uint32_t user;
    uint64_t key;                /* FL_NO_KEY: sent without a key */
} fl_order_rec;

/* A request that went out (at least in part) and got no complete answer:
 * it may or may not have created an order. */
typedef struct fl_lost_rec {
    uint32_t user;
    uint16_t qty;
    uint64_t key;
} fl_lost_rec;

/* A buyer's decision on a hold, and the answer (one per 201 of a product
 * with holds). */
typedef struct fl_decision_rec {
    fl_order_id order_id;
    uint8_t action;              /* FL_ABANDON, FL_PAY, FL_CANCEL */
    uint16_t qty;
    uint32_t user;
    int16_t status;              /* the answer's; 0: sent, no answer; -1: never sent */
    char code[24];               /* a refusal's error code ("" otherwise) */
    long long decided_ms;        /* a 200's confirmed_at / cancelled_at (Unix ms; -1 none) */
    long long expires_ms;        /* a 200's expires_at (-1 none) */
} fl_decision_rec;

typedef struct fl_code_count {
    char code[40];
    uint64_t n;
} fl_code_count;

/* What a run of the engine saw. Owned arrays: fl_load_result_free. */
typedef struct fl_load_result {
    int64_t elapsed_us;          /* start to the last answer */
    int64_t last_created_us;     /* start to the last 201: the selling window */
    int64_t max_sale_gap_us;     /* the longest time between two 201s (-1: fewer than two) */
    uint64_t sent;               /* requests written (in part or whole) */
    uint64_t answered;           /* complete answers */
    uint64_t status[600];        /* answers by status code */
    uint64_t transport_errors;   /* sent, no complete answer (reset, timeout, EOF) */
    uint64_t timeouts;           /* of which: no answer within the timeout */
    uint64_t connect_errors;
    uint64_t backlog;            /* open loop: scheduled, never sent before the end */
    uint64_t replays_sent;       /* orders that reused an earlier key */
    uint64_t fenced;             /* 429s whose message says the fence refused the write */
    uint64_t shed;               /* 503 overloaded: refused at the door, nothing taken (not
                                  * an error: the service protecting its latency) */
    uint64_t good;               /* 201s answered within goodput_us (goodput) */
    uint64_t late;               /* answers of any kind later than late_us */
    int max_open;                /* most connections open at once */
    fl_code_count codes[32];     /* error codes of non-2xx answers */
    size_t ncodes;
    fl_hist hist;                /* latency of every answer */
    fl_order_rec *created;       /* every 201 */
    size_t ncreated;
    fl_order_rec *replayed;      /* every 200 Idempotent-Replayed */
    size_t nreplayed;
    fl_lost_rec *lost;           /* transport errors after sending */
    size_t nlost;
    char key_tag[24];
    fl_decision_rec *decisions;  /* holds: one per 201, in no order */
    size_t ndecisions;
    fl_hist decision_hist;       /* latency of the confirms and cancels */
    int64_t start_wall_ms;       /* the wall clock at the start (Unix ms) */
    fl_buyer_rec *buyers;        /* a crowd: every buyer, in no order */
    size_t nbuyers;
} fl_load_result;

void fl_load_result_free(fl_load_result *r);
/* Count of answers with this error code. */
uint64_t fl_load_code(const fl_load_result *r, const char *code);
/* The key string of key id k, as sent: "fl-<tag>-<k>". */
void fl_key_string(const char *tag, uint64_t k, char *out, size_t len);

/* Live counters, for the progress line. */
typedef struct fl_progress {
    int64_t elapsed_us;
    uint64_t answered, c2xx, c201, c409, c429, c5xx, other, errors;
    uint64_t shed;               /* of c5xx: 503 overloaded */
    int open;                    /* connections open now */
    uint64_t p99_us;             /* over the answers since the previous call */
    uint64_t interval_n;         /* answers since the previous call */
} fl_progress;

typedef struct fl_engine fl_engine;

/* Starts the threads; they connect, send and read until the duration or
 * request budget is spent, then wait for answers in flight (up to the
 * timeout) and close. Returns NULL with e set if nothing could start. */
fl_engine *fl_engine_start(const fl_load_opts *o, fl_err *e);
/* Counters so far (thread-safe; call from one thread). */
void fl_engine_progress(fl_engine *g, fl_progress *p);
/* Whether every thread has finished. */
int fl_engine_finished(fl_engine *g);
/* Whether any connection has ever been established. */
int fl_engine_connected(fl_engine *g);
/* Stops issuing requests now (answers in flight are still awaited). */
void fl_engine_stop(fl_engine *g);
/* Waits for the threads, fills res and frees g. */
void fl_engine_join(fl_engine *g, fl_load_result *res);

/* What a crowd's run came to (crowd.c): who got the units, against who
 * came first. S is the stock the crowd competed for. */
typedef struct fl_crowd_figures {
    uint32_t buyers, bots, winners, bot_winners;
    long long stock;             /* S */
    double first_share;          /* of the units, the share the first S arrivals got */
    double first_place_share;    /* ...the share the S first places got (the room's own
                                    order: the line as Redis issued it; -1: no room) */
    uint64_t pairs, out_of_order;   /* pairs of winners; of them served against arrival */
    double bot_units, polite_units; /* units per capita */
    double bot_ratio;            /* bot_units / polite_units (0: polite got none) */
    int64_t final_p50_us, final_p99_us;   /* arrival to the final answer */
    uint32_t no_final;           /* buyers without a final answer at the end */
    int64_t final_after_last_unit_us;   /* the last final answer after the last unit sold */
    double requests_median, requests_p99;
    uint64_t requests;           /* all buyers' requests */
    int64_t first_unit_us, last_unit_us;
    double units_per_s;          /* units / (last - first unit) */
} fl_crowd_figures;

/* The figures of a crowd's buyers (r->buyers) for stock S. 0, or -1 when
 * out of memory. */
int fl_crowd_figures_get(const fl_load_result *r, long long stock, fl_crowd_figures *out);
/* Prints them, a few lines. */
void fl_crowd_print(const fl_crowd_figures *f, FILE *out);
/* Them as JSON, with the crowd's settings and each buyer's arrival rank,
 * outcome and time of its final answer (for the report's chart). */
struct json_t *fl_crowd_json(const fl_crowd_figures *f, const fl_crowd_opts *o,
                             const fl_load_result *r);

/* ------------------------------------------------------ the blocking client */

/* One keep-alive connection for admin calls and reads; reconnects once
 * when the server has closed it meanwhile. */
typedef struct fl_http {
    fl_target t;
    int fd;
    int timeout_ms;
    char token[256];             /* admin bearer token ("" none) */
    fl_resp resp;                /* the last answer */
} fl_http;

int fl_http_init(fl_http *h, const fl_target *t, const char *token, int timeout_ms);
void fl_http_close(fl_http *h);
/* Sends one request (body may be NULL) and reads the answer into h->resp.
 * Returns the status, or -1 with e set on a transport error. */
int fl_http_request(fl_http *h, const char *method, const char *path, const char *body,
                    fl_err *e);

/* A product as GET /v1/products/{sku} shows it. */
typedef struct fl_product {
    char sku[65];
    char strategy[32];
    int segments;
    long long per_user_limit;
    long long stock_initial, stock_available, sold;
    long long min_segment;       /* lowest of segment_available */
    int hold_seconds;            /* 0: no holds (absent: an older service) */
    long long held;              /* units of reserved holds */
} fl_product;

/* What a run creates. */
typedef struct fl_product_spec {
    char sku[65];
    long long stock;
    char strategy[32];           /* "" : the service's default */
    int segments;
    long long per_user_limit;
    int cs_delay_ms;             /* fault injection (0: not sent) */
    int lock_ttl_ms;             /* fault injection (0: not sent) */
    int cs_overlap;              /* fault injection: holders the critical section waits
                                    for, cs_delay_ms at most (0: not sent) */
    int hold_seconds;            /* holds (0: not sent) */
    int room_turn_s;             /* > 0: a waiting room, turns this long (0: none) */
    long long room_rate;         /* ...admitting this many orders/s (0: measured) */
} fl_product_spec;

/* POST /v1/products. Returns 0, or -1 with the service's answer in e. */
int fl_product_create(fl_http *h, const fl_product_spec *s, fl_err *e);
/* GET /v1/products/{sku}: 0, or -1 with e set. */
int fl_product_get(fl_http *h, const char *sku, fl_product *p, fl_err *e);
/* An order as a store lists it; state is the order's status (confirmed,
 * reserved, cancelled, expired), or "" for an order SQLite keeps no hold of
 * (which is confirmed). */
typedef void (*fl_row_fn)(const char *order_id, const char *user_id, int quantity,
                          const char *idem_key, const char *state, void *ud);
/* Calls fn for every order of sku (GET /v1/orders?sku=, all pages).
 * Returns the number of orders, or -1 with e set. */
long fl_orders_each(fl_http *h, const char *sku, fl_row_fn fn, void *ud, fl_err *e);

/* -------------------------------------------------------------- strategies */

#define FL_MAX_STRATEGIES 32

/* A stock strategy as GET /v1/strategies describes it: flashload keeps no
 * list of its own, so it offers exactly what the service it drives does. */
typedef struct fl_strategy {
    char name[32];
    int safe;                    /* 0: oversells by design (a demonstration) */
    int segments;                /* takes segments > 1 */
    int in_redis;                /* "redis" among its needs: its stock copy lives there */
    int available;               /* this instance can run it now */
    char reason[160];            /* why not, when it cannot */
} fl_strategy;

/* GET /v1/strategies into out[0..max). Returns how many, or -1 with e set. */
int fl_strategies_get(fl_http *h, fl_strategy *out, int max, fl_err *e);
/* The strategy named name among s[0..n), or NULL. */
const fl_strategy *fl_strategy_find(const fl_strategy *s, int n, const char *name);
/* Looks name up on the service. Returns 0 with *out filled, or -1 with e set
 * (the service cannot be asked, or offers no such strategy). */
int fl_strategy_lookup(fl_http *h, const char *name, fl_strategy *out, fl_err *e);

/* ------------------------------------------------- the stores, read directly */

/* The verifier reads Redis and SQLite itself, by the format users are given
 * (docs/storage.md), with hiredis and its own read-only SQL: a wrong key, a
 * wrong sum or a wrong query in the service's stock/ or db/ code cannot then
 * be wrong the same way in its judge. */

typedef struct fl_redis fl_redis;

/* A handle for reading the keys under prefix on the Redis at url. It
 * connects on first use and again after an error. NULL with e set when the
 * URL is unusable. */
fl_redis *fl_redis_open(const char *url, const char *prefix, int timeout_ms, fl_err *e);
void fl_redis_close(fl_redis *r);

/* url may be "redis://..." or "unix:..." (one server),
 * "redis-sentinel://[:pw@]host:port[,...]/<master>[?db=N]" (the primary the
 * sentinels name, asked again after an error) or
 * "redis-cluster://[[user]:pw@]host[:port][,host[:port]...]" (a Redis
 * Cluster: each read goes to the node serving the SKU's hash tag, following
 * MOVED, ASK, TRYAGAIN and CLUSTERDOWN; cluster.c). A copy's gen is checked
 * against the run_id of the server that served the read. */

/* Where the reads went: the server that answered the last one, and the
 * cluster's redirections followed so far (all 0 off a cluster). */
typedef struct fl_redis_route {
    char node[300];              /* "host:port" ("unix:<path>" for a socket); "" before a read */
    char run_id[41];             /* that server's run_id */
    unsigned long moved;         /* MOVED followed (the SKU's node then remembered) */
    unsigned long ask;           /* ASK followed (ASKING, one command) */
    unsigned long retried;       /* TRYAGAIN or CLUSTERDOWN waited out */
    unsigned long reconnects;    /* connection errors, each followed by the next seed */
} fl_redis_route;

void fl_redis_route_get(const fl_redis *r, fl_redis_route *out);

typedef enum fl_copy_state {
    FL_COPY_VALID = 0,           /* built for this Redis process; every segment key there */
    FL_COPY_MISSING,             /* no gen key, or a segment key absent */
    FL_COPY_STALE,               /* gen names another Redis process (run_id) */
    FL_COPY_MIXED                /* spread: lanes of different generations (a rebuild half done) */
} fl_copy_state;

/* Where a product's copy lives (docs/storage.md, "On a Redis Cluster"):
 * lanes 0, one slot, the keys <prefix>{<sku>}:...; lanes n > 1, spread:
 * segment i is lane i, a complete one-segment copy under <prefix>{<sku>:<i>}:...,
 * each lane in a slot of its own, read on the node serving it. */

/* The documented rule: a product is spread when r is a Redis Cluster, it
 * has segments > 1 and its strategy is a script one (lua,
 * unsafe-trust-redis). Returns its lanes (= segments), or 0. */
int fl_redis_lanes(const fl_redis *r, const char *strategy, int segments);
/* For a reader that does not know the product's strategy (inspect without
 * SQLite): on a cluster, sku is spread when <prefix>{<sku>}:gen is absent
 * and <prefix>{<sku>:0}:gen exists; its lanes are `segments` when > 1,
 * else counted (lanes 0, 1, ... up to the first without a gen). *lanes 0
 * when not spread. Returns 0, or -1 with e set. */
int fl_redis_find_lanes(fl_redis *r, const char *sku, int segments, int *lanes, fl_err *e);

/* A SKU's stock copy, read in one atomic step (one MGET); a spread one in
 * one MGET per lane (each lane atomic, the sum over lanes not). */
typedef struct fl_stock_copy {
    fl_copy_state state;
    long long gen;               /* the copy's generation (0: none); MIXED: the lowest */
    long long gen_hi;            /* MIXED: the highest lane generation (else gen) */
    long long total;             /* units in all segments (all lanes) */
    int low_seg;                 /* the segment (lane) holding least */
    long long low;               /* its units */
    int stranded;                /* segments the empty bitmap marks that hold units */
    int stranded_seg;            /* the first of them */
    long long stranded_units;    /* the units they hold, which no order can take */
    int lanes;                   /* 0: one slot; n: spread over n lanes */
    int bad_lane;                /* spread, MISSING or STALE: the first lane that is (else -1) */
} fl_stock_copy;

/* One lane of the last spread copy fl_redis_stock read. */
typedef struct fl_lane {
    char node[300];              /* the node that answered its MGET */
    char run_id[41];             /* that node's run_id */
    fl_copy_state state;         /* VALID, MISSING or STALE, judged by that run_id */
    long long gen;               /* its generation (0: no gen key) */
    int has_stock;               /* its stock:0 key exists */
    long long units;             /* stock:0 */
} fl_lane;

/* Reads the copy of sku, which has `segments` segments (1..1024), laid
 * out as `lanes` says (fl_redis_lanes). Returns 0, or -1 with e set when
 * Redis could not be read. */
int fl_redis_stock(fl_redis *r, const char *sku, int segments, int lanes, fl_stock_copy *out,
                   fl_err *e);
/* Lane i of the last spread copy read: 0, or -1 when there is none. */
int fl_redis_lane(const fl_redis *r, int i, fl_lane *out);
/* Why c is not valid, in words ("its gen names another Redis process",
 * "lane 2's gen names another Redis process", ...) into buf. */
const char *fl_copy_why(const fl_stock_copy *c, char *buf, size_t len);
/* What fault injection's forcing of an interleaving counted for sku
 * (docs/storage.md, "cs"): waits that ended with the holders asked for
 * inside the critical section with the same read (met), and waits that
 * ran to their bound (alone). 0 (both 0 when nothing was forced), or -1
 * with e set. */
int fl_redis_forcing(fl_redis *r, const char *sku, long long *met, long long *alone, fl_err *e);
/* Counts sku's pending records and the units they hold out (field "q"),
 * over every lane of a spread one (an order taken in steps has a record
 * in each lane it took from: each counts). A record without a readable
 * "q" counts as a record of no units and in *unreadable. Returns 0, or -1
 * with e set. */
int fl_redis_pending(fl_redis *r, const char *sku, int lanes, long long *records,
                     long long *units, long long *unreadable, fl_err *e);
/* The order ids of sku's return markers (ended holds whose units were
 * given back to this copy: the legacy `returned` hash and the time buckets
 * `returned:<b>`; of a spread one, the union over its lanes), sorted and
 * distinct, into *ids (the caller frees); and in *before_ms (may be NULL)
 * the forgetting watermark `returned:before` (the lowest of the lanes'; 0:
 * none): the markers of holds decided before it may be gone. Returns 0, or
 * -1 with e set. */
int fl_redis_returned(fl_redis *r, const char *sku, int lanes, fl_order_id **ids, size_t *n,
                      long long *before_ms, fl_err *e);

/* The orders' database a --db names: a libpq URI (postgresql://... or
 * postgres://...), else a SQLite file. */
int fl_db_is_server(const char *path);
/* The vantage point's name in verdicts: "postgresql" or "sqlite". */
const char *fl_db_vantage(const char *path);

/* What the orders' database holds for one SKU, read in one read
 * transaction (dbread.c). */
typedef struct fl_db_sku {
    char strategy[32];
    int segments;
    long long per_user_limit;
    long long stock_initial, sold;
    long long stock_gen;
    long long db_available;      /* the db strategies' stock */
    long long voided_committed;  /* orders both committed and voided */
    int schema_version;          /* SQLite's PRAGMA user_version; PostgreSQL's flashsale_schema */
    int hold_seconds;            /* schema 6 on; 0 before */
    long long held;
    const char *vantage;         /* fl_db_vantage of where it was read */
} fl_db_sku;

/* A row of `holds` (schema 6), as fl_db_read hands it over. */
typedef struct fl_hold_row {
    const char *order_id;
    int quantity;
    long long gen;               /* the stock generation it was reserved under */
    long long expires_ms;
    const char *state;           /* reserved, confirmed, cancelled, expired */
    long long decided_ms;        /* -1: NULL (still reserved) */
    const char *payment_ref;     /* "" : NULL */
    int owes;                    /* return_gen IS NOT NULL: units not yet back in Redis */
} fl_hold_row;

/* Opens path (a file or a server) read-only and, in one snapshot, reads
 * sku's product row,
 * calls hold (unless NULL; schema 6 on) for each of its holds, then fn for
 * each of its orders in order_id order. Returns 1 when read, 0 when the
 * file has no such SKU, -1 with e set (no such file, not the documented
 * schema, I/O). */
int fl_db_read(const char *path, const char *sku, fl_db_sku *out,
                   void (*hold)(const fl_hold_row *h, void *ud), fl_row_fn fn, void *ud,
                   fl_err *e);
/* The holds of sku still reserved, and those owing their units to Redis
 * (return_gen set), read-only in one snapshot: how far the holds are from
 * settled. Both 0 before schema 6. Returns 0, or -1 with e set. */
int fl_db_holds_open(const char *path, const char *sku, long long *reserved, long long *owed,
                         fl_err *e);

/* ------------------------------------------------------------ verification */

/* Where to look, besides the client's own record. */
typedef struct fl_vantage {
    fl_target api;               /* the service (any instance) */
    char token[256];
    char redis_url[512];         /* "" : Redis not checked */
    char key_prefix[64];
    char db_path[512];           /* "" : SQLite not checked */
} fl_vantage;

/* The state before the run, so an existing SKU can be tested too. */
typedef struct fl_baseline {
    fl_product p;
    fl_order_id *ids;            /* orders that existed before (sorted) */
    size_t nids;
    long long units;             /* their units */
} fl_baseline;

/* Samples taken while the load runs. */
typedef struct fl_sampler fl_sampler;

typedef struct fl_samples {
    uint64_t n;                  /* samples taken (API) */
    uint64_t redis_n;
    long long min_available;     /* lowest stock_available the API showed */
    long long min_segment;       /* lowest single segment the API showed */
    long long min_redis_segment; /* lowest segment read from Redis */
    uint64_t negative;           /* API samples with anything below zero */
    uint64_t redis_negative;     /* Redis samples with a segment below zero */
    uint64_t redis_stranded;     /* Redis samples with units in segments marked empty */
    long long max_stranded;      /* most such units in one sample */
    uint64_t errors;             /* samples that failed */
    int64_t first_empty_ms;      /* wall clock of the first API sample with nothing
                                  * available (Unix ms; 0: none) */
} fl_samples;

fl_sampler *fl_sampler_new(const fl_vantage *v, const fl_product *p, fl_err *e);
/* Takes one sample from the API and, if configured, Redis. */
void fl_sampler_sample(fl_sampler *s);
void fl_sampler_get(const fl_sampler *s, fl_samples *out);
void fl_sampler_free(fl_sampler *s);

#define FL_MAX_VIOLATIONS 32

typedef struct fl_violation {
    char vantage[8];             /* client, api, redis, sqlite */
    char what[240];              /* "oversold by 37 units (...)" */
    long long size;
} fl_violation;

/* What the verifier found of holds (a product with hold_seconds > 0). */
typedef struct fl_holds_verdict {
    int hold_seconds;            /* 0: the product has no holds (nothing below is set) */
    long long confirmed_units;   /* units of the orders confirmed by a 200 */
    int64_t settle_ms;           /* waited this long for the holds to settle */
    long long held;              /* API, at the end */
    int db;                      /* the counts below were read (SQLite) */
    long long reserved, confirmed, cancelled, expired, owed;   /* this run's holds */
    long long lag_n, lag_p50_ms, lag_p99_ms, lag_max_ms;       /* expired: decided - due */
    long long resold;            /* units ordered beyond the stock: came back, sold again */
    long long after_return;      /* units ordered after the first hold ended */
    int resale_checked;          /* the run's shape promised a resale: a check */
    long long returned_fields;   /* Redis `returned` fields (-1: not read) */
} fl_holds_verdict;

typedef struct fl_verdict {
    int pass;
    fl_violation v[FL_MAX_VIOLATIONS];
    int nv;                      /* listed violations */
    int nv_total;                /* found, listed or not */
    /* Figures (this run's share when the SKU existed before). */
    long long initial;           /* stock put on sale */
    long long sold;              /* API: sold by this run */
    long long available;         /* API: left at the end */
    long long units_201;         /* units the client holds 201s for */
    long long oversold;          /* units sold or offered beyond the stock */
    long long lost;              /* units neither sold nor available */
    long long min_stock;         /* lowest stock seen anywhere */
    long long stranded;          /* Redis: units in segments marked empty (unsellable) */
    long long pending_records, pending_units;   /* Redis, after settling */
    long long orders_listed;     /* API order rows of this run */
    long long orders_without_201, created_without_order;
    long long explained_by_errors;  /* rows matched to a transport error */
    int api_checked, redis_checked, db_checked;
    const char *db_vantage;      /* db_checked: "sqlite" or "postgresql" */
    fl_holds_verdict holds;      /* a product with hold_seconds > 0; all 0 otherwise */
    char notes[512];             /* what could not be checked, and why */
} fl_verdict;

typedef struct fl_verify_in {
    const fl_vantage *v;
    const char *sku;
    const fl_baseline *base;
    const fl_load_result *load;
    const fl_samples *samples;   /* may be NULL */
    int settle_ms;               /* wait this long at most for a quiet state */
    const fl_load_opts *lo;      /* how the load ran (NULL: unknown) */
    int progress;                /* a line per second on stderr while holds settle */
} fl_verify_in;

/* Reads the product and its orders before a run. */
int fl_baseline_take(fl_http *h, const char *sku, fl_baseline *b, fl_err *e);
void fl_baseline_free(fl_baseline *b);
/* Checks every invariant from every vantage point configured. Returns 0
 * with the verdict filled, or -1 with e set when checking itself failed. */
int fl_verify(const fl_verify_in *in, fl_verdict *out, fl_err *e);

/* `flashload inspect`: the stores of given SKUs as the verifier reads them,
 * without a load run (inspect.c). */
#define FL_INSPECT_MAX_SKUS 16
typedef struct fl_inspect_opts {
    char redis_url[512];         /* "" : Redis not read */
    char key_prefix[64];         /* "" : fs: */
    char db_path[512];           /* "" : SQLite not read */
    int segments;                /* 0: SQLite's products.segments, or 1 without it */
    int nskus;
    char skus[FL_INSPECT_MAX_SKUS][65];   /* read in this order, a SKU again if repeated */
} fl_inspect_opts;

/* Reads each SKU (Redis: the stock copy, pending, returned, and which
 * server answered; SQLite: the product's books) and prints what it saw and
 * the invariants broken to f. Returns 0 when none is, 1 when one is, -1
 * with e set when a store could not be read. */
int fl_inspect(const fl_inspect_opts *o, FILE *f, fl_err *e);
/* Prints the verdict: "PASS ..." or "FAIL" and one line per violation. */
void fl_verdict_print(const fl_verdict *vd, FILE *f);
/* One line: "PASS" or the violations joined by "; ". */
void fl_verdict_line(const fl_verdict *vd, char *out, size_t len);
/* The holds' lines: the buyers' decisions and their answers, how the holds
 * ended, the expiry lag, the units sold again (nothing without holds). */
void fl_holds_print(const fl_load_result *l, const fl_verdict *vd, FILE *f);

/* --------------------------------------------------------------- one run */

typedef struct fl_run_opts {
    fl_load_opts load;
    fl_vantage vantage;
    int create;                  /* create the product (else it must exist) */
    fl_product_spec product;
    int verify;                  /* on by default */
    int settle_ms;
    int sample_ms;               /* sampling period while running */
    int progress;                /* a progress line per second on stderr */
    const char *label;           /* shown on progress lines */
    /* Called after each sample with the counters so far; nonzero stops
     * the load (answers in flight are still awaited). NULL: none. */
    int (*tick)(void *ud, const fl_progress *p);
    void *tick_ud;
    const atomic_int *interrupted;   /* set by a signal: stop early */
} fl_run_opts;

void fl_run_opts_default(fl_run_opts *o);

typedef struct fl_run_result {
    fl_load_result load;
    fl_samples samples;
    fl_verdict verdict;
    fl_product product;          /* as created / found */
    int verified;
} fl_run_result;

/* Creates (or finds) the product, runs the load while sampling and showing
 * progress, then verifies. Returns 0 (see res->verdict), or -1 with e set
 * on a usage or setup failure (exit code 2). */
int fl_run(const fl_run_opts *o, fl_run_result *res, fl_err *e);
void fl_run_result_free(fl_run_result *r);
/* Prints the final figures: throughput, latencies, statuses, error codes. */
void fl_run_print(const fl_run_opts *o, const fl_run_result *r, FILE *f);
/* Formats a duration for people: "740us", "7.12ms", "1.20s". */
void fl_fmt_us(uint64_t us, char *out, size_t len);
/* Writes the run as JSON to path. Returns 0 or -1 with e set. */
int fl_run_write_json(const fl_run_opts *o, const fl_run_result *r, const char *path,
                      fl_err *e);

/* ---------------------------------------------------------------- processes */

/* What a process we start is; a server knows how to come back. */
typedef enum fl_proc_kind {
    FL_PROC_SERVICE = 0,
    FL_PROC_REDIS,               /* no persistence: what the service's Redis is */
    FL_PROC_REDIS_AOF,           /* append-only file: a Redlock server keeps its counters */
    FL_PROC_ZOOKEEPER,           /* standalone, Debian's zookeeper on a JRE */
    FL_PROC_ETCD,                /* single member, Debian's etcd-server */
    FL_PROC_REDIS_NODE,          /* from <dir>/redis.conf: a primary or replica a Sentinel watches */
    FL_PROC_SENTINEL             /* `redis-server <dir>/redis.conf --sentinel` */
} fl_proc_kind;

typedef struct fl_proc {
    pid_t pid;
    int port;
    int peer_port;               /* etcd's peer port (0: none) */
    fl_proc_kind kind;
    char dir[400];               /* a server's own directory (its data under it) */
    char bin[300];               /* the program, when not the usual one */
    char url[128];               /* redis://..., http://..., zk://..., etcd://... */
    char log[600];
    char clockjump[400];         /* FL_PROC_REDIS_AOF under bin/libclockjump.so: its offset file ("" none) */
} fl_proc;

/* A free TCP port on 127.0.0.1, or -1. */
int fl_free_port(void);
/* Starts redis-server (no persistence) in dir on a free port and waits for
 * it to answer. Returns 0 or -1 with e set. */
int fl_redis_start(const char *dir, fl_proc *p, fl_err *e);
/* Starts a lock server of kind (FL_PROC_REDIS_AOF, FL_PROC_ZOOKEEPER,
 * FL_PROC_ETCD) with its files in dir (made if absent) on free ports, and
 * bin instead of the usual program (redis-server, java, etcd) unless NULL,
 * returns at once: fl_proc_wait says when it serves, so several can start
 * side by side. Returns 0 or -1 with e set (p->pid is then 0). */
int fl_server_spawn(fl_proc_kind kind, const char *dir, const char *bin, fl_proc *p,
                    fl_err *e);
/* Waits up to timeout_ms until p serves (ZooKeeper: answers ruok; etcd: a
 * range read; Redis: accepts). On failure stops it; -1 with e set. */
int fl_proc_wait(fl_proc *p, int timeout_ms, fl_err *e);
/* Takes server p down and brings it back on the same port(s). wipe 0: a
 * restart that keeps its data (Redis without persistence is made to SAVE
 * first); wipe 1: killed with SIGKILL and started with its data directory
 * emptied: a server that lost its data. *down_ms gets how long it did not
 * serve. Returns 0, or -1 with e set (it is then down). */
int fl_server_restart(fl_proc *p, int wipe, int64_t *down_ms, fl_err *e);
/* Starts `bin --listen 127.0.0.1:<free> --redis url --db db_path` plus the
 * extra NULL-terminated args, logging to dir, and waits until it accepts. */
int fl_service_start(const char *bin, const char *dir, const char *redis_url,
                     const char *db_path, const char *const *extra, fl_proc *p, fl_err *e);
/* Restarts the n servers p[0..n) together (all down, then all up), as
 * fl_server_restart does one: Redlock's servers as one lock service. */
int fl_servers_restart(fl_proc *p, int n, int wipe, int64_t *down_ms, fl_err *e);
/* Starts a redis-server (FL_PROC_REDIS_NODE: no persistence, a full sync
 * without delay) or a sentinel (FL_PROC_SENTINEL) from <dir>/redis.conf,
 * written here (port, bind 127.0.0.1, dir) followed by the lines of extra
 * ("replicaof ...\n", "sentinel monitor ...\n"; NULL: none), on a free
 * port; returns at once (fl_proc_wait). A restart reads the same file, as
 * the sentinel rewrote it. Returns 0, or -1 with e set. */
int fl_conf_spawn(fl_proc_kind kind, const char *dir, const char *extra, fl_proc *p,
                  fl_err *e);
/* bin/libclockjump.so, the LD_PRELOAD shim next to this program
 * (loadtest/clockjump.c), into out; 0, or -1 with e set when it is not there. */
int fl_clockjump_lib(char *out, size_t len, fl_err *e);
/* Starts a redis-server with an append-only file, as fl_server_spawn's
 * FL_PROC_REDIS_AOF, under bin/libclockjump.so: its wall clock is the real
 * one plus the offset in file (created, or set, at 0 here), read at every
 * call, so fl_clockjump_set moves it at once; its monotonic clock is left
 * alone. Returns at once; 0, or -1 with e set (no shim: say so). */
int fl_clockjump_spawn(const char *dir, const char *file, fl_proc *p, fl_err *e);
/* Sets the offset of such a clock to secs seconds, in one store a reader
 * sees whole. 0, or -1 with e set. */
int fl_clockjump_set(const char *file, int64_t secs, fl_err *e);
/* Starts p again where it ran (port, files, settings), after it was killed
 * or stopped, and waits until it serves. 0, or -1 with e set. */
int fl_server_start_again(fl_proc *p, fl_err *e);

/* Where a server's append-only file ended at a moment. */
typedef struct fl_aof_mark {
    char path[600];              /* its newest incremental file (Redis 7: appendonlydir/) */
    long long size;
    int64_t at_ms;               /* when (monotonic) */
} fl_aof_mark;

/* Marks where p's (FL_PROC_REDIS_AOF) append-only file ends now. */
int fl_aof_mark_take(const fl_proc *p, fl_aof_mark *m, fl_err *e);
/* A crash of the machines of p[0..n) with `appendfsync everysec`: each is
 * killed with SIGKILL, its append-only file cut back to its mark (what an
 * OS crash or power loss leaves when the last writes had not reached the
 * disk: a killed process alone loses nothing, its writes are in the page
 * cache), then started again on its port. *down_ms: how long. 0, or -1
 * with e set. */
int fl_servers_crash(fl_proc *p, int n, const fl_aof_mark *m, int64_t *down_ms, fl_err *e);
/* SIGTERM, then SIGKILL after timeout_ms; reaps it. Safe on a zero pid. */
void fl_proc_stop(fl_proc *p, int timeout_ms);
/* SIGKILL now, and reaps it. Safe on a zero pid. */
void fl_proc_kill(fl_proc *p);
/* Removes a directory tree made by us (best effort). */
void fl_rmtree(const char *dir);

/* ------------------------------------------------------------- comparison */

/* The groups of scenes, in the order they run and are shown. */
enum { FL_GROUP_CONTENTION, FL_GROUP_PAUSE, FL_GROUP_FAILURE, FL_GROUP_HOLDS,
       FL_GROUP_FAIRNESS, FL_GROUP_CROWD, FL_GROUP_HOSTS, FL_GROUPS };

#define FL_CROWD_BINS 100            /* a crowd scene's arrival ranks, drawn in this many bins */

/* The fairness group's two scenes (fairness.c). */
enum { FL_FAIR_NONE, FL_FAIR_QUEUE, FL_FAIR_STREAM };
#define FL_FAIR_MAX 64               /* buyers in a fairness scene, at most */

/* The faults between hosts a scene of FL_GROUP_HOSTS runs under (hosts.c):
 * each on a deployment of network namespaces of its own (tests/hosts.py). */
typedef enum fl_between {
    FL_HOSTS_NONE = 0,
    FL_HOSTS_SPLIT,              /* the Redis primary cut off with one instance, a replica promoted */
    FL_HOSTS_ASYNC,              /* Patroni's leader dies, an asynchronous replica promoted */
    FL_HOSTS_SYNC,               /* the same with synchronous_mode: its standby promoted */
    FL_HOSTS_CUT,                /* Patroni's leader cut from etcd and its replica: demoted */
    FL_HOSTS_SWITCHOVER,         /* a planned Patroni switchover, one instance via HAProxy */
    FL_HOSTS_COUNT
} fl_between;

/* What a forced scene (cs_overlap) must see for its forcing to count:
 * a second holder inside the critical section with the same read (MET:
 * the interleaving that breaks an unsafe strategy, or a lease that ran
 * out), or none ever (ALONE: a lock that holds). */
enum { FL_FORCE_NONE, FL_FORCE_MET, FL_FORCE_ALONE };

/* The Redis failures of seed 004 (section 4.2) a scene of FL_GROUP_FAILURE
 * runs under (failures.c). */
typedef enum fl_failure {
    FL_FAIL_NONE = 0,
    FL_FAIL_FAILOVER,            /* the stock's Redis fails over to a replica that missed writes */
    FL_FAIL_CLOCK,               /* Redlock: a server's wall clock jumps forward mid-hold */
    FL_FAIL_AOF,                 /* Redlock: a server crashes mid-hold, AOF everysec loses the hold */
    FL_FAIL_MEMBER,              /* Redlock: a member fails over to a replica that missed the lock */
    FL_FAILURES
} fl_failure;

/* Why and how a scene is run. */
typedef struct fl_scene {
    char strategy[32];
    int segments;
    int instances;
    long long stock;
    int cs_delay_ms;             /* injected pause, or the forcing's longest wait (0: none) */
    int lock_ttl_ms;             /* lease (0: service default) */
    int cs_overlap;              /* forced: holders the critical section waits for (0: none) */
    int expect_force;            /* forced: FL_FORCE_MET or FL_FORCE_ALONE */
    int unsafe;                  /* expected to break */
    int fault;                   /* runs under an injected fault (group > 0): shaded, marked */
    int group;                   /* FL_GROUP_* */
    fl_failure failure;          /* FL_GROUP_FAILURE: which */
    fl_between between;          /* FL_GROUP_HOSTS: which */
    char condition[160];         /* for people: "contention", "pause 300ms > ttl 100ms" */
    const char *fault_name;      /* the fault a faulty scene shows, in a few words, for
                                    grouping ("a lease runs out"; NULL: none) */
    double duration_s;
    /* FL_GROUP_HOLDS: the product's hold_seconds, and the shares of the
     * holds their buyers pay for and cancel (the rest abandon). */
    int hold_seconds;
    double pay, cancel;
    /* FL_GROUP_FAIRNESS: which scene, its buyers and the gap between their
     * arrivals (cs_delay_ms is each one's hold). */
    int fair_scene;
    int waiters, gap_ms;
    /* FL_GROUP_CROWD: its buyers (arriving over crowd_ramp_s, a fifth of
     * them bots), and whether the product has a waiting room. */
    int crowd_buyers, crowd_room;
    double crowd_ramp_s;
} fl_scene;

typedef struct fl_scene_result {
    fl_scene sc;
    int ran;                     /* 0: skipped (see note) */
    char note[300];
    double orders_per_s;         /* 201s per second while the sale lasted (to the last 201) */
    double answers_per_s;        /* order requests answered per second, whatever the answer */
    uint64_t answered, created, transport_errors;
    uint64_t p50_us, p90_us, p99_us, p999_us, max_us;
    fl_verdict verdict;
    char verdict_line[300];
    int as_expected;             /* safe and PASS, or unsafe and FAIL */
    uint64_t status_201, status_409, status_429, status_5xx;
    uint64_t fenced;             /* 429s refused by the fence */
    /* The service's flashsale_lock_handoff_seconds over this scene
     * (release -> next acquire in the same process): count, sum/count, and
     * the median interpolated within its buckets. n 0: none recorded. */
    uint64_t handoff_n;
    double handoff_mean_us, handoff_p50_us;
    /* A Redis failure scene: from the fault (the kill of the primary) to
     * the next 201 (-1: none, or not measured), and what was done and seen,
     * in words. */
    int64_t recover_ms;
    char detail[400];
    /* A forced scene: the service's count of waits that met a second
     * holder and that ran to their bound alone (-1: not read), and, when
     * the forcing did not come as the scene claims, what was missing. */
    long long forced_met, forced_alone;
    char forced_why[200];
    /* The longest time between two 201s of the scene (-1: fewer than
     * two): how long a fault stalled the sale. */
    int64_t sale_gap_us;
    /* A fairness scene (fairness.c): buyers served, pairs of them and those
     * served against arrival order, the median and longest wait (less
     * their own hold), those not served while a later one was, and the
     * service order (arrival indices, first served first). */
    int fair_served, fair_starved;
    long fair_pairs, fair_out_of_order;
    double fair_wait_median_ms, fair_wait_max_ms;
    unsigned char fair_order[FL_FAIR_MAX];
    /* A crowd scene: its figures, and by arrival rank (FL_CROWD_BINS bins,
     * first arrivals first) the buyers, those who got a unit, and the bots
     * among them. */
    fl_crowd_figures crowd;
    uint32_t crowd_bins[FL_CROWD_BINS][3];
} fl_scene_result;

/* One measurement of a lock under a fault, for the "choosing a lock" table. */
typedef struct fl_probe {
    int ran;                     /* 0: not measured; note says why (n/a, skipped) */
    char note[300];              /* what happened, in words */
    int64_t down_ms;             /* the server did not serve for this long */
    int64_t refused_ms;          /* from the fault to the last refused answer (0: none) */
    int64_t recover_ms;          /* server back (or holder killed) -> next 201; -1: none */
    int still_refusing;          /* refused answers went on to the end of the probe */
    int64_t waited_ms;           /* the probe's load went on this long after the server was back */
    uint64_t ok, refused;        /* 201s, and 429/5xx/transport errors, from the fault on */
    uint64_t fenced;             /* refusals by the fence */
    long long oversold, lost;
    int pass;                    /* the verifier's verdict */
} fl_probe;

#define FL_LOCK_ROWS 10

/* A row of the "choosing a lock" table: one lock, measured in this run. */
typedef struct fl_lock_row {
    char strategy[32];           /* a name of LOCKS (probe.c): lock ... local */
    char server[200];            /* what its lock server is, in words */
    int have1, have8;            /* its contention scenes ran */
    double ops1, ops8;           /* orders/s with 1 and 8 segments */
    uint64_t p50_us, p99_us;     /* 1 segment */
    uint64_t p50_8_us, p99_8_us; /* 8 segments */
    uint64_t handoff_n;          /* hand-offs timed in the 1-segment scene */
    double handoff_mean_us, handoff_p50_us;
    fl_probe kill;               /* the holder killed (SIGKILL) mid-critical-section */
    fl_probe restart;            /* its lock server restarted mid-run, data kept */
    fl_probe wipe;               /* its lock server restarted empty mid-run */
    fl_probe fence;              /* a pause longer than the lease (the pause scene) */
    fl_probe failover;           /* its Redis failed over to a replica that missed the lock */
    /* The fairness scenes ([0] queue, [1] stream): ran, pairs served
     * against arrival order of all pairs, buyers starved, longest wait. */
    int fair_have[2];
    long fair_oo[2], fair_pairs[2];
    int fair_starved[2];
    double fair_wait_max_ms[2];
} fl_lock_row;

typedef struct fl_compare_opts {
    char strategies[16][32];     /* empty: every strategy the service lists */
    int nstrategies;
    int segments[8];
    int nsegments;
    int two_instances;           /* add the two-instance scenes */
    double duration_s;           /* per scene */
    double pause_duration_s;     /* per scene run under an injected pause */
    int connections;
    int threads;
    uint32_t users;
    int qty_min, qty_max;
    long long stock;             /* of the scenes without a pause */
    long long pause_stock;       /* of the scenes under an injected pause */
    int contention;              /* the ordinary contention group */
    int forced;                  /* the forced interleavings group */
    int between_hosts;           /* the between-hosts group (root; off by default) */
    char hosts_script[400];      /* "" : tools/hosts_scene.py of the service's tree */
    unsigned between_only;       /* bit per fl_between to run (0: every one) */
    int probes;                  /* measure the lock table's fault columns */
    int lock_servers;            /* start Redlock's, ZooKeeper and etcd (own services only) */
    int redis_failures;          /* the Redis failures group (own services only) */
    int holds;                   /* the holds group */
    int fairness;                /* the fairness group */
    int crowd;                   /* the crowd group: a sale past capacity, room off and on */
    int crowd_buyers;            /* ...its buyers (its units a tenth of them) */
    int hold_seconds;            /* of its products */
    double holds_duration_s;     /* per scene of the holds group */
    long long holds_stock;       /* of its products: sold out, returned, resold */
    char etcd_bin[300];          /* "" : etcd from PATH */
    char java_bin[300];          /* "" : java from PATH (ZooKeeper) */
    char out_dir[400];
    char service_bin[400];
    /* Existing services instead of our own. */
    fl_target targets[FL_MAX_TARGETS];
    int ntargets;
    char token[256];
    char redis_url[512];
    char key_prefix[64];
    char db_path[512];
    int progress;                /* per-second lines during each scene */
    const atomic_int *interrupted;
} fl_compare_opts;

void fl_compare_opts_default(fl_compare_opts *o);
/* Builds the matrix of scenes over the strategies st[0..nst) (as the
 * service lists them). Returns how many (at most max). */
int fl_compare_scenes(const fl_compare_opts *o, const fl_strategy *st, int nst, fl_scene *out,
                      int max);
/* Runs every scene, prints the table, writes report.json and report.html
 * into o->out_dir. Returns 0 when every scene came out as expected, 1 when
 * one did not, -1 with e set on a setup failure. */
int fl_compare(const fl_compare_opts *o, fl_err *e);
/* The table, as printed, then what each Redis failure scene did and how
 * the holds scenes' holds ended. */
void fl_compare_table(const fl_scene_result *r, int n, FILE *f);
/* A group's heading ("ordinary contention (no fault)", ...). */
const char *fl_group_title(int group);
/* A holds scene's figures in one line ("412 holds placed: 250 confirmed,
 * ..."); "" for a scene without holds or that did not run (scene.c, as
 * the next). */
void fl_holds_brief(const fl_scene_result *s, char *out, size_t len);
/* A forced scene's waits in a few words ("; waits: 20 met a second holder,
 * 1 alone"); "" for another scene, or one that did not run. */
void fl_forced_brief(const fl_scene_result *s, char *out, size_t len);
/* A failure in a few words ("a Redlock server's clock jumps"); failures.c,
 * as the next. */
const char *fl_failure_title(fl_failure kind);
/* A failure's short name ("failover", "clock jump", ...), as report.json has it. */
const char *fl_failure_name(fl_failure kind);
/* A fault between hosts in a few words ("a Redis split brain"), and its
 * short name as report.json has it ("split-brain"). */
const char *fl_between_title(fl_between b);
const char *fl_between_name(fl_between b);
/* A fairness scene's name, "queue" or "stream" (fairness.c). */
const char *fl_fair_scene_name(int kind);
/* The "choosing a lock" table, as printed. */
void fl_lock_table(const fl_lock_row *l, int n, FILE *f);
/* A lock row's fairness cell ("in order", or the pairs out of order of its
 * queue and stream scenes). */
void fl_fair_fmt(const fl_lock_row *r, char *out, size_t len);
/* Formats a probe's outcome in one short line ("n/a: ..." when not run). */
void fl_probe_fmt(const fl_probe *p, int kind, char *out, size_t len);
enum { FL_PROBE_KILL, FL_PROBE_RESTART, FL_PROBE_WIPE, FL_PROBE_FENCE, FL_PROBE_FAILOVER };
/* report.json and report.html. Return 0 or -1 with e set. */
int fl_report_json(const fl_compare_opts *o, const fl_scene_result *r, int n,
                   const fl_lock_row *l, int nl, const char *path, fl_err *e);
int fl_report_html(const fl_compare_opts *o, const fl_scene_result *r, int n,
                   const fl_lock_row *l, int nl, const char *path, fl_err *e);

#endif
