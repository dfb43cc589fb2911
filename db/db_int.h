/* db_int.h: the db module's insides, shared by its C files and seen by
 * nothing else (db.h and locktable.h are the public faces).
 *
 *   db.c         the connection (opening, prepared statements,
 *                transactions); products and orders
 *   schema.c     the schema, as numbered migrations, and applying them
 *   locktable.c  the `db-lock` strategy's lock table (locktable.h)
 *   holds.c      deciding holds; the scans for the due and the owing (holds.h)
 *   writer.c     group commit (db.h only)
 *
 * A connection prepares every statement once, when it opens (db_open), so
 * a bad statement fails the open and never a call on the hot path. db.c
 * owns the connection and its statement slots; a file with statements of
 * its own lists their SQL in a table here, which db_open prepares with the
 * rest, and reaches them through an accessor that hands them out reset.
 * The schema stays whole in schema.c, the lock table's tables too: the
 * migrations are one ordered list, applied in one transaction. */
#ifndef FLASHSALE_DB_INT_H
#define FLASHSALE_DB_INT_H

#include <sqlite3.h>

#include "db/db.h"

/* ------------------------------------------------- the connection (db.c) */

/* d's SQLite connection (for busy timeouts, sqlite3_changes). */
sqlite3 *db_conn(db *d);

/* Records SQLite's last error on d as "what: message" (db_errstr) and
 * returns DB_BUSY when the database was locked, else DB_ERROR. */
db_status db_fail(db *d, const char *what);

/* Records msg as d's error (db_errstr) and returns DB_ERROR. */
db_status db_error(db *d, const char *msg);

/* Runs s, a statement that returns no rows, and resets it: DB_OK; DB_EXISTS
 * on a constraint (the message in db_errstr); else as db_fail. */
db_status db_step_done(db *d, sqlite3_stmt *s, const char *what);

/* --------------------------------------------------- the schema (schema.c) */

/* Runs sql (any number of statements) on c. Returns 0, or -1 with SQLite's
 * message in err. */
int db_exec(sqlite3 *c, const char *sql, char *err, size_t errlen);

/* The schema version of c's file (PRAGMA user_version; 0: empty), or -1
 * when it cannot be read. */
int db_user_version(sqlite3 *c);

/* Brings c's file to DB_SCHEMA_VERSION, creating it when empty, in one
 * write transaction. Returns 0, or -1 with a message in err (a file of a
 * newer version is refused; a failed step leaves the file as it was). */
int db_migrate(sqlite3 *c, char *err, size_t errlen);

/* ------------------------------------ the lock table's statements (locktable.c) */

typedef enum db_lock_st {
    DB_LOCK_ST_EXPIRE, DB_LOCK_ST_INSERT, DB_LOCK_ST_BUMP, DB_LOCK_ST_LEFT, DB_LOCK_ST_DELETE,
    DB_LOCK_ST_COUNT
} db_lock_st;

/* Their SQL, defined in locktable.c; prepared by db_open on writable
 * connections (a read-only one never takes a lock). */
extern const char *const db_lock_sql[DB_LOCK_ST_COUNT];

/* Statement id of d, reset and with its bindings cleared. */
sqlite3_stmt *db_lock_stmt(db *d, db_lock_st id);

/* ---------------------------------------------- holds' statements (holds.c) */

typedef enum db_holds_st {
    DB_HOLDS_ST_READ, DB_HOLDS_ST_MOVE, DB_HOLDS_ST_PRODUCT, DB_HOLDS_ST_USER,
    DB_HOLDS_ST_OWING, DB_HOLDS_ST_OWED_UNITS, DB_HOLDS_ST_HELD, DB_HOLDS_ST_RETURNED,
    DB_HOLDS_ST_EXPIRE, DB_HOLDS_ST_ANY_DUE, DB_HOLDS_ST_UNHOLD, DB_HOLDS_ST_USER_OF,
    DB_HOLDS_ST_COUNT
} db_holds_st;

/* Their SQL, defined in holds.c; prepared by db_open on writable
 * connections. */
extern const char *const db_holds_sql[DB_HOLDS_ST_COUNT];

/* Statement id of d, reset and with its bindings cleared. */
sqlite3_stmt *db_holds_stmt(db *d, db_holds_st id);

/* Runs a holds job (DECIDE, EXPIRE, RETURNED) inside the writer's open
 * transaction; its status as the job's. */
db_status db_holds_job_in(db *d, db_job *job);

#endif
