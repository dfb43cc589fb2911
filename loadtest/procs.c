/* procs.c: the processes flashload starts when it is not given a target:
 * a private redis-server, one or two flashsale instances, and the lock
 * servers the comparison needs (three redis-servers for Redlock, a
 * standalone ZooKeeper, a single-member etcd), each on a free port of
 * 127.0.0.1 with its files in a temp dir, stopped by pid afterwards. A
 * lock server can be restarted on its port, with or without its data, for
 * the comparison's fault probes.
 *
 * For the Redis failures group (failures.c) also: redis-servers and
 * sentinels started from a config file of their own (a Sentinel rewrites
 * its file, as on a real machine), a redis-server whose wall clock we can
 * move (under our LD_PRELOAD shim, bin/libclockjump.so: clockjump.c), and a
 * crash that loses the end of a server's append-only file.
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
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <hiredis/hiredis.h>

#include "common/clock.h"
#include "loadtest/client/client.h"
#include "loadtest/procs.h"

#define START_WAIT_MS 20000
/* A JVM on a busy two-core machine: ZooKeeper may take a while. */
#define ZK_WAIT_MS 90000

static const char *const ZK_JARS[] = { "/usr/share/java/zookeeper.jar",
                                       "/usr/share/java/slf4j-log4j12.jar",
                                       "/usr/share/java/log4j-1.2.jar", NULL };

/* The lowest port the kernel gives outgoing connections (32768 when it
 * cannot be read). */
static int ephemeral_low(void) {
    int low = 32768, high;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
        fclose(f);
    }
    return low;
}

/* Whether port is free on 127.0.0.1 now. */
static int port_free(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A port for a server to listen on, chosen below the kernel's ephemeral
 * range: bind(0) picks from that range, where every outgoing connection
 * of the comparison (its buyers, its Redis clients) takes its local port
 * too, so one of them could hold the port by the time the server binds it
 * (a sentinel of `make demo` once exited at start so). Never the same
 * port twice in a process, so a server that is down for a restart keeps
 * its own. */
int fl_free_port(void) {
    static int given[512], ngiven;
    static unsigned seed;
    int low = ephemeral_low();
    if (!seed) seed = (unsigned)getpid() ^ (unsigned)clock_mono_us();
    for (int tries = 0; tries < 400 && low > 11000; tries++) {
        int port = 10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000));
        int taken = 0;
        for (int i = 0; i < ngiven && !taken; i++) taken = given[i] == port;
        if (taken || !port_free(port)) continue;
        if (ngiven < (int)(sizeof given / sizeof given[0])) given[ngiven++] = port;
        return port;
    }
    return -1;
}

extern char **environ;

/* Whether "NAME=value" var sets one of the names set in env. */
static int env_overridden(const char *var, char *const *env) {
    size_t len = strcspn(var, "=");
    for (int i = 0; env[i]; i++)
        if (!strncmp(env[i], var, len) && env[i][len] == '=') return 1;
    return 0;
}

/* Forks and execs argv with stdout and stderr appended to log, with the
 * NULL-terminated "NAME=value" strings of env replacing or added to our
 * environment (NULL: ours as it is). The environment is built before the
 * fork: the child of a threaded process should call nothing that may
 * allocate. */
