/* db.h: the durable record of flashsale, in SQLite (a file, the default)
 * or PostgreSQL (a server, for instances on several hosts).
 *
 * The database is the source of truth: products (with stock_initial, the units
 * ever put on sale, and sold, the units of committed orders) and orders.
 * Redis holds only a working copy of the stock that can always be rebuilt
 * as stock_initial - sold (see stock.h).
 *
 * Two rules keep Redis and SQLite honest with each other:
 * - Generations. Each product has stock_gen. Every rebuild of the Redis
 *   stock bumps it inside a write transaction, and an order is inserted only
 *   if it was reserved under the current generation. So an order reserved
 *   against a stock copy that has since been rebuilt can never commit, and
 *   the rebuilt copy (computed from `sold` in the same transaction) is exact.
 * - Tombstones. Whoever gives back the stock of an order that is not in the
 *   database first records the order as voided (db_order_void); an order
 *   that is voided can never be inserted afterwards. Both are write
 *   transactions, so exactly one of "committed" and "voided" wins.
 *
 * A `db` handle is one connection (SQLite or PostgreSQL) with its statements; it
 * belongs to one thread at a time. Errors live in the handle (db_errstr).
 * The group-commit writer (db_writer) runs its own thread and connection.
 * The `db-lock` strategy's lock table, in the same database, has a header
 * of its own: db/locktable.h. */
#ifndef FLASHSALE_DB_H
#define FLASHSALE_DB_H

#include <stddef.h>
#include <stdint.h>

#include "common/utctime.h"  /* the rows' times (created_at...): UTC_TIME_LEN */

#define DB_SKU_MAX 64
#define DB_NAME_MAX 256
#define DB_USER_MAX 128
#define DB_KEY_MAX 128
#define DB_ORDER_ID_LEN 26
#define DB_SCHEMA_VERSION 10
#define DB_REF_MAX 128         /* a hold's payment_ref */

typedef enum db_status {
    DB_OK = 0,
    DB_NOTFOUND,     /* no such row */
    DB_EXISTS,       /* the row already exists (product SKU; confirmed order) */
    DB_STALE,        /* order refused: reserved under an old generation, or voided */
    DB_DUPKEY,       /* order refused: its idempotency key belongs to another order */
    DB_NOSTOCK,      /* db strategies: not enough stock in the database */
    DB_LIMIT,        /* db strategies: per-user limit reached */
    DB_CONFLICT,     /* db-optimistic: the version moved; retry */
    DB_BUSY,         /* the database is locked by another writer */
    DB_ERROR,        /* anything else: I/O, read-only file, full disk... */
    DB_UNKNOWN,      /* a commit failed and whether it took effect could not be
                        learned: leave the order to reconciliation */
    DB_NOCONN,       /* no connection of the instance's budget was free in time
                        (db/pool.h): nothing was sent */
    DB_DOWN          /* opening: the server cannot be opened for now -- unreachable,
                        out of connections, or read-only (a standby not promoted
                        yet): trying again may succeed */
} db_status;

typedef struct db db;

typedef struct db_options {
    int synchronous_full;     /* 1: synchronous=FULL (default), 0: NORMAL */
    int busy_timeout_ms;      /* wait this long for another writer's lock */
    int readonly;             /* open read-only (audit, verifier) */
    /* PostgreSQL: a COMMIT not answered in this long (it waits for a
     * synchronous standby that does not answer) is canceled, and its
     * outcome called unconfirmed rather than waited for without end.
     * 0: DB_COMMIT_TIMEOUT_MS. */
    int commit_timeout_ms;
    /* PostgreSQL: any other statement not answered in this long is
     * canceled and its connection dropped: a pooler waiting for a server
     * connection to lend (PgBouncer's pool full), a server that stopped
     * answering. Lock waits end sooner (busy_timeout_ms). 0: no bound
     * (the tools: a migration's batches, an audit's sums). */
    int answer_timeout_ms;
} db_options;

#define DB_COMMIT_TIMEOUT_MS 3000

