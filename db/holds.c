/* holds.c: deciding holds, and the scans that find the due and the owing.
 * See holds.h.
 *
 * A file of its own because a hold's end is its own concept: three ways
 * out of RESERVED and the units that must come back, beside (not inside)
 * the order inserts of db.c. Its statements are prepared with db.c's when
 * a connection opens (db_int.h); the table is created by schema.c. The
 * same decisions through the committer (holds.h's db_writer_*) are
 * writer.c's: the committer calls down into this file, never back. */
#include "db/holds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db_int.h"

const char *const db_holds_sql[DB_HOLDS_ST_COUNT] = {
[DB_HOLDS_ST_READ] = "SELECT h.state,h.expires_ms,h.quantity,h.sku,o.user_id,h.gen,h.takes"
        " FROM holds h JOIN orders o ON o.order_id=h.order_id WHERE h.order_id=?1",
    /* The condition on state is the decision: of two racing deciders, the
     * second changes no row. */
[DB_HOLDS_ST_MOVE] = "UPDATE holds SET state=?2, decided_ms=?3, payment_ref=?4, return_gen=CASE WHEN ?5<>0"
        " THEN (SELECT stock_gen FROM products p WHERE p.sku=holds.sku) END"
        " WHERE order_id=?1 AND state='reserved'",
[DB_HOLDS_ST_PRODUCT] = "UPDATE products SET held=held-?2, sold=sold+?3, db_available=db_available+?4"
        " WHERE sku=?1 RETURNING stock_gen",
[DB_HOLDS_ST_USER] = "UPDATE user_units SET units=units-?3 WHERE sku=?1 AND user_id=?2",
    /* A sweep's batch in one statement; the subquery walks holds_due. The
     * condition on state is the outer statement's too: on PostgreSQL a row
     * a decision changed while the sweep waited for its lock is checked
     * again against the UPDATE's own conditions only, not the subquery's,
     * and without it a hold paid meanwhile would end twice. */
[DB_HOLDS_ST_EXPIRE] = "UPDATE holds SET state='expired', decided_ms=?1, return_gen=CASE WHEN in_db<>0"
        " THEN NULL ELSE (SELECT stock_gen FROM products p WHERE p.sku=holds.sku) END"
        " WHERE order_id IN (SELECT order_id FROM holds WHERE state='reserved'"
        " AND expires_ms<=?1 ORDER BY expires_ms LIMIT ?2) AND state='reserved'"
        " RETURNING order_id, sku, quantity, expires_ms, gen, coalesce(return_gen,0), takes, in_db",
[DB_HOLDS_ST_ANY_DUE] = "SELECT 1 FROM holds WHERE state='reserved' AND expires_ms<=?1 LIMIT 1",
[DB_HOLDS_ST_UNHOLD] = "UPDATE products SET held=held-?2, db_available=db_available+?3 WHERE sku=?1",
[DB_HOLDS_ST_USER_OF] = "UPDATE user_units SET units=units-?2 WHERE sku=?1"
        " AND user_id=(SELECT user_id FROM orders WHERE order_id=?3)",
[DB_HOLDS_ST_OWING] = "SELECT h.order_id,h.sku,o.user_id,h.quantity,h.gen,h.return_gen,h.takes,h.state,"
        "h.decided_ms FROM holds h JOIN orders o ON o.order_id=h.order_id"
        " WHERE h.return_gen IS NOT NULL AND h.decided_ms<=?1 ORDER BY h.decided_ms LIMIT ?2",
[DB_HOLDS_ST_OWED_UNITS] = "SELECT coalesce(sum(h.quantity),0) FROM holds h JOIN products p ON p.sku=h.sku"
        " WHERE h.return_gen IS NOT NULL AND h.sku=?1 AND h.return_gen>=p.stock_gen",
[DB_HOLDS_ST_HELD] = "SELECT coalesce((SELECT sum(held) FROM products),0)"
        "+coalesce((SELECT sum(held) FROM product_tallies),0)",
    /* The forgetting of return markers waits for this (service/holds):
     * by the holds_returning index, whose rows are the few debts not yet
     * cleared. -1: none. */
[DB_HOLDS_ST_OLDEST_OWED] = "SELECT coalesce(min(decided_ms),-1) FROM holds WHERE sku=?1 AND return_gen IS NOT NULL",
[DB_HOLDS_ST_RETURNED] = "UPDATE holds SET return_gen=NULL WHERE order_id=?1 AND return_gen=?2",
};

