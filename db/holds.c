/* holds.c: deciding holds, and the scans that find the due and the owing.
 * See holds.h.
 *
 * A file of its own because a hold's end is its own concept: three ways
 * out of RESERVED and the units that must come back, beside (not inside)
 * the order inserts of db.c. Its statements are prepared with db.c's when
 * a connection opens (db_int.h); the table is created by schema.c. */
#include "db/holds.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db_int.h"

const char *const db_holds_sql[DB_HOLDS_ST_COUNT] = {
    [DB_HOLDS_ST_READ] =
        "SELECT h.state,h.expires_ms,h.quantity,h.sku,o.user_id,h.gen,h.takes"
        " FROM holds h JOIN orders o ON o.order_id=h.order_id WHERE h.order_id=?1",
    /* The condition on state is the decision: of two racing deciders, the
     * second changes no row. */
    [DB_HOLDS_ST_MOVE] =
        "UPDATE holds SET state=?2, decided_ms=?3, payment_ref=?4, return_gen=CASE WHEN ?5"
        " THEN (SELECT stock_gen FROM products p WHERE p.sku=holds.sku) END"
        " WHERE order_id=?1 AND state='reserved'",
    [DB_HOLDS_ST_PRODUCT] =
        "UPDATE products SET held=held-?2, sold=sold+?3, db_available=db_available+?4"
        " WHERE sku=?1 RETURNING stock_gen",
    [DB_HOLDS_ST_USER] =
        "UPDATE user_units SET units=units-?3 WHERE sku=?1 AND user_id=?2",
    /* A sweep's batch in one statement; the subquery walks holds_due. */
    [DB_HOLDS_ST_EXPIRE] =
        "UPDATE holds SET state='expired', decided_ms=?1, return_gen=CASE WHEN in_db THEN NULL"
        " ELSE (SELECT stock_gen FROM products p WHERE p.sku=holds.sku) END"
        " WHERE order_id IN (SELECT order_id FROM holds WHERE state='reserved'"
        " AND expires_ms<=?1 ORDER BY expires_ms LIMIT ?2)"
        " RETURNING order_id, sku, quantity, expires_ms, gen, coalesce(return_gen,0), takes, in_db",
    [DB_HOLDS_ST_ANY_DUE] =
        "SELECT 1 FROM holds WHERE state='reserved' AND expires_ms<=?1 LIMIT 1",
    [DB_HOLDS_ST_UNHOLD] =
        "UPDATE products SET held=held-?2, db_available=db_available+?3 WHERE sku=?1",
    [DB_HOLDS_ST_USER_OF] =
        "UPDATE user_units SET units=units-?2 WHERE sku=?1"
        " AND user_id=(SELECT user_id FROM orders WHERE order_id=?3)",
    [DB_HOLDS_ST_OWING] =
        "SELECT h.order_id,h.sku,o.user_id,h.quantity,h.gen,h.return_gen,h.takes,h.state"
        " FROM holds h JOIN orders o ON o.order_id=h.order_id"
        " WHERE h.return_gen IS NOT NULL AND h.decided_ms<=?1 ORDER BY h.decided_ms LIMIT ?2",
    [DB_HOLDS_ST_OWED_UNITS] =
        "SELECT coalesce(sum(h.quantity),0) FROM holds h JOIN products p ON p.sku=h.sku"
        " WHERE h.return_gen IS NOT NULL AND h.sku=?1 AND h.return_gen>=p.stock_gen",
    [DB_HOLDS_ST_HELD] = "SELECT coalesce(sum(held),0) FROM products",
    [DB_HOLDS_ST_RETURNED] =
        "UPDATE holds SET return_gen=NULL WHERE order_id=?1 AND return_gen=?2",
};

static const char *const STATE_OF[] = {
    [DB_HOLD_CONFIRM] = "confirmed", [DB_HOLD_CANCEL] = "cancelled", [DB_HOLD_EXPIRE] = "expired"
};

/* ------------------------------------------------------------- deciding */

/* Moves the hold read into dc (RESERVED, q units of sku) to `to`, with the
 * products row and the buyer's count in the same transaction. */