static pid_t spawn(char *const argv[], const char *log, char *const *env, fl_err *e) {
    pid_t parent = getpid();
    char **envp = NULL;
    if (env) {
        size_t n = 0, k = 0, m = 0;
        while (environ[n]) n++;
        while (env[k]) k++;
        if (!(envp = calloc(n + k + 1, sizeof *envp))) {
            fl_errf(e, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            if (!env_overridden(environ[i], env)) envp[m++] = environ[i];
        memcpy(envp + m, env, k * sizeof *envp);
    }
    pid_t pid = fork();
    if (pid < 0) {
        free(envp);
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
        if (envp) execvpe(argv[0], argv, envp);
        else execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    free(envp);
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

static int spawn_server(fl_proc *p, fl_err *e);

/* Sends a ZooKeeper four-letter word; 1 when the answer starts with want. */
static int four_letter(int port, const char *word, const char *want) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct timeval tv = { 2, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    char buf[64] = "";
    int ok = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        write(fd, word, strlen(word)) == (ssize_t)strlen(word)) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        ok = n > 0 && !strncmp(buf, want, strlen(want));
    }
    close(fd);
    return ok;
}

/* Whether etcd's v3 gateway answers a read. */
static int etcd_serves(int port) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    fl_target t;
    fl_http h;
    fl_err e;
    if (fl_target_parse(url, &t, &e)) return 0;
    fl_http_init(&h, &t, "", 2000);
    int st = fl_http_request(&h, "POST", "/v3/kv/range", "{\"key\":\"AA==\"}", &e);
    fl_http_close(&h);
    return st == 200;
}

static int serves(const fl_proc *p) {
    switch (p->kind) {
    case FL_PROC_ZOOKEEPER: return four_letter(p->port, "ruok", "imok");
    case FL_PROC_ETCD: return etcd_serves(p->port);
    default: return accepting(p->port);
    }
}

static const char *kind_name(fl_proc_kind k) {
    switch (k) {
    case FL_PROC_SERVICE: return "flashsale";
    case FL_PROC_ZOOKEEPER: return "zookeeper";
    case FL_PROC_ETCD: return "etcd";
    case FL_PROC_SENTINEL: return "sentinel";
    default: return "redis-server";
    }
}

int fl_proc_wait(fl_proc *p, int timeout_ms, fl_err *e) {
    const char *what = kind_name(p->kind);
    int64_t deadline = clock_mono_ms() + timeout_ms;
    while (clock_mono_ms() < deadline) {
        int status;
        if (p->pid <= 0) return fl_errf(e, "%s is not running", what);
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->pid = 0;
            return fl_errf(e, "%s exited at start (status %d); see %s", what,
                           WIFEXITED(status) ? WEXITSTATUS(status) : -1, p->log);
        }
        if (serves(p)) return 0;
        clock_sleep_ms(20);
    }
    fl_proc_stop(p, 2000);
    return fl_errf(e, "%s did not serve within %d s; see %s", what, timeout_ms / 1000, p->log);
}

static int wait_up(fl_proc *p, fl_err *e) { return fl_proc_wait(p, START_WAIT_MS, e); }

int fl_redis_start(const char *dir, fl_proc *p, fl_err *e) {
    memset(p, 0, sizeof *p);
    p->kind = FL_PROC_REDIS;
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    p->port = fl_free_port();
    if (p->port < 0) return fl_errf(e, "no free port");
    snprintf(p->log, sizeof p->log, "%s/redis.log", dir);
    snprintf(p->url, sizeof p->url, "redis://127.0.0.1:%d/0", p->port);
    if (spawn_server(p, e)) return -1;
    return wait_up(p, e);
}

/* Writes a file; -1 with e set. */
static int write_file(const char *path, const char *text, fl_err *e) {
    FILE *f = fopen(path, "w");
    if (!f) return fl_errf(e, "cannot write %s: %s", path, strerror(errno));
    fputs(text, f);
    if (fclose(f) != 0) return fl_errf(e, "cannot write %s", path);
    return 0;
}

/* The configuration files of a ZooKeeper in p->dir: a short tick so that
 * sessions may be short (tickTime 100, minSessionTimeout 200), no admin
 * server, the four-letter words on, logs to a file. */
static int zk_config(const fl_proc *p, fl_err *e) {
    char path[700], text[2048];
    snprintf(path, sizeof path, "%s/zoo.cfg", p->dir);
    snprintf(text, sizeof text,
             "tickTime=100\ndataDir=%s/data\nclientPort=%d\nclientPortAddress=127.0.0.1\n"
             "minSessionTimeout=200\nmaxSessionTimeout=60000\nadmin.enableServer=false\n"
             "4lw.commands.whitelist=*\nmaxClientCnxns=0\n",
             p->dir, p->port);
    if (write_file(path, text, e)) return -1;
    snprintf(path, sizeof path, "%s/log4j.properties", p->dir);
    snprintf(text, sizeof text,
             "log4j.rootLogger=INFO, F\nlog4j.appender.F=org.apache.log4j.FileAppender\n"
             "log4j.appender.F.File=%s\nlog4j.appender.F.layout=org.apache.log4j.PatternLayout\n"
             "log4j.appender.F.layout.ConversionPattern=%%d %%p %%c{1}: %%m%%n\n", p->log);
    return write_file(path, text, e);
}

