/* compare.c: `flashload compare`: the same load against every stock
 * strategy, so the safe ones can be seen to hold and the unsafe ones to
 * oversell, side by side.
 *
 * The matrix is strategies (every one the service lists at GET
 * /v1/strategies, by default) x segment counts,
 * plus two-instance scenes for `local` (which breaks there) and `lua`
 * (which does not). A flaw that needs a particular interleaving is forced,
 * not hoped for: the lock-based unsafe strategies run with an injected
 * pause longer than their lease, and `lock` runs under that same pause to
 * show that its fence holds. Every scene gets a fresh SKU and is verified
 * like any run; its verdict is then compared with what the strategy is
 * expected to do.
 *
 * Without --target, compare starts a private redis-server and flashsale
 * (a second instance when a scene needs one) with --fault-injection, on
 * free ports in a temp dir, and stops them at the end. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "loadtest/loadtest.h"

#define MAX_SCENES 64

/* The pause that outlives a lease: what breaks the lock-based unsafe ones. */
#define PAUSE_MS 300
#define PAUSE_TTL_MS 100
/* unsafe-check-then-decr goes wrong only while several orders sit between
 * their read and their DECRBY as the stock runs out; a Redis round trip
 * is too short a window to count on, so it is widened a little. */
#define CHECK_DECR_PAUSE_MS 3
/* unsafe-setnx-expire leases in whole seconds (EXPIRE). */
#define SETNX_PAUSE_MS 1500
#define SETNX_TTL_MS 1000

void fl_compare_opts_default(fl_compare_opts *o) {
    memset(o, 0, sizeof *o);
    o->segments[0] = 1;
    o->segments[1] = 8;
    o->nsegments = 2;
    o->two_instances = 1;
    o->duration_s = 2;
    o->pause_duration_s = 3;
    o->connections = 64;
    o->threads = 2;
    o->users = 1000;
    o->qty_min = o->qty_max = 1;
    o->stock = 20000;
    o->pause_stock = 10;           /* a few units: a pause scene sells a few per second */
    snprintf(o->out_dir, sizeof o->out_dir, ".");
    snprintf(o->key_prefix, sizeof o->key_prefix, "fs:");
}

/* --------------------------------------------------------------- the matrix */

/* Fills the condition under which a strategy shows what it is. */
static void condition(const fl_compare_opts *o, fl_scene *sc) {
    const char *s = sc->strategy;
    sc->stock = o->stock;
    sc->duration_s = o->duration_s;
    if (!strcmp(s, "unsafe-setnx-expire")) {
        sc->cs_delay_ms = SETNX_PAUSE_MS;
        sc->lock_ttl_ms = SETNX_TTL_MS;
    } else if (!strcmp(s, "unsafe-lock-no-fence") || !strcmp(s, "lock")) {
        sc->cs_delay_ms = PAUSE_MS;
        sc->lock_ttl_ms = PAUSE_TTL_MS;
    }
    if (!strcmp(s, "unsafe-check-then-decr")) {
        sc->cs_delay_ms = CHECK_DECR_PAUSE_MS;
        sc->stock = o->stock / 10 > 0 ? o->stock / 10 : 1;    /* it must sell out */
        snprintf(sc->condition, sizeof sc->condition, "contention, pause %dms", sc->cs_delay_ms);
    } else if (sc->cs_delay_ms) {
        sc->stock = o->pause_stock;
        sc->duration_s = o->pause_duration_s;
        snprintf(sc->condition, sizeof sc->condition, "pause %dms > lease %dms", sc->cs_delay_ms,
                 sc->lock_ttl_ms);
    } else if (sc->instances > 1) {
        snprintf(sc->condition, sizeof sc->condition, "contention, %d instances", sc->instances);
    } else {
        snprintf(sc->condition, sizeof sc->condition, "contention");
    }
    /* `local` is only safe inside one process. */
    sc->unsafe = sc->unsafe || (!strcmp(s, "local") && sc->instances > 1);
}

static int add_scene(const fl_compare_opts *o, fl_scene *out, int *n, int max, const char *name,
                     int segments, int instances, int unsafe) {
    if (*n == max) return -1;
    fl_scene *sc = &out[(*n)++];
    memset(sc, 0, sizeof *sc);
    snprintf(sc->strategy, sizeof sc->strategy, "%s", name);
    sc->segments = segments;
    sc->instances = instances;
    sc->unsafe = unsafe;
    condition(o, sc);
    return 0;
}

