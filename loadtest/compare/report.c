/* report.c: the comparison's report.json (for tools) and report.html (for
 * people).
 *
 * The HTML is one self-contained file: inline CSS and inline SVG charts, no
 * script or font fetched from anywhere, so it opens the same from a CI
 * artifact, a mail attachment or a laptop offline. Three charts answer the
 * three questions a reader has: how fast is each strategy under ordinary
 * contention (throughput), what does a buyer wait there (latency
 * percentiles, on a log scale because a lock is a hundred times a Lua
 * script), and what each fault does to the unsafe version and to ours
 * (oversold, fenced, how long the sale stood still). Every scene run under
 * a fault is shaded and marked in the table, and comes after the ordinary
 * ones: first the forced interleavings, then the Redis failures (with what
 * each did, in words). The holds scenes come last, with how their holds ended. Then the "choosing a lock" table, one row per lock. The page fits 1400
 * px without horizontal scrolling: long text wraps, charts scale. A few
 * lines of script at the end only measure the drawn marks and the page's
 * width into data- attributes, for the headless-browser test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "loadtest/compare/compare_int.h"

#define W 980                      /* chart width */
#define LABEL_W 270                /* room for scene names */
#define ROW_H 24
#define TOP 34
#define RIGHT 80

/* -------------------------------------------------------------- report.json */

static json_t *probe_json(const fl_probe *p, int kind) {
    char brief[160];
    fl_probe_fmt(p, kind, brief, sizeof brief);
    json_t *j = json_pack("{s:b, s:s, s:s}", "measured", p->ran, "brief", brief, "note", p->note);
    if (!p->ran) return j;
    json_object_update_new(j, json_pack("{s:I, s:I, s:I, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "down_ms",
                                        (json_int_t)p->down_ms, "refused_ms",
                                        (json_int_t)p->refused_ms, "recover_ms",
                                        (json_int_t)p->recover_ms, "still_refusing",
                                        p->still_refusing, "waited_ms",
                                        (json_int_t)p->waited_ms, "ok", (json_int_t)p->ok,
                                        "refused", (json_int_t)p->refused, "fenced",
                                        (json_int_t)p->fenced, "oversold",
                                        (json_int_t)p->oversold, "lost", (json_int_t)p->lost,
                                        "pass", p->pass));
    return j;
}

static json_t *num_or_null(int have, double v) { return have ? json_real(v) : json_null(); }

/* A holds scene's holds: what the buyers were told to do, and how the
 * holds ended (the verifier's figures; holds = units at quantity 1). */
static json_t *fl_report_holds_json(const fl_scene_result *s) {
    const fl_holds_verdict *h = &s->verdict.holds;
    return json_pack("{s:i, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I, "
                     "s:{s:I, s:I, s:I, s:I}, s:I}",
                     "hold_seconds", s->sc.hold_seconds, "pay", s->sc.pay, "cancel",
                     s->sc.cancel, "placed", (json_int_t)s->created, "confirmed",
                     (json_int_t)h->confirmed, "cancelled", (json_int_t)h->cancelled, "expired",
                     (json_int_t)h->expired, "still_reserved", (json_int_t)h->reserved,
                     "returned", (json_int_t)(h->cancelled + h->expired), "resold",
                     (json_int_t)h->resold, "resale_checked", h->resale_checked, "after_return",
                     (json_int_t)h->after_return, "expiry_lag_ms", "n", (json_int_t)h->lag_n,
                     "p50", (json_int_t)h->lag_p50_ms, "p99", (json_int_t)h->lag_p99_ms, "max",
                     (json_int_t)h->lag_max_ms, "settle_ms", (json_int_t)h->settle_ms);
}

static json_t *locks_json(const fl_lock_row *l, int nl) {
    json_t *a = json_array();
    for (int i = 0; i < nl; i++) {
        const fl_lock_row *r = &l[i];
        json_t *j = json_pack(
            "{s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:{s:s, s:I, s:o, s:o}, s:o, s:o, s:o, s:o, "
            "s:o}",
            "strategy", r->strategy, "lock_server", r->server, "orders_per_s_1seg",
            num_or_null(r->have1, r->ops1), "orders_per_s_8seg", num_or_null(r->have8, r->ops8),
            "p50_us", num_or_null(r->have1, (double)r->p50_us), "p99_us",
            num_or_null(r->have1, (double)r->p99_us), "p50_us_8seg",
            num_or_null(r->have8, (double)r->p50_8_us), "p99_us_8seg",
            num_or_null(r->have8, (double)r->p99_8_us), "handoff", "source",
            "the service's flashsale_lock_handoff_seconds over the 1-segment contention scene "
            "(release -> next acquire in the same process): mean = sum/count, p50 interpolated "
            "in its buckets",
            "count", (json_int_t)r->handoff_n, "mean_us",
            num_or_null(r->handoff_n > 0, r->handoff_mean_us), "p50_us",
            num_or_null(r->handoff_n > 0, r->handoff_p50_us), "kill_holder",
            probe_json(&r->kill, FL_PROBE_KILL), "server_restart",
            probe_json(&r->restart, FL_PROBE_RESTART), "server_data_lost",
            probe_json(&r->wipe, FL_PROBE_WIPE), "failover_to_replica",
            probe_json(&r->failover, FL_PROBE_FAILOVER), "pause_past_lease",
            probe_json(&r->fence, FL_PROBE_FENCE));
        json_t *fair = json_object();
        for (int k = 0; k < 2; k++)
            json_object_set_new(fair, k ? "stream" : "queue",
                                r->fair_have[k]
                                    ? json_pack("{s:I, s:I, s:i, s:f}", "out_of_order",
                                                (json_int_t)r->fair_oo[k], "pairs",
                                                (json_int_t)r->fair_pairs[k], "starved",
                                                r->fair_starved[k], "wait_max_ms",
                                                r->fair_wait_max_ms[k])
                                    : json_null());
        json_object_set_new(j, "fairness", fair);
        json_array_append_new(a, j);
    }
    return a;
}