typedef struct db_product {
    char sku[DB_SKU_MAX + 1];
    char name[DB_NAME_MAX * 4 + 1];   /* UTF-8: up to 256 characters */
    char strategy[32];
    int segments;
    long long per_user_limit;         /* 0: no limit */
    long long stock_initial;          /* units put on sale, restocks included */
    long long sold;                   /* units of committed orders */
    long long stock_gen;              /* generation of the Redis stock copy */
    long long db_available;           /* db strategies: units left */
    long long db_version;             /* db-optimistic: row version */
    int cs_delay_ms;                  /* fault injection: pause in the critical section */
    int lock_ttl_ms;                  /* lock strategies: lease; 0 = default */
    int cs_overlap;                   /* fault injection: holders to wait for (stock.h) */
    char created_at[UTC_TIME_LEN + 1];
    int hold_seconds;                 /* 0: orders confirmed at once; else holds (holds.h) */
    long long held;                   /* units of reserved holds */
    int room_turn_ms;                 /* > 0: a waiting room, a turn this long (stock/room.h) */
    long long room_rate;              /* the room's fixed rate, orders/s (0: measured) */
    long long room_opens_ms;          /* > 0: the sale opens then (Redis's clock, ms since
                                         the epoch); asks before it wait in a pre-queue */
} db_product;

/* Where an order is. An order of a product without holds is CONFIRMED from
 * the start; a hold is RESERVED until exactly one of the other three. */
typedef enum db_order_status {
    DB_ORDER_CONFIRMED = 0,
    DB_ORDER_RESERVED,
    DB_ORDER_CANCELLED,
    DB_ORDER_EXPIRED
} db_order_status;

typedef struct db_order {
    char order_id[DB_ORDER_ID_LEN + 1];
    char sku[DB_SKU_MAX + 1];
    char user_id[DB_USER_MAX * 4 + 1];
    int quantity;
    char idem_key[DB_KEY_MAX + 1];     /* empty: none */
    char created_at[UTC_TIME_LEN + 1];
    long long gen;                     /* generation it was reserved under */
    /* Holds (db/holds.h). */
    db_order_status status;            /* read */
    int64_t expires_ms;                /* insert: hold until then (Unix ms; 0: confirmed at
                                          once); read: a hold's deadline, else 0 */
    int64_t decided_ms;                /* read: when a hold left RESERVED (0: it has not) */
    char payment_ref[DB_REF_MAX * 4 + 1];   /* read: what its confirm carried ("": none) */
    const char *takes;                 /* insert of a hold: where its units came from,
                                          "<segment>:<units>,..." (the caller's string;
                                          NULL: not in Redis) */
} db_order;

/* "confirmed", "reserved", "cancelled", "expired". */
const char *db_order_status_name(db_order_status s);
/* The status of that name, or -1 (NULL: -1). */
int db_order_status_parse(const char *name);

/* Opens (creating or migrating the schema of) the database target names:
 * a libpq URI (postgresql://... or postgres://...) or a SQLite file's
 * path. Returns NULL with a message in err on failure. */
db *db_open(const char *target, const db_options *opt, char *err, size_t errlen);
/* The same, and *st says how it failed: DB_DOWN (the server cannot be
 * opened for now: it may pass) or DB_ERROR (it stays: a file that cannot
 * be opened, a schema not ours, a pooler that cannot carry a
 * transaction...); DB_OK when it opened. */
db *db_open_st(const char *target, const db_options *opt, db_status *st, char *err,
               size_t errlen);
/* Whether the engine target names has row locks (db_row_locks) -- known
 * before it is opened. */
int db_target_row_locks(const char *target);
/* Whether target names a server reached over a connection (PostgreSQL),
 * which may be down or not writable yet for a while -- a failover --,
 * rather than a file (SQLite), whose errors stay. */
int db_target_server(const char *target);
/* target as a log may show it: a URI's password replaced by "***". */
void db_target_redact(const char *target, char *out, size_t len);
/* The engine d runs on: "sqlite" or "postgresql". */
const char *db_kind(const db *d);
void db_close(db *d);
/* The last error of d, for logs and answers. */
const char *db_errstr(const db *d);
/* Bytes SQLite holds in this process now (page caches of every connection,
 * prepared statements), for the metrics. */
long long db_memory_used(void);
/* A write committed and confirmed within timeout_ms as an order's COMMIT
 * is (PostgreSQL: by the synchronous standby; SQLite: at once, nothing is
 * written): DB_OK, and every commit before it is as durable; else an
 * error (a COMMIT not confirmed in time is canceled). */
