/* buyers.h: who buys and what a buyer decides -- a small random
 * generator, a zipf sampler in O(1) memory (some buyers come back far more
 * often than others), and the decision on a hold: pay, cancel or abandon
 * it, after thinking (buyers.c). */
#ifndef FLASHSALE_LOADTEST_BUYERS_H
#define FLASHSALE_LOADTEST_BUYERS_H

#include <stdint.h>

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

#endif
