/* zk.c: the ZooKeeper backend (zk://host:port[,host:port...][/base]): the
 * standard recipe -- an ephemeral-sequential node under a per-name parent,
 * the lowest sequence holds the lock, each waiter watches only the node
 * just before its own -- over the ZooKeeper C client (libzookeeper_mt).
 * lock.h documents the format on the server; this file is the how of the
 * lock itself. The sessions it runs on (they are the leases), its bounded
 * requests and the keeper thread are zksession.c's; zk_int.h has the
 * types both share and the threading rules. */
#include "lock/zk_int.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"


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
    assert(lock_mu_holds(LOCK_RANK_BACKEND) && !h->registered);
    h->wid = ++z->next_wid;
    unsigned b = (unsigned)(h->wid % ZK_WATCH_BUCKETS);
    h->wnext = z->watches[b];
    z->watches[b] = h;
    h->registered = 1;
}

static void watch_del(zk_backend *z, zk_hold *h) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    if (!h->registered) return;
    zk_hold **pp = &z->watches[h->wid % ZK_WATCH_BUCKETS];
    while (*pp && *pp != h) pp = &(*pp)->wnext;
    assert(*pp == h);                     /* a registered hold is in the table */
    *pp = h->wnext;
    h->registered = 0;
}

static zk_hold *watch_find(zk_backend *z, uint64_t wid) {
    assert(lock_mu_holds(LOCK_RANK_BACKEND));
    for (zk_hold *h = z->watches[wid % ZK_WATCH_BUCKETS]; h; h = h->wnext)
        if (h->wid == wid) return h;
    return NULL;
}

/* ------------------------------------------------------------------ holds */

/* The watcher of one node: the predecessor a waiter watches, or the own
 * node (its deletion by anyone but us means the lock is lost). The
 * context is the hold's watch id, not a pointer: a watch may fire long
 * after its hold is gone. */
void lock_zk_node_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)state;
    if (type == ZOO_SESSION_EVENT) return;    /* session_watcher's business */
    zk_session *s = (zk_session *)zoo_get_context(zh);
    if (!s) return;
    zk_backend *z = s->z;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
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
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

static zk_hold *hold_new(zk_backend *z, const char *name) {
    unsigned char rnd[16];
    zk_hold *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    if (lock_random(rnd, sizeof rnd)) {
        free(h);
        return NULL;
    }
    h->base.be = &lock_backend_zk;
    h->z = z;
    for (int i = 0; i < 16; i++) sprintf(h->guid + 2 * i, "%02x", rnd[i]);
    snprintf(h->parent, sizeof h->parent, "%s/", z->base);
    escape_name(name, h->parent, sizeof h->parent);
    atomic_init(&h->gone, 0);
    lock_cond_init(&h->cv);
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    watch_add(z, h);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    return h;
}

/* Frees h and drops its session reference. */
static void hold_drop(zk_hold *h) {
    assert(!lock_mu_holds(LOCK_RANK_BACKEND));
    zk_backend *z = h->z;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    watch_del(z, h);
    assert(!h->s || h->s->refs > 0);      /* h's reference is among them */
    if (h->s && --h->s->refs == 0 && h->s->dead) pthread_cond_signal(&z->keeper_cv);
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    pthread_cond_destroy(&h->cv);
    free(h);
}

static void zk_hold_free(lock_hold *base) { hold_drop((zk_hold *)base); }

/* Creates the base path's parts that are missing, as persistent nodes.
 * Returns 0 or -1 (err). */
static int make_base(zk_session *s, char *err, size_t errlen) {
    char p[ZK_PATH_MAX];
    snprintf(p, sizeof p, "%s", s->z->base);
    for (char *q = p + 1;; q++) {
        if (*q != '/' && *q) continue;
        char keep = *q;
        *q = '\0';
        int rc = lock_zk_call(s, REQ_MKDIR, p, ZOO_PERSISTENT, NULL, NULL, NULL, err, errlen);
        if (rc != ZOK && rc != ZNODEEXISTS) return -1;
        if (!keep) break;
        *q = keep;
    }
    return 0;
}

/* Creates the name's parent as a container (the server deletes it once it
 * has had children and has none left), and first, if missing, the base
 * path's parts as persistent nodes. Returns 0 or -1 (err). */
static int make_parents(zk_session *s, const char *parent, char *err, size_t errlen) {
    int rc = lock_zk_call(s, REQ_MKDIR, parent, ZOO_CONTAINER, NULL, NULL, NULL, err, errlen);
    if (rc == ZOK || rc == ZNODEEXISTS) return 0;
    if (rc != ZNONODE || make_base(s, err, errlen)) return -1;
    rc = lock_zk_call(s, REQ_MKDIR, parent, ZOO_CONTAINER, NULL, NULL, NULL, err, errlen);
    return rc == ZOK || rc == ZNODEEXISTS ? 0 : -1;
}