int fl_compare_scenes(const fl_compare_opts *o, const fl_strategy *st, int nst, fl_scene *out,
                      int max) {
    int n = 0;
    for (int i = 0; i < nst; i++) {
        const fl_strategy *info = &st[i];
        int wanted = o->nstrategies == 0;
        for (int k = 0; k < o->nstrategies; k++) wanted |= !strcmp(o->strategies[k], info->name);
        if (!wanted) continue;
        int did_one = 0;
        for (int k = 0; k < o->nsegments; k++) {
            if (o->segments[k] > 1 && !info->segments) continue;
            add_scene(o, out, &n, max, info->name, o->segments[k], 1, !info->safe);
            did_one = 1;
        }
        if (!did_one) add_scene(o, out, &n, max, info->name, 1, 1, !info->safe);
        if (o->two_instances && (!strcmp(info->name, "local") || !strcmp(info->name, "lua")))
            add_scene(o, out, &n, max, info->name, 1, 2, !info->safe);
    }
    return n;
}

/* Asks the service for its strategies; every name asked for must be one. */
static int strategies(const fl_compare_opts *o, const fl_target *t, fl_strategy *st, int *nst,
                      fl_err *e) {
    fl_http h;
    fl_http_init(&h, t, o->token, 10000);
    *nst = fl_strategies_get(&h, st, FL_MAX_STRATEGIES, e);
    fl_http_close(&h);
    if (*nst < 0) return -1;
    for (int k = 0; k < o->nstrategies; k++) {
        if (fl_strategy_find(st, *nst, o->strategies[k])) continue;
        char names[400] = "";
        for (int i = 0; i < *nst; i++) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%.31s", i ? ", " : "", st[i].name);
        }
        return fl_errf(e, "--strategies: the service offers no strategy '%s' (it offers: %s)",
                       o->strategies[k], names);
    }
    return 0;
}

/* ------------------------------------------------------------- the services */

typedef struct world {
    char dir[256];                 /* our temp dir ("" : services given) */
    fl_proc redis;
    fl_proc svc[2];
    int nsvc;
    fl_target targets[FL_MAX_TARGETS];
    int ntargets;
    char redis_url[512];
    char db_path[512];
    char key_prefix[64];
    char token[256];
    char service_bin[400];
} world;

static const char *const SERVICE_ARGS[] = { "--fault-injection", "--key-prefix", "fs:",
                                            "--pending-timeout-ms", "3000", "--lock-wait-ms",
                                            "1000", NULL };

/* Starts one more instance of our own service. */
static int start_instance(world *w, fl_err *e) {
    fl_proc *p = &w->svc[w->nsvc];
    if (fl_service_start(w->service_bin, w->dir, w->redis_url, w->db_path, SERVICE_ARGS, p, e))
        return -1;
    w->nsvc++;
    return fl_target_parse(p->url, &w->targets[w->ntargets++], e);
}

static int world_up(const fl_compare_opts *o, world *w, fl_err *e) {
    memset(w, 0, sizeof *w);
    snprintf(w->token, sizeof w->token, "%s", o->token);
    snprintf(w->service_bin, sizeof w->service_bin, "%s", o->service_bin);
    if (o->ntargets) {
        memcpy(w->targets, o->targets, sizeof w->targets);
        w->ntargets = o->ntargets;
        snprintf(w->redis_url, sizeof w->redis_url, "%s", o->redis_url);
        snprintf(w->db_path, sizeof w->db_path, "%s", o->db_path);
        snprintf(w->key_prefix, sizeof w->key_prefix, "%s", o->key_prefix);
        return 0;
    }
    if (access(o->service_bin, X_OK) != 0)
        return fl_errf(e, "no service binary at %s (build it, or give --flashsale or --target)",
                       o->service_bin);
    snprintf(w->dir, sizeof w->dir, "/tmp/flashload-XXXXXX");
    if (!mkdtemp(w->dir)) {
        w->dir[0] = '\0';
        return fl_errf(e, "cannot make a temp dir");
    }
    snprintf(w->key_prefix, sizeof w->key_prefix, "fs:");
    snprintf(w->db_path, sizeof w->db_path, "%s/orders.db", w->dir);
    if (fl_redis_start(w->dir, &w->redis, e)) return -1;
    snprintf(w->redis_url, sizeof w->redis_url, "%s", w->redis.url);
    return start_instance(w, e);
}

static void world_down(world *w, int keep) {
    for (int i = w->nsvc - 1; i >= 0; i--) fl_proc_stop(&w->svc[i], 30000);
    fl_proc_stop(&w->redis, 5000);
    if (!w->dir[0]) return;
    if (keep) fprintf(stderr, "flashload compare: logs kept in %s\n", w->dir);
    else fl_rmtree(w->dir);
}

