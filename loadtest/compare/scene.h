/* scene.h: the scenes of `flashload compare` -- what one scene is (a
 * strategy under a load, perhaps under a fault: a pause, a Redis failure,
 * a fault between hosts; holds, a fairness line, a crowd) and what it came
 * to, and the names and headings the table and the report give them
 * (scene.c; a group's own names: failures.c, hosts.c, fairness.c). */
#ifndef FLASHSALE_LOADTEST_SCENE_H
#define FLASHSALE_LOADTEST_SCENE_H

#include <stddef.h>
#include <stdint.h>

#include "loadtest/engine/engine.h"
#include "loadtest/verify/verify.h"

/* The groups of scenes, in the order they run and are shown. */
enum { FL_GROUP_CONTENTION, FL_GROUP_PAUSE, FL_GROUP_FAILURE, FL_GROUP_HOLDS,
       FL_GROUP_FAIRNESS, FL_GROUP_CROWD, FL_GROUP_HOSTS, FL_GROUPS };

#define FL_CROWD_BINS 100            /* a crowd scene's arrival ranks, drawn in this many bins */

/* The fairness group's two scenes (fairness.c). */
enum { FL_FAIR_NONE, FL_FAIR_QUEUE, FL_FAIR_STREAM };
#define FL_FAIR_MAX 64               /* buyers in a fairness scene, at most */

/* The faults between hosts a scene of FL_GROUP_HOSTS runs under (hosts.c):
 * each on a deployment of network namespaces of its own (tests/hosts.py). */
typedef enum fl_between {
    FL_HOSTS_NONE = 0,
    FL_HOSTS_SPLIT,              /* the Redis primary cut off with one instance, a replica promoted */
    FL_HOSTS_ASYNC,              /* Patroni's leader dies, an asynchronous replica promoted */
    FL_HOSTS_SYNC,               /* the same with synchronous_mode: its standby promoted */
    FL_HOSTS_CUT,                /* Patroni's leader cut from etcd and its replica: demoted */
    FL_HOSTS_SWITCHOVER,         /* a planned Patroni switchover, one instance via HAProxy */
    FL_HOSTS_COUNT
} fl_between;

/* What a forced scene (cs_overlap) must see for its forcing to count:
 * a second holder inside the critical section with the same read (MET:
 * the interleaving that breaks an unsafe strategy, or a lease that ran
 * out), or none ever (ALONE: a lock that holds). */
enum { FL_FORCE_NONE, FL_FORCE_MET, FL_FORCE_ALONE };

/* The Redis failures that break a Redis lock and RedLock (Alibaba Cloud's
 * "Implementation Principles and Best Practices of Distributed Lock", section 4.2),
 * one of which a scene of FL_GROUP_FAILURE runs under (failures.c). */
typedef enum fl_failure {
    FL_FAIL_NONE = 0,
    FL_FAIL_FAILOVER,            /* the stock's Redis fails over to a replica that missed writes */
    FL_FAIL_CLOCK,               /* Redlock: a server's wall clock jumps forward mid-hold */
    FL_FAIL_AOF,                 /* Redlock: a server crashes mid-hold, AOF everysec loses the hold */
    FL_FAIL_MEMBER,              /* Redlock: a member fails over to a replica that missed the lock */
    FL_FAILURES
} fl_failure;

/* Why and how a scene is run. */
typedef struct fl_scene {
    char strategy[32];
    int segments;
    int instances;
    long long stock;
    int cs_delay_ms;             /* injected pause, or the forcing's longest wait (0: none) */
    int lock_ttl_ms;             /* lease (0: service default) */
    int cs_overlap;              /* forced: holders the critical section waits for (0: none) */
    int expect_force;            /* forced: FL_FORCE_MET or FL_FORCE_ALONE */
    int unsafe;                  /* expected to break */
    int fault;                   /* runs under an injected fault (group > 0): shaded, marked */
    int group;                   /* FL_GROUP_* */
    fl_failure failure;          /* FL_GROUP_FAILURE: which */
    fl_between between;          /* FL_GROUP_HOSTS: which */
    char condition[160];         /* for people: "contention", "pause 300ms > ttl 100ms" */
    const char *fault_name;      /* the fault a faulty scene shows, in a few words, for
                                    grouping ("a lease runs out"; NULL: none) */
    double duration_s;
    /* FL_GROUP_HOLDS: the product's hold_seconds, and the shares of the
     * holds their buyers pay for and cancel (the rest abandon). */
    int hold_seconds;
    double pay, cancel;
    /* FL_GROUP_FAIRNESS: which scene, its buyers and the gap between their
     * arrivals (cs_delay_ms is each one's hold). */
    int fair_scene;
    int waiters, gap_ms;
    /* FL_GROUP_CROWD: its buyers (arriving over crowd_ramp_s, a fifth of
     * them bots), and whether the product has a waiting room. */
    int crowd_buyers, crowd_room;
    double crowd_ramp_s;
} fl_scene;

