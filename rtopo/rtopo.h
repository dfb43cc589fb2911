/* rtopo.h: where a Redis command must go, on the three topologies the
 * service runs on: one server, a primary watched by Redis Sentinel, and
 * Redis Cluster (production runs Redis replicated, so the service must
 * follow a failover and a reshard). hiredis 0.14 (Debian 12) knows none of them, so
 * the routing is here, as small blocking and reply-parsing pieces that the
 * blocking connections and the event loop's non-blocking one can both use:
 *
 * - Addresses: one URL for each topology (rtopo_parse):
 *     redis://..., unix:...               one server (rconn_parse)
 *     redis-sentinel://[[user]:pw@]host[:port][,host[:port]...]/<master>[?db=N]
 *     redis-cluster://[[user]:pw@]host[:port][,host[:port]...]
 *   The password (and user) are the data nodes'; sentinels are asked
 *   without one. Default ports: 26379 for a sentinel, 6379 for a node.
 * - Cluster: the slot of a key (CRC16 with hash tags), the map slot ->
 *   primary (and replicas) from CLUSTER SLOTS, and the redirections a node
 *   answers (MOVED, ASK, TRYAGAIN, CLUSTERDOWN).
 * - Sentinel: discovery of the primary (each sentinel in turn, the answer
 *   checked with ROLE: a stale sentinel naming a replica is refused), and
 *   the +switch-master message that announces a failover.
 * - rtopo_classify: what an answer means for routing (go elsewhere, try
 *   again, find the primary again, or pass it on).
 * - rtopo_client: a blocking connection that routes by key and follows all
 *   of the above, for tools and tests.
 *
 * Errors are written to a caller-supplied buffer; nothing a server sends
 * makes this module abort. What a function returns, the caller frees with
 * the one matching rtopo_*_free (or hiredis' redisFree/freeReplyObject). */
#ifndef FLASHSALE_RTOPO_H
#define FLASHSALE_RTOPO_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "common/rconn.h"

/* ------------------------------------------------------------- addresses */

typedef enum rtopo_kind { RTOPO_SINGLE, RTOPO_SENTINEL, RTOPO_CLUSTER } rtopo_kind;

#define RTOPO_MAX_SEEDS 16

typedef struct rtopo_spec {
    rtopo_kind kind;
    int nseeds;                        /* >= 1 */
    rconn_addr seeds[RTOPO_MAX_SEEDS]; /* SINGLE: the server; SENTINEL: the
                                          sentinels (no password, db 0);
                                          CLUSTER: nodes to ask for the map */
    char master[128];                  /* SENTINEL: the master's name */
    int db;                            /* SELECTed on data nodes (not CLUSTER) */
    char user[128], password[256];     /* of the data nodes */
} rtopo_spec;

/* Parses any of the three URL forms into *spec. Returns 0, or -1 with a
 * message in err (empty list, bad port, missing master name, a database
 * for a cluster, more than RTOPO_MAX_SEEDS addresses, ...). */
int rtopo_parse(const char *url, rtopo_spec *spec, char *err, size_t errlen);

/* The address of the data node host:port, with spec's user, password and
 * database. host longer than rconn_addr's is cut (it cannot be connected). */
void rtopo_node_addr(const rtopo_spec *spec, const char *host, int port, rconn_addr *out);

/* For logs (never shows the password). Returns buf. */
const char *rtopo_describe(const rtopo_spec *spec, char *buf, size_t len);

/* ------------------------------------------------------- cluster: slots */

#define RTOPO_SLOTS 16384

/* The cluster slot of a key, 0..16383: CRC16 (XMODEM) of the key, or of
 * its hash tag: the bytes between the first '{' and the first '}' after
 * it, when there are any. */
int rtopo_slot(const char *key, size_t len);

/* --------------------------------------------------- cluster: slot map */

typedef struct rtopo_shard {
    rconn_addr primary;               /* with the spec's credentials */
    char id[41];                      /* node id ("" when not told) */
    int nreplicas;
    rconn_addr *replicas;
} rtopo_shard;

typedef struct rtopo_slotmap rtopo_slotmap;

/* An empty map (no slot served), or NULL when out of memory. */
rtopo_slotmap *rtopo_slotmap_new(void);
void rtopo_slotmap_free(rtopo_slotmap *m);

/* (Re)loads m with CLUSTER SLOTS from the first node that answers one:
 * the map's own primaries first, then spec's seeds, each with timeout_ms
 * to connect and to answer. Returns 0; or -1 with err saying why the last
 * node failed, m unchanged. */
