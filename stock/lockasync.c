/* lockasync.c: the `lock` strategy on an event loop, in two round trips.
 *
 *   lock_read.lua    take the segment's lock (the lock module's format and
 *                    token counter), raise the segment's fence, read
 *   (check, in C)    replay? over the limit? enough units?
 *   lock_write.lua   the fenced write of the value computed from the read,
 *                    and the release, in one step
 *
 * The service keeps one order per segment in the critical section at a
 * time and sends the next order's lock_read right behind the previous
 * order's write, on the same connection: Redis runs release and acquire
 * back to back, so the lock is held for about one round trip per order
 * and no thread ever waits for it. A hold that short needs no renewal (an
 * extend would run behind the write on the same connection anyway); a
 * write that arrives after the lease has run out is refused by the fence.
 *
 * A segment that holds fewer units than asked is refused here as
 * insufficient; the caller, for a product with several segments, takes
 * the order to the blocking path, which reads every segment and locks the
 * ones it needs (stock_reserve_one: same keys, same locks).
 *
 * `fair-lock` is the same, with the lock module's fair line beside each
 * lock (lock/lock.h, FAIRNESS): lock_read takes the lock only as the head
 * of the line, else keeps the order's place (a waiter that polls: it
 * listens on no channel); lock_write's release wakes the head (a waiter of
 * the blocking path listens); the orders waiting behind the head join the
 * line with the head's lock_read or lock_line.lua, which also keeps their
 * places alive and takes out one that gives up. An order's owner id, made
 * once, is its name in the line. And the write and the next order's read
 * go in one call, lock_pass.lua: a release hands the lock straight to the
 * head of the line when the head is that next order (the steps of all
 * three scripts are lock_steps.lua's). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/aconn.h"
#include "common/clock.h"
#include "common/loop.h"
#include "stock/internal.h"
#include "stock/async_int.h"

/* --------------------------------------------------------------- owners */

/* A new owner id: 32 hex digits, unique per acquire (a random 64-bit base
 * per connection and a counter), as the lock module's format asks. */
static void new_owner(stock_async *sa, char out[33]) {
    if (!sa->owner_base) {
        if (getrandom(&sa->owner_base, sizeof sa->owner_base, 0) != sizeof sa->owner_base)
            sa->owner_base = (uint64_t)clock_mono_us() ^ (uint64_t)(uintptr_t)sa;
        sa->owner_base |= 1;
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)sa->owner_base,
             (unsigned long long)++sa->owner_seq);
}

int stock_pick_segment(const stock_product *p, uint64_t random, int first, int stride) {
    assert(stride >= 1 && first >= 0);
    int n = first < p->segments ? (p->segments - first + stride - 1) / stride : 0;
    for (int i = 0; i < n; i++) {
        int seg = first + (int)((random + (uint64_t)i) % (uint64_t)n) * stride;
        if (!sk_hint_empty(p, seg)) return seg;
    }
    return -1;
}

/* ------------------------------------------------------------- read */

typedef struct lock_job {
    stock_async *sa;
    stock_req *r;
    stock_hold *h;
    stock_lock_fn *fn;
    void *ud;
    int ttl_ms;                  /* lock_read */
    int write;                   /* lock_write: 1 write and release, 0 release only */
    int nbehind;                 /* lock_read, fair: orders joined after it (behind) */
    char (*behind)[33];
    struct lock_job *next_read;  /* lock_pass: the write's job, with the read's beside */
    /* A release only (fn NULL) outlives its order, which is answered
     * already: it keeps copies of what it sends (r and h point here). */
    stock_req rcopy;
    stock_hold hcopy;
    char user[STOCK_USER_MAX + 1], oid[STOCK_ORDER_ID_MAX + 1];
} lock_job;

static void add_lock_keys(stock_async *sa, const stock_product *p, int seg, const char *suffix) {
    rconn_cmd_addf(&sa->cmd, "%s{%s}:lock:%d%s", sa->prefix, p->sku, seg, suffix);
}

static int is_fair(const stock_product *p) { return p->strategy == STOCK_FAIR_LOCK; }

