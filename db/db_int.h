/* db_int.h: the db module's insides, shared by its C files and seen by
 * nothing else (db.h, holds.h and locktable.h are the public faces).
 *
 *   db.c         products and orders; the statements' table; the calls
 *                every file makes to run a statement (db_run, ...)
 *   holds.c      deciding holds; the scans for the due and the owing (holds.h)
 *   locktable.c  the `db-lock` strategy's lock table (locktable.h)
 *   writer.c     group commit (db.h), and holds decided through it
 *                (holds.h's db_writer_*: it calls holds.c, never back)
 *   schema.c     the schema, as numbered migrations, in each dialect
 *   sqlite.c     the SQLite driver
 *   pg.c         the PostgreSQL driver
 *
 * The logic is written once, against a driver: a table of functions that
 * run one statement with typed arguments and hand its rows out (struct
 * db_driver, below), as lock/ has a backend per lock server. Every
 * statement has an id and, where every dialect words it alike, one text
 * with ?N parameters (a driver puts in its own parameter marks); one that
 * dialects word apart has no common text, and each driver has its own (its
 * db_driver.sql). What an engine can do (row locks) and which targets are
 * its are the driver's too: a third database is a driver file and a line
 * in db.c's list of drivers, and touches no statement elsewhere. No
 * driver's type (sqlite3_stmt, PGresult) leaves its file. */
#ifndef FLASHSALE_DB_INT_H
#define FLASHSALE_DB_INT_H

#include "db/db.h"

/* ------------------------------------------------------------ statements */

/* Every statement, by id: db.c's, then the lock table's, then holds'. */
enum {
    DB_ST_PRODUCT_INSERT, DB_ST_PRODUCT_GET, DB_ST_PRODUCT_ALL, DB_ST_PRODUCT_RESTOCK,
    DB_ST_PRODUCT_GEN, DB_ST_USER_UNITS, DB_ST_ORDER_INSERT_GEN, DB_ST_ORDER_INSERT_ANY,
    DB_ST_HOLD_INSERT, DB_ST_ADD_SOLD, DB_ST_ORDER_GET, DB_ST_ORDER_BY_KEY, DB_ST_ORDER_EXISTS,
    DB_ST_VOID_EXISTS, DB_ST_VOID_INSERT, DB_ST_ORDER_UNITS, DB_ST_HELD_UNITS,
    DB_ST_PRODUCT_REPAIR, DB_ST_TALLY_CLEAR, DB_ST_TALLY_ADD, DB_ST_FOLD_LOCK, DB_ST_FOLD, DB_ST_FOLD_CLEAR, DB_ST_TAKE_CONDITIONAL, DB_ST_TAKE_VERSIONED, DB_ST_USER_ORDERS,
    DB_ST_USER_SUM, DB_ST_USER_ADD, DB_ST_STOCK_READ, DB_ST_RESTOCK_GET, DB_ST_RESTOCK_INSERT,
    DB_ST_PROBE, DB_ST_GEN_READ, DB_ST_PRODUCT_LOCK, DB_ST_SKU_SHARED, DB_ST_SKU_EXCLUSIVE,
    DB_ST_DUE_SKUS_SHARED, DB_ST_KEY_OWNER, DB_ST_PING, DB_ST_BEGIN, DB_ST_COMMIT, DB_ST_ROLLBACK,
    DB_ST_SAVEPOINT, DB_ST_ROLLBACK_TO, DB_ST_RELEASE, DB_ST_STOCK_FOR_UPDATE, DB_ST_TAKE_SET,
    DB_ST_ORDER_DELETE, DB_ST_HOLD_DELETE, DB_ST_USER_SUB,
    DB_ST_LOCK_FIRST                /* the lock table's: DB_LOCK_ST_* from here */
};

typedef enum db_lock_st {
    DB_LOCK_ST_EXPIRE, DB_LOCK_ST_INSERT, DB_LOCK_ST_BUMP, DB_LOCK_ST_LEFT, DB_LOCK_ST_DELETE,
    DB_LOCK_ST_COUNT
} db_lock_st;

