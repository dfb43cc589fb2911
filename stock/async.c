/* async.c: the stock operations of the order path, on an event loop.
 *
 * The service's loops gather the orders of one iteration and reserve each
 * SKU's share in one script call (reserve_batch.lua) on the loop's own
 * non-blocking connection (common/aconn); the pending records of orders
 * committed meanwhile are cleared in the same call. Undoing a reservation
 * (its order will never commit) is undo.lua, as on the blocking side.
 *
 * While the connection is being set up (at start, after Redis came back)
 * work waits in `held` and goes out once it is ready; if the connection
 * cannot be made, the work fails as UNAVAILABLE with nothing sent. */
#include "stock/stock.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/aconn.h"
#include "common/clock.h"
#include "common/loop.h"
#include "rtopo/rtopo.h"
#include "stock/internal.h"
#include "stock/async_int.h"

#define CLEAR_MAX 1024          /* clears carried by one call (Lua unpack limit: 8000) */
#define SPREAD_PART_MIN 32      /* orders of a spread batch per lane it is split over */

typedef enum job_kind { J_RESERVE, J_CLEAR, J_UNDO, J_MARK, J_CALL } job_kind;

/* Work for the connection: sent at once when it is ready, else held. */
typedef struct job {
    job_kind kind;
    const stock_product *p;
    stock_req **reqs;            /* J_RESERVE: the caller's; n of them */
    size_t n;
    char **ids;                  /* order ids to clear (copies) */
    size_t nids;
    stock_ref ref;               /* J_UNDO, J_MARK (ref_id) */
    char ref_id[STOCK_ORDER_ID_MAX + 1], ref_key[160];
    stock_batch_fn *batch_fn;
    stock_undo_fn *undo_fn;
    sk_call_build *build;        /* J_CALL: another file's command and answer */
    sk_call_reply *reply;
    stock_call call;             /* J_CALL: which, for the observer */
    void *ud;
    stock_async *sa;
    sk_anode *node;              /* where it was sent or is held */
    int attempts;                /* cluster: times redirected or refused (not run) */
    int64_t t0_us;               /* when it was sent (0: not timed) */
    struct job *next;
} job;
/* ref_key holds an idempotency key as the service takes one (db.h). */
_Static_assert(DB_KEY_MAX < sizeof ((job *)0)->ref_key, "ref_key must hold DB_KEY_MAX bytes");



/* -------------------------------------------------------------- commands */

static void add_key(stock_async *sa, const char *sku, const char *suffix) {
    rconn_cmd_addf(&sa->cmd, "%s{%s}:%s", sa->prefix, sku, suffix);
}

static void add_segments(stock_async *sa, const stock_product *p) {
    for (int i = 0; i < p->segments; i++)
        rconn_cmd_addf(&sa->cmd, "%s{%s}:stock:%d", sa->prefix, p->sku, i);
}

static uint64_t next_random(stock_async *sa) {
    sa->rng ^= sa->rng >> 12;
    sa->rng ^= sa->rng << 25;
    sa->rng ^= sa->rng >> 27;
    return sa->rng * 2685821657736338717ULL;
}

/* Builds one reserve_batch.lua call into sa->cmd: j's orders, on the copy
 * of the node it goes to ("*": any copy will do, unsafe-trust-redis: Redis
 * as the truth), clearing j's committed orders' pending records. */
static void build_reserve(stock_async *sa, const job *j) {
    const stock_product *p = j->p;
    sk_batch b = { .prefix = sa->prefix, .instance = sa->instance, .idem_ttl_ms = sa->idem_ttl_ms,
                   .p = p, .reqs = j->reqs, .n = j->n, .ids = j->ids, .nids = j->nids,
                   .run_id = stock_strategy_about(p->strategy)->trusts_copy
                                 ? "*" : aconn_run_id(j->node->conn),
                   .first = p->segments > 1 ? (long long)(next_random(sa) % (uint64_t)p->segments)
                                            : 0 };
    sk_batch_build(&sa->cmd, &b);
}

static void build_clear(stock_async *sa, const job *j) {
    rconn_cmd_reset(&sa->cmd);
    rconn_cmd_adds(&sa->cmd, "HDEL");
    add_key(sa, j->p->sku, "pending");
    for (size_t i = 0; i < j->nids; i++) rconn_cmd_adds(&sa->cmd, j->ids[i]);
}

