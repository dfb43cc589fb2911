/* db.c: the SQLite connection, its prepared statements and the queries of
 * products and orders. See db.h.
 *
 * db_open migrates an older file forward (schema.c) and refuses a newer
 * one. Every statement is prepared once per connection: this file's and
 * the lock table's (locktable.c, through db_int.h). */
#include "db/db.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <sqlite3.h>

#include "db/db_int.h"

enum {
    ST_PRODUCT_INSERT, ST_PRODUCT_GET, ST_PRODUCT_ALL, ST_PRODUCT_RESTOCK,
    ST_PRODUCT_GEN,
    ST_USER_UNITS,
    ST_ORDER_INSERT_GEN, ST_ORDER_INSERT_ANY, ST_HOLD_INSERT, ST_ADD_SOLD, ST_ORDER_GET,
    ST_ORDER_BY_KEY,
    ST_ORDER_EXISTS, ST_VOID_EXISTS, ST_VOID_INSERT,
    ST_ORDER_UNITS, ST_HELD_UNITS, ST_PRODUCT_REPAIR,
    ST_TAKE_CONDITIONAL, ST_TAKE_VERSIONED, ST_USER_ORDERS, ST_USER_SUM, ST_USER_ADD, ST_STOCK_READ,
    ST_RESTOCK_GET, ST_RESTOCK_INSERT, ST_PROBE, ST_GEN_READ,
    ST_BEGIN, ST_COMMIT, ST_ROLLBACK,
    ST_LOCK_FIRST,              /* the lock table's (db_lock_sql), DB_LOCK_ST_* from here */
    ST_HOLDS_FIRST = ST_LOCK_FIRST + DB_LOCK_ST_COUNT,   /* holds.c's, DB_HOLDS_ST_* */
    ST_COUNT = ST_HOLDS_FIRST + DB_HOLDS_ST_COUNT
};

/* An order as read: its row and, for a hold, its hold's (read_order). */
#define ORDER_COLUMNS                                                                      \
    "SELECT o.order_id,o.sku,o.user_id,o.quantity,coalesce(o.idempotency_key,''),"         \
    "o.created_at,coalesce(h.state,'confirmed'),coalesce(h.expires_ms,0),"                 \
    "coalesce(h.decided_ms,0),coalesce(h.payment_ref,'')"                                  \
    " FROM orders o LEFT JOIN holds h ON h.order_id=o.order_id"

