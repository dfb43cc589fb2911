/* redis_int.h: the Redis backend's insides, shared by its files and seen by
 * nothing else (lock_int.h is the lock module's; lock.h documents the
 * format on the server).
 *
 *   rserver.c   the servers and their pooled connections, the embedded
 *               scripts, running one script on every server at once
 *   waker.c     the subscriber thread: release notices -> wake-ups
 *   redis.c     the lock on top: try, wait, Redlock quorum, extend,
 *               release; the backend's entry points
 *   fence.c     lock_fenced_set
 *
 * One lock_redis per client (lock_client.bstate). Its mutexes: waker.mu
 * (LOCK_RANK_BACKEND), then a server's pool_mu (LOCK_RANK_POOL). */
#ifndef FLASHSALE_LOCK_REDIS_INT_H
#define FLASHSALE_LOCK_REDIS_INT_H

#include <hiredis/hiredis.h>

#include "common/rconn.h"
#include "lock/lock_int.h"

#define LOCK_KEY_MAX (LOCK_NAME_MAX + 64)   /* a derived key or channel */
#define LOCK_WAKE_COUNT 1                   /* live waiters one release wakes */
#define LOCK_DOWN_MS 250                    /* a server that refused: skip it this long */
#define LOCK_WAITER_BUCKETS 256

typedef struct lock_redis lock_redis;

/* ------------------------------------------------------------------ scripts */

typedef enum lock_script_id {
    LOCK_S_ACQUIRE, LOCK_S_RELEASE, LOCK_S_EXTEND, LOCK_S_SETTLE, LOCK_S_FENCE,
    LOCK_S_FAIR_ACQUIRE, LOCK_S_FAIR_RELEASE, LOCK_S_FAIR_LEAVE,
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
    char fairq[LOCK_KEY_MAX];     /* B:fair, B:fair:due, B:fair:sub (lock.h, FAIRNESS) */
    char fairdue[LOCK_KEY_MAX];
    char fairsub[LOCK_KEY_MAX];
} lock_keys;

/* Fills k for name. Returns 0, or -1 with a message in err. */
int lock_keys_make(const char *name, lock_keys *k, char *err, size_t errlen);

/* ----------------------------------------------------------------- servers */

/* Pooled idle connections to one address (guarded by its server's pool_mu). */
typedef struct lock_idle {
    redisContext **v;
    int n, cap;
} lock_idle;

/* A Redis Cluster node and its pooled connections. */
typedef struct lock_node {
    rconn_addr addr;
    lock_idle idle;
} lock_node;

typedef struct lock_server {
    int index;
    struct rtopo_cluster *cluster;   /* a Redis Cluster: each call goes to its slot's
                                     primary (NULL: one server or a Sentinel's) */
    lock_node *nodes;             /* a cluster's nodes met so far, guarded by pool_mu */
    int nnodes, nodecap;
    rconn_addr addr;              /* guarded by pool_mu when primary is set */
    struct rtopo_primary *primary;   /* a Sentinel-watched server: where addr comes
                                     from (NULL: one fixed server) */
    unsigned version;             /* primary's version addr and idle are of */
    char desc[300];
    pthread_mutex_t pool_mu;      /* guards addr, version, idle, nodes, down_until_us,
                                     down_err */
    lock_idle idle;               /* one server, or a Sentinel's primary */
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
int lock_waiter_add(lock_redis *r, lock_waiter *w, int64_t deadline_us);

/* Waits until a release notice arrives or until_us. Returns 1 if woken (and
 * clears the flag), 0 on timeout. */
int lock_waiter_wait(lock_redis *r, lock_waiter *w, int64_t until_us);

/* Clears the woken flag before a retry: a notice arriving from here on counts. */
void lock_waiter_clear(lock_redis *r, lock_waiter *w);

/* Unsubscribes and removes w. */
void lock_waiter_remove(lock_redis *r, lock_waiter *w);

/* Stops the waker thread and drops the subscriber connections. */
void lock_waker_stop(lock_redis *r);

/* Fills the keyspace fields of o. */
void lock_waker_stats(lock_redis *r, lock_stats *o);

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
int lock_run(lock_redis *r, lock_call *calls, int ncalls, unsigned mask, lock_replies *rs);
void lock_replies_free(lock_replies *rs);

/* Joins the per-server reasons of rs (servers in mask) into buf. */
void lock_replies_why(const lock_redis *r, const lock_replies *rs, unsigned mask, char *buf,
                      size_t len);


/* ------------------------------------------------------------ the backend */

struct lock_redis {
    lock_client *c;               /* the client: its counters and error */
    lock_server servers[LOCK_MAX_SERVERS];
    int nservers, quorum;
    int timeout_ms, max_backoff_ms;
    int fair;                     /* waiters served in arrival order (lock.h, FAIRNESS) */
    int waiter_lease_ms;          /* fair: a silent waiter's place lasts this long */
    char cid[17];                 /* random client id, in waiter ids */
    atomic_uint_fast64_t waiter_seq;
    lock_waker waker;
};

/* Opens server i of r from its URL: one server, or a primary a Sentinel
 * watches. Returns 0, or -1 with err. */
int lock_server_open(lock_redis *r, int i, const char *url, char *err, size_t errlen);
/* Closes what lock_server_open made (no thread uses the server any more). */
void lock_server_close(lock_server *s);
/* s's address now into *out, and its version (primary moved: another one;
 * 0 for a Sentinel that has named no primary yet). Thread-safe. */
unsigned lock_server_addr(lock_server *s, rconn_addr *out);
/* s's connection of version just said it is not the primary (READONLY, a
 * failure): look for the primary again. */
void lock_server_suspect(lock_server *s, unsigned version);

/* Builds the scripts and their SHA1s (once per process). Returns 0, or -1
 * when out of memory. */
int lock_scripts_ready(void);

/* Sets FD_CLOEXEC on a connection's socket. */
void lock_set_cloexec(redisContext *ctx);

/* Outcome of one script on all servers, counted. */
typedef struct lock_tally {
    int ok, no, io;               /* said yes, said no, no answer */
} lock_tally;

/* Interprets integer replies of call `call` (1 = yes, 0 = no, anything else
 * = no answer) over the servers in mask. */
lock_tally lock_tally_int(const lock_replies *rs, int call, unsigned mask);

#endif