static void build_undo(stock_async *sa, const job *j) {
    const stock_product *p = j->p;
    rconn_cmd_evalsha(&sa->cmd, &sk_undo, 4 + p->segments);
    add_key(sa, p->sku, "pending");
    add_key(sa, p->sku, "users");
    rconn_cmd_addf(&sa->cmd, "%s{%s}:idem:%s", sa->prefix, p->sku, j->ref_key);
    add_key(sa, p->sku, "empty");
    add_segments(sa, p);
    rconn_cmd_adds(&sa->cmd, j->ref_id);
}

/* HSET {sku}:revoke <order id> 1 (stock_revoke_mark's command). */
static void build_mark(stock_async *sa, const job *j) {
    rconn_cmd_reset(&sa->cmd);
    rconn_cmd_adds(&sa->cmd, "HSET");
    add_key(sa, j->p->sku, "revoke");
    rconn_cmd_adds(&sa->cmd, j->ref_id);
    rconn_cmd_addf(&sa->cmd, "%lld:%s", (long long)clock_wall_ms(), sa->instance);
}

/* ---------------------------------------------------------------- replies */

static void job_free(job *j) {
    for (size_t i = 0; i < j->nids; i++) free(j->ids[i]);
    free(j->ids);
    free(j);
}

/* Ends a job that got no reply: sent (the script may have run) or not. */
static void job_fail(stock_async *sa, job *j, int sent) {
    if (j->kind == J_RESERVE) {
        for (size_t i = 0; i < j->n; i++) {
            j->reqs[i]->result = STOCK_UNAVAILABLE;
            j->reqs[i]->outcome_unknown = sent;
        }
        j->batch_fn(j->ud, j->reqs, j->n);
    } else if (j->kind == J_UNDO || j->kind == J_MARK) {
        j->undo_fn(j->ud, 0);
    } else if (j->kind == J_CALL) {
        j->reply(j->ud, NULL, sent);
    }
    (void)sa;
    job_free(j);
}

/* The stock call each kind of job is, for the observer. */
static const stock_call CALL_OF[] = {
    [J_RESERVE] = STOCK_CALL_RESERVE_BATCH, [J_CLEAR] = STOCK_CALL_CLEAR, [J_UNDO] = STOCK_CALL_UNDO,
    [J_MARK] = STOCK_CALL_OTHER, [J_CALL] = STOCK_CALL_OTHER,
};

static void submit(stock_async *sa, job *j);
static void later(stock_async *sa, job *j, int ms);

/* A cluster's answer that says j did not run and should go again (to the
 * node the map now names, after a pause for all but MOVED). Returns 1 when
 * j was taken for that, 0 when r is j's answer. */
static int redirected(job *j, const redisReply *r) {
    stock_async *sa = j->sa;
    if (!sa->cluster || r->type != REDIS_REPLY_ERROR) return 0;
    rtopo_redirect rd;
    rtopo_verdict v = rtopo_classify(r, &rd);
    int pause = rtopo_retry_pause_ms(v);     /* rtopo.h's policy, as the blocking side's */
    if (pause < 0) return 0;
    if (v == RTOPO_MOVED) rtopo_cluster_moved(sa->cluster, &rd);
    else if (v == RTOPO_CLUSTERDOWN || v == RTOPO_REDISCOVER) rtopo_cluster_suspect(sa->cluster);
    if (++j->attempts > RTOPO_RETRIES) return 0;
    snprintf(sa->errstr, sizeof sa->errstr, "redis cluster: %s", r->str);
    later(sa, j, pause);
    return 1;
}

