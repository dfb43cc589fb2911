/* rcw.c: the read-check-write strategies: `lock` (when no one segment can
 * hold an order), `redlock`, `zookeeper`, `etcd`, `db-lock`, `local`, and
 * the unsafe demonstrations. They share one shape:
 *
 *   choose segments -> lock them (per strategy) -> read -> check
 *     -> [injected pause, or the forcing] -> write -> unlock
 *
 * and differ only in the lock, in when it is released, and in whether the
 * write sets the value computed from the read or subtracts. The lock is
 * the strategy's `rcw` column of the strategy table (stock.c): none, a
 * process mutex, the SETNX+EXPIRE or SET NX PX of the articles this project
 * tests ("How to use Redis to implement distributed locks", "Using redis to
 * implement a distributed lock service in Java"), a lock of the
 * lock module (on the service's Redis, on Redlock servers, ZooKeeper or
 * etcd), or a row of the database's lock table. The safe ones fence their
 * write with the lock's own token. The unsafe ones are faithful to the
 * articles' broken code on purpose; fault injection (cs_overlap, below)
 * forces the interleaving that breaks them, instead of hoping the
 * scheduler does, and the safe ones are shown under the same forcing.
 *
 * Segments: a request first tries one random segment not known to be
 * empty; if that is short, it reads all segments at once and locks the ones
 * it needs, in ascending order (so two requests never wait on each other
 * in a cycle). A verdict of sold out / insufficient comes only from a read
 * of every segment in one atomic step, never from the local hint. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <pthread.h>

#include "common/clock.h"
#include "db/locktable.h"
#include "db/pool.h"
#include "lock/lock.h"
#include "stock/internal.h"

#define ATTEMPTS 4
#define STRIPES 1024
#define POLL_MS 5
#define DB_POLL_MAX_MS 32       /* db-lock: longest sleep between two tries */
#define HANDOFF_SLOTS 1024

/* In-process mutexes of the `local` strategy, striped by (sku, segment). */
static pthread_mutex_t stripes[STRIPES] = { [0 ... STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER };

/* Who holds a segment's lock, as its fence knows holders (lock.h,
 * FENCING): the lock's token, and the incarnation of the lock service's
 * data it came from (0: the unnamed one, whose fence stays a plain
 * integer). */
typedef struct holder {
    uint64_t token;
    uint64_t incarnation;
} holder;

typedef struct pick {
    int n;
    int seg[STOCK_MAX_SEGMENTS];
    long long value[STOCK_MAX_SEGMENTS];   /* units read */
    long long take[STOCK_MAX_SEGMENTS];
    holder who[STOCK_MAX_SEGMENTS];        /* fenced strategies: the lock's holder */
    long long epoch[STOCK_MAX_SEGMENTS];   /* ...and the epoch its read was admitted at */
} pick;

/* One segment's lock, as its provider took it. */
typedef struct slot {
    lock_handle *handle;          /* the lock module's hold */
    char value[40];               /* the articles' locks: our value; db-lock: our owner id */
    unsigned order;               /* the provider's order key (local: the mutex) */
    int shared;                   /* a mutex already taken for an earlier segment */
} slot;

typedef struct held {
    int n;
    slot s[STOCK_MAX_SEGMENTS];
} held;

/* What the read under the locks found. */
typedef struct seen {
    long long gen, bought;
    char idem[160];
} seen;

/* ------------------------------------------------------------------- locks */

/* The names lock_key makes (in buffers of STOCK_SKU_MAX + 96) go to the
 * lock module's clients, which refuse a name longer than LOCK_NAME_MAX. */
_Static_assert(STOCK_SKU_MAX + 96 <= LOCK_NAME_MAX, "a lock name stock makes must fit lock.h's");

static void lock_key(stock_conn *c, const stock_product *p, int seg, char *buf, size_t len) {
    snprintf(buf, len, "%s{%s}:lock:%d", c->prefix, p->sku, seg);
}

static void random_hex(char *out, size_t bytes) {
    unsigned char rnd[32];
    if (bytes > sizeof rnd) bytes = sizeof rnd;
    if (getrandom(rnd, bytes, 0) != (ssize_t)bytes) memset(rnd, 0, sizeof rnd);
    for (size_t i = 0; i < bytes; i++) sprintf(out + 2 * i, "%02x", rnd[i]);
}

/* An incarnation as the fence scripts take it: 16 lowercase hex digits
 * (all zeros: the unnamed one). */
static void incarnation_hex(uint64_t inc, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)inc);
}

