/* rconn.c: Redis addresses, bounded connections, scripts by EVALSHA.
 * See rconn.h for the contract. */
#include "common/rconn.h"

#include <assert.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* ---------------------------------------------------------------- addresses */

static int parse_int(const char *s, size_t n, int lo, int hi, int *out) {
    long v = 0;
    if (n == 0 || n > 9) return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int copy_part(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap) return -1;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 0;
}

static int parse_unix(const char *rest, rconn_addr *a, char *err, size_t errlen) {
    const char *q = strchr(rest, '?');
    size_t n = q ? (size_t)(q - rest) : strlen(rest);
    if (n == 0 || rest[0] != '/' || copy_part(a->path, sizeof a->path, rest, n)) {
        snprintf(err, errlen, "bad unix socket path in Redis URL");
        return -1;
    }
    if (q) {
        if (strncmp(q, "?db=", 4) != 0 ||
            parse_int(q + 4, strlen(q + 4), 0, 1000000, &a->db)) {
            snprintf(err, errlen, "bad ?db= in Redis URL");
            return -1;
        }
    }
    return 0;
}

int rconn_parse(const char *url, rconn_addr *a, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    a->port = 6379;
    if (!url || !*url) {
        snprintf(err, errlen, "empty Redis URL");
        return -1;
    }
    if (!strncmp(url, "unix://", 7)) return parse_unix(url + 7, a, err, errlen);
    if (!strncmp(url, "redis+unix://", 13)) return parse_unix(url + 13, a, err, errlen);
    if (!strncmp(url, "unix:", 5)) return parse_unix(url + 5, a, err, errlen);

    const char *p = url;
    if (!strncmp(p, "redis://", 8)) p += 8;
    else if (strstr(p, "://")) {
        snprintf(err, errlen, "unsupported Redis URL scheme (want redis:// or unix:)");
        return -1;
    }
    const char *end = p + strcspn(p, "/");
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon) {
            if (copy_part(a->user, sizeof a->user, p, (size_t)(colon - p)) ||
                copy_part(a->password, sizeof a->password, colon + 1,
                          (size_t)(at - colon - 1)))
                goto bad;
        } else if (copy_part(a->password, sizeof a->password, p, (size_t)(at - p))) {
            goto bad;
        }
        p = at + 1;
    }
    const char *colon = memchr(p, ':', (size_t)(end - p));
    const char *hend = colon ? colon : end;
    if (hend == p || copy_part(a->host, sizeof a->host, p, (size_t)(hend - p)))
        goto bad;
    if (colon && parse_int(colon + 1, (size_t)(end - colon - 1), 1, 65535, &a->port))
        goto bad;
    if (*end == '/' && end[1] && parse_int(end + 1, strlen(end + 1), 0, 1000000, &a->db))
        goto bad;
    return 0;
bad:
    snprintf(err, errlen, "bad Redis URL '%s' (want redis://host:port/db or unix:/path)", url);
    return -1;
}

const char *rconn_describe(const rconn_addr *a, char *buf, size_t len) {
    if (a->path[0]) snprintf(buf, len, "unix:%s db %d", a->path, a->db);
    else snprintf(buf, len, "%s:%d db %d", a->host, a->port, a->db);
    return buf;
}

/* -------------------------------------------------------------- connections */

redisContext *rconn_connect(const rconn_addr *a, int timeout_ms, char *err,
                            size_t errlen) {
    struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
    redisContext *c = a->path[0] ? redisConnectUnixWithTimeout(a->path, tv)
                                 : redisConnectWithTimeout(a->host, a->port, tv);
    redisReply *r = NULL;
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (c->err) {
        snprintf(err, errlen, "connect: %s", c->errstr);
        goto err;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        snprintf(err, errlen, "set timeout: %s", c->errstr);
        goto err;
    }
    if (a->password[0]) {
        r = a->user[0] ? redisCommand(c, "AUTH %s %s", a->user, a->password)
                       : redisCommand(c, "AUTH %s", a->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "AUTH: %s", r ? r->str : c->errstr);
            goto err;
        }
        freeReplyObject(r);
        r = NULL;
    }
    if (a->db > 0) {
        r = redisCommand(c, "SELECT %d", a->db);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "SELECT %d: %s", a->db, r ? r->str : c->errstr);
            goto err;
        }
        freeReplyObject(r);
    }
    return c;
err:
    if (r) freeReplyObject(r);
    redisFree(c);
    return NULL;
}

int rconn_run_id(redisContext *c, char out[41]) {
    redisReply *r = redisCommand(c, "INFO server");
    int rc = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "run_id:");
        if (p && strlen(p + 7) >= 40) {
            memcpy(out, p + 7, 40);
            out[40] = '\0';
            rc = 0;
        }
    }
    if (r) freeReplyObject(r);
    return rc;
}

/* ------------------------------------------------------------------- SHA-1 */

/* SHA-1 is what Redis names scripts by; computing it here lets every
 * connection call EVALSHA without first asking the server for the name. */
typedef struct { uint32_t h[5]; uint64_t n; unsigned char blk[64]; size_t used; } sha1_ctx;

static uint32_t rol(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

static void sha1_block(sha1_ctx *s, const unsigned char *p) {
    uint32_t w[80], a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
        else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
        else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
        else { f = b ^ c ^ d; k = 0xCA62C1D6; }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d; d = c; c = rol(b, 30); b = a; a = t;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e;
}

static void sha1_update(sha1_ctx *s, const unsigned char *p, size_t n) {
    s->n += n;
    while (n > 0) {
        size_t k = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->blk + s->used, p, k);
        s->used += k; p += k; n -= k;
        if (s->used == 64) { sha1_block(s, s->blk); s->used = 0; }
    }
}

