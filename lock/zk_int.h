/* zk_int.h: the ZooKeeper backend's insides, shared by its two files and
 * seen by nothing else (lock_int.h is the lock module's; lock.h documents
 * the format on the server).
 *
 *   zk.c         the lock recipe: node names, the watch table, creating
 *                the own node, waiting for its turn, check and release;
 *                the backend's entry points and its URL
 *   zksession.c  the sessions, which are the leases; bounded asynchronous
 *                requests; the keeper thread, which confirms leases,
 *                sweeps, reports losses and closes dead sessions
 *
 * THREADS. The ZooKeeper client runs two threads per session (I/O and
 * completions); completions and watchers only record results and signal,
 * under zk_backend.mu, and never call into ZooKeeper or the generic lock
 * code. The keeper
 * thread sends probes, closes dead sessions, sweeps, and reports losses
 * (so lock_on_lost callbacks run on the keeper thread). Nothing calls the
 * ZooKeeper API with zk_backend.mu held, and a session is closed only when
 * no thread is inside a call on it. */
#ifndef FLASHSALE_LOCK_ZK_INT_H
#define FLASHSALE_LOCK_ZK_INT_H

#include <zookeeper/zookeeper.h>

#include "lock/lock_int.h"

#define ZK_BASE_DEFAULT "/locks"
#define ZK_MAX_SESSIONS 16          /* live sessions: one per distinct ttl */
#define ZK_PATH_MAX (3 * LOCK_NAME_MAX + 600)
#define ZK_HOSTS_MAX 1024
#define ZK_BASE_MAX 400
#define ZK_WATCH_BUCKETS 256
#define ZK_RETRY_US 100000          /* a failed probe or sweep is retried after this */
#define ZK_CREATE_TRIES 4           /* a parent (a container) may vanish between tries */
#define ZK_DRAIN_US 3000000         /* longest wait for a dead session's requests to end */
#define ZK_INCARNATION "/%incarnation"   /* under the base: lock.h, INCARNATIONS */

typedef struct zk_backend zk_backend;
typedef struct zk_session zk_session;

/* Something the keeper must delete: an exact node, or every child of
 * parent named "_c_<guid>-..." (a create whose outcome is unknown). */
typedef struct zk_sweep {
    char path[ZK_PATH_MAX];
    char guid[33];                /* "" : path is the node itself */
    struct zk_sweep *next;
} zk_sweep;

struct zk_session {
    zk_backend *z;
    zhandle_t *zh;
    int64_t ttl_ms;               /* the session timeout asked (the key) */
    int timeout_ms;               /* negotiated, once connected */
    int state;                    /* the last session state seen; 0: none yet */
    int64_t id;                   /* session id, once connected */
    atomic_int_fast64_t lease_end_us;   /* 0 until the server first answered */
    int64_t probe_due_us;
    int probing;                  /* a probe is in flight */
    int dead;                     /* expired, or its lease ran out: no new use */
    lock_errcode why_code;
    char why[200];
    int lost_reported;            /* the keeper reported its holds lost */
    int64_t sweep_due_us;
    int closing, closed;
    uint64_t incarnation;         /* of the server's data, read once on this
                                     session (zk.c); 0 until then */
    int users;                    /* threads inside a ZooKeeper call on zh */
    int inflight;                 /* requests sent whose completion has not run:
                                     closing zh with one outstanding leaks it (the
                                     library queues its completion to a thread it
                                     has already stopped), so a dead session is
                                     closed once they are drained, or ZK_DRAIN_US
                                     after it died at the latest */
    int64_t dead_us;              /* when it died (monotonic) */
    int refs;                     /* acquirers and holds using it */
    zk_sweep *sweeps;
    zk_session *next;
};

/* One acquire attempt and, once it succeeds, the hold (lock_hold). */
typedef struct zk_hold {
    lock_hold base;
    zk_backend *z;
    zk_session *s;                /* a reference */
    uint64_t wid;                 /* watch id: watchers find the hold by it */
    struct zk_hold *wnext;        /* the watch table's chain */
    int registered;
    int woken;                    /* a watch on the predecessor fired (z->mu) */
    int deleting;                 /* we delete the own node: its watch is no news */
    atomic_int gone;              /* the own node was deleted */
    pthread_cond_t cv;            /* the waiter sleeps here (z->mu) */
    uint64_t czxid;
    char guid[33];
    char parent[ZK_PATH_MAX];
    char path[ZK_PATH_MAX];       /* the own node */
} zk_hold;

