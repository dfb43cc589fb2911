/* room.c: a product's waiting room in Redis (room.h): the place a buyer
 * takes (room_take.lua) and an instance's beat (room_tick.lua), both in
 * the product's slot, on a blocking connection. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "stock/internal.h"
#include "stock/room.h"

/* ------------------------------------------------------------- a place */

static int take_at(stock_conn *c, const stock_product *p, const stock_room_ask *ask,
                   stock_room_place *out) {
    int n = ask->n;
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_evalsha(&c->cmd, &sk_room_take, 5);
    sk_add_key(c, p->sku, "room");
    sk_add_key(c, p->sku, "room:users");
    sk_add_key(c, p->sku, "room:marks");
    sk_add_key(c, p->sku, "room:at");
    sk_add_key(c, p->sku, "room:pre");
    rconn_cmd_addll(&c->cmd, ask->floor);
    rconn_cmd_addll(&c->cmd, ask->turn_ms);
    rconn_cmd_addll(&c->cmd, ask->opens_ms);
    for (int i = 0; i < n; i++) {
        rconn_cmd_adds(&c->cmd, ask->users[i]);
        rconn_cmd_addll(&c->cmd, ask->draws ? (long long)(ask->draws[i] & STOCK_ROOM_DRAW_MAX) : 0);
    }
    /* Safe to repeat: a place taken once is its user's, found again. */
    redisReply *rep = sk_run_idempotent(c, "room places");
    if (!rep) return -1;
    int rc = -1;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 3) {
        long long serving = sk_elem_int(rep, 0), now = sk_elem_int(rep, 2);
        int sold_out = sk_elem_int(rep, 1) == 1;
        if (sold_out || rep->elements == 3 + 3 * (size_t)n) {
            for (int i = 0; i < n; i++) {
                out[i] = (stock_room_place){ .serving = serving, .sold_out = sold_out,
                                             .now_ms = now };
                if (sold_out) continue;
                out[i].position = sk_elem_int(rep, 3 + 3 * (size_t)i);
                out[i].issued_ms = sk_elem_int(rep, 4 + 3 * (size_t)i);
                out[i].fresh = sk_elem_int(rep, 5 + 3 * (size_t)i) == 1;
                out[i].pre_queue = out[i].position == 0;
            }
            rc = 0;
        }
    }
    if (rc) sk_bad_reply(c, "room places", rep);
    freeReplyObject(rep);
    return rc;
}

int stock_room_take(stock_conn *c, const stock_product *p, const stock_room_ask *ask,
                    stock_room_place *out) {
    assert(ask->turn_ms > 0 && ask->n > 0 && ask->n <= STOCK_ROOM_TAKE_MAX);
    assert(ask->opens_ms >= 0);
    int rc = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++) rc = take_at(c, p, ask, out);
    return rc;
}

/* -------------------------------------------------------------- a beat */

static const char *EVENTS[] = { [STOCK_ROOM_NONE] = "", [STOCK_ROOM_SOLD_OUT] = "sold_out",
                                [STOCK_ROOM_REOPEN] = "reopen" };

static int parse_beat(const redisReply *rep, stock_room_state *out) {
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 6 ||
        rep->element[5]->type != REDIS_REPLY_ARRAY)
        return -1;
    out->seq = sk_elem_int(rep, 0);
    out->serving = strtod(sk_elem_str(rep, 1), NULL);
    out->now_ms = sk_elem_int(rep, 2);
    out->rate = strtod(sk_elem_str(rep, 3), NULL);
    out->sold_out_ms = sk_elem_int(rep, 4);
    const redisReply *m = rep->element[5];
    out->nmarks = 0;
    for (size_t i = 0; i + 1 < m->elements && out->nmarks < STOCK_ROOM_MARKS_MAX; i += 2) {
        out->mark_pos[out->nmarks] = sk_elem_int(m, i);
        out->mark_ms[out->nmarks++] = sk_elem_int(m, i + 1);
    }
    return out->seq >= 0 && out->serving >= 0 ? 0 : -1;
}

