/* redis.c: the Redis backend -- a lock on one Redis server, on a primary a
 * Sentinel watches, or on several independent servers by Redlock quorum:
 * one try on every server at once (acquire.lua), waiting for a release
 * notice between tries (the waker), the incarnation a Redlock token
 * carries (settle), renewal and reentry by extend.lua, and release. The
 * format on the server is lock.h's THE FORMAT; rserver.c runs the scripts. */
#include "lock/redis_int.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

#define BACKOFF_START_MS 10      /* notices do the waking; this is the safety net */

/* A Redis hold: the derived keys and the random id the lock's value holds. */
typedef struct redis_hold {
    lock_hold base;
    char name[LOCK_NAME_MAX + 1];
    lock_keys keys;
    char id[33];
} redis_hold;

/* -------------------------------------------------------------------- names */

/* The first '{' and the first '}' after it, with something between: what
 * Redis Cluster hashes instead of the whole key. */
static int has_hash_tag(const char *name) {
    const char *open = strchr(name, '{');
    if (!open) return 0;
    const char *close = strchr(open + 1, '}');
    return close && close > open + 1;
}

int lock_keys_make(const char *name, lock_keys *k, char *err, size_t errlen) {
    char base[LOCK_NAME_MAX + 3];
    size_t n = strlen(name);
    if (n == 0 || n > LOCK_NAME_MAX) {
        snprintf(err, errlen, "lock name must be 1 to %d bytes", LOCK_NAME_MAX);
        return -1;
    }
    if (has_hash_tag(name)) {
        snprintf(base, sizeof base, "%s", name);
    } else if (!strchr(name, '{') && !strchr(name, '}')) {
        /* "{name}:x" hashes like "name": the derived keys share its slot. */
        snprintf(base, sizeof base, "{%s}", name);
    } else {
        snprintf(err, errlen, "lock name '%.60s' has braces but no {hash tag}", name);
        return -1;
    }
    k->name = name;
    snprintf(k->fence, sizeof k->fence, "%s:fence", base);
    snprintf(k->queue, sizeof k->queue, "%s:waiters", base);
    snprintf(k->wake, sizeof k->wake, "%s:wake:", base);
    snprintf(k->incarnation, sizeof k->incarnation, "%s:incarnation", base);
    snprintf(k->fairq, sizeof k->fairq, "%s:fair", base);
    snprintf(k->fairdue, sizeof k->fairdue, "%s:fair:due", base);
    snprintf(k->fairsub, sizeof k->fairsub, "%s:fair:sub", base);
    return 0;
}

/* --------------------------------------------------------------- attempts */

/* One acquire in progress: what every try sends and what it learnt. */
typedef struct attempt {
    lock_redis *r;
    const lock_keys *k;
    int64_t ttl_ms;
    char id[33];
    const char *waiter;           /* waiter id, "" while not queued */
    char waiter_id[48];           /* fair: made before the first try, which queues */
    int listens;                  /* fair: the waiter's wake channel is subscribed: 1, or
                                   * 2 on a cluster (a PUBLISH cannot count it) */
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
    long long rank;               /* fair: place in the queue (0: the head; -1: none) */
    int64_t hint_ms;              /* fair: when to look again (0: no hint) */
    int queued;                   /* fair: has had a place in the queue */
    uint64_t ticket;              /* fair: the place's ticket (0: none) */
} attempt;

static unsigned all_servers(const lock_redis *r) { return (1u << r->nservers) - 1; }

static uint64_t next_rand(attempt *a) {
    /* xorshift64*, seeded from getrandom: only for jitter. */
    assert(a->rng != 0);                  /* seeded odd; the shifts never reach 0 */
    a->rng ^= a->rng >> 12;
    a->rng ^= a->rng << 25;
    a->rng ^= a->rng >> 27;
    return a->rng * 2685821657736338717ULL;
}

/* Runs one script call on the servers in mask. */
static int run1(lock_redis *r, lock_call *call, unsigned mask, lock_replies *rs) {
    assert((mask & ~all_servers(r)) == 0);
    int rc = lock_run(r, call, 1, mask, rs);
    rconn_cmd_free(&call->cmd);
    return rc;
}

