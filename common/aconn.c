/* aconn.c: the non-blocking Redis connection (see aconn.h).
 *
 * hiredis's non-blocking redisContext does the protocol: commands are
 * formatted into its output buffer (redisAppendCommandArgv), written with
 * redisBufferWrite, and replies parsed with redisBufferRead and
 * redisGetReplyFromReader. This file adds what the loop needs around it:
 * a FIFO of what each reply answers, the setup handshake, writes batched
 * to one per iteration (a hook in the loop's last phase, ACONN_PHASE_RANK),
 * timeouts (a loop timer), and
 * resending a command whose script the server had lost. */
#include "common/aconn.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"

#define RETRY_AFTER_REFUSAL_MS 100
#define CHECK_EVERY_MS 50

typedef enum kind { K_USER, K_SETUP, K_INFO, K_SCRIPT_LOAD } kind;

typedef struct pending {
    kind kind;
    aconn_reply_fn *fn;
    void *ud;
    int64_t sent_ms;
    char *evalsha;                 /* the formatted command, kept to resend on NOSCRIPT */
    size_t evalsha_len;
    int resent;                    /* sent again after a NOSCRIPT already */
} pending;

typedef enum state { S_DOWN, S_CONNECTING, S_SETUP, S_READY } state;

struct aconn {
    loop *l;
    rconn_addr addr;
    int timeout_ms;
    const rconn_script *const *scripts;
    int nscripts;
    aconn_state_fn *state_fn;
    void *state_ud;
    redisContext *ctx;
    state state;
    int fd;
    int want_write;                /* the output buffer is not empty */
    int unflushed;                 /* appended to since the last write */
    int64_t next_connect_ms;       /* no connect before then */
    int64_t connect_started_ms;
    pending *q;                    /* ring of replies awaited */
    size_t qcap, qhead, qlen;
    int setup_left;                /* setup replies still awaited */
    char run_id[41];
    char errstr[256];
};

/* ------------------------------------------------------------------ queue */

static int push(aconn *c, pending p) {
    if (c->qlen == c->qcap) {
        size_t cap = c->qcap ? c->qcap * 2 : 64;
        pending *q = malloc(cap * sizeof *q);
        if (!q) return -1;
        for (size_t i = 0; i < c->qlen; i++) q[i] = c->q[(c->qhead + i) % c->qcap];
        free(c->q);
        c->q = q;
        c->qcap = cap;
        c->qhead = 0;
    }
    c->q[(c->qhead + c->qlen++) % c->qcap] = p;
    return 0;
}

static pending pop(aconn *c) {
    pending p = c->q[c->qhead];
    c->qhead = (c->qhead + 1) % c->qcap;
    c->qlen--;
    return p;
}

/* ----------------------------------------------------------------- failure */

/* Drops the connection: every waiting callback gets NULL, in order. */
static void fail(aconn *c, const char *why, int64_t retry_in_ms) {
    snprintf(c->errstr, sizeof c->errstr, "%s", why);
    if (c->fd >= 0) loop_unwatch(c->l, c->fd);
    if (c->ctx) redisFree(c->ctx);
    c->ctx = NULL;
    c->fd = -1;
    c->state = S_DOWN;
    c->want_write = c->unflushed = 0;
    c->next_connect_ms = clock_mono_ms() + retry_in_ms;
    while (c->qlen) {
        pending p = pop(c);
        if (p.kind == K_USER) p.fn(p.ud, NULL);
        free(p.evalsha);
    }
    if (c->state_fn) c->state_fn(c, 0, c->state_ud);
}

static void fail_io(aconn *c, const char *what) {
    char why[256];
    snprintf(why, sizeof why, "redis %s: %s", what,
             c->ctx && c->ctx->err ? c->ctx->errstr : strerror(errno));
    fail(c, why, RETRY_AFTER_REFUSAL_MS);
}

/* ---------------------------------------------------------------- replies */

static void on_io(loop *l, int fd, unsigned events, void *ud);

static void watch_events(aconn *c) {
    unsigned ev = LOOP_READ | (c->want_write || c->state == S_CONNECTING ? LOOP_WRITE : 0);
    if (loop_watch(c->l, c->fd, ev, on_io, c) != 0) fail_io(c, "watch");
}

/* Sends the formatted cmd again (after SCRIPT LOADs): it did not run. Once:
 * a second NOSCRIPT (a script not among c's, which loading cannot cure) is
 * the command's answer, not a reason to go round again for ever. */
static int resend(aconn *c, pending p) {
    p.resent = 1;
    for (int i = 0; i < c->nscripts; i++) {
        if (redisAppendCommand(c->ctx, "SCRIPT LOAD %s", c->scripts[i]->src) != REDIS_OK ||
            push(c, (pending){ K_SCRIPT_LOAD, NULL, NULL, clock_mono_ms(), NULL, 0, 0 }) != 0)
            return -1;
    }
    if (redisAppendFormattedCommand(c->ctx, p.evalsha, p.evalsha_len) != REDIS_OK) return -1;
    p.sent_ms = clock_mono_ms();
    if (push(c, p) != 0) return -1;
    c->unflushed = 1;
    return 0;
}