static unsigned stripe_of(const stock_product *p, int seg) {
    unsigned h = 2166136261u;
    for (const char *s = p->sku; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return (h ^ (unsigned)seg * 2654435761u) % STRIPES;
}

/* `local`: the stripe's mutex (taken in stripe order: see lock_all). */
static stock_result take_local(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                               int64_t deadline_ms, slot *sl, holder *who) {
    (void)c, (void)p, (void)seg, (void)ttl_ms, (void)deadline_ms, (void)who;
    pthread_mutex_lock(&stripes[sl->order]);
    return STOCK_RESERVED;
}

static void drop_local(stock_conn *c, const stock_product *p, int seg, slot *sl) {
    (void)c, (void)p, (void)seg;
    pthread_mutex_unlock(&stripes[sl->order]);
}

/* The articles' own locks (top of this file), kept broken on purpose: SETNX then EXPIRE in a
 * second command (unsafe-setnx-expire), or SET NX PX; both polled. */
static stock_result naive_lock(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                               int64_t deadline_ms, slot *sl, int setnx_expire) {
    char key[STOCK_SKU_MAX + 96];
    if (stock_conn_ensure(c)) return STOCK_UNAVAILABLE;
    lock_key(c, p, seg, key, sizeof key);
    random_hex(sl->value, 8);
    for (;;) {
        int64_t t0 = sk_t0(c->observe);
        redisReply *rep = setnx_expire ? redisCommand(c->ctx, "SETNX %s %s", key, sl->value)
                                       : redisCommand(c->ctx, "SET %s %s NX PX %d", key, sl->value,
                                                      ttl_ms);
        sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
        if (!rep) goto err;
        int got = setnx_expire ? rep->type == REDIS_REPLY_INTEGER && rep->integer == 1
                               : rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (got && setnx_expire) {
            /* The gap "How to use Redis to implement distributed
             * locks" warns about: a crash here leaves a lock that never
             * expires. */
            t0 = sk_t0(c->observe);
            rep = redisCommand(c->ctx, "EXPIRE %s %d", key, (ttl_ms + 999) / 1000);
            sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
            if (!rep) goto err;
            freeReplyObject(rep);
        }
        if (got) return STOCK_RESERVED;
        if (clock_mono_ms() >= deadline_ms) return STOCK_LOCK_TIMEOUT;
        clock_sleep_ms(POLL_MS);
    }
err:
    sk_drop(c, "lock");
    return STOCK_UNAVAILABLE;
}

static stock_result take_setnx_expire(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                                      int64_t deadline_ms, slot *sl, holder *who) {
    (void)who;
    return naive_lock(c, p, seg, ttl_ms, deadline_ms, sl, 1);
}

static stock_result take_set_nx_px(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                                   int64_t deadline_ms, slot *sl, holder *who) {
    (void)who;
    return naive_lock(c, p, seg, ttl_ms, deadline_ms, sl, 0);
}

static void naive_unlock(stock_conn *c, const stock_product *p, int seg, slot *sl, int del) {
    char key[STOCK_SKU_MAX + 96];
    redisReply *rep;
    if (!c->ctx) return;
    lock_key(c, p, seg, key, sizeof key);
    int64_t t0 = sk_t0(c->observe);
    if (del) {
        /* The articles' first release, a plain DEL: whoever's lock it
         * is now. */
        rep = redisCommand(c->ctx, "DEL %s", key);
    } else {
        rconn_cmd_evalsha(&c->cmd, &sk_unlock, 1);
        rconn_cmd_adds(&c->cmd, key);
        rconn_cmd_adds(&c->cmd, sl->value);
        rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_unlock);
    }
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
    if (rep) freeReplyObject(rep);
    else sk_drop(c, "unlock");
}

static void drop_del(stock_conn *c, const stock_product *p, int seg, slot *sl) {
    naive_unlock(c, p, seg, sl, 1);
}

static void drop_owned(stock_conn *c, const stock_product *p, int seg, slot *sl) {
    naive_unlock(c, p, seg, sl, 0);
}

/* A lock of the lock module, on the server of the strategy. A product
 * whose injected pause stands for a whole-process pause takes it through
 * the client that renews nothing (where there is one: a ZooKeeper session
 * is kept by the library's own threads, which a pause of this thread does
 * not stop).
 *
 * The holder is known to the fence by token and incarnation, so that a
 * lock server that lost its data (tokens starting over, lower, under a
 * new incarnation) is admitted at once and its old holders refused. Not
 * for `lock`: its lock server is this Redis, whose data is lost only with
 * the stock copy, fences and all -- and any new data (a restart, a
 * failover) has a new run_id, which refuses every read and write of the
 * old copy until it is rebuilt under a new generation, which in turn
 * refuses every write of a holder that read the old one. The run_id is its
 * incarnation already; its fence stays the plain integer the loop path
 * (lock_read.lua, lock_write.lua) shares. */
