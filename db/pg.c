/* pg.c: the PostgreSQL driver of the db module (db_int.h, struct
 * db_driver), on libpq: one connection per db handle, opened from a libpq
 * URI (postgresql://user[:pw]@host[:port][,host2[:port2]...]/dbname[?params];
 * target_session_attrs, PGPASSWORD and ~/.pgpass work as libpq has them).
 *
 * Statements are the module's, their ?N parameters turned into $N when
 * the connection opens; each is prepared on its first run (with the types
 * of the arguments it is given: bigint, text) and again after a
 * reconnect. Arguments and columns travel as text. Errors are told apart
 * by SQLSTATE and constraint name, never by message text.
 *
 * What the logic above gets from SQLite's single writer, PostgreSQL gives
 * by row locks: a transaction that counts orders of a SKU, or voids one,
 * first locks the SKU's products row (docs/storage.md, "PostgreSQL"). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

#include "db/db_int.h"

#define INT8OID 20
#define TEXTOID 25
#define MAX_ARGS 16
/* The schema's own lock: two processes opening a new database at once
 * cannot both create it (pg_advisory_xact_lock's key). */
#define MIGRATE_LOCK 7346215501

typedef struct pg {
    PGconn *conn;
    char *target;
    db_options opt;
    int lock_timeout_ms;          /* what the session has now (-1: unknown) */
    char *sql[DB_ST_COUNT];       /* each statement in PostgreSQL's dialect */
    unsigned char prepared[DB_ST_COUNT];
} pg;

static pg *conn_of(db *d) { return d->impl; }

/* ------------------------------------------------------------- dialect */

/* A copy of sql with every ?N turned into $N (none stands in a string
 * literal of the module's statements). NULL when out of memory. */
static char *to_dollars(const char *sql) {
    size_t n = strlen(sql);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    int quoted = 0;
    for (size_t i = 0; i <= n; i++) {
        char c = sql[i];
        if (c == '\'') quoted = !quoted;
        out[i] = c == '?' && !quoted && sql[i + 1] >= '0' && sql[i + 1] <= '9' ? '$' : c;
    }
    return out;
}

/* Marks in used[0..n) the parameters sql (in $N form) uses: one pass. */
static void params_used(const char *sql, unsigned char *used, int n) {
    for (const char *c = sql; (c = strchr(c, '$')) != NULL; c++) {
        int k = atoi(c + 1);
        if (c[1] >= '0' && c[1] <= '9' && k >= 1 && k <= n) used[k - 1] = 1;
    }
}

/* ----------------------------------------------------------- errors */

/* Sets d's error from res (or the connection's), and returns its status:
 * DB_EXISTS for an integrity constraint (23xxx; d->conflict: the primary
 * key, another unique one, or none), DB_BUSY for a lock not granted in
 * time, a deadlock or a serialization failure, else DB_ERROR. */
static db_status fail(db *d, const PGresult *res, const char *what) {
    pg *p = conn_of(d);
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res && PQresultErrorMessage(res)[0] ? PQresultErrorMessage(res)
                                                          : PQerrorMessage(p->conn);
    char clean[200];
    snprintf(clean, sizeof clean, "%s", msg ? msg : "no message");
    clean[strcspn(clean, "\n")] = '\0';
    db_status st = DB_ERROR;
    if (state && !strncmp(state, "23", 2)) {
        st = DB_EXISTS;
        const char *c = PQresultErrorField(res, PG_DIAG_CONSTRAINT_NAME);
        size_t cl = c ? strlen(c) : 0;
        d->conflict = !strcmp(state, "23505")
                          ? (cl > 5 && !strcmp(c + cl - 5, "_pkey") ? DB_CONFLICT_PRIMARY
                                                                    : DB_CONFLICT_UNIQUE)
                          : DB_CONFLICT_NONE;
    } else if (state && (!strcmp(state, "55P03") || !strcmp(state, "40P01") ||
                         !strcmp(state, "40001"))) {
        st = DB_BUSY;
    }
    return db_set_error(d, st, what, clean);
}

/* ------------------------------------------------------------ the schema */

