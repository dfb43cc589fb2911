/* tickets.c: a waiting room's routes (room/room.h; docs/api.md, "Waiting
 * room"):
 *
 *   POST /v1/products/{sku}/tickets   {"user_id": ...}: the buyer's place
 *       -- a new one (201), or the one it has (200) -- as a ticket, with
 *       where it stands; one Redis call (an API worker's).
 *   GET /v1/products/{sku}/tickets/{ticket}[?wait_ms=N]   where a ticket
 *       stands, from this instance's view of the room: no store is asked;
 *       with wait_ms, a ticket still waiting is answered when its turn
 *       comes (the beat that brings it), the room sells out, or N ms pass
 *       -- a long poll: the buyer hears its turn at once, with one
 *       request.
 *
 * and the check an order of a product with a room passes before it enters
 * the order path (api_room_admit): a ticket of its buyer, in its turn. An
 * order sent without a ticket takes its buyer's place (with the tickets'
 * asks, in the same calls) and goes on at once when the place has its
 * turn -- a room that keeps up with its arrivals costs a buyer no second
 * request -- else hears its place as a ticket (429). A room that is sold
 * out answers every ticket and order so at once. */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "service/api/api_int.h"
#include "service/products.h"
#include "service/room/beats.h"
#include "service/room/room.h"

static const char *const STATE[] = { [SVC_TURN_WAIT] = "waiting", [SVC_TURN_NOW] = "your_turn",
                                     [SVC_TURN_OVER] = "turn_over" };

/* How long a waiting buyer should wait before asking again: its estimate,
 * at least 50 ms, at most SVC_ROOM_RETRY_MAX_MS (the rate may change, and
 * a sold-out room should be heard of soon). */
static long long retry_ms(long long wait_ms) {
    return wait_ms < 50 ? 50 : wait_ms > SVC_ROOM_RETRY_MAX_MS ? SVC_ROOM_RETRY_MAX_MS : wait_ms;
}

static void reply_sold_out(http_req *r, const char *sku) {
    http_reply_error(r, 409, "sold_out", "%s is sold out.", sku);
}

static void reply_no_view(http_req *r, svc_app *a) {
    atomic_fetch_add(&a->m.redis_errors, 1);
    http_reply_error_with(r, 503, "redis_unavailable", NULL, api_retry,
                          "The waiting room has not been heard from Redis yet; retry shortly.");
}

/* The ticket's answer: where it stands (turn t, ms as svc_room_turn says).
 * Written without a jansson tree, as not_your_turn's below: a waiting
 * buyer asks it again and again (the SKU is of [A-Za-z0-9._-] and the
 * ticket of our own making: nothing to escape). */
static void reply_ticket(http_req *r, int status, svc_product *p, const char *ticket,
                         long long position, svc_turn t, long long ms) {
    svc_room_figures f;
    assert(t == SVC_TURN_WAIT || t == SVC_TURN_NOW || t == SVC_TURN_OVER);
    svc_room_figures_get(p->room, &f);
    char secs[24], more[96];
    const char *retry[] = { "Retry-After", secs, NULL };
    if (t == SVC_TURN_WAIT) {
        long long rm = retry_ms(ms);
        snprintf(more, sizeof more, "\"estimated_wait_ms\":%lld,\"retry_after_ms\":%lld", ms, rm);
        snprintf(secs, sizeof secs, "%lld", (rm + 999) / 1000);
    } else {
        snprintf(more, sizeof more, "\"%s\":%lld",
                 t == SVC_TURN_NOW ? "turn_ends_in_ms" : "turn_ended_ms_ago", ms);
    }
    char body[256 + DB_SKU_MAX + SVC_ROOM_TICKET_MAX];
    int n = snprintf(body, sizeof body, "{\"ticket\":\"%s\",\"sku\":\"%s\",\"position\":%lld,"
                     "\"serving\":%lld,\"state\":\"%s\",%s}\n", ticket, p->sku, position,
                     f.serving, STATE[t], more);
    assert(n > 0 && (size_t)n < sizeof body);
    http_reply(r, status, "application/json; charset=utf-8", body, (size_t)n,
               t == SVC_TURN_WAIT ? retry : NULL);
}

