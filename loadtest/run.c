/* run.c: one flashload run: set the product up, drive the load while
 * sampling the stock and printing progress, then verify.
 *
 * The main thread does the sampling and the progress line; the engine's
 * threads do the load. Sampling goes through its own connection, so what
 * it sees is what any buyer could have seen at that moment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "common/clock.h"
#include "loadtest/run.h"

#define CONNECT_GIVE_UP_MS 10000   /* no connection at all by then: a setup error */

void fl_run_opts_default(fl_run_opts *o) {
    memset(o, 0, sizeof *o);
    fl_load_opts_default(&o->load);
    o->create = 1;
    o->verify = 1;
    o->settle_ms = 5000;
    o->sample_ms = 100;
    o->product.stock = 10000;
    o->product.segments = 1;
    snprintf(o->vantage.key_prefix, sizeof o->vantage.key_prefix, "fs:");
}

void fl_fmt_us(uint64_t us, char *out, size_t len) {
    if (us < 1000) snprintf(out, len, "%lluus", (unsigned long long)us);
    else if (us < 10000) snprintf(out, len, "%.2fms", us / 1000.0);
    else if (us < 1000000) snprintf(out, len, "%.1fms", us / 1000.0);
    else snprintf(out, len, "%.2fs", us / 1e6);
}

static uint64_t random_u64(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = (uint64_t)clock_mono_us() ^ (uint64_t)getpid();
    return v;
}

static void progress_line(const fl_run_opts *o, fl_engine *g, uint64_t *prev, int64_t *prev_us) {
    fl_progress p;
    fl_engine_progress(g, &p);
    double dt = (double)(p.elapsed_us - *prev_us) / 1e6;
    double rate = dt > 0 ? (double)(p.answered - *prev) / dt : 0;
    char p99[32];
    fl_fmt_us(p.p99_us, p99, sizeof p99);
    fprintf(stderr,
            "%s%s%5.1fs  requests %llu  201 %llu  409 %llu  429 %llu  5xx %llu  shed %llu  "
            "errors %llu  open %d  %.0f/s  p99 %s\n",
            o->label ? o->label : "", o->label ? "  " : "", p.elapsed_us / 1e6,
            (unsigned long long)p.answered, (unsigned long long)p.c201,
            (unsigned long long)p.c409, (unsigned long long)p.c429,
            (unsigned long long)(p.c5xx - p.shed), (unsigned long long)p.shed,
            (unsigned long long)p.errors, p.open, rate, p.interval_n ? p99 : "-");
    *prev = p.answered;
    *prev_us = p.elapsed_us;
}

/* Creates the product, or finds the one named. */
static int setup_product(const fl_run_opts *o, fl_http *h, fl_product_spec *spec, fl_product *p,
                         fl_err *e) {
    if (o->create) {
        if (!spec->sku[0])
            snprintf(spec->sku, sizeof spec->sku, "fl-%lld-%04x", (long long)time(NULL),
                     (unsigned)(random_u64() & 0xffff));
        if (fl_product_create(h, spec, e)) return -1;
    }
    if (fl_product_get(h, spec->sku, p, e)) return -1;
    return 0;
}

/* Drives the engine to its end: samples every sample_ms, a progress line
 * every second, stops early on an interrupt. */
static int drive(const fl_run_opts *o, fl_engine *g, fl_sampler *s, fl_err *e) {
    int64_t t0 = clock_mono_ms(), next_progress = t0 + 1000;
    uint64_t prev = 0;
    int64_t prev_us = 0;
    int stopped = 0, rc = 0;
    while (!fl_engine_finished(g)) {
        clock_sleep_ms(o->sample_ms > 0 ? o->sample_ms : 100);
        int64_t now = clock_mono_ms();
        if (s) fl_sampler_sample(s);
        if (!stopped && o->tick) {
            fl_progress p;
            fl_engine_progress(g, &p);
            if (o->tick(o->tick_ud, &p)) {
                fl_engine_stop(g);
                stopped = 1;
            }
        }
        if (!stopped && o->interrupted && atomic_load(o->interrupted)) {
            fl_engine_stop(g);
            stopped = 1;
        }
        if (!stopped && now - t0 > CONNECT_GIVE_UP_MS && !fl_engine_connected(g)) {
            fl_engine_stop(g);
            stopped = 1;
            rc = fl_errf(e, "no connection to %s could be made in %d s", o->load.targets[0].url,
                         CONNECT_GIVE_UP_MS / 1000);
        }
        if (o->progress && now >= next_progress) {
            progress_line(o, g, &prev, &prev_us);
            next_progress += 1000;
        }
    }
    return rc;
}