static int exec(PGconn *c, const char *sql, char *err, size_t errlen) {
    PGresult *res = PQexec(c, sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
    if (!ok) {
        snprintf(err, errlen, "%s", PQresultErrorMessage(res)[0] ? PQresultErrorMessage(res)
                                                                : PQerrorMessage(c));
        err[strcspn(err, "\n")] = '\0';
    }
    PQclear(res);
    return ok ? 0 : -1;
}

/* The schema version of the database (0: none yet), or -1 with err set. */
static int schema_version(PGconn *c, char *err, size_t errlen) {
    PGresult *res = PQexec(c, "SELECT coalesce(max(version),0) FROM flashsale_schema");
    int v = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        v = atoi(PQgetvalue(res, 0, 0));
    } else {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (state && !strcmp(state, "42P01")) v = 0;      /* no such table: empty */
        else snprintf(err, errlen, "read the schema version: %s", PQresultErrorMessage(res));
    }
    PQclear(res);
    return v;
}

/* Brings the database to DB_SCHEMA_VERSION in one transaction, under the
 * schema's advisory lock. A newer schema is refused. */
static int migrate(PGconn *c, char *err, size_t errlen) {
    char sql[96];
    if (exec(c, "BEGIN", err, errlen)) return -1;
    snprintf(sql, sizeof sql, "SELECT pg_advisory_xact_lock(%lld)", (long long)MIGRATE_LOCK);
    if (exec(c, sql, err, errlen) ||
        exec(c, "CREATE TABLE IF NOT EXISTS flashsale_schema(version INTEGER NOT NULL)", err,
             errlen))
        goto err;
    int v = schema_version(c, err, errlen);
    if (v < 0) goto err;
    if (v > DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "database schema version %d is not one this build knows (%d)", v,
                 DB_SCHEMA_VERSION);
        goto err;
    }
    if (v < DB_SCHEMA_VERSION) {
        for (int i = 0; i < db_nmigrations; i++) {
            const db_migration *m = &db_migrations[i];
            if (m->version > v && m->pg && exec(c, m->pg, err, errlen)) goto err;
        }
        snprintf(sql, sizeof sql, "DELETE FROM flashsale_schema; INSERT INTO flashsale_schema "
                 "VALUES(%d)", DB_SCHEMA_VERSION);
        if (exec(c, sql, err, errlen)) goto err;
    }
    if (exec(c, "COMMIT", err, errlen)) goto err;
    return 0;
err:
    exec(c, "ROLLBACK", err + strlen(err), 0);
    return -1;
}

/* ------------------------------------------------------------ the connection */

/* Opens the session: its settings, and the schema checked or brought
 * forward. 0, or -1 with err set. */
static int session(pg *p, char *err, size_t errlen) {
    char sql[160];
    if (PQstatus(p->conn) != CONNECTION_OK) {
        snprintf(err, errlen, "connect: %s", PQerrorMessage(p->conn));
        err[strcspn(err, "\n")] = '\0';
        return -1;
    }
    /* Durable commits always: a 201 means the order's row is on disk
     * (--synchronous NORMAL is SQLite's; PostgreSQL keeps on). */
    snprintf(sql, sizeof sql, "SET synchronous_commit=on; SET lock_timeout=%d;%s",
             p->opt.busy_timeout_ms > 0 ? p->opt.busy_timeout_ms : 2000,
             p->opt.readonly ? " SET default_transaction_read_only=on;" : "");
    if (exec(p->conn, sql, err, errlen)) return -1;
    p->lock_timeout_ms = p->opt.busy_timeout_ms > 0 ? p->opt.busy_timeout_ms : 2000;
    memset(p->prepared, 0, sizeof p->prepared);
    if (!p->opt.readonly) return migrate(p->conn, err, errlen);
    int v = schema_version(p->conn, err, errlen);
    if (v < 0) return -1;
    if (v != DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "not a flashsale database (schema version %d)", v);
        return -1;
    }
    return 0;
}

/* The server's notices ("relation ... already exists, skipping") are not
 * the service's to print. */
static void quiet(void *arg, const char *message) { (void)arg, (void)message; }

static void pg_close(db *d) {
    pg *p = conn_of(d);
    if (!p) return;
    if (p->conn) PQfinish(p->conn);
    for (int i = 0; i < DB_ST_COUNT; i++) free(p->sql[i]);
    free(p->target);
    free(p);
    d->impl = NULL;
}