/* The incarnation of the server's data (lock.h, INCARNATIONS), read once
 * per session from BASE/%incarnation, which the first reader to find none
 * creates with a new random id. Once per session suffices because a
 * session lives in one server's data: a server that lost its data does not
 * know the session (it expires, or the keeper ends it when its lease runs
 * out) -- so every node this session creates, and with it every czxid it
 * hands out as a token, is of the data this id was read from. Returns the
 * id, or 0 (err). */
static uint64_t incarnation(zk_session *s, char *err, size_t errlen) {
    zk_backend *z = s->z;
    char path[ZK_BASE_MAX + sizeof ZK_INCARNATION];
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    uint64_t inc = s->incarnation;
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    if (inc) return inc;
    snprintf(path, sizeof path, "%s%s", z->base, ZK_INCARNATION);
    for (int tries = 0; !inc && tries < ZK_CREATE_TRIES; tries++) {
        zk_op *op;
        int rc = lock_zk_call(s, REQ_GET, path, 0, NULL, NULL, &op, err, errlen);
        if (rc == ZOK) {
            inc = lock_incarnation_parse(op->value, op->value_len);
            lock_zk_op_release(op);
            if (!inc) {
                snprintf(err, errlen, "%s: %s does not hold 16 hex digits", z->desc, path);
                return 0;
            }
            break;
        }
        lock_zk_op_release(op);
        if (rc != ZNONODE) return 0;
        char hex[17];
        uint64_t fresh = lock_incarnation_new();
        if (!fresh) {
            snprintf(err, errlen, "getrandom failed");
            return 0;
        }
        lock_incarnation_hex(fresh, hex);
        rc = lock_zk_call(s, REQ_MKDIR, path, ZOO_PERSISTENT, hex, NULL, NULL, err, errlen);
        if (rc == ZOK) inc = fresh;
        else if (rc == ZNONODE && make_base(s, err, errlen)) return 0;
        else if (rc != ZNONODE && rc != ZNODEEXISTS) return 0;   /* exists: read it */
    }
    if (!inc) {
        snprintf(err, errlen, "%s: %s keeps vanishing", z->desc, path);
        return 0;
    }
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    s->incarnation = inc;
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    return inc;
}

/* Creates h's node. Returns 0, or -1 (err). A create whose outcome is
 * unknown leaves a sweep for the keeper. */
static int create_node(zk_session *s, zk_hold *h, char *err, size_t errlen) {
    char prefix[ZK_PATH_MAX + 48];
    snprintf(prefix, sizeof prefix, "%s/_c_%s-lock-", h->parent, h->guid);
    for (int tries = 0; tries < ZK_CREATE_TRIES; tries++) {
        zk_op *op;
        int rc = lock_zk_call(s, REQ_CREATE, prefix, 0, NULL, h, &op, err, errlen);
        int answered = op != NULL;
        if (rc == ZOK && op->created && op->created[0] == '/' && strrchr(op->created, '/')[1]) {
            snprintf(h->path, sizeof h->path, "%s", op->created);
            h->czxid = (uint64_t)op->stat.czxid;
            lock_zk_op_release(op);
            return 0;
        }
        if (rc == ZOK) {          /* not a path: nothing to wait on, nothing to delete */
            snprintf(err, errlen, "%s: the server created '%.100s'", s->z->desc,
                     op->created ? op->created : "");
            lock_zk_op_release(op);
            return -1;
        }
        lock_zk_op_release(op);
        if (rc == ZNONODE) {
            if (make_parents(s, h->parent, err, errlen)) return -1;
            continue;
        }
        /* Broken off mid-request: the node may exist. (Unanswered ones are
         * swept by their completion.) */
        if (answered && (rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT)) {
            lock_mu_take(&s->z->mu, LOCK_RANK_BACKEND);
            if (!s->dead) lock_zk_sweep_add(s, h->parent, h->guid);
            lock_mu_drop(&s->z->mu, LOCK_RANK_BACKEND);
        }
        return -1;
    }
    snprintf(err, errlen, "%s: %s keeps vanishing under the create", s->z->desc, h->parent);
    return -1;
}

/* Marks h's node as being deleted by us, so its watch firing is no loss. */
static void deleting(zk_hold *h) {
    lock_mu_take(&h->z->mu, LOCK_RANK_BACKEND);
    h->deleting = 1;
    lock_mu_drop(&h->z->mu, LOCK_RANK_BACKEND);
}

