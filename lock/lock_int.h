/* lock_int.h: the lock module's insides, shared by its C files and seen by
 * nothing else (lock.h is the public face).
 *
 * A client serves one kind of lock server, chosen by the URL scheme from a
 * table (client.c). Every kind is a backend (struct lock_backend below);
 * the generic part keeps what is the same for all of them -- the held
 * table, reentry counts, handles, lost callbacks, renewal, counters -- and
 * asks the backend to take, check and free the lock on its server. The
 * files, each calling only the ones listed above it:
 *
 *   util.c      helpers every file uses: monotonic condition variables,
 *               threads with signals blocked, SIGPIPE guards, randomness,
 *               incarnation ids, lease drift, the client's last error, and
 *               the lock-order check (lock_mu_take)
 *   held.c      the held table: entries, pins, marking a hold lost and
 *               running its callbacks (lock_holds_lost, for backends)
 *   watchdog.c  the renewal thread: renews every renewable hold through
 *               its backend's check, in batches
 *   rserver.c   Redis: the servers (one, or a Sentinel-watched primary),
 *               pooled connections, the embedded scripts, running one
 *               script on every server at once      (redis_int.h)
 *   waker.c     Redis: the subscriber thread that turns release notices
 *               into wake-ups of waiting threads      (redis_int.h)
 *   zksession.c ZooKeeper: sessions (the leases), bounded requests, the
 *               keeper thread                         (zk_int.h)
 *   etcd.c      the etcd backend (etcd:// URLs)
 *   redis.c     the Redis backend (redis://, redis-sentinel:// URLs): try,
 *               wait for a wake-up, Redlock quorum, extend, release
 *   zk.c        the ZooKeeper backend (zk:// URLs): the lock recipe
 *   fence.c     lock_fenced_set (on a Redis client)
 *   lock.c      the public calls: acquire (reentry, then the backend),
 *               the handles, release
 *   client.c    the client: the table of backends by URL scheme, new,
 *               free, counters
 *
 * Background threads (the watchdog, ZooKeeper's keeper, the waker) report
 * a loss down into held.c, never up into lock.c or client.c.
 *
 * LOCKING ORDER. client.mu (rank 1), then a backend's mutexes: the waker's
 * (2), a Redis server's pool_mu (3), a ZooKeeper or etcd backend's own mutex
 * (2); never the other way round. No server I/O happens under client.mu.
 * Every take goes through lock_mu_take, which asserts the order (in builds
 * with assertions: every build but one with NDEBUG). */
#ifndef FLASHSALE_LOCK_INT_H
#define FLASHSALE_LOCK_INT_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "lock/lock.h"

/* --------------------------------------------------------------- the order */

/* A mutex's place in the locking order: a thread may take a mutex only of a
 * rank above every one it holds. */
typedef enum lock_rank {
    LOCK_RANK_CLIENT = 1,         /* lock_client.mu */
    LOCK_RANK_BACKEND = 2,        /* the waker's mu, a ZooKeeper or etcd backend's mu */
    LOCK_RANK_POOL = 3,           /* a Redis server's pool_mu */
    LOCK_RANK_COUNT
} lock_rank;

/* pthread_mutex_lock(mu), asserting first that the calling thread holds no
 * mutex of this rank or a higher one (the order above), and recording it;
 * lock_mu_drop unlocks. pthread_cond_wait on a taken mutex keeps the
 * record right (the mutex is held again when it returns). */
void lock_mu_take(pthread_mutex_t *mu, lock_rank rank);
void lock_mu_drop(pthread_mutex_t *mu, lock_rank rank);
/* Whether the calling thread holds a mutex of this rank (for assertions). */
int lock_mu_holds(lock_rank rank);

/* ------------------------------------------------------------- backends */

typedef struct lock_backend lock_backend;

/* A backend's record of one hold (the node, the key and lease, ...). Each
 * backend's own struct starts with this header. It is written by the
 * backend's acquire and read-only afterwards, so checks and a release may
 * run on it at once; it is freed with its entry, never before. */
typedef struct lock_hold {
    const lock_backend *be;
} lock_hold;

/* What a backend's acquire hands back on LOCK_OK. */
typedef struct lock_took {
    lock_hold *hold;
    uint64_t fence;
    uint64_t incarnation;         /* of the data fence came from (never 0) */
    uint64_t ticket;              /* fair: the place in line it came through (0: none) */
    int64_t start_us;             /* monotonic: the server confirmed the lease after this */
    int64_t ttl_ms;               /* the lease the server granted (may differ from the asked) */
    /* Non-NULL: the lease is shared and kept by the backend (a ZooKeeper
     * session); lock_remaining_ms reads its end from here. */
    const atomic_int_fast64_t *lease_src;
} lock_took;

/* Whether a hold is still ours, as a check (reentry, renewal) found it. */
typedef enum lock_check { LOCK_CHECK_OURS, LOCK_CHECK_GONE, LOCK_CHECK_UNKNOWN } lock_check;

