/* stock.c: the Redis stock copy: connections, keys, and the `lua` strategy's
 * scripts (reserve_batch, undo, load, restock). See stock.h for the model.
 *
 * Its operations work on one copy: a product without lanes, or one lane
 * of a spread product (sk_copy_*, internal.h). The public ones
 * (stock_reserve, stock_read, ...), which also take a spread product
 * lane by lane, are spread.c's, above this file: the code of one copy
 * never calls back up into the lanes. */
#include "stock/stock.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "lock/lock.h"
#include "rtopo/rtopo.h"
#include "stock/internal.h"

extern const char stock_lua_undo[], stock_lua_load[],
    stock_lua_restock[], stock_lua_read[], stock_lua_write[], stock_lua_unlock[],
    stock_lua_reserve_batch[], stock_lua_lock_steps[], stock_lua_lock_read[], stock_lua_lock_write[],
    stock_lua_lock_pass[], stock_lua_lock_line[],
    stock_lua_return[], stock_lua_force_enter[], stock_lua_forget[], stock_lua_room_take[], stock_lua_room_tick[];

static rconn_script s_load, s_restock;
rconn_script sk_read, sk_write, sk_unlock, sk_undo, sk_reserve_batch, sk_lock_read,
    sk_lock_write, sk_lock_pass, sk_lock_line, sk_return, sk_force_enter, sk_forget, sk_room_take,
    sk_room_tick;
static int scripts_nomem;      /* composing one failed: connections are refused */
static pthread_once_t scripts_once = PTHREAD_ONCE_INIT;
#define s_undo sk_undo

/* The `lock` strategy's loop scripts take and free the lock module's lock
 * inside their own step, and the read-check-write scripts pass its fence
 * (lock.h, FENCING): they are its format's functions followed by the
 * stock's body (lock_script_compose), so the format is written only in
 * lock/. The text lives as long as the process. */
static void script_on_lock(rconn_script *s, const char *name, const char *body) {
    char *src = lock_script_compose(body);
    if (!src) {
        scripts_nomem = 1;
        return;
    }
    rconn_script_init(s, name, src);
}

/* The `lock` strategy's steps on a loop: format.lua's functions, then
 * lock_steps.lua's, then body. */
static void script_on_steps(rconn_script *s, const char *name, const char *body) {
    size_t ns = strlen(stock_lua_lock_steps), nb = strlen(body);
    char *both = malloc(ns + nb + 1);
    if (!both) {
        scripts_nomem = 1;
        return;
    }
    memcpy(both, stock_lua_lock_steps, ns);
    memcpy(both + ns, body, nb + 1);
    script_on_lock(s, name, both);
    free(both);
}

static void scripts_init(void) {
    rconn_script_init(&sk_reserve_batch, "reserve_batch", stock_lua_reserve_batch);
    script_on_steps(&sk_lock_read, "lock_read", stock_lua_lock_read);
    script_on_steps(&sk_lock_write, "lock_write", stock_lua_lock_write);
    script_on_steps(&sk_lock_pass, "lock_pass", stock_lua_lock_pass);
    script_on_lock(&sk_lock_line, "lock_line", stock_lua_lock_line);
    rconn_script_init(&s_undo, "undo", stock_lua_undo);
    rconn_script_init(&s_load, "load", stock_lua_load);
    rconn_script_init(&s_restock, "restock", stock_lua_restock);
    script_on_lock(&sk_read, "read", stock_lua_read);
    script_on_lock(&sk_write, "write", stock_lua_write);
    rconn_script_init(&sk_unlock, "unlock", stock_lua_unlock);
    rconn_script_init(&sk_return, "return", stock_lua_return);
    rconn_script_init(&sk_force_enter, "force_enter", stock_lua_force_enter);
    rconn_script_init(&sk_forget, "forget", stock_lua_forget);
    rconn_script_init(&sk_room_take, "room_take", stock_lua_room_take);
    rconn_script_init(&sk_room_tick, "room_tick", stock_lua_room_tick);
}

/* ---------------------------------------------------------------- strategies */

/* The one table of strategies. Per strategy: its name; its kind, which
 * decides where the service runs it (a family of service/order/ per kind)
 * and which code of this module takes its units; whether its stock lives
 * in Redis; whether it oversells by design; whether it may be segmented;
 * its line for --help and GET /v1/strategies; the lock server it needs
 * (whose row in servers.c says the rest: its flag, hint and clients);
 * and, for a read-check-write strategy, how rcw.c locks a segment. The db
 * kinds' code is the db module's (the committer takes their stock in the
 * order's own transaction). */