/* The fair line's keys (lock.h: B:fair, B:fair:due, B:fair:sub, B being the
 * lock's own name, which has the {sku} tag). */
static void add_line_keys(stock_async *sa, const stock_product *p, int seg) {
    add_lock_keys(sa, p, seg, ":fair");
    add_lock_keys(sa, p, seg, ":fair:due");
    add_lock_keys(sa, p, seg, ":fair:sub");
}

/* How long the line's keys outlive the last call on them. */
static long long line_keep_ms(const stock_async *sa) { return sa->fair_lease_ms + 2000LL; }

static void on_read(void *ud, redisReply *rep, int sent) {
    lock_job *j = ud;
    stock_req *r = j->r;
    stock_hold *h = j->h;
    int res;
    (void)sent;                                 /* a read takes nothing: the lock expires */
    sk_async_check_reply(j->sa, rep);
    r->outcome_unknown = 0;
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        r->result = STOCK_UNAVAILABLE;
        res = -1;
    } else if (sk_elem_int(rep, 0) == 1 && rep->elements == 6) {
        h->token = (uint64_t)sk_elem_int(rep, 1);
        h->gen = sk_elem_int(rep, 2);
        h->bought = sk_elem_int(rep, 3);
        snprintf(h->idem, sizeof h->idem, "%s", sk_elem_str(rep, 4));
        h->units = sk_elem_int(rep, 5);
        sk_hint_set(r->product, h->seg, h->units <= 0);
        res = 1;
    } else if (sk_elem_int(rep, 0) == 0) {
        h->pttl = sk_elem_int(rep, 1);
        res = 0;
    } else {
        r->result = STOCK_MISSING;
        res = -3;
    }
    j->fn(j->ud, res);
    free(j);
}

/* The idempotency record's key of r's order (of no key: one never set). */
static void add_idem_key(stock_async *sa, const stock_req *r) {
    rconn_cmd_addf(&sa->cmd, "%s{%s}:idem:%s", sa->prefix, r->product->sku,
                   r->idem_key ? r->idem_key : "");
}

/* fair-lock: a place's lease and the line's keys' ttl (lock_read.lua's
 * ARGV[5..6], lock_pass.lua's ARGV[22..23]). */
static void add_line_args(stock_async *sa) {
    rconn_cmd_addll(&sa->cmd, sa->fair_lease_ms);
    rconn_cmd_addll(&sa->cmd, line_keep_ms(sa));
}

/* fair-lock: the owner ids of the orders that join the line behind j's. */
static void add_behind(stock_async *sa, const lock_job *j) {
    for (int i = 0; i < j->nbehind; i++) rconn_cmd_adds(&sa->cmd, j->behind[i]);
}

/* lock_read.lua for j, to the node conn (sent again as is if redirected). */
static void build_read(stock_async *sa, aconn *conn, void *ud) {
    const lock_job *j = ud;
    const stock_req *r = j->r;
    const stock_product *p = r->product;
    int fair = is_fair(p);
    rconn_cmd_evalsha(&sa->cmd, &sk_lock_read, fair ? 10 : 7);
    add_lock_keys(sa, p, j->h->seg, "");
    add_lock_keys(sa, p, j->h->seg, ":fence");
    rconn_cmd_addf(&sa->cmd, "%s{%s}:gen", sa->prefix, p->sku);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:users", sa->prefix, p->sku);
    add_idem_key(sa, r);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:stock:%d", sa->prefix, p->sku, j->h->seg);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:fence:%d", sa->prefix, p->sku, j->h->seg);
    if (fair) add_line_keys(sa, p, j->h->seg);
    rconn_cmd_adds(&sa->cmd, j->h->owner);
    rconn_cmd_addll(&sa->cmd, j->ttl_ms);
    rconn_cmd_adds(&sa->cmd, aconn_run_id(conn));
    rconn_cmd_adds(&sa->cmd, r->user_id);
    if (!fair) return;                          /* `lock`: no line, nothing more */
    add_line_args(sa);
    add_lock_keys(sa, p, j->h->seg, ":wake:");
    add_behind(sa, j);
}

