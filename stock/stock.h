/* stock.h: how flashsale takes stock, one strategy per product.
 *
 * Redis holds a working copy of each SKU's stock; SQLite (db.h) holds the
 * truth. All keys of one SKU share the hash tag {sku}, so they live in one
 * Redis Cluster slot and one Lua script may touch them all:
 *
 *   <prefix>{<sku>}:gen          "<generation>:<redis run_id>" of the copy
 *   <prefix>{<sku>}:stock:<i>    units left in segment i (0 .. segments-1)
 *   <prefix>{<sku>}:pending      order_id -> JSON of a reserved, uncommitted order
 *   <prefix>{<sku>}:users        user_id -> units bought (when a limit applies)
 *   <prefix>{<sku>}:idem:<key>   "<generation>|<order_id>|<fingerprint>"
 *   <prefix>{<sku>}:revoke       order_id -> "<ms>:<instance>": answered 503, to be revoked
 *   <prefix>instance:<id>        heartbeat of a live service instance
 *
 * A copy is valid only for the generation SQLite has for the SKU and only
 * for the Redis process that built it (its run_id): if Redis restarts, with
 * or without its data, every reserve answers STOCK_MISSING until the service
 * rebuilds the copy as stock_initial - sold under a new generation. Pending
 * records make every reservation findable until its order is committed
 * (stock_confirm) or given back (stock_undo), even if the service dies.
 *
 * A stock_conn is one Redis connection (connected lazily, reconnected after
 * errors) with its error state; it belongs to one thread at a time. */
#ifndef FLASHSALE_STOCK_H
#define FLASHSALE_STOCK_H

#include <stddef.h>
#include <stdint.h>

/* Lengths of what the caller hands in, in bytes. The service checks what
 * it takes in against db.h's limits; stock/internal.h asserts that these
 * hold whatever those let in. */
#define STOCK_SKU_MAX 64
#define STOCK_ORDER_ID_MAX 26
#define STOCK_MAX_SEGMENTS 1024
#define STOCK_USER_MAX 512      /* bytes of a user id (128 UTF-8 characters) */
#define STOCK_PREFIX_MAX 63     /* stock_config.prefix */
#define STOCK_INSTANCE_MAX 127  /* stock_config.instance */

typedef enum stock_strategy {
    STOCK_LUA = 0,
    STOCK_LOCK,
    STOCK_REDLOCK,
    STOCK_ZOOKEEPER,
    STOCK_ETCD,
    STOCK_DB_LOCK,
    STOCK_DB,
    STOCK_DB_OPTIMISTIC,
    STOCK_LOCAL,
    STOCK_UNSAFE_READ_WRITE,
    STOCK_UNSAFE_CHECK_THEN_DECR,
    STOCK_UNSAFE_SETNX_EXPIRE,
    STOCK_UNSAFE_LOCK_NO_FENCE,
    STOCK_UNSAFE_UNLOCK_BEFORE_WRITE,
    STOCK_UNSAFE_REDLOCK_NO_FENCE,
    STOCK_UNSAFE_TRUST_REDIS,
    STOCK_DB_FOR_UPDATE,
    STOCK_UNSAFE_CHECK_OUTSIDE_TX,
    STOCK_FAIR_LOCK,
    STOCK_STRATEGY_COUNT
} stock_strategy;

/* How a strategy runs, which decides where the service runs it (the
 * service's order path has one family per kind: service/order/family.h). */
typedef enum stock_kind {
    STOCK_KIND_SCRIPT,        /* one atomic Lua script; batched (stock_reserve, or
                                 stock_async_reserve on an event loop) */
    STOCK_KIND_LOCK,          /* read, check, write under the lock module's lock in
                                 two round trips on an event loop (stock_async_lock_*);
                                 as STOCK_KIND_RCW when no one segment can hold an order */
    STOCK_KIND_RCW,           /* read, check, write in Redis, one order at a time,
                                 possibly waiting for a lock (stock_reserve_one) */
    STOCK_KIND_DB,            /* a conditional UPDATE in the order's SQLite transaction
                                 (the db module's DB_TAKE_CONDITIONAL: no code here) */
    STOCK_KIND_DB_OPTIMISTIC, /* read the version, then a versioned UPDATE there
                                 (db_stock_read, DB_TAKE_OPTIMISTIC) */
    STOCK_KIND_DB_FOR_UPDATE, /* a transaction of the order's own that locks the
                                 product row (SELECT ... FOR UPDATE), checks, writes
                                 and commits (db_order_for_update) */
    STOCK_KIND_COUNT
} stock_kind;

