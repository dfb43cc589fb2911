/* sentinel.c: finding the primary of a Sentinel-watched Redis, and
 * hearing when it changes.
 *
 * A sentinel's answer is only its belief: one that was cut off during a
 * failover, or misconfigured, may name a replica or a dead server. So the
 * address named is connected to and asked ROLE, and taken only when it
 * says master; otherwise the next sentinel is asked. A failover is
 * announced on each sentinel's +switch-master channel as
 * "<name> <old-ip> <old-port> <new-ip> <new-port>".
 * See rtopo.h for the contract. */
#include "rtopo/rtopo.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "rtopo/internal.h"

/* A reply is the bulk string word (exactly). */
static int is_word(const redisReply *r, const char *word) {
    size_t n = strlen(word);
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) &&
           r->len == n && !memcmp(r->str, word, n);
}

int rtopo_sentinel_addr(const redisReply *r, const rtopo_spec *spec, rconn_addr *out,
                        char *err, size_t errlen) {
    char host[256];
    int port;
    if (!r) {
        snprintf(err, errlen, "no answer");
        return -1;
    }
    if (r->type == REDIS_REPLY_NIL) {
        snprintf(err, errlen, "does not know a master named '%s'", spec->master);
        return -1;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s", r->str);
        return -1;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[0]->len == 0 || memchr(r->element[0]->str, '\0', r->element[0]->len) ||
        rtopo_copy(host, sizeof host, r->element[0]->str, r->element[0]->len) ||
        rtopo_port_parse(r->element[1]->str, r->element[1]->len, &port)) {
        snprintf(err, errlen, "not an address answer to get-master-addr-by-name");
        return -1;
    }
    rtopo_node_addr(spec, host, port, out);
    return 0;
}

int rtopo_role_is_master(const redisReply *r, char *err, size_t errlen) {
    if (r && r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "ROLE: %s", r->str);
        return -1;
    }
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "not an answer to ROLE");
        return -1;
    }
    const redisReply *role = r->element[0];
    if (is_word(role, "master")) return 1;
    if (is_word(role, "slave") && r->elements >= 3 && r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[2]->type == REDIS_REPLY_INTEGER)
        snprintf(err, errlen, "ROLE says it is a replica (of %.*s:%lld)",
                 (int)(r->element[1]->len > 255 ? 255 : r->element[1]->len), r->element[1]->str,
                 r->element[2]->integer);
    else
        snprintf(err, errlen, "ROLE says it is a %.*s, not a master",
                 (int)(role->len > 32 ? 32 : role->len), role->str);
    return 0;
}

int rtopo_check_master(const rconn_addr *a, int timeout_ms, char *err, size_t errlen) {
    char why[320];
    redisContext *c = rconn_connect(a, timeout_ms, why, sizeof why);
    redisReply *r = NULL;
    int rc = -1;
    if (!c) goto out;
    if (!(r = redisCommand(c, "ROLE"))) {
        snprintf(why, sizeof why, "ROLE: %s", c->errstr);
        goto out;
    }
    if (rtopo_role_is_master(r, why, sizeof why) == 1) rc = 0;
out:
    if (rc) snprintf(err, errlen, "%s:%d: %s", a->host, a->port, why);
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    return rc;
}

/* Asks the sentinel at s; 0 with *primary checked, or -1 with why. */
static int ask_sentinel(const rtopo_spec *spec, const rconn_addr *s, int timeout_ms,
                        rconn_addr *primary, char *why, size_t whylen) {
    redisContext *c = rconn_connect(s, timeout_ms, why, whylen);
    redisReply *r = NULL;
    int rc = -1;
    if (!c) return -1;
    r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", spec->master);
    if (!r) {
        snprintf(why, whylen, "%s", c->errstr);
        goto out;
    }
    if (rtopo_sentinel_addr(r, spec, primary, why, whylen)) goto out;
    char check[400];
    if (rtopo_check_master(primary, timeout_ms, check, sizeof check)) {
        snprintf(why, whylen, "named %s", check);
        goto out;
    }
    rc = 0;
out:
    if (r) freeReplyObject(r);
    redisFree(c);
    return rc;
}

