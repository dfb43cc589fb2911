/* inspect.c: `flashload inspect`, the verifier's reads of given SKUs'
 * stores, without a load run.
 *
 * A run judges what it sold. Sometimes there is nothing to sell through --
 * a Redis Cluster the service does not run on yet, stores copied off
 * another machine, a test that writes the documented format by hand -- and
 * the question is only what flashload's own reader sees there: which
 * server answered a SKU's reads and which redirections it followed,
 * whether the stock copy is valid for that server, and whether its units
 * add up with SQLite's books. This prints that, through the same reads a
 * run's verdict uses (fl_redis, fl_sqlite: stores.c), and words a broken
 * copy as a run's verdict does. It reads once, without waiting for pending
 * reservations to settle: point it at quiet stores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/verify_int.h"

/* One SKU as read. */
typedef struct seen {
    int db;                      /* 1 product read from SQLite, 0 not asked, -1 absent */
    fl_sqlite_sku sq;
    long long orders;            /* its order rows */
    int redis;                   /* 1 Redis read */
    fl_stock_copy copy;
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
        int found = fl_sqlite_read(o->db_path, sku, &s->sq, NULL, count_row, &s->orders, e);
        if (found < 0) return -1;
        s->db = found ? 1 : -1;
    }
    if (!rd) return 0;
    int segments = o->segments ? o->segments : s->db == 1 ? s->sq.segments : 1;
    char (*ids)[27] = NULL;
    fl_redis_route_get(rd, &s->before);
    if (fl_redis_stock(rd, sku, segments, &s->copy, e) ||
        fl_redis_pending(rd, sku, &s->records, &s->units, &s->unreadable, e) ||
        fl_redis_returned(rd, sku, &ids, &s->returned, e))
        return -1;
    free(ids);
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
    if (c->state != FL_COPY_VALID) {
        fl_violate(vd, "redis", 0, "no valid stock copy in Redis for the SKU (%s)",
                   c->state == FL_COPY_STALE ? "its gen names another Redis process"
                                             : "a gen or stock key is missing");
        return;
    }
    if (c->low < 0) fl_violate(vd, "redis", c->low, "stock key %d reached %lld", c->low_seg, c->low);
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
    const fl_sqlite_sku *q = &s->sq;
    long long out = q->sold + q->held;
    if (out > q->stock_initial)
        fl_violate(vd, "sqlite", out - q->stock_initial, "oversold by %lld units: %lld sold "
                   "(%lld held) of %lld", out - q->stock_initial, q->sold, q->held,
                   q->stock_initial);
    if (q->voided_committed)
        fl_violate(vd, "sqlite", q->voided_committed, "%lld orders are both committed and voided",
                   q->voided_committed);
    if (!s->redis || s->copy.state != FL_COPY_VALID) return;
    long long left = q->stock_initial - out, shown = s->copy.total > 0 ? s->copy.total : 0;
    long long pending = s->records > 0 ? s->units : 0;
    if (shown > left)
        fl_violate(vd, "redis", shown - left, "oversold by %lld units: sold %lld (%lld held, "
                   "sqlite) + %lld units in Redis > stock %lld", shown - left, q->sold, q->held,
                   s->copy.total, q->stock_initial);
    else if (shown + pending < left)
        fl_violate(vd, "redis", left - shown - pending, "%lld units lost: neither sold (%lld, "
                   "%lld held, sqlite) nor in Redis (%lld) nor pending (%lld) of %lld",
                   left - shown - pending, q->sold, q->held, s->copy.total, pending,
                   q->stock_initial);
}

static void print_redis(const seen *s, FILE *f) {
    const fl_redis_route *a = &s->after, *b = &s->before;
    const fl_stock_copy *c = &s->copy;
    fprintf(f, "redis     served by %s (run_id %s); followed %lu MOVED, %lu ASK, "
               "%lu TRYAGAIN/CLUSTERDOWN; %lu reconnects\n", a->node, a->run_id,
            a->moved - b->moved, a->ask - b->ask, a->retried - b->retried,
            a->reconnects - b->reconnects);
    if (c->state == FL_COPY_VALID)
        fprintf(f, "copy      valid, generation %lld: %lld units (lowest: segment %d, %lld)\n",
                c->gen, c->total, c->low_seg, c->low);
    else if (c->state == FL_COPY_STALE)
        fprintf(f, "copy      stale, generation %lld: its gen names another Redis process\n",
                c->gen);
    else
        fprintf(f, "copy      missing: a gen or stock key is missing\n");
    fprintf(f, "pending   %lld record%s (%lld units)\n", s->records, s->records == 1 ? "" : "s",
            s->units);
    fprintf(f, "returned  %zu ended hold%s\n", s->returned, s->returned == 1 ? "" : "s");
}

static void print_sku(const char *sku, const seen *s, const fl_verdict *vd, FILE *f) {
    char checked[32] = "";
    fprintf(f, "sku       %s\n", sku);
    if (s->redis) print_redis(s, f);
    if (s->db == 1)
        fprintf(f, "sqlite    %s, %d segment%s: stock %lld, sold %lld, held %lld; %lld order%s\n",
                s->sq.strategy, s->sq.segments, s->sq.segments == 1 ? "" : "s",
                s->sq.stock_initial, s->sq.sold, s->sq.held, s->orders, s->orders == 1 ? "" : "s");
    else if (s->db < 0)
        fprintf(f, "sqlite    no product %s\n", sku);
    snprintf(checked, sizeof checked, "%s%s%s", s->redis ? "redis" : "",
             s->redis && s->db ? ", " : "", s->db ? "sqlite" : "");
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
    for (int i = 0; i < o->nskus && rc >= 0; i++) {
        if (read_sku(o, rd, o->skus[i], s, e)) {
            rc = -1;
            break;
        }
        memset(vd, 0, sizeof *vd);
        vd->pass = 1;
        if (s->db < 0) fl_violate(vd, "sqlite", 0, "no product %s in %s", o->skus[i], o->db_path);
        if (s->redis) judge_redis(s, vd);
        if (s->db == 1) judge_books(s, vd);
        if (i) fputc('\n', f);
        print_sku(o->skus[i], s, vd, f);
        if (!vd->pass) rc = 1;
    }
    free(s);
    free(vd);
    fl_redis_close(rd);
    return rc;
}
