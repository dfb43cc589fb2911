/* test_room.c: the service's side of a waiting room (service/room/room.h)
 * without Redis: tickets signed and read back, and refused when any part
 * of them is changed, made up or another's; where a position stands by a
 * view seeded from a place's answer; and the rule an instance's rate
 * follows, case by case. */
#include <math.h>

#include "common/clock.h"
#include "service/room/room.h"
#include "tests/unit/t.h"

#define SECRET "a-secret-of-sixteen+"

static void test_ticket_round_trip(void) {
    char t[SVC_ROOM_TICKET_MAX + 1];
    svc_ticket k;
    unsigned char tag[8];
    svc_room_user_tag("u-42", tag);
    svc_room_ticket_sign(SECRET, "phone-x", tag, 1200, 1796458746374LL, t);
    CHECK(strncmp(t, "t1.1200.1796458746374.", 22) == 0 && strlen(t) <= SVC_ROOM_TICKET_MAX);
    CHECK(svc_room_ticket_read(SECRET, "phone-x", t, &k) == 0);
    CHECK(k.position == 1200 && k.issued_ms == 1796458746374LL);
    CHECK(svc_room_ticket_is_users(&k, "u-42"));
    CHECK(!svc_room_ticket_is_users(&k, "u-43"));
    /* Another product's, another secret's. */
    CHECK(svc_room_ticket_read(SECRET, "phone-y", t, &k) == -1);
    CHECK(svc_room_ticket_read("another-secret-16chars", "phone-x", t, &k) == -1);
    /* Any character changed: refused. */
    for (size_t i = 3; i < strlen(t); i++) {
        char u[sizeof t];
        memcpy(u, t, sizeof t);
        if (u[i] == '.') continue;
        u[i] = u[i] == '1' ? '2' : '1';
        CHECK(svc_room_ticket_read(SECRET, "phone-x", u, &k) == -1);
    }
}

static void test_ticket_malformed(void) {
    svc_ticket k;
    static const char *const BAD[] = {
        "", "t1", "t1.", "t2.1.2.0011223344556677.00112233445566778899aabbccddeeff",
        "t1.01.2.0011223344556677.00112233445566778899aabbccddeeff",      /* a leading zero */
        "t1.0.2.0011223344556677.00112233445566778899aabbccddeeff",       /* position 0 */
        "t1.-1.2.0011223344556677.00112233445566778899aabbccddeeff",
        "t1.1.2.0011223344556677.00112233445566778899AABBCCDDEEFF",       /* upper case */
        "t1.1.2.0011223344556677.00112233445566778899aabbccddeef",        /* short */
        "t1.1.2.0011223344556677.00112233445566778899aabbccddeeff0",      /* long */
        "t1.1.2.001122334455667.700112233445566778899aabbccddeeff",
        "t1.1234567890123456789.2.0011223344556677.00112233445566778899aabbccddeeff",
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++)
        CHECK(svc_room_ticket_read(SECRET, "phone-x", BAD[i], &k) == -1);
    CHECK(svc_room_ticket_read(SECRET, "phone-x", NULL, &k) == -1);
}

static void test_turn_from_a_seeded_view(void) {
    svc_room *r = svc_room_new(30000, 0, 2000, 0);
    long long ms;
    CHECK(svc_room_turn(r, 1, &ms) == SVC_TURN_UNKNOWN);   /* nothing heard yet */
    stock_room_place pl = { .position = 40, .issued_ms = 1000, .serving = 20, .fresh = 1,
                            .now_ms = 1796458746374LL };
    svc_room_issued(r, &pl);
    svc_room_figures f;
    svc_room_figures_get(r, &f);
    CHECK(f.issued == 40 && f.serving == 20 && f.rate == 2000);
    CHECK(svc_room_turn(r, 40, &ms) == SVC_TURN_WAIT && ms == 10);   /* 20 places at 2,000/s */
    CHECK(svc_room_turn(r, 20, &ms) == SVC_TURN_NOW && ms == 30000); /* no marks: its whole turn */
    svc_room_note_sold_out(r);                    /* said at the next beat, not before */
    CHECK(svc_room_turn(r, 20, &ms) == SVC_TURN_NOW);
    svc_room_free(r);
}

static double next(double rate, int64_t p90_us, uint64_t shed, long inflight, long limit,
                   double thr, int waiting) {
    svc_room_load l = { .p90_us = p90_us, .target_us = 100000, .shed = shed,
                        .inflight = inflight, .limit = limit, .throughput = thr };
    return svc_room_rate_next(rate, &l, waiting);
}