/* Where a strategy's lock lives, when it takes one of the lock module's
 * (or the database's) locks. Each has one row in the table of lock
 * servers (stock/servers.c, stock_lock_server_about): adding a lock server
 * is a name here, a row there (and its backend in lock/). */
typedef enum stock_lock_server {
    STOCK_LOCKS_NONE = 0,     /* no lock, a process mutex, or the articles' SET NX (rcw.c) */
    STOCK_LOCKS_REDIS,        /* the lock module on the service's own Redis (`lock`) */
    STOCK_LOCKS_REDLOCK,      /* the lock module's Redlock over independent Redis servers */
    STOCK_LOCKS_ZOOKEEPER,    /* the lock module's ZooKeeper backend */
    STOCK_LOCKS_ETCD,         /* the lock module's etcd backend */
    STOCK_LOCKS_DB,           /* a row in the SQLite database's lock table (db.h) */
    STOCK_LOCKS_REDIS_FAIR,   /* the lock module's fair lock on the service's own Redis
                                 (`fair-lock`: lock.h, FAIRNESS) */
    STOCK_LOCKS_COUNT
} stock_lock_server;

/* A lock server, as its row says: what it is called, how it is configured
 * (the service's flag, its environment twin and --help line, the URLs it
 * takes), what to tell someone whose strategy needs it, and how the lock
 * module's clients for it are opened. The strategies that use it are the
 * rows of the strategy table naming it (stock_strategy_info.locks). */
typedef struct stock_lock_server_info {
    const char *name;         /* "redlock", "zookeeper"... */
    const char *flag;         /* the flag that configures it ("--etcd"); NULL: always
                                 there (the service's own Redis, the database) */
    const char *env;          /* the flag's environment variable */
    const char *help;         /* the flag's --help line */
    const char *hint;         /* how to start flashsale so that its strategies can run */
    const char *const *schemes;   /* the URL schemes the flag takes (NULL-terminated) */
    const char *form;         /* what one URL must be, for the usage error */
    const char *majority;     /* non-NULL: the flag takes an odd number (3 or more) of
                                 comma-separated URLs, of which this says what */
    int value_max;            /* the flag's value is this many bytes at most */
    int client;               /* a lock module client (lock.h) is opened for it */
    int own_redis;            /* it is the service's own Redis (--redis): its failure is
                                 Redis's (STOCK_UNAVAILABLE), not a lock server's */
    int fair;                 /* its locks are the lock module's fair ones (lock_options) */
    int frozen;               /* also a client renewing nothing (stock_config.locks_frozen):
                                 not where the library renews on threads of its own */
} stock_lock_server_info;

/* The row of lock server srv (< STOCK_LOCKS_COUNT). */
const stock_lock_server_info *stock_lock_server_about(stock_lock_server srv);

struct sk_rcw_lock;

/* A strategy, as the one table of strategies (stock.c) describes it. */
typedef struct stock_strategy_info {
    const char *name;
    stock_kind kind;
    int uses_redis;     /* stock lives in Redis (else in SQLite) */
    int unsafe;         /* oversells by design: a demonstration */
    int segments_ok;    /* segments > 1 allowed */
    const char *about;  /* one line for --help; for unsafe ones: what breaks */
    stock_lock_server locks;   /* where its lock lives (NONE: not a lock of those) */
    const struct sk_rcw_lock *rcw;   /* KIND_RCW / KIND_LOCK: how stock_reserve_one locks
                                        a segment (stock/rcw.c's; NULL: no lock) */
    int trusts_copy;    /* takes any stock copy as valid, whoever built it: no check of
                           its generation's run_id (unsafe: Redis as the truth) */
    int row_locks;      /* needs the database's row locks: PostgreSQL, not SQLite */
} stock_strategy_info;

/* Looks a strategy up by name; returns 0, or -1 if there is none. */
int stock_strategy_parse(const char *name, stock_strategy *out);
const stock_strategy_info *stock_strategy_about(stock_strategy s);

