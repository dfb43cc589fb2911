/* engine.c: the load itself: a few event-loop threads, each owning a share
 * of non-blocking keep-alive connections on its own epoll instance.
 *
 * No thread per connection: ten thousand open connections cost memory
 * (a few KiB each, most of it never touched) and one epoll registration,
 * not a stack. A thread never shares a connection, so the hot path takes no
 * lock; results are per thread and merged at the end.
 *
 * Closed loop: each connection sends its next request as soon as the
 * previous answer is in. Open loop (--rate): request k of a thread is due
 * at t0 + k * interval whether or not a connection is free; its latency is
 * counted from that scheduled time, so a stalled service shows up as the
 * queueing delay its buyers would have seen (no coordinated omission, as
 * in wrk2). Requests still unsent when the time is up are counted as
 * backlog, not dropped silently.
 *
 * Every order request carries who bought what, so the verifier can match
 * each 201 to an order row, and each transport error (sent, never answered)
 * is kept as a possible explanation for a row without a 201.
 *
 * Holds: a 201 of a product with holds is a reserved order, and its buyer
 * decides what to do with it: pay (the confirm the payment system would
 * send, with the admin token), cancel it (as the buyer), or abandon it.
 * Paying and cancelling come after a think time, so they go into the
 * thread's timer queue (timerq.c) and are sent, when due, on the next idle
 * connection, ahead of new orders; the loop never waits for them. When the
 * orders stop, the decisions still due are sent (the buyers are still
 * deciding), each at most the timeout late, then the threads end. Every
 * decision and its answer is recorded for the verifier. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"
#include "loadtest/engine/crowd_int.h"
#include "loadtest/engine/timerq.h"

#define READ_BUF (64 * 1024)
#define WBUF 1024
#define RING 1024                 /* recent keys a replay may pick from */
#define BODY_KEEP 1024            /* order answers are ~200 bytes */
#define TICK_US 50000             /* housekeeping: stop checks, timeouts */
#define CONNECT_RETRY_US 100000   /* after a refused connect */
#define MAX_EVENTS 256

typedef struct req_info {
    uint64_t key;
    uint32_t user;
    uint16_t qty;
    uint8_t replay;
    uint8_t action;               /* 0: an order; FL_PAY, FL_CANCEL: a decision on dec_id;
                                     A_CROWD: a crowd's buyer's request */
    uint8_t ticket;               /* a crowd's: a place or a poll, not an order */
    uint32_t crowd_i;             /* a crowd's: the buyer, in the thread's part */
} req_info;

#define A_CROWD 3                 /* beside FL_PAY and FL_CANCEL */
#define A_WARM 4                  /* a crowd's connection, before its start: GET /healthz */

typedef enum cstate { C_DOWN, C_CONNECTING, C_IDLE, C_BUSY } cstate;

typedef struct conn {
    int fd;
    cstate st;
    int want_out;                 /* EPOLLOUT is registered */
    int in_idle;                  /* on the worker's idle stack */
    int warm;                     /* a crowd's: the service answered on it before the start */
    const fl_target *t;
    int64_t start_us;             /* latency is measured from here */
    int64_t deadline_us;          /* answer (or connect) by then */
    int64_t retry_at_us;          /* C_DOWN: connect again from then */
    size_t wlen, woff;
    req_info req;
    fl_order_id dec_id;           /* the order a decision is about */
    fl_resp resp;
    char wbuf[WBUF];
} conn;

typedef struct worker {
    fl_engine *g;
    int id;
    pthread_t th;
    int epfd;
    conn *conns;
    int nconns;
    int *idle, nidle;             /* stack of idle connections */
    int *down, down_head, ndown;  /* FIFO of connections to (re)connect */
    int connecting, busy, open;
    int stopping;
    int64_t stop_at;              /* end of issuing (duration), 0: none */
    int64_t last_scan, scan_every;  /* timeouts are checked this often */
    double next_sched, interval;  /* open loop */
    fl_rng rng;
    fl_zipf zipf;
    uint64_t next_key;
    req_info ring[RING];
    unsigned ring_n, ring_pos;
    int64_t last_answer, last_created;
    fl_load_result r;             /* this thread's, merged at the end */
    size_t cap_created, cap_replayed, cap_lost, cap_decisions;
    fl_timerq due;                /* buyers' decisions not yet sent */
    int crowd_on;                 /* the load is a crowd (fl_crowd_opts) */
    fl_crowd_part crowd;             /* ...its buyers of this thread */
    int64_t crowd_t0;             /* ...its clock, once started (0: warming up) */
    /* Read by the progress caller. */
    atomic_uint_fast64_t l_answered, l_2xx, l_201, l_409, l_429, l_5xx, l_other, l_errors;
    atomic_uint_fast64_t l_shed;
    atomic_int l_open;
    atomic_int finished;
    pthread_mutex_t live_mu;
    fl_hist live;                 /* answers since the last progress call */
    char rbuf[READ_BUF];
} worker;

struct fl_engine {
    fl_load_opts o;
    worker *w;
    int nw;
    int64_t t0;
    int64_t t0_wall_ms;
    atomic_uint_fast64_t issued;
    atomic_int stop;
    atomic_int connected_ever;
    /* The last 201 of any worker, and the longest time between two 201s
     * (the sale stalled: a lease running out, a failover); the last
     * sold_out / insufficient_stock answer (a sale that ended, not one
     * that stalled: fl_load_finish counts the time after the last 201). */
    atomic_int_fast64_t last_201, max_gap_201, last_soldout;
    /* A crowd starts once every connection is open and has had an answer
     * (crowd_start): the first thread to see it sets crowd_t0. */
    atomic_int warmed, warmed_at_start;
    int all_conns;
    atomic_int_fast64_t crowd_t0;
    char get_req[FL_MAX_TARGETS][600];    /* GET mode: the same bytes every time */
    size_t get_len[FL_MAX_TARGETS];
};

void fl_load_opts_default(fl_load_opts *o) {
    memset(o, 0, sizeof *o);
    o->connections = 64;
    o->threads = 2;
    o->timeout_us = 10 * 1000000LL;
    o->goodput_us = 250000;
    o->late_us = 1000000;
    o->connect_burst = 256;
    o->users = 1000;
    o->qty_min = o->qty_max = 1;
}

void fl_key_string(const char *tag, uint64_t k, char *out, size_t len) {
    snprintf(out, len, "fl-%s-%llu", tag, (unsigned long long)k);
}

/* ------------------------------------------------------------- recording */

