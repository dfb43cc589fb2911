/* config.c: flags, their environment twins, and --help, from one table.
 *
 * The lock servers' flags are not written here: one row of the table
 * (T_LOCKS) stands for them, and each lock server with a flag becomes a
 * flag there, from its row in the stock module's table of lock servers
 * (stock_lock_server_about): its name, environment variable, help and
 * longest value, kept in svc_config.lock_urls.
 *
 * Precedence: built-in default < FLASHSALE_* environment < command line, so
 * a deployment sets the environment and a person overrides a flag. */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/version.h"
#include "service/config.h"
#include "stock/stock.h"

typedef enum { T_STR, T_INT, T_UINT, T_LL, T_SYNC, T_FLAG, T_LOCKS } opt_type;

typedef struct opt {
    const char *name;
    const char *env;
    opt_type type;
    size_t off;
    size_t size;          /* T_STR: buffer size */
    long long lo, hi;     /* numeric range */
    const char *def;
    const char *help;
} opt;

#define F(field) offsetof(svc_config, field), sizeof(((svc_config *)0)->field)

static const opt OPTS[] = {
    { "listen", "FLASHSALE_LISTEN", T_STR, F(listen), 0, 0, "127.0.0.1:8080",
      "HTTP listen address, host:port (port 0: any free port)" },
    { "redis", "FLASHSALE_REDIS", T_STR, F(redis_url), 0, 0, "redis://127.0.0.1:6379/0",
      "Redis URL: redis://[:password@]host:port/db, unix:/path/to/socket[?db=N], or "
      "redis-sentinel://[:password@]host:port[,host:port...]/<master>[?db=N] (the primary "
      "found and followed through Sentinel)" },
    { "db", "FLASHSALE_DB", T_STR, F(db_path), 0, 0, "flashsale.db",
      "the orders' database: a SQLite file (created if missing; WAL mode), or "
      "postgresql://user[:pw]@host[:port][,...]/dbname[?params] (libpq's URI)" },
    { "strategy", "FLASHSALE_STRATEGY", T_STR, F(strategy), 0, 0, "lua",
      "default stock strategy of new products (see below)" },
    { "admin-token", "FLASHSALE_ADMIN_TOKEN", T_STR, F(admin_token), 0, 0, "",
      "bearer token for the admin endpoints; empty: they are open (a warning is logged)" },
    { "room-secret", "FLASHSALE_ROOM_SECRET", T_STR, F(room_secret), 0, 0, "",
      "the secret every instance signs and checks waiting-room tickets with (16 to 128 "
      "characters); empty: one made at random and kept in Redis, shared by the instances "
      "on it" },
    { "room-order-wait-ms", "FLASHSALE_ROOM_ORDER_WAIT_MS", T_INT, F(room_order_wait_ms), 0,
      10000, "5000", "how long an order of a product with a waiting room waits in the "
      "instance for its place's turn before it is answered 429 not_your_turn (an order's "
      "?wait_ms=N says otherwise for it; 0: answered at once): a buyer early in the line "
      "sends one request, not one per retry" },
    { "insecure-admin", "FLASHSALE_INSECURE_ADMIN", T_FLAG, F(insecure_admin), 0, 0, "0",
      "start even when the admin endpoints would be open (no --admin-token) on a "
      "non-loopback --listen, which is refused otherwise" },
    { "threads", "FLASHSALE_THREADS", T_INT, F(threads), 0, 256, "0",
      "HTTP event-loop threads (0: one per CPU it may use: its affinity, bounded by a "
      "cgroup CPU quota, v1 or v2, rounded up)" },
    { "key-prefix", "FLASHSALE_KEY_PREFIX", T_STR, F(key_prefix), 0, 0, "fs:",
      "prefix of every Redis key the service uses" },
    /* Here: a flag per lock server that has one (--redlock, --zookeeper,
     * --etcd), from the lock servers' table (lock_flags). */
    { NULL, NULL, T_LOCKS, 0, 0, 0, 0, NULL, NULL },
    { "redis-timeout-ms", "FLASHSALE_REDIS_TIMEOUT_MS", T_INT, F(redis_timeout_ms), 10, 60000,
      "1000", "Redis connect and command timeout" },
    { "db-busy-timeout-ms", "FLASHSALE_DB_BUSY_TIMEOUT_MS", T_INT, F(db_busy_timeout_ms), 1,
      60000, "2000", "how long a write waits for another process's SQLite lock" },
    { "db-commit-timeout-ms", "FLASHSALE_DB_COMMIT_TIMEOUT_MS", T_INT, F(db_commit_timeout_ms),
      100, 600000, "3000",
      "PostgreSQL: how long a COMMIT may wait (for a synchronous standby) before it is "
      "canceled and its orders answered 503 as unconfirmed" },
    { "db-max-connections", "FLASHSALE_DB_MAX_CONNECTIONS", T_INT, F(db_max_connections), 3,
      10000, "8",
      "database connections this instance opens at most, every part of it together: the "
      "committer and the health probe keep one each, the rest (blocking workers, API work, "
      "maintenance, the db-lock table) take one for each piece of work and give it back. "
      "N instances on one PostgreSQL need N x this under its max_connections "
      "(docs/operations.md)" },
    { "db-connection-wait-ms", "FLASHSALE_DB_CONNECTION_WAIT_MS", T_INT,
      F(db_connection_wait_ms), 0, 60000, "1000",
      "how long work waits for one of those connections when all are in use; then an order "
      "is answered 503 overloaded with Retry-After (nothing taken), other requests likewise" },
    { "db-start-wait-ms", "FLASHSALE_DB_START_WAIT_MS", T_INT, F(db_start_wait_ms), 0,
      3600000, "30000",
      "PostgreSQL: at start, how long to keep trying a database that cannot be opened yet "
      "(unreachable, read-only -- a standby mid-failover --, out of connections), each try "
      "logged, before giving up (exit 1). SQLite is opened once" },
    { "commit-gap-us", "FLASHSALE_COMMIT_GAP_US", T_INT, F(commit_gap_us), -1, 100000, "-1",
      "a group commit starts at least this long after the one before it, taking the orders "
      "that queued meanwhile: fewer, larger groups, each fsync's CPU shared by more orders, "
      "for a little latency (an order after a quiet spell commits at once). -1: 1000 inside "
      "a CPU quota (a container's limit), where CPU is what runs out first, else 0 (as "
      "often as the disk allows)" },
    { "synchronous", "FLASHSALE_SYNCHRONOUS", T_SYNC, F(synchronous_full), 0, 0, "FULL",
      "SQLite synchronous mode: FULL (an answered order survives power loss) or NORMAL" },
    { "max-connections", "FLASHSALE_MAX_CONNECTIONS", T_UINT, F(max_connections), 1, 1000000,
      "16384", "open HTTP connections at most; more are refused" },
    { "max-connections-per-client", "FLASHSALE_MAX_CONNECTIONS_PER_CLIENT", T_UINT,
      F(max_per_client), 0, 1000000, "0",
      "open HTTP connections one client address may hold (0: a quarter of --max-connections)" },
    { "connection-memory-kib", "FLASHSALE_CONNECTION_MEMORY_KIB", T_UINT, F(conn_memory_kib), 4,
      1024, "16", "memory each HTTP connection may use for its request head and buffers "
      "(KiB); a request head larger than about this is refused with 431" },
    { "idle-timeout", "FLASHSALE_IDLE_TIMEOUT", T_UINT, F(idle_timeout_s), 0, 86400, "60",
      "seconds before an idle HTTP connection is closed (0: never)" },
    { "request-timeout", "FLASHSALE_REQUEST_TIMEOUT", T_UINT, F(request_timeout_s), 0, 3600,
      "10", "seconds a request may take to arrive (head and body) once it has started; "
      "slower clients are disconnected (0: no limit)" },
    { "max-inflight", "FLASHSALE_MAX_INFLIGHT", T_INT, F(max_inflight), 0, 1000000, "0",
      "orders in the order path at once, of all strategies; past it POST /v1/orders is "
      "answered 503 overloaded with Retry-After, before its body is parsed (0: adaptive, "
      "one limit per strategy following --order-latency-target-ms)" },
    { "order-latency-target-ms", "FLASHSALE_ORDER_LATENCY_TARGET_MS", T_INT,
      F(latency_target_ms), 1, 60000, "100",
      "each strategy's adaptive admission limit keeps the 90th percentile of the time its "
      "admitted orders spend in the order path near this: every 100 ms it is scaled toward "
      "limit x target / p90" },
    { "api-workers", "FLASHSALE_API_WORKERS", T_INT, F(api_workers), 1, 256, "4",
      "threads for API requests that read or write the stores, in each of two pools: one for "
      "work that may wait on Redis (product reads, admin writes), one for work that needs "
      "SQLite only (order lookups), so the HTTP threads never wait on a store and a stalled "
      "Redis never holds up order lookups" },
    { "pending-timeout-ms", "FLASHSALE_PENDING_TIMEOUT_MS", T_LL, F(pending_timeout_ms), 100,
      86400000, "10000", "a reservation not committed after this long is settled by the sweeper" },
    { "returned-keep-ms", "FLASHSALE_RETURNED_KEEP_MS", T_LL, F(returned_keep_ms), 1000,
      30LL * 86400000, "60000",
      "how long Redis keeps the marker that makes an ended hold's return exactly-once, past "
      "its debt being cleared: it must exceed the time from a decision's clock read to its "
      "commit (seconds at most) plus the clock skew between instances" },
    { "soldout-cache-ms", "FLASHSALE_SOLDOUT_CACHE_MS", T_INT, F(soldout_cache_ms), 0, 10000,
      "50", "how long this instance remembers that a product sold out: meanwhile an order "
      "without an Idempotency-Key, of a product without a per-user limit, is answered 409 "
      "sold_out from memory; units that come back end it at once on this instance, within "
      "this long on the others (0: always ask the stock store)" },
    { "product-cache-ms", "FLASHSALE_PRODUCT_CACHE_MS", T_INT, F(product_cache_ms), 0, 10000,
      "50", "how old a GET /v1/products/{sku} answer may be: within this long of a read of "
      "the stores, the same body is answered again from memory on the HTTP thread "
      "(0: every read asks the stores)" },
    { "idempotency-ttl-ms", "FLASHSALE_IDEMPOTENCY_TTL_MS", T_LL, F(idem_ttl_ms), 1000,
      30LL * 86400000, "86400000", "how long Redis remembers an Idempotency-Key (SQLite: always)" },
    { "shutdown-grace-ms", "FLASHSALE_SHUTDOWN_GRACE_MS", T_INT, F(shutdown_grace_ms), 0,
      600000, "10000", "on SIGTERM, how long requests in flight may take to finish" },
    { "lock-ttl-ms", "FLASHSALE_LOCK_TTL_MS", T_INT, F(lock_ttl_ms), 10, 600000, "2000",
      "lease of the lock strategies' locks (renewed while held by lock, redlock and etcd; "
      "zookeeper: the session timeout asked; etcd: whole seconds, rounded up)" },
    { "lock-wait-ms", "FLASHSALE_LOCK_WAIT_MS", T_INT, F(lock_wait_ms), 0, 60000, "1000",
      "how long an order waits for a lock before 429 lock_timeout" },
    { "lock-workers", "FLASHSALE_LOCK_WORKERS", T_INT, F(lock_workers), 1, 1024, "32",
      "threads that run the strategies that may block (redlock, zookeeper, etcd, db-lock, "
      "local, unsafe-*, db-optimistic's read)" },
    { "fault-injection", "FLASHSALE_FAULT_INJECTION", T_FLAG, F(fault_injection), 0, 0, "0",
      "let products set cs_delay_ms (a pause inside the critical section) and lock_ttl_ms, "
      "to make the unsafe strategies' flaws visible; never in production" },
    { "verbose", "FLASHSALE_VERBOSE", T_FLAG, F(verbose), 0, 0, "0",
      "log debug events too" },
};
#define NOPTS (sizeof OPTS / sizeof OPTS[0])
#define NOPTS_ALL (NOPTS + STOCK_LOCKS_COUNT)

