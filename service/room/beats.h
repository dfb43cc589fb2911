/* beats.h: the thread that beats this instance's waiting rooms
 * (room.h): every STOCK_ROOM_TICK_MS, for each cached product with a
 * room, its order path's load makes the instance's rate and the beat
 * brings the room's view. It also learns the tickets' secret when none is
 * configured (the one kept in Redis): until then tickets are refused as
 * Redis being unavailable. */
#ifndef FLASHSALE_SERVICE_ROOM_BEATS_H
#define FLASHSALE_SERVICE_ROOM_BEATS_H

#include <stddef.h>

typedef struct svc_app svc_app;
typedef struct svc_room_beats svc_room_beats;

svc_room_beats *svc_room_beats_start(svc_app *a, char *err, size_t errlen);
void svc_room_beats_stop(svc_room_beats *b);

/* The tickets' secret, or NULL while it is not known yet. Any thread. */
const char *svc_room_secret(svc_app *a);

#endif
