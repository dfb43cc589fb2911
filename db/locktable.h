/* locktable.h: the `db-lock` strategy's lock, a row of a table in the
 * flashsale database (the "simple database lock" of Alibaba Cloud's
 * article "Implementation Principles and Best Practices of Distributed Lock") -- its whole
 * public face. It works on a connection of db.h (db_open); the tables,
 * `locks` and `lock_fences`, are part of its schema (docs/storage.md).
 *
 * A row of `locks` per held lock name, taken by a unique insert (a row of
 * an expired hold is deleted first: a dead holder's lock is taken over once
 * its lease ran out) and deleted to release. Every take bumps the name's
 * counter in `lock_fences` in the same transaction and hands it out as the
 * fencing token: strictly increasing per name, for ever. Expiry is by this
 * host's wall clock. Both calls set the connection's busy timeout to their
 * busy_ms (and leave it so). */
#ifndef FLASHSALE_DB_LOCKTABLE_H
#define FLASHSALE_DB_LOCKTABLE_H

#include "db/db.h"

/* Tries once to take the lock name for owner, waiting at most busy_ms for
 * SQLite's write lock. DB_OK: taken until ttl_ms from now, *fence its
 * token; DB_EXISTS: held by another, whose row has *left_ms left (<= 0:
 * expiring now); DB_BUSY: the database stayed locked by another writer;
 * DB_ERROR. */
db_status db_lock_acquire(db *d, const char *name, const char *owner, long long ttl_ms,
                          int busy_ms, long long *fence, long long *left_ms);

/* Deletes name's row if owner holds it: DB_OK; DB_NOTFOUND when it is not
 * owner's any more (expired and taken over); DB_BUSY or DB_ERROR. */
db_status db_lock_release(db *d, const char *name, const char *owner, int busy_ms);

#endif