int fl_report_json(const fl_compare_opts *o, const fl_scene_result *r, int n,
                   const fl_lock_row *l, int nl, const char *path, fl_err *e) {
    json_t *scenes = json_array();
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        json_t *v = json_array();
        for (int k = 0; k < s->verdict.nv; k++)
            json_array_append_new(v, json_pack("{s:s, s:s, s:I}", "vantage", s->verdict.v[k].vantage,
                                               "what", s->verdict.v[k].what, "size",
                                               (json_int_t)s->verdict.v[k].size));
        json_t *j = json_pack(
            "{s:s, s:i, s:i, s:s, s:b, s:b, s:I, s:i, s:i, s:f, s:b}", "strategy", s->sc.strategy,
            "segments", s->sc.segments, "instances", s->sc.instances, "condition",
            s->sc.condition, "unsafe", s->sc.unsafe, "fault", s->sc.fault, "stock",
            (json_int_t)s->sc.stock,
            "cs_delay_ms", s->sc.cs_delay_ms, "lock_ttl_ms", s->sc.lock_ttl_ms, "duration_s",
            s->sc.duration_s, "ran", s->ran);
        static const char *const GROUPS[FL_GROUPS] = { "contention", "forced", "redis-failure",
                                                       "holds", "fairness", "crowd",
                                                       "between-hosts" };
        json_object_set_new(j, "group", json_string(GROUPS[s->sc.group]));
        json_object_set_new(j, "fault_name", s->sc.fault_name ? json_string(s->sc.fault_name)
                                                              : json_null());
        json_object_set_new(j, "failure", s->sc.failure ? json_string(fl_failure_name(s->sc.failure))
                                                        : json_null());
        json_object_set_new(j, "between", s->sc.between ? json_string(fl_between_name(s->sc.between))
                                                        : json_null());
        if (s->sc.between && s->ran) {
            json_object_set_new(j, "detail", json_string(s->detail));
            json_object_set_new(j, "as_expected_why", json_string(s->forced_why));
        }
        if (s->sc.failure && s->ran) {
            json_object_set_new(j, "detail", json_string(s->detail));
            json_object_set_new(j, "recover_ms", s->recover_ms >= 0
                                                     ? json_integer((json_int_t)s->recover_ms)
                                                     : json_null());
        }
        if (!s->ran) {
            json_object_set_new(j, "note", json_string(s->note));
            json_decref(v);
        } else {
            json_object_update_new(
                j, json_pack("{s:f, s:f, s:I, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I}, "
                             "s:{s:I, s:I, s:I, s:I}, s:b, s:s, s:b, s:I, s:I, s:I, s:I, s:I, "
                             "s:I, s:I, s:o}",
                             "orders_per_s", s->orders_per_s, "answers_per_s", s->answers_per_s,
                             "answered", (json_int_t)s->answered, "created",
                             (json_int_t)s->created, "transport_errors",
                             (json_int_t)s->transport_errors, "latency_us", "p50",
                             (json_int_t)s->p50_us, "p90", (json_int_t)s->p90_us, "p99",
                             (json_int_t)s->p99_us, "p999", (json_int_t)s->p999_us, "max",
                             (json_int_t)s->max_us, "status", "201", (json_int_t)s->status_201,
                             "409", (json_int_t)s->status_409, "429", (json_int_t)s->status_429,
                             "5xx", (json_int_t)s->status_5xx, "pass", s->verdict.pass,
                             "verdict", s->verdict_line, "as_expected", s->as_expected,
                             "initial", (json_int_t)s->verdict.initial, "sold",
                             (json_int_t)s->verdict.sold, "available",
                             (json_int_t)s->verdict.available, "oversold",
                             (json_int_t)s->verdict.oversold, "min_stock",
                             (json_int_t)s->verdict.min_stock, "lost",
                             (json_int_t)s->verdict.lost, "orders_without_201",
                             (json_int_t)s->verdict.orders_without_201, "violations", v));
            json_object_set_new(j, "fenced", json_integer((json_int_t)s->fenced));
            json_object_set_new(j, "created_without_order",
                                json_integer((json_int_t)s->verdict.created_without_order));
            json_object_set_new(j, "sale_gap_ms", s->sale_gap_us >= 0
                                                      ? json_real(s->sale_gap_us / 1000.0)
                                                      : json_null());
            if (s->sc.cs_overlap)
                json_object_set_new(j, "forced", json_pack("{s:i, s:s, s:I, s:I, s:s}", "overlap",
                                                           s->sc.cs_overlap, "expect",
                                                           s->sc.expect_force == FL_FORCE_MET
                                                               ? "met" : "alone",
                                                           "met", (json_int_t)s->forced_met,
                                                           "alone", (json_int_t)s->forced_alone,
                                                           "why", s->forced_why));
            if (s->sc.hold_seconds) json_object_set_new(j, "holds", fl_report_holds_json(s));
            if (s->sc.group == FL_GROUP_FAIRNESS) {
                json_t *order = json_array();
                for (int k = 0; k < s->fair_served; k++)
                    json_array_append_new(order, json_integer(s->fair_order[k]));
                json_object_set_new(
                    j, "fairness",
                    json_pack("{s:s, s:i, s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:i, s:o}", "scene",
                              s->sc.fair_scene == FL_FAIR_STREAM ? "stream" : "queue",
                              "buyers", s->sc.waiters, "gap_ms", s->sc.gap_ms, "hold_ms",
                              s->sc.cs_delay_ms, "served", s->fair_served, "pairs",
                              (json_int_t)s->fair_pairs, "out_of_order",
                              (json_int_t)s->fair_out_of_order, "wait_median_ms",
                              s->fair_wait_median_ms, "wait_max_ms", s->fair_wait_max_ms,
                              "starved", s->fair_starved, "service_order", order));
            }
            if (s->sc.group == FL_GROUP_CROWD) {
                const fl_crowd_figures *c = &s->crowd;
                json_t *bins = json_array();
                for (int k = 0; k < FL_CROWD_BINS; k++)
                    json_array_append_new(bins, json_pack("[I, I, I]",
                                                          (json_int_t)s->crowd_bins[k][0],
                                                          (json_int_t)s->crowd_bins[k][1],
                                                          (json_int_t)s->crowd_bins[k][2]));
                json_object_set_new(
                    j, "crowd",
                    json_pack("{s:b, s:i, s:f, s:I, s:i, s:i, s:i, s:f, s:I, s:I, s:f, s:f, "
                              "s:f, s:f, s:i, s:f, s:f, s:f, s:o}",
                              "waiting_room", s->sc.crowd_room, "buyers", c->buyers,
                              "ramp_s", s->sc.crowd_ramp_s, "stock", (json_int_t)c->stock,
                              "bots", c->bots, "winners", c->winners, "bot_winners",
                              c->bot_winners, "first_s_share", c->first_share, "pairs",
                              (json_int_t)c->pairs, "out_of_order", (json_int_t)c->out_of_order,
                              "bot_ratio", c->bot_ratio, "final_p50_ms", c->final_p50_us / 1e3,
                              "final_p99_ms", c->final_p99_us / 1e3, "final_after_last_unit_ms",
                              c->final_after_last_unit_us / 1e3, "no_final", c->no_final,
                              "requests_median", c->requests_median, "requests_p99",
                              c->requests_p99, "units_per_s", c->units_per_s,
                              "by_arrival_bins", bins));
                json_t *cj = json_object_get(j, "crowd");
                if (cj) {
                    json_object_set_new(cj, "first_place_share",
                                        c->first_place_share >= 0 ? json_real(c->first_place_share)
                                                                  : json_null());
                    json_object_set_new(cj, "long_polls", json_integer((json_int_t)c->polls));
                }
            }
            if (s->handoff_n)
                json_object_set_new(j, "handoff", json_pack("{s:I, s:f, s:f}", "count",
                                                            (json_int_t)s->handoff_n, "mean_us",
                                                            s->handoff_mean_us, "p50_us",
                                                            s->handoff_p50_us));
        }
        json_array_append_new(scenes, j);
    }
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *root = json_pack("{s:s, s:i, s:{s:i, s:i, s:i, s:i, s:i, s:f, s:f}, s:o, s:o}",
                             "generated_at", when, "cpus", (int)sysconf(_SC_NPROCESSORS_ONLN),
                             "load", "connections", o->connections, "threads", o->threads, "users",
                             (int)o->users, "quantity_min", o->qty_min, "quantity_max", o->qty_max,
                             "duration_s", o->duration_s, "pause_duration_s",
                             o->pause_duration_s, "scenes", scenes, "locks", locks_json(l, nl));
    int rc = root ? json_dump_file(root, path, JSON_INDENT(2)) : -1;
    json_decref(root);
    return rc ? fl_errf(e, "cannot write %s", path) : 0;
}

