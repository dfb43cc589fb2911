/* orderloop.c: the order path's state on each event loop: its Redis
 * connection, the families' per-loop state (a slot each, by index: what is
 * in a slot is the family's business), the pending records to clear, and
 * the inbox other threads hand it orders through.
 *
 * The inbox is one mutex and at most one wake (loop_post) per loop for
 * whatever arrives before the loop looks: the committer hands a committed
 * group back with one wake per loop (give, give_done), not one per order.
 * An order in the inbox carries what to do with it (svc_order.arrive);
 * this file runs it and knows nothing else of orders. */
#include <stdio.h>
#include <stdlib.h>

#include "service/log.h"
#include "service/order/family.h"
#include "service/order/orderloop.h"

struct svc_order_loop {
    svc_app *a;
    loop *l;
    int index;                     /* in a->loops */
    stock_async *sa;
    void *state[SVC_FAMILY_SLOTS]; /* each family's, by its index */
    void *pending;                 /* reservation.c's */
    pthread_mutex_t mu;            /* guards the inbox */
    svc_order *in_head, *in_tail;
    atomic_int posted;             /* task is queued on the loop */
    loop_task task;
    /* The committer's staging, touched by its thread only. */
    svc_order *give_head, *give_tail;
    int give_listed;
    svc_order_loop *give_next;
    /* A busy question from another thread (svc_order_loop_busy). */
    loop_task probe;
    atomic_int probe_state;        /* -1 asked, 0 idle, 1 busy, -2 never asked */
    int (*probe_fn)(svc_order_loop *ol, void *ud);
    void *probe_ud;
};

int svc_order_loop_owned(const svc_order_loop *ol) { return loop_current() == ol->l; }
loop *svc_order_loop_loop(const svc_order_loop *ol) { return ol->l; }
svc_app *svc_order_loop_app(const svc_order_loop *ol) { return ol->a; }
int svc_order_loop_index(const svc_order_loop *ol) { return ol->index; }

stock_async *svc_order_loop_stock(svc_order_loop *ol) {
    assert(svc_order_loop_owned(ol));
    return ol->sa;
}

void *svc_order_loop_state(const svc_order_loop *ol, const svc_family *fam) {
    assert((unsigned)fam->index < SVC_FAMILY_SLOTS);
    return ol->state[fam->index];
}

void svc_order_loop_set_state(svc_order_loop *ol, const svc_family *fam, void *state) {
    assert((unsigned)fam->index < SVC_FAMILY_SLOTS);
    ol->state[fam->index] = state;
}

void *svc_order_loop_pending(const svc_order_loop *ol) { return ol->pending; }
void svc_order_loop_set_pending(svc_order_loop *ol, void *state) { ol->pending = state; }

svc_order_loop *svc_order_loop_current(void) {
    loop *l = loop_current();
    return l ? loop_data(l) : NULL;
}

/* ------------------------------------------------------------------ inbox */

static void wake(svc_order_loop *ol) {
    if (!atomic_exchange(&ol->posted, 1)) loop_post(ol->l, &ol->task);
}

/* The loop's task: what other threads handed over, in the order given. */
static void drain_inbox(loop *l, void *ud) {
    svc_order_loop *ol = ud;
    (void)l;
    assert(svc_order_loop_owned(ol));
    atomic_store(&ol->posted, 0);             /* before taking: a later give posts again */
    pthread_mutex_lock(&ol->mu);
    svc_order *in = ol->in_head;
    ol->in_head = ol->in_tail = NULL;
    pthread_mutex_unlock(&ol->mu);
    while (in) {
        svc_order *next = in->next;
        svc_order_fn *fn = in->arrive;
        in->arrive = NULL;
        fn(in);
        in = next;
    }
}

void svc_order_loop_run(svc_order_loop *ol, svc_order *op, svc_order_fn *fn) {
    if (svc_order_loop_owned(ol)) {
        fn(op);
        return;
    }
    op->arrive = fn;
    op->next = NULL;
    pthread_mutex_lock(&ol->mu);
    if (ol->in_tail) ol->in_tail->next = op;
    else ol->in_head = op;
    ol->in_tail = op;
    pthread_mutex_unlock(&ol->mu);
    wake(ol);
}

void svc_order_loop_give(svc_order_loop **touched, svc_order_loop *ol, svc_order *op) {
    assert(op->arrive != NULL);
    op->next = NULL;
    if (ol->give_tail) ol->give_tail->next = op;
    else ol->give_head = op;
    ol->give_tail = op;
    if (!ol->give_listed) {
        ol->give_listed = 1;
        ol->give_next = *touched;
        *touched = ol;
    }
}

void svc_order_loop_give_done(svc_order_loop **touched) {
    while (*touched) {
        svc_order_loop *ol = *touched;
        *touched = ol->give_next;
        ol->give_listed = 0;
        pthread_mutex_lock(&ol->mu);
        if (ol->in_tail) ol->in_tail->next = ol->give_head;
        else ol->in_head = ol->give_head;
        ol->in_tail = ol->give_tail;
        pthread_mutex_unlock(&ol->mu);
        ol->give_head = ol->give_tail = NULL;
        wake(ol);
    }
}

/* ------------------------------------------------------------------- busy */

static void answer_probe(loop *l, void *ud) {
    svc_order_loop *ol = ud;
    (void)l;
    int busy = stock_async_inflight(ol->sa) > 0 || (ol->probe_fn && ol->probe_fn(ol, ol->probe_ud));
    atomic_store(&ol->probe_state, busy);
}

int svc_order_loop_busy(svc_order_loop *ol, int (*busy)(svc_order_loop *ol, void *ud), void *ud) {
    assert(!svc_order_loop_owned(ol));
    int st = atomic_load(&ol->probe_state);
    if (st == -1) return -1;                  /* asked, not answered yet */
    ol->probe_fn = busy;                      /* published by loop_post's lock */
    ol->probe_ud = ud;
    atomic_store(&ol->probe_state, -1);
    loop_post(ol->l, &ol->probe);
    return st == -2 ? -1 : st;
}

/* -------------------------------------------------------------- lifecycle */

svc_order_loop *svc_order_loop_new(svc_app *a, loop *l, int index, char *err, size_t errlen) {
    svc_order_loop *ol = calloc(1, sizeof *ol);
    if (!ol) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ol->a = a;
    ol->l = l;
    ol->index = index;
    pthread_mutex_init(&ol->mu, NULL);
    ol->task = (loop_task){ drain_inbox, ol, NULL };
    ol->probe = (loop_task){ answer_probe, ol, NULL };
    atomic_init(&ol->probe_state, -2);
    loop_set_data(l, ol);
    return ol;
}

int svc_order_loop_connect(svc_order_loop *ol, char *err, size_t errlen) {
    ol->sa = stock_async_new(ol->l, &ol->a->stock_cfg, err, errlen);
    return ol->sa ? 0 : -1;
}

void svc_order_loop_free(svc_order_loop *ol) {
    if (!ol) return;
    assert(!ol->in_head && !ol->give_head);
    if (atomic_load(&ol->posted) || atomic_load(&ol->probe_state) == -1) {
        /* A task of ol's is still queued on its stopped loop, which runs
         * it when freed: ol must outlive that. Only after a drain that
         * gave up on a loop that did not answer. */
        svc_log(SVC_LOG_WARN, "shutdown: event loop %d did not answer; its state is left",
                ol->index);
        return;
    }
    stock_async_free(ol->sa);
    pthread_mutex_destroy(&ol->mu);
    free(ol);
}
