/* writer.c: group commit of orders.
 *
 * An fsync costs ~0.3 ms on the machines we run on, so committing each order
 * on its own caps the service near 3k orders/s. The writer instead takes
 * everything queued since its last commit and commits it in one transaction:
 * under load the groups grow by themselves (more orders arrive while a commit
 * is in flight), and with no load an order is committed alone, at once.
 *
 * Everything here but the queue (w->mu) belongs to the writer thread: the
 * connection, the batch, the group's jobs until the done callback returns
 * them (db_writer_on_thread lets a callee assert it runs there).
 *
 * Lookups (an idempotent replay asking for its original order) go through
 * the same queue and are answered after the group's commit, so a replay
 * that arrives while its original is queued sees the committed row.
 *
 * Holds ride the same groups (holds.h's db_writer_decide, _expire,
 * _returned): a caller queues a job and waits for its group, and the
 * writer runs it with holds.c's functions inside the group's transaction.
 * Both halves are here, so the committer calls down into holds.c and
 * holds.c knows nothing of the committer. */
#include "db/db.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "db/db_int.h"
#include "db/holds.h"

struct db_writer {
    db *conn;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    db_job *head, *tail;        /* FIFO of submitted jobs */
    int stopping;
    size_t max_batch;
    db_job **batch;
    db_batch_done *done;
    void *ud;
    db_commit_observer *observe;   /* set before the first job: read by the writer */
    void *observe_ud;
    int gap_us;                    /* db_writer_pace: likewise */
    atomic_uint_fast64_t groups, jobs, failures;
    atomic_int last_failed;
    /* The writer's own: the last COMMIT went unconfirmed (d->unconfirmed),
     * so the next group is sent only once a barrier is confirmed. */
    int unconfirmed;
};

void db_writer_submit(db_writer *w, db_job *job) { db_writer_submit_many(w, &job, 1); }

/* A decision's caller, waiting for its group. */
struct db_job_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
};

/* Queues job (a holds' kind) and waits until its group is committed or
 * failed: for holds.h's db_writer_* calls below, never on the writer's
 * own thread. Such jobs never reach the done callback. Returns
 * job->status. */
static db_status writer_call(db_writer *w, db_job *job) {
    struct db_job_wait wait = { .done = 0 };
    assert(!db_writer_on_thread(w));
    assert(job->kind == DB_JOB_DECIDE || job->kind == DB_JOB_EXPIRE ||
           job->kind == DB_JOB_RETURNED);
    job->wait = &wait;
    pthread_mutex_init(&wait.mu, NULL);
    pthread_cond_init(&wait.cv, NULL);
    db_writer_submit(w, job);
    pthread_mutex_lock(&wait.mu);
    while (!wait.done) pthread_cond_wait(&wait.cv, &wait.mu);
    pthread_mutex_unlock(&wait.mu);
    pthread_mutex_destroy(&wait.mu);
    pthread_cond_destroy(&wait.cv);
    return job->status;
}

/* ------------------------------------------------------ holds through the committer */

/* What an EXPIRE job asks (db_hold_expire_due's arguments) and gets. */
typedef struct expiry_arg {
    int64_t now_ms;
    int max;
    db_expired *out;
    size_t n;
} expiry_arg;

/* What a RETURNED job clears. */
typedef struct debts_arg {
    const db_debt *v;
    size_t n;
} debts_arg;

/* Runs a holds job (DECIDE, EXPIRE, RETURNED) inside the group's open
 * transaction, with holds.c's functions; its status as the job's. */
static db_status holds_job_in(db *d, db_job *job) {
    if (job->kind == DB_JOB_DECIDE) return db_hold_decide_in(d, job->arg);
    if (job->kind == DB_JOB_EXPIRE) {
        expiry_arg *e = job->arg;
        return db_hold_expire_due(d, e->now_ms, e->max, e->out, &e->n);
    }
    assert(job->kind == DB_JOB_RETURNED);
    debts_arg *a = job->arg;
    for (size_t i = 0; i < a->n; i++) {
        db_status st = db_hold_returned(d, a->v[i].order_id, a->v[i].gen);
        if (st != DB_OK) return st;
    }
    return DB_OK;
}

/* Queues a holds job of kind with arg and waits for its group. */
static db_status call(db_writer *w, db_job_kind kind, void *arg) {
    db_job job;
    memset(&job, 0, sizeof job);
    job.kind = kind;
    job.arg = arg;
    return writer_call(w, &job);
}

db_status db_writer_decide(db_writer *w, db_decision *dc) {
    return call(w, DB_JOB_DECIDE, dc);
}