#define HOLDS_ST(id) (DB_ST_HOLDS_FIRST + (id))

static const char *const STATE_OF[] = {
    [DB_HOLD_CONFIRM] = "confirmed", [DB_HOLD_CANCEL] = "cancelled", [DB_HOLD_EXPIRE] = "expired"
};

/* ------------------------------------------------------------- deciding */

/* Moves the hold read into dc (RESERVED, q units of sku) to `to`, with the
 * products row and the buyer's count in the same transaction. */
static db_status move(db *d, db_decision *dc, db_hold_to to, int q, const char *sku,
                      const char *user) {
    int back = to != DB_HOLD_CONFIRM;
    const char *ref = to == DB_HOLD_CONFIRM && dc->payment_ref && dc->payment_ref[0]
                          ? dc->payment_ref : NULL;
    const db_arg m[] = { DB_TEXT(dc->order_id), DB_TEXT(STATE_OF[to]), DB_INT(dc->now_ms),
                         DB_TEXT(ref), DB_INT(back && !dc->stock_in_db) };
    long long changed = 0;
    db_status st = db_do(d, HOLDS_ST(DB_HOLDS_ST_MOVE), m, 5, "decide hold", &changed);
    if (st != DB_OK) return st == DB_EXISTS ? DB_ERROR : st;
    if (changed == 0) return DB_OK;            /* decided by another: read again */
    dc->changed = 1;

    long long gen = 0;
    if (dc->stock_in_db) {
        /* Its units back in the products row: written there. */
        const db_arg p[] = { DB_TEXT(sku), DB_INT(q), DB_INT(to == DB_HOLD_CONFIRM ? q : 0),
                             DB_INT(back ? q : 0) };
        st = db_one_int(d, HOLDS_ST(DB_HOLDS_ST_PRODUCT), p, 4, "count the hold's units", &gen);
    } else {
        /* The stock is a Redis copy's: only the counts move, where the
         * connection counts (db_count_units), and the generation is read,
         * under the SKU's shared lock: no rebuild counts the hold's units
         * until this decision is committed or undone. */
        const db_arg g[] = { DB_TEXT(sku) };
        st = db_sku_shared(d, sku);
        if (st == DB_OK) st = db_one_int(d, DB_ST_GEN_READ, g, 1, "count the hold's units", &gen);
        if (st == DB_OK && gen > 0)
            st = db_count_units(d, sku, to == DB_HOLD_CONFIRM ? q : 0, -(long long)q);
    }
    if (st == DB_NOTFOUND || (st == DB_OK && gen <= 0))
        return db_error(d, "hold of an unknown product");
    if (st != DB_OK) return st;
    if (back && dc->stock_in_db) {
        /* A row exists only with a per-user limit: no row, nothing counted. */
        const db_arg u[] = { DB_TEXT(sku), DB_TEXT(user), DB_INT(q) };
        if ((st = db_do(d, HOLDS_ST(DB_HOLDS_ST_USER), u, 3, "uncount the buyer's units",
                        NULL)) != DB_OK)
            return st;
    }
    /* Owed to the copy of the generation the database has now (the MOVE
     * wrote the same): a rebuild that comes later counts these units
     * itself, as held went down in this transaction. */
    if (back && !dc->stock_in_db) dc->return_gen = gen;
    return DB_OK;
}

/* Reads dc's hold: its state, deadline, units, SKU and buyer, and into dc
 * where the units came from. DB_NOTFOUND when order_id is not a hold. */