static const stock_strategy_info STRATEGIES[STOCK_STRATEGY_COUNT] = {
    [STOCK_LUA] = { "lua", STOCK_KIND_SCRIPT, 1, 0, 1,
                    "one atomic Lua script checks and takes the stock (segments > 1: over N keys)",
                    STOCK_LOCKS_NONE },
    [STOCK_LOCK] = { "lock", STOCK_KIND_LOCK, 1, 0, 1,
                     "a Redis lock per SKU (or segment) around read, check and a fenced write; "
                     "lease renewal; 429 lock_timeout past the wait", STOCK_LOCKS_REDIS,
                     &sk_lock_module },
    [STOCK_REDLOCK] = { "redlock", STOCK_KIND_RCW, 1, 0, 1,
                        "the same, with the lock held by a majority of independent Redis "
                        "servers (Redlock, --redlock); its token fences the write",
                        STOCK_LOCKS_REDLOCK, &sk_lock_module },
    [STOCK_ZOOKEEPER] = { "zookeeper", STOCK_KIND_RCW, 1, 0, 1,
                          "an ephemeral-sequential ZooKeeper node per segment lock, each waiter "
                          "watching its predecessor; the session is the lease, the node's czxid "
                          "fences the write (--zookeeper)", STOCK_LOCKS_ZOOKEEPER,
                          &sk_lock_module },
    [STOCK_ETCD] = { "etcd", STOCK_KIND_RCW, 1, 0, 1,
                     "an etcd key under a lease kept alive while held, waiters watching the key "
                     "before theirs; its create revision fences the write (--etcd)",
                     STOCK_LOCKS_ETCD, &sk_lock_module },
    [STOCK_DB_LOCK] = { "db-lock", STOCK_KIND_RCW, 1, 0, 1,
                        "a row in a lock table in the SQLite database (unique insert, taken over "
                        "once expired, polled); a counter per lock fences the write",
                        STOCK_LOCKS_DB, &sk_lock_db_table },
    [STOCK_DB] = { "db", STOCK_KIND_DB, 0, 0, 0,
                   "SQLite: UPDATE .. WHERE available >= qty in the order's own transaction",
                   STOCK_LOCKS_NONE },
    [STOCK_DB_OPTIMISTIC] = { "db-optimistic", STOCK_KIND_DB_OPTIMISTIC, 0, 0, 0,
                              "SQLite: read available and version, UPDATE .. WHERE version = v; "
                              "bounded retries, then 429", STOCK_LOCKS_NONE },
    [STOCK_LOCAL] = { "local", STOCK_KIND_RCW, 1, 0, 1,
                      "an in-process mutex around read, check, write in Redis: right with one "
                      "instance, oversells with two", STOCK_LOCKS_NONE, &sk_lock_local },
    [STOCK_UNSAFE_READ_WRITE] = { "unsafe-read-write", STOCK_KIND_RCW, 1, 1, 1,
                                  "GET, check, SET, no lock: concurrent buyers overwrite each "
                                  "other's writes (lost updates)", STOCK_LOCKS_NONE },
    [STOCK_UNSAFE_CHECK_THEN_DECR] = { "unsafe-check-then-decr", STOCK_KIND_RCW, 1, 1, 1,
                                       "GET, check, DECRBY, no lock: the check is stale by the "
                                       "decrement, and stock goes negative", STOCK_LOCKS_NONE },
    [STOCK_UNSAFE_SETNX_EXPIRE] = { "unsafe-setnx-expire", STOCK_KIND_RCW, 1, 1, 1,
                                    "SETNX then EXPIRE, released by a plain DEL: a holder past "
                                    "its TTL deletes the next holder's lock", STOCK_LOCKS_NONE,
                                    &sk_lock_setnx_expire },
    [STOCK_UNSAFE_LOCK_NO_FENCE] = { "unsafe-lock-no-fence", STOCK_KIND_RCW, 1, 1, 1,
                                     "SET NX PX, owner-checked release, no renewal, no fencing: "
                                     "safe only while the critical section is shorter than the TTL",
                                     STOCK_LOCKS_NONE, &sk_lock_set_nx_px },
    [STOCK_UNSAFE_UNLOCK_BEFORE_WRITE] = { "unsafe-unlock-before-write", STOCK_KIND_RCW, 1, 1, 1,
                                           "releases the lock, then writes: the next holder "
                                           "reads the old value (lost updates)", STOCK_LOCKS_NONE,
                                           &sk_lock_set_nx_px },
    [STOCK_UNSAFE_REDLOCK_NO_FENCE] = { "unsafe-redlock-no-fence", STOCK_KIND_RCW, 1, 1, 1,
                                        "Redlock's majority lock (--redlock) with the write not "
                                        "fenced: a holder that outlives its lease -- a pause, a "
                                        "server's clock jumping forward, a server that forgets "
                                        "its last second of writes -- writes over the next "
                                        "holder's", STOCK_LOCKS_REDLOCK, &sk_lock_module_unfenced },
    [STOCK_UNSAFE_TRUST_REDIS] = { "unsafe-trust-redis", STOCK_KIND_SCRIPT, 1, 1, 1,
                                   "lua's script with Redis as the truth: any stock copy is "
                                   "trusted, whoever built it, so a replica promoted without "
                                   "the last decrements, or a Redis that lost its last second of "
                                   "AOF, sells those units again", STOCK_LOCKS_NONE, NULL, 1 },
    [STOCK_DB_FOR_UPDATE] = { "db-for-update", STOCK_KIND_DB_FOR_UPDATE, 0, 0, 0,
                              "PostgreSQL: a transaction per order locks the product row "
                              "(SELECT .. FOR UPDATE), checks, writes and commits (the "
                              "pessimistic lock of Alibaba Cloud's distributed lock article)",
                              STOCK_LOCKS_NONE, NULL, 0, 1 },
    [STOCK_UNSAFE_CHECK_OUTSIDE_TX] = { "unsafe-check-outside-tx", STOCK_KIND_DB_FOR_UPDATE,
                                        0, 1, 0,
                                        "PostgreSQL: reads and checks the stock before the "
                                        "transaction that locks the row, then writes what it "
                                        "computed: two buyers of one read both sell",
                                        STOCK_LOCKS_NONE, NULL, 0, 1 },
    [STOCK_FAIR_LOCK] = { "fair-lock", STOCK_KIND_LOCK, 1, 0, 1,
                          "the Redis lock of `lock`, fair: orders hold it in the order they "
                          "asked, across instances (a line in Redis beside the lock, as "
                          "Alibaba Cloud's distributed lock article asks); a fenced write; "
                          "429 lock_timeout past the wait",
                          STOCK_LOCKS_REDIS_FAIR, &sk_lock_module },
};

static const char *const CALL_NAMES[STOCK_CALL_COUNT] = {
    [STOCK_CALL_RESERVE_BATCH] = "reserve_batch", [STOCK_CALL_CLEAR] = "clear",
    [STOCK_CALL_UNDO] = "undo", [STOCK_CALL_LOCK_READ] = "lock_read",
    [STOCK_CALL_LOCK_WRITE] = "lock_write", [STOCK_CALL_RCW] = "rcw",
    [STOCK_CALL_OTHER] = "other",
};

const char *stock_call_name(stock_call c) {
    return c >= 0 && c < STOCK_CALL_COUNT ? CALL_NAMES[c] : "other";
}

int stock_strategy_parse(const char *name, stock_strategy *out) {
    for (int i = 0; i < STOCK_STRATEGY_COUNT; i++) {
        if (STRATEGIES[i].name && !strcmp(STRATEGIES[i].name, name)) {
            *out = (stock_strategy)i;
            return 0;
        }
    }
    return -1;
}

const stock_strategy_info *stock_strategy_about(stock_strategy s) {
    assert(s < STOCK_STRATEGY_COUNT);
    return &STRATEGIES[s];
}

/* ------------------------------------------------------------------- hints */

int stock_product_init(stock_product *p, const char *sku, stock_strategy s, int segments,
                       long long per_user_limit, int cs_delay_ms, int lock_ttl_ms) {
    int words = (segments + 63) / 64;
    *p = (stock_product){ .sku = sku, .strategy = s, .segments = segments,
                          .per_user_limit = per_user_limit, .cs_delay_ms = cs_delay_ms,
                          .lock_ttl_ms = lock_ttl_ms };
    p->hint = calloc(1, sizeof *p->hint + (size_t)words * sizeof(uint64_t));
    if (!p->hint) return -1;
    p->hint->nwords = words;
    return 0;
}

void sk_lane_free(stock_product *lane) {
    free((char *)lane->sku);
    lane->sku = NULL;
    stock_product_free(lane);
}

void stock_product_free(stock_product *p) {
    free(p->hint);
    p->hint = NULL;
    for (int i = 0; i < p->lanes; i++) sk_lane_free(&p->lane[i]);
    free(p->lane);
    p->lane = NULL;
    p->lanes = 0;
}

int sk_hint_empty(const stock_product *p, int seg) {
    if (!p->hint) return 0;
    return (__atomic_load_n(&p->hint->words[seg / 64], __ATOMIC_RELAXED) >> (seg % 64)) & 1;
}

