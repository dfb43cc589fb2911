/* spread.c: one SKU over a Redis Cluster's primaries (stock.h,
 * stock_product_spread), the blocking side; and so the public operations
 * on a product's stock, which take either its one copy or its lanes.
 *
 * A spread product's segment i is a lane: a one-segment copy of its own,
 * under the hash tag {<sku>:<i>}, so in a slot of its own, and the lanes
 * fall on every primary. Each lane is a complete copy as stock.h describes
 * one (gen, stock:0, pending, empty, returned, idem:...), so every script
 * runs unchanged on a lane: the functions here are the public ones
 * (stock_reserve, stock_confirm, stock_undo, stock_return, stock_read,
 * stock_read_gen, stock_load, stock_restock, stock_pending_scan), each
 * handing a product of one copy to the one-copy code below (stock.c's and
 * returns.c's sk_copy_*), and a spread one's lanes -- which lane, or each
 * lane in turn -- to itself again, each lane as a product of one segment
 * (p->lane[i]). So the choice of copy or lanes is made here alone, and the
 * one-copy code never calls back up into it.
 *
 * What spans lanes is not Redis's: the per-user limit is checked by SQLite
 * at commit (the lanes are given no limit), and an idempotency key that
 * two lanes both saw meets the order's unique key in SQLite. An order goes
 * to one lane whole when one holds it; else it is taken in steps, each
 * lane's part under the same order id (a pending record in that lane, at
 * most one part per lane), and every part is given back when the lanes
 * together fall short. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stock/internal.h"

#define GATHER_ROUNDS 3           /* passes over the lanes of a stepwise take */

/* ------------------------------------------------------------ the lanes */

int stock_product_spread(stock_product *p) {
    assert(p->segments > 1 && !p->lanes);
    stock_product *lane = calloc((size_t)p->segments, sizeof *lane);
    if (!lane) return -1;
    for (int i = 0; i < p->segments; i++) {
        char sku[STOCK_SKU_MAX + 16];
        snprintf(sku, sizeof sku, "%s:%d", p->sku, i);
        char *name = strdup(sku);
        if (!name || stock_product_init(&lane[i], name, p->strategy, 1, 0, p->cs_delay_ms,
                                        p->lock_ttl_ms) != 0) {
            free(name);
            for (int k = 0; k < i; k++) sk_lane_free(&lane[k]);
            free(lane);
            return -1;
        }
    }
    p->lane = lane;
    p->lanes = p->segments;
    return 0;
}

int sk_lane_parse(const stock_product *p, const char **t, int *units) {
    while (**t) {
        char *end;
        long lane = strtol(*t, &end, 10);
        long n = *end == ':' ? strtol(end + 1, &end, 10) : -1;
        const char *comma = strchr(end, ',');
        *t = comma ? comma + 1 : end + strlen(end);
        if (lane >= 0 && lane < p->lanes && n >= 0 && n <= 0x7fffffff) {
            *units = (int)n;
            return (int)lane;
        }
    }
    return -1;
}

/* ------------------------------------------------------------- reserve */

/* One attempt of r for `units` on lane i: the result in *res, with what it
 * says (available, gen, a replay's order) copied into r. */
static stock_result lane_take(stock_conn *c, const stock_product *p, int i, stock_req *r,
                              int units) {
    stock_req one = *r;
    stock_req *pr = &one;
    one.product = &p->lane[i];
    one.quantity = units;
    one.want_takes = 0;
    one.takes = NULL;
    stock_reserve(c, &pr, 1);
    r->available = one.available;
    r->gen = one.gen;
    r->outcome_unknown = one.outcome_unknown;
    memcpy(r->replay_order_id, one.replay_order_id, sizeof r->replay_order_id);
    r->replay_same = one.replay_same;
    return one.result;
}

/* Appends "<lane>:<units>" to the takes being built in buf (len bytes). */
static void add_take(char *buf, size_t len, int lane, int units) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%d:%d", used ? "," : "", lane, units);
}

/* r's outcome, with where its units came from. */
static void reserved(stock_req *r, const char *takes, long long gen) {
    r->result = STOCK_RESERVED;
    r->gen = gen;
    free(r->takes);
    r->takes = strdup(takes);
    if (!r->takes) r->result = STOCK_UNAVAILABLE;   /* (its parts are undone by the caller) */
}

/* A stepwise take: each lane's part in turn, at most one per lane, until
 * r has its quantity; every part given back when the lanes fall short. */