int rtopo_sentinel_discover(const rtopo_spec *spec, int timeout_ms, rconn_addr *primary,
                            char *err, size_t errlen) {
    char all[1024] = "", why[512];
    size_t used = 0;
    if (spec->kind != RTOPO_SENTINEL) {
        snprintf(err, errlen, "not a Sentinel address");
        return -1;
    }
    for (int i = 0; i < spec->nseeds; i++) {
        const rconn_addr *s = &spec->seeds[i];
        if (ask_sentinel(spec, s, timeout_ms, primary, why, sizeof why) == 0) return 0;
        if (used < sizeof all)
            used += (size_t)snprintf(all + used, sizeof all - used, "%ssentinel %s:%d: %s",
                                     i ? "; " : "", s->host, s->port, why);
    }
    snprintf(err, errlen, "no primary for '%s': %s", spec->master, all);
    return -1;
}

/* ----------------------------------------------------- +switch-master */

redisContext *rtopo_sentinel_subscribe(const rtopo_spec *spec, int timeout_ms, char *err,
                                       size_t errlen) {
    char why[320] = "no sentinel";
    for (int i = 0; i < spec->nseeds; i++) {
        redisContext *c = rconn_connect(&spec->seeds[i], timeout_ms, why, sizeof why);
        if (!c) continue;
        redisReply *r = redisCommand(c, "SUBSCRIBE +switch-master");
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            is_word(r->element[0], "subscribe")) {
            freeReplyObject(r);
            return c;
        }
        snprintf(why, sizeof why, "%s:%d: SUBSCRIBE: %s", spec->seeds[i].host,
                 spec->seeds[i].port, !r ? c->errstr : r->type == REDIS_REPLY_ERROR ? r->str :
                 "unexpected answer");
        if (r) freeReplyObject(r);
        redisFree(c);
    }
    snprintf(err, errlen, "cannot subscribe to +switch-master: %s", why);
    return NULL;
}

/* The payload "<name> <old-ip> <old-port> <new-ip> <new-port>". */
static int read_switch(const char *s, size_t n, rtopo_switch *sw) {
    const char *tok[5], *end = s + n;
    size_t len[5];
    for (int i = 0; i < 5; i++) {
        if (s >= end || *s == ' ') return -1;
        const char *sp = memchr(s, ' ', (size_t)(end - s));
        tok[i] = s;
        len[i] = (size_t)((sp ? sp : end) - s);
        if ((i < 4) != (sp != NULL)) return -1;
        s = sp ? sp + 1 : end;
    }
    if (rtopo_copy(sw->name, sizeof sw->name, tok[0], len[0]) ||
        rtopo_copy(sw->old_host, sizeof sw->old_host, tok[1], len[1]) ||
        rtopo_copy(sw->new_host, sizeof sw->new_host, tok[3], len[3]) ||
        rtopo_port_parse(tok[2], len[2], &sw->old_port) ||
        rtopo_port_parse(tok[4], len[4], &sw->new_port))
        return -1;
    return 0;
}

int rtopo_switch_parse(const redisReply *r, const char *name, rtopo_switch *sw, char *err,
                       size_t errlen) {
    rtopo_switch tmp;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "not a pub/sub message");
        return -1;
    }
    if (!is_word(r->element[0], "message") || !is_word(r->element[1], "+switch-master"))
        return 0;
    const redisReply *p = r->element[2];
    if (r->elements != 3 || p->type != REDIS_REPLY_STRING || memchr(p->str, '\0', p->len) ||
        read_switch(p->str, p->len, &tmp)) {
        snprintf(err, errlen, "malformed +switch-master message");
        return -1;
    }
    if (strcmp(tmp.name, name) != 0) return 0;
    *sw = tmp;
    return 1;
}

int rtopo_sentinel_wait_switch(redisContext *c, const char *name, int timeout_ms,
                               rtopo_switch *sw, char *err, size_t errlen) {
    int64_t until = clock_mono_ms() + timeout_ms;
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(c->reader, &reply) != REDIS_OK) {
            snprintf(err, errlen, "protocol error on the sentinel connection");
            return -1;
        }
        if (reply) {
            int rc = rtopo_switch_parse(reply, name, sw, err, errlen);
            freeReplyObject(reply);
            if (rc) return rc;
            continue;
        }
        int64_t left = until - clock_mono_ms();
        if (left <= 0) return 0;
        struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
        int n = poll(&pfd, 1, (int)left);
        if (n == 0) return 0;
        if (n < 0) continue;     /* EINTR: the deadline is checked again */
        if (redisBufferRead(c) != REDIS_OK) {
            snprintf(err, errlen, "sentinel connection: %s", c->errstr);
            return -1;
        }
    }
}