/* ----------------------------------------------------------------- a scene */

static void scene_run(const fl_compare_opts *o, world *w, const char *tag, int idx, int total,
                      fl_scene_result *res, fl_err *e) {
    static fl_run_opts ro;         /* large: off the stack */
    static fl_run_result rr;
    const fl_scene *sc = &res->sc;
    if (sc->instances > w->ntargets && w->dir[0]) {
        while (w->nsvc < sc->instances && w->nsvc < 2)
            if (start_instance(w, e)) {
                snprintf(res->note, sizeof res->note, "skipped: %.180s", e->msg);
                return;
            }
    }
    if (sc->instances > w->ntargets) {
        snprintf(res->note, sizeof res->note, "skipped: needs %d targets", sc->instances);
        return;
    }
    fl_run_opts_default(&ro);
    fl_load_opts *lo = &ro.load;
    memcpy(lo->targets, w->targets, sizeof lo->targets);
    lo->ntargets = sc->instances;
    lo->connections = o->connections;
    lo->threads = o->threads;
    lo->users = o->users;
    lo->qty_min = o->qty_min;
    lo->qty_max = o->qty_max;
    lo->duration_us = (int64_t)(sc->duration_s * 1e6);
    lo->timeout_us = 30 * 1000000LL;
    ro.vantage.api = w->targets[0];
    snprintf(ro.vantage.token, sizeof ro.vantage.token, "%s", w->token);
    snprintf(ro.vantage.redis_url, sizeof ro.vantage.redis_url, "%s", w->redis_url);
    snprintf(ro.vantage.db_path, sizeof ro.vantage.db_path, "%s", w->db_path);
    snprintf(ro.vantage.key_prefix, sizeof ro.vantage.key_prefix, "%s", w->key_prefix);
    ro.settle_ms = 4000;
    ro.progress = o->progress;
    ro.interrupted = o->interrupted;
    char label[96];
    snprintf(label, sizeof label, "[%d/%d %s x%d x%d]", idx, total, sc->strategy, sc->segments,
             sc->instances);
    ro.label = label;
    fl_product_spec *ps = &ro.product;
    snprintf(ps->sku, sizeof ps->sku, "cmp-%s-%s-s%d-i%d", tag, sc->strategy, sc->segments,
             sc->instances);
    ps->stock = sc->stock;
    snprintf(ps->strategy, sizeof ps->strategy, "%s", sc->strategy);
    ps->segments = sc->segments;
    ps->cs_delay_ms = sc->cs_delay_ms;
    ps->lock_ttl_ms = sc->lock_ttl_ms;
    if (fl_run(&ro, &rr, e)) {
        snprintf(res->note, sizeof res->note, "skipped: %.180s", e->msg);
        fl_run_result_free(&rr);
        return;
    }
    const fl_load_result *l = &rr.load;
    double secs = l->elapsed_us / 1e6;
    res->ran = 1;
    res->answered = l->answered;
    res->created = l->ncreated;
    res->transport_errors = l->transport_errors;
    /* Orders per second while there was stock to sell: once a sale is
     * over, the cheap sold-out answers would say nothing about the strategy. */
    double window = (l->ncreated && l->last_created_us > 0 ? l->last_created_us : l->elapsed_us) / 1e6;
    res->orders_per_s = window > 0 ? l->ncreated / window : 0;
    res->answers_per_s = secs > 0 ? l->answered / secs : 0;
    res->p50_us = fl_hist_percentile(&l->hist, 50);
    res->p90_us = fl_hist_percentile(&l->hist, 90);
    res->p99_us = fl_hist_percentile(&l->hist, 99);
    res->p999_us = fl_hist_percentile(&l->hist, 99.9);
    res->max_us = l->hist.max;
    res->status_201 = l->status[201];
    res->status_409 = l->status[409];
    res->status_429 = l->status[429];
    for (int s = 500; s < 600; s++) res->status_5xx += l->status[s];
    res->verdict = rr.verdict;
    fl_verdict_line(&rr.verdict, res->verdict_line, sizeof res->verdict_line);
    /* An unsafe scene is as expected when it shows its flaw: units sold or
     * offered beyond the stock, or stock below zero. */
    int flaw = rr.verdict.oversold > 0 || rr.verdict.min_stock < 0;
    res->as_expected = sc->unsafe ? (!rr.verdict.pass && flaw) : rr.verdict.pass;
    fl_run_result_free(&rr);
}

/* ------------------------------------------------------------------- table */

