/* verify_int.h: what the verifier's files share, and nobody else: the
 * verdict's bookkeeping (verdict.c), which verify.c calls. Not part of
 * loadtest.h: these are the verifier's insides, free to change with it.
 *
 * The files call downwards only: verify.c -> verdict.c. */
#ifndef FLASHSALE_VERIFY_INT_H
#define FLASHSALE_VERIFY_INT_H

#include "loadtest/loadtest.h"

/* ------------------------------------------------------------ the verdict */

/* Records a broken invariant, seen from vantage, of the given size. */
void fl_violate(fl_verdict *vd, const char *vantage, long long size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Adds to the notes: what could not be checked, and why. */
void fl_note(fl_verdict *vd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Keeps v if it is the lowest stock seen so far. */
void fl_see_stock(fl_verdict *vd, long long v);
/* Whether order id existed before the run (b may be NULL: none did). */
int fl_baseline_has(const fl_baseline *b, const char *id);

#endif