/* Execs p's server (its ports and dir already chosen). */
static int spawn_server(fl_proc *p, fl_err *e) {
    char port[16], data[500], l4j[520], cfg[500], cp[400] = "", client[64], peer[64], cluster[80];
    snprintf(port, sizeof port, "%d", p->port);
    snprintf(data, sizeof data, "%s/data", p->dir);
    mkdir(data, 0755);
    switch (p->kind) {
    case FL_PROC_REDIS: {
        char *argv[] = { "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "no", "--dir", data, "--maxclients", "10000", NULL };
        p->pid = spawn(argv, p->log, NULL, e);
        break;
    }
    case FL_PROC_REDIS_AOF: {
        char *argv[] = { "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "yes", "--appendfsync", "everysec", "--dir", data,
                         "--maxclients", "10000", NULL };
        char preload[420], file[440];
        /* Under bin/libclockjump.so only the wall clock moves, as when NTP
         * steps it; the monotonic clock goes on (Redis times its own timers
         * with it). The offset file is read at every call: a jump takes at
         * once. */
        char *env[] = { preload, file, NULL };
        if (p->clockjump[0]) {
            char lib[400];
            if (fl_clockjump_lib(lib, sizeof lib, e)) return -1;
            snprintf(preload, sizeof preload, "LD_PRELOAD=%s", lib);
            snprintf(file, sizeof file, "CLOCKJUMP_FILE=%s", p->clockjump);
        }
        p->pid = spawn(argv, p->log, p->clockjump[0] ? env : NULL, e);
        break;
    }
    case FL_PROC_REDIS_NODE:
    case FL_PROC_SENTINEL: {
        snprintf(cfg, sizeof cfg, "%s/redis.conf", p->dir);
        char *argv[] = { "redis-server", cfg, p->kind == FL_PROC_SENTINEL ? "--sentinel" : NULL,
                         NULL };
        p->pid = spawn(argv, p->log, NULL, e);
        break;
    }
    case FL_PROC_ZOOKEEPER: {
        for (int i = 0; ZK_JARS[i]; i++)
            if (access(ZK_JARS[i], R_OK) == 0)
                snprintf(cp + strlen(cp), sizeof cp - strlen(cp), "%s%s", cp[0] ? ":" : "",
                         ZK_JARS[i]);
        if (access(ZK_JARS[0], R_OK) != 0)
            return fl_errf(e, "no %s (Debian package zookeeper)", ZK_JARS[0]);
        if (zk_config(p, e)) return -1;
        snprintf(l4j, sizeof l4j, "-Dlog4j.configuration=file:%s/log4j.properties", p->dir);
        snprintf(cfg, sizeof cfg, "%s/zoo.cfg", p->dir);
        /* C1 only and a serial GC: a JVM that starts fast on a busy box. */
        char *argv[] = { p->bin[0] ? p->bin : "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                         "-Dzookeeper.admin.enableServer=false",
                         "-Dznode.container.checkIntervalMs=1000", l4j, "-cp", cp,
                         "org.apache.zookeeper.server.ZooKeeperServerMain", cfg, NULL };
        p->pid = spawn(argv, p->log, NULL, e);
        break;
    }
    case FL_PROC_ETCD: {
        snprintf(client, sizeof client, "http://127.0.0.1:%d", p->port);
        snprintf(peer, sizeof peer, "http://127.0.0.1:%d", p->peer_port);
        snprintf(cluster, sizeof cluster, "fl=%s", peer);
        /* A short election timeout: the smallest lease is then 1 s. */
        char *argv[] = { p->bin[0] ? p->bin : "etcd", "--name", "fl", "--data-dir", data, "--listen-client-urls",
                         client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                         "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
                         "--initial-cluster-state", "new", "--heartbeat-interval", "50",
                         "--election-timeout", "500", NULL };
        p->pid = spawn(argv, p->log, NULL, e);
        break;
    }
    default:
        return fl_errf(e, "not a server");
    }
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    return 0;
}

int fl_server_spawn(fl_proc_kind kind, const char *dir, const char *bin, fl_proc *p,
                    fl_err *e) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    if (bin) snprintf(p->bin, sizeof p->bin, "%s", bin);
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    mkdir(dir, 0755);
    p->port = fl_free_port();
    if (kind == FL_PROC_ETCD) p->peer_port = fl_free_port();
    if (p->port < 0 || p->peer_port < 0) return fl_errf(e, "no free port");
    snprintf(p->log, sizeof p->log, "%s/%s.log", dir, kind_name(kind));
    switch (kind) {
    case FL_PROC_ZOOKEEPER: snprintf(p->url, sizeof p->url, "zk://127.0.0.1:%d/locks", p->port); break;
    case FL_PROC_ETCD: snprintf(p->url, sizeof p->url, "etcd://127.0.0.1:%d", p->port); break;
    default: snprintf(p->url, sizeof p->url, "redis://127.0.0.1:%d/0", p->port);
    }
    return spawn_server(p, e);
}