static const char *const SQL[ST_LOCK_FIRST] = {
    [ST_PRODUCT_INSERT] =
        "INSERT INTO products(sku,name,strategy,segments,per_user_limit,stock_initial,"
        "sold,stock_gen,db_available,db_version,cs_delay_ms,lock_ttl_ms,created_at,"
        "hold_seconds,held,cs_overlap)"
        " VALUES(?1,?2,?3,?4,?5,?6,0,1,?6,0,?7,?8,?9,?10,0,?11)",
    [ST_PRODUCT_GET] =
        "SELECT sku,name,strategy,segments,per_user_limit,stock_initial,sold,stock_gen,"
        "db_available,db_version,cs_delay_ms,lock_ttl_ms,created_at,hold_seconds,held,"
        "cs_overlap"
        " FROM products WHERE sku=?1",
    [ST_PRODUCT_ALL] =
        "SELECT sku,name,strategy,segments,per_user_limit,stock_initial,sold,stock_gen,"
        "db_available,db_version,cs_delay_ms,lock_ttl_ms,created_at,hold_seconds,held,"
        "cs_overlap"
        " FROM products ORDER BY sku",
    [ST_PRODUCT_RESTOCK] =
        "UPDATE products SET stock_initial=stock_initial+?2, db_available=db_available+?2"
        " WHERE sku=?1",
    [ST_PRODUCT_GEN] =
        "UPDATE products SET stock_gen=max(stock_gen,?2)+1 WHERE sku=?1",
    [ST_USER_UNITS] =
        "SELECT o.user_id, sum(o.quantity) FROM orders o WHERE o.sku=?1 AND NOT EXISTS("
        "SELECT 1 FROM holds h WHERE h.order_id=o.order_id"
        " AND h.state IN ('cancelled','expired')) GROUP BY o.user_id",
    /* The generation check and the tombstone check are part of the insert
     * itself, so no window exists between checking and writing. */
    [ST_ORDER_INSERT_GEN] =
        "INSERT INTO orders(order_id,sku,user_id,quantity,idempotency_key,created_at)"
        " SELECT ?1,?2,?3,?4,?5,?6"
        " WHERE EXISTS(SELECT 1 FROM products WHERE sku=?2 AND stock_gen=?7)"
        " AND NOT EXISTS(SELECT 1 FROM voided_orders WHERE order_id=?1)",
    [ST_ORDER_INSERT_ANY] =
        "INSERT INTO orders(order_id,sku,user_id,quantity,idempotency_key,created_at)"
        " SELECT ?1,?2,?3,?4,?5,?6"
        " WHERE NOT EXISTS(SELECT 1 FROM voided_orders WHERE order_id=?1)",
    [ST_HOLD_INSERT] =
        "INSERT INTO holds(order_id,sku,quantity,gen,takes,in_db,expires_ms,state)"
        " VALUES(?1,?2,?3,?4,?5,?7,?6,'reserved')",
    [ST_ADD_SOLD] = "UPDATE products SET sold=sold+?2, held=held+?3 WHERE sku=?1",
    [ST_ORDER_GET] = ORDER_COLUMNS " WHERE o.order_id=?1",
    [ST_ORDER_BY_KEY] = ORDER_COLUMNS " WHERE o.idempotency_key=?1",
    [ST_ORDER_EXISTS] = "SELECT 1 FROM orders WHERE order_id=?1",
    [ST_VOID_EXISTS] = "SELECT 1 FROM voided_orders WHERE order_id=?1",
    [ST_VOID_INSERT] =
        "INSERT OR IGNORE INTO voided_orders(order_id,sku,reason,voided_at)"
        " VALUES(?1,?2,?3,strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
    [ST_TAKE_CONDITIONAL] =
        "UPDATE products SET db_available=db_available-?2, db_version=db_version+1"
        " WHERE sku=?1 AND db_available>=?2",
    [ST_ORDER_UNITS] =
        "SELECT coalesce(sum(o.quantity),0) FROM orders o LEFT JOIN holds h"
        " ON h.order_id=o.order_id WHERE o.sku=?1 AND (h.state IS NULL OR h.state='confirmed')",
    [ST_HELD_UNITS] =
        "SELECT coalesce(sum(quantity),0) FROM holds WHERE sku=?1 AND state='reserved'",
    [ST_PRODUCT_REPAIR] = "UPDATE products SET sold=?2, db_available=?3, held=?4 WHERE sku=?1",
    [ST_TAKE_VERSIONED] =
        "UPDATE products SET db_available=db_available-?2, db_version=db_version+1"
        " WHERE sku=?1 AND db_available>=?2 AND db_version=?3",
    [ST_STOCK_READ] = "SELECT db_available, db_version FROM products WHERE sku=?1",
    [ST_USER_ORDERS] =
        "SELECT coalesce(sum(o.quantity),0) FROM orders o WHERE o.sku=?1 AND o.user_id=?2"
        " AND NOT EXISTS(SELECT 1 FROM holds h WHERE h.order_id=o.order_id"
        " AND h.state IN ('cancelled','expired'))",
    [ST_USER_SUM] =
        "SELECT coalesce((SELECT units FROM user_units WHERE sku=?1 AND user_id=?2),0)",
    [ST_USER_ADD] =
        "INSERT INTO user_units(sku,user_id,units) VALUES(?1,?2,?3)"
        " ON CONFLICT(sku,user_id) DO UPDATE SET units=units+excluded.units",
    [ST_RESTOCK_GET] = "SELECT sku, quantity FROM restocks WHERE idempotency_key=?1",
    [ST_RESTOCK_INSERT] =
        "INSERT INTO restocks(idempotency_key,sku,quantity,created_at)"
        " VALUES(?1,?2,?3,strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
    [ST_PROBE] =
        "INSERT OR REPLACE INTO meta(key,value)"
        " VALUES('health_probe',strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
    [ST_GEN_READ] = "SELECT stock_gen FROM products WHERE sku=?1",
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
};

/* What a write transaction owes the products table: the units of the
 * orders it inserted (added at commit, once per SKU), and the generation
 * each SKU has (read once: the transaction holds the write lock, so it
 * cannot change under it). */
#define TALLY_MAX 32

typedef struct sku_tally {
    char sku[DB_SKU_MAX + 1];
    long long gen;
    long long sold;
    long long held;
} sku_tally;

struct db {
    sqlite3 *conn;
    sqlite3_stmt *st[ST_COUNT];
    /* Statements a callback walk is stepping through. Taking one of them
     * again (stmt() resets it) would restart the outer walk: that is how
     * `audit --repair` once audited products twice and never ended. */
    unsigned char walking[ST_COUNT];
    sku_tally tally[TALLY_MAX];
    int ntally;
    char errstr[256];
};

db_status db_fail(db *d, const char *what) {
    int code = sqlite3_extended_errcode(d->conn);
    snprintf(d->errstr, sizeof d->errstr, "%s: %s", what, sqlite3_errmsg(d->conn));
    return (code & 0xff) == SQLITE_BUSY || (code & 0xff) == SQLITE_LOCKED ? DB_BUSY : DB_ERROR;
}

const char *db_errstr(const db *d) { return d->errstr; }

