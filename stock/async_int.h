/* async_int.h: what the stock module's loop-side files share (async.c,
 * lockasync.c); private to stock/. */
#ifndef FLASHSALE_STOCK_ASYNC_INT_H
#define FLASHSALE_STOCK_ASYNC_INT_H

#include "common/aconn.h"
#include "stock/stock.h"

/* Work waiting for the connection to be ready (async.c). */
struct job;

struct stock_async {
    struct loop *l;
    aconn *conn;
    struct rtopo_primary *primary;     /* where the primary is; NULL: one fixed server */
    unsigned version;                  /* primary's version conn was pointed at */
    int stale;                         /* a reply said: not the primary (now) */
    char prefix[64];
    char instance[128];
    long long idem_ttl_ms;
    uint64_t rng;
    uint64_t owner_base, owner_seq;    /* lock owner ids (lockasync.c) */
    rconn_cmd cmd;
    struct job *held, *held_tail;
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

#endif
