/* schema.c: the flashsale database's schema, as the numbered migrations
 * that build it, in each dialect. See docs/storage.md for the tables.
 *
 * The whole schema lives here, the lock table's too (version 5; its
 * statements are locktable.c's): the migrations are one ordered list per
 * dialect (db_schema_sqlite, db_schema_pg), which its driver applies in
 * one transaction to a database that lacks them, and records how far it
 * has come (SQLite: PRAGMA user_version). A new version adds a step here
 * to every dialect's list, and raises DB_SCHEMA_VERSION (db.h); a new
 * dialect adds a list of its own and touches none of the others. */
#include <stddef.h>

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

/* Version 5: the `db-lock` strategy's lock table -- the "simple
 * database lock" of Alibaba Cloud's article "Implementation Principles and
 * Best Practices of Distributed Lock": a row per held lock, taken by a unique insert, deleted
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

/* PostgreSQL's schema, whole at version 7: a server database starts at the
 * version this build knows (its later steps come beside SQLite's). Text
 * keys sort byte by byte (COLLATE "C"), as SQLite's do, so a listing's
 * `after` pages the same on both. */
static const char PG_SCHEMA_V7[] =
    "CREATE TABLE products("
    "  sku TEXT COLLATE \"C\" PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  strategy TEXT NOT NULL,"
    "  segments INTEGER NOT NULL,"
    "  per_user_limit BIGINT NOT NULL,"
    "  stock_initial BIGINT NOT NULL,"
    "  sold BIGINT NOT NULL,"
    "  stock_gen BIGINT NOT NULL,"
    "  db_available BIGINT NOT NULL CHECK(db_available >= 0),"
    "  db_version BIGINT NOT NULL,"
    "  cs_delay_ms INTEGER NOT NULL,"
    "  lock_ttl_ms INTEGER NOT NULL,"
    "  created_at TEXT NOT NULL,"
    "  hold_seconds INTEGER NOT NULL DEFAULT 0,"
    "  held BIGINT NOT NULL DEFAULT 0,"
    "  cs_overlap INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE orders("
    "  order_id TEXT COLLATE \"C\" PRIMARY KEY,"
    "  sku TEXT COLLATE \"C\" NOT NULL,"
    "  user_id TEXT COLLATE \"C\" NOT NULL,"
    "  quantity INTEGER NOT NULL CHECK(quantity > 0),"
    "  idempotency_key TEXT COLLATE \"C\","
    "  created_at TEXT NOT NULL);"
    "CREATE UNIQUE INDEX orders_by_key ON orders(idempotency_key)"
    "  WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX orders_by_sku ON orders(sku, order_id);"
    "CREATE INDEX orders_by_user ON orders(user_id, order_id);"
    "CREATE TABLE voided_orders("
    "  order_id TEXT COLLATE \"C\" PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  voided_at TEXT NOT NULL);"
    "CREATE TABLE user_units("
    "  sku TEXT COLLATE \"C\" NOT NULL,"
    "  user_id TEXT COLLATE \"C\" NOT NULL,"
    "  units BIGINT NOT NULL,"
    "  PRIMARY KEY(sku, user_id));"
    "CREATE TABLE restocks("
    "  idempotency_key TEXT COLLATE \"C\" PRIMARY KEY,"
    "  sku TEXT NOT NULL,"
    "  quantity BIGINT NOT NULL CHECK(quantity > 0),"
    "  created_at TEXT NOT NULL);"
    "CREATE TABLE meta("
    "  key TEXT PRIMARY KEY,"
    "  value TEXT NOT NULL);"
    "CREATE TABLE locks("
    "  name TEXT COLLATE \"C\" PRIMARY KEY,"
    "  owner TEXT NOT NULL,"
    "  fence BIGINT NOT NULL,"
    "  expires_ms BIGINT NOT NULL);"
    "CREATE TABLE lock_fences("
    "  name TEXT COLLATE \"C\" PRIMARY KEY,"
    "  fence BIGINT NOT NULL);"
    "CREATE TABLE holds("
    "  order_id TEXT COLLATE \"C\" PRIMARY KEY,"
    "  sku TEXT COLLATE \"C\" NOT NULL,"
    "  quantity INTEGER NOT NULL CHECK(quantity > 0),"
    "  gen BIGINT NOT NULL,"
    "  takes TEXT NOT NULL,"
    "  in_db INTEGER NOT NULL,"
    "  expires_ms BIGINT NOT NULL,"
    "  state TEXT NOT NULL CHECK(state IN ('reserved','confirmed','cancelled','expired')),"
    "  decided_ms BIGINT,"
    "  payment_ref TEXT,"
    "  return_gen BIGINT);"
    "CREATE INDEX holds_due ON holds(expires_ms) WHERE state='reserved';"
    "CREATE INDEX holds_returning ON holds(decided_ms) WHERE return_gen IS NOT NULL;";