/* 429 not_your_turn: position waits (ms, the estimate); ticket: the
 * place's ticket, told when the buyer sent none (else NULL). Written
 * without a jansson tree: under a crowd this is the answer most often
 * given (a bot asks again the moment it hears it), on the threads that
 * also carry the orders in their turn. */
static void reply_not_your_turn(http_req *r, svc_product *p, long long position, long long ms,
                                const char *ticket) {
    svc_room_figures f;
    svc_room_figures_get(p->room, &f);
    long long rm = retry_ms(ms);
    char secs[24];
    const char *retry[] = { "Retry-After", secs, NULL };
    snprintf(secs, sizeof secs, "%lld", (rm + 999) / 1000);
    char body[384 + SVC_ROOM_TICKET_MAX];
    int n = snprintf(body, sizeof body, "{\"error\":\"not_your_turn\",\"message\":\"Ticket "
                     "%lld's turn has not come: the room serves %lld.\",\"position\":%lld,"
                     "\"serving\":%lld,\"estimated_wait_ms\":%lld,\"retry_after_ms\":%lld%s%s%s}\n",
                     position, f.serving, position, f.serving, ms, rm,
                     ticket ? ",\"ticket\":\"" : "", ticket ? ticket : "", ticket ? "\"" : "");
    assert(n > 0 && (size_t)n < sizeof body);
    http_reply_error_json(r, 429, "not_your_turn", body, (size_t)n, retry);
}

/* 429 sale_not_open: the sale opens at opens_ms (Redis's clock, now_ms by
 * it); the buyer is in its pre-queue, its place drawn at the opening. It
 * is told to come back then, a little after at random (at most
 * SVC_ROOM_OPENING_SPREAD_MS: the pre-queue's order is drawn, so coming
 * first gains nothing, and the opening need not meet every buyer in the
 * same millisecond), or within a minute when the opening is further. */
static void reply_not_open(http_req *r, svc_product *p, long long opens_ms, long long now_ms) {
    long long wait = opens_ms - now_ms, rm;
    if (wait > 60000) {
        rm = 60000;
    } else {
        uint32_t j = 0;
        if (getrandom(&j, sizeof j, GRND_NONBLOCK) != sizeof j) j = (uint32_t)now_ms;
        rm = (wait > 0 ? wait : 0) + (long long)(j % (SVC_ROOM_OPENING_SPREAD_MS + 1));
        if (rm < 50) rm = 50;
    }
    char secs[24], when[UTC_TIME_LEN + 1];
    const char *retry[] = { "Retry-After", secs, NULL };
    snprintf(secs, sizeof secs, "%lld", (rm + 999) / 1000);
    utc_time_format(opens_ms, when);
    http_reply_error_with(r, 429, "sale_not_open",
                          json_pack("{s:s, s:I, s:b}", "opens_at", when, "retry_after_ms",
                                    (json_int_t)rm, "pre_queue", 1),
                          retry, "The sale of %s opens at %s. You are in its pre-queue: the "
                          "places are drawn at the opening, so coming back early gains "
                          "nothing; come back then.", p->sku, when);
}

/* 409 turn_over: position's turn ended ms ago. */
static void reply_turn_over(http_req *r, svc_product *p, long long position, long long ms) {
    http_reply_error_with(r, 409, "turn_over",
                          json_pack("{s:I, s:I}", "position", (json_int_t)position,
                                    "turn_ended_ms_ago", (json_int_t)ms),
                          NULL, "Ticket %lld's turn is over; take a new place (POST "
                          "/v1/products/%s/tickets, or an order without the ticket).",
                          position, p->sku);
}

/* ------------------------------------------------- an order held */

/* An order out of its place's turn, waiting in the instance for it (the
 * order's long poll): the beat that brings its turn sends it on into the
 * order path, the one that finds the room sold out answers it so, the one
 * past its deadline answers where it stands (429). A buyer early in the
 * line -- a bot above all, which asks again the instant it is answered --
 * so costs one request and a watcher, not one request per retry: under a
 * crowd those answers were most of the instances' work (831,000 429s for
 * 7,300 units, docs/waiting-room.md). Its inputs are copied: the
 * request's body may be gone by its turn. */
