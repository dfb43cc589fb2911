/* fl.c: what every part of flashload shares (fl.h): its errors and the
 * order of order ids. Here rather than in any one part, so that no part
 * leans on another for them. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "loadtest/fl.h"

int fl_errf(fl_err *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int fl_order_id_cmp(const void *a, const void *b) { return strcmp(a, b); }