/* -------------------------------------------------------------- report.html */

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void scene_name(const fl_scene_result *s, char *out, size_t len) {
    snprintf(out, len, "%s%s \xc2\xb7 %d seg%s%s%s", s->sc.fault ? "\xe2\x9a\xa1 " : "",
             s->sc.strategy, s->sc.segments, s->sc.segments == 1 ? "" : "s",
             s->sc.instances > 1 ? " \xc2\xb7 2 instances" : "",
             s->sc.hold_seconds ? " \xc2\xb7 holds" : "");
}

/* The colour says what happened: green held, red oversold (as it should,
 * for an unsafe one), amber did not do what was expected. */
static const char *colour(const fl_scene_result *s) {
    if (!s->as_expected) return "#e08a00";
    return s->verdict.pass ? "#2e7d32" : "#c62828";
}

/* A "nice" upper bound for a linear axis. */
static double nice_max(double v) {
    if (v <= 0) return 1;
    double p = pow(10, floor(log10(v)));
    double steps[] = { 1, 2, 2.5, 5, 10 };
    for (int i = 0; i < 5; i++)
        if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
}

static int chart_height(int rows) { return TOP + rows * ROW_H + 30; }

static void chart_open(FILE *f, const char *id, const char *title, int rows) {
    fprintf(f, "<figure><figcaption>");
    esc(f, title);
    fprintf(f, "</figcaption>\n<svg class=\"chart\" id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
               "viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\">\n",
            id, W, chart_height(rows), W, chart_height(rows));
}

static void row_label(FILE *f, int row, const fl_scene_result *s) {
    char name[96];
    scene_name(s, name, sizeof name);
    if (s->sc.fault)
        fprintf(f, "<rect class=\"band\" x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\"><title>ran under "
                   "an injected fault: ", TOP + row * ROW_H, W, ROW_H);
    if (s->sc.fault) {
        esc(f, s->sc.condition);
        fprintf(f, "</title></rect>\n");
    }
    fprintf(f, "<text class=\"lbl\" x=\"%d\" y=\"%d\" text-anchor=\"end\">", LABEL_W - 10,
            TOP + row * ROW_H + ROW_H / 2 + 4);
    esc(f, name);
    fprintf(f, "</text>\n");
}

/* Vertical grid lines and their labels for a linear axis 0..max. */
static void linear_axis(FILE *f, int rows, double max, const char *unit) {
    int plot = W - LABEL_W - RIGHT;
    for (int k = 0; k <= 4; k++) {
        double x = LABEL_W + plot * k / 4.0;
        double v = max * k / 4.0;
        fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x,
                TOP - 6, x, TOP + rows * ROW_H);
        fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g%s</text>\n",
                x, TOP - 12, v, k == 4 ? unit : "");
    }
}

static void chart_throughput(FILE *f, const fl_scene_result *r, int n) {
    double max = 0;
    for (int i = 0; i < n; i++)
        if (r[i].ran && r[i].orders_per_s > max) max = r[i].orders_per_s;
    max = nice_max(max);
    chart_open(f, "throughput", "Throughput: orders confirmed (201) per second while the stock lasted", n);
    linear_axis(f, n, max, "/s");
    int plot = W - LABEL_W - RIGHT;
    for (int i = 0; i < n; i++) {
        row_label(f, i, &r[i]);
        int y = TOP + i * ROW_H + 4;
        if (!r[i].ran) {
            fprintf(f, "<text class=\"note\" x=\"%d\" y=\"%d\">skipped</text>\n", LABEL_W + 4, y + 12);
            continue;
        }
        double w = plot * r[i].orders_per_s / max;
        if (w < 1) w = 1;
        fprintf(f, "<rect class=\"mark\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
                   "fill=\"%s\"><title>%.0f orders/s while the stock lasted; %.0f answers/s "
                   "in all</title></rect>\n",
                LABEL_W, y, w, ROW_H - 8, colour(&r[i]), r[i].orders_per_s, r[i].answers_per_s);
        fprintf(f, r[i].orders_per_s < 10 ? "<text class=\"val\" x=\"%.1f\" y=\"%d\">%.1f</text>\n"
                                           : "<text class=\"val\" x=\"%.1f\" y=\"%d\">%.0f</text>\n",
                LABEL_W + w + 5, y + 12, r[i].orders_per_s);
    }
    fprintf(f, "</svg></figure>\n");
}

/* x of a latency on the log axis lo..hi (us). */
static double log_x(double us, double lo, double hi) {
    if (us < lo) us = lo;
    int plot = W - LABEL_W - RIGHT;
    return LABEL_W + plot * (log10(us) - log10(lo)) / (log10(hi) - log10(lo));
}

static void chart_latency(FILE *f, const fl_scene_result *r, int n) {
    double lo = 100, hi = 1e6;      /* 100 us .. 1 s, widened to fit */
    for (int i = 0; i < n; i++) {
        if (!r[i].ran) continue;
        while (r[i].p50_us && (double)r[i].p50_us < lo && lo > 1) lo /= 10;
        while ((double)r[i].p999_us > hi) hi *= 10;
    }
    chart_open(f, "latency",
               "Latency percentiles (log scale): \xe2\x97\x8f p50, | p90, \xe2\x97\x86 p99, | p99.9 (labelled: p99)",
               n);
    for (double t = lo; t <= hi * 1.01; t *= 10) {
        char lab[16];
        fl_fmt_us((uint64_t)t, lab, sizeof lab);
        double x = log_x(t, lo, hi);
        fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, TOP - 6,
                x, TOP + n * ROW_H);
        fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x,
                TOP - 12, lab);
    }
    for (int i = 0; i < n; i++) {
        row_label(f, i, &r[i]);
        if (!r[i].ran) continue;
        double cy = TOP + i * ROW_H + ROW_H / 2.0;
        double x50 = log_x((double)r[i].p50_us, lo, hi), x90 = log_x((double)r[i].p90_us, lo, hi);
        double x99 = log_x((double)r[i].p99_us, lo, hi), x999 = log_x((double)r[i].p999_us, lo, hi);
        const char *c = colour(&r[i]);
        char a[16], b[16], d[16], g[16];
        fl_fmt_us(r[i].p50_us, a, sizeof a);
        fl_fmt_us(r[i].p90_us, b, sizeof b);
        fl_fmt_us(r[i].p99_us, d, sizeof d);
        fl_fmt_us(r[i].p999_us, g, sizeof g);
        fprintf(f, "<g><title>p50 %s, p90 %s, p99 %s, p99.9 %s</title>\n", a, b, d, g);
        fprintf(f, "<line class=\"mark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"%s\" stroke-width=\"2\" opacity=\"0.5\"/>\n", x50, cy, x999 + 0.5, cy, c);
        fprintf(f, "<circle class=\"mark\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"/>\n", x50, cy, c);
        fprintf(f, "<line class=\"mark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"%s\" stroke-width=\"2\"/>\n", x90, cy - 5, x90, cy + 5, c);
        fprintf(f, "<rect class=\"mark\" x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"%s\" "
                   "transform=\"rotate(45 %.1f %.1f)\"/>\n", x99 - 4, cy - 4, c, x99, cy);
        fprintf(f, "<line class=\"mark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"%s\" stroke-width=\"2\"/>\n", x999, cy - 7, x999, cy + 7, c);
        fprintf(f, "<text class=\"val\" x=\"%.1f\" y=\"%.1f\">%s</text></g>\n", x999 + 8, cy + 4, d);
    }
    fprintf(f, "</svg></figure>\n");
}

