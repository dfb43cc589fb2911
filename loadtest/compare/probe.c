/* probe.c: the "choosing a lock" table of `flashload compare`: one row per
 * lock, and per way the database guards the stock without a lock server
 * (db-for-update's row lock; db and db-optimistic, which hold no lock
 * between statements), from the comparison's own scenes (throughput, latency, the lock
 * hand-off, the pause past the lease) and from three probes, each on a
 * fresh SKU and verified like any run:
 *
 *   kill     two instances; the second takes the lock and pauses inside
 *            its critical section (cs_delay_ms), is killed with SIGKILL,
 *            and the first orders again and again until one succeeds: the
 *            time from the kill to that 201 is how long a dead holder
 *            blocks the SKU (lease, session or take-over).
 *   restart  a light load (200 orders/s on 8 connections) while the lock server is taken
 *            down and brought back on its port, data kept: what was
 *            refused, for how long, and whether anything was oversold.
 *   wipe     the same, the server coming back empty (its data lost).
 *
 * And a column from the Redis failures group (failures.c): "failover to a
 * replica", for the locks whose server can be a Sentinel-watched Redis:
 * `lock` (the stock's own Redis fails over) and `redlock` (one member
 * fails over); n/a, with the reason, for the others.
 *
 * The fault of restart and wipe is caused from fl_run's tick, every 20 ms
 * while the load runs, which also records when answers were refused and
 * when the first 201 came after the server was back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"

#define FAULT_AFTER_MS 1000        /* load before the fault */
#define PROBE_RATE 200             /* orders/s during restart and wipe: every lock keeps up */
#define RECOVER_WAIT_MS 6000       /* after the server is back, wait this long for a 201 */
#define QUIET_MS 1500              /* selling, nothing refused this long (> the lock wait) */
#define KILL_TTL_MS 1000           /* the killed holder's lease (session; etcd: 1 s at least) */
#define KILL_PAUSE_MS 900          /* its pause: it would release before the lease ends */
#define KILL_AFTER_MS 300          /* it is killed this long after its order went out */
#define KILL_WAIT_MS 30000

typedef struct lock_about {
    const char *strategy;
    const char *server;          /* %s: the orders' database, in words */
} lock_about;

/* The locks, then the database's own ways to guard the stock, which a
 * user choosing weighs against them: db-for-update (the row lock, SELECT
 * ... FOR UPDATE, of FL_LOCK_ARTICLE's 3.2.1; PostgreSQL only) and the two
 * that hold no lock between statements. */
static const lock_about LOCKS[FL_LOCK_ROWS] = {
    { "lock", "the service's own Redis, which also holds the stock: its restart is a stock "
              "outage too" },
    { "fair-lock", "the service's own Redis, as lock's, with a line of waiters beside each lock "
                   "(lock.h, FAIRNESS)" },
    { "redlock", "3 independent redis-servers (append-only file), restarted together" },
    { "zookeeper", "1 standalone ZooKeeper" },
    { "etcd", "1 single-member etcd" },
    { "db-lock", "a table in %s" },
    { "db-for-update", "the product's row in %s, locked by SELECT ... FOR UPDATE until the "
                       "order's transaction ends" },
    { "db", "none: one conditional UPDATE (WHERE available >= q) of the product's row in %s, "
            "in the order's commit" },
    { "db-optimistic", "none: a read, then UPDATE ... WHERE version = v of the product's row in "
                       "%s, read again when it moved" },
    { "local", "none: a mutex inside each process" },
};

static const char DB_NA[] = "n/a: it is kept in %s: there is no server apart from the orders' "
                            "own, and losing it loses the orders";
static const char LOCAL_NA[] = "n/a: no lock server (the mutex lives and dies with its process)";
static const char QUORUM_NA[] = "n/a: no Redis replica to fail over to: its servers replicate by "
                                "quorum (%s), and a new leader has every acknowledged write";
static const char DB_FAILOVER_NA[] = "n/a: it is kept in %s, not in Redis: there is no Redis "
                                     "replica to fail over to";
