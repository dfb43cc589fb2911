/* aconn.h: a non-blocking Redis connection that lives on an event loop.
 *
 * Commands sent during one loop iteration are written together at its end
 * (one write per iteration, however many commands), and their replies are
 * handed to callbacks in order as they arrive, so a loop keeps many
 * commands in flight on one connection without a thread per round trip.
 *
 * - Setup: connecting is non-blocking; AUTH, SELECT, SCRIPT LOAD of the
 *   scripts given and INFO (for the server's run_id) go first, and the
 *   connection is `ready` once they are answered (aconn_state_fn says so).
 * - Timeouts: a command unanswered after timeout_ms fails the connection:
 *   every callback waiting gets NULL (the command may or may not have run).
 *   After a timeout the next connect waits one timeout more, so a stalled
 *   Redis is not asked again and again; after a refused connect, 100 ms.
 * - Scripts: an EVALSHA answered NOSCRIPT (the server lost its script
 *   cache) did not run; the scripts are loaded again and the command is
 *   sent again, transparently.
 *
 * hiredis 0.14 (Debian 12) has no timeouts in its async API, hence this
 * driver of its non-blocking context. All calls on the loop's thread. */
#ifndef FLASHSALE_ACONN_H
#define FLASHSALE_ACONN_H

#include <stddef.h>
#include <hiredis/hiredis.h>

#include "common/loop.h"
#include "common/rconn.h"

typedef struct aconn aconn;

/* The rank of the connections' loop phase (loop_on_phase): one write each
 * for everything the events and the phases before appended. Late, so that
 * whatever a module's phase writes leaves in the same turn: a module whose
 * phase appends commands takes a lower rank (and asserts it). */
#define ACONN_PHASE_RANK 900

/* A command's reply, or NULL when the connection failed first (then the
 * command may or may not have run). The reply is freed after the call. */
typedef void aconn_reply_fn(void *ud, redisReply *r);
/* The connection became ready (up = 1), or failed or gave up (up = 0). */
typedef void aconn_state_fn(aconn *c, int up, void *ud);

/* A connection to a (not connected yet: aconn_connect). scripts are
 * SCRIPT LOADed at every connect; they must outlive c. */
aconn *aconn_new(loop *l, const rconn_addr *a, int timeout_ms,
                 const rconn_script *const *scripts, int nscripts, aconn_state_fn *fn, void *ud);
/* Closes c; every callback waiting gets NULL first. The loop may go on
 * running (c's phase hook and timer are removed). */
void aconn_free(aconn *c);

/* Whether the setup is done: commands may be sent. */
int aconn_ready(const aconn *c);
/* Starts connecting when down. Returns 0 when ready or on its way, -1 when
 * a connect is not tried now (too soon after a failure, or it failed at
 * once: aconn_errstr). */
int aconn_connect(aconn *c);
/* Sends cmd (when ready); fn gets its reply. Returns 0, or -1 when not
 * ready (nothing was sent, fn is not called). */
int aconn_send(aconn *c, rconn_cmd *cmd, aconn_reply_fn *fn, void *ud);
/* Commands sent and not answered yet. */
int aconn_inflight(const aconn *c);
/* Points c at a (the primary moved, or the server said it is not the
 * primary any more): a connection to another place is dropped at once --
 * every callback waiting gets NULL, as for a failure -- and the next
 * connect, allowed at once, goes to a. why says why, for aconn_errstr. */
void aconn_retarget(aconn *c, const rconn_addr *a, const char *why);
/* The run_id of the server, once ready. */
const char *aconn_run_id(const aconn *c);
/* Why the connection last failed. */
const char *aconn_errstr(const aconn *c);

#endif