typedef struct stock_hint stock_hint;

/* What the stock module needs to know of a product. Set it up with
 * stock_product_init (which allocates the local hint of empty segments). */
typedef struct stock_product {
    const char *sku;
    stock_strategy strategy;
    int segments;                 /* 1 .. STOCK_MAX_SEGMENTS */
    long long per_user_limit;     /* 0: none */
    int cs_delay_ms;              /* fault injection: pause inside the critical section */
    int lock_ttl_ms;              /* lock strategies: lease; 0: the configured default */
    int cs_overlap;               /* fault injection: 0, or the holders that must be inside
                                     the critical section with the same read before a
                                     holder writes, cs_delay_ms being the longest wait
                                     (rcw.c, "forcing an interleaving"); set after init */
    stock_hint *hint;             /* segments known empty (a hint, never a verdict) */
    int lanes;                    /* 0: all of the SKU in one slot. n: its n segments
                                     spread over a Redis Cluster's slots, segment i a
                                     lane of its own (stock_product_spread) */
    struct stock_product *lane;   /* the lanes, each a one-segment product whose SKU is
                                     "<sku>:<i>" (its keys: <prefix>{<sku>:<i>}:...) */
} stock_product;

/* Fills p (sku must outlive it). Returns 0, or -1 when out of memory. */
int stock_product_init(stock_product *p, const char *sku, stock_strategy s, int segments,
                       long long per_user_limit, int cs_delay_ms, int lock_ttl_ms);
void stock_product_free(stock_product *p);

/* Spreads p (a script-kind strategy, segments > 1) over a Redis Cluster:
 * segment i becomes lane i, a one-segment copy under the hash tag
 * {<sku>:<i>}, so one SKU's sale uses every primary (docs/cluster.md). An
 * order takes from one lane, else from the next; one no lane can hold
 * alone is taken in steps over several (stock_reserve), with undo. Rules
 * that span lanes are not Redis's then: the per-user limit is SQLite's,
 * decided at commit, and an idempotency key is unique in SQLite. Returns
 * 0, or -1 when out of memory (p unchanged). */
int stock_product_spread(stock_product *p);

struct lock_client;
struct db_pool;

/* The kinds of Redis call the stock module makes, for a caller timing them
 * (stock_config.observe). A bounded set: a new kind is a row here and in
 * stock_call_name. */
typedef enum stock_call {
    STOCK_CALL_RESERVE_BATCH,   /* reserve_batch.lua: a loop's `lua` orders of one SKU */
    STOCK_CALL_CLEAR,           /* clearing committed orders' pending records */
    STOCK_CALL_UNDO,            /* undo.lua: giving a reservation back */
    STOCK_CALL_LOCK_READ,       /* lock_read.lua: `lock` on a loop, take and read */
    STOCK_CALL_LOCK_WRITE,      /* lock_write.lua: its fenced write and release */
    STOCK_CALL_RCW,             /* a call of a read-check-write order (stock_reserve_one) */
    STOCK_CALL_OTHER,           /* everything else: pings, reads, scans, loads */
    STOCK_CALL_COUNT
} stock_call;

/* "reserve_batch", "clear", ...: the label of each kind. */
const char *stock_call_name(stock_call c);

/* Told of every Redis call: its kind and the time from sending it to its
 * reply, in microseconds; a failure is told too, with the time it took (a
 * timeout, a refused connect). Runs on the calling thread (an event loop,
 * for the loop-side calls): keep it to a few atomic adds. */
typedef void stock_call_observer(stock_call call, int64_t micros, void *ud);

struct rtopo_primary;
struct rtopo_cluster;

