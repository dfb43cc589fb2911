/* returns.c: giving an ended hold's units back to the stock copy. See
 * stock.h (stock_return) and lua/return.lua, which decides, atomically,
 * whether this copy owes them and whether they were given back already.
 * Here on one copy (sk_copy_return); the public stock_return, which also
 * gives a spread product's units back lane by lane, is spread.c's.
 *
 * Its own file beside stock.c: the units of a hold come back by a path of
 * their own (its marker, its generations), not by undo.lua's pending
 * records, which end when an order commits.
 *
 * And forgetting: the markers that make a return exactly-once are kept in
 * time buckets, and dropped a bucket at a time once a watermark says that
 * no return decided before it is owed any more (lua/forget.lua). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stock/internal.h"

/* The suffix of the bucket key of the markers of orders decided at
 * decided_ms ("returned:<b>"), into buf. Every instance must build the
 * same: the bucket is STOCK_RETURNED_BUCKET_MS's, not configurable. */
static void bucket_suffix(char *buf, size_t len, long long decided_ms) {
    snprintf(buf, len, "returned:%lld", (decided_ms > 0 ? decided_ms : 0) / STOCK_RETURNED_BUCKET_MS);
}

static void build_return(stock_conn *c, const stock_return_req *r) {
    const stock_product *p = r->product;
    char q[24], bucket[48];
    rconn_cmd_evalsha(&c->cmd, &sk_return, 6 + p->segments);
    sk_add_key(c, p->sku, "gen");
    sk_add_key(c, p->sku, "returned");          /* the legacy markers, read only */
    sk_add_key(c, p->sku, "users");
    sk_add_key(c, p->sku, "empty");
    bucket_suffix(bucket, sizeof bucket, r->decided_ms);
    sk_add_key(c, p->sku, bucket);
    sk_add_key(c, p->sku, "returned:before");
    sk_add_segment_keys(c, p);
    rconn_cmd_adds(&c->cmd, c->run_id);
    rconn_cmd_addll(&c->cmd, r->return_gen);
    rconn_cmd_addll(&c->cmd, r->reserve_gen);
    rconn_cmd_adds(&c->cmd, r->order_id);
    rconn_cmd_adds(&c->cmd, r->takes ? r->takes : "");
    snprintf(q, sizeof q, "%d", r->quantity);
    rconn_cmd_adds(&c->cmd, q);
    rconn_cmd_adds(&c->cmd, r->user_id);
    rconn_cmd_adds(&c->cmd, p->per_user_limit > 0 ? "1" : "0");
    rconn_cmd_addll(&c->cmd, r->decided_ms > 0 ? r->decided_ms : 0);
}

/* Reads return.lua's answer into r. Returns 0, or -1 for a reply that is
 * not one of its answers. */
static int read_return(stock_conn *c, stock_return_req *r, const redisReply *rep) {
    if (rep->type != REDIS_REPLY_INTEGER) {
        sk_bad_reply(c, "return", rep);
        return -1;
    }
    switch (rep->integer) {
    case 1:
        r->given = 1;
        /* fallthrough */
    case 0:
        r->result = STOCK_RESERVED;
        for (const char *t = r->takes; t && *t;) {   /* this process's hint learns too */
            int seg = atoi(t);
            if (seg >= 0 && seg < r->product->segments) sk_hint_set(r->product, seg, 0);
            t = strchr(t, ',');
            if (t) t++;
        }
        return 0;
    case -3:
    case -5:
        r->result = STOCK_MISSING;
        return 0;
    case -6:
        /* Decided before the forgetting mark: not settled by this call.
         * The caller keeps the debt (never given twice, never dropped
         * silently) and says so. */
        r->result = STOCK_UNAVAILABLE;
        r->forgotten = 1;
        return 0;
    }
    sk_bad_reply(c, "return", rep);
    return -1;
}

/* One try of sk_copy_return: 0, -1 when Redis failed for some, -2 when the
 * connection broke (nothing more is known). */
static int return_calls(stock_conn *c, stock_return_req *reqs, size_t n) {
    size_t i;
    int rc = 0;
    for (i = 0; i < n; i++) {
        reqs[i].result = STOCK_UNAVAILABLE;
        reqs[i].given = 0;
        reqs[i].forgotten = 0;
    }
    if (stock_conn_ensure(c)) return -1;
    unsigned char *retry = sk_retry_flags(c, n);
    for (i = 0; i < n; i++) {
        build_return(c, &reqs[i]);
        rconn_cmd_append(c->ctx, &c->cmd);
    }
    for (i = 0; i < n; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(c->ctx, (void **)&rep) != REDIS_OK) {
            sk_drop(c, "return");
            return -2;
        }
        if (rconn_is_noscript(rep)) retry[i] = 1;     /* it did not run */
        else if (read_return(c, &reqs[i], rep)) rc = -1;
        freeReplyObject(rep);
    }
    for (i = 0; i < n; i++) {
        if (!retry[i]) continue;
        build_return(c, &reqs[i]);
        redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_return);
        if (!rep) {
            sk_drop(c, "return");
            return -2;
        }
        if (read_return(c, &reqs[i], rep)) rc = -1;
        freeReplyObject(rep);
    }
    return rc;
}

/* return_calls, and once more when the connection broke while idle
 * (Redis restarted, failed over): a return is safe to repeat. */
static int return_twice(stock_conn *c, stock_return_req *reqs, size_t n) {
    int rc = return_calls(c, reqs, n);
    return rc == -2 ? return_calls(c, reqs, n) : rc;
}