int rtopo_slotmap_load(rtopo_slotmap *m, const rtopo_spec *spec, int timeout_ms,
                       char *err, size_t errlen);

/* Replaces m's content with a CLUSTER SLOTS reply r received from the node
 * at asked_host (a node names itself "" when it does not know its own
 * address). For the event loop, which gets r by itself. Returns 0, or -1
 * with a message when r is not a valid answer (m unchanged). */
int rtopo_slotmap_set(rtopo_slotmap *m, const rtopo_spec *spec, const char *asked_host,
                      const redisReply *r, char *err, size_t errlen);

/* The shard serving slot, or NULL when none does (not loaded, a slot
 * unassigned). Valid until m is next changed. */
const rtopo_shard *rtopo_slotmap_lookup(const rtopo_slotmap *m, int slot);

/* Shards (distinct primaries) and slots served, for checks and logs. */
int rtopo_slotmap_nshards(const rtopo_slotmap *m);
const rtopo_shard *rtopo_slotmap_shard(const rtopo_slotmap *m, int i);
int rtopo_slotmap_served(const rtopo_slotmap *m);

/* -------------------------------------------- what an answer means */

typedef enum rtopo_verdict {
    RTOPO_OK,          /* not an error: the answer */
    RTOPO_ERROR,       /* the command's own error: pass it on */
    RTOPO_MOVED,       /* the slot lives elsewhere for good (rd says where) */
    RTOPO_ASK,         /* this one command: ASKING, then again at rd's node */
    RTOPO_TRYAGAIN,    /* keys of a slot in migration are split: retry soon */
    RTOPO_CLUSTERDOWN, /* the cluster cannot serve now: retry later, reload */
    RTOPO_REDISCOVER   /* no answer (r == NULL), READONLY, LOADING,
                          MASTERDOWN: not the primary (now): find it again */
} rtopo_verdict;

typedef struct rtopo_redirect {
    int slot;
    char host[256];
    int port;
} rtopo_redirect;

/* What r (NULL: the connection failed) means for routing. For MOVED and
 * ASK, *rd (when rd is not NULL) gets the slot and the node named; a
 * malformed redirection is RTOPO_ERROR. Only RTOPO_OK and RTOPO_ERROR say
 * the command ran; after NULL it may or may not have. */
rtopo_verdict rtopo_classify(const redisReply *r, rtopo_redirect *rd);

/* Points rd->slot at the primary rd names (a new shard when m does not
 * know it): what a MOVED says. Returns 0, or -1 (out of memory). */
int rtopo_slotmap_moved(rtopo_slotmap *m, const rtopo_spec *spec, const rtopo_redirect *rd);

/* ------------------------------------------ sending again what did not run */

/* The one policy for a command a cluster turned away (a verdict above says
 * it did not run: redirected, refused, or not sent for want of a node). It
 * is sent again, after a pause by verdict, for as long as a failover lasts:
 *
 *   MOVED                       at once (the map knows the new owner)
 *   ASK, TRYAGAIN               after RTOPO_RETRY_SOON_MS: the slot's keys
 *                               are being moved; every script's keys are of
 *                               one slot, so they are all on one side a
 *                               moment later (ASK is not followed)
 *   CLUSTERDOWN, REDISCOVER,    after RTOPO_RETRY_PAUSE_MS: a failover is
 *   a node refused or gone      under way, the map is reloaded meanwhile
 *
 * at most RTOPO_RETRIES times after the first send: the window over the
 * longest pause, so that a command turned away by a failover is answered
 * (by the new primary, or as unavailable) within about the window. The
 * service's connections use it, blocking (stock/stock.c, sk_again) and on
 * the loops (stock/async.c) alike: an order waits as long on either. The
 * tools' client (rtopo_client_run, below) has its own, longer budget. */
#define RTOPO_RETRY_WINDOW_MS 3000  /* a failover: node timeout, then the election */
#define RTOPO_RETRY_PAUSE_MS 100
#define RTOPO_RETRY_SOON_MS 10
#define RTOPO_RETRIES (RTOPO_RETRY_WINDOW_MS / RTOPO_RETRY_PAUSE_MS)

/* The pause before sending again a command that got verdict v, in ms;
 * -1 when v says it ran (RTOPO_OK, RTOPO_ERROR): not to be sent again. */