typedef struct stock_config {
    const char *redis_url;        /* one server (redis://, unix:), unless primary is set */
    struct rtopo_primary *primary;   /* where the primary is (rtopo.h): a Sentinel-watched
                                        one is followed across failovers; NULL: redis_url */
    struct rtopo_cluster *cluster;   /* a Redis Cluster (rtopo.h): each SKU's keys on the
                                        node serving their slot; NULL: not a cluster */
    const char *prefix;           /* key prefix, e.g. "fs:" */
    int timeout_ms;               /* connect and command timeout */
    const char *instance;         /* this process's instance id */
    long long idem_ttl_ms;        /* how long idempotency records live */
    /* lock strategies: the lock module's clients by server (REDIS, REDLOCK,
     * ZOOKEEPER, ETCD; NULL: that server is not configured, and its
     * strategies answer STOCK_LOCK_DOWN) */
    struct lock_client *locks[STOCK_LOCKS_COUNT];        /* renewing held leases */
    struct lock_client *locks_frozen[STOCK_LOCKS_COUNT]; /* renewing nothing: used when a
                                         product's injected pause stands for a whole-process
                                         pause (NULL: the renewing one) */
    struct db_pool *db_pool;      /* db-lock: the connections of the lock table's database
                                     (db/pool.h): one is taken for each try and each release */
    int db_wait_ms;               /* ...and how long a take may wait for one */
    int lock_ttl_ms;              /* default lease */
    int lock_wait_ms;             /* how long an order waits for a lock */
    stock_call_observer *observe; /* optional: the time of each Redis call */
    void *observe_ud;
} stock_config;

typedef struct stock_conn stock_conn;

/* Creates a connection handle (it connects on first use). NULL with err set
 * when the configuration is unusable (bad URL). */
stock_conn *stock_conn_new(const stock_config *cfg, char *err, size_t errlen);
void stock_conn_free(stock_conn *c);
/* The last error on c. */
const char *stock_conn_errstr(const stock_conn *c);
/* Connects if not connected. Returns 0 or -1 (see stock_conn_errstr). */
int stock_conn_ensure(stock_conn *c);
/* A round trip (PING). Returns 0 or -1. */
int stock_ping(stock_conn *c);

typedef enum stock_result {
    STOCK_RESERVED = 0,    /* units taken; a pending record exists */
    STOCK_SOLD_OUT,        /* nothing left */
    STOCK_INSUFFICIENT,    /* fewer left than asked (available says how many) */
    STOCK_LIMIT,           /* the per-user limit would be passed (available: bought) */
    STOCK_REPLAY,          /* idempotency key already used under this generation */
    STOCK_MISSING,         /* no valid copy in Redis: rebuild, then retry */
    STOCK_UNAVAILABLE,     /* Redis unreachable or failing (see outcome_unknown) */
    STOCK_LOCK_TIMEOUT,    /* lock strategies: no lock before the wait deadline */
    STOCK_FENCED,          /* lock: the lease ran out before the write, which the
                              fence refused; nothing was taken */
    STOCK_LOCK_DOWN,       /* the lock's server (ZooKeeper, etcd, the Redlock servers,
                              the database's lock table) failed or is not configured
                              here; nothing was taken */
    STOCK_SPREAD           /* a spread product (lanes): no one lane holds the order, all
                              of them together may (available: what they held); take
                              it in steps with stock_reserve on a thread that may block.
                              Nothing was taken */
} stock_result;

/* One reservation. The caller fills the inputs and keeps the strings alive
 * during the call. */
typedef struct stock_req {
    const stock_product *product;
    const char *order_id;
    const char *user_id;
    int quantity;
    const char *idem_key;         /* NULL or "": none */
    const char *fingerprint;      /* identifies the request body for replays */
    int want_takes;               /* keep where the units came from (a hold's) */
    /* out */
    char *takes;                  /* RESERVED with want_takes, or of a spread product:
                                     where the units came from, "<segment>:<units>,..."
                                     (NULL: out of memory); the caller frees it */
    stock_result result;
    long long available;          /* SOLD_OUT/INSUFFICIENT: units left; LIMIT: bought */
    long long gen;                /* RESERVED: generation reserved under */
    int outcome_unknown;          /* UNAVAILABLE after sending: it may have run */
    char replay_order_id[STOCK_ORDER_ID_MAX + 1];
    int replay_same;              /* REPLAY: same fingerprint (else: key reused) */
    int64_t lock_wait_us;         /* lock strategies: time spent getting locks (-1: none) */
    int64_t handoff_us;           /* a lock this order got had just been released by
                                     another order of this process while this one
                                     waited: the time from that release to this
                                     acquire (-1: no such hand-off) */
} stock_req;