/* A 201 at now: the time since the previous one, of any worker, raises
 * the longest gap between two sales. */
static void sale_gap(fl_engine *g, int64_t now) {
    int64_t prev = atomic_exchange_explicit(&g->last_201, now, memory_order_relaxed);
    if (prev <= 0 || now <= prev) return;
    int64_t gap = now - prev, seen = atomic_load_explicit(&g->max_gap_201, memory_order_relaxed);
    while (gap > seen && !atomic_compare_exchange_weak_explicit(&g->max_gap_201, &seen, gap,
                                                               memory_order_relaxed,
                                                               memory_order_relaxed)) {}
}

static void *fl_engine_grow(void *arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return arr;
    size_t c = *cap ? *cap * 2 : 256;
    void *p = realloc(arr, c * elem);
    if (!p) return NULL;
    *cap = c;
    return p;
}

static void count_code(fl_load_result *r, const char *code) {
    for (size_t i = 0; i < r->ncodes; i++)
        if (!strcmp(r->codes[i].code, code)) {
            r->codes[i].n++;
            return;
        }
    size_t max = sizeof r->codes / sizeof r->codes[0];
    size_t i = r->ncodes < max ? r->ncodes++ : max - 1;   /* the last slot takes the rest */
    if (i == max - 1 && r->codes[i].n) snprintf(r->codes[i].code, sizeof r->codes[i].code, "other");
    else snprintf(r->codes[i].code, sizeof r->codes[i].code, "%.39s", code);
    r->codes[i].n++;
}

static void push_order(worker *w, fl_order_rec **arr, size_t *n, size_t *cap, const conn *c,
                       const char *id) {
    fl_order_rec *a = fl_engine_grow(*arr, cap, *n, sizeof **arr);
    if (!a) return;               /* out of memory: the verifier will see a mismatch */
    *arr = a;
    fl_order_rec *o = &a[(*n)++];
    snprintf(o->order_id, sizeof o->order_id, "%s", id);
    o->qty = c->req.qty;
    o->user = c->req.user;
    o->key = c->req.key;
    (void)w;
}

/* Appends a decision on order id with status (0: sent, no answer; -1:
 * never sent). NULL when out of memory: the verifier then sees a hold end
 * it cannot explain. */
static fl_decision_rec *push_decision(worker *w, const char *id, int action, uint32_t user,
                                      uint16_t qty, int status) {
    fl_decision_rec *a =
        fl_engine_grow(w->r.decisions, &w->cap_decisions, w->r.ndecisions, sizeof *a);
    if (!a) return NULL;
    w->r.decisions = a;
    fl_decision_rec *d = &a[w->r.ndecisions++];
    memset(d, 0, sizeof *d);
    snprintf(d->order_id, sizeof d->order_id, "%s", id);
    d->action = (uint8_t)action;
    d->user = user;
    d->qty = qty;
    d->status = (int16_t)status;
    d->decided_ms = d->expires_ms = -1;
    return d;
}

/* A confirm or cancel was answered: records what the answer says (a 200's
 * times, a refusal's code). */
static void record_decision(worker *w, conn *c, int64_t now) {
    const fl_resp *rs = &c->resp;
    const char *body = rs->body ? rs->body : "";
    int st = rs->status < 600 ? rs->status : 599;
    fl_hist_record(&w->r.decision_hist, now > c->start_us ? (uint64_t)(now - c->start_us) : 0);
    fl_decision_rec *d = push_decision(w, c->dec_id, c->req.action, c->req.user, c->req.qty, st);
    if (!d) return;
    if (st == 200) {
        d->decided_ms = fl_json_time_ms(body, rs->body_len,
                                        c->req.action == FL_PAY ? "confirmed_at" : "cancelled_at");
        d->expires_ms = fl_json_time_ms(body, rs->body_len, "expires_at");
    } else if (fl_json_str(body, rs->body_len, "error", d->code, sizeof d->code) < 0) {
        snprintf(d->code, sizeof d->code, "http_%d", st);
    }
}

/* The buyer of a new hold decides what to do with it: an abandon is
 * recorded at once, a payment or a cancel is queued for when the buyer
 * has thought it over. */
static void schedule_decision(worker *w, const conn *c, const char *id, int64_t now) {
    const fl_load_opts *o = &w->g->o;
    if (o->hold_seconds <= 0 || !id[0]) return;
    int action = fl_decide(&w->rng, o->pay, o->cancel);
    if (action == FL_ABANDON) {
        push_decision(w, id, FL_ABANDON, c->req.user, c->req.qty, -1);
        return;
    }
    fl_due d = { .at = now + fl_think_us(&w->rng, o->hold_seconds), .action = (uint8_t)action,
                 .qty = c->req.qty, .user = c->req.user };
    size_t idlen = strlen(id);
    if (idlen >= sizeof d.order_id) {        /* not an order id (26 characters): no decision */
        push_decision(w, id, FL_ABANDON, c->req.user, c->req.qty, -1);
        return;
    }
    memcpy(d.order_id, id, idlen + 1);
    if (fl_timerq_push(&w->due, &d)) push_decision(w, id, action, d.user, d.qty, -1);
}

static void record_order_answer(worker *w, conn *c, int64_t now);

/* A whole answer: counted, and told to whoever asked (a crowd's buyer, a
 * buyer's decision). */
static void record_answer(worker *w, conn *c, int64_t now) {
    if (c->req.action == A_WARM) {        /* not a buyer's: counted nowhere */
        c->warm = 1;
        atomic_fetch_add_explicit(&w->g->warmed, 1, memory_order_relaxed);
        return;
    }
    if (c->req.action == A_CROWD) {
        /* A place's answer counts as an answer, never as an order. */
        if (!c->req.ticket) record_order_answer(w, c, now);
        else w->r.answered++, w->last_answer = now;
        fl_crowd_answer(&w->crowd, c->req.crowd_i, &c->resp, now);
        return;
    }
    if (c->req.action) {
        record_decision(w, c, now);
        return;
    }
    record_order_answer(w, c, now);
}

