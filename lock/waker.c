/* waker.c: one subscriber connection per server and client, and the thread
 * that reads it, turning release notices into wake-ups of waiting threads.
 *
 * Each waiting acquire has its own channel (B:wake:<waiter id>), so a
 * release wakes exactly the waiter it popped from the queue. Releases by
 * clients that publish nothing (node-redlock, redis-py) are seen through
 * Redis keyspace notifications when the server has them on: per lock name
 * with local waiters ("topic") the connection also listens on
 * __keyspace@<db>__:<name> and on the marker channel B:wake:, which our own
 * releases publish to just before their DEL. A del that follows a marker is
 * ours (its queue wakes one waiter; ignored here); any other del, expired
 * or evicted event wakes the topic's oldest waiter. See lock.h, OTHER
 * CLIENTS' RELEASES, for why the library never turns notifications on
 * itself. Waiting threads
 * write SUBSCRIBE/UNSUBSCRIBE themselves (under waker.mu); only this thread
 * reads, connects and frees the subscriber connections, so it never polls a
 * socket that another thread closed. hiredis 0.14 cannot wait on a socket
 * with a timeout and keep the context usable, hence poll() on the fd and
 * then redisBufferRead + redisGetReplyFromReader. */
#include "lock/redis_int.h"
#include "rtopo/rtopo.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"

static unsigned chan_hash(const char *s, size_t n) {
    unsigned h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h % LOCK_WAITER_BUCKETS;
}

static lock_waiter *find_waiter(lock_waker *wk, const char *chan, size_t n) {
    for (lock_waiter *w = wk->buckets[chan_hash(chan, n)]; w; w = w->next)
        if (w->chanlen == n && !memcmp(w->chan, chan, n)) return w;
    return NULL;
}

/* -------------------------------------------------------------- topics */

static lock_topic *find_topic(lock_waker *wk, const char *name, size_t n) {
    for (lock_topic *t = wk->topics[chan_hash(name, n)]; t; t = t->next)
        if (t->namelen == n && !memcmp(t->name, name, n)) return t;
    return NULL;
}

static lock_topic *find_marker(lock_waker *wk, const char *chan, size_t n) {
    for (lock_topic *t = wk->markers[chan_hash(chan, n)]; t; t = t->mnext)
        if (t->markerlen == n && !memcmp(t->marker, chan, n)) return t;
    return NULL;
}

/* The topic a keyspace channel of server s names, or NULL. */
static lock_topic *keyspace_topic(lock_waker *wk, const lock_server *s, const char *chan,
                                  size_t n) {
    char pfx[48];
    size_t pl = (size_t)snprintf(pfx, sizeof pfx, "__keyspace@%d__:", s->addr.db);
    if (n <= pl || memcmp(chan, pfx, pl)) return NULL;
    return find_topic(wk, chan + pl, n - pl);
}

/* Whether a keyspace event says the key is gone. */
static int gone_event(const redisReply *ev) {
    return ev->type == REDIS_REPLY_STRING &&
           (!strcmp(ev->str, "del") || !strcmp(ev->str, "expired") || !strcmp(ev->str, "evicted"));
}

/* Appends SUBSCRIBE or UNSUBSCRIBE of t's keyspace and marker channels to
 * s's subscriber. */
static void topic_append(lock_server *s, const char *verb, const lock_topic *t) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    char ks[LOCK_NAME_MAX + 48];
    size_t kl = (size_t)snprintf(ks, sizeof ks, "__keyspace@%d__:%s", s->addr.db, t->name);
    const char *argv[3] = { verb, ks, t->marker };
    size_t len[3] = { strlen(verb), kl, t->markerlen };
    if (redisAppendCommandArgv(s->sub, 3, argv, len) != REDIS_OK) s->sub_broken = 1;
}

/* Joins w to its name's topic, creating it (and returning it, to be
 * subscribed) if w is the first local waiter of the name. NULL when the
 * topic exists already or cannot be made (w then relies on its queue and
 * the re-check). */
