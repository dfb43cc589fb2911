/* room.h: the service's side of a product's waiting room
 * (docs/waiting-room.md: why a line, and how it stays fair). Redis keeps the line (stock/room.h); each
 * instance keeps what it last heard of it, so that a waiting buyer's
 * question -- is it my turn? -- and a sold-out room's answer cost no
 * store at all:
 *
 * - Tickets. A place is handed out as a ticket, "t1.<position>.<issued
 *   ms>.<user tag>.<mac>": the user tag is the first 8 bytes of
 *   SHA-256(user id), the mac the first 16 of HMAC-SHA-256 under the
 *   secret every instance shares (--room-secret, else the one kept in
 *   Redis) of the SKU, position, time and tag. Any instance checks any
 *   instance's ticket; a ticket is its holder's (an order checks the tag
 *   against its user id) and its product's.
 * - The view. Each beat (STOCK_ROOM_TICK_MS, the beat thread) brings the
 *   last place issued, the serving counter, the rate, whether the room is
 *   sold out, Redis's clock, and when the counter passed each value (the
 *   marks: when each position's turn began). Between beats the view is
 *   read with atomics; the marks under a mutex.
 * - A turn. A position at or below the counter has its turn for turn_ms
 *   from when the counter reached it; before, it waits (the estimate: its
 *   distance from the counter at the rate); after, its turn is over (the
 *   buyer may take a new place, at the back).
 * - The rate this instance says it can take (svc_room_rate_next): the
 *   room admits at the sum of the instances' rates, so each instance
 *   raises its own while its order path has room (orders in it well under
 *   its admission limit, none shed, the p90 under the target) and lowers
 *   it when its orders are shed or queue past the target: the admission
 *   limit's measure of the order path drives the counter. It starts at
 *   the admission limit over the target (Little's law: what the path
 *   takes at its limit). */
#ifndef FLASHSALE_SERVICE_ROOM_H
#define FLASHSALE_SERVICE_ROOM_H

#include <stdint.h>

#include "stock/room.h"

#define SVC_ROOM_TICKET_MAX 96          /* a ticket's text, at most */
#define SVC_ROOM_SECRET_MAX 128
#define SVC_ROOM_RETRY_MAX_MS 1000      /* a waiting buyer comes back within this */
#define SVC_ROOM_OPENING_SPREAD_MS 500  /* a pre-queued buyer comes back this much past the
                                           opening at most (at random) */
#define SVC_ROOM_RATE_INITIAL 1000.0  /* orders/s an instance says first */
#define SVC_ROOM_RATE_MIN 10.0          /* orders/s an instance says at least... */
#define SVC_ROOM_RATE_MAX 1000000.0     /* ...and at most */
#define SVC_ROOM_DONE_MAX (1 << 20)     /* places answered, kept for a beat at most */

typedef struct svc_room svc_room;

/* A room whose turns last turn_ms (> 0), admitting at fixed_rate orders/s
 * (0: at the instances' measured rates), an instance's own rate starting
 * at initial_rate, opening at opens_ms (Redis's clock, ms since the epoch;
 * 0: open from the start; before it, buyers wait in the pre-queue:
 * stock/room.h). NULL when out of memory. */
svc_room *svc_room_new(int turn_ms, long long fixed_rate, double initial_rate,
                       long long opens_ms);
void svc_room_free(svc_room *r);
int svc_room_turn_ms(const svc_room *r);
long long svc_room_fixed_rate(const svc_room *r);
long long svc_room_opens_ms(const svc_room *r);
/* Whether the sale may not have opened yet, by this instance's view of
 * Redis's clock (a minute's margin for the view before its first beat,
 * the host's clock): while so, its places' asks carry their draws. */
int svc_room_before_opening(const svc_room *r);
/* Redis's clock (ms) by this instance's view; 0 before its first beat. */
long long svc_room_now_ms(const svc_room *r);

/* ------------------------------------------------------------- tickets */

typedef struct svc_ticket {
    long long position;
    long long issued_ms;
    unsigned char user_tag[8];
} svc_ticket;

/* Writes the ticket of (sku, the user of tag -- svc_room_user_tag --,
 * position, issued_ms) under secret into out (NUL-terminated, at most
 * SVC_ROOM_TICKET_MAX). */
void svc_room_ticket_sign(const char *secret, const char *sku, const unsigned char tag[8],
                          long long position, long long issued_ms,
                          char out[SVC_ROOM_TICKET_MAX + 1]);
/* Whether text is a ticket of sku under secret: 0 with *t, else -1
 * (malformed, or not signed so: forged, changed, another product's). */
int svc_room_ticket_read(const char *secret, const char *sku, const char *text, svc_ticket *t);
/* Whether t was issued to user. */
int svc_room_ticket_is_users(const svc_ticket *t, const char *user);

/* user's draw in sku's pre-queue (stock/room.h): the first 48 bits of
 * HMAC-SHA-256 under secret of "pre|sku|user" -- the same on every
 * instance and at every ask, and unknown to a buyer without the secret,
 * so no choice of user id, no early or repeated ask, buys a better place
 * at the opening. */
uint64_t svc_room_draw(const char *secret, const char *sku, const char *user);

/* ------------------------------------------------------------ the view */

typedef enum svc_turn {
    SVC_TURN_WAIT,                /* not yet: *ms is the estimated wait */
    SVC_TURN_NOW,                 /* its turn: *ms is what is left of it */
    SVC_TURN_OVER,                /* its turn ended *ms ago */
    SVC_TURN_SOLD_OUT,            /* the room is sold out */
    SVC_TURN_UNKNOWN,             /* no beat heard yet (Redis unreachable since the start) */
} svc_turn;