typedef struct fl_scene_result {
    fl_scene sc;
    int ran;                     /* 0: skipped (see note) */
    char note[300];
    double orders_per_s;         /* 201s per second while the sale lasted (to the last 201) */
    double answers_per_s;        /* order requests answered per second, whatever the answer */
    uint64_t answered, created, transport_errors;
    uint64_t p50_us, p90_us, p99_us, p999_us, max_us;
    fl_verdict verdict;
    char verdict_line[300];
    int as_expected;             /* safe and PASS, or unsafe and FAIL */
    uint64_t status_201, status_409, status_429, status_5xx;
    uint64_t fenced;             /* 429s refused by the fence */
    /* The service's flashsale_lock_handoff_seconds over this scene
     * (release -> next acquire in the same process): count, sum/count, and
     * the median interpolated within its buckets. n 0: none recorded. */
    uint64_t handoff_n;
    double handoff_mean_us, handoff_p50_us;
    /* A Redis failure scene: from the fault (the kill of the primary) to
     * the next 201 (-1: none, or not measured), and what was done and seen,
     * in words. */
    int64_t recover_ms;
    char detail[400];
    /* A forced scene: the service's count of waits that met a second
     * holder and that ran to their bound alone (-1: not read), and, when
     * the forcing did not come as the scene claims, what was missing. */
    long long forced_met, forced_alone;
    char forced_why[200];
    /* The longest time between two 201s of the scene (-1: fewer than
     * two): how long a fault stalled the sale. */
    int64_t sale_gap_us;
    /* A fairness scene (fairness.c): buyers served, pairs of them and those
     * served against arrival order, the median and longest wait (less
     * their own hold), those not served while a later one was, and the
     * service order (arrival indices, first served first). */
    int fair_served, fair_starved;
    long fair_pairs, fair_out_of_order;
    double fair_wait_median_ms, fair_wait_max_ms;
    unsigned char fair_order[FL_FAIR_MAX];
    /* A crowd scene: its figures, and by arrival rank (FL_CROWD_BINS bins,
     * first arrivals first) the buyers, those who got a unit, and the bots
     * among them. */
    fl_crowd_figures crowd;
    uint32_t crowd_bins[FL_CROWD_BINS][3];
} fl_scene_result;

/* A group's heading ("ordinary contention (no fault)", ...). */
const char *fl_group_title(int group);
/* A holds scene's figures in one line ("412 holds placed: 250 confirmed,
 * ..."); "" for a scene without holds or that did not run (scene.c, as
 * the next). */
void fl_holds_brief(const fl_scene_result *s, char *out, size_t len);
/* A forced scene's waits in a few words ("; waits: 20 met a second holder,
 * 1 alone"); "" for another scene, or one that did not run. */
void fl_forced_brief(const fl_scene_result *s, char *out, size_t len);
/* A failure in a few words ("a Redlock server's clock jumps"); failures.c,
 * as the next. */
const char *fl_failure_title(fl_failure kind);
/* A failure's short name ("failover", "clock jump", ...), as report.json has it. */
const char *fl_failure_name(fl_failure kind);
/* A fault between hosts in a few words ("a Redis split brain"), and its
 * short name as report.json has it ("split-brain"). */
const char *fl_between_title(fl_between b);
const char *fl_between_name(fl_between b);
/* A fairness scene's name, "queue" or "stream" (fairness.c). */
const char *fl_fair_scene_name(int kind);

#endif