static const char NO_HOLDER_NA[] = "n/a: no lock is held between statements: the take is one "
                                   "UPDATE inside the order's commit";

/* Whether strategy keeps its lock (or its stock) in the orders' database. */
static int in_database(const char *strategy) { return !strncmp(strategy, "db", 2); }

/* The orders' database of w, in words. */
static const char *database_words(const fl_world *w) {
    return !strncmp(w->db_path, "postgres", 8) ? "the orders' PostgreSQL database"
                                               : "the orders' SQLite file";
}

/* ------------------------------------------------------- restart and wipe */

typedef struct fault_run {
    fl_proc *servers;
    int n, wipe;
    int started, done;
    int rc;
    fl_err e;
    int64_t down_ms;
    int64_t t0, t_down, t_back, first_ref, last_ref, first_ok_back;
    int still_refusing;            /* refusals went on to the end */
    int64_t waited_ms;             /* from the server back to the end of the load */
    uint64_t ref_prev, ok_prev, ref_at_down, ok_at_down;
    uint64_t ok_quiet0;            /* 201s when the current quiet stretch began */
} fault_run;

/* Every 20 ms while the load runs: cause the fault once, time the answers.
 * The restart runs here, on the main thread, while the engine's threads
 * keep ordering: a server must be started by a thread that lives as long
 * as flashload (PR_SET_PDEATHSIG follows the thread that forked). */
static int fault_tick(void *ud, const fl_progress *p) {
    fault_run *f = ud;
    int64_t now = clock_mono_ms();
    uint64_t refused = p->c429 + p->c5xx + p->errors, ok = p->c201;
    if (!f->t0) f->t0 = now;
    if (!f->started) {
        if (now - f->t0 < FAULT_AFTER_MS) return 0;
        f->ref_at_down = f->ref_prev = refused;
        f->ok_at_down = f->ok_prev = ok;
        f->started = 1;
        f->t_down = now;
        f->rc = fl_servers_restart(f->servers, f->n, f->wipe, &f->down_ms, &f->e);
        f->t_back = clock_mono_ms();
        f->done = 1;
        return f->rc != 0;
    }
    if (refused > f->ref_prev) {
        if (!f->first_ref) f->first_ref = now;
        f->last_ref = now;
        f->ok_quiet0 = ok;
    }
    if (ok > f->ok_prev && !f->first_ok_back) {
        f->first_ok_back = now;
        if (f->last_ref < now) f->ok_quiet0 = f->ok_prev;
    }
    f->ref_prev = refused;
    f->ok_prev = ok;
    /* Over once it sells again, steadily (a quarter of the rate at
     * least) and with nothing refused for longer than the lock wait, or
     * once it has had RECOVER_WAIT_MS to. */
    int64_t quiet_since = f->first_ok_back > f->last_ref ? f->first_ok_back : f->last_ref;
    f->waited_ms = now - f->t_back;
    if (f->first_ok_back && now - quiet_since >= QUIET_MS &&
        ok - f->ok_quiet0 >= (uint64_t)(PROBE_RATE * QUIET_MS / 4000))
        return 1;
    if (now - f->t_back <= RECOVER_WAIT_MS) return 0;
    f->still_refusing = now - f->last_ref < QUIET_MS;
    return 1;
}

static void run_opts(const fl_compare_opts *o, fl_world *w, fl_run_opts *ro) {
    fl_run_opts_default(ro);
    fl_load_opts *lo = &ro->load;
    memcpy(lo->targets, w->targets, sizeof lo->targets);
    lo->ntargets = 1;
    /* An open loop at a steady rate: while the server is down, refused
     * answers come back at that rate, not as fast as a client can spin. */
    lo->connections = 8;
    lo->threads = 1;
    lo->rate = PROBE_RATE;
    lo->users = o->users;
    lo->qty_min = lo->qty_max = 1;
    lo->timeout_us = 30 * 1000000LL;
    ro->vantage.api = w->targets[0];
    snprintf(ro->vantage.token, sizeof ro->vantage.token, "%s", w->token);
    snprintf(ro->vantage.redis_url, sizeof ro->vantage.redis_url, "%s", w->redis_url);
    snprintf(ro->vantage.db_path, sizeof ro->vantage.db_path, "%s", w->db_path);
    snprintf(ro->vantage.key_prefix, sizeof ro->vantage.key_prefix, "%s", w->key_prefix);
    ro->interrupted = o->interrupted;
    ro->settle_ms = 8000;
}