db_status db_writer_expire(db_writer *w, int64_t now_ms, int max, db_expired *out, size_t *n) {
    expiry_arg e = { now_ms, max, out, 0 };
    db_status st = call(w, DB_JOB_EXPIRE, &e);
    if (st != DB_OK) db_expired_free(out, e.n);   /* rolled back with its group */
    *n = st == DB_OK ? e.n : 0;
    return st;
}

db_status db_writer_returned(db_writer *w, const db_debt *debts, size_t n) {
    debts_arg a = { debts, n };
    return n ? call(w, DB_JOB_RETURNED, &a) : DB_OK;
}

/* ------------------------------------------------------------ the groups */

/* Hands the group's decisions back to their callers (each job lives on its
 * caller's stack: not touched after the signal) and moves the rest to the
 * front of jobs. Returns how many are left for the done callback. */
static size_t release_decisions(db_job **jobs, size_t n) {
    size_t left = 0;
    for (size_t i = 0; i < n; i++) {
        db_job *j = jobs[i];
        if (j->kind == DB_JOB_INSERT || j->kind == DB_JOB_LOOKUP) {
            jobs[left++] = j;
            continue;
        }
        struct db_job_wait *wt = j->wait;
        pthread_mutex_lock(&wt->mu);
        wt->done = 1;
        pthread_cond_signal(&wt->cv);
        pthread_mutex_unlock(&wt->mu);
    }
    return left;
}

void db_writer_submit_many(db_writer *w, db_job **jobs, size_t n) {
    if (n == 0) return;
    for (size_t i = 0; i + 1 < n; i++) jobs[i]->next = jobs[i + 1];
    jobs[n - 1]->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = jobs[0];
    else w->head = jobs[0];
    w->tail = jobs[n - 1];
    pthread_cond_signal(&w->cv);          /* one wake for the batch */
    pthread_mutex_unlock(&w->mu);
}

/* Moves queued jobs into w->batch after its first n, up to max_batch.
 * Returns the batch's size. */
static size_t take_queued(db_writer *w, size_t n) {
    assert(mutex_held(&w->mu));
    while (w->head && n < w->max_batch) {
        w->batch[n++] = w->head;
        w->head = w->head->next;
    }
    if (!w->head) w->tail = NULL;
    return n;
}

/* Takes up to max_batch queued jobs into w->batch; blocks while the queue is
 * empty. Returns 0 when stopping with nothing left. */
