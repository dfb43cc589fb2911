/* primary.c: where the primary is, watched for one process (rtopo.h).
 *
 * One thread per watched Sentinel set: it keeps the current address under
 * a mutex and bumps an atomic version when it changes, so a connection
 * checks "did the primary move?" with one load and fetches the address
 * only when it did. The thread asks the sentinels (each answer confirmed
 * with ROLE by rtopo_sentinel_discover) at start, on +switch-master, when
 * a connection says the primary is suspect, and every second; it waits on
 * its subscription in short slices, so stopping takes at most one. */
#include "rtopo/rtopo.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"

#define ASK_EVERY_MS 1000
#define SLICE_MS 100

struct rtopo_primary {
    rtopo_spec spec;
    int timeout_ms;
    int watched;                   /* a thread follows a Sentinel */
    pthread_mutex_t mu;            /* guards addr, and found_cv's wait */
    pthread_cond_t found_cv;       /* a first address was found */
    rconn_addr addr;
    atomic_uint version;           /* 0: none found yet */
    atomic_uint suspect;           /* the version a connection found wrong */
    atomic_int stopping;
    pthread_t thread;
    char err[256];                 /* the last failure, for the log */
};

int rtopo_primary_watched(const rtopo_primary *p) { return p->watched; }
unsigned rtopo_primary_version(const rtopo_primary *p) { return atomic_load(&p->version); }

unsigned rtopo_primary_get(rtopo_primary *p, rconn_addr *out) {
    pthread_mutex_lock(&p->mu);
    unsigned v = atomic_load(&p->version);
    if (v) *out = p->addr;
    pthread_mutex_unlock(&p->mu);
    return v;
}

void rtopo_primary_suspect(rtopo_primary *p, unsigned version) {
    if (p->watched && version) atomic_store(&p->suspect, version);
}

static int same_node(const rconn_addr *a, const rconn_addr *b) {
    return !strcmp(a->host, b->host) && a->port == b->port && !strcmp(a->path, b->path);
}

/* Asks the sentinels; takes a new address (a new version) when it moved. */
static void ask(rtopo_primary *p) {
    assert(p->watched);                    /* only a followed Sentinel moves the primary */
    rconn_addr found;
    char err[sizeof p->err];
    if (rtopo_sentinel_discover(&p->spec, p->timeout_ms, &found, err, sizeof err) != 0) {
        pthread_mutex_lock(&p->mu);
        snprintf(p->err, sizeof p->err, "%s", err);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    unsigned v = atomic_load(&p->version);
    if (!v || !same_node(&p->addr, &found)) {
        p->addr = found;
        atomic_store(&p->version, v + 1);
        pthread_cond_broadcast(&p->found_cv);
    }
    pthread_mutex_unlock(&p->mu);
}

static void *watch_main(void *arg) {
    rtopo_primary *p = arg;
    redisContext *sub = NULL;
    int64_t next_ask = 0;
    char err[256];
    pthread_setname_np(pthread_self(), "rtopo-watch");
    while (!atomic_load(&p->stopping)) {
        unsigned sus = atomic_exchange(&p->suspect, 0);
        int64_t now = clock_mono_ms();
        if (now >= next_ask || (sus && sus == atomic_load(&p->version))) {
            ask(p);
            next_ask = clock_mono_ms() + ASK_EVERY_MS;
        }
        if (!sub && !(sub = rtopo_sentinel_subscribe(&p->spec, p->timeout_ms, err, sizeof err))) {
            clock_sleep_ms(SLICE_MS);           /* no sentinel answers: ask again later */
            continue;
        }
        rtopo_switch sw;
        int rc = rtopo_sentinel_wait_switch(sub, p->spec.master, SLICE_MS, &sw, err, sizeof err);
        if (rc < 0) {
            redisFree(sub);
            sub = NULL;
        } else if (rc == 1) {
            next_ask = 0;                       /* moved: confirm the new one with ROLE */
        }
    }
    if (sub) redisFree(sub);
    return NULL;
}

rtopo_primary *rtopo_primary_start(const rtopo_spec *spec, int timeout_ms, char *err,
                                   size_t errlen) {
    if (spec->kind == RTOPO_CLUSTER) {
        snprintf(err, errlen, "a cluster has no single primary");
        return NULL;
    }
    rtopo_primary *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    assert(spec->nseeds >= 1);
    p->spec = *spec;
    p->timeout_ms = timeout_ms > 0 ? timeout_ms : 1000;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->found_cv, NULL);
    if (spec->kind == RTOPO_SINGLE) {
        p->addr = spec->seeds[0];
        atomic_store(&p->version, 1);
        return p;
    }
    p->watched = 1;
    if (pthread_create(&p->thread, NULL, watch_main, p) != 0) {
        snprintf(err, errlen, "cannot start the Sentinel watch thread");
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->found_cv);
        free(p);
        return NULL;
    }
    /* A first answer, within the timeout: connections made right after
     * start then go to the primary at once. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->mu);
    while (!atomic_load(&p->version) &&
           pthread_cond_timedwait(&p->found_cv, &p->mu, &until) == 0) {}
    pthread_mutex_unlock(&p->mu);
    return p;
oom:
    snprintf(err, errlen, "out of memory");
    return NULL;
}

void rtopo_primary_stop(rtopo_primary *p) {
    if (!p) return;
    if (p->watched) {
        atomic_store(&p->stopping, 1);
        pthread_join(p->thread, NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->found_cv);
    free(p);
}
