/* test_db.c: the db module on a real SQLite file, and again on a real
 * PostgreSQL server when the runner gives one (FLASHSALE_TEST_PG, the URL
 * of a database of a server where databases may be created: each case
 * gets one of its own): schema and migration, products, the generation and
 * tombstone rules, idempotency keys, the db strategies' conditional take,
 * holds (decisions, the expiry sweep, the debts of units), and the
 * group-commit writer. The same cases, the same expectations. */
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "common/clock.h"
#include "db/db.h"
#include "db/holds.h"
#include "db/locktable.h"
#include "db/pool.h"
#include "tests/unit/t.h"

static char dir[] = "/tmp/fs-test-db-XXXXXX";
static char path[512];
static const db_options OPTS = { 1, 2000, 0, 0, 0 };
/* The PostgreSQL server's URL (FLASHSALE_TEST_PG) while the cases run on
 * it; NULL: on SQLite files. */
static const char *pg_url;

/* Runs sql on the server with psql (creating databases, tampering). */
static int psql(const char *db_url, const char *sql) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "psql -q -v ON_ERROR_STOP=1 '%s' -c \"%s\" >/dev/null", db_url, sql);
    return system(cmd);
}

/* A new database for a case: a SQLite file, or a database of the server. */
static db *fresh(void) {
    static int n;
    char err[256];
    if (pg_url) {
        char sql[64];
        const char *slash = strrchr(pg_url, '/');
        snprintf(sql, sizeof sql, "CREATE DATABASE t%d", n);
        if (!slash || psql(pg_url, sql) != 0) {
            fprintf(stderr, "cannot create database t%d on %s\n", n, pg_url);
            return NULL;
        }
        snprintf(path, sizeof path, "%.*st%d", (int)(slash - pg_url + 1), pg_url, n++);
    } else {
        snprintf(path, sizeof path, "%s/t%d.db", dir, n++);
    }
    db *d = db_open(path, &OPTS, err, sizeof err);
    if (!d) fprintf(stderr, "db_open: %s\n", err);
    return d;
}

static db_product product(const char *sku, long long stock) {
    db_product p = { 0 };
    snprintf(p.sku, sizeof p.sku, "%s", sku);
    snprintf(p.name, sizeof p.name, "%s", sku);
    snprintf(p.strategy, sizeof p.strategy, "lua");
    p.segments = 1;
    p.stock_initial = stock;
    snprintf(p.created_at, sizeof p.created_at, "2026-01-01T00:00:00.000Z");
    return p;
}

static db_order order(const char *id, const char *sku, const char *user, int qty, const char *key,
                      long long gen) {
    db_order o = { 0 };
    snprintf(o.order_id, sizeof o.order_id, "%s", id);
    snprintf(o.sku, sizeof o.sku, "%s", sku);
    snprintf(o.user_id, sizeof o.user_id, "%s", user);
    o.quantity = qty;
    snprintf(o.idem_key, sizeof o.idem_key, "%s", key ? key : "");
    snprintf(o.created_at, sizeof o.created_at, "2026-01-01T00:00:00.000Z");
    o.gen = gen;
    return o;
}

/* Inserts one order in its own transaction. */
static db_status insert1(db *d, const db_order *o, db_take take, long long limit) {
    long long avail;
    CHECK(db_begin(d) == DB_OK);
    db_status st = db_order_insert(d, o, take, limit, 0, &avail);
    CHECK(db_commit(d) == DB_OK);
    return st;
}

static void test_products(void) {
    db *d = fresh();
    db_product p = product("a", 10), got;
    CHECK(db_product_insert(d, &p) == DB_OK);
    CHECK(db_product_insert(d, &p) == DB_EXISTS);
    CHECK(db_product_get(d, "a", &got) == DB_OK);
    CHECK(got.stock_initial == 10 && got.sold == 0 && got.stock_gen == 1 && got.db_available == 10);
    CHECK(db_product_get(d, "b", &got) == DB_NOTFOUND);
    int replayed = -1;
    CHECK(db_product_restock(d, "a", 5, NULL, &got, &replayed) == DB_OK && !replayed);
    CHECK(got.stock_initial == 15 && got.db_available == 15);
    CHECK(db_product_restock(d, "zz", 5, NULL, &got, &replayed) == DB_NOTFOUND);
    CHECK(db_ping(d) == DB_OK);
    CHECK(db_probe(d) == DB_OK);
    db_close(d);
}

/* A restock with a key adds once; the same key for another restock is
 * refused; its state is readable after the fact. */
static void test_restock_keys(void) {
    db *d = fresh();
    db_product p = product("r", 10), got;
    int replayed = -1;
    CHECK(db_product_insert(d, &p) == DB_OK);
    CHECK(db_restock_state(d, "k1") == DB_NOTFOUND);
    CHECK(db_product_restock(d, "r", 5, "k1", &got, &replayed) == DB_OK && !replayed);
    CHECK(got.stock_initial == 15);
    CHECK(db_product_restock(d, "r", 5, "k1", &got, &replayed) == DB_OK && replayed);
    CHECK(got.stock_initial == 15);                 /* nothing added the second time */
    CHECK(db_product_restock(d, "r", 6, "k1", &got, &replayed) == DB_DUPKEY && replayed);
    CHECK(db_restock_state(d, "k1") == DB_OK);
    CHECK(db_product_restock(d, "r", 1, "", &got, &replayed) == DB_OK && !replayed);
    CHECK(db_product_restock(d, "r", 1, "", &got, &replayed) == DB_OK && !replayed);
    CHECK(got.stock_initial == 17);                 /* no key: each one adds */
    CHECK(db_product_get(d, "r", &got) == DB_OK && got.db_available == 17);
    db_close(d);
}

