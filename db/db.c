/* db.c: products and orders, the statements' table, and the calls every
 * file of the module makes to run a statement through its connection's
 * driver. See db.h, and db_int.h for the driver.
 *
 * db_open picks the driver by the target it is given (the first in
 * DRIVERS that claims it) and lets it open, migrate and prepare;
 * everything else here is written once, in SQL every dialect takes, and
 * what the dialects word apart is each driver's (db_driver.sql). */
#include "db/db.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db/db_int.h"

/* An order as read: its row and, for a hold, its hold's (read_order). */
#define ORDER_COLUMNS                                                                      \
    "SELECT o.order_id,o.sku,o.user_id,o.quantity,coalesce(o.idempotency_key,''),"         \
    "o.created_at,coalesce(h.state,'confirmed'),coalesce(h.expires_ms,0),"                 \
    "coalesce(h.decided_ms,0),coalesce(h.payment_ref,'')"                                  \
    " FROM orders o LEFT JOIN holds h ON h.order_id=o.order_id"

/* A product's sold and held are its row's and its tallies' (schema.c,
 * version 8). */
#define TALLIED(col)                                                                       \
    "p." col "+coalesce((SELECT sum(t." col ") FROM product_tallies t WHERE t.sku=p.sku),0)"
#define PRODUCT_COLUMNS                                                                    \
    "SELECT p.sku,p.name,p.strategy,p.segments,p.per_user_limit,p.stock_initial,"          \
    TALLIED("sold") ",p.stock_gen,p.db_available,p.db_version,p.cs_delay_ms,"             \
    "p.lock_ttl_ms,p.created_at,p.hold_seconds," TALLIED("held") ",p.cs_overlap,"          \
    "p.room_turn_ms,p.room_rate,p.room_opens_ms FROM products p"

static const char *const SQL[DB_ST_LOCK_FIRST] = {
    [DB_ST_PRODUCT_INSERT] =
        "INSERT INTO products(sku,name,strategy,segments,per_user_limit,stock_initial,"
        "sold,stock_gen,db_available,db_version,cs_delay_ms,lock_ttl_ms,created_at,"
        "hold_seconds,held,cs_overlap,room_turn_ms,room_rate,room_opens_ms)"
        " VALUES(?1,?2,?3,?4,?5,?6,0,1,?6,0,?7,?8,?9,?10,0,?11,?12,?13,?14)",
    [DB_ST_PRODUCT_GET] = PRODUCT_COLUMNS " WHERE p.sku=?1",
    [DB_ST_PRODUCT_ALL] = PRODUCT_COLUMNS " ORDER BY p.sku",
    [DB_ST_PRODUCT_RESTOCK] =
        "UPDATE products SET stock_initial=stock_initial+?2, db_available=db_available+?2"
        " WHERE sku=?1",
    [DB_ST_USER_UNITS] =
        "SELECT o.user_id, sum(o.quantity) FROM orders o WHERE o.sku=?1 AND NOT EXISTS("
        "SELECT 1 FROM holds h WHERE h.order_id=o.order_id"
        " AND h.state IN ('cancelled','expired')) GROUP BY o.user_id",
    /* The generation check and the tombstone check are part of the insert
     * itself, so no window exists between checking and writing. */
    [DB_ST_ORDER_INSERT_GEN] =
        "INSERT INTO orders(order_id,sku,user_id,quantity,idempotency_key,created_at)"
        " SELECT ?1,?2,?3,?4,?5,?6"
        " WHERE EXISTS(SELECT 1 FROM products WHERE sku=?2 AND stock_gen=?7)"
        " AND NOT EXISTS(SELECT 1 FROM voided_orders WHERE order_id=?1)",
    [DB_ST_HOLD_INSERT] =
        "INSERT INTO holds(order_id,sku,quantity,gen,takes,in_db,expires_ms,state)"
        " VALUES(?1,?2,?3,?4,?5,?7,?6,'reserved')",
    [DB_ST_ADD_SOLD] = "UPDATE products SET sold=sold+?2, held=held+?3 WHERE sku=?1",
    [DB_ST_ORDER_GET] = ORDER_COLUMNS " WHERE o.order_id=?1",
    [DB_ST_ORDER_BY_KEY] = ORDER_COLUMNS " WHERE o.idempotency_key=?1",
    [DB_ST_ORDER_EXISTS] = "SELECT 1 FROM orders WHERE order_id=?1",
    [DB_ST_VOID_EXISTS] = "SELECT 1 FROM voided_orders WHERE order_id=?1",
    [DB_ST_TAKE_CONDITIONAL] =
        "UPDATE products SET db_available=db_available-?2, db_version=db_version+1"
        " WHERE sku=?1 AND db_available>=?2",
    [DB_ST_ORDER_UNITS] = "SELECT coalesce(sum(o.quantity),0) FROM orders o LEFT JOIN holds h"
        " ON h.order_id=o.order_id WHERE o.sku=?1 AND (h.state IS NULL OR h.state='confirmed')",
    [DB_ST_HELD_UNITS] =
        "SELECT coalesce(sum(quantity),0) FROM holds WHERE sku=?1 AND state='reserved'",
    [DB_ST_PRODUCT_REPAIR] = "UPDATE products SET sold=?2, held=?3,"
        " db_available=CASE WHEN ?4<>0 THEN stock_initial-?2-?3 ELSE db_available END"
        " WHERE sku=?1",
    [DB_ST_TALLY_CLEAR] = "DELETE FROM product_tallies WHERE sku=?1",
    [DB_ST_TALLY_ADD] = "INSERT INTO product_tallies(sku,slot,sold,held) VALUES(?1,?4,?2,?3)"
        " ON CONFLICT(sku,slot) DO UPDATE SET sold=product_tallies.sold+excluded.sold,"
        " held=product_tallies.held+excluded.held",
    [DB_ST_TAKE_VERSIONED] =
        "UPDATE products SET db_available=db_available-?2, db_version=db_version+1"
        " WHERE sku=?1 AND db_available>=?2 AND db_version=?3",
    [DB_ST_STOCK_READ] = "SELECT db_available, db_version FROM products WHERE sku=?1",
    [DB_ST_USER_ORDERS] =
        "SELECT coalesce(sum(o.quantity),0) FROM orders o WHERE o.sku=?1 AND o.user_id=?2"
        " AND NOT EXISTS(SELECT 1 FROM holds h WHERE h.order_id=o.order_id"
        " AND h.state IN ('cancelled','expired'))",
    [DB_ST_USER_SUM] =
        "SELECT coalesce((SELECT units FROM user_units WHERE sku=?1 AND user_id=?2),0)",
    [DB_ST_USER_ADD] = "INSERT INTO user_units(sku,user_id,units) VALUES(?1,?2,?3)"
        " ON CONFLICT(sku,user_id) DO UPDATE SET units=user_units.units+excluded.units",
    [DB_ST_RESTOCK_GET] = "SELECT sku, quantity FROM restocks WHERE idempotency_key=?1",
    /* A transaction that counts a SKU's orders reads its generation once,
     * holding the SKU's shared lock (db_sku_shared): SQLite's write
     * transaction holds the whole file; on PostgreSQL no rebuild (a new
     * generation) and no void can commit until it ends -- while other
     * instances' groups, which count in tally rows of their own, go on
     * beside it. */
    [DB_ST_GEN_READ] = "SELECT stock_gen FROM products WHERE sku=?1",
    [DB_ST_KEY_OWNER] = "SELECT 1 FROM orders WHERE idempotency_key=?1 AND order_id<>?2",
    [DB_ST_PING] = "SELECT count(*) FROM products",
    [DB_ST_COMMIT] = "COMMIT",
    [DB_ST_ROLLBACK] = "ROLLBACK",
    [DB_ST_SAVEPOINT] = "SAVEPOINT o",
    [DB_ST_ROLLBACK_TO] = "ROLLBACK TO o",
    [DB_ST_RELEASE] = "RELEASE o",
    [DB_ST_TAKE_SET] = "UPDATE products SET db_available=?2, db_version=db_version+1 WHERE sku=?1",
    /* An order revoked (db_order_revoke). */
    [DB_ST_ORDER_DELETE] = "DELETE FROM orders WHERE order_id=?1 RETURNING user_id, quantity",
    [DB_ST_HOLD_DELETE] = "DELETE FROM holds WHERE order_id=?1",
    [DB_ST_USER_SUB] = "UPDATE user_units SET units=units-?3 WHERE sku=?1 AND user_id=?2",
    /* The rest the dialects word apart, so each driver has its text
     * (db_driver.sql, in sqlite.c and pg.c): BEGIN (SQLite's takes the
     * write lock at once); PRODUCT_GEN (the greater of two);
     * ORDER_INSERT_ANY, VOID_INSERT, RESTOCK_INSERT, PROBE (a conflict
     * passed over, now); FOLD_LOCK, FOLD, FOLD_CLEAR (the tallies folded
     * into their products' rows, then emptied); SKU_SHARED, SKU_EXCLUSIVE, DUE_SKUS_SHARED (a SKU's
     * lock); PRODUCT_LOCK, STOCK_FOR_UPDATE (a row's lock). */
};

