/* zk.c: the ZooKeeper backend (zk://host:port[,host:port...][/base]): the
 * standard recipe -- an ephemeral-sequential node under a per-name parent,
 * the lowest sequence holds the lock, each waiter watches only the node
 * just before its own -- over the ZooKeeper C client (libzookeeper_mt).
 * lock.h documents the format on the server; this file is the how.
 *
 * SESSIONS ARE THE LEASES. A node lives as long as the session that made
 * it, so the session timeout plays the ttl: the client keeps one session
 * per distinct ttl asked (at most ZK_MAX_SESSIONS), requesting ttl as the
 * session timeout; the server may clamp it (min/maxSessionTimeout), and
 * the negotiated timeout is what counts. The ZooKeeper client's own pings
 * keep a session alive; what this file adds is proof: the lease of a
 * session ends at (send time of the last request the server answered) +
 * timeout - drift, because the server touched the session when that
 * request arrived, and it expires a session no earlier than timeout after
 * its last touch. A keeper thread sends a cheap request every timeout/3 to
 * move that proof forward. When the lease runs out unconfirmed (server
 * silent, network cut, this process paused), or the server says the
 * session expired, the session is dead: its holds are reported lost, and
 * the session is closed (which deletes its nodes if the server still had
 * them) and replaced by a fresh one for later acquires.
 *
 * BOUNDED CALLS. Every request is asynchronous and its caller waits at most
 * timeout_ms for the answer (zk_op). An answer that comes after the caller
 * gave up is still handled: a node created by an abandoned request is
 * deleted by the keeper. A create whose outcome is unknown (the connection
 * broke before the answer) is cleaned up by its GUID: every attempt names
 * its node "_c_<guid>-lock-", so the keeper finds it among the parent's
 * children and deletes it ("sweeps").
 *
 * THREADS. The ZooKeeper client runs two threads per session (I/O and
 * completions); completions and watchers only record results and signal,
 * under zk_backend.mu, and never call into ZooKeeper or lock.c. The keeper
 * thread sends probes, closes dead sessions, sweeps, and reports losses
 * (so lock_on_lost callbacks run on the keeper thread). Nothing calls the
 * ZooKeeper API with zk_backend.mu held, and a session is closed only when
 * no thread is inside a call on it. */
#include "lock/lock_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zookeeper/zookeeper.h>

#include "common/clock.h"

#define ZK_BASE_DEFAULT "/locks"
#define ZK_MAX_SESSIONS 16          /* live sessions: one per distinct ttl */
#define ZK_PATH_MAX (3 * LOCK_NAME_MAX + 600)
#define ZK_HOSTS_MAX 1024
#define ZK_BASE_MAX 400
#define ZK_WATCH_BUCKETS 256
#define ZK_RETRY_US 100000          /* a failed probe or sweep is retried after this */
#define ZK_CREATE_TRIES 4           /* a parent (a container) may vanish between tries */

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
    int users;                    /* threads inside a ZooKeeper call on zh */
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
};

/* One asynchronous request and its caller's wait. Two references: the
 * caller's and the completion's; whoever drops the last frees it. */
typedef struct zk_op {
    zk_session *s;
    pthread_cond_t cv;
    int refs, done, abandoned, rc;
    int probe;                    /* the keeper's probe: nobody waits */
    int64_t sent_us;
    struct Stat stat;
    char *created;                /* create: the node made */
    char **kids;                  /* get_children: names */
    int nkids;
    char guid[33];                /* create: for a sweep if abandoned */
    char parent[ZK_PATH_MAX];
} zk_op;

static const lock_backend zk_backend_ops;

/* ------------------------------------------------------------------ names */

/* Appends name to out as one znode path component: printable ASCII except
 * '/' and '%' as is, every other byte as %XX (uppercase hex), and "." and
 * ".." (not allowed as components) with their dots escaped. */
static void escape_name(const char *name, char *out, size_t len) {
    size_t o = strlen(out);
    int dots = !strcmp(name, ".") || !strcmp(name, "..");
    for (const unsigned char *p = (const unsigned char *)name; *p && o + 4 < len; p++) {
        if (*p > 0x20 && *p < 0x7f && *p != '/' && *p != '%' && !(dots && *p == '.'))
            out[o++] = (char)*p;
        else
            o += (size_t)snprintf(out + o, len - o, "%%%02X", *p);
    }
    out[o] = '\0';
}

/* The sort key of a lock node: what follows its last "lock-" (the 10-digit
 * sequence), or the whole name, as Curator's InterProcessMutex sorts. */
static const char *seq_key(const char *node) {
    const char *k = NULL;
    for (const char *p = strstr(node, "lock-"); p; p = strstr(p + 1, "lock-")) k = p + 5;
    return k ? k : node;
}

static int cmp_nodes(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    int r = strcmp(seq_key(x), seq_key(y));
    return r ? r : strcmp(x, y);
}

/* Checks a base path from a URL: absolute, not "/", no empty, "." or ".."
 * components, printable ASCII. Returns 0 or -1 (err). */
static int check_base(const char *p, char *err, size_t errlen) {
    if (p[0] != '/' || !p[1] || strlen(p) >= ZK_BASE_MAX || p[strlen(p) - 1] == '/') goto bad;
    for (const char *q = p; *q; q++) {
        if ((unsigned char)*q <= 0x20 || (unsigned char)*q >= 0x7f) goto bad;
        if (q[0] == '/' && (q[1] == '/' || (q[1] == '.' && (q[2] == '/' || !q[2])) ||
                            (q[1] == '.' && q[2] == '.' && (q[3] == '/' || !q[3]))))
            goto bad;
    }
    return 0;
bad:
    snprintf(err, errlen, "lock: zk:// base path '%.100s' must be an absolute ZooKeeper path "
             "other than / (printable ASCII, no empty, . or .. parts)", p);
    return -1;
}