static lock_topic *topic_join(lock_waker *wk, lock_waiter *w) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    size_t n = w->name ? strlen(w->name) : 0;
    size_t ml = w->chanlen - strlen(w->id);        /* the chan's B:wake: prefix */
    lock_topic *t = n ? find_topic(wk, w->name, n) : NULL, *fresh = NULL;
    if (!t && n && n <= LOCK_NAME_MAX && ml < sizeof t->marker && (t = calloc(1, sizeof *t))) {
        memcpy(t->name, w->name, n + 1);
        t->namelen = n;
        memcpy(t->marker, w->chan, ml);
        t->markerlen = ml;
        unsigned b = chan_hash(t->name, n), mb = chan_hash(t->marker, ml);
        t->next = wk->topics[b];
        wk->topics[b] = t;
        t->mnext = wk->markers[mb];
        wk->markers[mb] = t;
        fresh = t;
    }
    if (!t) return NULL;
    assert(!w->topic && !t->first == !t->last);   /* in one topic at most; a list */
    w->topic = t;
    w->tnext = NULL;
    if (t->last) t->last->tnext = w;
    else t->first = w;
    t->last = w;
    return fresh;
}

/* Takes w out of its topic; returns the topic if it is now empty (out of
 * the tables, to be unsubscribed and freed by the caller). */
static lock_topic *topic_leave(lock_redis *r, lock_waiter *w) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    lock_waker *wk = &r->waker;
    lock_topic *t = w->topic;
    if (!t) return NULL;
    lock_waiter **pp = &t->first, *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->tnext;
    }
    assert(*pp == w);                     /* w is in the topic it names */
    *pp = w->tnext;
    if (t->last == w) t->last = prev;
    w->topic = NULL;
    if (t->first) return NULL;
    lock_topic **tp = &wk->topics[chan_hash(t->name, t->namelen)];
    while (*tp != t) tp = &(*tp)->next;
    *tp = t->next;
    tp = &wk->markers[chan_hash(t->marker, t->markerlen)];
    while (*tp != t) tp = &(*tp)->mnext;
    *tp = t->mnext;
    for (int i = 0; i < r->nservers; i++)
        if (r->servers[i].released == t) r->servers[i].released = NULL;
    return t;
}

/* A release nobody announced: wake the oldest local waiter of t, once
 * (woken = 2: counted as a keyspace wake-up if a wait ends by it). */
static void wake_oldest(lock_topic *t) {
    lock_waiter *w = t->first;
    if (!w || w->woken) return;
    w->woken = 2;
    pthread_cond_signal(&w->cv);
}

static void kick(lock_waker *wk) {
    uint64_t one = 1;
    if (write(wk->efd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is already non-zero, the thread will wake. */
    }
}

/* Writes out what is buffered on s's subscriber. A failed
 * write marks it broken; the thread drops and reconnects it. */
static void sub_flush(lock_server *s) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    int done = 0;
    lock_pipe_guard g;
    lock_nosigpipe_begin(&g);
    while (!done) {
        if (redisBufferWrite(s->sub, &done) == REDIS_ERR) {
            s->sub_broken = 1;
            break;
        }
    }
    lock_nosigpipe_end(&g);
}

static int sub_up(const lock_server *s) { return s->sub && !s->sub_broken; }

static void sub_append(lock_server *s, const char *verb, const lock_waiter *w) {
    const char *argv[2] = { verb, w->chan };
    size_t len[2] = { strlen(verb), w->chanlen };
    if (redisAppendCommandArgv(s->sub, 2, argv, len) != REDIS_OK) s->sub_broken = 1;
}

/* ------------------------------------------------------------ the thread */