const char *db_sql_of(const db_driver *drv, int id) {
    assert(id >= 0 && id < DB_ST_COUNT);
    const char *own = drv->sql ? drv->sql[id] : NULL, *common;
    if (id < DB_ST_LOCK_FIRST) common = SQL[id];
    else if (id < DB_ST_HOLDS_FIRST) common = db_lock_sql[id - DB_ST_LOCK_FIRST];
    else common = db_holds_sql[id - DB_ST_HOLDS_FIRST];
    assert(own || common);      /* a statement worded apart is worded by every driver */
    return own ? own : common;
}

int db_st_reads(int id) {
    switch (id) {
    case DB_ST_PRODUCT_GET: case DB_ST_PRODUCT_ALL: case DB_ST_ORDER_GET:
    case DB_ST_ORDER_BY_KEY: case DB_ST_ORDER_EXISTS: case DB_ST_VOID_EXISTS:
    case DB_ST_USER_UNITS: case DB_ST_STOCK_READ: case DB_ST_ORDER_UNITS: case DB_ST_HELD_UNITS:
    case DB_ST_PING: case DB_ST_HOLDS_FIRST + DB_HOLDS_ST_OWED_UNITS:
        return 1;
    default:
        return 0;
    }
}

/* What a write transaction owes the products table: the units of the
 * orders it inserted (added at commit, once per SKU), and the generation
 * each SKU has (read once, under the lock DB_ST_GEN_READ says). */
typedef struct sku_tally {
    char sku[DB_SKU_MAX + 1];
    long long gen;
    long long sold;
    long long held;
} sku_tally;

typedef struct tallies {
    int n, cap;
    sku_tally *t;
} tallies;

static tallies *tallies_of(db *d) { return d->tally; }

/* --------------------------------------------------------------- running */

db_status db_error(db *d, const char *msg) {
    snprintf(d->errstr, sizeof d->errstr, "%s", msg);
    return DB_ERROR;
}

db_status db_set_error(db *d, db_status st, const char *what, const char *msg) {
    snprintf(d->errstr, sizeof d->errstr, "%s: %s", what, msg);
    return st;
}

const char *db_errstr(const db *d) { return d->errstr; }

db_status db_run(db *d, db_rows *r, int st, const db_arg *args, int n, const char *what) {
    assert(st >= 0 && st < DB_ST_COUNT);
    assert(!d->walking[st]);                   /* no nested runs of one statement */
    d->conflict = DB_CONFLICT_NONE;
    db_status res = d->drv->run(d, r, st, NULL, args, n, what);
    if (res == DB_OK) d->walking[st] = 1;
    return res;
}

db_status db_run_sql(db *d, db_rows *r, const char *sql, const db_arg *args, int n,
                     const char *what) {
    d->conflict = DB_CONFLICT_NONE;
    return d->drv->run(d, r, -1, sql, args, n, what);
}

int db_next(db_rows *r) { return r->d->drv->next(r); }
long long db_col_int(db_rows *r, int col) { return r->d->drv->col_int(r, col); }
const char *db_col_text(db_rows *r, int col) { return r->d->drv->col_text(r, col); }
int db_col_null(db_rows *r, int col) { return r->d->drv->col_null(r, col); }
long long db_changes(db_rows *r) { return r->d->drv->changes(r); }
void db_done(db_rows *r) {
    if (r->st >= 0) r->d->walking[r->st] = 0;
    r->d->drv->done(r);
}