void stock_async_lock_read(stock_async *sa, stock_req *r, stock_hold *h, int ttl_ms,
                           stock_lock_fn *fn, void *ud) {
    stock_async_lock_read_joining(sa, r, h, ttl_ms, NULL, 0, fn, ud);
}

/* A lock_read's job (its owner id, and those of the orders it joins
 * behind it, made if they have none); NULL when out of memory. */
static lock_job *read_job_new(stock_async *sa, stock_req *r, stock_hold *h, int ttl_ms,
                              stock_hold *const *behind, int nbehind, stock_lock_fn *fn,
                              void *ud) {
    if (!is_fair(r->product)) nbehind = 0;
    lock_job *j = malloc(sizeof *j + (size_t)nbehind * 33);
    if (!j) return NULL;
    *j = (lock_job){ .sa = sa, .r = r, .h = h, .fn = fn, .ud = ud, .ttl_ms = ttl_ms,
                     .nbehind = nbehind, .behind = (char (*)[33])(j + 1) };
    if (!h->owner[0]) new_owner(sa, h->owner);   /* one per order: its name in a fair line */
    for (int i = 0; i < nbehind; i++) {
        if (!behind[i]->owner[0]) new_owner(sa, behind[i]->owner);
        memcpy(j->behind[i], behind[i]->owner, 33);
    }
    return j;
}

/* A lock_read that could not be sent: r refused, nothing taken. */
static void read_refused(stock_req *r, stock_lock_fn *fn, void *ud) {
    r->result = STOCK_UNAVAILABLE;
    r->outcome_unknown = 0;
    fn(ud, -1);
}

void stock_async_lock_read_joining(stock_async *sa, stock_req *r, stock_hold *h, int ttl_ms,
                                   stock_hold *const *behind, int nbehind, stock_lock_fn *fn,
                                   void *ud) {
    assert(loop_owned(sa->l));
    lock_job *j = read_job_new(sa, r, h, ttl_ms, behind, nbehind, fn, ud);
    if (!j) {
        read_refused(r, fn, ud);
        return;
    }
    sk_async_call(sa, r->product, STOCK_CALL_LOCK_READ, build_read, on_read, j);
}

/* ------------------------------------------------------------ check */

stock_result stock_lock_check(stock_req *r, const stock_hold *h) {
    const stock_product *p = r->product;
    if (sk_idem_replay(r, h->idem, h->gen)) return STOCK_REPLAY;
    if (p->per_user_limit > 0 && h->bought + r->quantity > p->per_user_limit) {
        r->available = h->bought;
        return STOCK_LIMIT;
    }
    if (h->units < r->quantity) {
        r->available = h->units > 0 ? h->units : 0;
        return h->units <= 0 && p->segments == 1 ? STOCK_SOLD_OUT : STOCK_INSUFFICIENT;
    }
    return STOCK_RESERVED;
}

/* ----------------------------------------------------------- write */

static void on_write(void *ud, redisReply *rep, int sent) {
    lock_job *j = ud;
    stock_req *r = j->r;
    int res = 0;
    sk_async_check_reply(j->sa, rep);
    if (!j->fn) {                               /* a release only: r is answered already */
        free(j);
        return;
    }
    if (!rep) {
        r->result = STOCK_UNAVAILABLE;
        r->outcome_unknown = sent;              /* sent: the write may have run */
        res = -1;
    } else if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        r->result = STOCK_UNAVAILABLE;          /* an error reply: nothing stayed */
        r->outcome_unknown = 0;
        res = -1;
    } else {
        long long code = sk_elem_int(rep, 0);
        r->outcome_unknown = 0;
        if (code == 1) {
            r->result = STOCK_RESERVED;
            r->gen = sk_elem_int(rep, 1);
            sk_req_takes(r, rep);
        } else if (code == -4) {
            r->result = STOCK_FENCED;
        } else if (code == -3) {
            r->result = STOCK_MISSING;
        }
        res = (int)code;
    }
    j->fn(j->ud, res);
    free(j);
}