static void setup_reply(aconn *c, pending *p, redisReply *r) {
    if (r->type == REDIS_REPLY_ERROR) {
        char why[256];
        snprintf(why, sizeof why, "redis setup: %s", r->str);
        fail(c, why, RETRY_AFTER_REFUSAL_MS);
        return;
    }
    if (p->kind == K_INFO) {
        const char *id = r->type == REDIS_REPLY_STRING ? strstr(r->str, "run_id:") : NULL;
        if (!id || strlen(id + 7) < 40) {
            fail(c, "redis setup: no run_id in INFO server", RETRY_AFTER_REFUSAL_MS);
            return;
        }
        memcpy(c->run_id, id + 7, 40);
        c->run_id[40] = '\0';
    }
    if (--c->setup_left == 0) {
        c->state = S_READY;
        if (c->state_fn) c->state_fn(c, 1, c->state_ud);
    }
}

/* Hands out every complete reply. Returns -1 when the connection failed. */
static int read_replies(aconn *c) {
    for (;;) {
        redisReply *r = NULL;
        if (redisGetReplyFromReader(c->ctx, (void **)&r) != REDIS_OK) {
            fail_io(c, "protocol");
            return -1;
        }
        if (!r) return 0;
        if (c->qlen == 0) {                    /* a reply nobody asked for */
            freeReplyObject(r);
            fail(c, "redis: unexpected reply", RETRY_AFTER_REFUSAL_MS);
            return -1;
        }
        pending p = pop(c);
        if (p.kind == K_USER && p.evalsha && !p.resent && rconn_is_noscript(r)) {
            freeReplyObject(r);
            if (resend(c, p) != 0) {
                free(p.evalsha);
                fail(c, "redis: out of memory", RETRY_AFTER_REFUSAL_MS);
                return -1;
            }
            continue;
        }
        if (p.kind == K_USER) {
            p.fn(p.ud, r);
        } else if (p.kind != K_SCRIPT_LOAD || r->type == REDIS_REPLY_ERROR) {
            setup_reply(c, &p, r);
        }
        free(p.evalsha);
        freeReplyObject(r);
        if (c->state == S_DOWN) return -1;     /* a callback or the setup failed it */
    }
}

/* Writes what is buffered; keeps watching for writability if some is left. */
static void write_out(aconn *c) {
    int done = 0;
    if (redisBufferWrite(c->ctx, &done) != REDIS_OK) {
        fail_io(c, "write");
        return;
    }
    if (c->want_write != !done) {
        c->want_write = !done;
        watch_events(c);
    }
}

static void begin_setup(aconn *c);

static void on_io(loop *l, int fd, unsigned events, void *ud) {
    aconn *c = ud;
    (void)l;
    (void)fd;
    if (c->state == S_CONNECTING) {
        if (!(events & LOOP_WRITE)) return;
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
            errno = err;
            fail_io(c, "connect");
            return;
        }
        c->ctx->flags |= REDIS_CONNECTED;
        begin_setup(c);
        return;
    }
    if (events & LOOP_READ) {
        if (redisBufferRead(c->ctx) != REDIS_OK) {
            fail_io(c, "read");
            return;
        }
        if (read_replies(c) != 0) return;
    }
    if ((events & LOOP_WRITE) && c->want_write) write_out(c);
}

/* ACONN_PHASE_RANK, the last phase of a loop turn: one write for all that
 * was sent in the turn (by its events and the phases before). */
static void flush(loop *l, void *ud) {
    aconn *c = ud;
    (void)l;
    if (c->ctx && c->state >= S_SETUP && c->unflushed) {
        c->unflushed = 0;
        write_out(c);
    }
}

/* Timer: a command waiting longer than the timeout fails the connection. */
static void check(loop *l, void *ud) {
    aconn *c = ud;
    int64_t now = clock_mono_ms();
    (void)l;
    if (c->state == S_CONNECTING && now - c->connect_started_ms > c->timeout_ms) {
        fail(c, "redis connect: timed out", c->timeout_ms);
        return;
    }
    if (c->qlen && now - c->q[c->qhead].sent_ms > c->timeout_ms) {
        char why[128];
        snprintf(why, sizeof why, "redis: no reply within %d ms", c->timeout_ms);
        fail(c, why, c->timeout_ms);
    }
}

/* ------------------------------------------------------------- lifecycle */

