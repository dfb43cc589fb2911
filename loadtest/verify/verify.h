/* verify.h: the verifier -- the invariants of a run (no unit sold twice,
 * none vanished, every 201 an order and every order a 201) checked from
 * every vantage point configured: the client's own record, the API, Redis
 * and the orders' database (verify.c); those of holds (holds.c); the
 * verdict and how it is printed (verdict.c). */
#ifndef FLASHSALE_LOADTEST_VERIFY_H
#define FLASHSALE_LOADTEST_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "loadtest/client/client.h"
#include "loadtest/engine/engine.h"
#include "loadtest/fl.h"

/* Where to look, besides the client's own record. */
typedef struct fl_vantage {
    fl_target api;               /* the service (any instance) */
    char token[256];
    char redis_url[512];         /* "" : Redis not checked */
    char key_prefix[64];
    char db_path[512];           /* "" : SQLite not checked */
} fl_vantage;

/* The state before the run, so an existing SKU can be tested too. */
typedef struct fl_baseline {
    fl_product p;
    fl_order_id *ids;            /* orders that existed before (sorted) */
    size_t nids;
    long long units;             /* their units */
} fl_baseline;

/* Samples taken while the load runs. */
typedef struct fl_sampler fl_sampler;

typedef struct fl_samples {
    uint64_t n;                  /* samples taken (API) */
    uint64_t redis_n;
    long long min_available;     /* lowest stock_available the API showed */
    long long min_segment;       /* lowest single segment the API showed */
    long long min_redis_segment; /* lowest segment read from Redis */
    uint64_t negative;           /* API samples with anything below zero */
    uint64_t redis_negative;     /* Redis samples with a segment below zero */
    uint64_t redis_stranded;     /* Redis samples with units in segments marked empty */
    long long max_stranded;      /* most such units in one sample */
    uint64_t errors;             /* samples that failed */
    int64_t first_empty_ms;      /* wall clock of the first API sample with nothing
                                  * available (Unix ms; 0: none) */
} fl_samples;

fl_sampler *fl_sampler_new(const fl_vantage *v, const fl_product *p, fl_err *e);
/* Takes one sample from the API and, if configured, Redis. */
void fl_sampler_sample(fl_sampler *s);
void fl_sampler_get(const fl_sampler *s, fl_samples *out);
void fl_sampler_free(fl_sampler *s);

#define FL_MAX_VIOLATIONS 32

typedef struct fl_violation {
    char vantage[8];             /* client, api, redis, sqlite */
    char what[240];              /* "oversold by 37 units (...)" */
    long long size;
} fl_violation;

/* What the verifier found of holds (a product with hold_seconds > 0). */
typedef struct fl_holds_verdict {
    int hold_seconds;            /* 0: the product has no holds (nothing below is set) */
    long long confirmed_units;   /* units of the orders confirmed by a 200 */
    int64_t settle_ms;           /* waited this long for the holds to settle */
    long long held;              /* API, at the end */
    int db;                      /* the counts below were read (SQLite) */
    long long reserved, confirmed, cancelled, expired, owed;   /* this run's holds */
    long long lag_n, lag_p50_ms, lag_p99_ms, lag_max_ms;       /* expired: decided - due */
    long long resold;            /* units ordered beyond the stock: came back, sold again */
    long long after_return;      /* units ordered after the first hold ended */
    int resale_checked;          /* the run's shape promised a resale: a check */
    long long returned_fields;   /* Redis `returned` fields (-1: not read) */
} fl_holds_verdict;

typedef struct fl_verdict {
    int pass;
    fl_violation v[FL_MAX_VIOLATIONS];
    int nv;                      /* listed violations */
    int nv_total;                /* found, listed or not */
    /* Figures (this run's share when the SKU existed before). */
    long long initial;           /* stock put on sale */
    long long sold;              /* API: sold by this run */
    long long available;         /* API: left at the end */
    long long units_201;         /* units the client holds 201s for */
    long long oversold;          /* units sold or offered beyond the stock */
    long long lost;              /* units neither sold nor available */
    long long min_stock;         /* lowest stock seen anywhere */
    long long stranded;          /* Redis: units in segments marked empty (unsellable) */
    long long pending_records, pending_units;   /* Redis, after settling */
    long long orders_listed;     /* API order rows of this run */
    long long orders_without_201, created_without_order;
    long long explained_by_errors;  /* rows matched to a transport error */
    int api_checked, redis_checked, db_checked;
    const char *db_vantage;      /* db_checked: "sqlite" or "postgresql" */
    fl_holds_verdict holds;      /* a product with hold_seconds > 0; all 0 otherwise */
    char notes[512];             /* what could not be checked, and why */
} fl_verdict;

typedef struct fl_verify_in {
    const fl_vantage *v;
    const char *sku;
    const fl_baseline *base;
    const fl_load_result *load;
    const fl_samples *samples;   /* may be NULL */
    int settle_ms;               /* wait this long at most for a quiet state */
    const fl_load_opts *lo;      /* how the load ran (NULL: unknown) */
    int progress;                /* a line per second on stderr while holds settle */
} fl_verify_in;

/* Reads the product and its orders before a run. */
int fl_baseline_take(fl_http *h, const char *sku, fl_baseline *b, fl_err *e);
void fl_baseline_free(fl_baseline *b);
/* Checks every invariant from every vantage point configured. Returns 0
 * with the verdict filled, or -1 with e set when checking itself failed. */
int fl_verify(const fl_verify_in *in, fl_verdict *out, fl_err *e);

/* Prints the verdict: "PASS ..." or "FAIL" and one line per violation. */
void fl_verdict_print(const fl_verdict *vd, FILE *f);
/* One line: "PASS" or the violations joined by "; ". */
void fl_verdict_line(const fl_verdict *vd, char *out, size_t len);
/* The holds' lines: the buyers' decisions and their answers, how the holds
 * ended, the expiry lag, the units sold again (nothing without holds). */
void fl_holds_print(const fl_load_result *l, const fl_verdict *vd, FILE *f);

#endif