db_status db_do(db *d, int st, const db_arg *args, int n, const char *what, long long *changes) {
    db_rows r;
    db_status res = db_run(d, &r, st, args, n, what);
    if (res != DB_OK) return res;
    int got;
    while ((got = db_next(&r)) > 0) {}         /* a RETURNING's rows, unread */
    if (got < 0) res = d->last;
    if (changes) *changes = db_changes(&r);
    db_done(&r);
    return res;
}

db_status db_one_int(db *d, int st, const db_arg *args, int n, const char *what,
                     long long *out) {
    db_rows r;
    db_status res = db_run(d, &r, st, args, n, what);
    if (res != DB_OK) return res;
    int got = db_next(&r);
    if (got > 0) *out = db_col_int(&r, 0);
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

/* ------------------------------------------------------------ connection */

/* The drivers, asked in this order whether a target is theirs; the last
 * claims any (a SQLite file's path). */
static const db_driver *const DRIVERS[] = { &db_pg_driver, &db_sqlite_driver };

/* The driver a target names. */
static const db_driver *driver_of(const char *target) {
    size_t n = sizeof DRIVERS / sizeof DRIVERS[0];
    for (size_t i = 0; i + 1 < n; i++)
        if (DRIVERS[i]->claims(target)) return DRIVERS[i];
    assert(!DRIVERS[n - 1]->claims);
    return DRIVERS[n - 1];
}

const char *db_kind(const db *d) { return d->drv->name; }

void db_target_redact(const char *target, char *out, size_t len) {
    const db_driver *drv = driver_of(target);
    if (drv->redact) drv->redact(target, out, len);
    else snprintf(out, len, "%s", target);
}

int db_target_row_locks(const char *target) { return driver_of(target)->row_locks; }

int db_target_server(const char *target) { return driver_of(target)->server; }

db *db_open(const char *target, const db_options *opt, char *err, size_t errlen) {
    db_status st;
    return db_open_st(target, opt, &st, err, errlen);
}

db *db_open_st(const char *target, const db_options *opt, db_status *st, char *err,
               size_t errlen) {
    db *d = calloc(1, sizeof *d);
    *st = DB_ERROR;
    if (!d || !(d->tally = calloc(1, sizeof(tallies)))) {
        free(d);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->drv = driver_of(target);
    d->readonly = opt->readonly;
    d->commit_timeout_ms = opt->commit_timeout_ms > 0 ? opt->commit_timeout_ms : DB_COMMIT_TIMEOUT_MS;
    int rc = d->drv->open(d, target, opt, err, errlen);
    if (rc) {
        assert(rc == -1 || rc == -2);
        *st = rc == -2 ? DB_DOWN : DB_ERROR;
        free(d->tally);
        free(d);
        return NULL;
    }
    *st = DB_OK;
    return d;
}

void db_close(db *d) {
    if (!d) return;
    d->drv->close(d);
    free(tallies_of(d)->t);
    free(d->tally);
    free(d);
}



void db_set_lock_wait(db *d, int ms) { d->drv->wait_ms(d, ms); }

db_status db_ping(db *d) {
    long long n;
    db_status st = db_one_int(d, DB_ST_PING, NULL, 0, "ping", &n);
    return st == DB_NOTFOUND ? DB_ERROR : st;
}

db_status db_begin(db *d) {
    tallies_of(d)->n = 0;
    d->sku_locks = 0;
    return db_do(d, DB_ST_BEGIN, NULL, 0, "begin", NULL);
}

static db_status add_units(db *d, const char *sku, long long sold, long long held, int in_db);

/* Adds the tallied units to products.sold and held, once per SKU. */
static db_status flush_tally(db *d) {
    tallies *ts = tallies_of(d);
    for (int i = 0; i < ts->n; i++) {
        sku_tally *t = &ts->t[i];
        if (!t->sold && !t->held) continue;
        db_status st = add_units(d, t->sku, t->sold, t->held, 0);
        if (st != DB_OK) return st == DB_NOTFOUND ? DB_ERROR : st;
        t->sold = t->held = 0;
    }
    return DB_OK;
}

db_status db_commit(db *d) {
    db_status st = flush_tally(d);
    tallies_of(d)->n = 0;
    d->sku_locks = 0;
    if (st != DB_OK) return st;
    return db_do(d, DB_ST_COMMIT, NULL, 0, "commit", NULL);
}

db_status db_barrier(db *d, int timeout_ms) {
    d->unconfirmed = 0;
    return d->drv->barrier ? d->drv->barrier(d, timeout_ms) : DB_OK;
}

void db_rollback(db *d) {
    tallies_of(d)->n = 0;
    d->sku_locks = 0;
    if (d->drv->in_tx(d)) db_do(d, DB_ST_ROLLBACK, NULL, 0, "rollback", NULL);
}

/* ----------------------------------------------------------------- products */

static void copy_text(char *dst, size_t cap, db_rows *r, int col) {
    snprintf(dst, cap, "%s", db_col_text(r, col));
}

static void read_product(db_rows *r, db_product *p) {
    memset(p, 0, sizeof *p);
    copy_text(p->sku, sizeof p->sku, r, 0);
    copy_text(p->name, sizeof p->name, r, 1);
    copy_text(p->strategy, sizeof p->strategy, r, 2);
    p->segments = (int)db_col_int(r, 3);
    p->per_user_limit = db_col_int(r, 4);
    p->stock_initial = db_col_int(r, 5);
    p->sold = db_col_int(r, 6);
    p->stock_gen = db_col_int(r, 7);
    p->db_available = db_col_int(r, 8);
    p->db_version = db_col_int(r, 9);
    p->cs_delay_ms = (int)db_col_int(r, 10);
    p->lock_ttl_ms = (int)db_col_int(r, 11);
    copy_text(p->created_at, sizeof p->created_at, r, 12);
    p->hold_seconds = (int)db_col_int(r, 13);
    p->held = db_col_int(r, 14);
    p->cs_overlap = (int)db_col_int(r, 15);
    p->room_turn_ms = (int)db_col_int(r, 16);
    p->room_rate = db_col_int(r, 17);
    p->room_opens_ms = db_col_int(r, 18);
}

db_status db_product_insert(db *d, const db_product *p) {
    assert(p->stock_initial >= 0 && p->segments >= 1);
    const db_arg a[] = { DB_TEXT(p->sku), DB_TEXT(p->name), DB_TEXT(p->strategy),
                         DB_INT(p->segments), DB_INT(p->per_user_limit),
                         DB_INT(p->stock_initial), DB_INT(p->cs_delay_ms),
                         DB_INT(p->lock_ttl_ms), DB_TEXT(p->created_at),
                         DB_INT(p->hold_seconds), DB_INT(p->cs_overlap),
                         DB_INT(p->room_turn_ms), DB_INT(p->room_rate),
                         DB_INT(p->room_opens_ms) };
    return db_do(d, DB_ST_PRODUCT_INSERT, a, DB_NARGS(a), "insert product", NULL);
}

db_status db_product_get(db *d, const char *sku, db_product *out) {
    const db_arg a[] = { DB_TEXT(sku) };
    db_rows r;
    db_status st = db_run(d, &r, DB_ST_PRODUCT_GET, a, 1, "get product");
    if (st != DB_OK) return st;
    int got = db_next(&r);
    if (got > 0) read_product(&r, out);
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

db_status db_product_list(db *d, db_product **out, size_t *n) {
    db_product *v = NULL;
    size_t cap = 0;
    int got;
    db_rows r;
    *out = NULL;
    *n = 0;
    db_status st = db_run(d, &r, DB_ST_PRODUCT_ALL, NULL, 0, "list products");
    if (st != DB_OK) return st;
    while ((got = db_next(&r)) > 0) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            db_product *w = realloc(v, cap * sizeof *w);
            if (!w) {
                db_done(&r);
                free(v);
                *n = 0;
                return db_error(d, "list products: out of memory");
            }
            v = w;
        }
        read_product(&r, &v[(*n)++]);
    }
    db_done(&r);
    if (got < 0) {
        free(v);
        *n = 0;
        return d->last;
    }
    *out = v;
    return DB_OK;
}

/* Runs an UPDATE of sku's product row: DB_NOTFOUND when it changed none. */
static db_status update_product(db *d, int st_id, const char *sku, long long qty,
                                const char *what) {
    const db_arg a[] = { DB_TEXT(sku), DB_INT(qty) };
    long long changed = 0;
    db_status st = db_do(d, st_id, a, 2, what, &changed);
    return st == DB_OK && changed == 0 ? DB_NOTFOUND : st;
}

/* Looks up a restock by key: DB_OK (and its sku and quantity), DB_NOTFOUND
 * or an error. */
static db_status restock_by_key(db *d, const char *key, char *sku, size_t skulen,
                                long long *qty) {
    const db_arg a[] = { DB_TEXT(key) };
    db_rows r;
    db_status st = db_run(d, &r, DB_ST_RESTOCK_GET, a, 1, "read restock");
    if (st != DB_OK) return st;
    int got = db_next(&r);
    if (got > 0) {
        copy_text(sku, skulen, &r, 0);
        *qty = db_col_int(&r, 1);
    }
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

static db_status restock(db *d, const char *sku, long long qty, const char *idem_key,
                         db_product *out, int *replayed, int attempt) {
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
            const db_arg a[] = { DB_TEXT(idem_key), DB_TEXT(sku), DB_INT(qty) };
            st = db_do(d, DB_ST_RESTOCK_INSERT, a, 3, "record restock", NULL);
            if (st == DB_EXISTS && attempt == 0) {
                /* Another restock with this key committed since the read
                 * (two instances): a replay of it. */
                db_rollback(d);
                return restock(d, sku, qty, idem_key, out, replayed, 1);
            }
        }
    }
    if (st == DB_OK) st = update_product(d, DB_ST_PRODUCT_RESTOCK, sku, qty, "restock");
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

db_status db_product_restock(db *d, const char *sku, long long qty, const char *idem_key,
                             db_product *out, int *replayed) {
    return restock(d, sku, qty, idem_key, out, replayed, 0);
}

db_status db_restock_state(db *d, const char *idem_key) {
    char sku[DB_SKU_MAX + 1];
    long long qty;
    return restock_by_key(d, idem_key, sku, sizeof sku, &qty);
}

db_status db_probe(db *d) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    st = db_do(d, DB_ST_PROBE, NULL, 0, "probe", NULL);
    if (st == DB_OK) st = db_commit(d);
    if (st != DB_OK) db_rollback(d);
    return st;
}