static db_status read_hold(db *d, db_decision *dc, char *state, size_t cap, int64_t *expires,
                           int *q, char *sku, char *user) {
    const db_arg a[] = { DB_TEXT(dc->order_id) };
    db_rows r;
    db_status st = db_run(d, &r, HOLDS_ST(DB_HOLDS_ST_READ), a, 1, "read hold");
    if (st != DB_OK) return st;
    int got = db_next(&r);
    if (got > 0) {
        snprintf(state, cap, "%s", db_col_text(&r, 0));
        *expires = db_col_int(&r, 1);
        *q = (int)db_col_int(&r, 2);
        snprintf(sku, DB_SKU_MAX + 1, "%s", db_col_text(&r, 3));
        snprintf(user, DB_USER_MAX * 4 + 1, "%s", db_col_text(&r, 4));
        dc->reserve_gen = db_col_int(&r, 5);
        const char *t = db_col_text(&r, 6);
        snprintf(dc->takes, sizeof dc->takes, "%s", t);
        if (strlen(t) >= sizeof dc->takes) dc->takes[0] = '\0';
    }
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

db_status db_hold_decide_in(db *d, db_decision *dc) {
    char state[16], sku[DB_SKU_MAX + 1], user[DB_USER_MAX * 4 + 1];
    int64_t expires = 0;
    int q = 0;
    dc->changed = 0;
    dc->return_gen = 0;
    dc->reserve_gen = 0;
    dc->takes[0] = '\0';
    db_status st = read_hold(d, dc, state, sizeof state, &expires, &q, sku, user);
    if (st == DB_OK && dc->user_id && strcmp(dc->user_id, user)) return DB_NOTFOUND;
    if (st == DB_OK && !strcmp(state, "reserved")) {
        db_hold_to to = dc->now_ms >= expires ? DB_HOLD_EXPIRE : dc->to;
        if ((st = move(d, dc, to, q, sku, user)) != DB_OK) return st;
    } else if (st != DB_OK && st != DB_NOTFOUND) {
        return st;
    }
    /* Not a hold (an order confirmed at once, or none), decided before, or
     * just now: the order as it is. */
    st = db_order_get(d, dc->order_id, &dc->order);
    if (st == DB_OK && dc->user_id && strcmp(dc->user_id, dc->order.user_id)) return DB_NOTFOUND;
    return st;
}

db_status db_hold_decide(db *d, db_decision *dc) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    st = db_hold_decide_in(d, dc);
    if (st != DB_OK || !dc->changed) {
        db_rollback(d);                       /* nothing was written */
        return st;
    }
    if (db_commit(d) != DB_OK) {
        db_rollback(d);
        return DB_UNKNOWN;
    }
    return DB_OK;
}

/* ---------------------------------------------------------------- scans */

db_status db_hold_owing(db *d, int64_t decided_before_ms, int max,
                        void (*fn)(const db_owed *o, void *ud), void *ud) {
    const db_arg a[] = { DB_INT(decided_before_ms), DB_INT(max) };
    db_rows r;
    db_status st = db_run(d, &r, HOLDS_ST(DB_HOLDS_ST_OWING), a, 2, "holds owing units");
    if (st != DB_OK) return st;
    int got;
    db_owed o;
    while ((got = db_next(&r)) > 0) {
        memset(&o, 0, sizeof o);
        snprintf(o.order_id, sizeof o.order_id, "%s", db_col_text(&r, 0));
        snprintf(o.sku, sizeof o.sku, "%s", db_col_text(&r, 1));
        snprintf(o.user_id, sizeof o.user_id, "%s", db_col_text(&r, 2));
        o.quantity = (int)db_col_int(&r, 3);
        o.reserve_gen = db_col_int(&r, 4);
        o.return_gen = db_col_int(&r, 5);
        o.takes = db_col_text(&r, 6);
        int state = db_order_status_parse(db_col_text(&r, 7));
        o.status = state < 0 ? DB_ORDER_EXPIRED : (db_order_status)state;
        o.decided_ms = db_col_int(&r, 8);
        fn(&o, ud);
    }
    db_done(&r);
    return got >= 0 ? DB_OK : d->last;
}

db_status db_hold_owed_units(db *d, const char *sku, long long *units) {
    const db_arg a[] = { DB_TEXT(sku) };
    *units = 0;
    db_status st = db_one_int(d, HOLDS_ST(DB_HOLDS_ST_OWED_UNITS), a, 1, "owed units", units);
    return st == DB_NOTFOUND ? DB_ERROR : st;
}

db_status db_hold_oldest_owed(db *d, const char *sku, int64_t *decided_ms) {
    const db_arg a[] = { DB_TEXT(sku) };
    long long v = -1;
    db_status st = db_one_int(d, HOLDS_ST(DB_HOLDS_ST_OLDEST_OWED), a, 1, "oldest owed hold", &v);
    *decided_ms = st == DB_OK ? v : -1;
    return st == DB_NOTFOUND ? DB_ERROR : st;
}

db_status db_hold_units(db *d, long long *held) {
    *held = 0;
    db_status st = db_one_int(d, HOLDS_ST(DB_HOLDS_ST_HELD), NULL, 0, "units held", held);
    return st == DB_NOTFOUND ? DB_ERROR : st;
}

db_status db_hold_returned(db *d, const char *order_id, long long gen) {
    const db_arg a[] = { DB_TEXT(order_id), DB_INT(gen) };
    return db_do(d, HOLDS_ST(DB_HOLDS_ST_RETURNED), a, 2, "hold's units returned", NULL);
}