typedef struct held_order {
    http_req *r;
    svc_app *a;
    svc_product *p;
    long long position;
    int quantity;
    char sku[DB_SKU_MAX + 1];
    char user[DB_USER_MAX * 4 + 1];
    char key[DB_KEY_MAX + 1];     /* its Idempotency-Key ("": none) */
    char ticket[SVC_ROOM_TICKET_MAX + 1];   /* its place's, told when sent without ("": none) */
    api_in_turn_fn *go;
    int64_t deadline_us;          /* its wait ends (clock_mono_us) */
} held_order;

/* Whether h, in its turn, should wait on for the next beat: the order path
 * is full (counted as shed: the room's rate falls) and its wait lasts. A
 * buyer shed in its turn would have to come back; held, its order goes in
 * the beat the path has room, its unit kept meanwhile. */
static int wait_on(held_order *h) {
    svc_app *a = h->a;
    return !atomic_load(&a->shutting_down) && clock_mono_us() < h->deadline_us &&
           (svc_admit_door(&a->adm) || svc_admit_shed(&a->adm, h->p->strategy));
}

static void on_order_turn(void *ud, svc_turn turn, long long ms) {
    held_order *h = ud;
    const char *ticket = h->ticket[0] ? h->ticket : NULL;
    switch (turn) {
    case SVC_TURN_NOW: {
        if (wait_on(h) &&
            svc_room_watch(h->p->room, h->position, h->deadline_us, on_order_turn, h) == 0)
            return;
        svc_order_input in = { .sku = h->sku, .user_id = h->user, .quantity = h->quantity,
                               .ticket = NULL };
        h->go(h->a, h->r, h->p, &in, h->key[0] ? h->key : NULL, 1, h->position, ticket);
        break;
    }
    case SVC_TURN_SOLD_OUT:
        reply_sold_out(h->r, h->p->sku);
        break;
    case SVC_TURN_UNKNOWN:
        reply_no_view(h->r, h->a);
        break;
    case SVC_TURN_OVER:
        reply_turn_over(h->r, h->p, h->position, ms);
        break;
    case SVC_TURN_WAIT:                 /* its deadline: where it stands */
        reply_not_your_turn(h->r, h->p, h->position, ms, ticket);
        break;
    }
    free(h);
}

/* Holds r, an order of sku/user/quantity/key whose place (position,
 * ticket: told when the buyer sent none, else NULL) waits ms by the
 * estimate, for up to wait_ms (> 0), and r is answered when it ends (r is
 * deferred). Out of memory or watchers: answered at once, as unheld. */
static void hold_order(svc_app *a, http_req *r, svc_product *p, const char *sku,
                       const char *user, int quantity, const char *key, api_in_turn_fn *go,
                       long long position, const char *ticket, long long ms, long wait_ms) {
    assert(wait_ms > 0 && quantity > 0 && go);
    held_order *h = malloc(sizeof *h);
    if (h) {
        *h = (held_order){ .r = r, .a = a, .p = p, .position = position, .quantity = quantity,
                           .go = go, .deadline_us = clock_mono_us() + (int64_t)wait_ms * 1000 };
        snprintf(h->sku, sizeof h->sku, "%s", sku);
        snprintf(h->user, sizeof h->user, "%s", user);
        snprintf(h->key, sizeof h->key, "%s", key ? key : "");
        snprintf(h->ticket, sizeof h->ticket, "%s", ticket ? ticket : "");
        http_defer(r);
        if (svc_room_watch(p->room, position, h->deadline_us, on_order_turn, h) == 0) {
            atomic_fetch_add_explicit(&a->m.room_orders_held, 1, memory_order_relaxed);
            return;
        }
        free(h);
    }
    reply_not_your_turn(r, p, position, ms, ticket);
}

/* ---------------------------------------------------- taking a place */

/* A buyer's ask for a place, waiting for the call that takes it. Asks
 * queue here while a call takes the ones before them, so that one Redis
 * call takes up to STOCK_ROOM_TAKE_MAX places (a sale's opening minute
 * is tens of thousands of asks a second; a call each, on a handful of
 * workers, was the room's bottleneck: ~10,000 places a second here). One
 * drain runs at a time, on an API worker. */