static void server_probe(const fl_compare_opts *o, fl_world *w, const char *tag,
                         const char *strategy, fl_proc *servers, int n, int wipe, fl_probe *out) {
    static fl_run_opts ro;
    static fl_run_result rr;
    static fault_run f;
    fl_err e = { "" };
    memset(&f, 0, sizeof f);
    f.servers = servers;
    f.n = n;
    f.wipe = wipe;
    run_opts(o, w, &ro);
    ro.load.duration_us = 120 * 1000000LL;       /* the tick ends it */
    ro.sample_ms = 20;
    ro.tick = fault_tick;
    ro.tick_ud = &f;
    char label[64];
    snprintf(label, sizeof label, "[%s %s]", strategy, wipe ? "wipe" : "restart");
    ro.label = label;
    ro.progress = o->progress;
    snprintf(ro.product.sku, sizeof ro.product.sku, "cmp-%s-%s-%s", tag, strategy,
             wipe ? "wipe" : "restart");
    ro.product.stock = 100000;
    snprintf(ro.product.strategy, sizeof ro.product.strategy, "%s", strategy);
    ro.product.segments = 1;
    int rc = fl_run(&ro, &rr, &e);
    if (rc) {
        snprintf(out->note, sizeof out->note, "not measured: %.280s", e.msg);
        fl_run_result_free(&rr);
        return;
    }
    if (!f.started || f.rc) {
        snprintf(out->note, sizeof out->note, "not measured: %.280s",
                 f.started ? f.e.msg : "the load ended before the fault");
        fl_run_result_free(&rr);
        return;
    }
    const fl_load_result *l = &rr.load;
    uint64_t refused = l->status[429] + l->transport_errors;
    for (int s = 500; s < 600; s++) refused += l->status[s];
    out->ran = 1;
    out->down_ms = f.down_ms;
    out->ok = l->status[201] - f.ok_at_down;
    out->refused = refused > f.ref_at_down ? refused - f.ref_at_down : 0;
    out->fenced = l->fenced;
    out->refused_ms = f.last_ref ? f.last_ref - f.t_down : 0;
    out->recover_ms = f.first_ok_back ? f.first_ok_back - f.t_back : -1;
    out->still_refusing = f.still_refusing;
    out->waited_ms = f.waited_ms;
    out->oversold = rr.verdict.oversold;
    out->lost = rr.verdict.lost;
    out->pass = rr.verdict.pass;
    char codes[160] = "";
    for (size_t i = 0; i < l->ncodes; i++)
        snprintf(codes + strlen(codes), sizeof codes - strlen(codes), "%s%s %llu",
                 i ? ", " : "", l->codes[i].code, (unsigned long long)l->codes[i].n);
    char vl[120];
    fl_verdict_line(&rr.verdict, vl, sizeof vl);
    char fenced[48] = "";
    if (l->fenced)
        snprintf(fenced, sizeof fenced, " (%llu of them by the fence)",
                 (unsigned long long)l->fenced);
    int len = snprintf(out->note, sizeof out->note,
                     "down %.1f s; at %d orders/s, %llu sold and %llu refused from the fault "
                     "on: %.150s%s; %.60s", f.down_ms / 1000.0, PROBE_RATE,
                     (unsigned long long)out->ok, (unsigned long long)out->refused,
                     codes[0] ? codes : "none", fenced, vl);
    if (len >= (int)sizeof out->note)              /* cut: say so */
        memcpy(out->note + sizeof out->note - 4, "...", 4);
    fl_run_result_free(&rr);
}

