/* cluster_int.h: the verifier's own way around a Redis Cluster (cluster.c),
 * used by stores.c only. Not part of stores.h: the reader's insides.
 *
 * flashload judges the service, so it shares no routing code with it
 * (rtopo/, stock/): this is a separate, deliberately plain client that asks
 * the cluster where a SKU lives instead of computing it. */
#ifndef FLASHSALE_CLUSTER_INT_H
#define FLASHSALE_CLUSTER_INT_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "loadtest/stores/stores.h"

#define FL_CLUSTER_SCHEME "redis-cluster://"

typedef struct fl_cluster fl_cluster;

/* Parses "redis-cluster://[[user]:pw@]host[:port][,host[:port]...][/]"
 * (port 6379 when left out; no database: a cluster has only database 0)
 * into a handle that connects on first use, with connect and command
 * timeouts of timeout_ms. NULL with a message saying what is wrong in err. */
fl_cluster *fl_cluster_open(const char *url, int timeout_ms, char *err, size_t errlen);
void fl_cluster_close(fl_cluster *c);

/* Runs argv (argc arguments, every key of it carrying the hash tag {sku};
 * sku may be a spread product's lane, "<sku>:<i>")
 * on the node that serves sku's slot: the node last seen serving sku, else
 * the first seed that answers; then follows what the cluster answers:
 * MOVED (go there, resend, remember it for sku), ASK (ASKING and the
 * command on that node, this once), TRYAGAIN and CLUSTERDOWN (wait 50 ms,
 * resend; 40 sends in all at most), a connection error (drop the node,
 * start again from the next seed; every seed once at most).
 *
 * Returns the first reply that is not a redirection -- an error reply
 * included, which is the caller's to judge -- and points *run_id at the
 * run_id (INFO server, read when the connection opened) of the node that
 * sent it, valid until the next call. NULL with err set when no node
 * answered within those bounds. */
redisReply *fl_cluster_call(fl_cluster *c, const char *sku, int argc, const char **argv,
                            const char **run_id, char *err, size_t errlen);

/* Where the last answer came from and the redirections followed so far. */
void fl_cluster_route(const fl_cluster *c, fl_redis_route *out);

#endif