static void gather(stock_conn *c, const stock_product *p, stock_req *r, int first) {
    char takes[STOCK_MAX_SEGMENTS * 16] = "";
    unsigned char *taken = calloc((size_t)p->lanes, 1);
    int need = r->quantity, unknown = 0;
    long long gen = 0, seen = 0;
    stock_result fail = STOCK_INSUFFICIENT;
    if (!taken) {
        r->result = STOCK_UNAVAILABLE;
        r->outcome_unknown = 0;
        return;
    }
    for (int round = 0; round < GATHER_ROUNDS && need > 0; round++) {
        seen = r->quantity - need;                  /* the parts held count as seen */
        for (int k = 0; k < p->lanes && need > 0; k++) {
            int i = (first + k) % p->lanes, units = need;
            if (taken[i]) continue;
            stock_result res = lane_take(c, p, i, r, units);
            if (res == STOCK_INSUFFICIENT && r->available > 0) {
                units = (int)(r->available < need ? r->available : need);
                res = lane_take(c, p, i, r, units);
            }
            if (res == STOCK_RESERVED && gen && r->gen != gen) {
                taken[i] = 1;                       /* a rebuild came between the parts */
                add_take(takes, sizeof takes, i, units);
                fail = STOCK_MISSING;
                goto undo;
            }
            if (res == STOCK_RESERVED) {
                taken[i] = 1;
                gen = r->gen;
                need -= units;
                add_take(takes, sizeof takes, i, units);
                continue;
            }
            if (res == STOCK_SOLD_OUT || res == STOCK_INSUFFICIENT) {
                seen += r->available;
                continue;
            }
            if (res == STOCK_UNAVAILABLE && r->outcome_unknown) {
                unknown = 1;                       /* it may have run: give it back too */
                add_take(takes, sizeof takes, i, units);
            }
            fail = res;
            goto undo;
        }
    }
    if (need == 0) {
        free(taken);
        reserved(r, takes, gen);
        if (r->result == STOCK_RESERVED) return;
        fail = STOCK_UNAVAILABLE;
        goto undone;
    }
undo:
    free(taken);
undone:;
    stock_ref ref = { p, r->order_id, r->idem_key, takes };
    int done = 0;
    if (takes[0] && (stock_undo(c, &ref, 1, &done) != 0 || !done)) unknown = 1;
    r->result = fail;
    r->available = fail == STOCK_INSUFFICIENT ? seen : r->available;
    if (fail == STOCK_INSUFFICIENT && seen == 0) r->result = STOCK_SOLD_OUT;
    /* A part that may still be taken: the caller's undo retries (every
     * lane) settle it, as for any reservation of unknown outcome. */
    if (unknown) {
        r->result = STOCK_UNAVAILABLE;
        r->outcome_unknown = 1;
    } else if (r->result == STOCK_UNAVAILABLE) {
        r->outcome_unknown = 0;
    }
}

/* stock_reserve of one request of a spread product: one lane's whole
 * take when one holds it, else a stepwise take (gather). 0, or -1 when
 * Redis failed (r->result STOCK_UNAVAILABLE). */
static int spread_reserve(stock_conn *c, stock_req *r) {
    const stock_product *p = r->product;
    int first = (int)(sk_random(c) % (uint64_t)p->lanes);
    long long seen = 0;
    char takes[32];
    for (int k = 0; k < p->lanes; k++) {
        int i = (first + k) % p->lanes;
        stock_result res = lane_take(c, p, i, r, r->quantity);
        if (res == STOCK_RESERVED) {
            snprintf(takes, sizeof takes, "%d:%d", i, r->quantity);
            reserved(r, takes, r->gen);
            if (r->result != STOCK_RESERVED) {        /* out of memory: give it back */
                stock_ref ref = { p, r->order_id, r->idem_key, takes };
                int done = 0;
                stock_undo(c, &ref, 1, &done);
                r->outcome_unknown = !done;
            }
            return r->result == STOCK_UNAVAILABLE ? -1 : 0;
        }
        if (res != STOCK_SOLD_OUT && res != STOCK_INSUFFICIENT) {
            r->result = res;
            return res == STOCK_UNAVAILABLE ? -1 : 0;
        }
        seen += r->available;
    }
    if (seen >= r->quantity) {
        gather(c, p, r, first);
    } else {
        r->result = seen ? STOCK_INSUFFICIENT : STOCK_SOLD_OUT;
        r->available = seen;
    }
    return r->result == STOCK_UNAVAILABLE ? -1 : 0;
}

int stock_reserve(stock_conn *c, stock_req **reqs, size_t n) {
    if (!c->cluster) return sk_copy_reserve(c, reqs, n);
    /* A cluster: one at a time, each on its SKU's node (a spread one's:
     * on its lanes' nodes). */
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        rc |= reqs[i]->product->lanes ? spread_reserve(c, reqs[i])
                                      : sk_copy_reserve(c, &reqs[i], 1);
    return rc ? -1 : 0;
}

/* ------------------------------------------------- confirm, undo, return */

