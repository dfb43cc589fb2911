/* workers.c: a pool of threads for work that may wait on Redis or SQLite.
 *
 * The HTTP event-loop threads must never wait on a dependency: one stalled
 * Redis call there holds every connection of that loop (with Redis
 * stopped, orders that never touch Redis waited 6 s behind product reads).
 * Handlers that need I/O defer their request and hand a job to this pool;
 * its threads have their own Redis and SQLite connections (svc_thread_db,
 * svc_thread_stock) and answer when done. Jobs run in the order submitted. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include "service/service.h"

typedef struct job {
    void (*fn)(void *arg);
    void *arg;
    struct job *next;
} job;

struct svc_workers {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    int stopping;
    int nthreads;
    pthread_t *threads;
    char name[16];
};

static void *worker_main(void *arg) {
    svc_workers *w = arg;
    pthread_setname_np(pthread_self(), w->name);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        job *j = w->head;
        if (!j) break;                           /* stopping, and drained */
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        pthread_mutex_unlock(&w->mu);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

svc_workers *svc_workers_start(const char *name, int threads, char *err, size_t errlen) {
    svc_workers *w = calloc(1, sizeof *w);
    if (!w || !(w->threads = calloc((size_t)threads, sizeof *w->threads))) {
        free(w);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(w->name, sizeof w->name, "%s", name);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    for (; w->nthreads < threads; w->nthreads++) {
        if (pthread_create(&w->threads[w->nthreads], NULL, worker_main, w) != 0) {
            snprintf(err, errlen, "cannot start %s threads", name);
            svc_workers_stop(w);
            return NULL;
        }
    }
    return w;
}

int svc_workers_submit(svc_workers *w, void (*fn)(void *arg), void *arg) {
    job *j = malloc(sizeof *j);
    if (!j) return -1;
    *j = (job){ fn, arg, NULL };
    pthread_mutex_lock(&w->mu);
    assert(!w->stopping);
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

void svc_workers_stop(svc_workers *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->nthreads; i++) pthread_join(w->threads[i], NULL);
    assert(w->head == NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->threads);
    free(w);
}
