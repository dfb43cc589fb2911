/* crowd.c: buyers who behave like people (engine.h, fl_crowd_opts), and
 * what their run came to: who got the units against who came first.
 *
 * A buyer arrives at its time on the ramp and orders (with a waiting
 * room: without a ticket, which takes its place -- in its turn the order
 * is taken at once, else the answer carries its ticket, to order with,
 * and such an order may wait in the service for its turn (its
 * --room-order-wait-ms); with FL_CROWD_TICKETS it takes a ticket first). It stops at a final
 * answer: a unit (201), sold out (409 sold_out or insufficient_stock), or
 * a refusal nothing will change (another 4xx). Anything else -- 503
 * overloaded or unavailable, 429 not_your_turn or lock_timeout, no answer
 * at all -- it tries again: a polite buyer when told (a ticket's or a
 * refusal's retry_after_ms, else Retry-After, else 1 s), a bot at once.
 * A ticket whose turn passed (409 turn_over) is traded for a new place.
 * The place it bought in is the one its 201 says (or its ticket's).
 *
 * A polite buyer told to wait for its turn holds a long poll, as a
 * waiting-room page does (GET .../tickets/{ticket}?wait_ms=N: answered the
 * moment its turn comes), when its estimated wait is within a poll's
 * (POLL_MAX_MS) and a connection is free for it: at most half the
 * thread's connections hold requests that wait in the service -- polls,
 * and orders the service may hold for their turn --, the rest carry places
 * and orders answered at once (a crowd's buyers share the connections;
 * every waiting buyer on a poll of its own starved them: 515 units/s,
 * 44,000 buyers unanswered; every connection holding an order, a buyer
 * shed in its turn found none free to come back on for 90 s, and its unit
 * held the line). Otherwise it comes back when told, and orders. An order
 * sent when no such connection is free asks to be answered at once
 * (?wait_ms=0): a limit of the load generator, which has connections for
 * a few of its buyers at a time, where each person has its own.
 *
 * The figures: of the units, the share the first S arrivals got (S the
 * stock: with every unit to the first S, 1.0); pairs of winners served
 * against their arrival order; units per capita of bots against polite
 * buyers; the time from arrival to a final answer; requests per buyer; the
 * last final answer after the last unit sold; units sold per second from
 * the first to the last. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "loadtest/engine/crowd_int.h"

#define POLITE_DEFAULT_US 1000000  /* told nothing: a person waits a second */
#define POLL_MAX_MS 5000           /* a long poll asks to wait this long at most */
#define POLL_MARGIN_MS 1000        /* ...and its estimate and this much */

/* ------------------------------------------------------------- the heap */

static void heap_up(fl_crowd_due *h, size_t i) {
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].at <= h[i].at) break;
        fl_crowd_due t = h[p];
        h[p] = h[i];
        h[i] = t;
        i = p;
    }
}

static void heap_down(fl_crowd_due *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && h[l].at < h[m].at) m = l;
        if (l + 1 < n && h[l + 1].at < h[m].at) m = l + 1;
        if (m == i) return;
        fl_crowd_due t = h[m];
        h[m] = h[i];
        h[i] = t;
        i = m;
    }
}

/* Buyer i acts at `at`. The heap has room for every buyer once, and a
 * buyer is on it at most once (never while its request is out). */
static void schedule(fl_crowd_part *p, uint32_t i, int64_t at) {
    assert(p->hn < p->hcap && !p->b[i].in_flight && p->b[i].phase != FL_CROWD_DONE);
    p->heap[p->hn] = (fl_crowd_due){ at, i };
    heap_up(p->heap, p->hn++);
}

/* Whether b's next request may wait in the service (a long poll, or an
 * order the service may hold for its turn: fl_crowd_build decides so). */