db_status db_barrier(db *d, int timeout_ms);
/* How long d's statements wait for a lock another connection holds
 * (SQLite: its busy timeout; PostgreSQL: lock_timeout), in ms, until set
 * again (a connection given back to its pool gets the pool's back). */
void db_set_lock_wait(db *d, int ms);
/* A cheap read that fails when the file is unreadable. */
db_status db_ping(db *d);

/* Products. */
db_status db_product_insert(db *d, const db_product *p);
db_status db_product_get(db *d, const char *sku, db_product *out);
/* Every product, in SKU order, as an array the caller frees with free().
 * (A list, not a walk with a callback: a callback that itself walked the
 * products on the same handle would reset the statement under the outer
 * walk, which is how `flashsale audit --repair` once looped for ever.) */
db_status db_product_list(db *d, db_product **out, size_t *n);
/* Adds qty units to stock_initial (and db_available) in one transaction and
 * returns the product. With an idempotency key (NULL or "": none) the
 * restock is recorded under it: a second restock with the same key adds
 * nothing and sets *replayed (DB_OK when it named the same sku and
 * quantity, DB_DUPKEY when not). DB_BUSY / DB_ERROR: nothing was applied;
 * DB_UNKNOWN: the COMMIT failed and may still have landed. */
db_status db_product_restock(db *d, const char *sku, long long qty, const char *idem_key,
                             db_product *out, int *replayed);
/* Whether a restock with this key is committed: DB_OK, DB_NOTFOUND, or an
 * error (to learn the outcome of a restock whose commit failed). */
db_status db_restock_state(db *d, const char *idem_key);
/* A small real write transaction (the health probe): fails as an order's
 * commit would on a locked, full or read-only database. */
db_status db_probe(db *d);
/* Starts a new stock generation: gen = max(gen, min_gen) + 1, in one write
 * transaction that also reads stock_initial, sold and held (and, with
 * user_fn, calls it as db_user_units does), so the caller can set the Redis
 * copy to exactly stock_initial - sold - held under the new generation. */
db_status db_product_new_gen(db *d, const char *sku, long long min_gen, db_product *out,
                             int (*user_fn)(const char *user, long long units, void *ud),
                             void *ud);
/* Calls fn(user_id, units) for each user with orders of sku that count
 * toward the per-user limit (confirmed ones and reserved holds). */
db_status db_user_units(db *d, const char *sku,
                        int (*fn)(const char *user, long long units, void *ud), void *ud);

/* Units of the confirmed orders of sku and of its reserved holds, summed
 * from the rows (the audit's check of products.sold and held). */
db_status db_order_units(db *d, const char *sku, long long *sold, long long *held);
/* The audit's repair of sku: sets its sold and held to the units of its
 * orders' rows, counted in the same transaction under the SKU's locks (no
 * group can count units between the count and the write), and, when
 * in_db (a db strategy's stock), db_available to stock_initial - sold -
 * held. The counts set go to *sold and *held. */
db_status db_product_repair(db *d, const char *sku, int in_db, long long *sold, long long *held);

/* The db strategies' stock: units left and row version. */
db_status db_stock_read(db *d, const char *sku, long long *available, long long *version);

/* Orders (reads). */
db_status db_order_get(db *d, const char *order_id, db_order *out);
db_status db_order_by_key(db *d, const char *idem_key, db_order *out);
/* Lists orders, oldest first (by order_id), filtered by sku and/or user_id
 * (NULL: any) and status (< 0: any), strictly after `after` (NULL: from the
 * start), at most limit. fn is called per order; *more is set when further
 * orders exist. */
db_status db_order_list(db *d, const char *sku, const char *user_id, int status,
                        const char *after, int limit,
                        void (*fn)(const db_order *o, void *ud), void *ud, int *more);
/* Records order_id as voided unless it is already committed: DB_OK when
 * voided (now or before), DB_EXISTS when the order is committed. */
db_status db_order_void(db *d, const char *order_id, const char *sku, const char *reason);
/* Makes sure order_id does not stand: its row deleted if it is there
 * (with its hold, its buyer's units when per_user, and the product's
 * counts -- db_available too when in_db), and the order voided so it can
 * never commit after. For an order whose buyer was answered 503 while its
 * COMMIT's outcome was unknown: a 5xx leaves nothing taken. DB_OK
 * (*removed: whether a row was deleted), or an error, nothing changed. */
