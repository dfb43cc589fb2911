/* hist.h: a latency histogram -- log buckets of ~3% resolution,
 * mergeable across load threads, so that a percentile of millions of
 * answers costs no more memory than one of a hundred (hist.c). */
#ifndef FLASHSALE_LOADTEST_HIST_H
#define FLASHSALE_LOADTEST_HIST_H

#include <stdint.h>

#define FL_HIST_SUB_BITS 5                         /* 32 sub-buckets: <= 3.2% error */
#define FL_HIST_SUB (1u << FL_HIST_SUB_BITS)
#define FL_HIST_MAX_BITS 40                        /* up to 2^40 us (12 days) */
#define FL_HIST_BUCKETS ((FL_HIST_MAX_BITS - FL_HIST_SUB_BITS + 1) * FL_HIST_SUB)

/* Latencies in microseconds: exact below 32 us, then 32 buckets per power
 * of two. Recording is an index computation and an increment. */
typedef struct fl_hist {
    uint64_t count;
    uint64_t sum;
    uint64_t min, max;           /* exact */
    uint64_t b[FL_HIST_BUCKETS];
} fl_hist;

void fl_hist_reset(fl_hist *h);
void fl_hist_record(fl_hist *h, uint64_t us);
/* Adds src's observations to dst. */
void fl_hist_merge(fl_hist *dst, const fl_hist *src);
/* The value at percentile p (0..100): the upper edge of the bucket holding
 * that rank, never above the exact max. 0 when empty. */
uint64_t fl_hist_percentile(const fl_hist *h, double p);
double fl_hist_mean(const fl_hist *h);
/* Bucket index of a value, and the smallest value of a bucket (for tests). */
unsigned fl_hist_index(uint64_t us);
uint64_t fl_hist_bucket_low(unsigned idx);

#endif