static int may_wait(const fl_crowd_part *p, const fl_crowd_buyer *b) {
    return b->phase == FL_CROWD_POLL ||
           (p->o->room && b->ticket[0] && b->phase == FL_CROWD_ORDER && p->polls < p->poll_cap);
}

int64_t fl_crowd_next_at(const fl_crowd_part *p) {
    if (!p->hn) return INT64_MAX;
    if (p->regular_cap && p->regular >= p->regular_cap && !may_wait(p, &p->b[p->heap[0].i]))
        return INT64_MAX;               /* an answer frees a connection for it */
    return p->heap[0].at;
}

uint32_t fl_crowd_pop(fl_crowd_part *p) {
    assert(p->hn > 0);
    uint32_t i = p->heap[0].i;
    p->heap[0] = p->heap[--p->hn];
    heap_down(p->heap, p->hn, 0);
    return i;
}

/* ------------------------------------------------------------ the buyers */

/* A bot or not, fixed by the seed and the rank (splitmix64). */
static int is_bot(uint64_t seed, uint32_t idx, double share) {
    uint64_t z = seed + (uint64_t)idx * 0x9e3779b97f4a7c15ull + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53 < share;
}

int fl_crowd_part_init(fl_crowd_part *p, const fl_crowd_opts *o, int id, int nw, uint64_t seed,
                       int conns, int hold) {
    assert(hold >= 0 && (hold == 0 || hold < conns));
    memset(p, 0, sizeof *p);
    p->o = o;
    if (hold > 0) {                      /* kept for the waiting: the rest answer at once */
        p->poll_cap = (uint32_t)hold;
        p->regular_cap = (uint32_t)(conns - hold);
    } else {
        p->poll_cap = conns > 1 ? (uint32_t)conns / 2 : 0;
    }
    p->poll_max_ms = POLL_MAX_MS;
    p->n = o->buyers > (uint32_t)id ? (o->buyers - (uint32_t)id + (uint32_t)nw - 1) / (uint32_t)nw
                                   : 0;
    p->hcap = p->n ? p->n : 1;
    p->b = calloc(p->n ? p->n : 1, sizeof *p->b);
    p->heap = malloc(p->hcap * sizeof *p->heap);
    if (!p->b || !p->heap) {
        fl_crowd_part_free(p);
        return -1;
    }
    for (uint32_t k = 0; k < p->n; k++) {
        fl_crowd_buyer *b = &p->b[k];
        b->idx = (uint32_t)id + k * (uint32_t)nw;
        b->bot = (uint8_t)is_bot(seed, b->idx, o->impatient);
        b->phase = o->room == FL_CROWD_TICKETS ? FL_CROWD_TICKET : FL_CROWD_ORDER;
    }
    return 0;
}

void fl_crowd_part_start(fl_crowd_part *p, int64_t t0) {
    assert(p->hn == 0);
    for (uint32_t k = 0; k < p->n; k++) {
        fl_crowd_buyer *b = &p->b[k];
        b->arrive_us = t0 + (p->o->buyers > 1 ? p->o->ramp_us * (int64_t)b->idx /
                                                    (p->o->buyers - 1) : 0);
        schedule(p, k, b->arrive_us);
    }
}

void fl_crowd_part_free(fl_crowd_part *p) {
    free(p->b);
    free(p->heap);
    p->b = NULL;
    p->heap = NULL;
}

