/* hist.c: the latency histogram of flashload.
 *
 * Log buckets in the manner of HdrHistogram: values below 32 us have a
 * bucket each; above, every power of two is split into 32 equal buckets,
 * so a bucket is at most 1/32 (3.1%) of its values wide. Recording is a
 * bit scan and an increment, so it can sit on the hot path of the event
 * loop; per-thread histograms are merged at the end by adding buckets. */
#include <assert.h>
#include <string.h>

#include "loadtest/engine/hist.h"

void fl_hist_reset(fl_hist *h) {
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

unsigned fl_hist_index(uint64_t us) {
    if (us < FL_HIST_SUB) return (unsigned)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us);      /* floor(log2 us) >= SUB_BITS */
    if (e >= FL_HIST_MAX_BITS) return FL_HIST_BUCKETS - 1;
    unsigned shift = e - FL_HIST_SUB_BITS;
    unsigned sub = (unsigned)(us >> shift) - FL_HIST_SUB;  /* 0 .. SUB-1 */
    unsigned idx = (shift + 1) * FL_HIST_SUB + sub;
    assert(idx < FL_HIST_BUCKETS);
    return idx;
}

uint64_t fl_hist_bucket_low(unsigned idx) {
    assert(idx < FL_HIST_BUCKETS);
    if (idx < FL_HIST_SUB) return idx;
    unsigned shift = idx / FL_HIST_SUB - 1;
    uint64_t sub = idx % FL_HIST_SUB + FL_HIST_SUB;
    return sub << shift;
}

/* The largest value that falls in bucket idx. */
static uint64_t bucket_high(unsigned idx) {
    if (idx < FL_HIST_SUB) return idx;
    unsigned shift = idx / FL_HIST_SUB - 1;
    return fl_hist_bucket_low(idx) + ((uint64_t)1 << shift) - 1;
}

void fl_hist_record(fl_hist *h, uint64_t us) {
    h->b[fl_hist_index(us)]++;
    h->count++;
    h->sum += us;
    if (us < h->min) h->min = us;
    if (us > h->max) h->max = us;
}

void fl_hist_merge(fl_hist *dst, const fl_hist *src) {
    if (!src->count) return;
    for (unsigned i = 0; i < FL_HIST_BUCKETS; i++) dst->b[i] += src->b[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min) dst->min = src->min;
    if (src->max > dst->max) dst->max = src->max;
}

uint64_t fl_hist_percentile(const fl_hist *h, double p) {
    if (!h->count) return 0;
    if (p <= 0) return h->min;
    if (p >= 100) return h->max;
    /* The rank of the p-th percentile, 1-based, rounded up (nearest rank). */
    double want = p / 100.0 * (double)h->count;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want) rank++;
    if (rank == 0) rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < FL_HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen >= rank) {
            uint64_t v = bucket_high(i);
            if (v > h->max) v = h->max;
            if (v < h->min) v = h->min;
            return v;
        }
    }
    return h->max;
}

double fl_hist_mean(const fl_hist *h) {
    return h->count ? (double)h->sum / (double)h->count : 0.0;
}
