/* flashsale_main.c: the flashsale service's entry point: configuration,
 * recovery at start, wiring of the modules, signals and graceful shutdown.
 *
 * Start: open SQLite (migrating the schema), rebuild any Redis stock copy
 * that is missing or stale, settle pending reservations left by dead
 * instances, then serve.
 * Stop (SIGTERM/SIGINT): stop accepting, let every request in flight be
 * answered, let the writer commit what it holds, clear pending records,
 * exit 0. */
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rconn.h"
#include "lock/lock.h"
#include "service/service.h"

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
        log_msg(LOG_WARN, "open-file limit %llu is below --max-connections %u",
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

static void make_instance_id(app *a) {
    char host[64] = "localhost";
    unsigned char nonce[4];
    gethostname(host, sizeof host - 1);
    const char *port = strrchr(a->cfg.listen, ':');
    if (port && strcmp(port, ":0") != 0)
        snprintf(a->instance_name, sizeof a->instance_name, "%s%s", host, port);
    else
        snprintf(a->instance_name, sizeof a->instance_name, "%s:pid%d", host, (int)getpid());
    if (getrandom(nonce, sizeof nonce, 0) != sizeof nonce) memset(nonce, 0, sizeof nonce);
    snprintf(a->instance_id, sizeof a->instance_id, "%s#%02x%02x%02x%02x", a->instance_name,
             nonce[0], nonce[1], nonce[2], nonce[3]);
}

typedef struct start_ctx {
    app *a;
    db *d;
    stock_conn *sc;
    int rebuilt, failed;
} start_ctx;

static int check_copy(const db_product *dp, void *ud) {
    start_ctx *s = ud;
    long long total;
    product *p = product_cache_put(s->a->products, dp);
    if (!p || !stock_strategy_about(p->strategy)->uses_redis) return 0;
    stock_result res = stock_read(s->sc, &p->sp, &total, NULL);
    if (res == STOCK_UNAVAILABLE) {
        s->failed = 1;
        return 1;
    }
    if (res == STOCK_MISSING) {
        if (stock_rebuild(s->a, s->d, s->sc, p, 0) == 0) s->rebuilt++;
        else s->failed = 1;
    }
    return 0;
}

/* Brings Redis in line with SQLite before serving. Redis being down is not
 * fatal: orders answer 503 and the maintenance thread catches up. */
static void recover(app *a, db *d) {
    char err[256];
    start_ctx s = { a, d, stock_conn_new(&a->stock_cfg, err, sizeof err), 0, 0 };
    if (!s.sc) return;
    stock_heartbeat(s.sc, 5000);
    db_product_each(d, check_copy, &s);
    int settled = s.failed ? -1 : reconcile(a, d, s.sc, 1);
    if (s.failed || settled < 0)
        log_msg(LOG_WARN, "start: Redis not ready (%s); will retry in the background",
                stock_conn_errstr(s.sc));
    else
        log_msg(LOG_INFO, "start: %d stock copies rebuilt, %d pending reservations settled",
                s.rebuilt, settled);
    stock_conn_free(s.sc);
}

static void shutdown_gracefully(app *a) {
    atomic_store(&a->shutting_down, 1);
    http_quiesce(a->http);
    int64_t start = clock_mono_ms(), warned = 0;
    /* Every request in flight gets its answer: each waits at most for the
     * Redis and database timeouts, so this ends. */
    while (http_inflight(a->http) > 0) {
        if (!warned && clock_mono_ms() - start > a->cfg.shutdown_grace_ms) {
            log_msg(LOG_WARN, "shutdown: %ld requests still in flight after %d ms",
                    http_inflight(a->http), a->cfg.shutdown_grace_ms);
            warned = 1;
        }
        clock_sleep_ms(5);
    }
    workers_stop(a->api);
    /* The writer first: its last groups queue confirmations on the stage. */
    db_writer_stop(a->writer);
    stage_stop(a->pool);
    stage_stop(a->stage);
    maint_stop(a->maint);
    health_stop(a->health);
    http_stop(a->http);
}

/* flashsale audit [--repair] [OPTIONS]: the same flags as the service. */
static int audit_command(app *a, int argc, char **argv) {
    int repair = 0, n = 1;
    char *args[argc + 1];
    args[0] = argv[0];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--repair")) repair = 1;
        else args[n++] = argv[i];
    }
    args[n] = NULL;
    int rc = config_load(&a->cfg, n, args);
    if (rc != 0) return rc > 0 ? 0 : 2;
    a->stock_cfg = (stock_config){ .redis_url = a->cfg.redis_url, .prefix = a->cfg.key_prefix,
                                   .timeout_ms = a->cfg.redis_timeout_ms };
    a->db_opt = (db_options){ a->cfg.synchronous_full, a->cfg.db_busy_timeout_ms, 0 };
    return audit_main(a, repair);
}