/* Reserves each of reqs[0..n) and sets its result. Pipelines all of them in
 * one round trip. Returns 0 when Redis answered every request, -1 when some
 * ended STOCK_UNAVAILABLE. */
int stock_reserve(stock_conn *c, stock_req **reqs, size_t n);

/* Fault injection (a product's cs_delay_ms and cs_overlap): inside a
 * critical section, after the read and the check, waits as the product
 * asks -- a pause, or until cs_overlap holders have been inside with the
 * same read (gen, segment seg, units read), cs_delay_ms at most, the wait
 * counted in <prefix>{<sku>}:cs (docs/storage.md, "Forced
 * interleavings"). The read-check-write strategies call it themselves; a
 * strategy whose critical section is elsewhere (db-for-update's, in a
 * database transaction) calls it there. Redis failing ends the wait. */
void stock_force_wait(stock_conn *c, const stock_product *p, long long gen, int seg,
                      long long units);

/* Reserves one order of a STOCK_KIND_RCW strategy: read, check, write, with
 * the strategy's lock (if any) held around them as the strategy does it.
 * Blocks up to the lock wait deadline plus any injected pause (and, for a
 * lock server that does not answer, its timeouts); run it on a thread that
 * may block. Returns 0, or -1 when the result is UNAVAILABLE. */
int stock_reserve_one(stock_conn *c, stock_req *r);

/* Names an order whose reservation is to be confirmed or given back. */
typedef struct stock_ref {
    const stock_product *product;
    const char *order_id;
    const char *idem_key;         /* NULL or "": none */
    const char *takes;            /* a spread product: where its units came from,
                                     "<lane>:<units>,..." (stock_req.takes); NULL: look in
                                     every lane */
} stock_ref;

/* Clears the pending records of committed orders (pipelined). Returns 0, or
 * -1 when Redis failed (the records are then cleared by reconciliation). */
int stock_confirm(stock_conn *c, const stock_ref *refs, size_t n);

/* Gives back the reservations of orders that will never be committed. Safe
 * to repeat: only an order whose pending record still exists gets its units
 * back. done[i] is set to 1 when order i is known settled (given back now or
 * before). Returns 0, or -1 when Redis failed for some. */
int stock_undo(stock_conn *c, const stock_ref *refs, size_t n, int *done);

/* The units of an ended hold, owed to the stock copy (db/holds.h decided
 * the end and says which generation owes them). */
typedef struct stock_return_req {
    const stock_product *product;
    const char *order_id;
    const char *user_id;
    const char *takes;            /* where they came from, "<segment>:<units>,..."; "" */
    int quantity;
    long long reserve_gen;        /* the generation the hold was reserved under */
    long long return_gen;         /* the generation its end was decided under */
    long long decided_ms;         /* when it was decided (holds.decided_ms: the deciding
                                     clock, wall, Unix ms): names its marker's bucket */
    /* out */
    stock_result result;          /* STOCK_RESERVED: settled (given back now, or before,
                                     or counted by a rebuild); STOCK_MISSING: no copy of
                                     that generation yet (rebuild, then retry);
                                     STOCK_UNAVAILABLE: Redis failed (retry), or
                                     forgotten (below) */
    int given;                    /* given back by this call */
    int forgotten;                /* decided before the copy's forgetting mark (result
                                     STOCK_UNAVAILABLE): a repeat of a return done and
                                     forgotten, or a decision stamped by a clock behind
                                     the others' by more than the keep margin; nothing
                                     was given, and the debt must stay owed */
} stock_return_req;

/* Gives back the units of ended holds, pipelined (return.lua): exactly once
 * per order however often it is repeated, as long as its marker is kept
 * (stock_returned_forget). Returns 0, or -1 when Redis failed for some. */
int stock_return(stock_conn *c, stock_return_req *reqs, size_t n);

/* The markers that make a return exactly-once are kept per time bucket:
 * the marker of an order decided at decided_ms is in the hash
 * "{sku}:returned:<decided_ms / STOCK_RETURNED_BUCKET_MS>", so that they
 * can be forgotten a bucket at a time. Every instance must name the same
 * key for an order: a protocol constant, not an option. */
#define STOCK_RETURNED_BUCKET_MS 10000LL
/* How far back of the watermark found (none: of the new one) a forget
 * looks for buckets: one day, in buckets. */
