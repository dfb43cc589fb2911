/* flashlock_main.c: bin/flashlock, flock(1) across machines: runs a command
 * while holding a lock module lock, renews the lease while it runs, and
 * stops it if the lock is lost. See usage() for the whole contract.
 *
 * Signals: every signal flashlock acts on is blocked in all threads and
 * taken with sigwait by the main thread, so the library's threads never see
 * them and nothing runs in a signal handler. The lock is taken on a helper
 * thread, so ^C still works while waiting. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/version.h"
#include "lock/lock.h"

#define EXIT_USAGE 64       /* EX_USAGE: bad option, bad lock name, no COMMAND */
#define EXIT_REDIS 69       /* EX_UNAVAILABLE: Redis unreachable, no quorum */
#define EXIT_LOST 70        /* the lock was lost while COMMAND ran */
#define EXIT_BUSY 75        /* EX_TEMPFAIL: not acquired (-n, -w); -E changes it */

static void usage(FILE *f) {
    fputs(
"Usage: flashlock [OPTION]... NAME [--] COMMAND [ARG]...\n"
"  or:  flashlock [OPTION]... NAME -c COMMAND-STRING\n"
"\n"
"Like flock(1), across machines: takes the Redis lock NAME, runs COMMAND while\n"
"holding it, renews the lease while COMMAND runs, releases the lock when COMMAND\n"
"exits, and exits with COMMAND's status. By default it waits for the lock as\n"
"long as it takes.\n"
"\n"
"Options (flock's where flock has them):\n"
"  -w, --wait, --timeout SECONDS\n"
"                        give up if the lock is not had within SECONDS\n"
"                        (fractions allowed, e.g. 0.25; 0 is --nonblock).\n"
"  -n, --nb, --nonblock  give up at once if the lock is held.\n"
"  -E, --conflict-exit-code N\n"
"                        exit status when -n or -w gives up (0..255, default 75).\n"
"  -c, --command STRING  run STRING with /bin/sh -c instead of COMMAND [ARG]...\n"
"  -x, -e, --exclusive   accepted for flock compatibility (every lock is exclusive).\n"
"      --fair            wait in line: the lock goes to its waiters in the order they\n"
"                        came, a newcomer never takes it while others wait, and a\n"
"                        waiter silent for 1 s (killed, stopped, cut off) loses its\n"
"                        place. Every client of NAME must use it (a client without\n"
"                        it takes a free lock at once). Not with Redlock.\n"
"      --verbose         say how long getting the lock took and what woke the wait.\n"
"  -r, --redis URL       Redis server: redis://[:password@]host:port/db or\n"
"                        unix:/path (default $FLASHLOCK_REDIS, else\n"
"                        redis://127.0.0.1:6379/0). Give it 3 or 5 times for\n"
"                        Redlock over independent servers: the lock is held\n"
"                        when a majority took it in time.\n"
"  -t, --ttl MS          lease in milliseconds (default 10000); renewed every MS/3\n"
"                        while COMMAND runs, so it bounds how long a crashed\n"
"                        flashlock keeps others out, not how long COMMAND may run.\n"
"      --redis-timeout-ms MS\n"
"                        connect/command timeout of each Redis call (default: a\n"
"                        third of the ttl, at most 1000).\n"
"      --kill-after MS   after the lock is lost, SIGKILL COMMAND if it has not\n"
"                        exited MS ms after SIGTERM (default 5000).\n"
"  -V, --version         print the version and exit.\n"
"  -h, --help            this text.\n"
"\n"
"COMMAND gets the lock's fencing token in FLASHLOCK_FENCE (strictly increasing\n"
"per NAME: pass it to whatever you write, so it can refuse a stale holder), the\n"
"incarnation of the server's data it came from in FLASHLOCK_INCARNATION (16 hex\n"
"digits, new when the server lost its data and its tokens started over) and\n"
"the name in FLASHLOCK_NAME. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to\n"
"flashlock are passed on to COMMAND. If flashlock itself dies, COMMAND gets\n"
"SIGTERM (the lease would lapse without renewal). If the lock is lost while\n"
"COMMAND runs (renewal finds it gone or taken, or the lease runs out by the\n"
"local monotonic clock because Redis did not confirm a renewal in time),\n"
"COMMAND gets SIGTERM and flashlock exits 70 with a message.\n"
"\n"
"The lock is a plain Redis string taken with SET NX PX, so it also excludes\n"
"other clients (redis-py's Lock, node-redlock, redsync, ...) that take the same\n"
"key. A waiter is woken by a flashlock release at once; behind a client that\n"
"publishes nothing, at once too if the server has keyspace notifications on\n"
"(CONFIG SET notify-keyspace-events Kgx), else within a backoff of at most\n"
"200 ms. flashlock never changes the server's configuration.\n"
"\n"
"Exit status:\n"
"  COMMAND's    COMMAND ran: its status, or 128+N if it died of signal N\n"
"  75 (or -E)   the lock was not had: held, with -n, or still held after -w\n"
"  70           the lock was lost while COMMAND ran (COMMAND got SIGTERM)\n"
"  69           Redis could not be reached, or no quorum of Redlock servers\n"
"  64           bad usage: an unknown option, a bad value or lock name, no COMMAND\n"
"  126          COMMAND could not be run\n"
"  127          COMMAND was not found\n"
"  128+N        flashlock was stopped by signal N while waiting for the lock\n", f);
}