long long db_memory_used(void) { return (long long)sqlite3_memory_used(); }

db_status db_ping(db *d) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(d->conn, "SELECT count(*) FROM products", -1, &s, NULL) != SQLITE_OK)
        return db_fail(d, "ping");
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_ROW ? DB_OK : db_fail(d, "ping");
}

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

db *db_open(const char *path, const db_options *opt, char *err, size_t errlen) {
    db *d = calloc(1, sizeof *d);
    char pragmas[160];
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int flags = opt->readonly ? SQLITE_OPEN_READONLY
                              : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    if (sqlite3_open_v2(path, &d->conn, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "open %s: %s", path, sqlite3_errmsg(d->conn));
        goto err;
    }
    sqlite3_busy_timeout(d->conn, opt->busy_timeout_ms > 0 ? opt->busy_timeout_ms : 2000);
    snprintf(pragmas, sizeof pragmas, "PRAGMA synchronous=%s; PRAGMA foreign_keys=OFF;",
             opt->synchronous_full ? "FULL" : "NORMAL");
    if (!opt->readonly) {
        /* WAL: readers never wait for the writer, and a commit is one
         * append + fsync of the log. */
        if (db_exec(d->conn, "PRAGMA journal_mode=WAL", err, errlen)) goto err;
        if (db_migrate(d->conn, err, errlen)) goto err;
    } else if (db_user_version(d->conn) != DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "%s is not a flashsale database (schema version %d)", path,
                 db_user_version(d->conn));
        goto err;
    }
    if (db_exec(d->conn, pragmas, err, errlen)) goto err;
    for (int i = 0; i < ST_COUNT; i++) {
        if (opt->readonly && i != ST_PRODUCT_GET && i != ST_PRODUCT_ALL &&
            i != ST_ORDER_GET && i != ST_ORDER_BY_KEY && i != ST_ORDER_EXISTS &&
            i != ST_VOID_EXISTS && i != ST_USER_UNITS && i != ST_STOCK_READ &&
            i != ST_ORDER_UNITS && i != ST_HELD_UNITS &&
            i != ST_HOLDS_FIRST + DB_HOLDS_ST_OWED_UNITS)
            continue;
        const char *sql = i < ST_LOCK_FIRST    ? SQL[i]
                        : i < ST_HOLDS_FIRST ? db_lock_sql[i - ST_LOCK_FIRST]
                                             : db_holds_sql[i - ST_HOLDS_FIRST];
        if (sqlite3_prepare_v3(d->conn, sql, -1, SQLITE_PREPARE_PERSISTENT, &d->st[i],
                               NULL) != SQLITE_OK) {
            snprintf(err, errlen, "prepare: %s", sqlite3_errmsg(d->conn));
            goto err;
        }
    }
    return d;
err:
    if (!opt->readonly) explain_open_failure(path, err, errlen);
    db_close(d);
    return NULL;
}

void db_close(db *d) {
    if (!d) return;
    for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(d->st[i]);
    sqlite3_close(d->conn);
    free(d);
}

/* Returns statement i reset and with its bindings cleared. Never one that
 * a walk is still stepping through: no nested walks over one statement. */
static sqlite3_stmt *stmt(db *d, int i) {
    sqlite3_stmt *s = d->st[i];
    assert(s != NULL);
    assert(!d->walking[i]);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return s;
}

sqlite3_stmt *db_lock_stmt(db *d, db_lock_st id) {
    assert(id >= 0 && id < DB_LOCK_ST_COUNT);
    return stmt(d, ST_LOCK_FIRST + (int)id);
}

sqlite3_stmt *db_holds_stmt(db *d, db_holds_st id) {
    assert(id >= 0 && id < DB_HOLDS_ST_COUNT);
    return stmt(d, ST_HOLDS_FIRST + (int)id);
}

sqlite3 *db_conn(db *d) { return d->conn; }

db_status db_error(db *d, const char *msg) {
    snprintf(d->errstr, sizeof d->errstr, "%s", msg);
    return DB_ERROR;
}

static void bind_text(sqlite3_stmt *s, int i, const char *v) {
    if (v && *v) sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, i);
}

static void copy_col(char *dst, size_t cap, sqlite3_stmt *s, int col) {
    const unsigned char *t = sqlite3_column_text(s, col);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

db_status db_step_done(db *d, sqlite3_stmt *s, const char *what) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc == SQLITE_DONE) return DB_OK;
    if ((rc & 0xff) == SQLITE_CONSTRAINT) {
        snprintf(d->errstr, sizeof d->errstr, "%s: %s", what, sqlite3_errmsg(d->conn));
        return DB_EXISTS;
    }
    return db_fail(d, what);
}

db_status db_begin(db *d) {
    d->ntally = 0;
    return db_step_done(d, stmt(d, ST_BEGIN), "begin");
}