/* A message from a subscriber connection. */
static void dispatch(lock_redis *rd, lock_server *s, const redisReply *r) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    lock_waker *wk = &rd->waker;
    /* A marker speaks for the very next message only: the script that
     * published it ran its DEL right after, atomically. */
    lock_topic *ours = s->released;
    s->released = NULL;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *chan = r->element[1]->str;
    size_t n = r->element[1]->len;
    lock_waiter *w = find_waiter(wk, chan, n);
    if (!strcmp(r->element[0]->str, "message")) {
        lock_topic *t;
        if (w) {
            w->woken = 1;
            pthread_cond_signal(&w->cv);
        } else if ((t = find_marker(wk, chan, n))) {
            s->released = t;
        } else if ((t = keyspace_topic(wk, s, chan, n)) && gone_event(r->element[2]) &&
                   !(t == ours && !strcmp(r->element[2]->str, "del"))) {
            wake_oldest(t);
        }
    } else if (w && !strcmp(r->element[0]->str, "subscribe")) {
        w->confirmed |= 1u << s->index;
        pthread_cond_broadcast(&wk->state_cv);
    }
}

static void read_sub(lock_redis *r, lock_server *s) {
    if (redisBufferRead(s->sub) != REDIS_OK) {
        s->sub_broken = 1;
        return;
    }
    for (;;) {
        redisReply *m = NULL;
        if (redisGetReplyFromReader(s->sub, (void **)&m) != REDIS_OK) {
            s->sub_broken = 1;
            return;
        }
        if (!m) return;
        dispatch(r, s, m);
        freeReplyObject(m);
    }
}

/* Closes a broken subscriber; its subscriptions are gone with it. */
static void drop_sub(lock_waker *wk, lock_server *s) {
    redisFree(s->sub);
    s->sub = NULL;
    s->sub_broken = 0;
    s->released = NULL;
    s->sub_retry_us = clock_mono_us();   /* a restart: reconnect at once */
    for (int b = 0; b < LOCK_WAITER_BUCKETS; b++)
        for (lock_waiter *w = wk->buckets[b]; w; w = w->next) w->confirmed &= ~(1u << s->index);
    pthread_cond_broadcast(&wk->state_cv);
}

/* Whether the server has keyspace notifications for DEL on: 1 (K and g,
 * or A), -1 (not), 0 (CONFIG refused or renamed: unknown). Asked on the
 * new subscriber connection before it subscribes; never changed. Sets
 * *broken when the connection failed. */
static int keyspace_config(redisContext *ctx, int *broken) {
    redisReply *r = redisCommand(ctx, "CONFIG GET notify-keyspace-events");
    int on = 0;
    *broken = r == NULL;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        const char *f = r->element[1]->str;
        on = strchr(f, 'K') && (strchr(f, 'g') || strchr(f, 'A')) ? 1 : -1;
    }
    if (r) freeReplyObject(r);
    return on;
}

/* Connects s's subscriber and subscribes every current topic and waiter.
 * Called with waker.mu held; drops it while connecting. */
static void connect_sub(lock_redis *r, lock_server *s) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    lock_waker *wk = &r->waker;
    char err[200];
    int keyspace = 0, broken = 0;
    lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
    rconn_addr addr;
    unsigned version = lock_server_addr(s, &addr);
    redisContext *ctx = version ? rconn_connect(&addr, r->timeout_ms, err, sizeof err) : NULL;
    if (ctx) lock_set_cloexec(ctx);
    if (ctx && (keyspace = keyspace_config(ctx, &broken), broken)) {
        redisFree(ctx);
        ctx = NULL;
    }
    lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
    if (!ctx) {
        s->sub_retry_us = clock_mono_us() + LOCK_DOWN_MS * 1000;
        pthread_cond_broadcast(&wk->state_cv);
        return;
    }
    s->sub = ctx;
    s->sub_broken = 0;
    s->sub_version = version;
    s->keyspace = keyspace;
    s->released = NULL;
    /* Topics first: a waiter's confirmation then covers its topic's. */
    for (int b = 0; b < LOCK_WAITER_BUCKETS; b++)
        for (lock_topic *t = wk->topics[b]; t; t = t->next) topic_append(s, "SUBSCRIBE", t);
    for (int b = 0; b < LOCK_WAITER_BUCKETS; b++)
        for (lock_waiter *w = wk->buckets[b]; w; w = w->next) sub_append(s, "SUBSCRIBE", w);
    if (!s->sub_broken) sub_flush(s);
    pthread_cond_broadcast(&wk->state_cv);
}

