/* process.c: the process' own figures for the process_* metrics, read from
 * /proc as Prometheus' client libraries read them (client_golang's procfs):
 * /proc/self/stat for CPU time, memory and start time, /proc/stat for the
 * boot time that start time counts from, /proc/self/fd for the open
 * descriptors, and the soft RLIMIT_NOFILE for the most it may open.
 *
 * Read at a scrape only, never on the order path. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "service/ops/metrics.h"

/* The boot time, seconds since the epoch ("btime" of /proc/stat); -1. */
static long long boot_time(void) {
    char line[256];
    long long bt = -1;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %lld", &bt) == 1) break;
    fclose(f);
    return bt;
}

/* Entries of /proc/self/fd, less the one this count opens; -1. */
static long long count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    long long n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n > 0 ? n - 1 : 0;
}

int svc_process_read(svc_process_stats *out) {
    char text[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    /* The command name, field 2, is in parentheses and may hold spaces and
     * parentheses itself: the fields that follow start after the last ')'. */
    const char *p = strrchr(text, ')');
    unsigned long long utime, stime, start, vsize;
    long long rss;
    if (!p || sscanf(p + 1,
                     " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d"
                     " %*d %*d %llu %llu %lld",
                     &utime, &stime, &start, &vsize, &rss) != 5)
        return -1;
    long ticks = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    long long bt = boot_time();
    struct rlimit rl;
    if (ticks <= 0 || page <= 0 || bt < 0) return -1;
    out->cpu_seconds = (double)(utime + stime) / (double)ticks;
    out->start_time = (double)bt + (double)start / (double)ticks;
    out->virtual_bytes = (long long)vsize;
    out->resident_bytes = rss * page;
    out->open_fds = count_fds();
    out->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                       ? (long long)rl.rlim_cur : -1;
    return out->open_fds < 0 ? -1 : 0;
}