/* ---------------------------------------------------------------- watches */

static void watch_add(zk_backend *z, zk_hold *h) {
    h->wid = ++z->next_wid;
    unsigned b = (unsigned)(h->wid % ZK_WATCH_BUCKETS);
    h->wnext = z->watches[b];
    z->watches[b] = h;
    h->registered = 1;
}

static void watch_del(zk_backend *z, zk_hold *h) {
    if (!h->registered) return;
    zk_hold **pp = &z->watches[h->wid % ZK_WATCH_BUCKETS];
    while (*pp && *pp != h) pp = &(*pp)->wnext;
    if (*pp) *pp = h->wnext;
    h->registered = 0;
}

static zk_hold *watch_find(zk_backend *z, uint64_t wid) {
    for (zk_hold *h = z->watches[wid % ZK_WATCH_BUCKETS]; h; h = h->wnext)
        if (h->wid == wid) return h;
    return NULL;
}

/* --------------------------------------------------------------- sessions */

/* Declares s dead (z->mu held): no new use; its waiters wake up; the
 * keeper reports its holds lost and closes it. */
static void session_die(zk_session *s, lock_errcode code, const char *why) {
    zk_backend *z = s->z;
    if (s->dead) return;
    s->dead = 1;
    s->why_code = code;
    snprintf(s->why, sizeof s->why, "%s", why);
    /* Its holds' remaining time is gone at once, before any report. */
    atomic_store(&s->lease_end_us, 0);
    for (int b = 0; b < ZK_WATCH_BUCKETS; b++)
        for (zk_hold *h = z->watches[b]; h; h = h->wnext)
            if (h->s == s) pthread_cond_signal(&h->cv);
    pthread_cond_broadcast(&z->conn_cv);
    pthread_cond_signal(&z->keeper_cv);
}

/* A server answer to a request sent at sent_us: the session was alive when
 * the request arrived, so its lease runs at least until sent_us + timeout
 * (z->mu held). Error codes the server sends about the request itself
 * count; connection loss, expiry and the like do not. */
static void session_confirmed(zk_session *s, int rc, int64_t sent_us) {
    if (s->dead || s->timeout_ms <= 0) return;
    if (rc != ZOK && rc != ZNONODE && rc != ZNODEEXISTS && rc != ZNOTEMPTY && rc != ZBADVERSION)
        return;
    int64_t end = sent_us + (int64_t)s->timeout_ms * 1000 - lock_drift_us(s->timeout_ms);
    if (end > atomic_load(&s->lease_end_us)) atomic_store(&s->lease_end_us, end);
}

/* The session watcher: connection state changes of one session. */
static void session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)path;
    zk_session *s = ctx;
    if (type != ZOO_SESSION_EVENT || !s) return;
    zk_backend *z = s->z;
    pthread_mutex_lock(&z->mu);
    s->state = state;
    if (state == ZOO_CONNECTED_STATE) {
        const clientid_t *id = zoo_client_id(zh);
        s->timeout_ms = zoo_recv_timeout(zh);
        if (id) s->id = id->client_id;
        s->probe_due_us = 0;      /* confirm the lease at once */
        pthread_cond_signal(&z->keeper_cv);
    } else if (state == ZOO_EXPIRED_SESSION_STATE) {
        char why[120];
        snprintf(why, sizeof why, "ZooKeeper session 0x%llx expired", (unsigned long long)s->id);
        session_die(s, LOCK_ERR_LOST, why);
    } else if (state == ZOO_AUTH_FAILED_STATE) {
        session_die(s, LOCK_ERR_IO, "ZooKeeper authentication failed");
    }
    pthread_cond_broadcast(&z->conn_cv);
    pthread_mutex_unlock(&z->mu);
}

/* The ZooKeeper client logs through this: nowhere (it would write to the
 * application's stderr); failures reach callers as error codes. */
static void zk_log_discard(const char *message) { (void)message; }

/* Opens a session (z->mu held). The client's threads start with every
 * signal blocked, like the module's own: signals are the application's. */
static zk_session *session_open(zk_backend *z, int64_t ttl_ms, char *err, size_t errlen) {
    zk_session *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->z = z;
    s->ttl_ms = ttl_ms;
    atomic_init(&s->lease_end_us, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    errno = 0;
    s->zh = zookeeper_init2(z->hosts, session_watcher, ttl_ms > INT_MAX ? INT_MAX : (int)ttl_ms,
                            NULL, s, 0, zk_log_discard);
    int e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!s->zh) {
        snprintf(err, errlen, "%s: cannot start a session: %s", z->desc,
                 e ? strerror(e) : "bad host list");
        free(s);
        return NULL;
    }
    s->next = z->sessions;
    z->sessions = s;
    return s;
}

/* A connected live session for ttl_ms, with a reference for the caller (a
 * hold takes it over; hold_drop drops it). Waits at most timeout_ms for it
 * to connect. Returns NULL with a message in err. */