/* ------------------------------------------------------------ the faults
 *
 * A fault scene's orders/s says nothing (a lease scene sells a unit per
 * lease on purpose), so the faults get a chart of their own: per fault, the
 * unsafe version and ours side by side, each by what it shows -- units
 * oversold, stale writes the fence refused, and the longest the sale
 * stood still (a Redis failure: from the kill of the primary to the next
 * 201; a forced scene: the longest time between two 201s). */

#define PANEL_GAP 16
#define PANELS 3

/* x of v on panel k's log axis 0..max (log10(1 + v): 0 stays at 0). */
static double panel_x(int k, double v, double max) {
    double pw = (double)(W - LABEL_W - RIGHT / 4 - (PANELS - 1) * PANEL_GAP) / PANELS;
    double x0 = LABEL_W + k * (pw + PANEL_GAP);
    if (v < 0) v = 0;
    return x0 + pw * log10(1 + v) / log10(1 + max);
}

static int is_fault(const fl_scene_result *s) {
    return s->sc.group == FL_GROUP_PAUSE || s->sc.group == FL_GROUP_FAILURE ||
           s->sc.group == FL_GROUP_HOSTS;
}

/* The scene's stall in ms, or -1 when not measured. */
static double stall_ms(const fl_scene_result *s) {
    if (s->sc.group == FL_GROUP_FAILURE) return s->recover_ms >= 0 ? (double)s->recover_ms : -1;
    return s->sale_gap_us >= 0 ? s->sale_gap_us / 1000.0 : -1;
}

static void fault_bar(FILE *f, int k, int y, double v, double max, const char *fill,
                      const char *text, const char *title) {
    double x0 = panel_x(k, 0, max), x = panel_x(k, v, max);
    double w = x - x0 < 2 ? 2 : x - x0;
    fprintf(f, "<rect class=\"mark\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\">"
               "<title>", x0, y, w, ROW_H - 8, fill);
    esc(f, title);
    fprintf(f, "</title></rect>\n<text class=\"val\" x=\"%.1f\" y=\"%d\">", x0 + w + 4, y + 12);
    esc(f, text);
    fprintf(f, "</text>\n");
}

static void chart_faults(FILE *f, const fl_scene_result *r, int n) {
    double max_over = 10, max_fenced = 10, max_ms = 1000;
    int rows = 0;
    const char *last = NULL;
    for (int i = 0; i < n; i++) {
        if (!is_fault(&r[i])) continue;
        const char *name = r[i].sc.fault_name ? r[i].sc.fault_name : r[i].sc.condition;
        if (!last || strcmp(last, name)) rows++;
        last = name;
        rows++;
        if (!r[i].ran) continue;
        /* Room past the longest bar for its figure. */
        while ((double)r[i].verdict.oversold * 2 > max_over) max_over *= 10;
        while ((double)r[i].fenced * 2 > max_fenced) max_fenced *= 10;
        while (stall_ms(&r[i]) * 2 > max_ms) max_ms *= 10;
    }
    if (!rows) return;
    chart_open(f, "faults", "The faults, the unsafe version beside ours: units oversold, stale "
               "writes refused by the fence, and the longest the sale stood still (log scales)",
               rows);
    static const char *const HEAD[PANELS] = { "oversold (units)", "fenced (writes)",
                                              "sale stood still" };
    for (int k = 0; k < PANELS; k++)
        fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\">%s</text>\n", panel_x(k, 0, 1),
                TOP - 12, HEAD[k]);
    int row = 0;
    last = NULL;
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (!is_fault(s)) continue;
        const char *name = s->sc.fault_name ? s->sc.fault_name : s->sc.condition;
        if (!last || strcmp(last, name)) {
            fprintf(f, "<text class=\"lbl\" x=\"8\" y=\"%d\" font-weight=\"600\">",
                    TOP + row * ROW_H + ROW_H / 2 + 4);
            esc(f, name);
            fprintf(f, "</text>\n");
            row++;
        }
        last = name;
        row_label(f, row, s);
        int y = TOP + row * ROW_H + 4;
        row++;
        if (!s->ran) {
            fprintf(f, "<text class=\"note\" x=\"%d\" y=\"%d\">skipped</text>\n", LABEL_W + 4,
                    y + 12);
            continue;
        }
        char text[64], title[200];
        long long ov = s->verdict.oversold;
        snprintf(text, sizeof text, ov ? "%lld" : "0 \xe2\x9c\x93", ov);
        snprintf(title, sizeof title, "%s: %lld units oversold%s", s->sc.strategy, ov,
                 s->as_expected ? "" : " (not what was expected)");
        fault_bar(f, 0, y, (double)ov, max_over, colour(s), text, title);
        snprintf(text, sizeof text, "%llu", (unsigned long long)s->fenced);
        snprintf(title, sizeof title, "%s: %llu stale writes refused by the fence (429)",
                 s->sc.strategy, (unsigned long long)s->fenced);
        fault_bar(f, 1, y, (double)s->fenced, max_fenced, s->fenced ? "#1565c0" : "#9e9e9e",
                  text, title);
        double ms = stall_ms(s);
        if (ms < 0) {
            fprintf(f, "<text class=\"note\" x=\"%.1f\" y=\"%d\">-</text>\n",
                    panel_x(2, 0, max_ms) + 4, y + 12);
            continue;
        }
        fl_fmt_us((uint64_t)(ms * 1000), text, sizeof text);
        snprintf(title, sizeof title, s->sc.group == FL_GROUP_FAILURE
                                          ? "%s: the next 201 came %s after the kill"
                                          : "%s: at most %s between two 201s",
                 s->sc.strategy, text);
        fault_bar(f, 2, y, ms, max_ms, "#6d4c41", text, title);
    }
    fprintf(f, "</svg></figure>\n");
}

