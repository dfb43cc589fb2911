/* sqlite.c: the SQLite driver of the db module (db_int.h, struct
 * db_driver): a file in WAL mode, one connection per db handle, every
 * statement prepared once when the connection opens, so a bad statement
 * fails the open and never a call on the hot path.
 *
 * What the logic above gets from SQLite's single writer: a write
 * transaction (BEGIN IMMEDIATE) holds the whole file, so what it read
 * cannot change under it until it commits (docs/storage.md, "SQLite"). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <sqlite3.h>

#include "db/db_int.h"

/* Now, as db_format_time writes it. */
#define SQLITE_NOW "strftime('%Y-%m-%dT%H:%M:%fZ','now')"

/* SQLite's text of the statements the dialects word apart (db.c's table
 * has the rest). */
static const char *const SQL[DB_ST_COUNT] = {
    [DB_ST_PRODUCT_GEN] = "UPDATE products SET stock_gen=max(stock_gen,?2)+1 WHERE sku=?1",
    [DB_ST_ORDER_INSERT_ANY] =
        "INSERT INTO orders(order_id,sku,user_id,quantity,idempotency_key,created_at)"
        " SELECT ?1,?2,?3,?4,?5,?6"
        " WHERE NOT EXISTS(SELECT 1 FROM voided_orders WHERE order_id=?1)",
    [DB_ST_VOID_INSERT] =
        "INSERT OR IGNORE INTO voided_orders(order_id,sku,reason,voided_at)"
        " VALUES(?1,?2,?3," SQLITE_NOW ")",
    /* The one writer holds every row already: no lock to take, and the
     * UPDATE, then the DELETE. */
    [DB_ST_FOLD_LOCK] =
        "SELECT sku FROM products WHERE sku IN (SELECT sku FROM product_tallies)",
    [DB_ST_FOLD] =
        "UPDATE products SET"
        " sold=sold+(SELECT coalesce(sum(t.sold),0) FROM product_tallies t WHERE t.sku=products.sku),"
        " held=held+(SELECT coalesce(sum(t.held),0) FROM product_tallies t WHERE t.sku=products.sku)"
        " WHERE sku IN (SELECT sku FROM product_tallies)",
    [DB_ST_FOLD_CLEAR] = "DELETE FROM product_tallies",
    [DB_ST_RESTOCK_INSERT] =
        "INSERT INTO restocks(idempotency_key,sku,quantity,created_at)"
        " VALUES(?1,?2,?3," SQLITE_NOW ")",
    [DB_ST_PROBE] =
        "INSERT OR REPLACE INTO meta(key,value) VALUES('health_probe'," SQLITE_NOW ")",
    /* The write transaction holds the whole file: a SKU's locks and a
     * row's are held already. (STOCK_FOR_UPDATE only prepares: db-for-update
     * needs row locks.) */
    [DB_ST_SKU_SHARED] = "SELECT ?1",
    [DB_ST_SKU_EXCLUSIVE] = "SELECT ?1",
    [DB_ST_DUE_SKUS_SHARED] = "SELECT ?1",
    [DB_ST_PRODUCT_LOCK] = "SELECT 1 FROM products WHERE sku=?1",
    [DB_ST_STOCK_FOR_UPDATE] = "SELECT db_available, db_version FROM products WHERE sku=?1",
    /* The write lock at once: a transaction that read first and then
     * wrote could fail on a lock it cannot wait for. */
    [DB_ST_BEGIN] = "BEGIN IMMEDIATE",
};

typedef struct sq {
    sqlite3 *conn;
    sqlite3_stmt *st[DB_ST_COUNT];
} sq;

enum { R_END, R_PENDING, R_HANDED };

static sq *conn_of(db *d) { return d->impl; }

/* Sets d's error from SQLite's last, and returns its status: DB_EXISTS for
 * a constraint (d->conflict: a primary key, another unique one, or none),
 * DB_BUSY when locked, else DB_ERROR. */
static db_status fail(db *d, const char *what) {
    sqlite3 *c = conn_of(d)->conn;
    int code = sqlite3_extended_errcode(c);
    db_status st = DB_ERROR;
    if ((code & 0xff) == SQLITE_CONSTRAINT) {
        st = DB_EXISTS;
        d->conflict = code == SQLITE_CONSTRAINT_PRIMARYKEY ? DB_CONFLICT_PRIMARY
                      : code == SQLITE_CONSTRAINT_UNIQUE   ? DB_CONFLICT_UNIQUE
                                                           : DB_CONFLICT_NONE;
    } else if ((code & 0xff) == SQLITE_BUSY || (code & 0xff) == SQLITE_LOCKED) {
        st = DB_BUSY;
    }
    return db_set_error(d, st, what, sqlite3_errmsg(c));
}

