/* traw.c: the unit tests' plain connection to the runner's redis-server
 * and the commands they poke it with (traw.h). One copy for every test
 * program, instead of one per test file. */
#include "tests/unit/traw.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rconn.h"

redisContext *traw_conn;

redisContext *traw_connect(const char *url) {
    rconn_addr a;
    char err[200];
    if (rconn_parse(url, &a, err, sizeof err)) return NULL;
    return rconn_connect(&a, 2000, err, sizeof err);
}

const char *traw_open(void) {
    const char *url = getenv("FLASHSALE_TEST_REDIS");
    rconn_addr a;
    char err[200];
    if (!url) {
        fprintf(stderr, "FLASHSALE_TEST_REDIS is not set (run through tests/run.py)\n");
    } else if (rconn_parse(url, &a, err, sizeof err) ||
               !(traw_conn = rconn_connect(&a, 2000, err, sizeof err))) {
        fprintf(stderr, "redis: %s\n", err);
    } else {
        return url;
    }
    printf("0 passed, 1 failed\n");
    exit(1);
}

void traw_close(void) {
    if (traw_conn) redisFree(traw_conn);
    traw_conn = NULL;
}

void traw_cmd(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(traw_conn, fmt, ap);
    va_end(ap);
    if (r) freeReplyObject(r);
}

long long traw_int(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(traw_conn, fmt, ap);
    va_end(ap);
    long long v = !r ? -999 : r->type == REDIS_REPLY_INTEGER ? r->integer
                  : r->type == REDIS_REPLY_STRING ? atoll(r->str) : -998;
    if (r) freeReplyObject(r);
    return v;
}

const char *traw_get(const char *key, char *buf, size_t len) {
    redisReply *r = redisCommand(traw_conn, "GET %s", key);
    snprintf(buf, len, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "");
    if (r) freeReplyObject(r);
    return buf;
}
