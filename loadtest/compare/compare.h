/* compare.h: `flashload compare` -- every strategy the service offers,
 * side by side: the matrix of scenes run in processes of its own
 * (compare.c, world.c), the "choosing a lock" table with its fault probes
 * (probe.c), the table as printed, report.json and the self-contained
 * report.html (report.c). */
#ifndef FLASHSALE_LOADTEST_COMPARE_H
#define FLASHSALE_LOADTEST_COMPARE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loadtest/client/client.h"
#include "loadtest/compare/scene.h"
#include "loadtest/fl.h"

/* One measurement of a lock under a fault, for the "choosing a lock" table. */
typedef struct fl_probe {
    int ran;                     /* 0: not measured; note says why (n/a, skipped) */
    char note[300];              /* what happened, in words */
    int64_t down_ms;             /* the server did not serve for this long */
    int64_t refused_ms;          /* from the fault to the last refused answer (0: none) */
    int64_t recover_ms;          /* server back (or holder killed) -> next 201; -1: none */
    int still_refusing;          /* refused answers went on to the end of the probe */
    int64_t waited_ms;           /* the probe's load went on this long after the server was back */
    uint64_t ok, refused;        /* 201s, and 429/5xx/transport errors, from the fault on */
    uint64_t fenced;             /* refusals by the fence */
    long long oversold, lost;
    int pass;                    /* the verifier's verdict */
} fl_probe;

#define FL_LOCK_ROWS 10

/* A row of the "choosing a lock" table: one lock, measured in this run. */
typedef struct fl_lock_row {
    char strategy[32];           /* a name of LOCKS (probe.c): lock ... local */
    char server[200];            /* what its lock server is, in words */
    int have1, have8;            /* its contention scenes ran */
    double ops1, ops8;           /* orders/s with 1 and 8 segments */
    uint64_t p50_us, p99_us;     /* 1 segment */
    uint64_t p50_8_us, p99_8_us; /* 8 segments */
    uint64_t handoff_n;          /* hand-offs timed in the 1-segment scene */
    double handoff_mean_us, handoff_p50_us;
    fl_probe kill;               /* the holder killed (SIGKILL) mid-critical-section */
    fl_probe restart;            /* its lock server restarted mid-run, data kept */
    fl_probe wipe;               /* its lock server restarted empty mid-run */
    fl_probe fence;              /* a pause longer than the lease (the pause scene) */
    fl_probe failover;           /* its Redis failed over to a replica that missed the lock */
    /* The fairness scenes ([0] queue, [1] stream): ran, pairs served
     * against arrival order of all pairs, buyers starved, longest wait. */
    int fair_have[2];
    long fair_oo[2], fair_pairs[2];
    int fair_starved[2];
    double fair_wait_max_ms[2];
} fl_lock_row;

typedef struct fl_compare_opts {
    char strategies[16][32];     /* empty: every strategy the service lists */
    int nstrategies;
    int segments[8];
    int nsegments;
    int two_instances;           /* add the two-instance scenes */
    double duration_s;           /* per scene */
    double pause_duration_s;     /* per scene run under an injected pause */
    int connections;
    int threads;
    uint32_t users;
    int qty_min, qty_max;
    long long stock;             /* of the scenes without a pause */
    long long pause_stock;       /* of the scenes under an injected pause */
    int contention;              /* the ordinary contention group */
    int forced;                  /* the forced interleavings group */
    int between_hosts;           /* the between-hosts group (root; off by default) */
    char hosts_script[400];      /* "" : tools/hosts_scene.py of the service's tree */
    unsigned between_only;       /* bit per fl_between to run (0: every one) */
    int probes;                  /* measure the lock table's fault columns */
    int lock_servers;            /* start Redlock's, ZooKeeper and etcd (own services only) */
    int redis_failures;          /* the Redis failures group (own services only) */
    int holds;                   /* the holds group */
    int fairness;                /* the fairness group */
    int crowd;                   /* the crowd group: a sale past capacity, room off and on */
    int crowd_buyers;            /* ...its buyers (its units a tenth of them) */
    int hold_seconds;            /* of its products */
    double holds_duration_s;     /* per scene of the holds group */
    long long holds_stock;       /* of its products: sold out, returned, resold */
    char etcd_bin[300];          /* "" : etcd from PATH */
    char java_bin[300];          /* "" : java from PATH (ZooKeeper) */
    char out_dir[400];
    char service_bin[400];
    /* Existing services instead of our own. */
    fl_target targets[FL_MAX_TARGETS];
    int ntargets;
    char token[256];
    char redis_url[512];
    char key_prefix[64];
    char db_path[512];
    int progress;                /* per-second lines during each scene */
    const atomic_int *interrupted;
} fl_compare_opts;

void fl_compare_opts_default(fl_compare_opts *o);
/* Builds the matrix of scenes over the strategies st[0..nst) (as the
 * service lists them). Returns how many (at most max). */
int fl_compare_scenes(const fl_compare_opts *o, const fl_strategy *st, int nst, fl_scene *out,
                      int max);
/* Runs every scene, prints the table, writes report.json and report.html
 * into o->out_dir. Returns 0 when every scene came out as expected, 1 when
 * one did not, -1 with e set on a setup failure. */
int fl_compare(const fl_compare_opts *o, fl_err *e);
/* The table, as printed, then what each Redis failure scene did and how
 * the holds scenes' holds ended. */
void fl_compare_table(const fl_scene_result *r, int n, FILE *f);
/* The "choosing a lock" table, as printed. */
void fl_lock_table(const fl_lock_row *l, int n, FILE *f);
/* A lock row's fairness cell ("in order", or the pairs out of order of its
 * queue and stream scenes). */
void fl_fair_fmt(const fl_lock_row *r, char *out, size_t len);
/* Formats a probe's outcome in one short line ("n/a: ..." when not run). */
void fl_probe_fmt(const fl_probe *p, int kind, char *out, size_t len);
enum { FL_PROBE_KILL, FL_PROBE_RESTART, FL_PROBE_WIPE, FL_PROBE_FENCE, FL_PROBE_FAILOVER };
/* report.json and report.html. Return 0 or -1 with e set. */
int fl_report_json(const fl_compare_opts *o, const fl_scene_result *r, int n,
                   const fl_lock_row *l, int nl, const char *path, fl_err *e);
int fl_report_html(const fl_compare_opts *o, const fl_scene_result *r, int n,
                   const fl_lock_row *l, int nl, const char *path, fl_err *e);

#endif