static void test_generation_rule(void) {
    db *d = fresh();
    db_product p = product("g", 10), got;
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order o1 = order("01A", "g", "u", 2, NULL, 1);
    CHECK(insert1(d, &o1, DB_TAKE_NONE, 0) == DB_OK);
    /* A rebuild starts generation 2 above whatever Redis had (say 5). */
    CHECK(db_product_new_gen(d, "g", 5, &got, NULL, NULL) == DB_OK);
    CHECK(got.stock_gen == 6 && got.sold == 2 && got.stock_initial == 10);
    /* An order reserved under an old generation can no longer commit. */
    db_order o2 = order("01B", "g", "u", 1, NULL, 1);
    CHECK(insert1(d, &o2, DB_TAKE_NONE, 0) == DB_STALE);
    db_order o3 = order("01C", "g", "u", 1, NULL, 6);
    CHECK(insert1(d, &o3, DB_TAKE_NONE, 0) == DB_OK);
    CHECK(db_product_get(d, "g", &got) == DB_OK && got.sold == 3);
    db_close(d);
}

static void test_tombstones(void) {
    db *d = fresh();
    db_product p = product("t", 10);
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order a = order("01V", "t", "u", 1, NULL, 1), b = order("01W", "t", "u", 1, NULL, 1);
    CHECK(db_order_void(d, "01V", "t", "test") == DB_OK);
    CHECK(db_order_void(d, "01V", "t", "again") == DB_OK);     /* repeatable */
    CHECK(db_order_state(d, "01V") == DB_STALE);
    CHECK(insert1(d, &a, DB_TAKE_NONE, 0) == DB_STALE);          /* voided: never commits */
    CHECK(insert1(d, &b, DB_TAKE_NONE, 0) == DB_OK);
    CHECK(db_order_void(d, "01W", "t", "late") == DB_EXISTS);  /* committed: not voided */
    CHECK(db_order_state(d, "01W") == DB_OK);
    CHECK(db_order_state(d, "01X") == DB_NOTFOUND);
    db_product got;
    CHECK(db_product_get(d, "t", &got) == DB_OK && got.sold == 1);
    db_close(d);
}

/* An order answered 503 while its COMMIT's outcome was unknown is revoked:
 * its row gone with its units and its key, the order voided so it never
 * commits after; repeating a revoke changes nothing. The barrier commits
 * and leaves no row behind. */
static void test_revoke(void) {
    db *d = fresh();
    db_product p = product("r", 10);
    int removed = -1;
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order a = order("01R", "r", "u", 2, "key-r", 1), b = order("01S", "r", "u", 1, NULL, 1);
    CHECK(insert1(d, &a, DB_TAKE_NONE, 0) == DB_OK);
    CHECK(insert1(d, &b, DB_TAKE_NONE, 0) == DB_OK);
    CHECK(db_order_revoke(d, "01R", "r", 0, 0, &removed) == DB_OK && removed == 1);
    CHECK(db_order_state(d, "01R") == DB_STALE);
    db_order got;
    CHECK(db_order_by_key(d, "key-r", &got) == DB_NOTFOUND);
    db_product pr;
    CHECK(db_product_get(d, "r", &pr) == DB_OK && pr.sold == 1);
    CHECK(insert1(d, &a, DB_TAKE_NONE, 0) == DB_STALE);           /* never commits after */
    CHECK(db_order_revoke(d, "01R", "r", 0, 0, &removed) == DB_OK && removed == 0);
    CHECK(db_order_revoke(d, "01T", "r", 0, 0, &removed) == DB_OK && removed == 0);
    CHECK(db_order_state(d, "01T") == DB_STALE);
    CHECK(db_order_state(d, "01S") == DB_OK);
    CHECK(db_barrier(d, 2000) == DB_OK);
    CHECK(db_product_get(d, "r", &pr) == DB_OK && pr.sold == 1);
    db_close(d);
}

/* A barrier canceled mid-transaction (its INSERT waiting on a lock past
 * the deadline) leaves the session in an aborted block; the next barrier
 * must end that block and run, not trip over it (it once hit an
 * assert(!in_tx) and aborted two instances of test_hosts' partition). */
static void test_barrier_after_a_canceled_one(void) {
    db *d = fresh();
    if (!pg_url) {                              /* SQLite: no server, nothing to wait for */
        CHECK(db_barrier(d, 500) == DB_OK && db_barrier(d, 500) == DB_OK);
        db_close(d);
        return;
    }
    PGconn *other = PQconnectdb(path);
    CHECK(PQstatus(other) == CONNECTION_OK);
    PGresult *r = PQexec(other, "BEGIN; LOCK TABLE meta IN ACCESS EXCLUSIVE MODE");
    CHECK(PQresultStatus(r) == PGRES_COMMAND_OK);
    PQclear(r);
    CHECK(db_barrier(d, 300) != DB_OK);         /* waits on the lock, canceled */
    r = PQexec(other, "ROLLBACK");
    PQclear(r);
    PQfinish(other);
    CHECK(db_barrier(d, 2000) == DB_OK);        /* the aborted block ended first */
    CHECK(db_barrier(d, 2000) == DB_OK);
    db_product p = product("b", 3);
    CHECK(db_product_insert(d, &p) == DB_OK);   /* and the session works as before */
    db_close(d);
}

static void test_idempotency_keys(void) {
    db *d = fresh();
    db_product p = product("k", 10);
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order a = order("01K", "k", "u", 1, "key-1", 1), b = order("01L", "k", "u", 1, "key-1", 1);
    db_order c = order("01M", "k", "u", 1, NULL, 1), e = order("01N", "k", "u", 1, NULL, 1);
    CHECK(insert1(d, &a, DB_TAKE_NONE, 0) == DB_OK);
    CHECK(insert1(d, &b, DB_TAKE_NONE, 0) == DB_DUPKEY);
    CHECK(insert1(d, &c, DB_TAKE_NONE, 0) == DB_OK);             /* no key: no clash */
    CHECK(insert1(d, &e, DB_TAKE_NONE, 0) == DB_OK);
    db_order got;
    CHECK(db_order_by_key(d, "key-1", &got) == DB_OK);
    CHECK_STR(got.order_id, "01K");
    CHECK(db_order_get(d, "01L", &got) == DB_NOTFOUND);
    db_product pr;
    CHECK(db_product_get(d, "k", &pr) == DB_OK && pr.sold == 3);
    db_close(d);
}

