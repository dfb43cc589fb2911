/* pg.c: the PostgreSQL driver of the db module (db_int.h, struct
 * db_driver), on libpq: one connection per db handle, opened from a libpq
 * URI (postgresql://user[:pw]@host[:port][,host2[:port2]...]/dbname[?params];
 * target_session_attrs, PGPASSWORD and ~/.pgpass work as libpq has them).
 *
 * Statements are the module's (this file's own text for those the
 * dialects word apart: SQL, below), their ?N parameters turned into $N when
 * the connection opens; each is prepared on its first run (with the types
 * of the arguments it is given: bigint, text) and again after a
 * reconnect. Arguments and columns travel as text. Errors are told apart
 * by SQLSTATE and constraint name, never by message text.
 *
 * What the logic above gets from SQLite's single writer, PostgreSQL gives
 * by row locks: a transaction that counts orders of a SKU, or voids one,
 * first locks the SKU's products row (docs/storage.md, "PostgreSQL"). */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>
#include <libpq-fe.h>

#include "common/clock.h"
#include "db/db_int.h"

#define INT8OID 20
#define TEXTOID 25
#define MAX_ARGS 16
/* The schema's own lock: two processes opening a new database at once
 * cannot both create it (pg_advisory_xact_lock's key). */
#define MIGRATE_LOCK 7346215501

/* Now, as db_format_time writes it. */
#define PG_NOW "to_char(clock_timestamp() AT TIME ZONE 'UTC','YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* PostgreSQL's text of the statements the dialects word apart (db.c's
 * table has the rest). */
static const char *const SQL[DB_ST_COUNT] = {
    [DB_ST_BEGIN] = "BEGIN",
    [DB_ST_PRODUCT_GEN] = "UPDATE products SET stock_gen=greatest(stock_gen,?2)+1 WHERE sku=?1",
    /* PostgreSQL ends a transaction at its first error: a group's insert
     * that meets a taken key or order id changes no row instead (the
     * caller asks which it was), and the group goes on. */
    [DB_ST_ORDER_INSERT_ANY] =
        "INSERT INTO orders(order_id,sku,user_id,quantity,idempotency_key,created_at)"
        " SELECT ?1,?2,?3,?4,?5,?6"
        " WHERE NOT EXISTS(SELECT 1 FROM voided_orders WHERE order_id=?1)"
        " ON CONFLICT DO NOTHING",
    [DB_ST_VOID_INSERT] =
        "INSERT INTO voided_orders(order_id,sku,reason,voided_at)"
        " VALUES(?1,?2,?3," PG_NOW ") ON CONFLICT DO NOTHING",
    [DB_ST_RESTOCK_INSERT] =
        "INSERT INTO restocks(idempotency_key,sku,quantity,created_at)"
        " VALUES(?1,?2,?3," PG_NOW ")",
    [DB_ST_PROBE] =
        "INSERT INTO meta(key,value) VALUES('health_probe'," PG_NOW ")"
        " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
    /* The tallies folded into their products' rows. The rows of the
     * products first, in SKU order: a db take (the only other locker of a
     * products row, and never of a SKU with tallies) or a repair cannot
     * wait on this in a circle. */
    [DB_ST_FOLD_LOCK] =
        "SELECT sku FROM products WHERE sku IN (SELECT sku FROM product_tallies)"
        " ORDER BY sku FOR NO KEY UPDATE",
    /* One statement: what it adds to a products row is what its DELETE
     * took out, row version by row version. A group may commit units to a
     * tally between two statements (its transaction does not wait for the
     * products row); a DELETE after an UPDATE would then take out units
     * the UPDATE never added. So FOLD_CLEAR finds nothing left to do. */
    [DB_ST_FOLD] =
        "WITH gone AS (DELETE FROM product_tallies RETURNING sku, sold, held),"
        " s AS (SELECT sku, sum(sold) AS sold, sum(held) AS held FROM gone GROUP BY sku)"
        " UPDATE products p SET sold=p.sold+s.sold, held=p.held+s.held FROM s WHERE p.sku=s.sku",
    [DB_ST_FOLD_CLEAR] = "SELECT 1",
    /* A SKU's lock (db_sku_shared, db_sku_exclusive): an advisory lock of
     * the transaction keyed by the SKU, in the lock manager -- no row is
     * written, as a row's share lock would be by every group of every
     * instance. */
    [DB_ST_SKU_SHARED] = "SELECT pg_advisory_xact_lock_shared(hashtextextended(?1,0))",
    [DB_ST_SKU_EXCLUSIVE] = "SELECT pg_advisory_xact_lock(hashtextextended(?1,0))",
    /* The shared locks of the SKUs an expiry sweep will end holds of, in
     * SKU order, before it ends them. */
    [DB_ST_DUE_SKUS_SHARED] =
        "SELECT pg_advisory_xact_lock_shared(hashtextextended(sku,0)) FROM (SELECT DISTINCT sku"
        " FROM holds WHERE state='reserved' AND expires_ms<=?1 ORDER BY sku) x",
    /* A db strategy's take locks the SKU's row (its stock) first: what it
     * reads then (a key, the buyer's units) cannot change under it. */
    [DB_ST_PRODUCT_LOCK] = "SELECT 1 FROM products WHERE sku=?1 FOR NO KEY UPDATE",
    /* db-for-update: the row locked and read in one statement. */
    [DB_ST_STOCK_FOR_UPDATE] =
        "SELECT db_available, db_version FROM products WHERE sku=?1 FOR UPDATE",
};

typedef struct pg {
    PGconn *conn;
    char *target;
    db_options opt;
    int lock_timeout_ms;          /* what the session has now (-1: unknown) */
    char *sql[DB_ST_COUNT];       /* each statement in PostgreSQL's dialect */
    unsigned char prepared[DB_ST_COUNT];
    unsigned char piped_prepared[8 + 8];  /* the pipelines' statements (PIPED) */
    /* A BEGIN asked for and not sent yet: it goes with the transaction's
     * first statement (in a pipeline, in the same round trip). */
    int begin_pending;
    /* This connection's tally row (product_tallies.slot), and its text. */
    char slot[24];
    /* The connection was dropped with a statement unanswered: opened
     * again before the next one (ensure). */
    int dropped;
    /* The server connection is not this client's own: a pooler (PgBouncer)
     * stands between and may hand each transaction another one. Then
     * nothing lives in the session: statements are unnamed (parsed with
     * their run), and a transaction's settings are SET LOCAL in it. */
    int shared;
    int answer_ms;                /* opt.answer_timeout_ms: 0, wait for ever */
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

/* Copies libpq's message msg into out as one line: each attempt of a
 * multi-host connect is a line of its own ("connection to server at A
 * failed: ...\nconnection to server at B failed: ..."), and every one
 * says why that host was passed over, so they are kept, joined by "; ";
 * a DETAIL or HINT line, and the tab-indented lines after "server closed
 * the connection unexpectedly", are dropped. */
static void one_line(char *out, size_t len, const char *msg) {
    size_t n = 0;
    if (!len) return;
    out[0] = '\0';
    for (const char *line = msg; line && *line && n + 1 < len;) {
        const char *end = strchr(line, '\n');
        size_t ll = end ? (size_t)(end - line) : strlen(line);
        int keep = ll > 0 && line[0] != '\t' && strncmp(line, "DETAIL:", 7) &&
                   strncmp(line, "HINT:", 5);
        if (keep) n += (size_t)snprintf(out + n, len - n, "%s%.*s", n ? "; " : "", (int)ll, line);
        if (n >= len) n = len - 1;
        line = end ? end + 1 : NULL;
    }
}

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
    one_line(clean, sizeof clean, msg ? msg : "no message");
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

/* ------------------------------------------------- a COMMIT's deadline
 *
 * A COMMIT on a primary with a synchronous standby returns when the
 * standby has its record: while the standby cannot be reached it does
 * not return at all, and a writer waiting for it would hold every order
 * behind it (and the requests with them) for as long as the partition
 * lasts. So a COMMIT waits commit_timeout_ms, then is canceled. The
 * server's answer to that cancel is a WARNING and "COMMIT": the
 * transaction is committed here and perhaps not on the standby -- the
 * caller is told it is unconfirmed (d->unconfirmed), never that it
 * committed, for a failover to the standby would lose it. A cancel
 * that is not answered either (the server itself unreachable) drops the
 * connection; whatever the server does with the transaction then is for
 * a later look (db_order_void) to learn. */

#define CANCEL_GRACE_MS 2000

static void *cancel_main(void *arg) {
    PGcancel *c = arg;
    char err[256];
    PQcancel(c, err, sizeof err);      /* the answer comes on the connection */
    PQfreeCancel(c);
    return NULL;
}

/* Sends a cancel of the connection's running statement from a thread of
 * its own: PQcancel connects to the server, and a connect to a server
 * that does not answer blocks. 0, or -1 when it could not be sent. */
static int send_cancel(pg *p) {
    PGcancel *c = PQgetCancel(p->conn);
    pthread_t t;
    pthread_attr_t at;
    if (!c) return -1;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, cancel_main, c);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        PQfreeCancel(c);
        return -1;
    }
    return 0;
}

