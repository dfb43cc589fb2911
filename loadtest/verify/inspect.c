/* inspect.c: `flashload inspect`, the verifier's reads of given SKUs'
 * stores, without a load run.
 *
 * A run judges what it sold. Sometimes there is nothing to sell through --
 * a Redis Cluster the service does not run on yet, stores copied off
 * another machine, a test that writes the documented format by hand -- and
 * the question is only what flashload's own reader sees there: which
 * server answered a SKU's reads and which redirections it followed,
 * whether the stock copy is valid for that server, and whether its units
 * add up with SQLite's books. A product spread over a cluster's lanes
 * (docs/storage.md, "On a Redis Cluster") is read lane by lane, each lane
 * on its own node and judged by that node's run_id; a line per lane says
 * where it was read and what it holds. This prints that, through the same reads a
 * run's verdict uses (fl_redis, fl_sqlite: stores.c), and words a broken
 * copy as a run's verdict does. It reads once, without waiting for pending
 * reservations to settle: point it at quiet stores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/verify/inspect.h"
#include "loadtest/verify/verify_int.h"

/* One SKU as read. */
typedef struct seen {
    int db;                      /* 1 product read from SQLite, 0 not asked, -1 absent */
    fl_db_sku sq;
    long long orders;            /* its order rows */
    int redis;                   /* 1 Redis read */
    fl_stock_copy copy;
    fl_lane *lane;               /* copy.lanes of them: the lanes as read */
    long long records, units, unreadable;
    size_t returned;
    fl_redis_route before, after;
} seen;

static void count_row(const char *id, const char *user, int q, const char *key,
                      const char *state, void *ud) {
    (void)id, (void)user, (void)q, (void)key, (void)state;
    (*(long long *)ud)++;
}

/* Reads sku's SQLite rows (when o asks) and then its Redis keys (when o
 * asks) into s. Returns 0, or -1 with e set when a store could not be read. */
static int read_sku(const fl_inspect_opts *o, fl_redis *rd, const char *sku, seen *s,
                    fl_err *e) {
    memset(s, 0, sizeof *s);
    if (o->db_path[0]) {
        int found = fl_db_read(o->db_path, sku, &s->sq, NULL, count_row, &s->orders, e);
        if (found < 0) return -1;
        s->db = found ? 1 : -1;
    }
    if (!rd) return 0;
    int segments = o->segments ? o->segments : s->db == 1 ? s->sq.segments : 1, lanes = 0;
    fl_order_id *ids = NULL;
    fl_redis_route_get(rd, &s->before);
    /* Spread or not: by the product's strategy and segments when SQLite
     * says them, else by the keys there are. */
    if (s->db == 1) lanes = fl_redis_lanes(rd, s->sq.strategy, segments);
    else if (fl_redis_find_lanes(rd, sku, o->segments, &lanes, e)) return -1;
    if (lanes) segments = lanes;
    if (fl_redis_stock(rd, sku, segments, lanes, &s->copy, e) ||
        fl_redis_pending(rd, sku, lanes, &s->records, &s->units, &s->unreadable, e) ||
        fl_redis_returned(rd, sku, lanes, &ids, &s->returned, NULL, e))
        return -1;
    free(ids);
    if (lanes) {
        if (!(s->lane = calloc((size_t)lanes, sizeof *s->lane))) return fl_errf(e, "out of memory");
        for (int i = 0; i < lanes; i++) fl_redis_lane(rd, i, &s->lane[i]);
    }
    fl_redis_route_get(rd, &s->after);
    s->redis = 1;
    return 0;
}