/* The flag of each lock server that has one, in the order of
 * stock_lock_server, written to out; returns how many. */
static size_t lock_flags(opt *out) {
    size_t n = 0;
    for (int s = 0; s < STOCK_LOCKS_COUNT; s++) {
        const stock_lock_server_info *li = stock_lock_server_about((stock_lock_server)s);
        if (!li->flag) continue;
        assert(!strncmp(li->flag, "--", 2) && li->value_max < SVC_LOCK_URLS_MAX);
        out[n++] = (opt){ li->flag + 2, li->env, T_STR,
                          offsetof(svc_config, lock_urls) + (size_t)s * SVC_LOCK_URLS_MAX,
                          (size_t)li->value_max + 1, 0, 0,
                          "", li->help };
    }
    return n;
}

/* Every flag, OPTS with its T_LOCKS row made into the lock servers' flags,
 * written to out (NOPTS_ALL of room); returns how many. */
static size_t opts_all(opt *out) {
    size_t n = 0;
    for (size_t i = 0; i < NOPTS; i++) {
        if (OPTS[i].type == T_LOCKS) n += lock_flags(out + n);
        else out[n++] = OPTS[i];
    }
    assert(n <= NOPTS_ALL);
    return n;
}

static void usage(FILE *f, const char *prog, const opt *opts, size_t nopts) {
    fprintf(f,
            "Usage: %s [OPTION]...\n"
            "The flashsale order service: takes orders over HTTP, deducts stock in Redis (or\n"
            "SQLite) without overselling, and commits every accepted order to SQLite.\n\n"
            "Options (each also read from the environment variable shown):\n",
            prog);
    for (size_t i = 0; i < nopts; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s", opts[i].name, opts[i].type == T_FLAG ? "" : "=V");
        fprintf(f, "  %-24s %s\n  %-24s [%s, default %s]\n", left, opts[i].help, "",
                opts[i].env, opts[i].def[0] ? opts[i].def : "none");
    }
    fprintf(f, "  %-24s show this help\n  %-24s print the version and exit\n\nStock strategies (per product, \"strategy\" in POST /v1/products):\n",
            "--help", "--version");
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        const stock_strategy_info *si = stock_strategy_about((stock_strategy)s);
        fprintf(f, "  %-26s %s%s\n", si->name, si->unsafe ? "UNSAFE, oversells: " : "", si->about);
    }
    fprintf(f, "\nSignals: SIGTERM or SIGINT stop accepting, finish the requests in flight,\n"
               "commit, and exit 0.\n\n"
               "Audit: %s audit [--repair] --redis URL --db PATH|URL [--key-prefix P]\n"
               "  compares Redis and the database for every SKU and prints each discrepancy\n"
               "  (orphan pending reservations, stock that disagrees with stock_initial - sold);\n"
               "  --repair settles orphans and rebuilds disagreeing Redis copies from the\n"
               "  database, saying what it did. Exit 0 when consistent, 1 when not, 2 on errors.\n"
               "\n"
               "Migrate: %s migrate --from PATH --to postgresql://... [--redis URL] [--no-audit]\n"
               "  copies a sale's books (products, orders, holds, voided orders, keys, the\n"
               "  buyers' units, restocks, db-lock fences) from one database into an empty one,\n"
               "  in one transaction of the target (run it again after a failure), then audits\n"
               "  the target against Redis (--redis, --key-prefix as the service's). Stop the\n"
               "  service first. Exit 0 when copied and consistent, 1 when the audit is not,\n"
               "  2 on errors (a target that is not empty among them).\n", prog, prog);
}