/* -------------------------------------------------------------- the kill */

/* Sends an order on a connection of its own and leaves it waiting: the
 * holder to be killed. Returns the socket, or -1. */
static int order_in_flight(const fl_target *t, const char *sku) {
    int fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)&t->addr, t->addrlen) != 0) {
        close(fd);
        return -1;
    }
    char body[160], req[512];
    int bl = snprintf(body, sizeof body, "{\"sku\":\"%s\",\"user_id\":\"victim\",\"quantity\":1}", sku);
    int rl = snprintf(req, sizeof req,
                      "POST /v1/orders HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s", t->hostport, bl, body);
    if (write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return -1;
    }
    return fd;
}

static void kill_probe(fl_world *w, const char *tag, const char *strategy, fl_probe *out) {
    fl_err e = { "" };
    fl_http h;
    if (w->nsvc < 2 && fl_world_add_instance(w, &e)) {
        snprintf(out->note, sizeof out->note, "not measured: %.280s", e.msg);
        return;
    }
    fl_product_spec ps = { 0 };
    snprintf(ps.sku, sizeof ps.sku, "cmp-%s-%s-kill", tag, strategy);
    ps.stock = 5;
    snprintf(ps.strategy, sizeof ps.strategy, "%s", strategy);
    ps.segments = 1;
    ps.lock_ttl_ms = KILL_TTL_MS;
    ps.cs_delay_ms = KILL_PAUSE_MS;
    fl_http_init(&h, &w->targets[0], w->token, 30000);
    if (fl_product_create(&h, &ps, &e)) {
        snprintf(out->note, sizeof out->note, "not measured: %.280s", e.msg);
        fl_http_close(&h);
        return;
    }
    char lease[80];
    if (!strcmp(strategy, "db-for-update"))
        snprintf(lease, sizeof lease, "no lease: the server ends a dead client's transaction");
    else
        snprintf(lease, sizeof lease, "lease %d ms", KILL_TTL_MS);
    int fd = order_in_flight(&w->targets[1], ps.sku);
    clock_sleep_ms(KILL_AFTER_MS);
    int64_t t_kill = clock_mono_ms();
    fl_proc_kill(&w->svc[1]);
    if (fd >= 0) close(fd);
    /* The other instance orders until one succeeds. */
    int64_t t_ok = -1;
    uint64_t refused = 0;
    char body[160];
    for (int i = 0; clock_mono_ms() - t_kill < KILL_WAIT_MS; i++) {
        snprintf(body, sizeof body, "{\"sku\":\"%s\",\"user_id\":\"after-%d\",\"quantity\":1}",
                 ps.sku, i);
        int st = fl_http_request(&h, "POST", "/v1/orders", body, &e);
        if (st == 201) {
            t_ok = clock_mono_ms();
            break;
        }
        refused++;
        if (st < 0 || st >= 500) clock_sleep_ms(20);
    }
    /* The books: one unit sold, four left, nothing taken by the dead. */
    fl_product p = { 0 };
    int books = 0;
    for (int64_t until = clock_mono_ms() + 8000; clock_mono_ms() < until; clock_sleep_ms(100))
        if (!fl_product_get(&h, ps.sku, &p, &e) && p.sold + p.stock_available == ps.stock) {
            books = 1;
            break;
        }
    fl_http_close(&h);
    /* The killed instance comes back, for whatever follows. */
    w->nsvc--;
    w->ntargets--;
    fl_err re = { "" };
    int back = fl_world_add_instance(w, &re) == 0;
    out->ran = fd >= 0 && t_ok >= 0;
    out->recover_ms = t_ok >= 0 ? t_ok - t_kill : -1;
    out->refused = refused;
    out->ok = t_ok >= 0;
    long long over = p.sold + (p.stock_available > 0 ? p.stock_available : 0) - ps.stock;
    out->oversold = over > 0 ? over : 0;
    out->lost = books ? 0 : ps.stock - p.sold - p.stock_available;
    out->pass = books && p.sold == 1;
    if (fd < 0) snprintf(out->note, sizeof out->note, "not measured: the holder's order could not be sent");
    else if (t_ok < 0)
        snprintf(out->note, sizeof out->note, "no order succeeded within %d s of the kill",
                 KILL_WAIT_MS / 1000);
    else
        snprintf(out->note, sizeof out->note,
                 "holder killed %d ms into a %d ms pause (%s); the other instance's "
                 "next 201 (its own pause in it) %.2f s after the kill, %llu refused before it; "
                 "sold %lld, left %lld%s",
                 KILL_AFTER_MS, KILL_PAUSE_MS, lease, out->recover_ms / 1000.0,
                 (unsigned long long)refused, p.sold, p.stock_available,
                 back ? "" : "; the killed instance could not be restarted");
}

