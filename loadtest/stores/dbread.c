/* dbread.c: the verifier's own reads of the orders' database, a SQLite
 * file or a PostgreSQL server, by the schema written down for users in
 * docs/storage.md -- never through the service's db/ (see stores.c for
 * why the judge keeps its own eyes).
 *
 * Per SKU, in one read-only snapshot: the products row, the holds rows, the
 * orders rows (with their hold's state) and the orders that are also
 * voided; and, while the holds settle, how many are still reserved or owe
 * their units to Redis. SQLite is opened read-only (the judge must not be
 * able to change what it judges); PostgreSQL in a READ ONLY, REPEATABLE
 * READ transaction. The queries are written once, with ?1 for the SKU,
 * which the PostgreSQL side sends as $1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include "loadtest/stores/stores.h"

/* The documented schema, as this reader needs it: nothing else is read.
 * Holds came with schema 6 (their columns and table are read from then). */
static const char SQL_PRODUCT[] =
    "SELECT strategy, segments, per_user_limit, stock_initial, sold, stock_gen, db_available,"
    " 0, 0 FROM products WHERE sku = ?1";
static const char SQL_PRODUCT6[] =
    "SELECT strategy, segments, per_user_limit, stock_initial, sold, stock_gen, db_available,"
    " hold_seconds, held FROM products WHERE sku = ?1";
/* Schema 8: a product's sold and held are its row's plus its tallies'. */
static const char SQL_PRODUCT8[] =
    "SELECT strategy, segments, per_user_limit, stock_initial,"
    " sold + coalesce((SELECT sum(t.sold) FROM product_tallies t WHERE t.sku = p.sku), 0),"
    " stock_gen, db_available, hold_seconds,"
    " held + coalesce((SELECT sum(t.held) FROM product_tallies t WHERE t.sku = p.sku), 0)"
    " FROM products p WHERE sku = ?1";
static const char SQL_ORDERS[] =
    "SELECT order_id, user_id, quantity, coalesce(idempotency_key, ''), ''"
    " FROM orders WHERE sku = ?1 ORDER BY order_id";
static const char SQL_ORDERS6[] =
    "SELECT o.order_id, o.user_id, o.quantity, coalesce(o.idempotency_key, ''),"
    " coalesce(h.state, '') FROM orders o LEFT JOIN holds h ON h.order_id = o.order_id"
    " WHERE o.sku = ?1 ORDER BY o.order_id";
/* Through orders_by_sku, then each hold by its key: no scan of every hold. */
static const char SQL_HOLDS[] =
    "SELECT h.order_id, h.quantity, h.gen, h.expires_ms, h.state, coalesce(h.decided_ms, -1),"
    " coalesce(h.payment_ref, ''), CASE WHEN h.return_gen IS NULL THEN 0 ELSE 1 END"
    " FROM orders o JOIN holds h ON h.order_id = o.order_id WHERE o.sku = ?1";
/* Each through its partial index (holds_due, holds_returning). */
static const char SQL_HOLDS_RESERVED[] =
    "SELECT count(*) FROM holds WHERE state = 'reserved' AND sku = ?1";
static const char SQL_HOLDS_OWED[] =
    "SELECT count(*) FROM holds WHERE return_gen IS NOT NULL AND sku = ?1";
static const char SQL_VOIDED_COMMITTED[] =
    "SELECT count(*) FROM orders o JOIN voided_orders v ON v.order_id = o.order_id"
    " WHERE o.sku = ?1";

/* ------------------------------------------------ one reader, two engines */

typedef struct src {
    const char *path;            /* what the user gave: a file, or a libpq URI */
    sqlite3 *lite;
    PGconn *pg;
} src;

typedef struct qry {
    src *s;
    sqlite3_stmt *st;
    PGresult *res;
    int row;
} qry;

int fl_db_is_server(const char *path) {
    return !strncmp(path, "postgresql://", 13) || !strncmp(path, "postgres://", 11);
}

const char *fl_db_vantage(const char *path) {
    return fl_db_is_server(path) ? "postgresql" : "sqlite";
}

static int fl_db_fail(src *s, const char *what, fl_err *e) {
    const char *msg = s->pg ? PQerrorMessage(s->pg) : s->lite ? sqlite3_errmsg(s->lite)
                                                              : "out of memory";
    char clean[300];
    snprintf(clean, sizeof clean, "%s", msg);
    clean[strcspn(clean, "\n")] = '\0';
    return fl_errf(e, "%s: %s: %s", fl_db_vantage(s->path), what, clean);
}

