/* flashload_main.c: bin/flashload, the load generator and verifier of
 * flashsale: command line, signals and exit codes.
 *
 *   flashload [run] [options]    load one product, then verify it
 *   flashload compare [options]  every strategy x segments, table and report
 *   flashload inspect [options]  read given SKUs' stores, no load
 *
 * Exit code: 0 PASS (compare: every scene came out as expected), 1 an
 * invariant broken (compare: a scene did not), 2 a setup error (the service
 * cannot be reached, refuses the product, a store cannot be read, ...), 64
 * a usage error (EX_USAGE). */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/version.h"
#include "loadtest/compare/compare.h"
#include "loadtest/run.h"
#include "loadtest/stores/stores.h"
#include "loadtest/verify/inspect.h"

enum { EXIT_PASS = 0, EXIT_BROKEN = 1, EXIT_SETUP = 2, EXIT_USAGE = 64 };

#define RUN_DURATION_S 10          /* a run without --duration or --requests */
#define CROWD_LIMIT_S 120          /* a crowd without --duration: its longest */
#define DEFAULT_TARGET "http://127.0.0.1:8080"

static atomic_int interrupted;

/* What a usage error points to: the help of the command being parsed. */
static const char *help_hint = "flashload --help";

static void on_signal(int sig) {
    if (atomic_exchange(&interrupted, 1)) {
        signal(sig, SIG_DFL);      /* a second ^C: stop now */
        raise(sig);
    }
}

static void usage_exit_codes(FILE *f) {
    fprintf(f, "\nExit: 0 PASS (compare: every scene ran and came out as expected), 1 an "
               "invariant broken\n(compare: a scene not as expected, or one that could not "
               "run), 2 setup error, 64 usage error.\n");
}

/* The help of `run`, with the defaults the code uses. */
static void usage_run(FILE *f) {
    static fl_run_opts d;          /* large: off the stack */
    fl_run_opts_default(&d);
    fprintf(f,
"usage: flashload [run] [options]    load one product, then verify it\n"
"                                    (flashload compare --help: the strategy matrix)\n"
"\n"
"where and how hard\n"
"  --target URL           a service instance, repeatable (default %s)\n"
"  --connections N        keep-alive connections in total (%d)\n"
"  --threads N            event-loop threads (%d)\n"
"  --duration SECS        stop issuing after SECS (%d unless --requests is given)\n"
"  --requests N           stop issuing after N requests\n"
"  --rate R               open loop: R requests/s in total; latency counts from each\n"
"                         request's scheduled time (no coordinated omission)\n"
"  --timeout SECS         an answer later than this is a transport error (%g)\n"
"  --goodput-ms MS        a 201 within MS counts as goodput (%g); 503 overloaded\n"
"                         answers are counted as shed, not as errors\n"
"  --late-ms MS           answers later than MS are counted as late (%g)\n"
"the buyers\n"
"  --users N              buyers u0 .. u<N-1> (%u)\n"
"  --zipf S               choose buyers by zipf with exponent S (default: uniform)\n"
"  --quantity Q | A-B     units per order, fixed or uniform in A..B (%d)\n"
"  --idempotency          send an Idempotency-Key with every order\n"
"  --retry SHARE          share 0..1 of orders that replay an earlier key (with its body)\n"
"  --pay SHARE            holds: share 0..1 of the reserved orders their buyers pay for\n"
"                         (a confirm with the admin token), after thinking a while\n"
"                         (uniform within %.0f%% of the hold)\n"
"  --cancel SHARE         holds: share 0..1 they cancel, likewise; the rest abandon\n"
"                         theirs (it expires). Every answer is recorded and checked\n"
"a crowd: buyers as people, instead of connections that order again and again\n"
"  --crowd N              N buyers, u0 first, each trying until it has a unit or is told\n"
"                         sold out; the run ends when every buyer has its answer (or\n"
"                         after --duration, %d s by default). The first arrives once\n"
"                         the service has answered on every connection (GET /healthz)\n"
"  --ramp SECS            the buyers arrive evenly over SECS (0: all at once)\n"
"  --crowd-hold N         N connections more, kept for the requests that wait in the\n"
"                         service (long polls, orders held for their turn), as people\n"
"                         each have their own (0: half of --connections are kept so)\n"
"  --impatient SHARE      share 0..1 of them who retry at once (bots); the rest wait as\n"
"                         told (Retry-After, a ticket's retry_after_ms)\n"
"  --waiting-room         the product has a waiting room: each buyer orders without a\n"
"                         ticket (which takes its place; in its turn the order is taken\n"
"                         at once, else the answer is its ticket to order with in turn)\n"
"  --room-tickets         ...each buyer takes a ticket first (POST .../tickets), then orders\n"
"  --room-turn SECS       ...a ticket's turn (30)\n"
"  --room-rate N          ...admitting N orders/s (0: the service's measure)\n"
"  --room-opens-in SECS   ...opening SECS after it is created: the buyers who come\n"
"                         before wait in its pre-queue, drawn at the opening\n"
"the product (created unless --no-create)\n"
"  --sku SKU              its SKU (default: a fresh fl-<time>-<n>)\n"
"  --no-create            use the existing SKU given by --sku\n"
"  --stock N              units on sale (%lld)\n"
"  --strategy NAME        one of the service's strategies (GET /v1/strategies;\n"
"                         default: the service's --strategy)\n"
"  --segments N           stock segments (%d)\n"
"  --per-user-limit N     units one user may buy (0: none)\n"
"  --hold-seconds N       orders are holds of N s, paid, cancelled or expired (0: none)\n"
"  --cs-delay-ms N        injected pause in the critical section  } the service needs\n"
"  --lock-ttl-ms N        lease of the lock strategies            } --fault-injection\n"
"  --cs-overlap N         the critical section waits (--cs-delay-ms at most) until N  }\n"
"                         holders are inside it with the same read                  }\n"
"  --admin-token T        bearer token for the admin API (or FLASHSALE_ADMIN_TOKEN)\n"
"verification (on by default)\n"
"  --redis URL            also read Redis directly: stock keys, empty-segment bitmap,\n"
"                         pending records (format: docs/storage.md); redis://...,\n"
"                         redis-sentinel://host:port[,...]/<master>, or\n"
"                         redis-cluster://[[user]:pw@]host[:port][,host[:port]...]\n"
"  --key-prefix P         the service's --key-prefix (%s)\n"
"  --db PATH|URL          also read the orders' database directly (read-only): a SQLite\n"
"                         file, or postgresql://... (libpq's URI)\n"
"  --no-verify            skip it\n"
"  --settle-ms N          after the load, wait up to N ms for a quiet state (%d;\n"
"                         with holds, up to the hold more for every hold to end)\n"
"output\n"
"  --progress | --quiet   a progress line each second (default: if stderr is a terminal)\n"
"  --json FILE            also write the results as JSON\n"
"  --get PATH             GET PATH instead of ordering: a ceiling test, no verification\n"
"\n"
"flashload inspect --help: read given SKUs' stores without a load\n",
            DEFAULT_TARGET, d.load.connections, d.load.threads, RUN_DURATION_S,
            d.load.timeout_us / 1e6, d.load.goodput_us / 1e3, d.load.late_us / 1e3, d.load.users, d.load.qty_min, FL_THINK_SHARE * 100,
            CROWD_LIMIT_S,
            d.product.stock,
            d.product.segments, d.vantage.key_prefix, d.settle_ms);
    usage_exit_codes(f);
}

