/* url.c: the three forms of --redis (one server, Sentinel, Cluster) into
 * an rtopo_spec, and the "host:port" pieces the rest of rtopo/ parses.
 * One server is rconn_parse's business; the two others are lists of
 * addresses whose mistakes (an empty entry, a bad port, a missing master
 * name, a database for a cluster) must each get a message that says which.
 * See rtopo.h for the contract. */
#include "rtopo/rtopo.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "rtopo/internal.h"

#define SENTINEL_SCHEME "redis-sentinel://"
#define CLUSTER_SCHEME "redis-cluster://"
#define SENTINEL_PORT 26379
#define NODE_PORT 6379

/* ------------------------------------------------------- shared pieces */

int rtopo_copy(char *dst, size_t cap, const char *s, size_t n) {
    assert(dst && (s || n == 0));
    if (cap == 0) return -1;
    if (n >= cap) {
        dst[0] = '\0';
        return -1;
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 0;
}

int rtopo_port_parse(const char *s, size_t n, int *port) {
    long v = 0;
    if (n == 0 || n > 5) return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535) return -1;
    *port = (int)v;
    return 0;
}

int rtopo_hostport(const char *s, size_t n, int defport, char *host, size_t hostcap,
                   int *port) {
    const char *end = s + n, *h = s, *hend, *colon;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || close == s + 1) return -1;
        h = s + 1;
        hend = close;
        colon = close + 1 < end ? close + 1 : NULL;
        if (colon && *colon != ':') return -1;
    } else {
        colon = NULL;
        for (const char *p = s; p < end; p++)
            if (*p == ':') colon = p;
        hend = colon ? colon : end;
    }
    if (hend == h || memchr(h, ',', (size_t)(hend - h)) || memchr(h, ' ', (size_t)(hend - h)))
        return -1;
    if (colon) {
        if (rtopo_port_parse(colon + 1, (size_t)(end - colon - 1), port)) return -1;
    } else if (defport > 0) {
        *port = defport;
    } else {
        return -1;
    }
    return rtopo_copy(host, hostcap, h, (size_t)(hend - h));
}

void rtopo_node_addr(const rtopo_spec *spec, const char *host, int port, rconn_addr *out) {
    memset(out, 0, sizeof *out);
    rtopo_copy(out->host, sizeof out->host, host, strnlen(host, sizeof out->host - 1));
    out->port = port;
    out->db = spec->db;
    memcpy(out->user, spec->user, sizeof out->user);
    memcpy(out->password, spec->password, sizeof out->password);
}

/* ------------------------------------------------------------- the URL */

/* "[[user]:password@]": sets the credentials, returns what follows. The
 * last '@' ends them (a password may hold '/', '?' or '@'; a list or a
 * master name may not). */
static const char *parse_auth(const char *p, rtopo_spec *s, char *err, size_t errlen) {
    const char *at = strrchr(p, '@');
    if (!at) return p;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (!colon) {
        snprintf(err, errlen, "bad credentials in Redis URL (want [user]:password@)");
        return NULL;
    }
    if (rtopo_copy(s->user, sizeof s->user, p, (size_t)(colon - p)) ||
        rtopo_copy(s->password, sizeof s->password, colon + 1, (size_t)(at - colon - 1))) {
        snprintf(err, errlen, "user or password too long in Redis URL");
        return NULL;
    }
    return at + 1;
}

/* "host[:port][,host[:port]...]" between p and end, into spec's seeds. */
static int parse_list(const char *p, const char *end, int defport, rtopo_spec *s, char *err,
                      size_t errlen) {
    if (p == end) {
        snprintf(err, errlen, "empty address list in Redis URL");
        return -1;
    }
    for (int i = 1;; i++) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *e = comma ? comma : end;
        rconn_addr *a = &s->seeds[s->nseeds];
        if (s->nseeds == RTOPO_MAX_SEEDS) {
            snprintf(err, errlen, "more than %d addresses in Redis URL", RTOPO_MAX_SEEDS);
            return -1;
        }
        if (e == p) {
            snprintf(err, errlen, "address %d of the list in Redis URL is empty", i);
            return -1;
        }
        if (rtopo_hostport(p, (size_t)(e - p), defport, a->host, sizeof a->host, &a->port)) {
            snprintf(err, errlen, "bad address '%.*s' in Redis URL (want host[:port], port "
                     "1-65535, [v6addr] for IPv6)", (int)(e - p), p);
            return -1;
        }
        s->nseeds++;
        if (!comma) return 0;
        p = comma + 1;
    }
}