void sk_hint_set(const stock_product *p, int seg, int empty) {
    if (!p->hint) return;
    uint64_t bit = 1ULL << (seg % 64);
    if (empty) __atomic_fetch_or(&p->hint->words[seg / 64], bit, __ATOMIC_RELAXED);
    else __atomic_fetch_and(&p->hint->words[seg / 64], ~bit, __ATOMIC_RELAXED);
}

/* --------------------------------------------------------------- connection */



int sk_scripts_init(void) {
    pthread_once(&scripts_once, scripts_init);
    return scripts_nomem ? -1 : 0;
}

stock_conn *stock_conn_new(const stock_config *cfg, char *err, size_t errlen) {
    stock_conn *c = sk_scripts_init() ? NULL : calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->primary = cfg->primary;
    c->cluster = cfg->cluster;
    if (!c->primary && !c->cluster && rconn_parse(cfg->redis_url, &c->addr, err, errlen)) {
        free(c);
        return NULL;
    }
    snprintf(c->prefix, sizeof c->prefix, "%s", cfg->prefix);
    snprintf(c->instance, sizeof c->instance, "%s", cfg->instance ? cfg->instance : "");
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 1000;
    c->idem_ttl_ms = cfg->idem_ttl_ms > 0 ? cfg->idem_ttl_ms : 86400000;
    memcpy(c->locks, cfg->locks, sizeof c->locks);
    memcpy(c->locks_frozen, cfg->locks_frozen, sizeof c->locks_frozen);
    c->db_pool = cfg->db_pool;
    c->db_wait_ms = cfg->db_wait_ms;
    c->lock_ttl_ms = cfg->lock_ttl_ms > 0 ? cfg->lock_ttl_ms : 2000;
    c->lock_wait_ms = cfg->lock_wait_ms > 0 ? cfg->lock_wait_ms : 1000;
    c->observe = cfg->observe;
    c->observe_ud = cfg->observe_ud;
    c->rng = (uint64_t)clock_mono_us() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)c;
    rconn_cmd_init(&c->cmd);
    return c;
}

void stock_conn_free(stock_conn *c) {
    if (!c) return;
    if (c->ctx) redisFree(c->ctx);
    for (int i = 0; i < c->nparked; i++) redisFree(c->parked[i].ctx);
    rconn_cmd_free(&c->cmd);
    free(c->retry);
    free(c);
}

const char *stock_conn_errstr(const stock_conn *c) { return c->errstr; }

/* Drops a connection that failed: its replies can no longer be matched to
 * requests, so the next call starts afresh. */
void sk_drop(stock_conn *c, const char *what) {
    snprintf(c->errstr, sizeof c->errstr, "%s: %s", what,
             c->ctx && c->ctx->err ? c->ctx->errstr : "connection lost");
    if (c->ctx) redisFree(c->ctx);
    c->ctx = NULL;
    if (c->primary) rtopo_primary_suspect(c->primary, c->version);
    if (c->cluster) rtopo_cluster_suspect(c->cluster);
}