static db_status update_product(db *d, int st_id, const char *sku, long long qty,
                                const char *what);

static db_status add_units(db *d, const char *sku, long long sold, long long held);

/* Adds the tallied units to products.sold and held, once per SKU. */
static db_status flush_tally(db *d) {
    for (int i = 0; i < d->ntally; i++) {
        if (!d->tally[i].sold && !d->tally[i].held) continue;
        db_status st = add_units(d, d->tally[i].sku, d->tally[i].sold, d->tally[i].held);
        if (st != DB_OK) return st == DB_NOTFOUND ? DB_ERROR : st;
        d->tally[i].sold = d->tally[i].held = 0;
    }
    return DB_OK;
}

db_status db_commit(db *d) {
    db_status st = flush_tally(d);
    d->ntally = 0;
    if (st != DB_OK) return st;
    return db_step_done(d, stmt(d, ST_COMMIT), "commit");
}

void db_rollback(db *d) {
    d->ntally = 0;
    if (!sqlite3_get_autocommit(d->conn)) db_step_done(d, stmt(d, ST_ROLLBACK), "rollback");
}

/* ----------------------------------------------------------------- products */

static void read_product(sqlite3_stmt *s, db_product *p) {
    memset(p, 0, sizeof *p);
    copy_col(p->sku, sizeof p->sku, s, 0);
    copy_col(p->name, sizeof p->name, s, 1);
    copy_col(p->strategy, sizeof p->strategy, s, 2);
    p->segments = sqlite3_column_int(s, 3);
    p->per_user_limit = sqlite3_column_int64(s, 4);
    p->stock_initial = sqlite3_column_int64(s, 5);
    p->sold = sqlite3_column_int64(s, 6);
    p->stock_gen = sqlite3_column_int64(s, 7);
    p->db_available = sqlite3_column_int64(s, 8);
    p->db_version = sqlite3_column_int64(s, 9);
    p->cs_delay_ms = sqlite3_column_int(s, 10);
    p->lock_ttl_ms = sqlite3_column_int(s, 11);
    copy_col(p->created_at, sizeof p->created_at, s, 12);
    p->hold_seconds = sqlite3_column_int(s, 13);
    p->held = sqlite3_column_int64(s, 14);
    p->cs_overlap = sqlite3_column_int(s, 15);
}

db_status db_product_insert(db *d, const db_product *p) {
    sqlite3_stmt *s = stmt(d, ST_PRODUCT_INSERT);
    assert(p->stock_initial >= 0 && p->segments >= 1);
    sqlite3_bind_text(s, 1, p->sku, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, p->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, p->strategy, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 4, p->segments);
    sqlite3_bind_int64(s, 5, p->per_user_limit);
    sqlite3_bind_int64(s, 6, p->stock_initial);
    sqlite3_bind_int(s, 7, p->cs_delay_ms);
    sqlite3_bind_int(s, 8, p->lock_ttl_ms);
    sqlite3_bind_text(s, 9, p->created_at, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 10, p->hold_seconds);
    sqlite3_bind_int(s, 11, p->cs_overlap);
    return db_step_done(d, s, "insert product");
}

db_status db_product_get(db *d, const char *sku, db_product *out) {
    sqlite3_stmt *s = stmt(d, ST_PRODUCT_GET);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        read_product(s, out);
        sqlite3_reset(s);
        return DB_OK;
    }
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "get product");
}

db_status db_product_list(db *d, db_product **out, size_t *n) {
    sqlite3_stmt *s = stmt(d, ST_PRODUCT_ALL);
    db_product *v = NULL;
    size_t cap = 0;
    int rc;
    *out = NULL;
    *n = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            db_product *w = realloc(v, cap * sizeof *w);
            if (!w) {
                sqlite3_reset(s);
                free(v);
                snprintf(d->errstr, sizeof d->errstr, "list products: out of memory");
                return DB_ERROR;
            }
            v = w;
        }
        read_product(s, &v[(*n)++]);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        free(v);
        *n = 0;
        return db_fail(d, "list products");
    }
    *out = v;
    return DB_OK;
}

static db_status update_product(db *d, int st_id, const char *sku, long long qty,
                                const char *what) {
    sqlite3_stmt *s = stmt(d, st_id);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, qty);
    db_status st = db_step_done(d, s, what);
    if (st == DB_OK && sqlite3_changes(d->conn) == 0) return DB_NOTFOUND;
    return st;
}

/* Looks up a restock by key: DB_OK (and its sku and quantity), DB_NOTFOUND
 * or an error. */
static db_status restock_by_key(db *d, const char *key, char *sku, size_t skulen,
                                long long *qty) {
    sqlite3_stmt *s = stmt(d, ST_RESTOCK_GET);
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        copy_col(sku, skulen, s, 0);
        *qty = sqlite3_column_int64(s, 1);
    }
    sqlite3_reset(s);
    if (rc == SQLITE_ROW) return DB_OK;
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "read restock");
}

