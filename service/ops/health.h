/* health.h: probed health of the dependencies (health.c): a thread per
 * store probes it every second, so /healthz answers from the latest
 * results and never waits on a dependency. */
#ifndef FLASHSALE_SERVICE_HEALTH_H
#define FLASHSALE_SERVICE_HEALTH_H

#include <stddef.h>
#include <stdint.h>

typedef struct svc_app svc_app;
typedef struct svc_health svc_health;
typedef enum svc_health_state { HEALTH_OK, HEALTH_DOWN, HEALTH_UNKNOWN } svc_health_state;
typedef struct svc_health_view {
    svc_health_state redis, db;
    int64_t redis_age_ms, db_age_ms;   /* since the latest probe completed; -1: none yet */
} svc_health_view;

svc_health *svc_health_start(svc_app *a, char *err, size_t errlen);
void svc_health_stop(svc_health *h);
/* Reads the latest probe results; never waits on a dependency. */
void svc_health_read(const svc_health *h, svc_health_view *v);
/* Asks for a database probe now (after a failed commit). Any thread. */
void svc_health_poke_db(svc_health *h);
const char *svc_health_state_name(svc_health_state s);

#endif