/* --------------------------------------------------------- expiry sweeps */

int db_hold_any_due(db *d, int64_t now_ms) {
    const db_arg a[] = { DB_INT(now_ms) };
    long long one;
    db_status st = db_one_int(d, HOLDS_ST(DB_HOLDS_ST_ANY_DUE), a, 1, "due holds", &one);
    return st == DB_OK ? 1 : st == DB_NOTFOUND ? 0 : -1;
}

void db_expired_free(db_expired *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(e[i].takes);
        e[i].takes = NULL;
    }
}

/* Takes q units of sku out of held, back of them (a db strategy's) into
 * db_available in the products row, the others where the connection
 * counts (db_count_units). */
static db_status unhold(db *d, const char *sku, long long q, long long back) {
    db_status st = DB_OK;
    if (back) {
        const db_arg a[] = { DB_TEXT(sku), DB_INT(back), DB_INT(back) };
        st = db_do(d, HOLDS_ST(DB_HOLDS_ST_UNHOLD), a, 3, "count expired units", NULL);
    }
    if (st == DB_OK && q > back) st = db_count_units(d, sku, 0, -(q - back));
    return st;
}

db_status db_hold_expire_due(db *d, int64_t now_ms, int max, db_expired *out, size_t *n) {
    db_status st;
    int got, nomem = 0;
    *n = 0;
    /* The rows first (RETURNING hands them out as the UPDATE runs), then
     * the products: a statement may not be run under another. */
    unsigned char *in_db = calloc((size_t)max, 1);
    if (!in_db) return db_error(d, "out of memory");
    const db_arg a[] = { DB_INT(now_ms), DB_INT(max) };
    db_rows r;
    /* The shared locks of the SKUs first (db_sku_shared): the generation
     * the statement records as owed stays the SKU's until this commits. */
    st = db_due_skus_shared(d, now_ms);
    if (st != DB_OK || (st = db_run(d, &r, HOLDS_ST(DB_HOLDS_ST_EXPIRE), a, 2, "expire holds")) !=
                           DB_OK) {
        free(in_db);
        return st;
    }
    while ((got = db_next(&r)) > 0 && *n < (size_t)max) {
        db_expired *e = &out[*n];
        snprintf(e->order_id, sizeof e->order_id, "%s", db_col_text(&r, 0));
        snprintf(e->sku, sizeof e->sku, "%s", db_col_text(&r, 1));
        e->quantity = (int)db_col_int(&r, 2);
        e->expires_ms = db_col_int(&r, 3);
        e->reserve_gen = db_col_int(&r, 4);
        e->return_gen = db_col_int(&r, 5);
        e->takes = strdup(db_col_text(&r, 6));
        in_db[*n] = (unsigned char)db_col_int(&r, 7);
        (*n)++;
        if (!e->takes) {
            nomem = 1;
            break;
        }
    }
    /* Every row of the UPDATE stepped through, so that it is whole. */
    while (!nomem && got > 0) got = db_next(&r);
    db_done(&r);
    if (nomem || got < 0) {
        st = nomem ? db_error(d, "out of memory") : d->last;
        goto out;
    }
    /* One update per product of the batch (a wave is mostly one SKU): bit 1
     * of in_db marks a row counted. Then the db strategies' buyers. */
    for (size_t i = 0; i < *n && st == DB_OK; i++) {
        long long q = 0, back = 0;
        if (in_db[i] & 2) continue;
        for (size_t k = i; k < *n; k++) {
            if ((in_db[k] & 2) || strcmp(out[k].sku, out[i].sku)) continue;
            in_db[k] |= 2;
            q += out[k].quantity;
            if (in_db[k] & 1) back += out[k].quantity;
        }
        st = unhold(d, out[i].sku, q, back);
    }
    for (size_t i = 0; i < *n && st == DB_OK; i++) {
        if (!(in_db[i] & 1)) continue;
        const db_arg u[] = { DB_TEXT(out[i].sku), DB_INT(out[i].quantity),
                             DB_TEXT(out[i].order_id) };
        st = db_do(d, HOLDS_ST(DB_HOLDS_ST_USER_OF), u, 3, "uncount the buyer's units", NULL);
    }
out:
    free(in_db);
    if (st != DB_OK) {
        db_expired_free(out, *n);
        *n = 0;
    }
    return st;
}