size_t fl_crowd_build(fl_crowd_part *p, uint32_t i, const char *sku, const char *hostport,
                      char *buf, size_t cap, int64_t now) {
    fl_crowd_buyer *b = &p->b[i];
    char body[256];
    int bl, n;
    assert(b->phase != FL_CROWD_DONE && !b->in_flight);
    b->in_flight = 1;
    assert(b->phase != FL_CROWD_POLL || (b->polling && p->polls <= p->poll_cap));
    if (b->phase == FL_CROWD_POLL && b->polls < UINT16_MAX) b->polls++;
    if (b->requests < UINT16_MAX) b->requests++;
    if (!b->sent_us) b->sent_us = now;
    if (b->phase == FL_CROWD_POLL) {
        n = snprintf(buf, cap, "GET /v1/products/%s/tickets/%s?wait_ms=%u HTTP/1.1\r\nHost: %s"
                     "\r\n\r\n", sku, b->ticket, (unsigned)b->poll_ms, hostport);
    } else if (b->phase == FL_CROWD_TICKET) {
        bl = snprintf(body, sizeof body, "{\"user_id\":\"u%u\"}", b->idx);
        n = snprintf(buf, cap, "POST /v1/products/%s/tickets HTTP/1.1\r\nHost: %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                     sku, hostport, bl, body);
    } else {
        /* With a room the service may hold the order for its turn: on a
         * connection free for waiting, else it asks to be answered now. A
         * first order (no ticket yet) always asks so: its place is
         * unknown, and a late arrival's order held to the end of the sale
         * kept a connection a buyer near its turn needed (30,000 buyers
         * for 3,000 units: 99,000-151,000 requests and the final answer
         * p50 0.45-0.93 s, against 67,000 and 1 ms, 2026-12-05). */
        const char *q = "";
        if (may_wait(p, b)) {
            b->polling = 1;
            p->polls++;
        } else if (p->o->room) {
            q = "?wait_ms=0";
        }
        bl = snprintf(body, sizeof body, "{\"sku\":\"%s\",\"user_id\":\"u%u\",\"quantity\":1%s%s%s}",
                      sku, b->idx, b->ticket[0] ? ",\"ticket\":\"" : "", b->ticket,
                      b->ticket[0] ? "\"" : "");
        n = snprintf(buf, cap, "POST /v1/orders%s HTTP/1.1\r\nHost: %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                     q, hostport, bl, body);
    }
    if (!b->polling) p->regular++;
    assert(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

static void fl_crowd_finish(fl_crowd_part *p, fl_crowd_buyer *b, int outcome, int64_t now) {
    b->phase = FL_CROWD_DONE;
    b->outcome = (uint8_t)outcome;
    b->final_us = now;
    p->done++;
}

/* The integer value of "key" in a flat JSON object's text (-1: none). */
static long long json_int(const char *json, size_t len, const char *key) {
    char pat[48];
    int n = snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = json ? memmem(json, len, pat, (size_t)n) : NULL;
    if (!p) return -1;
    p += n;
    while (p < json + len && *p == ' ') p++;
    long long v = 0;
    const char *s = p;
    for (; p < json + len && *p >= '0' && *p <= '9' && p - s < 12; p++) v = v * 10 + (*p - '0');
    return p > s ? v : -1;
}

/* When a buyer told to wait (rs) comes back: a bot at once; a polite one
 * after the body's retry_after_ms, else Retry-After, else a second. */
static int64_t again_at(const fl_crowd_buyer *b, const fl_resp *rs, int64_t now) {
    if (b->bot) return now;
    if (rs) {
        long long ms = json_int(rs->body, rs->body_len, "retry_after_ms");
        if (ms >= 0) return now + ms * 1000;
        if (rs->retry_after_s >= 0) return now + (int64_t)rs->retry_after_s * 1000000;
    }
    return now + POLITE_DEFAULT_US;
}

/* A buyer with a ticket told to wait (rs: a ticket's or an order's
 * answer saying how long): a polite one holds a long poll when its wait
 * is within one and a connection is free for it (see the top), else comes
 * back when told and orders; a bot orders again at once. */
static void wait_turn(fl_crowd_part *p, uint32_t i, const fl_resp *rs, int64_t now) {
    fl_crowd_buyer *b = &p->b[i];
    long long est = rs ? json_int(rs->body, rs->body_len, "estimated_wait_ms") : -1;
    if (!b->bot && est >= 0 && est <= p->poll_max_ms && p->polls < p->poll_cap) {
        long long w = est + POLL_MARGIN_MS;
        b->phase = FL_CROWD_POLL;
        b->polling = 1;                           /* its connection, from now to the answer */
        p->polls++;
        b->poll_ms = (uint16_t)(w < p->poll_max_ms ? w : p->poll_max_ms);
        schedule(p, i, now);
        return;
    }
    b->phase = FL_CROWD_ORDER;
    schedule(p, i, again_at(b, rs, now));
}

/* A long poll came back (or was lost): one connection more for the rest
 * (counted from the decision to poll, so that no more are decided than
 * may be out at once). */
static void poll_over(fl_crowd_part *p, fl_crowd_buyer *b) {
    if (!b->polling) {
        assert(p->regular > 0);
        p->regular--;                 /* an answer at once: its connection is free */
        return;
    }
    assert(p->polls > 0);
    b->polling = 0;
    p->polls--;
}

void fl_crowd_answer(fl_crowd_part *p, uint32_t i, const fl_resp *rs, int64_t now) {
    fl_crowd_buyer *b = &p->b[i];
    char code[40] = "";
    char st[24] = "";
    assert(b->in_flight);
    b->in_flight = 0;
    poll_over(p, b);
    if (rs->status >= 400 && rs->body &&
        fl_json_str(rs->body, rs->body_len, "error", code, sizeof code) < 0)
        code[0] = '\0';
    int placed = b->phase == FL_CROWD_TICKET && (rs->status == 200 || rs->status == 201);
    if (placed || (b->phase == FL_CROWD_POLL && rs->status == 200)) {
        if (placed) {
            if (!rs->body || fl_json_str(rs->body, rs->body_len, "ticket", b->ticket,
                                         sizeof b->ticket) < 0) {
                fl_crowd_finish(p, b, FL_BUYER_REFUSED, now);   /* a place without a ticket: a bug */
                return;
            }
            long long pos = json_int(rs->body, rs->body_len, "position");
            b->position = pos > 0 && pos <= UINT32_MAX ? (uint32_t)pos : 0;
        }
        if (rs->body) fl_json_str(rs->body, rs->body_len, "state", st, sizeof st);
        if (strcmp(st, "waiting") == 0) {
            wait_turn(p, i, rs, now);
            return;
        }
        b->phase = FL_CROWD_ORDER;                 /* its turn (or a state to order in) */
        schedule(p, i, now);
        return;
    }
    /* An order: its place, when the answer says it (a 201 says the one it
     * was sold in, whether or not it was sent with a ticket: a buyer shed
     * in its turn heard its ticket without its position). An order sent
     * without a ticket took a place (whatever the answer: a unit, a wait,
     * a shed in its turn), whose ticket the body tells. */
    if (p->o->room && rs->body && b->phase == FL_CROWD_ORDER &&
        (rs->status == 201 || rs->status == 429 || rs->status == 503)) {
        long long pos = json_int(rs->body, rs->body_len, "position");
        if (pos > 0 && pos <= UINT32_MAX) b->position = (uint32_t)pos;
        if (!b->ticket[0] && rs->status != 201 &&
            fl_json_str(rs->body, rs->body_len, "ticket", b->ticket, sizeof b->ticket) < 0)
            b->ticket[0] = '\0';
    }
    if (rs->status == 201) {
        fl_crowd_finish(p, b, FL_BUYER_GOT, now);
        return;
    }
    if (rs->status == 409 && (!strcmp(code, "sold_out") || !strcmp(code, "insufficient_stock"))) {
        fl_crowd_finish(p, b, FL_BUYER_SOLD_OUT, now);
        return;
    }
    if (rs->status == 409 && !strcmp(code, "turn_over")) {
        /* A new place, at the back: asked for, or by an order without it. */
        b->phase = p->o->room == FL_CROWD_TICKETS ? FL_CROWD_TICKET : FL_CROWD_ORDER;
        b->ticket[0] = '\0';
        schedule(p, i, now);
        return;
    }
    if (rs->status == 429 && !strcmp(code, "not_your_turn")) {
        wait_turn(p, i, rs, now);
        return;
    }
    if (rs->status == 429 || rs->status >= 500) {
        if (b->phase == FL_CROWD_POLL) b->phase = FL_CROWD_ORDER;
        schedule(p, i, again_at(b, rs, now));
        return;
    }
    fl_crowd_finish(p, b, FL_BUYER_REFUSED, now);           /* 400, 403, 404, another 409 */
}

void fl_crowd_lost(fl_crowd_part *p, uint32_t i, int64_t now) {
    fl_crowd_buyer *b = &p->b[i];
    assert(b->in_flight);
    b->in_flight = 0;
    poll_over(p, b);
    if (b->phase == FL_CROWD_POLL) b->phase = FL_CROWD_ORDER;
    schedule(p, i, again_at(b, NULL, now));
}

int fl_crowd_records(const fl_crowd_part *p, int64_t t0, fl_buyer_rec **out, size_t *n) {
    if (!p->n) return 0;
    fl_buyer_rec *a = realloc(*out, (*n + p->n) * sizeof *a);
    if (!a) return -1;
    *out = a;
    for (uint32_t k = 0; k < p->n; k++) {
        const fl_crowd_buyer *b = &p->b[k];
        a[(*n)++] = (fl_buyer_rec){ .idx = b->idx, .bot = b->bot, .outcome = b->outcome,
                                    .requests = b->requests, .polls = b->polls,
                                    .position = b->position,
                                    .arrive_us = b->arrive_us - t0,
                                    .final_us = b->final_us ? b->final_us - t0 : -1,
                                    .sent_us = b->sent_us ? b->sent_us - t0 : -1 };
    }
    return 0;
}

/* ----------------------------------------------------------- the figures */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_final(const void *a, const void *b) {
    const fl_buyer_rec *x = a, *y = b;
    return x->final_us < y->final_us ? -1 : x->final_us > y->final_us;
}

/* By the time the first request was written, then by arrival rank. */
static int cmp_sent(const void *a, const void *b) {
    const fl_buyer_rec *x = *(const fl_buyer_rec *const *)a, *y = *(const fl_buyer_rec *const *)b;
    if (x->sent_us != y->sent_us) return x->sent_us < y->sent_us ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Of the units, the share the first S buyers to send a request got (-1:
 * no buyer's sending time known). */
static double first_sent_share(const fl_load_result *r, long long stock, size_t winners) {
    size_t n = r->nbuyers, ns = 0, in = 0;
    const fl_buyer_rec **by = malloc((n ? n : 1) * sizeof *by);
    if (!by) return -1;
    for (size_t i = 0; i < n; i++)
        if (r->buyers[i].sent_us >= 0) by[ns++] = &r->buyers[i];
    if (!ns || !winners || stock <= 0) {
        free(by);
        return -1;
    }
    qsort(by, ns, sizeof *by, cmp_sent);
    for (size_t i = 0; i < ns && (long long)i < stock; i++) in += by[i]->outcome == FL_BUYER_GOT;
    free(by);
    return (double)in / (double)winners;
}

/* Inversions of v[0..n) (pairs i < j with v[i] > v[j]), by merge sort. */
static uint64_t inversions(uint32_t *v, uint32_t *tmp, size_t n) {
    if (n < 2) return 0;
    size_t m = n / 2;
    uint64_t c = inversions(v, tmp, m) + inversions(v + m, tmp, n - m);
    size_t i = 0, j = m, k = 0;
    while (i < m && j < n) {
        if (v[i] <= v[j]) tmp[k++] = v[i++];
        else {
            c += m - i;
            tmp[k++] = v[j++];
        }
    }
    while (i < m) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    return c;
}

static int64_t pct(const int64_t *v, size_t n, double q) {
    if (!n) return 0;
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

int fl_crowd_figures_get(const fl_load_result *r, long long stock, fl_crowd_figures *f) {
    size_t n = r->nbuyers;
    memset(f, 0, sizeof *f);
    f->buyers = (uint32_t)n;
    f->stock = stock;
    f->start_us = r->crowd_start_us;
    f->warmed = r->crowd_warmed;
    f->conns = r->crowd_conns;
    fl_buyer_rec *won = malloc((n ? n : 1) * sizeof *won);
    int64_t *fin = malloc((n ? n : 1) * sizeof *fin), *req = malloc((n ? n : 1) * sizeof *req);
    uint32_t *rank = malloc((n ? n : 1) * sizeof *rank), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!won || !fin || !req || !rank || !tmp) {
        free(won), free(fin), free(req), free(rank), free(tmp);
        return -1;
    }
    size_t nw = 0, nf = 0, first = 0;
    int64_t last_final = -1;
    for (size_t i = 0; i < n; i++) {
        const fl_buyer_rec *b = &r->buyers[i];
        f->bots += b->bot;
        req[i] = b->requests;
        f->requests += b->requests;
        f->polls += b->polls;
        if (b->final_us >= 0) {
            fin[nf++] = b->final_us - b->arrive_us;
            if (b->final_us > last_final) last_final = b->final_us;
        } else {
            f->no_final++;
        }
        if (b->outcome == FL_BUYER_GOT) {
            won[nw++] = *b;
            f->bot_winners += b->bot;
            if ((long long)b->idx < stock) first++;
        }
    }
    f->winners = (uint32_t)nw;
    f->first_share = nw ? (double)first / (double)nw : 0;
    f->first_sent_share = first_sent_share(r, stock, nw);
    /* The room's own order: the S first places (the line as Redis issued
     * it; a buyer whose turn passed has its last place). */
    size_t np = 0;
    for (size_t i = 0; i < n; i++)
        if (r->buyers[i].position) fin[np++] = r->buyers[i].position;   /* fin reused below */
    f->first_place_share = -1;
    if (np && nw && stock > 0) {
        qsort(fin, np, sizeof *fin, cmp_i64);
        int64_t cut = fin[(size_t)stock < np ? (size_t)stock - 1 : np - 1];
        size_t in = 0;
        for (size_t i = 0; i < nw; i++) in += won[i].position && won[i].position <= cut;
        f->first_place_share = (double)in / (double)nw;
    }
    nf = 0;
    for (size_t i = 0; i < n; i++)
        if (r->buyers[i].sent_us >= 0) fin[nf++] = r->buyers[i].sent_us - r->buyers[i].arrive_us;
    qsort(fin, nf, sizeof *fin, cmp_i64);
    f->send_lag_p50_us = pct(fin, nf, 0.5);
    f->send_lag_p99_us = pct(fin, nf, 0.99);
    nf = 0;
    for (size_t i = 0; i < n; i++)
        if (r->buyers[i].final_us >= 0) fin[nf++] = r->buyers[i].final_us - r->buyers[i].arrive_us;
    qsort(won, nw, sizeof *won, cmp_final);
    for (size_t i = 0; i < nw; i++) rank[i] = won[i].idx;
    f->pairs = (uint64_t)nw * (nw ? nw - 1 : 0) / 2;
    f->out_of_order = inversions(rank, tmp, nw);
    uint32_t polite = f->buyers - f->bots;
    f->bot_units = f->bots ? (double)f->bot_winners / f->bots : 0;
    f->polite_units = polite ? (double)(nw - f->bot_winners) / polite : 0;
    f->bot_ratio = f->polite_units > 0 ? f->bot_units / f->polite_units : 0;
    /* What a strict first-come order would give these buyers: the first
     * nw arrivals' bots against their polite ones. A crowd's bots are a
     * draw, and a few more of them among the first arrivals is the
     * sample's luck, not the sale's unfairness. */
    uint32_t bots_first = 0;
    for (size_t i = 0; i < n; i++) bots_first += r->buyers[i].bot && r->buyers[i].idx < nw;
    f->fifo_bot_ratio = f->bots && polite && nw > bots_first
                            ? ((double)bots_first / f->bots) /
                                  ((double)(nw - bots_first) / polite)
                            : 0;
    qsort(fin, nf, sizeof *fin, cmp_i64);
    f->final_p50_us = pct(fin, nf, 0.5);
    f->final_p99_us = pct(fin, nf, 0.99);
    qsort(req, n, sizeof *req, cmp_i64);
    f->requests_median = (double)pct(req, n, 0.5);
    f->requests_p99 = (double)pct(req, n, 0.99);
    if (nw) {
        f->first_unit_us = won[0].final_us;
        f->last_unit_us = won[nw - 1].final_us;
        f->final_after_last_unit_us = last_final - f->last_unit_us;
        int64_t span = f->last_unit_us - f->first_unit_us;
        f->units_per_s = span > 0 ? (double)(nw - 1) * 1e6 / (double)span : 0;
    }
    free(won), free(fin), free(req), free(rank), free(tmp);
    return 0;
}

void fl_crowd_print(const fl_crowd_figures *f, FILE *out) {
    fprintf(out, "crowd      %u buyers (%u bots), %u got a unit (%u bots), stock %lld\n",
            f->buyers, f->bots, f->winners, f->bot_winners, f->stock);
    fprintf(out, "start      %.0f ms in, %d of %d connections answered once by then%s\n",
            f->start_us / 1000.0, f->warmed, f->conns,
            f->warmed < f->conns ? " (the others' buyers may be sent late)" : "");
    fprintf(out, "fairness   %.1f%% of the units to the first %lld arrivals; %llu of %llu pairs "
            "of winners served out of arrival order\n", 100 * f->first_share, f->stock,
            (unsigned long long)f->out_of_order, (unsigned long long)f->pairs);
    if (f->first_sent_share >= 0)
        fprintf(out, "           %.1f%% to the first %lld to send their first request (the "
                "order they left the load generator in, %.0f ms after arriving p50, %.0f ms "
                "p99)\n", 100 * f->first_sent_share, f->stock, f->send_lag_p50_us / 1000.0,
                f->send_lag_p99_us / 1000.0);
    if (f->first_place_share >= 0)
        fprintf(out, "room       %.1f%% of the units to the first %lld places in the line (the "
                "order the service saw the buyers in)\n", 100 * f->first_place_share, f->stock);
    fprintf(out, "bots       %.3f units per bot, %.3f per polite buyer (x%.2f; in a strict "
            "first-come order these buyers would get x%.2f)\n", f->bot_units, f->polite_units,
            f->bot_ratio, f->fifo_bot_ratio);
    fprintf(out, "answers    arrival to a final answer p50 %.0f ms, p99 %.0f ms; %u without one; "
            "the last %.0f ms after the last unit sold\n", f->final_p50_us / 1000.0,
            f->final_p99_us / 1000.0, f->no_final, f->final_after_last_unit_us / 1000.0);
    fprintf(out, "requests   %llu in all (%llu long polls), per buyer median %.0f, p99 %.0f\n",
            (unsigned long long)f->requests, (unsigned long long)f->polls, f->requests_median,
            f->requests_p99);
    fprintf(out, "sale       %.0f units/s from the first unit (%.0f ms) to the last (%.0f ms)\n",
            f->units_per_s, f->first_unit_us / 1000.0, f->last_unit_us / 1000.0);
}

static int cmp_idx(const void *a, const void *b) {
    const fl_buyer_rec *x = a, *y = b;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

json_t *fl_crowd_json(const fl_crowd_figures *f, const fl_crowd_opts *o, const fl_load_result *r) {
    json_t *j = json_pack(
        "{s:I, s:f, s:f, s:b, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f, "
        "s:f, s:f, s:I, s:f, s:f, s:I, s:f, s:f, s:f}",
        "buyers", (json_int_t)f->buyers, "ramp_s", o->ramp_us / 1e6, "impatient", o->impatient,
        "waiting_room", o->room, "bots", (json_int_t)f->bots, "winners", (json_int_t)f->winners,
        "bot_winners", (json_int_t)f->bot_winners, "stock", (json_int_t)f->stock,
        "first_s_units", (json_int_t)(f->first_share * f->winners + 0.5), "first_s_share",
        f->first_share, "pairs", (json_int_t)f->pairs, "out_of_order", (json_int_t)f->out_of_order,
        "bot_units", f->bot_units, "polite_units", f->polite_units, "bot_ratio", f->bot_ratio,
        "final_p50_ms", f->final_p50_us / 1000.0, "final_p99_ms", f->final_p99_us / 1000.0,
        "no_final", (json_int_t)f->no_final, "final_after_last_unit_ms",
        f->final_after_last_unit_us / 1000.0, "requests_median", f->requests_median,
        "requests", (json_int_t)f->requests, "requests_p99", f->requests_p99, "units_per_s",
        f->units_per_s, "first_unit_ms", f->first_unit_us / 1000.0);
    if (!j) return NULL;
    json_object_set_new(j, "last_unit_ms", json_real(f->last_unit_us / 1000.0));
    json_object_set_new(j, "long_polls", json_integer((json_int_t)f->polls));
    json_object_set_new(j, "first_place_share", f->first_place_share >= 0
                                                    ? json_real(f->first_place_share)
                                                    : json_null());
    json_object_set_new(j, "first_sent_share", f->first_sent_share >= 0
                                                   ? json_real(f->first_sent_share)
                                                   : json_null());
    json_object_set_new(j, "send_lag_p50_ms", json_real(f->send_lag_p50_us / 1000.0));
    json_object_set_new(j, "send_lag_p99_ms", json_real(f->send_lag_p99_us / 1000.0));
    json_object_set_new(j, "start_ms", json_real(f->start_us / 1000.0));
    json_object_set_new(j, "fifo_bot_ratio", json_real(f->fifo_bot_ratio));
    json_object_set_new(j, "connections_warmed", json_integer(f->warmed));
    json_object_set_new(j, "connections", json_integer(f->conns));
    /* Per buyer, in arrival order: outcome letter (g got, s sold out, r
     * refused, n none), bot flag, final ms -- a compact trace for the
     * report's chart of arrival rank against outcome. */
    fl_buyer_rec *b = malloc((r->nbuyers ? r->nbuyers : 1) * sizeof *b);
    if (b) {
        memcpy(b, r->buyers, r->nbuyers * sizeof *b);
        qsort(b, r->nbuyers, sizeof *b, cmp_idx);
        json_t *out = json_string(""), *bots = json_array(), *fin = json_array();
        char *s = malloc(r->nbuyers + 1);
        if (s) {
            static const char L[] = { 'n', 'g', 's', 'r' };
            for (size_t i = 0; i < r->nbuyers; i++) s[i] = L[b[i].outcome & 3];
            s[r->nbuyers] = '\0';
            json_string_set(out, s);
            free(s);
        }
        for (size_t i = 0; i < r->nbuyers; i++) {
            if (b[i].bot) json_array_append_new(bots, json_integer(b[i].idx));
            json_array_append_new(fin, json_integer(b[i].final_us >= 0 ? b[i].final_us / 1000 : -1));
        }
        json_object_set_new(j, "outcomes", out);
        json_object_set_new(j, "bot_ranks", bots);
        json_object_set_new(j, "final_ms", fin);
        free(b);
    }
    return j;
}