/* The help of `compare`, with the defaults the code uses. */
static void usage_compare(FILE *f) {
    static fl_compare_opts d;
    char segs[64] = "";
    fl_compare_opts_default(&d);
    for (int i = 0; i < d.nsegments; i++)
        snprintf(segs + strlen(segs), sizeof segs - strlen(segs), "%s%d", i ? "," : "",
                 d.segments[i]);
    fprintf(f,
"usage: flashload compare [options]  every strategy x segments: table, report.json/.html\n"
"\n"
"Without --target it starts its own redis-server, the lock servers (three\n"
"redis-servers for Redlock, a ZooKeeper, an etcd) and flashsale, in a temp dir\n"
"under $TMPDIR (default /tmp), and stops them.\n"
"Scenes run in six groups: ordinary contention (the safe strategies), forced\n"
"interleavings (each unsafe strategy under the one that breaks it, the safe ones\n"
"under the same: a holder waits inside its critical section until a second holder\n"
"is inside with the same read, or a bound; the service counts the meetings),\n"
"Redis failures (a failover to a stale replica, a Redlock server's clock jumping,\n"
"a Redlock server losing its last AOF second, a Redlock member failing over; on\n"
"servers and sentinels of their own), holds (lua, lock, db sell holds that\n"
"buyers pay for, cancel or abandon; sold out, then the returned units resold),\n"
"fairness (each lock's buyers arriving in a known order on two instances:\n"
"who is served in turn; docs/fairness.md), and a crowd past capacity (30,000\n"
"buyers in a second, a fifth bots, 3,000 lua units) with the waiting room off\n"
"and on: who got the units (docs/waiting-room.md); then the \"choosing a lock\"\n"
"table, one row per lock, measured in the same run.\n"
"A seventh group, between hosts, is opt-in (it needs root): each scene on a\n"
"deployment of its own, a network namespace per host (Redis primary and replica,\n"
"3 sentinels, two PostgreSQL nodes run by Patroni with etcd, HAProxy, 3 instances,\n"
"the load), the fault\n"
"cut between them: a Redis split brain under unsafe-trust-redis, then lua; a\n"
"PostgreSQL leader run by Patroni (etcd its store) killed and an asynchronous\n"
"replica promoted (unsafe), then with synchronous_mode; the leader cut from etcd\n"
"and its standby; a planned switchover, one instance through HAProxy (about 4\n"
"minutes; tools/hosts_scene.py runs each scene).\n"
"  --groups LIST          the groups to run, of contention,forced,redis-failures,\n"
"                         holds,fairness,crowd,between-hosts (default: all but\n"
"                         between-hosts);\n"
"                         without contention, no lock table\n"
"  --between-hosts        add the between-hosts group\n"
"  --hosts-script PATH    its scene runner (default: tools/hosts_scene.py of the tree\n"
"                         the service was built in)\n"
"  --between-scenes LIST  only these of its scenes: split-brain, async-standby,\n"
"                         sync-standby, leader-cut, switchover (default: all)\n"
"  --strategies A,B,..    (default: every strategy the service lists)\n"
"  --segments LIST        segment counts for the strategies that allow them (%s)\n"
"  --no-two-instances     leave out the two-instance scenes (local and lua under\n"
"                         contention; the fairness scenes but local's)\n"
"  --no-probes            leave out the lock table's fault probes (kill -9, lock\n"
"                         server restarted, lock server restarted empty)\n"
"  --no-redis-failures    leave out the Redis failures group (about 25 s; the clock\n"
"                         scene moves a redis-server's clock with bin/libclockjump.so,\n"
"                         our LD_PRELOAD shim, built next to flashload)\n"
"  --no-holds             leave out the holds group (holds of %d s, %g s a scene)\n"
"  --no-crowd             leave out the crowd group (two scenes of about 2 s)\n"
"  --crowd-buyers N       the crowd's buyers (30000; its units a tenth of them)\n"
"  --quick                shorter scenes for development: --duration 1\n"
"                         --pause-duration 2 --stock 5000, holds of 1 s for 3 s\n"
"  --no-lock-servers      start no lock server: their scenes are skipped\n"
"  --etcd-bin PATH        the etcd program (default: etcd from PATH)\n"
"  --java PATH            the java that runs ZooKeeper (default: java from PATH)\n"
"  --duration SECS        per scene (%g)\n"
"  --pause-duration SECS  per forced scene (%g)\n"
"  --connections N        keep-alive connections per scene (%d)\n"
"  --threads N            event-loop threads (%d)\n"
"  --users N              buyers (%u)\n"
"  --quantity Q | A-B     units per order (%d)\n"
"  --stock N              stock of the contention scenes (%lld; forced: %lld, or 1 for\n"
"                         the last unit)\n"
"  --out DIR              where report.json and report.html go (%s)\n"
"  --flashsale PATH       the service binary (default: next to flashload)\n"
"  --progress | --quiet   a progress line each second during each scene (default: quiet)\n"
"  --db postgresql://...  the orders of the services it starts on this PostgreSQL\n"
"                         database (default: a SQLite file in its temp dir); the\n"
"                         strategies that need row locks (db-for-update) then run too\n"
"running services instead (they need --fault-injection)\n"
"  --target URL           a service instance, repeatable\n"
"  --redis URL --db PATH  its Redis and database (a SQLite file or postgresql://...),\n"
"                         read directly by the verifier\n"
"  --admin-token T        bearer token for the admin API (or FLASHSALE_ADMIN_TOKEN)\n"
"  --key-prefix P         the service's --key-prefix (%s)\n",
            segs, d.hold_seconds, d.holds_duration_s, d.duration_s, d.pause_duration_s,
            d.connections, d.threads, d.users,
            d.qty_min, d.stock, d.pause_stock, d.out_dir, d.key_prefix);
    usage_exit_codes(f);
}

