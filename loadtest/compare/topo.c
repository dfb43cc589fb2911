/* topo.c: what the Redis failures group (failures.c) asks of the Redis
 * servers and sentinels it started: who is primary, whether a replica is in
 * sync, cutting a replica off from replication, and reading a lock key on
 * one server. Plain hiredis on a fresh loopback connection per question:
 * the servers are killed and started again under our feet, so no
 * connection is kept, and nothing here goes through the service's routing
 * (flashload shares no code with the service).
 *
 * How a replica is made to miss writes, deterministically (as
 * tests/topology.py does it, where the ways that do not work are listed):
 * the primary's default user loses PSYNC and SYNC, and the replica's link
 * is killed from the replica's side. The replica reconnects every second
 * and is refused, so nothing written from then on reaches it, and it stays
 * a replica the sentinels may promote. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hiredis/hiredis.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"

redisReply *fl_rcmd(int port, int timeout_ms, fl_err *e, const char *fmt, ...) {
    struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        fl_errf(e, "127.0.0.1:%d: %s", port, c ? c->errstr : "out of memory");
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r) fl_errf(e, "127.0.0.1:%d: %s", port, c->errstr);
    else if (r->type == REDIS_REPLY_ERROR) {
        fl_errf(e, "127.0.0.1:%d: %s", port, r->str);
        freeReplyObject(r);
        r = NULL;
    }
    redisFree(c);
    return r;
}

int fl_rget(int port, const char *key, char *out, size_t len) {
    fl_err e;
    redisReply *r = fl_rcmd(port, 500, &e, "GET %s", key);
    if (!r) return -1;
    int found = r->type == REDIS_REPLY_STRING;
    snprintf(out, len, "%s", found ? r->str : "");
    freeReplyObject(r);
    return found;
}

int fl_is_master(int port) {
    fl_err e;
    redisReply *r = fl_rcmd(port, 500, &e, "ROLE");
    int yes = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
              r->element[0]->type == REDIS_REPLY_STRING && !strcmp(r->element[0]->str, "master");
    freeReplyObject(r);
    return yes;
}

/* The value of field in an INFO answer ("name:value\r\n" lines). */
static int info_field(const char *info, const char *field, char *out, size_t len) {
    size_t fl = strlen(field);
    for (const char *l = info; l && *l;) {
        if (!strncmp(l, field, fl) && l[fl] == ':') {
            size_t vl = strcspn(l + fl + 1, "\r\n");
            snprintf(out, len, "%.*s", (int)vl, l + fl + 1);
            return 0;
        }
        l = strchr(l, '\n');
        if (l) l++;
    }
    return -1;
}

int fl_replica_of(int port, int primary) {
    fl_err e;
    redisReply *r = fl_rcmd(port, 500, &e, "INFO replication");
    if (!r) return -1;
    char mport[16] = "", link[16] = "";
    int ok = r->type == REDIS_REPLY_STRING && r->str &&
             !info_field(r->str, "master_port", mport, sizeof mport) &&
             !info_field(r->str, "master_link_status", link, sizeof link) &&
             atoi(mport) == primary && !strcmp(link, "up");
    freeReplyObject(r);
    return ok;
}

int fl_sentinel_master(const fl_proc *s, int n, const char *name) {
    int agreed = 0;
    for (int i = 0; i < n; i++) {
        fl_err e;
        if (s[i].pid <= 0) continue;
        redisReply *r = fl_rcmd(s[i].port, 500, &e, "SENTINEL GET-MASTER-ADDR-BY-NAME %s", name);
        int port = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                           r->element[1]->type == REDIS_REPLY_STRING
                       ? atoi(r->element[1]->str) : 0;
        freeReplyObject(r);
        if (!port || (agreed && port != agreed)) return 0;
        agreed = port;
    }
    return agreed;
}

/* The "flags" of each entry of a SENTINEL REPLICAS / SENTINELS answer
 * (flat name, value lists); how many entries, and how many say exactly
 * want (NULL: any). */
static int entries(const redisReply *r, const char *want, int *matching) {
    *matching = 0;
    if (!r || r->type != REDIS_REPLY_ARRAY) return -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *x = r->element[i];
        if (!want) {
            (*matching)++;
            continue;
        }
        for (size_t k = 0; x->type == REDIS_REPLY_ARRAY && k + 1 < x->elements; k += 2)
            if (x->element[k]->str && !strcmp(x->element[k]->str, "flags") &&
                x->element[k + 1]->str && !strcmp(x->element[k + 1]->str, want))
                (*matching)++;
    }
    return (int)r->elements;
}

int fl_sentinels_know(const fl_proc *s, int n, const char *name, int replicas) {
    for (int i = 0; i < n; i++) {
        fl_err e;
        int m;
        redisReply *r = fl_rcmd(s[i].port, 500, &e, "SENTINEL SENTINELS %s", name);
        int others = entries(r, NULL, &m);
        freeReplyObject(r);
        if (others != n - 1) return 0;
        r = fl_rcmd(s[i].port, 500, &e, "SENTINEL REPLICAS %s", name);
        entries(r, "slave", &m);
        freeReplyObject(r);
        if (m != replicas) return 0;
    }
    return 1;
}

int fl_replica_cut(int primary, int replica, fl_err *e) {
    redisReply *r = fl_rcmd(primary, 2000, e, "ACL SETUSER default -psync -sync");
    if (!r) return -1;
    freeReplyObject(r);
    if (!(r = fl_rcmd(replica, 2000, e, "CLIENT KILL TYPE master"))) return -1;
    freeReplyObject(r);
    for (int64_t until = clock_mono_ms() + 5000; clock_mono_ms() < until; clock_sleep_ms(10))
        if (fl_replica_of(replica, primary) == 0) return 0;
    return fl_errf(e, "the replica at %d kept its link to %d", replica, primary);
}

int fl_replica_wait(int primary, int timeout_ms, fl_err *e) {
    redisReply *r = fl_rcmd(primary, timeout_ms + 1000, e, "WAIT 1 %d", timeout_ms);
    if (!r) return -1;
    long long n = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    return n >= 1 ? 0 : fl_errf(e, "the replica did not acknowledge within %d ms", timeout_ms);
}

int fl_sentinel_failover(int sentinel, const char *name, int timeout_ms, fl_err *e) {
    /* NOGOODSLAVE until the sentinel has heard from the replica since its
     * last INFO; INPROG: a failover runs already, which will do. */
    for (int64_t until = clock_mono_ms() + timeout_ms;; clock_sleep_ms(100)) {
        fl_err te = { "" };
        redisReply *r = fl_rcmd(sentinel, 1000, &te, "SENTINEL FAILOVER %s", name);
        int done = r != NULL || strstr(te.msg, "INPROG") != NULL;
        freeReplyObject(r);
        if (done) return 0;
        if (clock_mono_ms() > until)
            return fl_errf(e, "SENTINEL FAILOVER %s: %.200s", name, te.msg);
    }
}