static size_t take_batch(db_writer *w) {
    pthread_mutex_lock(&w->mu);
    while (!w->head && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
    size_t n = take_queued(w, 0);
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* Paced (db_writer_pace): the group in w->batch (n jobs) waits until
 * gap_us after the previous group began (last_us), then takes what queued
 * meanwhile, up to max_batch. Returns the group's size. */
static size_t pace(db_writer *w, size_t n, int64_t last_us) {
    int64_t wait = last_us + w->gap_us - clock_mono_us();
    if (wait <= 0 || n >= w->max_batch) return n;
    struct timespec ts = { 0, (long)wait * 1000 };
    assert(wait < 1000000);
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&w->mu);
    n = take_queued(w, n);
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* How long a failed COMMIT's outcome is asked for before an order is left
 * DB_UNKNOWN: a server that went away in the middle of it (a restart, a
 * broken connection) is usually back within this, and then says. */
#define LEARN_WAIT_MS 5000
#define LEARN_RETRY_MS 50
/* After an unconfirmed COMMIT, how long the barrier before each group may
 * take: a standby that answers again answers in a few ms, and while it
 * does not, a group is refused at once instead of waiting the whole
 * commit timeout to be canceled in turn. */
#define PROBE_MS 250

/* Decides one order whose COMMIT's outcome is unknown and whose row was
 * not found: on a server of many connections, a transaction that inserts
 * it may still be running (its COMMIT waiting for a standby on a
 * connection we dropped), its row invisible until it ends. Voiding the
 * order waits for it -- the void takes the SKU's exclusive lock, which
 * every inserting transaction holds shared -- and then either finds the
 * row or makes sure it never comes. A single-writer file has no such
 * transaction: not found there is not committed. DB_STALE (it never
 * commits), DB_OK (it did) or DB_UNKNOWN. */
static db_status decide_absent(db_writer *w, const db_job *j) {
    if (w->conn->drv->one_writer) return DB_STALE;
    db_status v = db_order_void(w->conn, j->order.order_id, j->order.sku,
                                "its group's COMMIT failed");
    return v == DB_OK ? DB_STALE : v == DB_EXISTS ? DB_OK : DB_UNKNOWN;
}

/* A group failed with st. A failed COMMIT (an fsync error, a connection
 * that broke during it) may still have reached the log: ask the database
 * what it holds rather than assume -- giving back the units of an order
 * that did commit would oversell, and a 503 for it would lose a sale.
 * The asking starts with a barrier, so that a row found is also where a
 * COMMIT's durability is (a synchronous standby), not only here. A
 * COMMIT that went unconfirmed (canceled after the commit timeout, or its
 * connection dropped) is not asked about: its orders are DB_UNKNOWN --
 * answered 503, and revoked once the database confirms again
 * (db_order_revoke, asked by the service). While the
 * database cannot say, ask again (the connection reopened), for
 * LEARN_WAIT_MS at most; an order still unknown then is DB_UNKNOWN. */
static void learn_outcomes(db_writer *w, db_job **jobs, size_t n, db_status st, int commit_failed) {
    if (!commit_failed) {
        /* No COMMIT was sent: the transaction is undone, whatever the
         * connection does now. */
        for (size_t i = 0; i < n; i++)
            if (jobs[i]->kind == DB_JOB_INSERT) jobs[i]->status = st;
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (jobs[i]->kind == DB_JOB_INSERT) jobs[i]->status = DB_UNKNOWN;
    if (w->conn->unconfirmed) return;
    int64_t deadline = clock_mono_ms() + LEARN_WAIT_MS;
    unsigned char *known = calloc(n ? n : 1, 1);   /* NULL: one pass */
    for (;;) {
        size_t unknown = 0;
        int confirmed = db_barrier(w->conn, w->conn->commit_timeout_ms) == DB_OK;
        if (!confirmed && w->conn->unconfirmed) {
            w->unconfirmed = 1;               /* the next group probes first */
            break;
        }
        for (size_t i = 0; i < n; i++) {
            db_job *j = jobs[i];
            if (j->kind != DB_JOB_INSERT || (known && known[i])) continue;
            db_status now = confirmed ? db_order_state(w->conn, j->order.order_id) : DB_ERROR;
            if (now == DB_NOTFOUND) now = decide_absent(w, j);
            if (now == DB_OK || now == DB_STALE) {      /* committed; voided */
                j->status = now == DB_OK ? DB_OK : st;
                if (known) known[i] = 1;
            } else {
                j->status = DB_UNKNOWN;
                unknown++;
            }
        }
        if (!unknown || !known || clock_mono_ms() >= deadline) break;
        clock_sleep_ms(LEARN_RETRY_MS);
    }
    free(known);
}

/* Answers the group's lookups (after its commit, so they see its rows) --
 * unless the last COMMIT went unconfirmed: a row read then may be on the
 * primary alone (the canceled COMMIT's, answered 503 and to be revoked),
 * and a replay answered from it would be a 200 that a failover takes
 * back. They fail instead, until a barrier is confirmed. */
static void run_lookups(db_writer *w, db_job **jobs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        db_job *j = jobs[i];
        if (j->kind != DB_JOB_LOOKUP) continue;
        if (w->unconfirmed) {
            j->status = DB_ERROR;
            continue;
        }
        j->status = j->order.idem_key[0] && !j->order.order_id[0]
                        ? db_order_by_key(w->conn, j->order.idem_key, &j->order)
                        : db_order_get(w->conn, j->order.order_id, &j->order);
    }
}

/* After an unconfirmed COMMIT: whether the database confirms a commit
 * again (a barrier within PROBE_MS). If it does not, the group is refused
 * without being sent -- nothing of it reached the database, so each job
 * fails plainly and its units go back -- rather than committed here
 * and left unconfirmed in turn. */
static int confirms_again(db_writer *w, db_job **jobs, size_t n) {
    if (!w->unconfirmed) return 1;
    if (db_barrier(w->conn, PROBE_MS) == DB_OK) {
        w->unconfirmed = 0;
        return 1;
    }
    db_error(w->conn, "the database confirms no COMMIT (its synchronous standby out of reach?)");
    for (size_t i = 0; i < n; i++)
        if (jobs[i]->kind != DB_JOB_LOOKUP) jobs[i]->status = DB_ERROR;
    return 0;
}

/* Inserts the group's orders and decides its holds in one transaction. A
 * refusal of one order (stale generation, reused key, no stock) leaves the
 * others alone; an error of the database fails them all and rolls back. */
static void commit_group(db_writer *w, db_job **jobs, size_t n) {
    assert(db_writer_on_thread(w) && n > 0);
    int64_t t0 = w->observe ? clock_mono_us() : 0;
    size_t i, orders = 0;
    for (i = 0; i < n; i++) orders += jobs[i]->kind == DB_JOB_INSERT;
    if (!confirms_again(w, jobs, n)) {
        if (w->observe && orders) w->observe(orders, clock_mono_us() - t0, 0, w->observe_ud);
        atomic_fetch_add(&w->failures, 1);
        run_lookups(w, jobs, n);
        atomic_store(&w->last_failed, 1);
        goto done;
    }
    db_status st = db_begin(w->conn);
    /* A server's driver takes the orders reserved in Redis, and the db
     * strategies' takes, in a few exchanges (a round trip per order would
     * cap a group), with the COMMIT when that is all the group holds; the
     * rest go one by one. */
    int many = st == DB_OK && w->conn->drv->insert_group != NULL, commit_failed = 0, committed = 0;
    if (many) {
        int all = 1;
        for (i = 0; i < n && all; i++)
            all = db_group_insert(jobs[i]) || jobs[i]->kind == DB_JOB_LOOKUP;
        st = w->conn->drv->insert_group(w->conn, jobs, n, all, &commit_failed);
        committed = all && st == DB_OK;
    }
    for (i = 0; st == DB_OK && !committed && i < n; i++) {
        db_job *j = jobs[i];
        if (many && db_group_insert(j)) {
            if (j->status == DB_ERROR || j->status == DB_BUSY) st = j->status;
            continue;
        }
        if (j->kind == DB_JOB_DECIDE || j->kind == DB_JOB_EXPIRE || j->kind == DB_JOB_RETURNED)
            j->status = holds_job_in(w->conn, j);
        else if (j->kind == DB_JOB_INSERT)
            j->status = db_order_insert(w->conn, &j->order, j->take, j->per_user_limit,
                                        j->expect_version, &j->available);
        else continue;
        if (j->status == DB_ERROR || j->status == DB_BUSY) st = j->status;
    }
    if (st == DB_OK && !committed && (st = db_commit(w->conn)) != DB_OK) commit_failed = 1;
    if (st != DB_OK) db_rollback(w->conn);
    for (i = 0; st != DB_OK && i < n; i++)     /* a holds job's outcome, if the group failed */
        if (jobs[i]->kind != DB_JOB_INSERT && jobs[i]->kind != DB_JOB_LOOKUP)
            jobs[i]->status = commit_failed ? DB_UNKNOWN : st;
    if (w->observe && orders) w->observe(orders, clock_mono_us() - t0, st == DB_OK, w->observe_ud);
    if (st != DB_OK) {
        atomic_fetch_add(&w->failures, 1);
        if (commit_failed && w->conn->unconfirmed) w->unconfirmed = 1;
        learn_outcomes(w, jobs, n, st, commit_failed);
    }
    run_lookups(w, jobs, n);
    atomic_store(&w->last_failed, st != DB_OK);
done:
    atomic_fetch_add(&w->groups, 1);
    atomic_fetch_add(&w->jobs, n);
}

void db_writer_observe(db_writer *w, db_commit_observer *fn, void *ud) {
    /* Published to the writer thread by the queue's mutex, which every
     * submission (after this) takes before the writer takes the job. */
    pthread_mutex_lock(&w->mu);
    w->observe = fn;
    w->observe_ud = ud;
    pthread_mutex_unlock(&w->mu);
}

void db_writer_pace(db_writer *w, int gap_us) {
    assert(gap_us >= 0 && gap_us < 1000000);
    pthread_mutex_lock(&w->mu);          /* published as db_writer_observe's */
    w->gap_us = gap_us;
    pthread_mutex_unlock(&w->mu);
}

int db_writer_on_thread(const db_writer *w) { return pthread_equal(pthread_self(), w->thread); }

static void *writer_main(void *arg) {
    db_writer *w = arg;
    pthread_setname_np(pthread_self(), "db-writer");
    size_t n;
    int64_t last_us = 0;
    while ((n = take_batch(w)) > 0) {
        if (w->gap_us > 0) {
            n = pace(w, n, last_us);
            last_us = clock_mono_us();
        }
        commit_group(w, w->batch, n);
        if ((n = release_decisions(w->batch, n)) > 0) w->done(w->batch, n, w->ud);
    }
    return NULL;
}

db_writer *db_writer_start(db *conn, size_t max_batch, db_batch_done *done, void *ud, char *err,
                           size_t errlen) {
    db_writer *w = calloc(1, sizeof *w);
    if (!w) goto oom;
    assert(max_batch > 0);
    w->max_batch = max_batch;
    w->batch = calloc(max_batch, sizeof *w->batch);
    if (!w->batch) goto oom;
    w->done = done;
    w->ud = ud;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    assert(conn != NULL);
    w->conn = conn;
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        snprintf(err, errlen, "cannot start the writer thread");
        goto err;
    }
    return w;
oom:
    snprintf(err, errlen, "out of memory");
err:
    if (w) {
        free(w->batch);
        free(w);
    }
    return NULL;
}

void db_writer_get_stats(db_writer *w, db_writer_stats *out) {
    out->groups = atomic_load(&w->groups);
    out->jobs = atomic_load(&w->jobs);
    out->failures = atomic_load(&w->failures);
    out->last_failed = atomic_load(&w->last_failed);
}

void db_writer_stop(db_writer *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    assert(w->head == NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->batch);
    free(w);
}