/* The poll() timeout: until the next reconnect is due, if one is wanted. */
/* How often the waker looks whether a watched primary moved. */
#define FOLLOW_EVERY_MS 200

static int poll_timeout_ms(lock_redis *r, int64_t now) {
    int64_t next = INT64_MAX;
    if (r->waker.nwaiters == 0) return -1;
    for (int i = 0; i < r->nservers; i++) {
        const lock_server *s = &r->servers[i];
        if (!s->sub && s->sub_retry_us < next) next = s->sub_retry_us;
    }
    /* A Sentinel-watched server: look again soon whether its primary moved. */
    for (int i = 0; i < r->nservers; i++)
        if (r->servers[i].primary && now + FOLLOW_EVERY_MS * 1000 < next)
            next = now + FOLLOW_EVERY_MS * 1000;
    if (next == INT64_MAX) return -1;
    return next <= now ? 0 : (int)((next - now + 999) / 1000);
}

static void *waker_main(void *arg) {
    lock_redis *r = arg;
    lock_waker *wk = &r->waker;
    struct pollfd pfd[LOCK_MAX_SERVERS + 1];
    int who[LOCK_MAX_SERVERS + 1];
    lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
    while (!wk->stop) {
        for (int i = 0; i < r->nservers; i++) {
            lock_server *s = &r->servers[i];
            /* A subscriber to a primary that has moved hears nothing more. */
            if (s->sub && (s->sub_broken || s->sub->err ||
                           (s->primary && rtopo_primary_version(s->primary) != s->sub_version)))
                drop_sub(wk, s);
            if (!s->sub && wk->nwaiters > 0 && clock_mono_us() >= s->sub_retry_us && !wk->stop)
                connect_sub(r, s);
        }
        int n = 1;
        pfd[0] = (struct pollfd){ wk->efd, POLLIN, 0 };
        for (int i = 0; i < r->nservers; i++) {
            if (!r->servers[i].sub) continue;
            pfd[n] = (struct pollfd){ r->servers[i].sub->fd, POLLIN, 0 };
            who[n++] = i;
        }
        int timeout = poll_timeout_ms(r, clock_mono_us());
        lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
        int rc = poll(pfd, (nfds_t)n, timeout);
        lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
        if (rc < 0 && errno != EINTR) break;
        if (rc <= 0) continue;
        if (pfd[0].revents) {
            uint64_t v;
            if (read(wk->efd, &v, sizeof v) < 0) { /* nothing pending */ }
        }
        for (int k = 1; k < n; k++) {
            lock_server *s = &r->servers[who[k]];
            if (pfd[k].revents && s->sub && !s->sub_broken) read_sub(r, s);
        }
    }
    lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
    return NULL;
}

/* Starts the thread on first use. */
static int waker_start(lock_redis *r) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    lock_waker *wk = &r->waker;
    if (wk->started) return 0;
    if (wk->stop) return -1;
    wk->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wk->efd < 0) return -1;
    if (lock_thread_start(&wk->thread, waker_main, r)) {
        close(wk->efd);
        wk->efd = -1;
        return -1;
    }
    wk->started = 1;
    return 0;
}

/* ----------------------------------------------------------------- waiters */

/* Done waiting for confirmations: every server has confirmed, or has no
 * subscriber and none is about to be connected. */
static int settled(const lock_redis *r, const lock_waiter *w, int64_t now) {
    for (int i = 0; i < r->nservers; i++) {
        const lock_server *s = &r->servers[i];
        if (w->confirmed & (1u << i)) continue;
        if (sub_up(s) || now >= s->sub_retry_us) return 0;
    }
    return 1;
}