int fl_run(const fl_run_opts *o, fl_run_result *res, fl_err *e) {
    memset(res, 0, sizeof *res);
    fl_hist_reset(&res->load.hist);
    fl_hist_reset(&res->load.decision_hist);
    fl_load_opts lo = o->load;
    fl_product_spec spec = o->product;
    fl_baseline base = { 0 };
    fl_sampler *s = NULL;
    fl_engine *g = NULL;
    fl_http h;
    int rc = -1;
    fl_http_init(&h, &lo.targets[0], o->vantage.token, 10000);
    if (!lo.get_path) {
        if (setup_product(o, &h, &spec, &res->product, e)) goto out;
        lo.sku = spec.sku;
        lo.hold_seconds = res->product.hold_seconds;     /* the product's, created or found */
        snprintf(lo.token, sizeof lo.token, "%s", o->vantage.token);
        if (o->verify && fl_baseline_take(&h, spec.sku, &base, e)) goto out;
        if (o->verify && !(s = fl_sampler_new(&o->vantage, &res->product, e))) goto out;
    }
    if (!lo.key_tag[0]) snprintf(lo.key_tag, sizeof lo.key_tag, "%08x", (unsigned)random_u64());
    if (!lo.seed) lo.seed = random_u64();
    if (!(g = fl_engine_start(&lo, e))) goto out;
    int drove = drive(o, g, s, e);
    fl_engine_join(g, &res->load);
    if (drove) goto out;
    if (s) fl_sampler_get(s, &res->samples);
    if (o->verify && !lo.get_path) {
        fl_verify_in in = { &o->vantage, spec.sku, &base, &res->load, &res->samples,
                            o->settle_ms, &lo, o->progress };
        if (fl_verify(&in, &res->verdict, e)) goto out;
        res->verified = 1;
    }
    rc = 0;
out:
    fl_sampler_free(s);
    fl_baseline_free(&base);
    fl_http_close(&h);
    return rc;
}

void fl_run_result_free(fl_run_result *r) { fl_load_result_free(&r->load); }

/* ------------------------------------------------------------------ output */

static void print_latency(const fl_hist *h, FILE *f) {
    const double ps[] = { 50, 90, 99, 99.9 };
    const char *names[] = { "p50", "p90", "p99", "p99.9" };
    char v[32];
    fprintf(f, "latency   ");
    for (int i = 0; i < 4; i++) {
        fl_fmt_us(fl_hist_percentile(h, ps[i]), v, sizeof v);
        fprintf(f, " %s %s ", names[i], v);
    }
    fl_fmt_us(h->max, v, sizeof v);
    fprintf(f, " max %s\n", v);
}

/* "250 ms" from microseconds. */
static const char *fmt_ms(int64_t us, char *out, size_t len) {
    snprintf(out, len, "%g ms", (double)us / 1000.0);
    return out;
}

