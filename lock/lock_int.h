/* lock_int.h: the lock module's insides, shared by its C files and seen by
 * nothing else (lock.h is the public face).
 *
 *   client.c    the client: servers, pooled connections, scripts, running
 *               one script on every server at once, errors and counters
 *   lock.c      acquire (try, wait, Redlock quorum), reentry, release
 *   waker.c     the subscriber thread that turns release notices (and
 *               keyspace notifications of other clients' releases) into
 *               wake-ups of waiting threads
 *   watchdog.c  the renewal thread
 *   fence.c     lock_fenced_set
 *   zk.c        the ZooKeeper backend (zk:// URLs): the lock recipe
 *   zksession.c its sessions (the leases), bounded requests, keeper thread
 *               (zk_int.h: what the two share)
 *   etcd.c      the etcd backend (etcd:// URLs)
 *
 * A client serves one kind of server, chosen by the URL scheme. Redis is
 * built into lock.c and the files above; the other kinds are backends
 * (struct lock_backend): lock.c keeps the generic parts (the held table,
 * reentry counts, handles, lost callbacks, counters) and asks the backend
 * to take, check and free the lock on its server.
 *
 * Locking order: client.mu, then waker.mu, a server's pool_mu or a
 * backend's own mutex; never the other way round. No server I/O happens
 * under client.mu. */
#ifndef FLASHSALE_LOCK_INT_H
#define FLASHSALE_LOCK_INT_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#include "common/rconn.h"
#include "lock/lock.h"

#define LOCK_KEY_MAX (LOCK_NAME_MAX + 64)   /* a derived key or channel */
#define LOCK_WAKE_COUNT 1                   /* live waiters one release wakes */
#define LOCK_DOWN_MS 250                    /* a server that refused: skip it this long */
#define LOCK_WAITER_BUCKETS 256

/* ------------------------------------------------------------------ scripts */

typedef enum lock_script_id {
    LOCK_S_ACQUIRE, LOCK_S_RELEASE, LOCK_S_EXTEND, LOCK_S_SETTLE, LOCK_S_FENCE,
    LOCK_S_COUNT
} lock_script_id;

/* The embedded scripts, initialised once per process. */
const rconn_script *lock_script(lock_script_id id);

/* ---------------------------------------------------------------- the names */

/* The keys and channels a lock name derives (see lock.h, THE FORMAT). */
typedef struct lock_keys {
    const char *name;
    char fence[LOCK_KEY_MAX];
    char queue[LOCK_KEY_MAX];
    char wake[LOCK_KEY_MAX];      /* channel prefix: wake + waiter id */
    char incarnation[LOCK_KEY_MAX];   /* B:incarnation (lock.h, INCARNATIONS) */
} lock_keys;

/* Fills k for name. Returns 0, or -1 with a message in err. */
int lock_keys_make(const char *name, lock_keys *k, char *err, size_t errlen);

/* ----------------------------------------------------------------- servers */

typedef struct lock_server {
    int index;
    rconn_addr addr;              /* guarded by pool_mu when primary is set */
    struct rtopo_primary *primary;   /* a Sentinel-watched server: where addr comes
                                     from (NULL: one fixed server) */
    unsigned version;             /* primary's version addr and idle are of */
    char desc[300];
    pthread_mutex_t pool_mu;      /* guards addr, version, idle, nidle, down_until_us,
                                     down_err */
    redisContext **idle;
    int nidle, cap;
    int64_t down_until_us;        /* connect failed: fail fast until then */
    char down_err[200];
    /* The subscriber connection, guarded by waker.mu; only the waker thread
     * connects or frees it (so it never polls a closed fd). */
    redisContext *sub;
    int sub_broken;               /* a write failed: the waker thread drops it */
    int64_t sub_retry_us;
    unsigned sub_version;         /* primary's version the subscriber connected to */
    int keyspace;                 /* notify-keyspace-events at the subscriber's last
                                     connect: 1 has K and g, -1 not, 0 unknown */
    struct lock_topic *released;  /* our release marker just came: the next message,
                                     if a del of this topic's key, is that release */
} lock_server;

