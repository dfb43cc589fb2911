/* schema.c: the flashsale database's schema, as the numbered migrations
 * that build it, and db_migrate, which applies those a file lacks. See
 * docs/storage.md for the tables.
 *
 * The whole schema lives here, the lock table's too (version 5; its
 * statements are locktable.c's): the migrations are one ordered list,
 * applied in one transaction, and PRAGMA user_version says how far a file
 * has come. A new version adds a SCHEMA_V<N> and its step in db_migrate,
 * and raises DB_SCHEMA_VERSION (db.h). */
#include <stdio.h>
#include <string.h>

#include "db/db_int.h"

/* Version 1: products, orders, and the tombstones of voided orders. */
static const char SCHEMA_V1[] =
    "CREATE TABLE products("
    "  sku TEXT PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  strategy TEXT NOT NULL,"
    "  segments INTEGER NOT NULL,"
    "  per_user_limit INTEGER NOT NULL,"
    "  stock_initial INTEGER NOT NULL,"
    "  sold INTEGER NOT NULL,"
    "  stock_gen INTEGER NOT NULL,"
    "  db_available INTEGER NOT NULL CHECK(db_available >= 0),"
    "  db_version INTEGER NOT NULL,"
    "  cs_delay_ms INTEGER NOT NULL,"
    "  lock_ttl_ms INTEGER NOT NULL,"
    "  created_at TEXT NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE orders("
    "  order_id TEXT PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  user_id TEXT NOT NULL,"
    "  quantity INTEGER NOT NULL CHECK(quantity > 0),"
    "  idempotency_key TEXT UNIQUE,"
    "  created_at TEXT NOT NULL);"
    "CREATE INDEX orders_by_sku ON orders(sku, order_id);"
    "CREATE INDEX orders_by_user ON orders(user_id, order_id);"
    "CREATE TABLE voided_orders("
    "  order_id TEXT PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  voided_at TEXT NOT NULL) WITHOUT ROWID;";

/* Version 2: the units each buyer holds of each product sold by a db
 * strategy with a per-user limit, kept in the order's own transaction.
 * Summing the buyer's order rows instead read, through orders_by_user, every
 * order the buyer ever placed in any SKU, so each order got slower as orders
 * piled up (the soak saw db-optimistic fall from 80 to 20 orders/s). A
 * counter costs the other strategies nothing, where a wider index on orders
 * cost the lua path ~7%. */
static const char SCHEMA_V2[] =
    "CREATE TABLE user_units("
    "  sku TEXT NOT NULL,"
    "  user_id TEXT NOT NULL,"
    "  units INTEGER NOT NULL,"
    "  PRIMARY KEY(sku, user_id)) WITHOUT ROWID;"
    "INSERT INTO user_units(sku,user_id,units)"
    "  SELECT o.sku, o.user_id, sum(o.quantity) FROM orders o JOIN products p ON p.sku=o.sku"
    "  WHERE p.strategy IN ('db','db-optimistic') AND p.per_user_limit > 0"
    "  GROUP BY o.sku, o.user_id;";

/* Version 3: restocks remembered by idempotency key, so a retried restock
 * adds its units once; and a key-value table whose one row the health
 * probe rewrites (a real write: it fails on a full disk or a read-only
 * file, as orders would). */
static const char SCHEMA_V3[] =
    "CREATE TABLE restocks("
    "  idempotency_key TEXT PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  quantity INTEGER NOT NULL CHECK(quantity > 0),"
    "  created_at TEXT NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE meta("
    "  key TEXT PRIMARY KEY,"
    "  value TEXT NOT NULL) WITHOUT ROWID;";

/* Version 4: orders keyed by order_id in the table itself (WITHOUT ROWID:
 * one b-tree less per insert), and the idempotency key indexed only where
 * there is one (orders without a key add nothing to that index). Measured
 * on the group commit of the `lua` path: see docs/performance.md. */
static const char SCHEMA_V4[] =
    "CREATE TABLE orders_v4("
    "  order_id TEXT PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  user_id TEXT NOT NULL,"
    "  quantity INTEGER NOT NULL CHECK(quantity > 0),"
    "  idempotency_key TEXT,"
    "  created_at TEXT NOT NULL) WITHOUT ROWID;"
    "INSERT INTO orders_v4 SELECT order_id,sku,user_id,quantity,idempotency_key,created_at"
    "  FROM orders;"
    "DROP TABLE orders;"
    "ALTER TABLE orders_v4 RENAME TO orders;"
    "CREATE UNIQUE INDEX orders_by_key ON orders(idempotency_key)"
    "  WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX orders_by_sku ON orders(sku, order_id);"
    "CREATE INDEX orders_by_user ON orders(user_id, order_id);";

