/* tloop.h: what the loop-side unit tests share (test_loop, test_aconn,
 * test_stock_async).
 *
 * - A loop on a thread of its own, as the service runs its loops; the test
 *   runs code on it with tl_call (posted, waited for) and waits for a
 *   condition evaluated there with tl_wait, so everything the loop owns is
 *   touched only on its thread.
 * - A private redis-server on a free loopback port below the ephemeral
 *   range (tr_start), for the fault cases: killed (SIGKILL), stalled
 *   (SIGSTOP / SIGCONT) and restarted on the same port, always by its PID.
 *   tr_start_ext starts one with more arguments (a cluster node, a replica)
 *   or from a config file (a sentinel: "--sentinel"), as test_rtopo does.
 *
 * Header-only; every function static. */
#ifndef FLASHSALE_TLOOP_H
#define FLASHSALE_TLOOP_H

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/loop.h"

/* ------------------------------------------------------ a loop on a thread */

typedef struct tloop {
    loop *l;
    pthread_t th;
    int running;
} tloop;

static inline void *tl_main(void *l) {
    loop_run(l);
    return NULL;
}

/* A new loop, running on its own thread. Returns 0 or -1. */
static inline int tl_start(tloop *t) {
    char err[128];
    t->running = 0;
    if (!(t->l = loop_new(err, sizeof err))) {
        fprintf(stderr, "  loop_new: %s\n", err);
        return -1;
    }
    if (pthread_create(&t->th, NULL, tl_main, t->l) != 0) {
        loop_free(t->l);
        return -1;
    }
    t->running = 1;
    return 0;
}

/* Stops the loop and joins its thread (what the loop owns may then be
 * freed from here, as the service does at shutdown). */
static inline void tl_stop(tloop *t) {
    if (!t->running) return;
    loop_stop(t->l);
    pthread_join(t->th, NULL);
    t->running = 0;
}

static inline void tl_end(tloop *t) {
    tl_stop(t);
    loop_free(t->l);
    t->l = NULL;
}

typedef void tl_fn(void *ud);

typedef struct tl_call_s {
    loop_task task;
    tl_fn *fn;
    void *ud;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} tl_call_s;

static inline void tl_call_run(loop *l, void *ud) {
    tl_call_s *c = ud;
    (void)l;
    c->fn(c->ud);
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Runs fn(ud) on t's loop thread and waits for it. A loop that does not
 * get to it within 10 s is stuck: the program ends, failed. */
static inline void tl_call(tloop *t, tl_fn *fn, void *ud) {
    tl_call_s c = { .fn = fn, .ud = ud };
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    c.task = (loop_task){ tl_call_run, &c, NULL };
    loop_post(t->l, &c.task);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&c.mu);
    while (!c.done)
        if (pthread_cond_timedwait(&c.cv, &c.mu, &until) != 0 && !c.done) {
            fprintf(stderr, "  the loop did not run a posted call within 10 s: stuck\n");
            printf("0 passed, 1 failed\n");
            fflush(NULL);
            _exit(1);
        }
    pthread_mutex_unlock(&c.mu);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
}

typedef struct tl_pred_s {
    int (*pred)(void *);
    void *ud;
    int ok;
} tl_pred_s;

static inline void tl_pred_run(void *ud) {
    tl_pred_s *p = ud;
    p->ok = p->pred(p->ud);
}

/* Waits until pred(ud), evaluated on the loop's thread, is true: 1, or 0
 * after timeout_ms. */
static inline int tl_wait(tloop *t, int (*pred)(void *), void *ud, int timeout_ms) {
    int64_t until = clock_mono_ms() + timeout_ms;
    tl_pred_s p = { pred, ud, 0 };
    for (;;) {
        tl_call(t, tl_pred_run, &p);
        if (p.ok) return 1;
        if (clock_mono_ms() >= until) return 0;
        clock_sleep_ms(1);
    }
}

/* ------------------------------------------------- a private redis-server */

typedef struct tredis {
    pid_t pid;                    /* 0: not running */
    int port;
    char dir[64];
    char url[64];
} tredis;

/* A loopback port nothing listens on, below the ephemeral range (where
 * the tests' own outgoing connections take theirs), never twice. */