static void record_order_answer(worker *w, conn *c, int64_t now) {
    const fl_resp *rs = &c->resp;
    fl_load_result *r = &w->r;
    uint64_t lat = now > c->start_us ? (uint64_t)(now - c->start_us) : 0;
    int st = rs->status < 600 ? rs->status : 599;
    fl_hist_record(&r->hist, lat);
    pthread_mutex_lock(&w->live_mu);
    fl_hist_record(&w->live, lat);
    pthread_mutex_unlock(&w->live_mu);
    r->answered++;
    r->status[st]++;
    if (st == 201 && lat <= (uint64_t)w->g->o.goodput_us) r->good++;
    if (lat > (uint64_t)w->g->o.late_us) r->late++;
    w->last_answer = now;
    atomic_fetch_add_explicit(&w->l_answered, 1, memory_order_relaxed);
    if (st >= 200 && st < 300) atomic_fetch_add_explicit(&w->l_2xx, 1, memory_order_relaxed);
    if (st == 201) atomic_fetch_add_explicit(&w->l_201, 1, memory_order_relaxed);
    else if (st == 409) atomic_fetch_add_explicit(&w->l_409, 1, memory_order_relaxed);
    else if (st == 429) atomic_fetch_add_explicit(&w->l_429, 1, memory_order_relaxed);
    else if (st >= 500) atomic_fetch_add_explicit(&w->l_5xx, 1, memory_order_relaxed);
    else if (st >= 300) atomic_fetch_add_explicit(&w->l_other, 1, memory_order_relaxed);
    if (w->g->o.get_path) return;
    char buf[64];
    if (st == 201 || (st == 200 && rs->replayed)) {
        if (fl_json_str(rs->body ? rs->body : "", rs->body_len, "order_id", buf, sizeof buf) < 0)
            buf[0] = '\0';
        if (st == 201) {
            push_order(w, &r->created, &r->ncreated, &w->cap_created, c, buf);
            w->last_created = now;
            sale_gap(w->g, now);
            schedule_decision(w, c, buf, now);
        } else push_order(w, &r->replayed, &r->nreplayed, &w->cap_replayed, c, buf);
    } else if (st >= 400) {
        if (fl_json_str(rs->body ? rs->body : "", rs->body_len, "error", buf, sizeof buf) < 0)
            snprintf(buf, sizeof buf, "http_%d", st);
        /* Shed at the door: the service keeping its latency, nothing taken;
         * counted apart, not as an error. */
        if (st == 503 && !strcmp(buf, "overloaded")) {
            r->shed++;
            atomic_fetch_add_explicit(&w->l_shed, 1, memory_order_relaxed);
            return;
        }
        count_code(r, buf);
        if (st == 409 && (!strcmp(buf, "sold_out") || !strcmp(buf, "insufficient_stock"))) {
            int64_t seen = atomic_load_explicit(&w->g->last_soldout, memory_order_relaxed);
            while (now > seen &&
                   !atomic_compare_exchange_weak_explicit(&w->g->last_soldout, &seen, now,
                                                          memory_order_relaxed,
                                                          memory_order_relaxed)) {}
        }
        /* The fence's refusal shares lock_timeout's code; its message tells. */
        if (st == 429 && rs->body && memmem(rs->body, rs->body_len, "(fenced)", 8)) r->fenced++;
    }
}

/* -------------------------------------------------------------- requests */

static req_info pick(worker *w) {
    const fl_load_opts *o = &w->g->o;
    req_info q = { FL_NO_KEY, 0, 1, 0, 0, 0, 0 };
    if (o->get_path) return q;
    if (o->idem && o->retry > 0 && w->ring_n && fl_rng_unit(&w->rng) < o->retry) {
        q = w->ring[fl_rng_below(&w->rng, w->ring_n)];
        q.replay = 1;
        w->r.replays_sent++;
        return q;
    }
    q.user = o->zipf_s > 0 ? (uint32_t)(fl_zipf_next(&w->zipf, &w->rng) - 1)
                           : (uint32_t)fl_rng_below(&w->rng, o->users);
    q.qty = (uint16_t)(o->qty_min +
                       (o->qty_max > o->qty_min
                            ? (int)fl_rng_below(&w->rng, (uint64_t)(o->qty_max - o->qty_min + 1))
                            : 0));
    if (o->idem) {
        q.key = w->next_key++ * (uint64_t)w->g->nw + (uint64_t)w->id;
        w->ring[w->ring_pos] = q;
        w->ring_pos = (w->ring_pos + 1) % RING;
        if (w->ring_n < RING) w->ring_n++;
    }
    return q;
}

/* Writes the request's bytes into c->wbuf. */
static void build(worker *w, conn *c) {
    const fl_load_opts *o = &w->g->o;
    if (o->get_path) {
        int ti = (int)(c->t - o->targets);
        c->wlen = w->g->get_len[ti];
        memcpy(c->wbuf, w->g->get_req[ti], c->wlen);
        return;
    }
    char body[160], key[96] = "";
    int bl = snprintf(body, sizeof body, "{\"sku\":\"%s\",\"user_id\":\"u%u\",\"quantity\":%u}",
                      o->sku, c->req.user, (unsigned)c->req.qty);
    if (c->req.key != FL_NO_KEY) {
        char k[64];
        fl_key_string(o->key_tag, c->req.key, k, sizeof k);
        snprintf(key, sizeof key, "Idempotency-Key: %s\r\n", k);
    }
    int n = snprintf(c->wbuf, sizeof c->wbuf,
                     "POST /v1/orders HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\n%s\r\n%s",
                     c->t->hostport, bl, key, body);
    assert(n > 0 && (size_t)n < sizeof c->wbuf);
    c->wlen = (size_t)n;
}

/* Writes a decision's request into c->wbuf: a confirm, as the payment
 * system sends it (the admin token; the payment_ref names the order), or
 * a cancel by the buyer. */
static void build_decision(worker *w, conn *c) {
    const fl_load_opts *o = &w->g->o;
    char body[96], auth[300] = "";
    int bl;
    if (c->req.action == FL_PAY) {
        bl = snprintf(body, sizeof body, "{\"payment_ref\":\"pay-%s\"}", c->dec_id);
        if (o->token[0]) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", o->token);
    } else {
        bl = snprintf(body, sizeof body, "{\"user_id\":\"u%u\"}", c->req.user);
    }
    int n = snprintf(c->wbuf, sizeof c->wbuf,
                     "POST /v1/orders/%s/%s HTTP/1.1\r\nHost: %s\r\n%s"
                     "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                     c->dec_id, c->req.action == FL_PAY ? "confirm" : "cancel", c->t->hostport,
                     auth, bl, body);
    assert(n > 0 && (size_t)n < sizeof c->wbuf);
    c->wlen = (size_t)n;
}

/* ----------------------------------------------------------- connections */

static void set_events(worker *w, conn *c, int out) {
    if (c->want_out == out) return;
    struct epoll_event ev = { .events = EPOLLIN | (out ? EPOLLOUT : 0),
                              .data.u32 = (uint32_t)(c - w->conns) };
    epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = out;
}

