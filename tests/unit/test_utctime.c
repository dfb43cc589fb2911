/* test_utctime.c: the one time format (common/utctime.h) against libc's
 * calendar: every day from 2000 to 2101 and random instants to 9999 write
 * as gmtime_r says and read back as timegm says; the strict reader refuses
 * what sscanf let through ("+1" for a month, a short field, a day the
 * month does not have). */
#include <time.h>

#include "common/utctime.h"
#include "tests/unit/t.h"

/* What libc says unix_ms is, in the format. */
static void libc_format(int64_t unix_ms, char out[64]) {
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(out, 64, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(unix_ms % 1000));
}

static int round_trips(int64_t ms) {
    char mine[UTC_TIME_LEN + 1], theirs[64];
    int64_t back = -1;
    utc_time_format(ms, mine);
    libc_format(ms, theirs);
    return !strcmp(mine, theirs) && utc_time_parse(mine, strlen(mine), &back) == 0 && back == ms;
}

static void test_format_and_parse_agree_with_libc(void) {
    int bad = 0;
    const int64_t y2000 = 946684800000LL, day = 86400000LL;
    for (int64_t d = 0; d < 102 * 366; d++)         /* every day, at a moving time of day */
        bad += !round_trips(y2000 + d * day + (d * 7919 % 86400) * 1000 + d % 1000);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 200000; i++) {              /* instants up to 9999 */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        bad += !round_trips(y2000 + (int64_t)(x % (253402300799999ULL - 946684800000ULL)));
    }
    CHECK(bad == 0);
    char t[UTC_TIME_LEN + 1];
    utc_time_format(1796524817123LL, t);
    CHECK_STR(t, "2026-12-06T02:40:17.123Z");
    utc_time_format(1796524817004LL, t);              /* the same second, cached */
    CHECK_STR(t, "2026-12-06T02:40:17.004Z");
}

static int parses(const char *s, int64_t *ms) { return utc_time_parse(s, strlen(s), ms) == 0; }

static void test_parse_is_strict(void) {
    int64_t ms = 0;
    CHECK(parses("2026-12-06T02:40:17Z", &ms) && ms == 1796524817000LL);
    CHECK(parses("2000-02-29T00:00:00.000Z", &ms));   /* a leap year (400) */
    CHECK(parses("2024-02-29T23:59:59.999Z", &ms));
    static const char *const bad[] = {
        "2100-02-29T00:00:00Z",      /* not a leap year (100) */
        "2026-04-31T00:00:00Z", "2026-02-30T00:00:00Z", "2026-13-01T00:00:00Z",
        "2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z",
        "2026-01-01T00:60:00Z", "2026-01-01T00:00:60Z", "1999-12-31T23:59:59Z",
        "2026-+1-05T00:00:00Z", "2026-1-05T00:00:00.0Z", " 2026-01-05T00:00:00Z",
        "2026-01-05 00:00:00Z", "2026-01-05T00:00:00", "2026-01-05T00:00:00.1Z",
        "2026-01-05T00:00:00.12Z", "2026-01-05T00:00:00.123", "2026-01-05T00:00:00+00:00",
        "2026-01-05T00:00:00.123Zx", "", "Z",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (parses(bad[i], &ms)) fprintf(stderr, "  accepted: \"%s\"\n", bad[i]);
        CHECK(!parses(bad[i], &ms));
    }
    CHECK(utc_time_parse("2026-12-06T02:40:17Zjunk", 20, &ms) == 0);   /* len bounds it */
}

int main(int argc, char **argv) {
    static const t_case cases[] = { T(test_format_and_parse_agree_with_libc),
                                    T(test_parse_is_strict) };
    return t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