#define STOCK_RETURNED_LOOKBACK 8640LL

/* The buckets that a raise of the watermark from w_old (0: none yet) to w
 * may delete: those wholly before w, [*first, *end); none when *first >=
 * *end. Pure arithmetic, for stock_returned_forget and its tests. */
void stock_returned_span(long long w_old, long long w, long long *first, long long *end);

/* The watermark that may be set at now_ms: min(now_ms - keep_ms, the
 * decision time of the SKU's oldest debt still owed (oldest_owed_ms; -1:
 * none)), 0 when that is not a time. A marker may go only once its debt is
 * cleared, hence the oldest debt; keep_ms covers a decision stamped before
 * now - keep_ms and committed after the debts were read (its clock read to
 * its commit, and the clock skew between instances). Pure arithmetic. */
long long stock_returned_watermark(long long now_ms, long long keep_ms, long long oldest_owed_ms);

/* The watermark of p's copy (the smallest of its lanes'), 0 when none, in
 * *before_ms. Returns 0, or -1 when Redis failed. */
int stock_returned_mark(stock_conn *c, const stock_product *p, long long *before_ms);

/* Forgets the return markers of p's orders decided before before_ms: raises
 * the watermark "{sku}:returned:before" to before_ms (never lowers it) and
 * deletes the buckets wholly before it, atomically (forget.lua), so that a
 * repeat of a forgotten return is answered `forgotten`, never given again.
 * The caller vouches that every order of p decided before before_ms was
 * given back and its debt cleared, and that no decision still to commit is
 * stamped before it. *forgot_buckets (may be NULL): buckets deleted (or
 * found gone). Returns 0, or -1 when Redis failed (try again later). */
int stock_returned_forget(stock_conn *c, const stock_product *p, long long before_ms,
                          long long *forgot_buckets);

/* Reads the units left, in total and per segment (seg may be NULL; else it
 * has room for product->segments values). Returns STOCK_RESERVED (= ok),
 * STOCK_MISSING or STOCK_UNAVAILABLE. */
stock_result stock_read(stock_conn *c, const stock_product *p, long long *total,
                        long long *seg);

/* Reads the generation of the Redis copy (0 when missing). */
stock_result stock_read_gen(stock_conn *c, const stock_product *p, long long *gen);

/* A user's bought units, for rebuilding the per-user counts. */
typedef struct stock_user_units {
    const char *user_id;
    long long units;
} stock_user_units;

/* Sets the Redis copy of p to `available` units (spread over segments) under
 * generation gen, with the given per-user counts, wiping pending records.
 * Unless force, a copy of a generation >= gen is left alone (another instance
 * rebuilt it first). Returns 0 if loaded, 1 if left alone, -1 on error. */
int stock_load(stock_conn *c, const stock_product *p, long long gen, long long available,
               const stock_user_units *users, size_t nusers, int force);

/* Adds qty units, spread over the segments. STOCK_RESERVED (= ok),
 * STOCK_MISSING (rebuild; SQLite already counts them) or STOCK_UNAVAILABLE. */
stock_result stock_restock(stock_conn *c, const stock_product *p, long long qty);

/* Revoke marks: an order answered 503 while its COMMIT's outcome was
 * unknown must not stand (db_order_revoke). The mark says so to every
 * instance, so that the sweep of another -- the owner having died before
 * revoking it -- revokes the order rather than confirm a row it finds.
 * Each returns 0 (stock_revoke_marked: 1 marked, 0 not) or -1 when Redis
 * failed. */
int stock_revoke_mark(stock_conn *c, const stock_product *p, const char *order_id);
int stock_revoke_marked(stock_conn *c, const stock_product *p, const char *order_id);
int stock_revoke_unmark(stock_conn *c, const stock_product *p, const char *order_id);
/* A mark, as found by stock_revoke_scan: who marked it ("" : not said) and
 * how long ago by that instance's wall clock. A rebuild drops pending
 * records, not marks: a mark without its record is an order still to be
 * revoked whose units the rebuild already counted. */
typedef void stock_mark_fn(const char *order_id, const char *instance, long long age_ms,
                           void *ud);