/* ------------------------------------------------------------------ rows */

/* The one-instance scene of strategy with segments in group (failure:
 * of that kind, FL_GROUP_FAILURE only), or NULL. */
static const fl_scene_result *fl_scene_at(const fl_scene_result *r, int n, const char *strategy,
                                          int segments, int group, fl_failure failure) {
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].sc.strategy, strategy) && r[i].sc.segments == segments &&
            r[i].sc.instances == 1 && r[i].sc.group == group && r[i].sc.failure == failure)
            return &r[i];
    return NULL;
}

static void not_measured(fl_probe *p, const char *why) {
    p->ran = 0;
    snprintf(p->note, sizeof p->note, "%.299s", why);
}

/* The "failover to a replica" cell: lock's from the stock's failover,
 * redlock's from a member's; n/a for the locks without a Redis. */
static void failover_cell(const fl_compare_opts *o, const fl_world *w, fl_lock_row *row,
                          const fl_scene_result *r, int n) {
    fl_probe *p = &row->failover;
    const char *s = row->strategy;
    char why[300];
    if (!strcmp(s, "zookeeper") || !strcmp(s, "etcd")) {
        snprintf(why, sizeof why, QUORUM_NA, !strcmp(s, "etcd") ? "Raft" : "ZAB");
        not_measured(p, why);
        return;
    }
    if (!strcmp(s, "local")) {
        not_measured(p, LOCAL_NA);
        return;
    }
    if (in_database(s)) {
        snprintf(why, sizeof why, DB_FAILOVER_NA, database_words(w));
        not_measured(p, why);
        return;
    }
    int redlock = !strcmp(s, "redlock");
    const fl_scene_result *sc =
        fl_scene_at(r, n, s, 1, FL_GROUP_FAILURE, redlock ? FL_FAIL_MEMBER : FL_FAIL_FAILOVER);
    if (!sc) {
        not_measured(p, !o->redis_failures ? "not measured (--no-redis-failures)"
                                           : "not measured: no failover scene");
        return;
    }
    if (!sc->ran) {
        not_measured(p, sc->note);
        return;
    }
    if (!sc->as_expected && sc->verdict.pass) {
        /* Sold exactly, but the failover did not come as planned. */
        snprintf(why, sizeof why, "not measured: the fault was not caused as planned: %.240s",
                 sc->detail);
        not_measured(p, why);
        return;
    }
    p->ran = 1;
    p->recover_ms = sc->recover_ms;
    p->ok = (uint64_t)sc->verdict.sold;
    p->fenced = sc->fenced;
    p->refused = sc->status_429 + sc->status_5xx;
    p->oversold = sc->verdict.oversold;
    p->lost = sc->verdict.lost;
    p->pass = sc->verdict.pass;
    /* The scene's condition (with the time to the next 201); its full
     * account is with the scenes. */
    snprintf(p->note, sizeof p->note, "%s%.160s; %lld sold, %lld oversold, %llu fenced; %.80s",
             redlock ? "a member: " : "the stock's Redis: ", sc->sc.condition, sc->verdict.sold,
             sc->verdict.oversold, (unsigned long long)sc->fenced, sc->verdict_line);
}

