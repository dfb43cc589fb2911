/* maint.h: the maintenance thread: the heartbeat that tells other
 * instances this one is alive, and the repair work on its schedule
 * (queued rebuilds and undo retries at once, sweeps of pending records
 * every two seconds: repair/repair.h). */
#ifndef FLASHSALE_SERVICE_MAINT_H
#define FLASHSALE_SERVICE_MAINT_H

#include <stddef.h>

typedef struct svc_app svc_app;
typedef struct svc_maint svc_maint;

svc_maint *svc_maint_start(svc_app *a, char *err, size_t errlen);
void svc_maint_stop(svc_maint *m);

#endif