static void test_conditional_take(void) {
    db *d = fresh();
    db_product p = product("c", 3), got;
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order a = order("01P", "c", "u1", 2, NULL, 0), b = order("01Q", "c", "u2", 2, NULL, 0);
    db_order c = order("01R", "c", "u1", 1, NULL, 0), e = order("01S", "c", "u2", 1, NULL, 0);
    db_order f = order("01T", "c", "u2", 1, NULL, 0);
    /* Every order of the product with its per-user limit of 2. */
    CHECK(insert1(d, &a, DB_TAKE_CONDITIONAL, 2) == DB_OK);
    CHECK(insert1(d, &b, DB_TAKE_CONDITIONAL, 2) == DB_NOSTOCK);
    CHECK(insert1(d, &c, DB_TAKE_CONDITIONAL, 2) == DB_LIMIT);   /* u1 has 2 of 2 */
    CHECK(insert1(d, &e, DB_TAKE_CONDITIONAL, 2) == DB_OK);      /* b's 2 were not counted */
    CHECK(insert1(d, &f, DB_TAKE_CONDITIONAL, 2) == DB_NOSTOCK);
    CHECK(db_product_get(d, "c", &got) == DB_OK);
    CHECK(got.db_available == 0 && got.sold == 3);
    CHECK(db_order_get(d, "01Q", &a) == DB_NOTFOUND);            /* refused: no row */
    db_close(d);
}

/* A walk's callback may use the database, but never walk the statement
 * it is called from: stmt() would reset it and restart the outer walk
 * (audit --repair once looped for ever that way). The assert stops it. */
static db *walked;
static int inner_calls;
static int count_user(const char *user, long long units, void *ud) {
    (void)user;
    (void)units;
    ++*(int *)ud;
    return 0;
}
static int walk_again(const char *user, long long units, void *ud) {
    int n = 0;
    (void)ud;
    (void)units;
    db_order o;
    db_order_get(walked, user, &o);          /* another statement: fine */
    inner_calls++;
    db_user_units(walked, "w", count_user, &n);   /* the same one: refused */
    return 0;
}

static void test_no_nested_walks(void) {
    db *d = fresh();
    db_product p = product("w", 10);
    p.per_user_limit = 5;
    snprintf(p.strategy, sizeof p.strategy, "db");
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order a = order("01W1", "w", "u1", 1, NULL, 0), b = order("01W2", "w", "u2", 1, NULL, 0);
    CHECK(insert1(d, &a, DB_TAKE_CONDITIONAL, 5) == DB_OK);
    CHECK(insert1(d, &b, DB_TAKE_CONDITIONAL, 5) == DB_OK);
    int n = 0;
    CHECK(db_user_units(d, "w", count_user, &n) == DB_OK && n == 2);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(4);   /* the assert's message, expected */
        walked = d;
        db_user_units(d, "w", walk_again, NULL);
        _exit(inner_calls == 1 ? 0 : 3);       /* not reached: the assert fires */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    db_close(d);
}

static char seen[8][32];
static int nseen;
static void collect(const db_order *o, void *ud) {
    (void)ud;
    if (nseen < 8) snprintf(seen[nseen++], 32, "%s", o->order_id);
}

static void test_list_paging(void) {
    db *d = fresh();
    db_product p = product("l", 100);
    CHECK(db_product_insert(d, &p) == DB_OK);
    const char *ids[] = { "01A1", "01A2", "01A3", "01A4", "01A5" };
    for (int i = 0; i < 5; i++) {
        db_order o = order(ids[i], "l", i % 2 ? "odd" : "even", 1, NULL, 1);
        CHECK(insert1(d, &o, DB_TAKE_NONE, 0) == DB_OK);
    }
    int more = 0;
    nseen = 0;
    CHECK(db_order_list(d, "l", NULL, -1, NULL, 2, collect, NULL, &more) == DB_OK);
    CHECK(nseen == 2 && more && !strcmp(seen[1], "01A2"));
    nseen = 0;
    CHECK(db_order_list(d, "l", NULL, -1, "01A4", 2, collect, NULL, &more) == DB_OK);
    CHECK(nseen == 1 && !more && !strcmp(seen[0], "01A5"));
    nseen = 0;
    CHECK(db_order_list(d, NULL, "odd", -1, NULL, 10, collect, NULL, &more) == DB_OK);
    CHECK(nseen == 2 && !strcmp(seen[0], "01A2") && !strcmp(seen[1], "01A4"));
    db_close(d);
}