static void on_reply(void *ud, redisReply *r) {
    job *j = ud;
    sk_observe(j->sa->observe, j->sa->observe_ud, j->kind == J_CALL ? j->call : CALL_OF[j->kind],
               j->t0_us);
    if (!r) {
        if (j->sa->cluster) rtopo_cluster_suspect(j->sa->cluster);
        job_fail(NULL, j, 1);
        return;
    }
    if (redirected(j, r)) return;
    sk_async_check_reply(j->sa, r);
    if (j->kind == J_RESERVE) {
        int ok = r->type == REDIS_REPLY_ARRAY && r->elements == j->n;
        for (size_t i = 0; i < j->n; i++) {
            if (ok) {
                sk_reserve_decode(j->reqs[i], r->element[i]);
            } else {
                /* An error reply: the script aborted, nothing it did stays. */
                j->reqs[i]->result = STOCK_UNAVAILABLE;
                j->reqs[i]->outcome_unknown = 0;
            }
        }
        j->batch_fn(j->ud, j->reqs, j->n);
    } else if (j->kind == J_UNDO || j->kind == J_MARK) {
        j->undo_fn(j->ud, r->type == REDIS_REPLY_INTEGER);
    } else if (j->kind == J_CALL) {
        j->reply(j->ud, r, 1);
    }
    job_free(j);
}

/* -------------------------------------------------------------- dispatch */

static void send_job(stock_async *sa, job *j) {
    switch (j->kind) {
    case J_RESERVE: build_reserve(sa, j); break;
    case J_CLEAR: build_clear(sa, j); break;
    case J_UNDO: build_undo(sa, j); break;
    case J_MARK: build_mark(sa, j); break;
    case J_CALL: j->build(sa, j->node->conn, j->ud); break;
    }
    j->sa = sa;
    j->t0_us = sk_t0(sa->observe);
    if (aconn_send(j->node->conn, &sa->cmd, on_reply, j) != 0) job_fail(sa, j, 0);
}

/* ------------------------------------------------------------ the nodes */

static void on_state(aconn *c, int up, void *ud);

/* A node for address a (made on first use). NULL when out of memory. */
static sk_anode *node_at(stock_async *sa, const rconn_addr *a) {
    /* Constant, and shared by every loop's connections (aconn keeps the
     * pointer): written once by the compiler, never by a loop. */
    static const rconn_script *const scripts[] = { &sk_reserve_batch, &sk_undo, &sk_lock_read,
                                                   &sk_lock_write, &sk_lock_pass, &sk_lock_line };
    for (int i = 0; i < sa->nnodes; i++) {
        const rconn_addr *b = &sa->nodes[i]->addr;
        if (b->port == a->port && !strcmp(b->host, a->host) && !strcmp(b->path, a->path))
            return sa->nodes[i];
    }
    sk_anode **grown = realloc(sa->nodes, sizeof *grown * (size_t)(sa->nnodes + 1));
    if (!grown) return NULL;
    sa->nodes = grown;
    sk_anode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->sa = sa;
    n->addr = *a;
    if (!(n->conn = aconn_new(sa->l, a, sa->timeout_ms, scripts, (int)(sizeof scripts / sizeof *scripts),
                              on_state, n))) {
        free(n);
        return NULL;
    }
    sa->nodes[sa->nnodes++] = n;
    return n;
}

/* The node j goes to: the one node, or the primary serving j's SKU. NULL
 * (sa->errstr says why) when the cluster's map names none yet. */
static sk_anode *route(stock_async *sa, const job *j) {
    if (!sa->cluster) return sa->nodes[0];
    unsigned v = rtopo_cluster_version(sa->cluster);
    if (v != sa->route_version) {                /* something moved: look up again */
        memset(sa->route, 0xff, sizeof *sa->route * RTOPO_SLOTS);
        sa->route_version = v;
    }
    char key[STOCK_SKU_MAX + 96];
    int n = stock_key(key, sizeof key, sa->prefix, j->p->sku, "gen");
    int slot = rtopo_slot(key, n > 0 ? (size_t)n : 0);
    if (sa->route[slot] >= 0) return sa->nodes[sa->route[slot]];
    rconn_addr a;
    if (!rtopo_cluster_route(sa->cluster, slot, &a)) {
        snprintf(sa->errstr, sizeof sa->errstr, "redis cluster: no node known to serve slot %d",
                 slot);
        rtopo_cluster_suspect(sa->cluster);
        return NULL;
    }
    sk_anode *node = node_at(sa, &a);
    if (!node) {
        snprintf(sa->errstr, sizeof sa->errstr, "out of memory");
        return NULL;
    }
    for (int i = 0; i < sa->nnodes; i++)
        if (sa->nodes[i] == node) sa->route[slot] = (int16_t)i;
    return node;
}

/* Ends j unsent: on a cluster, it goes again after a pause while attempts
 * last (a failover or a reshard is under way); else it fails, nothing sent. */
