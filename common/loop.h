/* loop.h: a small epoll event loop, one per thread.
 *
 * The order path lives on these loops: HTTP connections, the Redis
 * connection that reserves stock, and the completions coming back from the
 * SQLite committer all wake the same epoll_wait, so an order stays on one
 * thread from request to Redis reply and threads wake each other once per
 * batch, not once per order.
 *
 * - Watches: a callback per descriptor for readable / writable.
 * - Timers: periodic callbacks (milliseconds, monotonic clock).
 * - Phases: hooks run once per iteration, after the events of that
 *   iteration, phase by phase in a written order (loop_phase below): this
 *   is where work gathered while handling the events (a batch of
 *   reservations, the writes of a Redis connection) goes out, as one
 *   batch.
 * - Tasks: any thread may post a task to a loop; tasks posted before the
 *   loop next looks run together, for one eventfd write.
 *
 * One turn of loop_run, as uv_run's (libuv) is written:
 *
 *   1. timers  due timers run (loop_after, loop_every); they also say how
 *              long the wait may be
 *   2. wait    epoll_wait, not at all when a timer ran or loop_again was
 *              called
 *   3. events  each ready descriptor's callback; posted tasks run here,
 *              as the event of the loop's eventfd
 *   4. phases  LOOP_PHASE_HTTP, LOOP_PHASE_ORDERS, LOOP_PHASE_CLEARS,
 *              LOOP_PHASE_SENDS: each phase's hooks in the order they were
 *              registered
 *
 * Everything but loop_post and loop_stop must be called on the loop's own
 * thread (loop_run's). Errors are returned, with a message where one can
 * help; nothing here aborts on input. */
#ifndef FLASHSALE_LOOP_H
#define FLASHSALE_LOOP_H

#include <stddef.h>
#include <stdint.h>

typedef struct loop loop;

enum { LOOP_READ = 1, LOOP_WRITE = 2 };

/* The phases of a turn, in the order they run (after the turn's events).
 * The order is what lets one turn's work leave in that same turn: each
 * phase makes work for those after it, none for those before.
 *
 *   LOOP_PHASE_HTTP    the HTTP server (http/http.c): answers handed over
 *                      during the turn are queued, and requests already
 *                      buffered (pipelined) are read; the orders those
 *                      requests make join this turn's batches, so it runs
 *                      before ORDERS.
 *   LOOP_PHASE_ORDERS  the order path (service/order/pipeline.c): the
 *                      turn's orders become Redis commands (lock queues
 *                      started, one script call per SKU, the clears of
 *                      pending records); they write into the connections'
 *                      buffers, so before SENDS.
 *   LOOP_PHASE_CLEARS  the stock module's lane clears (stock/async.c, on a
 *                      cluster): a spread product's clears that no batch of
 *                      ORDERS carried (a lane's batch takes its clears
 *                      first) go as commands of their own; after ORDERS, so
 *                      that only those no batch carried are left, and
 *                      before SENDS, which writes them.
 *   LOOP_PHASE_SENDS   the Redis connections (common/aconn.c): one write
 *                      each for everything the phases before (and the
 *                      events) appended. Last, so nothing is left behind
 *                      for a later turn.
 *
 * A hook that makes work for a phase that already ran this turn (a
 * command appended after SENDS) calls loop_again: the next turn then does
 * not wait. */
typedef enum loop_phase {
    LOOP_PHASE_HTTP,
    LOOP_PHASE_ORDERS,
    LOOP_PHASE_CLEARS,
    LOOP_PHASE_SENDS,
    LOOP_PHASES
} loop_phase;

typedef void loop_io_fn(loop *l, int fd, unsigned events, void *ud);
typedef void loop_fn(loop *l, void *ud);

/* A task for loop_post. The caller owns it; the loop links it until run. */
typedef struct loop_task {
    loop_fn *fn;
    void *ud;
    struct loop_task *next;
} loop_task;

/* A new loop, or NULL with a message in err. */
loop *loop_new(char *err, size_t errlen);
/* Frees l (after loop_run returned). Posted tasks not yet run are run. */
void loop_free(loop *l);

/* Watches fd for events (LOOP_READ | LOOP_WRITE; 0 keeps it registered but
 * quiet), calling fn on the loop's thread. Calling it again for the same
 * fd changes the events and the callback. Returns 0 or -1 (errno). */
int loop_watch(loop *l, int fd, unsigned events, loop_io_fn *fn, void *ud);
/* Stops watching fd (before it is closed). */
void loop_unwatch(loop *l, int fd);

/* Calls fn every period_ms while the loop runs. Returns 0 or -1. */
int loop_every(loop *l, int64_t period_ms, loop_fn *fn, void *ud);
/* Calls fn once, about ms milliseconds from now (0: next iteration).
 * Returns 0, or -1 when out of memory. */
int loop_after(loop *l, int64_t ms, loop_fn *fn, void *ud);
/* Calls fn(l, ud) in phase `phase` of every turn, after the hooks
 * registered in that phase before it. A hook added while the phases run
 * runs in this turn when its phase is the current one or a later one, else
 * from the next turn on. Returns 0, or -1 (errno EINVAL: no fn, no such
 * phase; ENOSPC: the phase is full). */
int loop_on_phase(loop *l, loop_phase phase, loop_fn *fn, void *ud);
/* Removes every timer (loop_every, loop_after) and phase hook registered
 * with ud, so that what ud points to may be freed while the loop goes on
 * (also from inside a timer or a hook). */
void loop_forget(loop *l, void *ud);

/* Makes the next iteration not wait for events (work is left that a phase
 * hook of this iteration made after another had run). On l's thread. */
void loop_again(loop *l);

/* Runs t->fn(l, t->ud) on l's thread soon. Thread-safe. */
void loop_post(loop *l, loop_task *t);

/* Runs until loop_stop. */
void loop_run(loop *l);
/* Makes loop_run return after its current iteration. Thread-safe. */
void loop_stop(loop *l);

/* How long l's last whole turn took, in microseconds: from its epoll_wait's
 * return through its events and phases (the wait not counted). A
 * request read in this turn came in at the latest while the last one ran:
 * under load, about how long it waited to be read. On l's thread. */
int64_t loop_turn_us(const loop *l);

/* The loop running on the calling thread, or NULL. */
loop *loop_current(void);
/* Whether the calling thread may touch l: it runs l, or no thread does
 * (before loop_run, after it returned). The functions above that say "on
 * the loop's thread" assert it. */
int loop_owned(const loop *l);
/* A pointer the owner keeps with the loop (e.g. its per-loop state). */
void loop_set_data(loop *l, void *data);
void *loop_data(const loop *l);

#endif