static int pg_open(db *d, const char *target, const db_options *opt, char *err, size_t errlen) {
    pg *p = calloc(1, sizeof *p);
    if (!p || !(p->target = strdup(target))) {
        free(p);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    d->impl = p;
    p->opt = *opt;
    for (int i = 0; i < DB_ST_COUNT; i++) {
        const db_sql *s = db_sql_of(i);
        if (!(p->sql[i] = to_dollars(s->pg ? s->pg : s->sql))) {
            snprintf(err, errlen, "out of memory");
            goto err;
        }
    }
    p->conn = PQconnectdb(target);
    if (!p->conn) {
        snprintf(err, errlen, "out of memory");
        goto err;
    }
    PQsetNoticeProcessor(p->conn, quiet, NULL);
    if (session(p, err, errlen)) goto err;
    return 0;
err:
    pg_close(d);
    return -1;
}

/* A connection that broke is opened again (PQreset: the same target, the
 * next of several hosts when one is down) before a statement runs; its
 * prepared statements went with it. */
static db_status ensure(db *d, const char *what) {
    pg *p = conn_of(d);
    if (PQstatus(p->conn) == CONNECTION_OK) return DB_OK;
    char err[300];
    PQreset(p->conn);
    if (session(p, err, sizeof err)) return db_set_error(d, DB_ERROR, what, err);
    return DB_OK;
}

/* ------------------------------------------------------------------- runs */

static db_status pg_run(db *d, db_rows *r, int st, const char *sql, const db_arg *args, int n,
                        const char *what) {
    pg *p = conn_of(d);
    memset(r, 0, sizeof *r);
    r->d = d;
    r->st = st;
    r->row = -1;
    assert(st < 0 || n <= MAX_ARGS);
    if (ensure(d, what) != DB_OK) return DB_ERROR;
    /* A statement of the module's has a few arguments; an ad hoc one (a
     * migration's batch of rows) may have thousands. */
    char small_nums[MAX_ARGS][24];
    const char *small_values[MAX_ARGS];
    unsigned int small_types[MAX_ARGS];
    char (*nums)[24] = small_nums;
    const char **values = small_values;
    unsigned int *types = small_types;
    if (n > MAX_ARGS) {
        nums = malloc((size_t)n * sizeof *nums);
        values = malloc((size_t)n * sizeof *values);
        types = malloc((size_t)n * sizeof *types);
        if (!nums || !values || !types) {
            free(nums);
            free(values);
            free(types);
            return db_error(d, "out of memory");
        }
    }
    char *text = st < 0 ? to_dollars(sql) : NULL;
    unsigned char *used = text ? calloc((size_t)n + 1, 1) : NULL;
    if (used) params_used(text, used, n);
    for (int i = 0; i < n; i++) {
        /* A NULL's type is the server's to infer where the statement uses
         * it; an ad hoc statement may not use every argument (the order
         * listing's filters), and an unused one needs a type: text. */
        types[i] = args[i].kind == 'i' ? INT8OID
                   : args[i].kind == 't' || (used && !used[i]) ? TEXTOID : 0;
        if (args[i].kind == 'i') {
            snprintf(nums[i], sizeof nums[i], "%lld", args[i].i);
            values[i] = nums[i];
        } else {
            values[i] = args[i].kind == 't' ? args[i].s : NULL;
        }
    }
    PGresult *res;
    if (st >= 0) {
        char name[16];
        snprintf(name, sizeof name, "s%d", st);
        if (!p->prepared[st]) {
            res = PQprepare(p->conn, name, p->sql[st], n, n ? types : NULL);
            if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                db_status e = fail(d, res, what);
                PQclear(res);
                return e;
            }
            PQclear(res);
            p->prepared[st] = 1;
        }
        res = PQexecPrepared(p->conn, name, n, values, NULL, NULL, 0);
    } else {
        res = text ? PQexecParams(p->conn, text, n, types, values, NULL, NULL, 0) : NULL;
    }
    free(text);
    free(used);
    if (n > MAX_ARGS) {
        free(nums);
        free(values);
        free(types);
    }
    if (!res) return db_error(d, "out of memory");
    ExecStatusType rs = PQresultStatus(res);
    if (rs != PGRES_COMMAND_OK && rs != PGRES_TUPLES_OK) {
        db_status e = fail(d, res, what);
        PQclear(res);
        return e;
    }
    r->h = res;
    return DB_OK;
}