db_status db_product_new_gen(db *d, const char *sku, long long min_gen, db_product *out,
                             int (*user_fn)(const char *user, long long units, void *ud),
                             void *ud) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    /* Every group counting the SKU commits first, and none starts until
     * this does: the counts read below are whole. */
    st = db_sku_exclusive(d, sku);
    if (st == DB_OK) st = update_product(d, DB_ST_PRODUCT_GEN, sku, min_gen, "new generation");
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
    const db_arg a[] = { DB_TEXT(sku) };
    db_rows r;
    int got;
    db_status st = db_run(d, &r, DB_ST_USER_UNITS, a, 1, "user units");
    if (st != DB_OK) return st;
    while ((got = db_next(&r)) > 0)
        if (fn(db_col_text(&r, 0), db_col_int(&r, 1), ud)) break;
    db_done(&r);
    return got >= 0 ? DB_OK : d->last;
}

/* ------------------------------------------------------------------- orders */

static void read_order(db_rows *r, db_order *o) {
    memset(o, 0, sizeof *o);
    copy_text(o->order_id, sizeof o->order_id, r, 0);
    copy_text(o->sku, sizeof o->sku, r, 1);
    copy_text(o->user_id, sizeof o->user_id, r, 2);
    o->quantity = (int)db_col_int(r, 3);
    copy_text(o->idem_key, sizeof o->idem_key, r, 4);
    copy_text(o->created_at, sizeof o->created_at, r, 5);
    int st = db_order_status_parse(db_col_text(r, 6));
    o->status = st < 0 ? DB_ORDER_CONFIRMED : (db_order_status)st;
    o->expires_ms = db_col_int(r, 7);
    o->decided_ms = db_col_int(r, 8);
    copy_text(o->payment_ref, sizeof o->payment_ref, r, 9);
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
    const db_arg a[] = { DB_TEXT(arg) };
    db_rows r;
    db_status st = db_run(d, &r, st_id, a, 1, "get order");
    if (st != DB_OK) return st;
    int got = db_next(&r);
    if (got > 0) read_order(&r, out);
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

db_status db_order_get(db *d, const char *order_id, db_order *out) {
    return get_one_order(d, DB_ST_ORDER_GET, order_id, out);
}

db_status db_order_by_key(db *d, const char *idem_key, db_order *out) {
    return get_one_order(d, DB_ST_ORDER_BY_KEY, idem_key, out);
}

db_status db_order_list(db *d, const char *sku, const char *user_id, int status,
                        const char *after, int limit, void (*fn)(const db_order *o, void *ud),
                        void *ud, int *more) {
    /* Shapes of one query; each uses an index ending in order_id. */
    char sql[640];
    snprintf(sql, sizeof sql, ORDER_COLUMNS " WHERE 1=1%s%s%s%s ORDER BY o.order_id LIMIT ?4",
             sku ? " AND o.sku=?1" : "", user_id ? " AND o.user_id=?2" : "",
             after ? " AND o.order_id>?3" : "",
             status < 0 ? "" : " AND coalesce(h.state,'confirmed')=?5");
    const db_arg a[] = {
        DB_TEXT(sku), DB_TEXT(user_id), DB_TEXT(after), DB_INT(limit + 1),
        status < 0 ? DB_NULL : DB_TEXT(db_order_status_name((db_order_status)status))
    };
    db_rows r;
    db_status st = db_run_sql(d, &r, sql, a, DB_NARGS(a), "list orders");
    if (st != DB_OK) return st;
    db_order o;
    int got, n = 0;
    *more = 0;
    while ((got = db_next(&r)) > 0) {
        if (n == limit) {
            *more = 1;
            break;
        }
        read_order(&r, &o);
        fn(&o, ud);
        n++;
    }
    db_done(&r);
    return got >= 0 ? DB_OK : d->last;
}

/* Whether a row of statement st_id matches order_id: DB_OK, DB_NOTFOUND,
 * or an error. */
static db_status exists(db *d, int st_id, const char *order_id) {
    const db_arg a[] = { DB_TEXT(order_id) };
    long long one;
    return db_one_int(d, st_id, a, 1, "order state", &one);
}

db_status db_order_state(db *d, const char *order_id) {
    db_status st = exists(d, DB_ST_ORDER_EXISTS, order_id);
    if (st != DB_NOTFOUND) return st;
    st = exists(d, DB_ST_VOID_EXISTS, order_id);
    return st == DB_OK ? DB_STALE : st;
}

db_status db_order_void(db *d, const char *order_id, const char *sku, const char *reason) {
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    /* The SKU's lock first, exclusive (db_sku_exclusive): a group that is
     * counting this order commits before the check below, or waits for
     * the void. */
    if ((st = db_sku_exclusive(d, sku)) != DB_OK) {
        db_rollback(d);
        return st;
    }
    db_status found = exists(d, DB_ST_ORDER_EXISTS, order_id);
    if (found == DB_OK) {
        st = DB_EXISTS;
    } else if (found != DB_NOTFOUND) {
        st = found;
    } else {
        const db_arg a[] = { DB_TEXT(order_id), DB_TEXT(sku), DB_TEXT(reason) };
        st = db_do(d, DB_ST_VOID_INSERT, a, 3, "void order", NULL);
    }
    if (st != DB_OK) {
        db_rollback(d);
        return st;
    }
    return db_commit(d);
}

/* A read of one integer about sku (and user): DB_OK, DB_NOTFOUND or an error. */
static db_status scalar(db *d, int st_id, const char *sku, const char *user, long long *out) {
    const db_arg a[] = { DB_TEXT(sku), DB_TEXT(user) };
    return db_one_int(d, st_id, a, user ? 2 : 1, "read", out);
}

void db_set_critical(db *d, void (*fn)(void *ud, long long units), void *ud) {
    d->critical = fn;
    d->critical_ud = ud;
}

int db_row_locks(const db *d) { return d->drv->row_locks; }

int db_tallies(const db *d) { return d->drv->tally_slot != NULL; }

int db_pooled(const db *d) { return d->drv->pooled && d->drv->pooled(d); }

/* db-for-update's lock: SELECT ... FOR UPDATE of the product's row, which
 * reads what is left: DB_OK with *left, DB_NOTFOUND, or an error. */
static db_status lock_for_update(db *d, const char *sku, long long *left) {
    const db_arg a[] = { DB_TEXT(sku) };
    db_rows r;
    db_status st = db_run(d, &r, DB_ST_STOCK_FOR_UPDATE, a, 1, "lock the product row");
    if (st != DB_OK) return st;
    int got = db_next(&r);
    if (got > 0) *left = db_col_int(&r, 0);
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

/* db-for-update's take, under its lock: what was left (read with the
 * lock) checked here -- or, for its unsafe twin, the caller's earlier read
 * trusted -- then set. */
static db_status take_for_update(db *d, const db_order *o, db_take take, long long left,
                                 long long read_before, long long *available) {
    db_status st;
    *available = left;
    if (take == DB_TAKE_FOR_UPDATE) {
        if (left < o->quantity) return DB_NOSTOCK;
        if (d->critical) d->critical(d->critical_ud, left);
    } else {
        left = read_before;                   /* the stale read: its flaw */
    }
    const db_arg w[] = { DB_TEXT(o->sku), DB_INT(left - o->quantity) };
    st = db_do(d, DB_ST_TAKE_SET, w, 2, "write stock", NULL);
    if (st == DB_EXISTS) return DB_NOSTOCK;   /* CHECK(db_available >= 0): refused */
    if (st == DB_OK) *available = left - o->quantity;
    return st;
}

/* Takes the stock of a db-strategy order inside the writer's transaction.
 * The conditional UPDATE is the whole check: it changes no row when fewer
 * than qty units are left (or, optimistic, when the version moved since the
 * caller read it), so no read-then-write window exists in here. */
static db_status take_stock(db *d, const db_order *o, db_take take, long long per_user_limit,
                            long long expect_version, long long *available) {
    db_status st;
    db_order prior;
    long long one, left = 0;
    int for_update = take == DB_TAKE_FOR_UPDATE || take == DB_TAKE_READ_BEFORE;
    /* The SKU's row first: what is read below (a key, the buyer's units)
     * cannot change until this transaction ends. db-for-update's lock is
     * the pessimistic lock of Alibaba Cloud's distributed lock article,
     * which reads what is left. */
    if (for_update) {
        st = lock_for_update(d, o->sku, &left);
        if (st == DB_NOTFOUND) {
            *available = 0;
            return DB_NOSTOCK;
        }
    } else {
        const db_arg l[] = { DB_TEXT(o->sku) };
        st = db_one_int(d, DB_ST_PRODUCT_LOCK, l, 1, "lock the product", &one);
        if (st == DB_NOTFOUND) st = DB_OK;
    }
    if (st != DB_OK) return st;
    /* A replay is a replay before it is anything else (over the limit, or
     * sold out since): look the key up first. */
    if (o->idem_key[0]) {
        st = get_one_order(d, DB_ST_ORDER_BY_KEY, o->idem_key, &prior);
        if (st == DB_OK) return DB_DUPKEY;
        if (st != DB_NOTFOUND) return st;
    }
    if (per_user_limit > 0) {
        long long bought = 0;
        if ((st = scalar(d, DB_ST_USER_SUM, o->sku, o->user_id, &bought)) != DB_OK) return st;
        if (bought + o->quantity > per_user_limit) {
            *available = bought;
            return DB_LIMIT;
        }
        /* Counted before the take: a refusal below rolls back the savepoint. */
        const db_arg u[] = { DB_TEXT(o->sku), DB_TEXT(o->user_id), DB_INT(o->quantity) };
        if ((st = db_do(d, DB_ST_USER_ADD, u, 3, "count the buyer's units", NULL)) != DB_OK)
            return st;
    }
    if (for_update) return take_for_update(d, o, take, left, expect_version, available);
    const db_arg a[] = { DB_TEXT(o->sku), DB_INT(o->quantity), DB_INT(expect_version) };
    long long changed = 0;
    st = db_do(d, take == DB_TAKE_OPTIMISTIC ? DB_ST_TAKE_VERSIONED : DB_ST_TAKE_CONDITIONAL, a,
               take == DB_TAKE_OPTIMISTIC ? 3 : 2, "take stock", &changed);
    if (st != DB_OK) return st;
    long long version = 0;
    if ((st = db_stock_read(d, o->sku, available, &version)) != DB_OK) return st;
    if (changed) return DB_OK;
    if (*available < o->quantity) return DB_NOSTOCK;
    return take == DB_TAKE_OPTIMISTIC && version != expect_version ? DB_CONFLICT : DB_NOSTOCK;
}

db_status db_order_units(db *d, const char *sku, long long *sold, long long *held) {
    db_status st = scalar(d, DB_ST_ORDER_UNITS, sku, NULL, sold);
    return st == DB_OK ? scalar(d, DB_ST_HELD_UNITS, sku, NULL, held) : st;
}

db_status db_product_repair(db *d, const char *sku, int in_db, long long *sold, long long *held) {
    long long one;
    const db_arg k[] = { DB_TEXT(sku) };
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    /* The SKU's lock, exclusive, then its row: every group counting it (in
     * a tally or in the row) has committed, and none starts until this
     * does; the locks in the order the groups take them. */
    if ((st = db_sku_exclusive(d, sku)) != DB_OK) goto err;
    if ((st = db_one_int(d, DB_ST_PRODUCT_LOCK, k, 1, "lock the product", &one)) != DB_OK) goto err;
    if ((st = db_order_units(d, sku, sold, held)) != DB_OK) goto err;
    const db_arg a[] = { DB_TEXT(sku), DB_INT(*sold), DB_INT(*held), DB_INT(in_db != 0) };
    if ((st = db_do(d, DB_ST_PRODUCT_REPAIR, a, 4, "repair product", NULL)) != DB_OK) goto err;
    if ((st = db_do(d, DB_ST_TALLY_CLEAR, a, 1, "repair product", NULL)) != DB_OK) goto err;
    return db_commit(d);
err:
    db_rollback(d);
    return st;
}

db_status db_order_revoke(db *d, const char *order_id, const char *sku, int in_db, int per_user,
                          int *removed) {
    long long one, sold, held;
    const db_arg k[] = { DB_TEXT(order_id) };
    char user[DB_USER_MAX * 4 + 1] = "";
    long long qty = 0;
    db_rows r;
    *removed = 0;
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    /* As a repair: the SKU's exclusive lock, then its row. A transaction
     * inserting the order holds the SKU's lock shared until it ends, so
     * past this point it has ended, one way or the other. */
    if ((st = db_sku_exclusive(d, sku)) != DB_OK) goto err;
    const db_arg s[] = { DB_TEXT(sku) };
    if ((st = db_one_int(d, DB_ST_PRODUCT_LOCK, s, 1, "lock the product", &one)) != DB_OK &&
        st != DB_NOTFOUND)
        goto err;
    if ((st = db_run(d, &r, DB_ST_ORDER_DELETE, k, 1, "revoke order")) != DB_OK) goto err;
    int got = db_next(&r);
    if (got > 0) {
        snprintf(user, sizeof user, "%s", db_col_text(&r, 0));
        qty = db_col_int(&r, 1);
    }
    db_done(&r);
    if (got < 0) {
        st = d->last;
        goto err;
    }
    if (got > 0) {
        *removed = 1;
        if ((st = db_do(d, DB_ST_HOLD_DELETE, k, 1, "revoke order", NULL)) != DB_OK) goto err;
        const char *buyer = user;
        const db_arg u[] = { DB_TEXT(sku), DB_TEXT(buyer), DB_INT(qty) };
        if (per_user && (st = db_do(d, DB_ST_USER_SUB, u, 3, "revoke order", NULL)) != DB_OK)
            goto err;
        /* The counts again from the rows (the tallies folded in). */
        if ((st = db_order_units(d, sku, &sold, &held)) != DB_OK) goto err;
        const db_arg a[] = { DB_TEXT(sku), DB_INT(sold), DB_INT(held), DB_INT(in_db != 0) };
        if ((st = db_do(d, DB_ST_PRODUCT_REPAIR, a, 4, "revoke order", NULL)) != DB_OK) goto err;
        if ((st = db_do(d, DB_ST_TALLY_CLEAR, a, 1, "revoke order", NULL)) != DB_OK) goto err;
    }
    const db_arg v[] = { DB_TEXT(order_id), DB_TEXT(sku), DB_TEXT("revoked: answered 503") };
    if ((st = db_do(d, DB_ST_VOID_INSERT, v, 3, "revoke order", NULL)) != DB_OK) goto err;
    return db_commit(d);
err:
    db_rollback(d);
    return st;
}

db_status db_stock_read(db *d, const char *sku, long long *available, long long *version) {
    const db_arg a[] = { DB_TEXT(sku) };
    db_rows r;
    db_status st = db_run(d, &r, DB_ST_STOCK_READ, a, 1, "read stock");
    if (st != DB_OK) return st;
    int got = db_next(&r);
    if (got > 0) {
        *available = db_col_int(&r, 0);
        *version = db_col_int(&r, 1);
    }
    db_done(&r);
    return got > 0 ? DB_OK : got == 0 ? DB_NOTFOUND : d->last;
}

/* The tally of sku in this transaction (its generation read, and its row
 * locked, on first use), or NULL on error (*st says which). */
static sku_tally *tally_of(db *d, const char *sku, db_status *st) {
    tallies *ts = tallies_of(d);
    *st = DB_OK;
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->t[i].sku, sku)) return &ts->t[i];
    if (ts->n == ts->cap) {
        int cap = ts->cap ? ts->cap * 2 : 16;
        sku_tally *t = realloc(ts->t, (size_t)cap * sizeof *t);
        if (!t) {
            *st = db_error(d, "tally: out of memory");
            return NULL;
        }
        ts->t = t;
        ts->cap = cap;
    }
    long long gen = -1;
    const db_arg a[] = { DB_TEXT(sku) };
    if ((*st = db_sku_shared(d, sku)) != DB_OK) return NULL;
    *st = db_one_int(d, DB_ST_GEN_READ, a, 1, "read generation", &gen);
    if (*st == DB_NOTFOUND) {
        *st = DB_OK;
        gen = -1;                              /* no such product: every order stale */
    }
    if (*st != DB_OK) return NULL;
    sku_tally *t = &ts->t[ts->n++];
    snprintf(t->sku, sizeof t->sku, "%s", sku);
    t->gen = gen;
    t->sold = t->held = 0;
    return t;
}

