/* verify.c: the invariants of a flash sale, checked from four vantage
 * points, so a bug cannot hide behind the one place it also corrupted:
 *
 *   client  what the buyers were told: units confirmed by 201s never exceed
 *           the stock, no order id is confirmed twice, one idempotency key
 *           never yields two orders, the per-user limit holds;
 *   api     GET /v1/products/{sku}: sold + available == initial, available
 *           never below zero (also in every sample taken while running),
 *           and GET /v1/orders?sku= lists exactly the 201s the client got;
 *   redis   the stock keys (a valid copy, no segment below zero, no units in
 *           a segment the empty bitmap marks empty: those are stranded, as
 *           no order can take them while every sum counts them) and the
 *           pending records (none left once the load is over and has settled);
 *   sqlite  the order rows, read-only: they match the 201s, products.sold is
 *           their sum, no key twice, no user over the limit, no order both
 *           committed and voided.
 *
 * Redis and SQLite are read by stores.c, by the documented format, never
 * through the service's code; where the stock lives (Redis or SQLite) is
 * what the service says of the product's strategy (GET /v1/strategies).
 *
 * An order row without a 201 is allowed only when the client saw a
 * transport error for a request that could have created it: matched by
 * idempotency key when the row has one of ours, else by (user, quantity).
 *
 * A product with holds is first given time to settle (every hold ended,
 * its units back); its sold units are then the confirmed orders', and
 * holds.c checks each hold's end against what its buyer was told.
 *
 * Each violation carries its size ("oversold by 37 units", "stock reached
 * -12", "3 orders without a 201"); the verdict is PASS only without any. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "loadtest/verify/verify_int.h"

/* ------------------------------------------------------------ stock's home */

/* Opens a Redis reader for the product when Redis holds its stock, as the
 * service says of its strategy (GET /v1/strategies). *home: 1 Redis, 0
 * SQLite, -1 unknown (e says why). NULL when Redis is not to be read. */
static fl_redis *open_redis(const fl_vantage *v, fl_http *h, const fl_product *p, int *home,
                            fl_err *e) {
    fl_strategy st;
    *home = -1;
    if (fl_strategy_lookup(h, p->strategy, &st, e)) return NULL;
    *home = st.in_redis;
    if (!st.in_redis || !v->redis_url[0]) return NULL;
    return fl_redis_open(v->redis_url, v->key_prefix[0] ? v->key_prefix : "fs:", 2000, e);
}

/* ----------------------------------------------------------------- sampler */

struct fl_sampler {
    fl_http api;
    char sku[65];
    fl_redis *redis;              /* NULL: Redis not sampled */
    int segments;
    int lanes;                    /* spread over a cluster's lanes (fl_redis_lanes), else 0 */
    fl_samples s;
};

fl_sampler *fl_sampler_new(const fl_vantage *v, const fl_product *p, fl_err *e) {
    fl_sampler *s = calloc(1, sizeof *s);
    if (!s) {
        fl_errf(e, "out of memory");
        return NULL;
    }
    fl_http_init(&s->api, &v->api, v->token, 2000);
    snprintf(s->sku, sizeof s->sku, "%s", p->sku);
    s->segments = p->segments > 0 ? p->segments : 1;
    s->s.min_available = s->s.min_segment = s->s.min_redis_segment = LLONG_MAX;
    fl_err ignore;
    int home;
    s->redis = open_redis(v, &s->api, p, &home, &ignore);
    s->lanes = fl_redis_lanes(s->redis, p->strategy, s->segments);
    return s;
}

void fl_sampler_sample(fl_sampler *s) {
    fl_product p;
    fl_err e;
    if (fl_product_get(&s->api, s->sku, &p, &e) == 0) {
        s->s.n++;
        if (p.stock_available < s->s.min_available) s->s.min_available = p.stock_available;
        if (p.min_segment < s->s.min_segment) s->s.min_segment = p.min_segment;
        if (p.stock_available < 0 || p.min_segment < 0) s->s.negative++;
        if (p.stock_available <= 0 && !s->s.first_empty_ms) s->s.first_empty_ms = clock_wall_ms();
    } else {
        s->s.errors++;
    }
    fl_stock_copy c;
    if (s->redis && fl_redis_stock(s->redis, s->sku, s->segments, s->lanes, &c, &e) == 0 &&
        c.state == FL_COPY_VALID) {
        s->s.redis_n++;
        if (c.low < s->s.min_redis_segment) s->s.min_redis_segment = c.low;
        s->s.redis_negative += (uint64_t)(c.low < 0);
        if (c.stranded) {
            s->s.redis_stranded++;
            if (c.stranded_units > s->s.max_stranded) s->s.max_stranded = c.stranded_units;
        }
    }
}

