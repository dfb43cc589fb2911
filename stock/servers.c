/* servers.c: the one table of lock servers, a row per server.
 *
 * A lock server's facts were spread over the service (its flag, its hint,
 * its start-up, its place in GET /v1/strategies) and the stock module (the
 * enum, whether its failure is Redis's). They live here, one row each, so
 * adding a lock server is a name in stock.h's stock_lock_server, a row
 * below, and its backend in lock/; everything else reads the row. The
 * strategies name the server they need in their own table (stock.c). */
#include "stock/stock.h"

#include <assert.h>
#include <stddef.h>

static const char *const REDIS_SCHEMES[] = { "redis://", "unix:", "redis-sentinel://", NULL };
static const char *const ZK_SCHEMES[] = { "zk://", NULL };
static const char *const ETCD_SCHEMES[] = { "etcd://", NULL };

static const stock_lock_server_info SERVERS[STOCK_LOCKS_COUNT] = {
    [STOCK_LOCKS_NONE] = { .name = "none" },
    [STOCK_LOCKS_REDIS] = { .name = "redis", .client = 1, .own_redis = 1, .frozen = 1 },
    [STOCK_LOCKS_REDLOCK] = {
        .name = "redlock",
        .flag = "--redlock",
        .env = "FLASHSALE_REDLOCK",
        .help = "Redis URLs of the `redlock` strategy's servers, comma-separated: an odd number "
                "(3, 5) of independent redis-servers, not the --redis one; empty: `redlock` is "
                "unavailable",
        .hint = "start flashsale with --redlock URL,URL,URL (independent redis-servers)",
        .schemes = REDIS_SCHEMES,
        .form = "a redis://, unix: or redis-sentinel:// URL",
        .majority = "an odd number (3, 5, ...) of independent Redis URLs, comma-separated",
        .value_max = 2047,
        .client = 1,
        .frozen = 1,
    },
    [STOCK_LOCKS_ZOOKEEPER] = {
        .name = "zookeeper",
        .flag = "--zookeeper",
        .env = "FLASHSALE_ZOOKEEPER",
        .help = "zk://host:port[,host:port...][/base] of the `zookeeper` strategy's ensemble "
                "(base default /locks); empty: `zookeeper` is unavailable",
        .hint = "start flashsale with --zookeeper zk://host:port",
        .schemes = ZK_SCHEMES,
        .form = "a zk://host:port[/base] URL",
        .value_max = 1023,
        .client = 1,
        /* No client renewing nothing: the library keeps the session alive
         * on its own threads, which a pause of the caller's does not stop. */
        .frozen = 0,
    },
    [STOCK_LOCKS_ETCD] = {
        .name = "etcd",
        .flag = "--etcd",
        .env = "FLASHSALE_ETCD",
        .help = "etcd://host:port[,host:port...][/prefix] of the `etcd` strategy's cluster; "
                "empty: `etcd` is unavailable",
        .hint = "start flashsale with --etcd etcd://host:port",
        .schemes = ETCD_SCHEMES,
        .form = "an etcd://host:port[/prefix] URL",
        .value_max = 1023,
        .client = 1,
        .frozen = 1,
    },
    [STOCK_LOCKS_DB] = { .name = "db" },      /* the db-lock table: stock_config.db_pool */
    [STOCK_LOCKS_REDIS_FAIR] = { .name = "redis-fair", .client = 1, .own_redis = 1, .fair = 1,
                                 .frozen = 1 },
};

const stock_lock_server_info *stock_lock_server_about(stock_lock_server srv) {
    assert((unsigned)srv < STOCK_LOCKS_COUNT);
    const stock_lock_server_info *li = &SERVERS[srv];
    /* A server with a flag takes URLs of known schemes and says how; one
     * without is always there. */
    assert(!li->flag ||
           (li->env && li->help && li->hint && li->schemes && li->form && li->value_max > 0));
    assert(!(li->flag && li->own_redis));
    return li;
}