static void not_sent(stock_async *sa, job *j) {
    if (sa->cluster && ++j->attempts <= RTOPO_RETRIES) {
        rtopo_cluster_suspect(sa->cluster);
        later(sa, j, RTOPO_RETRY_PAUSE_MS);
        return;
    }
    job_fail(sa, j, 0);
}

/* Sends j now, or holds it until its node's connection is ready. */
static void submit(stock_async *sa, job *j) {
    sk_anode *node = route(sa, j);
    if (!node) {
        not_sent(sa, j);
        return;
    }
    j->node = node;
    if (aconn_ready(node->conn)) {
        send_job(sa, j);
        return;
    }
    if (aconn_connect(node->conn) != 0) {            /* not now */
        snprintf(sa->errstr, sizeof sa->errstr, "%s", aconn_errstr(node->conn));
        not_sent(sa, j);
        return;
    }
    j->next = NULL;
    if (node->held_tail) node->held_tail->next = j;
    else node->held = j;
    node->held_tail = j;
}

static void on_state(aconn *c, int up, void *ud) {
    sk_anode *node = ud;
    stock_async *sa = node->sa;
    job *j = node->held;
    (void)c;
    node->held = node->held_tail = NULL;
    if (!up) snprintf(sa->errstr, sizeof sa->errstr, "%s", aconn_errstr(node->conn));
    while (j) {
        job *next = j->next;
        if (up) send_job(sa, j);
        else not_sent(sa, j);
        j = next;
    }
}

/* ------------------------------------------------------ waiting (cluster) */

static void on_wake(loop *l, void *ud) {
    stock_async *sa = ud;
    job *j = sa->waiting;
    (void)l;
    sa->waiting = NULL;
    while (j) {
        job *next = j->next;
        submit(sa, j);
        j = next;
    }
}

/* Sends j again in ms (0: at the end of this turn); all jobs waiting go
 * together, when the first pause asked for ends. */
static void later(stock_async *sa, job *j, int ms) {
    j->next = sa->waiting;
    if (!sa->waiting && loop_after(sa->l, ms, on_wake, sa) != 0) {
        job_fail(sa, j, 0);
        return;
    }
    sa->waiting = j;
}

/* --------------------------------------------------------- the primary */

void sk_async_follow(stock_async *sa) {
    if (!sa->primary) return;
    unsigned v = rtopo_primary_version(sa->primary);
    if (v == sa->version && !sa->stale) return;
    rconn_addr a;
    if (sa->stale) rtopo_primary_suspect(sa->primary, sa->version);
    sa->stale = 0;
    if (!(v = rtopo_primary_get(sa->primary, &a))) return;   /* none known yet */
    const char *why = v != sa->version ? "redis: the primary moved (Sentinel)"
                                       : "redis: the server is not the primary (now)";
    sa->version = v;
    aconn_retarget(sa->conn, &a, why);
}

void sk_async_check_reply(stock_async *sa, const redisReply *r) {
    if (sa->primary && r && r->type == REDIS_REPLY_ERROR &&
        rtopo_classify(r, NULL) == RTOPO_REDISCOVER)
        sa->stale = 1;
}

/* ------------------------------------------------------------------ API */

/* A lane's clears waiting on this loop (stock_async_clear_spread): the ids
 * are owned here until a job takes them. */
typedef struct lane_clears {
    const stock_product *lane;
    char **ids;
    size_t n, cap;
} lane_clears;

/* The waiting clears of lane (made on first use when make), or NULL. */
static lane_clears *clears_of(stock_async *sa, const stock_product *lane, int make) {
    for (int i = 0; i < sa->nlclears; i++)
        if (sa->lclears[i].lane == lane) return &sa->lclears[i];
    if (!make) return NULL;
    lane_clears *grown = realloc(sa->lclears, sizeof *grown * (size_t)(sa->nlclears + 1));
    if (!grown) return NULL;
    sa->lclears = grown;
    lane_clears *lc = &sa->lclears[sa->nlclears++];
    *lc = (lane_clears){ lane, NULL, 0, 0 };
    return lc;
}