int lock_waiter_add(lock_redis *r, lock_waiter *w, int64_t deadline_us) {
    lock_waker *wk = &r->waker;
    lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
    if (waker_start(r)) {
        lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
        return -1;
    }
    unsigned b = chan_hash(w->chan, w->chanlen);
    w->next = wk->buckets[b];
    wk->buckets[b] = w;
    wk->nwaiters++;
    lock_topic *fresh = topic_join(wk, w);
    int need_thread = 0;
    for (int i = 0; i < r->nservers; i++) {
        lock_server *s = &r->servers[i];
        if (sub_up(s)) {
            if (fresh) topic_append(s, "SUBSCRIBE", fresh);
            sub_append(s, "SUBSCRIBE", w);
            if (!s->sub_broken) sub_flush(s);
        }
        if (!sub_up(s)) need_thread = 1;
    }
    if (need_thread) kick(wk);
    while (!settled(r, w, clock_mono_us()) && clock_mono_us() < deadline_us)
        lock_cond_wait_until(&wk->state_cv, &wk->mu, deadline_us);
    lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
    return 0;
}

int lock_waiter_wait(lock_redis *r, lock_waiter *w, int64_t until_us) {
    lock_waker *wk = &r->waker;
    lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
    while (!w->woken && clock_mono_us() < until_us)
        lock_cond_wait_until(&w->cv, &wk->mu, until_us);
    int woken = w->woken;
    w->woken = 0;
    lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
    if (woken == 2) atomic_fetch_add(&r->c->st.keyspace_wakeups, 1);
    return woken != 0;
}

void lock_waiter_clear(lock_redis *r, lock_waiter *w) {
    lock_mu_take(&r->waker.mu, LOCK_RANK_BACKEND);
    w->woken = 0;
    lock_mu_drop(&r->waker.mu, LOCK_RANK_BACKEND);
}

void lock_waiter_remove(lock_redis *r, lock_waiter *w) {
    lock_waker *wk = &r->waker;
    lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
    lock_waiter **pp = &wk->buckets[chan_hash(w->chan, w->chanlen)];
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) {
        *pp = w->next;
        wk->nwaiters--;
    }
    lock_topic *empty = topic_leave(r, w);
    int need_thread = 0;
    for (int i = 0; i < r->nservers; i++) {
        lock_server *s = &r->servers[i];
        if (!sub_up(s)) continue;
        sub_append(s, "UNSUBSCRIBE", w);
        if (empty) topic_append(s, "UNSUBSCRIBE", empty);
        if (!s->sub_broken) sub_flush(s);
        if (s->sub_broken) need_thread = 1;
    }
    if (need_thread) kick(wk);
    lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
    free(empty);
}

void lock_waker_stats(lock_redis *r, lock_stats *o) {
    o->keyspace_on = o->keyspace_off = 0;
    lock_mu_take(&r->waker.mu, LOCK_RANK_BACKEND);
    for (int i = 0; i < r->nservers; i++) {
        o->keyspace_on += r->servers[i].keyspace > 0;
        o->keyspace_off += r->servers[i].keyspace < 0;
    }
    lock_mu_drop(&r->waker.mu, LOCK_RANK_BACKEND);
}

void lock_waker_stop(lock_redis *r) {
    lock_waker *wk = &r->waker;
    lock_mu_take(&wk->mu, LOCK_RANK_BACKEND);
    int started = wk->started;
    wk->stop = 1;
    if (started) kick(wk);
    lock_mu_drop(&wk->mu, LOCK_RANK_BACKEND);
    if (started) pthread_join(wk->thread, NULL);
    for (int i = 0; i < r->nservers; i++) {
        if (r->servers[i].sub) redisFree(r->servers[i].sub);
        r->servers[i].sub = NULL;
    }
    if (wk->efd >= 0) close(wk->efd);
    wk->efd = -1;
}