static void push_down(worker *w, conn *c, int64_t retry_at) {
    c->st = C_DOWN;
    c->retry_at_us = retry_at;
    assert(w->ndown < w->nconns);
    w->down[(w->down_head + w->ndown) % w->nconns] = (int)(c - w->conns);
    w->ndown++;
}

/* Closes c and queues it for a new connection. A request in flight becomes
 * a transport error (and, if any byte went out, a possible order). */
static void conn_close(worker *w, conn *c, int64_t now, int failed_request, int timed_out) {
    if (c->st == C_BUSY) {
        w->busy--;
        if (c->req.action == A_CROWD && failed_request) {
            /* Unanswered, the buyer tries again. */
            fl_crowd_lost(&w->crowd, c->req.crowd_i, now);
            if (c->req.ticket) w->r.transport_errors++;
        }
        if (c->req.action == A_WARM) {
            /* Nobody's request: the connection opens again and warms up. */
        } else if (failed_request && c->req.action && c->req.action != A_CROWD) {
            push_decision(w, c->dec_id, c->req.action, c->req.user, c->req.qty, 0);
        } else if (failed_request && !(c->req.action == A_CROWD && c->req.ticket)) {
            w->r.transport_errors++;
            if (timed_out) w->r.timeouts++;
            atomic_fetch_add_explicit(&w->l_errors, 1, memory_order_relaxed);
            if (c->woff > 0 && !w->g->o.get_path) {
                fl_lost_rec *a = fl_engine_grow(w->r.lost, &w->cap_lost, w->r.nlost, sizeof *a);
                if (a) {
                    w->r.lost = a;
                    a[w->r.nlost++] = (fl_lost_rec){ c->req.user, c->req.qty, c->req.key };
                }
            }
        }
    }
    if (c->st == C_CONNECTING) w->connecting--;
    if (c->st == C_IDLE || c->st == C_BUSY) {
        w->open--;
        atomic_store_explicit(&w->l_open, w->open, memory_order_relaxed);
    }
    if (c->fd >= 0) close(c->fd);     /* also removes it from epoll */
    c->fd = -1;
    c->want_out = 0;
    push_down(w, c, now);
}

/* Each connection is on the idle stack at most once; an entry whose
 * connection has since closed is skipped when popped. */
static void push_idle(worker *w, conn *c) {
    if (c->in_idle) return;
    c->in_idle = 1;
    w->idle[w->nidle++] = (int)(c - w->conns);
}

/* The next idle connection, or NULL. */
static conn *pop_idle(worker *w) {
    while (w->nidle) {
        conn *c = &w->conns[w->idle[--w->nidle]];
        c->in_idle = 0;
        if (c->st == C_IDLE) return c;
    }
    return NULL;
}

static void send_request(worker *w, conn *c, int64_t start, int64_t now);

static void conn_ready(worker *w, conn *c, int64_t now) {
    c->st = C_IDLE;
    w->open++;
    if (w->open > w->r.max_open) w->r.max_open = w->open;
    atomic_store_explicit(&w->l_open, w->open, memory_order_relaxed);
    atomic_store_explicit(&w->g->connected_ever, 1, memory_order_relaxed);
    if (w->crowd_on && !w->crowd_t0 && !c->warm) {
        /* Before a crowd's start, each connection has one answer of the
         * service: a connection still in its listen queue when buyers
         * arrive would hold a buyer's request there while requests on
         * the connections it took go first, and the service would see
         * the buyers out of their order (docs/waiting-room.md, "The
         * crowd's connections"). */
        int n = snprintf(c->wbuf, sizeof c->wbuf, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n",
                         c->t->hostport);
        assert(n > 0 && (size_t)n < sizeof c->wbuf);
        c->wlen = (size_t)n;
        c->req = (req_info){ FL_NO_KEY, 0, 0, 0, A_WARM, 0, 0 };
        send_request(w, c, now, now);
        return;
    }
    push_idle(w, c);
}

static void conn_start(worker *w, conn *c, int64_t now) {
    int fd = socket(c->t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        w->r.connect_errors++;
        push_down(w, c, now + CONNECT_RETRY_US);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->want_out = 1;
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)(c - w->conns) };
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(fd);
        c->fd = -1;
        w->r.connect_errors++;
        push_down(w, c, now + CONNECT_RETRY_US);
        return;
    }
    int rc = connect(fd, (const struct sockaddr *)&c->t->addr, c->t->addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
        close(fd);
        c->fd = -1;
        w->r.connect_errors++;
        push_down(w, c, now + CONNECT_RETRY_US);
        return;
    }
    c->st = C_CONNECTING;
    c->deadline_us = now + w->g->o.timeout_us;
    w->connecting++;
}

static void on_connected(worker *w, conn *c, int64_t now) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        w->r.connect_errors++;
        w->connecting--;
        close(c->fd);
        c->fd = -1;
        push_down(w, c, now + CONNECT_RETRY_US);
        return;
    }
    w->connecting--;
    set_events(w, c, 0);
    conn_ready(w, c, now);
}

static void start_connects(worker *w, int64_t now) {
    while (w->ndown && w->connecting < w->g->o.connect_burst) {
        conn *c = &w->conns[w->down[w->down_head]];
        if (c->retry_at_us > now) break;           /* FIFO: later ones are later still */
        w->down_head = (w->down_head + 1) % w->nconns;
        w->ndown--;
        conn_start(w, c, now);
    }
}

