/* compare_int.h: what the files of `flashload compare` share, private to
 * loadtest/compare/: the world of processes a comparison runs in (world.c), a
 * scene's result (scene.c), the probes' entry points (probe.c), the Redis
 * failures group's (failures.c, topo.c), the between-hosts group's
 * (hosts.c). Nothing outside loadtest/compare/ includes it.
 *
 * The files call downwards only, in this order: compare.c; report.c and
 * probe.c; world.c (which starts the failures group's processes);
 * failures.c and hosts.c; scene.c. */
#ifndef FLASHSALE_LOADTEST_COMPARE_INT_H
#define FLASHSALE_LOADTEST_COMPARE_INT_H
#include "loadtest/compare/compare.h"
#include "loadtest/procs.h"
#include "loadtest/run.h"

#define FL_REDLOCK_N 3

/* The article the comparison's locks answer, as the table and the report
 * name it: Alibaba Cloud's community blog post on distributed locks. Its
 * 3.2.1 is the database's pessimistic lock (SELECT ... FOR UPDATE); its
 * 4.2, the Redis failures that break a Redis lock and RedLock (a failover,
 * an AOF second lost, a clock jump: the Redis failures group); its 6.1,
 * what a distributed lock must have, fairness among it (the fairness
 * group). */
#define FL_LOCK_ARTICLE "\"Implementation Principles and Best Practices of Distributed Lock\""

/* A lock server of the comparison: one process, or Redlock's three. */
typedef struct fl_lockserver {
    const char *strategy;        /* the strategy it serves */
    fl_proc p[FL_REDLOCK_N];
    int n;
    int state;                   /* 0 spawned, 1 serving, -1 could not start */
    char why[300];               /* -1: why */
} fl_lockserver;

enum { FL_LS_REDLOCK, FL_LS_ZOOKEEPER, FL_LS_ETCD, FL_LS_COUNT };

/* The comparison's progress, for the lines a user watches: everything
 * planned (scenes, probes) weighs the seconds it is expected to take; the
 * time left is the time so far scaled by the weight still to run, so a
 * slow machine's estimate slows with it. */
typedef struct fl_eta {
    int64_t t0_ms;
    double planned, done;
} fl_eta;
/* Counts weight as done and writes "1:23 elapsed, about 2:05 left" into
 * out (world.c). */
void fl_eta_step(fl_eta *e, double weight, char *out, size_t len);
/* The expected seconds of a probe of the lock table (probe.c). */
#define FL_ETA_PROBE_KILL 2.2
#define FL_ETA_PROBE_SERVER 3.5

/* The Redis failures group's own processes (failures.c). */
typedef struct fl_failworld fl_failworld;

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
    fl_failworld *fail;          /* the Redis failures group's world (NULL: none) */
    fl_eta eta;
} fl_world;

/* ------------------------------------------------------ the world (world.c) */

/* Sets up w for o: the services o names (o->targets), or our own in a temp
 * dir -- a redis-server, the lock servers when a strategy wanted needs
 * one, the Redis failures group's processes when failures (started now,
 * used last: their sentinels learn of each other meanwhile), and the
 * first instance of the service. 0, or -1 with e set; fl_world_down
 * either way. */
int fl_world_up(const fl_compare_opts *o, fl_world *w, int failures, fl_err *e);
/* Stops every process of w and removes its temp dir (keep: keeps it, for
 * its logs, and says where). */
void fl_world_down(fl_world *w, int keep);
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

/* Fills a scene's figures and verdict from its run (scene.c). */
void fl_scene_fill(fl_scene_result *res, const fl_run_result *rr);

/* ------------------------------------------- the Redis failures (failures.c) */

/* Starts the group's processes in dir/failures without waiting for them
 * (the sentinels take seconds to learn of each other): two primaries with
 * a replica each and three sentinels watching both, Redlock's two plain
 * servers (one under bin/libclockjump.so when it is there); the service starts
 * when the group first runs, on db (a PostgreSQL URL; NULL or "": a SQLite
 * file of its own). NULL: out of memory. A failure to start is
 * kept and said when the group runs. */
fl_failworld *fl_failures_spawn(const char *dir, const char *service_bin, const char *db);
/* Stops every process of f (NULL: nothing). Frees f. */
void fl_failures_down(fl_failworld *f);
/* Waits (once) until f serves; 0, or -1 with why filled. */
int fl_failures_ready(fl_failworld *f, const fl_compare_opts *o, char *why, size_t len);
/* Runs res[0..n), scenes of one kind of failure (res[0].sc.failure), all
 * under one fault, each with its own product; fills each result (ran, or a
 * skip note). */
void fl_failures_run(fl_failworld *f, const fl_compare_opts *o, const char *tag,
                     fl_scene_result *res, int n);

/* ------------------------------------------------ between hosts (hosts.c) */

/* Runs res's scene (FL_GROUP_HOSTS) on a deployment of its own, through
 * o->hosts_script (tools/hosts_scene.py beside bin/ by default), and fills
 * res: ran, or a skip note (not root, no script, no result). */
void fl_hosts_run(const fl_compare_opts *o, fl_scene_result *res);

/* ------------------------------------------------------ fairness (fairness.c) */

/* Makes sc (strategy and instances set) the fairness scene kind
 * (FL_FAIR_QUEUE or FL_FAIR_STREAM): its buyers, gap, hold, condition. */
void fl_fair_scene_setup(fl_scene *sc, int kind);
/* Runs res's fairness scene on w's first res->sc.instances services with a
 * product sku of its own, and fills res (figures, verdict, as_expected).
 * 0, or -1 with e set (the product could not be made: not run). */
int fl_fair_run(const fl_world *w, const char *sku, fl_scene_result *res, fl_err *e);

/* ------------------------------------------------- Redis, asked (topo.c) */

struct redisReply;
/* One command on a fresh connection to 127.0.0.1:port, timeout_ms for the
 * connect and the reply. The reply (freeReplyObject), or NULL with e set
 * (unreachable, or an error reply). */
struct redisReply *fl_rcmd(int port, int timeout_ms, fl_err *e, const char *fmt, ...);
/* GET key at port: 1 with its value in out, 0 when absent, -1 unreachable. */
int fl_rget(int port, const char *key, char *out, size_t len);
/* Whether the server at port says (ROLE) it is a primary. */
int fl_is_master(int port);
/* Whether the server at port replicates primary with its link up: 1, 0,
 * or -1 when it does not answer. */
int fl_replica_of(int port, int primary);
/* The port every live sentinel of s[0..n) names for master name; 0 when
 * they disagree or one does not answer. */
int fl_sentinel_master(const fl_proc *s, int n, const char *name);
/* Whether each sentinel knows the n - 1 others and exactly `replicas`
 * replicas of name in good health (flags "slave"). */
int fl_sentinels_know(const fl_proc *s, int n, const char *name, int replicas);
/* Cuts replica off from primary: nothing written to primary from now on
 * reaches it (topo.c says how). 0, or -1 with e set. */
int fl_replica_cut(int primary, int replica, fl_err *e);
/* SENTINEL FAILOVER name at the sentinel on port: a failover now, without
 * the sentinels' agreement that the primary is down. Retried for
 * timeout_ms while refused; 0 (or one in progress already), or -1 with e. */
int fl_sentinel_failover(int sentinel, const char *name, int timeout_ms, fl_err *e);
/* WAIT: until a replica has every write made so far; 0, or -1 with e set. */
int fl_replica_wait(int primary, int timeout_ms, fl_err *e);

#endif
