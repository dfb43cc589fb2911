/* audit.c: `flashsale audit`: compares Redis and SQLite for every SKU and,
 * with --repair, fixes what is safely fixable.
 *
 * Checks, per product:
 *   - SQLite against itself: sold == the units of the order rows; for the
 *     db strategies, available == stock_initial - sold;
 *   - Redis against SQLite (Redis strategies): the copy exists for this
 *     Redis process; no segment is negative; units in Redis plus units of
 *     reservations not yet committed == stock_initial - sold;
 *   - pending records whose owner is dead or that are older than the
 *     pending timeout (orphans).
 * Repairs: orphans are settled (committed: cleared; not: voided, then given
 * back), a missing, stale or disagreeing Redis copy is rebuilt from SQLite
 * under a new generation (which also refuses any order reserved against the
 * old copy), and SQLite's own counters are recomputed from the order rows.
 *
 * On a live system the two stores are read at different moments, so an
 * order in flight can show as a passing difference; run it on a quiet
 * system, or run it twice. Exit: 0 consistent (after repair, if asked),
 * 1 discrepancies remain, 2 usage or connection error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <unistd.h>

#include "db/holds.h"
#include "service/app.h"
#include "service/products.h"
#include "service/repair/repair.h"

typedef struct audit {
    svc_app *a;
    db *d;
    stock_conn *sc;
    int repair;
    int problems;        /* discrepancies found */
    int fixed;           /* of which repaired */
} audit;

typedef struct pend_sum {
    svc_app *a;
    db *d;
    stock_conn *sc;
    long long uncommitted;   /* units of reservations whose order is not in SQLite */
    int orphans;
    int committed_records;   /* records of committed orders not yet cleared */
} pend_sum;

static void sum_pending(const stock_pending *rec, void *ud) {
    pend_sum *ps = ud;
    db_status st = db_order_state(ps->d, rec->order_id);
    if (st == DB_OK) {
        ps->committed_records++;
        return;
    }
    ps->uncommitted += rec->quantity;
    int alive = rec->instance[0] ? stock_instance_alive(ps->sc, rec->instance) : 0;
    if (alive != 1 || rec->age_ms >= ps->a->cfg.pending_timeout_ms) {
        ps->orphans++;
        printf("  orphan pending record %s: %lld unit(s), owner %s %s, %lld ms old\n",
               rec->order_id, rec->quantity, rec->instance[0] ? rec->instance : "(none)",
               alive == 1 ? "alive" : "gone", rec->age_ms);
    }
}