static zk_session *session_get(zk_backend *z, int64_t ttl_ms, char *err, size_t errlen) {
    int64_t until = clock_mono_us() + (int64_t)z->timeout_ms * 1000;
    pthread_mutex_lock(&z->mu);
    zk_session *s = z->sessions;
    int live = 0;
    for (zk_session *x = z->sessions; x; x = x->next) live += !x->dead;
    while (s && (s->dead || s->ttl_ms != ttl_ms)) s = s->next;
    if (!s) {
        if (live >= ZK_MAX_SESSIONS) {
            snprintf(err, errlen, "%s: %d ZooKeeper sessions open already (one per distinct "
                     "ttl): use fewer distinct ttls", z->desc, live);
            pthread_mutex_unlock(&z->mu);
            return NULL;
        }
        if (!(s = session_open(z, ttl_ms, err, errlen))) {
            pthread_mutex_unlock(&z->mu);
            return NULL;
        }
    }
    s->refs++;
    while (!s->dead && s->state != ZOO_CONNECTED_STATE && clock_mono_us() < until)
        lock_cond_wait_until(&z->conn_cv, &z->mu, until);
    if (s->dead || s->state != ZOO_CONNECTED_STATE) {
        if (s->dead) snprintf(err, errlen, "%s: %s", z->desc, s->why);
        else snprintf(err, errlen, "%s: not connected within %d ms", z->desc, z->timeout_ms);
        s->refs--;
        pthread_cond_signal(&z->keeper_cv);
        pthread_mutex_unlock(&z->mu);
        return NULL;
    }
    pthread_mutex_unlock(&z->mu);
    return s;
}

/* Brackets a ZooKeeper call on s->zh, so the keeper never closes a handle
 * in use. Returns 0, or -1 (err) when s is closing. */
static int session_enter(zk_session *s, char *err, size_t errlen) {
    zk_backend *z = s->z;
    pthread_mutex_lock(&z->mu);
    int ok = !s->closing;
    if (ok) s->users++;
    else snprintf(err, errlen, "%s: %s", z->desc, s->why[0] ? s->why : "session closed");
    pthread_mutex_unlock(&z->mu);
    return ok ? 0 : -1;
}

static void session_leave(zk_session *s) {
    zk_backend *z = s->z;
    pthread_mutex_lock(&z->mu);
    if (--s->users == 0 && s->dead) pthread_cond_signal(&z->keeper_cv);
    pthread_mutex_unlock(&z->mu);
}

/* Queues a sweep on s (z->mu held). */
static void sweep_add(zk_session *s, const char *path, const char *guid) {
    zk_sweep *w = calloc(1, sizeof *w);
    if (!w) return;               /* the node then lives until the session ends */
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->guid, sizeof w->guid, "%s", guid ? guid : "");
    w->next = s->sweeps;
    s->sweeps = w;
    pthread_cond_signal(&s->z->keeper_cv);
}

/* -------------------------------------------------------------------- ops */

static zk_op *op_new(zk_session *s) {
    zk_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    op->s = s;
    op->refs = 2;
    lock_cond_init(&op->cv);
    return op;
}

static void op_free(zk_op *op) {
    free(op->created);
    for (int i = 0; i < op->nkids; i++) free(op->kids[i]);
    free(op->kids);
    pthread_cond_destroy(&op->cv);
    free(op);
}

/* Drops one reference (z->mu held). */
static void op_unref(zk_op *op) {
    if (--op->refs == 0) op_free(op);
}

/* Records a completion (z->mu held) and wakes the caller. An abandoned
 * create is undone by the keeper: the node it made, or, when the outcome
 * is unknown, whatever carries its GUID. */
static void op_complete(zk_op *op, int rc) {
    zk_session *s = op->s;
    op->rc = rc;
    op->done = 1;
    session_confirmed(s, rc, op->sent_us);
    if (op->probe) {
        s->probing = 0;
        int64_t now = clock_mono_us();
        s->probe_due_us = rc == ZOK || rc == ZNONODE
                              ? op->sent_us + (int64_t)s->timeout_ms * 1000 / 3
                              : now + ZK_RETRY_US;
        if (rc == ZSESSIONEXPIRED) session_die(s, LOCK_ERR_LOST, "ZooKeeper session expired");
        pthread_cond_signal(&s->z->keeper_cv);
    } else if (op->abandoned && op->guid[0] && !s->dead) {
        if (rc == ZOK && op->created) sweep_add(s, op->created, NULL);
        else if (rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT)
            sweep_add(s, op->parent, op->guid);
    }
    pthread_cond_signal(&op->cv);
    op_unref(op);
}

static void done_void(int rc, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    pthread_mutex_lock(&z->mu);
    op_complete(op, rc);
    pthread_mutex_unlock(&z->mu);
}

static void done_stat(int rc, const struct Stat *stat, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    pthread_mutex_lock(&z->mu);
    if (rc == ZOK && stat) op->stat = *stat;
    op_complete(op, rc);
    pthread_mutex_unlock(&z->mu);
}

static void done_data(int rc, const char *value, int value_len, const struct Stat *stat,
                      const void *data) {
    (void)value;
    (void)value_len;
    done_stat(rc, stat, data);
}

static void done_create(int rc, const char *path, const struct Stat *stat, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    pthread_mutex_lock(&z->mu);
    if (rc == ZOK && path && !(op->created = strdup(path))) rc = ZSYSTEMERROR;
    if (rc == ZOK && stat) op->stat = *stat;
    op_complete(op, rc);
    pthread_mutex_unlock(&z->mu);
}

static void done_kids(int rc, const struct String_vector *v, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    pthread_mutex_lock(&z->mu);
    if (rc == ZOK && v && v->count > 0) {
        op->kids = calloc((size_t)v->count, sizeof *op->kids);
        for (int i = 0; op->kids && i < v->count; i++) {
            if (!(op->kids[i] = strdup(v->data[i] ? v->data[i] : ""))) {
                rc = ZSYSTEMERROR;
                break;
            }
            op->nkids++;
        }
        if (!op->kids) rc = ZSYSTEMERROR;
    }
    op_complete(op, rc);
    pthread_mutex_unlock(&z->mu);
}