/* Sends what is left of c's request. */
static void conn_flush(worker *w, conn *c, int64_t now) {
    while (c->woff < c->wlen) {
        ssize_t n = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
        if (n > 0) {
            if (c->woff == 0) w->r.sent++;
            c->woff += (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            set_events(w, c, 1);
            return;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            conn_close(w, c, now, 1, 0);
            return;
        }
    }
    set_events(w, c, 0);
}

/* Whether another request may be issued (takes one from the budget). */
static int take_budget(worker *w, int64_t now) {
    if (w->stopping) return 0;
    if (w->g->o.rate <= 0 && w->stop_at && now >= w->stop_at) return 0;   /* time is up */
    uint64_t max = w->g->o.requests;
    if (max && atomic_fetch_add(&w->g->issued, 1) >= max) {
        w->stopping = 1;
        return 0;
    }
    return 1;
}

/* Puts the request built in c on the wire; its latency counts from start. */
static void send_request(worker *w, conn *c, int64_t start, int64_t now) {
    c->st = C_BUSY;
    c->woff = 0;
    c->start_us = start;
    c->deadline_us = now + w->g->o.timeout_us;
    fl_resp_reset(&c->resp);
    w->busy++;
    conn_flush(w, c, now);
}

/* Sends the next order on the idle connection c. */
static void issue(worker *w, conn *c, int64_t start, int64_t now) {
    assert(c->st == C_IDLE);
    c->req = pick(w);
    build(w, c);
    send_request(w, c, start, now);
}

/* Sends decision d on the idle connection c. */
static void issue_decision(worker *w, conn *c, const fl_due *d, int64_t now) {
    assert(c->st == C_IDLE);
    c->req = (req_info){ FL_NO_KEY, d->user, d->qty, 0, d->action, 0, 0 };
    memcpy(c->dec_id, d->order_id, sizeof c->dec_id);
    build_decision(w, c);
    send_request(w, c, now, now);
}

/* Sends crowd buyer i's next request on the idle connection c. */
static void issue_buyer(worker *w, conn *c, uint32_t i, int64_t now) {
    assert(c->st == C_IDLE);
    const fl_crowd_buyer *b = &w->crowd.b[i];
    /* Places and polls are not orders: never counted or verified as one. */
    c->req = (req_info){ FL_NO_KEY, b->idx, 1, 0, A_CROWD, b->phase != FL_CROWD_ORDER, i };
    c->wlen = fl_crowd_build(&w->crowd, i, w->g->o.sku, c->t->hostport, c->wbuf, sizeof c->wbuf,
                             now);
    send_request(w, c, now, now);
}

/* Sends the crowd's buyers that are due, each on an idle connection. */
static void dispatch_crowd(worker *w, int64_t now) {
    while (w->nidle && fl_crowd_next_at(&w->crowd) <= now) {
        conn *c = pop_idle(w);
        if (!c) return;
        issue_buyer(w, c, fl_crowd_pop(&w->crowd), now);
    }
}

/* Whether a decision is due now. */
static int decision_due(const worker *w, int64_t now) {
    const fl_due *d = fl_timerq_peek(&w->due);
    return d && d->at <= now;
}

/* A whole answer is in: record it, then reuse or replace the connection. */
static void on_answer(worker *w, conn *c, int64_t now) {
    record_answer(w, c, now);
    if (!c->resp.keep_alive) {
        conn_close(w, c, now, 0, 0);
        return;
    }
    w->busy--;
    c->st = C_IDLE;
    if (w->crowd_on) {
        if (!w->stopping && fl_crowd_next_at(&w->crowd) <= now)
            issue_buyer(w, c, fl_crowd_pop(&w->crowd), now);
        else push_idle(w, c);
        return;
    }
    if (decision_due(w, now)) {     /* a buyer's decision goes first */
        fl_due d;
        fl_timerq_pop(&w->due, &d);
        issue_decision(w, c, &d, now);
        return;
    }
    if (w->g->o.rate <= 0 && take_budget(w, now)) {
        issue(w, c, now, now);     /* closed loop: straight on */
        return;
    }
    push_idle(w, c);
}

static void on_readable(worker *w, conn *c, int64_t now) {
    for (;;) {
        ssize_t n = recv(c->fd, w->rbuf, sizeof w->rbuf, 0);
        if (n < 0) {
            if (errno == EAGAIN) return;
            if (errno == EINTR) continue;
            conn_close(w, c, now, 1, 0);
            return;
        }
        if (n == 0) {                  /* the peer closed */
            if (c->st == C_BUSY && fl_resp_eof(&c->resp) == FL_RESP_DONE) {
                record_answer(w, c, now);
                conn_close(w, c, now, 0, 0);
            } else {
                conn_close(w, c, now, c->st == C_BUSY, 0);
            }
            return;
        }
        if (c->st != C_BUSY) {         /* bytes nobody asked for */
            conn_close(w, c, now, 0, 0);
            return;
        }
        size_t used;
        int rc = fl_resp_feed(&c->resp, w->rbuf, (size_t)n, &used);
        if (rc == FL_RESP_ERROR || (rc == FL_RESP_DONE && used < (size_t)n)) {
            conn_close(w, c, now, 1, 0);
            return;
        }
        if (rc == FL_RESP_DONE) {
            on_answer(w, c, now);
            return;
        }
        if ((size_t)n < sizeof w->rbuf) return;
    }
}

static void on_event(worker *w, uint32_t idx, uint32_t events, int64_t now) {
    conn *c = &w->conns[idx];
    if (c->fd < 0) return;
    if (c->st == C_CONNECTING) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) on_connected(w, c, now);
        return;
    }
    if ((events & EPOLLOUT) && c->st == C_BUSY && c->woff < c->wlen) conn_flush(w, c, now);
    if (c->fd >= 0 && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) on_readable(w, c, now);
}

/* --------------------------------------------------------------- the loop */

/* Sends what is due: every idle connection (closed loop), or the requests
 * whose scheduled time has come (open loop). */
static void fl_engine_dispatch(worker *w, int64_t now) {
    if (w->crowd_on) {
        dispatch_crowd(w, now);
        return;
    }
    if (w->g->o.rate <= 0) {
        while (w->nidle) {
            conn *c = pop_idle(w);
            if (!c) break;
            if (!take_budget(w, now)) {
                push_idle(w, c);
                break;
            }
            issue(w, c, now, now);
        }
        return;
    }
    /* The schedule is [t0, stop_at): a request due before the end is still
     * sent if it is late, with its latency counted from when it was due. */
    while (w->nidle && w->next_sched <= (double)now) {
        if (w->stop_at && w->next_sched >= (double)w->stop_at) break;
        conn *c = pop_idle(w);
        if (!c) break;
        if (!take_budget(w, now)) {
            push_idle(w, c);
            break;
        }
        issue(w, c, (int64_t)w->next_sched, now);
        w->next_sched += w->interval;
    }
}

/* Sends the decisions that are due, each on an idle connection, ahead of
 * new orders. One that found no connection within the timeout of its time
 * is given up, recorded as never sent (its hold then expires). */
static void dispatch_decisions(worker *w, int64_t now) {
    const fl_due *top;
    while ((top = fl_timerq_peek(&w->due)) && top->at <= now) {
        fl_due d;
        if (now - top->at > w->g->o.timeout_us) {
            fl_timerq_pop(&w->due, &d);
            push_decision(w, d.order_id, d.action, d.user, d.qty, -1);
            continue;
        }
        conn *c = pop_idle(w);
        if (!c) return;
        fl_timerq_pop(&w->due, &d);
        issue_decision(w, c, &d, now);
    }
}