/* Moves up to CLEAR_MAX of lane's waiting clears into j (j->ids). */
static void take_lane_clears(stock_async *sa, const stock_product *lane, job *j) {
    lane_clears *lc = clears_of(sa, lane, 0);
    if (!lc || !lc->n) return;
    size_t k = lc->n < CLEAR_MAX ? lc->n : CLEAR_MAX;
    if (!(j->ids = malloc(sizeof *j->ids * k))) return;
    lc->n -= k;
    memcpy(j->ids, lc->ids + lc->n, sizeof *j->ids * k);
    j->nids = k;
}

/* STOCK_CLEARS_PHASE_RANK, after the order path's batches (which carry
 * their lane's clears): a lane's clears no batch carried go as one HDEL,
 * written by the connections' phase later in the turn. */
_Static_assert(STOCK_CLEARS_PHASE_RANK < ACONN_PHASE_RANK,
               "the lane clears are written by the connections' phase of the same turn");
static void flush_lane_clears(loop *l, void *ud) {
    stock_async *sa = ud;
    if (!sa->lclears_dirty) return;
    sa->lclears_dirty = 0;
    int sent = 0;
    for (int i = 0; i < sa->nlclears; i++) {
        while (sa->lclears[i].n) {
            job *j = calloc(1, sizeof *j);
            if (!j) return;                      /* left to reconciliation */
            *j = (job){ .kind = J_CLEAR, .p = sa->lclears[i].lane };
            take_lane_clears(sa, sa->lclears[i].lane, j);
            if (!j->nids) {
                free(j);
                return;
            }
            submit(sa, j);
            sent = 1;
        }
    }
    if (sent) loop_again(l);                     /* written by this turn's writes; the
                                                    next turn does not wait either */
}

stock_async *stock_async_new(loop *l, const stock_config *cfg, char *err, size_t errlen) {
    rconn_addr a;
    if (sk_scripts_init()) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memset(&a, 0, sizeof a);
    if (!cfg->primary && !cfg->cluster && rconn_parse(cfg->redis_url, &a, err, errlen))
        return NULL;
    stock_async *sa = calloc(1, sizeof *sa);
    if (!sa) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sa->l = l;
    snprintf(sa->prefix, sizeof sa->prefix, "%s", cfg->prefix);
    snprintf(sa->instance, sizeof sa->instance, "%s", cfg->instance ? cfg->instance : "");
    sa->idem_ttl_ms = cfg->idem_ttl_ms > 0 ? cfg->idem_ttl_ms : 86400000;
    /* fair-lock: a place in line lapses this long after its last call (the
     * head's lock_read, or its loop's keep every third of it): what a dead
     * instance's places cost the others. */
    sa->fair_lease_ms = STOCK_FAIR_LEASE_MS;
    sa->timeout_ms = cfg->timeout_ms;
    sa->observe = cfg->observe;
    sa->observe_ud = cfg->observe_ud;
    sa->rng = (uint64_t)clock_mono_us() ^ (uint64_t)(uintptr_t)sa;
    rconn_cmd_init(&sa->cmd);
    if ((sa->cluster = cfg->cluster)) {
        /* Nodes are made as SKUs are routed to them. */
        if (!(sa->route = malloc(sizeof *sa->route * RTOPO_SLOTS))) goto oom;
        memset(sa->route, 0xff, sizeof *sa->route * RTOPO_SLOTS);
        if (loop_on_phase(l, STOCK_CLEARS_PHASE_RANK, flush_lane_clears, sa) != 0) goto oom;
        return sa;
    }
    if ((sa->primary = cfg->primary)) sa->version = rtopo_primary_get(sa->primary, &a);
    if (!node_at(sa, &a)) {
        snprintf(err, errlen, "cannot attach a Redis connection to the loop");
        stock_async_free(sa);
        return NULL;
    }
    sa->conn = sa->nodes[0]->conn;
    aconn_connect(sa->conn);                     /* ready before the first order, usually */
    return sa;
oom:
    snprintf(err, errlen, "out of memory");
    stock_async_free(sa);
    return NULL;
}

