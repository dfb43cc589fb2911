/* timerq.c: the buyers' decisions on their holds, due later.
 *
 * A buyer who got a hold (a reserved order) thinks a while, then pays or
 * cancels. The load thread that got the 201 must not wait for that: it
 * keeps serving its other connections. So the decision goes into this
 * thread's queue, due at a time, and the thread's loop sends what is due
 * on its next idle connection. A binary min-heap: the earliest decision is
 * at the top, push and pop cost O(log n) for any number waiting. */
#include <stdlib.h>

#include "loadtest/engine/timerq.h"

static void swap(fl_due *a, fl_due *b) {
    fl_due t = *a;
    *a = *b;
    *b = t;
}

/* Moves entry i up until its parent is due no later. */
static void sift_up(fl_due *h, size_t i) {
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent].at <= h[i].at) return;
        swap(&h[parent], &h[i]);
        i = parent;
    }
}

/* Moves entry i down until its children are due no earlier. */
static void sift_down(fl_due *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, least = i;
        if (l < n && h[l].at < h[least].at) least = l;
        if (r < n && h[r].at < h[least].at) least = r;
        if (least == i) return;
        swap(&h[least], &h[i]);
        i = least;
    }
}

int fl_timerq_push(fl_timerq *q, const fl_due *d) {
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 256;
        fl_due *h = realloc(q->h, cap * sizeof *h);
        if (!h) return -1;
        q->h = h;
        q->cap = cap;
    }
    q->h[q->n] = *d;
    sift_up(q->h, q->n++);
    return 0;
}

const fl_due *fl_timerq_peek(const fl_timerq *q) { return q->n ? &q->h[0] : NULL; }

void fl_timerq_pop(fl_timerq *q, fl_due *out) {
    *out = q->h[0];
    q->h[0] = q->h[--q->n];
    sift_down(q->h, q->n, 0);
}

void fl_timerq_free(fl_timerq *q) {
    free(q->h);
    q->h = NULL;
    q->n = q->cap = 0;
}