void fl_sampler_get(const fl_sampler *s, fl_samples *out) { *out = s->s; }

void fl_sampler_free(fl_sampler *s) {
    if (!s) return;
    fl_http_close(&s->api);
    fl_redis_close(s->redis);
    free(s);
}

/* ---------------------------------------------------------------- baseline */

typedef struct id_list {
    fl_order_id *ids;
    size_t n, cap;
    long long units;
} id_list;

static void collect_id(const char *id, const char *user, int qty, const char *key,
                       const char *state, void *ud) {
    id_list *l = ud;
    (void)user;
    (void)key;
    (void)state;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        void *p = realloc(l->ids, cap * sizeof *l->ids);
        if (!p) return;
        l->ids = p;
        l->cap = cap;
    }
    snprintf(l->ids[l->n++], 27, "%s", id);
    l->units += qty;
}

static int cmp_key_str(const void *a, const void *b) { return strcmp(a, b); }

/* qsort, for arrays that may be empty (and then NULL). */
static void sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
    if (n > 1) qsort(base, n, size, cmp);
}

int fl_baseline_take(fl_http *h, const char *sku, fl_baseline *b, fl_err *e) {
    memset(b, 0, sizeof *b);
    if (fl_product_get(h, sku, &b->p, e)) return -1;
    id_list l = { 0 };
    if (fl_orders_each(h, sku, collect_id, &l, e) < 0) {
        free(l.ids);
        return -1;
    }
    sort(l.ids, l.n, sizeof *l.ids, fl_order_id_cmp);
    b->ids = l.ids;
    b->nids = l.n;
    b->units = l.units;
    return 0;
}

void fl_baseline_free(fl_baseline *b) {
    free(b->ids);
    b->ids = NULL;
    b->nids = 0;
}

/* --------------------------------------------------- what the client knows */

/* The client's orders, sorted by id, for matching against rows. */
typedef struct known {
    fl_order_rec *o;             /* created then replayed, sorted by id */
    size_t n;
    fl_lost_rec *lost;           /* sorted by (user, qty) */
    char *lost_used;
    size_t nlost;
    uint64_t *lost_keys;         /* sorted keys of lost requests sent with one */
    size_t nlost_keys;
    char *lost_key_used;
} known;

static int fl_order_rec_cmp(const void *a, const void *b) {
    return strcmp(((const fl_order_rec *)a)->order_id, ((const fl_order_rec *)b)->order_id);
}

/* By key, then order id. */
static int cmp_key_id(const void *a, const void *b) {
    const fl_order_rec *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return strcmp(x->order_id, y->order_id);
}