/* Version 8: the tallies of the groups of several writers. On PostgreSQL,
 * a group of one instance adds its orders' units to a row of its own here
 * (its connection's slot) rather than to the SKU's products row, so that
 * two instances' groups of one hot SKU do not wait for each other's
 * COMMIT; a product's sold and held are its row's plus its tallies', and
 * maintenance folds the tallies into the row now and then. SQLite's one
 * writer adds to the products row and leaves this table empty. */
static const char SCHEMA_V8[] =
    "CREATE TABLE product_tallies("
    "  sku TEXT NOT NULL,"
    "  slot INTEGER NOT NULL,"
    "  sold INTEGER NOT NULL,"
    "  held INTEGER NOT NULL,"
    "  PRIMARY KEY(sku, slot)) WITHOUT ROWID;";
static const char PG_SCHEMA_V8[] =
    "CREATE TABLE product_tallies("
    "  sku TEXT COLLATE \"C\" NOT NULL,"
    "  slot BIGINT NOT NULL,"
    "  sold BIGINT NOT NULL,"
    "  held BIGINT NOT NULL,"
    "  PRIMARY KEY(sku, slot));";

/* Version 9: a product's waiting room (stock/room.h): room_turn_ms > 0
 * puts one in front of its orders, a ticket's turn lasting that long;
 * room_rate fixes the rate it admits at (orders a second, all instances
 * together; 0: the order path's measured capacity). Both kept here, the
 * truth, so that a Redis that starts empty cannot sell the product
 * without its room. */
static const char SCHEMA_V9[] =
    "ALTER TABLE products ADD COLUMN room_turn_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE products ADD COLUMN room_rate INTEGER NOT NULL DEFAULT 0;";

/* Version 10: a sale's opening (stock/room.h, the pre-queue): room_opens_ms
 * > 0 is when a product with a room opens (ms since the epoch, Redis's
 * clock); the buyers who ask before it wait in a pre-queue, shuffled at
 * the opening. */
static const char SCHEMA_V10[] =
    "ALTER TABLE products ADD COLUMN room_opens_ms INTEGER NOT NULL DEFAULT 0;";
static const char PG_SCHEMA_V10[] =
    "ALTER TABLE products ADD COLUMN room_opens_ms BIGINT NOT NULL DEFAULT 0;";

const db_migration db_schema_sqlite[] = {
    { 1, SCHEMA_V1 },
    { 2, SCHEMA_V2 },
    { 3, SCHEMA_V3 },
    { 4, SCHEMA_V4 },
    { 5, SCHEMA_V5 },
    { 6, SCHEMA_V6 },
    { 7, SCHEMA_V7 },
    { 8, SCHEMA_V8 },
    { 9, SCHEMA_V9 },
    { 10, SCHEMA_V10 },
};
const int db_schema_sqlite_n = (int)(sizeof db_schema_sqlite / sizeof db_schema_sqlite[0]);

/* A server database starts whole at version 7. */
const db_migration db_schema_pg[] = {
    { 7, PG_SCHEMA_V7 },
    { 8, PG_SCHEMA_V8 },
    { 9, SCHEMA_V9 },
    { 10, PG_SCHEMA_V10 },
};
const int db_schema_pg_n = (int)(sizeof db_schema_pg / sizeof db_schema_pg[0]);