void sk_bad_reply(stock_conn *c, const char *what, const redisReply *rep) {
    snprintf(c->errstr, sizeof c->errstr, "%s: %s", what,
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    if (sk_redirected(c, rep)) return;
    if (rtopo_classify(rep, NULL) == RTOPO_REDISCOVER) c->stale = 1;
}

/* ------------------------------------------------------ cluster routing */

static int same_node(const rconn_addr *a, const rconn_addr *b) {
    return a->port == b->port && !strcmp(a->host, b->host) && !strcmp(a->path, b->path);
}

/* Keeps the current node's connection for later (the oldest kept goes
 * when there are SK_PARKED already). */
static void park(stock_conn *c) {
    if (!c->ctx) return;
    if (c->nparked == SK_PARKED) {
        redisFree(c->parked[0].ctx);
        memmove(&c->parked[0], &c->parked[1], sizeof c->parked[0] * (SK_PARKED - 1));
        c->nparked--;
    }
    sk_node *n = &c->parked[c->nparked++];
    n->addr = c->addr;
    n->ctx = c->ctx;
    memcpy(n->run_id, c->run_id, sizeof n->run_id);
    c->ctx = NULL;
}

/* Makes a the current node, with its kept connection if there is one. */
static void unpark(stock_conn *c, const rconn_addr *a) {
    c->addr = *a;
    c->routed = 1;
    for (int i = 0; i < c->nparked; i++) {
        if (!same_node(&c->parked[i].addr, a)) continue;
        c->ctx = c->parked[i].ctx;
        memcpy(c->run_id, c->parked[i].run_id, sizeof c->run_id);
        c->parked[i] = c->parked[--c->nparked];
        return;
    }
}

/* Points c at the node serving slot (see sk_route). */
static int route_slot(stock_conn *c, int slot) {
    rconn_addr a;
    if (!rtopo_cluster_route(c->cluster, slot, &a)) {
        snprintf(c->errstr, sizeof c->errstr, "redis cluster: no node known to serve slot %d",
                 slot);
        rtopo_cluster_suspect(c->cluster);
        park(c);
        c->routed = 0;
        return -1;
    }
    if (c->routed && same_node(&a, &c->addr)) return 0;
    park(c);
    unpark(c, &a);
    return 0;
}

/* The slot of the keys of sku (all share its hash tag). */
static int sku_slot(const stock_conn *c, const char *sku) {
    char key[STOCK_SKU_MAX + 96];
    int n = stock_key(key, sizeof key, c->prefix, sku, "gen");
    return rtopo_slot(key, n > 0 ? (size_t)n : 0);
}

int sk_route(stock_conn *c, const char *sku) {
    return c->cluster ? route_slot(c, sku_slot(c, sku)) : 0;
}

int sk_redirected(stock_conn *c, const redisReply *rep) {
    if (!c->cluster || !rep || rep->type != REDIS_REPLY_ERROR) return 0;
    rtopo_redirect rd;
    rtopo_verdict v = rtopo_classify(rep, &rd);
    if (v == RTOPO_MOVED) rtopo_cluster_moved(c->cluster, &rd);
    else if (v == RTOPO_CLUSTERDOWN) rtopo_cluster_suspect(c->cluster);
    else if (v != RTOPO_ASK && v != RTOPO_TRYAGAIN) return 0;
    c->redirect = (int)v;
    return 1;
}

/* sk_again for a call whose keys are in slot (-1: any node will do). */
static int again_slot(stock_conn *c, int slot, int attempt) {
    if (attempt > 0) {
        if (!c->redirect || attempt > RTOPO_RETRIES) return 0;
        /* The pause rtopo.h's policy gives the verdict. MOVED: the map
         * knows the new node now. ASK: the slot's keys are being moved;
         * they are all there or all here in a moment (the script's keys
         * are of one slot), so wait and ask where again rather than follow
         * one command. TRYAGAIN: the same. CLUSTERDOWN: a failover is
         * under way. */
        int pause = rtopo_retry_pause_ms((rtopo_verdict)c->redirect);
        if (pause > 0) clock_sleep_ms(pause);
    }
    c->redirect = 0;
    /* Any node will do: slot 0's primary, as the map has it now (not the
     * node last used, which may have died since). */
    if (c->cluster) route_slot(c, slot >= 0 ? slot : 0);
    return 1;
}

int sk_again(stock_conn *c, const char *sku, int attempt) {
    return again_slot(c, c->cluster ? sku_slot(c, sku) : -1, attempt);
}

/* Where to connect: the primary as last found. Returns 0, or -1 with
 * c->errstr when none is known. */
static int pick_primary(stock_conn *c) {
    if (!c->primary) return 0;
    if (!(c->version = rtopo_primary_get(c->primary, &c->addr))) {
        snprintf(c->errstr, sizeof c->errstr, "redis: no primary found yet through Sentinel");
        return -1;
    }
    return 0;
}

int stock_conn_ensure(stock_conn *c) {
    /* A connection to a primary that moved, or that said it is not one,
     * goes: the next command finds the new primary. */
    if (c->ctx && (c->stale || (c->primary && rtopo_primary_version(c->primary) != c->version))) {
        redisFree(c->ctx);
        c->ctx = NULL;
        if (c->stale && c->primary) rtopo_primary_suspect(c->primary, c->version);
    }
    if (c->stale && c->cluster) rtopo_cluster_suspect(c->cluster);
    c->stale = 0;
    if (c->ctx) return 0;
    if (c->cluster && !c->routed) {
        snprintf(c->errstr, sizeof c->errstr, "redis cluster: no node known for the key yet");
        return -1;
    }
    if (pick_primary(c)) return -1;
    const rconn_script *all[] = { &sk_reserve_batch, &s_undo, &s_load, &s_restock, &sk_read,
                                  &sk_write, &sk_unlock, &sk_return, &sk_force_enter, &sk_forget,
                                  &sk_room_take, &sk_room_tick };
    char err[200];
    c->ctx = rconn_connect(&c->addr, c->timeout_ms, err, sizeof err);
    if (!c->ctx) {
        snprintf(c->errstr, sizeof c->errstr, "redis %s", err);
        if (c->cluster) rtopo_cluster_suspect(c->cluster);
        return -1;
    }
    if (rconn_script_load(c->ctx, all, (int)(sizeof all / sizeof all[0]), err, sizeof err) ||
        rconn_run_id(c->ctx, c->run_id)) {
        snprintf(c->errstr, sizeof c->errstr, "redis setup: %s", err);
        redisFree(c->ctx);
        c->ctx = NULL;
        return -1;
    }
    return 0;
}

/* Runs c->cmd, which must be safe to repeat. A connection that broke while
 * idle (Redis restarted since the last call) fails on first use; that one
 * failure is retried once on a fresh connection. */
redisReply *sk_run_idempotent(stock_conn *c, const char *what) {
    for (int attempt = 0; attempt < 2; attempt++) {
        if (stock_conn_ensure(c)) return NULL;
        int64_t t0 = sk_t0(c->observe);
        redisReply *rep = rconn_cmd_run(c->ctx, &c->cmd);
        sk_observe(c->observe, c->observe_ud, STOCK_CALL_OTHER, t0);
        if (rep && sk_redirected(c, rep)) {
            snprintf(c->errstr, sizeof c->errstr, "%s: %s", what, rep->str);
            freeReplyObject(rep);
            return NULL;
        }
        if (rep) return rep;
        sk_drop(c, what);
    }
    return NULL;
}

int stock_ping(stock_conn *c) {
    again_slot(c, -1, 0);                 /* a cluster: slot 0's primary, as the map has it */
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "PING");
    redisReply *rep = sk_run_idempotent(c, "ping");
    if (!rep) return -1;
    freeReplyObject(rep);
    return 0;
}

/* ---------------------------------------------------------------------- keys */

int stock_key(char *buf, size_t len, const char *prefix, const char *sku, const char *suffix) {
    int n = snprintf(buf, len, "%s{%s}:%s", prefix, sku, suffix);
    return n < 0 || (size_t)n >= len ? -1 : n;
}

void sk_add_key(stock_conn *c, const char *sku, const char *suffix) {
    rconn_cmd_addf(&c->cmd, "%s{%s}:%s", c->prefix, sku, suffix);
}

void sk_add_segment_keys(stock_conn *c, const stock_product *p) {
    for (int i = 0; i < p->segments; i++)
        rconn_cmd_addf(&c->cmd, "%s{%s}:stock:%d", c->prefix, p->sku, i);
}

void sk_add_idem_key(stock_conn *c, const char *sku, const char *idem) {
    rconn_cmd_addf(&c->cmd, "%s{%s}:idem:%s", c->prefix, sku, idem ? idem : "");
}

uint64_t sk_random(stock_conn *c) {
    /* xorshift64*: a per-connection stream, only for spreading load. */
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 2685821657736338717ULL;
}

/* -------------------------------------------------------- idempotency */

#define SK_STR_(x) #x
#define SK_STR(x) SK_STR_(x)

int sk_idem_replay(stock_req *r, const char *idem, long long gen) {
    char rgen[24], oid[STOCK_ORDER_ID_MAX + 1], fp[40];
    if (!r->idem_key || !r->idem_key[0] || !idem[0]) return 0;
    /* The order id's width from its one definition (stock.h). */
    if (sscanf(idem, "%23[0-9]|%" SK_STR(STOCK_ORDER_ID_MAX) "[^|]|%39s", rgen, oid, fp) != 3 ||
        atoll(rgen) != gen)
        return 0;
    snprintf(r->replay_order_id, sizeof r->replay_order_id, "%s", oid);
    r->replay_same = r->fingerprint && !strcmp(fp, r->fingerprint);
    return 1;
}

/* ------------------------------------------------------------------ reserve */

/* Whether r has an idempotency key (its record is one of the call's keys). */
static int req_keyed(const stock_req *r) { return r->idem_key && r->idem_key[0]; }