static inline int rtopo_retry_pause_ms(rtopo_verdict v) {
    switch (v) {
    case RTOPO_MOVED: return 0;
    case RTOPO_ASK:
    case RTOPO_TRYAGAIN: return RTOPO_RETRY_SOON_MS;
    case RTOPO_CLUSTERDOWN:
    case RTOPO_REDISCOVER: return RTOPO_RETRY_PAUSE_MS;
    default: return -1;
    }
}

/* --------------------------------------------------------- sentinel */

/* Finds the primary of spec (RTOPO_SENTINEL): asks each sentinel in turn
 * SENTINEL get-master-addr-by-name, connects to the address named and
 * takes it only when ROLE says master. *primary gets it with spec's
 * credentials and database. timeout_ms bounds each connect and answer.
 * Returns 0, or -1 with err saying what each sentinel answered. */
int rtopo_sentinel_discover(const rtopo_spec *spec, int timeout_ms, rconn_addr *primary,
                            char *err, size_t errlen);

/* Reads a get-master-addr-by-name answer r into *out (with spec's
 * credentials). Returns 0; or -1 with a message (the sentinel does not
 * know the master, or r is not an address). */
int rtopo_sentinel_addr(const redisReply *r, const rtopo_spec *spec, rconn_addr *out,
                        char *err, size_t errlen);

/* Reads a ROLE answer: 1 master, 0 anything else (err says what), -1 not
 * a ROLE answer (err says why). */
int rtopo_role_is_master(const redisReply *r, char *err, size_t errlen);

/* Connects to a and checks with ROLE that it is a master. Returns 0, or
 * -1 with a message (unreachable, a replica, a sentinel, ...). */
int rtopo_check_master(const rconn_addr *a, int timeout_ms, char *err, size_t errlen);

typedef struct rtopo_switch {
    char name[128];
    char old_host[256], new_host[256];
    int old_port, new_port;
} rtopo_switch;

/* A connection to the first of spec's sentinels that answers, subscribed
 * to +switch-master. Free with redisFree. NULL with err when none does. */
redisContext *rtopo_sentinel_subscribe(const rtopo_spec *spec, int timeout_ms, char *err,
                                       size_t errlen);

/* Reads a pub/sub message r: 1 when it is a +switch-master for master
 * name (*sw filled), 0 when it is another message (subscribe confirmation,
 * another master), -1 with err when r is malformed. */
int rtopo_switch_parse(const redisReply *r, const char *name, rtopo_switch *sw, char *err,
                       size_t errlen);

/* Waits up to timeout_ms on c (from rtopo_sentinel_subscribe) for a
 * +switch-master of name. Returns 1 (*sw filled); 0 on timeout, c still
 * usable; -1 with err when c failed (then only redisFree it). */
int rtopo_sentinel_wait_switch(redisContext *c, const char *name, int timeout_ms,
                               rtopo_switch *sw, char *err, size_t errlen);

/* ------------------------------------------------ the primary, watched */

/* Where the primary is, as one process knows it, for every connection of
 * the process to follow: a service's loops, threads and lock clients ask
 * it for the address at each (re)connect, and check its version -- one
 * atomic load -- to learn that the primary moved.
 *
 * SINGLE: the one server, for ever (no thread). SENTINEL: a thread finds
 * the primary (rtopo_sentinel_discover), then listens on a sentinel for
 * +switch-master and asks again at once when it hears one, when a
 * connection reports the primary suspect, and every second anyway (a
 * message is lost with its connection). A connection that still talks to
 * the old primary after a failover (it answers as a master until the
 * sentinels demote it) thus learns of the move within a second, or at
 * once, rather than when the old primary refuses a write. CLUSTER: not a
 * single primary (NULL). */
typedef struct rtopo_primary rtopo_primary;

/* Starts watching spec's primary; for a SENTINEL spec, waits up to
 * timeout_ms for a first answer (the watch goes on without one: an
 * unreachable Sentinel at start is not fatal). NULL with err for a
 * CLUSTER spec, or when out of memory. */
rtopo_primary *rtopo_primary_start(const rtopo_spec *spec, int timeout_ms, char *err,
                                   size_t errlen);
void rtopo_primary_stop(rtopo_primary *p);
/* The primary as last found into *out, and its version: it changes each
 * time the address does; 0 while none was found (*out untouched).
 * Thread-safe. */
unsigned rtopo_primary_get(rtopo_primary *p, rconn_addr *out);
/* The version alone: an atomic load, for checking on a hot path. */
unsigned rtopo_primary_version(const rtopo_primary *p);
/* A connection found the primary of `version` wrong (a refused or failed
 * connection, READONLY, LOADING): ask the sentinels now. Never waits. */