/* The help of `inspect`. */
static void usage_inspect(FILE *f) {
    fprintf(f,
"usage: flashload inspect --sku SKU [--sku SKU...] [--redis URL] [--db PATH] [options]\n"
"\n"
"Reads each SKU's stores as the verifier of a run does (docs/storage.md), without\n"
"a load and without the service: which Redis server answered and the Redis\n"
"Cluster redirections followed (MOVED, ASK, TRYAGAIN/CLUSTERDOWN), the stock copy\n"
"(valid only for the run_id of the server that answered), pending records,\n"
"returned holds, and SQLite's books; then the invariants broken. It reads once,\n"
"without waiting for pending reservations to settle: point it at quiet stores.\n"
"\n"
"  --sku SKU              a SKU to read, repeatable (up to %d; again: the same SKU again)\n"
"  --redis URL            redis://..., redis-sentinel://host:port[,...]/<master>, or\n"
"                         redis-cluster://[[user]:pw@]host[:port][,host[:port]...]\n"
"  --key-prefix P         the service's --key-prefix (fs:)\n"
"  --db PATH|URL          the orders' database (a SQLite file or postgresql://...), read-only\n"
"  --segments N           stock segments (default: SQLite's, or 1 without --db); on a\n"
"                         cluster a lua or unsafe-trust-redis product of more than one\n"
"                         is spread, a lane per segment under {<sku>:<i>} (without --db:\n"
"                         when {<sku>}:gen is absent and {<sku>:0}:gen exists)\n"
"\n"
"Exit: 0 nothing broken, 1 an invariant broken, 2 a store could not be read,\n"
"64 usage error.\n", FL_INSPECT_MAX_SKUS);
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One line naming what is wrong and where help is; -1. */
static int bad(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "flashload: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see %s)\n", help_hint);
    return -1;
}