void sk_batch_build(rconn_cmd *cmd, const sk_batch *b) {
    const stock_product *p = b->p;
    int nkeyed = 0;
    for (size_t i = 0; i < b->n; i++) nkeyed += req_keyed(b->reqs[i]);
    rconn_cmd_evalsha(cmd, &sk_reserve_batch, 4 + p->segments + nkeyed);
    static const char *const sku_keys[] = { "gen", "pending", "users", "empty" };  /* KEYS[1..4] */
    for (size_t k = 0; k < sizeof sku_keys / sizeof sku_keys[0]; k++)
        rconn_cmd_addf(cmd, "%s{%s}:%s", b->prefix, p->sku, sku_keys[k]);
    for (int i = 0; i < p->segments; i++)
        rconn_cmd_addf(cmd, "%s{%s}:stock:%d", b->prefix, p->sku, i);
    for (size_t i = 0; i < b->n; i++)
        if (req_keyed(b->reqs[i]))
            rconn_cmd_addf(cmd, "%s{%s}:idem:%s", b->prefix, p->sku, b->reqs[i]->idem_key);
    rconn_cmd_adds(cmd, b->run_id);
    rconn_cmd_adds(cmd, b->instance);
    rconn_cmd_addll(cmd, b->idem_ttl_ms);
    rconn_cmd_addll(cmd, p->per_user_limit);
    rconn_cmd_addll(cmd, p->segments);
    rconn_cmd_addll(cmd, b->first);
    rconn_cmd_addll(cmd, (long long)b->nids);
    for (size_t i = 0; i < b->nids; i++) rconn_cmd_adds(cmd, b->ids[i]);
    int keyidx = 5 + p->segments;              /* KEYS index of the first idem record */
    for (size_t i = 0; i < b->n; i++) {
        const stock_req *r = b->reqs[i];
        int keyed = req_keyed(r);
        char tail[STOCK_USER_MAX + 200];
        size_t ul = strlen(r->user_id), kl = keyed ? strlen(r->idem_key) : 0;
        rconn_cmd_adds(cmd, r->order_id);
        rconn_cmd_add(cmd, r->user_id, ul);
        rconn_cmd_addll(cmd, r->quantity);
        rconn_cmd_adds(cmd, keyed ? r->fingerprint : "");
        rconn_cmd_addll(cmd, keyed ? keyidx++ : 0);
        /* The pending record's tail, "<n>:<user><n>:<key>" (docs/storage.md). */
        int n = snprintf(tail, sizeof tail, "%zu:%s%zu:%s", ul, r->user_id, kl,
                         keyed ? r->idem_key : "");
        rconn_cmd_add(cmd, tail, n > 0 && (size_t)n < sizeof tail ? (size_t)n : 0);
        if (keyed) rconn_cmd_adds(cmd, r->idem_key);
    }
}

/* One order, r, as a batch of one: the copy this connection's server
 * keeps must be valid (never "*", as the loops' trusting strategy may). */
static void build_reserve(stock_conn *c, stock_req *const *r) {
    const stock_product *p = (*r)->product;
    sk_batch b = { .prefix = c->prefix, .instance = c->instance, .idem_ttl_ms = c->idem_ttl_ms,
                   .p = p, .reqs = r, .n = 1, .run_id = c->run_id,
                   .first = p->segments > 1 ? (long long)(sk_random(c) % (uint64_t)p->segments)
                                            : 0 };
    sk_batch_build(&c->cmd, &b);
}

long long sk_elem_int(const redisReply *r, size_t i) {
    if (r->type != REDIS_REPLY_ARRAY || i >= r->elements) return 0;
    const redisReply *e = r->element[i];
    if (e->type == REDIS_REPLY_INTEGER) return e->integer;
    if (e->type == REDIS_REPLY_STRING) return strtoll(e->str, NULL, 10);
    return 0;
}

const char *sk_elem_str(const redisReply *r, size_t i) {
    if (r->type != REDIS_REPLY_ARRAY || i >= r->elements) return "";
    const redisReply *e = r->element[i];
    return e->type == REDIS_REPLY_STRING ? e->str : "";
}

int sk_reserve_decode(stock_req *r, const redisReply *rep) {
    r->outcome_unknown = 0;   /* an answer came; an error reply means the script aborted */
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1) {
        r->result = STOCK_UNAVAILABLE;
        return -1;
    }
    switch (sk_elem_int(rep, 0)) {
    case 1:
        r->result = STOCK_RESERVED;
        r->gen = sk_elem_int(rep, 1);
        sk_req_takes(r, rep);
        break;
    case 2:
        r->result = STOCK_REPLAY;
        snprintf(r->replay_order_id, sizeof r->replay_order_id, "%s", sk_elem_str(rep, 1));
        r->replay_same = r->fingerprint && !strcmp(sk_elem_str(rep, 2), r->fingerprint);
        break;
    case 0:
        r->result = STOCK_SOLD_OUT;
        r->available = 0;
        break;
    case -1:
        r->result = STOCK_INSUFFICIENT;
        r->available = sk_elem_int(rep, 1);
        break;
    case -2:
        r->result = STOCK_LIMIT;
        r->available = sk_elem_int(rep, 1);
        break;
    default:
        r->result = STOCK_MISSING;
        break;
    }
    return 0;
}

/* Turns a batch of one's reply into the request's result. */
static void read_reserve_reply(stock_conn *c, stock_req *r, const redisReply *rep) {
    int one = rep->type == REDIS_REPLY_ARRAY && rep->elements == 1;
    if (sk_reserve_decode(r, one ? rep->element[0] : NULL)) sk_bad_reply(c, "reserve", rep);
}

void sk_req_takes(stock_req *r, const redisReply *rep) {
    if (!r->want_takes) return;
    free(r->takes);
    r->takes = strdup(sk_elem_str(rep, 2));
}

unsigned char *sk_retry_flags(stock_conn *c, size_t n) {
    if (n > c->retry_cap) {
        unsigned char *p = realloc(c->retry, n);
        if (!p) abort();
        c->retry = p;
        c->retry_cap = n;
    }
    if (n) memset(c->retry, 0, n);       /* (memset of NULL is undefined, even for 0) */
    return c->retry;
}

static int reserve_at(stock_conn *c, stock_req **reqs, size_t n) {
    size_t i, got = 0;
    for (i = 0; i < n; i++) {
        reqs[i]->result = STOCK_UNAVAILABLE;
        reqs[i]->outcome_unknown = 0;
    }
    if (stock_conn_ensure(c)) return -1;
    unsigned char *retry = sk_retry_flags(c, n);
    for (i = 0; i < n; i++) {
        build_reserve(c, &reqs[i]);
        rconn_cmd_append(c->ctx, &c->cmd);
        /* From here on a lost connection leaves the request unknown. */
        reqs[i]->outcome_unknown = 1;
    }
    int noscript = 0;
    for (got = 0; got < n; got++) {
        redisReply *rep = NULL;
        if (redisGetReply(c->ctx, (void **)&rep) != REDIS_OK) break;
        reqs[got]->outcome_unknown = 0;
        if (rconn_is_noscript(rep)) noscript = retry[got] = 1;   /* it did not run */
        else read_reserve_reply(c, reqs[got], rep);
        freeReplyObject(rep);
    }
    if (got < n) {
        sk_drop(c, "reserve");
        return -1;
    }
    /* Redis lost its script cache (restart, SCRIPT FLUSH): EVAL those. */
    for (i = 0; noscript && i < n; i++) {
        if (!retry[i]) continue;
        build_reserve(c, &reqs[i]);
        reqs[i]->outcome_unknown = 1;
        redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &sk_reserve_batch);
        if (!rep) {
            sk_drop(c, "reserve");
            return -1;
        }
        reqs[i]->outcome_unknown = 0;
        read_reserve_reply(c, reqs[i], rep);
        freeReplyObject(rep);
    }
    for (i = 0; i < n; i++)
        if (reqs[i]->result == STOCK_UNAVAILABLE) return -1;
    return 0;
}