db_status db_product_restock(db *d, const char *sku, long long qty, const char *idem_key,
                             db_product *out, int *replayed) {
    char prior_sku[DB_SKU_MAX + 1];
    long long prior_qty = 0;
    *replayed = 0;
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    if (idem_key && idem_key[0]) {
        st = restock_by_key(d, idem_key, prior_sku, sizeof prior_sku, &prior_qty);
        if (st == DB_OK) {
            *replayed = 1;
            st = strcmp(prior_sku, sku) || prior_qty != qty ? DB_DUPKEY : DB_OK;
            if (st == DB_OK) st = db_product_get(d, sku, out);
            db_rollback(d);                   /* nothing was written */
            return st;
        }
        if (st == DB_NOTFOUND) {
            sqlite3_stmt *s = stmt(d, ST_RESTOCK_INSERT);
            sqlite3_bind_text(s, 1, idem_key, -1, SQLITE_STATIC);
            sqlite3_bind_text(s, 2, sku, -1, SQLITE_STATIC);
            sqlite3_bind_int64(s, 3, qty);
            st = db_step_done(d, s, "record restock");
        }
    }
    if (st == DB_OK) st = update_product(d, ST_PRODUCT_RESTOCK, sku, qty, "restock");
    if (st == DB_OK) st = db_product_get(d, sku, out);
    if (st != DB_OK) {
        db_rollback(d);
        return st;
    }
    /* A COMMIT that fails may still have reached the log. */
    if ((st = db_commit(d)) != DB_OK) {
        db_rollback(d);
        return DB_UNKNOWN;
    }
    return DB_OK;
}

db_status db_restock_state(db *d, const char *idem_key) {
    char sku[DB_SKU_MAX + 1];
    long long qty;
    return restock_by_key(d, idem_key, sku, sizeof sku, &qty);
}

db_status db_probe(db *d) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    st = db_step_done(d, stmt(d, ST_PROBE), "probe");
    if (st == DB_OK) st = db_commit(d);
    if (st != DB_OK) db_rollback(d);
    return st;
}

db_status db_product_new_gen(db *d, const char *sku, long long min_gen, db_product *out,
                             int (*user_fn)(const char *user, long long units, void *ud),
                             void *ud) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    st = update_product(d, ST_PRODUCT_GEN, sku, min_gen, "new generation");
    if (st == DB_OK) st = db_product_get(d, sku, out);
    /* In the same transaction: a hold cancelled after it is owed to the new
     * copy, and its return takes its units off the buyer's count there. */
    if (st == DB_OK && user_fn) st = db_user_units(d, sku, user_fn, ud);
    if (st == DB_OK) st = db_commit(d);
    if (st != DB_OK) db_rollback(d);
    return st;
}

db_status db_user_units(db *d, const char *sku,
                        int (*fn)(const char *user, long long units, void *ud), void *ud) {
    sqlite3_stmt *s = stmt(d, ST_USER_UNITS);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    int rc;
    d->walking[ST_USER_UNITS] = 1;             /* fn must not walk it again */
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        if (fn((const char *)sqlite3_column_text(s, 0), sqlite3_column_int64(s, 1), ud)) break;
    d->walking[ST_USER_UNITS] = 0;
    sqlite3_reset(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? DB_OK : db_fail(d, "user units");
}

/* ------------------------------------------------------------------- orders */

static void read_order(sqlite3_stmt *s, db_order *o) {
    memset(o, 0, sizeof *o);
    copy_col(o->order_id, sizeof o->order_id, s, 0);
    copy_col(o->sku, sizeof o->sku, s, 1);
    copy_col(o->user_id, sizeof o->user_id, s, 2);
    o->quantity = sqlite3_column_int(s, 3);
    copy_col(o->idem_key, sizeof o->idem_key, s, 4);
    copy_col(o->created_at, sizeof o->created_at, s, 5);
    int st = db_order_status_parse((const char *)sqlite3_column_text(s, 6));
    o->status = st < 0 ? DB_ORDER_CONFIRMED : (db_order_status)st;
    o->expires_ms = sqlite3_column_int64(s, 7);
    o->decided_ms = sqlite3_column_int64(s, 8);
    copy_col(o->payment_ref, sizeof o->payment_ref, s, 9);
}

static const char *const STATUS_NAMES[] = { "confirmed", "reserved", "cancelled", "expired" };

const char *db_order_status_name(db_order_status s) {
    assert(s >= DB_ORDER_CONFIRMED && s <= DB_ORDER_EXPIRED);
    return STATUS_NAMES[s];
}

int db_order_status_parse(const char *name) {
    for (int i = DB_ORDER_CONFIRMED; name && i <= DB_ORDER_EXPIRED; i++)
        if (!strcmp(name, STATUS_NAMES[i])) return i;
    return -1;
}

static db_status get_one_order(db *d, int st_id, const char *arg, db_order *out) {
    sqlite3_stmt *s = stmt(d, st_id);
    sqlite3_bind_text(s, 1, arg, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) read_order(s, out);
    sqlite3_reset(s);
    if (rc == SQLITE_ROW) return DB_OK;
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "get order");
}

