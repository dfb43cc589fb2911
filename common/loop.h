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
 * - Flush hooks: run once per iteration, after the events of that
 *   iteration: this is where work gathered while handling the events (a
 *   batch of reservations, the writes of a Redis connection) goes out, as
 *   one batch.
 * - Tasks: any thread may post a task to a loop; tasks posted before the
 *   loop next looks run together, for one eventfd write.
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
/* Calls fn after the events of every iteration. Returns 0 or -1. */
int loop_on_flush(loop *l, loop_fn *fn, void *ud);
/* Removes every timer (loop_every, loop_after) and flush hook registered
 * with ud, so that what ud points to may be freed while the loop goes on
 * (also from inside a timer or a hook). */
void loop_forget(loop *l, void *ud);

/* Makes the next iteration not wait for events (work is left that a flush
 * hook of this iteration made after another had run). On l's thread. */
void loop_again(loop *l);

/* Runs t->fn(l, t->ud) on l's thread soon. Thread-safe. */
void loop_post(loop *l, loop_task *t);

/* Runs until loop_stop. */
void loop_run(loop *l);
/* Makes loop_run return after its current iteration. Thread-safe. */
void loop_stop(loop *l);

/* How long l's last whole turn took, in microseconds: from its epoll_wait's
 * return through its events and flush hooks (the wait not counted). A
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
