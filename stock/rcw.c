/* rcw.c: the read-check-write strategies: `lock`, `local`, and the unsafe
 * demonstrations. They share one shape:
 *
 *   choose segments -> lock them (per strategy) -> read -> check
 *     -> [injected pause] -> write -> unlock
 *
 * and differ only in the lock (none, a process mutex, SETNX+EXPIRE, SET NX
 * PX, or the lock module's fenced lease), in when it is released, and in
 * whether the write sets the value computed from the read or subtracts.
 * The unsafe ones are faithful to the seeds' broken code on purpose; the
 * injected pause (cs_delay_ms, fault injection only) forces the
 * interleaving that breaks them, instead of hoping the scheduler does.
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
#include "lock/lock.h"
#include "stock/internal.h"

#define ATTEMPTS 4
#define STRIPES 1024
#define POLL_MS 5

/* In-process mutexes of the `local` strategy, striped by (sku, segment). */
static pthread_mutex_t stripes[STRIPES] = { [0 ... STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER };

typedef struct pick {
    int n;
    int seg[STOCK_MAX_SEGMENTS];
    long long value[STOCK_MAX_SEGMENTS];   /* units read */
    long long take[STOCK_MAX_SEGMENTS];
    uint64_t token[STOCK_MAX_SEGMENTS];    /* fence tokens (`lock` only) */
} pick;

typedef struct held {
    int n;
    lock_handle *handle[STOCK_MAX_SEGMENTS];
    char value[STOCK_MAX_SEGMENTS][40];    /* unsafe locks: our value */
    int stripe[STOCK_MAX_SEGMENTS];
} held;

/* What the read under the locks found. */
typedef struct seen {
    long long gen, bought;
    char idem[160];
} seen;

/* ------------------------------------------------------------------- locks */

static void lock_key(stock_conn *c, const stock_product *p, int seg, char *buf, size_t len) {
    snprintf(buf, len, "%s{%s}:lock:%d", c->prefix, p->sku, seg);
}

static unsigned stripe_of(const char *sku, int seg) {
    unsigned h = 2166136261u;
    while (*sku) h = (h ^ (unsigned char)*sku++) * 16777619u;
    return (h ^ (unsigned)seg * 2654435761u) % STRIPES;
}

static int cmp_int(const void *a, const void *b) {
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* The seeds' own locks, kept broken on purpose: SETNX then EXPIRE in a
 * second command (unsafe-setnx-expire), or SET NX PX; both polled. */
static int naive_lock(stock_conn *c, const char *key, const char *value, int ttl_ms,
                      int64_t deadline_ms, int setnx_expire) {
    for (;;) {
        int64_t t0 = sk_t0(c->observe);
        redisReply *rep = setnx_expire ? redisCommand(c->ctx, "SETNX %s %s", key, value)
                                       : redisCommand(c->ctx, "SET %s %s NX PX %d", key, value, ttl_ms);
        sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
        if (!rep) return -1;
        int got = setnx_expire ? rep->type == REDIS_REPLY_INTEGER && rep->integer == 1
                               : rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (got && setnx_expire) {
            /* The gap the seed warns about: a crash here leaves a lock
             * that never expires. */
            t0 = sk_t0(c->observe);
            rep = redisCommand(c->ctx, "EXPIRE %s %d", key, (ttl_ms + 999) / 1000);
            sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
            if (!rep) return -1;
            freeReplyObject(rep);
        }
        if (got) return 1;
        if (clock_mono_ms() >= deadline_ms) return 0;
        clock_sleep_ms(POLL_MS);
    }
}

static int has_lock(stock_strategy s) {
    return s != STOCK_UNSAFE_READ_WRITE && s != STOCK_UNSAFE_CHECK_THEN_DECR;
}

/* Takes the locks of pk's segments in ascending order. */
static stock_result lock_all(stock_conn *c, stock_req *r, pick *pk, held *h) {
    const stock_product *p = r->product;
    int64_t t0 = clock_mono_us();
    int64_t deadline = clock_mono_ms() + c->lock_wait_ms;
    int ttl = p->lock_ttl_ms > 0 ? p->lock_ttl_ms : c->lock_ttl_ms;
    char key[STOCK_SKU_MAX + 96], err[200];
    h->n = 0;
    qsort(pk->seg, (size_t)pk->n, sizeof pk->seg[0], cmp_int);
    if (!has_lock(p->strategy)) return STOCK_RESERVED;
    if (p->strategy == STOCK_LOCAL) {
        for (int i = 0; i < pk->n; i++) h->stripe[i] = (int)stripe_of(p->sku, pk->seg[i]);
        qsort(h->stripe, (size_t)pk->n, sizeof h->stripe[0], cmp_int);
        for (int i = 0; i < pk->n; i++)
            if (i == 0 || h->stripe[i] != h->stripe[i - 1])
                pthread_mutex_lock(&stripes[h->stripe[h->n++] = h->stripe[i]]);
        r->lock_wait_us = clock_mono_us() - t0;
        return STOCK_RESERVED;
    }
    for (int i = 0; i < pk->n; i++) {
        lock_key(c, p, pk->seg[i], key, sizeof key);
        int64_t wait = deadline - clock_mono_ms();
        if (p->strategy == STOCK_LOCK) {
            lock_client *lc = p->cs_delay_ms > 0 && c->locks_frozen ? c->locks_frozen : c->locks;
            lock_status st = lock_acquire(lc, key, ttl, wait > 0 ? wait : 0, NULL, &h->handle[i],
                                          err, sizeof err);
            if (st != LOCK_OK) {
                r->lock_wait_us = clock_mono_us() - t0;
                if (st == LOCK_ERROR) snprintf(c->errstr, sizeof c->errstr, "lock: %s", err);
                return st == LOCK_BUSY ? STOCK_LOCK_TIMEOUT : STOCK_UNAVAILABLE;
            }
            pk->token[i] = lock_fence(h->handle[i]);
        } else {
            unsigned char rnd[8];
            if (stock_conn_ensure(c)) {
                r->lock_wait_us = clock_mono_us() - t0;
                return STOCK_UNAVAILABLE;
            }
            if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) memset(rnd, 0, sizeof rnd);
            snprintf(h->value[i], sizeof h->value[i], "%02x%02x%02x%02x%02x%02x%02x%02x",
                     rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
            int got = naive_lock(c, key, h->value[i], ttl, deadline,
                                 p->strategy == STOCK_UNSAFE_SETNX_EXPIRE);
            if (got <= 0) {
                r->lock_wait_us = clock_mono_us() - t0;
                if (got < 0) sk_drop(c, "lock");
                return got < 0 ? STOCK_UNAVAILABLE : STOCK_LOCK_TIMEOUT;
            }
        }
        h->n = i + 1;
    }
    r->lock_wait_us = clock_mono_us() - t0;
    return STOCK_RESERVED;
}

/* Releases what lock_all took (in every case; errors are not the order's). */
static void unlock_all(stock_conn *c, const stock_req *r, const pick *pk, held *h) {
    const stock_product *p = r->product;
    char key[STOCK_SKU_MAX + 96];
    for (int i = h->n - 1; i >= 0; i--) {
        if (p->strategy == STOCK_LOCAL) {
            pthread_mutex_unlock(&stripes[h->stripe[i]]);
        } else if (p->strategy == STOCK_LOCK) {
            lock_release(h->handle[i]);
        } else if (c->ctx) {
            lock_key(c, p, pk->seg[i], key, sizeof key);
            redisReply *rep;
            int64_t t0 = sk_t0(c->observe);
            if (p->strategy == STOCK_UNSAFE_SETNX_EXPIRE) {
                /* The seed's release: whoever's lock it is now. */
                rep = redisCommand(c->ctx, "DEL %s", key);
            } else {
                rconn_cmd_evalsha(&c->cmd, &sk_unlock, 1);
                rconn_cmd_adds(&c->cmd, key);
                rconn_cmd_adds(&c->cmd, h->value[i]);
                rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_unlock);
            }
            sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
            if (rep) freeReplyObject(rep);
            else sk_drop(c, "unlock");
        }
    }
    h->n = 0;
}


/* ------------------------------------------------------------ read, write */

/* Reads the picked segments (and the request's idempotency record and the
 * user's count) in one atomic step. Under the locks of the `lock`
 * strategy (locked), the read also raises each segment's fence to our
 * token; the planning read, which holds no lock, leaves the fences alone. */
static stock_result read_segments(stock_conn *c, stock_req *r, pick *pk, seen *sn, int locked) {
    const stock_product *p = r->product;
    int fenced = locked && p->strategy == STOCK_LOCK;
    char suffix[32];
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
        snprintf(suffix, sizeof suffix, "fence:%d", pk->seg[i]);
        sk_add_key(c, p->sku, suffix);
    }
    rconn_cmd_adds(&c->cmd, c->run_id);
    rconn_cmd_adds(&c->cmd, r->user_id);
    rconn_cmd_addll(&c->cmd, pk->n);
    for (int i = 0; fenced && i < pk->n; i++) rconn_cmd_addll(&c->cmd, (long long)pk->token[i]);
    int64_t t0 = sk_t0(c->observe);
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_read);
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_RCW, t0);
    if (!rep) {
        sk_drop(c, "read");
        return STOCK_UNAVAILABLE;
    }
    stock_result res = STOCK_RESERVED;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        snprintf(c->errstr, sizeof c->errstr, "read: %s",
                 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        res = STOCK_UNAVAILABLE;
    } else if (sk_elem_int(rep, 0) == -3) {
        res = STOCK_MISSING;
    } else if (sk_elem_int(rep, 0) == -4) {
        res = STOCK_FENCED;
    } else if (rep->elements != 3 + (size_t)pk->n) {
        snprintf(c->errstr, sizeof c->errstr, "read: unexpected reply");
        res = STOCK_UNAVAILABLE;
    } else {
        sn->gen = sk_elem_int(rep, 0);
        sn->bought = sk_elem_int(rep, 1);
        snprintf(sn->idem, sizeof sn->idem, "%s", sk_elem_str(rep, 2));
        for (int i = 0; i < pk->n; i++) {
            pk->value[i] = sk_elem_int(rep, 3 + (size_t)i);
            sk_hint_set(p, pk->seg[i], pk->value[i] <= 0);
        }
    }
    freeReplyObject(rep);
    return res;
}

