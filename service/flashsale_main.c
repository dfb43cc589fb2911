/* flashsale_main.c: the flashsale service's entry point: configuration,
 * signals, and the audit command. Starting and stopping the service itself
 * is lifecycle.c's (svc_start, svc_stop).
 * Stop (SIGTERM/SIGINT): stop accepting, let every request in flight be
 * answered, let the writer commit what it holds, clear pending records,
 * exit 0. */
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "rtopo/rtopo.h"
#include "service/app.h"
#include "service/log.h"
#include "service/repair/repair.h"

/* Open connections each need a descriptor: raise the soft limit as far as
 * the hard limit allows. */
static void raise_fd_limit(unsigned want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < (rlim_t)want + 64)
        svc_log(SVC_LOG_WARN, "open-file limit %llu is below --max-connections %u",
                (unsigned long long)rl.rlim_cur, want);
}

/* Whether the address --listen binds to is a loopback one (127.0.0.0/8,
 * ::1, or "localhost"); a wildcard or an unresolvable host is not. */
static int listen_is_loopback(const char *listen) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    size_t n = colon ? (size_t)(colon - listen) : 0;
    if (n == 0 || n >= sizeof host) return 0;
    memcpy(host, listen, n);
    host[n] = '\0';
    if (host[0] == '[') {             /* [::1]:8080 */
        memmove(host, host + 1, n);
        host[strcspn(host, "]")] = '\0';
    }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE }, *res;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return 0;
    int loop = 0;
    if (res->ai_family == AF_INET)
        loop = (ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (res->ai_family == AF_INET6)
        loop = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr);
    freeaddrinfo(res);
    return loop;
}

/* flashsale audit [--repair] [OPTIONS]: the same flags as the service. */
static int audit_command(svc_app *a, int argc, char **argv) {
    int repair = 0, n = 1;
    char *args[argc + 1];
    args[0] = argv[0];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--repair")) repair = 1;
        else args[n++] = argv[i];
    }
    args[n] = NULL;
    int rc = svc_config_load(&a->cfg, n, args);
    if (rc != 0) return rc > 0 ? 0 : 2;
    a->stock_cfg = (stock_config){ .redis_url = a->cfg.redis_url, .prefix = a->cfg.key_prefix,
                                   .timeout_ms = a->cfg.redis_timeout_ms };
    a->db_opt = (db_options){ a->cfg.synchronous_full, a->cfg.db_busy_timeout_ms, 0,
                                a->cfg.db_commit_timeout_ms, 0 };   /* no answer bound: a tool */
    char err[512];
    if (svc_redis_open(a, err, sizeof err) != 0) {
        fprintf(stderr, "flashsale audit: %s\n", err);
        return 2;
    }
    rc = svc_audit_main(a, repair);
    svc_redis_close(a);
    return rc;
}

static void copy_progress(const char *table, long long rows, int done, void *ud) {
    (void)ud;
    fprintf(stderr, "flashsale migrate: %s: %lld rows%s\n", table, rows, done ? " copied" : "...");
}

/* flashsale migrate --from SOURCE --to TARGET [--no-audit] [OPTIONS]: the
 * books copied into an empty database (db_copy_into), then the target
 * audited against Redis as `flashsale audit` would. */