/* The load was stopped: the decisions not yet sent never will be. */
static void drop_decisions(worker *w) {
    while (w->due.n) {
        fl_due d;
        fl_timerq_pop(&w->due, &d);
        push_decision(w, d.order_id, d.action, d.user, d.qty, -1);
    }
}

/* Fails requests and connects that have waited longer than the timeout. */
static void scan_timeouts(worker *w, int64_t now) {
    for (int i = 0; i < w->nconns; i++) {
        conn *c = &w->conns[i];
        if ((c->st == C_BUSY || c->st == C_CONNECTING) && now > c->deadline_us) {
            if (c->st == C_CONNECTING) w->r.connect_errors++;
            conn_close(w, c, now, c->st == C_BUSY, 1);
        }
    }
}

static void update_stopping(worker *w, int64_t now) {
    if (w->stopping) return;
    if (atomic_load(&w->g->stop) || (w->stop_at && now >= w->stop_at)) w->stopping = 1;
    if (w->crowd_on && w->crowd_t0 && w->crowd.done == w->crowd.n)
        w->stopping = 1;                  /* every buyer answered */
}

/* How long epoll may sleep, in microseconds. */
static int64_t fl_engine_wait_for(worker *w, int64_t now) {
    int64_t t = w->busy || w->connecting ? w->scan_every : TICK_US;
    const fl_due *d = fl_timerq_peek(&w->due);
    if (d && w->nidle && d->at - now < t) t = d->at - now;
    if (!w->stopping) {
        if (w->crowd_on && !w->crowd_t0 && t > 1000) t = 1000;   /* the start is near */
        if (w->crowd_on && w->nidle && fl_crowd_next_at(&w->crowd) - now < t)
            t = fl_crowd_next_at(&w->crowd) - now;
        if (w->stop_at && w->stop_at - now < t) t = w->stop_at - now;
        if (w->g->o.rate > 0 && w->nidle && (int64_t)w->next_sched - now < t)
            t = (int64_t)w->next_sched - now;
    }
    if ((!w->stopping || d) && w->ndown && w->connecting < w->g->o.connect_burst) {
        int64_t r = w->conns[w->down[w->down_head]].retry_at_us - now;
        if (r < t) t = r;
    }
    return t < 0 ? 0 : t;
}

static int wait_events(worker *w, struct epoll_event *ev, int64_t us) {
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    int n = epoll_pwait2(w->epfd, ev, MAX_EVENTS, &ts, NULL);
    if (n < 0 && errno == ENOSYS) n = epoll_wait(w->epfd, ev, MAX_EVENTS, (int)((us + 999) / 1000));
    return n;
}

static void count_backlog(worker *w) {
    if (w->g->o.rate <= 0 || !w->stop_at) return;
    double end = (double)w->stop_at;
    if (w->next_sched < end) w->r.backlog += (uint64_t)ceil((end - w->next_sched) / w->interval);
}

/* Starts the crowd's clock once every connection of the run has had its
 * answer, or the timeout after the run's start has passed (then with the
 * connections that have: the others' buyers may be late, and say so in
 * their send lag). */
static void crowd_start(worker *w, int64_t now) {
    fl_engine *g = w->g;
    int_fast64_t t0 = atomic_load(&g->crowd_t0);
    if (!t0 && (atomic_load(&g->warmed) >= g->all_conns || now - g->t0 >= g->o.timeout_us)) {
        int_fast64_t none = 0;
        if (atomic_compare_exchange_strong(&g->crowd_t0, &none, now)) {
            t0 = now;
            atomic_store(&g->warmed_at_start, atomic_load(&g->warmed));
        } else {
            t0 = none;
        }
    }
    if (!t0) return;
    w->crowd_t0 = t0;
    fl_crowd_part_start(&w->crowd, t0);
}

static void *fl_engine_worker(void *arg) {
    worker *w = arg;
    struct epoll_event ev[MAX_EVENTS];
    int64_t hard_end = 0;
    for (;;) {
        int64_t now = clock_mono_us();
        if (!w->stopping || w->due.n) start_connects(w, now);
        if (w->crowd_on && !w->crowd_t0) crowd_start(w, now);
        dispatch_decisions(w, now);
        /* First: what fell due before the end goes out. */
        if (!w->stopping) fl_engine_dispatch(w, now);
        update_stopping(w, now);
        if (w->stopping && atomic_load(&w->g->stop)) drop_decisions(w);
        if (w->stopping && !w->due.n) {       /* no order to send, no buyer still deciding */
            if (!hard_end) {
                hard_end = now + w->g->o.timeout_us + 1000000;
                count_backlog(w);
            }
            if (w->busy == 0 || now > hard_end) break;
        }
        if (now - w->last_scan >= w->scan_every) {
            scan_timeouts(w, now);
            w->last_scan = now;
        }
        int n = wait_events(w, ev, fl_engine_wait_for(w, now));
        now = clock_mono_us();
        for (int i = 0; i < n; i++) on_event(w, ev[i].data.u32, ev[i].events, now);
    }
    int64_t now = clock_mono_us();
    for (int i = 0; i < w->nconns; i++)
        if (w->conns[i].fd >= 0) conn_close(w, &w->conns[i], now, 1, 1);
    if (w->crowd_on && w->crowd_t0 &&
        fl_crowd_records(&w->crowd, w->crowd_t0, &w->r.buyers, &w->r.nbuyers) != 0)
        w->r.nbuyers = 0;             /* out of memory: no figures, said by the caller */
    atomic_store(&w->finished, 1);
    return NULL;
}

/* ----------------------------------------------------------------- set-up */

static int fl_engine_raise_fd_limit(int want, fl_err *e) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    if (rl.rlim_cur >= (rlim_t)want) return 0;
    rl.rlim_cur = rl.rlim_max < (rlim_t)want ? rl.rlim_max : (rlim_t)want;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)want)
        return fl_errf(e, "the open-file limit (%llu) is too low for %d connections; "
                          "raise it with ulimit -n",
                       (unsigned long long)rl.rlim_cur, want - 64);
    return 0;
}

/* Every connection of a run: a crowd's kept for its waiting ones too. */
static int all_connections(const fl_load_opts *o) {
    return o->connections + (o->crowd.buyers ? o->crowd.hold : 0);
}

static void worker_free(worker *w) {
    if (w->epfd > 0) close(w->epfd);
    if (w->conns)
        for (int i = 0; i < w->nconns; i++) fl_resp_free(&w->conns[i].resp);
    free(w->conns);
    free(w->idle);
    free(w->down);
    fl_timerq_free(&w->due);
    if (w->crowd_on) fl_crowd_part_free(&w->crowd);
    fl_load_result_free(&w->r);
    pthread_mutex_destroy(&w->live_mu);
}