static void test_schema_version(void) {
    db *d = fresh();
    char err[256];
    db_close(d);
    /* Reopening migrates nothing and works; read-only opens work too. */
    d = db_open(path, &OPTS, err, sizeof err);
    CHECK(d != NULL);
    db_close(d);
    db_options ro = OPTS;
    ro.readonly = 1;
    d = db_open(path, &ro, err, sizeof err);
    CHECK(d != NULL);
    db_close(d);
    if (pg_url) {
        /* A server database starts at this build's version; a newer one is
         * refused, not damaged. */
        CHECK(psql(path, "UPDATE flashsale_schema SET version=99") == 0);
        d = db_open(path, &OPTS, err, sizeof err);
        CHECK(d == NULL && strstr(err, "99"));
        return;
    }
    /* A version 1 file is migrated (through 2 to 10): the buyers' units of the db strategies
     * with a limit are counted from their order rows, no one else's; products gain
     * hold_seconds and held (0), and the holds table appears; then cs_overlap (0), then
     * no waiting room (room_turn_ms 0), then no opening time (room_opens_ms 0). */
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "sqlite3 %s \"DROP TABLE user_units; DROP TABLE restocks; DROP TABLE meta;"
             " DROP TABLE locks; DROP TABLE lock_fences; DROP TABLE holds;"
             " DROP TABLE product_tallies; ALTER TABLE products DROP COLUMN room_opens_ms;"
             " ALTER TABLE products DROP COLUMN room_rate;"
             " ALTER TABLE products DROP COLUMN room_turn_ms; ALTER TABLE products DROP COLUMN cs_overlap;"
             " ALTER TABLE products DROP COLUMN held; ALTER TABLE products DROP COLUMN hold_seconds;"
             " PRAGMA user_version=1;"
             " INSERT INTO products VALUES('d','d','db',1,5,10,3,1,7,3,0,0,'t'),"
             " ('l','l','lua',1,5,10,2,1,10,0,0,0,'t');"
             " INSERT INTO orders VALUES('o1','d','u',1,NULL,'t'),('o2','d','u',2,NULL,'t'),"
             " ('o3','l','u',2,NULL,'t')\"", path);
    CHECK(system(cmd) == 0);
    d = db_open(path, &OPTS, err, sizeof err);
    CHECK(d != NULL);
    db_close(d);
    snprintf(cmd, sizeof cmd, "sqlite3 %s 'PRAGMA user_version; SELECT sku, user_id, units "
             "FROM user_units; SELECT sku, hold_seconds, held, cs_overlap, room_turn_ms,"
             " room_opens_ms FROM products;"
             " SELECT count(*) FROM holds'", path);
    FILE *f = popen(cmd, "r");
    char out[1000] = "";
    size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[got] = '\0';
    CHECK(f && pclose(f) == 0);
    CHECK(strcmp(out, "10\nd|u|3\nd|0|0|0|0|0\nl|0|0|0|0|0\n0\n") == 0);
    /* A file from a newer build is refused, not damaged. */
    snprintf(cmd, sizeof cmd, "sqlite3 %s 'PRAGMA user_version=99'", path);
    CHECK(system(cmd) == 0);
    d = db_open(path, &OPTS, err, sizeof err);
    CHECK(d == NULL && strstr(err, "99"));
}

/* The db-lock table: a unique row per held name, deleted to release, taken
 * over once expired; the token grows at every take, across releases. */
static void test_lock_table(void) {
    db *d = fresh();
    char err[256];
    db *e = db_open(path, &OPTS, err, sizeof err);     /* a second process's view */
    long long f1, f2, f3, left;
    CHECK(db_lock_acquire(d, "fs:{a}:lock:0", "me", 60000, 100, &f1, &left) == DB_OK);
    CHECK(f1 == 1 && left == 60000);
    CHECK(db_lock_acquire(e, "fs:{a}:lock:0", "you", 60000, 100, &f2, &left) == DB_EXISTS);
    CHECK(left > 59000 && left <= 60000);
    /* Another name is another lock. */
    CHECK(db_lock_acquire(e, "fs:{a}:lock:1", "you", 60000, 100, &f2, &left) == DB_OK && f2 == 1);
    CHECK(db_lock_release(e, "fs:{a}:lock:0", "you", 100) == DB_NOTFOUND);   /* not ours */
    CHECK(db_lock_release(d, "fs:{a}:lock:0", "me", 100) == DB_OK);
    CHECK(db_lock_release(d, "fs:{a}:lock:0", "me", 100) == DB_NOTFOUND);
    CHECK(db_lock_acquire(e, "fs:{a}:lock:0", "you", 30, 100, &f2, &left) == DB_OK && f2 == 2);
    /* Its holder "dies": once its row expired, the next take takes it over. */
    usleep(60000);
    CHECK(db_lock_acquire(d, "fs:{a}:lock:0", "me2", 60000, 100, &f3, &left) == DB_OK && f3 == 3);
    CHECK(db_lock_release(e, "fs:{a}:lock:0", "you", 100) == DB_NOTFOUND);
    /* While another connection holds the lock a take needs (SQLite's write
     * lock; on PostgreSQL an uncommitted row of the same name), the take
     * waits at most its busy time and says so. */
    PGconn *raw = NULL;
    if (pg_url) {
        raw = PQconnectdb(path);
        PGresult *r = PQexec(raw, "BEGIN; INSERT INTO locks VALUES('fs:{a}:lock:2','x',1,"
                                  "9000000000000)");
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK);
        PQclear(r);
    } else {
        CHECK(db_begin(e) == DB_OK);
    }
    CHECK(db_lock_acquire(d, "fs:{a}:lock:2", "me", 1000, 20, &f1, &left) == DB_BUSY);
    if (raw) PQfinish(raw);                    /* its transaction rolled back */
    else db_rollback(e);
    CHECK(db_lock_acquire(d, "fs:{a}:lock:2", "me", 1000, 20, &f1, &left) == DB_OK && f1 == 1);
    db_close(e);
    db_close(d);
}

/* ------------------------------------------------------------- the writer */

typedef struct batches {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t jobs, groups;
} batches;