static db_status move(db *d, db_decision *dc, db_hold_to to, int q, const char *sku,
                      const char *user) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_MOVE);
    int back = to != DB_HOLD_CONFIRM;
    sqlite3_bind_text(s, 1, dc->order_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, STATE_OF[to], -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, dc->now_ms);
    if (to == DB_HOLD_CONFIRM && dc->payment_ref && dc->payment_ref[0])
        sqlite3_bind_text(s, 4, dc->payment_ref, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 4);
    sqlite3_bind_int(s, 5, back && !dc->stock_in_db);
    db_status st = db_step_done(d, s, "decide hold");
    if (st != DB_OK) return st == DB_EXISTS ? DB_ERROR : st;
    if (sqlite3_changes(db_conn(d)) == 0) return DB_OK;   /* decided by another: read again */
    dc->changed = 1;

    s = db_holds_stmt(d, DB_HOLDS_ST_PRODUCT);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, q);
    sqlite3_bind_int(s, 3, to == DB_HOLD_CONFIRM ? q : 0);
    sqlite3_bind_int(s, 4, back && dc->stock_in_db ? q : 0);
    int rc = sqlite3_step(s);
    long long gen = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    while (rc == SQLITE_ROW) rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return db_fail(d, "count the hold's units");
    if (gen <= 0) return db_error(d, "hold of an unknown product");
    if (back && dc->stock_in_db) {
        /* A row exists only with a per-user limit: no row, nothing counted. */
        s = db_holds_stmt(d, DB_HOLDS_ST_USER);
        sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, user, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 3, q);
        if ((st = db_step_done(d, s, "uncount the buyer's units")) != DB_OK) return st;
    }
    /* Owed to the copy of the generation SQLite has now (the MOVE wrote the
     * same): a rebuild that comes later counts these units itself, as held
     * went down in this transaction. */
    if (back && !dc->stock_in_db) dc->return_gen = gen;
    return DB_OK;
}

/* Reads dc's hold: its state, deadline, units, SKU and buyer, and into dc
 * where the units came from. DB_NOTFOUND when order_id is not a hold. */
static db_status read_hold(db *d, db_decision *dc, char *state, size_t cap, int64_t *expires,
                           int *q, char *sku, char *user) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_READ);
    sqlite3_bind_text(s, 1, dc->order_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        snprintf(state, cap, "%s", (const char *)sqlite3_column_text(s, 0));
        *expires = sqlite3_column_int64(s, 1);
        *q = sqlite3_column_int(s, 2);
        snprintf(sku, DB_SKU_MAX + 1, "%s", (const char *)sqlite3_column_text(s, 3));
        snprintf(user, DB_USER_MAX * 4 + 1, "%s", (const char *)sqlite3_column_text(s, 4));
        dc->reserve_gen = sqlite3_column_int64(s, 5);
        const unsigned char *t = sqlite3_column_text(s, 6);
        snprintf(dc->takes, sizeof dc->takes, "%s", t ? (const char *)t : "");
        if (t && strlen((const char *)t) >= sizeof dc->takes) dc->takes[0] = '\0';
    }
    sqlite3_reset(s);
    if (rc == SQLITE_ROW) return DB_OK;
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "read hold");
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
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_OWING);
    sqlite3_bind_int64(s, 1, decided_before_ms);
    sqlite3_bind_int(s, 2, max);
    int rc;
    db_owed o;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        memset(&o, 0, sizeof o);
        snprintf(o.order_id, sizeof o.order_id, "%s", (const char *)sqlite3_column_text(s, 0));
        snprintf(o.sku, sizeof o.sku, "%s", (const char *)sqlite3_column_text(s, 1));
        snprintf(o.user_id, sizeof o.user_id, "%s", (const char *)sqlite3_column_text(s, 2));
        o.quantity = sqlite3_column_int(s, 3);
        o.reserve_gen = sqlite3_column_int64(s, 4);
        o.return_gen = sqlite3_column_int64(s, 5);
        o.takes = (const char *)sqlite3_column_text(s, 6);
        int state = db_order_status_parse((const char *)sqlite3_column_text(s, 7));
        o.status = state < 0 ? DB_ORDER_EXPIRED : (db_order_status)state;
        fn(&o, ud);
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? DB_OK : db_fail(d, "holds owing units");
}

db_status db_hold_owed_units(db *d, const char *sku, long long *units) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_OWED_UNITS);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    *units = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? DB_OK : db_fail(d, "owed units");
}

db_status db_hold_units(db *d, long long *held) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_HELD);
    int rc = sqlite3_step(s);
    *held = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? DB_OK : db_fail(d, "units held");
}

db_status db_hold_returned(db *d, const char *order_id, long long gen) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_RETURNED);
    sqlite3_bind_text(s, 1, order_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, gen);
    return db_step_done(d, s, "hold's units returned");
}

/* --------------------------------------------------------- expiry sweeps */

int db_hold_any_due(db *d, int64_t now_ms) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_ANY_DUE);
    sqlite3_bind_int64(s, 1, now_ms);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        db_fail(d, "due holds");
        return -1;
    }
    return rc == SQLITE_ROW;
}

