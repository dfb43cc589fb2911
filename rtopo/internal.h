/* internal.h: what the files of rtopo/ share and nobody else needs:
 * "host:port" parsing (URLs, MOVED/ASK, +switch-master) and a bounded
 * copy. Private to rtopo/ (tools/layering.py). */
#ifndef FLASHSALE_RTOPO_INTERNAL_H
#define FLASHSALE_RTOPO_INTERNAL_H

#include <stddef.h>

/* Parses a port of n bytes (1..65535). Returns 0 or -1. */
int rtopo_port_parse(const char *s, size_t n, int *port);

/* Parses "host:port", "[v6addr]:port" or, when defport > 0, a lone host
 * ("host", "[v6addr]") into host (NUL-terminated, at most hostcap - 1
 * bytes, brackets dropped) and *port. Without brackets the port follows
 * the last colon, so an IPv6 address as Redis writes it in a MOVED
 * ("::1:7000") parses too; in that form, a lone host may hold no colon.
 * Returns 0 or -1. */
int rtopo_hostport(const char *s, size_t n, int defport, char *host, size_t hostcap,
                   int *port);

/* Copies n bytes of s into dst (cap bytes) with a NUL. Returns 0, or -1
 * (nothing copied but an empty string) when it does not fit. */
int rtopo_copy(char *dst, size_t cap, const char *s, size_t n);

#endif