static stock_result take_module(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                                int64_t deadline_ms, slot *sl, holder *who) {
    stock_lock_server srv = stock_strategy_about(p->strategy)->locks;
    lock_client *lc = p->cs_delay_ms > 0 && c->locks_frozen[srv] ? c->locks_frozen[srv]
                                                                  : c->locks[srv];
    /* The service's own Redis failing is Redis down; any other lock
     * server failing is that server's. */
    int own_redis = stock_lock_server_about(srv)->own_redis;
    stock_result down = own_redis ? STOCK_UNAVAILABLE : STOCK_LOCK_DOWN;
    char key[STOCK_SKU_MAX + 96], err[200];
    if (!lc) {
        snprintf(c->errstr, sizeof c->errstr, "lock: no %s lock server configured",
                 stock_strategy_about(p->strategy)->name);
        return down;
    }
    lock_key(c, p, seg, key, sizeof key);
    int64_t wait = deadline_ms - clock_mono_ms();
    lock_status st = lock_acquire(lc, key, ttl_ms, wait > 0 ? wait : 0, NULL, &sl->handle, err,
                                  sizeof err);
    if (st == LOCK_OK) {
        who->token = lock_fence(sl->handle);
        who->incarnation = own_redis ? 0 : lock_incarnation(sl->handle);
        return STOCK_RESERVED;
    }
    if (st == LOCK_BUSY) return STOCK_LOCK_TIMEOUT;
    snprintf(c->errstr, sizeof c->errstr, "lock: %s", err);
    return down;
}

static void drop_module(stock_conn *c, const stock_product *p, int seg, slot *sl) {
    (void)c, (void)p, (void)seg;
    lock_release(sl->handle);
    sl->handle = NULL;
}

/* db-lock: a row of the database's lock table (db_lock_acquire), tried
 * again after a jittered exponential backoff -- never longer than the
 * holder's row has left, nor past the wait -- as the tryLock of "Using
 * redis to implement a distributed lock service in Java" polls.
 * Its tokens are unnamed (no incarnation): the counter lives in the
 * orders' own database, which cannot lose it without losing the orders.
 * Each try takes a connection of the instance's budget (db/pool.h) and
 * gives it back before its nap: a waiter holds none while it waits, and
 * the holder's release finds one. No connection within the wait is the
 * lock's timeout (429, nothing taken), as a holder that outlasts it is. */
static stock_result take_db(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                            int64_t deadline_ms, slot *sl, holder *who) {
    char name[STOCK_SKU_MAX + 96], err[256];
    assert(c->db_pool != NULL);    /* the service always gives one */
    lock_key(c, p, seg, name, sizeof name);
    random_hex(sl->value, 16);
    int64_t backoff_ms = 1;
    for (;;) {
        int64_t left = deadline_ms - clock_mono_ms();
        long long fence, holder_left;
        int wait = (int)(left < c->db_wait_ms ? left : c->db_wait_ms);
        db *d = NULL;
        db_status st = db_pool_take(c->db_pool, wait > 0 ? wait : 0, &d, err, sizeof err);
        if (st == DB_NOCONN) return STOCK_LOCK_TIMEOUT;
        if (st != DB_OK) {
            snprintf(c->errstr, sizeof c->errstr, "lock table: %.200s", err);
            return STOCK_LOCK_DOWN;
        }
        left = deadline_ms - clock_mono_ms();
        st = db_lock_acquire(d, name, sl->value, ttl_ms, left > 1 ? (int)left : 1, &fence,
                             &holder_left);
        if (st != DB_OK && st != DB_EXISTS && st != DB_BUSY)
            snprintf(c->errstr, sizeof c->errstr, "lock table: %s", db_errstr(d));
        db_pool_give(c->db_pool, d);
        if (st == DB_OK) {
            who->token = (uint64_t)fence;
            who->incarnation = 0;
            return STOCK_RESERVED;
        }
        if (st != DB_EXISTS && st != DB_BUSY) return STOCK_LOCK_DOWN;
        int64_t now = clock_mono_ms();
        if (now >= deadline_ms) return STOCK_LOCK_TIMEOUT;
        int64_t nap = backoff_ms / 2 + (int64_t)(sk_random(c) % (uint64_t)(backoff_ms / 2 + 1));
        if (st == DB_EXISTS && holder_left + 1 < nap) nap = holder_left > 0 ? holder_left + 1 : 0;
        if (nap > deadline_ms - now) nap = deadline_ms - now;
        if (nap > 0) clock_sleep_ms(nap);
        backoff_ms = backoff_ms * 2 > DB_POLL_MAX_MS ? DB_POLL_MAX_MS : backoff_ms * 2;
    }
}

/* A release that finds no connection within the lock's own busy wait, or
 * fails, leaves the row to expire after its ttl (the lease is the bound). */
static void drop_db(stock_conn *c, const stock_product *p, int seg, slot *sl) {
    char name[STOCK_SKU_MAX + 96], err[256];
    int busy_ms = db_pool_options(c->db_pool)->busy_timeout_ms;
    db *d = NULL;
    lock_key(c, p, seg, name, sizeof name);
    if (db_pool_take(c->db_pool, busy_ms, &d, err, sizeof err) != DB_OK) return;
    db_lock_release(d, name, sl->value, busy_ms);
    db_pool_give(c->db_pool, d);
}

/* How a strategy locks one segment: take (STOCK_RESERVED when held, with
 * *who set for a fenced one; else LOCK_TIMEOUT, UNAVAILABLE for Redis or
 * LOCK_DOWN for another lock server, with c->errstr), drop, the order
 * locks are taken in (NULL: ascending segment; equal keys share one lock),
 * and whether the write is fenced by the lock's holder. The strategy table
 * (stock.c) names each strategy's; none: the strategy takes no lock. */