void stock_async_free(stock_async *sa) {
    if (!sa) return;
    assert(loop_owned(sa->l));
    loop_forget(sa->l, sa);
    for (job *j = sa->waiting, *next; j; j = next) {   /* never sent (again) */
        next = j->next;
        job_fail(sa, j, 0);
    }
    sa->waiting = NULL;
    for (int i = 0; i < sa->nnodes; i++) {
        sk_anode *n = sa->nodes[i];
        for (job *j = n->held, *next; j; j = next) {    /* held: nothing sent */
            next = j->next;
            job_fail(sa, j, 0);
        }
        aconn_free(n->conn);                          /* fails what is in flight */
        free(n);
    }
    free(sa->nodes);
    free(sa->route);
    for (int i = 0; i < sa->nlclears; i++) {      /* not sent: left to reconciliation */
        for (size_t k = 0; k < sa->lclears[i].n; k++) free(sa->lclears[i].ids[k]);
        free(sa->lclears[i].ids);
    }
    free(sa->lclears);
    rconn_cmd_free(&sa->cmd);
    free(sa);
}

const char *stock_async_errstr(const stock_async *sa) { return sa->errstr; }
int stock_async_inflight(const stock_async *sa) {
    assert(loop_owned(sa->l));
    int n = 0;
    for (int i = 0; i < sa->nnodes; i++) n += aconn_inflight(sa->nodes[i]->conn);
    for (const job *j = sa->waiting; j; j = j->next) n++;
    return n;
}

/* Copies ids (at most CLEAR_MAX) into j. Returns how many were taken. */
static size_t take_ids(job *j, const char *const *ids, size_t n) {
    if (n > CLEAR_MAX) n = CLEAR_MAX;
    if (!n || !(j->ids = calloc(n, sizeof *j->ids))) return 0;
    for (size_t i = 0; i < n; i++) {
        if (!(j->ids[i] = strdup(ids[i]))) break;
        j->nids++;
    }
    return j->nids;
}

/* -------------------------------------------------- spread products */

/* A batch of a spread product's orders (stock_product_spread): the batch
 * goes to a lane chosen at random (split over more lanes when it is large),
 * each order on to the next lane while the lanes it tried were short, until one takes it or every lane was tried. The parts
 * sent to each lane are one reserve_batch.lua call each, on that lane's
 * primary. The caller hears once, when every order has its result. */
typedef struct spread_batch {
    stock_async *sa;
    const stock_product *p;
    stock_req **reqs;
    size_t n, left;               /* orders; orders without a result yet */
    int busy;                     /* parts being sent (a failure answers at once) */
    stock_batch_fn *fn;
    void *ud;
    int lane[STOCK_BATCH_MAX], tries[STOCK_BATCH_MAX];
    long long seen[STOCK_BATCH_MAX];   /* units the lanes tried had */
} spread_batch;

/* The orders of one batch sent to one lane. */
typedef struct spread_part {
    spread_batch *b;
    int lane;
    size_t n;
    uint16_t idx[STOCK_BATCH_MAX];
    stock_req *reqs[STOCK_BATCH_MAX];
} spread_part;

static void spread_send(spread_batch *b, const int *which, size_t nwhich);

static void spread_finish(spread_batch *b) {
    if (b->left || b->busy) return;
    b->fn(b->ud, b->reqs, b->n);
    free(b);
}

/* One lane's answers: the orders taken or refused for good are done; the
 * short ones go on to their next lane. */
static void spread_part_done(void *ud, stock_req **reqs, size_t n) {
    spread_part *part = ud;
    spread_batch *b = part->b;
    int again[STOCK_BATCH_MAX];
    size_t nagain = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = part->idx[i];
        stock_req *r = reqs[i];
        if (r->result == STOCK_RESERVED) {
            char t[32];
            snprintf(t, sizeof t, "%d:%d", part->lane, r->quantity);
            free(r->takes);
            if (!(r->takes = strdup(t))) {
                /* Its units stay pending: the undo retries of an unknown
                 * outcome give them back. */
                r->result = STOCK_UNAVAILABLE;
                r->outcome_unknown = 1;
            }
        } else if (r->result == STOCK_SOLD_OUT || r->result == STOCK_INSUFFICIENT) {
            b->seen[k] += r->available;
            if (++b->tries[k] < b->p->lanes) {
                b->lane[k] = (b->lane[k] + 1) % b->p->lanes;
                again[nagain++] = (int)k;
                continue;
            }
            /* Every lane tried: short everywhere, or only one by one. */
            long long seen = b->seen[k];
            r->available = seen;
            r->result = seen == 0 ? STOCK_SOLD_OUT
                      : seen >= r->quantity ? STOCK_SPREAD : STOCK_INSUFFICIENT;
        }
        b->left--;
    }
    free(part);
    b->busy++;
    spread_send(b, again, nagain);
    b->busy--;
    spread_finish(b);
}

