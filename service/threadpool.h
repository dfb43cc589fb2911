/* threadpool.h: a pool of threads for work that may wait.
 *
 * The event loops must never wait on Redis, SQLite or a lock server, so
 * work that may is handed to a pool: the API's reads and writes (two
 * pools: one that may wait on Redis, one that needs SQLite only, so a
 * stalled Redis cannot hold up order lookups) and the order path's
 * blocking strategies. A task is the caller's (intrusive: embed an
 * svc_task where the work's state lives), so submitting never allocates
 * and cannot fail. Tasks run in the order submitted, each on one thread. */
#ifndef FLASHSALE_SERVICE_THREADPOOL_H
#define FLASHSALE_SERVICE_THREADPOOL_H

#include <stddef.h>

typedef struct svc_task svc_task;
struct svc_task {
    void (*run)(svc_task *t);      /* runs on a pool thread; may free t's owner */
    svc_task *next;                /* the pool's while queued */
};

typedef struct svc_threadpool svc_threadpool;

/* Starts threads named name (at most 15 characters). NULL with err. */
svc_threadpool *svc_threadpool_start(const char *name, int threads, char *err, size_t errlen);
/* Queues t (run set). Any thread; never after svc_threadpool_stop began. */
void svc_threadpool_submit(svc_threadpool *tp, svc_task *t);
/* Runs what is queued, then stops the threads and frees tp. NULL: nothing. */
void svc_threadpool_stop(svc_threadpool *tp);

#endif