static int worker_init(fl_engine *g, worker *w, int id, fl_err *e) {
    const fl_load_opts *o = &g->o;
    w->g = g;
    w->id = id;
    pthread_mutex_init(&w->live_mu, NULL);
    fl_hist_reset(&w->live);
    fl_hist_reset(&w->r.hist);
    fl_hist_reset(&w->r.decision_hist);
    int all = all_connections(o);
    w->nconns = all / g->nw + (id < all % g->nw);
    w->conns = calloc((size_t)w->nconns, sizeof *w->conns);
    w->idle = calloc((size_t)w->nconns, sizeof *w->idle);
    w->down = calloc((size_t)w->nconns, sizeof *w->down);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (!w->conns || !w->idle || !w->down || w->epfd < 0)
        return fl_errf(e, "cannot set up %d connections: out of memory", w->nconns);
    for (int i = 0; i < w->nconns; i++) {
        conn *c = &w->conns[i];
        c->fd = -1;
        c->t = &o->targets[(i * g->nw + id) % o->ntargets];
        fl_resp_init(&c->resp, BODY_KEEP);
        push_down(w, c, 0);
    }
    fl_rng_seed(&w->rng, o->seed * 1000003u + (uint64_t)id * 7919u + 1);
    if (o->zipf_s > 0) fl_zipf_init(&w->zipf, o->users, o->zipf_s);
    if (o->rate > 0) {
        w->interval = 1e6 / (o->rate / g->nw);
        w->next_sched = (double)g->t0 + w->interval * id / g->nw;
    }
    w->stop_at = o->duration_us ? g->t0 + o->duration_us : 0;
    if (o->crowd.buyers) {
        int hold = o->crowd.hold / g->nw + (id < o->crowd.hold % g->nw);
        if (fl_crowd_part_init(&w->crowd, &g->o.crowd, id, g->nw, o->seed, w->nconns, hold))
            return fl_errf(e, "cannot set up %u buyers: out of memory", o->crowd.buyers);
        if (w->crowd.poll_max_ms > o->timeout_us / 2000) w->crowd.poll_max_ms = (int)(o->timeout_us / 2000);
        w->crowd_on = 1;
    }
    /* A timeout is noticed within a quarter of itself (and 50 ms at most). */
    w->scan_every = o->timeout_us / 4;
    if (w->scan_every > TICK_US) w->scan_every = TICK_US;
    if (w->scan_every < 1000) w->scan_every = 1000;
    return 0;
}

static int check_opts(const fl_load_opts *o, fl_err *e) {
    if (o->ntargets < 1) return fl_errf(e, "no target");
    if (o->connections < 1) return fl_errf(e, "--connections must be at least 1");
    if (o->threads < 1 || o->threads > 64) return fl_errf(e, "--threads must be 1..64");
    if (!o->get_path && (!o->sku || !o->sku[0])) return fl_errf(e, "no SKU");
    if (!o->get_path && (o->users < 1)) return fl_errf(e, "--users must be at least 1");
    if (!o->get_path && (o->qty_min < 1 || o->qty_max < o->qty_min || o->qty_max > 1000))
        return fl_errf(e, "--quantity must be within 1..1000");
    if (!o->duration_us && !o->requests) return fl_errf(e, "give --duration or --requests");
    if (o->crowd.buyers && (o->rate > 0 || o->idem || o->hold_seconds || o->crowd.impatient < 0 ||
                            o->crowd.impatient > 1 || o->crowd.ramp_us < 0))
        return fl_errf(e, "a crowd (--crowd) is its own load: not with --rate, --idem or holds; "
                       "--impatient is a share, 0..1");
    if (o->crowd.buyers && o->crowd.hold > 0 && o->connections < o->threads)
        return fl_errf(e, "--crowd-hold needs --connections at least --threads: each thread "
                       "keeps one for the answers at once");
    if (o->rate < 0) return fl_errf(e, "--rate must be positive");
    if (o->pay < 0 || o->cancel < 0 || o->pay + o->cancel > 1)
        return fl_errf(e, "--pay and --cancel are shares: each 0..1, together at most 1");
    return 0;
}

fl_engine *fl_engine_start(const fl_load_opts *o, fl_err *e) {
    if (check_opts(o, e)) return NULL;
    if (fl_engine_raise_fd_limit(all_connections(o) + 64, e)) return NULL;
    fl_engine *g = calloc(1, sizeof *g);
    if (!g) {
        fl_errf(e, "out of memory");
        return NULL;
    }
    g->o = *o;
    if (g->o.connect_burst < 1) g->o.connect_burst = 256;
    if (g->o.timeout_us <= 0) g->o.timeout_us = 10000000;
    g->nw = o->threads < o->connections ? o->threads : o->connections;
    g->all_conns = all_connections(o);
    g->t0 = clock_mono_us();
    g->t0_wall_ms = clock_wall_ms();
    for (int i = 0; i < o->ntargets && o->get_path; i++) {
        int n = snprintf(g->get_req[i], sizeof g->get_req[i], "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n",
                         o->get_path, o->targets[i].hostport);
        g->get_len[i] = n > 0 && (size_t)n < sizeof g->get_req[i] ? (size_t)n : 0;
    }
    g->w = calloc((size_t)g->nw, sizeof *g->w);
    if (!g->w) goto err_mem;
    for (int i = 0; i < g->nw; i++)
        if (worker_init(g, &g->w[i], i, e)) goto err;
    for (int i = 0; i < g->nw; i++) {
        if (pthread_create(&g->w[i].th, NULL, fl_engine_worker, &g->w[i]) != 0) {
            fl_errf(e, "cannot start a thread");
            atomic_store(&g->stop, 1);
            for (int j = 0; j < i; j++) pthread_join(g->w[j].th, NULL);
            goto err;
        }
        char name[16];
        snprintf(name, sizeof name, "flashload-%d", (i & 63));
        pthread_setname_np(g->w[i].th, name);
    }
    return g;
err_mem:
    fl_errf(e, "out of memory");
err:
    for (int i = 0; g->w && i < g->nw; i++) worker_free(&g->w[i]);
    free(g->w);
    free(g);
    return NULL;
}

void fl_engine_stop(fl_engine *g) { atomic_store(&g->stop, 1); }

int fl_engine_connected(fl_engine *g) { return atomic_load(&g->connected_ever); }