int sk_copy_reserve(stock_conn *c, stock_req **reqs, size_t n) {
    if (!c->cluster) return reserve_at(c, reqs, n);
    /* A cluster: one at a time, each on its SKU's node. */
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int one = 0;
        for (int a = 0; sk_again(c, reqs[i]->product->sku, a); a++)
            one = reserve_at(c, &reqs[i], 1);
        rc |= one;
    }
    return rc ? -1 : 0;
}

/* ----------------------------------------------------------- confirm / undo */

/* sk_copy_confirm's calls on the node c points at. */
static int confirm_calls(stock_conn *c, const stock_ref *refs, size_t n) {
    int rc = 0;
    if (stock_conn_ensure(c)) return -1;
    for (size_t i = 0; i < n; i++) {
        rconn_cmd_reset(&c->cmd);
        rconn_cmd_adds(&c->cmd, "HDEL");
        sk_add_key(c, refs[i].product->sku, "pending");
        rconn_cmd_adds(&c->cmd, refs[i].order_id);
        rconn_cmd_append(c->ctx, &c->cmd);
    }
    for (size_t i = 0; i < n; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(c->ctx, (void **)&rep) != REDIS_OK) {
            sk_drop(c, "confirm");
            return -1;
        }
        if (sk_redirected(c, rep)) rc = -1;
        freeReplyObject(rep);
    }
    return rc;
}

int sk_copy_confirm(stock_conn *c, const stock_ref *refs, size_t n) {
    if (!c->cluster) return confirm_calls(c, refs, n);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int one = 0;
        for (int a = 0; sk_again(c, refs[i].product->sku, a); a++)
            one = confirm_calls(c, &refs[i], 1);
        rc |= one;
    }
    return rc;
}

static void build_undo(stock_conn *c, const stock_ref *r) {
    rconn_cmd_evalsha(&c->cmd, &s_undo, 4 + r->product->segments);
    sk_add_key(c, r->product->sku, "pending");
    sk_add_key(c, r->product->sku, "users");
    sk_add_idem_key(c, r->product->sku, r->idem_key);
    sk_add_key(c, r->product->sku, "empty");
    sk_add_segment_keys(c, r->product);
    rconn_cmd_adds(&c->cmd, r->order_id);
}

/* sk_copy_undo's calls on the node c points at. */
static int undo_calls(stock_conn *c, const stock_ref *refs, size_t n, int *done) {
    size_t i;
    for (i = 0; i < n; i++) done[i] = 0;
    if (stock_conn_ensure(c)) return -1;
    unsigned char *retry = sk_retry_flags(c, n);
    for (i = 0; i < n; i++) {
        build_undo(c, &refs[i]);
        rconn_cmd_append(c->ctx, &c->cmd);
    }
    int rc = 0;
    for (i = 0; i < n; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(c->ctx, (void **)&rep) != REDIS_OK) {
            sk_drop(c, "undo");
            return -1;
        }
        done[i] = rep->type == REDIS_REPLY_INTEGER;
        if (rconn_is_noscript(rep)) retry[i] = 1;   /* it did not run */
        else if (!done[i]) {
            sk_bad_reply(c, "undo", rep);
            rc = -1;
        }
        freeReplyObject(rep);
    }
    for (i = 0; i < n; i++) {
        if (!retry[i]) continue;
        build_undo(c, &refs[i]);
        redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &s_undo);
        if (!rep) {
            sk_drop(c, "undo");
            return -1;
        }
        done[i] = rep->type == REDIS_REPLY_INTEGER;
        if (!done[i]) rc = -1;
        freeReplyObject(rep);
    }
    return rc;
}

int sk_copy_undo(stock_conn *c, const stock_ref *refs, size_t n, int *done) {
    if (!c->cluster) return undo_calls(c, refs, n, done);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int one = 0;
        for (int a = 0; sk_again(c, refs[i].product->sku, a); a++)
            one = undo_calls(c, &refs[i], 1, &done[i]);
        rc |= one;
    }
    return rc;
}

/* --------------------------------------------------------------------- reads */

/* Parses a gen value "<gen>:<run_id>"; returns the generation when the copy
 * was built for the Redis we are connected to, else 0. */
static long long valid_gen(const stock_conn *c, const stock_product *p, const redisReply *e) {
    if (e->type != REDIS_REPLY_STRING) return 0;
    char *colon = strchr(e->str, ':');
    if (!colon || (strcmp(colon + 1, c->run_id) != 0 &&
                   !stock_strategy_about(p->strategy)->trusts_copy))
        return 0;
    return strtoll(e->str, NULL, 10);
}

static stock_result read_at(stock_conn *c, const stock_product *p, long long *total,
                            long long *seg) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "MGET");
    sk_add_key(c, p->sku, "gen");
    sk_add_segment_keys(c, p);
    redisReply *rep = sk_run_idempotent(c, "read stock");
    if (!rep) return STOCK_UNAVAILABLE;
    stock_result res = STOCK_RESERVED;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != (size_t)p->segments + 1) {
        snprintf(c->errstr, sizeof c->errstr, "read stock: unexpected reply");
        res = STOCK_UNAVAILABLE;
    } else if (!valid_gen(c, p, rep->element[0])) {
        res = STOCK_MISSING;
    } else {
        *total = 0;
        for (int i = 0; i < p->segments; i++) {
            const redisReply *e = rep->element[i + 1];
            long long v = e->type == REDIS_REPLY_STRING ? strtoll(e->str, NULL, 10) : 0;
            if (e->type != REDIS_REPLY_STRING) res = STOCK_MISSING;
            if (seg) seg[i] = v;
            *total += v;
        }
    }
    freeReplyObject(rep);
    return res;
}

stock_result sk_copy_read(stock_conn *c, const stock_product *p, long long *total,
                          long long *seg) {
    stock_result res = STOCK_UNAVAILABLE;
    for (int a = 0; sk_again(c, p->sku, a); a++) res = read_at(c, p, total, seg);
    return res;
}

static stock_result read_gen_at(stock_conn *c, const stock_product *p, long long *gen) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "GET");
    sk_add_key(c, p->sku, "gen");
    redisReply *rep = sk_run_idempotent(c, "read generation");
    if (!rep) return STOCK_UNAVAILABLE;
    /* Any generation counts here, even one built for an earlier Redis
     * process: the new one must be above it. */
    *gen = rep->type == REDIS_REPLY_STRING ? strtoll(rep->str, NULL, 10) : 0;
    freeReplyObject(rep);
    return STOCK_RESERVED;
}