/* Calls fn for each revoke mark of p. Returns 0 or -1 on error. */
int stock_revoke_scan(stock_conn *c, const stock_product *p, stock_mark_fn *fn, void *ud);

/* A pending record, as found by stock_pending_scan. */
typedef struct stock_pending {
    int lane;                 /* a spread product: the lane it is in (-1: not spread) */
    const char *order_id;
    const char *instance;     /* instance that reserved it */
    const char *idem_key;
    long long quantity;
    long long age_ms;         /* by the Redis clock */
} stock_pending;

/* Calls fn for each pending record of p. Returns 0 or -1 on error. */
int stock_pending_scan(stock_conn *c, const stock_product *p,
                       void (*fn)(const stock_pending *rec, void *ud), void *ud);

/* Marks this instance alive for ttl_ms. Returns 0 or -1. */
int stock_heartbeat(stock_conn *c, long long ttl_ms);
/* Whether instance id has a live heartbeat: 1, 0, or -1 on error. */
int stock_instance_alive(stock_conn *c, const char *instance);

/* ------------------------------------------------------ on an event loop
 *
 * The order path's side: one non-blocking connection per event loop
 * (common/loop.h), whose calls return at once and report through callbacks
 * on the loop's thread. Everything here runs on that thread. A callback may
 * run before the call that queued its work returns (when the work fails at
 * once, with nothing sent). */

#define STOCK_BATCH_MAX 256

/* The rank of a stock handle's loop phase (loop_on_phase; on a cluster
 * only): a spread product's clears of pending records that no batch
 * carried (a lane's batch takes its clears first) go as commands of their
 * own. A caller whose phase sends those batches takes a lower rank, so that
 * only the clears no batch carried are left; the connections' writes come
 * after (ACONN_PHASE_RANK). */
#define STOCK_CLEARS_PHASE_RANK 300

struct loop;
typedef struct stock_async stock_async;

/* A stock handle for loop l (it connects at once, in the background). */
stock_async *stock_async_new(struct loop *l, const stock_config *cfg, char *err, size_t errlen);
/* Frees sa; work not answered yet fails (UNAVAILABLE, outcome unknown). */
void stock_async_free(stock_async *sa);
/* The last connection error. */
const char *stock_async_errstr(const stock_async *sa);
/* Commands sent and not answered yet. */
int stock_async_inflight(const stock_async *sa);

/* The reservations of a batch, each with its result set (as stock_reserve). */
typedef void stock_batch_fn(void *ud, stock_req **reqs, size_t n);
/* Reserves reqs[0..n) (all of product p; n <= STOCK_BATCH_MAX) in one
 * script call, which first clears the pending records of the committed
 * orders in clear[0..nclear) (their ids are copied). Returns how many of the
 * clears it took (the rest: another call). The reqs must stay alive until
 * fn is called. */
size_t stock_async_reserve(stock_async *sa, const stock_product *p, stock_req **reqs, size_t n,
                           const char *const *clear, size_t nclear, stock_batch_fn *fn, void *ud);
/* Clears pending records of committed orders of p (no answer: a failure
 * leaves them to reconciliation). Returns how many it took. */
size_t stock_async_clear(stock_async *sa, const stock_product *p, const char *const *ids,
                         size_t n);
/* A spread product's committed order (its pending records are not carried
 * by the next batch): clears them in each lane named by takes. */
void stock_async_clear_spread(stock_async *sa, const stock_product *p, const char *order_id,
                              const char *takes);
/* done: 1 when the order's units are known given back (now or before). */
typedef void stock_undo_fn(void *ud, int done);
/* Gives back the reservation of an order that will never commit (undo.lua). */
void stock_async_undo(stock_async *sa, const stock_ref *ref, stock_undo_fn *fn, void *ud);
/* stock_revoke_mark on a loop: fn(ud, 1) once the mark is written, (ud, 0)
 * when Redis did not answer that it was. */
void stock_async_revoke_mark(stock_async *sa, const stock_product *p, const char *order_id,
                             stock_undo_fn *fn, void *ud);

/* The `lock` strategy on a loop (lockasync.c): one order holds a segment's
 * lock for two round trips, lock_read (take, raise the fence, read) and
 * lock_write (fenced write, release). */