/* stock_confirm of one order of a spread product: on each lane its takes
 * name (every lane when it has none). 0, or -1 when one failed. */
static int spread_confirm(stock_conn *c, const stock_ref *ref) {
    const stock_product *p = ref->product;
    const char *t = ref->takes;
    int units, rc = 0;
    for (int i = 0; i < p->lanes; i++) {
        int lane = t ? sk_lane_parse(p, &t, &units) : i;
        if (lane < 0) break;
        stock_ref one = { &p->lane[lane], ref->order_id, ref->idem_key, NULL };
        if (sk_copy_confirm(c, &one, 1) != 0) rc = -1;   /* timed once, by the caller */
    }
    return rc;
}

int stock_confirm(stock_conn *c, const stock_ref *refs, size_t n) {
    int64_t t0 = sk_t0(c->observe);
    int rc = 0;
    if (!c->cluster) {
        rc = sk_copy_confirm(c, refs, n);
    } else {
        for (size_t i = 0; i < n; i++)
            rc |= refs[i].product->lanes ? spread_confirm(c, &refs[i])
                                         : sk_copy_confirm(c, &refs[i], 1);
    }
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_CLEAR, t0);
    return rc;
}

/* stock_undo of one order of a spread product, as spread_confirm: *done
 * when every lane's undo ran. 0, or -1 when one failed. */
static int spread_undo(stock_conn *c, const stock_ref *ref, int *done) {
    const stock_product *p = ref->product;
    const char *t = ref->takes;
    int units, rc = 0;
    *done = 1;
    for (int i = 0; i < p->lanes; i++) {
        int lane = t ? sk_lane_parse(p, &t, &units) : i, one_done = 0;
        if (lane < 0) break;
        stock_ref one = { &p->lane[lane], ref->order_id, ref->idem_key, NULL };
        if (sk_copy_undo(c, &one, 1, &one_done) != 0) rc = -1;   /* timed by the caller */
        if (!one_done) *done = 0;
    }
    return rc;
}

int stock_undo(stock_conn *c, const stock_ref *refs, size_t n, int *done) {
    int64_t t0 = sk_t0(c->observe);
    int rc = 0;
    if (!c->cluster) {
        rc = sk_copy_undo(c, refs, n, done);
    } else {
        for (size_t i = 0; i < n; i++)
            rc |= refs[i].product->lanes ? spread_undo(c, &refs[i], &done[i])
                                         : sk_copy_undo(c, &refs[i], 1, &done[i]);
    }
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_UNDO, t0);
    return rc;
}

/* stock_return of one hold of a spread product: each lane its takes name
 * gets its part back (all to lane 0 when there is no record). 0, or -1
 * when one failed. */
static int spread_return(stock_conn *c, stock_return_req *r) {
    const stock_product *p = r->product;
    const char *t = r->takes && r->takes[0] ? r->takes : "0:0";
    char part[32];
    int units, rc = 0, any = 0;
    r->result = STOCK_RESERVED;
    r->given = 0;
    r->forgotten = 0;
    for (int lane; (lane = sk_lane_parse(p, &t, &units)) >= 0;) {
        if (!r->takes || !r->takes[0]) units = r->quantity;   /* no record: all to lane 0 */
        snprintf(part, sizeof part, "0:%d", units);
        stock_return_req one = *r;
        one.product = &p->lane[lane];
        one.takes = part;
        one.quantity = units;
        any = 1;
        if (sk_copy_return(c, &one, 1) != 0) rc = -1;   /* timed by the caller */
        if (one.given) r->given = 1;
        if (one.forgotten) r->forgotten = 1;   /* the whole debt stays owed */
        if (one.result == STOCK_UNAVAILABLE) r->result = STOCK_UNAVAILABLE;
        else if (one.result == STOCK_MISSING && r->result != STOCK_UNAVAILABLE)
            r->result = STOCK_MISSING;
    }
    if (!any) r->result = STOCK_RESERVED;      /* nothing was taken from any lane */
    return rc;
}

int stock_return(stock_conn *c, stock_return_req *reqs, size_t n) {
    if (n == 0) return 0;
    int64_t t0 = sk_t0(c->observe);
    int rc = 0;
    if (!c->cluster) {
        rc = sk_copy_return(c, reqs, n);
    } else {
        for (size_t i = 0; i < n; i++) {     /* a cluster: each on its SKU's node */
            int one = reqs[i].product->lanes ? spread_return(c, &reqs[i])
                                             : sk_copy_return(c, &reqs[i], 1);
            if (one < 0) rc = one;
        }
    }
    sk_observe(c->observe, c->observe_ud, STOCK_CALL_UNDO, t0);
    return rc < 0 ? -1 : 0;
}

/* --------------------------------------------------------------- reads */