static inline int tr_free_port(void) {
    static int used[64], nused;
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() ^ (unsigned)clock_mono_us();
    for (int tries = 0; tries < 500; tries++) {
        int port = 12000 + (int)(rand_r(&seed) % 20000u), seen = 0;
        for (int i = 0; i < nused; i++) seen |= used[i] == port;
        if (seen) continue;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0) close(fd);
        if (ok) {
            if (nused < 64) used[nused++] = port;
            return port;
        }
    }
    return -1;
}

/* Whether a PING on port answers +PONG within 200 ms. */
static inline int tr_pong(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = { 0, 200000 };
    char buf[16] = "";
    int ok = 0;
    if (fd < 0) return 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "PING\r\n", 6) == 6 &&
        read(fd, buf, sizeof buf - 1) >= 5)
        ok = !strncmp(buf, "+PONG", 5);
    close(fd);
    return ok;
}

/* Builds r's command line into argv (at most 40 entries): conf first when
 * given, then the usual options, then extra (NULL-terminated, or NULL). */
static inline void tr_argv(const tredis *r, const char *conf, const char *const *extra,
                           char *port, char *log, const char **argv) {
    int n = 0;
    argv[n++] = "redis-server";
    if (conf) argv[n++] = conf;
    const char *usual[] = { "--port", port, "--bind", "127.0.0.1", "--dir", r->dir, "--save", "",
                            "--appendonly", "no", "--logfile", log };
    for (size_t i = 0; i < sizeof usual / sizeof usual[0]; i++) argv[n++] = usual[i];
    for (int i = 0; extra && extra[i] && n < 39; i++) argv[n++] = extra[i];
    argv[n] = NULL;
}

/* (Re)starts r's redis-server: on r->port when set (a restart), else on a
 * free port; conf (a config file, or NULL) and extra (more arguments,
 * NULL-terminated, or NULL) as tr_argv says. Returns 0 once it answers
 * PING, or -1. */
static inline int tr_start_ext(tredis *r, const char *conf, const char *const *extra) {
    if (!r->dir[0]) {
        snprintf(r->dir, sizeof r->dir, "/tmp/fs-unit-redis-XXXXXX");
        if (!mkdtemp(r->dir)) return -1;
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        if (!r->port || attempt > 0) r->port = tr_free_port();
        if (r->port < 0) return -1;
        char port[16], log[128];
        const char *argv[40];
        snprintf(port, sizeof port, "%d", r->port);
        snprintf(log, sizeof log, "%s/redis.log", r->dir);
        tr_argv(r, conf, extra, port, log, argv);
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlives the test */
            dup2(null, 1);
            dup2(null, 2);
            execvp(argv[0], (char **)argv);
            _exit(127);
        }
        if (null >= 0) close(null);
        if (pid < 0) return -1;
        for (int64_t until = clock_mono_ms() + 5000; clock_mono_ms() < until;) {
            if (tr_pong(r->port)) {
                r->pid = pid;
                snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d/0", r->port);
                return 0;
            }
            if (waitpid(pid, NULL, WNOHANG) == pid) break;   /* exited: port taken? */
            clock_sleep_ms(5);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

static inline int tr_start(tredis *r) { return tr_start_ext(r, NULL, NULL); }

/* Kills r's server (SIGKILL, by its PID) and reaps it. */
static inline void tr_kill(tredis *r) {
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

/* Stalls (1) or resumes (0) r's server. */
static inline void tr_pause(tredis *r, int stop) {
    if (r->pid > 0) kill(r->pid, stop ? SIGSTOP : SIGCONT);
}

/* Kills the server and removes its directory (every file in it: logs,
 * dump, a cluster node's nodes.conf, a sentinel's config). */
static inline void tr_cleanup(tredis *r) {
    char f[384];
    tr_kill(r);
    if (!r->dir[0]) return;
    DIR *d = opendir(r->dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(f, sizeof f, "%s/%s", r->dir, e->d_name);
        unlink(f);
    }
    if (d) closedir(d);
    rmdir(r->dir);
    r->dir[0] = '\0';
}

#endif