/* Waits for op until until_us. Returns its rc, or ZOPERATIONTIMEOUT if the
 * answer did not come in time (the op is then abandoned: its completion
 * cleans up). Drops the caller's reference either way. */
static int op_wait(zk_op *op, int64_t until_us) {
    zk_backend *z = op->s->z;
    pthread_mutex_lock(&z->mu);
    while (!op->done && clock_mono_us() < until_us) lock_cond_wait_until(&op->cv, &z->mu, until_us);
    int rc = op->done ? op->rc : ZOPERATIONTIMEOUT;
    if (!op->done) op->abandoned = 1;
    op_unref(op);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

/* The request kinds. Each sends one request on s and returns the op to
 * wait for, or NULL (err) if it could not be sent. */
typedef enum zk_req {
    REQ_CREATE, REQ_MKDIR, REQ_KIDS, REQ_GET_WATCH, REQ_EXISTS, REQ_DELETE, REQ_PROBE
} zk_req;

static void node_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx);

static zk_op *send_req(zk_session *s, zk_req req, const char *path, int mode, zk_hold *h,
                       char *err, size_t errlen) {
    zk_backend *z = s->z;
    zk_op *op = op_new(s);
    if (!op) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (session_enter(s, err, errlen)) {
        op_free(op);
        return NULL;
    }
    if (h && req == REQ_CREATE) {
        memcpy(op->guid, h->guid, sizeof op->guid);
        snprintf(op->parent, sizeof op->parent, "%s", h->parent);
    }
    void *wctx = h ? (void *)(uintptr_t)h->wid : NULL;
    op->sent_us = clock_mono_us();
    int rc = ZBADARGUMENTS;
    switch (req) {
    case REQ_CREATE:
        rc = zoo_acreate2(s->zh, path, z->data, (int)strlen(z->data), &ZOO_OPEN_ACL_UNSAFE,
                          ZOO_EPHEMERAL_SEQUENTIAL, done_create, op);
        break;
    case REQ_MKDIR:
        rc = zoo_acreate2(s->zh, path, "", 0, &ZOO_OPEN_ACL_UNSAFE, mode, done_create, op);
        break;
    case REQ_KIDS: rc = zoo_aget_children(s->zh, path, 0, done_kids, op); break;
    case REQ_GET_WATCH: rc = zoo_awget(s->zh, path, node_watcher, wctx, done_data, op); break;
    case REQ_EXISTS: rc = zoo_aexists(s->zh, path, 0, done_stat, op); break;
    case REQ_DELETE: rc = zoo_adelete(s->zh, path, -1, done_void, op); break;
    case REQ_PROBE:
        op->probe = 1;
        rc = zoo_aexists(s->zh, "/", 0, done_stat, op);
        break;
    }
    session_leave(s);
    if (rc != ZOK) {
        snprintf(err, errlen, "%s: %s", z->desc, zerror(rc));
        if (rc == ZBADARGUMENTS || rc == ZINVALIDSTATE) {
            op_free(op);          /* refused before its completion was queued */
        } else {
            /* A marshalling error may come after the completion was queued:
             * leave it its reference (at worst a small leak, never a use
             * after free). */
            pthread_mutex_lock(&z->mu);
            op->abandoned = 1;
            op_unref(op);
            pthread_mutex_unlock(&z->mu);
        }
        return NULL;
    }
    return op;
}

/* Sends a request and waits (timeout_ms at most). Returns its rc,
 * ZOPERATIONTIMEOUT when no answer came in time, or ZSYSTEMERROR when it
 * could not be sent (err). With out, *out is the op for its results (only
 * when an answer came; free it with op_release). */
static int call(zk_session *s, zk_req req, const char *path, int mode, zk_hold *h, zk_op **out,
                char *err, size_t errlen) {
    zk_backend *z = s->z;
    if (out) *out = NULL;
    zk_op *op = send_req(s, req, path, mode, h, err, errlen);
    if (!op) return ZSYSTEMERROR;
    int64_t until = clock_mono_us() + (int64_t)z->timeout_ms * 1000;
    pthread_mutex_lock(&z->mu);
    op->refs++;                   /* ours past op_wait, for the results */
    pthread_mutex_unlock(&z->mu);
    int rc = op_wait(op, until);
    pthread_mutex_lock(&z->mu);
    int answered = op->done;
    if (!out || !answered) op_unref(op);
    pthread_mutex_unlock(&z->mu);
    if (!answered) snprintf(err, errlen, "%s: no answer within %d ms", z->desc, z->timeout_ms);
    else if (rc != ZOK) snprintf(err, errlen, "%s: %s", z->desc, zerror(rc));
    if (out && answered) *out = op;
    return rc;
}

static void op_release(zk_op *op) {
    if (!op) return;
    zk_backend *z = op->s->z;
    pthread_mutex_lock(&z->mu);
    op_unref(op);
    pthread_mutex_unlock(&z->mu);
}

/* ------------------------------------------------------------------ holds */

/* The watcher of one node: the predecessor a waiter watches, or the own
 * node (its deletion by anyone but us means the lock is lost). The
 * context is the hold's watch id, not a pointer: a watch may fire long
 * after its hold is gone. */
