/* jobs.c: what the API's routes share (api_int.h): the answers every
 * route may give (a validation error, a store down, 401), reading the
 * Idempotency-Key, and deferring a request to an API worker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/utf8.h"
#include "service/api/api_int.h"
#include "service/ops/health.h"

/* ------------------------------------------------------------------ helpers */

const char *const api_retry[] = { "Retry-After", "1", NULL };

char *api_json_escape(char *p, const char *s) {
    static const char HEX[] = "0123456789abcdef";
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *p++ = '\\';
            *p++ = (char)*c;
        } else if (*c < 0x20) {
            memcpy(p, "\\u00", 4);
            p[4] = HEX[*c >> 4];
            p[5] = HEX[*c & 15];
            p += 6;
        } else {
            *p++ = (char)*c;
        }
    }
    return p;
}

void api_reply_verr(http_req *r, const svc_verr *e) {
    http_reply_error(r, e->status, e->code, "%s", e->message);
}

void api_reply_db_down(http_req *r, svc_app *a, const char *doing) {
    atomic_fetch_add(&a->m.db_errors, 1);
    svc_health_poke_db(a->health);
    http_reply_error_with(r, 503, "db_unavailable", NULL, api_retry,
                          "The database is unavailable (%s); nothing was changed. Retry shortly.",
                          doing);
}

void api_reply_db_busy(http_req *r, const char *doing) {
    http_reply_error_with(r, 503, "overloaded", NULL, api_retry,
                          "Every database connection of this instance stayed in use (%s); "
                          "nothing was changed. Retry after Retry-After seconds.", doing);
}

void api_reply_db_failed(http_req *r, svc_app *a, int busy, const char *doing) {
    if (busy) api_reply_db_busy(r, doing);
    else api_reply_db_down(r, a, doing);
}


/* Constant-time comparison: the time taken does not depend on where the
 * strings first differ, so the token cannot be guessed byte by byte. */
static int same_secret(const char *given, const char *want) {
    size_t gl = strlen(given), wl = strlen(want);
    unsigned char diff = (unsigned char)(gl != wl);
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)(want[i] ^ given[i < gl ? i : 0]);
    return diff == 0;
}

/* Admin endpoints need the bearer token when one is configured. */
int api_authorized(http_req *r, svc_app *a) {
    if (!a->cfg.admin_token[0]) return 1;
    const char *h;
    /* The scheme is case-insensitive (RFC 9110 11.1), then one or more
     * spaces before the token. */
    if (http_header(r, "Authorization", &h) == 1 && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (same_secret(h, a->cfg.admin_token)) return 1;
    }
    const char *www[] = { "WWW-Authenticate", "Bearer", NULL };
    http_reply_error_with(r, 401, "unauthorized", NULL, www,
                          "This endpoint needs 'Authorization: Bearer <admin token>'.");
    return 0;
}

/* Reads the Idempotency-Key header into key (DB_KEY_MAX + 1 bytes; "" when
 * absent). Answers 400 and returns -1 when it is malformed. */
int api_idem_key(http_req *r, char *key) {
    const char *v;
    int rc = http_header(r, "Idempotency-Key", &v);
    key[0] = '\0';
    if (rc == 0) return 0;
    if (rc < 0 || !svc_valid_idem_key(v)) {
        http_reply_error(r, 400, "invalid_field",
                         "The Idempotency-Key header must be sent once, as 1 to 128 visible "
                         "ASCII characters.");
        return -1;
    }
    snprintf(key, DB_KEY_MAX + 1, "%s", v);
    return 0;
}

void api_reply_unknown_sku(http_req *r, const char *sku) {
    char clip[80];
    http_reply_error(r, 404, "unknown_sku", "No product has SKU '%s'.",
                     utf8_clip(clip, sizeof clip, sku));
}

/* ---------------------------------------------------------- deferred jobs */

static void run_job(svc_task *t) {
    api_job *j = (api_job *)t;            /* the task is its first member */
    j->run(j);
    json_decref(j->body);
    free(j);
}

/* Defers r to an API worker of lane running run(j). Takes j (and j->body). */
void api_defer(http_req *r, api_job *j, api_lane lane, void (*run)(api_job *j)) {
    j->r = r;
    j->run = run;
    j->task.run = run_job;
    http_defer(r);
    svc_threadpool_submit(lane == LANE_DB ? j->a->api_db : j->a->api, &j->task);
}

api_job *api_job_new(http_req *r, svc_app *a, json_t *body) {
    api_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(body);
        http_reply_error_with(r, 503, "shutting_down", NULL, api_retry,
                              "The service is out of memory; retry shortly.");
        return NULL;
    }
    j->a = a;
    j->body = body;
    return j;
}