static void table(FILE *f, const fl_scene_result *r, int n) {
    fprintf(f, "<table class=\"scenes\"><thead><tr><th>strategy</th><th>seg&shy;ments</th>"
               "<th>inst&shy;ances</th><th>orders/s</th><th>answers/s</th><th>p50</th><th>p99</th>"
               "<th>sold</th><th>over&shy;sold</th><th>min stock</th><th>lost</th><th>verdict</th>"
               "</tr></thead><tbody>\n");
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        static const char *const HEADS[FL_GROUPS] = {
            "Ordinary contention: no fault injected",
            "\xe2\x9a\xa1 Forced interleavings (fault injection): a holder waits inside its "
            "critical section until a second holder is inside with the same read (or a bound): "
            "at once without a lock that excludes it, after the lease with one that runs out, "
            "never with one that holds; the scene checks the service's count of such meetings",
            "\xe2\x9a\xa1 Redis failures (" FL_LOCK_ARTICLE " \xc2\xa7" "4.2), each forced at "
            "the moment "
            "that breaks a lock: a failover to a replica that missed the last writes, a Redlock "
            "server's clock jumping, a Redlock server losing its last AOF second, a Redlock "
            "member failing over; the unsafe version, then ours",
            "Holds: each order holds its units until paid, cancelled or expired; the stock "
            "sells out and the units that come back are sold again within the scene",
            "Fairness (" FL_LOCK_ARTICLE " \xc2\xa7" "6.1): buyers arrive at a lock in a known "
            "order, on "
            "two instances taking turns (one for local), each holding the lock a while: who is "
            "served in turn, who overtakes, who starves",
            "A crowd past the order path's capacity: thousands of buyers in a second, a fifth "
            "of them bots that retry at once, the rest waiting as told; the waiting room off "
            "(a lottery: whoever retries at the right moment) and on (a queue: the first to "
            "come, first); orders/s here is units sold a second",
            "\xe2\x9a\xa1 Between hosts: each scene on a deployment of its own, a network "
            "namespace per host (Redis primary and replica, 3 sentinels, two PostgreSQL nodes "
            "run by Patroni with etcd, HAProxy, 3 instances, the load), the fault cut in the "
            "router between them: a Redis split brain (the unsafe version, then ours); "
            "Patroni's leader killed and an asynchronous replica promoted (unsafe: it lacks "
            "acknowledged orders), then with synchronous_mode (ours); the leader cut from etcd "
            "and its standby; a planned switchover" };
        if (i == 0 || s->sc.group != r[i - 1].sc.group)
            fprintf(f, "<tr class=\"group\"><td colspan=\"12\">%s</td></tr>\n",
                    HEADS[s->sc.group]);
        fprintf(f, "<tr%s><td>", s->sc.fault ? " class=\"fault\"" : "");
        if (s->sc.fault) fprintf(f, "\xe2\x9a\xa1 ");
        esc(f, s->sc.strategy);
        fprintf(f, "<br><small>%s", s->sc.fault ? "FAULT: " : "");
        esc(f, s->sc.condition);
        fprintf(f, "</small></td><td>%d</td><td>%d</td>", s->sc.segments, s->sc.instances);
        if (!s->ran) {
            fprintf(f, "<td colspan=\"9\" class=\"v skip\">");
            esc(f, s->note);
            fprintf(f, "</td></tr>\n");
            continue;
        }
        char p50[16], p99[16], rate[24];
        fl_fmt_us(s->p50_us, p50, sizeof p50);
        fl_fmt_us(s->p99_us, p99, sizeof p99);
        snprintf(rate, sizeof rate, s->orders_per_s < 10 ? "%.1f" : "%.0f", s->orders_per_s);
        fprintf(f, "<td>%s</td><td>%.0f</td><td>%s</td><td>%s</td><td>%lld</td><td>%lld</td>"
                   "<td>%lld</td><td>%lld</td><td class=\"v\" style=\"color:%s\">",
                rate, s->answers_per_s, p50, p99, s->verdict.sold, s->verdict.oversold,
                s->verdict.min_stock, s->verdict.lost, colour(s));
        esc(f, s->verdict_line);
        if (!s->as_expected) fprintf(f, " (unexpected)");
        char brief[400];
        fl_holds_brief(s, brief, sizeof brief);
        const char *more = s->detail[0] ? s->detail : brief;
        if (more[0]) {
            fprintf(f, "<br><small>");
            esc(f, more);
            fprintf(f, "</small>");
        }
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</tbody></table>\n");
}

static void fmt_rate(int have, double v, char *out, size_t len) {
    if (!have) snprintf(out, len, "-");
    else snprintf(out, len, v < 10 ? "%.1f" : "%.0f", v);
}

static void probe_cell(FILE *f, const fl_probe *p, int kind) {
    char brief[160];
    fl_probe_fmt(p, kind, brief, sizeof brief);
    int bad = p->ran && (p->oversold > 0 || !p->pass);
    fprintf(f, "<td class=\"p%s\"><b>", bad ? " bad" : !p->ran ? " na" : "");
    esc(f, brief);
    fprintf(f, "</b><br><small>");
    esc(f, p->note);
    fprintf(f, "</small></td>");
}