static void problem(audit *au, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(audit *au, const char *fmt, ...) {
    va_list ap;
    au->problems++;
    printf("  DISCREPANCY: ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* Audits one product (and repairs it when asked). Returns -1 when Redis
 * failed, which ends the audit. */
static int audit_product(audit *au, const db_product *dp) {
    svc_app *a = au->a;
    svc_product *p = svc_product_cache_put(a->products, dp);
    long long units = 0;
    if (!p) {
        problem(au, "%s has an unknown strategy %s", dp->sku, dp->strategy);
        return 0;
    }
    const stock_strategy_info *si = stock_strategy_about(p->strategy);
    printf("%s (%s, %d segment(s)): stock_initial %lld, sold %lld, held %lld\n", dp->sku,
           si->name, dp->segments, dp->stock_initial, dp->sold, dp->held);
    int before = au->problems;
    long long sold = dp->sold, held = dp->held, held_rows = 0, owed = 0;
    if (db_order_units(au->d, dp->sku, &units, &held_rows) != DB_OK ||
        db_hold_owed_units(au->d, dp->sku, &owed) != DB_OK) {
        problem(au, "cannot sum the order rows: %s", db_errstr(au->d));
        return 0;
    }
    if (units != dp->sold || held_rows != dp->held) {
        problem(au, "sold is %lld and held %lld, but the order rows hold %lld and %lld units",
                dp->sold, dp->held, units, held_rows);
        long long now_sold = 0, now_held = 0;
        if (au->repair &&
            db_product_repair(au->d, dp->sku, !si->uses_redis, &now_sold, &now_held) == DB_OK) {
            printf("  repaired: sold and held set to %lld and %lld from the order rows\n",
                   now_sold, now_held);
            au->fixed++;
            sold = now_sold;
            held = now_held;
        }
    }
    /* Units out of the stock: sold, held, and those of ended holds whose
     * return to the Redis copy is still under way. */
    long long out = sold + held + owed;
    if (!si->uses_redis) {
        if (dp->db_available != dp->stock_initial - sold - held) {
            problem(au, "available %lld != stock_initial - sold - held = %lld", dp->db_available,
                    dp->stock_initial - sold - held);
            long long now_sold = 0, now_held = 0;
            if (au->repair &&
                db_product_repair(au->d, dp->sku, 1, &now_sold, &now_held) == DB_OK) {
                printf("  repaired: available set to %lld\n",
                       dp->stock_initial - now_sold - now_held);
                au->fixed++;
            }
        }
        if (au->problems == before) printf("  consistent: %lld available\n", dp->db_available);
        return 0;
    }

    long long total = 0, *seg = calloc((size_t)p->segments, sizeof *seg);
    stock_result res = seg ? stock_read(au->sc, &p->sp, &total, seg) : STOCK_UNAVAILABLE;
    if (res == STOCK_UNAVAILABLE) {
        free(seg);
        problem(au, "redis: %s", stock_conn_errstr(au->sc));
        return -1;
    }
    pend_sum ps = { a, au->d, au->sc, 0, 0, 0 };
    int rebuild = 0;
    if (res == STOCK_MISSING) {
        problem(au, "no valid Redis copy (lost, or built for another Redis process)");
        rebuild = 1;
    } else {
        for (int i = 0; i < p->segments; i++)
            if (seg[i] < 0) problem(au, "segment %d holds %lld units", i, seg[i]);
        stock_pending_scan(au->sc, &p->sp, sum_pending, &ps);
        if (ps.orphans) {
            au->problems += ps.orphans;
            if (au->repair) {
                /* This product's records only: the others are audited in
                 * their turn. */
                int n = svc_reconcile_product(a, au->d, au->sc, p, 1);
                if (n > 0) {
                    printf("  repaired: settled %d pending reservation(s)\n", n);
                    au->fixed += n;
                }
                if (n >= 0 && n < ps.orphans)
                    printf("  NOT repaired: %d pending reservation(s) could not be settled\n",
                           ps.orphans - n);
            }
        }
        if (total + ps.uncommitted != dp->stock_initial - out) {
            problem(au, "Redis holds %lld units and %lld reserved in flight; SQLite says %lld "
                    "(%lld unaccounted)", total, ps.uncommitted, dp->stock_initial - out,
                    dp->stock_initial - out - total - ps.uncommitted);
            rebuild = 1;
        }
    }
    free(seg);
    if (rebuild && au->repair) {
        if (svc_rebuild(a, au->d, au->sc, p, 1) == 0) {
            printf("  repaired: rebuilt the Redis copy from SQLite (%lld available)\n",
                   dp->stock_initial - sold - held);
            au->fixed++;
        }
    }
    if (au->problems == before)
        printf("  consistent: %lld available in Redis, %lld reserved in flight, %d record(s) "
               "of committed orders awaiting cleanup\n",
               total, ps.uncommitted, ps.committed_records);
    return 0;
}

int svc_audit_main(svc_app *a, int repair) {
    char err[256];
    audit au = { .a = a, .repair = repair };
    snprintf(a->instance_name, sizeof a->instance_name, "audit");
    snprintf(a->instance_id, sizeof a->instance_id, "audit#%d", (int)getpid());
    a->stock_cfg.instance = a->instance_id;
    a->db_opt.readonly = !repair;
    if (!(au.d = db_open(a->cfg.db_path, &a->db_opt, err, sizeof err))) {
        char shown[600];
        db_target_redact(a->cfg.db_path, shown, sizeof shown);
        fprintf(stderr, "flashsale audit: %s: %s\n", shown, err);
        return 2;
    }
    if (!(au.sc = stock_conn_new(&a->stock_cfg, err, sizeof err)) || stock_ping(au.sc) != 0) {
        fprintf(stderr, "flashsale audit: redis: %s\n", au.sc ? stock_conn_errstr(au.sc) : err);
        stock_conn_free(au.sc);
        db_close(au.d);
        return 2;
    }
    a->products = svc_product_cache_new(a->cluster != NULL);
    db_product *all = NULL;
    size_t n = 0;
    if (db_product_list(au.d, &all, &n) != DB_OK)
        problem(&au, "cannot list the products: %s", db_errstr(au.d));
    for (size_t i = 0; i < n && audit_product(&au, &all[i]) == 0; i++) {}
    free(all);
    int left = au.problems - au.fixed;
    if (au.problems == 0) printf("audit: consistent\n");
    else if (repair) printf("audit: %d discrepancies, %d repaired, %d left\n", au.problems, au.fixed,
                            left);
    else printf("audit: %d discrepancies (run with --repair to fix what is safely fixable)\n",
                au.problems);
    stock_conn_free(au.sc);
    db_close(au.d);
    svc_product_cache_free(a->products);
    return left > 0 || (!repair && au.problems) ? 1 : 0;
}
