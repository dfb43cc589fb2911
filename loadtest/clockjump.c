/* clockjump.c: bin/libclockjump.so, an LD_PRELOAD shim that moves a
 * process's wall clock by an offset another process can change at any
 * moment. `flashload compare` runs one of Redlock's redis-servers under it
 * to jump that server's clock forward mid-hold: RedLock's third problem in
 * Alibaba Cloud's "Implementation Principles and Best Practices of Distributed Lock"
 * (4.2.4), a clock jump on one node that releases the lock there before its
 * timeout, so that another client takes it. Redis 7
 * expires keys by mstime(), i.e. gettimeofday(), so a jump of a minute
 * expires a lock with a lease of seconds at once, on that server only.
 *
 * Why not libfaketime (Debian's faketime): Debian's redis-server 7.0, built
 * with jemalloc, does not start under it on our machines. `FAKETIME=+0
 * LD_PRELOAD=.../libfaketime.so.1 redis-server --port 0` prints
 * "libfaketime: Unexpected recursive calls to clock_gettime() without
 * proper initialization" and "Cannot recover", and Redis does not serve.
 * libfaketime looks up the real functions with dlsym() and reads its
 * settings with stdio, which allocate; jemalloc, setting itself up on that
 * first allocation, reads the clock: a call back into libfaketime before it
 * is ready. This shim neither looks anything up nor allocates: it asks the
 * kernel with syscall(2) and reads its offset from a mapped file.
 *
 * The offset: CLOCKJUMP_FILE names a file whose first 8 bytes are a
 * native int64, seconds to add to the wall clock. It is mapped (MAP_SHARED)
 * at the first call and read at every call, so a store into the file
 * (flashload stores through a mapping of its own: one aligned 8-byte
 * store, never seen half done) takes at once. No variable, no file, or a
 * file shorter than 8 bytes: offset 0.
 *
 * Only CLOCK_REALTIME and CLOCK_REALTIME_COARSE move (and gettimeofday and
 * time, which read them): the monotonic clocks go on, as when NTP steps a
 * machine's clock. Every call is a real system call (no vDSO): slower, and
 * of no matter for a test server.
 *
 * Built alone (-fPIC -shared, loadtest/module.mk), never into a program. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const int64_t no_offset = 0;
static const int64_t *offset_at;       /* the mapped offset, or &no_offset */

/* Maps the offset file once (the first caller that gets here wins; a
 * caller racing it maps again and unmaps its own), leaving errno as it
 * was: the clock call it serves succeeded. Returns the offset. */
static int64_t offset(void) {
    const int64_t *at = __atomic_load_n(&offset_at, __ATOMIC_ACQUIRE);
    if (!at) {
        int saved = errno;
        const char *path = getenv("CLOCKJUMP_FILE");
        int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        struct stat st;
        void *m = MAP_FAILED;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(int64_t))
            m = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        if (fd >= 0) close(fd);
        const int64_t *mine = m == MAP_FAILED ? &no_offset : m;
        const int64_t *expected = NULL;
        if (__atomic_compare_exchange_n(&offset_at, &expected, mine, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            at = mine;
        } else {
            if (mine != &no_offset) munmap(m, sizeof(int64_t));
            at = expected;
        }
        errno = saved;
    }
    return __atomic_load_n(at, __ATOMIC_RELAXED);
}

/* The kernel's clock_gettime, the wall clocks moved by the offset. (glibc
 * declares the pointers never NULL, the kernel accepts a NULL tv: hence
 * the copies, which the compiler lets us test.) */
int clock_gettime(clockid_t clk, struct timespec *ts) {
    struct timespec *out = ts;
    long rc = syscall(SYS_clock_gettime, clk, out);
    if (rc == 0 && out && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE))
        out->tv_sec += (time_t)offset();
    return (int)rc;
}

/* The kernel's gettimeofday (timezone too, for who still asks), moved. */
int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timeval *out = tv;
    long rc = syscall(SYS_gettimeofday, out, tz);
    if (rc == 0 && out) out->tv_sec += (time_t)offset();
    return (int)rc;
}

/* Seconds since the epoch, moved (time(2) is not on every architecture:
 * asked as CLOCK_REALTIME). */
time_t time(time_t *t) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