struct sk_rcw_lock {
    stock_result (*take)(stock_conn *c, const stock_product *p, int seg, int ttl_ms,
                         int64_t deadline_ms, slot *sl, holder *who);
    void (*drop)(stock_conn *c, const stock_product *p, int seg, slot *sl);
    unsigned (*order)(const stock_product *p, int seg);
    int fenced;
};
typedef struct sk_rcw_lock provider;

static const provider NO_LOCK = { NULL, NULL, NULL, 0 };
const provider sk_lock_local = { take_local, drop_local, stripe_of, 0 };
const provider sk_lock_setnx_expire = { take_setnx_expire, drop_del, NULL, 0 };
const provider sk_lock_set_nx_px = { take_set_nx_px, drop_owned, NULL, 0 };
const provider sk_lock_module = { take_module, drop_module, NULL, 1 };
const provider sk_lock_module_unfenced = { take_module, drop_module, NULL, 0 };
const provider sk_lock_db_table = { take_db, drop_db, NULL, 1 };

static const provider *provider_of(const stock_product *p) {
    const provider *pv = stock_strategy_about(p->strategy)->rcw;
    return pv ? pv : &NO_LOCK;
}

/* The fence key of segment seg. Each kind of lock has its own, so that
 * one key only ever sees tokens of one kind (they are not comparable):
 * `lock` keeps the key it always had, and `fair-lock`, the same lock
 * fair, shares it (its loop path, lockasync.c, writes that key). */
static void fence_suffix(const stock_product *p, int seg, char *buf, size_t len) {
    if (p->strategy == STOCK_LOCK || p->strategy == STOCK_FAIR_LOCK)
        snprintf(buf, len, "fence:%d", seg);
    else snprintf(buf, len, "fence:%s:%d", stock_strategy_about(p->strategy)->name, seg);
}

/* -------------------------------------------------------------- hand-offs
 *
 * The time from a release of a lock by this process to the next acquire of
 * the same lock completing in this process, counted only when that
 * acquirer was already waiting: per lock name, how many of our orders are
 * taking it and when it was last given up with someone waiting. Names
 * share slots by hash; a collision at worst misses or blurs one sample. */

static struct handoff_slot {
    pthread_mutex_t mu;
    uint64_t key;
    int waiting;
    int64_t released_us;
} handoffs[HANDOFF_SLOTS] = { [0 ... HANDOFF_SLOTS - 1] = { PTHREAD_MUTEX_INITIALIZER, 0, 0, 0 } };

