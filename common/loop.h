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
 *   iteration, phase by phase in the order of their ranks: this is where
 *   work gathered while handling the events (a batch of reservations, the
 *   writes of a Redis connection) goes out, as one batch. The loop names
 *   no phase: a module registers its hook with its phase's rank, which its
 *   own header says (as libuv's and nginx's loops do not know their
 *   handlers).
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
 *   4. phases  by rank, lowest first; each phase's hooks in the order
 *              they were registered
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

/* A phase's place in a turn: phases run in ascending rank (0 first) after
 * the turn's events; hooks of one rank are one phase. The order is what
 * lets one turn's work leave in that same turn: a phase makes work for
 * those after it, none for those before, so a module that makes work for
 * another's phase takes a lower rank than that module's, and the order is
 * checked where both ranks are known (a _Static_assert in the module
 * above). A hook that makes work for a phase that already
 * ran this turn (a command appended after the writes) calls loop_again:
 * the next turn then does not wait. */
enum { LOOP_RANK_MAX = 999 };

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
/* Calls fn(l, ud) in the phase of rank `rank` (0 .. LOOP_RANK_MAX) of
 * every turn, after the hooks registered with that rank before it. A hook
 * added while the phases run runs in this turn when its rank is the
 * running phase's or a later one's, else from the next turn on. Returns 0,
 * or -1 (errno EINVAL: no fn, a rank out of range; ENOSPC: the phase is
 * full, or a new rank and the loop has as many phases as it holds). */
int loop_on_phase(loop *l, int rank, loop_fn *fn, void *ud);
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
