/* pool.h: a process's budget of database connections, and the connections
 * that live within it -- the whole public face of the pool.
 *
 * A PostgreSQL server takes max_connections clients (100 by default, a
 * few kept for superusers), and many instances of the service share one.
 * So an instance opens at most `max` connections, whoever asks: every part
 * of it (the committer, the health probe, the blocking workers, the API
 * pools, maintenance, the lock table) takes a connection here and gives it
 * back. A take finds an idle one, or opens one while fewer than `max` are
 * open, or waits -- a bounded time -- for one to be given back; a take
 * that waited its time out is answered DB_BUSY, so its caller refuses its
 * request honestly instead of queueing without end.
 *
 * Connections are handed out whole: between take and give a connection is
 * its taker's alone (db.h: a handle belongs to one thread at a time). A
 * connection given back with a transaction open has it rolled back, and
 * its lock wait set back to the pool's (a lock-table call may have changed
 * it). Idle connections are closed after a while (db_pool_trim), so an
 * idle instance holds only what it keeps using. */
#ifndef FLASHSALE_DB_POOL_H
#define FLASHSALE_DB_POOL_H

#include <stdint.h>

#include "db/db.h"

typedef struct db_pool db_pool;

/* A connection idle this long is closed by the next give or trim (the
 * default; db_pool_set_idle changes it). */
#define DB_POOL_IDLE_MS 30000

/* A pool of at most max (>= 1) connections to target, each opened with opt.
 * Opens nothing yet. NULL (err set) only when out of memory. */
db_pool *db_pool_new(const char *target, const db_options *opt, int max, char *err,
                     size_t errlen);
/* Closes every connection; none may be out (assert). NULL: nothing. */
void db_pool_free(db_pool *p);

/* Takes a connection into *out: DB_OK; DB_NOCONN when all max were in use
 * for wait_ms (0: do not wait); DB_DOWN or DB_ERROR when one could not be
 * opened (db_open_st: whether the failure may pass).
 * On an error *out is NULL and err says why. Thread-safe. */
db_status db_pool_take(db_pool *p, int wait_ms, db **out, char *err, size_t errlen);
/* Gives back d, taken from p (NULL: nothing). Thread-safe. */
void db_pool_give(db_pool *p, db *d);
/* Closes the connections idle for the pool's idle time or more. */
void db_pool_trim(db_pool *p);
/* Sets the idle time after which a connection is closed (ms, >= 0). */
void db_pool_set_idle(db_pool *p, int idle_ms);

/* The target's text, as given (for a part that reports where it reads). */
const char *db_pool_target(const db_pool *p);
/* The options every connection is opened with. */
const db_options *db_pool_options(const db_pool *p);

typedef struct db_pool_stats {
    int max;                  /* the budget */
    int open;                 /* connections open (or opening) now */
    int in_use;               /* ...of which taken */
    int waiting;              /* takes waiting now */
    uint64_t takes;           /* takes answered DB_OK */
    uint64_t waits;           /* takes that found every connection in use and waited */
    uint64_t timeouts;        /* ...and were answered DB_BUSY */
    uint64_t failures;        /* takes whose connection could not be opened */
    uint64_t opened, closed;  /* connections ever opened / closed */
    uint64_t wait_us;         /* the time takes spent waiting, in all */
} db_pool_stats;

void db_pool_get_stats(db_pool *p, db_pool_stats *out);

#endif
