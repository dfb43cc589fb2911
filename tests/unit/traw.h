/* traw.h: what the unit tests that use the runner's redis-server share
 * (FLASHSALE_TEST_REDIS, which tests/run.py starts and names): a plain
 * blocking connection to it, to look at and poke the keys the code under
 * test keeps, and the few commands they look and poke with.
 *
 * traw.c is no test program of its own: the Makefile links it into every
 * unit test (tests/unit/test_*.c), and a test that calls none of it takes
 * none of it. */
#ifndef FLASHSALE_TRAW_H
#define FLASHSALE_TRAW_H

#include <stddef.h>

#include <hiredis/hiredis.h>

/* The connection traw_open made; a test may point it at another server
 * for a while (and back). */
extern redisContext *traw_conn;

/* Connects traw_conn to FLASHSALE_TEST_REDIS and returns its URL. When it
 * is not set or cannot be reached, says why on stderr and the runner's
 * summary line ("0 passed, 1 failed") on stdout, and exits 1. */
const char *traw_open(void);
/* Closes traw_conn (NULL after). */
void traw_close(void);
/* A new plain connection to the Redis at url (2 s timeouts), or NULL. */
redisContext *traw_connect(const char *url);

/* Runs a command (hiredis format) on traw_conn; its reply is dropped. */
void traw_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs a command on traw_conn: its integer reply, or a string reply read
 * as a number; -999 when no reply came, -998 for a reply of another type
 * (nil, an error, an array). */
long long traw_int(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* GET key into buf ("" when missing); returns buf. */
const char *traw_get(const char *key, char *buf, size_t len);

#endif
