/* copy.c: moving a flashsale database to another (`flashsale migrate`):
 * every table a sale's books live in, row for row, from a database of one
 * engine to an empty one of another (a SQLite file to a PostgreSQL
 * server), in one transaction of the target, so that a copy that fails
 * leaves the target as it was and can simply run again.
 *
 * What moves: products (with their generations, sold, held, db stock and
 * versions), orders (with their idempotency keys), holds (and their debts
 * to Redis), the tombstones of voided orders, the buyers' units of the db
 * strategies, restocks by key, the db-lock fences (a token must never
 * go back), and the tallies of several writers' groups (version 8). Not the held db-lock rows (a lock held across a migration is
 * a lock of the old database's holders) nor the health probe's row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db/db.h"
#include "db/db_int.h"

/* A table and its columns, each an integer ('i') or a text ('t'). */
typedef struct table {
    const char *name;
    const char *cols;
    const char *kinds;
} table;

static const table TABLES[] = {
    { "products",
      "sku,name,strategy,segments,per_user_limit,stock_initial,sold,stock_gen,db_available,"
      "db_version,cs_delay_ms,lock_ttl_ms,created_at,hold_seconds,held,cs_overlap,"
      "room_turn_ms,room_rate,room_opens_ms",
      "tttiiiiiiiiitiiiiii" },
    { "orders", "order_id,sku,user_id,quantity,idempotency_key,created_at", "tttitt" },
    { "holds", "order_id,sku,quantity,gen,takes,in_db,expires_ms,state,decided_ms,payment_ref,"
               "return_gen", "ttiitiititi" },
    { "voided_orders", "order_id,sku,reason,voided_at", "tttt" },
    { "user_units", "sku,user_id,units", "tti" },
    { "restocks", "idempotency_key,sku,quantity,created_at", "ttit" },
    { "lock_fences", "name,fence", "ti" },
    { "product_tallies", "sku,slot,sold,held", "tiii" },
};

#define BATCH_ROWS 500

/* The rows of one batch, kept until the batch is inserted. */
typedef struct batch {
    int rows, ncols;
    db_arg *args;
    char **texts;               /* owned copies of the text arguments */
} batch;

static void batch_clear(batch *b) {
    for (int i = 0; i < b->rows * b->ncols; i++) free(b->texts[i]);
    memset(b->texts, 0, (size_t)BATCH_ROWS * (size_t)b->ncols * sizeof *b->texts);
    b->rows = 0;
}

/* Inserts the batch's rows into t on dst: one statement. */
static db_status batch_flush(db *dst, const table *t, batch *b) {
    if (b->rows == 0) return DB_OK;
    size_t cap = strlen(t->name) + strlen(t->cols) + 64 + (size_t)b->rows * (size_t)b->ncols * 8;
    char *sql = malloc(cap);
    if (!sql) return db_error(dst, "copy: out of memory");
    size_t len = (size_t)snprintf(sql, cap, "INSERT INTO %s(%s) VALUES", t->name, t->cols);
    for (int r = 0; r < b->rows; r++) {
        len += (size_t)snprintf(sql + len, cap - len, "%s(", r ? "," : "");
        for (int c = 0; c < b->ncols; c++)
            len += (size_t)snprintf(sql + len, cap - len, "%s?%d", c ? "," : "",
                                    r * b->ncols + c + 1);
        len += (size_t)snprintf(sql + len, cap - len, ")");
    }
    db_rows rw;
    db_status st = db_run_sql(dst, &rw, sql, b->args, b->rows * b->ncols, "copy rows");
    if (st == DB_OK) db_done(&rw);
    free(sql);
    batch_clear(b);
    return st;
}

/* Copies table t from src to dst (in dst's open transaction). */
static db_status copy_table(db *src, db *dst, const table *t, long long *copied,
                            void (*progress)(const char *table, long long rows, int done, void *ud),
                            void *ud) {
    char sql[512];
    int ncols = (int)strlen(t->kinds);
    batch b = { 0, ncols, calloc((size_t)BATCH_ROWS * (size_t)ncols, sizeof(db_arg)),
                calloc((size_t)BATCH_ROWS * (size_t)ncols, sizeof(char *)) };
    db_status st = DB_OK;
    *copied = 0;
    if (!b.args || !b.texts) {
        st = db_error(dst, "copy: out of memory");
        goto out;
    }
    snprintf(sql, sizeof sql, "SELECT %s FROM %s", t->cols, t->name);
    db_rows r;
    if ((st = db_run_sql(src, &r, sql, NULL, 0, "read rows")) != DB_OK) {
        snprintf(dst->errstr, sizeof dst->errstr, "source: %.240s", src->errstr);
        goto out;
    }
    int got;
    while (st == DB_OK && (got = db_next(&r)) > 0) {
        for (int c = 0; c < ncols; c++) {
            db_arg *a = &b.args[b.rows * ncols + c];
            if (db_col_null(&r, c)) *a = DB_NULL;
            else if (t->kinds[c] == 'i') *a = DB_INT(db_col_int(&r, c));
            else {
                char *s = strdup(db_col_text(&r, c));
                b.texts[b.rows * ncols + c] = s;
                *a = (db_arg){ s ? 't' : 'n', 0, s };
                if (!s) st = db_error(dst, "copy: out of memory");
            }
        }
        b.rows++;
        (*copied)++;
        if (b.rows == BATCH_ROWS && st == DB_OK) st = batch_flush(dst, t, &b);
        if (progress && *copied % 100000 == 0) progress(t->name, *copied, 0, ud);
    }
    if (got < 0 && st == DB_OK) {
        snprintf(dst->errstr, sizeof dst->errstr, "source: %.240s", src->errstr);
        st = src->last;
    }
    db_done(&r);
    if (st == DB_OK) st = batch_flush(dst, t, &b);
out:
    if (b.texts) batch_clear(&b);
    free(b.args);
    free(b.texts);
    return st;
}

db_status db_copy_into(db *src, db *dst,
                       void (*progress)(const char *table, long long rows, int done, void *ud), void *ud) {
    long long n;
    db_rows r;
    /* Only into an empty database: a copy is the whole of the books or
     * nothing, never a merge with another sale's. */
    const char *const CHECK[] = { "SELECT count(*) FROM products", "SELECT count(*) FROM orders" };
    for (int i = 0; i < 2; i++) {
        db_status st = db_run_sql(dst, &r, CHECK[i], NULL, 0, "read the target");
        if (st != DB_OK) return st;
        n = db_next(&r) > 0 ? db_col_int(&r, 0) : -1;
        db_done(&r);
        if (n != 0) {
            snprintf(dst->errstr, sizeof dst->errstr, "the target is not empty (%s has rows): "
                     "a migration copies into an empty database only", i ? "orders" : "products");
            return DB_EXISTS;
        }
    }
    db_status st = db_begin(dst);
    if (st != DB_OK) return st;
    for (size_t i = 0; st == DB_OK && i < sizeof TABLES / sizeof TABLES[0]; i++) {
        st = copy_table(src, dst, &TABLES[i], &n, progress, ud);
        if (st == DB_OK && progress) progress(TABLES[i].name, n, 1, ud);
    }
    if (st == DB_OK) st = db_commit(dst);
    if (st != DB_OK) db_rollback(dst);
    return st;
}
