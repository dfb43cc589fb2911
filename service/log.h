/* log.h: the service's log: one line per event on stderr. */
#ifndef FLASHSALE_SERVICE_LOG_H
#define FLASHSALE_SERVICE_LOG_H

typedef enum svc_log_level {
    SVC_LOG_DEBUG, SVC_LOG_INFO, SVC_LOG_WARN, SVC_LOG_ERROR, SVC_LOG_QUIET
} svc_log_level;

void svc_log_set_level(svc_log_level lvl);
/* One line to stderr: time, level, message. Thread-safe. */
void svc_log(svc_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