static int set(svc_config *c, const opt *o, const char *v, const char *from) {
    assert(o->type != T_LOCKS);             /* made into flags by opts_all */
    char *p = (char *)c + o->off, *end;
    long long n;
    switch (o->type) {
    case T_STR:
        if (strlen(v) >= o->size) {
            fprintf(stderr, "flashsale: %s: value too long\n", from);
            return -1;
        }
        strcpy(p, v);
        return 0;
    case T_SYNC:
        if (!strcasecmp(v, "FULL")) *(int *)p = 1;
        else if (!strcasecmp(v, "NORMAL")) *(int *)p = 0;
        else {
            fprintf(stderr, "flashsale: %s: want FULL or NORMAL, not '%s'\n", from, v);
            return -1;
        }
        return 0;
    case T_FLAG:
        *(int *)p = !(v[0] == '0' || v[0] == '\0' || !strcasecmp(v, "false"));
        return 0;
    default:
        errno = 0;
        n = strtoll(v, &end, 10);
        if (errno || end == v || *end || n < o->lo || n > o->hi) {
            fprintf(stderr, "flashsale: %s: want an integer in %lld..%lld, not '%s'\n", from,
                    o->lo, o->hi, v);
            return -1;
        }
        if (o->type == T_INT) *(int *)p = (int)n;
        else if (o->type == T_UINT) *(unsigned *)p = (unsigned)n;
        else *(long long *)p = n;
        return 0;
    }
}