/* The row's fairness, from its two fairness scenes. */
static void fairness_of(fl_lock_row *row, const fl_scene_result *r, int n) {
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_FAIRNESS || !s->ran || strcmp(s->sc.strategy, row->strategy))
            continue;
        int k = s->sc.fair_scene == FL_FAIR_STREAM;
        row->fair_have[k] = 1;
        row->fair_oo[k] = s->fair_out_of_order;
        row->fair_pairs[k] = s->fair_pairs;
        row->fair_starved[k] = s->fair_starved;
        row->fair_wait_max_ms[k] = s->fair_wait_max_ms;
    }
}

/* The row's figures that come from the scenes. */
static void from_scenes(fl_lock_row *row, const fl_scene_result *r, int n) {
    fairness_of(row, r, n);
    const char *s = row->strategy;
    const fl_scene_result *one = fl_scene_at(r, n, s, 1, FL_GROUP_CONTENTION, FL_FAIL_NONE);
    const fl_scene_result *eight = fl_scene_at(r, n, s, 8, FL_GROUP_CONTENTION, FL_FAIL_NONE);
    const fl_scene_result *pause = fl_scene_at(r, n, s, 1, FL_GROUP_PAUSE, FL_FAIL_NONE);
    if (one && one->ran) {
        row->have1 = 1;
        row->ops1 = one->orders_per_s;
        row->p50_us = one->p50_us;
        row->p99_us = one->p99_us;
        row->handoff_n = one->handoff_n;
        row->handoff_mean_us = one->handoff_mean_us;
        row->handoff_p50_us = one->handoff_p50_us;
    }
    if (eight && eight->ran) {
        row->have8 = 1;
        row->ops8 = eight->orders_per_s;
        row->p50_8_us = eight->p50_us;
        row->p99_8_us = eight->p99_us;
    }
    fl_probe *f = &row->fence;
    if (!strcmp(row->strategy, "local")) {
        not_measured(f, "n/a: no lease (a mutex is held until released)");
    } else if (!strcmp(row->strategy, "db-for-update")) {
        /* No lease to outlive: the forced scene, where a holder pauses
         * for a second one, says whether any came in. */
        char why[300];
        int k = snprintf(why, sizeof why, "n/a: no lease: the row lock is held until the "
                         "transaction ends, however long the holder pauses");
        if (pause && pause->ran)
            snprintf(why + k, sizeof why - (size_t)k, "; in the forced scene (each holder waits "
                     "in its transaction for a second): %lld sold, %lld oversold, %lld of %lld "
                     "waits met a second holder", pause->verdict.sold, pause->verdict.oversold,
                     pause->forced_met, pause->forced_met + pause->forced_alone);
        not_measured(f, why);
    } else if (in_database(row->strategy) && strcmp(row->strategy, "db-lock")) {
        not_measured(f, "n/a: no lease, and no lock held between statements");
    } else if (!pause) {
        not_measured(f, "not measured: no pause scene (left out by --strategies)");
    } else if (!pause->ran) {
        not_measured(f, pause->note);
    } else {
        f->ran = 1;
        f->ok = (uint64_t)pause->verdict.sold;
        f->fenced = pause->fenced;
        f->refused = pause->status_429;
        f->oversold = pause->verdict.oversold;
        f->lost = pause->verdict.lost;
        f->pass = pause->verdict.pass;
        snprintf(f->note, sizeof f->note, "%.60s: %llu stale writes refused by the fence (429), "
                 "%lld sold, %lld oversold; %.100s", pause->sc.condition,
                 (unsigned long long)pause->fenced, pause->verdict.sold, pause->verdict.oversold,
                 pause->verdict_line);
    }
}