/* The value of option argv[*i], advancing *i; NULL (reported) if missing. */
static const char *val(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        bad("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int num(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    if (!s) return -1;
    double v = strtod(s, &end);
    if (end == s || *end || v < lo || v > hi)
        return bad("%s: '%s' is not a number in %g..%g", opt, s, lo, hi);
    *out = v;
    return 0;
}

static int inum(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    if (!s) return -1;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return bad("%s: '%s' is not a whole number in %lld..%lld", opt, s, lo, hi);
    *out = v;
    return 0;
}

static int copy(const char *opt, const char *s, char *dst, size_t len) {
    if (!s) return -1;
    if (strlen(s) >= len) return bad("%s: value too long", opt);
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

static int quantity(const char *s, int *lo, int *hi) {
    if (!s) return -1;
    int a, b;
    char extra;
    if (sscanf(s, "%d-%d%c", &a, &b, &extra) == 2) {
        *lo = a;
        *hi = b;
    } else if (sscanf(s, "%d%c", &a, &extra) == 1) {
        *lo = *hi = a;
    } else {
        return bad("--quantity: '%s' is neither N nor A-B", s);
    }
    if (*lo < 1 || *hi < *lo || *hi > 1000) return bad("--quantity must be within 1..1000");
    return 0;
}

/* A --redis URL, refused here when flashload's reader could not use it:
 * a mistake then stops the command instead of leaving Redis unchecked. */
static int redis_url(const char *opt, const char *s, char *dst, size_t len) {
    fl_err e;
    if (copy(opt, s, dst, len)) return -1;
    fl_redis *r = fl_redis_open(s, "fs:", 1000, &e);
    if (!r) return bad("%s: %s", opt, e.msg);
    fl_redis_close(r);
    return 0;
}

static int add_target(fl_target *t, int *n, const char *url) {
    fl_err e;
    if (!url) return -1;
    if (*n == FL_MAX_TARGETS) return bad("at most %d targets", FL_MAX_TARGETS);
    if (fl_target_parse(url, &t[*n], &e)) return bad("%s", e.msg);
    (*n)++;
    return 0;
}

/* Options shared by run and compare. Returns 1 if argv[*i] was one, 0 if
 * not, -1 on a bad value. */
static int common_opt(int argc, char **argv, int *i, fl_load_opts *lo, fl_vantage *v,
                      int *progress) {
    const char *a = argv[*i];
    long long n;
    if (!strcmp(a, "--connections")) {
        if (inum(a, val(argc, argv, i), 1, 100000, &n)) return -1;
        lo->connections = (int)n;
    } else if (!strcmp(a, "--threads")) {
        if (inum(a, val(argc, argv, i), 1, 64, &n)) return -1;
        lo->threads = (int)n;
    } else if (!strcmp(a, "--users")) {
        if (inum(a, val(argc, argv, i), 1, 1000000000, &n)) return -1;
        lo->users = (uint32_t)n;
    } else if (!strcmp(a, "--quantity")) {
        if (quantity(val(argc, argv, i), &lo->qty_min, &lo->qty_max)) return -1;
    } else if (!strcmp(a, "--zipf")) {
        if (num(a, val(argc, argv, i), 0.01, 10, &lo->zipf_s)) return -1;
    } else if (!strcmp(a, "--target")) {
        if (add_target(lo->targets, &lo->ntargets, val(argc, argv, i))) return -1;
    } else if (!strcmp(a, "--redis")) {
        if (redis_url(a, val(argc, argv, i), v->redis_url, sizeof v->redis_url)) return -1;
    } else if (!strcmp(a, "--db")) {
        if (copy(a, val(argc, argv, i), v->db_path, sizeof v->db_path)) return -1;
    } else if (!strcmp(a, "--key-prefix")) {
        if (copy(a, val(argc, argv, i), v->key_prefix, sizeof v->key_prefix)) return -1;
    } else if (!strcmp(a, "--admin-token")) {
        if (copy(a, val(argc, argv, i), v->token, sizeof v->token)) return -1;
    } else if (!strcmp(a, "--progress")) {
        *progress = 1;
    } else if (!strcmp(a, "--quiet")) {
        *progress = 0;
    } else {
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------- run */

static int parse_run(int argc, char **argv, int first, fl_run_opts *o, const char **json) {
    fl_load_opts *lo = &o->load;
    double d;
    long long n;
    int progress = isatty(2), have_duration = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        int c = common_opt(argc, argv, &i, lo, &o->vantage, &progress);
        if (c < 0) return -1;
        if (c) continue;
        if (!strcmp(a, "--duration")) {
            if (num(a, val(argc, argv, &i), 0.001, 86400, &d)) return -1;
            lo->duration_us = (int64_t)(d * 1e6);
            have_duration = 1;
        } else if (!strcmp(a, "--requests")) {
            if (inum(a, val(argc, argv, &i), 1, (long long)1e12, &n)) return -1;
            lo->requests = (uint64_t)n;
        } else if (!strcmp(a, "--rate")) {
            if (num(a, val(argc, argv, &i), 0.1, 1e7, &lo->rate)) return -1;
        } else if (!strcmp(a, "--timeout")) {
            if (num(a, val(argc, argv, &i), 0.001, 3600, &d)) return -1;
            lo->timeout_us = (int64_t)(d * 1e6);
        } else if (!strcmp(a, "--goodput-ms")) {
            if (num(a, val(argc, argv, &i), 0.001, 3600000, &d)) return -1;
            lo->goodput_us = (int64_t)(d * 1e3);
        } else if (!strcmp(a, "--late-ms")) {
            if (num(a, val(argc, argv, &i), 0.001, 3600000, &d)) return -1;
            lo->late_us = (int64_t)(d * 1e3);
        } else if (!strcmp(a, "--idempotency")) {
            lo->idem = 1;
        } else if (!strcmp(a, "--retry")) {
            if (num(a, val(argc, argv, &i), 0, 1, &lo->retry)) return -1;
            lo->idem = 1;
        } else if (!strcmp(a, "--pay")) {
            if (num(a, val(argc, argv, &i), 0, 1, &lo->pay)) return -1;
        } else if (!strcmp(a, "--cancel")) {
            if (num(a, val(argc, argv, &i), 0, 1, &lo->cancel)) return -1;
        } else if (!strcmp(a, "--hold-seconds")) {
            if (inum(a, val(argc, argv, &i), 0, 86400, &n)) return -1;
            o->product.hold_seconds = (int)n;
        } else if (!strcmp(a, "--crowd")) {
            if (inum(a, val(argc, argv, &i), 1, 10000000, &n)) return -1;
            lo->crowd.buyers = (uint32_t)n;
        } else if (!strcmp(a, "--ramp")) {
            if (num(a, val(argc, argv, &i), 0, 3600, &d)) return -1;
            lo->crowd.ramp_us = (int64_t)(d * 1e6);
        } else if (!strcmp(a, "--crowd-hold")) {
            if (inum(a, val(argc, argv, &i), 0, 1000000, &n)) return -1;
            lo->crowd.hold = (int)n;
        } else if (!strcmp(a, "--impatient")) {
            if (num(a, val(argc, argv, &i), 0, 1, &lo->crowd.impatient)) return -1;
        } else if (!strcmp(a, "--waiting-room") || !strcmp(a, "--room-tickets")) {
            int tickets = !strcmp(a, "--room-tickets");   /* the other wins over --waiting-room */
            if (tickets || !lo->crowd.room) lo->crowd.room = tickets ? FL_CROWD_TICKETS : 1;
            if (!o->product.room_turn_s) o->product.room_turn_s = 30;
        } else if (!strcmp(a, "--room-rate")) {
            if (inum(a, val(argc, argv, &i), 0, 10000000, &o->product.room_rate)) return -1;
        } else if (!strcmp(a, "--room-opens-in")) {
            if (num(a, val(argc, argv, &i), 0, 86400, &d)) return -1;
            o->product.room_opens_in_ms = (long long)(d * 1000);
            if (!o->product.room_turn_s) o->product.room_turn_s = 30;
        } else if (!strcmp(a, "--room-turn")) {
            if (inum(a, val(argc, argv, &i), 1, 3600, &n)) return -1;
            o->product.room_turn_s = (int)n;
        } else if (!strcmp(a, "--sku")) {
            if (copy(a, val(argc, argv, &i), o->product.sku, sizeof o->product.sku)) return -1;
        } else if (!strcmp(a, "--no-create")) {
            o->create = 0;
        } else if (!strcmp(a, "--stock")) {
            if (inum(a, val(argc, argv, &i), 0, 1000000000, &o->product.stock)) return -1;
        } else if (!strcmp(a, "--strategy")) {
            if (copy(a, val(argc, argv, &i), o->product.strategy, sizeof o->product.strategy))
                return -1;
        } else if (!strcmp(a, "--segments")) {
            if (inum(a, val(argc, argv, &i), 1, 1024, &n)) return -1;
            o->product.segments = (int)n;
        } else if (!strcmp(a, "--per-user-limit")) {
            if (inum(a, val(argc, argv, &i), 0, 1000000000, &o->product.per_user_limit)) return -1;
        } else if (!strcmp(a, "--cs-delay-ms")) {
            if (inum(a, val(argc, argv, &i), 0, 60000, &n)) return -1;
            o->product.cs_delay_ms = (int)n;
        } else if (!strcmp(a, "--cs-overlap")) {
            if (inum(a, val(argc, argv, &i), 0, 64, &n)) return -1;
            o->product.cs_overlap = (int)n;
        } else if (!strcmp(a, "--lock-ttl-ms")) {
            if (inum(a, val(argc, argv, &i), 0, 600000, &n)) return -1;
            o->product.lock_ttl_ms = (int)n;
        } else if (!strcmp(a, "--no-verify")) {
            o->verify = 0;
        } else if (!strcmp(a, "--settle-ms")) {
            if (inum(a, val(argc, argv, &i), 0, 600000, &n)) return -1;
            o->settle_ms = (int)n;
        } else if (!strcmp(a, "--json")) {
            if (!(*json = val(argc, argv, &i))) return -1;
        } else if (!strcmp(a, "--get")) {
            if (!(lo->get_path = val(argc, argv, &i))) return -1;
            if (lo->get_path[0] != '/') return bad("--get: the path must start with /");
        } else {
            return bad("unknown option %s", a);
        }
    }
    if (!lo->ntargets && add_target(lo->targets, &lo->ntargets, DEFAULT_TARGET)) return -1;
    if (!have_duration && !lo->requests && !lo->crowd.buyers)
        lo->duration_us = RUN_DURATION_S * 1000000LL;
    if (!o->create && !o->product.sku[0] && !lo->get_path) return bad("--no-create needs --sku");
    if (lo->pay + lo->cancel > 1) return bad("--pay and --cancel add up to more than 1");
    if ((lo->pay > 0 || lo->cancel > 0) && o->create && !o->product.hold_seconds)
        return bad("--pay and --cancel need --hold-seconds (or --no-create with a product "
                   "that has holds)");
    if (lo->get_path) o->verify = 0;
    if (lo->crowd.room && !lo->crowd.buyers)
        return bad("--waiting-room and --room-tickets are for a crowd (--crowd N)");
    if (lo->crowd.buyers && !have_duration) lo->duration_us = CROWD_LIMIT_S * 1000000LL;
    if (lo->crowd.buyers && (lo->rate > 0 || lo->idem || o->product.hold_seconds))
        return bad("--crowd is a load of its own: not with --rate, --idempotency, --retry or "
                   "--hold-seconds");
    o->vantage.api = lo->targets[0];
    o->progress = progress;
    return 0;
}

static int run_main(int argc, char **argv, int first) {
    static fl_run_opts o;          /* large: off the stack */
    static fl_run_result r;
    const char *json = NULL;
    fl_err e = { "" };
    fl_run_opts_default(&o);
    const char *tok = getenv("FLASHSALE_ADMIN_TOKEN");
    if (tok) snprintf(o.vantage.token, sizeof o.vantage.token, "%s", tok);
    if (parse_run(argc, argv, first, &o, &json)) return EXIT_USAGE;
    o.interrupted = &interrupted;
    if (fl_run(&o, &r, &e)) {
        fprintf(stderr, "flashload: %s\n", e.msg);
        fl_run_result_free(&r);
        return EXIT_SETUP;
    }
    fl_run_print(&o, &r, stdout);
    if (json && fl_run_write_json(&o, &r, json, &e)) fprintf(stderr, "flashload: %s\n", e.msg);
    int rc = r.verified && !r.verdict.pass ? EXIT_BROKEN : EXIT_PASS;
    fl_run_result_free(&r);
    return rc;
}

/* ------------------------------------------------------------------ compare */

static int list(const char *opt, const char *s, char *items, size_t item_len, int max, int *n) {
    if (!s) return -1;
    *n = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= item_len) return bad("%s: bad list '%s'", opt, s);
        if (*n == max) return bad("%s: at most %d items", opt, max);
        memcpy(items + (size_t)*n * item_len, s, len);
        items[(size_t)*n * item_len + len] = '\0';
        (*n)++;
        s += len + (s[len] == ',');
    }
    return 0;
}

static int parse_compare(int argc, char **argv, int first, fl_compare_opts *o) {
    fl_load_opts lo;
    fl_vantage v;
    fl_load_opts_default(&lo);
    memset(&v, 0, sizeof v);
    lo.connections = o->connections;
    lo.threads = o->threads;
    lo.users = o->users;
    lo.qty_min = o->qty_min;
    lo.qty_max = o->qty_max;
    snprintf(v.key_prefix, sizeof v.key_prefix, "%s", o->key_prefix);
    int progress = 0;
    long long n;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        int c = common_opt(argc, argv, &i, &lo, &v, &progress);
        if (c < 0) return -1;
        if (c) continue;
        if (!strcmp(a, "--strategies")) {
            /* Checked against the service's list once it is up. */
            if (list(a, val(argc, argv, &i), o->strategies[0], sizeof o->strategies[0], 16,
                     &o->nstrategies))
                return -1;
        } else if (!strcmp(a, "--segments")) {
            char items[8][8];
            if (list(a, val(argc, argv, &i), items[0], sizeof items[0], 8, &o->nsegments))
                return -1;
            for (int k = 0; k < o->nsegments; k++) {
                if (inum(a, items[k], 1, 1024, &n)) return -1;
                o->segments[k] = (int)n;
            }
        } else if (!strcmp(a, "--groups")) {
            char items[7][24];
            int ng;
            if (list(a, val(argc, argv, &i), items[0], sizeof items[0], 7, &ng)) return -1;
            o->contention = o->forced = o->redis_failures = o->holds = o->fairness =
                o->crowd = o->between_hosts = 0;
            for (int k = 0; k < ng; k++) {
                int *flag = !strcmp(items[k], "contention")      ? &o->contention
                            : !strcmp(items[k], "forced")        ? &o->forced
                            : !strcmp(items[k], "redis-failures") ? &o->redis_failures
                            : !strcmp(items[k], "holds")         ? &o->holds
                            : !strcmp(items[k], "fairness")      ? &o->fairness
                            : !strcmp(items[k], "crowd")         ? &o->crowd
                            : !strcmp(items[k], "between-hosts") ? &o->between_hosts
                                                                 : NULL;
                if (!flag)
                    return bad("--groups: '%s' is none of contention, forced, redis-failures, "
                               "holds, fairness, crowd, between-hosts", items[k]);
                *flag = 1;
            }
        } else if (!strcmp(a, "--between-hosts")) {
            o->between_hosts = 1;
        } else if (!strcmp(a, "--between-scenes")) {
            char items[FL_HOSTS_COUNT][24];
            int ng;
            if (list(a, val(argc, argv, &i), items[0], sizeof items[0], FL_HOSTS_COUNT - 1, &ng))
                return -1;
            o->between_only = 0;
            for (int k = 0; k < ng; k++) {
                int b = FL_HOSTS_SPLIT;
                while (b < FL_HOSTS_COUNT && strcmp(items[k], fl_between_name((fl_between)b))) b++;
                if (b == FL_HOSTS_COUNT)
                    return bad("--between-scenes: '%s' is none of split-brain, async-standby, "
                               "sync-standby, leader-cut, switchover", items[k]);
                o->between_only |= 1u << b;
            }
        } else if (!strcmp(a, "--hosts-script")) {
            if (copy(a, val(argc, argv, &i), o->hosts_script, sizeof o->hosts_script)) return -1;
        } else if (!strcmp(a, "--no-two-instances")) {
            o->two_instances = 0;
        } else if (!strcmp(a, "--no-probes")) {
            o->probes = 0;
        } else if (!strcmp(a, "--no-redis-failures")) {
            o->redis_failures = 0;
        } else if (!strcmp(a, "--no-holds")) {
            o->holds = 0;
        } else if (!strcmp(a, "--no-crowd")) {
            o->crowd = 0;
        } else if (!strcmp(a, "--crowd-buyers")) {
            if (inum(a, val(argc, argv, &i), 100, 10000000, &n)) return -1;
            o->crowd_buyers = (int)n;
        } else if (!strcmp(a, "--no-lock-servers")) {
            o->lock_servers = 0;
        } else if (!strcmp(a, "--quick")) {
            o->duration_s = 1;
            o->pause_duration_s = 2;
            o->stock = 5000;
            o->hold_seconds = 1;       /* a hold, then RESALE_MARGIN_MS (holds.c) of load */
            o->holds_duration_s = 3;
        } else if (!strcmp(a, "--etcd-bin")) {
            if (copy(a, val(argc, argv, &i), o->etcd_bin, sizeof o->etcd_bin)) return -1;
        } else if (!strcmp(a, "--java")) {
            if (copy(a, val(argc, argv, &i), o->java_bin, sizeof o->java_bin)) return -1;
        } else if (!strcmp(a, "--duration")) {
            if (num(a, val(argc, argv, &i), 0.1, 3600, &o->duration_s)) return -1;
        } else if (!strcmp(a, "--pause-duration")) {
            if (num(a, val(argc, argv, &i), 0.1, 3600, &o->pause_duration_s)) return -1;
        } else if (!strcmp(a, "--stock")) {
            if (inum(a, val(argc, argv, &i), 1, 1000000000, &o->stock)) return -1;
        } else if (!strcmp(a, "--out")) {
            if (copy(a, val(argc, argv, &i), o->out_dir, sizeof o->out_dir)) return -1;
        } else if (!strcmp(a, "--flashsale")) {
            if (copy(a, val(argc, argv, &i), o->service_bin, sizeof o->service_bin)) return -1;
        } else {
            return bad("unknown option %s", a);
        }
    }
    o->connections = lo.connections;
    o->threads = lo.threads;
    o->users = lo.users;
    o->qty_min = lo.qty_min;
    o->qty_max = lo.qty_max;
    memcpy(o->targets, lo.targets, sizeof o->targets);
    o->ntargets = lo.ntargets;
    memcpy(o->token, v.token, sizeof o->token);
    memcpy(o->redis_url, v.redis_url, sizeof o->redis_url);
    memcpy(o->db_path, v.db_path, sizeof o->db_path);
    memcpy(o->key_prefix, v.key_prefix, sizeof o->key_prefix);
    o->progress = progress;
    return 0;
}