void fl_compare_table(const fl_scene_result *r, int n, FILE *f) {
    fprintf(f, "%-27s %8s %9s %9s %8s %8s %6s %8s %9s %5s  %s\n", "strategy", "segments",
            "instances", "orders/s", "p50", "p99", "sold", "oversold", "min stock", "lost",
            "verdict");
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (!s->ran) {
            fprintf(f, "%-27s %8d %9d  %s\n", s->sc.strategy, s->sc.segments, s->sc.instances,
                    s->note);
            continue;
        }
        char p50[16], p99[16], rate[24];
        fl_fmt_us(s->p50_us, p50, sizeof p50);
        fl_fmt_us(s->p99_us, p99, sizeof p99);
        snprintf(rate, sizeof rate, s->orders_per_s < 10 ? "%.1f" : "%.0f", s->orders_per_s);
        fprintf(f, "%-27s %8d %9d %9s %8s %8s %6lld %8lld %9lld %5lld  %s%s  [%s]\n",
                s->sc.strategy, s->sc.segments, s->sc.instances, rate, p50, p99,
                s->verdict.sold, s->verdict.oversold, s->verdict.min_stock, s->verdict.lost,
                s->verdict_line, s->as_expected ? "" : "  << UNEXPECTED", s->sc.condition);
    }
}

static void make_tag(char *tag, size_t len) {
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (unsigned)clock_mono_us();
    snprintf(tag, len, "%04x", r & 0xffff);
}

int fl_compare(const fl_compare_opts *o, fl_err *e) {
    static fl_scene scenes[MAX_SCENES];
    static fl_scene_result res[MAX_SCENES];
    fl_strategy st[FL_MAX_STRATEGIES];
    int nst, n;
    world w;
    int rc = -1;
    if (world_up(o, &w, e)) goto out;
    if (strategies(o, &w.targets[0], st, &nst, e)) goto out;
    n = fl_compare_scenes(o, st, nst, scenes, MAX_SCENES);
    if (n == 0) {
        fl_errf(e, "no scene to run (check --strategies and --segments)");
        goto out;
    }
    char tag[16];
    make_tag(tag, sizeof tag);
    fprintf(stderr, "flashload compare: %d scenes, %d connections each, services at %s%s\n", n,
            o->connections, w.targets[0].url, w.dir[0] ? " (our own)" : "");
    int64_t t0 = clock_mono_ms();
    int ran = 0, unexpected = 0;
    for (int i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].sc = scenes[i];
        if (o->interrupted && atomic_load(o->interrupted)) {
            snprintf(res[i].note, sizeof res[i].note, "skipped: interrupted");
            continue;
        }
        const fl_strategy *info = fl_strategy_find(st, nst, scenes[i].strategy);
        fl_err se = { "" };
        if (info && !info->available)
            snprintf(res[i].note, sizeof res[i].note, "skipped: the service cannot run it%s%.150s",
                     info->reason[0] ? ": " : "", info->reason);
        else scene_run(o, &w, tag, i + 1, n, &res[i], &se);
        if (!res[i].ran) {
            fprintf(stderr, "[%d/%d] %s x%d x%d: %s\n", i + 1, n, scenes[i].strategy,
                    scenes[i].segments, scenes[i].instances, res[i].note);
            continue;
        }
        ran++;
        unexpected += !res[i].as_expected;
        fprintf(stderr, "[%d/%d] %-27s x%d x%d  %7.0f orders/s  %s%s\n", i + 1, n,
                scenes[i].strategy, scenes[i].segments, scenes[i].instances, res[i].orders_per_s,
                res[i].verdict_line, res[i].as_expected ? "" : "  << UNEXPECTED");
    }
    printf("\n");
    fl_compare_table(res, n, stdout);
    printf("\n%d scenes in %.0f s: %s\n", ran, (clock_mono_ms() - t0) / 1000.0,
           !ran ? "none ran"
           : unexpected ? "some did not come out as expected (marked above)"
                        : "every safe strategy PASSed and every unsafe one oversold, as expected");
    char path[512];
    snprintf(path, sizeof path, "%s/report.json", o->out_dir);
    if (fl_report_json(o, res, n, path, e)) goto out;
    snprintf(path, sizeof path, "%s/report.html", o->out_dir);
    if (fl_report_html(o, res, n, path, e)) goto out;
    char abs[PATH_MAX];
    printf("report: %s\n", realpath(path, abs) ? abs : path);
    rc = ran && !unexpected ? 0 : 1;
out:
    world_down(&w, rc < 0);
    return rc;
}