db_status db_order_revoke(db *d, const char *order_id, const char *sku, int in_db, int per_user,
                          int *removed);
/* Whether order_id is committed (DB_OK), voided (DB_STALE) or neither
 * (DB_NOTFOUND). */
db_status db_order_state(db *d, const char *order_id);

/* Transactions, for the writer and for tests. */
db_status db_begin(db *d);
db_status db_commit(db *d);
void db_rollback(db *d);

/* How an order insert takes its stock. */
typedef enum db_take {
    DB_TAKE_NONE = 0,       /* stock was reserved elsewhere (Redis) */
    DB_TAKE_CONDITIONAL,    /* `db`: UPDATE ... WHERE available >= qty */
    DB_TAKE_OPTIMISTIC,     /* `db-optimistic`: read version, UPDATE ... WHERE version = v */
    DB_TAKE_FOR_UPDATE,     /* `db-for-update`: SELECT ... FOR UPDATE, check, write */
    DB_TAKE_READ_BEFORE     /* `unsafe-check-outside-tx`: the row locked, and written as
                               the units read before the transaction (expect_version)
                               less the order's: a lost update when two read alike */
} db_take;

/* Inserts o inside the open transaction: a confirmed order, or with
 * o->expires_ms a reserved hold (its units counted in `held`, not `sold`).
 * DB_TAKE_NONE orders must carry the product's current generation. Per-order failures (DB_STALE, DB_DUPKEY,
 * DB_NOSTOCK, DB_LIMIT, DB_CONFLICT) leave the transaction usable;
 * DB_ERROR/DB_BUSY do not. per_user_limit applies to DB_TAKE_* != NONE (the
 * user_units count), and to DB_TAKE_NONE when given (a product spread over
 * a cluster, whose limit no one Redis script sees: the user's orders that
 * count, summed; DB_LIMIT with *available_out the units bought);
 * expect_version to DB_TAKE_OPTIMISTIC (the version the caller read). */
db_status db_order_insert(db *d, const db_order *o, db_take take, long long per_user_limit,
                          long long expect_version, long long *available_out);

/* `db-for-update` and its unsafe twin (the pessimistic
 * lock of Alibaba Cloud's article "Implementation Principles and Best
 * Practices of Distributed Lock", its "Simple Database Lock": select for
 * update): the order
 * in a transaction of its own, which locks the product's row (SELECT ...
 * FOR UPDATE), reads what is left, checks it (take DB_TAKE_FOR_UPDATE; or,
 * DB_TAKE_READ_BEFORE, trusts read_before, the units its caller read and
 * checked before the transaction), writes, inserts the order and commits:
 * the lock is the row's, held until the commit. On PostgreSQL only (SQLite
 * has no row locks: DB_ERROR). Results as db_order_insert's; *available_out
 * the units left (or, refused, found). DB_UNKNOWN: the COMMIT failed and
 * may have landed. */
db_status db_order_for_update(db *d, const db_order *o, db_take take, long long per_user_limit,
                              long long read_before, long long *available_out);
/* Fault injection: fn(ud, units) is called inside the locked critical
 * section of db_order_for_update, after the check and before the write
 * (NULL: none). */
void db_set_critical(db *d, void (*fn)(void *ud, long long units), void *ud);
/* Folds the tallies of several writers' groups (schema version 8) into
 * their products' rows, in one transaction: a product's sold and held do
 * not change, the tallies' table empties. *folded: the products folded.
 * Maintenance runs it now and then on PostgreSQL. */
db_status db_fold_tallies(db *d, long long *folded);
/* Whether d's engine has row locks that a transaction holds until it
 * ends, SELECT ... FOR UPDATE (PostgreSQL). */
int db_row_locks(const db *d);
/* Whether d counts units in tally rows of its own, which db_fold_tallies
 * folds into the products rows now and then (PostgreSQL). */
int db_tallies(const db *d);
/* Whether d's server connection is not its own: a pooler (PgBouncer)
 * stands between and lends it one per transaction or session, so d keeps
 * nothing in the session (no named statements, SET LOCAL per
 * transaction). 0 on SQLite and on a connection to PostgreSQL itself. */
int db_pooled(const db *d);