/* bin/flashsale next to this program. */
static void default_service_bin(char *out, size_t len) {
    char self[380];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(out, len, "flashsale");
        return;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(out, len, "%.370s/flashsale", self);
}

static int compare_main(int argc, char **argv, int first) {
    static fl_compare_opts o;
    fl_err e = { "" };
    fl_compare_opts_default(&o);
    const char *tok = getenv("FLASHSALE_ADMIN_TOKEN");
    if (tok) snprintf(o.token, sizeof o.token, "%s", tok);
    if (parse_compare(argc, argv, first, &o)) return EXIT_USAGE;
    if (!o.service_bin[0]) default_service_bin(o.service_bin, sizeof o.service_bin);
    o.interrupted = &interrupted;
    int rc = fl_compare(&o, &e);
    if (rc < 0) {
        fprintf(stderr, "flashload compare: %s\n", e.msg);
        return EXIT_SETUP;
    }
    return rc ? EXIT_BROKEN : EXIT_PASS;
}

/* ------------------------------------------------------------------ inspect */

static int parse_inspect(int argc, char **argv, int first, fl_inspect_opts *o) {
    long long n;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--sku")) {
            if (o->nskus == FL_INSPECT_MAX_SKUS) return bad("at most %d SKUs", FL_INSPECT_MAX_SKUS);
            if (copy(a, val(argc, argv, &i), o->skus[o->nskus], sizeof o->skus[0])) return -1;
            o->nskus++;
        } else if (!strcmp(a, "--redis")) {
            if (redis_url(a, val(argc, argv, &i), o->redis_url, sizeof o->redis_url)) return -1;
        } else if (!strcmp(a, "--db")) {
            if (copy(a, val(argc, argv, &i), o->db_path, sizeof o->db_path)) return -1;
        } else if (!strcmp(a, "--key-prefix")) {
            if (copy(a, val(argc, argv, &i), o->key_prefix, sizeof o->key_prefix)) return -1;
        } else if (!strcmp(a, "--segments")) {
            if (inum(a, val(argc, argv, &i), 1, 1024, &n)) return -1;
            o->segments = (int)n;
        } else {
            return bad("unknown option %s", a);
        }
    }
    if (!o->nskus) return bad("inspect needs --sku");
    if (!o->redis_url[0] && !o->db_path[0]) return bad("inspect needs --redis or --db");
    return 0;
}

