/* utctime.c: the times of the API, the database and the logs (utctime.h).
 *
 * Every order gets a timestamp, so the writer formats the date and time up
 * to the second once per second and thread, and the milliseconds each
 * time. The reader is strict: a time comes from outside (a client's room
 * opening), and sscanf would take "+1" for a month. */
#include <assert.h>
#include <string.h>

#include "common/utctime.h"

/* Days from 1970-01-01 to y-m-d (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

/* Its inverse (civil_from_days): the date of day z since 1970-01-01. */
static void civil_from_days(int64_t z, int *y, unsigned *m, unsigned *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int)((int64_t)yoe + era * 400 + (*m <= 2));
}

static void put2(char *p, unsigned v) {
    p[0] = (char)('0' + v / 10 % 10);
    p[1] = (char)('0' + v % 10);
}

void utc_time_format(int64_t unix_ms, char out[UTC_TIME_LEN + 1]) {
    static __thread int64_t cached_secs = -1;
    static __thread char cached[UTC_TIME_LEN + 1];
    if (unix_ms < 0) unix_ms = 0;
    int64_t secs = unix_ms / 1000, ms = unix_ms % 1000;
    if (secs != cached_secs) {
        int y;
        unsigned mo, d, sod = (unsigned)(secs % 86400);
        civil_from_days(secs / 86400, &y, &mo, &d);
        memcpy(cached, "0000-00-00T00:00:00.000Z", UTC_TIME_LEN + 1);
        put2(cached, (unsigned)y / 100);
        put2(cached + 2, (unsigned)y % 100);
        put2(cached + 5, mo);
        put2(cached + 8, d);
        put2(cached + 11, sod / 3600);
        put2(cached + 14, sod / 60 % 60);
        put2(cached + 17, sod % 60);
        cached_secs = secs;
    }
    memcpy(out, cached, UTC_TIME_LEN + 1);
    out[20] = (char)('0' + ms / 100);
    out[21] = (char)('0' + ms / 10 % 10);
    out[22] = (char)('0' + ms % 10);
    assert(out[UTC_TIME_LEN - 1] == 'Z' && out[UTC_TIME_LEN] == '\0');
}

/* The value of the n decimal digits at s (checked digits). */
static unsigned digits(const char *s, int n) {
    unsigned v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (unsigned)(s[i] - '0');
    return v;
}

int utc_time_parse(const char *s, size_t len, int64_t *unix_ms) {
    static const char form[] = "dddd-dd-ddTdd:dd:dd.dddZ";
    static const unsigned char mdays[12] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    if (len != 20 && len != UTC_TIME_LEN) return -1;   /* without or with the milliseconds */
    for (size_t i = 0; i + 1 < len; i++)
        if (form[i] == 'd' ? s[i] < '0' || s[i] > '9' : s[i] != form[i]) return -1;
    if (s[len - 1] != 'Z') return -1;
    unsigned y = digits(s, 4), mo = digits(s + 5, 2), d = digits(s + 8, 2),
             h = digits(s + 11, 2), mi = digits(s + 14, 2), sec = digits(s + 17, 2),
             frac = len == UTC_TIME_LEN ? digits(s + 20, 3) : 0;
    if (y < 2000 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 ||
        sec > 59)
        return -1;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo == 2 && d == 29 && !leap) return -1;
    *unix_ms = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60000 + sec * 1000 + frac;
    return 0;
}