static int cmp_lost(const void *a, const void *b) {
    const fl_lost_rec *x = a, *y = b;
    if (x->user != y->user) return x->user < y->user ? -1 : 1;
    return (int)x->qty - (int)y->qty;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int known_init(known *k, const fl_load_result *r) {
    memset(k, 0, sizeof *k);
    k->n = r->ncreated + r->nreplayed;
    k->o = malloc((k->n + 1) * sizeof *k->o);
    k->lost = malloc((r->nlost + 1) * sizeof *k->lost);
    k->lost_used = calloc(r->nlost + 1, 1);
    k->lost_keys = malloc((r->nlost + 1) * sizeof *k->lost_keys);
    k->lost_key_used = calloc(r->nlost + 1, 1);
    if (!k->o || !k->lost || !k->lost_used || !k->lost_keys || !k->lost_key_used) return -1;
    if (r->ncreated) memcpy(k->o, r->created, r->ncreated * sizeof *k->o);
    if (r->nreplayed) memcpy(k->o + r->ncreated, r->replayed, r->nreplayed * sizeof *k->o);
    sort(k->o, k->n, sizeof *k->o, fl_order_rec_cmp);
    k->nlost = r->nlost;
    if (r->nlost) memcpy(k->lost, r->lost, r->nlost * sizeof *k->lost);
    sort(k->lost, k->nlost, sizeof *k->lost, cmp_lost);
    for (size_t i = 0; i < r->nlost; i++)
        if (r->lost[i].key != FL_NO_KEY) k->lost_keys[k->nlost_keys++] = r->lost[i].key;
    sort(k->lost_keys, k->nlost_keys, sizeof *k->lost_keys, cmp_u64);
    return 0;
}

static void known_reset_matches(known *k) {
    memset(k->lost_used, 0, k->nlost + 1);
    memset(k->lost_key_used, 0, k->nlost + 1);
}

static void known_free(known *k) {
    free(k->o);
    free(k->lost);
    free(k->lost_used);
    free(k->lost_keys);
    free(k->lost_key_used);
}

static const fl_order_rec *known_find(const known *k, const char *id) {
    fl_order_rec probe;
    snprintf(probe.order_id, sizeof probe.order_id, "%s", id);
    return k->n ? bsearch(&probe, k->o, k->n, sizeof *k->o, fl_order_rec_cmp) : NULL;
}

/* Parses "u<number>", the user ids flashload sends. */
static int parse_user(const char *user, uint32_t *out) {
    if (user[0] != 'u' || !user[1]) return -1;
    char *end;
    unsigned long v = strtoul(user + 1, &end, 10);
    if (*end || v > UINT32_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* Parses "fl-<tag>-<n>" with this run's tag. */
static int parse_key(const char *tag, const char *key, uint64_t *out) {
    size_t tl = strlen(tag);
    if (strncmp(key, "fl-", 3) || strncmp(key + 3, tag, tl) || key[3 + tl] != '-') return -1;
    char *end;
    unsigned long long v = strtoull(key + 4 + tl, &end, 10);
    if (*end) return -1;
    *out = v;
    return 0;
}

/* Whether a row the client holds no 2xx for is explained by a request that
 * was sent and never answered; each such request explains one row. */
static int explain(known *k, const char *tag, const char *user, int qty, const char *key) {
    uint64_t kid;
    if (key && key[0]) {
        if (parse_key(tag, key, &kid)) return 0;
        uint64_t *hit = k->nlost_keys ? bsearch(&kid, k->lost_keys, k->nlost_keys,
                                                sizeof *k->lost_keys, cmp_u64)
                                      : NULL;
        if (!hit) return 0;
        size_t i = (size_t)(hit - k->lost_keys);
        if (k->lost_key_used[i]) return 0;   /* one key, one order: a second row is not */
        k->lost_key_used[i] = 1;
        return 1;
    }
    fl_lost_rec probe = { 0, (uint16_t)qty, 0 };
    if (parse_user(user, &probe.user)) return 0;
    fl_lost_rec *hit = k->nlost ? bsearch(&probe, k->lost, k->nlost, sizeof *k->lost, cmp_lost)
                                : NULL;
    if (!hit) return 0;
    size_t i = (size_t)(hit - k->lost);
    while (i > 0 && cmp_lost(&k->lost[i - 1], &probe) == 0) i--;
    for (; i < k->nlost && cmp_lost(&k->lost[i], &probe) == 0; i++)
        if (!k->lost_used[i]) {
            k->lost_used[i] = 1;
            return 1;
        }
    return 0;
}

/* Per-user units, for the limit. */
typedef struct user_units {
    char user[64];
    long long units;
} user_units;

static int cmp_user(const void *a, const void *b) {
    return strcmp(((const user_units *)a)->user, ((const user_units *)b)->user);
}

/* Sorts u[0..n) and folds equal users; returns the users over limit and the
 * worst of them in *worst. */
static size_t over_limit(user_units *u, size_t n, long long limit, user_units *worst) {
    sort(u, n, sizeof *u, cmp_user);
    size_t over = 0;
    worst->units = 0;
    for (size_t i = 0; i < n;) {
        long long units = 0;
        size_t j = i;
        for (; j < n && !strcmp(u[j].user, u[i].user); j++) units += u[j].units;
        if (units > limit) {
            over++;
            if (units > worst->units) {
                *worst = u[i];
                worst->units = units;
            }
        }
        i = j;
    }
    return over;
}

/* Units confirmed by 201s never exceed what was for sale (with holds, a
 * 201 is a reservation whose units may come back and sell again: the
 * confirms answered 200 are checked instead, by holds.c). */
static void check_client_units(const fl_load_result *r, long long run_stock, int holds,
                               fl_verdict *vd) {
    long long units = 0;
    size_t noid = 0;
    for (size_t i = 0; i < r->ncreated; i++) {
        units += r->created[i].qty;
        if (!r->created[i].order_id[0]) noid++;
    }
    vd->units_201 = units;
    if (units > run_stock && !holds)
        fl_violate(vd, "client", units - run_stock,
                "oversold by %lld units: the client holds 201s for %lld units of %lld",
                units - run_stock, units, run_stock);
    if (noid) fl_violate(vd, "client", (long long)noid, "%zu 201s without an order id", noid);
}

/* No order id is confirmed by two 201s. */
static void check_client_ids(const fl_load_result *r, fl_verdict *vd) {
    fl_order_rec *c = malloc((r->ncreated + 1) * sizeof *c);
    if (!c) return;
    if (r->ncreated) memcpy(c, r->created, r->ncreated * sizeof *c);
    sort(c, r->ncreated, sizeof *c, fl_order_rec_cmp);
    size_t dup = 0;
    for (size_t i = 1; i < r->ncreated; i++)
        if (c[i].order_id[0] && !strcmp(c[i].order_id, c[i - 1].order_id)) dup++;
    if (dup) fl_violate(vd, "client", (long long)dup, "%zu order ids confirmed twice (201)", dup);
    free(c);
}

/* One key, one order: every 201 and every replay of a key name the same id. */
static void check_client_keys(const fl_load_result *r, fl_verdict *vd) {
    size_t twice = 0, m = 0;
    fl_order_rec *k = malloc((r->ncreated + r->nreplayed + 1) * sizeof *k);
    if (!k) return;
    for (size_t i = 0; i < r->ncreated; i++)
        if (r->created[i].key != FL_NO_KEY) k[m++] = r->created[i];
    for (size_t i = 0; i < r->nreplayed; i++)
        if (r->replayed[i].key != FL_NO_KEY) k[m++] = r->replayed[i];
    sort(k, m, sizeof *k, cmp_key_id);
    for (size_t i = 0; i < m;) {
        size_t j = i + 1;
        int differ = 0;
        for (; j < m && k[j].key == k[i].key; j++)
            differ |= strcmp(k[j].order_id, k[i].order_id) != 0;
        twice += (size_t)differ;
        i = j;
    }
    if (twice)
        fl_violate(vd, "client", (long long)twice,
                "%zu idempotency keys were answered with two different orders", twice);
    free(k);
}

static void check_client(const fl_verify_in *in, const fl_holds *hx, long long run_stock,
                         fl_verdict *vd) {
    check_client_units(in->load, run_stock, hx->on, vd);
    check_client_ids(in->load, vd);
    check_client_keys(in->load, vd);
    fl_holds_check_client(hx, run_stock, vd);
}

/* The units the client was told each user bought: every 201, or with
 * holds those whose confirm was answered 200 (a cancelled or expired hold
 * does not count toward the limit). */
static void check_client_limit(const fl_verify_in *in, const fl_holds *hx, long long limit,
                               fl_verdict *vd) {
    const fl_load_result *r = in->load;
    if (limit <= 0 || !r->ncreated) return;
    user_units *u = malloc(r->ncreated * sizeof *u);
    if (!u) return;
    size_t n = 0;
    for (size_t i = 0; i < r->ncreated; i++) {
        if (hx->on && !fl_holds_paid(hx, r->created[i].order_id)) continue;
        snprintf(u[n].user, sizeof u[n].user, "u%u", r->created[i].user);
        u[n++].units = r->created[i].qty;
    }
    user_units worst;
    size_t over = over_limit(u, n, limit, &worst);
    if (over)
        fl_violate(vd, "client", (long long)over,
                "%zu users got 201s beyond the per-user limit of %lld (%s: %lld units)", over,
                limit, worst.user, worst.units);
    free(u);
}

/* ----------------------------------------------------------- order rows */

/* Rows of one vantage point, compared with what the client knows. */
typedef struct rows_ctx {
    known *k;
    const fl_baseline *base;
    const char *tag;
    fl_holds *hx;                /* the product's holds (inert without) */
    fl_hold_rows hr;             /* the rows as holds see them */
    fl_order_id *seen;           /* row ids of this run, to find 201s without a row */
    size_t nseen, capseen;
    user_units *users;
    size_t nusers, capusers;
    char (*keys)[FL_KEY_MAX + 1];
    size_t nkeys, capkeys;
    long long units_all;         /* every row sold (confirmed), baseline included */
    long long units_run;
    long long rows_run;
    long long without_201, explained;
    fl_order_id without_ids[3];  /* the first few rows without a 201, to name them */
    fl_order_id last;            /* the last row's id: rows come in id order */
} rows_ctx;

static void *grow_arr(void *p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return p;
    size_t c = *cap ? *cap * 2 : 256;
    void *q = realloc(p, c * elem);
    if (!q) return NULL;
    *cap = c;
    return q;
}

static void on_row(const char *id, const char *user, int qty, const char *key,
                   const char *state, void *ud) {
    rows_ctx *x = ud;
    int this_run = !fl_baseline_has(x->base, id);
    snprintf(x->last, sizeof x->last, "%s", id);
    fl_holds_row(x->hx, &x->hr, id, qty, state, this_run);
    if (fl_holds_sold_state(state)) x->units_all += qty;
    void *p = fl_holds_counts_for_limit(state)
                  ? grow_arr(x->users, &x->capusers, x->nusers, sizeof *x->users)
                  : NULL;
    if (p) {
        x->users = p;
        snprintf(x->users[x->nusers].user, sizeof x->users[x->nusers].user, "%s", user);
        x->users[x->nusers++].units = qty;
    }
    if (key && key[0] && (p = grow_arr(x->keys, &x->capkeys, x->nkeys, sizeof *x->keys))) {
        x->keys = p;
        snprintf(x->keys[x->nkeys++], FL_KEY_MAX + 1, "%s", key);
    }
    if (!this_run) return;
    x->rows_run++;
    x->units_run += qty;
    if ((p = grow_arr(x->seen, &x->capseen, x->nseen, sizeof *x->seen))) {
        x->seen = p;
        snprintf(x->seen[x->nseen++], 27, "%s", id);
    }
    if (known_find(x->k, id)) return;
    if (explain(x->k, x->tag, user, qty, key)) {
        x->explained++;
        return;
    }
    if (x->without_201 < 3) snprintf(x->without_ids[x->without_201], 27, "%s", id);
    x->without_201++;
}

static void rows_free(rows_ctx *x) {
    free(x->seen);
    free(x->users);
    free(x->keys);
}

/* The checks common to the API's and SQLite's lists of rows. */
static void check_rows(rows_ctx *x, const char *vantage, const fl_verify_in *in, long long sold,
                       long long limit, fl_verdict *vd) {
    const fl_load_result *r = in->load;
    if (x->without_201 > vd->orders_without_201) vd->orders_without_201 = x->without_201;
    if (x->without_201)
        fl_violate(vd, vantage, x->without_201, "%lld orders without a 201%s: %s%s%s%s%s%s",
                   x->without_201,
                   x->explained ? " (beyond those explained by transport errors)" : "",
                   x->without_ids[0], x->without_201 > 1 ? ", " : "", x->without_ids[1],
                   x->without_201 > 2 ? ", " : "", x->without_ids[2],
                   x->without_201 > 3 ? ", ..." : "");
    sort(x->seen, x->nseen, sizeof *x->seen, fl_order_id_cmp);
    size_t missing = 0;
    for (size_t i = 0; i < r->ncreated; i++)
        if (!x->nseen ||
            !bsearch(r->created[i].order_id, x->seen, x->nseen, sizeof *x->seen, fl_order_id_cmp))
            missing++;
    if (missing)
        fl_violate(vd, vantage, (long long)missing, "%zu orders confirmed by a 201 are not recorded",
                missing);
    if ((long long)missing > vd->created_without_order) vd->created_without_order = (long long)missing;
    size_t ghost = 0;
    for (size_t i = 0; i < r->nreplayed; i++)
        if (r->replayed[i].order_id[0] &&
            (!x->nseen ||
             !bsearch(r->replayed[i].order_id, x->seen, x->nseen, sizeof *x->seen, fl_order_id_cmp)))
            ghost++;
    if (ghost)
        fl_violate(vd, vantage, (long long)ghost, "%zu replays named orders that are not recorded",
                ghost);
    if (x->units_all != sold)
        fl_violate(vd, vantage, llabs(sold - x->units_all),
                "sold says %lld units but the %sorder rows add up to %lld", sold,
                x->hx->on ? "confirmed " : "", x->units_all);
    fl_holds_check_rows(x->hx, &x->hr, vantage, sold - (in->base ? in->base->p.sold : 0), vd);
    if (limit > 0 && x->nusers) {
        user_units worst;
        size_t over = over_limit(x->users, x->nusers, limit, &worst);
        if (over)
            fl_violate(vd, vantage, (long long)over,
                    "%zu users bought beyond the per-user limit of %lld (%s: %lld units)", over,
                    limit, worst.user, worst.units);
    }
    if (x->nkeys) {
        sort(x->keys, x->nkeys, sizeof *x->keys, cmp_key_str);
        size_t dup = 0;
        for (size_t i = 1; i < x->nkeys; i++) dup += !strcmp(x->keys[i], x->keys[i - 1]);
        if (dup)
            fl_violate(vd, vantage, (long long)dup, "%zu idempotency keys appear on two orders", dup);
    }
    if (x->explained > vd->explained_by_errors) vd->explained_by_errors = x->explained;
}

/* ----------------------------------------------------------------- settle */

typedef struct pend {
    long long records, units, unreadable;   /* records -1: not read */
} pend;

/* Waits (up to settle_ms) until nothing is pending and two reads of the
 * product agree: the pipeline has finished with every answered request. */
static int fl_verify_settle(const fl_verify_in *in, fl_http *h, fl_redis *rd, int lanes,
                            fl_product *p, pend *pd, fl_err *e) {
    int64_t deadline = clock_mono_ms() + in->settle_ms;
    fl_product prev;
    int have_prev = 0;
    for (;;) {
        fl_err ignore;
        if (fl_product_get(h, in->sku, p, e)) return -1;
        memset(pd, 0, sizeof *pd);
        if (rd && fl_redis_pending(rd, in->sku, lanes, &pd->records, &pd->units,
                                   &pd->unreadable, &ignore) != 0)
            pd->records = -1;
        int same = have_prev && prev.sold == p->sold && prev.stock_available == p->stock_available;
        if (same && pd->records <= 0) return 0;
        if (clock_mono_ms() >= deadline) return 0;
        prev = *p;
        have_prev = 1;
        clock_sleep_ms(100);
    }
}

/* ------------------------------------------------------------- vantages */

/* " + held <n>" when units are held, for the books' messages ("" else:
 * a product without holds reads as it always did). */
static const char *held_text(long long held, char *buf, size_t len) {
    if (!held) return "";
    snprintf(buf, len, " + held %lld", held);
    return buf;
}

/* The product's numbers: nothing oversold, nothing below zero (now or in
 * any sample), nothing lost beyond what is still pending; held units
 * (holds still reserved) are neither. */
static void check_api_stock(const fl_verify_in *in, const fl_product *p, const pend *pd,
                            fl_verdict *vd) {
    long long avail = p->stock_available, shown = avail > 0 ? avail : 0;
    long long low = avail < p->min_segment ? avail : p->min_segment;
    char hb[48];
    const char *ht = held_text(p->held, hb, sizeof hb);
    fl_see_stock(vd, avail);
    fl_see_stock(vd, p->min_segment);
    long long over = p->sold + p->held + shown - p->stock_initial;
    if (over > 0 && avail > 0)
        fl_violate(vd, "api", over, "oversold by %lld units: sold %lld%s + available %lld > stock "
                   "%lld", over, p->sold, ht, avail, p->stock_initial);
    else if (over > 0)
        fl_violate(vd, "api", over, "oversold by %lld units: sold %lld%s > stock %lld", over,
                   p->sold, ht, p->stock_initial);
    if (low < 0) fl_violate(vd, "api", low, "stock reached %lld (at the end)", low);
    long long lost = p->stock_initial - p->sold - p->held - shown -
                     (pd->records > 0 ? pd->units : 0);
    if (avail >= 0 && lost > 0) {
        fl_violate(vd, "api", lost, "%lld units lost: neither sold nor available (sold %lld%s + "
                "available %lld of %lld)", lost, p->sold, ht, avail, p->stock_initial);
        if (lost > vd->lost) vd->lost = lost;
    }
    const fl_samples *s = in->samples;
    if (!s || !s->n) return;
    long long m = s->min_available < s->min_segment ? s->min_available : s->min_segment;
    fl_see_stock(vd, m);
    if (m < 0)
        fl_violate(vd, "api", m, "stock reached %lld while the load ran (%llu of %llu samples "
                "below zero)", m, (unsigned long long)s->negative, (unsigned long long)s->n);
}

/* GET /v1/orders?sku= against the 201s. Returns 0, or -1 with e set. */
static int check_api_rows(const fl_verify_in *in, fl_http *h, const fl_product *p, known *k,
                          fl_holds *hx, fl_verdict *vd, fl_err *e) {
    rows_ctx x = { .k = k, .base = in->base, .tag = in->load->key_tag, .hx = hx };
    known_reset_matches(k);
    int rc = -1;
    if (fl_orders_each(h, in->sku, on_row, &x, e) >= 0) {
        vd->orders_listed = x.rows_run;
        check_rows(&x, "api", in, p->sold, p->per_user_limit, vd);
        vd->api_checked = 1;
        rc = 0;
    }
    rows_free(&x);
    return rc;
}

/* The copy against the books: what is in Redis plus what pending records
 * hold out is what is left to sell (stock_initial - sold - held, by
 * `whose`): every cancelled or expired hold's units are back, once. */
static void check_redis_books(const fl_stock_copy *c, const pend *pd, long long initial,
                              long long sold, long long held, const char *whose,
                              fl_verdict *vd) {
    long long shown = c->total > 0 ? c->total : 0;
    long long pending = pd->records > 0 ? pd->units : 0;
    char hb[48];
    const char *ht = held_text(held, hb, sizeof hb);
    long long over = sold + held + shown - initial;
    if (over > 0)
        fl_violate(vd, "redis", over, "oversold by %lld units: sold %lld%s (%s) + %lld units in "
                "Redis > stock %lld", over, sold, ht, whose, c->total, initial);
    long long lost = initial - sold - held - shown - pending;
    if (c->total >= 0 && lost > 0) {
        fl_violate(vd, "redis", lost, "%lld units lost: neither sold (%lld%s, %s) nor in Redis "
                "(%lld) nor pending (%lld) of %lld", lost, sold, ht, whose, c->total, pending,
                initial);
        if (lost > vd->lost) vd->lost = lost;
    }
}

/* Redis, read by its documented format. The books (stock_initial, sold)
 * are SQLite's as read by us when we read it (db), else the API's (p). */
static void check_redis(const fl_verify_in *in, fl_redis *rd, const fl_product *p,
                        const fl_db_sku *db, const pend *pd, const fl_holds *hx,
                        fl_verdict *vd) {
    int segments = p->segments > 0 ? p->segments : 1;
    fl_stock_copy c;
    fl_err e;
    char why[160];
    if (fl_redis_stock(rd, in->sku, segments, fl_redis_lanes(rd, p->strategy, segments), &c, &e)) {
        fl_note(vd, "redis not checked: %s", e.msg);
        return;
    }
    if (c.state != FL_COPY_VALID) {
        fl_violate(vd, "redis", 0, "no valid stock copy in Redis for the SKU (%s)",
                   fl_copy_why(&c, why, sizeof why));
    } else {
        fl_see_stock(vd, c.total);
        fl_see_stock(vd, c.low);
        if (c.low < 0)
            fl_violate(vd, "redis", c.low, "stock key %s%d reached %lld", c.lanes ? "of lane " : "",
                       c.low_seg, c.low);
        if (db) check_redis_books(&c, pd, db->stock_initial, db->sold, db->held, db->vantage, vd);
        else check_redis_books(&c, pd, p->stock_initial, p->sold, p->held, "api", vd);
        fl_holds_check_returned(hx, rd, &c, vd);
        vd->stranded = c.stranded_units;
        if (c.stranded)
            fl_violate(vd, "redis", c.stranded_units,
                    "%lld units stranded: %d segment%s marked empty in the bitmap still "
                    "hold%s units (first: segment %d); no order can take them",
                    c.stranded_units, c.stranded, c.stranded == 1 ? "" : "s",
                    c.stranded == 1 ? "s" : "", c.stranded_seg);
    }
    if (pd->records > 0)
        fl_violate(vd, "redis", pd->units, "%lld reservations (%lld units) still pending after %d ms",
                pd->records, pd->units, in->settle_ms);
    if (pd->unreadable > 0)
        fl_note(vd, "redis: %lld pending records without a readable quantity", pd->unreadable);
    if (pd->records >= 0) vd->pending_records = pd->records;
    if (pd->records > 0) vd->pending_units = pd->units;
    const fl_samples *s = in->samples;
    if (s && s->redis_n && s->min_redis_segment < 0)
        fl_violate(vd, "redis", s->min_redis_segment,
                "a stock key reached %lld while the load ran (%llu of %llu samples below zero)",
                s->min_redis_segment, (unsigned long long)s->redis_negative,
                (unsigned long long)s->redis_n);
    if (s && s->redis_stranded) {
        if (s->max_stranded > vd->stranded) vd->stranded = s->max_stranded;
        fl_violate(vd, "redis", s->max_stranded,
                "up to %lld units stranded in segments marked empty while the load ran "
                "(%llu of %llu samples)", s->max_stranded,
                (unsigned long long)s->redis_stranded, (unsigned long long)s->redis_n);
    }
    if (s && s->redis_n) fl_see_stock(vd, s->min_redis_segment);
    vd->redis_checked = 1;
}

/* A hold row of SQLite, for holds.c (ud: the rows' context). */
static void on_hold(const fl_hold_row *h, void *ud) {
    rows_ctx *x = ud;
    fl_holds_on_hold(x->hx, h, !fl_baseline_has(x->base, h->order_id));
}

/* The SQLite file, read-only, by its documented schema. home: where the
 * service says the product's stock lives (0: SQLite, the db strategies). */
static void check_db(const fl_verify_in *in, known *k, fl_holds *hx, int home, fl_db_sku *out,
                     fl_verdict *vd) {
    rows_ctx x = { .k = k, .base = in->base, .tag = in->load->key_tag, .hx = hx };
    fl_db_sku dp;
    fl_err e;
    known_reset_matches(k);
    int found = fl_db_read(in->v->db_path, in->sku, &dp, hx->on ? on_hold : NULL, on_row, &x,
                               &e);
    if (found <= 0) {
        if (found < 0) fl_note(vd, "%s not checked: %s", dp.vantage, e.msg);
        else fl_note(vd, "%s not checked: no product %s in %s", dp.vantage, in->sku,
                     in->v->db_path);
        rows_free(&x);
        return;
    }
    char hb[48];
    const char *ht = held_text(dp.held, hb, sizeof hb);
    long long out_of_stock = dp.sold + dp.held;
    if (out_of_stock > dp.stock_initial)
        fl_violate(vd, dp.vantage, out_of_stock - dp.stock_initial, "oversold by %lld units: %lld "
                   "sold%s of %lld", out_of_stock - dp.stock_initial, dp.sold, ht,
                   dp.stock_initial);
    if (home == 0) {
        fl_see_stock(vd, dp.db_available);
        if (dp.db_available < 0)
            fl_violate(vd, dp.vantage, dp.db_available, "stock reached %lld", dp.db_available);
        if (out_of_stock + dp.db_available != dp.stock_initial && dp.db_available >= 0)
            fl_violate(vd, dp.vantage, out_of_stock + dp.db_available - dp.stock_initial,
                    "sold %lld%s + available %lld != stock %lld", dp.sold, ht, dp.db_available,
                    dp.stock_initial);
    }
    if (dp.voided_committed)
        fl_violate(vd, dp.vantage, dp.voided_committed,
                "%lld orders are both committed and voided", dp.voided_committed);
    check_rows(&x, dp.vantage, in, dp.sold, dp.per_user_limit, vd);
    fl_holds_check_db(hx, &x.hr, &dp, vd);
    rows_free(&x);
    *out = dp;
    vd->db_checked = 1;
    vd->db_vantage = dp.vantage;
}

int fl_verify(const fl_verify_in *in, fl_verdict *vd, fl_err *e) {
    memset(vd, 0, sizeof *vd);
    vd->pass = 1;
    vd->min_stock = LLONG_MAX;
    fl_http h;
    fl_http_init(&h, &in->v->api, in->v->token, 10000);
    known k;
    fl_holds hx;
    fl_product p;
    pend pd = { 0, 0, 0 };
    int rc = -1, home = -1;
    fl_redis *rd = NULL;
    memset(&hx, 0, sizeof hx);
    if (known_init(&k, in->load)) {
        fl_errf(e, "out of memory");
        goto out;
    }
    if (fl_product_get(&h, in->sku, &p, e)) goto out;
    if (fl_holds_init(&hx, in, p.hold_seconds)) {
        fl_errf(e, "out of memory");
        goto out;
    }
    vd->holds.hold_seconds = p.hold_seconds;
    vd->holds.returned_fields = -1;
    fl_err why = { "" };
    rd = open_redis(in->v, &h, &p, &home, &why);
    if (home < 0) fl_note(vd, "where the stock lives is unknown: %s", why.msg);
    else if (home == 1 && in->v->redis_url[0] && !rd) fl_note(vd, "redis not checked: %s", why.msg);
    if (fl_holds_settle(&hx, &h, &p, vd, e)) goto out;
    if (fl_verify_settle(in, &h, rd,
                         fl_redis_lanes(rd, p.strategy, p.segments > 0 ? p.segments : 1), &p,
                         &pd, e))
        goto out;
    const fl_baseline *b = in->base;
    long long base_sold = b ? b->p.sold : 0;
    long long base_initial = b ? b->p.stock_initial : p.stock_initial;
    /* What this run could sell: what was left, plus any restock meanwhile. */
    long long run_stock = base_initial - base_sold + (p.stock_initial - base_initial);
    vd->initial = run_stock;
    vd->sold = p.sold - base_sold;
    vd->available = p.stock_available;
    check_client(in, &hx, run_stock, vd);
    check_client_limit(in, &hx, p.per_user_limit, vd);
    check_api_stock(in, &p, &pd, vd);
    if (check_api_rows(in, &h, &p, &k, &hx, vd, e)) goto out;
    fl_db_sku dp;
    if (in->v->db_path[0]) check_db(in, &k, &hx, home, &dp, vd);
    if (rd) check_redis(in, rd, &p, vd->db_checked ? &dp : NULL, &pd, &hx, vd);
    else if (in->v->redis_url[0] && home == 0)
        fl_note(vd, "redis: the %s strategy keeps no stock there", p.strategy);
    long long shown = p.stock_available > 0 ? p.stock_available : 0;
    long long over = p.sold + p.held + shown - p.stock_initial;
    /* What the buyers were told was theirs: every 201, or with holds the
     * confirms answered 200. */
    long long told = hx.on ? hx.paid_units : vd->units_201;
    long long over201 = told - run_stock;
    vd->oversold = over > over201 ? over : over201;
    if (vd->oversold < 0) vd->oversold = 0;
    if (vd->min_stock == LLONG_MAX) vd->min_stock = p.stock_available;
    rc = 0;
out:
    fl_redis_close(rd);
    fl_holds_free(&hx);
    known_free(&k);
    fl_http_close(&h);
    return rc;
}
