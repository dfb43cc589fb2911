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
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "lock/lock.h"

#define EXIT_USAGE 64       /* EX_USAGE */
#define EXIT_REDIS 69       /* EX_UNAVAILABLE: Redis unreachable, no quorum */
#define EXIT_LOST 70        /* the lock was lost while COMMAND ran */
#define EXIT_BUSY 75        /* EX_TEMPFAIL: not acquired within --wait */

static void usage(FILE *f) {
    fputs(
"usage: flashlock [--redis URL]... [--ttl MS] [--wait MS] NAME -- COMMAND [ARGS...]\n"
"\n"
"Like flock(1), across machines: takes the Redis lock NAME, runs COMMAND while\n"
"holding it, renews the lease while COMMAND runs, releases the lock when COMMAND\n"
"exits, and exits with COMMAND's status (128+N if it died of signal N).\n"
"\n"
"  -r, --redis URL       Redis server: redis://host:port/db or unix:/path\n"
"                        (default $FLASHLOCK_REDIS, else redis://127.0.0.1:6379/0).\n"
"                        Give it 3 or 5 times for Redlock over independent servers:\n"
"                        the lock is held when a majority took it in time.\n"
"  -t, --ttl MS          lease in ms (default 10000); renewed every MS/3 while\n"
"                        COMMAND runs, so it bounds how long a crashed flashlock\n"
"                        keeps others out, not how long COMMAND may run.\n"
"  -w, --wait MS         give up after waiting MS ms for the lock (default: wait\n"
"                        forever; 0: try once). Waiting is woken by the release.\n"
"      --timeout MS      connect/command timeout per Redis call (default: a third\n"
"                        of the ttl, at most 1000).\n"
"      --kill-after MS   after the lock is lost, SIGKILL COMMAND if it has not\n"
"                        exited MS ms after SIGTERM (default 5000).\n"
"  -h, --help            this text.\n"
"\n"
"COMMAND gets the lock's fencing token in FLASHLOCK_FENCE (strictly increasing\n"
"per NAME: pass it to whatever you write, so it can refuse a stale holder) and\n"
"the name in FLASHLOCK_NAME. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to\n"
"flashlock are passed on to COMMAND. If flashlock itself dies, COMMAND gets\n"
"SIGTERM (the lease would lapse without renewal).\n"
"\n"
"If the lock is lost while COMMAND runs (renewal finds it gone or taken, or the\n"
"lease runs out by the local monotonic clock because Redis did not confirm a\n"
"renewal in time), COMMAND gets SIGTERM and flashlock exits 70 with a message.\n"
"\n"
"The lock is a plain Redis string taken with SET NX PX, so it also excludes\n"
"other clients (redis-py's Lock, redsync, ...) that take the same key.\n"
"\n"
"Exit status: COMMAND's; 75 if the lock was not had within --wait; 70 if it was\n"
"lost; 69 if Redis could not be reached (or no quorum); 64 on bad usage;\n"
"126/127 if COMMAND could not be run.\n", f);
}

typedef struct args {
    const char *urls[LOCK_MAX_SERVERS];
    int nurls;
    long long ttl_ms, wait_ms, timeout_ms, kill_after_ms;
    const char *name;
    char **cmd;
} args;

static int parse_ms(const char *s, long long lo, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo) return -1;
    *out = v;
    return 0;
}

/* Returns 0, 1 for --help, or -1 (message printed). */
static int parse_args(int argc, char **argv, args *a) {
    static const struct option opts[] = {
        { "redis", required_argument, 0, 'r' }, { "ttl", required_argument, 0, 't' },
        { "wait", required_argument, 0, 'w' },  { "timeout", required_argument, 0, 'T' },
        { "kill-after", required_argument, 0, 'K' }, { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 } };
    memset(a, 0, sizeof *a);
    a->ttl_ms = 10000;
    a->wait_ms = -1;
    a->timeout_ms = 0;   /* default: ttl/3, at most 1000 */
    a->kill_after_ms = 5000;
    int ch;
    while ((ch = getopt_long(argc, argv, "+r:t:w:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'r':
            if (a->nurls == LOCK_MAX_SERVERS) {
                fprintf(stderr, "flashlock: at most %d --redis\n", LOCK_MAX_SERVERS);
                return -1;
            }
            a->urls[a->nurls++] = optarg;
            break;
        case 't': if (parse_ms(optarg, 10, &a->ttl_ms)) goto bad; break;
        case 'w': if (parse_ms(optarg, 0, &a->wait_ms)) goto bad; break;
        case 'T': if (parse_ms(optarg, 1, &a->timeout_ms)) goto bad; break;
        case 'K': if (parse_ms(optarg, 0, &a->kill_after_ms)) goto bad; break;
        case 'h': return 1;
        default: goto usage;
        }
    }
    if (optind >= argc) goto usage;
    a->name = argv[optind++];
    if (optind < argc && !strcmp(argv[optind], "--")) optind++;
    if (optind >= argc) goto usage;
    a->cmd = argv + optind;
    if (a->timeout_ms == 0) {
        a->timeout_ms = a->ttl_ms / 3 < 1000 ? a->ttl_ms / 3 : 1000;
        if (a->timeout_ms < 5) a->timeout_ms = 5;
    }
    if (a->nurls == 0) {
        const char *env = getenv("FLASHLOCK_REDIS");
        a->urls[a->nurls++] = env && *env ? env : "redis://127.0.0.1:6379/0";
    }
    return 0;
bad:
    fprintf(stderr, "flashlock: bad number of milliseconds '%s'\n", optarg);
    return -1;
usage:
    fprintf(stderr, "usage: flashlock [--redis URL]... [--ttl MS] [--wait MS] NAME -- COMMAND [ARGS...]\n"
                    "       (flashlock --help for more)\n");
    return -1;
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
    char fence[24], err[600];
    atomic_init(&r.child, 0);
    atomic_init(&r.lost, 0);
    atomic_init(&r.lapsed, 0);
    snprintf(fence, sizeof fence, "%llu", (unsigned long long)lock_fence(h));
    /* setenv before fork: the child may only make async-signal-safe calls. */
    setenv("FLASHLOCK_FENCE", fence, 1);
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

int main(int argc, char **argv) {
    args a;
    char err[600];
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        if (rc > 0) usage(stdout);
        return rc > 0 ? 0 : EXIT_USAGE;
    }
    sigset_t set;
    sigemptyset(&set);
    int sigs[] = { SIGCHLD, SIGUSR1, SIGINT, SIGTERM, SIGHUP, SIGQUIT };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaddset(&set, sigs[i]);
    /* Before any thread exists, so they all inherit the mask. */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    lock_options o = { .urls = a.urls, .nurls = a.nurls, .timeout_ms = (int)a.timeout_ms,
                       .watchdog = 1 };
    lock_client *c = lock_client_new(&o, err, sizeof err);
    if (!c) {
        fprintf(stderr, "flashlock: %s\n", err);
        return EXIT_USAGE;
    }
    lock_handle *h = NULL;
    lock_status st = acquire(c, &a, &set, &h, err, sizeof err);
    if (st != LOCK_OK) {
        fprintf(stderr, "flashlock: %s\n", err);
        lock_client_free(c);
        return st == LOCK_BUSY ? EXIT_BUSY : EXIT_REDIS;
    }
    rc = run(&a, &set, h);
    lock_client_free(c);
    return rc;
}
