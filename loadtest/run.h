/* run.h: one run of flashload -- the product created or found, the load
 * run while the stock is sampled and progress shown, then the verdict
 * (run.c); and how the run is printed and written as JSON. */
#ifndef FLASHSALE_LOADTEST_RUN_H
#define FLASHSALE_LOADTEST_RUN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loadtest/client/client.h"
#include "loadtest/engine/engine.h"
#include "loadtest/fl.h"
#include "loadtest/verify/verify.h"

typedef struct fl_run_opts {
    fl_load_opts load;
    fl_vantage vantage;
    int create;                  /* create the product (else it must exist) */
    fl_product_spec product;
    int verify;                  /* on by default */
    int settle_ms;
    int sample_ms;               /* sampling period while running */
    int progress;                /* a progress line per second on stderr */
    const char *label;           /* shown on progress lines */
    /* Called after each sample with the counters so far; nonzero stops
     * the load (answers in flight are still awaited). NULL: none. */
    int (*tick)(void *ud, const fl_progress *p);
    void *tick_ud;
    const atomic_int *interrupted;   /* set by a signal: stop early */
} fl_run_opts;

void fl_run_opts_default(fl_run_opts *o);

typedef struct fl_run_result {
    fl_load_result load;
    fl_samples samples;
    fl_verdict verdict;
    fl_product product;          /* as created / found */
    int verified;
} fl_run_result;

/* Creates (or finds) the product, runs the load while sampling and showing
 * progress, then verifies. Returns 0 (see res->verdict), or -1 with e set
 * on a usage or setup failure (exit code 2). */
int fl_run(const fl_run_opts *o, fl_run_result *res, fl_err *e);
void fl_run_result_free(fl_run_result *r);
/* Prints the final figures: throughput, latencies, statuses, error codes. */
void fl_run_print(const fl_run_opts *o, const fl_run_result *r, FILE *f);
/* Formats a duration for people: "740us", "7.12ms", "1.20s". */
void fl_fmt_us(uint64_t us, char *out, size_t len);
/* Writes the run as JSON to path. Returns 0 or -1 with e set. */
int fl_run_write_json(const fl_run_opts *o, const fl_run_result *r, const char *path,
                      fl_err *e);

#endif