int fl_engine_finished(fl_engine *g) {
    for (int i = 0; i < g->nw; i++)
        if (!atomic_load(&g->w[i].finished)) return 0;
    return 1;
}

void fl_engine_progress(fl_engine *g, fl_progress *p) {
    fl_hist *h = malloc(sizeof *h);   /* 9 KiB: not on the caller's stack */
    memset(p, 0, sizeof *p);
    p->elapsed_us = clock_mono_us() - g->t0;
    if (h) fl_hist_reset(h);
    for (int i = 0; i < g->nw; i++) {
        worker *w = &g->w[i];
        p->answered += atomic_load_explicit(&w->l_answered, memory_order_relaxed);
        p->c2xx += atomic_load_explicit(&w->l_2xx, memory_order_relaxed);
        p->c201 += atomic_load_explicit(&w->l_201, memory_order_relaxed);
        p->c409 += atomic_load_explicit(&w->l_409, memory_order_relaxed);
        p->c429 += atomic_load_explicit(&w->l_429, memory_order_relaxed);
        p->c5xx += atomic_load_explicit(&w->l_5xx, memory_order_relaxed);
        p->shed += atomic_load_explicit(&w->l_shed, memory_order_relaxed);
        p->other += atomic_load_explicit(&w->l_other, memory_order_relaxed);
        p->errors += atomic_load_explicit(&w->l_errors, memory_order_relaxed);
        p->open += atomic_load_explicit(&w->l_open, memory_order_relaxed);
        pthread_mutex_lock(&w->live_mu);
        if (h) fl_hist_merge(h, &w->live);
        fl_hist_reset(&w->live);
        pthread_mutex_unlock(&w->live_mu);
    }
    if (h) {
        p->p99_us = fl_hist_percentile(h, 99);
        p->interval_n = h->count;
        free(h);
    }
}

/* Appends src[0..n) to *dst (of *dn). */
static void append(void **dst, size_t *dn, const void *src, size_t n, size_t elem) {
    if (!n) return;
    void *p = realloc(*dst, (*dn + n) * elem);
    if (!p) return;
    memcpy((char *)p + *dn * elem, src, n * elem);
    *dst = p;
    *dn += n;
}

static void merge_result(fl_load_result *d, const fl_load_result *s) {
    d->sent += s->sent;
    d->answered += s->answered;
    for (int i = 0; i < 600; i++) d->status[i] += s->status[i];
    d->transport_errors += s->transport_errors;
    d->shed += s->shed;
    d->good += s->good;
    d->late += s->late;
    d->timeouts += s->timeouts;
    d->connect_errors += s->connect_errors;
    d->backlog += s->backlog;
    d->replays_sent += s->replays_sent;
    d->fenced += s->fenced;
    d->max_open += s->max_open;
    for (size_t i = 0; i < s->ncodes; i++) {
        size_t j = 0;
        while (j < d->ncodes && strcmp(d->codes[j].code, s->codes[i].code)) j++;
        if (j == d->ncodes) {
            if (j == sizeof d->codes / sizeof d->codes[0]) j--;
            else d->ncodes++;
            snprintf(d->codes[j].code, sizeof d->codes[j].code, "%s", s->codes[i].code);
        }
        d->codes[j].n += s->codes[i].n;
    }
    fl_hist_merge(&d->hist, &s->hist);
    append((void **)&d->created, &d->ncreated, s->created, s->ncreated, sizeof *s->created);
    append((void **)&d->replayed, &d->nreplayed, s->replayed, s->nreplayed, sizeof *s->replayed);
    append((void **)&d->lost, &d->nlost, s->lost, s->nlost, sizeof *s->lost);
    append((void **)&d->decisions, &d->ndecisions, s->decisions, s->ndecisions,
           sizeof *s->decisions);
    append((void **)&d->buyers, &d->nbuyers, s->buyers, s->nbuyers, sizeof *s->buyers);
    fl_hist_merge(&d->decision_hist, &s->decision_hist);
}

void fl_engine_join(fl_engine *g, fl_load_result *res) {
    memset(res, 0, sizeof *res);
    fl_hist_reset(&res->hist);
    fl_hist_reset(&res->decision_hist);
    snprintf(res->key_tag, sizeof res->key_tag, "%s", g->o.key_tag);
    res->start_wall_ms = g->t0_wall_ms;
    int64_t last = g->t0, last_created = g->t0;
    for (int i = 0; i < g->nw; i++) {
        pthread_join(g->w[i].th, NULL);
        merge_result(res, &g->w[i].r);
        if (g->w[i].last_answer > last) last = g->w[i].last_answer;
        if (g->w[i].last_created > last_created) last_created = g->w[i].last_created;
        worker_free(&g->w[i]);
    }
    res->elapsed_us = last > g->t0 ? last - g->t0 : 1;
    if (g->o.crowd.buyers) {
        int_fast64_t c0 = atomic_load(&g->crowd_t0);
        res->crowd_start_us = c0 ? c0 - g->t0 : -1;
        res->crowd_warmed = atomic_load(&g->warmed_at_start);
        res->crowd_conns = g->all_conns;
    }
    res->last_created_us = last_created > g->t0 ? last_created - g->t0 : 0;
    res->max_sale_gap_us = res->ncreated > 1 ? atomic_load(&g->max_gap_201) : -1;
    /* A sale that stalled and never came back before the run ended: the
     * time from its last 201 to its last answer is a gap too (a run that
     * ended in a failover the service never recovered from would say only
     * the gaps before it). Not when sold out was heard after the last 201:
     * that sale ended. */
    int64_t l201 = atomic_load(&g->last_201);
    if (res->max_sale_gap_us >= 0 && l201 > 0 && atomic_load(&g->last_soldout) < l201 &&
        last > l201 && last - l201 > res->max_sale_gap_us)
        res->max_sale_gap_us = last - l201;
    free(g->w);
    free(g);
}

void fl_load_result_free(fl_load_result *r) {
    free(r->created);
    free(r->replayed);
    free(r->lost);
    free(r->decisions);
    free(r->buyers);
    r->created = r->replayed = NULL;
    r->lost = NULL;
    r->decisions = NULL;
    r->buyers = NULL;
    r->ncreated = r->nreplayed = r->nlost = r->ndecisions = r->nbuyers = 0;
}

uint64_t fl_load_code(const fl_load_result *r, const char *code) {
    for (size_t i = 0; i < r->ncodes; i++)
        if (!strcmp(r->codes[i].code, code)) return r->codes[i].n;
    return 0;
}