static void test_rate_rule(void) {
    /* The path has room and buyers wait: a slow start, while the buyers
     * let in come (it answers more than half the rate). */
    CHECK(fabs(next(1000, 5000, 0, 10, 256, 600, 1) - 1250) < 1e-9);
    CHECK(next(1000, 5000, 0, 10, 256, 600, 0) == 1000);            /* nobody waits */
    CHECK(next(1000, 5000, 0, 10, 256, 400, 1) == 1000);            /* they have not come */
    CHECK(next(1000, 5000, 0, 10, 256, 0, 1) == 1000);              /* none answered yet */
    /* Shed, or the path full: down, but not below what it answers. */
    CHECK(fabs(next(1000, 5000, 3, 10, 256, 0, 1) - 900) < 1e-9);
    CHECK(fabs(next(1000, 5000, 0, 240, 256, 0, 1) - 900) < 1e-9);
    CHECK(next(1000, 5000, 0, 240, 256, 950, 1) == 950);
    CHECK(next(100, 5000, 0, 240, 256, 800, 1) == 800);              /* collapsed below it: up */
    /* Busy, not full: by the p90 (a stale p90 is not read when roomy). */
    CHECK(fabs(next(1000, 150000, 0, 100, 256, 0, 1) - 900) < 1e-9);
    CHECK(fabs(next(1000, 20000, 0, 100, 256, 600, 1) - 1050) < 1e-9);
    CHECK(next(1000, 20000, 0, 100, 256, 400, 1) == 1000);
    CHECK(next(1000, 70000, 0, 100, 256, 0, 1) == 1000);
    CHECK(fabs(next(1000, 900000, 0, 10, 256, 600, 1) - 1250) < 1e-9); /* roomy: p90 stale */
    /* Buyers waiting here for their turn (held orders, polls) count as
     * coming: 30 of them could bring 600 a second (all within a beat). */
    svc_room_load h = { .p90_us = 5000, .target_us = 100000, .inflight = 10, .limit = 256,
                        .throughput = 0, .held = 30 };
    CHECK(fabs(svc_room_rate_next(1000, &h, 1) - 1250) < 1e-9);
    h.held = 20;                                                    /* 400 a second: no */
    CHECK(svc_room_rate_next(1000, &h, 1) == 1000);
    /* Bounds. */
    CHECK(next(SVC_ROOM_RATE_MIN, 0, 1, 0, 256, 0, 1) == SVC_ROOM_RATE_MIN);
    CHECK(next(SVC_ROOM_RATE_MAX, 0, 0, 0, 256, SVC_ROOM_RATE_MAX, 1) == SVC_ROOM_RATE_MAX);
}

/* Places known here: a place noted is known for its user only, while its
 * turn is not over by the view; a user whose slot another took since is
 * not known (it asks Redis). */
static void test_places_known(void) {
    svc_room *r = svc_room_new(30000, 0, 1000, 0);
    unsigned char t1[8], t2[8];
    long long pos = 0, iss = 0;
    CHECK(r != NULL);
    svc_room_user_tag("u1", t1);
    svc_room_user_tag("u2", t2);
    CHECK(!svc_room_place_known(r, t1, &pos, &iss));
    svc_room_place_note(r, t1, 5, 1000);
    CHECK(!svc_room_place_known(r, t1, &pos, &iss));    /* no view yet: not known */
    stock_room_place pl = { .position = 5, .issued_ms = 1000, .serving = 1, .fresh = 1,
                            .now_ms = 1796458746374LL };
    svc_room_issued(r, &pl);
    CHECK(svc_room_place_known(r, t1, &pos, &iss) && pos == 5 && iss == 1000);
    CHECK(!svc_room_place_known(r, t2, &pos, &iss));
    /* Another user in u1's slot takes it. */
    char other[32];
    unsigned char t3[8];
    for (int i = 0;; i++) {
        snprintf(other, sizeof other, "x%d", i);
        svc_room_user_tag(other, t3);
        if (((unsigned)t3[0] << 8 | t3[1]) % SVC_ROOM_KNOWN_PLACES ==
                ((unsigned)t1[0] << 8 | t1[1]) % SVC_ROOM_KNOWN_PLACES &&
            memcmp(t3, t1, 8) != 0)
            break;
    }
    svc_room_place_note(r, t3, 6, 1001);
    CHECK(!svc_room_place_known(r, t1, &pos, &iss));
    CHECK(svc_room_place_known(r, t3, &pos, &iss) && pos == 6);
    /* A room that opened: a user once in its pre-queue is not known so. */
    svc_room_place_note(r, t2, 0, 1000);
    CHECK(!svc_room_place_known(r, t2, &pos, &iss));
    svc_room_free(r);

    /* Before the opening: in the pre-queue, known for a second after it
     * was said. */
    long long now = clock_wall_ms(), opens = now + 60000;
    r = svc_room_new(30000, 0, 1000, opens);
    CHECK(r != NULL);
    stock_room_place pre = { .pre_queue = 1, .now_ms = now };
    svc_room_issued(r, &pre);
    svc_room_place_note(r, t2, 0, opens);
    CHECK(svc_room_place_known(r, t2, &pos, &iss) && pos == 0 && iss == opens);
    CHECK(!svc_room_place_known(r, t1, &pos, &iss));
    clock_sleep_ms(SVC_ROOM_PRE_QUEUE_KNOWN_MS + 50);
    CHECK(!svc_room_place_known(r, t2, &pos, &iss));
    svc_room_free(r);
}

int main(int argc, char **argv) {
    static const t_case cases[] = { T(test_places_known), T(test_ticket_round_trip),
                                    T(test_ticket_malformed), T(test_turn_from_a_seeded_view),
                                    T(test_rate_rule) };
    return t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