/* Writes the order's take and its records, atomically; see write.lua. */
static stock_result write_segments(stock_conn *c, stock_req *r, const pick *pk, const seen *sn) {
    const stock_product *p = r->product;
    int has_key = r->idem_key && r->idem_key[0], m = 0;
    char suffix[32];
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
        snprintf(suffix, sizeof suffix, "fence:%d", pk->seg[i]);
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
    rconn_cmd_adds(&c->cmd, p->strategy == STOCK_UNSAFE_CHECK_THEN_DECR ? "decr" : "set");
    for (int i = 0; i < pk->n; i++) {
        if (pk->take[i] == 0) continue;
        rconn_cmd_addll(&c->cmd, pk->seg[i]);
        rconn_cmd_addll(&c->cmd, pk->value[i] - pk->take[i]);
        rconn_cmd_addll(&c->cmd, pk->take[i]);
        rconn_cmd_addll(&c->cmd, p->strategy == STOCK_LOCK ? (long long)pk->token[i] : 0);
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
        if (code == 1) r->gen = sk_elem_int(rep, 1);
    } else {
        snprintf(c->errstr, sizeof c->errstr, "write: %s",
                 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
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

/* Reads every segment in one step and picks, from a random start, the ones
 * that cover the quantity. Returns STOCK_RESERVED when picked, else the
 * verdict (SOLD_OUT / INSUFFICIENT with available set, MISSING, ...). */
static stock_result pick_many(stock_conn *c, stock_req *r, pick *pk) {
    const stock_product *p = r->product;
    static __thread pick all;
    seen sn;
    all.n = p->segments;
    for (int i = 0; i < p->segments; i++) all.seg[i] = i;
    stock_result res = read_segments(c, r, &all, &sn, 0);
    if (res != STOCK_RESERVED) return res;
    long long total = 0;
    for (int i = 0; i < p->segments; i++) total += all.value[i] > 0 ? all.value[i] : 0;
    if (total < r->quantity) {
        r->available = total;
        return total == 0 ? STOCK_SOLD_OUT : STOCK_INSUFFICIENT;
    }
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
    if (r->idem_key && r->idem_key[0] && sn->idem[0]) {
        char rgen[24], oid[STOCK_ORDER_ID_MAX + 1], fp[40];
        if (sscanf(sn->idem, "%23[0-9]|%26[^|]|%39s", rgen, oid, fp) == 3 &&
            atoll(rgen) == sn->gen) {
            snprintf(r->replay_order_id, sizeof r->replay_order_id, "%s", oid);
            r->replay_same = !strcmp(fp, r->fingerprint);
            return STOCK_REPLAY;
        }
    }
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
        injected_pause(p);
        res = write_segments(c, r, pk, &sn);
    }
    unlock_all(c, r, pk, &h);
    return res;
}

int stock_reserve_one(stock_conn *c, stock_req *r) {
    const stock_product *p = r->product;
    static __thread pick pk;
    assert(stock_strategy_about(p->strategy)->kind == STOCK_KIND_RCW);
    r->result = STOCK_UNAVAILABLE;
    r->outcome_unknown = 0;
    r->lock_wait_us = has_lock(p->strategy) ? 0 : -1;
    if (stock_conn_ensure(c)) return -1;
    stock_result res = STOCK_LOCK_TIMEOUT;
    for (int i = 0; i < ATTEMPTS; i++) {
        int all = 0;
        if (p->segments == 1) {
            pk.n = 1;
            pk.seg[0] = 0;
            all = 1;
        } else if (i > 0 || !pick_one(c, p, &pk)) {
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