/* The master name and ?db=N after the sentinel list. */
static int parse_master(const char *p, rtopo_spec *s, char *err, size_t errlen) {
    size_t n = strcspn(p, "?");
    if (*p != '/' || n < 2) {
        snprintf(err, errlen, "missing master name in Sentinel URL "
                 "(want redis-sentinel://host:port[,host:port...]/<master-name>)");
        return -1;
    }
    if (strcspn(p + 1, "/@, \t\r\n") < n - 1 ||
        rtopo_copy(s->master, sizeof s->master, p + 1, n - 1)) {
        snprintf(err, errlen, "bad master name '%.*s' in Sentinel URL", (int)(n - 1), p + 1);
        return -1;
    }
    const char *q = p + n;
    if (!*q) return 0;
    long v = 0;
    size_t dn = strlen(q + 4);
    int ok = !strncmp(q, "?db=", 4) && dn > 0 && dn <= 7 && strspn(q + 4, "0123456789") == dn;
    for (size_t i = 0; ok && i < dn; i++) v = v * 10 + (q[4 + i] - '0');
    if (!ok) {
        snprintf(err, errlen, "bad query '%s' in Sentinel URL (want ?db=N)", q);
        return -1;
    }
    s->db = (int)v;
    return 0;
}

/* What may follow the cluster list: nothing, or a lone "/". */
static int cluster_tail(const char *p, char *err, size_t errlen) {
    if (!*p || !strcmp(p, "/")) return 0;
    if (strstr(p, "db=") || (p[0] == '/' && p[1] >= '0' && p[1] <= '9'))
        snprintf(err, errlen, "a database given for Redis Cluster, which has only database 0");
    else
        snprintf(err, errlen, "unexpected '%s' after the address list of a Cluster URL", p);
    return -1;
}

static int parse_multi(const char *url, rtopo_spec *s, char *err, size_t errlen) {
    int sentinel = !strncmp(url, SENTINEL_SCHEME, strlen(SENTINEL_SCHEME));
    const char *p = url + strlen(sentinel ? SENTINEL_SCHEME : CLUSTER_SCHEME);
    s->kind = sentinel ? RTOPO_SENTINEL : RTOPO_CLUSTER;
    if (!(p = parse_auth(p, s, err, errlen))) return -1;
    const char *end = p + strcspn(p, "/?");
    if (parse_list(p, end, sentinel ? SENTINEL_PORT : NODE_PORT, s, err, errlen)) return -1;
    if (sentinel ? parse_master(end, s, err, errlen) : cluster_tail(end, err, errlen)) return -1;
    for (int i = 0; i < s->nseeds; i++) {
        rconn_addr *a = &s->seeds[i];
        if (sentinel) continue;     /* sentinels: no credentials, db 0 */
        memcpy(a->user, s->user, sizeof a->user);
        memcpy(a->password, s->password, sizeof a->password);
    }
    assert(s->nseeds >= 1 && s->nseeds <= RTOPO_MAX_SEEDS);
    return 0;
}

int rtopo_parse(const char *url, rtopo_spec *spec, char *err, size_t errlen) {
    memset(spec, 0, sizeof *spec);
    if (url && (!strncmp(url, SENTINEL_SCHEME, strlen(SENTINEL_SCHEME)) ||
                !strncmp(url, CLUSTER_SCHEME, strlen(CLUSTER_SCHEME)))) {
        if (parse_multi(url, spec, err, errlen) == 0) return 0;
        memset(spec, 0, sizeof *spec);
        return -1;
    }
    if (url && (!strncmp(url, "redis-sentinel:", 15) || !strncmp(url, "redis-cluster:", 14))) {
        snprintf(err, errlen, "bad Redis URL '%s' (want redis-sentinel:// or redis-cluster://)",
                 url);
        return -1;
    }
    spec->kind = RTOPO_SINGLE;
    if (rconn_parse(url, &spec->seeds[0], err, errlen)) return -1;
    spec->nseeds = 1;
    spec->db = spec->seeds[0].db;
    memcpy(spec->user, spec->seeds[0].user, sizeof spec->user);
    memcpy(spec->password, spec->seeds[0].password, sizeof spec->password);
    return 0;
}

const char *rtopo_describe(const rtopo_spec *spec, char *buf, size_t len) {
    size_t used = 0;
    if (spec->kind == RTOPO_SINGLE) return rconn_describe(&spec->seeds[0], buf, len);
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "%s ", spec->kind == RTOPO_SENTINEL ? "sentinel" :
                             "cluster");
    for (int i = 0; i < spec->nseeds && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s:%d", i ? "," : "",
                                 spec->seeds[i].host, spec->seeds[i].port);
    if (spec->kind == RTOPO_SENTINEL && used < len)
        snprintf(buf + used, len - used, " master %s db %d", spec->master, spec->db);
    return buf;
}