static uint64_t handoff_key(const stock_conn *c, const stock_product *p, int seg) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)p->strategy;
    for (const char *s = c->prefix; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    for (const char *s = p->sku; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return (h ^ (uint64_t)seg) * 1099511628211ULL;
}

static struct handoff_slot *handoff_slot(uint64_t key) {
    struct handoff_slot *hs = &handoffs[key % HANDOFF_SLOTS];
    pthread_mutex_lock(&hs->mu);
    if (hs->key != key) {
        hs->key = key;
        hs->waiting = 0;
        hs->released_us = 0;
    }
    return hs;
}

static void handoff_waiting(uint64_t key) {
    struct handoff_slot *hs = handoff_slot(key);
    hs->waiting++;
    pthread_mutex_unlock(&hs->mu);
}

/* The acquire that began at start_us ended (got: it holds the lock).
 * Returns the hand-off it completed, or -1. */
static int64_t handoff_done(uint64_t key, int64_t start_us, int got) {
    int64_t now = clock_mono_us(), d = -1;
    struct handoff_slot *hs = handoff_slot(key);
    if (hs->waiting > 0) hs->waiting--;
    if (got && hs->released_us && hs->released_us >= start_us) {
        d = now - hs->released_us;
        hs->released_us = 0;
    }
    pthread_mutex_unlock(&hs->mu);
    return d;
}

static void handoff_released(uint64_t key) {
    struct handoff_slot *hs = handoff_slot(key);
    hs->released_us = hs->waiting > 0 ? clock_mono_us() : 0;
    pthread_mutex_unlock(&hs->mu);
}

/* ------------------------------------------------------- locking a pick */

static int cmp_int(const void *a, const void *b) {
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* Orders two segments of product p by their provider's order key. */
static int cmp_order(const void *a, const void *b, void *arg) {
    const stock_product *p = arg;
    unsigned (*order)(const stock_product *, int) = provider_of(p)->order;
    int x = *(const int *)a, y = *(const int *)b;
    unsigned kx = order(p, x), ky = order(p, y);
    return kx != ky ? (kx > ky) - (kx < ky) : (x > y) - (x < y);
}

/* Takes the locks of pk's segments in the provider's order, all or none. */
static stock_result lock_all(stock_conn *c, stock_req *r, pick *pk, held *h) {
    const stock_product *p = r->product;
    const provider *pv = provider_of(p);
    int64_t t0 = clock_mono_us();
    int64_t deadline = clock_mono_ms() + c->lock_wait_ms;
    int ttl = p->lock_ttl_ms > 0 ? p->lock_ttl_ms : c->lock_ttl_ms;
    stock_result res = STOCK_RESERVED;
    h->n = 0;
    if (pv->order) qsort_r(pk->seg, (size_t)pk->n, sizeof pk->seg[0], cmp_order, (void *)p);
    else qsort(pk->seg, (size_t)pk->n, sizeof pk->seg[0], cmp_int);
    if (!pv->take) return STOCK_RESERVED;
    for (int i = 0; i < pk->n && res == STOCK_RESERVED; i++) {
        slot *sl = &h->s[i];
        memset(sl, 0, sizeof *sl);
        pk->who[i] = (holder){ 0, 0 };
        pk->epoch[i] = 0;
        sl->order = pv->order ? pv->order(p, pk->seg[i]) : (unsigned)pk->seg[i];
        sl->shared = i > 0 && sl->order == h->s[i - 1].order;
        if (!sl->shared) {
            uint64_t key = handoff_key(c, p, pk->seg[i]);
            int64_t start = clock_mono_us();
            handoff_waiting(key);
            res = pv->take(c, p, pk->seg[i], ttl, deadline, sl, &pk->who[i]);
            int64_t d = handoff_done(key, start, res == STOCK_RESERVED);
            if (d > r->handoff_us) r->handoff_us = d;
        }
        if (res == STOCK_RESERVED) h->n = i + 1;
    }
    r->lock_wait_us = clock_mono_us() - t0;
    return res;
}

/* Releases what lock_all took (in every case; errors are not the order's). */
static void unlock_all(stock_conn *c, const stock_req *r, const pick *pk, held *h) {
    const stock_product *p = r->product;
    const provider *pv = provider_of(p);
    for (int i = h->n - 1; i >= 0; i--) {
        if (h->s[i].shared) continue;
        pv->drop(c, p, pk->seg[i], &h->s[i]);
        handoff_released(handoff_key(c, p, pk->seg[i]));
    }
    h->n = 0;
}


/* ------------------------------------------------------------ read, write */

/* Reads the picked segments (and the request's idempotency record and the
 * user's count) in one atomic step. Under the locks of a fenced strategy
 * (locked), the read also admits us at each segment's fence (read.lua),
 * and pk->epoch gets what our write must carry; the planning read, which
 * holds no lock, leaves the fences alone. */
static stock_result read_segments(stock_conn *c, stock_req *r, pick *pk, seen *sn, int locked) {
    const stock_product *p = r->product;
    int fenced = locked && provider_of(p)->fenced;
    char suffix[48], inc[17];
    if (stock_conn_ensure(c)) return STOCK_UNAVAILABLE;
    rconn_cmd_evalsha(&c->cmd, &sk_read, 3 + pk->n * (fenced ? 2 : 1));
    sk_add_key(c, p->sku, "gen");
    sk_add_key(c, p->sku, "users");
    sk_add_idem_key(c, p->sku, r->idem_key);
    for (int i = 0; i < pk->n; i++) {
        snprintf(suffix, sizeof suffix, "stock:%d", pk->seg[i]);
        sk_add_key(c, p->sku, suffix);
    }
    for (int i = 0; fenced && i < pk->n; i++) {
        fence_suffix(p, pk->seg[i], suffix, sizeof suffix);
        sk_add_key(c, p->sku, suffix);
    }
    rconn_cmd_adds(&c->cmd, c->run_id);
    rconn_cmd_adds(&c->cmd, r->user_id);
    rconn_cmd_addll(&c->cmd, pk->n);
    for (int i = 0; fenced && i < pk->n; i++) {
        rconn_cmd_addll(&c->cmd, (long long)pk->who[i].token);
        incarnation_hex(pk->who[i].incarnation, inc);
        rconn_cmd_adds(&c->cmd, inc);
    }
    int64_t t0 = sk_t0(c->observe);
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_read);
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
    if (!rep) {
        sk_drop(c, "read");
        return STOCK_UNAVAILABLE;
    }
    stock_result res = STOCK_RESERVED;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        sk_bad_reply(c, "read", rep);
        res = STOCK_UNAVAILABLE;
    } else if (sk_elem_int(rep, 0) == -3) {
        res = STOCK_MISSING;
    } else if (sk_elem_int(rep, 0) == -4) {
        res = STOCK_FENCED;
    } else if (rep->elements != 3 + (size_t)pk->n * (fenced ? 2 : 1)) {
        snprintf(c->errstr, sizeof c->errstr, "read: unexpected reply");
        res = STOCK_UNAVAILABLE;
    } else {
        sn->gen = sk_elem_int(rep, 0);
        sn->bought = sk_elem_int(rep, 1);
        snprintf(sn->idem, sizeof sn->idem, "%s", sk_elem_str(rep, 2));
        for (int i = 0; i < pk->n; i++) {
            pk->value[i] = sk_elem_int(rep, 3 + (size_t)i);
            sk_hint_set(p, pk->seg[i], pk->value[i] <= 0);
            if (fenced) pk->epoch[i] = sk_elem_int(rep, 3 + (size_t)(pk->n + i));
        }
    }
    freeReplyObject(rep);
    return res;
}