/* Says in one line what getopt refused (word: the argument it stopped at)
 * and where the help is: a usage error is not the place for 60 lines of it. */
static void bad_option(const char *word, const opt *opts, size_t nopts) {
    if (optopt >= 1000 && optopt < 1000 + (int)nopts)
        fprintf(stderr, "flashsale: --%s needs a value (see flashsale --help)\n",
                opts[optopt - 1000].name);
    else if (optopt > 0 && optopt < 256)
        fprintf(stderr, "flashsale: unknown option '-%c' (see flashsale --help)\n", optopt);
    else
        fprintf(stderr, "flashsale: unknown or ambiguous option '%s' (see flashsale --help)\n",
                word);
}

int svc_config_load(svc_config *c, int argc, char **argv) {
    opt opts[NOPTS_ALL];
    size_t nopts = opts_all(opts);
    struct option lopts[NOPTS_ALL + 3];
    char from[96];
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < nopts; i++) {
        if (set(c, &opts[i], opts[i].def, opts[i].name)) return -1;
        const char *e = getenv(opts[i].env);
        if (e && set(c, &opts[i], e, opts[i].env)) return -1;
        lopts[i] = (struct option){ opts[i].name,
                                    opts[i].type == T_FLAG ? no_argument : required_argument,
                                    NULL, 1000 + (int)i };
    }
    lopts[nopts] = (struct option){ "help", no_argument, NULL, 'h' };
    lopts[nopts + 1] = (struct option){ "version", no_argument, NULL, 'V' };
    lopts[nopts + 2] = (struct option){ 0, 0, 0, 0 };
    optind = 1;
    opterr = 0;                  /* one line of our own, not getopt's and the help */
    int ch;
    while ((ch = getopt_long(argc, argv, "hv", lopts, NULL)) != -1) {
        if (ch == 'h') {
            usage(stdout, argv[0], opts, nopts);
            return 1;
        }
        if (ch == 'V') {
            printf("flashsale %s\n", flashsale_version);
            return 1;
        }
        if (ch == 'v') {
            c->verbose = 1;
            continue;
        }
        if (ch < 1000) {
            bad_option(argv[optind - 1], opts, nopts);
            return -1;
        }
        assert(ch - 1000 < (int)nopts);
        const opt *o = &opts[ch - 1000];
        snprintf(from, sizeof from, "--%s", o->name);
        if (set(c, o, o->type == T_FLAG ? "1" : optarg, from)) return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "flashsale: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    if (c->room_secret[0] && strlen(c->room_secret) < 16) {
        fprintf(stderr, "flashsale: --room-secret: 16 characters at least (a shorter secret "
                        "could be guessed, and tickets forged)\n");
        return -1;
    }
    c->request_timeout_ms = c->request_timeout_s * 1000u;
    if (c->max_per_client == 0) c->max_per_client = c->max_connections / 4 ? c->max_connections / 4 : 1;
    /* One loop per CPU it may use: under a container's quota of half a
     * core, one, not one per CPU of the machine. */
    cpus_probe("", &c->cpus);
    if (c->threads == 0) c->threads = c->cpus.usable;
    /* Inside a quota each fsync's CPU is taken from the orders' (measured:
     * docs/performance.md, "Inside a CPU quota"); outside one, pacing only
     * adds latency to a closed loop (-15% at 64 connections). */
    if (c->commit_gap_us < 0)
        c->commit_gap_us = c->cpus.quota > 0 && c->cpus.quota < c->cpus.affinity ? 1000 : 0;
    return 0;
}