static int pg_next(db_rows *r) {
    if (!r->h) return 0;
    if (r->row + 1 >= PQntuples(r->h)) {
        r->row = PQntuples(r->h);
        return 0;
    }
    r->row++;
    return 1;
}

static long long pg_col_int(db_rows *r, int col) {
    return atoll(PQgetvalue(r->h, (int)r->row, col));
}

static const char *pg_col_text(db_rows *r, int col) {
    return PQgetvalue(r->h, (int)r->row, col);     /* "" for NULL */
}

static int pg_col_null(db_rows *r, int col) { return PQgetisnull(r->h, (int)r->row, col); }

static long long pg_changes(db_rows *r) { return r->h ? atoll(PQcmdTuples(r->h)) : 0; }

static void pg_done(db_rows *r) {
    if (r->h) PQclear(r->h);
    r->h = NULL;
}

static int pg_in_tx(db *d) {
    PGTransactionStatusType t = PQtransactionStatus(conn_of(d)->conn);
    return t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
}

static void pg_wait_ms(db *d, int ms) {
    pg *p = conn_of(d);
    char sql[64], err[200];
    if (ms < 1) ms = 1;
    if (ms == p->lock_timeout_ms || ensure(d, "lock timeout") != DB_OK) return;
    snprintf(sql, sizeof sql, "SET lock_timeout=%d", ms);
    p->lock_timeout_ms = exec(p->conn, sql, err, sizeof err) ? -1 : ms;
}

/* ------------------------------------------------- a group's plain inserts
 *
 * The orders a group commits that were reserved in Redis are inserted by
 * one statement, their arguments as arrays (unnest), and three statements
 * go to the server in one pipeline -- one round trip, however many orders:
 *
 *   1. the SKUs' products rows locked FOR NO KEY UPDATE, in SKU order (two
 *      instances' groups never wait on each other in a circle): no rebuild
 *      and no void of theirs can commit until this transaction does;
 *   2. the orders inserted whose generation is the row's and that are not
 *      voided (a statement of its own, so that its snapshot is taken with
 *      the locks held and sees a void that committed while it waited), a
 *      hold's row beside each hold, and each SKU's sold and held raised
 *      once by its orders' units; the ids inserted come back;
 *   3. the orders whose idempotency key another order holds (DB_DUPKEY,
 *      where db_order_insert would say so; any other refusal is DB_STALE). */

static const char PLAIN_LOCK[] =
    "SELECT sku FROM products WHERE sku = ANY($1::text[]) ORDER BY sku FOR NO KEY UPDATE";

static const char PLAIN_INSERT[] =
    "WITH o AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[],"
    " $5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::text[]) WITH ORDINALITY"
    " AS o(order_id, sku, user_id, quantity, idempotency_key, created_at, gen, expires_ms,"
    " takes, n)),"
    " ins AS (INSERT INTO orders(order_id, sku, user_id, quantity, idempotency_key, created_at)"
    " SELECT o.order_id, o.sku, o.user_id, o.quantity, o.idempotency_key, o.created_at"
    " FROM o JOIN products p ON p.sku = o.sku AND p.stock_gen = o.gen"
    " WHERE NOT EXISTS (SELECT 1 FROM voided_orders v WHERE v.order_id = o.order_id)"
    " ON CONFLICT DO NOTHING RETURNING order_id),"
    " h AS (INSERT INTO holds(order_id, sku, quantity, gen, takes, in_db, expires_ms, state)"
    " SELECT o.order_id, o.sku, o.quantity, o.gen, o.takes, 0, o.expires_ms, 'reserved'"
    " FROM o JOIN ins USING (order_id) WHERE o.expires_ms > 0),"
    " u AS (UPDATE products p SET sold = p.sold + t.sold, held = p.held + t.held"
    " FROM (SELECT o.sku, sum(CASE WHEN o.expires_ms > 0 THEN 0 ELSE o.quantity END) AS sold,"
    " sum(CASE WHEN o.expires_ms > 0 THEN o.quantity ELSE 0 END) AS held"
    " FROM o JOIN ins USING (order_id) GROUP BY o.sku) t WHERE p.sku = t.sku)"
    " SELECT o.n FROM o JOIN ins USING (order_id)";

