/* fence.c: lock_fenced_set, the C side of lock/lua/fence.lua: a write that
 * a stale lock holder (one whose lease ran out while it was paused) cannot
 * make, because a newer holder's larger token -- or a token of a newer
 * incarnation of the lock service -- has been recorded. */
#include "lock/redis_int.h"

#include <stdio.h>
#include <string.h>

int lock_fenced_set(lock_client *c, const char *fence_key, const char *key, uint64_t token,
                    uint64_t incarnation, const char *value, size_t value_len,
                    uint64_t *highest, char *err, size_t errlen) {
    char scratch[8], inc[17];
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof scratch;
    }
    if (!c || !fence_key || !key || (!value && value_len)) {
        snprintf(err, errlen, "lock_fenced_set: need a client, two keys and a value");
        return -1;
    }
    if (c->be != &lock_backend_redis) {
        /* The protected resource is in Redis; the token may come from any
         * kind of lock, the write needs a Redis client of its own. */
        snprintf(err, errlen, "lock_fenced_set: this is a %s lock client; write through a "
                 "redis:// client, passing lock_fence()'s token", c->be->name);
        lock_set_error(c, LOCK_ERR_ARG, err);
        return -1;
    }
    lock_call call;
    lock_replies rs;
    rconn_cmd_init(&call.cmd);
    lock_call_start(&call, LOCK_S_FENCE, 2);
    rconn_cmd_adds(&call.cmd, fence_key);
    rconn_cmd_adds(&call.cmd, key);
    rconn_cmd_addll(&call.cmd, (long long)token);
    rconn_cmd_add(&call.cmd, value ? value : "", value_len);
    lock_incarnation_hex(incarnation, inc);
    rconn_cmd_adds(&call.cmd, inc);
    lock_redis *rd = c->bstate;
    int rc = lock_run(rd, &call, 1, 1u, &rs);
    rconn_cmd_free(&call.cmd);
    if (rc) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const redisReply *r = LOCK_REPLY(&rs, 0, 0);
    rc = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_INTEGER) {
        rc = r->element[0]->integer == 1;
        if (!rc && highest) *highest = (uint64_t)r->element[1]->integer;
    } else {
        lock_replies_why(rd, &rs, 1u, err, errlen);
        lock_set_error(c, r ? LOCK_ERR_REDIS : LOCK_ERR_IO, err);
    }
    lock_replies_free(&rs);
    return rc;
}
