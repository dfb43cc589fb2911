/* procs.h: the processes flashload starts and stops -- private
 * redis-servers and flashsale instances, the lock servers (Redlock's
 * redis-servers with an append-only file, ZooKeeper, etcd), and for the
 * Redis failures: Sentinel-watched redis-servers, a redis-server whose wall
 * clock can jump (bin/libclockjump.so, clockjump.c), a crash that loses
 * the end of an append-only file (procs.c). */
#ifndef FLASHSALE_LOADTEST_PROCS_H
#define FLASHSALE_LOADTEST_PROCS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "loadtest/fl.h"

/* What a process we start is; a server knows how to come back. */
typedef enum fl_proc_kind {
    FL_PROC_SERVICE = 0,
    FL_PROC_REDIS,               /* no persistence: what the service's Redis is */
    FL_PROC_REDIS_AOF,           /* append-only file: a Redlock server keeps its counters */
    FL_PROC_ZOOKEEPER,           /* standalone, Debian's zookeeper on a JRE */
    FL_PROC_ETCD,                /* single member, Debian's etcd-server */
    FL_PROC_REDIS_NODE,          /* from <dir>/redis.conf: a primary or replica a Sentinel watches */
    FL_PROC_SENTINEL             /* `redis-server <dir>/redis.conf --sentinel` */
} fl_proc_kind;

typedef struct fl_proc {
    pid_t pid;
    int port;
    int peer_port;               /* etcd's peer port (0: none) */
    fl_proc_kind kind;
    char dir[400];               /* a server's own directory (its data under it) */
    char bin[300];               /* the program, when not the usual one */
    char url[128];               /* redis://..., http://..., zk://..., etcd://... */
    char log[600];
    char clockjump[400];         /* FL_PROC_REDIS_AOF under bin/libclockjump.so: its offset file ("" none) */
} fl_proc;

/* A free TCP port on 127.0.0.1, or -1. */
int fl_free_port(void);
/* Starts redis-server (no persistence) in dir on a free port and waits for
 * it to answer. Returns 0 or -1 with e set. */
int fl_redis_start(const char *dir, fl_proc *p, fl_err *e);
/* Starts a lock server of kind (FL_PROC_REDIS_AOF, FL_PROC_ZOOKEEPER,
 * FL_PROC_ETCD) with its files in dir (made if absent) on free ports, and
 * bin instead of the usual program (redis-server, java, etcd) unless NULL,
 * returns at once: fl_proc_wait says when it serves, so several can start
 * side by side. Returns 0 or -1 with e set (p->pid is then 0). */
int fl_server_spawn(fl_proc_kind kind, const char *dir, const char *bin, fl_proc *p,
                    fl_err *e);
/* Waits up to timeout_ms until p serves (ZooKeeper: answers ruok; etcd: a
 * range read; Redis: accepts). On failure stops it; -1 with e set. */
int fl_proc_wait(fl_proc *p, int timeout_ms, fl_err *e);
/* Takes server p down and brings it back on the same port(s). wipe 0: a
 * restart that keeps its data (Redis without persistence is made to SAVE
 * first); wipe 1: killed with SIGKILL and started with its data directory
 * emptied: a server that lost its data. *down_ms gets how long it did not
 * serve. Returns 0, or -1 with e set (it is then down). */
int fl_server_restart(fl_proc *p, int wipe, int64_t *down_ms, fl_err *e);
/* Starts `bin --listen 127.0.0.1:<free> --redis url --db db_path` plus the
 * extra NULL-terminated args, logging to dir, and waits until it accepts. */
int fl_service_start(const char *bin, const char *dir, const char *redis_url,
                     const char *db_path, const char *const *extra, fl_proc *p, fl_err *e);
/* Restarts the n servers p[0..n) together (all down, then all up), as
 * fl_server_restart does one: Redlock's servers as one lock service. */
int fl_servers_restart(fl_proc *p, int n, int wipe, int64_t *down_ms, fl_err *e);
/* Starts a redis-server (FL_PROC_REDIS_NODE: no persistence, a full sync
 * without delay) or a sentinel (FL_PROC_SENTINEL) from <dir>/redis.conf,
 * written here (port, bind 127.0.0.1, dir) followed by the lines of extra
 * ("replicaof ...\n", "sentinel monitor ...\n"; NULL: none), on a free
 * port; returns at once (fl_proc_wait). A restart reads the same file, as
 * the sentinel rewrote it. Returns 0, or -1 with e set. */
int fl_conf_spawn(fl_proc_kind kind, const char *dir, const char *extra, fl_proc *p,
                  fl_err *e);
/* bin/libclockjump.so, the LD_PRELOAD shim next to this program
 * (loadtest/clockjump.c), into out; 0, or -1 with e set when it is not there. */
int fl_clockjump_lib(char *out, size_t len, fl_err *e);
/* Starts a redis-server with an append-only file, as fl_server_spawn's
 * FL_PROC_REDIS_AOF, under bin/libclockjump.so: its wall clock is the real
 * one plus the offset in file (created, or set, at 0 here), read at every
 * call, so fl_clockjump_set moves it at once; its monotonic clock is left
 * alone. Returns at once; 0, or -1 with e set (no shim: say so). */
int fl_clockjump_spawn(const char *dir, const char *file, fl_proc *p, fl_err *e);
/* Sets the offset of such a clock to secs seconds, in one store a reader
 * sees whole. 0, or -1 with e set. */
int fl_clockjump_set(const char *file, int64_t secs, fl_err *e);
/* Starts p again where it ran (port, files, settings), after it was killed
 * or stopped, and waits until it serves. 0, or -1 with e set. */
int fl_server_start_again(fl_proc *p, fl_err *e);

/* Where a server's append-only file ended at a moment. */
typedef struct fl_aof_mark {
    char path[600];              /* its newest incremental file (Redis 7: appendonlydir/) */
    long long size;
    int64_t at_ms;               /* when (monotonic) */
} fl_aof_mark;

/* Marks where p's (FL_PROC_REDIS_AOF) append-only file ends now. */
int fl_aof_mark_take(const fl_proc *p, fl_aof_mark *m, fl_err *e);
/* A crash of the machines of p[0..n) with `appendfsync everysec`: each is
 * killed with SIGKILL, its append-only file cut back to its mark (what an
 * OS crash or power loss leaves when the last writes had not reached the
 * disk: a killed process alone loses nothing, its writes are in the page
 * cache), then started again on its port. *down_ms: how long. 0, or -1
 * with e set. */
int fl_servers_crash(fl_proc *p, int n, const fl_aof_mark *m, int64_t *down_ms, fl_err *e);
/* SIGTERM, then SIGKILL after timeout_ms; reaps it. Safe on a zero pid. */
void fl_proc_stop(fl_proc *p, int timeout_ms);
/* SIGKILL now, and reaps it. Safe on a zero pid. */
void fl_proc_kill(fl_proc *p);
/* Removes a directory tree made by us (best effort). */
void fl_rmtree(const char *dir);

#endif