/* Drops a connection whose statement goes unanswered. The socket is
 * reset, not closed gracefully: bytes still queued for the server are
 * discarded rather than delivered later, when the caller may already
 * have acted on the statement's failure. */
static void drop(db *d) {
    pg *p = conn_of(d);
    struct linger lg = { 1, 0 };
    int fd = PQsocket(p->conn);
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    p->dropped = 1;
    p->begin_pending = 0;
    d->unconfirmed = DB_UNCONFIRMED_DROPPED;
}

/* A statement's wait for its answer, with a deadline (0: none). */
typedef struct waiter {
    int timeout_ms;
    int64_t deadline;
    int canceled;           /* a cancel was sent */
    int dropped;            /* the connection was dropped */
} waiter;

static void waiter_start(waiter *w, int timeout_ms) {
    w->timeout_ms = timeout_ms;
    w->deadline = timeout_ms > 0 ? clock_mono_ms() + timeout_ms : 0;
    w->canceled = w->dropped = 0;
}

/* Waits until the connection's next result can be read without blocking:
 * 0; -1 when the deadline passed, the cancel was sent and unanswered too,
 * and the connection was dropped (then no result is to be read). */
static int await_result(db *d, waiter *w) {
    pg *p = conn_of(d);
    if (w->dropped) return -1;
    while (w->deadline && PQisBusy(p->conn)) {
        int64_t left = w->deadline - clock_mono_ms();
        if (left <= 0) {
            if (w->canceled || send_cancel(p)) {
                drop(d);
                w->dropped = 1;
                return -1;
            }
            w->canceled = 1;
            w->deadline = clock_mono_ms() + CANCEL_GRACE_MS;
            continue;
        }
        struct pollfd pfd = { .fd = PQsocket(p->conn), .events = POLLIN };
        if (pfd.fd < 0) break;
        int n = poll(&pfd, 1, (int)left);
        if (n < 0 && errno != EINTR) break;
        if (n > 0 && !PQconsumeInput(p->conn)) break;    /* PQgetResult tells */
    }
    return 0;
}

/* A COMMIT waited for by w, whose answer was st: st, unless it had to
 * be canceled -- then an error, and d->unconfirmed says how it ended. */
static db_status unconfirmed(db *d, const waiter *w, db_status st, const char *what) {
    char msg[200];
    if (!w->canceled) return st;
    d->unconfirmed = w->dropped ? DB_UNCONFIRMED_DROPPED : DB_UNCONFIRMED_CANCELED;
    snprintf(msg, sizeof msg,
             "no answer in %d ms (a synchronous standby out of reach?): %s", w->timeout_ms,
             w->dropped ? "the cancel went unanswered too; connection dropped"
                        : "canceled; committed here, perhaps not on the standby");
    return db_set_error(d, DB_ERROR, what, msg);
}


/* Runs sql (a COMMIT, or statements ending with one) with the commit
 * deadline of timeout_ms. DB_OK when every statement succeeded and no
 * cancel was needed; else an error, d->unconfirmed saying why. */
static db_status commit_with_deadline(db *d, const char *sql, int timeout_ms, const char *what) {
    pg *p = conn_of(d);
    waiter w;
    db_status st = DB_OK;
    d->unconfirmed = 0;
    if (!PQsendQuery(p->conn, sql)) return fail(d, NULL, what);
    waiter_start(&w, timeout_ms);
    for (;;) {
        if (await_result(d, &w)) break;
        PGresult *res = PQgetResult(p->conn);
        if (!res) break;
        ExecStatusType rs = PQresultStatus(res);
        if (st == DB_OK && rs != PGRES_COMMAND_OK && rs != PGRES_TUPLES_OK) st = fail(d, res, what);
        PQclear(res);
    }
    return unconfirmed(d, &w, st, what);
}

/* ------------------------------------------------------------ the schema */

/* Waits, with w's deadline, for every result of what was just sent on d's
 * connection and returns the last (a statement that fails ends the
 * server's run of a string, so the last tells); NULL when they did not
 * come in time (the connection was dropped) or out of memory. */
static PGresult *last_answer(db *d, waiter *w) {
    pg *p = conn_of(d);
    PGresult *last = NULL, *res;
    for (;;) {
        if (await_result(d, w)) {
            PQclear(last);
            return NULL;
        }
        if (!(res = PQgetResult(p->conn))) break;
        PQclear(last);
        last = res;
    }
    return last;
}

/* Runs sql (a statement or a string of them, without parameters) with
 * the connection's answer deadline: its last result, or NULL with err set
 * (the server's message, or no answer in time: the connection dropped). */
static PGresult *query(db *d, const char *sql, char *err, size_t errlen) {
    pg *p = conn_of(d);
    waiter w;
    PGresult *res = NULL;
    waiter_start(&w, p->answer_ms);
    if (PQsendQuery(p->conn, sql)) res = last_answer(d, &w);
    ExecStatusType rs = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (rs == PGRES_COMMAND_OK || rs == PGRES_TUPLES_OK) return res;
    if (w.dropped)
        snprintf(err, errlen, "no answer in %d ms (a pooler's wait for a server connection, or "
                 "a server out of reach); connection dropped", w.timeout_ms);
    else
        one_line(err, errlen, res && PQresultErrorMessage(res)[0] ? PQresultErrorMessage(res)
                                                                   : PQerrorMessage(p->conn));
    PQclear(res);
    return NULL;
}

static int exec(db *d, const char *sql, char *err, size_t errlen) {
    PGresult *res = query(d, sql, err, errlen);
    PQclear(res);
    return res ? 0 : -1;
}

/* The schema version of the database (0: none yet), or -1 with err set. */
static int schema_version(db *d, char *err, size_t errlen) {
    pg *p = conn_of(d);
    waiter w;
    PGresult *res = NULL;
    waiter_start(&w, p->answer_ms);
    if (PQsendQuery(p->conn, "SELECT coalesce(max(version),0) FROM flashsale_schema"))
        res = last_answer(d, &w);
    int v = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        v = atoi(PQgetvalue(res, 0, 0));
    } else {
        const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
        if (state && !strcmp(state, "42P01")) v = 0;      /* no such table: empty */
        else snprintf(err, errlen, "read the schema version: %s",
                      res ? PQresultErrorMessage(res) : "no answer in time");
    }
    PQclear(res);
    return v;
}

/* Brings the database to DB_SCHEMA_VERSION in one transaction, under the
 * schema's advisory lock. A newer schema is refused. */
static int migrate(db *d, char *err, size_t errlen) {
    char sql[96];
    if (exec(d, "BEGIN", err, errlen)) return -1;
    snprintf(sql, sizeof sql, "SELECT pg_advisory_xact_lock(%lld)", (long long)MIGRATE_LOCK);
    if (exec(d, sql, err, errlen) ||
        exec(d, "CREATE TABLE IF NOT EXISTS flashsale_schema(version INTEGER NOT NULL)", err,
             errlen))
        goto err;
    int v = schema_version(d, err, errlen);
    if (v < 0) goto err;
    if (v > DB_SCHEMA_VERSION) {
        snprintf(err, errlen, "database schema version %d is not one this build knows (%d)", v,
                 DB_SCHEMA_VERSION);
        goto err;
    }
    if (v < DB_SCHEMA_VERSION) {
        for (int i = 0; i < db_schema_pg_n; i++) {
            const db_migration *m = &db_schema_pg[i];
            if (m->version > v && m->sql && exec(d, m->sql, err, errlen)) goto err;
        }
        snprintf(sql, sizeof sql, "DELETE FROM flashsale_schema; INSERT INTO flashsale_schema "
                 "VALUES(%d)", DB_SCHEMA_VERSION);
        if (exec(d, sql, err, errlen)) goto err;
    }
    if (exec(d, "COMMIT", err, errlen)) goto err;
    return 0;
err:
    exec(d, "ROLLBACK", err + strlen(err), 0);
    return -1;
}