/* Deletes h's node now (bounded) or, failing that, by a sweep. */
static void delete_node(zk_session *s, zk_hold *h) {
    char ignored[200];
    deleting(h);
    int rc = lock_zk_call(s, REQ_DELETE, h->path, 0, NULL, NULL, NULL, ignored, sizeof ignored);
    if (rc == ZOK || rc == ZNONODE) return;
    lock_mu_take(&s->z->mu, LOCK_RANK_BACKEND);
    if (!s->dead) lock_zk_sweep_add(s, h->path, NULL);
    lock_mu_drop(&s->z->mu, LOCK_RANK_BACKEND);
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
    zk_op *mine = lock_zk_send(s, REQ_GET_WATCH, h->path, 0, NULL, h, err, errlen);
    if (!mine) return LOCK_ERROR;
    lock_zk_op_release(mine);             /* its answer does not matter: the watch does */
    for (;;) {
        zk_op *op;
        if (atomic_load(&h->gone)) {
            snprintf(err, errlen, "%s: our node %s was deleted while waiting", z->desc, h->path);
            return LOCK_ERROR;
        }
        lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
        h->woken = 0;
        lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        if (lock_zk_call(s, REQ_KIDS, h->parent, 0, NULL, NULL, &op, err, errlen) != ZOK) {
            lock_zk_op_release(op);
            return LOCK_ERROR;
        }
        qsort(op->kids, (size_t)op->nkids, sizeof *op->kids, cmp_nodes);
        int me = -1;
        for (int i = 0; i < op->nkids && me < 0; i++)
            if (!strcmp(op->kids[i], own)) me = i;
        if (me > 0) snprintf(pred, sizeof pred, "%s/%s", h->parent, op->kids[me - 1]);
        lock_zk_op_release(op);
        if (me < 0) {
            snprintf(err, errlen, "%s: our node %s vanished (session ended?)", z->desc, h->path);
            return LOCK_ERROR;
        }
        if (me == 0) return LOCK_OK;
        if (clock_mono_us() >= deadline_us) return LOCK_BUSY;
        /* getData, not exists: on a node already gone it leaves no watch
         * behind (exists would wait for a creation that never comes). */
        int rc = lock_zk_call(s, REQ_GET_WATCH, pred, 0, NULL, h, NULL, err, errlen);
        if (rc == ZNONODE) continue;
        if (rc != ZOK) return LOCK_ERROR;
        lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
        while (!h->woken && !s->dead && clock_mono_us() < deadline_us)
            lock_cond_wait_until(&h->cv, &z->mu, deadline_us);
        int dead = s->dead;
        if (dead) snprintf(err, errlen, "%s: %s while waiting", z->desc, s->why);
        lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
        if (dead) return LOCK_ERROR;
    }
}

static lock_status zk_acquire(lock_client *c, const char *name, int64_t ttl_ms,
                              int64_t deadline_us, lock_took *out, lock_errcode *code, char *err,
                              size_t errlen) {
    zk_backend *z = c->bstate;
    *code = LOCK_ERR_IO;
    atomic_fetch_add(&c->st.attempts, 1);
    zk_hold *h = hold_new(z, name);
    if (!h) {
        *code = LOCK_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
        return LOCK_ERROR;
    }
    zk_session *s = lock_zk_session_get(z, ttl_ms, err, errlen);
    if (!s) {
        hold_drop(h);
        return LOCK_ERROR;
    }
    h->s = s;                     /* the reference lock_zk_session_get took */
    int64_t start = clock_mono_us();
    uint64_t inc = incarnation(s, err, errlen);
    if (!inc || create_node(s, h, err, errlen)) {
        hold_drop(h);
        return LOCK_ERROR;
    }
    lock_status st = wait_turn(s, h, deadline_us, err, errlen);
    if (st != LOCK_OK) {
        delete_node(s, h);        /* a wait that ends leaves nothing behind */
        hold_drop(h);
        return st;
    }
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    out->ttl_ms = s->timeout_ms;
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
    out->hold = &h->base;
    out->fence = h->czxid;
    out->incarnation = inc;
    out->start_us = start;
    out->lease_src = &s->lease_end_us;
    return LOCK_OK;
}

/* Whether h's node is still there and of its session (the session's lease
 * is its own: a check renews nothing). */
static lock_check check_one(lock_hold *base, char *err, size_t errlen) {
    zk_hold *h = (zk_hold *)base;
    zk_session *s = h->s;
    zk_op *op;
    lock_mu_take(&s->z->mu, LOCK_RANK_BACKEND);
    int dead = s->dead;
    int64_t sid = s->id;
    lock_mu_drop(&s->z->mu, LOCK_RANK_BACKEND);
    if (dead || atomic_load(&h->gone)) return LOCK_CHECK_GONE;
    int rc = lock_zk_call(s, REQ_EXISTS, h->path, 0, NULL, NULL, &op, err, errlen);
    lock_check r = LOCK_CHECK_UNKNOWN;
    if (rc == ZOK) r = op->stat.ephemeralOwner == sid ? LOCK_CHECK_OURS : LOCK_CHECK_GONE;
    else if (rc == ZNONODE) r = LOCK_CHECK_GONE;
    lock_zk_op_release(op);
    return r;
}