static int inspect_main(int argc, char **argv, int first) {
    static fl_inspect_opts o;
    fl_err e = { "" };
    if (parse_inspect(argc, argv, first, &o)) return EXIT_USAGE;
    int rc = fl_inspect(&o, stdout, &e);
    if (rc < 0) {
        fprintf(stderr, "flashload inspect: %s\n", e.msg);
        return EXIT_SETUP;
    }
    return rc ? EXIT_BROKEN : EXIT_PASS;
}

/* Whether argv[first..) asks for help. */
static int wants_help(int argc, char **argv, int first) {
    for (int i = first; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

int main(int argc, char **argv) {
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("flashload %s\n", flashsale_version);
        return EXIT_PASS;
    }
    if (argc > 1 && !strcmp(argv[1], "compare")) {
        help_hint = "flashload compare --help";
        if (wants_help(argc, argv, 2)) {
            usage_compare(stdout);
            return EXIT_PASS;
        }
        return compare_main(argc, argv, 2);
    }
    if (argc > 1 && !strcmp(argv[1], "inspect")) {
        help_hint = "flashload inspect --help";
        if (wants_help(argc, argv, 2)) {
            usage_inspect(stdout);
            return EXIT_PASS;
        }
        return inspect_main(argc, argv, 2);
    }
    int first = argc > 1 && !strcmp(argv[1], "run") ? 2 : 1;
    if (first == 2) help_hint = "flashload run --help";
    if (wants_help(argc, argv, first)) {
        usage_run(stdout);
        return EXIT_PASS;
    }
    if (first == 1 && argc > 1 && argv[1][0] != '-') {
        bad("unknown command '%s'", argv[first]);
        return EXIT_USAGE;
    }
    return run_main(argc, argv, first);
}
