/* procs.c: the processes flashload starts when it is not given a target:
 * a private redis-server and one or two flashsale instances, each on a free
 * port of 127.0.0.1 with its files in a temp dir, stopped by pid afterwards.
 *
 * A child asks the kernel for SIGTERM when flashload dies (PR_SET_PDEATHSIG),
 * so even a killed flashload leaves no server running behind it. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "common/clock.h"
#include "loadtest/loadtest.h"

#define START_WAIT_MS 20000

int fl_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Forks and execs argv with stdout and stderr appended to log. */
static pid_t spawn(char *const argv[], const char *log, fl_err *e) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fl_errf(e, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);       /* the parent died already */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (null >= 0) dup2(null, 0);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Whether something accepts TCP connections on 127.0.0.1:port. */
static int accepting(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Waits until the child accepts connections; fails early if it exits. */
static int wait_up(fl_proc *p, const char *what, fl_err *e) {
    int64_t deadline = clock_mono_ms() + START_WAIT_MS;
    while (clock_mono_ms() < deadline) {
        int status;
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->pid = 0;
            return fl_errf(e, "%s exited at start (status %d); see %s", what,
                           WIFEXITED(status) ? WEXITSTATUS(status) : -1, p->log);
        }
        if (accepting(p->port)) return 0;
        clock_sleep_ms(20);
    }
    fl_proc_stop(p, 2000);
    return fl_errf(e, "%s did not accept connections within %d s; see %s", what,
                   START_WAIT_MS / 1000, p->log);
}

int fl_redis_start(const char *dir, fl_proc *p, fl_err *e) {
    memset(p, 0, sizeof *p);
    p->port = fl_free_port();
    if (p->port < 0) return fl_errf(e, "no free port");
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    snprintf(p->log, sizeof p->log, "%s/redis.log", dir);
    char *argv[] = { "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", (char *)dir, "--maxclients", "10000", NULL };
    p->pid = spawn(argv, p->log, e);
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    snprintf(p->url, sizeof p->url, "redis://127.0.0.1:%d/0", p->port);
    return wait_up(p, "redis-server", e);
}

int fl_service_start(const char *bin, const char *dir, const char *redis_url,
                     const char *db_path, const char *const *extra, fl_proc *p, fl_err *e) {
    memset(p, 0, sizeof *p);
    p->port = fl_free_port();
    if (p->port < 0) return fl_errf(e, "no free port");
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", p->port);
    snprintf(p->log, sizeof p->log, "%s/flashsale-%d.log", dir, p->port);
    const char *argv[48] = { bin, "--listen", listen, "--redis", redis_url, "--db", db_path };
    int n = 7;
    for (int i = 0; extra && extra[i] && n < 47; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    p->pid = spawn((char *const *)argv, p->log, e);
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    snprintf(p->url, sizeof p->url, "http://127.0.0.1:%d", p->port);
    return wait_up(p, "flashsale", e);
}

void fl_proc_stop(fl_proc *p, int timeout_ms) {
    if (p->pid <= 0) return;
    kill(p->pid, SIGTERM);
    int64_t deadline = clock_mono_ms() + timeout_ms;
    int status;
    while (waitpid(p->pid, &status, WNOHANG) == 0) {
        if (clock_mono_ms() > deadline) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            break;
        }
        clock_sleep_ms(10);
    }
    p->pid = 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void fl_rmtree(const char *dir) {
    if (dir && dir[0] && strcmp(dir, "/") != 0) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