static void zk_check(lock_client *c, lock_checking *each, int n) {
    (void)c;
    for (int i = 0; i < n; i++) {
        each[i].why[0] = '\0';
        each[i].start_us = -1;
        each[i].code = LOCK_ERR_IO;
        each[i].outcome = check_one(each[i].hold, each[i].why, sizeof each[i].why);
    }
}

static lock_release_result zk_release(lock_client *c, lock_hold *base, char *err,
                                      size_t errlen) {
    (void)c;
    zk_hold *h = (zk_hold *)base;
    zk_session *s = h->s;
    lock_mu_take(&s->z->mu, LOCK_RANK_BACKEND);
    int dead = s->dead;
    if (dead) snprintf(err, errlen, "%s: %s", s->z->desc, s->why);
    lock_mu_drop(&s->z->mu, LOCK_RANK_BACKEND);
    /* A dead session's nodes go with it (the keeper closes it). */
    if (dead) return LOCK_NOT_OWNER;
    if (atomic_load(&h->gone)) {
        snprintf(err, errlen, "%s: our node %s was deleted by another", s->z->desc, h->path);
        return LOCK_NOT_OWNER;
    }
    deleting(h);
    int rc = lock_zk_call(s, REQ_DELETE, h->path, 0, NULL, NULL, NULL, err, errlen);
    if (rc == ZOK) return LOCK_RELEASED;
    if (rc == ZNONODE) {
        snprintf(err, errlen, "%s: our node %s is gone", s->z->desc, h->path);
        return LOCK_NOT_OWNER;
    }
    lock_mu_take(&s->z->mu, LOCK_RANK_BACKEND);
    if (!s->dead) lock_zk_sweep_add(s, h->path, NULL);   /* deleted once the server answers */
    lock_mu_drop(&s->z->mu, LOCK_RANK_BACKEND);
    return LOCK_UNKNOWN;
}

/* lock.c put a hold of ours into its table: if its session died meanwhile,
 * the keeper must report it (again). */
static void zk_held(lock_client *c, lock_hold *base) {
    zk_backend *z = c->bstate;
    zk_hold *h = (zk_hold *)base;
    lock_mu_take(&z->mu, LOCK_RANK_BACKEND);
    if (h->s->dead) {
        h->s->lost_reported = 0;
        pthread_cond_signal(&z->keeper_cv);
    }
    if (atomic_load(&h->gone)) {
        z->gone_pending = 1;
        pthread_cond_signal(&z->keeper_cv);
    }
    lock_mu_drop(&z->mu, LOCK_RANK_BACKEND);
}

/* ------------------------------------------------------------ the backend */

static void zk_stop(lock_client *c) { lock_zk_keeper_stop(c->bstate); }

static void zk_destroy(lock_client *c) {
    zk_backend *z = c->bstate;
    if (!z) return;
    lock_zk_keeper_stop(z);
    lock_zk_sessions_close(z);
    pthread_cond_destroy(&z->keeper_cv);
    pthread_cond_destroy(&z->conn_cv);
    pthread_mutex_destroy(&z->mu);
    free(z);
    c->bstate = NULL;
}

static int zk_open(lock_client *c, const lock_options *o, char *err, size_t errlen);

const lock_backend lock_backend_zk = {
    .name = "zookeeper",
    .kind = "ZooKeeper (zk://)",
    .scheme = "zk://",
    .max_urls = 1,
    .urls_hint = " (list an ensemble's servers inside it: zk://h1:p1,h2:p2/path)",
    .watchdog_renews = 0,
    .rearms = 0,
    .open = zk_open,
    .acquire = zk_acquire,
    .check = zk_check,
    .release = zk_release,
    .held = zk_held,
    .hold_free = zk_hold_free,
    .stats = NULL,
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

/* One zk:// URL: an ensemble's servers and the base path. */
static int zk_open(lock_client *c, const lock_options *o, char *err, size_t errlen) {
    const char *url = o->urls[0];
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
    z->node_watcher = lock_zk_node_watcher;
    pthread_mutex_init(&z->mu, NULL);
    lock_cond_init(&z->conn_cv);
    lock_cond_init(&z->keeper_cv);
    if (lock_zk_keeper_start(z)) {
        snprintf(err, errlen, "lock: cannot start the ZooKeeper keeper thread");
        pthread_cond_destroy(&z->keeper_cv);
        pthread_cond_destroy(&z->conn_cv);
        pthread_mutex_destroy(&z->mu);
        free(z);
        return -1;
    }
    c->bstate = z;
    return 0;
}