/* The release script for id on the servers in mask. */
static lock_tally release_on(lock_redis *r, const lock_keys *k, const char *id, unsigned mask,
                             char *why, size_t whylen) {
    lock_call call;
    lock_replies rs;
    lock_tally t = { 0, 0, r->nservers };
    rconn_cmd_init(&call.cmd);
    if (r->fair) {
        lock_call_start(&call, LOCK_S_FAIR_RELEASE, 4);
        rconn_cmd_adds(&call.cmd, k->name);
        rconn_cmd_adds(&call.cmd, k->fairq);
        rconn_cmd_adds(&call.cmd, k->fairdue);
        rconn_cmd_adds(&call.cmd, k->fairsub);
        rconn_cmd_adds(&call.cmd, id);
        rconn_cmd_adds(&call.cmd, k->wake);
    } else {
        lock_call_start(&call, LOCK_S_RELEASE, 2);
        rconn_cmd_adds(&call.cmd, k->name);
        rconn_cmd_adds(&call.cmd, k->queue);
        rconn_cmd_adds(&call.cmd, id);
        rconn_cmd_adds(&call.cmd, k->wake);
        rconn_cmd_addll(&call.cmd, LOCK_WAKE_COUNT);
    }
    if (run1(r, &call, mask, &rs)) {
        snprintf(why, whylen, "out of memory");
        return t;
    }
    t = lock_tally_int(&rs, 0, mask);
    if (t.io) lock_replies_why(r, &rs, mask, why, whylen);
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
    assert(okmask != 0 && fence > 0);     /* after a try that won, with its token */
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
    if (run1(a->r, &call, okmask, &rs)) return 0;
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
    for (int i = 0; i < a->r->nservers; i++) {
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
        if (a->r->fair && r->elements >= 5) {      /* one server: a fair lock's reply */
            assert(a->r->nservers == 1);
            a->rank = elem_ll(r, 2);
            a->hint_ms = elem_ll(r, 3) > 0 ? elem_ll(r, 3) : 0;
            if (elem_ll(r, 4) == 1) {
                if (a->queued) atomic_fetch_add(&a->r->c->st.requeued, 1);
                a->queued = 1;
            }
            if (r->elements >= 6 && elem_ll(r, 5) > 0) a->ticket = (uint64_t)elem_ll(r, 5);
            continue;
        }
        if (r->elements > 2 && !a->score[0] && elem_ll(r, 2) > 0)
            snprintf(a->score, sizeof a->score, "%lld", elem_ll(r, 2));
    }
    if (differ) t.incarnation = 0;
    /* Each server counted once, yes or busy; a yes carries a token. */
    assert(!(t.okmask & t.busymask) && t.ok + t.busy <= a->r->nservers);
    assert(t.ok == 0 || t.fence > 0);
    return t;
}

/* One try on every server. Returns LOCK_OK (a->fence, a->start_us set),
 * LOCK_BUSY (a->pttl_ms, a->split set) or LOCK_ERROR (err). Whatever this
 * try may have taken without reaching a quorum is released again. */