/* lock_write.lua's keys for j (lock_pass.lua's first twelve). */
static void add_write_keys(stock_async *sa, const lock_job *j) {
    const stock_req *r = j->r;
    const stock_hold *h = j->h;
    const stock_product *p = r->product;
    int has_key = j->write && r->idem_key && r->idem_key[0];
    add_lock_keys(sa, p, h->seg, "");
    add_lock_keys(sa, p, h->seg, ":waiters");
    rconn_cmd_addf(&sa->cmd, "%s{%s}:gen", sa->prefix, p->sku);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:pending", sa->prefix, p->sku);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:users", sa->prefix, p->sku);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:idem:%s", sa->prefix, p->sku, has_key ? r->idem_key : "");
    rconn_cmd_addf(&sa->cmd, "%s{%s}:empty", sa->prefix, p->sku);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:stock:%d", sa->prefix, p->sku, h->seg);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:fence:%d", sa->prefix, p->sku, h->seg);
    if (is_fair(p)) add_line_keys(sa, p, h->seg);
}

/* lock_write.lua's arguments for j (lock_pass.lua's first eighteen). */
static void add_write_args(stock_async *sa, aconn *conn, const lock_job *j) {
    const stock_req *r = j->r;
    const stock_hold *h = j->h;
    const stock_product *p = r->product;
    int write = j->write;
    int has_key = write && r->idem_key && r->idem_key[0];
    size_t ul = strlen(r->user_id), kl = has_key ? strlen(r->idem_key) : 0;
    char tail[STOCK_USER_MAX + 200];
    int tl = snprintf(tail, sizeof tail, "%zu:%s%zu:%s", ul, r->user_id, kl,
                      has_key ? r->idem_key : "");
    rconn_cmd_adds(&sa->cmd, h->owner);
    rconn_cmd_addf(&sa->cmd, "%s{%s}:lock:%d:wake:", sa->prefix, p->sku, h->seg);
    rconn_cmd_adds(&sa->cmd, aconn_run_id(conn));
    rconn_cmd_addll(&sa->cmd, h->gen);
    rconn_cmd_addll(&sa->cmd, (long long)h->token);
    rconn_cmd_adds(&sa->cmd, write ? "write" : "release");
    rconn_cmd_addll(&sa->cmd, h->seg);
    rconn_cmd_addll(&sa->cmd, p->segments);
    rconn_cmd_addll(&sa->cmd, h->units - r->quantity);
    rconn_cmd_addll(&sa->cmd, r->quantity);
    rconn_cmd_adds(&sa->cmd, r->order_id);
    rconn_cmd_add(&sa->cmd, r->user_id, ul);
    rconn_cmd_addll(&sa->cmd, p->per_user_limit);
    rconn_cmd_adds(&sa->cmd, has_key ? r->fingerprint : "");
    rconn_cmd_addll(&sa->cmd, sa->idem_ttl_ms);
    rconn_cmd_adds(&sa->cmd, sa->instance);
    rconn_cmd_add(&sa->cmd, tail, tl > 0 && (size_t)tl < sizeof tail ? (size_t)tl : 0);
    if (is_fair(p)) rconn_cmd_adds(&sa->cmd, "1");
}

/* lock_write.lua for j, to the node conn. On a cluster the node is the one
 * the lock_read took the lock on, unless the slot moved since: then the
 * lock, the fence and the segment moved with it (or the write is
 * redirected, does not run, and goes again where the slot is now). */
static void build_write(stock_async *sa, aconn *conn, void *ud) {
    const lock_job *j = ud;
    rconn_cmd_evalsha(&sa->cmd, &sk_lock_write, is_fair(j->r->product) ? 12 : 9);
    add_write_keys(sa, j);
    add_write_args(sa, conn, j);
}

/* A lock_write's job; NULL when out of memory. A release only (fn NULL)
 * keeps copies of what it sends: its order is answered, r and h may go. */