static void on_done(db_job **jobs, size_t n, void *ud) {
    batches *b = ud;
    (void)jobs;
    pthread_mutex_lock(&b->mu);
    b->jobs += n;
    b->groups++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* A committer on a connection of its own to the case's database (path),
 * its groups counted in b. */
static db_writer *open_writer(batches *b, db **wc) {
    char err[256];
    *wc = db_open(path, &OPTS, err, sizeof err);
    CHECK(*wc != NULL);
    db_writer *w = *wc ? db_writer_start(*wc, 512, on_done, b, err, sizeof err) : NULL;
    CHECK(w != NULL);
    return w;
}

/* Waits until b has seen n jobs done. */
static void wait_jobs(batches *b, size_t n) {
    pthread_mutex_lock(&b->mu);
    while (b->jobs < n) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

static void test_writer_groups(void) {
    db *d = fresh();
    db_product p = product("w", 100000);
    CHECK(db_product_insert(d, &p) == DB_OK);
    batches b = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
    db *wc;
    db_writer *w = open_writer(&b, &wc);
    enum { N = 3000 };
    static db_job jobs[N];
    for (int i = 0; i < N; i++) {
        char id[27];
        snprintf(id, sizeof id, "01W%07d", i);
        jobs[i] = (db_job){ .kind = DB_JOB_INSERT, .take = DB_TAKE_NONE };
        jobs[i].order = order(id, "w", "u", 1, NULL, 1);
        db_writer_submit(w, &jobs[i]);
    }
    wait_jobs(&b, N);
    int ok = 0;
    for (int i = 0; i < N; i++) ok += jobs[i].status == DB_OK;
    CHECK(ok == N);
    /* Queued faster than fsync: committed in groups, not one by one. */
    CHECK(b.groups < N / 4);
    db_writer_stats ws;
    db_writer_get_stats(w, &ws);
    CHECK(ws.jobs == N && ws.failures == 0);
    db_writer_stop(w);
    db_close(wc);
    db_product got;
    CHECK(db_product_get(d, "w", &got) == DB_OK && got.sold == N);
    db_close(d);
}

/* A group's orders left out, each told apart: a key another order holds
 * (DB_DUPKEY), a copy of an older generation (DB_STALE, its key its own),
 * beside orders inserted with a key and without one, and another SKU's
 * (the SKUs' locks taken together) -- in one group whose
 * COMMIT goes with its statements, the keys asked only after it. */
static void test_writer_group_left_out(void) {
    db *d = fresh();
    db_product p = product("wk", 100), p2 = product("wk2", 100);
    CHECK(db_product_insert(d, &p) == DB_OK && db_product_insert(d, &p2) == DB_OK);
    db_order first = order("01WK0", "wk", "u", 1, "held-key", 1);
    CHECK(insert1(d, &first, DB_TAKE_NONE, 0) == DB_OK);
    batches b = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
    db *wc;
    db_writer *w = open_writer(&b, &wc);
    static db_job jobs[5];
    db_job *all[5];
    jobs[0].order = order("01WK1", "wk", "u", 1, "held-key", 1);   /* the key is 01WK0's */
    jobs[1].order = order("01WK2", "wk", "u", 1, "own-key", 1);
    jobs[2].order = order("01WK3", "wk", "u", 1, NULL, 1);
    jobs[3].order = order("01WK4", "wk", "u", 1, "stale-key", 7);   /* not the row's generation */
    jobs[4].order = order("01WK5", "wk2", "u", 1, NULL, 1);         /* a second SKU's */
    for (int i = 0; i < 5; i++) {
        jobs[i].kind = DB_JOB_INSERT;
        jobs[i].take = DB_TAKE_NONE;
        all[i] = &jobs[i];
    }
    db_writer_submit_many(w, all, 5);
    wait_jobs(&b, 5);
    CHECK(jobs[0].status == DB_DUPKEY);
    CHECK(jobs[1].status == DB_OK && jobs[2].status == DB_OK);
    CHECK(jobs[3].status == DB_STALE && jobs[4].status == DB_OK);
    db_writer_stop(w);
    db_close(wc);
    db_order got;
    CHECK(db_order_by_key(d, "held-key", &got) == DB_OK);
    CHECK_STR(got.order_id, "01WK0");
    CHECK(db_order_get(d, "01WK1", &got) == DB_NOTFOUND && db_order_get(d, "01WK4", &got) == DB_NOTFOUND);
    db_product pr;
    CHECK(db_product_get(d, "wk", &pr) == DB_OK && pr.sold == 3);
    CHECK(db_product_get(d, "wk2", &pr) == DB_OK && pr.sold == 1);
    db_close(d);
}

/* A paced writer (db_writer_pace): a job after a quiet spell commits at
 * once; the next group waits out the gap after the one before, taking
 * what was submitted meanwhile, one job at a time, into one group. */
static void test_writer_paced(void) {
    db *d = fresh();
    db_product p = product("wp", 100);
    CHECK(db_product_insert(d, &p) == DB_OK);
    batches b = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
    db *wc;
    db_writer *w = open_writer(&b, &wc);
    db_writer_pace(w, 400000);                         /* 400 ms */
    static db_job jobs[6];
    for (int i = 0; i < 6; i++) {
        char id[27];
        snprintf(id, sizeof id, "01P%07d", i);
        jobs[i] = (db_job){ .kind = DB_JOB_INSERT, .take = DB_TAKE_NONE };
        jobs[i].order = order(id, "wp", "u", 1, NULL, 1);
    }
    int64_t t0 = clock_mono_us();
    db_writer_submit(w, &jobs[0]);                     /* quiet before: at once */
    pthread_mutex_lock(&b.mu);
    while (b.jobs < 1) pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
    CHECK(clock_mono_us() - t0 < 300000);
    for (int i = 1; i < 6; i++) {                      /* one by one, 20 ms apart */
        db_writer_submit(w, &jobs[i]);
        usleep(20000);
    }
    pthread_mutex_lock(&b.mu);
    while (b.jobs < 6) pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
    CHECK(b.groups == 2);                              /* the first, then the other five */
    for (int i = 0; i < 6; i++) CHECK(jobs[i].status == DB_OK);
    db_writer_stop(w);
    db_close(wc);
    db_close(d);
}

/* The fold of the tallies (PostgreSQL's groups count in rows of their own,
 * db.h) beside a writer committing groups all the while: every unit is
 * counted once, whichever side of a fold its group commits on. */
typedef struct folder {
    atomic_int stop;
    long long folds, folded;
    db_status failed;
} folder;

static void *fold_loop(void *arg) {
    folder *f = arg;
    char err[256];
    db *d = db_open(path, &OPTS, err, sizeof err);
    if (!d) {
        f->failed = DB_ERROR;
        return NULL;
    }
    while (!atomic_load(&f->stop)) {
        long long n = 0;
        db_status st = db_fold_tallies(d, &n);
        if (st != DB_OK && st != DB_BUSY) {
            fprintf(stderr, "fold: %s\n", db_errstr(d));
            f->failed = st;
            break;
        }
        f->folds++;
        f->folded += n;
        /* A breath between folds, as the maintenance thread's pass has: a
         * fold back to back holds SQLite's write lock nearly all the time,
         * and under ThreadSanitizer the writer's busy handler once missed
         * every opening for its 2 s (10 orders refused BUSY, 33,182 folds). */
        usleep(200);
    }
    db_close(d);
    return NULL;
}

static void test_fold_beside_writer(void) {
    db *d = fresh();
    db_product p = product("f", 100000), got;
    CHECK(db_product_insert(d, &p) == DB_OK);
    batches b = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
    db *wc;
    db_writer *w = open_writer(&b, &wc);
    folder f = { 0 };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, fold_loop, &f) == 0);
    enum { N = 2000, WAVE = 5 };
    static db_job jobs[N];
    for (int i = 0; i < N; i += WAVE) {
        for (int j = i; j < i + WAVE; j++) {
            char id[27];
            snprintf(id, sizeof id, "01F%07d", j);
            jobs[j] = (db_job){ .kind = DB_JOB_INSERT, .take = DB_TAKE_NONE };
            jobs[j].order = order(id, "f", "u", 1 + j % 3, NULL, 1);
            db_writer_submit(w, &jobs[j]);
        }
        pthread_mutex_lock(&b.mu);
        while (b.jobs < (size_t)(i + WAVE)) pthread_cond_wait(&b.cv, &b.mu);
        pthread_mutex_unlock(&b.mu);
    }
    atomic_store(&f.stop, 1);
    pthread_join(th, NULL);
    db_writer_stop(w);
    db_close(wc);
    long long units = 0;
    int ok = 0;
    for (int i = 0; i < N; i++) {
        ok += jobs[i].status == DB_OK;
        units += 1 + i % 3;
    }
    CHECK(ok == N);
    CHECK(f.failed == DB_OK);
    CHECK(f.folds > 0);
    if (pg_url) CHECK(f.folded > 0);   /* SQLite's writer leaves no tallies */
    long long sold = 0, held = 0;
    CHECK(db_order_units(d, "f", &sold, &held) == DB_OK && sold == units);
    CHECK(db_product_get(d, "f", &got) == DB_OK);
    if (got.sold != units) fprintf(stderr, "sold %lld, the orders %lld units (%lld folds)\n",
                                   got.sold, units, f.folds);
    CHECK(got.sold == units && got.held == 0);
    db_close(d);
}