/* Where position stands now, by this instance's view. */
svc_turn svc_room_turn(svc_room *r, long long position, long long *ms);

typedef struct svc_room_figures {
    long long issued;             /* the last place issued */
    long long serving;            /* the counter (whole positions) */
    double rate;                  /* the room's rate (orders/s, all instances) */
    long long sold_out_ms;        /* > 0: sold out since (Redis's clock, ms) */
} svc_room_figures;

void svc_room_figures_get(svc_room *r, svc_room_figures *out);

/* A place was taken here (pl: Redis's answer): the room never issues
 * below it, the counter is at least pl->serving, and a room not heard
 * from yet (its first beat is at most STOCK_ROOM_TICK_MS away) is known
 * by this answer meanwhile, at this instance's own rate. */
void svc_room_issued(svc_room *r, const stock_room_place *pl);

/* ---------------------------------------------------- places known here
 *
 * The places this instance handed out or gave back lately, by user: a
 * user who asks for its place again -- a lost ticket, an order sent
 * without one, a bot that asks and asks -- hears it from memory while its
 * turn is not over, as Redis would answer (the place a user has is given
 * back as it is), without a call; and a user already in the pre-queue
 * hears so again before the opening (joining it twice is joining it
 * once), for SVC_ROOM_PRE_QUEUE_KNOWN_MS after Redis said so: a Redis
 * restarted empty lost its pre-queue, and the user's next ask after that
 * puts it back. A place is never issued twice (the
 * floor, svc_room_issued), so one remembered here stays its user's even
 * if Redis lost it. A table of SVC_ROOM_KNOWN_PLACES slots by the user's
 * tag: a user whose slot another took since asks Redis, as before. */

#define SVC_ROOM_KNOWN_PLACES 65536   /* places remembered per room (2.5 MiB) */
#define SVC_ROOM_PRE_QUEUE_KNOWN_MS 1000   /* a user in the pre-queue is known so this long */

/* The first 8 bytes of SHA-256(user): the tag its tickets carry. */
void svc_room_user_tag(const char *user, unsigned char tag[8]);
/* Remembers the place (position > 0, issued at issued_ms; 0: the user is
 * in the pre-queue, the opening at issued_ms) of the user of tag (any
 * thread). */
void svc_room_place_note(svc_room *r, const unsigned char tag[8], long long position,
                         long long issued_ms);
/* 1 with *position and *issued_ms when the place of the user of tag is
 * known here and its turn is not over by the view, or (*position 0) the
 * user is known to be in the pre-queue and the sale has not opened by the
 * view (any thread); else 0. */
int svc_room_place_known(svc_room *r, const unsigned char tag[8], long long *position,
                         long long *issued_ms);

/* An order with the ticket of position was answered finally (a unit, or a
 * refusal a retry cannot change): its place no longer holds a unit; the
 * next beat tells the room (stock/room.h, the cap by the units left). */
void svc_room_done(svc_room *r, long long position);

/* The store said the product is sold out / units came back (any thread):
 * the next beat tells the room. */
void svc_room_note_sold_out(svc_room *r);
void svc_room_note_units(svc_room *r);

/* ------------------------------------------------------------ watchers */

/* Called once, on the beat thread, with where position stands: its turn
 * (SVC_TURN_NOW, ms left of it), the room sold out, or (SVC_TURN_WAIT,
 * the estimate) its deadline reached. */
typedef void svc_room_watch_fn(void *ud, svc_turn t, long long ms);

#define SVC_ROOM_WATCHERS_MAX 1000000   /* waits at once, per room (past it: refused) */

/* Watches position until its turn comes, the room is sold out, or
 * deadline_us (clock_mono_us) passes: a buyer told the moment its turn
 * comes, not by a retry told in advance (a long poll). Returns 0, or -1
 * (too many watchers, out of memory): fn will not be called. fn may watch
 * again: it is called at the next wake, not this one. */
int svc_room_watch(svc_room *r, long long position, int64_t deadline_us, svc_room_watch_fn *fn,
                   void *ud);
/* Calls the watchers that are due (the beat thread, after each beat,
 * whether or not it reached Redis); all: every watcher, as if its
 * deadline had passed (the instance is shutting down: its waits are
 * answered where they stand, not held to their deadlines). */
void svc_room_wake(svc_room *r, int all);

/* ------------------------------------------------------------- a beat */

/* What the instance's order path did since the last beat, for its rate. */
typedef struct svc_room_load {
    int64_t p90_us;               /* the strategy's latest p90 in the path (0: none) */
    int64_t target_us;            /* the latency target */
    uint64_t shed;                /* its orders refused overloaded, since the last beat */
    long inflight, limit;         /* its orders in the path now, and its admission limit */
    double throughput;            /* the room's orders answered finally here a second, lately
                                     (svc_room_beat fills it in; 0: none) */
    long held;                    /* buyers waiting here for their turn (held orders, long
                                     polls: svc_room_beat fills it in) */
} svc_room_load;

/* One beat of p's room on c (the beat thread): says this instance's rate,
 * hears the room. Returns 0, or -1 (Redis failed: the view stays as it
 * was, growing older). */
int svc_room_beat(svc_room *r, stock_conn *c, const stock_product *p, const svc_room_load *load);

/* The rule, pure (unit tests): an instance's next rate from its rate, its
 * load and whether buyers wait beyond the counter. */
double svc_room_rate_next(double rate, const svc_room_load *load, int waiting);

#endif