stock_result sk_copy_read_gen(stock_conn *c, const stock_product *p, long long *gen) {
    stock_result res = STOCK_UNAVAILABLE;
    for (int a = 0; sk_again(c, p->sku, a); a++) res = read_gen_at(c, p, gen);
    return res;
}

/* ------------------------------------------------------------ revoke marks */

/* Runs verb (HSET, HEXISTS, HDEL) on p's revoke marks for order_id: the
 * reply's integer, or -1 when Redis failed. */
static long long revoke_at(stock_conn *c, const stock_product *p, const char *verb,
                           const char *order_id) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, verb);
    sk_add_key(c, p->sku, "revoke");
    rconn_cmd_adds(&c->cmd, order_id);
    if (!strcmp(verb, "HSET"))
        rconn_cmd_addf(&c->cmd, "%lld:%s", (long long)clock_wall_ms(), c->instance);
    redisReply *rep = sk_run_idempotent(c, "revoke mark");  /* each verb may be repeated */
    if (!rep) return -1;
    long long v = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    freeReplyObject(rep);
    return v;
}

static long long revoke_cmd(stock_conn *c, const stock_product *p, const char *verb,
                            const char *order_id) {
    long long v = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++) v = revoke_at(c, p, verb, order_id);
    return v;
}

int stock_revoke_mark(stock_conn *c, const stock_product *p, const char *order_id) {
    return revoke_cmd(c, p, "HSET", order_id) < 0 ? -1 : 0;
}

int stock_revoke_marked(stock_conn *c, const stock_product *p, const char *order_id) {
    long long v = revoke_cmd(c, p, "HEXISTS", order_id);
    return v < 0 ? -1 : v > 0;
}

int stock_revoke_unmark(stock_conn *c, const stock_product *p, const char *order_id) {
    return revoke_cmd(c, p, "HDEL", order_id) < 0 ? -1 : 0;
}

/* --------------------------------------------------------------------- writes */

static int load_at(stock_conn *c, const stock_product *p, long long gen, long long available,
                   const stock_user_units *users, size_t nusers, int force) {
    assert(available >= 0 && gen > 0);
    if (stock_conn_ensure(c)) return -1;
    rconn_cmd_evalsha(&c->cmd, &s_load, 5 + p->segments);
    sk_add_key(c, p->sku, "gen");
    sk_add_key(c, p->sku, "pending");
    sk_add_key(c, p->sku, "users");
    sk_add_key(c, p->sku, "empty");
    sk_add_key(c, p->sku, "returned");
    sk_add_segment_keys(c, p);
    rconn_cmd_addll(&c->cmd, gen);
    rconn_cmd_adds(&c->cmd, c->run_id);
    rconn_cmd_adds(&c->cmd, force ? "1" : "0");
    /* As even as possible: the first (available % n) segments get one more. */
    for (int i = 0; i < p->segments; i++)
        rconn_cmd_addll(&c->cmd, available / p->segments + (i < available % p->segments));
    for (size_t i = 0; i < nusers; i++) {
        rconn_cmd_adds(&c->cmd, users[i].user_id);
        rconn_cmd_addll(&c->cmd, users[i].units);
    }
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &s_load);
    if (!rep) {
        sk_drop(c, "load stock");
        return -1;
    }
    int rc = rep->type == REDIS_REPLY_INTEGER ? (rep->integer == 1 ? 0 : 1) : -1;
    if (rc < 0)
        sk_bad_reply(c, "load stock", rep);
    freeReplyObject(rep);
    return rc;
}

int sk_copy_load(stock_conn *c, const stock_product *p, long long gen, long long available,
                 const stock_user_units *users, size_t nusers, int force) {
    int rc = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++)
        rc = load_at(c, p, gen, available, users, nusers, force);
    return rc;
}

static stock_result restock_at(stock_conn *c, const stock_product *p, long long qty) {
    if (stock_conn_ensure(c)) return STOCK_UNAVAILABLE;
    rconn_cmd_evalsha(&c->cmd, &s_restock, 2 + p->segments);
    sk_add_key(c, p->sku, "gen");
    sk_add_key(c, p->sku, "empty");
    sk_add_segment_keys(c, p);
    rconn_cmd_adds(&c->cmd, c->run_id);
    rconn_cmd_addll(&c->cmd, qty);
    redisReply *rep = rconn_cmd_run_script(c->ctx, &c->cmd, &s_restock);
    if (!rep) {
        sk_drop(c, "restock");
        return STOCK_UNAVAILABLE;
    }
    stock_result res = STOCK_UNAVAILABLE;
    if (rep->type == REDIS_REPLY_INTEGER) res = rep->integer == 1 ? STOCK_RESERVED : STOCK_MISSING;
    else sk_bad_reply(c, "restock", rep);
    freeReplyObject(rep);
    return res;
}

stock_result sk_copy_restock(stock_conn *c, const stock_product *p, long long qty) {
    stock_result res = STOCK_UNAVAILABLE;
    for (int a = 0; sk_again(c, p->sku, a); a++) res = restock_at(c, p, qty);
    return res;
}

/* ----------------------------------------------------------- reconciliation */

static long long redis_now_ms(stock_conn *c) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "TIME");
    redisReply *rep = sk_run_idempotent(c, "time");
    long long now = -1;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        now = strtoll(rep->element[0]->str, NULL, 10) * 1000 +
              strtoll(rep->element[1]->str, NULL, 10) / 1000;
    if (rep) freeReplyObject(rep);
    return now;
}

/* Reads one <length>:<bytes> field of a format 2 record at *p (end: the
 * record's end) into out (cap bytes). Returns 0, or -1 when malformed. */
static int length_field(const char **p, const char *end, char *out, size_t cap) {
    char *colon;
    long long n = strtoll(*p, &colon, 10);
    if (colon == *p || colon >= end || *colon != ':' || n < 0 || n > end - colon - 1 ||
        (size_t)n >= cap)
        return -1;
    memcpy(out, colon + 1, (size_t)n);
    out[n] = '\0';
    *p = colon + 1 + n;
    return 0;
}

/* Parses a pending record, format 2 ("2|q|t|l|spec|" and length-prefixed
 * instance, user, key) or the JSON of format 1. Returns 0, or -1 when the
 * record is not one of ours (left for the audit to report). */
