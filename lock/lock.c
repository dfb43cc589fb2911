/* lock.c: acquiring (try, wait for a wake-up, Redlock quorum), reentry,
 * releasing, and the handles. See lock.h for the contract and the format.
 * For ZooKeeper and etcd clients the server side is the backend's (zk.c,
 * etcd.c); the held table, reentry counts, handles and callbacks are the
 * same for every kind. */
#include "lock/lock_int.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"

#define BACKOFF_START_MS 10      /* notices do the waking; this is the safety net */

/* ------------------------------------------------------------ held table */

static unsigned entry_hash(const char *name, const char *owner) {
    unsigned h = 2166136261u;   /* FNV-1a over name, NUL, owner */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    h *= 16777619u;
    for (const char *p = owner; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    return h % LOCK_ENTRY_BUCKETS;
}

/* The hold of name by owner, if any (c->mu held). */
static lock_entry *table_find(lock_client *c, const char *name, const char *owner) {
    for (lock_entry *e = c->buckets[entry_hash(name, owner)]; e; e = e->hnext)
        if (!e->released && !strcmp(e->name, name) && !strcmp(e->owner, owner)) return e;
    return NULL;
}

static void table_insert(lock_client *c, lock_entry *e) {
    unsigned b = entry_hash(e->name, e->owner);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    e->prev = NULL;
    e->next = c->all;
    if (c->all) c->all->prev = e;
    c->all = e;
}

static void table_remove(lock_client *c, lock_entry *e) {
    lock_entry **pp = &c->buckets[entry_hash(e->name, e->owner)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    assert(*pp == e);
    *pp = e->hnext;
    if (e->prev) e->prev->next = e->next;
    else c->all = e->next;
    if (e->next) e->next->prev = e->prev;
    e->prev = e->next = e->hnext = NULL;
    e->released = 1;
}

/* Frees an entry that is out of the table (c->mu held). */
static void entry_free(lock_entry *e) {
    if (e->hold) e->hold->be->hold_free(e->hold);
    free(e);
}

void lock_entry_unref(lock_entry *e) {
    assert(e->refs > 0);
    if (--e->refs == 0) {
        assert(e->released && e->count == 0 && !e->handles);
        entry_free(e);
    }
}

/* Calls h's on_lost on this thread, without c->mu (held on entry and on
 * return). lock_release(h) from inside fn is allowed: h is freed after fn. */
static void run_callback(lock_client *c, lock_handle *h) {
    void (*fn)(lock_handle *, void *) = h->on_lost;
    h->notified = 1;
    h->in_cb = 1;
    h->cb_thread = pthread_self();
    pthread_mutex_unlock(&c->mu);
    fn(h, h->ud);
    pthread_mutex_lock(&c->mu);
    h->in_cb = 0;
    if (h->free_after_cb) free(h);
    pthread_cond_broadcast(&c->cb_cv);
}

void lock_entry_mark_lost(lock_client *c, lock_entry *e, lock_errcode code, const char *why) {
    if (atomic_exchange(&e->lost, 1)) return;
    e->err = code;
    snprintf(e->errstr, sizeof e->errstr, "%s", why);
    atomic_fetch_add(&c->st.lost, 1);
    /* One at a time, from the head each time: a callback may release its own
     * or another handle of e, which changes the list. */
    for (;;) {
        lock_handle *h = e->handles;
        while (h && (!h->on_lost || h->notified)) h = h->next;
        if (!h) break;
        run_callback(c, h);
    }
}

int lock_holds_lost(lock_client *c, int (*match)(const lock_hold *h, void *arg), void *arg,
                    lock_errcode code, const char *why) {
    int n = 0;
    pthread_mutex_lock(&c->mu);
    /* From the head each time: callbacks run without c->mu and may
     * release entries; marked ones are skipped, so this ends. */
    for (;;) {
        lock_entry *e = c->all;
        while (e && (atomic_load(&e->lost) || !e->hold || !match(e->hold, arg))) e = e->next;
        if (!e) break;
        e->refs++;
        lock_entry_mark_lost(c, e, code, why);
        lock_entry_unref(e);
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* --------------------------------------------------------------- attempts */

/* One acquire in progress: what every try sends and what it learnt. */
typedef struct attempt {
    lock_client *c;
    const lock_keys *k;
    int64_t ttl_ms;
    char id[33];
    const char *waiter;           /* waiter id, "" while not queued */
    char score[24];               /* queue position once known, to keep it */
    int64_t queue_ttl_ms;
    uint64_t rng;
    uint64_t proposal;            /* this try's new incarnation (see settle) */
    /* results of the last try */
    uint64_t fence;
    uint64_t incarnation;
    int64_t start_us;             /* when the successful try began */
    int64_t pttl_ms;              /* the holder's remaining TTL (-1: none known) */
    int split;                    /* Redlock: some servers said yes, too few */
} attempt;

static unsigned all_servers(const lock_client *c) { return (1u << c->nservers) - 1; }

static uint64_t next_rand(attempt *a) {
    /* xorshift64*, seeded from getrandom: only for jitter. */
    a->rng ^= a->rng >> 12;
    a->rng ^= a->rng << 25;
    a->rng ^= a->rng >> 27;
    return a->rng * 2685821657736338717ULL;
}

/* Runs one script call on the servers in mask. */
static int run1(lock_client *c, lock_call *call, unsigned mask, lock_replies *rs) {
    int rc = lock_run(c, call, 1, mask, rs);
    rconn_cmd_free(&call->cmd);
    return rc;
}

/* The release script for id on the servers in mask. */
static lock_tally release_on(lock_client *c, const lock_keys *k, const char *id, unsigned mask,
                             char *why, size_t whylen) {
    lock_call call;
    lock_replies rs;
    lock_tally t = { 0, 0, c->nservers };
    rconn_cmd_init(&call.cmd);
    lock_call_start(&call, LOCK_S_RELEASE, 2);
    rconn_cmd_adds(&call.cmd, k->name);
    rconn_cmd_adds(&call.cmd, k->queue);
    rconn_cmd_adds(&call.cmd, id);
    rconn_cmd_adds(&call.cmd, k->wake);
    rconn_cmd_addll(&call.cmd, LOCK_WAKE_COUNT);
    if (run1(c, &call, mask, &rs)) {
        snprintf(why, whylen, "out of memory");
        return t;
    }
    t = lock_tally_int(&rs, 0, mask);
    if (t.io) lock_replies_why(c, &rs, mask, why, whylen);
    lock_replies_free(&rs);
    return t;
}

/* Redlock: writes the agreed token and incarnation back to the servers
 * that took the lock. Returns how many confirmed.
 *
 * THE INCARNATION OF A REDLOCK TOKEN. Each server keeps, beside its
 * counter, the incarnation its counter belongs to (B:incarnation); a
 * server without one (new, or it lost its data) stores the try's proposal
 * as it takes the lock (acquire.lua). When every server of the quorum
 * answered the same incarnation, the token carries it; when they differ
 * (some lost their data, some did not), the token carries the try's
 * proposal, drawn new for that try, and settle stores it on the quorum.
 * So an incarnation I gets onto a server only through the take and the
 * settle of the one try that drew I -- adjacent on that server, as settle
 * needs the lock still ours there -- and then stays until the server loses
 * its data or settles another: a server carries I over one unbroken
 * stretch of its data, in which its counter never goes back.
 *
 * Two successful acquires never hand out the same (incarnation, token).
 * Their settled quorums share a server n, on which each took the lock and
 * settled with no take between. Say H1's take and settle on n came first,
 * and both got (I, T). H2's reply on n carried I too (it agreed on I), or
 * H2 drew I; if H2 drew I, I reached n only by H2's own take and settle
 * there, after H1's settle had already put I on n: impossible. So n
 * carried I from H1's settle (counter >= T) to H2's take without a break,
 * H2's take counted past T, and H2's token, the quorum's highest, is > T.
 * No clock is involved (Redlock's own exclusion needs one; this does not).
 * tests/unit/test_lock.c (test_redlock_incarnation) drives these cases
 * on real servers. */
static int settle(attempt *a, unsigned okmask, uint64_t fence, uint64_t incarnation) {
    lock_call call;
    lock_replies rs;
    char inc[17];
    lock_incarnation_hex(incarnation, inc);
    rconn_cmd_init(&call.cmd);
    lock_call_start(&call, LOCK_S_SETTLE, 3);
    rconn_cmd_adds(&call.cmd, a->k->name);
    rconn_cmd_adds(&call.cmd, a->k->fence);
    rconn_cmd_adds(&call.cmd, a->k->incarnation);
    rconn_cmd_adds(&call.cmd, a->id);
    rconn_cmd_addll(&call.cmd, (long long)fence);
    rconn_cmd_adds(&call.cmd, inc);
    if (run1(a->c, &call, okmask, &rs)) return 0;
    int ok = lock_tally_int(&rs, 0, okmask).ok;
    lock_replies_free(&rs);
    return ok;
}

static long long elem_ll(const redisReply *r, size_t i) {
    const redisReply *e = r->element[i];
    return e->type == REDIS_REPLY_INTEGER ? e->integer : -1;
}

/* The acquire script's answers, tallied. */
typedef struct try_tally {
    int ok, busy;
    unsigned okmask, busymask;
    uint64_t fence;               /* the highest the yes-sayers gave */
    uint64_t incarnation;         /* the one they all gave; 0 if they differ */
} try_tally;

static try_tally tally_try(attempt *a, const lock_replies *rs) {
    try_tally t = { 0, 0, 0, 0, 0, 0 };
    int differ = 0;
    a->pttl_ms = -1;
    for (int i = 0; i < a->c->nservers; i++) {
        const redisReply *r = LOCK_REPLY(rs, 0, i);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
            r->element[0]->type != REDIS_REPLY_INTEGER)
            continue;
        if (r->element[0]->integer == 1) {
            long long f = elem_ll(r, 1);
            if (f <= 0) continue;
            const redisReply *ir = r->elements > 2 ? r->element[2] : NULL;
            uint64_t inc = ir && ir->type == REDIS_REPLY_STRING
                               ? lock_incarnation_parse(ir->str, ir->len) : 0;
            if (t.ok == 0) t.incarnation = inc;
            else if (inc != t.incarnation) differ = 1;
            t.ok++;
            t.okmask |= 1u << i;
            if ((uint64_t)f > t.fence) t.fence = (uint64_t)f;
            continue;
        }
        t.busy++;
        t.busymask |= 1u << i;
        long long p = elem_ll(r, 1);
        if (p > 0 && (a->pttl_ms < 0 || p < a->pttl_ms)) a->pttl_ms = p;
        if (r->elements > 2 && !a->score[0] && elem_ll(r, 2) > 0)
            snprintf(a->score, sizeof a->score, "%lld", elem_ll(r, 2));
    }
    if (differ) t.incarnation = 0;
    return t;
}

/* One try on every server. Returns LOCK_OK (a->fence, a->start_us set),
 * LOCK_BUSY (a->pttl_ms, a->split set) or LOCK_ERROR (err). Whatever this
 * try may have taken without reaching a quorum is released again. */
static lock_status try_once(attempt *a, char *err, size_t errlen) {
    lock_client *c = a->c;
    lock_call call;
    lock_replies rs;
    unsigned all = all_servers(c);
    char proposal[17];
    /* New for every try: an incarnation no server had before this try. */
    if (!(a->proposal = lock_incarnation_new())) {
        snprintf(err, errlen, "getrandom failed");
        return LOCK_ERROR;
    }
    lock_incarnation_hex(a->proposal, proposal);
    rconn_cmd_init(&call.cmd);
    lock_call_start(&call, LOCK_S_ACQUIRE, 4);
    rconn_cmd_adds(&call.cmd, a->k->name);
    rconn_cmd_adds(&call.cmd, a->k->fence);
    rconn_cmd_adds(&call.cmd, a->k->queue);
    rconn_cmd_adds(&call.cmd, a->k->incarnation);
    rconn_cmd_adds(&call.cmd, a->id);
    rconn_cmd_addll(&call.cmd, a->ttl_ms);
    rconn_cmd_adds(&call.cmd, a->waiter);
    rconn_cmd_adds(&call.cmd, a->score);
    rconn_cmd_addll(&call.cmd, a->queue_ttl_ms);
    rconn_cmd_adds(&call.cmd, proposal);
    a->start_us = clock_mono_us();
    atomic_fetch_add(&c->st.attempts, 1);
    if (run1(c, &call, all, &rs)) {
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    try_tally t = tally_try(a, &rs);
    int64_t valid_until = a->start_us + a->ttl_ms * 1000 - lock_drift_us(a->ttl_ms);
    int won = t.ok >= c->quorum && clock_mono_us() < valid_until;
    /* The quorum's servers disagree on the incarnation (or one stored an
     * unreadable one): the token gets this try's proposal, stored by settle. */
    uint64_t inc = t.incarnation ? t.incarnation : a->proposal;
    if (won && (c->nservers > 1 || !t.incarnation))
        won = settle(a, t.okmask, t.fence, inc) >= c->quorum && clock_mono_us() < valid_until;
    if (won) {
        a->fence = t.fence;
        a->incarnation = inc;
        lock_replies_free(&rs);
        return LOCK_OK;
    }
    /* Not ours: undo whatever this try may have set, on every server that
     * did not plainly say "held" (a lost reply may hide a success). */
    char why[600];
    unsigned undo = all & ~t.busymask;
    lock_replies_why(c, &rs, all & ~(t.okmask | t.busymask), why, sizeof why);
    lock_replies_free(&rs);
    if (undo) {
        char ignored[8];
        release_on(c, a->k, a->id, undo, ignored, sizeof ignored);
    }
    a->split = t.ok > 0;
    if (t.ok + t.busy >= c->quorum) return LOCK_BUSY;
    if (c->nservers == 1) snprintf(err, errlen, "%s", why);
    else
        snprintf(err, errlen, "no quorum: %d of %d servers answered (need %d): %s",
                 t.ok + t.busy, c->nservers, c->quorum, why);
    return LOCK_ERROR;
}

/* Leaves the waiter queue on every server (best effort). */
static void leave_queue(attempt *a) {
    lock_call call;
    lock_replies rs;
    rconn_cmd_init(&call.cmd);
    call.script = LOCK_S_COUNT;   /* a plain command */
    rconn_cmd_adds(&call.cmd, "ZREM");
    rconn_cmd_adds(&call.cmd, a->k->queue);
    rconn_cmd_adds(&call.cmd, a->waiter);
    if (run1(a->c, &call, all_servers(a->c), &rs) == 0) lock_replies_free(&rs);
}

/* The wait before the next try: a jittered exponential backoff ("equal
 * jitter": half fixed, half random), cut to the holder's remaining TTL so an
 * expiry is seen at once, or a short random delay after a Redlock split
 * vote, so contenders do not split again in step. */
static int64_t next_wait_us(attempt *a, int64_t *backoff_ms) {
    int64_t b = *backoff_ms * 1000;
    int64_t w = b / 2 + (int64_t)(next_rand(a) % (uint64_t)(b / 2 + 1));
    if (a->pttl_ms > 0 && a->pttl_ms * 1000 + 1000 < w) w = a->pttl_ms * 1000 + 1000;
    if (a->split) {
        int64_t cap = a->ttl_ms / 10 < 50 ? (a->ttl_ms / 10 > 2 ? a->ttl_ms / 10 : 2) : 50;
        w = 1000 + (int64_t)(next_rand(a) % (uint64_t)(cap * 1000));
    }
    *backoff_ms = *backoff_ms * 2 > a->c->max_backoff_ms ? a->c->max_backoff_ms : *backoff_ms * 2;
    return w;
}

/* The waiting part of an acquire: subscribe first, then retry (joining the
 * queue atomically), then sleep until a notice or the computed wait. */
static lock_status wait_for(attempt *a, int64_t deadline_us, char *err, size_t errlen) {
    lock_client *c = a->c;
    lock_waiter *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    snprintf(w->id, sizeof w->id, "%s-%llx", c->cid,
             (unsigned long long)atomic_fetch_add(&c->waiter_seq, 1));
    w->chanlen = (size_t)snprintf(w->chan, sizeof w->chan, "%s%s", a->k->wake, w->id);
    w->name = a->k->name;
    lock_cond_init(&w->cv);
    int64_t sub_until = clock_mono_us() + c->timeout_ms * 1000;
    int subscribed = lock_waiter_add(c, w, sub_until < deadline_us ? sub_until : deadline_us) == 0;
    a->waiter = w->id;
    int64_t backoff_ms = BACKOFF_START_MS;
    lock_status st;
    for (;;) {
        if (subscribed) lock_waiter_clear(c, w);
        st = try_once(a, err, errlen);
        if (st != LOCK_BUSY) break;
        int64_t now = clock_mono_us();
        if (now >= deadline_us) break;
        int64_t until = now + next_wait_us(a, &backoff_ms);
        if (until > deadline_us) until = deadline_us;
        int woken = subscribed ? lock_waiter_wait(c, w, until) : 0;
        if (!subscribed) clock_sleep_ms((until - now + 999) / 1000);
        atomic_fetch_add(woken ? &c->st.wakeups : &c->st.timeouts, 1);
    }
    if (subscribed) lock_waiter_remove(c, w);
    if (st != LOCK_OK) leave_queue(a);
    pthread_cond_destroy(&w->cv);
    free(w);
    return st;
}

/* ------------------------------------------------------------------ reentry */

/* Adds h to the hold e (c->mu held) and re-arms the lease from start_us
 * (< 0: the lease is left as it is). */
static void add_handle(lock_entry *e, lock_client *c, lock_handle *h, int64_t start_us,
                       int64_t ttl_ms) {
    h->c = c;
    h->e = e;
    h->next = e->handles;
    e->handles = h;
    e->count++;
    e->refs++;
    if (start_us < 0) return;
    e->ttl_ms = ttl_ms;
    atomic_store(&e->lease_end_us, start_us + ttl_ms * 1000 - lock_drift_us(ttl_ms));
    e->next_renew_us = start_us + ttl_ms * 1000 / 3;
}

/* reenter() for a backend: the backend checks the hold is still ours (an
 * etcd lease is kept alive by the check; a ZooKeeper session's lease is its
 * own). The lease keeps the length the server granted: a backend lease
 * cannot be re-armed to another ttl. e is pinned by the caller. */
static lock_status reenter_backend(lock_client *c, lock_entry *e, const char *name,
                                   lock_handle *h, lock_errcode *code, char *err,
                                   size_t errlen) {
    int64_t start = -1;
    lock_check r = c->be->check(c, e->hold, &start, err, errlen);
    lock_status st = LOCK_ERROR;
    pthread_mutex_lock(&c->mu);
    if (r == LOCK_CHECK_OURS && !atomic_load(&e->lost)) {
        add_handle(e, c, h, start, e->ttl_ms);
        st = LOCK_OK;
    } else if (r == LOCK_CHECK_GONE || atomic_load(&e->lost)) {
        lock_entry_mark_lost(c, e, LOCK_ERR_LOST, "reentry found the lock gone");
        snprintf(err, errlen, "%s: this owner held it but it is gone (expired or taken)", name);
    } else {
        *code = LOCK_ERR_IO;
    }
    lock_entry_unref(e);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* An acquire of a name this owner already holds: Redis must still have it
 * (the lease is re-armed to ttl_ms at the same time). Returns LOCK_OK (h is
 * now a handle of the hold), LOCK_ERROR (*code, err), or LOCK_BUSY meaning
 * "not held: acquire normally". */
static lock_status reenter(lock_client *c, const char *name, const char *owner, int64_t ttl_ms,
                           lock_handle *h, lock_errcode *code, char *err, size_t errlen) {
    *code = LOCK_ERR_LOST;
    pthread_mutex_lock(&c->mu);
    lock_entry *e = table_find(c, name, owner);
    if (!e) {
        pthread_mutex_unlock(&c->mu);
        return LOCK_BUSY;
    }
    if (atomic_load(&e->lost)) {
        pthread_mutex_unlock(&c->mu);
        snprintf(err, errlen, "%s: this owner holds it but it was lost; release that handle first",
                 name);
        return LOCK_ERROR;
    }
    e->refs++;
    pthread_mutex_unlock(&c->mu);
    if (c->be) return reenter_backend(c, e, name, h, code, err, errlen);

    lock_call call;
    lock_replies rs;
    unsigned all = all_servers(c);
    rconn_cmd_init(&call.cmd);
    lock_call_start(&call, LOCK_S_EXTEND, 1);
    rconn_cmd_adds(&call.cmd, e->name);
    rconn_cmd_adds(&call.cmd, e->id);
    rconn_cmd_addll(&call.cmd, ttl_ms);
    int64_t start = clock_mono_us();
    if (run1(c, &call, all, &rs)) {
        pthread_mutex_lock(&c->mu);
        lock_entry_unref(e);
        pthread_mutex_unlock(&c->mu);
        snprintf(err, errlen, "out of memory");
        *code = LOCK_ERR_NOMEM;
        return LOCK_ERROR;
    }
    lock_tally t = lock_tally_int(&rs, 0, all);
    int64_t lease_end = start + ttl_ms * 1000 - lock_drift_us(ttl_ms);
    lock_status st = LOCK_ERROR;
    pthread_mutex_lock(&c->mu);
    if (t.ok >= c->quorum && clock_mono_us() < lease_end && !atomic_load(&e->lost)) {
        add_handle(e, c, h, start, ttl_ms);
        st = LOCK_OK;
    } else if (t.no > c->nservers - c->quorum) {
        lock_entry_mark_lost(c, e, LOCK_ERR_LOST, "reentry found the lock gone");
        snprintf(err, errlen, "%s: this owner held it but it is gone (expired or taken)", name);
    } else {
        lock_replies_why(c, &rs, all, err, errlen);
        *code = c->nservers > 1 ? LOCK_ERR_QUORUM : LOCK_ERR_IO;
    }
    lock_entry_unref(e);
    pthread_mutex_unlock(&c->mu);
    lock_replies_free(&rs);
    return st;
}

/* ------------------------------------------------------------------ acquire */

static lock_status fail(lock_client *c, lock_errcode code, const char *msg, char *err,
                        size_t errlen) {
    if (err != msg) snprintf(err, errlen, "%s", msg);
    lock_set_error(c, code, msg);
    atomic_fetch_add(&c->st.errors, 1);
    return LOCK_ERROR;
}

/* Puts a fresh hold into the table and hands out its first handle. e's
 * name, keys, id and hold are set by the caller. */
static void hold(lock_client *c, const char *owner, uint64_t fence, uint64_t incarnation,
                 int64_t start_us, int64_t ttl_ms, lock_entry *e, lock_handle *h) {
    snprintf(e->owner, sizeof e->owner, "%s", owner);
    e->keys.name = e->name;
    e->fence = fence;
    e->incarnation = incarnation;
    e->ttl_ms = ttl_ms;
    atomic_init(&e->lease_end_us, start_us + ttl_ms * 1000 - lock_drift_us(ttl_ms));
    atomic_init(&e->lost, 0);
    e->next_renew_us = start_us + ttl_ms * 1000 / 3;
    e->count = 1;
    e->refs = 1;
    e->handles = h;
    h->c = c;
    h->e = e;
    int renew = c->watchdog && (!c->be || c->be->watchdog_renews);
    pthread_mutex_lock(&c->mu);
    table_insert(c, e);
    if (renew && lock_watchdog_ensure(c) == 0) pthread_cond_signal(&c->wd_cv);
    pthread_mutex_unlock(&c->mu);
    if (e->hold && c->be->held) c->be->held(c, e->hold);
}

/* Sets up a's id, jitter seed and keys. Returns 0 or -1 (err). */
static int attempt_init(attempt *a, lock_client *c, const lock_keys *k, int64_t ttl_ms,
                        int64_t wait_ms, char *err, size_t errlen) {
    unsigned char rnd[24];
    memset(a, 0, sizeof *a);
    if (lock_random(rnd, sizeof rnd)) {
        snprintf(err, errlen, "getrandom failed");
        return -1;
    }
    for (int i = 0; i < 16; i++) sprintf(a->id + 2 * i, "%02x", rnd[i]);
    memcpy(&a->rng, rnd + 16, sizeof a->rng);
    a->rng |= 1;
    a->c = c;
    a->k = k;
    a->ttl_ms = ttl_ms;
    a->waiter = "";
    /* Each retry re-arms it; 1 s past the longest gap between retries. */
    int64_t gap = c->max_backoff_ms > ttl_ms ? c->max_backoff_ms : ttl_ms;
    a->queue_ttl_ms = (wait_ms >= 0 && wait_ms < gap ? wait_ms : gap) + 1000;
    return 0;
}

lock_status lock_acquire(lock_client *c, const char *name, int64_t ttl_ms, int64_t wait_ms,
                         const char *owner, lock_handle **out, char *err, size_t errlen) {
    char scratch[256], me[64];
    lock_keys keys;
    attempt a;
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (out) *out = NULL;
    if (!c) {
        snprintf(err, errlen, "no lock client");
        return LOCK_ERROR;
    }
    if (!name || !out || ttl_ms < 3 || ttl_ms > (1LL << 40))
        return fail(c, LOCK_ERR_ARG, "lock_acquire: need a name, a handle pointer and ttl_ms >= 3",
                    err, errlen);
    if (owner && (!owner[0] || strlen(owner) > LOCK_OWNER_MAX))
        return fail(c, LOCK_ERR_ARG, "lock_acquire: owner must be 1 to 200 bytes", err, errlen);
    if (c->be) {
        size_t n = strlen(name);
        if (n == 0 || n > LOCK_NAME_MAX) {
            snprintf(err, errlen, "lock name must be 1 to %d bytes", LOCK_NAME_MAX);
            return fail(c, LOCK_ERR_ARG, err, err, errlen);
        }
        memset(&keys, 0, sizeof keys);
        keys.name = name;
    } else if (lock_keys_make(name, &keys, err, errlen)) {
        return fail(c, LOCK_ERR_ARG, err, err, errlen);
    }
    if (!owner) {
        snprintf(me, sizeof me, "%ld:%ld", (long)getpid(), (long)syscall(SYS_gettid));
        owner = me;
    }
    int64_t start = clock_mono_us();
    int64_t deadline = wait_ms < 0 ? INT64_MAX : start + wait_ms * 1000;
    lock_entry *e = calloc(1, sizeof *e);
    lock_handle *h = calloc(1, sizeof *h);
    if (!e || !h) {
        free(e);
        free(h);
        return fail(c, LOCK_ERR_NOMEM, "out of memory", err, errlen);
    }
    lock_errcode code;
    lock_status st = reenter(c, name, owner, ttl_ms, h, &code, err, errlen);
    if (st != LOCK_BUSY) {
        free(e);
        if (st == LOCK_OK) {
            atomic_fetch_add(&c->st.reentered, 1);
            atomic_fetch_add(&c->st.acquired, 1);
            *out = h;
            return LOCK_OK;
        }
        free(h);
        return fail(c, code, err, err, errlen);
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    e->keys = keys;
    code = LOCK_ERR_IO;
    if (c->be) {
        lock_took t = { 0 };
        atomic_fetch_add(&c->st.attempts, 1);
        st = c->be->acquire(c, name, ttl_ms, deadline, &t, &code, err, errlen);
        if (st == LOCK_OK) {
            e->hold = t.hold;
            e->lease_src = t.lease_src;
            hold(c, owner, t.fence, t.incarnation, t.start_us, t.ttl_ms, e, h);
        }
    } else if (attempt_init(&a, c, &keys, ttl_ms, wait_ms, err, errlen)) {
        st = LOCK_ERROR;
    } else {
        code = c->nservers > 1 ? LOCK_ERR_QUORUM : LOCK_ERR_IO;
        st = try_once(&a, err, errlen);
        if (st == LOCK_BUSY && clock_mono_us() < deadline) st = wait_for(&a, deadline, err, errlen);
        if (st == LOCK_OK) {
            memcpy(e->id, a.id, sizeof e->id);
            hold(c, owner, a.fence, a.incarnation, a.start_us, a.ttl_ms, e, h);
        }
    }
    if (st == LOCK_OK) {
        atomic_fetch_add(&c->st.acquired, 1);
        *out = h;
        return LOCK_OK;
    }
    free(e);
    free(h);
    if (st == LOCK_ERROR) return fail(c, code, err, err, errlen);
    atomic_fetch_add(&c->st.busy, 1);
    snprintf(err, errlen, "%s is held by another (waited %lld ms)", name,
             (long long)((clock_mono_us() - start) / 1000));
    return LOCK_BUSY;
}

/* ------------------------------------------------------------------ handles */

uint64_t lock_fence(const lock_handle *h) { return h ? h->e->fence : 0; }

uint64_t lock_incarnation(const lock_handle *h) { return h ? h->e->incarnation : 0; }

int64_t lock_remaining_ms(const lock_handle *h) {
    if (!h || atomic_load(&h->e->lost)) return 0;
    const atomic_int_fast64_t *end = h->e->lease_src ? h->e->lease_src : &h->e->lease_end_us;
    int64_t left = atomic_load(end) - clock_mono_us();
    return left >= 0 ? left / 1000 : -((-left + 999) / 1000);
}

int lock_lost(const lock_handle *h) { return h ? atomic_load(&h->e->lost) : 1; }

const char *lock_name(const lock_handle *h) { return h ? h->e->name : ""; }

lock_errcode lock_err(const lock_handle *h, char *buf, size_t len) {
    if (!h) return LOCK_ERR_ARG;
    lock_client *c = h->c;
    pthread_mutex_lock(&c->mu);
    lock_errcode code = h->e->err;
    if (buf && len) snprintf(buf, len, "%s", h->e->errstr);
    pthread_mutex_unlock(&c->mu);
    return code;
}

void lock_on_lost(lock_handle *h, void (*fn)(lock_handle *h, void *ud), void *ud) {
    if (!h) return;
    lock_client *c = h->c;
    pthread_mutex_lock(&c->mu);
    h->on_lost = fn;
    h->ud = ud;
    /* Lost before anyone listened: tell now, so the loss is never missed. */
    if (fn && atomic_load(&h->e->lost) && !h->notified) {
        lock_entry *e = h->e;
        e->refs++;
        run_callback(c, h);
        lock_entry_unref(e);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Takes h off its entry (c->mu held). Returns 1 if it was the last handle:
 * the entry is then out of the table and the caller must free the lock. */
static int detach(lock_client *c, lock_handle *h) {
    lock_entry *e = h->e;
    lock_handle **pp = &e->handles;
    while (*pp && *pp != h) pp = &(*pp)->next;
    assert(*pp == h);
    *pp = h->next;
    e->count--;
    if (e->count > 0) return 0;
    table_remove(c, e);
    return 1;
}

lock_release_result lock_release_ex(lock_handle *h, char *err, size_t errlen) {
    char scratch[8];
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    if (!h) {
        snprintf(err, errlen, "no handle");
        return LOCK_UNKNOWN;
    }
    lock_client *c = h->c;
    lock_entry *e = h->e;
    pthread_mutex_lock(&c->mu);
    /* Its lost callback may be running on another thread: let it finish. */
    while (h->in_cb && !pthread_equal(h->cb_thread, pthread_self()))
        pthread_cond_wait(&c->cb_cv, &c->mu);
    int last = detach(c, h);
    int lost = atomic_load(&e->lost);
    pthread_mutex_unlock(&c->mu);

    lock_release_result res;
    if (!last) {
        res = lost ? LOCK_NOT_OWNER : LOCK_RELEASED;
        if (lost) snprintf(err, errlen, "%s was lost", e->name);
    } else if (c->be) {
        res = c->be->release(c, e->hold, err, errlen);
        if (res == LOCK_UNKNOWN) lock_set_error(c, LOCK_ERR_IO, err);
    } else {
        lock_tally t = release_on(c, &e->keys, e->id, all_servers(c), err, errlen);
        if (t.ok >= c->quorum) {
            res = LOCK_RELEASED;
        } else if (t.ok + t.io >= c->quorum) {
            res = LOCK_UNKNOWN;
            lock_set_error(c, LOCK_ERR_IO, err);
        } else {
            res = LOCK_NOT_OWNER;
            snprintf(err, errlen, "%s is not ours: it expired or another holds it", e->name);
        }
    }
    atomic_fetch_add(res == LOCK_RELEASED ? &c->st.released
                     : res == LOCK_NOT_OWNER ? &c->st.not_owner : &c->st.unknown, 1);
    pthread_mutex_lock(&c->mu);
    int deferred = h->in_cb;
    if (deferred) h->free_after_cb = 1;
    lock_entry_unref(e);
    pthread_mutex_unlock(&c->mu);
    if (!deferred) free(h);
    return res;
}

lock_release_result lock_release(lock_handle *h) { return lock_release_ex(h, NULL, 0); }

/* ------------------------------------------------------------------ teardown */

void lock_entries_drop_all(lock_client *c) {
    pthread_mutex_lock(&c->mu);
    while (c->all) {
        lock_entry *e = c->all;
        table_remove(c, e);
        pthread_mutex_unlock(&c->mu);
        char ignored[8];
        if (c->be) c->be->release(c, e->hold, ignored, sizeof ignored);
        else release_on(c, &e->keys, e->id, all_servers(c), ignored, sizeof ignored);
        pthread_mutex_lock(&c->mu);
        while (e->handles) {
            lock_handle *h = e->handles;
            e->handles = h->next;
            free(h);
        }
        e->count = 0;
        entry_free(e);
    }
    pthread_mutex_unlock(&c->mu);
}

void lock_client_free(lock_client *c) {
    if (!c) return;
    lock_watchdog_stop(c);
    lock_waker_stop(c);
    if (c->be) c->be->stop(c);
    lock_entries_drop_all(c);
    lock_client_destroy(c);
}
