/* holds.c: the verifier's checks of holds, for a product created with
 * hold_seconds > 0 (docs/api.md, "Holds"): its 201s are reserved orders,
 * each then confirmed (paid), cancelled, or expired at its deadline.
 *
 * What a buyer was told decides what must be true at the end, once the
 * holds have settled (nothing held, nothing owed to Redis):
 *
 *   client  the units of the confirms answered 200 are within the stock,
 *           and no confirm was answered 200 at or after its deadline;
 *   rows    every hold ended the way its buyer was told (a 200 confirm:
 *           confirmed; a 200 cancel: cancelled; 409 order_expired, or no
 *           decision sent at all: expired), none is still reserved, and
 *           `sold` is the units confirmed by a 200 (API and SQLite);
 *   sqlite  no hold confirmed at or after its deadline or expired before
 *           it, none owing its units to Redis, `held` is 0; the expiry lag
 *           (decided_ms - expires_ms) is measured; the units ordered beyond
 *           the stock (units that came back and sold again) are counted,
 *           and must be above 0 when the run's shape promised a resale;
 *   redis   the return markers (`returned` and its time buckets) name only
 *           cancelled or expired holds, and every such hold taken from this
 *           copy (its generation) is in them, or decided before the
 *           forgetting watermark (`returned:before`): the units went back
 *           exactly once (the books check counts them).
 *
 * Nothing here runs for a product without holds: its checks are exactly
 * what they were before holds existed. SQLite and Redis are read by
 * stores.c, by docs/storage.md, never through the service's code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "loadtest/verify/verify_int.h"

#define RESALE_MARGIN_MS 2000     /* buyers kept ordering this long after a return */
#define RESALE_MIN_RATE 50        /* open loop: orders/s enough to find the units in it */

/* ------------------------------------------------------------ the buyers */

static int cmp_dec(const void *a, const void *b) {
    return strcmp(((const fl_decision_rec *)a)->order_id, ((const fl_decision_rec *)b)->order_id);
}

