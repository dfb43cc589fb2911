/* mutex.h: the assertion that a function's caller holds a mutex.
 *
 * A function that reads or writes what a mutex guards says so once, as
 * assert(mutex_held(&x->mu)) at its start, rather than in a comment. The
 * check costs one uncontended atomic operation and no field in the
 * guarded struct: a mutex the caller forgot is free, so the try takes it
 * and the assert fails. (It cannot tell the caller from another holder;
 * the lock module, whose mutexes are ranked, keeps a per-thread record
 * instead: lock_mu_holds.) */
#ifndef FLASHSALE_MUTEX_H
#define FLASHSALE_MUTEX_H

#include <errno.h>
#include <pthread.h>

/* Whether mu is held (by the caller, if the caller is right), for assert()
 * only: when it is not, this takes it. A default (not recursive) mutex. */
static inline int mutex_held(const pthread_mutex_t *mu) {
    return pthread_mutex_trylock((pthread_mutex_t *)mu) == EBUSY;
}

#endif