/* The hold row of order o (a reserved hold); in_db: its units came from
 * products.db_available. */
static db_status insert_hold(db *d, const db_order *o, int in_db) {
    const db_arg a[] = { DB_TEXT(o->order_id), DB_TEXT(o->sku), DB_INT(o->quantity),
                         DB_INT(o->gen), DB_TEXT(o->takes ? o->takes : ""),
                         DB_INT(o->expires_ms), DB_INT(in_db) };
    return db_do(d, DB_ST_HOLD_INSERT, a, DB_NARGS(a), "insert hold", NULL);
}

/* Adds units to sku's counts: in its products row where the stock is
 * (in_db: a db strategy's, whose row its take locked), else as
 * db_count_units. */
static db_status add_units(db *d, const char *sku, long long sold, long long held, int in_db) {
    if (!in_db) return db_count_units(d, sku, sold, held);
    const db_arg a[] = { DB_TEXT(sku), DB_INT(sold), DB_INT(held) };
    long long changed = 0;
    db_status st = db_do(d, DB_ST_ADD_SOLD, a, 3, "count units", &changed);
    return st == DB_OK && changed == 0 ? DB_NOTFOUND : st;
}

/* Runs a statement that takes SKU locks, and counts them taken. */
static db_status sku_lock(db *d, int st, const db_arg *a, const char *what) {
    db_status res = db_do(d, st, a, 1, what, NULL);
    if (res == DB_OK) d->sku_locks++;
    return res;
}

