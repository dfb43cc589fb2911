/* buyers.c: who buys: random numbers and the zipf choice of buyers.
 *
 * A real flash sale has a few very eager buyers and a long tail; a zipf
 * choice of user ids makes the per-user limit and per-user contention bite
 * the way they do there. The sampler is rejection-inversion (Hörmann and
 * Derflinger, "Rejection-inversion to generate variates from monotone
 * discrete distributions", 1996), as in Apache Commons RNG: O(1) memory and
 * about one uniform draw per variate, for any number of users.
 *
 * What a buyer then does with a hold (pay, cancel or abandon it) and how
 * long it thinks first are drawn here too, from the load thread's own
 * generator, so a seed replays the same decisions. */
#include <assert.h>
#include <math.h>

#include "loadtest/engine/buyers.h"

void fl_rng_seed(fl_rng *r, uint64_t seed) { r->s = seed ? seed : 0x9e3779b97f4a7c15ull; }

uint64_t fl_rng_next(fl_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t fl_rng_below(fl_rng *r, uint64_t n) {
    assert(n > 0);
    /* Lemire's multiply-shift: unbiased enough for n far below 2^64. */
    return (uint64_t)(((unsigned __int128)fl_rng_next(r) * n) >> 64);
}

double fl_rng_unit(fl_rng *r) { return (double)(fl_rng_next(r) >> 11) * 0x1.0p-53; }

/* log1p(x)/x, accurate near 0. */
static double helper1(double x) {
    return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}

/* expm1(x)/x, accurate near 0. */
static double helper2(double x) {
    return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}

/* H(x) = integral of h, h(x) = x^-s, shifted so that s = 1 needs no case. */
static double h_integral(double s, double x) {
    double lx = log(x);
    return helper2((1 - s) * lx) * lx;
}

static double h(double s, double x) { return exp(-s * log(x)); }

static double h_integral_inverse(double s, double x) {
    double t = x * (1 - s);
    if (t < -1) t = -1;           /* rounding: keep log1p's argument in range */
    return exp(helper1(t) * x);
}

void fl_zipf_init(fl_zipf *z, uint64_t n, double s) {
    assert(n >= 1 && s > 0);
    z->n = n;
    z->s = s;
    z->h_x1 = h_integral(s, 1.5) - 1;
    z->h_n = h_integral(s, (double)n + 0.5);
    z->s_param = 2 - h_integral_inverse(s, h_integral(s, 2.5) - h(s, 2));
}

uint64_t fl_zipf_next(const fl_zipf *z, fl_rng *r) {
    for (int tries = 0; tries < 1000; tries++) {
        double u = z->h_n + fl_rng_unit(r) * (z->h_x1 - z->h_n);
        double x = h_integral_inverse(z->s, u);
        uint64_t k = x < 1.5 ? 1 : (uint64_t)(x + 0.5);
        if (k > z->n) k = z->n;
        if ((double)k - x <= z->s_param || u >= h_integral(z->s, (double)k + 0.5) - h(z->s, (double)k))
            return k;
    }
    return 1;                     /* the acceptance rate is > 0.9: never reached */
}

int fl_decide(fl_rng *r, double pay, double cancel) {
    double u = fl_rng_unit(r);
    if (u < pay) return FL_PAY;
    if (u < pay + cancel) return FL_CANCEL;
    return FL_ABANDON;
}

int64_t fl_think_us(fl_rng *r, int hold_seconds) {
    double span = FL_THINK_SHARE * hold_seconds * 1e6;
    return (int64_t)(fl_rng_unit(r) * span);
}
