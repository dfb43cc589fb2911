/* timerq.h: the buyers' decisions on their holds that are due later (pay,
 * cancel), kept by time in a min-heap, one per load thread (timerq.c). */
#ifndef FLASHSALE_LOADTEST_TIMERQ_H
#define FLASHSALE_LOADTEST_TIMERQ_H

#include <stddef.h>
#include <stdint.h>

#include "loadtest/fl.h"

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

#endif