/* One hold to check, and what the check found. */
typedef struct lock_checking {
    lock_hold *hold;              /* in */
    int64_t ttl_ms;               /* in: the lease to renew to (lock_backend.rearms) */
    lock_check outcome;           /* out */
    /* out, on OURS: the renewed lease began after this (monotonic); left at
     * -1 when the check renews nothing (the backend keeps the lease). */
    int64_t start_us;
    lock_errcode code;            /* out, on UNKNOWN: LOCK_ERR_IO or LOCK_ERR_QUORUM */
    char why[400];                /* out, on GONE or UNKNOWN */
} lock_checking;

struct lock_backend {
    const char *name;             /* "redis", "zookeeper", "etcd": in messages */
    const char *kind;             /* "Redis", "ZooKeeper (zk://)": in URL errors */
    const char *scheme;           /* the URL prefix that picks it; NULL: the default */
    int max_urls;                 /* URLs one client takes (Redlock: several servers) */
    const char *urls_hint;        /* appended to "give ... one URL" */
    /* 1: the watchdog renews holds through check() (Redis, etcd leases); 0:
     * the backend keeps its leases alive itself (ZooKeeper sessions). */
    int watchdog_renews;
    /* 1: a check renews the lease to the ttl it is given (a reentry may
     * re-arm the hold to another length); 0: to the length the server
     * granted at acquire, whatever is asked. */
    int rearms;
    /* Sets the backend up on c from the client's URLs (o->urls, all of this
     * kind, at most max_urls): c->bstate. Returns 0, or -1 with err. */
    int (*open)(lock_client *c, const lock_options *o, char *err, size_t errlen);
    /* Takes the lock `name` for ttl_ms, waiting until deadline_us
     * (monotonic; INT64_MAX: no deadline; already past: try once). Every
     * server call is bounded by the client's timeout_ms. Counts its tries
     * in c->st.attempts. Returns LOCK_OK (*out filled), LOCK_BUSY (nothing
     * left behind on the server), or LOCK_ERROR (*code, err). */
    lock_status (*acquire)(lock_client *c, const char *name, int64_t ttl_ms, int64_t deadline_us,
                           lock_took *out, lock_errcode *code, char *err, size_t errlen);
    /* Is each hold still ours on the server? Renews the leases it can
     * (each[i].ttl_ms); n >= 1. Fills every out field of each[i]. */
    void (*check)(lock_client *c, lock_checking *each, int n);
    /* Frees the lock on the server (never one that is not h's). Does not
     * free h. */
    lock_release_result (*release)(lock_client *c, lock_hold *h, char *err, size_t errlen);
    /* Optional: h is now in the held table (a loss found from here on is
     * reported through lock_holds_lost). */
    void (*held)(lock_client *c, lock_hold *h);
    /* Frees h (called with client.mu held: no I/O, no client.mu). */
    void (*hold_free)(lock_hold *h);
    /* Optional: adds the backend's own figures to *o. */
    void (*stats)(lock_client *c, lock_stats *o);
    /* Stops the backend's threads that may report losses (before the held
     * locks are dropped); the backend still serves release(). */
    void (*stop)(lock_client *c);
    /* Frees the backend's state, once every hold is freed. */
    void (*destroy)(lock_client *c);
};

extern const lock_backend lock_backend_redis, lock_backend_zk, lock_backend_etcd;

/* Marks lost every held entry whose hold matches, running the callbacks
 * (on the calling thread, which must not hold client.mu or any backend
 * mutex). For backends that learn of a loss on their own (a session that
 * ended, a node deleted from outside). Returns how many were marked. */
int lock_holds_lost(lock_client *c, int (*match)(const lock_hold *h, void *arg), void *arg,
                    lock_errcode code, const char *why);

/* ------------------------------------------------------------- held locks */

typedef struct lock_entry lock_entry;

struct lock_handle {
    lock_client *c;
    lock_entry *e;
    void (*on_lost)(lock_handle *h, void *ud);
    void *ud;
    int notified;                 /* on_lost has been (or is being) called */
    int in_cb;                    /* on_lost is running on the watchdog thread */
    int free_after_cb;            /* released from inside its own callback */
    pthread_t cb_thread;          /* the thread running on_lost, while in_cb */
    lock_handle *next;            /* the entry's handles */
};

