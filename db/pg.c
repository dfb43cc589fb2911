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
    assert(n <= MAX_ARGS);
    if (ensure(d, what) != DB_OK) return DB_ERROR;
    char nums[MAX_ARGS][24];
    const char *values[MAX_ARGS];
    unsigned int types[MAX_ARGS];
    for (int i = 0; i < n; i++) {
        /* A NULL's type is the server's to infer where the statement uses
         * it; an ad hoc statement may not use every argument (the order
         * listing's filters), and an unused one needs a type: text. */
        types[i] = args[i].kind == 'i' ? INT8OID
                   : args[i].kind == 't' || st < 0 ? TEXTOID : 0;
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
        char *text = to_dollars(sql);
        if (!text) return db_error(d, "out of memory");
        res = PQexecParams(p->conn, text, n, types, values, NULL, NULL, 0);
        free(text);
    }
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

const db_driver db_pg_driver = {
    .name = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .run = pg_run,
    .next = pg_next,
    .col_int = pg_col_int,
    .col_text = pg_col_text,
    .changes = pg_changes,
    .done = pg_done,
    .in_tx = pg_in_tx,
    .wait_ms = pg_wait_ms,
};