/* ------------------------------------------------------------ the connection */

static int ensure_functions(db *d, char *err, size_t errlen);

/* Opens the session: whose server connection it is, its settings, and
 * the schema checked or brought forward. 0, or -1 with err set.
 *
 * A client talking to PostgreSQL itself is told the backend's own process
 * id at connect (BackendKeyData, PQbackendPID), the one pg_backend_pid()
 * names. A pooler (PgBouncer) answers the connect itself with a key of its
 * own, as it must to route a cancel, and then lends the client a server
 * connection for a session, a transaction or a statement: the two ids
 * differ. Such a connection is `shared`: nothing may live in its session
 * (a named statement or a SET would stay with a server connection another
 * client gets next), and it must carry transactions -- a pooler in
 * statement mode cannot, and is refused here with its setting named. */
static int session(db *d, char *err, size_t errlen) {
    pg *p = conn_of(d);
    char sql[256];
    if (PQstatus(p->conn) != CONNECTION_OK) {
        char why[400];
        one_line(why, sizeof why, PQerrorMessage(p->conn));
        snprintf(err, errlen, "connect: %s", why);
        /* Down, starting, shutting down, out of connections: may pass. A
         * refusal of who or what is asked for stays (the server's English
         * words; in another language it is tried again, each try logged). */
        static const char *const stays[] = { "does not exist", "authentication failed",
                                             "no pg_hba.conf entry", NULL };
        for (int i = 0; stays[i]; i++)
            if (strstr(why, stays[i])) return -1;
        return -2;
    }
    p->lock_timeout_ms = p->opt.busy_timeout_ms > 0 ? p->opt.busy_timeout_ms : 2000;
    memset(p->prepared, 0, sizeof p->prepared);
    memset(p->piped_prepared, 0, sizeof p->piped_prepared);
    PGresult *who = query(d, "SELECT pg_backend_pid(), current_setting('transaction_read_only')",
                          err, errlen);
    if (!who) return -1;
    p->shared = PQntuples(who) != 1 || atoi(PQgetvalue(who, 0, 0)) != PQbackendPID(p->conn);
    /* A writer's connection on a server that takes no writes -- a standby
     * (hot_standby), or one not promoted yet mid-failover -- may find the
     * primary it needs later: the caller may try again. */
    int read_only = PQntuples(who) == 1 && !strcmp(PQgetvalue(who, 0, 1), "on");
    PQclear(who);
    if (read_only && !p->opt.readonly) {
        snprintf(err, errlen, "the server takes no writes (transaction_read_only is on: a "
                 "standby, or a primary not promoted yet)");
        return -2;
    }
    if (p->shared) {
        char why[200];
        if (exec(d, "BEGIN", why, sizeof why) || exec(d, "COMMIT", why, sizeof why)) {
            /* PgBouncer says why, then hangs up: the reason is the
             * connection's, the result's only that it closed. */
            if (strstr(why, "statement pooling") || strstr(PQerrorMessage(p->conn),
                                                          "statement pooling"))
                snprintf(err, errlen, "the database is reached through a pooler in statement "
                         "mode (\"transaction blocks not allowed in statement pooling mode\"), "
                         "which cannot carry a transaction: give flashsale's database "
                         "pool_mode = transaction or session (PgBouncer)");
            else
                snprintf(err, errlen, "through a pooler: a transaction failed: %s", why);
            return -1;
        }
    } else {
        /* Durable commits always: a 201 means the order's row is on disk
         * (--synchronous NORMAL is SQLite's; PostgreSQL keeps on). Generic
         * plans: every statement of ours has one shape, found by a key or
         * an index whatever its arguments, so it is planned once per
         * connection; a custom plan per run re-planned a group's insert
         * each time, with its arrays, at more server CPU than the rows' own
         * work (make bench-pg: 40 -> 16 us of server CPU per order at
         * groups of ~90). A shared connection gets the first and the lock
         * wait in each transaction (send_begin), and has no named
         * statements to plan. */
        snprintf(sql, sizeof sql, "SET synchronous_commit=on; SET plan_cache_mode=force_generic_plan;"
                 " SET lock_timeout=%d;%s", p->lock_timeout_ms,
                 p->opt.readonly ? " SET default_transaction_read_only=on;" : "");
        if (exec(d, sql, err, errlen)) return -1;
    }
    if (!p->opt.readonly) {
        if (migrate(d, err, errlen)) return -1;
        return p->shared ? ensure_functions(d, err, errlen) : 0;
    }
    int v = schema_version(d, err, errlen);
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
    p->answer_ms = opt->answer_timeout_ms > 0 ? opt->answer_timeout_ms : 0;
    unsigned long long rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd) rnd = (unsigned long long)getpid();
    snprintf(p->slot, sizeof p->slot, "%llu", rnd % 1000000000000ULL + 1);
    for (int i = 0; i < DB_ST_COUNT; i++) {
        if (!(p->sql[i] = to_dollars(db_sql_of(d->drv, i)))) {
            snprintf(err, errlen, "out of memory");
            goto err;
        }
    }
    /* Bounds on a network that stops answering, and the name the server's
     * pg_stat_activity shows, before the target's own parameters (which
     * override them): a connect gives up after 5 s; a
     * statement sent and not acknowledged for 5 s, or a silent peer
     * probed 3 times a second apart after 5 s idle, breaks the
     * connection -- without them a partitioned server holds a query for
     * as long as TCP retransmits (15 minutes), and the writer with it. */
    static const char *const keys[] = { "connect_timeout", "keepalives", "keepalives_idle",
                                         "keepalives_interval", "keepalives_count",
                                         "tcp_user_timeout", "application_name", "dbname",
                                         NULL };
    const char *values[] = { "5", "1", "5", "1", "3", "5000", "flashsale", target, NULL };
    p->conn = PQconnectdbParams(keys, values, 1);
    if (!p->conn) {
        snprintf(err, errlen, "out of memory");
        goto err;
    }
    PQsetNoticeProcessor(p->conn, quiet, NULL);
    int rc = session(d, err, errlen);
    if (rc) {
        pg_close(d);
        return rc;
    }
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
    if (p->dropped) {
        p->dropped = 0;
        goto reopen;
    }
    /* Between transactions, a look at the socket first (a poll that does
     * not wait). The service never LISTENs, so an idle connection has
     * nothing to read unless the server is going away -- it sent FATAL
     * and hung up (shut down, crashed, promoted elsewhere) -- or the
     * socket failed (keepalives unanswered through a partition). Such a
     * connection is opened again here rather than found dead by the
     * statement, whose failure the caller could not tell from a refusal.
     * Inside a transaction a broken connection is the transaction's
     * failure, told as such. */
    if (PQstatus(p->conn) == CONNECTION_OK && PQtransactionStatus(p->conn) == PQTRANS_IDLE) {
        struct pollfd pfd = { .fd = PQsocket(p->conn), .events = POLLIN };
        if (pfd.fd < 0 || poll(&pfd, 1, 0) == 0) return DB_OK;
    } else if (PQstatus(p->conn) == CONNECTION_OK) {
        return DB_OK;
    }
reopen:;
    char err[600];
    PQreset(p->conn);
    if (session(d, err, sizeof err)) {
        p->dropped = 1;                  /* half open: opened again next time */
        return db_set_error(d, DB_ERROR, what, err);
    }
    return DB_OK;
}

/* ------------------------------------------------------------------- runs */

/* The answer to what was just sent (sent: whether it went), waited for
 * with the connection's answer deadline: DB_OK with *out the result, or
 * the failure (d's error set; a deadline passed drops the connection). */