static const char PLAIN_KEYS[] =
    "SELECT o.n FROM unnest($1::text[], $2::text[]) WITH ORDINALITY"
    " AS o(order_id, idempotency_key, n)"
    " JOIN orders x ON x.idempotency_key = o.idempotency_key AND x.order_id <> o.order_id";

/* A growing text: an array literal being written. */
typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* Appends one element of an array literal: a text quoted (NULL: NULL). */
static void put_text(buf *b, const char *s) {
    put(b, b->len > 1 ? "," : "", b->len > 1);
    if (!s) {
        put(b, "NULL", 4);
        return;
    }
    put(b, "\"", 1);
    for (const char *c = s; *c; c++) {
        if (*c == '"' || *c == '\\') put(b, "\\", 1);
        put(b, c, 1);
    }
    put(b, "\"", 1);
}

static void put_int(buf *b, long long v) {
    char num[24];
    int n = snprintf(num, sizeof num, "%lld", v);
    put(b, b->len > 1 ? "," : "", b->len > 1);
    put(b, num, (size_t)n);
}

enum { A_ID, A_SKU, A_USER, A_QTY, A_KEY, A_AT, A_GEN, A_EXP, A_TAKES, A_NARRAYS };

/* Reads the pipeline's next result of a statement (then its NULL): 0 with
 * *res owned by the caller, or -1 with d's error set. */
static int pipe_result(db *d, PGresult **res, ExecStatusType want, const char *what) {
    pg *p = conn_of(d);
    *res = PQgetResult(p->conn);
    PGresult *extra;
    while ((extra = PQgetResult(p->conn)) != NULL) PQclear(extra);
    if (*res && PQresultStatus(*res) == want) return 0;
    fail(d, *res, what);
    return -1;
}