typedef enum db_holds_st {
    DB_HOLDS_ST_READ, DB_HOLDS_ST_MOVE, DB_HOLDS_ST_PRODUCT, DB_HOLDS_ST_USER,
    DB_HOLDS_ST_OWING, DB_HOLDS_ST_OWED_UNITS, DB_HOLDS_ST_HELD, DB_HOLDS_ST_RETURNED,
    DB_HOLDS_ST_EXPIRE, DB_HOLDS_ST_ANY_DUE, DB_HOLDS_ST_UNHOLD, DB_HOLDS_ST_USER_OF,
    DB_HOLDS_ST_OLDEST_OWED, DB_HOLDS_ST_COUNT
} db_holds_st;

#define DB_ST_HOLDS_FIRST (DB_ST_LOCK_FIRST + DB_LOCK_ST_COUNT)
#define DB_ST_COUNT (DB_ST_HOLDS_FIRST + DB_HOLDS_ST_COUNT)

/* Their common text (NULL: each driver words it its own way): db.c's own
 * table, and those of locktable.c and holds.c. */
extern const char *const db_lock_sql[DB_LOCK_ST_COUNT];
extern const char *const db_holds_sql[DB_HOLDS_ST_COUNT];
struct db_driver;
/* The text drv runs for statement id (0 <= id < DB_ST_COUNT): its own
 * when it has one, else the common one. Never NULL. */
const char *db_sql_of(const struct db_driver *drv, int id);
/* Whether a read-only connection prepares statement id. */
int db_st_reads(int id);

/* ------------------------------------------------------------- arguments */

/* One argument of a statement: an integer, a text (NULL: SQL NULL), or
 * NULL. The caller's text must outlive the run. */
typedef struct db_arg {
    char kind;                  /* 'i', 't', 'n' */
    long long i;
    const char *s;
} db_arg;

#define DB_INT(v) ((db_arg){ 'i', (long long)(v), NULL })
#define DB_TEXT(v) ((db_arg){ (v) ? 't' : 'n', 0, (v) })
/* A text that is NULL when empty (an absent idempotency key). */
#define DB_TEXT0(v) ((db_arg){ (v) && *(v) ? 't' : 'n', 0, (v) })
#define DB_NULL ((db_arg){ 'n', 0, NULL })
#define DB_NARGS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* --------------------------------------------------------------- a run */

/* A statement being run: its rows, read one at a time (db_next), then
 * closed (db_done). Lives on the caller's stack. */
typedef struct db_rows {
    db *d;
    int st;                     /* its id, or -1: ad hoc */
    void *h;                    /* the driver's */
    long row;                   /* the driver's */
    int state;                  /* the driver's */
} db_rows;

/* What a unique constraint that refused a write guarded (d->conflict). */
typedef enum db_conflict {
    DB_CONFLICT_NONE, DB_CONFLICT_PRIMARY, DB_CONFLICT_UNIQUE
} db_conflict;