typedef struct args {
    const char *urls[LOCK_MAX_SERVERS];
    int nurls;
    long long ttl_ms, wait_ms, timeout_ms, kill_after_ms;
    int conflict_exit, verbose, fair;
    const char *name;
    char **cmd;
    char *sh_cmd[4];              /* -c: /bin/sh -c STRING */
} args;

/* Parses milliseconds, at least lo. */
static int parse_ms(const char *s, long long lo, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo) return -1;
    *out = v;
    return 0;
}

/* Parses flock's SECONDS (fractions allowed) into whole milliseconds,
 * rounded up so that a tiny positive wait still waits. */
static int parse_seconds(const char *s, long long *ms) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9) return -1;
    *ms = (long long)ceil(v * 1000.0);
    return 0;
}

/* Prints one line of complaint and where to read more; returns -1. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    va_list ap;
    fputs("flashlock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry 'flashlock --help' for more.\n", stderr);
    return -1;
}

/* Returns 0, 1 for --help, 2 for --version, or -1 (message printed). */
static int parse_args(int argc, char **argv, args *a) {
    enum { O_REDIS_TIMEOUT = 1000, O_KILL_AFTER, O_VERBOSE, O_FAIR };
    static const struct option opts[] = {
        { "wait", required_argument, 0, 'w' }, { "timeout", required_argument, 0, 'w' },
        { "nonblock", no_argument, 0, 'n' }, { "nb", no_argument, 0, 'n' },
        { "conflict-exit-code", required_argument, 0, 'E' },
        { "command", required_argument, 0, 'c' }, { "exclusive", no_argument, 0, 'x' },
        { "verbose", no_argument, 0, O_VERBOSE }, { "redis", required_argument, 0, 'r' },
        { "fair", no_argument, 0, O_FAIR },
        { "ttl", required_argument, 0, 't' },
        { "redis-timeout-ms", required_argument, 0, O_REDIS_TIMEOUT },
        { "kill-after", required_argument, 0, O_KILL_AFTER },
        { "version", no_argument, 0, 'V' }, { "help", no_argument, 0, 'h' },
        /* flock's, refused by name below */
        { "shared", no_argument, 0, 's' }, { "unlock", no_argument, 0, 'u' },
        { "no-fork", no_argument, 0, 'F' }, { "close", no_argument, 0, 'o' },
        { 0, 0, 0, 0 } };
    const char *command = NULL;
    memset(a, 0, sizeof *a);
    a->ttl_ms = 10000;
    a->wait_ms = -1;
    a->timeout_ms = 0;   /* default: ttl/3, at most 1000 */
    a->kill_after_ms = 5000;
    a->conflict_exit = EXIT_BUSY;
    opterr = 0;          /* our own messages, one line each */
    int ch;
    long long n;
    while ((ch = getopt_long(argc, argv, "+:w:nE:c:xer:t:VhsuFo", opts, NULL)) != -1) {
        switch (ch) {
        case 'w':
            if (parse_seconds(optarg, &a->wait_ms))
                return usage_error("--wait: want seconds (e.g. 5 or 0.25), not '%s'", optarg);
            break;
        case 'n': a->wait_ms = 0; break;
        case 'E':
            if (parse_ms(optarg, 0, &n) || n > 255)
                return usage_error("--conflict-exit-code: want 0..255, not '%s'", optarg);
            a->conflict_exit = (int)n;
            break;
        case 'c': command = optarg; break;
        case 'x': case 'e': break;
        case O_VERBOSE: a->verbose = 1; break;
        case O_FAIR: a->fair = 1; break;
        case 'r':
            if (a->nurls == LOCK_MAX_SERVERS)
                return usage_error("at most %d --redis", LOCK_MAX_SERVERS);
            a->urls[a->nurls++] = optarg;
            break;
        case 't':
            if (parse_ms(optarg, 10, &a->ttl_ms))
                return usage_error("--ttl: want milliseconds >= 10, not '%s'", optarg);
            break;
        case O_REDIS_TIMEOUT:
            if (parse_ms(optarg, 1, &a->timeout_ms) || a->timeout_ms > 3600000)
                return usage_error("--redis-timeout-ms: want 1..3600000, not '%s'", optarg);
            break;
        case O_KILL_AFTER:
            if (parse_ms(optarg, 0, &a->kill_after_ms))
                return usage_error("--kill-after: want milliseconds, not '%s'", optarg);
            break;
        case 'V': return 2;
        case 'h': return 1;
        case 's': return usage_error("%s: there are no shared locks: each is exclusive", "--shared");
        case 'u': return usage_error("%s: the lock is released when COMMAND exits", "--unlock");
        case 'F': case 'o':
            return usage_error("%s: flashlock stays to renew the lease, so it always forks",
                               ch == 'F' ? "--no-fork" : "--close");
        case ':': return usage_error("%s needs a value", argv[optind - 1]);
        default:
            if (optopt) return usage_error("unknown option '-%c'", optopt);
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) return usage_error("%s", "no lock NAME given");
    a->name = argv[optind++];
    if (optind < argc && (!strcmp(argv[optind], "-c") || !strcmp(argv[optind], "--command"))) {
        if (command || argc - optind != 2)   /* flock's form: NAME -c STRING */
            return usage_error("%s takes exactly one command string", argv[optind]);
        command = argv[optind + 1];
        optind = argc;
    }
    if (optind < argc && !strcmp(argv[optind], "--")) optind++;
    if (command) {
        if (optind < argc)
            return usage_error("-c takes the whole command as one string; unexpected '%s'",
                               argv[optind]);
        a->sh_cmd[0] = "/bin/sh";
        a->sh_cmd[1] = "-c";
        a->sh_cmd[2] = (char *)command;
        a->cmd = a->sh_cmd;
    } else {
        if (optind >= argc) return usage_error("%s", "no COMMAND given (or -c STRING)");
        a->cmd = argv + optind;
    }
    if (a->timeout_ms == 0) {
        a->timeout_ms = a->ttl_ms / 3 < 1000 ? a->ttl_ms / 3 : 1000;
        if (a->timeout_ms < 5) a->timeout_ms = 5;
    }
    if (a->nurls == 0) {
        const char *env = getenv("FLASHLOCK_REDIS");
        a->urls[a->nurls++] = env && *env ? env : "redis://127.0.0.1:6379/0";
    }
    return 0;
}

/* ----------------------------------------------------------------- acquire */

typedef struct acquiring {
    lock_client *c;
    const args *a;
    lock_handle *h;
    lock_status st;
    char err[600];
} acquiring;

static void *acquirer(void *arg) {
    acquiring *q = arg;
    q->st = lock_acquire(q->c, q->a->name, q->a->ttl_ms, q->a->wait_ms, NULL, &q->h, q->err,
                         sizeof q->err);
    kill(getpid(), SIGUSR1);   /* wake the main thread's sigwait */
    return NULL;
}

/* Dies of sig as if flashlock had not blocked it. */
static void die_of(int sig) {
    sigset_t s;
    signal(sig, SIG_DFL);
    sigemptyset(&s);
    sigaddset(&s, sig);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    raise(sig);
    _exit(128 + sig);
}

static int is_forwarded(int sig) {
    return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
}

/* Takes the lock on a helper thread while the main thread answers signals.
 * Returns the status; a terminating signal meanwhile ends flashlock. */
static lock_status acquire(lock_client *c, const args *a, const sigset_t *set, lock_handle **h,
                           char *err, size_t errlen) {
    acquiring q = { c, a, NULL, LOCK_ERROR, "" };
    pthread_t t;
    if (pthread_create(&t, NULL, acquirer, &q)) {
        snprintf(err, errlen, "cannot start a thread");
        return LOCK_ERROR;
    }
    for (;;) {
        int sig = sigwaitinfo(set, NULL);
        if (sig == SIGUSR1) break;
        if (is_forwarded(sig)) {
            fprintf(stderr, "flashlock: %s: interrupted while waiting for the lock\n", a->name);
            die_of(sig);
        }
    }
    pthread_join(t, NULL);
    *h = q.h;
    snprintf(err, errlen, "%s", q.err);
    return q.st;
}

/* ------------------------------------------------------------------ running */

typedef struct running {
    atomic_int child;             /* pid, 0 before the fork */
    atomic_int lost;
    atomic_int lapsed;            /* lost by the clock, before the watchdog knew */
} running;

/* The lock's on_lost callback (watchdog thread): stop COMMAND now, and wake
 * the main thread to report and escalate. */
static void on_lost(lock_handle *h, void *ud) {
    running *r = ud;
    (void)h;
    atomic_store(&r->lost, 1);
    pid_t pid = atomic_load(&r->child);
    if (pid > 0) kill(pid, SIGTERM);
    kill(getpid(), SIGUSR1);
}

/* The child: back to default signals, die with flashlock, exec COMMAND. Only
 * async-signal-safe calls here (the parent has threads). */
static void exec_child(const args *a, pid_t parent) {
    sigset_t none;
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(EXIT_LOST);   /* flashlock died before prctl */
    execvp(a->cmd[0], a->cmd);
    int e = errno;
    const char *msg = strerror(e);
    if (write(2, "flashlock: ", 11) < 0 || write(2, a->cmd[0], strlen(a->cmd[0])) < 0 ||
        write(2, ": ", 2) < 0 || write(2, msg, strlen(msg)) < 0 || write(2, "\n", 1) < 0) {
    }
    _exit(e == ENOENT ? 127 : 126);
}

/* Waits for COMMAND, passing signals on, stopping it when the lock is lost
 * -- reported by the watchdog, or the lease run out by the monotonic clock
 * (a renewal stuck on a silent Redis cannot report in time) -- and
 * escalating to SIGKILL kill_after_ms later. Returns its wait status. */
static int supervise(running *r, const args *a, const sigset_t *set, pid_t pid,
                     const lock_handle *h) {
    int status = 0, killed = 0;
    int64_t lost_at = 0;
    for (;;) {
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        int64_t lease_left = lock_remaining_ms(h);
        if (!atomic_load(&r->lost) && lease_left <= 0) {
            atomic_store(&r->lapsed, 1);
            atomic_store(&r->lost, 1);
            kill(pid, SIGTERM);
        }
        if (atomic_load(&r->lost) && !lost_at) lost_at = clock_mono_ms();
        int64_t wait_ms = lost_at ? lost_at + a->kill_after_ms - clock_mono_ms() : lease_left;
        if (lost_at && killed) wait_ms = -1;
        if (lost_at && !killed && wait_ms <= 0) {
            kill(pid, SIGKILL);
            killed = 1;
            continue;
        }
        int sig;
        if (wait_ms >= 0) {
            struct timespec ts = { wait_ms / 1000, (wait_ms % 1000) * 1000000 };
            sig = sigtimedwait(set, NULL, &ts);
        } else {
            sig = sigwaitinfo(set, NULL);
        }
        if (is_forwarded(sig)) kill(pid, sig);
    }
}

static int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/* Holds the lock around COMMAND. Returns flashlock's exit status. */
static int run(const args *a, const sigset_t *set, lock_handle *h) {
    running r;
    char fence[24], inc[24], err[600];
    atomic_init(&r.child, 0);
    atomic_init(&r.lost, 0);
    atomic_init(&r.lapsed, 0);
    snprintf(fence, sizeof fence, "%llu", (unsigned long long)lock_fence(h));
    snprintf(inc, sizeof inc, "%016llx", (unsigned long long)lock_incarnation(h));
    /* setenv before fork: the child may only make async-signal-safe calls. */
    setenv("FLASHLOCK_FENCE", fence, 1);
    setenv("FLASHLOCK_INCARNATION", inc, 1);
    setenv("FLASHLOCK_NAME", a->name, 1);
    lock_on_lost(h, on_lost, &r);
    pid_t parent = getpid();
    pid_t pid = atomic_load(&r.lost) ? -1 : fork();
    if (pid == 0) exec_child(a, parent);
    int code;
    if (pid < 0) {
        code = atomic_load(&r.lost) ? EXIT_LOST : 126;
        if (!atomic_load(&r.lost)) fprintf(stderr, "flashlock: fork: %s\n", strerror(errno));
    } else {
        atomic_store(&r.child, pid);
        if (atomic_load(&r.lost)) kill(pid, SIGTERM);   /* lost between fork and store */
        code = exit_code(supervise(&r, a, set, pid, h));
    }
    char why[300];
    if (lock_err(h, why, sizeof why) == LOCK_ERR_NONE || !why[0] || atomic_load(&r.lapsed))
        snprintf(why, sizeof why, "the lease ran out before Redis confirmed a renewal");
    lock_release_result rel = lock_release_ex(h, err, sizeof err);
    if (atomic_load(&r.lost) || rel == LOCK_NOT_OWNER) {
        fprintf(stderr, "flashlock: %s: lost the lock while %s ran (%s)%s\n", a->name, a->cmd[0],
                atomic_load(&r.lost) ? why : err,
                atomic_load(&r.lost) && pid > 0 ? "; it was sent SIGTERM" : "");
        return EXIT_LOST;
    }
    if (rel == LOCK_UNKNOWN)
        fprintf(stderr, "flashlock: %s: release failed, the lock lapses after its ttl: %s\n",
                a->name, err);
    return code;
}

/* --verbose: what flock says ("getting lock took S seconds"), and what
 * woke the wait, so a slow hand-off can be told from a slow holder. */
static void report(lock_client *c, const args *a, lock_status st, const lock_handle *h,
                   int64_t took_us) {
    lock_stats s;
    lock_client_stats(c, &s);
    if (st == LOCK_OK)
        fprintf(stderr, "flashlock: getting lock took %lld.%06lld seconds (fence %llu)\n",
                (long long)(took_us / 1000000), (long long)(took_us % 1000000),
                (unsigned long long)lock_fence(h));
    else
        fprintf(stderr, "flashlock: failed to get lock after %lld.%06lld seconds\n",
                (long long)(took_us / 1000000), (long long)(took_us % 1000000));
    fprintf(stderr, "flashlock: %llu tries; woken %llu times by a release (%llu of them seen "
            "as keyspace events), %llu times by the re-check; keyspace notifications "
            "on %d, off %d of %d servers%s\n",
            (unsigned long long)s.attempts, (unsigned long long)s.wakeups,
            (unsigned long long)s.keyspace_wakeups, (unsigned long long)s.timeouts,
            s.keyspace_on, s.keyspace_off, a->nurls,
            s.requeued ? "; lost its place in line and queued again" : "");
    if (st == LOCK_OK) fprintf(stderr, "flashlock: executing %s\n", a->cmd[a->cmd == a->sh_cmd ? 2 : 0]);
}

int main(int argc, char **argv) {
    args a;
    char err[600];
    int rc = parse_args(argc, argv, &a);
    if (rc == 2) printf("flashlock %s\n", flashsale_version);
    if (rc == 1) usage(stdout);
    if (rc) return rc > 0 ? 0 : EXIT_USAGE;
    sigset_t set;
    sigemptyset(&set);
    int sigs[] = { SIGCHLD, SIGUSR1, SIGINT, SIGTERM, SIGHUP, SIGQUIT };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&set, sigs[i]);
    /* Before any thread exists, so they all inherit the mask. */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    lock_options o = { .urls = a.urls, .nurls = a.nurls, .timeout_ms = (int)a.timeout_ms,
                       .watchdog = 1, .fair = a.fair };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    if (!c) {
        fprintf(stderr, "flashlock: %s\n", err);
        return EXIT_USAGE;
    }
    lock_handle *h = NULL;
    int64_t t0 = clock_mono_us();
    lock_status st = acquire(c, &a, &set, &h, err, sizeof err);
    if (a.verbose) report(c, &a, st, h, clock_mono_us() - t0);
    if (st != LOCK_OK) {
        /* A name the library refuses is the caller's mistake, not Redis's. */
        int bad_name = st == LOCK_ERROR && lock_client_error(c, NULL, 0) == LOCK_ERR_ARG;
        fprintf(stderr, "flashlock: %s\n", err);
        lock_client_free(c);
        return st == LOCK_BUSY ? a.conflict_exit : bad_name ? EXIT_USAGE : EXIT_REDIS;
    }
    rc = run(&a, &set, h);
    lock_client_free(c);
    return rc;
}