/* ------------------------------------------------------------- the schema */

static int exec(sqlite3 *c, const char *sql, char *err, size_t errlen) {
    char *msg = NULL;
    if (sqlite3_exec(c, sql, NULL, NULL, &msg) == SQLITE_OK) return 0;
    snprintf(err, errlen, "%s", msg ? msg : sqlite3_errmsg(c));
    sqlite3_free(msg);
    return -1;
}

/* The schema version of c's file (PRAGMA user_version; 0: empty), or -1. */
static int user_version(sqlite3 *c) {
    sqlite3_stmt *s;
    int v = -1;
    if (sqlite3_prepare_v2(c, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK) return -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* Brings c's file to DB_SCHEMA_VERSION in one write transaction, so two
 * processes opening a new file at once cannot both create it. A file of a
 * newer version is refused; a failed step leaves the file as it was. */
static int migrate(sqlite3 *c, char *err, size_t errlen) {
    /* Current already (the usual case): no write lock, so a connection
     * opened while another process holds it can still read. */
    if (user_version(c) == DB_SCHEMA_VERSION) return 0;
    if (exec(c, "BEGIN IMMEDIATE", err, errlen)) return -1;
    int v = user_version(c);
    if (v < 0 || v > DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "database schema version %d is not one this build knows (%d)",
                 v, DB_SCHEMA_VERSION);
        goto err;
    }
    for (int i = 0; i < db_schema_sqlite_n; i++) {
        const db_migration *m = &db_schema_sqlite[i];
        char pragma[48];
        if (m->version <= v) continue;
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%d", m->version);
        if ((m->sql && exec(c, m->sql, err, errlen)) || exec(c, pragma, err, errlen))
            goto err;
    }
    if (exec(c, "COMMIT", err, errlen)) goto err;
    return 0;
err:
    exec(c, "ROLLBACK", err + strlen(err), 0);
    return -1;
}

/* ------------------------------------------------------------ the connection */

/* Appends the likely cause when a writable open failed on a read-only file
 * or file system: SQLite's own message ("unable to open database file",
 * "attempt to write a readonly database") does not say it. */
static void explain_open_failure(const char *path, char *err, size_t errlen) {
    char dir[1024];
    struct statvfs vfs;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
    else snprintf(dir, sizeof dir, ".");
    const char *why = NULL;
    if (statvfs(dir, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
        why = "its file system is mounted read-only";
    else if (access(path, F_OK) == 0 && access(path, W_OK) != 0)
        why = "the file is read-only";
    else if (access(dir, W_OK) != 0)
        why = "its directory is not writable (SQLite needs the -wal and -shm files beside it)";
    size_t used = strlen(err);
    if (why && used < errlen)
        snprintf(err + used, errlen - used, " (%s: orders could not be stored)", why);
}

static void sq_close(db *d) {
    sq *q = conn_of(d);
    if (!q) return;
    for (int i = 0; i < DB_ST_COUNT; i++) sqlite3_finalize(q->st[i]);
    sqlite3_close(q->conn);
    free(q);
    d->impl = NULL;
}

static int sq_open(db *d, const char *path, const db_options *opt, char *err, size_t errlen) {
    sq *q = calloc(1, sizeof *q);
    char pragmas[160];
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    d->impl = q;
    int flags = opt->readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    if (sqlite3_open_v2(path, &q->conn, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "open %s: %s", path, sqlite3_errmsg(q->conn));
        goto err;
    }
    sqlite3_busy_timeout(q->conn, opt->busy_timeout_ms > 0 ? opt->busy_timeout_ms : 2000);
    snprintf(pragmas, sizeof pragmas, "PRAGMA synchronous=%s; PRAGMA foreign_keys=OFF;",
             opt->synchronous_full ? "FULL" : "NORMAL");
    if (!opt->readonly) {
        /* WAL: readers never wait for the writer, and a commit is one
         * append + fsync of the log. */
        if (exec(q->conn, "PRAGMA journal_mode=WAL", err, errlen)) goto err;
        if (migrate(q->conn, err, errlen)) goto err;
    } else if (user_version(q->conn) != DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "%s is not a flashsale database (schema version %d)", path,
                 user_version(q->conn));
        goto err;
    }
    if (exec(q->conn, pragmas, err, errlen)) goto err;
    for (int i = 0; i < DB_ST_COUNT; i++) {
        if (opt->readonly && !db_st_reads(i)) continue;
        if (sqlite3_prepare_v3(q->conn, db_sql_of(d->drv, i), -1, SQLITE_PREPARE_PERSISTENT,
                               &q->st[i], NULL) != SQLITE_OK) {
            snprintf(err, errlen, "prepare: %s", sqlite3_errmsg(q->conn));
            goto err;
        }
    }
    return 0;
err:
    if (!opt->readonly) explain_open_failure(path, err, errlen);
    sq_close(d);
    return -1;
}

/* ------------------------------------------------------------------- runs */

static void bind(sqlite3_stmt *s, const db_arg *args, int n) {
    for (int i = 0; i < n; i++) {
        if (args[i].kind == 'i') sqlite3_bind_int64(s, i + 1, args[i].i);
        else if (args[i].kind == 't') sqlite3_bind_text(s, i + 1, args[i].s, -1, SQLITE_STATIC);
        else sqlite3_bind_null(s, i + 1);
    }
}

/* Ends r's use of its statement: reset (a prepared one) or finalized (an
 * ad hoc one). */
static void sq_done(db_rows *r) {
    sqlite3_stmt *s = r->h;
    if (!s) return;
    if (r->st >= 0) {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    } else {
        sqlite3_finalize(s);
    }
    r->h = NULL;
    r->state = R_END;
}

static db_status sq_run(db *d, db_rows *r, int st, const char *sql, const db_arg *args, int n,
                        const char *what) {
    sq *q = conn_of(d);
    sqlite3_stmt *s;
    memset(r, 0, sizeof *r);
    r->d = d;
    r->st = st;
    if (st >= 0) {
        assert(st < DB_ST_COUNT && q->st[st] != NULL);
        s = q->st[st];
    } else if (sqlite3_prepare_v2(q->conn, sql, -1, &s, NULL) != SQLITE_OK) {
        return fail(d, what);
    }
    r->h = s;
    bind(s, args, n);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        r->state = R_PENDING;
        return DB_OK;
    }
    if (rc == SQLITE_DONE) {
        r->state = R_END;
        return DB_OK;
    }
    db_status res = fail(d, what);
    sq_done(r);
    return res;
}

static int sq_next(db_rows *r) {
    if (r->state == R_PENDING) {
        r->state = R_HANDED;
        return 1;
    }
    if (r->state == R_END || !r->h) return 0;
    int rc = sqlite3_step(r->h);
    if (rc == SQLITE_ROW) return 1;
    r->state = R_END;
    if (rc == SQLITE_DONE) return 0;
    r->d->last = fail(r->d, "read");
    return -1;
}

static long long sq_col_int(db_rows *r, int col) { return sqlite3_column_int64(r->h, col); }

static const char *sq_col_text(db_rows *r, int col) {
    const unsigned char *t = sqlite3_column_text(r->h, col);
    return t ? (const char *)t : "";
}

static int sq_col_null(db_rows *r, int col) { return sqlite3_column_type(r->h, col) == SQLITE_NULL; }

static long long sq_changes(db_rows *r) { return sqlite3_changes(conn_of(r->d)->conn); }

static int sq_in_tx(db *d) { return !sqlite3_get_autocommit(conn_of(d)->conn); }

static void sq_wait_ms(db *d, int ms) { sqlite3_busy_timeout(conn_of(d)->conn, ms > 0 ? ms : 1); }

const db_driver db_sqlite_driver = {
    .name = "sqlite",
    .claims = NULL,             /* any target: a file's path */
    .row_locks = 0,             /* the write transaction holds the file */
    .one_writer = 1,
    .sql = SQL,
    .open = sq_open,
    .close = sq_close,
    .run = sq_run,
    .next = sq_next,
    .col_int = sq_col_int,
    .col_text = sq_col_text,
    .col_null = sq_col_null,
    .changes = sq_changes,
    .done = sq_done,
    .in_tx = sq_in_tx,
    .wait_ms = sq_wait_ms,
};

long long db_memory_used(void) { return (long long)sqlite3_memory_used(); }