static int beat_at(stock_conn *c, const stock_product *p, const stock_room_beat *in,
                   stock_room_state *out) {
    /* The units left are read where the stock is in the room's slot. */
    int stock_here = stock_strategy_about(p->strategy)->uses_redis && p->lanes == 0;
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_evalsha(&c->cmd, &sk_room_tick, 5 + (stock_here ? p->segments : 0));
    sk_add_key(c, p->sku, "room");
    sk_add_key(c, p->sku, "room:marks");
    sk_add_key(c, p->sku, "room:rates");
    sk_add_key(c, p->sku, "room:done");
    sk_add_key(c, p->sku, "room:at");
    if (stock_here) sk_add_segment_keys(c, p);
    rconn_cmd_adds(&c->cmd, c->instance);
    rconn_cmd_addf(&c->cmd, "%.3f", in->rate > 0 ? in->rate : 0);
    rconn_cmd_addll(&c->cmd, in->fixed_rate);
    rconn_cmd_addll(&c->cmd, in->marks_from);
    rconn_cmd_addll(&c->cmd, in->floor_seq);
    rconn_cmd_addll(&c->cmd, in->floor_serving);
    rconn_cmd_adds(&c->cmd, EVENTS[in->event]);
    rconn_cmd_addll(&c->cmd, STOCK_ROOM_MARKS_MAX);
    rconn_cmd_addll(&c->cmd, in->turn_ms);
    char *done = malloc((size_t)in->ndone * 21 + 1);
    if (!done) return -1;
    size_t len = 0;
    for (int i = 0; i < in->ndone; i++)
        len += (size_t)sprintf(done + len, "%s%lld", i ? "," : "", in->done[i]);
    done[len] = '\0';
    rconn_cmd_adds(&c->cmd, done);
    free(done);
    /* Safe to repeat: the counter moves by the time since it last moved. */
    redisReply *rep = sk_run_idempotent(c, "room beat");
    if (!rep) return -1;
    int rc = parse_beat(rep, out);
    if (rc) sk_bad_reply(c, "room beat", rep);
    freeReplyObject(rep);
    return rc;
}

int stock_room_beat_run(stock_conn *c, const stock_product *p, const stock_room_beat *in,
                        stock_room_state *out) {
    assert(in->event <= STOCK_ROOM_REOPEN);
    int rc = -1;
    for (int a = 0; sk_again(c, p->sku, a); a++) rc = beat_at(c, p, in, out);
    return rc;
}

/* ------------------------------------------------------------ the secret */

#define SECRET_TAG "room-secret"

static int secret_at(stock_conn *c, const char *proposal, char *out, size_t len) {
    rconn_cmd_reset(&c->cmd);
    rconn_cmd_adds(&c->cmd, "SET");
    sk_add_key(c, SECRET_TAG, "key");
    rconn_cmd_adds(&c->cmd, proposal);
    rconn_cmd_adds(&c->cmd, "NX");
    rconn_cmd_adds(&c->cmd, "GET");       /* Redis >= 7: the value kept, or nil if none was */
    redisReply *rep = sk_run_idempotent(c, "room secret");
    if (!rep) return -1;
    int rc = -1;
    if (rep->type == REDIS_REPLY_NIL) {
        snprintf(out, len, "%s", proposal);
        rc = 0;
    } else if (rep->type == REDIS_REPLY_STRING && rep->len > 0 && rep->len < len) {
        memcpy(out, rep->str, rep->len);
        out[rep->len] = '\0';
        rc = 0;
    } else {
        sk_bad_reply(c, "room secret", rep);
    }
    freeReplyObject(rep);
    return rc;
}

int stock_room_secret(stock_conn *c, const char *proposal, char *out, size_t len) {
    int rc = -1;
    for (int a = 0; sk_again(c, SECRET_TAG, a); a++) rc = secret_at(c, proposal, out, len);
    return rc;
}