/* Asks a Redis without persistence to write its snapshot, so that a
 * restart keeps its data (it loads dump.rdb at start). */
static int redis_save(const fl_proc *p, fl_err *e) {
    struct timeval tv = { 5, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", p->port, tv);
    if (!c || c->err) {
        fl_errf(e, "redis SAVE: %s", c ? c->errstr : "out of memory");
        redisFree(c);
        return -1;
    }
    redisSetTimeout(c, (struct timeval){ 30, 0 });
    redisReply *r = redisCommand(c, "SAVE");
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok) fl_errf(e, "redis SAVE failed: %s", r && r->str ? r->str : c->errstr);
    freeReplyObject(r);
    redisFree(c);
    return ok ? 0 : -1;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw);

int fl_servers_restart(fl_proc *p, int n, int wipe, int64_t *down_ms, fl_err *e) {
    for (int i = 0; i < n; i++) {
        if (p[i].kind == FL_PROC_SERVICE) return fl_errf(e, "not a server");
        if (!wipe && p[i].kind == FL_PROC_REDIS && redis_save(&p[i], e)) return -1;
    }
    int64_t t0 = clock_mono_ms();
    for (int i = 0; i < n; i++) {
        if (wipe) fl_proc_kill(&p[i]);
        else fl_proc_stop(&p[i], 10000);
        if (wipe) {
            char data[500];
            snprintf(data, sizeof data, "%s/data", p[i].dir);
            nftw(data, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        }
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = spawn_server(&p[i], e);
    for (int i = 0; i < n && !rc; i++)
        rc = fl_proc_wait(&p[i], p[i].kind == FL_PROC_ZOOKEEPER ? ZK_WAIT_MS : START_WAIT_MS, e);
    if (down_ms) *down_ms = clock_mono_ms() - t0;
    return rc;
}

int fl_server_restart(fl_proc *p, int wipe, int64_t *down_ms, fl_err *e) {
    return fl_servers_restart(p, 1, wipe, down_ms, e);
}

/* ------------------------------------------- the Redis failures group's */

int fl_clockjump_lib(char *out, size_t len, fl_err *e) {
    char self[380];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fl_errf(e, "readlink /proc/self/exe: %s", strerror(errno));
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(out, len, "%.370s/libclockjump.so", self);
    if (access(out, R_OK) != 0)
        return fl_errf(e, "%s: %s (make builds it next to flashload)", out, strerror(errno));
    return 0;
}

int fl_clockjump_set(const char *file, int64_t secs, fl_err *e) {
    /* One aligned 8-byte store through a shared mapping: the shim, which
     * maps the same page, sees the old offset or the new, never half of
     * each (a write(2) is a copy of bytes, with no such promise). */
    int fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fl_errf(e, "open %s: %s", file, strerror(errno));
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 &&
        (st.st_size >= (off_t)sizeof secs || ftruncate(fd, sizeof secs) == 0))
        m = mmap(NULL, sizeof secs, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) return fl_errf(e, "map %s: %s", file, strerror(err));
    __atomic_store_n((int64_t *)m, secs, __ATOMIC_RELEASE);
    munmap(m, sizeof secs);
    return 0;
}

int fl_clockjump_spawn(const char *dir, const char *file, fl_proc *p, fl_err *e) {
    char lib[400];
    memset(p, 0, sizeof *p);
    if (fl_clockjump_lib(lib, sizeof lib, e) || fl_clockjump_set(file, 0, e)) return -1;
    fl_proc q;
    memset(&q, 0, sizeof q);
    q.kind = FL_PROC_REDIS_AOF;
    snprintf(q.dir, sizeof q.dir, "%s", dir);
    snprintf(q.clockjump, sizeof q.clockjump, "%s", file);
    mkdir(dir, 0755);
    q.port = fl_free_port();
    if (q.port < 0) return fl_errf(e, "no free port");
    snprintf(q.log, sizeof q.log, "%s/redis-server.log", dir);
    snprintf(q.url, sizeof q.url, "redis://127.0.0.1:%d/0", q.port);
    *p = q;
    return spawn_server(p, e);
}

int fl_conf_spawn(fl_proc_kind kind, const char *dir, const char *extra, fl_proc *p,
                  fl_err *e) {
    memset(p, 0, sizeof *p);
    if (kind != FL_PROC_REDIS_NODE && kind != FL_PROC_SENTINEL) return fl_errf(e, "not a node");
    p->kind = kind;
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    mkdir(dir, 0755);
    p->port = fl_free_port();
    if (p->port < 0) return fl_errf(e, "no free port");
    snprintf(p->log, sizeof p->log, "%s/%s.log", dir, kind_name(kind));
    snprintf(p->url, sizeof p->url, "redis://127.0.0.1:%d/0", p->port);
    char path[500], text[4096];
    snprintf(path, sizeof path, "%s/redis.conf", dir);
    /* A data node keeps nothing on disk, and a full sync starts at once
     * (Redis 7 waits 5 s for more replicas by default). */
    snprintf(text, sizeof text, "port %d\nbind 127.0.0.1\ndir \"%s%s\"\n%s%s", p->port, dir,
             kind == FL_PROC_SENTINEL ? "" : "/data",
             kind == FL_PROC_SENTINEL ? ""
                                      : "save \"\"\nappendonly no\nrepl-diskless-sync-delay 0\n",
             extra ? extra : "");
    if (write_file(path, text, e)) return -1;
    return spawn_server(p, e);
}

int fl_server_start_again(fl_proc *p, fl_err *e) {
    if (p->pid > 0) return fl_errf(e, "%s is still running", kind_name(p->kind));
    if (spawn_server(p, e)) return -1;
    return fl_proc_wait(p, START_WAIT_MS, e);
}

/* The newest incremental file of a Redis 7 append-only file (a directory,
 * appendonlydir/, of a base file, incremental files and a manifest), or -1. */
static int aof_incr_file(const fl_proc *p, char *out, size_t len) {
    char dir[440];
    snprintf(dir, sizeof dir, "%s/data/appendonlydir", p->dir);
    DIR *d = opendir(dir);
    if (!d) return -1;
    long best = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        long seq;
        char tail[32];
        /* appendonly.aof.<seq>.incr.aof */
        if (sscanf(de->d_name, "appendonly.aof.%ld.%31s", &seq, tail) == 2 &&
            !strcmp(tail, "incr.aof") && seq > best) {
            best = seq;
            snprintf(out, len, "%s/%.150s", dir, de->d_name);
        }
    }
    closedir(d);
    return best >= 0 ? 0 : -1;
}