db_status db_order_get(db *d, const char *order_id, db_order *out) {
    return get_one_order(d, ST_ORDER_GET, order_id, out);
}

db_status db_order_by_key(db *d, const char *idem_key, db_order *out) {
    return get_one_order(d, ST_ORDER_BY_KEY, idem_key, out);
}

db_status db_order_list(db *d, const char *sku, const char *user_id, int status,
                        const char *after, int limit, void (*fn)(const db_order *o, void *ud),
                        void *ud, int *more) {
    /* Shapes of one query; each uses an index ending in order_id. */
    char sql[640];
    snprintf(sql, sizeof sql, ORDER_COLUMNS " WHERE 1%s%s%s%s ORDER BY o.order_id LIMIT ?4",
             sku ? " AND o.sku=?1" : "", user_id ? " AND o.user_id=?2" : "",
             after ? " AND o.order_id>?3" : "",
             status < 0 ? "" : " AND coalesce(h.state,'confirmed')=?5");
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(d->conn, sql, -1, &s, NULL) != SQLITE_OK)
        return db_fail(d, "list orders");
    bind_text(s, 1, sku);
    bind_text(s, 2, user_id);
    bind_text(s, 3, after);
    sqlite3_bind_int(s, 4, limit + 1);
    if (status >= 0)
        sqlite3_bind_text(s, 5, db_order_status_name((db_order_status)status), -1, SQLITE_STATIC);
    db_order o;
    int rc, n = 0;
    *more = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == limit) {
            *more = 1;
            break;
        }
        read_order(s, &o);
        fn(&o, ud);
        n++;
    }
    db_status st = rc == SQLITE_ROW || rc == SQLITE_DONE ? DB_OK : db_fail(d, "list orders");
    sqlite3_finalize(s);
    return st;
}