/* Writes the order's take and its records, atomically; see write.lua. A
 * fenced write goes ahead only if no other holder has been admitted at its
 * fences since our read (the epochs it returned). */
static stock_result write_segments(stock_conn *c, stock_req *r, const pick *pk, const seen *sn) {
    const stock_product *p = r->product;
    int has_key = r->idem_key && r->idem_key[0], m = 0;
    int fenced = provider_of(p)->fenced;
    char suffix[48], inc[17];
    if (stock_conn_ensure(c)) return STOCK_UNAVAILABLE;
    for (int i = 0; i < pk->n; i++) m += pk->take[i] > 0;
    rconn_cmd_evalsha(&c->cmd, &sk_write, 5 + 2 * m);
    sk_add_key(c, p->sku, "gen");
    sk_add_key(c, p->sku, "pending");
    sk_add_key(c, p->sku, "users");
    sk_add_idem_key(c, p->sku, r->idem_key);
    sk_add_key(c, p->sku, "empty");
    for (int i = 0; i < pk->n; i++) {
        if (pk->take[i] == 0) continue;
        snprintf(suffix, sizeof suffix, "stock:%d", pk->seg[i]);
        sk_add_key(c, p->sku, suffix);
        fence_suffix(p, pk->seg[i], suffix, sizeof suffix);
        sk_add_key(c, p->sku, suffix);
    }
    rconn_cmd_adds(&c->cmd, c->run_id);
    rconn_cmd_addll(&c->cmd, sn->gen);
    rconn_cmd_adds(&c->cmd, r->order_id);
    rconn_cmd_adds(&c->cmd, r->user_id);
    rconn_cmd_addll(&c->cmd, r->quantity);
    rconn_cmd_addll(&c->cmd, p->per_user_limit);
    rconn_cmd_adds(&c->cmd, has_key ? r->fingerprint : "");
    rconn_cmd_adds(&c->cmd, c->instance);
    rconn_cmd_addll(&c->cmd, c->idem_ttl_ms);
    rconn_cmd_adds(&c->cmd, has_key ? r->idem_key : "");
    /* The safe ones take what they checked off what is there now: units
     * given back without the lock (restocks, undos, ended holds) since the
     * read stay. The unsafe ones write as the articles' code does: the value
     * computed from the read (their lost update), or a plain decrement. */
    rconn_cmd_adds(&c->cmd, p->strategy == STOCK_UNSAFE_CHECK_THEN_DECR ||
                                    !stock_strategy_about(p->strategy)->unsafe
                                ? "decr"
                                : "set");
    for (int i = 0; i < pk->n; i++) {
        if (pk->take[i] == 0) continue;
        rconn_cmd_addll(&c->cmd, pk->seg[i]);
        rconn_cmd_addll(&c->cmd, pk->value[i] - pk->take[i]);
        rconn_cmd_addll(&c->cmd, pk->take[i]);
        rconn_cmd_addll(&c->cmd, fenced ? (long long)pk->who[i].token : 0);
        incarnation_hex(fenced ? pk->who[i].incarnation : 0, inc);
        rconn_cmd_adds(&c->cmd, inc);
        rconn_cmd_addll(&c->cmd, fenced ? pk->epoch[i] : 0);
    }
    r->outcome_unknown = 1;
    int64_t t0 = sk_t0(c->observe);
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_write);
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
    if (!rep) {
        sk_drop(c, "write");
        return STOCK_UNAVAILABLE;
    }
    r->outcome_unknown = 0;
    stock_result res = STOCK_UNAVAILABLE;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1) {
        long long code = sk_elem_int(rep, 0);
        res = code == 1 ? STOCK_RESERVED : code == -4 ? STOCK_FENCED : STOCK_MISSING;
        if (code == 1) {
            r->gen = sk_elem_int(rep, 1);
            sk_req_takes(r, rep);
        }
    } else {
        sk_bad_reply(c, "write", rep);
    }
    freeReplyObject(rep);
    return res;
}

/* ---------------------------------------------------------------- planning */

/* Picks one random segment not known to be empty; 0 when all look empty. */
static int pick_one(stock_conn *c, const stock_product *p, pick *pk) {
    int start = (int)(sk_random(c) % (uint64_t)p->segments);
    for (int i = 0; i < p->segments; i++) {
        int seg = (start + i) % p->segments;
        if (!sk_hint_empty(p, seg)) {
            pk->n = 1;
            pk->seg[0] = seg;
            return 1;
        }
    }
    return 0;
}

static stock_result check(stock_req *r, pick *pk, const seen *sn, int all_segments);

/* Reads every segment in one step and picks, from a random start, the ones
 * that cover the quantity. Returns STOCK_RESERVED when picked, else the
 * verdict that one atomic read gives (a replay, the per-user limit,
 * SOLD_OUT / INSUFFICIENT with available set, MISSING, ...): it was true
 * at that read, and no lock is needed to give it. */
