/* returns.c: giving an ended hold's units back to the stock copy. See
 * stock.h (stock_return) and lua/return.lua, which decides, atomically,
 * whether this copy owes them and whether they were given back already.
 *
 * Its own file beside stock.c: the units of a hold come back by a path of
 * their own (its marker, its generations), not by undo.lua's pending
 * records, which end when an order commits. */
#include <string.h>

#include "stock/internal.h"

static void build_return(stock_conn *c, const stock_return_req *r) {
    const stock_product *p = r->product;
    char q[24];
    rconn_cmd_evalsha(&c->cmd, &sk_return, 4 + p->segments);
    sk_add_key(c, p->sku, "gen");
    sk_add_key(c, p->sku, "returned");
    sk_add_key(c, p->sku, "users");
    sk_add_key(c, p->sku, "empty");
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
    }
    sk_bad_reply(c, "return", rep);
    return -1;
}

/* One try of stock_return: 0, -1 when Redis failed for some, -2 when the
 * connection broke (nothing more is known). */
static int return_calls(stock_conn *c, stock_return_req *reqs, size_t n) {
    size_t i;
    int rc = 0;
    for (i = 0; i < n; i++) {
        reqs[i].result = STOCK_UNAVAILABLE;
        reqs[i].given = 0;
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

int stock_return(stock_conn *c, stock_return_req *reqs, size_t n) {
    if (n == 0) return 0;
    int64_t t0 = sk_t0(c->observe);
    int rc = 0;
    if (!c->cluster) {
        rc = return_twice(c, reqs, n);
    } else {
        for (size_t i = 0; i < n; i++) {     /* a cluster: each on its SKU's node */
            int one = 0;
            if (reqs[i].product->lanes) {
                one = sk_spread_return(c, &reqs[i]);
            } else {
                for (int a = 0; sk_again(c, reqs[i].product->sku, a); a++)
                    one = return_twice(c, &reqs[i], 1);
            }
            if (one < 0) rc = one;
        }
    }
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_UNDO, t0);
    return rc < 0 ? -1 : 0;
}
