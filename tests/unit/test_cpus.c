/* test_cpus.c: the CPUs a process may use (common/cpus.h), read from the
 * files of machines other than this one: each case writes, under a temp
 * dir that stands for /, the /proc/self/cgroup, /proc/self/mountinfo and
 * cgroup files such a machine has, as the kernel formats them:
 * - cgroup v1 (cpu,cpuacct mounted together), a quota of 1.5 CPUs: 2;
 * - v1 inside a container (the mount's root is the container's group,
 *   /proc/self/cgroup names it in full), half a core: 1;
 * - v2 (cpu.max), a parent's quota tighter than the group's own: the
 *   parent's, and the file it came from;
 * - v2 "max": no quota, the affinity;
 * - nothing readable: no quota, never an error.
 * The real one (this machine's cgroup v1 with a quota set by the test) is
 * tests/test_container.py's. */
#include <sys/stat.h>
#include <unistd.h>

#include "common/cpus.h"
#include "tests/unit/t.h"

static char root[256];

static void put(const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    /* mkdir -p of its directory */
    for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = '\0';
        mkdir(path, 0755);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void fresh(void) {
    char cmd[300];
    if (root[0]) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        CHECK(system(cmd) == 0);
    }
    snprintf(root, sizeof root, "/tmp/fs-cpus-XXXXXX");
    CHECK(mkdtemp(root) != NULL);
}

static const char V1_MOUNTS[] =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n";

static void test_v1_quota(void) {
    fresh();
    put("proc/self/cgroup", "5:cpuset:/\n4:cpu,cpuacct:/system.slice/shop.service\n"
                            "0::/system.slice/shop.service\n");
    put("proc/self/mountinfo", V1_MOUNTS);
    put("sys/fs/cgroup/cpu,cpuacct/system.slice/shop.service/cpu.cfs_quota_us", "150000\n");
    put("sys/fs/cgroup/cpu,cpuacct/system.slice/shop.service/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/cpu,cpuacct/system.slice/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/system.slice/cpu.cfs_period_us", "100000\n");
    cpus_info c;
    cpus_probe(root, &c);
    CHECK(c.quota > 1.49 && c.quota < 1.51);
    CHECK_STR(c.where, "/sys/fs/cgroup/cpu,cpuacct/system.slice/shop.service/cpu.cfs_quota_us");
    CHECK(c.usable == (c.affinity < 2 ? c.affinity : 2));
    char text[400];
    cpus_describe(&c, text, sizeof text);
    CHECK(strstr(text, "CPU quota 1.50") != NULL);
    /* The frozen time, from that group's cpu.stat (v1: nanoseconds). */
    CHECK(cpus_throttled_us(&c) == -1);                      /* no cpu.stat yet */
    put("sys/fs/cgroup/cpu,cpuacct/system.slice/shop.service/cpu.stat",
        "nr_periods 40\nnr_throttled 31\nthrottled_time 2500000000\n");
    CHECK(cpus_throttled_us(&c) == 2500000);
}

static void test_v1_inside_a_container(void) {
    fresh();
    put("proc/self/cgroup", "4:cpu,cpuacct:/kubepods/pod1/c0ffee\n");
    put("proc/self/mountinfo",
        "700 690 0:29 /kubepods/pod1/c0ffee /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup "
        "cgroup rw,cpu,cpuacct\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    cpus_info c;
    cpus_probe(root, &c);
    CHECK(c.quota > 0.49 && c.quota < 0.51);
    CHECK(c.usable == 1);
    CHECK_STR(c.where, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us");
}

static void test_v2_parent_tighter(void) {
    fresh();
    put("proc/self/cgroup", "0::/shop/api\n");
    put("proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 "
                               "cgroup2 rw,nsdelegate\n");
    put("sys/fs/cgroup/shop/api/cpu.max", "300000 100000\n");
    put("sys/fs/cgroup/shop/cpu.max", "100000 100000\n");
    put("sys/fs/cgroup/cpu.max", "max 100000\n");
    cpus_info c;
    cpus_probe(root, &c);
    CHECK(c.quota > 0.99 && c.quota < 1.01);
    CHECK_STR(c.where, "/sys/fs/cgroup/shop/cpu.max");
    CHECK(c.usable == 1);
    /* The quota's group counts the freezes (v2: microseconds), not ours. */
    put("sys/fs/cgroup/shop/api/cpu.stat", "usage_usec 9\nthrottled_usec 77\n");
    put("sys/fs/cgroup/shop/cpu.stat", "usage_usec 10\nuser_usec 5\nsystem_usec 5\n"
                                       "nr_periods 3\nnr_throttled 2\nthrottled_usec 1234\n");
    CHECK(cpus_throttled_us(&c) == 1234);
}

static void test_v2_max_is_no_quota(void) {
    fresh();
    put("proc/self/cgroup", "0::/user.slice\n");
    put("proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/user.slice/cpu.max", "max 100000\n");
    cpus_info c;
    cpus_probe(root, &c);
    CHECK(c.quota == 0 && c.where[0] == '\0');
    CHECK(c.usable == c.affinity && c.usable >= 1);
}

static void test_nothing_readable(void) {
    fresh();
    cpus_info c;
    cpus_probe(root, &c);
    CHECK(c.quota == 0 && c.usable == c.affinity && c.online >= 1);
    char text[400];
    cpus_describe(&c, text, sizeof text);
    CHECK(strstr(text, "no CPU quota") != NULL);
    CHECK(cpus_throttled_us(&c) == -1);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        T(test_v1_quota), T(test_v1_inside_a_container), T(test_v2_parent_tighter),
        T(test_v2_max_is_no_quota), T(test_nothing_readable),
    };
    int rc = t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
    fresh();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) rc = 1;
    return rc;
}
