/* locktable.c: the `db-lock` strategy's lock table. See locktable.h.
 *
 * Its own file because it is its own concept: a lock that happens to live
 * in the flashsale database, next to (not part of) the products and orders
 * of db.c. Its tables are created by db.c's migration to schema 5, and its
 * statements prepared with db.c's when a connection opens (db_int.h). */
#include "db/locktable.h"

#include <stdio.h>

#include "common/clock.h"
#include "db/db_int.h"

/* A dead holder's row is deleted once expired, then the unique insert
 * decides who holds; the counter is bumped in the same transaction. */
const char *const db_lock_sql[DB_LOCK_ST_COUNT] = {
    [DB_LOCK_ST_EXPIRE] = "DELETE FROM locks WHERE name=?1 AND expires_ms<=?2",
    [DB_LOCK_ST_INSERT] =
        "INSERT INTO locks(name,owner,fence,expires_ms)"
        " VALUES(?1,?2,coalesce((SELECT fence FROM lock_fences WHERE name=?1),0)+1,?3)",
    [DB_LOCK_ST_BUMP] =
        "INSERT INTO lock_fences(name,fence) VALUES(?1,1)"
        " ON CONFLICT(name) DO UPDATE SET fence=fence+1 RETURNING fence",
    [DB_LOCK_ST_LEFT] = "SELECT expires_ms-?2 FROM locks WHERE name=?1",
    [DB_LOCK_ST_DELETE] = "DELETE FROM locks WHERE name=?1 AND owner=?2",
};

/* One step of a statement that returns one integer row. */
static db_status step_int(db *d, sqlite3_stmt *s, const char *what, long long *out) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(s, 0);
    sqlite3_reset(s);
    if (rc == SQLITE_ROW) return DB_OK;
    return rc == SQLITE_DONE ? DB_NOTFOUND : db_fail(d, what);
}

/* Held by another: how long its holder's row has left, for the caller's
 * wait (0 when that cannot be read). */
static long long holder_left(db *d, const char *name, long long now) {
    long long left = 0;
    sqlite3_stmt *s = db_lock_stmt(d, DB_LOCK_ST_LEFT);
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, now);
    if (step_int(d, s, "read lock", &left) == DB_ERROR) left = 0;
    return left;
}

db_status db_lock_acquire(db *d, const char *name, const char *owner, long long ttl_ms,
                          int busy_ms, long long *fence, long long *left_ms) {
    long long now = clock_wall_ms();
    *fence = 0;
    *left_ms = 0;
    sqlite3_busy_timeout(db_conn(d), busy_ms > 0 ? busy_ms : 1);
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    sqlite3_stmt *s = db_lock_stmt(d, DB_LOCK_ST_EXPIRE);
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, now);
    st = db_step_done(d, s, "expire lock");
    if (st == DB_OK) {
        s = db_lock_stmt(d, DB_LOCK_ST_INSERT);
        sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, now + ttl_ms);
        st = db_step_done(d, s, "take lock");
    }
    if (st == DB_EXISTS) {
        *left_ms = holder_left(d, name, now);
        db_rollback(d);
        return DB_EXISTS;
    }
    if (st == DB_OK) {
        s = db_lock_stmt(d, DB_LOCK_ST_BUMP);
        sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
        st = step_int(d, s, "count lock", fence);
        if (st == DB_NOTFOUND) st = DB_ERROR;
    }
    if (st != DB_OK) {
        db_rollback(d);
        return st;
    }
    if ((st = db_commit(d)) != DB_OK) {
        /* The row may have landed: it expires after ttl_ms. */
        db_rollback(d);
        return st == DB_BUSY ? DB_BUSY : DB_ERROR;
    }
    *left_ms = ttl_ms;
    return DB_OK;
}

db_status db_lock_release(db *d, const char *name, const char *owner, int busy_ms) {
    sqlite3_busy_timeout(db_conn(d), busy_ms > 0 ? busy_ms : 1);
    sqlite3_stmt *s = db_lock_stmt(d, DB_LOCK_ST_DELETE);
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, owner, -1, SQLITE_STATIC);
    db_status st = db_step_done(d, s, "release lock");
    if (st == DB_OK && sqlite3_changes(db_conn(d)) == 0) return DB_NOTFOUND;
    return st;
}