static void begin_setup(aconn *c) {
    int64_t now = clock_mono_ms();
    int ok = 1;
    c->state = S_SETUP;
    c->setup_left = 0;
    if (c->addr.password[0]) {
        ok &= (c->addr.user[0]
                   ? redisAppendCommand(c->ctx, "AUTH %s %s", c->addr.user, c->addr.password)
                   : redisAppendCommand(c->ctx, "AUTH %s", c->addr.password)) == REDIS_OK;
        ok &= push(c, (pending){ K_SETUP, NULL, NULL, now, NULL, 0, 0 }) == 0;
        c->setup_left++;
    }
    if (c->addr.db > 0) {
        ok &= redisAppendCommand(c->ctx, "SELECT %d", c->addr.db) == REDIS_OK;
        ok &= push(c, (pending){ K_SETUP, NULL, NULL, now, NULL, 0, 0 }) == 0;
        c->setup_left++;
    }
    for (int i = 0; i < c->nscripts; i++) {
        ok &= redisAppendCommand(c->ctx, "SCRIPT LOAD %s", c->scripts[i]->src) == REDIS_OK;
        ok &= push(c, (pending){ K_SETUP, NULL, NULL, now, NULL, 0, 0 }) == 0;
        c->setup_left++;
    }
    ok &= redisAppendCommand(c->ctx, "INFO server") == REDIS_OK;
    ok &= push(c, (pending){ K_INFO, NULL, NULL, now, NULL, 0, 0 }) == 0;
    c->setup_left++;
    if (!ok) {
        fail(c, "redis setup: out of memory", RETRY_AFTER_REFUSAL_MS);
        return;
    }
    c->want_write = 1;
    watch_events(c);
    if (c->state != S_DOWN) write_out(c);
}

aconn *aconn_new(loop *l, const rconn_addr *a, int timeout_ms,
                 const rconn_script *const *scripts, int nscripts, aconn_state_fn *fn, void *ud) {
    aconn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->l = l;
    c->addr = *a;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 1000;
    c->scripts = scripts;
    c->nscripts = nscripts;
    c->state_fn = fn;
    c->state_ud = ud;
    c->fd = -1;
    if (loop_on_phase(l, ACONN_PHASE_RANK, flush, c) != 0 || loop_every(l, CHECK_EVERY_MS, check, c) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

void aconn_free(aconn *c) {
    if (!c) return;
    assert(loop_owned(c->l));
    c->state_fn = NULL;
    if (c->ctx || c->qlen) fail(c, "closed", 0);
    loop_forget(c->l, c);                        /* its phase hook and check timer */
    free(c->q);
    free(c);
}

int aconn_ready(const aconn *c) {
    assert(loop_owned(c->l));
    return c->state == S_READY;
}

int aconn_inflight(const aconn *c) {
    assert(loop_owned(c->l));
    return (int)c->qlen;
}
const char *aconn_run_id(const aconn *c) { return c->run_id; }

void aconn_retarget(aconn *c, const rconn_addr *a, const char *why) {
    assert(loop_owned(c->l));
    c->addr = *a;
    if (c->state != S_DOWN) fail(c, why, 0);
    else c->next_connect_ms = 0;
}
const char *aconn_errstr(const aconn *c) { return c->errstr; }

int aconn_connect(aconn *c) {
    assert(loop_owned(c->l));
    if (c->state != S_DOWN) return 0;
    int64_t now = clock_mono_ms();
    if (now < c->next_connect_ms) return -1;
    c->ctx = c->addr.path[0] ? redisConnectUnixNonBlock(c->addr.path)
                             : redisConnectNonBlock(c->addr.host, c->addr.port);
    if (!c->ctx || c->ctx->err) {
        fail_io(c, "connect");
        return -1;
    }
    c->fd = c->ctx->fd;
    c->state = S_CONNECTING;
    c->connect_started_ms = now;
    watch_events(c);
    return c->state == S_DOWN ? -1 : 0;
}

int aconn_send(aconn *c, rconn_cmd *cmd, aconn_reply_fn *fn, void *ud) {
    assert(loop_owned(c->l));
    if (c->state != S_READY) return -1;
    for (int i = 0; i < cmd->argc; i++) cmd->argv[i] = cmd->buf + cmd->off[i];
    pending p = { K_USER, fn, ud, clock_mono_ms(), NULL, 0, 0 };
    if (cmd->argc > 0 && cmd->len[0] == 7 && !memcmp(cmd->argv[0], "EVALSHA", 7)) {
        /* Kept formatted, to send again as it was if the script is lost. */
        char *f = NULL;
        int n = redisFormatCommandArgv(&f, cmd->argc, cmd->argv, cmd->len);
        if (n < 0 || redisAppendFormattedCommand(c->ctx, f, (size_t)n) != REDIS_OK) {
            free(f);
            return -1;
        }
        p.evalsha = f;
        p.evalsha_len = (size_t)n;
    } else if (redisAppendCommandArgv(c->ctx, cmd->argc, cmd->argv, cmd->len) != REDIS_OK) {
        return -1;
    }
    if (push(c, p) != 0) {
        /* Appended but unaccounted for: the replies would no longer match. */
        free(p.evalsha);
        fail(c, "redis: out of memory", RETRY_AFTER_REFUSAL_MS);
        return -1;
    }
    c->unflushed = 1;
    return 0;
}