/* Sends orders which[0..nwhich) of b, each to its lane, one part per lane. */
static void spread_send(spread_batch *b, const int *which, size_t nwhich) {
    spread_part *parts[STOCK_MAX_SEGMENTS] = { 0 };
    int used[STOCK_BATCH_MAX], nused = 0;
    for (size_t i = 0; i < nwhich; i++) {
        int k = which[i], lane = b->lane[k];
        spread_part *part = parts[lane];
        if (!part) {
            if (!(part = calloc(1, sizeof *part))) {
                b->reqs[k]->result = STOCK_UNAVAILABLE;   /* nothing sent */
                b->reqs[k]->outcome_unknown = 0;
                b->left--;
                continue;
            }
            part->b = b;
            part->lane = lane;
            parts[lane] = part;
            used[nused++] = lane;
        }
        part->idx[part->n] = (uint16_t)k;
        part->reqs[part->n++] = b->reqs[k];
    }
    for (int u = 0; u < nused; u++) {
        spread_part *part = parts[used[u]];
        job *j = calloc(1, sizeof *j);
        if (!j) {
            for (size_t i = 0; i < part->n; i++) {
                part->reqs[i]->result = STOCK_UNAVAILABLE;
                part->reqs[i]->outcome_unknown = 0;
            }
            spread_part_done(part, part->reqs, part->n);
            continue;
        }
        *j = (job){ .kind = J_RESERVE, .p = &b->p->lane[part->lane], .reqs = part->reqs,
                    .n = part->n, .batch_fn = spread_part_done, .ud = part };
        take_lane_clears(b->sa, j->p, j);      /* the lane's committed orders, cleared first */
        submit(b->sa, j);
    }
}

static void spread_reserve(stock_async *sa, const stock_product *p, stock_req **reqs, size_t n,
                           stock_batch_fn *fn, void *ud) {
    spread_batch *b = calloc(1, sizeof *b);
    int all[STOCK_BATCH_MAX];
    if (!b) {
        for (size_t i = 0; i < n; i++) {
            reqs[i]->result = STOCK_UNAVAILABLE;
            reqs[i]->outcome_unknown = 0;
        }
        fn(ud, reqs, n);
        return;
    }
    *b = (spread_batch){ .sa = sa, .p = p, .reqs = reqs, .n = n, .left = n, .fn = fn, .ud = ud };
    /* As few lanes as keep each call worth its cost: one for a small
     * batch (a script call per lane is the price of a lane), more as the
     * batch grows, from a random lane on, so that batches spread over the
     * lanes, and so over the primaries, as the load does. */
    size_t parts = n / SPREAD_PART_MIN;
    if (parts < 1) parts = 1;
    if (parts > (size_t)p->lanes) parts = (size_t)p->lanes;
    int start = (int)(next_random(sa) % (uint64_t)p->lanes);
    for (size_t i = 0; i < n; i++) {
        b->lane[i] = (start + (int)(i % parts)) % p->lanes;
        all[i] = (int)i;
    }
    b->busy++;
    spread_send(b, all, n);
    b->busy--;
    spread_finish(b);
}

typedef struct spread_undo {
    stock_undo_fn *fn;
    void *ud;
    int left, busy, done;
} spread_undo;

static void spread_undo_finish(spread_undo *u) {
    if (u->left || u->busy) return;
    u->fn(u->ud, u->done);
    free(u);
}

static void spread_undo_part(void *ud, int done) {
    spread_undo *u = ud;
    if (!done) u->done = 0;
    u->left--;
    spread_undo_finish(u);
}

/* ------------------------------------------------------------ the API */