/* --------------------------------------------------------------- the waker */

typedef struct lock_topic lock_topic;

typedef struct lock_waiter {
    char chan[LOCK_KEY_MAX + 48];
    char id[48];                  /* member of the waiter queue */
    size_t chanlen;
    const char *name;             /* the lock name (caller's), for keyspace events */
    unsigned confirmed;           /* servers that confirmed the SUBSCRIBE (bits) */
    int woken;                    /* since last cleared: 1 a release notice came,
                                     2 a keyspace event of a foreign release */
    pthread_cond_t cv;
    struct lock_waiter *next;     /* hash chain */
    lock_topic *topic;            /* the waiters of the same name in this client */
    struct lock_waiter *tnext;    /* ...oldest first */
} lock_waiter;

/* The local waiters of one lock name. A client that does not publish
 * (node-redlock, redis-py) frees a lock with a plain DEL or lets it expire;
 * with Redis keyspace notifications on, that shows as a del/expired event
 * on __keyspace@<db>__:<name>, and the waker wakes the oldest local waiter
 * of the name. Our own releases publish on the marker channel (B:wake:)
 * just before their DEL, so their event is told apart and ignored: their
 * queue already wakes exactly one waiter. */
struct lock_topic {
    char name[LOCK_NAME_MAX + 1];
    char marker[LOCK_KEY_MAX];
    size_t namelen, markerlen;
    lock_waiter *first, *last;
    lock_topic *next;             /* hash chain by name */
    lock_topic *mnext;            /* hash chain by marker */
};

typedef struct lock_waker {
    pthread_mutex_t mu;
    pthread_t thread;
    int started, stop;
    int efd;                      /* eventfd that wakes the thread */
    pthread_cond_t state_cv;      /* a confirmation came or a connection changed */
    lock_waiter *buckets[LOCK_WAITER_BUCKETS];
    lock_topic *topics[LOCK_WAITER_BUCKETS];    /* by name */
    lock_topic *markers[LOCK_WAITER_BUCKETS];   /* by marker channel */
    int nwaiters;
} lock_waker;

/* Adds w (chan, id and name set by the caller) and subscribes it on every
 * server -- and, for the first local waiter of the name, the name's keyspace
 * and marker channels, before w's own, so w's confirmation covers them --
 * starting the waker thread on first use. Then waits (until deadline_us at
 * most) for the servers to confirm. Returns 0, or -1 if the thread could not
 * start (the caller then waits by backoff alone). */
int lock_waiter_add(lock_client *c, lock_waiter *w, int64_t deadline_us);

/* Waits until a release notice arrives or until_us. Returns 1 if woken (and
 * clears the flag), 0 on timeout. */
int lock_waiter_wait(lock_client *c, lock_waiter *w, int64_t until_us);

/* Clears the woken flag before a retry: a notice arriving from here on counts. */
void lock_waiter_clear(lock_client *c, lock_waiter *w);

/* Unsubscribes and removes w. */
void lock_waiter_remove(lock_client *c, lock_waiter *w);

/* Stops the waker thread and drops the subscriber connections. */
void lock_waker_stop(lock_client *c);

/* Fills the keyspace fields of o. */
void lock_waker_stats(lock_client *c, lock_stats *o);

/* ------------------------------------------------------------- backends */

typedef enum lock_kind { LOCK_KIND_REDIS, LOCK_KIND_ZK, LOCK_KIND_ETCD } lock_kind;

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
    int64_t start_us;             /* monotonic: the server confirmed the lease after this */
    int64_t ttl_ms;               /* the lease the server granted (may differ from the asked) */
    /* Non-NULL: the lease is shared and kept by the backend (a ZooKeeper
     * session); lock_remaining_ms reads its end from here. */
    const atomic_int_fast64_t *lease_src;
} lock_took;

