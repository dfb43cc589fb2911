/* config.h: the service's configuration, from flags and environment. */
#ifndef FLASHSALE_SERVICE_CONFIG_H
#define FLASHSALE_SERVICE_CONFIG_H

#include "common/cpus.h"
#include "stock/stock.h"

/* Room for the longest value of a lock server's flag (its row's value_max). */
#define SVC_LOCK_URLS_MAX 2048

typedef struct svc_config {
    char listen[128];
    char redis_url[512];
    char db_path[512];
    char strategy[32];
    char admin_token[256];
    char room_secret[129];    /* waiting-room tickets' secret ("": kept in Redis) */
    int room_order_wait_ms;   /* an order out of its turn waits this long for it */
    char key_prefix[64];
    /* each lock server's flag's value, by stock_lock_server ("": not configured;
     * always "" for those without a flag): its row says what it takes */
    char lock_urls[STOCK_LOCKS_COUNT][SVC_LOCK_URLS_MAX];
    int threads;              /* HTTP event-loop threads */
    cpus_info cpus;           /* the CPUs it may use (a container's quota): threads 0 */
    int redis_timeout_ms;
    int db_busy_timeout_ms;
    int db_commit_timeout_ms;
    int db_max_connections;   /* the instance's database connections at most */
    int db_connection_wait_ms;   /* how long a part waits for one of them */
    int db_start_wait_ms;     /* PostgreSQL: how long start keeps trying to open it */
    int commit_gap_us;        /* the committer's pacing (db_writer_pace) */
    int synchronous_full;
    unsigned max_connections;
    unsigned max_per_client;  /* connections one client address may hold (0: no cap) */
    unsigned conn_memory_kib; /* libmicrohttpd's memory per connection */
    unsigned idle_timeout_s;
    unsigned request_timeout_s;   /* a started request must be in within this */
    unsigned request_timeout_ms;  /* the same, set by svc_config_load; an embedder (the
                                   * request fuzzer) may make it finer after that */
    int max_inflight;         /* orders in the order path at once (0: adaptive) */
    int latency_target_ms;    /* the adaptive limit's target: p90 of the time in the path */
    int api_workers;          /* threads in each API pool (Redis work; SQLite-only work) */
    long long pending_timeout_ms;   /* a reservation older than this is settled */
    long long returned_keep_ms;     /* return markers are kept this long (see holds.c) */
    int soldout_cache_ms;           /* a "sold out" is remembered this long (0: never) */
    int product_cache_ms;           /* a product read is answered again this long */
    long long idem_ttl_ms;
    int shutdown_grace_ms;
    int lock_ttl_ms;          /* default lease of the lock strategies */
    int lock_wait_ms;         /* how long an order waits for a lock */
    int lock_workers;         /* threads that run the blocking strategies */
    int fault_injection;      /* products may set cs_delay_ms and lock_ttl_ms */
    int insecure_admin;       /* open admin endpoints on a non-loopback address */
    int verbose;
} svc_config;

/* Fills c from defaults, then environment (FLASHSALE_*), then argv. Returns
 * 0 to run, 1 when --help or --version was printed, -1 on a usage error
 * (printed). */
int svc_config_load(svc_config *c, int argc, char **argv);

#endif