/* Redis's own invariants, worded as verify.c words them. */
static void judge_redis(const seen *s, fl_verdict *vd) {
    const fl_stock_copy *c = &s->copy;
    if (s->records > 0)
        fl_violate(vd, "redis", s->units, "%lld reservations (%lld units) pending", s->records,
                   s->units);
    char why[160];
    if (c->state != FL_COPY_VALID) {
        fl_violate(vd, "redis", 0, "no valid stock copy in Redis for the SKU (%s)",
                   fl_copy_why(c, why, sizeof why));
        return;
    }
    if (c->low < 0)
        fl_violate(vd, "redis", c->low, "stock key %s%d reached %lld", c->lanes ? "of lane " : "",
                   c->low_seg, c->low);
    if (c->stranded)
        fl_violate(vd, "redis", c->stranded_units,
                   "%lld units stranded: %d segment%s marked empty in the bitmap still "
                   "hold%s units (first: segment %d); no order can take them",
                   c->stranded_units, c->stranded, c->stranded == 1 ? "" : "s",
                   c->stranded == 1 ? "s" : "", c->stranded_seg);
}

/* SQLite's books, and Redis's units against them (docs/storage.md,
 * "Invariants a reader may check"). */
static void judge_books(const seen *s, fl_verdict *vd) {
    const fl_db_sku *q = &s->sq;
    long long out = q->sold + q->held;
    if (out > q->stock_initial)
        fl_violate(vd, q->vantage, out - q->stock_initial, "oversold by %lld units: %lld sold "
                   "(%lld held) of %lld", out - q->stock_initial, q->sold, q->held,
                   q->stock_initial);
    if (q->voided_committed)
        fl_violate(vd, q->vantage, q->voided_committed, "%lld orders are both committed and voided",
                   q->voided_committed);
    if (!s->redis || s->copy.state != FL_COPY_VALID) return;
    long long left = q->stock_initial - out, shown = s->copy.total > 0 ? s->copy.total : 0;
    long long pending = s->records > 0 ? s->units : 0;
    if (shown > left)
        fl_violate(vd, "redis", shown - left, "oversold by %lld units: sold %lld (%lld held, "
                   "database) + %lld units in Redis > stock %lld", shown - left, q->sold, q->held,
                   s->copy.total, q->stock_initial);
    else if (shown + pending < left)
        fl_violate(vd, "redis", left - shown - pending, "%lld units lost: neither sold (%lld, "
                   "%lld held, sqlite) nor in Redis (%lld) nor pending (%lld) of %lld",
                   left - shown - pending, q->sold, q->held, s->copy.total, pending,
                   q->stock_initial);
}

/* The nodes the lanes were read on, counted. */
static int lane_nodes(const seen *s) {
    int n = 0;
    for (int i = 0; i < s->copy.lanes; i++) {
        int again = 0;
        for (int k = 0; k < i && !again; k++) again = !strcmp(s->lane[k].node, s->lane[i].node);
        n += !again;
    }
    return n;
}

static const char *state_word(fl_copy_state st) {
    return st == FL_COPY_VALID ? "valid" : st == FL_COPY_STALE ? "stale" : "missing";
}

/* One line per lane: where it was read, and what it holds there. */
static void print_lanes(const seen *s, FILE *f) {
    for (int i = 0; i < s->copy.lanes; i++) {
        const fl_lane *l = &s->lane[i];
        char lab[24], units[48] = "no stock key";
        snprintf(lab, sizeof lab, "lane %d", i);
        if (l->has_stock) snprintf(units, sizeof units, "%lld unit%s", l->units,
                                   l->units == 1 ? "" : "s");
        fprintf(f, "%-9s %s (run_id %s): %s, ", lab, l->node, l->run_id, state_word(l->state));
        if (l->gen) fprintf(f, "generation %lld: %s", l->gen, units);
        else fprintf(f, "no gen: %s", units);
        if (l->state == FL_COPY_STALE) fputs("; its gen names another Redis process", f);
        fputc('\n', f);
    }
}

static void print_copy(const seen *s, FILE *f) {
    const fl_stock_copy *c = &s->copy;
    char why[160];
    const char *unit = c->lanes ? "lane" : "segment";
    char over[32] = "";
    if (c->lanes) snprintf(over, sizeof over, " in %d lanes", c->lanes);
    if (c->state == FL_COPY_VALID)
        fprintf(f, "copy      valid, generation %lld: %lld units%s (lowest: %s %d, %lld)\n",
                c->gen, c->total, over, unit, c->low_seg, c->low);
    else if (c->state == FL_COPY_MIXED)
        fprintf(f, "copy      invalid: %s\n", fl_copy_why(c, why, sizeof why));
    else if (c->state == FL_COPY_STALE)
        fprintf(f, "copy      stale, generation %lld: %s\n", c->gen, fl_copy_why(c, why, sizeof why));
    else
        fprintf(f, "copy      missing: %s\n", fl_copy_why(c, why, sizeof why));
}