/* Whether a hold is still ours, as a check (reentry, renewal) found it. */
typedef enum lock_check { LOCK_CHECK_OURS, LOCK_CHECK_GONE, LOCK_CHECK_UNKNOWN } lock_check;

struct lock_backend {
    const char *name;             /* "zookeeper", "etcd": in messages */
    /* 1: the watchdog renews holds through check() (etcd leases); 0: the
     * backend keeps its leases alive itself (ZooKeeper sessions). */
    int watchdog_renews;
    /* Takes the lock `name` for ttl_ms, waiting until deadline_us
     * (monotonic; INT64_MAX: no deadline; already past: try once). Every
     * server call is bounded by the client's timeout_ms. Returns LOCK_OK
     * (*out filled), LOCK_BUSY (nothing left behind on the server), or
     * LOCK_ERROR (*code, err). */
    lock_status (*acquire)(lock_client *c, const char *name, int64_t ttl_ms, int64_t deadline_us,
                           lock_took *out, lock_errcode *code, char *err, size_t errlen);
    /* Is h still ours on the server? On OURS with a renewable lease,
     * *start_us is when the renewed lease began (else left alone). */
    lock_check (*check)(lock_client *c, lock_hold *h, int64_t *start_us, char *err,
                        size_t errlen);
    /* Frees the lock on the server (never one that is not h's). Does not
     * free h. */
    lock_release_result (*release)(lock_client *c, lock_hold *h, char *err, size_t errlen);
    /* Optional: h is now in the held table (a loss found from here on is
     * reported through lock_holds_lost). */
    void (*held)(lock_client *c, lock_hold *h);
    /* Frees h (called with client.mu held: no I/O, no client.mu). */
    void (*hold_free)(lock_hold *h);
    /* Stops the backend's threads that may call into lock.c (before the
     * held locks are dropped); the backend still serves release(). */
    void (*stop)(lock_client *c);
    /* Frees the backend's state, once every hold is freed. */
    void (*destroy)(lock_client *c);
};

/* Opens the backend for url on c (c->kind, c->be and c->bstate are set on
 * success). Returns 0, or -1 with a message in err. */
int lock_zk_open(lock_client *c, const char *url, char *err, size_t errlen);
int lock_etcd_open(lock_client *c, const char *url, char *err, size_t errlen);

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
    lock_keys keys;
    char id[33];
    uint64_t fence;
    uint64_t incarnation;
    int64_t ttl_ms;
    atomic_int_fast64_t lease_end_us;   /* monotonic */
    const atomic_int_fast64_t *lease_src;   /* backend-kept lease (lock_took), or NULL */
    lock_hold *hold;              /* a backend's record; NULL for Redis */
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

/* ------------------------------------------------------------ the client */

#define LOCK_ENTRY_BUCKETS 1024

struct lock_client {
    lock_kind kind;
    const lock_backend *be;       /* NULL for Redis */
    void *bstate;                 /* the backend's own state */
    lock_server servers[LOCK_MAX_SERVERS];   /* Redis only: nservers is 0 otherwise */
    int nservers, quorum;
    int timeout_ms, watchdog, max_backoff_ms;
    char cid[17];                 /* random client id, in waiter ids */
    atomic_uint_fast64_t waiter_seq;

    pthread_mutex_t mu;           /* the held table, handles, watchdog schedule, error */
    lock_entry *buckets[LOCK_ENTRY_BUCKETS];
    lock_entry *all;
    pthread_cond_t wd_cv;         /* wakes the watchdog (new lock, stop) */
    pthread_cond_t cb_cv;         /* a lost callback returned */
    pthread_t wd_thread;
    int wd_started, stopping;

    lock_waker waker;

    lock_errcode err;
    char errstr[256];