static db_status pg_insert_plain(db *d, db_job **jobs, size_t n) {
    pg *p = conn_of(d);
    buf a[A_NARRAYS], skus = { 0 }, keys[2];
    size_t nplain = 0, nkeyed = 0;
    db_status st = DB_ERROR;
    /* The jobs by their place in the arrays (1-based, as WITH ORDINALITY
     * counts): plain[k - 1], and keyed[k - 1] for the keys' array. */
    db_job **plain = calloc(n ? n : 1, sizeof *plain), **keyed = calloc(n ? n : 1, sizeof *keyed);
    memset(a, 0, sizeof a);
    memset(keys, 0, sizeof keys);
    if (!plain || !keyed) {
        st = db_error(d, "insert orders: out of memory");
        goto out;
    }
    memset(a, 0, sizeof a);
    memset(keys, 0, sizeof keys);
    for (int k = 0; k < A_NARRAYS; k++) put(&a[k], "{", 1);
    put(&keys[0], "{", 1);
    put(&keys[1], "{", 1);
    put(&skus, "{", 1);
    for (size_t i = 0; i < n; i++) {
        db_job *j = jobs[i];
        if (!db_plain_insert(j)) continue;
        const db_order *o = &j->order;
        j->status = DB_STALE;
        plain[nplain++] = j;
        put_text(&a[A_ID], o->order_id);
        put_text(&a[A_SKU], o->sku);
        put_text(&a[A_USER], o->user_id);
        put_int(&a[A_QTY], o->quantity);
        put_text(&a[A_KEY], o->idem_key[0] ? o->idem_key : NULL);
        put_text(&a[A_AT], o->created_at);
        put_int(&a[A_GEN], o->gen);
        put_int(&a[A_EXP], o->expires_ms > 0 ? o->expires_ms : 0);
        put_text(&a[A_TAKES], o->takes ? o->takes : "");
        if (o->idem_key[0]) {
            put_text(&keys[0], o->order_id);
            put_text(&keys[1], o->idem_key);
            keyed[nkeyed++] = j;
        }
        put_text(&skus, o->sku);               /* = ANY() takes a SKU twice as once */
    }
    if (nplain == 0) {
        st = DB_OK;
        goto out;
    }
    for (int k = 0; k < A_NARRAYS; k++) put(&a[k], "}", 1);
    put(&keys[0], "}", 1);
    put(&keys[1], "}", 1);
    put(&skus, "}", 1);
    int oom = skus.oom || keys[0].oom || keys[1].oom;
    for (int k = 0; k < A_NARRAYS; k++) oom |= a[k].oom;
    if (oom) {
        st = db_error(d, "insert orders: out of memory");
        goto out;
    }
    const char *lock_args[1] = { skus.p };
    const char *ins_args[A_NARRAYS];
    for (int k = 0; k < A_NARRAYS; k++) ins_args[k] = a[k].p;
    const char *key_args[2] = { keys[0].p, keys[1].p };
    if (PQenterPipelineMode(p->conn) != 1) {
        st = fail(d, NULL, "insert orders: pipeline");
        goto out;
    }
    int sent = PQsendQueryParams(p->conn, PLAIN_LOCK, 1, NULL, lock_args, NULL, NULL, 0) &&
               PQsendQueryParams(p->conn, PLAIN_INSERT, A_NARRAYS, NULL, ins_args, NULL, NULL,
                                 0) &&
               (!nkeyed ||
                PQsendQueryParams(p->conn, PLAIN_KEYS, 2, NULL, key_args, NULL, NULL, 0)) &&
               PQpipelineSync(p->conn);
    PGresult *lock = NULL, *ins = NULL, *dup = NULL, *sync = NULL;
    int bad = !sent;
    if (sent) {
        bad = pipe_result(d, &lock, PGRES_TUPLES_OK, "lock the products") ||
              pipe_result(d, &ins, PGRES_TUPLES_OK, "insert orders") ||
              (nkeyed && pipe_result(d, &dup, PGRES_TUPLES_OK, "read keys"));
        /* Whatever failed, read on to the sync so the connection is usable. */
        while ((sync = PQgetResult(p->conn)) != NULL &&
               PQresultStatus(sync) != PGRES_PIPELINE_SYNC)
            PQclear(sync);
        if (sync) PQclear(sync);
    } else {
        fail(d, NULL, "insert orders: send");
    }
    PQexitPipelineMode(p->conn);
    if (!bad) {
        /* A job is inserted when its id came back; else a key another
         * order holds makes it a replay's refusal; else stale. */
        for (int r = 0; r < PQntuples(ins); r++) {
            long long k = atoll(PQgetvalue(ins, r, 0));
            if (k >= 1 && (size_t)k <= nplain) plain[k - 1]->status = DB_OK;
        }
        for (int r = 0; dup && r < PQntuples(dup); r++) {
            long long k = atoll(PQgetvalue(dup, r, 0));
            if (k >= 1 && (size_t)k <= nkeyed && keyed[k - 1]->status != DB_OK)
                keyed[k - 1]->status = DB_DUPKEY;
        }
        st = DB_OK;
    } else {
        const char *state = NULL;
        PGresult *f = !lock || PQresultStatus(lock) != PGRES_TUPLES_OK ? lock
                      : !ins || PQresultStatus(ins) != PGRES_TUPLES_OK   ? ins : dup;
        if (f) state = PQresultErrorField(f, PG_DIAG_SQLSTATE);
        st = state && (!strcmp(state, "55P03") || !strcmp(state, "40P01") ||
                       !strcmp(state, "40001"))
                 ? DB_BUSY
                 : DB_ERROR;
    }
    PQclear(lock);
    PQclear(ins);
    PQclear(dup);
out:
    for (int k = 0; k < A_NARRAYS; k++) free(a[k].p);
    free(keys[0].p);
    free(keys[1].p);
    free(skus.p);
    free(plain);
    free(keyed);
    return st;
}

const db_driver db_pg_driver = {
    .name = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .run = pg_run,
    .next = pg_next,
    .col_int = pg_col_int,
    .col_text = pg_col_text,
    .col_null = pg_col_null,
    .changes = pg_changes,
    .done = pg_done,
    .in_tx = pg_in_tx,
    .wait_ms = pg_wait_ms,
    .insert_plain = pg_insert_plain,
};