static db_status answer(db *d, int sent, PGresult **out, const char *what) {
    pg *p = conn_of(d);
    waiter w;
    char msg[160];
    *out = NULL;
    if (!sent) return fail(d, NULL, what);
    waiter_start(&w, p->answer_ms);
    PGresult *res = last_answer(d, &w);
    if (!res && w.dropped) {
        snprintf(msg, sizeof msg, "no answer in %d ms (a pooler's wait for a server connection, "
                 "or a server out of reach); connection dropped", w.timeout_ms);
        return db_set_error(d, DB_ERROR, what, msg);
    }
    ExecStatusType rs = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (rs != PGRES_COMMAND_OK && rs != PGRES_TUPLES_OK) {
        db_status e = fail(d, res, what);
        PQclear(res);
        return e;
    }
    *out = res;
    return DB_OK;
}

/* Prepares sql as statement name on d's connection: DB_OK, or the failure
 * (d's error set). */
static db_status prepare(db *d, const char *name, const char *sql, int n,
                         const unsigned int *types, const char *what) {
    PGresult *res;
    db_status st = answer(d, PQsendPrepare(conn_of(d)->conn, name, sql, n, types), &res, what);
    PQclear(res);
    return st;
}

/* A shared connection's transaction settings (session() says why), SET
 * LOCAL as its first statement: a durable COMMIT and the lock wait. */
#define LOCAL_SETTINGS "SELECT set_config('synchronous_commit', 'on', true), " \
                       "set_config('lock_timeout', $1, true)"

/* Sends the BEGIN a transaction's first statement carries (begin_pending),
 * and on a shared connection its settings. */
static db_status send_begin(db *d, const char *what) {
    pg *p = conn_of(d);
    PGresult *res;
    if (!p->begin_pending) return DB_OK;
    p->begin_pending = 0;
    char sql[200];
    if (p->shared)             /* one round trip: a string of the two (the simple protocol) */
        snprintf(sql, sizeof sql, "BEGIN%s; SELECT set_config('synchronous_commit', 'on', true), "
                 "set_config('lock_timeout', '%d', true)", p->opt.readonly ? " READ ONLY" : "",
                 p->lock_timeout_ms);
    else
        snprintf(sql, sizeof sql, "BEGIN");
    db_status st = answer(d, PQsendQuery(p->conn, sql), &res, what);
    PQclear(res);
    return st;
}

static db_status pg_run(db *d, db_rows *r, int st, const char *sql, const db_arg *args, int n,
                        const char *what) {
    pg *p = conn_of(d);
    memset(r, 0, sizeof *r);
    r->d = d;
    r->st = st;
    r->row = -1;
    assert(st < 0 || n <= MAX_ARGS);
    /* BEGIN waits for the transaction's first statement; a transaction that
     * ends before one has nothing to send. */
    if (st == DB_ST_BEGIN) {
        if (ensure(d, what) != DB_OK) return DB_ERROR;
        p->begin_pending = 1;
        return DB_OK;
    }
    if ((st == DB_ST_COMMIT || st == DB_ST_ROLLBACK) && p->begin_pending) {
        p->begin_pending = 0;
        return DB_OK;
    }
    if (ensure(d, what) != DB_OK) return DB_ERROR;
    db_status begun = send_begin(d, what);
    if (begun != DB_OK) return begun;
    if (st == DB_ST_COMMIT) return commit_with_deadline(d, "COMMIT", d->commit_timeout_ms, what);
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
    /* The module's statements are named and prepared once per connection,
     * but on a shared one, where each goes with its text. */
    PGresult *res = NULL;
    db_status e = DB_OK;
    if (st >= 0 && !p->shared) {
        char name[16];
        snprintf(name, sizeof name, "s%d", st);
        if (!p->prepared[st]) {
            e = prepare(d, name, p->sql[st], n, n ? types : NULL, what);
            p->prepared[st] = e == DB_OK;
        }
        if (e == DB_OK)
            e = answer(d, PQsendQueryPrepared(p->conn, name, n, values, NULL, NULL, 0), &res,
                       what);
    } else if (st >= 0 || text) {
        e = answer(d, PQsendQueryParams(p->conn, st >= 0 ? p->sql[st] : text, n, types, values,
                                        NULL, NULL, 0), &res, what);
    } else {
        e = db_error(d, "out of memory");
    }
    free(text);
    free(used);
    if (n > MAX_ARGS) {
        free(nums);
        free(values);
        free(types);
    }
    r->h = res;
    return e;
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
    if (conn_of(d)->begin_pending) return 1;
    PGTransactionStatusType t = PQtransactionStatus(conn_of(d)->conn);
    return t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
}

/* The session's lock_timeout; on a shared connection, the next
 * transaction's (send_begin), and the open one's now. */
static void pg_wait_ms(db *d, int ms) {
    pg *p = conn_of(d);
    char sql[96], err[200];
    if (ms < 1) ms = 1;
    if (ms == p->lock_timeout_ms || ensure(d, "lock timeout") != DB_OK) return;
    if (p->shared) {
        p->lock_timeout_ms = ms;
        if (p->begin_pending || PQtransactionStatus(p->conn) != PQTRANS_INTRANS) return;
        snprintf(sql, sizeof sql, "SELECT set_config('lock_timeout', '%d', true)", ms);
        exec(d, sql, err, sizeof err);    /* failed: the transaction is failing anyway */
        return;
    }
    snprintf(sql, sizeof sql, "SET lock_timeout=%d", ms);
    p->lock_timeout_ms = exec(d, sql, err, sizeof err) ? -1 : ms;
}

/* ------------------------------------------------- a group's plain inserts
 *
 * The orders a group commits that were reserved in Redis are inserted by
 * one statement, their arguments as arrays (unnest), and two statements
 * (and the COMMIT) go to the server in one pipeline -- one round trip,
 * however many orders:
 *
 *   1. the SKUs' shared locks (db_sku_shared: advisory locks of the
 *      transaction, in SKU order): no rebuild and no void, which take it
 *      exclusive, can commit until this transaction does, while another
 *      instance's group of the same SKU goes on beside it (a row's share
 *      lock would do the same, but writes the row, a multixact per group);
 *   2. the orders inserted whose generation is the row's and that are not
 *      voided (a statement of its own, so that its snapshot is taken with
 *      the locks held and sees a void that committed while it waited), a
 *      hold's row beside each hold, and each SKU's sold and held raised by
 *      its orders' units in this connection's own tally row (schema
 *      version 8: the products row is not written, so two instances'
 *      groups of one hot SKU do not wait for each other's COMMIT); the ids
 *      inserted come back;
 *   3. only when a keyed order was left out (a replay, a stale copy;
 *      nearly never), after the COMMIT -- or in the pipeline, when the
 *      transaction goes on after it -- the orders whose idempotency key
 *      another order holds (DB_DUPKEY, where db_order_insert would say
 *      so; any other refusal is DB_STALE). */

/* The shared locks of the SKUs of array arr, in SKU order: after SELECT
 * (PLAIN_LOCK) or PERFORM (PLAIN_LOCK_FIRST, below). */
#define SKU_LOCKS(arr) "pg_advisory_xact_lock_shared(hashtextextended(s, 0))" \
                       " FROM (SELECT DISTINCT unnest(" arr ") AS s ORDER BY 1) x"
static const char PLAIN_LOCK[] = "SELECT " SKU_LOCKS("$1::text[]");
/* The same for a group of one SKU (a sale's usual group): one function
 * call, no sort of the SKUs. */
static const char PLAIN_LOCK_ONE[] = "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))";

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
    " u AS (INSERT INTO product_tallies(sku, slot, sold, held)"
    " SELECT o.sku, $10::bigint, sum(CASE WHEN o.expires_ms > 0 THEN 0 ELSE o.quantity END),"
    " sum(CASE WHEN o.expires_ms > 0 THEN o.quantity ELSE 0 END)"
    " FROM o JOIN ins USING (order_id) GROUP BY o.sku"
    " ON CONFLICT (sku, slot) DO UPDATE SET sold = product_tallies.sold + excluded.sold,"
    " held = product_tallies.held + excluded.held)"
    " SELECT o.n FROM o JOIN ins USING (order_id)";

/* The same for a group without holds (the usual one): no insert into
 * holds at all, whose table and indexes every run of PLAIN_INSERT opens
 * even when it inserts nothing. */