/* A hold per order: decided once, by whichever comes first; its units move
 * from held to sold or out, and a Redis product's are owed once. */
static void test_holds(void) {
    db *d = fresh();
    db_product p = product("h", 10), dbp = product("hd", 10), got;
    snprintf(dbp.strategy, sizeof dbp.strategy, "db");
    dbp.per_user_limit = 5;
    CHECK(db_product_insert(d, &p) == DB_OK && db_product_insert(d, &dbp) == DB_OK);
    const char *ids[] = { "01H0", "01H1", "01H2", "01H3" };
    for (int i = 0; i < 4; i++) {
        db_order o = order(ids[i], "h", "u", 2, NULL, 1);
        o.expires_ms = 1000 + i;                      /* deadlines 1000..1003 */
        o.takes = "0:2";
        CHECK(insert1(d, &o, DB_TAKE_NONE, 0) == DB_OK);
    }
    db_order od = order("01HD", "hd", "u", 3, NULL, 0);
    od.expires_ms = 1000;
    CHECK(insert1(d, &od, DB_TAKE_CONDITIONAL, 5) == DB_OK);
    CHECK(db_product_get(d, "h", &got) == DB_OK && got.held == 8 && got.sold == 0);
    CHECK(db_product_get(d, "hd", &got) == DB_OK && got.held == 3 && got.db_available == 7);
    CHECK(db_order_get(d, "01H0", &od) == DB_OK && od.status == DB_ORDER_RESERVED &&
          od.expires_ms == 1000);

    db_decision dc = { .order_id = "01H0", .to = DB_HOLD_CONFIRM, .now_ms = 999,
                       .payment_ref = "pay" };
    CHECK(db_hold_decide(d, &dc) == DB_OK && dc.changed && dc.return_gen == 0);
    CHECK(dc.order.status == DB_ORDER_CONFIRMED && !strcmp(dc.order.payment_ref, "pay"));
    dc.to = DB_HOLD_CANCEL;                          /* decided: nothing changes */
    CHECK(db_hold_decide(d, &dc) == DB_OK && !dc.changed && dc.order.status == DB_ORDER_CONFIRMED);
    /* Another buyer's cancel does not see the order. */
    db_decision other = { .order_id = "01H1", .to = DB_HOLD_CANCEL, .now_ms = 999,
                          .user_id = "v" };
    CHECK(db_hold_decide(d, &other) == DB_NOTFOUND);
    db_decision cancel = { .order_id = "01H1", .to = DB_HOLD_CANCEL, .now_ms = 999,
                           .user_id = "u" };
    CHECK(db_hold_decide(d, &cancel) == DB_OK && cancel.changed && cancel.return_gen == 1);
    CHECK(cancel.reserve_gen == 1 && !strcmp(cancel.takes, "0:2"));
    /* At the deadline a confirm expires the hold. */
    db_decision late = { .order_id = "01H2", .to = DB_HOLD_CONFIRM, .now_ms = 1002 };
    CHECK(db_hold_decide(d, &late) == DB_OK && late.changed);
    CHECK(late.order.status == DB_ORDER_EXPIRED && late.return_gen == 1);
    CHECK(db_product_get(d, "h", &got) == DB_OK && got.held == 2 && got.sold == 2);

    /* The sweep: what is due by 1003 (01H3, and the db product's hold,
     * whose units come back in the transaction). */
    db_expired ex[8];
    size_t n = 0;
    CHECK(db_begin(d) == DB_OK);
    CHECK(db_hold_expire_due(d, 1003, 8, ex, &n) == DB_OK && n == 2);
    CHECK(db_commit(d) == DB_OK);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(ex[i].order_id, "01H3")) seen |= ex[i].return_gen == 1 ? 1 : 0;
        if (!strcmp(ex[i].order_id, "01HD")) seen |= ex[i].return_gen == 0 ? 2 : 0;
    }
    CHECK(seen == 3);
    db_expired_free(ex, n);
    CHECK(db_begin(d) == DB_OK);
    CHECK(db_hold_expire_due(d, 5000, 8, ex, &n) == DB_OK && n == 0);   /* none left */
    CHECK(db_commit(d) == DB_OK);
    CHECK(db_product_get(d, "h", &got) == DB_OK && got.held == 0 && got.sold == 2);
    CHECK(db_product_get(d, "hd", &got) == DB_OK && got.held == 0 && got.db_available == 10);

    /* Three holds owe units (cancelled, expired by the late confirm, swept);
     * a debt is cleared only for its own generation. */
    long long owed = 0;
    CHECK(db_hold_owed_units(d, "h", &owed) == DB_OK && owed == 6);
    CHECK(db_hold_returned(d, "01H1", 7) == DB_OK);
    CHECK(db_hold_owed_units(d, "h", &owed) == DB_OK && owed == 6);
    CHECK(db_hold_returned(d, "01H1", 1) == DB_OK);
    CHECK(db_hold_owed_units(d, "h", &owed) == DB_OK && owed == 4);
    long long sold = 0, held = 0;
    CHECK(db_order_units(d, "h", &sold, &held) == DB_OK && sold == 2 && held == 0);
    db_close(d);
}