static int migrate_command(svc_app *a, int argc, char **argv) {
    const char *from = NULL, *to = NULL;
    int audit = 1, n = 1;
    char *args[argc + 1], err[512], shown[2][600];
    args[0] = argv[0];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--from") && i + 1 < argc) from = argv[++i];
        else if (!strcmp(argv[i], "--to") && i + 1 < argc) to = argv[++i];
        else if (!strcmp(argv[i], "--no-audit")) audit = 0;
        else args[n++] = argv[i];
    }
    args[n] = NULL;
    if (!from || !to) {
        fprintf(stderr, "flashsale: migrate needs --from and --to (see flashsale --help)\n");
        return 2;
    }
    int rc = svc_config_load(&a->cfg, n, args);
    if (rc != 0) return rc > 0 ? 0 : 2;
    db_target_redact(from, shown[0], sizeof shown[0]);
    db_target_redact(to, shown[1], sizeof shown[1]);
    db_options ro = { 1, a->cfg.db_busy_timeout_ms, 1, a->cfg.db_commit_timeout_ms, 0 },
               rw = { 1, a->cfg.db_busy_timeout_ms, 0, a->cfg.db_commit_timeout_ms, 0 };
    db *src = db_open(from, &ro, err, sizeof err), *dst = NULL;
    if (!src) {
        fprintf(stderr, "flashsale migrate: %s: %s\n", shown[0], err);
        return 2;
    }
    if (!(dst = db_open(to, &rw, err, sizeof err))) {
        fprintf(stderr, "flashsale migrate: %s: %s\n", shown[1], err);
        db_close(src);
        return 2;
    }
    db_status st = db_copy_into(src, dst, copy_progress, NULL);
    if (st != DB_OK) fprintf(stderr, "flashsale migrate: %s\n", db_errstr(dst));
    db_close(src);
    db_close(dst);
    if (st != DB_OK) return 2;
    printf("migrate: copied %s into %s\n", shown[0], shown[1]);
    if (!audit) {
        printf("migrate: not audited (--no-audit): run flashsale audit --db ... before selling\n");
        return 0;
    }
    snprintf(a->cfg.db_path, sizeof a->cfg.db_path, "%s", to);
    a->stock_cfg = (stock_config){ .redis_url = a->cfg.redis_url, .prefix = a->cfg.key_prefix,
                                   .timeout_ms = a->cfg.redis_timeout_ms };
    a->db_opt = (db_options){ a->cfg.synchronous_full, a->cfg.db_busy_timeout_ms, 0,
                                a->cfg.db_commit_timeout_ms, 0 };   /* no answer bound: a tool */
    if (svc_redis_open(a, err, sizeof err) != 0) {
        fprintf(stderr, "flashsale migrate: copied, but the audit could not run: %s\n", err);
        return 2;
    }
    rc = svc_audit_main(a, 0);
    svc_redis_close(a);
    return rc;
}

int main(int argc, char **argv) {
    static svc_app a;
    char err[512], where[300];
    if (argc > 1 && !strcmp(argv[1], "audit")) return audit_command(&a, argc, argv);
    if (argc > 1 && !strcmp(argv[1], "migrate")) return migrate_command(&a, argc, argv);
    int rc = svc_config_load(&a.cfg, argc, argv);
    if (rc != 0) return rc > 0 ? 0 : 2;
    if (a.cfg.verbose) svc_log_set_level(SVC_LOG_DEBUG);
    /* Open admin endpoints are a convenience on one's own machine, never a
     * default on a network: listening elsewhere takes a token or a flag. */
    if (!a.cfg.admin_token[0] && !a.cfg.insecure_admin && !listen_is_loopback(a.cfg.listen)) {
        fprintf(stderr,
                "flashsale: refusing to start: --listen %s is not a loopback address and no\n"
                "--admin-token is set, so anyone who can reach it could create and restock\n"
                "products. Set --admin-token (FLASHSALE_ADMIN_TOKEN), listen on 127.0.0.1, or\n"
                "pass --insecure-admin (FLASHSALE_INSECURE_ADMIN=1) to allow it anyway.\n",
                a.cfg.listen);
        return 2;
    }

    /* Signals are taken by sigwait in main only; threads inherit the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit(a.cfg.max_connections);

    if ((rc = svc_start(&a, err, sizeof err)) != 0) {
        if (rc == 2) fprintf(stderr, "flashsale: %s\n", err);
        else svc_log(SVC_LOG_ERROR, "%s", err);
        return rc;
    }
    rtopo_spec spec;
    if (rtopo_parse(a.cfg.redis_url, &spec, err, sizeof err) == 0)
        rtopo_describe(&spec, where, sizeof where);
    else
        snprintf(where, sizeof where, "?");
    char db_shown[600];
    db_target_redact(a.cfg.db_path, db_shown, sizeof db_shown);
    svc_log(SVC_LOG_INFO, "listening on %s (port %d), %d HTTP threads, redis %s, db %s, "
            "default strategy %s, instance %s",
            a.cfg.listen, http_port(a.http), a.cfg.threads, where, db_shown, a.cfg.strategy,
            a.instance_id);
    char cpus[400];
    cpus_describe(&a.cfg.cpus, cpus, sizeof cpus);
    svc_log(SVC_LOG_INFO, "CPUs it may use: %s; HTTP threads %d%s; commit gap %d us", cpus,
            a.cfg.threads, a.cfg.threads == a.cfg.cpus.usable ? "" : " (as set)",
            a.cfg.commit_gap_us);
    if (!a.cfg.admin_token[0])
        svc_log(SVC_LOG_WARN, "no --admin-token: the admin endpoints are open to anyone");

    int sig = 0;
    sigwait(&sigs, &sig);
    svc_log(SVC_LOG_INFO, "%s: stopping (finishing requests in flight)",
            sig == SIGTERM ? "SIGTERM" : "SIGINT");
    svc_stop(&a);
    svc_log(SVC_LOG_INFO, "stopped");
    return 0;
}