/* A database engine. Every function runs on the connection's one thread. */
typedef struct db_driver {
    const char *name;           /* "sqlite", "postgresql" */
    /* Whether target names a database of this engine (NULL: any target;
     * db.c asks the drivers in its list's order, this one last). */
    int (*claims)(const char *target);
    /* Whether it has row locks (SELECT ... FOR UPDATE) that a transaction
     * holds until it ends (db_row_locks). */
    int row_locks;
    /* Whether a write transaction holds the whole database, so that no
     * other writer's transaction runs beside it (SQLite's file). */
    int one_writer;
    /* Whether the database is a server reached over a connection, which
     * may be down, or not writable yet, for a while (a failover), rather
     * than a file (db_target_server). */
    int server;
    /* Optional (NULL: shown as it is): target as a log may show it, its
     * secrets (a password) replaced by "***". */
    void (*redact)(const char *target, char *out, size_t len);
    /* Its own text of the statements it words its own way, by id
     * (DB_ST_COUNT entries, NULL: the common text; every statement
     * without a common text has one here). ?N parameters. */
    const char *const *sql;
    /* Opens (and migrates, unless read-only) the database at target into
     * d->impl. 0; or -1 with err filled, or -2 when the failure may pass
     * (a server that cannot be reached, or is not writable, for now). */
    int (*open)(db *d, const char *target, const db_options *opt, char *err, size_t errlen);
    void (*close)(db *d);
    /* Runs statement st (sql: an ad hoc one's SQLite text, st -1) with
     * args into r, whose rows db_next then hands out. DB_OK; DB_EXISTS
     * when a unique constraint refused it (d->conflict says which);
     * DB_BUSY when another holds the lock it waited for; else DB_ERROR,
     * with d's errstr set ("what: message"). */
    db_status (*run)(db *d, db_rows *r, int st, const char *sql, const db_arg *args, int n,
                     const char *what);
    /* The next row: 1; 0 at the end; -1 on an error (d's errstr and
     * d->last set). */
    int (*next)(db_rows *r);
    long long (*col_int)(db_rows *r, int col);
    /* A column as text: "" for NULL; valid until the next row. */
    const char *(*col_text)(db_rows *r, int col);
    /* Whether a column is NULL. */
    int (*col_null)(db_rows *r, int col);
    /* Rows the run changed (after its rows are read). */
    long long (*changes)(db_rows *r);
    void (*done)(db_rows *r);
    /* Whether a transaction is open. */
    int (*in_tx)(db *d);
    /* How long a statement may wait for a lock another connection holds. */
    void (*wait_ms)(db *d, int ms);
    /* Optional (NULL: none). Inside the open transaction, inserts the
     * orders of jobs[0..n) that db_group_insert names -- those reserved in
     * Redis, and the db strategies' takes -- in a few exchanges with the
     * server, by the same rules as db_order_insert: each gets the status
     * db_order_insert would give it (and its available), its units are
     * counted in products before this returns. DB_OK, or an error that
     * fails the whole group. With commit (every job of the group is one of
     * those, or a lookup), it also commits the transaction, in the same
     * exchange, and on a failure sets *commit_unknown when the COMMIT was
     * sent and whether it ran cannot be told. */
    db_status (*insert_group)(db *d, db_job **jobs, size_t n, int commit, int *commit_unknown);
    /* Optional (NULL: none): this connection's row of product_tallies,
     * where its units go instead of the products row (schema.c, version
     * 8), as text. */
    const char *(*tally_slot)(db *d);
    /* Optional (NULL: every COMMIT is durable when it returns). Outside a
     * transaction, commits a write and waits up to timeout_ms for it to
     * be confirmed as a COMMIT is (PostgreSQL: by the synchronous
     * standby), which confirms every commit before it too. DB_OK, or an
     * error (d->unconfirmed set when it was canceled). */
    db_status (*barrier)(db *d, int timeout_ms);
    /* Optional (NULL: never): whether the server connection is not this
     * client's own (db_pooled). */
    int (*pooled)(const db *d);
} db_driver;

enum { DB_UNCONFIRMED_CANCELED = 1, DB_UNCONFIRMED_DROPPED = 2 };

/* Whether job is an order reserved in Redis whose insert needs nothing
 * but the rule (no stock taken here, no per-user limit to count). */
int db_plain_insert(const db_job *job);
/* Whether a driver's insert_group takes job: a plain insert, or a take of
 * `db` or `db-optimistic`. */
int db_group_insert(const db_job *job);

extern const db_driver db_sqlite_driver, db_pg_driver;

