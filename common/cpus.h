/* cpus.h: how many CPUs this process may use.
 *
 * A container's CPU limit (Kubernetes limits.cpu, systemd CPUQuota=,
 * docker --cpus) is a cgroup CPU quota: the kernel lets the group run
 * quota microseconds per period and freezes it for the rest. sysconf
 * counts the machine's CPUs, not that, so threads sized by it outnumber
 * what the quota lets run and spend the period waiting to be thawed.
 * cpus_probe reads the quota of this process's cgroup and its ancestors
 * (cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us; v2: cpu.max), as Go's
 * automaxprocs and the JVM's container support do, and the CPUs its
 * affinity allows (a cpuset). */
#ifndef FLASHSALE_CPUS_H
#define FLASHSALE_CPUS_H

#include <stddef.h>

typedef struct cpus_info {
    int online;                  /* CPUs the machine has online */
    int affinity;                /* CPUs this process may run on (its affinity mask) */
    double quota;                /* CPUs the tightest quota allows; 0: no quota */
    char where[300];             /* the file that quota was read from ("" : none) */
    int usable;                  /* min(affinity, quota rounded up), at least 1 */
    /* That group's cpu.stat, where the kernel counts the time it kept the
     * group frozen (cpus_throttled_us); "": no quota. */
    char stat[2600];
    int stat_v1;                 /* v1 (throttled_time, ns) or v2 (throttled_usec) */
} cpus_info;

/* Fills out for this process. root: "" to read the real /proc and cgroup
 * files, or a directory that stands for / (the tests' copies of other
 * machines' files). Never fails: what it cannot read counts as no limit. */
void cpus_probe(const char *root, cpus_info *out);

/* The time, in microseconds, the kernel has kept the quota's group frozen
 * since the group was made (summed over the CPUs it was frozen on), or -1
 * when there is no quota or its cpu.stat cannot be read. A read of one
 * small file: a few microseconds, for a caller that asks now and then. */
long long cpus_throttled_us(const cpus_info *c);

/* out in words: "2 (quota 1.50 CPUs in /sys/fs/cgroup/...; 4 online)". */
void cpus_describe(const cpus_info *c, char *out, size_t len);

#endif