    struct {
        atomic_uint_fast64_t acquired, busy, errors, reentered, attempts, wakeups,
            timeouts, renewals, renew_errors, lost, released, not_owner, unknown,
            keyspace_wakeups;
    } st;
};

/* Frees what lock_client_new made, once its threads and locks are gone. */
void lock_client_destroy(lock_client *c);
/* s's address now into *out, and its version (primary moved: another one;
 * 0 for a Sentinel that has named no primary yet). Thread-safe. */
unsigned lock_server_addr(lock_server *s, rconn_addr *out);
/* s's connection of version just said it is not the primary (READONLY, a
 * failure): look for the primary again. */
void lock_server_suspect(lock_server *s, unsigned version);

/* Releases every lock still held (best effort) and frees entries and
 * handles; the client's threads must be stopped. */
void lock_entries_drop_all(lock_client *c);

/* Sets FD_CLOEXEC on a connection's socket. */
void lock_set_cloexec(redisContext *ctx);

/* Records the client's last error (thread-safe). Returns code. */
lock_errcode lock_set_error(lock_client *c, lock_errcode code, const char *msg);

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
 * Redis, the way libraries that cannot change process-wide signal state do
 * it: block, write, then swallow a SIGPIPE this thread caused. */
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

/* ------------------------------------------------------------ script calls */

/* One script call, to be run on every server. */
typedef struct lock_call {
    rconn_cmd cmd;
    lock_script_id script;
} lock_call;

/* Starts a call: EVALSHA of script with nkeys keys; add keys and arguments
 * to call->cmd afterwards. */
void lock_call_start(lock_call *call, lock_script_id script, int nkeys);

/* The replies of ncalls calls on each server: reply(r, call, server). */
typedef struct lock_replies {
    redisReply **r;               /* [ncalls * nservers]; NULL: no reply (I/O) */
    int ncalls, nservers;
    char err[LOCK_MAX_SERVERS][400];   /* per server: why its replies are missing */
    unsigned stale;               /* servers that said they are not the primary (now) */
} lock_replies;

#define LOCK_REPLY(rs, call, server) ((rs)->r[(call) * (rs)->nservers + (server)])

/* Runs the calls pipelined on the servers in mask (bit i = server i), all
 * servers at once: everything is sent first, then the replies are read, so
 * the time is that of the slowest server, not the sum. Replies of servers
 * that could not be reached are NULL with a reason in rs->err. Returns 0, or
 * -1 when out of memory. Free with lock_replies_free. */
int lock_run(lock_client *c, lock_call *calls, int ncalls, unsigned mask, lock_replies *rs);
void lock_replies_free(lock_replies *rs);

/* Joins the per-server reasons of rs (servers in mask) into buf. */
void lock_replies_why(const lock_client *c, const lock_replies *rs, unsigned mask, char *buf,
                      size_t len);

/* -------------------------------------------------------- the watchdog */

/* Starts the watchdog thread if not yet running. Called with c->mu held.
 * Returns 0, or -1 (the caller's lock then simply is not renewed). */
int lock_watchdog_ensure(lock_client *c);

/* Stops it (c->mu not held). */
void lock_watchdog_stop(lock_client *c);

/* Marks e lost with a reason and calls its handles' on_lost callbacks, one
 * at a time, without c->mu held while they run. Called with c->mu held; e
 * must be pinned by the caller. */
void lock_entry_mark_lost(lock_client *c, lock_entry *e, lock_errcode code, const char *why);

/* Drops one reference to e (c->mu held); frees it at zero. */
void lock_entry_unref(lock_entry *e);

/* Outcome of one script on all servers, counted. */
typedef struct lock_tally {
    int ok, no, io;               /* said yes, said no, no answer */
} lock_tally;

/* Interprets integer replies of call `call` (1 = yes, 0 = no, anything else
 * = no answer) over the servers in mask. */
lock_tally lock_tally_int(const lock_replies *rs, int call, unsigned mask);

#endif
