/* inspect.h: `flashload inspect` -- the stores of given SKUs read as the
 * verifier reads them, and their invariants checked, without a load run
 * (inspect.c). */
#ifndef FLASHSALE_LOADTEST_INSPECT_H
#define FLASHSALE_LOADTEST_INSPECT_H

#include <stdio.h>

#include "loadtest/fl.h"

#define FL_INSPECT_MAX_SKUS 16
typedef struct fl_inspect_opts {
    char redis_url[512];         /* "" : Redis not read */
    char key_prefix[64];         /* "" : fs: */
    char db_path[512];           /* "" : SQLite not read */
    int segments;                /* 0: SQLite's products.segments, or 1 without it */
    int nskus;
    char skus[FL_INSPECT_MAX_SKUS][65];   /* read in this order, a SKU again if repeated */
} fl_inspect_opts;

/* Reads each SKU (Redis: the stock copy, pending, returned, and which
 * server answered; SQLite: the product's books) and prints what it saw and
 * the invariants broken to f. Returns 0 when none is, 1 when one is, -1
 * with e set when a store could not be read. */
int fl_inspect(const fl_inspect_opts *o, FILE *f, fl_err *e);

#endif