static void lock_table(FILE *f, const fl_lock_row *l, int nl) {
    fprintf(f, "<h2 id=\"choosing\">Choosing a lock</h2>\n<p class=\"sub\">Every figure measured in "
               "this run, against real servers started for it. Orders/s and latency: the ordinary "
               "contention scenes above. Hand-off: release &rarr; next holder in the same process, "
               "from the service's <code>flashsale_lock_handoff_seconds</code> over the 1-segment "
               "scene (mean; p50 interpolated in its buckets). Kill -9: two instances, the holder "
               "killed with SIGKILL inside its critical section, time until the other instance's "
               "next order for that SKU succeeds. Restart / data lost: the lock server taken down "
               "and brought back (with its data, or empty) under a light load; refused = 429, 5xx "
               "and transport errors from the fault on. Failover to a replica: the Redis failures "
               "scenes below, for the locks whose server can be a Sentinel-watched Redis "
               "(<code>lock</code>: the stock's Redis; <code>redlock</code>: one member); the time "
               "is from the kill of the primary to the next 201. Past its lease: the forced "
               "scene below, held past its lease until a second holder came in.</p>\n");
    fprintf(f, "<table class=\"locks\"><colgroup><col style=\"width:9%%\"><col style=\"width:6%%\">"
               "<col style=\"width:6%%\"><col style=\"width:8%%\"><col style=\"width:7%%\">"
               "<col style=\"width:7%%\">"
               "<col style=\"width:12%%\"><col style=\"width:12%%\"><col style=\"width:12%%\">"
               "<col style=\"width:10.5%%\"><col style=\"width:10.5%%\"></colgroup><thead><tr>"
               "<th>lock</th><th>orders/s 1 seg</th>"
               "<th>orders/s 8 segs</th><th>p50 / p99 (1 seg)</th><th>hand-off</th>"
               "<th>fair (out of order: queue, stream)</th><th>holder killed (-9)</th><th>server restarted</th><th>server lost its data</th>"
               "<th>failover to a replica</th><th>past its lease</th></tr></thead><tbody>\n");
    for (int i = 0; i < nl; i++) {
        const fl_lock_row *r = &l[i];
        char a[24], b[24], p50[16], p99[16], ho[96];
        fmt_rate(r->have1, r->ops1, a, sizeof a);
        fmt_rate(r->have8, r->ops8, b, sizeof b);
        fl_fmt_us(r->p50_us, p50, sizeof p50);
        fl_fmt_us(r->p99_us, p99, sizeof p99);
        if (r->handoff_n) {
            char m[16], h50[16];
            fl_fmt_us((uint64_t)r->handoff_mean_us, m, sizeof m);
            fl_fmt_us((uint64_t)r->handoff_p50_us, h50, sizeof h50);
            snprintf(ho, sizeof ho, "mean %s<br><small>p50 ~%s, n=%llu</small>", m, h50,
                     (unsigned long long)r->handoff_n);
        } else snprintf(ho, sizeof ho, "-");
        fprintf(f, "<tr><td><b>");
        esc(f, r->strategy);
        fprintf(f, "</b><br><small>");
        esc(f, r->server);
        char fair[48];
        fl_fair_fmt(r, fair, sizeof fair);
        fprintf(f, "</small></td><td>%s</td><td>%s</td><td>%s<br>%s</td><td>%s</td>"
                   "<td><a href=\"#fairness\">%s</a></td>", a, b, r->have1 ? p50 : "-",
                r->have1 ? p99 : "", ho, fair);
        probe_cell(f, &r->kill, FL_PROBE_KILL);
        probe_cell(f, &r->restart, FL_PROBE_RESTART);
        probe_cell(f, &r->wipe, FL_PROBE_WIPE);
        probe_cell(f, &r->failover, FL_PROBE_FAILOVER);
        probe_cell(f, &r->fence, FL_PROBE_FENCE);
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</tbody></table>\n");
}

/* The fairness scenes, drawn: for each lock and scene, every buyer served
 * at (its place in the service order, its place in the arrival order). A
 * lock that serves in arrival order draws the diagonal; each point off it
 * is a buyer who overtook, or was overtaken. */
static void chart_fairness(FILE *f, const fl_scene_result *r, int n) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= r[i].sc.group == FL_GROUP_FAIRNESS && r[i].ran;
    if (!any) return;
    fprintf(f, "<h2 id=\"fairness\">Fairness: arrival order against service order</h2>\n"
               "<p class=\"sub\">" FL_LOCK_ARTICLE " \xc2\xa7" "6.1: \"when the lock wakes up, it "
               "does so in "
               "sequence\". Buyers arrive at a lock one after another, on two instances taking "
               "turns (<code>local</code>: one), each holding the lock a while once it has it. "
               "Queue: they come close together, a long line forms; stream: they come a little "
               "faster than the lock is handed on. Each dot is a buyer: across, when it was "
               "served; down, when it came. In order is the diagonal.</p>\n<div class=\"fair\">");
    enum { S = 150, M = 18 };
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_FAIRNESS || !s->ran) continue;
        int w = s->sc.waiters > 1 ? s->sc.waiters - 1 : 1;
        /* Indigo, not red: red is for oversold. */
        const char *dot = s->fair_out_of_order || s->fair_starved ? "#3f51b5" : "#2e7d32";
        fprintf(f, "<figure class=\"fairone\"><svg width=\"%d\" height=\"%d\" "
                   "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>", S + 2 * M,
                S + 2 * M);
        esc(f, s->sc.strategy);
        fprintf(f, " %s: %ld of %ld pairs out of order</title>", fl_fair_scene_name(s->sc.fair_scene),
                s->fair_out_of_order, s->fair_pairs);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" "
                   "stroke=\"#d5d9dc\"/><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                   "stroke=\"#b0b8bf\" stroke-dasharray=\"3 3\"/>",
                M, M, S, S, M, M, M + S, M + S);
        for (int k = 0; k < s->fair_served; k++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.2\" fill=\"%s\"/>",
                    M + (double)k * S / w, M + (double)s->fair_order[k] * S / w, dot);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#5c6670\">served "
                   "&rarr;</text><text x=\"%d\" y=\"6\" font-size=\"10\" fill=\"#5c6670\" "
                   "transform=\"rotate(90 %d 6)\">came &rarr;</text></svg><figcaption><b>",
                M, S + 2 * M - 4, M - 12, M - 12);
        esc(f, s->sc.strategy);
        fprintf(f, "</b> %s &middot; %d inst.<br>%ld of %ld pairs out of order<br>wait p50 "
                   "%.0f ms, max %.0f ms%s</figcaption></figure>",
                fl_fair_scene_name(s->sc.fair_scene), s->sc.instances, s->fair_out_of_order,
                s->fair_pairs, s->fair_wait_median_ms, s->fair_wait_max_ms,
                s->fair_starved ? ", some starved" : "");
    }
    fprintf(f, "</div>\n");
}

/* The crowd scenes, drawn: the buyers by arrival rank (first to come at
 * the left, in FL_CROWD_BINS bins), each bin's bar the share of its buyers
 * who got a unit (bots' part darker). A queue fills the first bars and
 * leaves the rest empty; a lottery spreads the units over everyone. */
static void chart_crowd(FILE *f, const fl_scene_result *r, int n) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= r[i].sc.group == FL_GROUP_CROWD && r[i].ran;
    if (!any) return;
    fprintf(f, "<h2 id=\"crowd\">A sale past capacity: who got the units</h2>\n"
               "<p class=\"sub\">The same crowd twice. Each bar is a hundredth of the buyers, "
               "by the order they came (the first at the left); its height, the share of them "
               "who got a unit (bots, who retry at once, darker). Without a waiting room the "
               "units go to whoever retries at the right moment; with it, to the first to "
               "come.</p>\n<div class=\"fair\">");
    enum { CW = 400, CH = 110, CM = 18 };
    for (int i = 0; i < n; i++) {
        const fl_scene_result *s = &r[i];
        if (s->sc.group != FL_GROUP_CROWD || !s->ran) continue;
        const fl_crowd_figures *c = &s->crowd;
        fprintf(f, "<figure class=\"crowdone\"><svg width=\"%d\" height=\"%d\" "
                   "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"><title>waiting room %s: "
                   "%.1f%% of the units to the first %lld</title>",
                CW + 2 * CM, CH + 2 * CM, s->sc.crowd_room ? "on" : "off", 100 * c->first_share,
                (long long)c->stock);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" "
                   "stroke=\"#d5d9dc\"/>", CM, CM, CW, CH);
        double bw = (double)CW / FL_CROWD_BINS;
        for (int k = 0; k < FL_CROWD_BINS; k++) {
            double all = s->crowd_bins[k][0] ? s->crowd_bins[k][0] : 1;
            double got = s->crowd_bins[k][1] / all * CH, bots = s->crowd_bins[k][2] / all * CH;
            if (got > 0)
                fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                           "fill=\"#66bb6a\"/>", CM + k * bw, CM + CH - got, bw, got);
            if (bots > 0)
                fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                           "fill=\"#1b5e20\"/>", CM + k * bw, CM + CH - bots, bw, bots);
        }
        /* Where the first S arrivals end. */
        double xs = c->buyers ? CM + (double)c->stock * CW / c->buyers : CM;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#3f51b5\" "
                   "stroke-dasharray=\"3 3\"/><text x=\"%d\" y=\"%d\" font-size=\"10\" "
                   "fill=\"#5c6670\">came &rarr;</text></svg><figcaption><b>waiting room %s</b> "
                   "&middot; %u buyers, %lld units<br>%.1f%% of the units to the first %lld "
                   "(left of the dashes); bots x%.2f per capita<br>%.0f units/s; requests per "
                   "buyer p50 %.0f; last answer %.2f s after the last unit</figcaption></figure>",
                xs, CM, xs, CM + CH, CM, CH + 2 * CM - 4, s->sc.crowd_room ? "on" : "off", c->buyers,
                (long long)c->stock, 100 * c->first_share, (long long)c->stock, c->bot_ratio,
                c->units_per_s, c->requests_median, c->final_after_last_unit_us / 1e6);
    }
    fprintf(f, "</div>\n");
}