/* Version 5: the `db-lock` strategy's lock table -- seed 004's "simple
 * database lock": a row per held lock, taken by a unique insert, deleted
 * to release; with an expiry, so that the row of a holder that died is
 * taken over -- and its fencing counter per lock name, which must outlive
 * the rows (a token never goes back). Its statements are locktable.c's; the
 * tables are created here with the rest, so the migrations stay one ordered
 * list in one transaction. */
static const char SCHEMA_V5[] =
    "CREATE TABLE locks("
    "  name TEXT PRIMARY KEY,"
    "  owner TEXT NOT NULL,"
    "  fence INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE lock_fences("
    "  name TEXT PRIMARY KEY,"
    "  fence INTEGER NOT NULL) WITHOUT ROWID;";

/* Version 6: holds (docs/storage.md, "holds"). A product may sell holds:
 * orders whose units are kept out of the stock until paid, cancelled or
 * expired. The order row stays what it was (every order is one); a hold
 * adds a row here, so orders that are confirmed at once cost nothing more.
 * `held` counts the units of reserved holds, as `sold` counts confirmed
 * units. Two partial indexes keep the two scans the service makes cheap
 * however many holds are settled: the reserved ones by deadline (expiry),
 * and those whose units are not yet back in the Redis copy. */
static const char SCHEMA_V6[] =
    "ALTER TABLE products ADD COLUMN hold_seconds INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE products ADD COLUMN held INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE holds("
    "  order_id TEXT PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  quantity INTEGER NOT NULL CHECK(quantity > 0),"
    "  gen INTEGER NOT NULL,"
    "  takes TEXT NOT NULL,"
    "  in_db INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK(state IN ('reserved','confirmed','cancelled','expired')),"
    "  decided_ms INTEGER,"
    "  payment_ref TEXT,"
    "  return_gen INTEGER) WITHOUT ROWID;"
    "CREATE INDEX holds_due ON holds(expires_ms) WHERE state='reserved';"
    "CREATE INDEX holds_returning ON holds(decided_ms) WHERE return_gen IS NOT NULL;";

/* Version 7: fault injection's forcing of an interleaving (stock.h,
 * cs_overlap): the holders a product's critical section waits for. */
static const char SCHEMA_V7[] =
    "ALTER TABLE products ADD COLUMN cs_overlap INTEGER NOT NULL DEFAULT 0;";

int db_exec(sqlite3 *c, const char *sql, char *err, size_t errlen) {
    char *msg = NULL;
    if (sqlite3_exec(c, sql, NULL, NULL, &msg) == SQLITE_OK) return 0;
    snprintf(err, errlen, "%s", msg ? msg : sqlite3_errmsg(c));
    sqlite3_free(msg);
    return -1;
}

int db_user_version(sqlite3 *c) {
    sqlite3_stmt *s;
    int v = -1;
    if (sqlite3_prepare_v2(c, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK) return -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* One write transaction, so two processes opening a new file at once cannot
 * both create it. */
int db_migrate(sqlite3 *c, char *err, size_t errlen) {
    /* Current already (the usual case): no write lock, so a connection
     * opened while another process holds it can still read. */
    if (db_user_version(c) == DB_SCHEMA_VERSION) return 0;
    if (db_exec(c, "BEGIN IMMEDIATE", err, errlen)) return -1;
    int v = db_user_version(c);
    if (v < 0 || v > DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "database schema version %d is not one this build knows (%d)",
                 v, DB_SCHEMA_VERSION);
        goto err;
    }
    if (v == 0 && (db_exec(c, SCHEMA_V1, err, errlen) ||
                   db_exec(c, "PRAGMA user_version=1", err, errlen)))
        goto err;
    if (v < 2 && (db_exec(c, SCHEMA_V2, err, errlen) ||
                  db_exec(c, "PRAGMA user_version=2", err, errlen)))
        goto err;
    if (v < 3 && (db_exec(c, SCHEMA_V3, err, errlen) ||
                  db_exec(c, "PRAGMA user_version=3", err, errlen)))
        goto err;
    if (v < 4 && (db_exec(c, SCHEMA_V4, err, errlen) ||
                  db_exec(c, "PRAGMA user_version=4", err, errlen)))
        goto err;
    if (v < 5 && (db_exec(c, SCHEMA_V5, err, errlen) ||
                  db_exec(c, "PRAGMA user_version=5", err, errlen)))
        goto err;
    if (v < 6 && (db_exec(c, SCHEMA_V6, err, errlen) ||
                  db_exec(c, "PRAGMA user_version=6", err, errlen)))
        goto err;
    if (v < 7 && (db_exec(c, SCHEMA_V7, err, errlen) ||
                  db_exec(c, "PRAGMA user_version=7", err, errlen)))
        goto err;
    /* Later versions add "if (v < N) apply step N" here. */
    if (db_exec(c, "COMMIT", err, errlen)) goto err;
    return 0;
err:
    db_exec(c, "ROLLBACK", err + strlen(err), 0);
    return -1;
}