void rtopo_primary_suspect(rtopo_primary *p, unsigned version);
/* Whether p follows a Sentinel (else: one fixed server). */
int rtopo_primary_watched(const rtopo_primary *p);

/* ------------------------------------------------ the cluster, watched */

/* The slot map of a cluster, as one process knows it, for every connection
 * of the process to follow (the counterpart of rtopo_primary for
 * RTOPO_CLUSTER): a thread reloads it every second and when asked; a
 * connection routes a key's slot with rtopo_cluster_route, and checks the
 * version -- one atomic load -- to learn that something moved. */
typedef struct rtopo_cluster rtopo_cluster;

/* Loads spec's slot map once (each node asked with timeout_ms; a cluster
 * that does not answer at start is not fatal: the thread goes on asking)
 * and starts the watch. NULL with err for a spec that is not a cluster's,
 * or when out of memory. */
rtopo_cluster *rtopo_cluster_start(const rtopo_spec *spec, int timeout_ms, char *err,
                                   size_t errlen);
void rtopo_cluster_stop(rtopo_cluster *cl);
/* The primary serving slot into *out, and the map's version; 0 when no
 * map is loaded or no node serves the slot (*out untouched). Thread-safe. */
unsigned rtopo_cluster_route(rtopo_cluster *cl, int slot, rconn_addr *out);
/* The version alone: it changes each time any slot's primary does. */
unsigned rtopo_cluster_version(const rtopo_cluster *cl);
/* A node answered MOVED: rd's slot is now its node's (applied at once),
 * and the whole map is reloaded soon. Never waits. */
void rtopo_cluster_moved(rtopo_cluster *cl, const rtopo_redirect *rd);
/* A node failed or said CLUSTERDOWN: reload the map now. Never waits. */
void rtopo_cluster_suspect(rtopo_cluster *cl);
/* The primaries of the map as "host:port,host:port (n of 16384 slots
 * served)" into buf, for logs; returns the map's version (0: none yet). */
unsigned rtopo_cluster_describe(rtopo_cluster *cl, char *buf, size_t len);
/* Why the last reload failed into buf; returns 0 when it did not. */
int rtopo_cluster_error(rtopo_cluster *cl, char *buf, size_t len);

/* ------------------------------------------------ a routed connection */

typedef struct rtopo_client rtopo_client;

/* A blocking client of spec: connects lazily (finding the primary or
 * loading the slot map on first use). NULL only when out of memory. */
rtopo_client *rtopo_client_new(const rtopo_spec *spec, int timeout_ms);
void rtopo_client_free(rtopo_client *c);

/* The client's retry budget, not RTOPO_RETRIES: it is for tools and
 * tests, which wait out a Sentinel failover too (sentinels must agree the
 * primary is down, then elect; longer than a cluster's) and hold no order
 * while they wait, so it pauses from RTOPO_CLIENT_PAUSE_MS doubling up to
 * RTOPO_CLIENT_PAUSE_MAX_MS, RTOPO_CLIENT_TRIES attempts in all: about 7.7 s
 * of pauses at most, over twice RTOPO_RETRY_WINDOW_MS, so that a test's
 * client does not give up before the service it watches does. */
#define RTOPO_CLIENT_TRIES 16
#define RTOPO_CLIENT_PAUSE_MS 20
#define RTOPO_CLIENT_PAUSE_MAX_MS 640
/* The first five pauses double up to the longest; the others are it. */
_Static_assert(RTOPO_CLIENT_PAUSE_MAX_MS == RTOPO_CLIENT_PAUSE_MS << 5 &&
                   (RTOPO_CLIENT_TRIES - 5) * RTOPO_CLIENT_PAUSE_MAX_MS >= 2 * RTOPO_RETRY_WINDOW_MS,
               "the tools' client must outlast the service's retries (RTOPO_RETRY_WINDOW_MS)");

/* Runs argv on the node that serves key (keylen bytes; key NULL: any
 * primary), following MOVED and ASK, retrying TRYAGAIN, CLUSTERDOWN and
 * what needs rediscovery, up to RTOPO_CLIENT_TRIES attempts. Returns the
 * reply (RTOPO_OK or RTOPO_ERROR: caller frees it with freeReplyObject),
 * or NULL with err. After a connection failed with the command sent, it
 * is not resent (it may have run): NULL, err says so. */
redisReply *rtopo_client_run(rtopo_client *c, const char *key, size_t keylen, int argc,
                             const char **argv, const size_t *argvlen, char *err,
                             size_t errlen);

#endif