typedef struct ticket_ask {
    struct ticket_ask *next;
    http_req *r;
    svc_product *p;
    char user[DB_USER_MAX * 4 + 1];
    unsigned char tag[8];         /* its user's (svc_room_user_tag) */
    /* An order sent without a ticket (quantity > 0): it goes on in its
     * place's turn, in the same request. */
    int quantity;
    char sku[DB_SKU_MAX + 1];
    char key[DB_KEY_MAX + 1];     /* its Idempotency-Key ("": none) */
    api_in_turn_fn *go;           /* ...how it goes on in its turn */
    long wait_ms;                 /* ...and how long it waits for it here */
} ticket_ask;

static struct {
    pthread_mutex_t mu;
    ticket_ask *head, *tail;
    int draining;                 /* a drain is queued or running */
    svc_task task;
    svc_app *a;
} asks = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* Answers ask's request from its place pl (ok 0: Redis failed). */
static void answer_place(svc_app *a, ticket_ask *k, int ok, const stock_room_place *pl) {
    const char *secret = svc_room_secret(a);
    svc_product *p = k->p;
    if (!ok || !secret) {
        atomic_fetch_add(&a->m.redis_errors, 1);
        http_reply_error_with(k->r, 503, "redis_unavailable", NULL, api_retry,
                              "Redis is unavailable; no place was taken. Retry shortly.");
        return;
    }
    if (pl->sold_out) {
        reply_sold_out(k->r, p->sku);
        return;
    }
    if (pl->pre_queue) {
        svc_room_place_note(p->room, k->tag, 0, svc_room_opens_ms(p->room));
        reply_not_open(k->r, p, svc_room_opens_ms(p->room), pl->now_ms);
        return;
    }
    svc_room_issued(p->room, pl);
    svc_room_place_note(p->room, k->tag, pl->position, pl->issued_ms);
    char ticket[SVC_ROOM_TICKET_MAX + 1];
    long long ms;
    svc_room_ticket_sign(secret, p->sku, k->tag, pl->position, pl->issued_ms, ticket);
    svc_turn t = svc_room_turn(p->room, pl->position, &ms);
    if (t == SVC_TURN_UNKNOWN || t == SVC_TURN_SOLD_OUT) {
        /* A view older than this answer: Redis's word. */
        t = pl->position <= pl->serving ? SVC_TURN_NOW : SVC_TURN_WAIT;
        ms = t == SVC_TURN_NOW ? svc_room_turn_ms(p->room) : SVC_ROOM_RETRY_MAX_MS;
    }
    if (k->quantity == 0) {
        reply_ticket(k->r, pl->fresh ? 201 : 200, p, ticket, pl->position, t, ms);
        return;
    }
    /* An order: in its place's turn it goes on now; else the buyer hears
     * its place as a ticket, to order with in its turn. */
    if (t == SVC_TURN_NOW) {
        svc_order_input in = { .sku = k->sku, .user_id = k->user, .quantity = k->quantity,
                               .ticket = NULL };
        k->go(a, k->r, p, &in, k->key[0] ? k->key : NULL, 1, pl->position, ticket);
        return;
    }
    if (t == SVC_TURN_WAIT && k->wait_ms > 0) {
        hold_order(a, k->r, p, k->sku, k->user, k->quantity, k->key[0] ? k->key : NULL, k->go,
                   pl->position, ticket, ms, k->wait_ms);
        return;
    }
    if (t == SVC_TURN_WAIT) {
        reply_not_your_turn(k->r, p, pl->position, ms, ticket);
        return;
    }
    /* Over by this view though Redis gave the place as still its turn's
     * (the two clocks a few ms apart at its end): as an order with the
     * ticket would hear. */
    reply_turn_over(k->r, p, pl->position, ms);
}

