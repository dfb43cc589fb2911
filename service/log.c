/* log.c: one line per event on stderr, with a UTC timestamp and a level.
 * Events are rare by design (start, stop, dependency errors, rebuilds), so
 * a plain locked stdio write is enough; the order path never logs by
 * default. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "common/clock.h"
#include "db/db.h"
#include "service/log.h"

static svc_log_level min_level = SVC_LOG_INFO;
static const char *const NAMES[] = { "debug", "info", "warn", "error" };

void svc_log_set_level(svc_log_level lvl) { min_level = lvl; }

void svc_log(svc_log_level lvl, const char *fmt, ...) {
    if (lvl < min_level) return;
    char when[UTC_TIME_LEN + 1], line[1024];
    utc_time_format(clock_wall_ms(), when);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line: stdio locks the stream, so lines never mix. */
    fprintf(stderr, "%s flashsale %s: %s\n", when, NAMES[lvl], line);
}