static const char PLAIN_INSERT_NO_HOLDS[] =
    "WITH o AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[],"
    " $5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::text[]) WITH ORDINALITY"
    " AS o(order_id, sku, user_id, quantity, idempotency_key, created_at, gen, expires_ms,"
    " takes, n)),"
    " ins AS (INSERT INTO orders(order_id, sku, user_id, quantity, idempotency_key, created_at)"
    " SELECT o.order_id, o.sku, o.user_id, o.quantity, o.idempotency_key, o.created_at"
    " FROM o JOIN products p ON p.sku = o.sku AND p.stock_gen = o.gen"
    " WHERE NOT EXISTS (SELECT 1 FROM voided_orders v WHERE v.order_id = o.order_id)"
    " ON CONFLICT DO NOTHING RETURNING order_id),"
    " u AS (INSERT INTO product_tallies(sku, slot, sold, held)"
    " SELECT o.sku, $10::bigint, sum(o.quantity), 0"
    " FROM o JOIN ins USING (order_id) GROUP BY o.sku"
    " ON CONFLICT (sku, slot) DO UPDATE SET sold = product_tallies.sold + excluded.sold)"
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

/* Array literals being written: each opened with "{" and closed with "}". */
static void arrays_open(buf *a, int n) {
    memset(a, 0, (size_t)n * sizeof *a);
    for (int k = 0; k < n; k++) put(&a[k], "{", 1);
}

/* Closes them; 0, or -1 when one ran out of memory. */
static int arrays_close(buf *a, int n) {
    int oom = 0;
    for (int k = 0; k < n; k++) {
        put(&a[k], "}", 1);
        oom |= a[k].oom;
    }
    return oom ? -1 : 0;
}

static void arrays_free(buf *a, int n) {
    for (int k = 0; k < n; k++) free(a[k].p);
}

/* A statement of a pipeline: its SQL and its arguments (array literals). */
typedef struct piped {
    const char *sql;
    int n;
    const char *args[12];
    PGresult *res;              /* out: its result (the caller clears it) */
} piped;

/* The place of sql among the pipelines' statements (PIPED, below). */
static int piped_index(const char *sql);
/* How a shared connection sends sql: a call of its function (FNS, below),
 * or sql itself. */
static const char *shared_text(const char *sql);

/* Prepares, on this connection, the statements of q[0..nq) not prepared
 * yet (once per connection: prepared again after a reconnect), so that a
 * group's statements are parsed and planned once, not per group -- a big
 * CTE's parse, analysis and plan cost the server several times the
 * group's rows. DB_OK or the failure. */
static db_status prepare_piped(db *d, const piped *q, int nq, const char *what) {
    pg *p = conn_of(d);
    for (int i = 0; i < nq; i++) {
        int k = piped_index(q[i].sql);
        if (p->piped_prepared[k]) continue;
        char name[16];
        snprintf(name, sizeof name, "g%d", k);
        db_status e = prepare(d, name, q[i].sql, 0, NULL, what);
        if (e != DB_OK) return e;
        p->piped_prepared[k] = 1;
    }
    return DB_OK;
}

/* Sends q[0..nq) in one pipeline (one round trip) and reads their results
 * -- behind the transaction's pending BEGIN, and with commit, followed by
 * its COMMIT. DB_OK; else the first failure's status (DB_BUSY for a lock
 * not granted in time, a deadlock, a serialization failure), d's error
 * set, every result cleared, and *commit_unknown (when commit) set if the
 * COMMIT was sent and whether it ran cannot be told (it failed itself, or
 * the connection broke). The connection is out of pipeline mode either
 * way. */
static db_status pipeline_commit(db *d, piped *q, int nq, int commit, int *commit_unknown,
                                 const char *what) {
    pg *p = conn_of(d);
    db_status st = DB_OK;
    int begin = p->begin_pending;
    waiter w;
    if (commit_unknown) *commit_unknown = 0;
    if (commit) d->unconfirmed = 0;
    for (int i = 0; i < nq; i++) q[i].res = NULL;
    if (!p->shared && (st = prepare_piped(d, q, nq, what)) != DB_OK) return st;
    if (PQenterPipelineMode(p->conn) != 1) return fail(d, NULL, what);
    p->begin_pending = 0;
    /* What goes before the statements: the BEGIN, and on a shared
     * connection the transaction's settings (send_begin). */
    char ms[16];
    const char *local[] = { ms };
    snprintf(ms, sizeof ms, "%d", p->lock_timeout_ms);
    int head = begin ? 1 + p->shared : 0;
    int sent = !begin || PQsendQueryParams(p->conn, "BEGIN", 0, NULL, NULL, NULL, NULL, 0);
    if (sent && begin && p->shared)
        sent = PQsendQueryParams(p->conn, LOCAL_SETTINGS, 1, NULL, local, NULL, NULL, 0);
    for (int i = 0; sent && i < nq; i++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", piped_index(q[i].sql));
        sent = p->shared ? PQsendQueryParams(p->conn, shared_text(q[i].sql), q[i].n, NULL,
                                             q[i].args, NULL, NULL, 0)
                         : PQsendQueryPrepared(p->conn, name, q[i].n, q[i].args, NULL, NULL, 0);
    }
    sent = sent && (!commit || PQsendQueryParams(p->conn, "COMMIT", 0, NULL, NULL, NULL, NULL, 0));
    sent = sent && PQpipelineSync(p->conn);
    if (!sent) {
        st = fail(d, NULL, what);
        if (commit && commit_unknown) *commit_unknown = 1;   /* it may have gone out */
    }
    /* With the COMMIT in it, the pipeline has the COMMIT's deadline; else
     * any statement's. */
    waiter_start(&w, commit ? d->commit_timeout_ms : p->answer_ms);
    PGresult *extra;
    for (int i = -head; sent && i < nq + commit; i++) {
        if (await_result(d, &w)) {
            if (st == DB_OK) st = db_set_error(d, DB_ERROR, what, "no answer");
            break;
        }
        PGresult *res = PQgetResult(p->conn);
        while ((extra = PQgetResult(p->conn)) != NULL) PQclear(extra);
        ExecStatusType rs = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
        int bad = rs != PGRES_TUPLES_OK && rs != PGRES_COMMAND_OK;
        if (i == nq && bad && st == DB_OK && commit_unknown) *commit_unknown = 1;
        if (st == DB_OK && bad) st = fail(d, res, what);
        if (i >= 0 && i < nq) q[i].res = res;
        else PQclear(res);
    }
    if (commit) st = unconfirmed(d, &w, st, what);
    if (st != DB_OK && commit && commit_unknown &&
        (w.canceled || PQstatus(p->conn) != CONNECTION_OK))
        *commit_unknown = 1;     /* the COMMIT went out; its answer did not come, or was forced */
    /* Whatever failed, read on to the sync so the connection is usable. */
    PGresult *sync;
    while (sent && !w.dropped && (sync = PQgetResult(p->conn)) != NULL) {
        int end = PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
        PQclear(sync);
        if (end) break;
    }
    if (!w.dropped) PQexitPipelineMode(p->conn);
    if (st != DB_OK)
        for (int i = 0; i < nq; i++) {
            PQclear(q[i].res);
            q[i].res = NULL;
        }
    return st;
}

static db_status pipeline(db *d, piped *q, int nq, const char *what) {
    return pipeline_commit(d, q, nq, 0, NULL, what);
}

enum { A_ID, A_SKU, A_USER, A_QTY, A_KEY, A_AT, A_GEN, A_EXP, A_TAKES, A_NARRAYS };
#define A_NPARAMS (A_NARRAYS + 1)       /* and the tally's slot */