int fl_lock_rows(const fl_compare_opts *o, fl_world *w, const char *tag,
                 const fl_strategy *st, int nst, const fl_scene_result *r, int n,
                 fl_lock_row *rows) {
    int nr = 0;
    for (int i = 0; i < FL_LOCK_ROWS; i++) {
        const char *s = LOCKS[i].strategy;
        int named = 0;
        for (int k = 0; k < o->nstrategies; k++) named |= !strcmp(o->strategies[k], s);
        const fl_strategy *info = fl_strategy_find(st, nst, s);
        /* One the service cannot run here (db-for-update on SQLite) is left
         * out unless named, as its scenes are. */
        if (!(o->nstrategies == 0 || named) || !info || (!info->available && !named)) continue;
        fl_lock_row *row = &rows[nr++];
        memset(row, 0, sizeof *row);
        snprintf(row->strategy, sizeof row->strategy, "%s", s);
        snprintf(row->server, sizeof row->server, LOCKS[i].server, database_words(w));
        from_scenes(row, r, n);
        failover_cell(o, w, row, r, n);
    }
    /* The probes, in an order that disturbs the least: kills, restarts,
     * data lost, and the stock Redis (lock) last of all. */
    char why[300];
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < nr; i++) {
            fl_lock_row *row = &rows[i];
            const char *s = row->strategy;
            fl_probe *p = pass == 0 ? &row->kill : pass == 1 ? &row->restart : &row->wipe;
            int is_lock = !strcmp(s, "lock") || !strcmp(s, "fair-lock"), is_db = in_database(s),
                is_local = !strcmp(s, "local");
            if (is_local) {
                not_measured(p, pass == 0 ? "n/a: the mutex dies with its process, and never "
                                            "excluded the other instance (see local x2)"
                                          : LOCAL_NA);
                continue;
            }
            if (pass > 0 && is_lock) continue;        /* below */
            if (pass > 0 && is_db) {
                snprintf(why, sizeof why, DB_NA, database_words(w));
                not_measured(p, why);
                continue;
            }
            if (is_db && strcmp(s, "db-lock") && strcmp(s, "db-for-update")) {
                not_measured(p, NO_HOLDER_NA);
                continue;
            }
            if (!o->probes) {
                not_measured(p, "not measured (--no-probes)");
                continue;
            }
            if (!w->dir[0]) {
                not_measured(p, "not measured: needs the services compare starts itself");
                continue;
            }
            if (o->interrupted && atomic_load(o->interrupted)) {
                not_measured(p, "not measured: interrupted");
                continue;
            }
            if (fl_world_ready(w, s, why, sizeof why)) {
                char msg[320];
                snprintf(msg, sizeof msg, "skipped: %.300s", why);
                not_measured(p, msg);
                continue;
            }
            if (pass == 0) {
                kill_probe(w, tag, s, p);
            } else {
                fl_lockserver *ls = fl_world_server(w, s);
                if (!ls) continue;
                server_probe(o, w, tag, s, ls->p, ls->n, pass == 2, p);
            }
            char eta[64];
            fl_eta_step(&w->eta, pass == 0 ? FL_ETA_PROBE_KILL : FL_ETA_PROBE_SERVER, eta,
                        sizeof eta);
            fprintf(stderr, "[%s %s] %s  (%s)\n", s,
                    pass == 0 ? "kill -9" : pass == 1 ? "restart" : "data lost", p->note, eta);
        }
    }
    /* lock and fair-lock: their server is the stock's Redis. */
    for (int i = 0; i < nr; i++) {
        const char *s = rows[i].strategy;
        if (strcmp(s, "lock") && strcmp(s, "fair-lock")) continue;
        for (int wipe = 0; wipe < 2; wipe++) {
            fl_probe *p = wipe ? &rows[i].wipe : &rows[i].restart;
            if (!o->probes || !w->dir[0]) {
                not_measured(p, !o->probes ? "not measured (--no-probes)"
                                           : "not measured: needs the services compare starts itself");
                continue;
            }
            server_probe(o, w, tag, s, &w->redis, 1, wipe, p);
            char eta[64];
            fl_eta_step(&w->eta, FL_ETA_PROBE_SERVER, eta, sizeof eta);
            fprintf(stderr, "[%s %s] %s  (%s)\n", s, wipe ? "data lost" : "restart", p->note, eta);
        }
    }
    return nr;
}
