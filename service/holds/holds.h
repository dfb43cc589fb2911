/* holds.h: ending holds -- confirm, cancel, expiry -- and giving their units
 * back to the stock. The whole face of service/holds/.
 *
 * SQLite decides every end (db/holds.h); this part then gives the units
 * back to the Redis copy (stock_return) and clears the debt. The expiry
 * thread ends the holds whose deadline has passed, at most a tick after it,
 * on whichever instance gets there first, and finishes the returns a
 * decider left undone (it died, Redis was down). */
#ifndef FLASHSALE_SERVICE_HOLDS_H
#define FLASHSALE_SERVICE_HOLDS_H

#include <stddef.h>

#include "db/holds.h"

typedef struct svc_app svc_app;
typedef struct svc_holds svc_holds;

/* Starts the expiry thread. NULL with err set when it cannot start. */
svc_holds *svc_holds_start(svc_app *a, char *err, size_t errlen);
/* Stops it (within a tick) and frees h; NULL is fine. */
void svc_holds_stop(svc_holds *h);

/* Decides dc (its order_id, to, user_id, payment_ref set by the caller) in
 * the committer's next group commit, waiting for it on the calling thread
 * (which may block; never the committer's): now_ms and stock_in_db are
 * filled in here. When it ended the hold, the units are given back before it
 * returns (or, when Redis fails, left owed for the expiry thread). Returns
 * as db_hold_decide; DB_NOCONN when no database connection of the
 * instance was free in time (nothing decided). */
db_status svc_hold_decide(svc_app *a, db_decision *dc);

#endif
