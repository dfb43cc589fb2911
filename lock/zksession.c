/* zksession.c: the ZooKeeper backend's sessions, its bounded requests and
 * its keeper thread (zk.c builds the lock recipe on them; zk_int.h).
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
 * children and deletes it ("sweeps"). */
#include "lock/zk_int.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

/* --------------------------------------------------------------- sessions */

/* Declares s dead: no new use; its waiters wake up; the
 * keeper reports its holds lost and closes it. */
static void session_die(zk_session *s, lock_errcode code, const char *why) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    zk_backend *z = s->z;
    if (s->dead) return;
    assert(!s->closing);                  /* only a dead session is closed */
    s->dead = 1;
    s->dead_us = clock_mono_us();
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
 * the request arrived, so its lease runs at least until sent_us + timeout.
 * Error codes the server sends about the request itself count; connection
 * loss, expiry and the like do not. */
static void session_confirmed(zk_session *s, int rc, int64_t sent_us) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
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
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
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
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

/* The ZooKeeper client logs through this: nowhere (it would write to the
 * application's stderr); failures reach callers as error codes. */
static void zk_log_discard(const char *message) { (void)message; }

/* Opens a session. The client's threads start with every
 * signal blocked, like the module's own: signals are the application's. */
static zk_session *session_open(zk_backend *z, int64_t ttl_ms, char *err, size_t errlen) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
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

zk_session *lock_zk_session_get(zk_backend *z, int64_t ttl_ms, char *err, size_t errlen) {
    int64_t until = clock_mono_us() + (int64_t)z->timeout_ms * 1000;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    zk_session *s = z->sessions;
    int live = 0;
    for (zk_session *x = z->sessions; x; x = x->next) live += !x->dead;
    while (s && (s->dead || s->ttl_ms != ttl_ms)) s = s->next;
    if (!s) {
        if (live >= ZK_MAX_SESSIONS) {
            snprintf(err, errlen, "%s: %d ZooKeeper sessions open already (one per distinct "
                     "ttl): use fewer distinct ttls", z->desc, live);
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            return NULL;
        }
        if (!(s = session_open(z, ttl_ms, err, errlen))) {
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
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
        lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        return NULL;
    }
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    return s;
}

/* Brackets a ZooKeeper call on s->zh, so the keeper never closes a handle
 * in use. Returns 0, or -1 (err) when s is closing. */
static int session_enter(zk_session *s, char *err, size_t errlen) {
    zk_backend *z = s->z;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    int ok = !s->closing;
    if (ok) s->users++;
    else snprintf(err, errlen, "%s: %s", z->desc, s->why[0] ? s->why : "session closed");
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    return ok ? 0 : -1;
}

static void session_leave(zk_session *s) {
    zk_backend *z = s->z;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    assert(s->users > 0);                 /* after its session_enter */
    if (--s->users == 0 && s->dead) pthread_cond_signal(&z->keeper_cv);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

/* Queues a sweep on s. */
void lock_zk_sweep_add(zk_session *s, const char *path, const char *guid) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
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

/* Drops one reference. */
static void op_unref(zk_op *op) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND) && op->refs > 0);
    if (--op->refs == 0) op_free(op);
}

/* Records a completion and wakes the caller. An abandoned
 * create is undone by the keeper: the node it made, or, when the outcome
 * is unknown, whatever carries its GUID. */
static void op_complete(zk_op *op, int rc) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    zk_session *s = op->s;
    assert(!op->done);                    /* a request completes once */
    op->rc = rc;
    op->done = 1;
    if (op->counted) {
        assert(s->inflight > 0);
        op->counted = 0;
        if (--s->inflight == 0) pthread_cond_broadcast(&s->z->keeper_cv);
    }
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
        if (rc == ZOK && op->created) lock_zk_sweep_add(s, op->created, NULL);
        else if (rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT)
            lock_zk_sweep_add(s, op->parent, op->guid);
    }
    pthread_cond_signal(&op->cv);
    op_unref(op);
}