static void sha1_hex(const char *data, size_t n, char out[41]) {
    sha1_ctx s = { { 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0 }, 0, {0}, 0 };
    unsigned char pad[72] = { 0x80 };
    sha1_update(&s, (const unsigned char *)data, n);
    uint64_t bits = s.n * 8;
    size_t padlen = (s.used < 56 ? 56 : 120) - s.used;
    for (int i = 0; i < 8; i++) pad[padlen + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha1_update(&s, pad, padlen + 8);
    assert(s.used == 0);
    for (int i = 0; i < 5; i++) sprintf(out + 8 * i, "%08x", s.h[i]);
}

/* ------------------------------------------------------------------ scripts */

void rconn_script_init(rconn_script *s, const char *name, const char *src) {
    s->name = name;
    s->src = src;
    sha1_hex(src, strlen(src), s->sha);
}

int rconn_script_load(redisContext *c, const rconn_script *const *scripts, int n,
                      char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        redisAppendCommand(c, "SCRIPT LOAD %s", scripts[i]->src);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            snprintf(err, errlen, "SCRIPT LOAD: %s", c->errstr);
            return -1;
        }
        if (r->type != REDIS_REPLY_STRING || strcmp(r->str, scripts[i]->sha) != 0) {
            snprintf(err, errlen, "SCRIPT LOAD %s: %s", scripts[i]->name,
                     r->type == REDIS_REPLY_ERROR ? r->str : "unexpected SHA");
            rc = -1;
        }
        freeReplyObject(r);
    }
    return rc;
}

int rconn_is_noscript(const redisReply *r) {
    return r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8);
}

/* --------------------------------------------------------------- arguments */

void rconn_cmd_init(rconn_cmd *cmd) { memset(cmd, 0, sizeof *cmd); }

void rconn_cmd_free(rconn_cmd *cmd) {
    free(cmd->off);
    free(cmd->len);
    free(cmd->argv);
    free(cmd->buf);
    memset(cmd, 0, sizeof *cmd);
}

void rconn_cmd_reset(rconn_cmd *cmd) { cmd->argc = 0; cmd->used = 0; }

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) { fputs("out of memory\n", stderr); abort(); }
    return q;
}

void rconn_cmd_add(rconn_cmd *cmd, const char *s, size_t len) {
    if (cmd->argc == cmd->cap) {
        cmd->cap = cmd->cap ? cmd->cap * 2 : 16;
        cmd->off = xrealloc(cmd->off, sizeof *cmd->off * (size_t)cmd->cap);
        cmd->len = xrealloc(cmd->len, sizeof *cmd->len * (size_t)cmd->cap);
        cmd->argv = xrealloc(cmd->argv, sizeof *cmd->argv * (size_t)cmd->cap);
    }
    if (cmd->used + len + 1 > cmd->bufcap) {
        while (cmd->used + len + 1 > cmd->bufcap) cmd->bufcap = cmd->bufcap ? cmd->bufcap * 2 : 512;
        cmd->buf = xrealloc(cmd->buf, cmd->bufcap);
    }
    memcpy(cmd->buf + cmd->used, s, len);
    cmd->buf[cmd->used + len] = '\0';
    cmd->off[cmd->argc] = cmd->used;
    cmd->len[cmd->argc] = len;
    cmd->argc++;
    cmd->used += len + 1;
}

void rconn_cmd_adds(rconn_cmd *cmd, const char *s) { rconn_cmd_add(cmd, s, strlen(s)); }

void rconn_cmd_addf(rconn_cmd *cmd, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    assert(n >= 0 && (size_t)n < sizeof tmp);
    rconn_cmd_add(cmd, tmp, (size_t)n);
}

void rconn_cmd_addll(rconn_cmd *cmd, long long v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%lld", v);
    rconn_cmd_add(cmd, tmp, (size_t)n);
}

static void resolve(rconn_cmd *cmd) {
    for (int i = 0; i < cmd->argc; i++) cmd->argv[i] = cmd->buf + cmd->off[i];
}

int rconn_cmd_append(redisContext *c, rconn_cmd *cmd) {
    resolve(cmd);
    return redisAppendCommandArgv(c, cmd->argc, cmd->argv, cmd->len) == REDIS_OK ? 0 : -1;
}

void rconn_cmd_evalsha(rconn_cmd *cmd, const rconn_script *s, int nkeys) {
    rconn_cmd_reset(cmd);
    rconn_cmd_add(cmd, "EVALSHA", 7);
    rconn_cmd_add(cmd, s->sha, 40);
    rconn_cmd_addll(cmd, nkeys);
}

redisReply *rconn_cmd_run(redisContext *c, rconn_cmd *cmd) {
    resolve(cmd);
    return redisCommandArgv(c, cmd->argc, cmd->argv, cmd->len);
}

redisReply *rconn_cmd_run_script(redisContext *c, rconn_cmd *cmd, const rconn_script *s) {
    redisReply *r = rconn_cmd_run(c, cmd);
    if (!rconn_is_noscript(r)) return r;
    freeReplyObject(r);
    /* Same arguments with EVAL and the source in place of the SHA. */
    cmd->argv[0] = "EVAL";
    cmd->len[0] = 4;
    cmd->argv[1] = s->src;
    cmd->len[1] = strlen(s->src);
    return redisCommandArgv(c, cmd->argc, cmd->argv, cmd->len);
}