static int exists(db *d, int st_id, const char *order_id, int *found) {
    sqlite3_stmt *s = stmt(d, st_id);
    sqlite3_bind_text(s, 1, order_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    *found = rc == SQLITE_ROW;
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

db_status db_order_state(db *d, const char *order_id) {
    int found;
    if (exists(d, ST_ORDER_EXISTS, order_id, &found)) return db_fail(d, "order state");
    if (found) return DB_OK;
    if (exists(d, ST_VOID_EXISTS, order_id, &found)) return db_fail(d, "order state");
    return found ? DB_STALE : DB_NOTFOUND;
}

db_status db_order_void(db *d, const char *order_id, const char *sku, const char *reason) {
    db_status st = db_begin(d);
    int found;
    if (st != DB_OK) return st;
    if (exists(d, ST_ORDER_EXISTS, order_id, &found)) {
        st = db_fail(d, "void order");
    } else if (found) {
        st = DB_EXISTS;
    } else {
        sqlite3_stmt *s = stmt(d, ST_VOID_INSERT);
        sqlite3_bind_text(s, 1, order_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, sku, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, reason, -1, SQLITE_STATIC);
        st = db_step_done(d, s, "void order");
    }
    if (st != DB_OK) {
        db_rollback(d);
        return st;
    }
    return db_commit(d);
}

static db_status scalar(db *d, int st_id, const char *sku, const char *user, long long *out) {
    sqlite3_stmt *s = stmt(d, st_id);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    if (user) sqlite3_bind_text(s, 2, user, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(s, 0);
    sqlite3_reset(s);
    if (rc == SQLITE_ROW) return DB_OK;
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "read");
}

/* Takes the stock of a db-strategy order inside the writer's transaction.
 * The conditional UPDATE is the whole check: it changes no row when fewer
 * than qty units are left (or, optimistic, when the version moved since the
 * caller read it), so no read-then-write window exists in here. */
static db_status take_stock(db *d, const db_order *o, db_take take, long long per_user_limit,
                            long long expect_version, long long *available) {
    db_status st;
    db_order prior;
    /* A replay is a replay before it is anything else (over the limit, or
     * sold out since): look the key up first. */
    if (o->idem_key[0]) {
        st = get_one_order(d, ST_ORDER_BY_KEY, o->idem_key, &prior);
        if (st == DB_OK) return DB_DUPKEY;
        if (st != DB_NOTFOUND) return st;
    }
    if (per_user_limit > 0) {
        long long bought = 0;
        if ((st = scalar(d, ST_USER_SUM, o->sku, o->user_id, &bought)) != DB_OK) return st;
        if (bought + o->quantity > per_user_limit) {
            *available = bought;
            return DB_LIMIT;
        }
    }
    /* Counted before the take: a refusal below rolls back the savepoint. */
    if (per_user_limit > 0) {
        sqlite3_stmt *u = stmt(d, ST_USER_ADD);
        sqlite3_bind_text(u, 1, o->sku, -1, SQLITE_STATIC);
        sqlite3_bind_text(u, 2, o->user_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(u, 3, o->quantity);
        if ((st = db_step_done(d, u, "count the buyer's units")) != DB_OK) return st;
    }
    sqlite3_stmt *s = stmt(d, take == DB_TAKE_OPTIMISTIC ? ST_TAKE_VERSIONED : ST_TAKE_CONDITIONAL);
    sqlite3_bind_text(s, 1, o->sku, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, o->quantity);
    if (take == DB_TAKE_OPTIMISTIC) sqlite3_bind_int64(s, 3, expect_version);
    st = db_step_done(d, s, "take stock");
    if (st != DB_OK) return st;
    int changed = sqlite3_changes(d->conn) > 0;
    long long version = 0;
    sqlite3_stmt *r = stmt(d, ST_STOCK_READ);
    sqlite3_bind_text(r, 1, o->sku, -1, SQLITE_STATIC);
    int rc = sqlite3_step(r);
    if (rc == SQLITE_ROW) {
        *available = sqlite3_column_int64(r, 0);
        version = sqlite3_column_int64(r, 1);
    }
    sqlite3_reset(r);
    if (rc != SQLITE_ROW) return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "read stock");
    if (changed) return DB_OK;
    if (*available < o->quantity) return DB_NOSTOCK;
    return take == DB_TAKE_OPTIMISTIC && version != expect_version ? DB_CONFLICT : DB_NOSTOCK;
}

db_status db_order_units(db *d, const char *sku, long long *sold, long long *held) {
    db_status st = scalar(d, ST_ORDER_UNITS, sku, NULL, sold);
    return st == DB_OK ? scalar(d, ST_HELD_UNITS, sku, NULL, held) : st;
}

db_status db_product_repair(db *d, const char *sku, long long sold, long long held,
                            long long db_available) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    sqlite3_stmt *s = stmt(d, ST_PRODUCT_REPAIR);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, sold);
    sqlite3_bind_int64(s, 3, db_available);
    sqlite3_bind_int64(s, 4, held);
    st = db_step_done(d, s, "repair product");
    if (st == DB_OK) return db_commit(d);
    db_rollback(d);
    return st;
}

db_status db_stock_read(db *d, const char *sku, long long *available, long long *version) {
    sqlite3_stmt *r = stmt(d, ST_STOCK_READ);
    sqlite3_bind_text(r, 1, sku, -1, SQLITE_STATIC);
    int rc = sqlite3_step(r);
    if (rc == SQLITE_ROW) {
        *available = sqlite3_column_int64(r, 0);
        *version = sqlite3_column_int64(r, 1);
    }
    sqlite3_reset(r);
    if (rc == SQLITE_ROW) return DB_OK;
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, "read stock");
}

/* The tally of sku in this transaction (its generation read on first
 * use), or NULL when full or on error (*st says which). */
static sku_tally *tally_of(db *d, const char *sku, db_status *st) {
    *st = DB_OK;
    for (int i = 0; i < d->ntally; i++)
        if (!strcmp(d->tally[i].sku, sku)) return &d->tally[i];
    if (d->ntally == TALLY_MAX) return NULL;
    sqlite3_stmt *s = stmt(d, ST_GEN_READ);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    long long gen = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        *st = db_fail(d, "read generation");
        return NULL;
    }
    sku_tally *t = &d->tally[d->ntally++];
    snprintf(t->sku, sizeof t->sku, "%s", sku);
    t->gen = gen;                              /* -1: no such product: every order stale */
    t->sold = t->held = 0;
    return t;
}

/* The hold row of order o (a reserved hold); in_db: its units came from
 * products.db_available. */
static db_status insert_hold(db *d, const db_order *o, int in_db) {
    sqlite3_stmt *s = stmt(d, ST_HOLD_INSERT);
    sqlite3_bind_text(s, 1, o->order_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, o->sku, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, o->quantity);
    sqlite3_bind_int64(s, 4, o->gen);
    sqlite3_bind_text(s, 5, o->takes ? o->takes : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 6, o->expires_ms);
    sqlite3_bind_int(s, 7, in_db);
    return db_step_done(d, s, "insert hold");
}