/* Runs sql with sku (unless NULL) as its ?1. 0, or -1 with e set. */
static int q_open(src *s, qry *q, const char *sql, const char *sku, const char *what, fl_err *e) {
    memset(q, 0, sizeof *q);
    q->s = s;
    q->row = -1;
    if (s->pg) {
        char text[1024];
        snprintf(text, sizeof text, "%s", sql);
        for (char *c = text; (c = strchr(c, '?')) != NULL;) *c = '$';
        const char *vals[1] = { sku };
        q->res = PQexecParams(s->pg, text, sku ? 1 : 0, NULL, vals, NULL, NULL, 0);
        if (PQresultStatus(q->res) != PGRES_TUPLES_OK) {
            fl_errf(e, "postgresql: %s: %s", what, PQresultErrorMessage(q->res));
            e->msg[strcspn(e->msg, "\n")] = '\0';
            PQclear(q->res);
            q->res = NULL;
            return -1;
        }
        return 0;
    }
    if (sqlite3_prepare_v2(s->lite, sql, -1, &q->st, NULL) != SQLITE_OK) {
        sqlite3_finalize(q->st);
        q->st = NULL;
        return fl_db_fail(s, what, e);
    }
    if (sku) sqlite3_bind_text(q->st, 1, sku, -1, SQLITE_TRANSIENT);
    return 0;
}

/* The next row: 1, 0 at the end, -1 on an error (e set). */
static int q_next(qry *q, const char *what, fl_err *e) {
    if (q->res) return ++q->row < PQntuples(q->res) ? 1 : 0;
    int rc = sqlite3_step(q->st);
    if (rc == SQLITE_ROW) return 1;
    if (rc == SQLITE_DONE) return 0;
    return fl_db_fail(q->s, what, e);
}

static const char *q_text(qry *q, int col) {
    if (q->res) return PQgetvalue(q->res, q->row, col);
    const unsigned char *t = sqlite3_column_text(q->st, col);
    return t ? (const char *)t : "";
}

static long long q_int(qry *q, int col) {
    return q->res ? atoll(PQgetvalue(q->res, q->row, col)) : sqlite3_column_int64(q->st, col);
}

static void q_close(qry *q) {
    if (q->res) PQclear(q->res);
    if (q->st) sqlite3_finalize(q->st);
    q->res = NULL;
    q->st = NULL;
}

/* A query of one number (sku bound to ?1 unless NULL). */
static int read_scalar(src *s, const char *what, const char *sql, const char *sku,
                       long long *out, fl_err *e) {
    qry q;
    if (q_open(s, &q, sql, sku, what, e)) return -1;
    int got = q_next(&q, what, e);
    if (got > 0) *out = q_int(&q, 0);
    q_close(&q);
    if (got == 0) return fl_errf(e, "%s: %s: no row", fl_db_vantage(s->path), what);
    return got > 0 ? 0 : -1;
}

static void src_close(src *s) {
    if (s->pg) PQfinish(s->pg);
    if (s->lite) sqlite3_close(s->lite);
    s->pg = NULL;
    s->lite = NULL;
}

/* Opens path read-only, reads its schema version and starts one read-only
 * snapshot. 0, or -1 with e set. */
