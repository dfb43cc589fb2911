/* room.h: a product's waiting room, in Redis beside its stock
 * (docs/waiting-room.md).
 *
 * Past the order path's capacity, a flash sale without a room is a
 * lottery: refused orders (503, Retry-After) go to whoever retries at the
 * right moment, most of all to whoever ignores Retry-After. A room serves
 * buyers in the order they came instead. A buyer takes a place (one per
 * user): the next position. A serving counter, which every instance
 * shares, moves on at the rate the instances together take orders (each
 * says its own, measured, at every beat; or a fixed rate); a position at
 * or below the counter has its turn, for the room's turn length from the
 * moment the counter reached it. The counter never runs past the last
 * place issued, so an idle room does not bank a burst. It moves at each
 * beat and at each call that takes places (by the time since it last
 * moved, at most 100 ms of it): while the rate keeps up with the
 * arrivals, a new place has its turn as it is taken.
 *
 * A sale may have an opening time: before it no place is issued, and who
 * asks waits in the pre-queue, scored by a draw the service derives from
 * the user id under the room's secret (the same at every ask, on every
 * instance: asking early or often changes nothing, and a buyer cannot
 * know its draw). The first call at or after the opening issues the
 * pre-queue a block of places, in the order of the draws -- the shuffle
 * of Queue-it's and Cloudflare's pre-queues -- and whoever comes later
 * is behind it. A Redis that loses the pre-queue before the opening
 * loses nothing of its order: each buyer rejoins with its draw.
 *
 * Keys, in the product's slot ({sku}): <prefix>{sku}:room (hash: seq, the
 * last place issued; serving, the counter, a decimal; at, when it last
 * moved; sold_out, since when the stock is gone, 0: open; rate; cap,
 * the highest counter the units left allow as of the last beat, -1: none;
 * pre_base, set at the opening: the places issued before the pre-queue's
 * block), :room:pre (user -> its draw, the pre-queue),
 * :room:users (user -> "position:issued_ms"), :room:marks (when the
 * counter reached each value, the last 8192 moves: when a position's turn
 * began), :room:at (the same by time), :room:done (a bit per position
 * whose order had its final answer) and :room:rates (instance ->
 * "orders/s:ms"). All times are Redis's clock (ms).
 *
 * The units left cap the counter (room_tick.lua): the positions in their
 * turn without a final answer each hold a unit, and no more are admitted
 * than the units left beyond them, so a buyer in its turn finds its unit
 * whenever it comes within its turn. Read from the stock keys when they
 * are in the room's slot (a product not spread over a cluster's slots, of
 * a strategy whose stock is in Redis); otherwise only the rate moves it.
 *
 * Redis losing its last writes (restarted empty, a failover to a replica
 * that missed them): each instance passes the highest place and counter it
 * saw at every call, and the room never goes back below them: a place is
 * issued twice only if it was issued by another instance after this one's
 * last beat (STOCK_ROOM_TICK_MS) and lost; a user whose place was lost may
 * take a new one, at the back. The turn of such a place is shared, not
 * doubled: neither oversells (the stock decides that), each can buy.
 *
 * Nothing here decides who may buy: the service checks a ticket (its
 * signature, its position against the counter, its turn) and then sells
 * as the product's strategy does. */
#ifndef FLASHSALE_STOCK_ROOM_H
#define FLASHSALE_STOCK_ROOM_H

#include "stock/stock.h"

#define STOCK_ROOM_TICK_MS 50     /* an instance's beat, per room */
#define STOCK_ROOM_MARKS_MAX 1024 /* marks a beat brings back at most */

/* ------------------------------------------------------------- a place */

typedef struct stock_room_place {
    long long position;           /* 0: no place (sold out, or in the pre-queue) */
    long long issued_ms;          /* when it was taken (the place's, if it was had; in
                                     the pre-queue: the opening) */
    long long serving;            /* the counter (whole positions) */
    int fresh;                    /* 1: a new place (or new in the pre-queue); 0: the
                                     user's, as it was */
    int sold_out;
    int pre_queue;                /* 1: the sale has not opened; the user waits in its
                                     pre-queue */
    long long now_ms;             /* Redis's clock */
} stock_room_place;

#define STOCK_ROOM_DRAW_MAX ((1ull << 48) - 1)   /* a draw fits a double exactly */

/* What a call asks: the places of users[0..n), each with its draw (read
 * only before the sale's opening; NULL, all 0: past it), never below floor (the highest
 * position the caller knows was issued); turns of turn_ms; opens_ms, the
 * sale's opening (Redis's clock, ms since the epoch; 0: none). */
typedef struct stock_room_ask {
    const char *const *users;
    const uint64_t *draws;
    int n;
    long long floor;
    int turn_ms;
    long long opens_ms;
} stock_room_ask;

#define STOCK_ROOM_TAKE_MAX 256   /* places one call takes at most */

/* The places of ask's users in p's room (room_take.lua), in one call on c
 * -- each the one its user has, unless its turn is over, else a new one at
 * the back, never below ask->floor; new places follow the order of the
 * users; the counter moves on as a beat would move it (out[i].serving:
 * after the call, so a place at or below it has its turn from now).
 * Before the sale's opening, no place: each user is kept in the pre-queue
 * (out[i].pre_queue). Returns 0 with out[0..n), or -1 (stock_conn_errstr;
 * places may have been taken: they are their users', found again by the
 * next call). Blocking. */
int stock_room_take(stock_conn *c, const stock_product *p, const stock_room_ask *ask,
                    stock_room_place *out);

/* -------------------------------------------------------------- a beat */

typedef enum stock_room_event {
    STOCK_ROOM_NONE = 0,
    STOCK_ROOM_SOLD_OUT,          /* this instance's store said nothing is left */
    STOCK_ROOM_REOPEN,            /* units came back: the room is open again */
} stock_room_event;

typedef struct stock_room_beat {
    double rate;                  /* this instance's, orders/s (0: says nothing) */
    long long fixed_rate;         /* > 0: the room's rate, whatever the instances say */
    long long marks_from;         /* the counter up to which the caller has the marks */
    long long floor_seq;          /* the highest place the caller knows was issued... */
    long long floor_serving;      /* ...and counter it saw */
    stock_room_event event;
    int turn_ms;
    const long long *done;        /* places whose orders were answered finally here */
    int ndone;
} stock_room_beat;

typedef struct stock_room_state {
    long long seq;                /* the last place issued */
    double serving;               /* the counter */
    long long now_ms;             /* Redis's clock */
    double rate;                  /* the rate it moved at (orders/s, all instances) */
    long long sold_out_ms;        /* > 0: sold out since */
    int nmarks;                   /* marks past marks_from, oldest first */
    long long mark_pos[STOCK_ROOM_MARKS_MAX], mark_ms[STOCK_ROOM_MARKS_MAX];
} stock_room_state;

/* One beat of p's room (room_tick.lua) on c: returns 0 with *out filled,
 * or -1 (stock_conn_errstr). Blocking: the caller's own thread. */
int stock_room_beat_run(stock_conn *c, const stock_product *p, const stock_room_beat *in,
                        stock_room_state *out);

/* The secret the instances sign tickets with, when none is configured:
 * the one kept in Redis, or proposal if there is none yet (it is then
 * kept). Returns 0 with the key in out (NUL-terminated), or -1. */
int stock_room_secret(stock_conn *c, const char *proposal, char *out, size_t len);

#endif