/* ------------------------------------------------- the lock table, as text */

void fl_probe_fmt(const fl_probe *p, int kind, char *out, size_t len) {
    if (!p->ran) {
        snprintf(out, len, "%s", !strncmp(p->note, "n/a", 3) ? "n/a"
                                 : !strncmp(p->note, "skipped", 7) ? "skipped" : "not measured");
        return;
    }
    char over[48] = "";
    if (p->oversold) snprintf(over, sizeof over, ", OVERSOLD %lld", p->oversold);
    else if (!p->pass) snprintf(over, sizeof over, ", verdict FAIL");
    switch (kind) {
    case FL_PROBE_KILL:
        snprintf(out, len, "%.2fs%s", p->recover_ms / 1000.0, over[0] ? over : ", 0 oversold");
        break;
    case FL_PROBE_FAILOVER:
        /* lock: how long until it sells again; redlock: what the fence did
         * to the holder the failover left behind. */
        if (p->oversold) snprintf(out, len, "NOT safe%s", over);
        else if (p->fenced) snprintf(out, len, "fenced %llu, 0 oversold%s",
                                     (unsigned long long)p->fenced, p->pass ? "" : over);
        else if (p->recover_ms >= 0)
            snprintf(out, len, "%.2fs, 0 oversold%s", p->recover_ms / 1000.0, p->pass ? "" : over);
        else snprintf(out, len, "0 oversold%s", p->pass ? "" : over);
        break;
    case FL_PROBE_FENCE:
        if (p->oversold) snprintf(out, len, "NOT fenced%s", over);
        else if (p->fenced) snprintf(out, len, "fenced %llu, 0 oversold%s",
                                     (unsigned long long)p->fenced, p->pass ? "" : over);
        else snprintf(out, len, "lock kept, 0 oversold%s", p->pass ? "" : over);
        break;
    default: {
        char fen[40] = "";
        if (p->fenced) snprintf(fen, sizeof fen, " (%llu fenced)", (unsigned long long)p->fenced);
        if (p->recover_ms < 0)
            snprintf(out, len, "no 201 in %.0fs after%s%s", p->waited_ms / 1000.0, fen,
                     over[0] ? over : ", 0 oversold");
        else if (p->still_refusing)
            snprintf(out, len, "refused > %.0fs (probe's end)%s%s", p->refused_ms / 1000.0, fen,
                     over[0] ? over : ", 0 oversold");
        else if (!p->refused)
            snprintf(out, len, "none refused%s", over[0] ? over : ", 0 oversold");
        else
            snprintf(out, len, "refused %.1fs%s%s", p->refused_ms / 1000.0, fen,
                     over[0] ? over : ", 0 oversold");
    }
    }
}

/* A lock's fairness cell: "in order" when both scenes served every pair in
 * arrival order, else the pairs out of order of each ("-": not run). */
void fl_fair_fmt(const fl_lock_row *r, char *out, size_t len) {
    if (!r->fair_have[0] && !r->fair_have[1]) {
        snprintf(out, len, "-");
        return;
    }
    if (r->fair_have[0] && r->fair_have[1] && !r->fair_oo[0] && !r->fair_oo[1] &&
        !r->fair_starved[0] && !r->fair_starved[1]) {
        snprintf(out, len, "in order");
        return;
    }
    char cell[2][32];
    for (int k = 0; k < 2; k++) {
        if (!r->fair_have[k]) snprintf(cell[k], sizeof cell[k], "-");
        else snprintf(cell[k], sizeof cell[k], "%ld/%ld%s", r->fair_oo[k], r->fair_pairs[k],
                      r->fair_starved[k] ? "!" : "");
    }
    snprintf(out, len, "%s %s", cell[0], cell[1]);
}

void fl_lock_table(const fl_lock_row *l, int n, FILE *f) {
    fprintf(f, "%-13s %8s %8s %8s %8s %8s %-14s  %-18s %-26s %-54s %-22s %s\n", "lock",
            "1 seg/s", "8 segs/s", "p50", "p99", "hand-off", "fair", "holder killed -9",
            "server restarted", "server lost its data", "failover to a replica",
            "past its lease");
    for (int i = 0; i < n; i++) {
        const fl_lock_row *r = &l[i];
        char a[24], b[24], p50[16] = "-", p99[16] = "-", ho[16] = "-", k[160], rs[160], wp[160],
             fo[160], fe[160], fair[48];
        fmt_rate(r->have1, r->ops1, a, sizeof a);
        fmt_rate(r->have8, r->ops8, b, sizeof b);
        if (r->have1) {
            fl_fmt_us(r->p50_us, p50, sizeof p50);
            fl_fmt_us(r->p99_us, p99, sizeof p99);
        }
        if (r->handoff_n) fl_fmt_us((uint64_t)r->handoff_mean_us, ho, sizeof ho);
        fl_probe_fmt(&r->kill, FL_PROBE_KILL, k, sizeof k);
        fl_probe_fmt(&r->restart, FL_PROBE_RESTART, rs, sizeof rs);
        fl_probe_fmt(&r->wipe, FL_PROBE_WIPE, wp, sizeof wp);
        fl_probe_fmt(&r->failover, FL_PROBE_FAILOVER, fo, sizeof fo);
        fl_probe_fmt(&r->fence, FL_PROBE_FENCE, fe, sizeof fe);
        fl_fair_fmt(r, fair, sizeof fair);
        fprintf(f, "%-13s %8s %8s %8s %8s %8s %-14s  %-18s %-26s %-54s %-22s %s\n", r->strategy,
                a, b, p50, p99, ho, fair, k, rs, wp, fo, fe);
    }
    fprintf(f, "hand-off: mean release -> next acquire in one process "
               "(flashsale_lock_handoff_seconds, 1-segment scene)\n"
               "fair: pairs of buyers served against arrival order, the queue scene's then the "
               "stream's ('in order': none in both; '!': a buyer starved); see the fairness "
               "table above\n");
    for (int i = 0; i < n; i++) {
        const fl_lock_row *r = &l[i];
        fprintf(f, "  %s (lock server: %s)\n", r->strategy, r->server);
        const fl_probe *ps[5] = { &r->kill, &r->restart, &r->wipe, &r->failover, &r->fence };
        const char *names[5] = { "killed", "restart", "data lost", "failover", "pause" };
        for (int k = 0; k < 5; k++) fprintf(f, "    %-9s %s\n", names[k], ps[k]->note);
    }
}