struct zk_backend {
    lock_client *c;
    int gone_pending;             /* a held node was deleted: the keeper reports it */
    char hosts[ZK_HOSTS_MAX];     /* "h:p,h:p" as the ZooKeeper client takes it */
    char base[ZK_BASE_MAX];       /* "/locks": no trailing slash, never "/" */
    char desc[ZK_HOSTS_MAX + ZK_BASE_MAX + 20];
    char data[200];               /* what each node holds: who made it */
    int timeout_ms;
    pthread_mutex_t mu;           /* everything below and every session and op */
    pthread_cond_t conn_cv;       /* a session connected or died */
    pthread_cond_t keeper_cv;     /* work for the keeper */
    pthread_t keeper;
    int keeper_started, stopping;
    zk_session *sessions;
    uint64_t next_wid;
    zk_hold *watches[ZK_WATCH_BUCKETS];
    /* zk.c's watcher of held nodes (lock_zk_node_watcher), handed down so
     * that zksession.c sets it on a node without calling up into zk.c. */
    watcher_fn node_watcher;
};

/* One asynchronous request and its caller's wait. Two references: the
 * caller's and the completion's; whoever drops the last frees it. */
typedef struct zk_op {
    zk_session *s;
    pthread_cond_t cv;
    int refs, done, abandoned, rc;
    int probe;                    /* the keeper's probe: nobody waits */
    int counted;                  /* in its session's inflight */
    int64_t sent_us;
    struct Stat stat;
    char *created;                /* create: the node made */
    char **kids;                  /* get_children: names */
    int nkids;
    char value[64];               /* get: the node's data (its first 64 bytes) */
    size_t value_len;
    char guid[33];                /* create: for a sweep if abandoned */
    char parent[ZK_PATH_MAX];
} zk_op;

/* The request kinds. */
typedef enum zk_req {
    REQ_CREATE, REQ_MKDIR, REQ_KIDS, REQ_GET, REQ_GET_WATCH, REQ_EXISTS, REQ_DELETE, REQ_PROBE
} zk_req;

/* ------------------------------------------------------- zksession.c */

/* A connected live session for ttl_ms, with a reference for the caller (a
 * hold takes it over; hold_drop in zk.c gives it back). Waits at most
 * timeout_ms for it to connect. Returns NULL with a message in err. */
zk_session *lock_zk_session_get(zk_backend *z, int64_t ttl_ms, char *err, size_t errlen);

/* Queues for the keeper the deletion of path, or with a guid, of every
 * child of path named "_c_<guid>-..." (z->mu held). */
void lock_zk_sweep_add(zk_session *s, const char *path, const char *guid);

/* Sends one request of kind req on s (path; mode and data -- NULL: none --
 * for REQ_MKDIR, which creates a node of that mode; h: the hold whose watch
 * id a REQ_GET_WATCH watch carries, and whose guid and parent a REQ_CREATE
 * remembers for a sweep). Returns the op to wait for, or NULL (err) if it
 * could not be sent. */
zk_op *lock_zk_send(zk_session *s, zk_req req, const char *path, int mode, const char *data,
                    zk_hold *h, char *err, size_t errlen);

/* Sends a request and waits (timeout_ms at most). Returns its rc,
 * ZOPERATIONTIMEOUT when no answer came in time, or ZSYSTEMERROR when it
 * could not be sent (err). With out, *out is the op for its results (only
 * when an answer came; free it with lock_zk_op_release). */
int lock_zk_call(zk_session *s, zk_req req, const char *path, int mode, const char *data,
                 zk_hold *h, zk_op **out, char *err, size_t errlen);

/* Drops the caller's reference to op (NULL: nothing). */
void lock_zk_op_release(zk_op *op);

/* Starts z's keeper thread. Returns 0 or -1. */
int lock_zk_keeper_start(zk_backend *z);

/* Stops z's keeper thread (if it runs) and waits for it. */
void lock_zk_keeper_stop(zk_backend *z);

/* Closes and frees every session of z (the keeper stopped): the server
 * deletes the nodes they still held. */
void lock_zk_sessions_close(zk_backend *z);

/* -------------------------------------------------------------- zk.c */

/* The watcher of one node (the predecessor a waiter watches, or the own
 * node), set by REQ_GET_WATCH; its context is the hold's watch id. */
void lock_zk_node_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx);

#endif