static void node_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)state;
    if (type == ZOO_SESSION_EVENT) return;    /* session_watcher's business */
    zk_session *s = (zk_session *)zoo_get_context(zh);
    if (!s) return;
    zk_backend *z = s->z;
    pthread_mutex_lock(&z->mu);
    zk_hold *h = watch_find(z, (uint64_t)(uintptr_t)ctx);
    if (h) {
        if (type == ZOO_DELETED_EVENT && path && !strcmp(path, h->path) && !h->deleting) {
            atomic_store(&h->gone, 1);
            z->gone_pending = 1;
            pthread_cond_signal(&z->keeper_cv);
        }
        h->woken = 1;
        pthread_cond_signal(&h->cv);
    }
    pthread_mutex_unlock(&z->mu);
}

static zk_hold *hold_new(zk_backend *z, const char *name) {
    unsigned char rnd[16];
    zk_hold *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    if (lock_random(rnd, sizeof rnd)) {
        free(h);
        return NULL;
    }
    h->base.be = &zk_backend_ops;
    h->z = z;
    for (int i = 0; i < 16; i++) sprintf(h->guid + 2 * i, "%02x", rnd[i]);
    snprintf(h->parent, sizeof h->parent, "%s/", z->base);
    escape_name(name, h->parent, sizeof h->parent);
    atomic_init(&h->gone, 0);
    lock_cond_init(&h->cv);
    pthread_mutex_lock(&z->mu);
    watch_add(z, h);
    pthread_mutex_unlock(&z->mu);
    return h;
}