int fl_aof_mark_take(const fl_proc *p, fl_aof_mark *m, fl_err *e) {
    struct stat st;
    memset(m, 0, sizeof *m);
    if (aof_incr_file(p, m->path, sizeof m->path))
        return fl_errf(e, "no append-only file under %s/data", p->dir);
    if (stat(m->path, &st) != 0) return fl_errf(e, "stat %s: %s", m->path, strerror(errno));
    m->size = (long long)st.st_size;
    m->at_ms = clock_mono_ms();
    return 0;
}

int fl_servers_crash(fl_proc *p, int n, const fl_aof_mark *m, int64_t *down_ms, fl_err *e) {
    int64_t t0 = clock_mono_ms();
    for (int i = 0; i < n; i++) fl_proc_kill(&p[i]);
    for (int i = 0; i < n; i++)
        if (truncate(m[i].path, (off_t)m[i].size) != 0)
            return fl_errf(e, "truncate %s: %s", m[i].path, strerror(errno));
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = spawn_server(&p[i], e);
    for (int i = 0; i < n && !rc; i++) rc = fl_proc_wait(&p[i], START_WAIT_MS, e);
    if (down_ms) *down_ms = clock_mono_ms() - t0;
    return rc;
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
    p->kind = FL_PROC_SERVICE;
    p->pid = spawn((char *const *)argv, p->log, NULL, e);
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    snprintf(p->url, sizeof p->url, "http://127.0.0.1:%d", p->port);
    return wait_up(p, e);
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

void fl_proc_kill(fl_proc *p) {
    if (p->pid <= 0) return;
    kill(p->pid, SIGKILL);
    int status;
    waitpid(p->pid, &status, 0);
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