static lock_job *write_job_new(stock_async *sa, stock_req *r, const stock_hold *h, int write,
                               stock_lock_fn *fn, void *ud) {
    lock_job *j = malloc(sizeof *j);
    if (!j) return NULL;
    *j = (lock_job){ .sa = sa, .r = r, .h = (stock_hold *)h, .fn = fn, .ud = ud, .write = write };
    if (!fn) {
        j->hcopy = *h;
        snprintf(j->user, sizeof j->user, "%s", r->user_id);
        snprintf(j->oid, sizeof j->oid, "%s", r->order_id);
        j->rcopy = (stock_req){ .product = r->product, .order_id = j->oid, .user_id = j->user,
                                .quantity = r->quantity };
        j->r = &j->rcopy;
        j->h = &j->hcopy;
    }
    return j;
}

/* A lock_write that could not be sent: nothing written; the lock expires
 * by its lease. A release only (fn NULL) leaves r alone. */
static void write_refused(stock_req *r, stock_lock_fn *fn, void *ud) {
    if (!fn) return;
    r->result = STOCK_UNAVAILABLE;
    r->outcome_unknown = 0;
    fn(ud, -1);
}

void stock_async_lock_write(stock_async *sa, stock_req *r, const stock_hold *h, int write,
                            stock_lock_fn *fn, void *ud) {
    assert(loop_owned(sa->l));
    lock_job *j = write_job_new(sa, r, h, write, fn, ud);
    if (!j) {
        write_refused(r, fn, ud);
        return;
    }
    if (write && fn) r->outcome_unknown = 1;     /* from here, it may run */
    sk_async_call(sa, r->product, STOCK_CALL_LOCK_WRITE, build_write, on_write, j);
}

/* ------------------------------------------------------------ the pass */

/* fair-lock: a lock_write and the next order's lock_read in one call, whose
 * job is the write's, with the read's beside it (next_read). */

/* lock_pass.lua: the write's keys and arguments, then what the next
 * order's read adds (its segment is the write's: the same lock and line). */
static void build_pass(stock_async *sa, aconn *conn, void *ud) {
    const lock_job *w = ud, *rd = w->next_read;
    const stock_product *p = w->r->product;
    assert(is_fair(p) && rd->r->product == p && rd->h->seg == w->h->seg);
    rconn_cmd_evalsha(&sa->cmd, &sk_lock_pass, 14);
    add_write_keys(sa, w);
    add_lock_keys(sa, p, w->h->seg, ":fence");
    add_idem_key(sa, rd->r);
    add_write_args(sa, conn, w);
    rconn_cmd_adds(&sa->cmd, rd->h->owner);
    rconn_cmd_addll(&sa->cmd, rd->ttl_ms);
    rconn_cmd_adds(&sa->cmd, rd->r->user_id);
    add_line_args(sa);
    add_behind(sa, rd);
}

/* Each half of the reply to its own job, the write first, as the two
 * calls' replies would come; a failure of the call to both. */
static void on_pass(void *ud, redisReply *rep, int sent) {
    lock_job *w = ud, *rd = w->next_read;
    redisReply *wr = rep, *rr = rep;
    if (rep && rep->type == REDIS_REPLY_ARRAY) {
        int whole = rep->elements == 2;
        wr = whole ? rep->element[0] : NULL;   /* not the script's reply: not known */
        rr = whole ? rep->element[1] : NULL;
    }
    on_write(w, wr, sent);                 /* frees w */
    on_read(rd, rr, sent);
}