/* Frees h and drops its session reference (z->mu not held). */
static void hold_drop(zk_hold *h) {
    zk_backend *z = h->z;
    pthread_mutex_lock(&z->mu);
    watch_del(z, h);
    if (h->s && --h->s->refs == 0 && h->s->dead) pthread_cond_signal(&z->keeper_cv);
    pthread_mutex_unlock(&z->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

static void zk_hold_free(lock_hold *base) { hold_drop((zk_hold *)base); }

/* Creates the name's parent as a container (the server deletes it once it
 * has had children and has none left), and first, if missing, the base
 * path's parts as persistent nodes. Returns 0 or -1 (err). */
static int make_parents(zk_session *s, const char *parent, char *err, size_t errlen) {
    char p[ZK_PATH_MAX];
    int rc = call(s, REQ_MKDIR, parent, ZOO_CONTAINER, NULL, NULL, err, errlen);
    if (rc == ZOK || rc == ZNODEEXISTS) return 0;
    if (rc != ZNONODE) return -1;
    snprintf(p, sizeof p, "%s", s->z->base);
    for (char *q = p + 1;; q++) {
        if (*q != '/' && *q) continue;
        char keep = *q;
        *q = '\0';
        rc = call(s, REQ_MKDIR, p, ZOO_PERSISTENT, NULL, NULL, err, errlen);
        if (rc != ZOK && rc != ZNODEEXISTS) return -1;
        if (!keep) break;
        *q = keep;
    }
    rc = call(s, REQ_MKDIR, parent, ZOO_CONTAINER, NULL, NULL, err, errlen);
    return rc == ZOK || rc == ZNODEEXISTS ? 0 : -1;
}

/* Creates h's node. Returns 0, or -1 (err). A create whose outcome is
 * unknown leaves a sweep for the keeper. */
static int create_node(zk_session *s, zk_hold *h, char *err, size_t errlen) {
    char prefix[ZK_PATH_MAX + 48];
    snprintf(prefix, sizeof prefix, "%s/_c_%s-lock-", h->parent, h->guid);
    for (int tries = 0; tries < ZK_CREATE_TRIES; tries++) {
        zk_op *op;
        int rc = call(s, REQ_CREATE, prefix, 0, h, &op, err, errlen);
        int answered = op != NULL;
        if (rc == ZOK && op->created && op->created[0] == '/' && strrchr(op->created, '/')[1]) {
            snprintf(h->path, sizeof h->path, "%s", op->created);
            h->czxid = (uint64_t)op->stat.czxid;
            op_release(op);
            return 0;
        }
        if (rc == ZOK) {          /* not a path: nothing to wait on, nothing to delete */
            snprintf(err, errlen, "%s: the server created '%.100s'", s->z->desc,
                     op->created ? op->created : "");
            op_release(op);
            return -1;
        }
        op_release(op);
        if (rc == ZNONODE) {
            if (make_parents(s, h->parent, err, errlen)) return -1;
            continue;
        }
        /* Broken off mid-request: the node may exist. (Unanswered ones are
         * swept by their completion.) */
        if (answered && (rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT)) {
            pthread_mutex_lock(&s->z->mu);
            if (!s->dead) sweep_add(s, h->parent, h->guid);
            pthread_mutex_unlock(&s->z->mu);
        }
        return -1;
    }
    snprintf(err, errlen, "%s: %s keeps vanishing under the create", s->z->desc, h->parent);
    return -1;
}

/* Marks h's node as being deleted by us, so its watch firing is no loss. */
static void deleting(zk_hold *h) {
    pthread_mutex_lock(&h->z->mu);
    h->deleting = 1;
    pthread_mutex_unlock(&h->z->mu);
}

/* Deletes h's node now (bounded) or, failing that, by a sweep. */
static void delete_node(zk_session *s, zk_hold *h) {
    char ignored[200];
    deleting(h);
    int rc = call(s, REQ_DELETE, h->path, 0, NULL, NULL, ignored, sizeof ignored);
    if (rc == ZOK || rc == ZNONODE) return;
    pthread_mutex_lock(&s->z->mu);
    if (!s->dead) sweep_add(s, h->path, NULL);
    pthread_mutex_unlock(&s->z->mu);
}

/* Waits for h's turn: the lowest node holds the lock; else watch the node
 * just before ours and look again when it goes. Returns LOCK_OK, LOCK_BUSY
 * (deadline passed) or LOCK_ERROR (err). */
static lock_status wait_turn(zk_session *s, zk_hold *h, int64_t deadline_us, char *err,
                             size_t errlen) {
    zk_backend *z = s->z;
    const char *own = strrchr(h->path, '/') + 1;
    char pred[2 * ZK_PATH_MAX];
    /* A watch on the own node: its deletion by anyone else is a loss. */
    zk_op *mine = send_req(s, REQ_GET_WATCH, h->path, 0, h, err, errlen);
    if (!mine) return LOCK_ERROR;
    op_release(mine);             /* its answer does not matter: the watch does */
    for (;;) {
        zk_op *op;
        if (atomic_load(&h->gone)) {
            snprintf(err, errlen, "%s: our node %s was deleted while waiting", z->desc, h->path);
            return LOCK_ERROR;
        }
        pthread_mutex_lock(&z->mu);
        h->woken = 0;
        pthread_mutex_unlock(&z->mu);
        if (call(s, REQ_KIDS, h->parent, 0, NULL, &op, err, errlen) != ZOK) {
            op_release(op);
            return LOCK_ERROR;
        }
        qsort(op->kids, (size_t)op->nkids, sizeof *op->kids, cmp_nodes);
        int me = -1;
        for (int i = 0; i < op->nkids && me < 0; i++)
            if (!strcmp(op->kids[i], own)) me = i;
        if (me > 0) snprintf(pred, sizeof pred, "%s/%s", h->parent, op->kids[me - 1]);
        op_release(op);
        if (me < 0) {
            snprintf(err, errlen, "%s: our node %s vanished (session ended?)", z->desc, h->path);
            return LOCK_ERROR;
        }
        if (me == 0) return LOCK_OK;
        if (clock_mono_us() >= deadline_us) return LOCK_BUSY;
        /* getData, not exists: on a node already gone it leaves no watch
         * behind (exists would wait for a creation that never comes). */
        int rc = call(s, REQ_GET_WATCH, pred, 0, h, NULL, err, errlen);
        if (rc == ZNONODE) continue;
        if (rc != ZOK) return LOCK_ERROR;
        pthread_mutex_lock(&z->mu);
        while (!h->woken && !s->dead && clock_mono_us() < deadline_us)
            lock_cond_wait_until(&h->cv, &z->mu, deadline_us);
        int dead = s->dead;
        if (dead) snprintf(err, errlen, "%s: %s while waiting", z->desc, s->why);
        pthread_mutex_unlock(&z->mu);
        if (dead) return LOCK_ERROR;
    }
}

static lock_status zk_acquire(lock_client *c, const char *name, int64_t ttl_ms,
                              int64_t deadline_us, lock_took *out, lock_errcode *code, char *err,
                              size_t errlen) {
    zk_backend *z = c->bstate;
    *code = LOCK_ERR_IO;
    zk_hold *h = hold_new(z, name);
    if (!h) {
        *code = LOCK_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    zk_session *s = session_get(z, ttl_ms, err, errlen);
    if (!s) {
        hold_drop(h);
        return LOCK_ERROR;
    }
    h->s = s;                     /* the reference session_get took */
    int64_t start = clock_mono_us();
    if (create_node(s, h, err, errlen)) {
        hold_drop(h);
        return LOCK_ERROR;
    }
    lock_status st = wait_turn(s, h, deadline_us, err, errlen);
    if (st != LOCK_OK) {
        delete_node(s, h);        /* a wait that ends leaves nothing behind */
        hold_drop(h);
        return st;
    }
    pthread_mutex_lock(&z->mu);
    out->ttl_ms = s->timeout_ms;
    pthread_mutex_unlock(&z->mu);
    out->hold = &h->base;
    out->fence = h->czxid;
    out->start_us = start;
    out->lease_src = &s->lease_end_us;
    return LOCK_OK;
}

static lock_check zk_check(lock_client *c, lock_hold *base, int64_t *start_us, char *err,
                           size_t errlen) {
    (void)c;
    (void)start_us;               /* the session's lease is its own */
    zk_hold *h = (zk_hold *)base;
    zk_session *s = h->s;
    zk_op *op;
    pthread_mutex_lock(&s->z->mu);
    int dead = s->dead;
    int64_t sid = s->id;
    pthread_mutex_unlock(&s->z->mu);
    if (dead || atomic_load(&h->gone)) return LOCK_CHECK_GONE;
    int rc = call(s, REQ_EXISTS, h->path, 0, NULL, &op, err, errlen);
    lock_check r = LOCK_CHECK_UNKNOWN;
    if (rc == ZOK) r = op->stat.ephemeralOwner == sid ? LOCK_CHECK_OURS : LOCK_CHECK_GONE;
    else if (rc == ZNONODE) r = LOCK_CHECK_GONE;
    op_release(op);
    return r;
}

static lock_release_result zk_release(lock_client *c, lock_hold *base, char *err,
                                      size_t errlen) {
    (void)c;
    zk_hold *h = (zk_hold *)base;
    zk_session *s = h->s;
    pthread_mutex_lock(&s->z->mu);
    int dead = s->dead;
    if (dead) snprintf(err, errlen, "%s: %s", s->z->desc, s->why);
    pthread_mutex_unlock(&s->z->mu);
    /* A dead session's nodes go with it (the keeper closes it). */
    if (dead) return LOCK_NOT_OWNER;
    if (atomic_load(&h->gone)) {
        snprintf(err, errlen, "%s: our node %s was deleted by another", s->z->desc, h->path);
        return LOCK_NOT_OWNER;
    }
    deleting(h);
    int rc = call(s, REQ_DELETE, h->path, 0, NULL, NULL, err, errlen);
    if (rc == ZOK) return LOCK_RELEASED;
    if (rc == ZNONODE) {
        snprintf(err, errlen, "%s: our node %s is gone", s->z->desc, h->path);
        return LOCK_NOT_OWNER;
    }
    pthread_mutex_lock(&s->z->mu);
    if (!s->dead) sweep_add(s, h->path, NULL);   /* deleted once the server answers */
    pthread_mutex_unlock(&s->z->mu);
    return LOCK_UNKNOWN;
}

/* lock.c put a hold of ours into its table: if its session died meanwhile,
 * the keeper must report it (again). */
static void zk_held(lock_client *c, lock_hold *base) {
    zk_backend *z = c->bstate;
    zk_hold *h = (zk_hold *)base;
    pthread_mutex_lock(&z->mu);
    if (h->s->dead) {
        h->s->lost_reported = 0;
        pthread_cond_signal(&z->keeper_cv);
    }
    if (atomic_load(&h->gone)) {
        z->gone_pending = 1;
        pthread_cond_signal(&z->keeper_cv);
    }
    pthread_mutex_unlock(&z->mu);
}

/* ----------------------------------------------------------------- keeper */

static int match_session(const lock_hold *h, void *s) { return ((const zk_hold *)h)->s == s; }

static int match_gone(const lock_hold *h, void *unused) {
    (void)unused;
    return atomic_load(&((const zk_hold *)h)->gone);
}

/* Runs one sweep of s (z->mu not held; s pinned). */
static void sweep_one(zk_session *s) {
    zk_backend *z = s->z;
    char err[300];
    pthread_mutex_lock(&z->mu);
    zk_sweep *w = s->sweeps;
    if (w) s->sweeps = w->next;
    pthread_mutex_unlock(&z->mu);
    if (!w) return;
    int done;
    if (!w->guid[0]) {
        int rc = call(s, REQ_DELETE, w->path, 0, NULL, NULL, err, sizeof err);
        done = rc == ZOK || rc == ZNONODE;
    } else {
        char mark[48], node[ZK_PATH_MAX + 200];
        zk_op *op;
        snprintf(mark, sizeof mark, "_c_%s-", w->guid);
        int rc = call(s, REQ_KIDS, w->path, 0, NULL, &op, err, sizeof err);
        done = rc == ZNONODE;
        if (rc == ZOK) {
            done = 1;
            for (int i = 0; i < op->nkids; i++) {
                if (strncmp(op->kids[i], mark, strlen(mark))) continue;
                snprintf(node, sizeof node, "%s/%s", w->path, op->kids[i]);
                int d = call(s, REQ_DELETE, node, 0, NULL, NULL, err, sizeof err);
                if (d != ZOK && d != ZNONODE) done = 0;
            }
        }
        op_release(op);
    }
    pthread_mutex_lock(&z->mu);
    if (done || s->dead) {
        free(w);
    } else {
        w->next = s->sweeps;
        s->sweeps = w;
        s->sweep_due_us = clock_mono_us() + ZK_RETRY_US;
    }
    pthread_mutex_unlock(&z->mu);
}

static void session_free(zk_session *s) {
    while (s->sweeps) {
        zk_sweep *w = s->sweeps;
        s->sweeps = w->next;
        free(w);
    }
    free(s);
}

typedef enum keeper_work { W_NONE, W_LOST, W_CLOSE, W_PROBE, W_SWEEP } keeper_work;

/* Picks the next thing to do (z->mu held), frees closed sessions nobody
 * uses, and declares dead the sessions whose lease ran out. *next is when
 * to look again if there is nothing. */
static keeper_work keeper_pick(zk_backend *z, zk_session **out, int64_t *next) {
    int64_t now = clock_mono_us();
    *next = now + 1000000;
    for (zk_session **pp = &z->sessions; *pp;) {
        zk_session *s = *pp;
        if (s->closed && s->refs == 0) {
            *pp = s->next;
            session_free(s);
            continue;
        }
        pp = &s->next;
        if (s->closed) continue;
        int64_t end = atomic_load(&s->lease_end_us);
        if (!s->dead && end && now >= end) {
            char why[200];
            snprintf(why, sizeof why, "ZooKeeper session 0x%llx: lease ran out (no answer from "
                     "%.60s within the %d ms session timeout)", (unsigned long long)s->id,
                     z->hosts, s->timeout_ms);
            session_die(s, LOCK_ERR_IO, why);
        }
        *out = s;
        if (s->dead) {
            if (!s->lost_reported) return W_LOST;
            if (s->users == 0 && !s->closing) return W_CLOSE;
            continue;
        }
        if (end && end < *next) *next = end;
        if (s->state != ZOO_CONNECTED_STATE) continue;
        if (!s->probing) {
            if (now >= s->probe_due_us) return W_PROBE;
            if (s->probe_due_us < *next) *next = s->probe_due_us;
        }
        if (s->sweeps) {
            if (now >= s->sweep_due_us) return W_SWEEP;
            if (s->sweep_due_us < *next) *next = s->sweep_due_us;
        }
    }
    *out = NULL;
    return W_NONE;
}

static void *keeper_main(void *arg) {
    zk_backend *z = arg;
    char err[300];
    pthread_mutex_lock(&z->mu);
    while (!z->stopping) {
        if (z->gone_pending) {
            z->gone_pending = 0;
            pthread_mutex_unlock(&z->mu);
            lock_holds_lost(z->c, match_gone, NULL, LOCK_ERR_LOST,
                            "our ZooKeeper node was deleted by another client");
            pthread_mutex_lock(&z->mu);
            continue;
        }
        zk_session *s;
        int64_t next;
        keeper_work w = keeper_pick(z, &s, &next);
        if (w == W_NONE) {
            lock_cond_wait_until(&z->keeper_cv, &z->mu, next);
            continue;
        }
        s->refs++;                /* pinned while z->mu is let go */
        if (w == W_LOST) {
            char why[200];
            lock_errcode code = s->why_code;
            snprintf(why, sizeof why, "%s", s->why);
            s->lost_reported = 1;
            pthread_mutex_unlock(&z->mu);
            lock_holds_lost(z->c, match_session, s, code, why);
        } else if (w == W_CLOSE) {
            /* Closing deletes its nodes if the server still has them. */
            s->closing = 1;
            zhandle_t *zh = s->zh;
            pthread_mutex_unlock(&z->mu);
            zookeeper_close(zh);
            pthread_mutex_lock(&z->mu);
            s->zh = NULL;
            s->closed = 1;
            pthread_mutex_unlock(&z->mu);
        } else if (w == W_PROBE) {
            s->probing = 1;
            pthread_mutex_unlock(&z->mu);
            zk_op *op = send_req(s, REQ_PROBE, "/", 0, NULL, err, sizeof err);
            if (op) {
                op_release(op);   /* the completion does the rest */
            } else {
                pthread_mutex_lock(&z->mu);
                s->probing = 0;
                s->probe_due_us = clock_mono_us() + ZK_RETRY_US;
                pthread_mutex_unlock(&z->mu);
            }
        } else {
            pthread_mutex_unlock(&z->mu);
            sweep_one(s);
        }
        pthread_mutex_lock(&z->mu);
        s->refs--;
    }
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* ------------------------------------------------------------ the backend */

static void zk_stop(lock_client *c) {
    zk_backend *z = c->bstate;
    pthread_mutex_lock(&z->mu);
    z->stopping = 1;
    pthread_cond_signal(&z->keeper_cv);
    pthread_mutex_unlock(&z->mu);
    if (z->keeper_started) pthread_join(z->keeper, NULL);
    z->keeper_started = 0;
}

static void zk_destroy(lock_client *c) {
    zk_backend *z = c->bstate;
    if (!z) return;
    zk_stop(c);
    while (z->sessions) {
        zk_session *s = z->sessions;
        z->sessions = s->next;
        if (s->zh) zookeeper_close(s->zh);   /* deletes what it still held */
        session_free(s);
    }
    pthread_cond_destroy(&z->keeper_cv);
    pthread_cond_destroy(&z->conn_cv);
    pthread_mutex_destroy(&z->mu);
    free(z);
    c->bstate = NULL;
}

static const lock_backend zk_backend_ops = {
    .name = "zookeeper",
    .watchdog_renews = 0,
    .acquire = zk_acquire,
    .check = zk_check,
    .release = zk_release,
    .held = zk_held,
    .hold_free = zk_hold_free,
    .stop = zk_stop,
    .destroy = zk_destroy,
};

/* Splits "zk://hosts[/base]" into z->hosts and z->base. */
static int parse_url(zk_backend *z, const char *url, char *err, size_t errlen) {
    const char *h = url + 5;      /* after "zk://" */
    const char *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (hl == 0 || hl >= sizeof z->hosts) {
        snprintf(err, errlen, "lock: zk:// URL needs host:port[,host:port...]: '%.100s'", url);
        return -1;
    }
    memcpy(z->hosts, h, hl);
    z->hosts[hl] = '\0';
    for (const char *p = z->hosts; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memrchr(p, ':', n);
        if (!colon || colon == p || colon + 1 == p + n ||
            strspn(colon + 1, "0123456789") < (size_t)(p + n - colon - 1)) {
            snprintf(err, errlen, "lock: zk:// server '%.*s' is not host:port", (int)n, p);
            return -1;
        }
        p += n + (end ? 1 : 0);
        if (end && !*p) {
            snprintf(err, errlen, "lock: zk:// URL ends with a comma: '%.100s'", url);
            return -1;
        }
    }
    snprintf(z->base, sizeof z->base, "%s", slash && slash[1] ? slash : ZK_BASE_DEFAULT);
    if (strlen(slash ? slash : "") >= sizeof z->base) {
        snprintf(err, errlen, "lock: zk:// base path too long");
        return -1;
    }
    return check_base(z->base, err, errlen);
}

int lock_zk_open(lock_client *c, const char *url, char *err, size_t errlen) {
    zk_backend *z = calloc(1, sizeof *z);
    if (!z) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (parse_url(z, url, err, errlen)) {
        free(z);
        return -1;
    }
    char host[100] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(z->data, sizeof z->data, "flashsale-lock host=%s pid=%ld", host, (long)getpid());
    snprintf(z->desc, sizeof z->desc, "zookeeper %s%s", z->hosts, z->base);
    z->c = c;
    z->timeout_ms = c->timeout_ms;
    pthread_mutex_init(&z->mu, NULL);
    lock_cond_init(&z->conn_cv);
    lock_cond_init(&z->keeper_cv);
    if (lock_thread_start(&z->keeper, keeper_main, z)) {
        snprintf(err, errlen, "lock: cannot start the ZooKeeper keeper thread");
        pthread_cond_destroy(&z->keeper_cv);
        pthread_cond_destroy(&z->conn_cv);
        pthread_mutex_destroy(&z->mu);
        free(z);
        return -1;
    }
    z->keeper_started = 1;
    c->kind = LOCK_KIND_ZK;
    c->be = &zk_backend_ops;
    c->bstate = z;
    return 0;
}