int sk_copy_return(stock_conn *c, stock_return_req *reqs, size_t n) {
    int rc = 0;
    if (!c->cluster) {
        rc = return_twice(c, reqs, n);
    } else {
        for (size_t i = 0; i < n; i++) {     /* a cluster: each on its SKU's node */
            int one = 0;
            for (int a = 0; sk_again(c, reqs[i].product->sku, a); a++)
                one = return_twice(c, &reqs[i], 1);
            if (one < 0) rc = one;
        }
    }
    return rc < 0 ? -1 : 0;
}

/* ------------------------------------------------------------ forgetting */

#define FORGET_KEYS_MAX 1000      /* buckets per script call: one call stays short */

void stock_returned_span(long long w_old, long long w, long long *first, long long *end) {
    /* Bucket b spans [b*B, (b+1)*B): wholly before w when b < w/B. Those
     * before w_old/B went when the watermark was raised to w_old (each
     * raise deletes all it covers, a step at a time, see forget_steps). */
    *end = w > 0 ? w / STOCK_RETURNED_BUCKET_MS : 0;
    *first = w_old > 0 ? w_old / STOCK_RETURNED_BUCKET_MS : *end - STOCK_RETURNED_LOOKBACK;
    if (*first < 0) *first = 0;
}

long long stock_returned_watermark(long long now_ms, long long keep_ms, long long oldest_owed_ms) {
    long long w = now_ms - keep_ms;
    if (oldest_owed_ms >= 0 && oldest_owed_ms < w) w = oldest_owed_ms;
    return w > 0 ? w : 0;
}

/* The watermark of p's copy now (0: none), or -1 when Redis failed. */
static long long watermark_at(stock_conn *c, const stock_product *p) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "GET");
    sk_add_key(c, p->sku, "returned:before");
    redisReply *rep = sk_run_idempotent(c, "read the forgetting mark");
    if (!rep) return -1;
    long long w = rep->type == REDIS_REPLY_STRING ? strtoll(rep->str, NULL, 10)
                : rep->type == REDIS_REPLY_NIL ? 0 : -1;
    if (w < 0) sk_bad_reply(c, "read the forgetting mark", rep);
    freeReplyObject(rep);
    return w;
}

/* watermark_at, routed (a cluster: to p's node, following redirects). */
static long long watermark_of(stock_conn *c, const stock_product *p) {
    long long w = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++) w = watermark_at(c, p);
    return w;
}

int stock_returned_mark(stock_conn *c, const stock_product *p, long long *before_ms) {
    long long w = -1;
    if (!p->lanes) {
        w = watermark_of(c, p);
    } else {
        for (int i = 0; i < p->lanes; i++) {
            long long one = watermark_of(c, &p->lane[i]);
            if (one < 0) return -1;
            if (w < 0 || one < w) w = one;
        }
    }
    if (w < 0) return -1;
    *before_ms = w;
    return 0;
}

/* One forget.lua call: raises the watermark to w and deletes buckets
 * [first, end). Returns the buckets deleted, or -1 when Redis failed. */
static long long forget_at(stock_conn *c, const stock_product *p, long long w, long long first,
                           long long end) {
    if (stock_conn_ensure(c)) return -1;
    rconn_cmd_evalsha(&c->cmd, &sk_forget, 1 + (int)(end - first));
    sk_add_key(c, p->sku, "returned:before");
    for (long long b = first; b < end; b++) rconn_cmd_addf(&c->cmd, "%s{%s}:returned:%lld",
                                                           c->prefix, p->sku, b);
    rconn_cmd_addll(&c->cmd, w);
    rconn_cmd_addll(&c->cmd, STOCK_RETURNED_BUCKET_MS);
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_forget);
    if (!rep) {
        sk_drop(c, "forget returns");
        return -1;
    }
    long long n = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    if (n < 0) sk_bad_reply(c, "forget returns", rep);
    freeReplyObject(rep);
    return n;
}

/* Raises p's watermark to w and deletes the buckets it covers, in steps of
 * FORGET_KEYS_MAX buckets. Each step raises the watermark only to the end
 * of the buckets it deletes (the last one: to w), so a failure midway
 * leaves no bucket behind the watermark: the next call starts from the
 * watermark it finds, and would never look at those again. */
static int forget_steps(stock_conn *c, const stock_product *p, long long w, long long *forgot) {
    long long w_old = watermark_of(c, p), first, end, n = -1;
    if (w_old < 0) return -1;
    if (w <= w_old) return 0;                     /* raised as far, or further, already */
    stock_returned_span(w_old, w, &first, &end);
    if (first >= end) {
        /* Within the watermark's bucket: only the watermark moves. */
        for (int a = 0; sk_again(c, p->sku, a); a++) n = forget_at(c, p, w, 0, 0);
        return n < 0 ? -1 : 0;
    }
    while (first < end) {
        long long upto = end - first > FORGET_KEYS_MAX ? first + FORGET_KEYS_MAX : end;
        long long step_w = upto == end ? w : upto * STOCK_RETURNED_BUCKET_MS;
        for (int a = 0; sk_again(c, p->sku, a); a++) n = forget_at(c, p, step_w, first, upto);
        if (n < 0) return -1;
        *forgot += n;
        first = upto;
    }
    return 0;
}

int stock_returned_forget(stock_conn *c, const stock_product *p, long long before_ms,
                          long long *forgot_buckets) {
    long long forgot = 0;
    int rc = 0;
    if (before_ms > 0) {
        /* A spread product: each lane is a copy with markers of its own. */
        if (p->lanes) {
            for (int i = 0; i < p->lanes; i++)
                if (forget_steps(c, &p->lane[i], before_ms, &forgot) != 0) rc = -1;
        } else {
            rc = forget_steps(c, p, before_ms, &forgot);
        }
    }
    if (forgot_buckets) *forgot_buckets = forgot;
    return rc;
}