/* The orders reserved in Redis (above). */
static db_status insert_plain(db *d, db_job **jobs, size_t n, int commit, int *committed,
                              int *commit_unknown) {
    buf a[A_NARRAYS], skus[1], keys[2];
    size_t nplain = 0, nkeyed = 0, nholds = 0;
    int one_sku = 1;
    db_status st = DB_OK;
    /* The jobs by their place in the arrays (1-based, as WITH ORDINALITY
     * counts): plain[k - 1], and keyed[k - 1] for the keys' array. */
    db_job **plain = calloc(n ? n : 1, sizeof *plain), **keyed = calloc(n ? n : 1, sizeof *keyed);
    arrays_open(a, A_NARRAYS);
    arrays_open(skus, 1);
    arrays_open(keys, 2);
    if (!plain || !keyed) {
        st = db_error(d, "insert orders: out of memory");
        goto out;
    }
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
        nholds += o->expires_ms > 0;
        if (o->idem_key[0]) {
            put_text(&keys[0], o->order_id);
            put_text(&keys[1], o->idem_key);
            keyed[nkeyed++] = j;
        }
        put_text(&skus[0], o->sku);            /* = ANY() takes a SKU twice as once */
        one_sku = one_sku && strcmp(o->sku, plain[0]->order.sku) == 0;
    }
    if (nplain == 0) goto out;
    if (arrays_close(a, A_NARRAYS) || arrays_close(skus, 1) || arrays_close(keys, 2)) {
        st = db_error(d, "insert orders: out of memory");
        goto out;
    }
    piped q[3] = { { one_sku ? PLAIN_LOCK_ONE : PLAIN_LOCK, 1,
                     { one_sku ? plain[0]->order.sku : skus[0].p }, NULL },
                   { nholds ? PLAIN_INSERT : PLAIN_INSERT_NO_HOLDS, A_NPARAMS, { 0 }, NULL },
                   { PLAIN_KEYS, 2, { keys[0].p, keys[1].p }, NULL } };
    for (int k = 0; k < A_NARRAYS; k++) q[1].args[k] = a[k].p;
    q[1].args[A_NARRAYS] = conn_of(d)->slot;
    *committed = commit;
    /* With the COMMIT in the pipeline, the keys are asked after it, and
     * only when a keyed order was left out (a replay, a stale copy):
     * nearly never, and the statement cost every group a third of a
     * transaction's statements. Asked then, the key's holder is a
     * committed order as it was inside the transaction. */
    int keys_now = nkeyed && !commit;
    /* On a shared connection the insert's function takes the SKUs' locks
     * itself (FNS): the lock is not a statement of its own there. */
    int from = conn_of(d)->shared ? 1 : 0;
    if ((st = pipeline_commit(d, q + from, (keys_now ? 3 : 2) - from, commit, commit_unknown,
                              "insert orders")) != DB_OK)
        goto out;
    /* A job is inserted when its place came back; else a key another
     * order holds makes it a replay's refusal; else stale. */
    size_t left_out = 0;
    for (int r = 0; r < PQntuples(q[1].res); r++) {
        long long k = atoll(PQgetvalue(q[1].res, r, 0));
        if (k >= 1 && (size_t)k <= nplain) plain[k - 1]->status = DB_OK;
    }
    for (size_t k = 0; k < nkeyed; k++) left_out += keyed[k]->status != DB_OK;
    if (!keys_now && left_out && pipeline(d, &q[2], 1, "insert orders: keys") != DB_OK) {
        /* Committed; whether a left-out order's key is another's cannot
         * be told now: refused as the database's failure, units back. */
        for (size_t k = 0; k < nkeyed; k++)
            if (keyed[k]->status != DB_OK) keyed[k]->status = DB_ERROR;
        goto clear;
    }
    for (int r = 0; nkeyed && r < PQntuples(q[2].res); r++) {
        long long k = atoll(PQgetvalue(q[2].res, r, 0));
        if (k >= 1 && (size_t)k <= nkeyed && keyed[k - 1]->status != DB_OK)
            keyed[k - 1]->status = DB_DUPKEY;
    }
clear:
    for (int k = 0; k < 3; k++) PQclear(q[k].res);
out:
    arrays_free(a, A_NARRAYS);
    arrays_free(skus, 1);
    arrays_free(keys, 2);
    free(plain);
    free(keyed);
    return st;
}

/* ------------------------------------------------- a group's db takes
 *
 * The `db` and `db-optimistic` orders of a group, by the same rules as
 * db_order_insert's take (a replay first, then the buyer's limit, then the
 * conditional take -- for db-optimistic the version too), decided here in
 * arrival order from one read of what they depend on, and written once:
 *
 *   1. one pipeline: the SKUs' rows locked and read (FOR NO KEY UPDATE,
 *      SKU order), the buyers' units, the keys that orders hold already;
 *   2. the decisions, order by order, against those figures as each take
 *      leaves them (what a statement per order would have seen);
 *   3. one pipeline: the orders taken inserted (and their holds' rows), each
 *      SKU's row updated once (units, versions, sold, held), the buyers'
 *      units added.
 *
 * A hot SKU's row is written once per group, not once per order, and the
 * group waits two round trips, not eight per order. */

static const char TAKE_LOCK[] =
    "SELECT sku, db_available, db_version FROM products WHERE sku = ANY($1::text[])"
    " ORDER BY sku FOR NO KEY UPDATE";
static const char TAKE_UNITS[] =
    "SELECT u.sku, u.user_id, u.units FROM user_units u"
    " JOIN unnest($1::text[], $2::text[]) AS x(sku, user_id)"
    " ON u.sku = x.sku AND u.user_id = x.user_id";
static const char TAKE_KEYS[] =
    "SELECT idempotency_key FROM orders WHERE idempotency_key = ANY($1::text[])";
static const char TAKE_INSERT[] =
    "WITH o AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[],"
    " $5::text[], $6::text[], $7::bigint[])"
    " AS o(order_id, sku, user_id, quantity, idempotency_key, created_at, expires_ms)),"
    " ins AS (INSERT INTO orders(order_id, sku, user_id, quantity, idempotency_key, created_at)"
    " SELECT order_id, sku, user_id, quantity, idempotency_key, created_at FROM o"
    " ON CONFLICT DO NOTHING RETURNING order_id),"
    " h AS (INSERT INTO holds(order_id, sku, quantity, gen, takes, in_db, expires_ms, state)"
    " SELECT o.order_id, o.sku, o.quantity, 0, '', 1, o.expires_ms, 'reserved'"
    " FROM o JOIN ins USING (order_id) WHERE o.expires_ms > 0)"
    " SELECT count(*) FROM ins";
static const char TAKE_PRODUCTS[] =
    "UPDATE products p SET db_available = p.db_available - t.q, db_version = p.db_version + t.v,"
    " sold = p.sold + t.sold, held = p.held + t.held"
    " FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[])"
    " AS t(sku, q, v, sold, held) WHERE p.sku = t.sku";
static const char TAKE_USERS[] =
    "INSERT INTO user_units(sku, user_id, units)"
    " SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])"
    " ON CONFLICT (sku, user_id) DO UPDATE SET units = user_units.units + excluded.units";

/* Every statement a pipeline sends, prepared once per connection by its
 * place here (prepare_piped). */
static const char *const PIPED[] = { PLAIN_LOCK, PLAIN_LOCK_ONE, PLAIN_INSERT,
                                     PLAIN_INSERT_NO_HOLDS, PLAIN_KEYS, TAKE_LOCK, TAKE_UNITS,
                                     TAKE_KEYS, TAKE_INSERT, TAKE_PRODUCTS, TAKE_USERS };

static int piped_index(const char *sql) {
    int k = 0, n = (int)(sizeof PIPED / sizeof PIPED[0]);
    while (k < n && PIPED[k] != sql) k++;
    assert(k < n && k < (int)sizeof ((pg *)0)->piped_prepared);   /* every one is listed */
    return k;
}

/* ------------------------------------------- a shared connection's functions
 *
 * A shared connection (session()) can keep no prepared statement, and a
 * group's insert parsed and planned at every run cost the server about as
 * much again as the group's rows (make bench-pgscale: PostgreSQL's CPU per
 * order 46-61 us through PgBouncer against 25-27 us straight). So the
 * group's statements are wrapped in PL/pgSQL functions, whose plans each
 * server backend keeps from one call to the next whoever borrows it: what
 * is parsed and planned per group is the call. A function is named by a
 * hash of its text and parameters, so a build whose statement changed
 * makes a function of its own; the first shared connection that misses
 * one creates it, under the schema's lock (ensure_functions). */

typedef struct piped_fn {
    const char *sql;            /* a PIPED statement, returning one bigint column */
    const char *args;           /* its parameters' types, in order */
    int nargs;
    const char *first;          /* NULL, or a statement PERFORMed before it */
} piped_fn;

/* The group's SKU locks (PLAIN_LOCK) on the SKUs of the insert's orders
 * ($2), taken by the insert's function before its statement: a function
 * that is not STABLE gives each of its statements a snapshot of its own
 * (READ COMMITTED), so the insert's is taken with the locks held, as the
 * direct connection's separate statements do -- one call less a group. */