static db_status add_units(db *d, const char *sku, long long sold, long long held) {
    sqlite3_stmt *s = stmt(d, ST_ADD_SOLD);
    sqlite3_bind_text(s, 1, sku, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, sold);
    sqlite3_bind_int64(s, 3, held);
    db_status st = db_step_done(d, s, "count units");
    if (st == DB_OK && sqlite3_changes(d->conn) == 0) return DB_NOTFOUND;
    return st;
}

db_status db_order_insert(db *d, const db_order *o, db_take take, long long per_user_limit,
                          long long expect_version, long long *available_out) {
    db_status st;
    long long available = -1;
    /* A savepoint lets a per-order refusal undo this order's stock update
     * without ending the group's transaction. */
    if (take != DB_TAKE_NONE) {
        if (sqlite3_exec(d->conn, "SAVEPOINT o", NULL, NULL, NULL) != SQLITE_OK)
            return db_fail(d, "savepoint");
        st = take_stock(d, o, take, per_user_limit, expect_version, &available);
        if (available_out) *available_out = available;
        if (st != DB_OK) goto undo;
    }
    /* Reserved in Redis: the generation is checked against the tally (one
     * read per SKU per transaction), and sold added at commit. When the
     * tally is full, the per-order statement checks it instead. */
    sku_tally *t = NULL;
    if (take == DB_TAKE_NONE && per_user_limit > 0) {
        /* Reserved in Redis where no one script saw the buyer's other
         * orders (a product spread over a cluster's slots): the limit is
         * checked here, against the committed orders that count. */
        long long bought = 0;
        if ((st = scalar(d, ST_USER_ORDERS, o->sku, o->user_id, &bought)) != DB_OK) return st;
        if (bought + o->quantity > per_user_limit) {
            if (available_out) *available_out = bought;
            return DB_LIMIT;
        }
    }
    if (take == DB_TAKE_NONE && !sqlite3_get_autocommit(d->conn)) {
        t = tally_of(d, o->sku, &st);
        if (st != DB_OK) return st;
        if (t && t->gen != o->gen) return DB_STALE;
    }
    sqlite3_stmt *s = stmt(d, take == DB_TAKE_NONE && !t ? ST_ORDER_INSERT_GEN : ST_ORDER_INSERT_ANY);
    sqlite3_bind_text(s, 1, o->order_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, o->sku, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, o->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 4, o->quantity);
    bind_text(s, 5, o->idem_key);
    sqlite3_bind_text(s, 6, o->created_at, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 7, o->gen);
    st = db_step_done(d, s, "insert order");
    if (st == DB_EXISTS)
        st = strstr(d->errstr, "idempotency_key") ? DB_DUPKEY : DB_STALE;
    else if (st == DB_OK && sqlite3_changes(d->conn) == 0)
        st = DB_STALE;
    /* The row is in; failing to record or count it would break sold ==
     * sum(orders), so that is an error that aborts the whole group. */
    int hold = o->expires_ms > 0;
    if (st == DB_OK && hold && insert_hold(d, o, take != DB_TAKE_NONE) != DB_OK) return DB_ERROR;
    if (st == DB_OK && t) {
        if (hold) t->held += o->quantity;
        else t->sold += o->quantity;
    } else if (st == DB_OK &&
               add_units(d, o->sku, hold ? 0 : o->quantity, hold ? o->quantity : 0) != DB_OK) {
        return DB_ERROR;
    }
    if (st != DB_OK) goto undo;
    if (take != DB_TAKE_NONE && sqlite3_exec(d->conn, "RELEASE o", NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(d, "release");
    return DB_OK;
undo:
    if (take != DB_TAKE_NONE)
        sqlite3_exec(d->conn, "ROLLBACK TO o; RELEASE o", NULL, NULL, NULL);
    return st;
}

void db_format_time(int64_t wall_ms, char out[DB_TIME_LEN + 1]) {
    /* Every order gets a timestamp: the date and time up to the second are
     * formatted once per second and thread, the milliseconds each time. */
    static __thread int64_t cached_secs = -1;
    static __thread char cached[DB_TIME_LEN + 1];
    int64_t secs = wall_ms / 1000, ms = wall_ms % 1000;
    if (secs != cached_secs) {
        time_t t = (time_t)secs;
        struct tm tm;
        char tmp[64];
        gmtime_r(&t, &tm);
        snprintf(tmp, sizeof tmp, "%04d-%02d-%02dT%02d:%02d:%02d.000Z", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        memcpy(cached, tmp, DB_TIME_LEN);
        cached[DB_TIME_LEN] = '\0';
        cached_secs = secs;
    }
    memcpy(out, cached, DB_TIME_LEN + 1);
    out[20] = (char)('0' + ms / 100);          /* "YYYY-MM-DDTHH:MM:SS.mmmZ" */
    out[21] = (char)('0' + ms / 10 % 10);
    out[22] = (char)('0' + ms % 10);
}
