/* async_int.h: what the stock module's loop-side files share (async.c,
 * lockasync.c); private to stock/. */
#ifndef FLASHSALE_STOCK_ASYNC_INT_H
#define FLASHSALE_STOCK_ASYNC_INT_H

#include "common/aconn.h"
#include "stock/stock.h"

/* Work waiting for the connection to be ready (async.c). */
struct job;
struct rtopo_cluster;

/* One Redis node this loop talks to: the one server (or primary), or, on
 * a cluster, each primary a SKU of this loop's orders lives on. */
typedef struct sk_anode {
    struct stock_async *sa;
    rconn_addr addr;
    aconn *conn;
    struct job *held, *held_tail;      /* waiting for conn to be ready */
} sk_anode;

struct stock_async {
    struct loop *l;
    aconn *conn;                       /* one server: nodes[0]'s; a cluster: NULL */
    struct rtopo_cluster *cluster;     /* a cluster: nodes by slot; NULL: one node */
    sk_anode **nodes;
    int nnodes;
    unsigned route_version;            /* the cluster map's version route[] is of */
    int16_t *route;                    /* slot -> index in nodes (-1: not looked up) */
    struct job *waiting;               /* cluster: jobs to send again after a pause */
    struct lane_clears *lclears;       /* spread products' committed orders, by lane, whose
                                          pending records the lane's next batch (or the end
                                          of this loop turn) clears */
    int nlclears, lclears_dirty;
    int timeout_ms;
    struct rtopo_primary *primary;     /* where the primary is; NULL: one fixed server */
    unsigned version;                  /* primary's version conn was pointed at */
    int stale;                         /* a reply said: not the primary (now) */
    char prefix[STOCK_PREFIX_MAX + 1];
    char instance[STOCK_INSTANCE_MAX + 1];
    long long idem_ttl_ms;
    int fair_lease_ms;                 /* fair-lock: a place in line lasts this long */
    uint64_t rng;
    uint64_t owner_base, owner_seq;    /* lock owner ids (lockasync.c) */
    rconn_cmd cmd;
    stock_call_observer *observe;
    void *observe_ud;
    char errstr[256];
};

/* Points the connection at the primary if it moved, or if a reply said
 * the server is not it (sa->stale): called before each operation (one
 * atomic load when nothing changed). async.c. */
void sk_async_follow(stock_async *sa);
/* A reply that says the server is not the primary (now) makes the next
 * operation look for it again. */
void sk_async_check_reply(stock_async *sa, const redisReply *r);

/* A call of another file (lockasync.c) through this loop's nodes, as the
 * reservations go: to the node p's keys are on (on a cluster, the primary
 * serving p's slot), held until that connection is ready, and sent again
 * where a cluster says when it answers MOVED, ASK, TRYAGAIN or CLUSTERDOWN
 * (the call did not run). build writes the command into sa->cmd for conn
 * (its run_id is that node's), at each send; reply gets the answer, or
 * NULL with sent = whether the command may have run. async.c. */
typedef void sk_call_build(stock_async *sa, aconn *conn, void *ud);
typedef void sk_call_reply(void *ud, redisReply *r, int sent);
void sk_async_call(stock_async *sa, const stock_product *p, stock_call call, sk_call_build *build,
                   sk_call_reply *reply, void *ud);

#endif
