/* rconn.h: the Redis plumbing that lock/, stock/ and the tools share.
 *
 * - Addresses: "redis://[user:password@]host[:port][/db]" and
 *   "unix:/path/to/socket[?db=N]" (also "redis+unix:" / "unix://").
 * - Connections with a bounded connect timeout and a bounded command timeout,
 *   so a stalled Redis turns into an error within the timeout instead of a
 *   stuck thread.
 * - Lua scripts: the SHA1 of each script is computed here once, scripts are
 *   SCRIPT LOADed when a connection opens and called by EVALSHA; a NOSCRIPT
 *   answer (Redis restarted or flushed its script cache) falls back to EVAL,
 *   which also caches the script again.
 * - rconn_cmd: a reusable argument vector, so building a command on the hot
 *   path allocates nothing once it has grown to size.
 *
 * Errors are written to a caller-supplied buffer; nothing here is global
 * except the immutable script descriptors. */
#ifndef FLASHSALE_RCONN_H
#define FLASHSALE_RCONN_H

#include <stddef.h>
#include <hiredis/hiredis.h>

typedef struct rconn_addr {
    char host[256];       /* TCP host; empty for a unix socket */
    int port;             /* TCP port (default 6379) */
    char path[108];       /* unix socket path; empty for TCP */
    int db;               /* SELECT this database when > 0 */
    char user[128];       /* ACL user, optional */
    char password[256];   /* AUTH password, optional */
} rconn_addr;

/* Parses url into *a. Returns 0, or -1 with a message in err. */
int rconn_parse(const char *url, rconn_addr *a, char *err, size_t errlen);

/* Formats a for logs (never shows the password). Returns buf. */
const char *rconn_describe(const rconn_addr *a, char *buf, size_t len);

/* Connects to a with connect and command timeouts of timeout_ms, then does
 * AUTH and SELECT as a asks. Returns the context (free with redisFree), or
 * NULL with a message in err. */
redisContext *rconn_connect(const rconn_addr *a, int timeout_ms, char *err,
                            size_t errlen);

/* A Lua script embedded in the binary. Initialise once (not thread-safe),
 * then share between threads read-only. */
typedef struct rconn_script {
    const char *name;
    const char *src;
    char sha[41];
} rconn_script;

/* Fills s with name, src and the script's SHA1 in hex. */
void rconn_script_init(rconn_script *s, const char *name, const char *src);

/* SCRIPT LOADs each of n scripts on c. Returns 0, or -1 with err set. */
int rconn_script_load(redisContext *c, const rconn_script *const *scripts,
                      int n, char *err, size_t errlen);

/* A growable argument vector whose storage is reused between commands. */
typedef struct rconn_cmd {
    int argc, cap;
    size_t *off, *len;        /* argument i is buf[off[i]] .. +len[i] */
    const char **argv;        /* resolved pointers, rebuilt per send */
    char *buf;
    size_t used, bufcap;
} rconn_cmd;

void rconn_cmd_init(rconn_cmd *cmd);
void rconn_cmd_free(rconn_cmd *cmd);
void rconn_cmd_reset(rconn_cmd *cmd);
/* Adds one argument of len bytes. */
void rconn_cmd_add(rconn_cmd *cmd, const char *s, size_t len);
/* Adds a NUL-terminated argument. */
void rconn_cmd_adds(rconn_cmd *cmd, const char *s);
/* Adds a formatted argument (printf style). */
void rconn_cmd_addf(rconn_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Adds a signed integer argument. */
void rconn_cmd_addll(rconn_cmd *cmd, long long v);

/* Appends cmd to c's output buffer (pipelining; nothing is sent yet). */
int rconn_cmd_append(redisContext *c, rconn_cmd *cmd);

/* Starts an EVALSHA of script s with nkeys keys: the caller then adds the
 * keys and arguments to cmd and appends or runs it. */
void rconn_cmd_evalsha(rconn_cmd *cmd, const rconn_script *s, int nkeys);

/* True when r is a NOSCRIPT error: the command did not run. */
int rconn_is_noscript(const redisReply *r);

/* Runs an EVALSHA command built by rconn_cmd_evalsha synchronously, retrying
 * once with EVAL of the source on NOSCRIPT. Returns the reply (caller frees
 * with freeReplyObject) or NULL on an I/O error (see c->errstr). */
redisReply *rconn_cmd_run_script(redisContext *c, rconn_cmd *cmd,
                                 const rconn_script *s);

/* Runs cmd synchronously. Returns the reply or NULL on an I/O error. */
redisReply *rconn_cmd_run(redisContext *c, rconn_cmd *cmd);

/* Reads the server's run_id (INFO server) into out[41]. Returns 0 or -1. */
int rconn_run_id(redisContext *c, char out[41]);

#endif