static void print_redis(const seen *s, FILE *f) {
    const fl_redis_route *a = &s->after, *b = &s->before;
    if (s->copy.lanes)
        fprintf(f, "redis     spread over %d lanes on %d node%s; ", s->copy.lanes, lane_nodes(s),
                lane_nodes(s) == 1 ? "" : "s");
    else
        fprintf(f, "redis     served by %s (run_id %s); ", a->node, a->run_id);
    fprintf(f, "followed %lu MOVED, %lu ASK, %lu TRYAGAIN/CLUSTERDOWN; %lu reconnects\n",
            a->moved - b->moved, a->ask - b->ask, a->retried - b->retried,
            a->reconnects - b->reconnects);
    print_lanes(s, f);
    print_copy(s, f);
    fprintf(f, "pending   %lld record%s (%lld units)\n", s->records, s->records == 1 ? "" : "s",
            s->units);
    fprintf(f, "returned  %zu ended hold%s\n", s->returned, s->returned == 1 ? "" : "s");
}

static void print_sku(const char *sku, const seen *s, const fl_verdict *vd, FILE *f) {
    char checked[32] = "";
    fprintf(f, "sku       %s\n", sku);
    if (s->redis) print_redis(s, f);
    if (s->db == 1)
        fprintf(f, "%-9s %s, %d segment%s: stock %lld, sold %lld, held %lld; %lld order%s\n",
                s->sq.vantage, s->sq.strategy, s->sq.segments, s->sq.segments == 1 ? "" : "s",
                s->sq.stock_initial, s->sq.sold, s->sq.held, s->orders, s->orders == 1 ? "" : "s");
    else if (s->db < 0)
        fprintf(f, "%-9s no product %s\n", s->sq.vantage ? s->sq.vantage : "db", sku);
    snprintf(checked, sizeof checked, "%s%s%s", s->redis ? "redis" : "",
             s->redis && s->db ? ", " : "", s->db ? s->sq.vantage : "");
    if (vd->pass) {
        fprintf(f, "verdict   PASS (checked: %s)\n", checked);
        return;
    }
    fprintf(f, "verdict   FAIL: %d invariant%s broken (checked: %s)\n", vd->nv_total,
            vd->nv_total == 1 ? "" : "s", checked);
    for (int i = 0; i < vd->nv; i++) fprintf(f, "  [%s] %s\n", vd->v[i].vantage, vd->v[i].what);
}

int fl_inspect(const fl_inspect_opts *o, FILE *f, fl_err *e) {
    fl_redis *rd = NULL;
    if (o->redis_url[0] &&
        !(rd = fl_redis_open(o->redis_url, o->key_prefix[0] ? o->key_prefix : "fs:", 2000, e)))
        return -1;
    fl_verdict *vd = malloc(sizeof *vd);
    seen *s = malloc(sizeof *s);
    int rc = vd && s ? 0 : fl_errf(e, "out of memory");
    if (s) s->lane = NULL;
    for (int i = 0; i < o->nskus && rc >= 0; i++) {
        free(s->lane);
        if (read_sku(o, rd, o->skus[i], s, e)) {
            free(s->lane);
            s->lane = NULL;
            rc = -1;
            break;
        }
        memset(vd, 0, sizeof *vd);
        vd->pass = 1;
        if (s->db < 0) fl_violate(vd, fl_db_vantage(o->db_path), 0, "no product %s in %s", o->skus[i], o->db_path);
        if (s->redis) judge_redis(s, vd);
        if (s->db == 1) judge_books(s, vd);
        if (i) fputc('\n', f);
        print_sku(o->skus[i], s, vd, f);
        if (!vd->pass) rc = 1;
    }
    if (s) free(s->lane);
    free(s);
    free(vd);
    fl_redis_close(rd);
    return rc;
}