static stock_result pick_many(stock_conn *c, stock_req *r, pick *pk) {
    const stock_product *p = r->product;
    static __thread pick all;
    seen sn;
    all.n = p->segments;
    for (int i = 0; i < p->segments; i++) all.seg[i] = i;
    stock_result res = read_segments(c, r, &all, &sn, 0);
    if (res == STOCK_RESERVED) res = check(r, &all, &sn, 1);
    if (res != STOCK_RESERVED) return res;
    int start = (int)(sk_random(c) % (uint64_t)p->segments);
    long long need = r->quantity;
    pk->n = 0;
    for (int i = 0; i < p->segments && need > 0; i++) {
        int seg = (start + i) % p->segments;
        if (all.value[seg] <= 0) continue;
        pk->seg[pk->n++] = seg;
        need -= all.value[seg];
    }
    return STOCK_RESERVED;
}

/* Checks what was read against the request; plans the take. Returns
 * STOCK_RESERVED to go on, a verdict, or STOCK_INSUFFICIENT with available
 * = -1 when these segments are short but others may not be. */
static stock_result check(stock_req *r, pick *pk, const seen *sn, int all_segments) {
    const stock_product *p = r->product;
    if (sk_idem_replay(r, sn->idem, sn->gen)) return STOCK_REPLAY;
    if (p->per_user_limit > 0 && sn->bought + r->quantity > p->per_user_limit) {
        r->available = sn->bought;
        return STOCK_LIMIT;
    }
    long long need = r->quantity, total = 0;
    for (int i = 0; i < pk->n; i++) {
        long long v = pk->value[i] > 0 ? pk->value[i] : 0;
        pk->take[i] = v < need ? v : need;
        need -= pk->take[i];
        total += v;
    }
    if (need > 0) {
        r->available = all_segments ? total : -1;
        return total == 0 && all_segments ? STOCK_SOLD_OUT : STOCK_INSUFFICIENT;
    }
    return STOCK_RESERVED;
}

static void injected_pause(const stock_product *p) {
    if (p->cs_delay_ms <= 0) return;
    unsigned char j;
    if (getrandom(&j, 1, 0) != 1) j = 128;
    /* 75% .. 125% of the setting: a pause, not a metronome. */
    clock_sleep_ms(p->cs_delay_ms * (192 + (int)j / 2) / 256);
}

/* ------------------------------------------------ forcing an interleaving
 *
 * A pause inside the critical section makes a bad interleaving likely, not
 * certain: whether another holder reads the same units meanwhile is the
 * scheduler's luck, and a busy machine changes the luck. With cs_overlap N
 * (fault injection only) a holder instead waits, after its check and
 * before its write, until N holders -- itself included -- have been inside
 * the critical section of the same segment with the same read (the same
 * generation and units), or until cs_delay_ms has passed. It counts those
 * inside when it arrived and those who arrive after it while it is still
 * inside (force_enter.lua), so every one counted was inside together with
 * it. Then it writes.
 *
 * What that shows depends on the lock. With none, or one that excludes
 * nobody across instances (`local` on two), the second holder comes at
 * once and both write from one read: an oversell, every time. With a
 * lease, the second holder can only come once the first one's lease has
 * run out -- a lease seen expired -- and then the fenced locks refuse the
 * first one's write while the unfenced ones sell twice. A lock that holds
 * (a mutex on one instance, a renewed lease, a ZooKeeper session kept
 * alive by its own threads) lets no second holder in: the wait runs to
 * its bound. Each wait's outcome is counted in <prefix>{<sku>}:cs, fields
 * met and alone (docs/storage.md), so a scene can tell whether the
 * interleaving it claims was forced. */

#define FORCE_POLL_MS 1
#define FORCE_KEY_TTL_MS 60000

static void force_key(stock_conn *c, const stock_product *p, long long gen, int seg,
                      long long units, const char *what) {
    rconn_cmd_addf(&c->cmd, "%s{%s}:cs:%lld:%d:%lld:%s", c->prefix, p->sku, gen, seg, units, what);
}

/* The arrivals counted so far at the key of (gen, seg, units); -1 when
 * Redis fails. */
static long long force_arrivals(stock_conn *c, const stock_product *p, long long gen, int seg,
                                long long units) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "GET");
    force_key(c, p, gen, seg, units, "n");
    redisReply *rep = NULL;
    if (rconn_cmd_append(c->ctx, &c->cmd) == 0 && redisGetReply(c->ctx, (void **)&rep) != REDIS_OK)
        rep = NULL;
    long long n = !rep                              ? -1
                  : rep->type == REDIS_REPLY_STRING ? atoll(rep->str)
                  : rep->type == REDIS_REPLY_NIL    ? 0
                                                    : -1;
    if (rep) freeReplyObject(rep);
    return n;
}

