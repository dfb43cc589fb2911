/* recover.c: bringing Redis in line with SQLite at start-up, before the
 * service serves: every product is cached, each missing Redis copy is
 * rebuilt, and the pending reservations of dead instances (a previous run
 * killed with -9, say) are settled. Redis being down is not fatal: orders
 * answer 503 and the maintenance thread catches up. */
#include <stdlib.h>

#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/repair/repair.h"

typedef struct start_ctx {
    svc_app *a;
    db *d;
    stock_conn *sc;
    int rebuilt, failed;
} start_ctx;

/* Rebuilds p's Redis copy if it is missing; 0, or -1 when Redis failed. */
static int check_copy(start_ctx *s, const db_product *dp) {
    long long total;
    svc_product *p = svc_product_cache_put(s->a->products, dp);
    if (!p || !stock_strategy_about(p->strategy)->uses_redis) return 0;
    stock_result res = stock_read(s->sc, &p->sp, &total, NULL);
    if (res == STOCK_UNAVAILABLE) return -1;
    if (res == STOCK_MISSING) {
        if (svc_rebuild(s->a, s->d, s->sc, p, 0) != 0) return -1;
        s->rebuilt++;
    }
    return 0;
}

void svc_repair_recover(svc_app *a, db *d) {
    char err[256];
    start_ctx s = { a, d, stock_conn_new(&a->stock_cfg, err, sizeof err), 0, 0 };
    if (!s.sc) return;
    stock_heartbeat(s.sc, 5000);
    db_product *all = NULL;
    size_t n = 0;
    if (db_product_list(d, &all, &n) != DB_OK) s.failed = 1;
    for (size_t i = 0; i < n && !s.failed; i++) s.failed = check_copy(&s, &all[i]) != 0;
    free(all);
    int settled = s.failed ? -1 : svc_reconcile(a, d, s.sc, 1);
    if (s.failed || settled < 0)
        svc_log(SVC_LOG_WARN, "start: Redis not ready (%s); will retry in the background",
                stock_conn_errstr(s.sc));
    else
        svc_log(SVC_LOG_INFO, "start: %d stock copies rebuilt, %d pending reservations settled",
                s.rebuilt, settled);
    stock_conn_free(s.sc);
}