/* Takes the places of batch[0..n), all of one product, in one call. */
static void take_batch(svc_app *a, ticket_ask **batch, int n) {
    static __thread stock_room_place places[STOCK_ROOM_TAKE_MAX];
    const char *users[STOCK_ROOM_TAKE_MAX];
    uint64_t draws[STOCK_ROOM_TAKE_MAX];
    svc_product *p = batch[0]->p;
    stock_conn *sc = svc_thread_stock(a);
    const char *secret = svc_room_secret(a);
    svc_room_figures f;
    assert(n > 0 && n <= STOCK_ROOM_TAKE_MAX);
    stock_room_ask ask = { .users = users, .n = n, .turn_ms = svc_room_turn_ms(p->room),
                           .opens_ms = svc_room_opens_ms(p->room) };
    /* Draws are read by Redis only before the opening: not made after. */
    int drawing = secret && svc_room_before_opening(p->room);
    for (int i = 0; i < n; i++) {
        users[i] = batch[i]->user;
        if (drawing) draws[i] = svc_room_draw(secret, p->sku, users[i]);
    }
    if (drawing) ask.draws = draws;
    svc_room_figures_get(p->room, &f);
    ask.floor = f.issued;
    int ok = sc && secret && stock_room_take(sc, &p->sp, &ask, places) == 0;
    for (int i = 0; i < n; i++) {
        answer_place(a, batch[i], ok, &places[i]);
        free(batch[i]);
    }
}

static void drain_asks(svc_task *t) {
    (void)t;
    ticket_ask *batch[STOCK_ROOM_TAKE_MAX];
    for (;;) {
        /* The first ask's product, and up to a call's worth of its asks. */
        int n = 0;
        pthread_mutex_lock(&asks.mu);
        svc_app *a = asks.a;
        ticket_ask **link = &asks.head, *last = NULL;
        svc_product *p = asks.head ? asks.head->p : NULL;
        while (*link && n < STOCK_ROOM_TAKE_MAX) {
            ticket_ask *k = *link;
            if (k->p == p) {
                *link = k->next;
                batch[n++] = k;
                if (k == asks.tail) asks.tail = last;   /* the end was reached */
            } else {
                last = k;
                link = &k->next;
            }
        }
        if (n == 0) asks.draining = 0;
        pthread_mutex_unlock(&asks.mu);
        if (n == 0) return;
        take_batch(a, batch, n);
    }
}

/* Queues r's ask for a place in p's room (r is deferred); in: an order
 * sent without a ticket (else NULL), key its Idempotency-Key. */
static void ask_place(svc_app *a, http_req *r, svc_product *p, const char *user,
                      const svc_order_input *in, const char *key, api_in_turn_fn *go,
                      long wait_ms) {
    ticket_ask *k = calloc(1, sizeof *k);
    if (!k) {
        http_reply_error_with(r, 503, "shutting_down", NULL, api_retry,
                              "The service is out of memory; retry shortly.");
        return;
    }
    k->r = r;
    k->p = p;
    snprintf(k->user, sizeof k->user, "%s", user);
    if (in) {
        assert(in->quantity > 0 && go);
        k->quantity = in->quantity;
        snprintf(k->sku, sizeof k->sku, "%s", in->sku);
        snprintf(k->key, sizeof k->key, "%s", key ? key : "");
        k->go = go;
        k->wait_ms = wait_ms;
    }
    /* A place this instance handed out or gave back, its turn not over:
     * Redis would give it back as it is; or a user this instance put in
     * the pre-queue, before the opening: Redis would keep it there.
     * Answered from memory -- a bot asking again and again, or ordering
     * without its ticket, costs no call. */
    svc_room_user_tag(user, k->tag);
    long long position, issued_ms;
    if (svc_room_place_known(p->room, k->tag, &position, &issued_ms)) {
        svc_room_figures f;
        svc_room_figures_get(p->room, &f);
        stock_room_place pl = { .position = position, .issued_ms = issued_ms,
                                .serving = f.serving, .pre_queue = position == 0,
                                .now_ms = svc_room_now_ms(p->room) };
        atomic_fetch_add_explicit(&a->m.room_places_known, 1, memory_order_relaxed);
        answer_place(a, k, 1, &pl);
        free(k);
        return;
    }
    http_defer(r);
    pthread_mutex_lock(&asks.mu);
    if (asks.tail) asks.tail->next = k;
    else asks.head = k;
    asks.tail = k;
    asks.a = a;
    int start = !asks.draining;
    asks.draining = 1;
    if (start) asks.task.run = drain_asks;
    pthread_mutex_unlock(&asks.mu);
    if (start) svc_threadpool_submit(a->api, &asks.task);
}

