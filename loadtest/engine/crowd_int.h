/* crowd_int.h: a crowd's buyers inside a load thread (crowd.c), for the
 * engine (engine.c); private to loadtest/. Each thread owns the buyers
 * whose arrival rank is its id modulo the threads, and a heap of when
 * each of them acts next. */
#ifndef FLASHSALE_LOADTEST_CROWD_INT_H
#define FLASHSALE_LOADTEST_CROWD_INT_H

#include "loadtest/engine/engine.h"

typedef struct fl_crowd_buyer {
    uint32_t idx;                /* arrival rank */
    uint8_t bot;
    uint8_t phase;               /* FL_CROWD_TICKET, FL_CROWD_ORDER, FL_CROWD_DONE */
    uint8_t outcome;             /* FL_BUYER_* */
    uint8_t in_flight;           /* a request of it is out */
    uint8_t polling;             /* ...and it may wait in the service: a long poll (phase
                                    FL_CROWD_POLL) or an order it may hold for its turn */
    uint16_t poll_ms;            /* FL_CROWD_POLL: the wait it asks for */
    uint16_t requests;
    uint16_t polls;              /* ...of them long polls */
    uint32_t position;           /* its place in the room, from its ticket (0: none) */
    int64_t arrive_us, final_us; /* monotonic; final 0: none yet */
    int64_t sent_us;             /* its first request written (monotonic; 0: not yet) */
    char ticket[FL_TICKET_MAX + 1];
} fl_crowd_buyer;

enum { FL_CROWD_TICKET, FL_CROWD_ORDER, FL_CROWD_POLL, FL_CROWD_DONE };

typedef struct fl_crowd_due {
    int64_t at;
    uint32_t i;                  /* index into the part's buyers */
} fl_crowd_due;

typedef struct fl_crowd_part {
    const fl_crowd_opts *o;
    fl_crowd_buyer *b;
    uint32_t n, done;
    uint32_t polls, poll_cap;    /* requests out that may wait in the service (long polls,
                                    orders it may hold), and at most (the thread's
                                    connections they may hold: the rest are for places and
                                    orders answered at once) */
    uint32_t regular, regular_cap;   /* requests out answered at once, and at most (0: no
                                    bound of its own -- the connections not kept for
                                    waiting; > 0 with fl_crowd_opts.hold: --connections) */
    int poll_max_ms;             /* the longest wait a poll asks for (under the timeout) */
    fl_crowd_due *heap;
    size_t hn, hcap;
} fl_crowd_part;

/* Thread id of nw's buyers, on a thread of conns connections, hold of them
 * kept for requests that wait in the service (0: half of them may); none
 * arrives before fl_crowd_part_start. 0, or -1 when out of memory. */
int fl_crowd_part_init(fl_crowd_part *p, const fl_crowd_opts *o, int id, int nw, uint64_t seed,
                       int conns, int hold);
/* The crowd's clock starts at t0 (monotonic us): its buyers arrive over
 * the ramp from then on. Once. */
void fl_crowd_part_start(fl_crowd_part *p, int64_t t0);
void fl_crowd_part_free(fl_crowd_part *p);
/* When the next buyer acts (INT64_MAX: none waiting to, or the next one's
 * request would be answered at once and regular_cap of those are out). */
int64_t fl_crowd_next_at(const fl_crowd_part *p);
/* The buyer due first (the caller checked it is due); taken off the heap. */
uint32_t fl_crowd_pop(fl_crowd_part *p);
/* Writes buyer i's next request into buf (cap bytes); its length. */
size_t fl_crowd_build(fl_crowd_part *p, uint32_t i, const char *sku, const char *hostport,
                      char *buf, size_t cap, int64_t now);
/* Buyer i's request was answered (rs) at now. */
void fl_crowd_answer(fl_crowd_part *p, uint32_t i, const fl_resp *rs, int64_t now);
/* Buyer i's request got no answer (a transport error) at now: it tries again. */
void fl_crowd_lost(fl_crowd_part *p, uint32_t i, int64_t now);
/* Appends the part's buyers to *out (times from t0). 0, or -1 out of memory. */
int fl_crowd_records(const fl_crowd_part *p, int64_t t0, fl_buyer_rec **out, size_t *n);

#endif