static lock_status try_once(attempt *a, char *err, size_t errlen) {
    lock_redis *r = a->r;
    lock_call call;
    lock_replies rs;
    unsigned all = all_servers(r);
    char proposal[17];
    /* New for every try: an incarnation no server had before this try. */
    if (!(a->proposal = lock_incarnation_new())) {
        snprintf(err, errlen, "getrandom failed");
        return LOCK_ERROR;
    }
    lock_incarnation_hex(a->proposal, proposal);
    rconn_cmd_init(&call.cmd);
    if (r->fair) {
        lock_call_start(&call, LOCK_S_FAIR_ACQUIRE, 6);
        rconn_cmd_adds(&call.cmd, a->k->name);
        rconn_cmd_adds(&call.cmd, a->k->fence);
        rconn_cmd_adds(&call.cmd, a->k->fairq);
        rconn_cmd_adds(&call.cmd, a->k->incarnation);
        rconn_cmd_adds(&call.cmd, a->k->fairdue);
        rconn_cmd_adds(&call.cmd, a->k->fairsub);
        rconn_cmd_adds(&call.cmd, a->id);
        rconn_cmd_addll(&call.cmd, a->ttl_ms);
        rconn_cmd_adds(&call.cmd, a->waiter);
        rconn_cmd_adds(&call.cmd, a->listens == 2 ? "2" : a->listens ? "1" : "0");
        rconn_cmd_addll(&call.cmd, r->waiter_lease_ms);
        rconn_cmd_addll(&call.cmd, a->queue_ttl_ms);
        rconn_cmd_adds(&call.cmd, proposal);
        rconn_cmd_adds(&call.cmd, a->k->wake);
        a->rank = -1;
        a->hint_ms = 0;
    } else {
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
    }
    a->start_us = clock_mono_us();
    atomic_fetch_add(&r->c->st.attempts, 1);
    if (run1(r, &call, all, &rs)) {
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    try_tally t = tally_try(a, &rs);
    int64_t valid_until = a->start_us + a->ttl_ms * 1000 - lock_drift_us(a->ttl_ms);
    int won = t.ok >= r->quorum && clock_mono_us() < valid_until;
    /* The quorum's servers disagree on the incarnation (or one stored an
     * unreadable one): the token gets this try's proposal, stored by settle. */
    uint64_t inc = t.incarnation ? t.incarnation : a->proposal;
    if (won && (r->nservers > 1 || !t.incarnation))
        won = settle(a, t.okmask, t.fence, inc) >= r->quorum && clock_mono_us() < valid_until;
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
    lock_replies_why(r, &rs, all & ~(t.okmask | t.busymask), why, sizeof why);
    lock_replies_free(&rs);
    if (undo) {
        char ignored[8];
        release_on(r, a->k, a->id, undo, ignored, sizeof ignored);
    }
    a->split = t.ok > 0;
    if (t.ok + t.busy >= r->quorum) return LOCK_BUSY;
    if (r->nservers == 1) snprintf(err, errlen, "%s", why);
    else
        snprintf(err, errlen, "no quorum: %d of %d servers answered (need %d): %s",
                 t.ok + t.busy, r->nservers, r->quorum, why);
    return LOCK_ERROR;
}

/* Leaves the waiter queue on every server (best effort). A fair lock's
 * waiter that was the head of a free lock wakes the next one in its stead
 * (fair_leave.lua). */
static void leave_queue(attempt *a) {
    lock_call call;
    lock_replies rs;
    rconn_cmd_init(&call.cmd);
    if (a->r->fair) {
        lock_call_start(&call, LOCK_S_FAIR_LEAVE, 4);
        rconn_cmd_adds(&call.cmd, a->k->name);
        rconn_cmd_adds(&call.cmd, a->k->fairq);
        rconn_cmd_adds(&call.cmd, a->k->fairdue);
        rconn_cmd_adds(&call.cmd, a->k->fairsub);
        rconn_cmd_adds(&call.cmd, a->waiter);
        rconn_cmd_adds(&call.cmd, a->k->wake);
        if (run1(a->r, &call, all_servers(a->r), &rs) == 0) lock_replies_free(&rs);
        return;
    }
    call.script = LOCK_S_COUNT;   /* a plain command */
    rconn_cmd_adds(&call.cmd, "ZREM");
    rconn_cmd_adds(&call.cmd, a->k->queue);
    rconn_cmd_adds(&call.cmd, a->waiter);
    if (run1(a->r, &call, all_servers(a->r), &rs) == 0) lock_replies_free(&rs);
}

/* The wait before the next try: a jittered exponential backoff ("equal
 * jitter": half fixed, half random), cut to the holder's remaining TTL so an
 * expiry is seen at once, or a short random delay after a Redlock split
 * vote, so contenders do not split again in step. */
static int64_t next_wait_us(attempt *a, int64_t *backoff_ms) {
    int64_t b = *backoff_ms * 1000;
    int64_t w = b / 2 + (int64_t)(next_rand(a) % (uint64_t)(b / 2 + 1));
    if (a->r->fair) {
        /* A fair waiter's calls keep its place: at least three per lease.
         * The script's hint says when something changes without notice:
         * the holder's lease ending (the head), the woken head's place
         * lapsing (the one behind it). */
        int64_t cap = a->r->waiter_lease_ms * 1000 / 3;
        if (w > cap) w = cap;
        if (a->hint_ms > 0 && a->hint_ms * 1000 < w) w = a->hint_ms * 1000;
        *backoff_ms = *backoff_ms * 2 > a->r->max_backoff_ms ? a->r->max_backoff_ms
                                                             : *backoff_ms * 2;
        return w;
    }
    if (a->pttl_ms > 0 && a->pttl_ms * 1000 + 1000 < w) w = a->pttl_ms * 1000 + 1000;
    if (a->split) {
        int64_t cap = a->ttl_ms / 10 < 50 ? (a->ttl_ms / 10 > 2 ? a->ttl_ms / 10 : 2) : 50;
        w = 1000 + (int64_t)(next_rand(a) % (uint64_t)(cap * 1000));
    }
    *backoff_ms = *backoff_ms * 2 > a->r->max_backoff_ms ? a->r->max_backoff_ms : *backoff_ms * 2;
    return w;
}

/* The waiting part of an acquire: subscribe first, then retry (joining the
 * queue atomically), then sleep until a notice or the computed wait. */
static lock_status wait_for(attempt *a, int64_t deadline_us, char *err, size_t errlen) {
    lock_redis *r = a->r;
    lock_waiter *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    if (a->waiter_id[0])             /* fair: the first try queued it under this id */
        snprintf(w->id, sizeof w->id, "%s", a->waiter_id);
    else
        snprintf(w->id, sizeof w->id, "%s-%llx", r->cid,
                 (unsigned long long)atomic_fetch_add(&r->waiter_seq, 1));
    w->chanlen = (size_t)snprintf(w->chan, sizeof w->chan, "%s%s", a->k->wake, w->id);
    w->name = a->k->name;
    lock_cond_init(&w->cv);
    int64_t sub_until = clock_mono_us() + r->timeout_ms * 1000;
    int subscribed = lock_waiter_add(r, w, sub_until < deadline_us ? sub_until : deadline_us) == 0;
    a->waiter = w->id;
    /* A PUBLISH counts the receivers on its own node only: on a cluster,
     * whose subscriber is on slot 0's primary, a release could not tell a
     * gone waiter from one listening elsewhere. There it is woken all the
     * same (the cluster bus carries the PUBLISH to every node), and a gone
     * one's place lapses. */
    a->listens = !subscribed ? 0 : r->servers[0].cluster ? 2 : 1;
    int64_t backoff_ms = BACKOFF_START_MS;
    lock_status st;
    for (;;) {
        if (subscribed) lock_waiter_clear(r, w);
        st = try_once(a, err, errlen);
        if (st != LOCK_BUSY) break;
        int64_t now = clock_mono_us();
        if (now >= deadline_us) break;
        int64_t until = now + next_wait_us(a, &backoff_ms);
        if (until > deadline_us) until = deadline_us;
        int woken = subscribed ? lock_waiter_wait(r, w, until) : 0;
        if (!subscribed) clock_sleep_ms((until - now + 999) / 1000);
        atomic_fetch_add(woken ? &r->c->st.wakeups : &r->c->st.timeouts, 1);
    }
    if (subscribed) lock_waiter_remove(r, w);
    if (st != LOCK_OK) leave_queue(a);
    pthread_cond_destroy(&w->cv);
    free(w);
    return st;
}

/* Sets up a's id, jitter seed and keys. Returns 0 or -1 (err). */
static int attempt_init(attempt *a, lock_redis *r, const lock_keys *k, int64_t ttl_ms,
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
    a->r = r;
    a->k = k;
    a->ttl_ms = ttl_ms;
    a->waiter = "";
    /* Each retry re-arms it; 1 s past the longest gap between retries. */
    int64_t gap = r->max_backoff_ms > ttl_ms ? r->max_backoff_ms : ttl_ms;
    a->queue_ttl_ms = (wait_ms >= 0 && wait_ms < gap ? wait_ms : gap) + 1000;
    return 0;
}


/* ------------------------------------------------------------ the backend */

static lock_status redis_acquire(lock_client *c, const char *name, int64_t ttl_ms,
                                 int64_t deadline_us, lock_took *out, lock_errcode *code,
                                 char *err, size_t errlen) {
    lock_redis *r = c->bstate;
    attempt a;
    redis_hold *h = calloc(1, sizeof *h);
    if (!h) {
        *code = LOCK_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    h->base.be = &lock_backend_redis;
    snprintf(h->name, sizeof h->name, "%s", name);
    if (lock_keys_make(h->name, &h->keys, err, errlen)) {
        free(h);
        *code = LOCK_ERR_ARG;
        return LOCK_ERROR;
    }
    int64_t now = clock_mono_us();
    int64_t wait_ms = deadline_us == INT64_MAX ? -1
                      : deadline_us <= now    ? 0 : (deadline_us - now + 999) / 1000;
    *code = LOCK_ERR_IO;
    if (attempt_init(&a, r, &h->keys, ttl_ms, wait_ms, err, errlen)) {
        free(h);
        return LOCK_ERROR;
    }
    *code = r->nservers > 1 ? LOCK_ERR_QUORUM : LOCK_ERR_IO;
    if (r->fair && wait_ms != 0) {
        /* The first try of a fair waiter takes its place in the queue: its
         * arrival is this try, not its subscription a round trip later. */
        snprintf(a.waiter_id, sizeof a.waiter_id, "%s-%llx", r->cid,
                 (unsigned long long)atomic_fetch_add(&r->waiter_seq, 1));
        a.waiter = a.waiter_id;
    }
    lock_status st = try_once(&a, err, errlen);
    if (st == LOCK_BUSY && clock_mono_us() < deadline_us) st = wait_for(&a, deadline_us, err, errlen);
    else if (st != LOCK_OK && a.waiter[0]) leave_queue(&a);
    if (st != LOCK_OK) {
        free(h);
        return st;
    }
    memcpy(h->id, a.id, sizeof h->id);
    out->hold = &h->base;
    out->fence = a.fence;
    out->incarnation = a.incarnation;
    out->ticket = a.ticket;
    out->start_us = a.start_us;
    out->ttl_ms = ttl_ms;
    out->lease_src = NULL;
    return LOCK_OK;
}

/* Renews every hold of each on every server, pipelined in one round: a
 * quorum re-armed it (OURS), enough servers said it is not ours (GONE), or
 * neither (UNKNOWN). */
static void redis_check(lock_client *c, lock_checking *each, int n) {
    lock_redis *r = c->bstate;
    lock_call *calls = calloc((size_t)n, sizeof *calls);
    lock_replies rs = { 0 };
    unsigned all = all_servers(r);
    int64_t start = clock_mono_us();
    for (int i = 0; calls && i < n; i++) {
        const redis_hold *h = (const redis_hold *)each[i].hold;
        rconn_cmd_init(&calls[i].cmd);
        lock_call_start(&calls[i], LOCK_S_EXTEND, 1);
        rconn_cmd_adds(&calls[i].cmd, h->name);
        rconn_cmd_adds(&calls[i].cmd, h->id);
        rconn_cmd_addll(&calls[i].cmd, each[i].ttl_ms);
    }
    int ran = calls && lock_run(r, calls, n, all, &rs) == 0;
    for (int i = 0; i < n; i++) {
        lock_checking *k = &each[i];
        k->start_us = start;
        k->code = r->nservers > 1 ? LOCK_ERR_QUORUM : LOCK_ERR_IO;
        k->why[0] = '\0';
        if (!ran) {
            k->outcome = LOCK_CHECK_UNKNOWN;
            k->code = LOCK_ERR_NOMEM;
            snprintf(k->why, sizeof k->why, "out of memory");
            continue;
        }
        lock_tally t = lock_tally_int(&rs, i, all);
        if (t.ok >= r->quorum) {
            k->outcome = LOCK_CHECK_OURS;
        } else if (t.no > r->nservers - r->quorum) {
            k->outcome = LOCK_CHECK_GONE;
            snprintf(k->why, sizeof k->why, "not ours on %d of %d servers", t.no, r->nservers);
        } else {
            k->outcome = LOCK_CHECK_UNKNOWN;
            lock_replies_why(r, &rs, all, k->why, sizeof k->why);
        }
    }
    if (ran) lock_replies_free(&rs);
    for (int i = 0; calls && i < n; i++) rconn_cmd_free(&calls[i].cmd);
    free(calls);
}

static lock_release_result redis_release(lock_client *c, lock_hold *base, char *err,
                                         size_t errlen) {
    lock_redis *r = c->bstate;
    const redis_hold *h = (const redis_hold *)base;
    lock_tally t = release_on(r, &h->keys, h->id, all_servers(r), err, errlen);
    if (t.ok >= r->quorum) return LOCK_RELEASED;
    if (t.ok + t.io >= r->quorum) return LOCK_UNKNOWN;
    snprintf(err, errlen, "%s is not ours: it expired or another holds it", h->name);
    return LOCK_NOT_OWNER;
}

static void redis_hold_free(lock_hold *h) { free(h); }

static void redis_stats(lock_client *c, lock_stats *o) { lock_waker_stats(c->bstate, o); }

static void redis_stop(lock_client *c) { lock_waker_stop(c->bstate); }

static void redis_destroy(lock_client *c) {
    lock_redis *r = c->bstate;
    if (!r) return;
    for (int i = 0; i < r->nservers; i++) lock_server_close(&r->servers[i]);
    pthread_cond_destroy(&r->waker.state_cv);
    pthread_mutex_destroy(&r->waker.mu);
    free(r);
    c->bstate = NULL;
}

/* One Redis server per URL (Redlock over several: a quorum of them). */
static int redis_open(lock_client *c, const lock_options *o, char *err, size_t errlen) {
    unsigned char rnd[8];
    if (lock_scripts_ready()) {   /* SHA1s computed now, not on a hot path */
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (lock_random(rnd, sizeof rnd)) {
        snprintf(err, errlen, "lock: getrandom: %s", strerror(errno));
        return -1;
    }
    lock_redis *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    r->c = c;
    r->timeout_ms = c->timeout_ms;
    r->max_backoff_ms = o->max_backoff_ms > 0 ? o->max_backoff_ms : 200;
    r->fair = o->fair != 0;
    r->waiter_lease_ms = o->waiter_lease_ms > 0 ? o->waiter_lease_ms : LOCK_WAITER_LEASE_MS;
    if (r->fair && o->nurls > 1) {
        free(r);
        snprintf(err, errlen, "lock: a fair lock runs on one Redis server (or a Sentinel's "
                              "primary, or a cluster), not by Redlock over %d", o->nurls);
        return -1;
    }
    for (int i = 0; i < o->nurls; i++) {
        if (lock_server_open(r, i, o->urls[i], err, errlen) != 0) {
            for (int k = 0; k < i; k++) lock_server_close(&r->servers[k]);
            free(r);
            return -1;
        }
    }
    assert(o->nurls >= 1 && o->nurls <= LOCK_MAX_SERVERS);   /* lock_client_new's check */
    r->nservers = o->nurls;
    r->quorum = o->nurls / 2 + 1;
    for (int i = 0; i < 8; i++) sprintf(r->cid + 2 * i, "%02x", rnd[i]);
    pthread_mutex_init(&r->waker.mu, NULL);
    lock_cond_init(&r->waker.state_cv);
    r->waker.efd = -1;
    c->bstate = r;
    return 0;
}

const lock_backend lock_backend_redis = {
    .name = "redis",
    .kind = "Redis",
    .scheme = NULL,               /* redis://, rediss://, redis-sentinel://: rtopo_parse's */
    .max_urls = LOCK_MAX_SERVERS,
    .urls_hint = "",
    .watchdog_renews = 1,
    .rearms = 1,
    .open = redis_open,
    .acquire = redis_acquire,
    .check = redis_check,
    .release = redis_release,
    .held = NULL,
    .hold_free = redis_hold_free,
    .stats = redis_stats,
    .stop = redis_stop,
    .destroy = redis_destroy,
};