/* Whether p can take an ask now: answered (409) when it has no room or
 * the room is sold out -- known here, no store asked. */
static int room_open(http_req *r, svc_product *p) {
    long long ms;
    if (!p->room) {
        http_reply_error(r, 409, "no_waiting_room", "%s sells without a waiting room: order it "
                         "with POST /v1/orders.", p->sku);
        return 0;
    }
    if (svc_room_turn(p->room, 1, &ms) == SVC_TURN_SOLD_OUT) {
        reply_sold_out(r, p->sku);
        return 0;
    }
    return 1;
}

static void take_job(api_job *j) {
    svc_product *p = NULL;
    db_status st = svc_product_find(j->a, NULL, j->sku, &p);
    if (st == DB_NOTFOUND) api_reply_unknown_sku(j->r, j->sku);
    else if (st != DB_OK) api_reply_db_failed(j->r, j->a, st == DB_NOCONN, "reading the product");
    else if (room_open(j->r, p)) ask_place(j->a, j->r, p, j->user, NULL, NULL, NULL, 0);
}

void api_ticket_take(http_req *r, const char *const *params, void *ud) {
    svc_app *a = ud;
    const char *user;
    svc_verr e;
    if (!svc_valid_sku(params[0])) {
        api_reply_unknown_sku(r, params[0]);
        return;
    }
    svc_product *p = svc_product_cache_get(a->products, params[0]);
    if (p && !room_open(r, p)) return;       /* before parsing */
    json_t *body = http_body_json(r);
    if (!body) return;
    if (svc_validate_ticket_request(body, &user, &e) != 0) {
        api_reply_verr(r, &e);
        json_decref(body);
        return;
    }
    if (p) {
        ask_place(a, r, p, user, NULL, NULL, NULL, 0);
        json_decref(body);
        return;
    }
    api_job *j = api_job_new(r, a, body);
    if (!j) return;
    snprintf(j->sku, sizeof j->sku, "%s", params[0]);
    snprintf(j->user, sizeof j->user, "%s", user);
    api_defer(r, j, LANE_REDIS, take_job);
}

/* --------------------------------------------------- where it stands */

#define WAIT_MS_MAX 10000         /* the longest a ticket or an order may wait for its turn */

int api_wait_ms(http_req *r, long *ms) {
    const char *v;
    int q = http_query(r, "wait_ms", &v);
    if (q == 0) return 0;
    char *end;
    long n = q > 0 ? strtol(v, &end, 10) : -1;
    if (q < 0 || !v[0] || *end || n < 0 || n > WAIT_MS_MAX) {
        http_reply_error(r, 400, "invalid_field", "'wait_ms' must be an integer 0 to %d: how "
                         "long to wait for the place's turn before answering.", WAIT_MS_MAX);
        return -1;
    }
    *ms = n;
    return 0;
}

/* A GET of a ticket waiting for its turn (?wait_ms=): answered by the
 * beat that brings it, or the room sold out, or its deadline. */
typedef struct ticket_wait {
    http_req *r;
    svc_app *a;
    svc_product *p;
    long long position;
    char ticket[SVC_ROOM_TICKET_MAX + 1];
} ticket_wait;

static void on_watch(void *ud, svc_turn turn, long long ms) {
    ticket_wait *w = ud;
    if (turn == SVC_TURN_SOLD_OUT) reply_sold_out(w->r, w->p->sku);
    else if (turn == SVC_TURN_UNKNOWN) reply_no_view(w->r, w->a);
    else reply_ticket(w->r, 200, w->p, w->ticket, w->position, turn, ms);
    free(w);
}