/* One hold of a name by an owner, shared by its reentrant handles. */
struct lock_entry {
    char name[LOCK_NAME_MAX + 1];
    char owner[LOCK_OWNER_MAX + 1];
    uint64_t fence;
    uint64_t incarnation;
    uint64_t ticket;              /* lock_took.ticket */
    int64_t ttl_ms;
    atomic_int_fast64_t lease_end_us;   /* monotonic */
    const atomic_int_fast64_t *lease_src;   /* backend-kept lease (lock_took), or NULL */
    lock_hold *hold;              /* the backend's record */
    atomic_int lost;
    int64_t next_renew_us;
    int count;                    /* handles */
    int refs;                     /* handles + pins (the watchdog, a reentry) */
    int released;                 /* out of the table: no renewal, no loss */
    lock_errcode err;             /* why the lease ended / last renewal failed */
    char errstr[200];
    lock_handle *handles;
    lock_entry *hnext;            /* hash chain */
    lock_entry *prev, *next;      /* all entries, for the watchdog */
};

/* The hold of name by owner still in the table, or NULL (c->mu held). */
lock_entry *lock_table_find(lock_client *c, const char *name, const char *owner);
/* Puts e into the table (c->mu held). */
void lock_table_insert(lock_client *c, lock_entry *e);
/* Takes e out of the table (c->mu held); it is then released: no renewal,
 * no loss reported. */
void lock_table_remove(lock_client *c, lock_entry *e);

/* Marks e lost with a reason and calls its handles' on_lost callbacks, one
 * at a time, without c->mu held while they run. Called with c->mu held; e
 * must be pinned by the caller. */
void lock_entry_mark_lost(lock_client *c, lock_entry *e, lock_errcode code, const char *why);

/* Calls h's on_lost on this thread, without c->mu (held on entry and on
 * return). lock_release(h) from inside fn is allowed: h is freed after fn. */
void lock_handle_notify(lock_client *c, lock_handle *h);

/* Drops one reference to e (c->mu held); frees it (and its hold) at zero. */
void lock_entry_unref(lock_entry *e);

/* Releases every lock still held (best effort) and frees entries and
 * handles; the client's threads must be stopped. */
void lock_entries_drop_all(lock_client *c);

/* ------------------------------------------------------------ the client */

#define LOCK_ENTRY_BUCKETS 1024

struct lock_client {
    const lock_backend *be;
    void *bstate;                 /* the backend's own state */
    int timeout_ms, watchdog;

    pthread_mutex_t mu;           /* the held table, handles, watchdog schedule, error */
    lock_entry *buckets[LOCK_ENTRY_BUCKETS];
    lock_entry *all;
    pthread_cond_t wd_cv;         /* wakes the watchdog (new lock, stop) */
    pthread_cond_t cb_cv;         /* a lost callback returned */
    pthread_t wd_thread;
    int wd_started, stopping;

    lock_errcode err;
    char errstr[256];

    struct {
        atomic_uint_fast64_t acquired, busy, errors, reentered, attempts, wakeups,
            timeouts, renewals, renew_errors, lost, released, not_owner, unknown,
            keyspace_wakeups, requeued;
    } st;
};

/* Records the client's last error (thread-safe). Returns code. */
lock_errcode lock_set_error(lock_client *c, lock_errcode code, const char *msg);

/* -------------------------------------------------------- the watchdog */

/* Starts the watchdog thread if not yet running. Called with c->mu held.
 * Returns 0, or -1 (the caller's lock then simply is not renewed). */
int lock_watchdog_ensure(lock_client *c);

/* Stops it (c->mu not held). */
void lock_watchdog_stop(lock_client *c);

/* ---------------------------------------------------------------- helpers */

/* drift = ttl * 0.01 + 2 ms, in microseconds. */
int64_t lock_drift_us(int64_t ttl_ms);

/* A condition variable on the monotonic clock. */
void lock_cond_init(pthread_cond_t *cv);
/* Waits on cv until until_us (monotonic) at most. */
void lock_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_us);

/* Starts a module thread with every signal blocked: signals are the
 * application's business, and a write to a closed socket must not kill the
 * process with SIGPIPE. Returns pthread_create's result. */
int lock_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* Suppresses SIGPIPE on the calling (application) thread around writes to
 * a server, the way libraries that cannot change process-wide signal state
 * do it: block, write, then swallow a SIGPIPE this thread caused. */
typedef struct lock_pipe_guard {
    sigset_t old;
    int active;                   /* 0: SIGPIPE is ignored anyway, nothing done */
    int pending_before;
} lock_pipe_guard;
void lock_nosigpipe_begin(lock_pipe_guard *g);
void lock_nosigpipe_end(lock_pipe_guard *g);

/* Fills buf with n random bytes (getrandom). Returns 0 or -1. */
int lock_random(void *buf, size_t n);

/* A new incarnation id: 64 random bits, never 0 (0 is "unnamed"). Returns
 * 0 only when getrandom fails. */
uint64_t lock_incarnation_new(void);
/* Parses an incarnation as stored on a server (16 hex digits, not all
 * zero). Returns it, or 0 when s is not one. */
uint64_t lock_incarnation_parse(const char *s, size_t len);
/* Writes id as 16 lowercase hex digits and a NUL into out[17]. */
void lock_incarnation_hex(uint64_t id, char out[17]);

#endif