#define PLAIN_LOCK_FIRST "PERFORM " SKU_LOCKS("$2")
#define PLAIN_ARGS "text[],text[],text[],int[],text[],text[],bigint[],bigint[],text[],bigint"
static const piped_fn FNS[] = {
    { PLAIN_INSERT, PLAIN_ARGS, A_NPARAMS, PLAIN_LOCK_FIRST },
    { PLAIN_INSERT_NO_HOLDS, PLAIN_ARGS, A_NPARAMS, PLAIN_LOCK_FIRST },
    { PLAIN_KEYS, "text[],text[]", 2, NULL },
};
#define NFNS (sizeof FNS / sizeof FNS[0])

static char fn_name[NFNS][32];          /* flashsale_<16 hex> */
static char fn_call[NFNS][160];         /* SELECT * FROM <name>($1, ...) */
static pthread_once_t fns_named = PTHREAD_ONCE_INIT;

static void name_fns(void) {
    for (size_t k = 0; k < NFNS; k++) {
        uint64_t h = 1469598103934665603ULL;              /* FNV-1a */
        for (const char *c = FNS[k].sql; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        for (const char *c = FNS[k].args; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        for (const char *c = FNS[k].first ? FNS[k].first : ""; *c; c++)
            h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        snprintf(fn_name[k], sizeof fn_name[k], "flashsale_%016llx", (unsigned long long)h);
        int n = snprintf(fn_call[k], sizeof fn_call[k], "SELECT * FROM %s(", fn_name[k]);
        for (int a = 1; a <= FNS[k].nargs; a++)
            n += snprintf(fn_call[k] + n, sizeof fn_call[k] - (size_t)n, "%s$%d", a > 1 ? "," : "",
                          a);
        snprintf(fn_call[k] + n, sizeof fn_call[k] - (size_t)n, ")");
    }
}

static const char *shared_text(const char *sql) {
    pthread_once(&fns_named, name_fns);
    for (size_t k = 0; k < NFNS; k++)
        if (FNS[k].sql == sql) return fn_call[k];
    return sql;
}

/* Creates, on d's database, the functions of FNS it lacks: 0, or -1 with
 * err set. One look at the catalog when they are all there. */
static int ensure_functions(db *d, char *err, size_t errlen) {
    pthread_once(&fns_named, name_fns);
    char look[600] = "SELECT count(*) FROM pg_proc WHERE proname IN (";
    for (size_t k = 0; k < NFNS; k++)
        snprintf(look + strlen(look), sizeof look - strlen(look), "%s'%s'", k ? "," : "",
                 fn_name[k]);
    snprintf(look + strlen(look), sizeof look - strlen(look), ")");
    PGresult *r = query(d, look, err, errlen);
    if (!r) return -1;
    int have = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (have == (int)NFNS) return 0;
    size_t len = 256;
    for (size_t k = 0; k < NFNS; k++)
        len += strlen(FNS[k].sql) + (FNS[k].first ? strlen(FNS[k].first) : 0) + 400;
    char *sql = malloc(len);
    if (!sql) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* One string, one transaction: a transaction pool keeps it on one
     * server connection. */
    int n = snprintf(sql, len, "BEGIN; SELECT pg_advisory_xact_lock(%lld);",
                     (long long)MIGRATE_LOCK);
    for (size_t k = 0; k < NFNS; k++)
        n += snprintf(sql + n, len - (size_t)n,
                      " CREATE OR REPLACE FUNCTION %s(%s) RETURNS SETOF bigint LANGUAGE plpgsql"
                      " SET plan_cache_mode = force_generic_plan AS $fs$ BEGIN %s%s RETURN QUERY %s;"
                      " END $fs$;", fn_name[k], FNS[k].args, FNS[k].first ? FNS[k].first : "",
                      FNS[k].first ? ";" : "", FNS[k].sql);
    snprintf(sql + n, len - (size_t)n, " COMMIT");
    int rc = exec(d, sql, err, errlen);
    free(sql);
    return rc;
}

/* One SKU of the group's takes, as read and as the takes leave it. */
typedef struct take_sku {
    const char *sku;
    int found;
    long long available, version;
    long long q, v, sold, held;         /* what this group takes */
} take_sku;

/* A buyer's units of a SKU, as read and as the takes leave them. */
typedef struct take_user {
    const char *sku, *user;
    long long units, added;
} take_user;

static int is_take(const db_job *j) {
    return j->kind == DB_JOB_INSERT &&
           (j->take == DB_TAKE_CONDITIONAL || j->take == DB_TAKE_OPTIMISTIC);
}

static take_sku *sku_of(take_sku *s, size_t ns, const char *sku) {
    for (size_t i = 0; i < ns; i++)
        if (!strcmp(s[i].sku, sku)) return &s[i];
    return NULL;
}

static take_user *user_of(take_user *u, size_t nu, const char *sku, const char *user) {
    for (size_t i = 0; i < nu; i++)
        if (!strcmp(u[i].sku, sku) && !strcmp(u[i].user, user)) return &u[i];
    return NULL;
}

/* Decides job j against the figures (step 2); keys[0..*nkeys) are those
 * taken already, to which an order taken adds its own. */
static void decide_take(db_job *j, take_sku *s, take_user *u, const char **keys, size_t *nkeys) {
    const db_order *o = &j->order;
    if (o->idem_key[0])
        for (size_t k = 0; k < *nkeys; k++)
            if (!strcmp(keys[k], o->idem_key)) {
                j->status = DB_DUPKEY;         /* a replay is a replay before anything else */
                return;
            }
    if (!s || !s->found) {
        j->status = DB_NOTFOUND;
        return;
    }
    if (j->per_user_limit > 0 && u && u->units + u->added + o->quantity > j->per_user_limit) {
        j->available = u->units + u->added;
        j->status = DB_LIMIT;
        return;
    }
    if (s->available < o->quantity) {
        j->available = s->available;
        j->status = DB_NOSTOCK;
        return;
    }
    if (j->take == DB_TAKE_OPTIMISTIC && s->version != j->expect_version) {
        j->available = s->available;
        j->status = DB_CONFLICT;
        return;
    }
    s->available -= o->quantity;
    s->version++;
    s->q += o->quantity;
    s->v++;
    if (o->expires_ms > 0) s->held += o->quantity;
    else s->sold += o->quantity;
    if (j->per_user_limit > 0 && u) u->added += o->quantity;
    if (o->idem_key[0]) keys[(*nkeys)++] = o->idem_key;
    j->available = s->available;
    j->status = DB_OK;
}

enum { T_ID, T_SKU, T_USER, T_QTY, T_KEY, T_AT, T_EXP, T_NARRAYS };

static db_status insert_takes(db *d, db_job **jobs, size_t n, int commit, int *committed,
                              int *commit_unknown) {
    db_job **tj = calloc(n ? n : 1, sizeof *tj);
    take_sku *s = calloc(n ? n : 1, sizeof *s);
    take_user *u = calloc(n ? n : 1, sizeof *u);
    const char **keys = NULL;
    size_t nt = 0, ns = 0, nu = 0, nkeys = 0, nkeyed = 0, taken = 0, nadd = 0;
    buf rd[4], wr[T_NARRAYS], prod[5], users[3];
    db_status st = DB_OK;
    piped r1[3], q[3];
    memset(r1, 0, sizeof r1);
    memset(q, 0, sizeof q);
    arrays_open(rd, 4);
    arrays_open(wr, T_NARRAYS);
    arrays_open(prod, 5);
    arrays_open(users, 3);
    if (!tj || !s || !u) goto oom;
    for (size_t i = 0; i < n; i++) {
        db_job *j = jobs[i];
        if (!is_take(j)) continue;
        tj[nt++] = j;
        const db_order *o = &j->order;
        if (!sku_of(s, ns, o->sku)) {
            s[ns++].sku = o->sku;
            put_text(&rd[0], o->sku);
        }
        if (o->idem_key[0]) {
            nkeyed++;
            put_text(&rd[3], o->idem_key);
        }
        if (j->per_user_limit > 0 && !user_of(u, nu, o->sku, o->user_id)) {
            u[nu].sku = o->sku;
            u[nu++].user = o->user_id;
            put_text(&rd[1], o->sku);
            put_text(&rd[2], o->user_id);
        }
    }
    if (nt == 0) goto out;
    if (arrays_close(rd, 4)) goto oom;
    /* 1. The figures, under the rows' locks. */
    r1[0] = (piped){ TAKE_LOCK, 1, { rd[0].p }, NULL };
    r1[1] = (piped){ TAKE_UNITS, 2, { rd[1].p, rd[2].p }, NULL };
    r1[2] = (piped){ TAKE_KEYS, 1, { rd[3].p }, NULL };
    if ((st = pipeline(d, r1, nkeyed ? 3 : 2, "read the takes' figures")) != DB_OK) goto out;
    for (int r = 0; r < PQntuples(r1[0].res); r++) {
        take_sku *t = sku_of(s, ns, PQgetvalue(r1[0].res, r, 0));
        if (!t) continue;
        t->found = 1;
        t->available = atoll(PQgetvalue(r1[0].res, r, 1));
        t->version = atoll(PQgetvalue(r1[0].res, r, 2));
    }
    for (int r = 0; r < PQntuples(r1[1].res); r++) {
        take_user *t = user_of(u, nu, PQgetvalue(r1[1].res, r, 0), PQgetvalue(r1[1].res, r, 1));
        if (t) t->units = atoll(PQgetvalue(r1[1].res, r, 2));
    }
    size_t nread = nkeyed ? (size_t)PQntuples(r1[2].res) : 0;
    if (!(keys = calloc(nread + nt + 1, sizeof *keys))) goto oom;
    for (size_t r = 0; r < nread; r++) keys[nkeys++] = PQgetvalue(r1[2].res, (int)r, 0);
    /* 2. The decisions, in arrival order. */
    for (size_t i = 0; i < nt; i++) {
        db_job *j = tj[i];
        decide_take(j, sku_of(s, ns, j->order.sku),
                    user_of(u, nu, j->order.sku, j->order.user_id), keys, &nkeys);
        if (j->status != DB_OK) continue;
        const db_order *o = &j->order;
        taken++;
        put_text(&wr[T_ID], o->order_id);
        put_text(&wr[T_SKU], o->sku);
        put_text(&wr[T_USER], o->user_id);
        put_int(&wr[T_QTY], o->quantity);
        put_text(&wr[T_KEY], o->idem_key[0] ? o->idem_key : NULL);
        put_text(&wr[T_AT], o->created_at);
        put_int(&wr[T_EXP], o->expires_ms > 0 ? o->expires_ms : 0);
    }
    if (taken == 0) goto out;
    for (size_t i = 0; i < ns; i++) {
        if (!s[i].q) continue;
        put_text(&prod[0], s[i].sku);
        put_int(&prod[1], s[i].q);
        put_int(&prod[2], s[i].v);
        put_int(&prod[3], s[i].sold);
        put_int(&prod[4], s[i].held);
    }
    for (size_t i = 0; i < nu; i++) {
        if (!u[i].added) continue;
        nadd++;
        put_text(&users[0], u[i].sku);
        put_text(&users[1], u[i].user);
        put_int(&users[2], u[i].added);
    }
    if (arrays_close(wr, T_NARRAYS) || arrays_close(prod, 5) || arrays_close(users, 3)) goto oom;
    /* 3. The writes, once per row. */
    q[0] = (piped){ TAKE_INSERT, T_NARRAYS, { 0 }, NULL };
    for (int k = 0; k < T_NARRAYS; k++) q[0].args[k] = wr[k].p;
    q[1] = (piped){ TAKE_PRODUCTS, 5, { prod[0].p, prod[1].p, prod[2].p, prod[3].p, prod[4].p },
                    NULL };
    q[2] = (piped){ TAKE_USERS, 3, { users[0].p, users[1].p, users[2].p }, NULL };
    *committed = commit;
    if ((st = pipeline_commit(d, q, nadd ? 3 : 2, commit, commit_unknown, "write the takes")) !=
        DB_OK)
        goto out;
    /* Every order taken is in, or the group fails: units taken without
     * their order would leak. */
    if (atoll(PQgetvalue(q[0].res, 0, 0)) != (long long)taken)
        st = db_error(d, "write the takes: an order id was taken already");
    goto out;
oom:
    st = db_error(d, "db takes: out of memory");
out:
    for (int k = 0; k < 3; k++) {
        PQclear(r1[k].res);                    /* keys[] pointed into it: done with */
        PQclear(q[k].res);
    }
    arrays_free(rd, 4);
    arrays_free(wr, T_NARRAYS);
    arrays_free(prod, 5);
    arrays_free(users, 3);
    free(keys);
    free(tj);
    free(s);
    free(u);
    return st;
}

/* The group's orders a server takes at once: those reserved in Redis,
 * then the db strategies' takes; with commit, the COMMIT goes in the last
 * pipeline (a group of orders reserved in Redis: one round trip). */
static db_status pg_insert_group(db *d, db_job **jobs, size_t n, int commit,
                                 int *commit_unknown) {
    int takes = 0, committed = 0;
    *commit_unknown = 0;
    for (size_t i = 0; i < n && !takes; i++) takes = is_take(jobs[i]);
    db_status st = insert_plain(d, jobs, n, commit && !takes, &committed, commit_unknown);
    if (st == DB_OK && takes) st = insert_takes(d, jobs, n, commit, &committed, commit_unknown);
    if (st == DB_OK && commit && !committed)
        st = pipeline_commit(d, NULL, 0, 1, commit_unknown, "commit");
    return st;
}

static const char *pg_tally_slot(db *d) { return conn_of(d)->slot; }

static int pg_pooled(const db *d) { return ((const pg *)d->impl)->shared; }

/* The barrier: a transaction that writes (a row of its own in meta, put
 * and taken away, so the table ends as it was), whose COMMIT waits for the
 * synchronous standby as an order's does; the standby confirming it has
 * every record before it. (A transaction that only takes an id, such as
 * SELECT txid_current(), writes its commit record without waiting for
 * the standby: PostgreSQL waits only for transactions that wrote.) */
static db_status pg_barrier(db *d, int timeout_ms) {
    pg *p = conn_of(d);
    if (ensure(d, "barrier") != DB_OK) return DB_ERROR;
    /* A statement that failed or was canceled inside a transaction -- a
     * barrier of its own whose INSERT waited on a lock past its deadline,
     * one string of statements cut short -- leaves the session in an
     * aborted block (or a BEGIN not sent yet): the server's doing, so it is
     * ended here, not asserted away. An end that is not answered either
     * drops the connection, and the barrier fails for its caller to retry. */
    p->begin_pending = 0;
    if (pg_in_tx(d)) {
        db_status st = commit_with_deadline(d, "ROLLBACK", timeout_ms, "barrier: end an aborted "
                                            "transaction");
        d->unconfirmed = 0;                    /* a ROLLBACK confirms nothing either way */
        if (st != DB_OK || pg_in_tx(d)) {
            if (!p->dropped) drop(d);
            return db_set_error(d, DB_ERROR, "barrier", "a transaction left open could not be ended");
        }
    }
    return commit_with_deadline(d,
                                "BEGIN; INSERT INTO meta(key,value)"
                                " VALUES('barrier.'||pg_backend_pid(),'');"
                                " DELETE FROM meta WHERE key='barrier.'||pg_backend_pid(); COMMIT",
                                timeout_ms, "barrier");
}

/* A libpq URI is ours. */
static int pg_claims(const char *target) {
    return !strncmp(target, "postgresql://", 13) || !strncmp(target, "postgres://", 11);
}

/* The URI with its password (user:pw@) replaced by "***". */
static void pg_redact(const char *target, char *out, size_t len) {
    const char *scheme = strstr(target, "://");
    const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
    const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - scheme - 3)) : NULL;
    if (!colon) {
        snprintf(out, len, "%s", target);
        return;
    }
    snprintf(out, len, "%.*s:***%s", (int)(colon - target), target, at);
}

const db_driver db_pg_driver = {
    .name = "postgresql",
    .claims = pg_claims,
    .row_locks = 1,
    .server = 1,
    .redact = pg_redact,
    .sql = SQL,
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
    .insert_group = pg_insert_group,
    .tally_slot = pg_tally_slot,
    .barrier = pg_barrier,
    .pooled = pg_pooled,
};