/* stock_read of a spread product: the lanes' units, each lane's in seg;
 * STOCK_MISSING when a lane has no valid copy or two lanes are of
 * different generations. */
static stock_result spread_read(stock_conn *c, const stock_product *p, long long *total,
                                long long *seg) {
    stock_result res = STOCK_RESERVED;
    long long gen = -1;
    *total = 0;
    for (int i = 0; i < p->lanes; i++) {
        long long units = 0, g = 0;
        stock_result one = stock_read(c, &p->lane[i], &units, NULL);
        if (one == STOCK_UNAVAILABLE) return one;
        if (one != STOCK_RESERVED) res = one;
        /* One copy is lanes of one generation: lanes of two are a rebuild
         * half done, which the next rebuild finishes. */
        if (one == STOCK_RESERVED && stock_read_gen(c, &p->lane[i], &g) == STOCK_RESERVED) {
            if (gen >= 0 && g != gen) res = STOCK_MISSING;
            gen = g;
        }
        if (seg) seg[i] = units;
        *total += units;
    }
    return res;
}

stock_result stock_read(stock_conn *c, const stock_product *p, long long *total,
                        long long *seg) {
    return p->lanes ? spread_read(c, p, total, seg) : sk_copy_read(c, p, total, seg);
}

/* stock_read_gen of a spread product: the highest of its lanes'. */
static stock_result spread_read_gen(stock_conn *c, const stock_product *p, long long *gen) {
    *gen = 0;
    for (int i = 0; i < p->lanes; i++) {
        long long g = 0;
        stock_result one = stock_read_gen(c, &p->lane[i], &g);
        if (one != STOCK_RESERVED) return one;
        if (g > *gen) *gen = g;                /* the new one must be above every lane's */
    }
    return STOCK_RESERVED;
}

stock_result stock_read_gen(stock_conn *c, const stock_product *p, long long *gen) {
    return p->lanes ? spread_read_gen(c, p, gen) : sk_copy_read_gen(c, p, gen);
}

/* -------------------------------------------------------------- writes */

/* stock_load of a spread product: available shared evenly over the lanes
 * (no per-user counts: SQLite checks the limit). 0 when some lane was
 * loaded now, 1 when every lane was already, -1 when one failed. */
static int spread_load(stock_conn *c, const stock_product *p, long long gen, long long available,
                       int force) {
    int rc = 1;
    for (int i = 0; i < p->lanes; i++) {
        long long share = available / p->lanes + (i < available % p->lanes);
        int one = stock_load(c, &p->lane[i], gen, share, NULL, 0, force);
        if (one < 0) return -1;
        if (one == 0) rc = 0;                  /* loaded now (else: by another instance) */
    }
    return rc;
}

int stock_load(stock_conn *c, const stock_product *p, long long gen, long long available,
               const stock_user_units *users, size_t nusers, int force) {
    if (p->lanes) return spread_load(c, p, gen, available, force);
    return sk_copy_load(c, p, gen, available, users, nusers, force);
}

/* stock_restock of a spread product: qty shared evenly over the lanes. */
static stock_result spread_restock(stock_conn *c, const stock_product *p, long long qty) {
    stock_result res = STOCK_RESERVED;
    for (int i = 0; i < p->lanes; i++) {
        long long share = qty / p->lanes + (i < qty % p->lanes);
        if (!share) continue;
        stock_result one = stock_restock(c, &p->lane[i], share);
        if (one == STOCK_UNAVAILABLE) return one;
        if (one != STOCK_RESERVED) res = one;
    }
    return res;
}

stock_result stock_restock(stock_conn *c, const stock_product *p, long long qty) {
    return p->lanes ? spread_restock(c, p, qty) : sk_copy_restock(c, p, qty);
}

typedef struct lane_visit {
    int lane;
    void (*fn)(const stock_pending *rec, void *ud);
    void *ud;
} lane_visit;

static void visit_lane(const stock_pending *rec, void *ud) {
    const lane_visit *v = ud;
    stock_pending one = *rec;
    one.lane = v->lane;
    v->fn(&one, v->ud);
}

/* stock_pending_scan of a spread product: each lane's records in turn,
 * each with its lane. */
static int spread_pending_scan(stock_conn *c, const stock_product *p,
                               void (*fn)(const stock_pending *rec, void *ud), void *ud) {
    for (int i = 0; i < p->lanes; i++) {
        lane_visit v = { i, fn, ud };
        if (stock_pending_scan(c, &p->lane[i], visit_lane, &v) != 0) return -1;
    }
    return 0;
}

int stock_pending_scan(stock_conn *c, const stock_product *p,
                       void (*fn)(const stock_pending *rec, void *ud), void *ud) {
    return p->lanes ? spread_pending_scan(c, p, fn, ud) : sk_copy_pending_scan(c, p, fn, ud);
}