void stock_force_wait(stock_conn *c, const stock_product *p, long long gen, int seg,
                      long long units) {
    if (p->cs_overlap <= 0) {
        injected_pause(p);
        return;
    }
    if (sk_route(c, p->sku) || stock_conn_ensure(c)) return;
    char id[24];
    random_hex(id, 8);
    rconn_cmd_evalsha(&c->cmd, &sk_force_enter, 2);
    force_key(c, p, gen, seg, units, "in");
    force_key(c, p, gen, seg, units, "n");
    rconn_cmd_adds(&c->cmd, id);
    rconn_cmd_addll(&c->cmd, p->cs_delay_ms + FORCE_KEY_TTL_MS);
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_force_enter);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        if (rep) freeReplyObject(rep);
        else sk_drop(c, "force");
        return;
    }
    long long inside = sk_elem_int(rep, 0), arrival = sk_elem_int(rep, 1);
    freeReplyObject(rep);
    int64_t deadline = clock_mono_ms() + p->cs_delay_ms;
    long long together = inside;
    while (together < p->cs_overlap && clock_mono_ms() < deadline) {
        clock_sleep_ms(FORCE_POLL_MS);
        long long n = force_arrivals(c, p, gen, seg, units);
        if (n < 0) {
            sk_drop(c, "force");
            return;
        }
        together = inside + (n > arrival ? n - arrival : 0);
    }
    /* Out of the critical section's set, and the outcome counted. */
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "SREM");
    force_key(c, p, gen, seg, units, "in");
    rconn_cmd_adds(&c->cmd, id);
    int bad = rconn_cmd_append(c->ctx, &c->cmd);
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "HINCRBY");
    sk_add_key(c, p->sku, "cs");
    rconn_cmd_adds(&c->cmd, together >= p->cs_overlap ? "met" : "alone");
    rconn_cmd_addll(&c->cmd, 1);
    bad = bad || rconn_cmd_append(c->ctx, &c->cmd);
    for (int k = 0; k < 2 && !bad; k++) {
        redisReply *done = NULL;
        bad = redisGetReply(c->ctx, (void **)&done) != REDIS_OK;
        if (done) freeReplyObject(done);
    }
    if (bad) sk_drop(c, "force");
}

/* Waits as cs_overlap asks (stock_force_wait), holding the first segment
 * the order writes and the units it read there. */
static void injected_wait(stock_conn *c, const stock_req *r, const pick *pk, const seen *sn) {
    int i = 0;
    while (i + 1 < pk->n && pk->take[i] == 0) i++;      /* the first segment written */
    stock_force_wait(c, r->product, sn->gen, pk->seg[i], pk->value[i]);
}

/* One attempt under the locks of pk. */
static stock_result attempt(stock_conn *c, stock_req *r, pick *pk, int all_segments) {
    const stock_product *p = r->product;
    static __thread held h;
    seen sn;
    stock_result res = lock_all(c, r, pk, &h);
    if (res == STOCK_RESERVED && (!c->ctx && stock_conn_ensure(c))) res = STOCK_UNAVAILABLE;
    if (res == STOCK_RESERVED) res = read_segments(c, r, pk, &sn, 1);
    if (res == STOCK_RESERVED) res = check(r, pk, &sn, all_segments);
    if (res == STOCK_RESERVED) {
        if (p->strategy == STOCK_UNSAFE_UNLOCK_BEFORE_WRITE) unlock_all(c, r, pk, &h);
        injected_wait(c, r, pk, &sn);
        res = write_segments(c, r, pk, &sn);
    }
    unlock_all(c, r, pk, &h);
    return res;
}

int stock_reserve_one(stock_conn *c, stock_req *r) {
    const stock_product *p = r->product;
    static __thread pick pk;
    assert(stock_strategy_about(p->strategy)->kind == STOCK_KIND_RCW ||
           stock_strategy_about(p->strategy)->kind == STOCK_KIND_LOCK);
    r->result = STOCK_UNAVAILABLE;
    r->outcome_unknown = 0;
    r->lock_wait_us = provider_of(p)->take ? 0 : -1;
    r->handoff_us = -1;
    /* A cluster: on the SKU's node; a redirection met on the way fails
     * the order (UNAVAILABLE): its steps are not all safe to repeat. */
    if (sk_route(c, p->sku) || stock_conn_ensure(c)) return -1;
    stock_result res = STOCK_LOCK_TIMEOUT;
    for (int i = 0; i < ATTEMPTS; i++) {
        int all = p->segments == 1;
        if (p->segments == 1 && (i > 0 || !sk_hint_empty(p, 0))) {
            pk.n = 1;
            pk.seg[0] = 0;
        } else if (p->segments == 1 || i > 0 || !pick_one(c, p, &pk)) {
            /* Every segment looks empty (or one was short): one read of
             * them all decides, or picks, without taking a lock. */
            res = pick_many(c, r, &pk);
            if (res != STOCK_RESERVED) break;
        }
        res = attempt(c, r, &pk, all);
        /* Short only on the segments tried: plan again from a full read. */
        if (!(res == STOCK_INSUFFICIENT && r->available < 0)) break;
        res = STOCK_LOCK_TIMEOUT;   /* if the attempts run out: contention */
    }
    r->result = res;
    return res == STOCK_UNAVAILABLE ? -1 : 0;
}