int main(int argc, char **argv) {
    static app a;
    char err[512], where[300];
    if (argc > 1 && !strcmp(argv[1], "audit")) return audit_command(&a, argc, argv);
    int rc = config_load(&a.cfg, argc, argv);
    if (rc != 0) return rc > 0 ? 0 : 2;
    if (a.cfg.verbose) log_set_level(LOG_DEBUG);
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

    if (stock_strategy_parse(a.cfg.strategy, &a.default_strategy) != 0) {
        fprintf(stderr, "flashsale: --strategy: no strategy named '%s' (see --help)\n",
                a.cfg.strategy);
        return 2;
    }
    make_instance_id(&a);
    a.stock_cfg = (stock_config){ .redis_url = a.cfg.redis_url, .prefix = a.cfg.key_prefix,
                                  .timeout_ms = a.cfg.redis_timeout_ms,
                                  .instance = a.instance_id, .idem_ttl_ms = a.cfg.idem_ttl_ms,
                                  .lock_ttl_ms = a.cfg.lock_ttl_ms,
                                  .lock_wait_ms = a.cfg.lock_wait_ms };
    a.db_opt = (db_options){ a.cfg.synchronous_full, a.cfg.db_busy_timeout_ms, 0 };
    /* The lock strategies' clients: one renewing its leases, one not (for
     * products whose injected pause stands for a whole-process pause). */
    const char *urls[1] = { a.cfg.redis_url };
    lock_options lo = { urls, 1, a.cfg.redis_timeout_ms, 1, 0 };
    if (!(a.stock_cfg.locks = lock_client_new(&lo, err, sizeof err))) {
        fprintf(stderr, "flashsale: --redis: %s\n", err);
        return 2;
    }
    lo.watchdog = 0;
    a.stock_cfg.locks_frozen = lock_client_new(&lo, err, sizeof err);
    stock_conn *probe = stock_conn_new(&a.stock_cfg, err, sizeof err);
    if (!probe) {
        fprintf(stderr, "flashsale: --redis: %s\n", err);
        return 2;
    }
    stock_conn_free(probe);
    db *d = db_open(a.cfg.db_path, &a.db_opt, err, sizeof err);
    if (!d) {
        log_msg(LOG_ERROR, "database %s: %s", a.cfg.db_path, err);
        return 1;
    }
    a.products = product_cache_new();
    app_tls_init(&a);
    recover(&a, d);
    db_close(d);

    if (!(a.writer = db_writer_start(a.cfg.db_path, &a.db_opt, 4096, order_batch_done, &a, err,
                                     sizeof err)) ||
        !(a.maint = maint_start(&a, err, sizeof err)) ||
        !(a.health = health_start(&a, err, sizeof err)) ||
        !(a.api = workers_start("fs-api", a.cfg.api_workers, err, sizeof err)) ||
        !(a.stage = stage_start(&a, a.cfg.redis_workers, 0, err, sizeof err)) ||
        !(a.pool = stage_start(&a, a.cfg.lock_workers, 1, err, sizeof err))) {
        log_msg(LOG_ERROR, "start: %s", err);
        return 1;
    }
    http_options ho = { .listen = a.cfg.listen, .threads = a.cfg.threads,
                        .max_connections = a.cfg.max_connections,
                        .max_per_client = a.cfg.max_per_client,
                        .idle_timeout_s = a.cfg.idle_timeout_s,
                        .request_timeout_s = a.cfg.request_timeout_s, .max_body = 64 * 1024,
                        .routes = api_routes, .nroutes = api_nroutes, .observer = api_observe,
                        .ud = &a };
    if (!(a.http = http_start(&ho, err, sizeof err))) {
        log_msg(LOG_ERROR, "start: %s", err);
        return 1;
    }
    rconn_addr ra;
    rconn_parse(a.cfg.redis_url, &ra, err, sizeof err);
    rconn_describe(&ra, where, sizeof where);
    log_msg(LOG_INFO, "listening on %s (port %d), %d HTTP threads, redis %s, db %s, "
            "default strategy %s, instance %s",
            a.cfg.listen, http_port(a.http), a.cfg.threads, where, a.cfg.db_path, a.cfg.strategy,
            a.instance_id);
    if (!a.cfg.admin_token[0])
        log_msg(LOG_WARN, "no --admin-token: the admin endpoints are open to anyone");

    int sig = 0;
    sigwait(&sigs, &sig);
    log_msg(LOG_INFO, "%s: stopping (finishing requests in flight)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    shutdown_gracefully(&a);
    lock_client_free(a.stock_cfg.locks);
    lock_client_free(a.stock_cfg.locks_frozen);
    product_cache_free(a.products);
    log_msg(LOG_INFO, "stopped");
    return 0;
}