db_status db_sku_shared(db *d, const char *sku) {
    const db_arg a[] = { DB_TEXT(sku) };
    return sku_lock(d, DB_ST_SKU_SHARED, a, "lock the product");
}

db_status db_sku_exclusive(db *d, const char *sku) {
    const db_arg a[] = { DB_TEXT(sku) };
    return sku_lock(d, DB_ST_SKU_EXCLUSIVE, a, "lock the product");
}

db_status db_due_skus_shared(db *d, long long now_ms) {
    const db_arg a[] = { DB_INT(now_ms) };
    return sku_lock(d, DB_ST_DUE_SKUS_SHARED, a, "expire holds");
}

db_status db_count_units(db *d, const char *sku, long long sold, long long held) {
    assert(d->sku_locks > 0);                  /* under the SKU's shared lock */
    const char *slot = d->drv->tally_slot ? d->drv->tally_slot(d) : NULL;
    if (slot) {
        const db_arg t[] = { DB_TEXT(sku), DB_INT(sold), DB_INT(held), DB_INT(atoll(slot)) };
        return db_do(d, DB_ST_TALLY_ADD, t, 4, "count units", NULL);
    }
    const db_arg a[] = { DB_TEXT(sku), DB_INT(sold), DB_INT(held) };
    long long changed = 0;
    db_status st = db_do(d, DB_ST_ADD_SOLD, a, 3, "count units", &changed);
    return st == DB_OK && changed == 0 ? DB_NOTFOUND : st;
}

