/* compare_int.h: what compare.c and probe.c share, private to loadtest/:
 * the world of processes a comparison runs in, and the probes' entry
 * points. Nothing outside loadtest/ includes it. */
#ifndef FLASHSALE_LOADTEST_COMPARE_INT_H
#define FLASHSALE_LOADTEST_COMPARE_INT_H
#include "loadtest/loadtest.h"

#define FL_REDLOCK_N 3

/* A lock server of the comparison: one process, or Redlock's three. */
typedef struct fl_lockserver {
    const char *strategy;        /* the strategy it serves */
    fl_proc p[FL_REDLOCK_N];
    int n;
    int state;                   /* 0 spawned, 1 serving, -1 could not start */
    char why[300];               /* -1: why */
} fl_lockserver;

enum { FL_LS_REDLOCK, FL_LS_ZOOKEEPER, FL_LS_ETCD, FL_LS_COUNT };

typedef struct fl_world {
    char dir[256];               /* our temp dir ("" : services given) */
    fl_proc redis;
    fl_proc svc[2];
    int nsvc;
    fl_lockserver ls[FL_LS_COUNT];
    int lock_servers;            /* we started them */
    const char *svc_args[32];    /* the services' extra flags (pointing into args) */
    char args[4][600];
    fl_target targets[FL_MAX_TARGETS];
    int ntargets;
    char redis_url[512];
    char db_path[512];
    char key_prefix[64];
    char token[256];
    char service_bin[400];
} fl_world;

/* The lock server strategy needs, or NULL (lock: the service's Redis;
 * db-lock: its SQLite file; local: none). */
fl_lockserver *fl_world_server(fl_world *w, const char *strategy);
/* Waits (once) until strategy's lock server serves. 0, or -1 with why
 * filled ("zookeeper could not start: ..."). */
int fl_world_ready(fl_world *w, const char *strategy, char *why, size_t len);
/* Starts one more instance of the service (w->svc[w->nsvc]). */
int fl_world_add_instance(fl_world *w, fl_err *e);

/* Fills the lock table from the scenes and, when o->probes, runs the
 * fault probes against w (may kill and restart w's second instance and
 * restart its servers). */
int fl_lock_rows(const fl_compare_opts *o, fl_world *w, const char *tag,
                 const fl_strategy *st, int nst, const fl_scene_result *r, int n,
                 fl_lock_row *rows);

#endif