void db_expired_free(db_expired *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(e[i].takes);
        e[i].takes = NULL;
    }
}

/* Takes q units of sku out of held (in_db: back into db_available). */
static db_status unhold(db *d, const char *sku, long long q, long long back) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_UNHOLD);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, q);
    sqlite3_bind_int64(s, 3, back);
    return db_step_done(d, s, "count expired units");
}

db_status db_hold_expire_due(db *d, int64_t now_ms, int max, db_expired *out, size_t *n) {
    sqlite3_stmt *s = db_holds_stmt(d, DB_HOLDS_ST_EXPIRE);
    int rc;
    db_status st = DB_OK;
    *n = 0;
    sqlite3_bind_int64(s, 1, now_ms);
    sqlite3_bind_int(s, 2, max);
    /* The rows first (RETURNING hands them out as the UPDATE runs), then
     * the products: a statement may not be stepped under another. */
    unsigned char *in_db = calloc((size_t)max, 1);
    if (!in_db) return db_error(d, "out of memory");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW && *n < (size_t)max) {
        db_expired *e = &out[*n];
        snprintf(e->order_id, sizeof e->order_id, "%s", (const char *)sqlite3_column_text(s, 0));
        snprintf(e->sku, sizeof e->sku, "%s", (const char *)sqlite3_column_text(s, 1));
        e->quantity = sqlite3_column_int(s, 2);
        e->expires_ms = sqlite3_column_int64(s, 3);
        e->reserve_gen = sqlite3_column_int64(s, 4);
        e->return_gen = sqlite3_column_int64(s, 5);
        const unsigned char *t = sqlite3_column_text(s, 6);
        e->takes = strdup(t ? (const char *)t : "");
        in_db[*n] = (unsigned char)sqlite3_column_int(s, 7);
        (*n)++;
        if (!e->takes) rc = SQLITE_NOMEM;
        if (rc == SQLITE_NOMEM) break;
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        st = rc == SQLITE_NOMEM ? db_error(d, "out of memory") : db_fail(d, "expire holds");
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
        s = db_holds_stmt(d, DB_HOLDS_ST_USER_OF);
        sqlite3_bind_text(s, 1, out[i].sku, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 2, out[i].quantity);
        sqlite3_bind_text(s, 3, out[i].order_id, -1, SQLITE_STATIC);
        st = db_step_done(d, s, "uncount the buyer's units");
    }
out:
    free(in_db);
    if (st != DB_OK) {
        db_expired_free(out, *n);
        *n = 0;
    }
    return st;
}

/* ------------------------------------------------------ through the committer */

typedef struct expiry_arg {
    int64_t now_ms;
    int max;
    db_expired *out;
    size_t n;
} expiry_arg;

typedef struct debts_arg {
    const db_debt *v;
    size_t n;
} debts_arg;

db_status db_holds_job_in(db *d, db_job *job) {
    if (job->kind == DB_JOB_DECIDE) return db_hold_decide_in(d, job->arg);
    if (job->kind == DB_JOB_EXPIRE) {
        expiry_arg *e = job->arg;
        return db_hold_expire_due(d, e->now_ms, e->max, e->out, &e->n);
    }
    assert(job->kind == DB_JOB_RETURNED);
    debts_arg *a = job->arg;
    for (size_t i = 0; i < a->n; i++) {
        db_status st = db_hold_returned(d, a->v[i].order_id, a->v[i].gen);
        if (st != DB_OK) return st;
    }
    return DB_OK;
}

static db_status call(db_writer *w, db_job_kind kind, void *arg) {
    db_job job;
    memset(&job, 0, sizeof job);
    job.kind = kind;
    job.arg = arg;
    return db_writer_call(w, &job);
}

db_status db_writer_decide(db_writer *w, db_decision *dc) {
    return call(w, DB_JOB_DECIDE, dc);
}

db_status db_writer_expire(db_writer *w, int64_t now_ms, int max, db_expired *out, size_t *n) {
    expiry_arg e = { now_ms, max, out, 0 };
    db_status st = call(w, DB_JOB_EXPIRE, &e);
    if (st != DB_OK) db_expired_free(out, e.n);   /* rolled back with its group */
    *n = st == DB_OK ? e.n : 0;
    return st;
}

db_status db_writer_returned(db_writer *w, const db_debt *debts, size_t n) {
    debts_arg a = { debts, n };
    return n ? call(w, DB_JOB_RETURNED, &a) : DB_OK;
}