static int src_open(src *s, const char *path, long long *version, fl_err *e) {
    memset(s, 0, sizeof *s);
    s->path = path;
    if (fl_db_is_server(path)) {
        /* A server that stops answering fails the read in seconds, not
         * after TCP's 15 minutes (the target's own parameters win). */
        static const char *const keys[] = { "connect_timeout", "keepalives_idle",
                                             "keepalives_interval", "keepalives_count",
                                             "tcp_user_timeout", "dbname", NULL };
        const char *values[] = { "5", "5", "1", "3", "5000", path, NULL };
        s->pg = PQconnectdbParams(keys, values, 1);
        if (!s->pg || PQstatus(s->pg) != CONNECTION_OK) {
            fl_db_fail(s, "connect", e);
            src_close(s);
            return -1;
        }
        PGresult *r = PQexec(s->pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
        int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) {
            fl_db_fail(s, "begin", e);
            src_close(s);
            return -1;
        }
        if (read_scalar(s, "schema version (not a flashsale database?)",
                        "SELECT coalesce(max(version), 0) FROM flashsale_schema", NULL, version,
                        e)) {
            src_close(s);
            return -1;
        }
    } else {
        if (sqlite3_open_v2(path, &s->lite, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
            fl_db_fail(s, "open", e);
            src_close(s);
            return -1;
        }
        sqlite3_busy_timeout(s->lite, 5000);
        if (read_scalar(s, "schema version", "PRAGMA user_version", NULL, version, e)) {
            src_close(s);
            return -1;
        }
        /* One transaction: the product row, the holds and the order rows
         * are one snapshot, however many orders there are and whoever
         * writes meanwhile. */
        if (sqlite3_exec(s->lite, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) {
            fl_db_fail(s, "begin", e);
            src_close(s);
            return -1;
        }
    }
    if (*version < 1) {
        fl_errf(e, "%s %s: not a flashsale database (schema version %lld)",
                fl_db_vantage(path), path, *version);
        src_close(s);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- the reads */

/* Reads the product row; 1 found, 0 not, -1 error. */
static int fl_db_read_product(src *s, const char *sku, fl_db_sku *out, fl_err *e) {
    qry q;
    const char *what = "products (not the documented schema?)";
    const char *sql = out->schema_version >= 8   ? SQL_PRODUCT8
                      : out->schema_version >= 6 ? SQL_PRODUCT6
                                                 : SQL_PRODUCT;
    if (q_open(s, &q, sql, sku, what, e)) return -1;
    int found = q_next(&q, what, e);
    if (found > 0) {
        snprintf(out->strategy, sizeof out->strategy, "%s", q_text(&q, 0));
        out->segments = (int)q_int(&q, 1);
        out->per_user_limit = q_int(&q, 2);
        out->stock_initial = q_int(&q, 3);
        out->sold = q_int(&q, 4);
        out->stock_gen = q_int(&q, 5);
        out->db_available = q_int(&q, 6);
        out->hold_seconds = (int)q_int(&q, 7);
        out->held = q_int(&q, 8);
    }
    q_close(&q);
    return found;
}

static int read_orders(src *s, const char *sku, int version, fl_row_fn fn, void *ud, fl_err *e) {
    qry q;
    const char *what = "orders (not the documented schema?)";
    if (q_open(s, &q, version >= 6 ? SQL_ORDERS6 : SQL_ORDERS, sku, what, e)) return -1;
    int got;
    while ((got = q_next(&q, what, e)) > 0)
        fn(q_text(&q, 0), q_text(&q, 1), (int)q_int(&q, 2), q_text(&q, 3), q_text(&q, 4), ud);
    q_close(&q);
    return got < 0 ? -1 : 0;
}

static int read_holds(src *s, const char *sku, void (*fn)(const fl_hold_row *, void *), void *ud,
                      fl_err *e) {
    qry q;
    const char *what = "holds (not the documented schema?)";
    if (q_open(s, &q, SQL_HOLDS, sku, what, e)) return -1;
    int got;
    while ((got = q_next(&q, what, e)) > 0) {
        fl_hold_row h = { q_text(&q, 0), (int)q_int(&q, 1), q_int(&q, 2), q_int(&q, 3),
                          q_text(&q, 4), q_int(&q, 5), q_text(&q, 6), (int)q_int(&q, 7) };
        fn(&h, ud);
    }
    q_close(&q);
    return got < 0 ? -1 : 0;
}

int fl_db_read(const char *path, const char *sku, fl_db_sku *out,
               void (*hold)(const fl_hold_row *h, void *ud), fl_row_fn fn, void *ud, fl_err *e) {
    long long version = 0;
    int rc = -1;
    src s;
    memset(out, 0, sizeof *out);
    out->vantage = fl_db_vantage(path);
    if (src_open(&s, path, &version, e)) return -1;
    out->schema_version = (int)version;
    int found = fl_db_read_product(&s, sku, out, e);
    if (found <= 0) {
        rc = found;
        goto out;
    }
    if (hold && version >= 6 && read_holds(&s, sku, hold, ud, e)) goto out;
    if (read_orders(&s, sku, (int)version, fn, ud, e)) goto out;
    if (read_scalar(&s, "voided_orders (not the documented schema?)", SQL_VOIDED_COMMITTED, sku,
                    &out->voided_committed, e))
        goto out;
    rc = 1;
out:
    src_close(&s);                               /* the read transaction ends with it */
    return rc;
}

int fl_db_holds_open(const char *path, const char *sku, long long *reserved, long long *owed,
                     fl_err *e) {
    long long version = 0;
    int rc = -1;
    src s;
    *reserved = *owed = 0;
    if (src_open(&s, path, &version, e)) return -1;
    if (version < 6 || (!read_scalar(&s, "holds", SQL_HOLDS_RESERVED, sku, reserved, e) &&
                        !read_scalar(&s, "holds", SQL_HOLDS_OWED, sku, owed, e)))
        rc = 0;
    src_close(&s);
    return rc;
}
