/* cluster.c: the slot map of a Redis Cluster, watched for one process
 * (rtopo.h, "the cluster, watched").
 *
 * The same shape as primary.c's watch of a Sentinel: one thread keeps the
 * map under a mutex and bumps an atomic version when it changes, so a
 * connection checks "did anything move?" with one load and looks a slot up
 * only when it did, or when it has a new key to place. The thread reloads
 * the map (CLUSTER SLOTS, rtopo_slotmap_load) at start, every second, and
 * at once when a connection reports a node suspect (a refused connect, a
 * CLUSTERDOWN). A MOVED a connection receives is applied at once, without
 * waiting for the thread (it names the new owner of one slot), and a reload
 * is asked for too: one slot moved usually means more did. */
#include "rtopo/rtopo.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define RELOAD_EVERY_MS 1000
#define SLICE_MS 20

struct rtopo_cluster {
    rtopo_spec spec;
    int timeout_ms;
    pthread_mutex_t mu;            /* guards map and err */
    rtopo_slotmap *map;
    atomic_uint version;           /* 0: no map loaded yet */
    atomic_int reload;             /* a connection asked for a reload */
    atomic_int stopping;
    pthread_t thread;
    char err[256];                 /* the last failure, for the log */
};

unsigned rtopo_cluster_version(const rtopo_cluster *cl) { return atomic_load(&cl->version); }

unsigned rtopo_cluster_route(rtopo_cluster *cl, int slot, rconn_addr *out) {
    unsigned v = 0;
    pthread_mutex_lock(&cl->mu);
    const rtopo_shard *s = rtopo_slotmap_lookup(cl->map, slot);
    if (s) {
        *out = s->primary;
        v = atomic_load(&cl->version);
        assert(v != 0);                    /* 0: no map yet, so no slot served */
    }
    pthread_mutex_unlock(&cl->mu);
    return v;
}

void rtopo_cluster_suspect(rtopo_cluster *cl) { atomic_store(&cl->reload, 1); }

void rtopo_cluster_moved(rtopo_cluster *cl, const rtopo_redirect *rd) {
    pthread_mutex_lock(&cl->mu);
    const rtopo_shard *s = rtopo_slotmap_lookup(cl->map, rd->slot);
    int same = s && s->primary.port == rd->port && !strcmp(s->primary.host, rd->host);
    if (!same && rtopo_slotmap_moved(cl->map, &cl->spec, rd) == 0)
        atomic_fetch_add(&cl->version, 1);
    pthread_mutex_unlock(&cl->mu);
    atomic_store(&cl->reload, 1);
}

int rtopo_cluster_error(rtopo_cluster *cl, char *buf, size_t len) {
    pthread_mutex_lock(&cl->mu);
    int any = cl->err[0] != '\0';
    snprintf(buf, len, "%s", cl->err);
    pthread_mutex_unlock(&cl->mu);
    return any;
}

/* Whether two maps send every slot to the same primary. */
static int same_routes(const rtopo_slotmap *a, const rtopo_slotmap *b) {
    for (int slot = 0; slot < RTOPO_SLOTS; slot++) {
        const rtopo_shard *x = rtopo_slotmap_lookup(a, slot), *y = rtopo_slotmap_lookup(b, slot);
        if (!x != !y) return 0;
        if (x && (x->primary.port != y->primary.port || strcmp(x->primary.host, y->primary.host)))
            return 0;
    }
    return 1;
}

/* Loads a fresh map (asking the current one's primaries first) and takes
 * it, with a new version when any slot moved. The blocking load runs
 * without the mutex: routing goes on meanwhile. */
static void reload(rtopo_cluster *cl) {
    rtopo_slotmap *fresh = rtopo_slotmap_new();
    char err[sizeof cl->err];
    if (!fresh) return;
    /* Asked: the spec's seeds, then the current map's primaries (a node
     * added since start is known only from the map). */
    rtopo_spec spec = cl->spec;
    pthread_mutex_lock(&cl->mu);
    for (int i = 0; i < rtopo_slotmap_nshards(cl->map) && spec.nseeds < RTOPO_MAX_SEEDS; i++) {
        const rtopo_shard *s = rtopo_slotmap_shard(cl->map, i);
        spec.seeds[spec.nseeds++] = s->primary;
    }
    pthread_mutex_unlock(&cl->mu);
    if (rtopo_slotmap_load(fresh, &spec, cl->timeout_ms, err, sizeof err) != 0) {
        pthread_mutex_lock(&cl->mu);
        snprintf(cl->err, sizeof cl->err, "%s", err);
        pthread_mutex_unlock(&cl->mu);
        rtopo_slotmap_free(fresh);
        return;
    }
    pthread_mutex_lock(&cl->mu);
    cl->err[0] = '\0';
    if (atomic_load(&cl->version) && same_routes(cl->map, fresh)) {
        rtopo_slotmap_free(fresh);
    } else {
        rtopo_slotmap_free(cl->map);
        cl->map = fresh;
        atomic_fetch_add(&cl->version, 1);
    }
    pthread_mutex_unlock(&cl->mu);
}

static void *watch_main(void *arg) {
    rtopo_cluster *cl = arg;
    int64_t next = 0;
    pthread_setname_np(pthread_self(), "rtopo-cluster");
    while (!atomic_load(&cl->stopping)) {
        int asked = atomic_exchange(&cl->reload, 0);
        if (asked || clock_mono_ms() >= next) {
            reload(cl);
            next = clock_mono_ms() + RELOAD_EVERY_MS;
        }
        clock_sleep_ms(SLICE_MS);
    }
    return NULL;
}

rtopo_cluster *rtopo_cluster_start(const rtopo_spec *spec, int timeout_ms, char *err,
                                   size_t errlen) {
    if (spec->kind != RTOPO_CLUSTER) {
        snprintf(err, errlen, "not a cluster address");
        return NULL;
    }
    rtopo_cluster *cl = calloc(1, sizeof *cl);
    if (!cl || !(cl->map = rtopo_slotmap_new())) {
        free(cl);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    assert(spec->nseeds >= 1);
    cl->spec = *spec;
    cl->timeout_ms = timeout_ms > 0 ? timeout_ms : 1000;
    pthread_mutex_init(&cl->mu, NULL);
    reload(cl);                       /* a first map now: routing can start at once */
    if (pthread_create(&cl->thread, NULL, watch_main, cl) != 0) {
        snprintf(err, errlen, "cannot start the cluster watch thread");
        pthread_mutex_destroy(&cl->mu);
        rtopo_slotmap_free(cl->map);
        free(cl);
        return NULL;
    }
    return cl;
}

void rtopo_cluster_stop(rtopo_cluster *cl) {
    if (!cl) return;
    atomic_store(&cl->stopping, 1);
    pthread_join(cl->thread, NULL);
    pthread_mutex_destroy(&cl->mu);
    rtopo_slotmap_free(cl->map);
    free(cl);
}

unsigned rtopo_cluster_describe(rtopo_cluster *cl, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&cl->mu);
    unsigned v = atomic_load(&cl->version);
    int n = rtopo_slotmap_nshards(cl->map);
    for (int i = 0; i < n && used < len; i++) {
        const rtopo_shard *s = rtopo_slotmap_shard(cl->map, i);
        int w = snprintf(buf + used, len - used, "%s%s:%d", i ? "," : "", s->primary.host,
                         s->primary.port);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used < len)
        snprintf(buf + used, len - used, " (%d of %d slots served)",
                 rtopo_slotmap_served(cl->map), RTOPO_SLOTS);
    pthread_mutex_unlock(&cl->mu);
    return v;
}