size_t stock_async_reserve(stock_async *sa, const stock_product *p, stock_req **reqs, size_t n,
                           const char *const *clear, size_t nclear, stock_batch_fn *fn, void *ud) {
    assert(loop_owned(sa->l));
    sk_async_follow(sa);
    assert(n > 0 && n <= STOCK_BATCH_MAX);
    if (p->lanes) {                              /* its clears go by stock_async_clear_spread */
        spread_reserve(sa, p, reqs, n, fn, ud);
        return 0;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        for (size_t i = 0; i < n; i++) {
            reqs[i]->result = STOCK_UNAVAILABLE;
            reqs[i]->outcome_unknown = 0;
        }
        fn(ud, reqs, n);
        return 0;
    }
    *j = (job){ .kind = J_RESERVE, .p = p, .reqs = reqs, .n = n, .batch_fn = fn, .ud = ud };
    size_t taken = take_ids(j, clear, nclear);
    submit(sa, j);
    return taken;
}

size_t stock_async_clear(stock_async *sa, const stock_product *p, const char *const *ids,
                         size_t n) {
    assert(loop_owned(sa->l));
    sk_async_follow(sa);
    job *j = calloc(1, sizeof *j);
    if (!j) return 0;
    *j = (job){ .kind = J_CLEAR, .p = p };
    size_t taken = take_ids(j, ids, n);
    if (!taken) {
        job_free(j);
        return 0;
    }
    submit(sa, j);
    return taken;
}

void stock_async_clear_spread(stock_async *sa, const stock_product *p, const char *order_id,
                              const char *takes) {
    assert(loop_owned(sa->l) && p->lanes);
    const char *t = takes ? takes : "";
    int units;
    for (int lane; (lane = sk_lane_parse(p, &t, &units)) >= 0;) {
        lane_clears *lc = clears_of(sa, &p->lane[lane], 1);
        char *id = lc ? strdup(order_id) : NULL;
        if (!id) continue;                       /* left to reconciliation */
        if (lc->n == lc->cap) {
            size_t cap = lc->cap ? lc->cap * 2 : 64;
            char **grown = realloc(lc->ids, sizeof *grown * cap);
            if (!grown) {
                free(id);
                continue;
            }
            lc->ids = grown;
            lc->cap = cap;
        }
        lc->ids[lc->n++] = id;
        sa->lclears_dirty = 1;
    }
}

void stock_async_undo(stock_async *sa, const stock_ref *ref, stock_undo_fn *fn, void *ud) {
    assert(loop_owned(sa->l));
    sk_async_follow(sa);
    const stock_product *p = ref->product;
    if (p->lanes) {                              /* each lane it took from, or every lane */
        spread_undo *u = calloc(1, sizeof *u);
        if (!u) {
            fn(ud, 0);
            return;
        }
        *u = (spread_undo){ fn, ud, 0, 1, 1 };
        const char *t = ref->takes;
        int units;
        for (int i = 0; i < p->lanes; i++) {
            int lane = t ? sk_lane_parse(p, &t, &units) : i;
            if (lane < 0) break;
            stock_ref one = { &p->lane[lane], ref->order_id, ref->idem_key, NULL };
            u->left++;
            stock_async_undo(sa, &one, spread_undo_part, u);
        }
        u->busy--;
        spread_undo_finish(u);
        return;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        fn(ud, 0);
        return;
    }
    *j = (job){ .kind = J_UNDO, .p = ref->product, .undo_fn = fn, .ud = ud };
    snprintf(j->ref_id, sizeof j->ref_id, "%s", ref->order_id);
    snprintf(j->ref_key, sizeof j->ref_key, "%s", ref->idem_key ? ref->idem_key : "");
    submit(sa, j);
}

void stock_async_revoke_mark(stock_async *sa, const stock_product *p, const char *order_id,
                             stock_undo_fn *fn, void *ud) {
    assert(loop_owned(sa->l));
    sk_async_follow(sa);
    job *j = calloc(1, sizeof *j);
    if (!j) {
        fn(ud, 0);
        return;
    }
    *j = (job){ .kind = J_MARK, .p = p, .undo_fn = fn, .ud = ud };
    snprintf(j->ref_id, sizeof j->ref_id, "%s", order_id);
    submit(sa, j);
}

void sk_async_call(stock_async *sa, const stock_product *p, stock_call call, sk_call_build *build,
                   sk_call_reply *reply, void *ud) {
    assert(loop_owned(sa->l));
    sk_async_follow(sa);
    job *j = calloc(1, sizeof *j);
    if (!j) {
        reply(ud, NULL, 0);
        return;
    }
    *j = (job){ .kind = J_CALL, .p = p, .build = build, .reply = reply, .call = call, .ud = ud };
    submit(sa, j);
}