void fl_run_print(const fl_run_opts *o, const fl_run_result *r, FILE *f) {
    const fl_load_result *l = &r->load;
    const fl_load_opts *lo = &o->load;
    double secs = l->elapsed_us / 1e6;
    char gms[32], lms[32];
    fprintf(f, "target    ");
    for (int i = 0; i < lo->ntargets; i++) fprintf(f, "%s%s", i ? ", " : "", lo->targets[i].url);
    fprintf(f, "  (%d connections, %d thread%s, %s)\n", lo->connections, lo->threads,
            lo->threads == 1 ? "" : "s", lo->rate > 0 ? "open loop" : "closed loop");
    if (!lo->get_path)
        fprintf(f, "product   %s: %s, %d segment%s, stock %lld, per-user limit %lld\n",
                r->product.sku, r->product.strategy, r->product.segments,
                r->product.segments == 1 ? "" : "s", r->product.stock_initial,
                r->product.per_user_limit);
    fprintf(f, "requests  %llu answered in %.2f s: %.0f/s", (unsigned long long)l->answered, secs,
            secs > 0 ? l->answered / secs : 0);
    if (lo->rate > 0) fprintf(f, " (asked for %.0f/s)", lo->rate);
    fprintf(f, "; most connections open at once: %d\n", l->max_open);
    print_latency(&l->hist, f);
    fprintf(f, "status   ");
    for (int s = 100; s < 600; s++)
        if (l->status[s]) fprintf(f, " %d: %llu ", s, (unsigned long long)l->status[s]);
    fprintf(f, "\n");
    if (l->ncodes) {
        fprintf(f, "errors   ");
        for (size_t i = 0; i < l->ncodes; i++)
            fprintf(f, " %s: %llu ", l->codes[i].code, (unsigned long long)l->codes[i].n);
        fprintf(f, "\n");
    }
    if (!lo->get_path)
        fprintf(f, "goodput   %llu 201s within %s: %.0f/s; %llu shed (503 overloaded, nothing "
                   "taken); %llu answers later than %s\n",
                (unsigned long long)l->good, fmt_ms(lo->goodput_us, gms, sizeof gms),
                secs > 0 ? l->good / secs : 0.0, (unsigned long long)l->shed,
                (unsigned long long)l->late, fmt_ms(lo->late_us, lms, sizeof lms));
    if (l->transport_errors || l->connect_errors || l->backlog)
        fprintf(f, "transport %llu requests without an answer (%llu timed out), %llu failed "
                   "connects, %llu never sent (open-loop backlog)\n",
                (unsigned long long)l->transport_errors, (unsigned long long)l->timeouts,
                (unsigned long long)l->connect_errors, (unsigned long long)l->backlog);
    if (l->replays_sent)
        fprintf(f, "replays   %llu orders reused an earlier key; %zu answered as replays\n",
                (unsigned long long)l->replays_sent, l->nreplayed);
    fl_crowd_figures cf;
    if (lo->crowd.buyers && fl_crowd_figures_get(l, r->product.stock_initial, &cf) == 0)
        fl_crowd_print(&cf, f);
    if (!r->verified) return;
    const fl_verdict *vd = &r->verdict;
    fprintf(f, "stock     %lld for sale, %lld sold, %lld left; the client holds 201s for %lld "
               "units; lowest stock seen %lld\n",
            vd->initial, vd->sold, vd->available, vd->units_201, vd->min_stock);
    if (r->samples.n)
        fprintf(f, "samples   %llu from the API, %llu from Redis while running\n",
                (unsigned long long)r->samples.n, (unsigned long long)r->samples.redis_n);
    fl_holds_print(l, vd, f);
    fl_verdict_print(vd, f);
}

/* Adds 1 to the integer o[k] (absent: 0). */
static void json_incr(json_t *o, const char *k) {
    json_object_set_new(o, k, json_integer(json_integer_value(json_object_get(o, k)) + 1));
}

/* The holds' part of the JSON: the buyers' decisions, their answers by
 * "<confirm|cancel> <status>[ <code>]" ("none": no answer, "unsent"), and
 * what the verifier found. */
static json_t *fl_run_holds_json(const fl_load_result *l, const fl_holds_verdict *h) {
    static const char *const ACTION[] = { "abandon", "pay", "cancel" };
    json_t *decided = json_pack("{s:i, s:i, s:i}", "pay", 0, "cancel", 0, "abandon", 0);
    json_t *answers = json_object();
    for (size_t i = 0; i < l->ndecisions; i++) {
        const fl_decision_rec *d = &l->decisions[i];
        if (d->action > FL_CANCEL) continue;
        json_incr(decided, ACTION[d->action]);
        if (d->action == FL_ABANDON) continue;
        char k[64];
        const char *what = d->action == FL_PAY ? "confirm" : "cancel";
        if (d->status <= 0) snprintf(k, sizeof k, "%s %s", what, d->status ? "unsent" : "none");
        else snprintf(k, sizeof k, "%s %d%s%s", what, d->status, d->code[0] ? " " : "", d->code);
        json_incr(answers, k);
    }
    return json_pack("{s:i, s:I, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                     "s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:b, s:I}",
                     "hold_seconds", h->hold_seconds, "reserved", (json_int_t)l->ndecisions,
                     "decided", decided, "answers", answers, "confirmed_units",
                     (json_int_t)h->confirmed_units, "settle_ms", (json_int_t)h->settle_ms,
                     "held", (json_int_t)h->held, "confirmed", (json_int_t)h->confirmed,
                     "cancelled", (json_int_t)h->cancelled, "expired", (json_int_t)h->expired,
                     "still_reserved", (json_int_t)h->reserved, "owed", (json_int_t)h->owed,
                     "expiry_lag_ms", "n", (json_int_t)h->lag_n, "p50", (json_int_t)h->lag_p50_ms,
                     "p99", (json_int_t)h->lag_p99_ms, "max", (json_int_t)h->lag_max_ms,
                     "resold", (json_int_t)h->resold, "after_return",
                     (json_int_t)h->after_return, "resale_checked", h->resale_checked,
                     "returned_fields", (json_int_t)h->returned_fields);
}