static void get_on(http_req *r, svc_app *a, svc_product *p, const char *ticket, long wait_ms) {
    const char *secret = svc_room_secret(a);
    svc_ticket t;
    long long ms;
    if (!p->room) {
        http_reply_error(r, 409, "no_waiting_room", "%s sells without a waiting room.", p->sku);
        return;
    }
    if (!secret) {
        reply_no_view(r, a);
        return;
    }
    if (svc_room_ticket_read(secret, p->sku, ticket, &t) != 0) {
        http_reply_error(r, 403, "invalid_ticket", "That is not a ticket of %s's waiting room.",
                         p->sku);
        return;
    }
    svc_turn turn = svc_room_turn(p->room, t.position, &ms);
    if (turn == SVC_TURN_WAIT && wait_ms > 0) {
        ticket_wait *w = malloc(sizeof *w);
        if (w) {
            *w = (ticket_wait){ .r = r, .a = a, .p = p, .position = t.position };
            snprintf(w->ticket, sizeof w->ticket, "%s", ticket);
            http_defer(r);
            if (svc_room_watch(p->room, t.position, clock_mono_us() + wait_ms * 1000, on_watch,
                               w) == 0)
                return;
            free(w);                     /* too many waiting: answered now, as without */
        }
    }
    if (turn == SVC_TURN_SOLD_OUT) reply_sold_out(r, p->sku);
    else if (turn == SVC_TURN_UNKNOWN) reply_no_view(r, a);
    else reply_ticket(r, 200, p, ticket, t.position, turn, ms);
}

static void get_job(api_job *j) {
    svc_product *p = NULL;
    db_status st = svc_product_find(j->a, NULL, j->sku, &p);
    if (st == DB_NOTFOUND) api_reply_unknown_sku(j->r, j->sku);
    else if (st != DB_OK) api_reply_db_failed(j->r, j->a, st == DB_NOCONN, "reading the product");
    else get_on(j->r, j->a, p, j->ref, j->limit);
}

void api_ticket_get(http_req *r, const char *const *params, void *ud) {
    static const char *const known[] = { "wait_ms", NULL };
    svc_app *a = ud;
    const char *unknown;
    long wait_ms = 0;
    if (!svc_valid_sku(params[0])) {
        api_reply_unknown_sku(r, params[0]);
        return;
    }
    if (http_query_only(r, known, &unknown) != 0) {
        http_reply_error(r, 400, "invalid_field", "Unknown query argument '%.40s' (only "
                         "wait_ms).", unknown);
        return;
    }
    if (api_wait_ms(r, &wait_ms) != 0) return;
    svc_product *p = svc_product_cache_get(a->products, params[0]);
    if (p) {
        get_on(r, a, p, params[1], wait_ms);
        return;
    }
    api_job *j = api_job_new(r, a, NULL);
    if (!j) return;
    j->limit = wait_ms;
    snprintf(j->sku, sizeof j->sku, "%s", params[0]);
    snprintf(j->ref, sizeof j->ref, "%.*s", SVC_ROOM_TICKET_MAX + 1, params[1]);
    api_defer(r, j, LANE_DB, get_job);
}

/* ----------------------------------------------------- an order's turn */

long long api_room_admit(http_req *r, svc_app *a, svc_product *p, const svc_order_input *in,
                         const char *key, api_in_turn_fn *go, long wait_ms) {
    const char *secret = svc_room_secret(a);
    svc_ticket t;
    long long ms;
    if (!in->ticket) {              /* the buyer's place first, then the order in its turn */
        if (room_open(r, p)) ask_place(a, r, p, in->user_id, in, key, go, wait_ms);
        return 0;
    }
    if (!secret) {
        reply_no_view(r, a);
        return 0;
    }
    if (svc_room_ticket_read(secret, p->sku, in->ticket, &t) != 0 ||
        !svc_room_ticket_is_users(&t, in->user_id)) {
        http_reply_error(r, 403, "invalid_ticket", "That is not a ticket of %s's waiting room "
                         "issued to this user_id.", p->sku);
        return 0;
    }
    svc_turn turn = svc_room_turn(p->room, t.position, &ms);
    switch (turn) {
    case SVC_TURN_NOW:
        return t.position;
    case SVC_TURN_SOLD_OUT:
        reply_sold_out(r, p->sku);
        return 0;
    case SVC_TURN_UNKNOWN:
        reply_no_view(r, a);
        return 0;
    case SVC_TURN_OVER:
        reply_turn_over(r, p, t.position, ms);
        return 0;
    case SVC_TURN_WAIT:
        if (wait_ms > 0)
            hold_order(a, r, p, in->sku, in->user_id, in->quantity, key, go, t.position, NULL,
                       ms, wait_ms);
        else
            reply_not_your_turn(r, p, t.position, ms, NULL);
        return 0;
    }
    return 0;
}