static void done_void(int rc, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    op_complete(op, rc);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

static void done_stat(int rc, const struct Stat *stat, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    if (rc == ZOK && stat) op->stat = *stat;
    op_complete(op, rc);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

static void done_data(int rc, const char *value, int value_len, const struct Stat *stat,
                      const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    if (rc == ZOK && stat) op->stat = *stat;
    if (rc == ZOK && value && value_len > 0) {
        size_t n = (size_t)value_len < sizeof op->value ? (size_t)value_len : sizeof op->value;
        memcpy(op->value, value, n);
        op->value_len = n;
    }
    op_complete(op, rc);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

static void done_create(int rc, const char *path, const struct Stat *stat, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    if (rc == ZOK && path && !(op->created = strdup(path))) rc = ZSYSTEMERROR;
    if (rc == ZOK && stat) op->stat = *stat;
    op_complete(op, rc);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

static void done_kids(int rc, const struct String_vector *v, const void *data) {
    zk_op *op = (zk_op *)data;
    zk_backend *z = op->s->z;   /* op may be freed below */
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
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
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

/* Waits for op until until_us. Returns its rc, or ZOPERATIONTIMEOUT if the
 * answer did not come in time (the op is then abandoned: its completion
 * cleans up). Drops the caller's reference either way. */
static int op_wait(zk_op *op, int64_t until_us) {
    zk_backend *z = op->s->z;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    while (!op->done && clock_mono_us() < until_us) lock_cond_wait_until(&op->cv, &z->mu, until_us);
    int rc = op->done ? op->rc : ZOPERATIONTIMEOUT;
    if (!op->done) op->abandoned = 1;
    op_unref(op);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    return rc;
}

zk_op *lock_zk_send(zk_session *s, zk_req req, const char *path, int mode, const char *data,
                    zk_hold *h, char *err, size_t errlen) {
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
    /* Counted before it is queued: its completion may run before the call
     * returns. */
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    op->counted = 1;
    s->inflight++;
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    int rc = ZBADARGUMENTS;
    switch (req) {
    case REQ_CREATE:
        rc = zoo_acreate2(s->zh, path, z->data, (int)strlen(z->data), &ZOO_OPEN_ACL_UNSAFE,
                          ZOO_EPHEMERAL_SEQUENTIAL, done_create, op);
        break;
    case REQ_MKDIR:
        rc = zoo_acreate2(s->zh, path, data ? data : "", data ? (int)strlen(data) : 0,
                          &ZOO_OPEN_ACL_UNSAFE, mode, done_create, op);
        break;
    case REQ_GET: rc = zoo_aget(s->zh, path, 0, done_data, op); break;
    case REQ_KIDS: rc = zoo_aget_children(s->zh, path, 0, done_kids, op); break;
    case REQ_GET_WATCH:
        rc = zoo_awget(s->zh, path, s->z->node_watcher, wctx, done_data, op);
        break;
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
        lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
        if (op->counted) {        /* no completion will say so */
            op->counted = 0;
            s->inflight--;
        }
        lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        if (rc == ZBADARGUMENTS || rc == ZINVALIDSTATE) {
            op_free(op);          /* refused before its completion was queued */
        } else {
            /* A marshalling error may come after the completion was queued:
             * leave it its reference (at worst a small leak, never a use
             * after free). */
            lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
            op->abandoned = 1;
            op_unref(op);
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        }
        return NULL;
    }
    return op;
}

int lock_zk_call(zk_session *s, zk_req req, const char *path, int mode, const char *data,
                 zk_hold *h, zk_op **out, char *err, size_t errlen) {
    zk_backend *z = s->z;
    if (out) *out = NULL;
    zk_op *op = lock_zk_send(s, req, path, mode, data, h, err, errlen);
    if (!op) return ZSYSTEMERROR;
    int64_t until = clock_mono_us() + (int64_t)z->timeout_ms * 1000;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    op->refs++;                   /* ours past op_wait, for the results */
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    int rc = op_wait(op, until);
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    int answered = op->done;
    if (!out || !answered) op_unref(op);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    if (!answered) snprintf(err, errlen, "%s: no answer within %d ms", z->desc, z->timeout_ms);
    else if (rc != ZOK) snprintf(err, errlen, "%s: %s", z->desc, zerror(rc));
    if (out && answered) *out = op;
    return rc;
}

void lock_zk_op_release(zk_op *op) {
    if (!op) return;
    zk_backend *z = op->s->z;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    op_unref(op);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

/* ----------------------------------------------------------------- keeper */

/* lock_holds_lost's matchers: the holds of a session, and those whose node
 * another client deleted. */
static int match_session(const lock_hold *h, void *s) { return ((const zk_hold *)h)->s == s; }

static int match_gone(const lock_hold *h, void *unused) {
    (void)unused;
    return atomic_load(&((const zk_hold *)h)->gone);
}

/* Runs one sweep of s (z->mu not held; s pinned). */
static void sweep_one(zk_session *s) {
    zk_backend *z = s->z;
    char err[300];
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    zk_sweep *w = s->sweeps;
    if (w) s->sweeps = w->next;
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    if (!w) return;
    int done;
    if (!w->guid[0]) {
        int rc = lock_zk_call(s, REQ_DELETE, w->path, 0, NULL, NULL, NULL, err, sizeof err);
        done = rc == ZOK || rc == ZNONODE;
    } else {
        char mark[48], node[ZK_PATH_MAX + 200];
        zk_op *op;
        snprintf(mark, sizeof mark, "_c_%s-", w->guid);
        int rc = lock_zk_call(s, REQ_KIDS, w->path, 0, NULL, NULL, &op, err, sizeof err);
        done = rc == ZNONODE;
        if (rc == ZOK) {
            done = 1;
            for (int i = 0; i < op->nkids; i++) {
                if (strncmp(op->kids[i], mark, strlen(mark))) continue;
                snprintf(node, sizeof node, "%s/%s", w->path, op->kids[i]);
                int d = lock_zk_call(s, REQ_DELETE, node, 0, NULL, NULL, NULL, err, sizeof err);
                if (d != ZOK && d != ZNONODE) done = 0;
            }
        }
        lock_zk_op_release(op);
    }
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    if (done || s->dead) {
        free(w);
    } else {
        w->next = s->sweeps;
        s->sweeps = w;
        s->sweep_due_us = clock_mono_us() + ZK_RETRY_US;
    }
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
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

/* Picks the next thing to do, frees closed sessions nobody
 * uses, and declares dead the sessions whose lease ran out. *next is when
 * to look again if there is nothing. */
static keeper_work keeper_pick(zk_backend *z, zk_session **out, int64_t *next) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
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
            if (s->users > 0 || s->closing) continue;
            if (s->inflight == 0 || now >= s->dead_us + ZK_DRAIN_US) return W_CLOSE;
            if (s->dead_us + ZK_DRAIN_US < *next) *next = s->dead_us + ZK_DRAIN_US;
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
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    while (!z->stopping) {
        if (z->gone_pending) {
            z->gone_pending = 0;
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            lock_holds_lost(z->c, match_gone, NULL, LOCK_ERR_LOST,
                            "our ZooKeeper node was deleted by another client");
            lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
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
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            lock_holds_lost(z->c, match_session, s, code, why);
        } else if (w == W_CLOSE) {
            /* Closing deletes its nodes if the server still has them. */
            assert(s->dead && s->lost_reported && !s->closing);   /* dead, told, then closed */
            s->closing = 1;
            zhandle_t *zh = s->zh;
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            zookeeper_close(zh);
            lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
            s->zh = NULL;
            s->closed = 1;
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        } else if (w == W_PROBE) {
            s->probing = 1;
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            zk_op *op = lock_zk_send(s, REQ_PROBE, "/", 0, NULL, NULL, err, sizeof err);
            if (op) {
                lock_zk_op_release(op);   /* the completion does the rest */
            } else {
                lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
                s->probing = 0;
                s->probe_due_us = clock_mono_us() + ZK_RETRY_US;
                lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            }
        } else {
            lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
            sweep_one(s);
        }
        lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
        s->refs--;
    }
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    return NULL;
}

int lock_zk_keeper_start(zk_backend *z) {
    if (lock_thread_start(&z->keeper, keeper_main, z)) return -1;
    z->keeper_started = 1;
    return 0;
}

void lock_zk_keeper_stop(zk_backend *z) {
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    z->stopping = 1;
    pthread_cond_signal(&z->keeper_cv);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    if (z->keeper_started) pthread_join(z->keeper, NULL);
    z->keeper_started = 0;
}

void lock_zk_sessions_close(zk_backend *z) {
    while (z->sessions) {
        zk_session *s = z->sessions;
        z->sessions = s->next;
        /* Let its outstanding requests end first (see inflight), briefly. */
        int64_t until = clock_mono_us() + (int64_t)z->timeout_ms * 1000;
        lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
        while (s->zh && s->inflight > 0 && clock_mono_us() < until)
            lock_cond_wait_until(&z->keeper_cv, &z->mu, until);
        lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        if (s->zh) zookeeper_close(s->zh);   /* deletes what it still held */
        session_free(s);
    }
}
