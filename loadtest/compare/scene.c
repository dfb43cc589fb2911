/* scene.c: a scene's result of `flashload compare`: its figures and
 * verdict from its run (fl_scene_fill), and what it showed in a few words
 * (fl_holds_brief, fl_forced_brief).
 *
 * A file of its own below compare.c: the groups that run scenes of their
 * own (failures.c) fill their results the same way, and the report
 * (report.c) words them the same way, and neither may call back into the
 * comparison that calls them. */
#include <stdio.h>
#include <string.h>

#include "loadtest/compare/compare_int.h"

void fl_scene_fill(fl_scene_result *res, const fl_run_result *rr) {
    const fl_load_result *l = &rr->load;
    double secs = l->elapsed_us / 1e6;
    res->ran = 1;
    res->answered = l->answered;
    res->created = l->ncreated;
    res->transport_errors = l->transport_errors;
    res->fenced = l->fenced;
    res->sale_gap_us = l->max_sale_gap_us;
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
    res->verdict = rr->verdict;
    fl_verdict_line(&rr->verdict, res->verdict_line, sizeof res->verdict_line);
    /* An unsafe scene is as expected when it shows its flaw: units sold or
     * offered beyond the stock, or stock below zero. */
    int flaw = rr->verdict.oversold > 0 || rr->verdict.min_stock < 0;
    res->as_expected = res->sc.unsafe ? (!rr->verdict.pass && flaw) : rr->verdict.pass;
}

void fl_holds_brief(const fl_scene_result *s, char *out, size_t len) {
    const fl_holds_verdict *h = &s->verdict.holds;
    out[0] = '\0';
    if (!s->ran || !s->sc.hold_seconds) return;
    snprintf(out, len, "%llu holds placed: %lld confirmed, %lld cancelled, %lld expired, %lld "
             "still reserved; %lld returned, %lld units resold%s; expiry lag p50 %lld ms, p99 "
             "%lld ms", (unsigned long long)s->created, h->confirmed, h->cancelled, h->expired,
             h->reserved, h->cancelled + h->expired, h->resold,
             h->resale_checked ? " (checked)" : "", h->lag_p50_ms, h->lag_p99_ms);
}

void fl_forced_brief(const fl_scene_result *s, char *out, size_t len) {
    out[0] = '\0';
    if (!s->ran || !s->sc.cs_overlap || s->forced_met < 0) return;
    snprintf(out, len, "; waits: %lld met a second holder, %lld alone", s->forced_met,
             s->forced_alone);
}
