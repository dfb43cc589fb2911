/* cpus.c: the CPUs this process may use (cpus.h): affinity, bounded by the
 * cgroup CPU quota of its group and of every ancestor up to the mount. */
#include "common/cpus.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_MAX_LEN 4096

/* Whether word is one of the comma-separated items of list. */
static int has_item(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *s = list; *s;) {
        size_t len = strcspn(s, ",");
        if (len == n && !strncmp(s, word, n)) return 1;
        s += len + (s[len] == ',');
    }
    return 0;
}

/* This process's cgroup path for the v1 cpu controller (v1 = 1) or v2's
 * unified one (v1 = 0), from <root>/proc/self/cgroup. 0, or -1 if none. */
static int group_path(const char *root, int v1, char *out, size_t len) {
    char path[600], line[LINE_MAX_LEN];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1;
        if (v1 ? has_item(ctrls, "cpu") : (c1 == line + 1 && line[0] == '0' && !*ctrls)) {
            snprintf(out, len, "%s", c2 + 1);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* Where the hierarchy is mounted (<root>/proc/self/mountinfo): its mount
 * point and the group its root shows (a container sees its own group as
 * "/"). 0, or -1 when not mounted. */
static int mount_of(const char *root, int v1, char *point, size_t plen, char *mroot,
                    size_t rlen) {
    char path[600], line[LINE_MAX_LEN];
    snprintf(path, sizeof path, "%s/proc/self/mountinfo", root);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        /* id parent maj:min root point options [optional...] - type source super */
        char *dash = strstr(line, " - ");
        if (!dash) continue;
        char type[64] = "", source[256] = "", super[1024] = "", r[1024] = "", p[1024] = "";
        if (sscanf(dash + 3, "%63s %255s %1023s", type, source, super) < 2) continue;
        if (sscanf(line, "%*s %*s %*s %1023s %1023s", r, p) != 2) continue;
        int match = v1 ? !strcmp(type, "cgroup") && has_item(super, "cpu")
                       : !strcmp(type, "cgroup2");
        if (match) {
            snprintf(point, plen, "%s", p);
            snprintf(mroot, rlen, "%s", r);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* The quota in dir, in CPUs (0: none there). */
static double quota_in(const char *dir, int v1) {
    char path[2600];
    if (v1) {
        long long q = -1, per = 0;
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        FILE *f = fopen(path, "r");
        if (!f) return 0;
        if (fscanf(f, "%lld", &q) != 1) q = -1;
        fclose(f);
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (!(f = fopen(path, "r"))) return 0;
        if (fscanf(f, "%lld", &per) != 1) per = 0;
        fclose(f);
        return q > 0 && per > 0 ? (double)q / (double)per : 0;
    }
    char max[32] = "";
    long long per = 0;
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = fscanf(f, "%31s %lld", max, &per);
    fclose(f);
    if (n != 2 || !strcmp(max, "max") || per <= 0) return 0;
    double q = atof(max);
    return q > 0 ? q / (double)per : 0;
}

/* The tightest quota of the group and its ancestors in one hierarchy. */
static void tightest(const char *root, int v1, cpus_info *out) {
    char group[1024], point[1024], mroot[1024];
    if (group_path(root, v1, group, sizeof group) || mount_of(root, v1, point, sizeof point,
                                                              mroot, sizeof mroot))
        return;
    /* The group as seen below the mount: a container's mount root is its
     * own group, which /proc/self/cgroup may name in full. */
    const char *rel = group;
    size_t rl = strlen(mroot);
    if (strcmp(mroot, "/") && !strncmp(group, mroot, rl) && (group[rl] == '/' || !group[rl]))
        rel = group + rl;
    char dir[2400];
    snprintf(dir, sizeof dir, "%s%s%s", root, point, strcmp(rel, "/") ? rel : "");
    size_t floor_len = strlen(root) + strlen(point);
    for (;;) {
        double q = quota_in(dir, v1);
        if (q > 0 && (out->quota == 0 || q < out->quota)) {
            out->quota = q;
            snprintf(out->where, sizeof out->where, "%s/%s", dir + strlen(root),
                     v1 ? "cpu.cfs_quota_us" : "cpu.max");
            snprintf(out->stat, sizeof out->stat, "%s/cpu.stat", dir);
            out->stat_v1 = v1;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < floor_len) break;
        *slash = '\0';
    }
}

void cpus_probe(const char *root, cpus_info *out) {
    memset(out, 0, sizeof *out);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    out->online = n > 0 ? (int)n : 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    out->affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : out->online;
    if (out->affinity < 1) out->affinity = out->online;
    if (!root) root = "";
    tightest(root, 1, out);
    if (out->quota == 0) tightest(root, 0, out);
    int usable = out->affinity;
    if (out->quota > 0) {
        int q = (int)ceil(out->quota - 1e-9);
        if (q < usable) usable = q;
    }
    out->usable = usable > 0 ? usable : 1;
}

long long cpus_throttled_us(const cpus_info *c) {
    if (!c->stat[0]) return -1;
    FILE *f = fopen(c->stat, "r");
    if (!f) return -1;
    const char *want = c->stat_v1 ? "throttled_time" : "throttled_usec";
    char name[64];
    long long v, found = -1;
    while (fscanf(f, "%63s %lld", name, &v) == 2)
        if (!strcmp(name, want)) {
            found = c->stat_v1 ? v / 1000 : v;
            break;
        }
    fclose(f);
    return found;
}

void cpus_describe(const cpus_info *c, char *out, size_t len) {
    if (c->quota > 0)
        snprintf(out, len, "%d (CPU quota %.2f in %s; %d CPUs allowed, %d online)", c->usable,
                 c->quota, c->where, c->affinity, c->online);
    else
        snprintf(out, len, "%d (no CPU quota; %d CPUs allowed, %d online)", c->usable,
                 c->affinity, c->online);
}