int db_plain_insert(const db_job *job) {
    return job->kind == DB_JOB_INSERT && job->take == DB_TAKE_NONE && job->per_user_limit <= 0;
}

int db_group_insert(const db_job *job) {
    return db_plain_insert(job) ||
           (job->kind == DB_JOB_INSERT &&
            (job->take == DB_TAKE_CONDITIONAL || job->take == DB_TAKE_OPTIMISTIC));
}

db_status db_order_insert(db *d, const db_order *o, db_take take, long long per_user_limit,
                          long long expect_version, long long *available_out) {
    db_status st;
    long long available = -1;
    /* A savepoint lets a per-order refusal undo this order's stock update
     * without ending the group's transaction. */
    if (take != DB_TAKE_NONE) {
        if ((st = db_do(d, DB_ST_SAVEPOINT, NULL, 0, "savepoint", NULL)) != DB_OK) return st;
        st = take_stock(d, o, take, per_user_limit, expect_version, &available);
        if (available_out) *available_out = available;
        if (st != DB_OK) goto undo;
    }
    /* Reserved in Redis: the generation is checked against the tally (one
     * read per SKU per transaction, which locks the SKU's row), and sold
     * added at commit. Outside a transaction, the per-order statement
     * checks it instead. */
    sku_tally *t = NULL;
    if (take == DB_TAKE_NONE && d->drv->in_tx(d)) {
        t = tally_of(d, o->sku, &st);
        if (st != DB_OK) return st;
        if (t->gen != o->gen) return DB_STALE;
    }
    if (take == DB_TAKE_NONE && per_user_limit > 0) {
        /* Reserved in Redis where no one script saw the buyer's other
         * orders (a product spread over a cluster's slots): the limit is
         * checked here, against the committed orders that count. */
        long long bought = 0;
        if ((st = scalar(d, DB_ST_USER_ORDERS, o->sku, o->user_id, &bought)) != DB_OK) return st;
        if (bought + o->quantity > per_user_limit) {
            if (available_out) *available_out = bought;
            return DB_LIMIT;
        }
    }
    const db_arg a[] = { DB_TEXT(o->order_id), DB_TEXT(o->sku), DB_TEXT(o->user_id),
                         DB_INT(o->quantity), DB_TEXT0(o->idem_key), DB_TEXT(o->created_at),
                         DB_INT(o->gen) };
    long long changed = 0;
    int gen_checked = take == DB_TAKE_NONE && !t;
    st = db_do(d, gen_checked ? DB_ST_ORDER_INSERT_GEN : DB_ST_ORDER_INSERT_ANY, a,
               gen_checked ? 7 : 6, "insert order", &changed);
    if (st == DB_EXISTS) {
        st = d->conflict == DB_CONFLICT_UNIQUE ? DB_DUPKEY : DB_STALE;
    } else if (st == DB_OK && changed == 0) {
        /* Refused without an error: voided, of another generation, or
         * (PostgreSQL) its id or key taken. */
        st = DB_STALE;
        if (o->idem_key[0]) {
            long long one;
            const db_arg k[] = { DB_TEXT(o->idem_key), DB_TEXT(o->order_id) };
            db_status ks = db_one_int(d, DB_ST_KEY_OWNER, k, 2, "read key", &one);
            st = ks == DB_OK ? DB_DUPKEY : ks == DB_NOTFOUND ? DB_STALE : ks;
        }
    }
    /* The row is in; failing to record or count it would break sold ==
     * sum(orders), so that is an error that aborts the whole group. */
    int hold = o->expires_ms > 0;
    if (st == DB_OK && hold && insert_hold(d, o, take != DB_TAKE_NONE) != DB_OK) return DB_ERROR;
    if (st == DB_OK && t) {
        if (hold) t->held += o->quantity;
        else t->sold += o->quantity;
    } else if (st == DB_OK &&
               add_units(d, o->sku, hold ? 0 : o->quantity, hold ? o->quantity : 0,
                         take != DB_TAKE_NONE) != DB_OK) {
        return DB_ERROR;
    }
    if (st != DB_OK) goto undo;
    if (take != DB_TAKE_NONE && (st = db_do(d, DB_ST_RELEASE, NULL, 0, "release", NULL)) != DB_OK)
        return st;
    return DB_OK;
undo:
    if (take != DB_TAKE_NONE &&
        (db_do(d, DB_ST_ROLLBACK_TO, NULL, 0, "rollback to savepoint", NULL) != DB_OK ||
         db_do(d, DB_ST_RELEASE, NULL, 0, "release", NULL) != DB_OK) &&
        (st != DB_ERROR && st != DB_BUSY))
        st = DB_ERROR;                         /* the transaction is no longer usable */
    return st;
}