int fl_run_write_json(const fl_run_opts *o, const fl_run_result *r, const char *path,
                      fl_err *e) {
    const fl_load_result *l = &r->load;
    json_t *status = json_object(), *codes = json_object(), *viol = json_array();
    for (int s = 100; s < 600; s++)
        if (l->status[s]) {
            char k[16];
            snprintf(k, sizeof k, "%d", s);
            json_object_set_new(status, k, json_integer((json_int_t)l->status[s]));
        }
    for (size_t i = 0; i < l->ncodes; i++)
        json_object_set_new(codes, l->codes[i].code, json_integer((json_int_t)l->codes[i].n));
    for (int i = 0; i < r->verdict.nv; i++)
        json_array_append_new(viol, json_pack("{s:s, s:s, s:I}", "vantage", r->verdict.v[i].vantage,
                                              "what", r->verdict.v[i].what, "size",
                                              (json_int_t)r->verdict.v[i].size));
    double secs = l->elapsed_us / 1e6;
    json_t *j = json_pack(
        "{s:s, s:i, s:i, s:f, s:I, s:f, s:I, s:I, s:I, s:o, s:o, s:i, s:{s:I, s:I, s:I, s:I, s:I, s:I}}",
        "sku", r->product.sku, "connections", o->load.connections, "threads", o->load.threads,
        "seconds", secs, "answered", (json_int_t)l->answered, "per_second",
        secs > 0 ? l->answered / secs : 0.0, "transport_errors", (json_int_t)l->transport_errors,
        "created", (json_int_t)l->ncreated, "backlog", (json_int_t)l->backlog, "status", status,
        "codes", codes, "max_open", l->max_open, "latency_us", "p50",
        (json_int_t)fl_hist_percentile(&l->hist, 50), "p90",
        (json_int_t)fl_hist_percentile(&l->hist, 90), "p99",
        (json_int_t)fl_hist_percentile(&l->hist, 99), "p999",
        (json_int_t)fl_hist_percentile(&l->hist, 99.9), "max", (json_int_t)l->hist.max, "mean",
        (json_int_t)fl_hist_mean(&l->hist));
    json_object_set_new(j, "shed", json_integer((json_int_t)l->shed));
    /* From the start to the last 201: a sale that resumed after a fault
     * ends late, one that did not ends at the fault. */
    json_object_set_new(j, "last_created_s", json_real(l->last_created_us / 1e6));
    /* The longest stretch without a 201 (a fault's cost to the sale),
     * the last one up to the end of the run when the product was not
     * heard sold out after it (a sale that stalled and never resumed). */
    json_object_set_new(j, "max_sale_gap_ms", l->max_sale_gap_us >= 0
                                                  ? json_real(l->max_sale_gap_us / 1000.0)
                                                  : json_null());
    json_object_set_new(j, "goodput", json_pack("{s:I, s:f, s:I}", "created", (json_int_t)l->good,
                                                "per_second", secs > 0 ? l->good / secs : 0.0,
                                                "within_us", (json_int_t)o->load.goodput_us));
    json_object_set_new(j, "late", json_pack("{s:I, s:I}", "answers", (json_int_t)l->late,
                                             "after_us", (json_int_t)o->load.late_us));
    fl_crowd_figures cf;
    if (o->load.crowd.buyers && fl_crowd_figures_get(l, r->product.stock_initial, &cf) == 0)
        json_object_set_new(j, "crowd", fl_crowd_json(&cf, &o->load.crowd, l));
    if (r->verified) {
        const fl_verdict *vd = &r->verdict;
        json_object_set_new(j, "verdict",
                            json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "pass",
                                      vd->pass, "initial", (json_int_t)vd->initial, "sold",
                                      (json_int_t)vd->sold, "available", (json_int_t)vd->available,
                                      "units_201", (json_int_t)vd->units_201, "oversold",
                                      (json_int_t)vd->oversold, "lost", (json_int_t)vd->lost,
                                      "min_stock", (json_int_t)vd->min_stock, "orders_without_201",
                                      (json_int_t)vd->orders_without_201, "violations", viol));
        /* 201s the books have no order for: what a lost commit leaves. */
        json_object_set_new(json_object_get(j, "verdict"), "created_without_order",
                            json_integer((json_int_t)vd->created_without_order));
        if (vd->holds.hold_seconds)
            json_object_set_new(j, "holds", fl_run_holds_json(l, &vd->holds));
    } else {
        json_decref(viol);
    }
    int rc = json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    return rc ? fl_errf(e, "cannot write %s", path) : 0;
}
