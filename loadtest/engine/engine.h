/* engine.h: the load -- one epoll loop per thread over non-blocking
 * keep-alive connections, closed loop or open loop at a fixed rate with
 * latency from each request's scheduled time (engine.c); or a crowd of
 * buyers who each try until they have a unit (crowd.c). What it sends is
 * fl_load_opts, what it saw fl_load_result: every 201, every lost request
 * and every decision on a hold, for the verifier to count. */
#ifndef FLASHSALE_LOADTEST_ENGINE_H
#define FLASHSALE_LOADTEST_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loadtest/client/client.h"
#include "loadtest/engine/buyers.h"
#include "loadtest/engine/hist.h"
#include "loadtest/fl.h"

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
    int room;                    /* a waiting room: 1, each buyer orders first (an order
                                    without a ticket takes its place, and is taken at once
                                    in its turn; else it hears its ticket); FL_CROWD_TICKETS,
                                    each takes a ticket first (POST .../tickets) */
    int hold;                    /* > 0: this many connections more, kept for the requests
                                    that wait in the service (long polls, orders it holds
                                    for their turn); 0: half the connections are kept so */
} fl_crowd_opts;

#define FL_CROWD_TICKETS 2

enum { FL_BUYER_NONE, FL_BUYER_GOT, FL_BUYER_SOLD_OUT, FL_BUYER_REFUSED };

/* One buyer of a crowd, as the run saw it (times from the crowd's start,
 * us: once every connection has had an answer of the service). */
typedef struct fl_buyer_rec {
    uint32_t idx;                /* arrival rank: 0 came first */
    uint8_t bot;
    uint8_t outcome;             /* FL_BUYER_* (NONE: no final answer by the end) */
    uint16_t requests;
    uint16_t polls;              /* ...of them long polls of its ticket */
    uint32_t position;           /* its place in the waiting room (0: none) */
    int64_t arrive_us;
    int64_t final_us;            /* its final answer (-1: none) */
    int64_t sent_us;             /* its first request written to a connection (-1: never):
                                    later than arrive_us when the load generator had no
                                    connection free for it, or fell behind */
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
    int64_t max_sale_gap_us;     /* the longest time between two 201s, or from the last
                                    201 to the last answer when no sold out was heard
                                    after it (-1: fewer than two 201s) */
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
    int64_t crowd_start_us;      /* a crowd: its clock's start after the run's (-1: never) --
                                    once its connections had an answer each */
    int crowd_warmed, crowd_conns;   /* ...connections that had, of all */
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
    double first_sent_share;     /* ...the share the first S to send a request got (the
                                    order the buyers left the load generator in, which
                                    is all a service can see; -1: not known) */
    int64_t send_lag_p50_us, send_lag_p99_us;   /* arrival to its first request written:
                                                   the load generator's own lag */
    uint64_t pairs, out_of_order;   /* pairs of winners; of them served against arrival */
    double bot_units, polite_units; /* units per capita */
    double bot_ratio;            /* bot_units / polite_units (0: polite got none) */
    double fifo_bot_ratio;       /* ...what a strict first-come order would give the same
                                    buyers (the first `winners` arrivals): the sample's
                                    share of bots up front (0: not defined) */
    int64_t final_p50_us, final_p99_us;   /* arrival to the final answer */
    uint32_t no_final;           /* buyers without a final answer at the end */
    int64_t final_after_last_unit_us;   /* the last final answer after the last unit sold */
    double requests_median, requests_p99;
    uint64_t requests;           /* all buyers' requests */
    uint64_t polls;              /* ...of them long polls (polite buyers waiting their turn) */
    int64_t first_unit_us, last_unit_us;
    double units_per_s;          /* units / (last - first unit) */
    int64_t start_us;            /* the buyers' clock started this long after the run's */
    int warmed, conns;           /* ...connections answered once by then, of all */
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

#endif
