/* locktable.c: the `db-lock` strategy's lock table. See locktable.h.
 *
 * Its own file because it is its own concept: a lock that happens to live
 * in the flashsale database, next to (not part of) the products and orders
 * of db.c. Its tables are created by the migration to schema 5 (schema.c),
 * and its statements prepared with db.c's when a connection opens
 * (db_int.h). */
#include "db/locktable.h"

#include <stdio.h>

#include "common/clock.h"
#include "db/db_int.h"

/* A dead holder's row is deleted once expired, then the unique insert
 * decides who holds; the counter is bumped in the same transaction. */
const char *const db_lock_sql[DB_LOCK_ST_COUNT] = {
[DB_LOCK_ST_EXPIRE] = "DELETE FROM locks WHERE name=?1 AND expires_ms<=?2",
[DB_LOCK_ST_INSERT] = "INSERT INTO locks(name,owner,fence,expires_ms)"
        " VALUES(?1,?2,coalesce((SELECT fence FROM lock_fences WHERE name=?1),0)+1,?3)",
[DB_LOCK_ST_BUMP] = "INSERT INTO lock_fences(name,fence) VALUES(?1,1)"
        " ON CONFLICT(name) DO UPDATE SET fence=lock_fences.fence+1 RETURNING fence",
[DB_LOCK_ST_LEFT] = "SELECT expires_ms-?2 FROM locks WHERE name=?1",
[DB_LOCK_ST_DELETE] = "DELETE FROM locks WHERE name=?1 AND owner=?2",
};

#define LOCK_ST(id) (DB_ST_LOCK_FIRST + (id))

/* Held by another: how long its holder's row has left, for the caller's
 * wait (0 when that cannot be read). */
static long long holder_left(db *d, const char *name, long long now) {
    long long left = 0;
    const db_arg a[] = { DB_TEXT(name), DB_INT(now) };
    if (db_one_int(d, LOCK_ST(DB_LOCK_ST_LEFT), a, 2, "read lock", &left) != DB_OK) left = 0;
    return left;
}

db_status db_lock_acquire(db *d, const char *name, const char *owner, long long ttl_ms,
                          int busy_ms, long long *fence, long long *left_ms) {
    long long now = clock_wall_ms();
    *fence = 0;
    *left_ms = 0;
    d->drv->wait_ms(d, busy_ms);
    db_status st = db_begin(d);
    if (st != DB_OK) return st;
    const db_arg ex[] = { DB_TEXT(name), DB_INT(now) };
    st = db_do(d, LOCK_ST(DB_LOCK_ST_EXPIRE), ex, 2, "expire lock", NULL);
    if (st == DB_OK) {
        const db_arg in[] = { DB_TEXT(name), DB_TEXT(owner), DB_INT(now + ttl_ms) };
        st = db_do(d, LOCK_ST(DB_LOCK_ST_INSERT), in, 3, "take lock", NULL);
    }
    if (st == DB_EXISTS) {
        /* PostgreSQL ends a transaction at its first error: the holder's
         * row is read after the rollback. */
        db_rollback(d);
        *left_ms = holder_left(d, name, now);
        return DB_EXISTS;
    }
    if (st == DB_OK) {
        const db_arg b[] = { DB_TEXT(name) };
        st = db_one_int(d, LOCK_ST(DB_LOCK_ST_BUMP), b, 1, "count lock", fence);
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
    d->drv->wait_ms(d, busy_ms);
    const db_arg a[] = { DB_TEXT(name), DB_TEXT(owner) };
    long long changed = 0;
    db_status st = db_do(d, LOCK_ST(DB_LOCK_ST_DELETE), a, 2, "release lock", &changed);
    return st == DB_OK && changed == 0 ? DB_NOTFOUND : st;
}