static const char CSS[] =
    "body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2329;"
    "margin:32px auto;max-width:1320px;padding:0 16px;background:#fbfbfa}"
    "h2{font-size:21px;margin:32px 0 4px}code{font-size:13px}"
    "h1{font-size:26px;margin:0 0 4px}p.sub{color:#5c6670;margin:0 0 20px}"
    ".sum{padding:12px 16px;border-radius:8px;margin:0 0 24px;font-weight:600}"
    ".sum.ok{background:#e8f5e9;color:#1b5e20}.sum.bad{background:#fff3e0;color:#8a4b00}"
    "figure{margin:0 0 28px;background:#fff;border:1px solid #e3e6e8;border-radius:8px;"
    "padding:12px 8px 4px}figcaption{font-weight:600;margin:0 0 4px 10px}"
    "svg{width:100%;height:auto;font-family:inherit}"
    ".lbl{font-size:13px;fill:#1d2329}.tick{font-size:11px;fill:#7a848c}"
    ".val{font-size:12px;fill:#3a434a}.val.ok{fill:#2e7d32}.note{font-size:12px;fill:#999}"
    ".grid{stroke:#eceff1;stroke-width:1}"
    "table{border-collapse:collapse;width:100%;font-size:12.5px;background:#fff;margin:0 0 24px}"
    "th,td{border-bottom:1px solid #e3e6e8;padding:5px 5px;text-align:right;vertical-align:top;"
    "overflow-wrap:anywhere}"
    "td small{color:#7a848c}tr.fault td{background:#fff8e1}"
    "tr.group td{background:#eef1f3;font-weight:600;text-align:left}"
    "th:first-child,td:first-child,td.v,th:last-child{text-align:left}"
    "td.v{font-weight:600}td.skip{color:#8a4b00}"
    "table.locks{table-layout:fixed}table.locks td,table.locks th{text-align:left}"
    "td.p.bad b{color:#c62828}td.p.na b{color:#7a848c}"
    ".band{fill:#ffb300;fill-opacity:0.10}"
    ".legend span{display:inline-block;width:12px;"
    "height:12px;border-radius:2px;margin:0 4px 0 14px;vertical-align:-1px}"
    "div.fair{display:flex;flex-wrap:wrap;gap:10px;margin:0 0 24px}"
    "figure.fairone{margin:0;padding:6px;width:200px}figure.fairone svg{width:186px}"
    "figure.fairone figcaption{font-weight:400;font-size:12px;margin:2px 4px}"
    "figure.crowdone{margin:0;padding:6px;width:450px}figure.crowdone svg{width:436px}"
    "figure.crowdone figcaption{font-weight:400;font-size:12px;margin:2px 4px}"
    "footer{color:#7a848c;font-size:12px;margin:24px 0}";

/* Counts the drawn marks of each chart into data- attributes, and any
 * script error, so a headless browser can tell the page rendered. */
static const char SELF_CHECK[] =
    "<script>(function(){var errors=0;"
    "window.addEventListener('error',function(){errors++;"
    "document.body.setAttribute('data-errors',errors);});"
    "var charts=document.querySelectorAll('svg.chart');"
    "charts.forEach(function(svg){var n=0;svg.querySelectorAll('.mark').forEach(function(m){"
    "var b=m.getBBox();if(b.width>0||b.height>0)n++;});svg.setAttribute('data-marks',n);});"
    "document.body.setAttribute('data-charts',charts.length);"
    "var over=0;document.querySelectorAll('table,figure,div,p').forEach(function(el){"
    "if(el.scrollWidth>el.clientWidth+1)over++;});"
    "document.body.setAttribute('data-overflow',over);"
    "document.body.setAttribute('data-scroll-width',document.documentElement.scrollWidth);"
    "document.body.setAttribute('data-errors',errors);})();</script>\n";

int fl_report_html(const fl_compare_opts *o, const fl_scene_result *r, int n,
                   const fl_lock_row *l, int nl, const char *path, fl_err *e) {
    FILE *f = fopen(path, "w");
    if (!f) return fl_errf(e, "cannot write %s", path);
    int ran = 0, unexpected = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        ran += r[i].ran;
        skipped += !r[i].ran;
        unexpected += r[i].ran && !r[i].as_expected;
    }
    char when[40];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
               "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
               "<title>flashsale: stock strategies compared</title><style>%s</style></head>\n"
               "<body>\n<h1>flashsale: stock strategies compared</h1>\n",
            CSS);
    char qty[32];
    if (o->qty_max > o->qty_min) snprintf(qty, sizeof qty, "%d-%d", o->qty_min, o->qty_max);
    else snprintf(qty, sizeof qty, "%d", o->qty_min);
    fprintf(f, "<p class=\"sub\">%s &middot; %ld CPUs &middot; the same load in every scene: "
               "%d connections, %u buyers, quantity %s, %.3g s per scene (%.3g s a forced "
               "one) &middot; verified from the client, the API, Redis and SQLite</p>\n",
            when, sysconf(_SC_NPROCESSORS_ONLN), o->connections, o->users, qty, o->duration_s,
            o->pause_duration_s);
    fprintf(f, "<div class=\"sum %s\">%d scenes: %s", unexpected || !ran ? "bad" : "ok", ran,
            unexpected ? "some did not come out as expected (amber)"
                       : "every safe strategy that ran passed, every unsafe one broke, as "
                         "expected");
    if (skipped)
        fprintf(f, ". %d skipped, neither run nor passed (the table says why)", skipped);
    fprintf(f, "</div>\n");
    fprintf(f, "<p class=\"legend\"><span style=\"background:#2e7d32\"></span>invariants held"
               "<span style=\"background:#c62828\"></span>oversold (an unsafe strategy, as "
               "designed)<span style=\"background:#e08a00\"></span>not what was expected"
               "<span style=\"background:#ffecb3\"></span>\xe2\x9a\xa1 ran under a fault "
               "(a forced interleaving, or a Redis failure)</p>\n");
    /* Orders/s and latency mean something only under ordinary contention:
     * a fault scene sells slowly on purpose, and is drawn by what it shows. */
    fl_scene_result *plain = calloc((size_t)n + 1, sizeof *plain);
    int np = 0;
    for (int i = 0; plain && i < n; i++)
        if (r[i].sc.group == FL_GROUP_CONTENTION) plain[np++] = r[i];
    if (plain && np) {
        chart_throughput(f, plain, np);
        chart_latency(f, plain, np);
    }
    free(plain);
    chart_faults(f, r, n);
    if (nl) lock_table(f, l, nl);
    chart_fairness(f, r, n);
    chart_crowd(f, r, n);
    table(f, r, n);
    fprintf(f, "<footer>Orders/s: orders confirmed (201) per second from the start to the "
               "last 201, i.e. while there was stock to sell; answers/s counts every answer, "
               "sold-out ones included. Oversold: units sold or still offered beyond the stock put on sale "
               "(sold + max(available, 0) &minus; stock). Min stock: the lowest stock any "
               "vantage point saw, sampled while the load ran and read after it. Lost: units "
               "neither sold nor available. Forced: with fault injection, a holder waits inside "
               "its critical section until a second one is inside with the same read, or a "
               "bound; the service counts each wait (met, alone) and a scene whose forcing did "
               "not come as claimed is marked not as expected. Generated by flashload "
               "compare.</footer>\n");
    fputs(SELF_CHECK, f);
    fprintf(f, "</body></html>\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return fl_errf(e, "cannot write %s", path);
    return 0;
}
