/* verdict.c: the verdict: the broken invariants, each with its vantage
 * point and size, the notes on what could not be checked, and how they
 * are printed, as one line per violation or one headline for a table.
 *
 * Kept apart from the checks so that every file of checks (verify.c, and
 * holds.c for holds) records into one verdict the same way, each calling
 * down to this file and never to the other. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/verify/verify_int.h"

void fl_violate(fl_verdict *vd, const char *vantage, long long size, const char *fmt, ...) {
    vd->pass = 0;
    vd->nv_total++;
    if (vd->nv == FL_MAX_VIOLATIONS) return;
    fl_violation *v = &vd->v[vd->nv++];
    snprintf(v->vantage, sizeof v->vantage, "%s", vantage);
    v->size = size;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->what, sizeof v->what, fmt, ap);
    va_end(ap);
}

void fl_note(fl_verdict *vd, const char *fmt, ...) {
    size_t n = strlen(vd->notes);
    if (n + 4 >= sizeof vd->notes) return;
    if (n) n += (size_t)snprintf(vd->notes + n, sizeof vd->notes - n, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vd->notes + n, sizeof vd->notes - n, fmt, ap);
    va_end(ap);
}

void fl_see_stock(fl_verdict *vd, long long v) {
    if (v < vd->min_stock) vd->min_stock = v;
}

int fl_baseline_has(const fl_baseline *b, const char *id) {
    return b && b->nids && bsearch(id, b->ids, b->nids, sizeof *b->ids, fl_order_id_cmp) != NULL;
}

/* ------------------------------------------------------------------ output */

void fl_verdict_print(const fl_verdict *vd, FILE *f) {
    char seen[64] = "client, api";
    if (vd->redis_checked) strcat(seen, ", redis");
    if (vd->db_checked) {
        strcat(seen, ", ");
        strcat(seen, vd->db_vantage ? vd->db_vantage : "sqlite");
    }
    if (vd->pass) {
        fprintf(f, "verdict    PASS (checked: %s)\n", seen);
    } else {
        fprintf(f, "verdict    FAIL: %d invariant%s broken (checked: %s)\n", vd->nv_total,
                vd->nv_total == 1 ? "" : "s", seen);
        for (int i = 0; i < vd->nv; i++)
            fprintf(f, "  [%s] %s\n", vd->v[i].vantage, vd->v[i].what);
        if (vd->nv_total > vd->nv) fprintf(f, "  ... and %d more\n", vd->nv_total - vd->nv);
    }
    if (vd->explained_by_errors)
        fprintf(f, "note       %lld orders without a 201 match requests that got a transport error\n",
                vd->explained_by_errors);
    if (vd->notes[0]) fprintf(f, "note       %s\n", vd->notes);
}

void fl_verdict_line(const fl_verdict *vd, char *out, size_t len) {
    if (vd->pass) {
        snprintf(out, len, "PASS");
        return;
    }
    /* The headline: one line per kind of damage, the largest of each, so the
     * same oversell seen from four places is said once. */
    size_t n = (size_t)snprintf(out, len, "FAIL");
    const char *kinds[] = { "oversold", "reached", "lost", "stranded", "without a 201",
                            "not recorded", "no valid", "twice", "two different", "limit",
                            "add up", "pending", "both committed and voided",
                            "ended otherwise", "deadline", "still reserved", "still owe",
                            "marked returned", "never given back", "not sold again",
                            "held says", "no hold", "payment_ref", NULL };
    for (int k = 0; kinds[k] && n < len; k++) {
        int best = -1;
        for (int i = 0; i < vd->nv; i++) {
            if (!strstr(vd->v[i].what, kinds[k])) continue;
            if (best < 0 || llabs(vd->v[i].size) > llabs(vd->v[best].size)) best = i;
        }
        if (best < 0) continue;
        char what[240];
        snprintf(what, sizeof what, "%s", vd->v[best].what);
        char *colon = strchr(what, ':');   /* the headline drops the details */
        if (colon) *colon = '\0';
        char *paren = strstr(what, " (");
        if (paren) *paren = '\0';
        if (strstr(out, what)) continue;       /* one violation matched by two kinds */
        n += (size_t)snprintf(out + n, len - n, "%s %s", n == 4 ? ":" : ";", what);
    }
}
