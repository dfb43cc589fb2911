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

#endif