void stock_async_lock_pass(stock_async *sa, stock_req *r, const stock_hold *h, int write,
                           stock_lock_fn *fn, void *ud, stock_req *rn, stock_hold *hn,
                           int ttl_ms, stock_hold *const *behind, int nbehind,
                           stock_lock_fn *nfn, void *nud) {
    assert(loop_owned(sa->l));
    assert(nfn && rn->product == r->product && hn->seg == h->seg);
    if (!is_fair(r->product)) {                  /* no line: two calls */
        stock_async_lock_write(sa, r, h, write, fn, ud);
        stock_async_lock_read_joining(sa, rn, hn, ttl_ms, behind, nbehind, nfn, nud);
        return;
    }
    lock_job *w = write_job_new(sa, r, h, write, fn, ud);
    lock_job *rd = w ? read_job_new(sa, rn, hn, ttl_ms, behind, nbehind, nfn, nud) : NULL;
    if (!rd) {
        free(w);
        write_refused(r, fn, ud);
        read_refused(rn, nfn, nud);
        return;
    }
    w->next_read = rd;
    if (write && fn) r->outcome_unknown = 1;     /* from here, it may run */
    sk_async_call(sa, r->product, STOCK_CALL_LOCK_WRITE, build_pass, on_pass, w);
}

/* ------------------------------------------------------------ the line */

/* A fair line call: what it needs once the orders may be gone. */
typedef struct line_job {
    stock_async *sa;
    const stock_product *p;
    int seg;
    const char *mode;             /* "join", "keep", "leave" */
    int n;
    char owners[][33];
} line_job;

static void build_line(stock_async *sa, aconn *conn, void *ud) {
    const line_job *j = ud;
    (void)conn;
    rconn_cmd_evalsha(&sa->cmd, &sk_lock_line, 4);
    add_lock_keys(sa, j->p, j->seg, "");
    add_line_keys(sa, j->p, j->seg);
    rconn_cmd_adds(&sa->cmd, j->mode);
    rconn_cmd_addll(&sa->cmd, sa->fair_lease_ms);
    rconn_cmd_addll(&sa->cmd, line_keep_ms(sa));
    add_lock_keys(sa, j->p, j->seg, ":wake:");
    for (int i = 0; i < j->n; i++) rconn_cmd_adds(&sa->cmd, j->owners[i]);
}

static line_job *line_new(stock_async *sa, const stock_product *p, int seg, const char *mode,
                          int n) {
    line_job *j = malloc(sizeof *j + (size_t)n * sizeof j->owners[0]);
    if (j) *j = (line_job){ .sa = sa, .p = p, .seg = seg, .mode = mode, .n = n };
    return j;
}

static void on_line(void *ud, redisReply *rep, int sent) {
    line_job *j = ud;
    (void)sent;
    sk_async_check_reply(j->sa, rep);
    free(j);
}

void stock_async_lock_leave(stock_async *sa, stock_req *r, stock_hold *h) {
    assert(loop_owned(sa->l));
    if (!is_fair(r->product) || !h->owner[0]) return;   /* never in line */
    line_job *j = line_new(sa, r->product, h->seg, "leave", 1);
    if (!j) return;                              /* its place lapses */
    memcpy(j->owners[0], h->owner, sizeof j->owners[0]);
    sk_async_call(sa, r->product, STOCK_CALL_LOCK_READ, build_line, on_line, j);
}

void stock_async_lock_join(stock_async *sa, const stock_product *p, int seg,
                           stock_hold *const *holds, int n) {
    assert(loop_owned(sa->l));
    if (!is_fair(p) || n <= 0) return;
    line_job *j = line_new(sa, p, seg, "join", n);
    for (int i = 0; i < n; i++) {
        if (!holds[i]->owner[0]) new_owner(sa, holds[i]->owner);
        if (j) memcpy(j->owners[i], holds[i]->owner, sizeof j->owners[i]);
    }
    /* Out of memory: each takes its place at its own first lock_read. */
    if (j) sk_async_call(sa, p, STOCK_CALL_LOCK_READ, build_line, on_line, j);
}

void stock_async_lock_keep(stock_async *sa, const stock_product *p, int seg,
                           const stock_hold *const *holds, int n) {
    assert(loop_owned(sa->l));
    if (!is_fair(p) || n <= 0) return;
    line_job *j = line_new(sa, p, seg, "keep", n);
    if (!j) return;                              /* the places lapse if this keeps failing */
    for (int i = 0; i < n; i++) memcpy(j->owners[i], holds[i]->owner, sizeof j->owners[i]);
    sk_async_call(sa, p, STOCK_CALL_LOCK_READ, build_line, on_line, j);
}