static int parse_pending(const redisReply *v, long long *q, long long *t, char *instance,
                         size_t ilen, char *key, size_t klen) {
    if (v->len > 0 && v->str[0] == '{') {
        json_error_t jerr;
        json_t *j = json_loadb(v->str, v->len, 0, &jerr);
        if (!j) return -1;
        const char *i = json_string_value(json_object_get(j, "i"));
        const char *k = json_string_value(json_object_get(j, "k"));
        *q = json_integer_value(json_object_get(j, "q"));
        *t = json_integer_value(json_object_get(j, "t"));
        snprintf(instance, ilen, "%s", i ? i : "");
        snprintf(key, klen, "%s", k ? k : "");
        json_decref(j);
        return 0;
    }
    const char *p = v->str, *end = v->str + v->len;
    char user[STOCK_USER_MAX + 1];
    int l, used = 0;
    if (sscanf(p, "2|%lld|%lld|%d|%*[0-9:,]|%n", q, t, &l, &used) < 3 || used == 0) {
        /* An empty spec does not match %[...]: try without it. */
        used = 0;
        if (sscanf(p, "2|%lld|%lld|%d||%n", q, t, &l, &used) < 3 || used == 0) return -1;
    }
    p += used;
    if (length_field(&p, end, instance, ilen) || length_field(&p, end, user, sizeof user) ||
        length_field(&p, end, key, klen))
        return -1;
    return 0;
}

static int visit_pending(const redisReply *field, const redisReply *value, long long now,
                         void (*fn)(const stock_pending *rec, void *ud), void *ud) {
    char instance[160], key[160];
    long long q, t;
    if (value->type != REDIS_REPLY_STRING ||
        parse_pending(value, &q, &t, instance, sizeof instance, key, sizeof key) != 0)
        return 0;   /* not ours to judge; left for the audit */
    stock_pending rec = { .lane = -1, .order_id = field->str, .instance = instance, .idem_key = key,
                          .quantity = q, .age_ms = now - t };
    fn(&rec, ud);
    return 0;
}

/* Calls each(field, value, ud) for every field of the hash at key (HSCAN).
 * 0, or -1 with c->errstr set (what names the scan). */
typedef void hscan_fn(const redisReply *field, const redisReply *value, void *ud);
static int hscan_at(stock_conn *c, const char *key, const char *what, hscan_fn *each,
                    void *ud) {
    char cursor[32] = "0";
    do {
        redisReply *rep = redisCommand(c->ctx, "HSCAN %s %s COUNT 500", key, cursor);
        if (!rep) {
            sk_drop(c, what);
            return -1;
        }
        if (sk_redirected(c, rep) && strcmp(cursor, "0") == 0) {
            freeReplyObject(rep);             /* not begun: the whole scan again */
            return -1;
        }
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(rep);
            snprintf(c->errstr, sizeof c->errstr, "%s: unexpected reply", what);
            return -1;
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        const redisReply *kv = rep->element[1];
        for (size_t i = 0; i + 1 < kv->elements; i += 2) each(kv->element[i], kv->element[i + 1], ud);
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

typedef struct mark_visit {
    long long now;
    stock_mark_fn *fn;
    void *ud;
} mark_visit;

/* One mark's value, "<wall ms>:<instance>" (an old "1": time 0, no owner). */
static void visit_mark(const redisReply *field, const redisReply *value, void *ud) {
    const mark_visit *v = ud;
    if (field->type != REDIS_REPLY_STRING || value->type != REDIS_REPLY_STRING) return;
    char *end = NULL;
    long long t = strtoll(value->str, &end, 10);
    const char *instance = end && *end == ':' ? end + 1 : "";
    v->fn(field->str, instance, t > 0 ? v->now - t : v->now, v->ud);
}

static int mark_scan_at(stock_conn *c, const stock_product *p, stock_mark_fn *fn, void *ud) {
    char key[STOCK_SKU_MAX + 96];
    mark_visit v = { clock_wall_ms(), fn, ud };
    stock_key(key, sizeof key, c->prefix, p->sku, "revoke");
    if (stock_conn_ensure(c)) return -1;
    return hscan_at(c, key, "scan revoke marks", visit_mark, &v);
}

int stock_revoke_scan(stock_conn *c, const stock_product *p, stock_mark_fn *fn, void *ud) {
    int rc = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++) rc = mark_scan_at(c, p, fn, ud);
    return rc;
}

typedef struct pending_visit {
    long long now;
    void (*fn)(const stock_pending *rec, void *ud);
    void *ud;
} pending_visit;

static void visit_pending_of(const redisReply *field, const redisReply *value, void *ud) {
    const pending_visit *v = ud;
    visit_pending(field, value, v->now, v->fn, v->ud);
}

static int pending_scan_at(stock_conn *c, const stock_product *p,
                           void (*fn)(const stock_pending *rec, void *ud), void *ud) {
    char key[STOCK_SKU_MAX + 96];
    pending_visit v = { redis_now_ms(c), fn, ud };
    if (v.now < 0) return -1;
    stock_key(key, sizeof key, c->prefix, p->sku, "pending");
    return hscan_at(c, key, "scan pending", visit_pending_of, &v);
}

int sk_copy_pending_scan(stock_conn *c, const stock_product *p,
                         void (*fn)(const stock_pending *rec, void *ud), void *ud) {
    int rc = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++) rc = pending_scan_at(c, p, fn, ud);
    return rc;
}

/* The slot of instance's heartbeat key (-1 on one server). */
static int instance_slot(const stock_conn *c, const char *instance) {
    char key[256];
    int n = snprintf(key, sizeof key, "%sinstance:%s", c->prefix, instance);
    return c->cluster ? rtopo_slot(key, n > 0 && (size_t)n < sizeof key ? (size_t)n : 0) : -1;
}

static int heartbeat_at(stock_conn *c, long long ttl_ms) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "SET");
    rconn_cmd_addf(&c->cmd, "%sinstance:%s", c->prefix, c->instance);
    rconn_cmd_addll(&c->cmd, getpid());
    rconn_cmd_adds(&c->cmd, "PX");
    rconn_cmd_addll(&c->cmd, ttl_ms);
    redisReply *rep = sk_run_idempotent(c, "heartbeat");
    if (!rep) return -1;
    freeReplyObject(rep);
    return 0;
}

int stock_heartbeat(stock_conn *c, long long ttl_ms) {
    int rc = -1;
    for (int a = 0; again_slot(c, instance_slot(c, c->instance), a); a++) rc = heartbeat_at(c, ttl_ms);
    return rc;
}

static int instance_alive_at(stock_conn *c, const char *instance) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "EXISTS");
    rconn_cmd_addf(&c->cmd, "%sinstance:%s", c->prefix, instance);
    redisReply *rep = sk_run_idempotent(c, "instance check");
    if (!rep) return -1;
    int alive = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    freeReplyObject(rep);
    return alive;
}

int stock_instance_alive(stock_conn *c, const char *instance) {
    int rc = -1;
    for (int a = 0; again_slot(c, instance_slot(c, instance), a); a++)
        rc = instance_alive_at(c, instance);
    return rc;
}
