/* threadpool.c: a pool of threads for work that may wait (threadpool.h).
 *
 * One mutex, one condition variable and an intrusive FIFO: a submit is a
 * lock, a link and a signal; no allocation, so it cannot fail. */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "service/threadpool.h"

struct svc_threadpool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    svc_task *head, *tail;
    int stopping;
    int nthreads;
    pthread_t *threads;
    char name[16];
};

static void *worker_main(void *arg) {
    svc_threadpool *tp = arg;
    pthread_setname_np(pthread_self(), tp->name);
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->head && !tp->stopping) pthread_cond_wait(&tp->cv, &tp->mu);
        svc_task *t = tp->head;
        if (!t) break;                           /* stopping, and drained */
        if (!(tp->head = t->next)) tp->tail = NULL;
        pthread_mutex_unlock(&tp->mu);
        t->next = NULL;
        t->run(t);
        pthread_mutex_lock(&tp->mu);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

svc_threadpool *svc_threadpool_start(const char *name, int threads, char *err, size_t errlen) {
    svc_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp || !(tp->threads = calloc((size_t)(threads > 0 ? threads : 1), sizeof *tp->threads))) {
        free(tp);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(tp->name, sizeof tp->name, "%s", name);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    for (; tp->nthreads < threads; tp->nthreads++) {
        if (pthread_create(&tp->threads[tp->nthreads], NULL, worker_main, tp) != 0) {
            snprintf(err, errlen, "cannot start %s threads", name);
            svc_threadpool_stop(tp);
            return NULL;
        }
    }
    return tp;
}

void svc_threadpool_submit(svc_threadpool *tp, svc_task *t) {
    assert(t->run != NULL);
    t->next = NULL;
    pthread_mutex_lock(&tp->mu);
    assert(!tp->stopping);
    if (tp->tail) tp->tail->next = t;
    else tp->head = t;
    tp->tail = t;
    pthread_cond_signal(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
}

void svc_threadpool_stop(svc_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->stopping = 1;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->nthreads; i++) pthread_join(tp->threads[i], NULL);
    assert(tp->head == NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}
