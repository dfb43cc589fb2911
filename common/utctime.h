/* utctime.h: the one way times are written and read -- in the API's
 * bodies, the database's rows and the logs: "YYYY-MM-DDTHH:MM:SS.mmmZ",
 * UTC to the millisecond (an RFC 3339 profile). The service writes them,
 * the API reads them back (a room's opening), and flashload reads the
 * service's. The calendar is computed (proleptic Gregorian), so neither a
 * time zone nor libc's state is involved. */
#ifndef FLASHSALE_UTCTIME_H
#define FLASHSALE_UTCTIME_H

#include <stddef.h>
#include <stdint.h>

#define UTC_TIME_LEN 24        /* "2026-11-22T09:00:00.123Z" */

/* Writes unix_ms (milliseconds since the epoch, years 2000..9999) into
 * out. Thread-safe. */
void utc_time_format(int64_t unix_ms, char out[UTC_TIME_LEN + 1]);

/* Reads s[0..len), the format above or without its milliseconds
 * ("YYYY-MM-DDTHH:MM:SSZ"), years 2000..9999, character by character: no
 * sign, space or short field slips in, and no day a month does not have.
 * 0 with *unix_ms, or -1. */
int utc_time_parse(const char *s, size_t len, int64_t *unix_ms);

#endif