db_status db_order_for_update(db *d, const db_order *o, db_take take, long long per_user_limit,
                              long long read_before, long long *available_out) {
    assert(take == DB_TAKE_FOR_UPDATE || take == DB_TAKE_READ_BEFORE);
    if (!db_row_locks(d)) return db_error(d, "db-for-update needs PostgreSQL's row locks");
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    st = db_order_insert(d, o, take, per_user_limit, read_before, available_out);
    if (st != DB_OK) {
        db_rollback(d);
        return st;
    }
    if ((st = db_commit(d)) != DB_OK) {
        db_rollback(d);
        /* A COMMIT that had to be canceled is here and perhaps not on the
         * synchronous standby: its row proves nothing. */
        if (d->unconfirmed) return DB_UNKNOWN;
        /* Else the order's row tells whether the COMMIT landed. */
        db_status now = db_order_state(d, o->order_id);
        return now == DB_OK ? DB_OK : now == DB_NOTFOUND || now == DB_STALE ? st : DB_UNKNOWN;
    }
    return DB_OK;
}

db_status db_fold_tallies(db *d, long long *folded) {
    long long n = 0;
    *folded = 0;
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    db_rows r;
    if ((st = db_run(d, &r, DB_ST_FOLD_LOCK, NULL, 0, "fold tallies")) == DB_OK) {
        int got;
        while ((got = db_next(&r)) > 0) n++;
        db_done(&r);
        if (got < 0) st = d->last;
    }
    if (st == DB_OK && n) st = db_do(d, DB_ST_FOLD, NULL, 0, "fold tallies", NULL);
    if (st == DB_OK && n) st = db_do(d, DB_ST_FOLD_CLEAR, NULL, 0, "fold tallies", NULL);
    if (st == DB_OK) st = db_commit(d);
    if (st != DB_OK) {
        db_rollback(d);
        return st;
    }
    *folded = n;
    return DB_OK;
}