struct db {
    const db_driver *drv;
    void *impl;                 /* the driver's connection */
    db_conflict conflict;       /* the last DB_EXISTS's constraint */
    db_status last;             /* the last error db_next met */
    int readonly;
    int commit_timeout_ms;      /* db_options.commit_timeout_ms, its default applied */
    /* Statements a run is stepping through. Running one of them again
     * (which, on SQLite, resets it) would restart the outer walk: that is
     * how `audit --repair` once audited products twice and never ended. */
    unsigned char walking[DB_ST_COUNT];
    /* Fault injection: called in db_order_for_update's critical section. */
    void (*critical)(void *ud, long long units);
    void *critical_ud;
    /* How the driver's last COMMIT ended when it did not say: 0 (it
     * answered), DB_UNCONFIRMED_CANCELED (not answered within the
     * commit timeout and canceled -- on PostgreSQL a COMMIT waiting for
     * its synchronous standby is then committed here, but perhaps not on
     * the standby) or DB_UNCONFIRMED_DROPPED (the cancel went unanswered
     * too: the connection was dropped, and the server may still be
     * committing it). Set by every COMMIT; read by the writer. */
    int unconfirmed;
    /* What a write transaction owes the products table (db.c). */
    void *tally;
    /* SKU locks the open transaction took (db_sku_shared, ...), so that
     * db_count_units can assert it counts under one. */
    int sku_locks;
    char errstr[512];
};

/* ------------------------------------------------------------ running */

/* Runs statement st into r (see db_driver.run). */
db_status db_run(db *d, db_rows *r, int st, const db_arg *args, int n, const char *what);
/* The same for an ad hoc statement (SQLite's text, ?N parameters). */
db_status db_run_sql(db *d, db_rows *r, const char *sql, const db_arg *args, int n,
                     const char *what);
/* The next row: 1, 0 at the end, -1 on an error (its status in d->last). */
int db_next(db_rows *r);
long long db_col_int(db_rows *r, int col);
const char *db_col_text(db_rows *r, int col);
int db_col_null(db_rows *r, int col);
long long db_changes(db_rows *r);
void db_done(db_rows *r);

/* Adds sold and held units to the counts of sku, whose stock is a Redis
 * copy's: to this connection's tally row where the driver has one
 * (PostgreSQL: no wait for another instance's COMMIT), else to the
 * products row (DB_NOTFOUND when there is none). The caller holds the
 * SKU's shared lock (db_sku_shared). */
db_status db_count_units(db *d, const char *sku, long long sold, long long held);
/* The SKU's lock, until the transaction ends: shared by every transaction
 * that counts units of a Redis copy's SKU or decides one of its holds,
 * exclusive for one that starts a new generation of the copy or voids an
 * order of it. On SQLite the write transaction holds the file: nothing to
 * take. DB_OK or an error. */
db_status db_sku_shared(db *d, const char *sku);
db_status db_sku_exclusive(db *d, const char *sku);
/* The shared locks of the SKUs of the holds due at now_ms, in SKU order
 * (an expiry sweep's, before it ends them). DB_OK or an error. */
db_status db_due_skus_shared(db *d, long long now_ms);

/* Runs st, which returns no rows: DB_OK, with *changes set when given. */
db_status db_do(db *d, int st, const db_arg *args, int n, const char *what, long long *changes);
/* Runs st and reads the first column of its first row into *out:
 * DB_OK, DB_NOTFOUND when there is no row, or an error. */
db_status db_one_int(db *d, int st, const db_arg *args, int n, const char *what,
                     long long *out);

/* Records msg as d's error (db_errstr) and returns DB_ERROR. */
db_status db_error(db *d, const char *msg);
/* Sets d's error from a driver: "what: msg", and returns st. */
db_status db_set_error(db *d, db_status st, const char *what, const char *msg);

/* ---------------------------------------------------- the schema (schema.c) */

/* One step of the schema in one dialect: the version it brings a
 * database to, and its statements (NULL: the step does nothing there). */
typedef struct db_migration {
    int version;
    const char *sql;
} db_migration;

/* The steps in each dialect, version 1 first (a dialect may start
 * later, whole at that version); DB_SCHEMA_VERSION is the last. */
extern const db_migration db_schema_sqlite[], db_schema_pg[];
extern const int db_schema_sqlite_n, db_schema_pg_n;

#endif