/* A sweep that meets a hold being decided (its row locked by the
 * decision's transaction) waits for it, then leaves it: a hold ends once,
 * whichever comes first. */
typedef struct sweeper {
    size_t n;
    db_status st;
} sweeper;

static void *sweep_once(void *arg) {
    sweeper *w = arg;
    char err[256];
    db *d = db_open(path, &OPTS, err, sizeof err);
    db_expired ex[8];
    w->st = DB_ERROR;
    if (!d) return NULL;
    if ((w->st = db_begin(d)) == DB_OK && (w->st = db_hold_expire_due(d, 5000, 8, ex, &w->n)) == DB_OK)
        w->st = db_commit(d);
    else
        db_rollback(d);
    if (w->st == DB_OK) db_expired_free(ex, w->n);
    db_close(d);
    return NULL;
}

static void test_hold_decided_while_swept(void) {
    db *d = fresh();
    db_product p = product("r", 10), got;
    CHECK(db_product_insert(d, &p) == DB_OK);
    db_order o = order("01R0", "r", "u", 2, NULL, 1);
    o.expires_ms = 1000;
    o.takes = "0:2";
    CHECK(insert1(d, &o, DB_TAKE_NONE, 0) == DB_OK);
    /* Paid just before the deadline; the sweep runs after it, while the
     * payment's transaction is still open. */
    db_decision dc = { .order_id = "01R0", .to = DB_HOLD_CONFIRM, .now_ms = 999 };
    CHECK(db_begin(d) == DB_OK);
    CHECK(db_hold_decide_in(d, &dc) == DB_OK && dc.changed);
    sweeper w = { 0, DB_OK };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, sweep_once, &w) == 0);
    usleep(300 * 1000);                     /* the sweep waits on the row (or the file) */
    CHECK(db_commit(d) == DB_OK);
    pthread_join(th, NULL);
    CHECK(w.st == DB_OK);
    if (w.n != 0) fprintf(stderr, "the sweep expired %zu hold(s) already confirmed\n", w.n);
    CHECK(w.n == 0);
    CHECK(db_order_get(d, "01R0", &o) == DB_OK && o.status == DB_ORDER_CONFIRMED);
    CHECK(db_product_get(d, "r", &got) == DB_OK && got.held == 0 && got.sold == 2);
    long long owed = -1;
    CHECK(db_hold_owed_units(d, "r", &owed) == DB_OK && owed == 0);
    db_close(d);
}

static void cleanup(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
}

/* ------------------------------------------------------- the connection budget */

typedef struct giver {
    db_pool *p;
    db *d;
    int after_ms;
} giver;

static void *give_later(void *arg) {
    giver *g = arg;
    clock_sleep_ms(g->after_ms);
    db_pool_give(g->p, g->d);
    return NULL;
}

/* At most max connections, whoever asks: a take past them waits for a
 * give, or its wait out (DB_BUSY, counted); the LIFO stack hands the last
 * given back first. */