static int cmp_rec(const void *a, const void *b) {
    return strcmp(((const fl_hold_rec *)a)->order_id, ((const fl_hold_rec *)b)->order_id);
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int fl_holds_init(fl_holds *hx, const fl_verify_in *in, int hold_seconds) {
    const fl_load_result *l = in->load;
    memset(hx, 0, sizeof *hx);
    hx->in = in;
    hx->on = hold_seconds > 0;
    if (!hx->on || !l->ndecisions) return 0;
    if (!(hx->dec = malloc(l->ndecisions * sizeof *hx->dec))) return -1;
    memcpy(hx->dec, l->decisions, l->ndecisions * sizeof *hx->dec);
    hx->ndec = l->ndecisions;
    if (hx->ndec > 1) qsort(hx->dec, hx->ndec, sizeof *hx->dec, cmp_dec);
    for (size_t i = 0; i < hx->ndec; i++) {
        const fl_decision_rec *d = &hx->dec[i];
        if (d->action != FL_PAY) continue;
        if (d->status == 200) hx->paid_units += d->qty;
        else if (d->status == 0) hx->unknown_units += d->qty;
    }
    return 0;
}

void fl_holds_free(fl_holds *hx) {
    free(hx->dec);
    free(hx->rows);
    free(hx->lags);
    memset(hx, 0, sizeof *hx);
}

static const fl_decision_rec *find_dec(const fl_holds *hx, const char *id) {
    fl_decision_rec probe;
    snprintf(probe.order_id, sizeof probe.order_id, "%s", id);
    return hx->ndec ? bsearch(&probe, hx->dec, hx->ndec, sizeof *hx->dec, cmp_dec) : NULL;
}

int fl_holds_paid(const fl_holds *hx, const char *id) {
    const fl_decision_rec *d = find_dec(hx, id);
    return d && d->action == FL_PAY && d->status == 200;
}

/* A state's letter: 'c' also for "" (an order without a hold: confirmed). */
static char state_char(const char *state) {
    if (!state[0] || !strcmp(state, "confirmed")) return 'c';
    if (!strcmp(state, "reserved")) return 'r';
    if (!strcmp(state, "cancelled")) return 'x';
    if (!strcmp(state, "expired")) return 'e';
    return '?';
}

static const char *state_name(char s) {
    return s == 'c' ? "confirmed" : s == 'r' ? "reserved" : s == 'x' ? "cancelled"
         : s == 'e' ? "expired" : "in no known state";
}

int fl_holds_sold_state(const char *state) { return state_char(state) == 'c'; }

int fl_holds_counts_for_limit(const char *state) {
    char s = state_char(state);
    return s == 'c' || s == 'r';
}

/* The state the buyer's answer says the hold ended in; 0 when it says
 * nothing (no answer, or a refusal that is not about the state). */
static char told_state(const fl_decision_rec *d) {
    if (d->action == FL_ABANDON || d->status == -1) return 'e';   /* nobody decided: expiry */
    if (d->status == 200) return d->action == FL_PAY ? 'c' : 'x';
    if (d->status != 409) return 0;
    if (!strcmp(d->code, "order_expired")) return 'e';
    if (!strcmp(d->code, "order_cancelled")) return 'x';
    if (!strcmp(d->code, "order_confirmed")) return 'c';
    return 0;
}

/* "a confirm answered 200", "no decision", ... for messages. */
static void told_what(const fl_decision_rec *d, char *out, size_t len) {
    const char *what = d->action == FL_PAY ? "confirm" : "cancel";
    if (d->action == FL_ABANDON) snprintf(out, len, "abandoned by its buyer");
    else if (d->status == -1) snprintf(out, len, "its %s never sent", what);
    else if (d->status == 200) snprintf(out, len, "its %s answered 200", what);
    else snprintf(out, len, "its %s answered %d %s", what, d->status, d->code);
}

void fl_holds_check_client(const fl_holds *hx, long long run_stock, fl_verdict *vd) {
    if (!hx->on) return;
    vd->holds.confirmed_units = hx->paid_units;
    if (hx->paid_units > run_stock)
        fl_violate(vd, "client", hx->paid_units - run_stock,
                   "oversold by %lld units: buyers were answered 200 to confirms of %lld units "
                   "of %lld", hx->paid_units - run_stock, hx->paid_units, run_stock);
    long long late = 0, untimed = 0;
    const fl_decision_rec *eg = NULL;
    for (size_t i = 0; i < hx->ndec; i++) {
        const fl_decision_rec *d = &hx->dec[i];
        if (d->action != FL_PAY || d->status != 200) continue;
        if (d->decided_ms < 0 || d->expires_ms < 0) untimed++;
        else if (d->decided_ms >= d->expires_ms && !late++) eg = d;
    }
    if (late)
        fl_violate(vd, "client", late, "%lld confirms answered 200 at or after the hold's deadline "
                   "(first: %s confirmed %lld ms after it)", late, eg->order_id,
                   eg->decided_ms - eg->expires_ms);
    if (untimed) fl_note(vd, "%lld confirms answered 200 without confirmed_at/expires_at", untimed);
}

/* ------------------------------------------------------------------ settle */

int fl_holds_settle(const fl_holds *hx, fl_http *h, fl_product *p, fl_verdict *vd, fl_err *e) {
    const fl_verify_in *in = hx->in;
    if (!hx->on) return 0;
    int64_t t0 = clock_mono_ms(), next_line = t0 + 1000;
    int64_t limit = p->hold_seconds * 1000LL + in->settle_ms;
    for (;;) {
        long long reserved = 0, owed = 0;
        fl_err ignore;             /* unreadable: check_db says so */
        if (fl_product_get(h, in->sku, p, e)) return -1;
        if (in->v->db_path[0] &&
            fl_db_holds_open(in->v->db_path, in->sku, &reserved, &owed, &ignore))
            reserved = owed = 0;
        int64_t now = clock_mono_ms();
        if ((p->held == 0 && reserved == 0 && owed == 0) || now - t0 >= limit) break;
        if (in->progress && now >= next_line) {
            fprintf(stderr, "settling  held %lld units, %lld holds reserved, %lld returns owed "
                    "(%.1f s of at most %.1f s)\n", p->held, reserved, owed, (now - t0) / 1e3,
                    limit / 1e3);
            next_line += 1000;
        }
        clock_sleep_ms(100);
    }
    vd->holds.settle_ms = clock_mono_ms() - t0;
    vd->holds.held = p->held;
    return 0;
}

/* -------------------------------------------------------------- order rows */

/* Unix milliseconds in a ULID's first 10 characters (Crockford base32);
 * -1 when it is not one. */
static long long ulid_ms(const char *id) {
    static const char B32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    long long ms = 0;
    for (int i = 0; i < 10; i++) {
        const char *c = id[i] ? strchr(B32, id[i]) : NULL;
        if (!c) return -1;
        ms = ms * 32 + (c - B32);
    }
    return ms;
}

void fl_holds_row(const fl_holds *hx, fl_hold_rows *hr, const char *id, int qty,
                  const char *state, int this_run) {
    if (!hx->on) return;
    char s = state_char(state);
    hr->units_every += qty;
    if (!state[0]) hr->no_hold++;
    if (s == 'r') hr->reserved++;
    if (hx->first_end_ms > 0 && ulid_ms(id) > hx->first_end_ms) hr->after_end += qty;
    const fl_decision_rec *d = this_run ? find_dec(hx, id) : NULL;
    char want = d ? told_state(d) : 0;
    if (!want || want == s) return;
    if (!hr->disagree++) {
        char told[80];
        told_what(d, told, sizeof told);
        snprintf(hr->disagree_eg, sizeof hr->disagree_eg, "%s is %s, %s", id, state_name(s),
                 told);
    }
}

void fl_holds_check_rows(const fl_holds *hx, const fl_hold_rows *hr, const char *vantage,
                         long long sold, fl_verdict *vd) {
    if (!hx->on) return;
    if (hr->disagree)
        fl_violate(vd, vantage, hr->disagree, "%lld holds ended otherwise than their buyers were "
                   "told (first: %s)", hr->disagree, hr->disagree_eg);
    if (hr->no_hold)
        fl_violate(vd, vantage, hr->no_hold, "%lld orders of a product with holds have no hold",
                   hr->no_hold);
    if (hr->reserved)
        fl_violate(vd, vantage, hr->reserved, "%lld holds still reserved %.1f s after the load",
                   hr->reserved, vd->holds.settle_ms / 1e3);
    long long lo = hx->paid_units, hi = lo + hx->unknown_units;
    if (sold >= lo && sold <= hi) return;
    fl_violate(vd, vantage, sold < lo ? lo - sold : sold - hi,
               "sold says %lld units but the confirms answered 200 add up to %lld%s", sold, lo,
               hi > lo ? " (more only by confirms without an answer)" : "");
}

/* ---------------------------------------------------------------- SQLite */

/* Makes room for one more element in *arr (of *cap); -1 out of memory. */
static int reserve(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return 0;
    size_t c = *cap ? *cap * 2 : 256;
    void *p = realloc(*arr, c * elem);
    if (!p) return -1;
    *arr = p;
    *cap = c;
    return 0;
}

/* A hold of this run ended by a cancel or an expiry: the first end, and
 * an expiry's lag. */
static void on_end(fl_holds *hx, const fl_hold_rec *r) {
    if (r->decided_ms > 0 && (!hx->first_end_ms || r->decided_ms < hx->first_end_ms))
        hx->first_end_ms = r->decided_ms;
    if (r->state == 'e' && !reserve((void **)&hx->lags, &hx->caplags, hx->nlags, sizeof *hx->lags))
        hx->lags[hx->nlags++] = r->decided_ms - r->expires_ms;
}

/* A confirmed hold whose confirm we sent and saw answered 200 carries that
 * confirm's payment_ref ("pay-<order_id>"). */
static void check_ref(fl_holds *hx, const fl_hold_rec *r, const char *ref) {
    char want[40];
    snprintf(want, sizeof want, "pay-%s", r->order_id);
    if (strcmp(ref, want) && !hx->wrong_refs++)
        snprintf(hx->ref_eg, sizeof hx->ref_eg, "%s", r->order_id);
}

void fl_holds_on_hold(fl_holds *hx, const fl_hold_row *h, int this_run) {
    if (reserve((void **)&hx->rows, &hx->cap, hx->nrows, sizeof *hx->rows))
        return;                    /* out of memory: fewer holds checked */
    fl_hold_rec *r = &hx->rows[hx->nrows++];
    snprintf(r->order_id, sizeof r->order_id, "%s", h->order_id);
    r->state = state_char(h->state);
    r->quantity = h->quantity;
    r->this_run = this_run;
    r->gen = h->gen;
    r->expires_ms = h->expires_ms;
    r->decided_ms = h->decided_ms;
    hx->owed += h->owes;
    if (r->state == 'c' && h->decided_ms >= h->expires_ms && !hx->late_confirms++)
        snprintf(hx->late_eg, sizeof hx->late_eg, "%s", r->order_id);
    if (r->state == 'e' && h->decided_ms < h->expires_ms && !hx->early_expiries++)
        snprintf(hx->early_eg, sizeof hx->early_eg, "%s", r->order_id);
    if (r->state == 'c' && this_run && fl_holds_paid(hx, r->order_id))
        check_ref(hx, r, h->payment_ref);
    if (this_run && (r->state == 'x' || r->state == 'e')) on_end(hx, r);
}

/* This run's holds by state, and the expiry lag's percentiles. */
static void count_holds(fl_holds *hx, fl_verdict *vd) {
    for (size_t i = 0; i < hx->nrows; i++) {
        const fl_hold_rec *r = &hx->rows[i];
        if (!r->this_run) continue;
        vd->holds.reserved += r->state == 'r';
        vd->holds.confirmed += r->state == 'c';
        vd->holds.cancelled += r->state == 'x';
        vd->holds.expired += r->state == 'e';
    }
    vd->holds.owed = hx->owed;
    vd->holds.db = 1;
    if (!hx->nlags) return;
    qsort(hx->lags, hx->nlags, sizeof *hx->lags, cmp_ll);
    size_t n = hx->nlags, p99 = (n * 99 + 99) / 100;    /* nearest rank: ceil(0.99 n) */
    vd->holds.lag_n = (long long)n;
    vd->holds.lag_p50_ms = hx->lags[(n - 1) / 2];
    vd->holds.lag_p99_ms = hx->lags[p99 - 1];
    vd->holds.lag_max_ms = hx->lags[n - 1];
}

/* The earliest end (cancel or expiry) of this run's holds at or after
 * from_ms; 0 when none. */
static long long first_end_after(const fl_holds *hx, long long from_ms) {
    long long best = 0;
    for (size_t i = 0; i < hx->nrows; i++) {
        const fl_hold_rec *r = &hx->rows[i];
        if (!r->this_run || (r->state != 'x' && r->state != 'e') || r->decided_ms < from_ms)
            continue;
        if (!best || r->decided_ms < best) best = r->decided_ms;
    }
    return best;
}

/* Whether the run's shape promised that returned units sold again: the
 * API once showed nothing available, a hold ended after that while the
 * buyers went on ordering for RESALE_MARGIN_MS, and any of them could take
 * one unit (no per-user limit; quantity from 1; a closed loop or a brisk
 * open one). *end_ms gets that end. */
static int resale_promised(const fl_holds *hx, const fl_db_sku *dp, long long *end_ms) {
    const fl_verify_in *in = hx->in;
    const fl_load_opts *lo = in->lo;
    if (!lo || !in->samples || !in->samples->first_empty_ms || dp->per_user_limit > 0) return 0;
    if (lo->qty_min > 1 || (lo->rate > 0 && lo->rate < RESALE_MIN_RATE)) return 0;
    long long load_end = in->load->start_wall_ms + in->load->elapsed_us / 1000;
    *end_ms = first_end_after(hx, in->samples->first_empty_ms);
    return *end_ms && *end_ms <= load_end - RESALE_MARGIN_MS;
}

/* Units that came back and were ordered again, and the check when promised. */
static void check_resale(const fl_holds *hx, const fl_hold_rows *hr, const fl_db_sku *dp,
                         fl_verdict *vd) {
    long long beyond = hr->units_every - dp->stock_initial, end_ms;
    vd->holds.resold = beyond > 0 ? beyond : 0;
    vd->holds.after_return = hr->after_end;
    if (!resale_promised(hx, dp, &end_ms)) return;
    vd->holds.resale_checked = 1;
    if (beyond <= 0)
        fl_violate(vd, dp->vantage, 1, "returned units were not sold again: a hold ended %lld ms "
                   "after the stock ran out and buyers ordered for %.1f s more, yet the orders "
                   "add up to %lld units of %lld", end_ms - hx->in->samples->first_empty_ms,
                   (hx->in->load->start_wall_ms + hx->in->load->elapsed_us / 1000 - end_ms) / 1e3,
                   hr->units_every, dp->stock_initial);
}

void fl_holds_check_db(fl_holds *hx, const fl_hold_rows *hr, const fl_db_sku *dp,
                       fl_verdict *vd) {
    if (!hx->on) return;
    if (hx->nrows > 1) qsort(hx->rows, hx->nrows, sizeof *hx->rows, cmp_rec);
    count_holds(hx, vd);
    if (hx->late_confirms)
        fl_violate(vd, dp->vantage, hx->late_confirms, "%lld holds confirmed at or after their "
                   "deadline (first: %s)", hx->late_confirms, hx->late_eg);
    if (hx->early_expiries)
        fl_violate(vd, dp->vantage, hx->early_expiries, "%lld holds expired before their deadline "
                   "(first: %s)", hx->early_expiries, hx->early_eg);
    if (hx->wrong_refs)
        fl_violate(vd, dp->vantage, hx->wrong_refs, "%lld holds confirmed with another payment_ref "
                   "than their confirm's (first: %s)", hx->wrong_refs, hx->ref_eg);
    if (hx->owed)
        fl_violate(vd, dp->vantage, hx->owed, "%lld ended holds still owe their units to Redis "
                   "(return_gen set)", hx->owed);
    if (dp->held)
        fl_violate(vd, dp->vantage, dp->held, "held says %lld units once the holds settled",
                   dp->held);
    check_resale(hx, hr, dp, vd);
}

/* ----------------------------------------------------------------- Redis */

static const fl_hold_rec *find_rec(const fl_holds *hx, const char *id) {
    fl_hold_rec probe;
    snprintf(probe.order_id, sizeof probe.order_id, "%s", id);
    return hx->nrows ? bsearch(&probe, hx->rows, hx->nrows, sizeof *hx->rows, cmp_rec) : NULL;
}

static int in_ids(fl_order_id *ids, size_t n, const char *id) {
    return n && bsearch(id, ids, n, sizeof *ids, fl_order_id_cmp);
}

void fl_holds_check_returned(const fl_holds *hx, fl_redis *rd, const fl_stock_copy *c,
                             fl_verdict *vd) {
    long long copy_gen = c->gen;
    fl_order_id *ids = NULL;
    size_t n = 0;
    long long before = 0;
    fl_err e;
    vd->holds.returned_fields = -1;
    if (!hx->on || !vd->holds.db) return;      /* the holds' states are SQLite's */
    if (fl_redis_returned(rd, hx->in->sku, c->lanes, &ids, &n, &before, &e)) {
        fl_note(vd, "redis returned not read: %s", e.msg);
        return;
    }
    vd->holds.returned_fields = (long long)n;
    long long wrong = 0, missing = 0, wrong_units = 0, missing_units = 0;
    const char *wrong_eg = "", *missing_eg = "";
    for (size_t i = 0; i < n; i++) {
        const fl_hold_rec *r = find_rec(hx, ids[i]);
        if (r && (r->state == 'x' || r->state == 'e')) continue;
        wrong_units += r ? r->quantity : 0;
        if (!wrong++) wrong_eg = ids[i];
    }
    for (size_t i = 0; i < hx->nrows; i++) {
        const fl_hold_rec *r = &hx->rows[i];
        if ((r->state != 'x' && r->state != 'e') || r->gen != copy_gen) continue;
        if (in_ids(ids, n, r->order_id)) continue;
        /* Decided before the watermark: its marker was forgotten (the
         * service does that only once its debt is cleared, which the
         * check of owed returns covers). */
        if (r->decided_ms >= 0 && r->decided_ms < before) continue;
        missing_units += r->quantity;
        if (!missing++) missing_eg = r->order_id;
    }
    if (wrong)
        fl_violate(vd, "redis", wrong_units ? wrong_units : wrong, "%lld orders marked returned "
                   "that are not cancelled or expired holds (first: %s, %s)", wrong, wrong_eg,
                   find_rec(hx, wrong_eg) ? state_name(find_rec(hx, wrong_eg)->state) : "no hold");
    if (missing)
        fl_violate(vd, "redis", missing_units, "%lld cancelled or expired holds taken from this "
                   "copy were never given back to it (%lld units; first: %s)", missing,
                   missing_units, missing_eg);
    free(ids);
}

/* ------------------------------------------------------------------ output */

/* One answer and how often it came. */
typedef struct answer_count {
    int status;                  /* 0: no answer */
    char code[24];
    long long n;
} answer_count;

/* Counts the answers to one action's decisions into c[0..max); returns
 * how many kinds (the last slot takes the rest); *unsent gets those never
 * sent. */
static int count_answers(const fl_load_result *l, int action, answer_count *c, int max,
                         long long *unsent) {
    int n = 0;
    *unsent = 0;
    for (size_t i = 0; i < l->ndecisions; i++) {
        const fl_decision_rec *d = &l->decisions[i];
        if (d->action != action) continue;
        if (d->status == -1) {
            (*unsent)++;
            continue;
        }
        int k = 0;
        while (k < n && (c[k].status != d->status || strcmp(c[k].code, d->code))) k++;
        if (k == n && n == max) k = max - 1;
        if (k == n) {
            c[n].status = d->status;
            snprintf(c[n].code, sizeof c[n].code, "%s", d->code);
            c[n++].n = 0;
        }
        c[k].n++;
    }
    return n;
}

/* "confirm   912 sent, answered 200: 905  409 order_expired: 7; 2 never
 * sent (the load was stopped)". */
static void print_answers(const fl_load_result *l, int action, const char *name, FILE *f) {
    answer_count c[16];
    long long unsent, sent = 0;
    int n = count_answers(l, action, c, 16, &unsent);
    if (!n && !unsent) return;
    for (int k = 0; k < n; k++) sent += c[k].n;
    fprintf(f, "%-9s %lld sent%s", name, sent, n ? ", answered" : "");
    for (int k = 0; k < n; k++) {
        const char *sep = k ? "  " : " ";
        if (!c[k].status) fprintf(f, "%snone: %lld", sep, c[k].n);
        else fprintf(f, "%s%d%s%s: %lld", sep, c[k].status, c[k].code[0] ? " " : "", c[k].code,
                     c[k].n);
    }
    if (unsent) fprintf(f, "; %lld never sent (no connection in time, or stopped)", unsent);
    fprintf(f, "\n");
}

void fl_holds_print(const fl_load_result *l, const fl_verdict *vd, FILE *f) {
    const fl_holds_verdict *h = &vd->holds;
    if (!h->hold_seconds) return;
    long long n[3] = { 0, 0, 0 };
    for (size_t i = 0; i < l->ndecisions; i++)
        if (l->decisions[i].action <= FL_CANCEL) n[l->decisions[i].action]++;
    fprintf(f, "holds     %zu reserved (holds of %d s); their buyers: %lld pay, %lld cancel, "
               "%lld abandon\n", l->ndecisions, h->hold_seconds, n[FL_PAY], n[FL_CANCEL],
            n[FL_ABANDON]);
    print_answers(l, FL_PAY, "confirm", f);
    print_answers(l, FL_CANCEL, "cancel", f);
    if (l->decision_hist.count)
        fprintf(f, "          answered in p50 %.1fms  p99 %.1fms  max %.1fms\n",
                fl_hist_percentile(&l->decision_hist, 50) / 1e3,
                fl_hist_percentile(&l->decision_hist, 99) / 1e3, l->decision_hist.max / 1e3);
    if (h->db)
        fprintf(f, "settled   in %.1f s: %lld confirmed, %lld cancelled, %lld expired, %lld still "
                   "reserved; %lld returns owed (sqlite)\n", h->settle_ms / 1e3, h->confirmed,
                h->cancelled, h->expired, h->reserved, h->owed);
    else
        fprintf(f, "settled   in %.1f s: %lld units still held (api; --db tells more)\n",
                h->settle_ms / 1e3, h->held);
    if (h->returned_fields >= 0)
        fprintf(f, "returned  %lld ended holds given back to this Redis copy (returned)\n",
                h->returned_fields);
    if (h->lag_n)
        fprintf(f, "expiry    lag p50 %lld ms  p99 %lld ms  max %lld ms  over %lld expired holds "
                   "(decided_ms - expires_ms)\n", h->lag_p50_ms, h->lag_p99_ms, h->lag_max_ms,
                h->lag_n);
    if (h->db)
        fprintf(f, "resold    %lld units ordered beyond the stock (back from a cancel or an "
                   "expiry, sold again); %lld units ordered after the first hold ended%s\n",
                h->resold, h->after_return,
                h->resale_checked ? " (checked: the run outlived a return after a sell-out)" : "");
}
