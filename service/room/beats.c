/* beats.c: the waiting rooms' beat thread (beats.h). */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/room/beats.h"
#include "service/room/room.h"

struct svc_room_beats {
    svc_app *a;
    pthread_t thread;
    atomic_int stopping;
    stock_conn *sc;
    uint64_t shed_seen[STOCK_STRATEGY_COUNT];   /* each strategy's shed count, last beat */
    uint64_t shed_now[STOCK_STRATEGY_COUNT];    /* ...and this one's */
    int64_t failing_since;        /* a beat failed since (mono ms; 0: they go through) */
    int64_t next_keep;            /* when to keep the secret in Redis again (mono ms) */
    int split_said;               /* the split below was logged */
};

const char *svc_room_secret(svc_app *a) {
    return atomic_load_explicit(&a->room_secret_known, memory_order_acquire) ? a->room_secret
                                                                              : NULL;
}

/* The secret kept in Redis (or this instance's proposal, then kept). */
static void learn_secret(svc_room_beats *b) {
    svc_app *a = b->a;
    unsigned char raw[24];
    char proposal[2 * sizeof raw + 1];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return;
    for (size_t i = 0; i < sizeof raw; i++) sprintf(proposal + 2 * i, "%02x", raw[i]);
    if (stock_room_secret(b->sc, proposal, a->room_secret, sizeof a->room_secret) == 0)
        atomic_store_explicit(&a->room_secret_known, 1, memory_order_release);
}

/* Keeps this instance's secret in Redis (a Redis that lost it, restarted
 * empty, gets it back from the instances, once a second) and says so when
 * Redis holds another: then instances sign with different secrets and
 * refuse each other's tickets (--room-secret on every instance ends it). */
static void keep_secret(svc_room_beats *b) {
    svc_app *a = b->a;
    char kept[sizeof a->room_secret];
    if (a->cfg.room_secret[0] ||
        stock_room_secret(b->sc, a->room_secret, kept, sizeof kept) != 0)
        return;
    if (strcmp(kept, a->room_secret) != 0 && !b->split_said) {
        svc_log(SVC_LOG_WARN, "waiting rooms: Redis holds another tickets' secret than this "
                "instance's (Redis lost it and another instance made a new one): tickets of the "
                "other instances are refused here; give every instance --room-secret");
        b->split_said = 1;
    }
}

static void beat_one(svc_product *p, void *ud) {
    svc_room_beats *b = ud;
    if (!p->room) return;
    const svc_admission *ad = &b->a->adm.by_strategy[p->strategy];
    svc_room_load load = { .p90_us = svc_admission_p90_us(ad),
                           .target_us = (int64_t)b->a->cfg.latency_target_ms * 1000,
                           .shed = b->shed_now[p->strategy] - b->shed_seen[p->strategy],
                           .inflight = svc_admission_inflight(ad),
                           .limit = svc_admission_limit(ad) };
    int rc = svc_room_beat(p->room, b->sc, &p->sp, &load);
    /* Also when Redis failed: the waits' deadlines. */
    svc_room_wake(p->room, atomic_load(&b->a->shutting_down));
    if (rc == 0) {
        if (b->failing_since) svc_log(SVC_LOG_INFO, "waiting room %s: heard again", p->sku);
        b->failing_since = 0;
    } else if (!b->failing_since) {
        b->failing_since = clock_mono_ms();
        svc_log(SVC_LOG_WARN, "waiting room %s: a beat failed: %s (the room's view grows old; "
                "tickets and orders go on by it)", p->sku, stock_conn_errstr(b->sc));
    }
}

static void *beats_main(void *arg) {
    svc_room_beats *b = arg;
    svc_app *a = b->a;
    pthread_setname_np(pthread_self(), "fs-room");
    int64_t next = clock_mono_ms();
    while (!atomic_load(&b->stopping)) {
        int64_t t = clock_mono_ms();
        if (!svc_room_secret(a)) {
            learn_secret(b);
        } else if (t >= b->next_keep) {
            keep_secret(b);
            b->next_keep = t + 1000;
        }
        /* A strategy's own sheds only: the door's, before the body is
         * read, are mostly the waiting buyers' early asks (a bot's, again
         * and again), which say nothing of what the path takes. */
        for (int s = 0; s < STOCK_STRATEGY_COUNT; s++)
            b->shed_now[s] = svc_admission_shed_count(&a->adm.by_strategy[s]);
        svc_product_cache_each(a->products, beat_one, b);
        memcpy(b->shed_seen, b->shed_now, sizeof b->shed_seen);
        next += STOCK_ROOM_TICK_MS;
        int64_t now = clock_mono_ms();
        if (next < now) next = now;        /* a slow beat: no catching up in a burst */
        clock_sleep_ms(next - now);
    }
    return NULL;
}

svc_room_beats *svc_room_beats_start(svc_app *a, char *err, size_t errlen) {
    svc_room_beats *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->a = a;
    if (a->cfg.room_secret[0]) {
        snprintf(a->room_secret, sizeof a->room_secret, "%s", a->cfg.room_secret);
        atomic_store_explicit(&a->room_secret_known, 1, memory_order_release);
    }
    if (!(b->sc = stock_conn_new(&a->stock_cfg, err, errlen))) {
        free(b);
        return NULL;
    }
    if (pthread_create(&b->thread, NULL, beats_main, b) != 0) {
        snprintf(err, errlen, "cannot start the waiting rooms' thread");
        stock_conn_free(b->sc);
        free(b);
        return NULL;
    }
    return b;
}

void svc_room_beats_stop(svc_room_beats *b) {
    if (!b) return;
    atomic_store(&b->stopping, 1);
    pthread_join(b->thread, NULL);
    stock_conn_free(b->sc);
    free(b);
}