/* Copies a sale's books -- products, orders, holds, voided orders, the
 * buyers' units, restocks by key, the db-lock fences -- from src into dst,
 * which must be empty (DB_EXISTS, with the reason in dst's error, when it
 * is not), in one transaction of dst: a copy that fails leaves dst as it
 * was. progress (NULL: none) is called every 100,000 rows of a table
 * (done 0) and when a table is copied (done 1). Errors are dst's
 * (db_errstr); one of src's is told as "source: ...". (`flashsale
 * migrate`: copy.c.) */
db_status db_copy_into(db *src, db *dst,
                       void (*progress)(const char *table, long long rows, int done, void *ud),
                       void *ud);

/* Group commit. One thread, one connection: jobs submitted from any thread
 * are committed together in one transaction (one fsync for the group), and
 * then handed back in one call of the done callback, on the writer thread. */
/* DECIDE, EXPIRE and RETURNED are holds' work (db/holds.h), queued and
 * waited for by the db_writer_* calls declared there. */
typedef enum db_job_kind {
    DB_JOB_INSERT, DB_JOB_LOOKUP, DB_JOB_DECIDE, DB_JOB_EXPIRE, DB_JOB_RETURNED
} db_job_kind;

struct db_job_wait;

typedef struct db_job {
    db_job_kind kind;
    db_order order;            /* INSERT: the order; LOOKUP: order_id set */
    db_take take;
    long long per_user_limit;
    long long expect_version;  /* DB_TAKE_OPTIMISTIC */
    /* out */
    db_status status;          /* INSERT: DB_OK when committed; LOOKUP: found? */
    long long available;       /* db strategies: units left after / when refused */
    void *arg;                 /* DECIDE, EXPIRE, RETURNED: what to do (writer.c) */
    struct db_job_wait *wait;  /* ...and where its caller waits for it */
    struct db_job *next;       /* owned by the writer while queued */
} db_job;

typedef struct db_writer db_writer;

/* Called on the writer thread once per group, after the commit (or its
 * failure) with every job of the group and its status set. The jobs belong
 * to the caller again from then on. */
typedef void db_batch_done(db_job **jobs, size_t n, void *ud);

/* Starts the writer on conn, which is its alone until db_writer_stop
 * returns; the caller closes (or gives back) conn after that. NULL (err
 * set) when the thread cannot start. */
db_writer *db_writer_start(db *conn, size_t max_batch, db_batch_done *done, void *ud, char *err,
                           size_t errlen);
/* Told of each group commit that held orders: how many orders (inserts;
 * lookups are not counted) the transaction held, the time from its BEGIN to
 * its COMMIT (or rollback) in microseconds, and whether it committed. On
 * the committing thread, once per group: keep it cheap. */
typedef void db_commit_observer(size_t orders, int64_t micros, int ok, void *ud);
/* Sets w's commit observer (NULL: none). Call before submitting jobs. */
void db_writer_observe(db_writer *w, db_commit_observer *fn, void *ud);
/* Paces w's groups: a group starts no sooner than gap_us after the one
 * before it started, and takes what queued meanwhile (0: at once, the
 * default). A commit's fsync costs the committing thread CPU (on a
 * virtual disk a VM exit per flush, ~0.1-0.2 ms), and unpaced a steady
 * stream of orders commits as often as the disk allows -- a thousand or
 * more groups a second of a few orders each -- spending on flushes the
 * CPU a container's quota would give to orders. An order after a quiet
 * spell (no group in the last gap_us) still commits at once. Call before
 * submitting jobs. */
void db_writer_pace(db_writer *w, int gap_us);

/* Queues job (thread-safe). */
void db_writer_submit(db_writer *w, db_job *job);
/* Queues jobs[0..n) at once: one lock and one wake for the lot. */
void db_writer_submit_many(db_writer *w, db_job **jobs, size_t n);
/* Whether the calling thread is w's writer thread (where the done callback
 * runs): for assert. */
int db_writer_on_thread(const db_writer *w);
typedef struct db_writer_stats {
    uint64_t groups;          /* transactions attempted */
    uint64_t jobs;            /* jobs handled */
    uint64_t failures;        /* transactions that failed */
    int last_failed;          /* the most recent transaction failed */
} db_writer_stats;

/* Counters, for /metrics and /healthz. */
void db_writer_get_stats(db_writer *w, db_writer_stats *out);
/* Commits everything queued, then stops the thread and frees w (not its
 * connection). */
void db_writer_stop(db_writer *w);

#endif