typedef struct stock_hold {
    int seg;                      /* in: the segment */
    char owner[33];               /* set by lock_read: the owner id taken with */
    uint64_t token;               /* the fencing token */
    long long gen, bought, units; /* what the read found */
    char idem[160];
    long long pttl;               /* lock_read found it held: the holder's lease left */
} stock_hold;

/* res: lock_read: 1 taken (h filled), 0 held by another (h->pttl), -3 no
 * valid copy (r->result MISSING), -1 Redis failed (r->result UNAVAILABLE).
 * lock_write: 1 written (r->result RESERVED), 0 released only, -4 fenced
 * off, -3 copy gone, -1 Redis failed. */
typedef void stock_lock_fn(void *ud, int res);

/* A segment of p for a one-segment lock hold, among first, first+stride,
 * first+2*stride...: from a random start, the first not known to be empty;
 * -1 when all of those look empty. */
int stock_pick_segment(const stock_product *p, uint64_t random, int first, int stride);
void stock_async_lock_read(stock_async *sa, stock_req *r, stock_hold *h, int ttl_ms,
                           stock_lock_fn *fn, void *ud);
/* fair-lock: the same, carrying the join of behind[0..nbehind) (orders
 * that came behind it on this loop, in order): they take their places
 * after its own take or place, in the same call (for another strategy,
 * nothing is joined). */
void stock_async_lock_read_joining(stock_async *sa, stock_req *r, stock_hold *h, int ttl_ms,
                                   stock_hold *const *behind, int nbehind, stock_lock_fn *fn,
                                   void *ud);
/* Checks the read against r: STOCK_RESERVED to write, else the verdict
 * (INSUFFICIENT with r->available: this segment alone is short). */
stock_result stock_lock_check(stock_req *r, const stock_hold *h);
/* write: 1 the fenced write then release, 0 release only. With fn NULL
 * (a release only), r is not touched once this returns. */
void stock_async_lock_write(stock_async *sa, stock_req *r, const stock_hold *h, int write,
                            stock_lock_fn *fn, void *ud);
/* fair-lock: stock_async_lock_write for r (and h, write, fn, ud), then
 * stock_async_lock_read_joining for rn, the next order of the same
 * segment (and hn, ttl_ms, behind, nbehind, nfn, nud), in one call
 * (lock_pass.lua): the lock is handed straight to rn when rn is the head
 * of the line, or the line is empty. fn (if any) hears first, then nfn,
 * each as from its own call. For another strategy: the two calls. */
void stock_async_lock_pass(stock_async *sa, stock_req *r, const stock_hold *h, int write,
                           stock_lock_fn *fn, void *ud, stock_req *rn, stock_hold *hn,
                           int ttl_ms, stock_hold *const *behind, int nbehind,
                           stock_lock_fn *nfn, void *nud);
/* fair-lock (nothing for another strategy): takes the order (h->seg, its
 * owner id) out of its segment's fair line, as it gives up without the
 * lock (nothing if it never had a place). Fire and forget: a leave that
 * fails is made good by its place lapsing. r and h are not touched once
 * this returns. */
void stock_async_lock_leave(stock_async *sa, stock_req *r, stock_hold *h);
/* fair-lock: puts several orders of p's segment seg, waiting on this loop
 * behind others, into the line at once, in arrival order (one call; their
 * owner ids made here if they have none). Fire and forget: one that fails
 * takes its place at its own first lock_read. */
void stock_async_lock_join(stock_async *sa, const stock_product *p, int seg,
                           stock_hold *const *holds, int n);
/* fair-lock: keeps the places of holds[0..n) (orders of p's segment seg
 * waiting on this loop, in line) alive: a place lapses STOCK_FAIR_LEASE_MS
 * after its last call, so the loop calls this every third of that while
 * such orders wait. Fire and forget. */
void stock_async_lock_keep(stock_async *sa, const stock_product *p, int seg,
                           const stock_hold *const *holds, int n);
#define STOCK_FAIR_LEASE_MS 600

/* Writes "<prefix>{<sku>}:<suffix>" into buf (of len bytes). Returns the
 * length, or -1 if it does not fit. Exposed for tests and tools. */
int stock_key(char *buf, size_t len, const char *prefix, const char *sku, const char *suffix);

#endif