static void test_pool_budget(void) {
    db *first = fresh();
    char err[256];
    CHECK(first != NULL);
    if (!first) return;
    db_close(first);
    db_pool *p = db_pool_new(path, &OPTS, 2, err, sizeof err);
    db *a = NULL, *b = NULL, *c = NULL;
    CHECK(p && db_pool_take(p, 0, &a, err, sizeof err) == DB_OK && a);
    CHECK(db_pool_take(p, 0, &b, err, sizeof err) == DB_OK && b && b != a);
    int64_t t0 = clock_mono_ms();
    CHECK(db_pool_take(p, 80, &c, err, sizeof err) == DB_NOCONN && c == NULL);
    int64_t waited = clock_mono_ms() - t0;
    CHECK(waited >= 70 && waited < 2000);
    CHECK(strstr(err, "all 2 database connections") != NULL);
    CHECK(db_pool_take(p, 0, &c, err, sizeof err) == DB_NOCONN);   /* no wait at all */
    db_pool_stats st;
    db_pool_get_stats(p, &st);
    CHECK(st.max == 2 && st.open == 2 && st.in_use == 2 && st.timeouts == 2 && st.waits == 1);
    CHECK(st.takes == 2 && st.opened == 2 && st.wait_us >= 70000);
    /* A give wakes a waiter, which gets that very connection. */
    giver g = { p, b, 50 };
    pthread_t t;
    pthread_create(&t, NULL, give_later, &g);
    t0 = clock_mono_ms();
    CHECK(db_pool_take(p, 5000, &c, err, sizeof err) == DB_OK && c == b);
    CHECK(clock_mono_ms() - t0 < 4000);
    pthread_join(t, NULL);
    db_pool_give(p, c);
    db_pool_give(p, a);
    CHECK(db_pool_take(p, 0, &c, err, sizeof err) == DB_OK && c == a);   /* last in, first out */
    db_pool_give(p, c);
    db_pool_get_stats(p, &st);
    CHECK(st.open == 2 && st.in_use == 0 && st.waiting == 0 && st.takes == 4);
    db_pool_free(p);
}

/* A connection comes back as new: a transaction its taker left open is
 * rolled back (its write gone), its lock wait is the pool's again. */
static void test_pool_gives_back_clean(void) {
    db *first = fresh();
    char err[256];
    CHECK(first != NULL);
    if (!first) return;
    db_close(first);
    db_pool *p = db_pool_new(path, &OPTS, 1, err, sizeof err);
    db *d = NULL;
    db_product got, pr = product("left-open", 5);
    CHECK(p && db_pool_take(p, 0, &d, err, sizeof err) == DB_OK);
    CHECK(db_begin(d) == DB_OK && db_product_insert(d, &pr) == DB_OK);
    db_set_lock_wait(d, 1);
    db_pool_give(p, d);
    CHECK(db_pool_take(p, 0, &d, err, sizeof err) == DB_OK);
    CHECK(db_product_get(d, "left-open", &got) == DB_NOTFOUND);
    CHECK(db_begin(d) == DB_OK && db_commit(d) == DB_OK);      /* usable, no transaction */
    db_pool_give(p, d);
    db_pool_free(p);
}

/* A connection that cannot be opened gives its slot back: the budget is
 * not spent by failures, which say whether they may pass (a server that
 * refuses the connect) or stay (no such database, no such file). Idle
 * connections past their time are closed. */
static void test_pool_failures_and_idle(void) {
    char err[256], bad[600];
    db *d = NULL;
    if (pg_url) snprintf(bad, sizeof bad, "%s_no_such_database", pg_url);
    else snprintf(bad, sizeof bad, "%s/no/such/dir/x.db", dir);
    db_pool *p = db_pool_new(bad, &OPTS, 1, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    for (int i = 0; i < 3; i++) CHECK(db_pool_take(p, 0, &d, err, sizeof err) == DB_ERROR && !d);
    db_pool_stats st;
    db_pool_get_stats(p, &st);
    CHECK(st.open == 0 && st.in_use == 0 && st.failures == 3 && st.takes == 0);
    db_pool_free(p);
    if (pg_url) {      /* a server that refuses the connect may come: it may pass */
        p = db_pool_new("postgresql://postgres@127.0.0.1:1/x", &OPTS, 1, err, sizeof err);
        CHECK(p && db_pool_take(p, 0, &d, err, sizeof err) == DB_DOWN && !d);
        db_pool_free(p);
    }

    db *first = fresh();
    CHECK(first != NULL);
    if (!first) return;
    db_close(first);
    p = db_pool_new(path, &OPTS, 3, err, sizeof err);
    db *a = NULL, *b = NULL;
    CHECK(db_pool_take(p, 0, &a, err, sizeof err) == DB_OK);
    CHECK(db_pool_take(p, 0, &b, err, sizeof err) == DB_OK);
    db_pool_give(p, a);
    db_pool_give(p, b);
    db_pool_trim(p);                                    /* not idle long yet */
    db_pool_get_stats(p, &st);
    CHECK(st.open == 2 && st.closed == 0);
    db_pool_set_idle(p, 20);
    clock_sleep_ms(40);
    db_pool_trim(p);
    db_pool_get_stats(p, &st);
    CHECK(st.open == 0 && st.closed == 2);
    CHECK(db_pool_take(p, 0, &a, err, sizeof err) == DB_OK);   /* opened afresh */
    db_pool_give(p, a);
    db_pool_get_stats(p, &st);
    CHECK(st.open == 1 && st.opened == 3);
    db_pool_free(p);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_products), T(test_restock_keys), T(test_generation_rule), T(test_tombstones), T(test_revoke), T(test_barrier_after_a_canceled_one), T(test_idempotency_keys),
        T(test_conditional_take), T(test_list_paging), T(test_schema_version),
        T(test_lock_table), T(test_writer_groups), T(test_writer_group_left_out), T(test_writer_paced), T(test_fold_beside_writer), T(test_no_nested_walks), T(test_holds),
        T(test_hold_decided_while_swept), T(test_pool_budget), T(test_pool_gives_back_clean),
        T(test_pool_failures_and_idle),
    };
    if (!mkdtemp(dir)) return 2;
    int passed = 0, failed = 0;
    size_t n = sizeof cases / sizeof cases[0];
    t_run(argc > 1 ? argv[1] : NULL, "", cases, n, &passed, &failed);
    if ((pg_url = getenv("FLASHSALE_TEST_PG")) != NULL)
        t_run(argc > 1 ? argv[1] : NULL, "postgresql: ", cases, n, &passed, &failed);
    printf("%d passed, %d failed\n", passed, failed);
    cleanup();
    return failed ? 1 : 0;
}
