/* lock.h: a distributed lock on Redis, ZooKeeper or etcd -- the lock
 * module's whole public face.
 *
 * A lease lock that waits without polling, renews itself, hands out fencing
 * tokens, counts reentry, and runs over one Redis server or, as Redlock,
 * over several independent ones -- or over ZooKeeper or etcd, behind the
 * same calls. It is a library of its own: it needs hiredis, the ZooKeeper
 * C client (libzookeeper_mt), libcurl, jansson and common/ (rconn, clock),
 * nothing of the service.
 *
 * One client serves one kind of server, chosen by the scheme of its URLs:
 *   redis://host:port/db, unix:/path   Redis (several: Redlock)
 *   zk://host:port[,host:port...][/base]   ZooKeeper (one URL; an ensemble
 *                                      is listed inside it)
 *   etcd://host:port[,host:port...][/prefix]   etcd (one URL; endpoints are
 *                                      tried in turn when one refuses)
 * Mixing schemes in one client is refused. Sections marked REDIS, ZOOKEEPER
 * and ETCD below say how each kind stores the lock; the rest holds for all.
 *
 * THE FORMAT, REDIS (what is in Redis, so other clients can interoperate)
 *
 *   The lock NAME is the full Redis key. Its hash tag B is NAME when NAME
 *   has a {tag} of its own (e.g. "fs:{sku}:lock:3"), else "{NAME}" (so
 *   "jobs" derives "{jobs}:fence"). A NAME with braces but no valid {tag}
 *   is refused. Keys and channels:
 *
 *     NAME            string "<id>:<fence>", set with SET NX PX <ttl>:
 *                     <id> is 32 lowercase hex digits, 128 random bits from
 *                     getrandom(2), new for every acquire; <fence> is the
 *                     fencing token in decimal. Because the lock is a plain
 *                     string taken with SET NX, it excludes redis-py's Lock,
 *                     redsync, node-redlock and anything else that takes the
 *                     same key with SET NX. Ownership is "the value starts
 *                     with <id>:", checked inside Lua, never by GET then DEL.
 *     B:fence         the fencing counter (INCR on every acquire). It never
 *                     expires: tokens must never go back.
 *     B:incarnation   16 lowercase hex digits: the incarnation the counter
 *                     belongs to (INCARNATIONS below), stored by the first
 *                     acquire that finds none (its random proposal) and, in
 *                     Redlock, by settling a new one. It never expires.
 *     B:waiters       sorted set of waiting clients, scored by arrival
 *                     (server TIME in microseconds). It expires a few
 *                     seconds after the last waiter joined or retried.
 *     B:wake:<waiter> pub/sub channel of one waiter (not a key). A release
 *                     pops waiters from B:waiters in arrival order and
 *                     PUBLISHes to each until one had a listener, so one
 *                     release wakes one live waiter, not a stampede; gone
 *                     waiters (PUBLISH reached nobody) are dropped as met.
 *     B:fair          sorted set: a fair lock's waiters (FAIRNESS), scored
 *                     by ticket (one more than the last one's) -- their
 *                     arrival order. With B:fair:due (sorted set: when each
 *                     one's place lapses, Redis's clock in ms) and
 *                     B:fair:sub (set: those listening on their wake
 *                     channel). They expire a few seconds after the last
 *                     waiter's last call.
 *     B:wake:         pub/sub channel (the bare prefix): a release PUBLISHes
 *                     "released" here just before its DEL, in the same
 *                     script, so a client watching the key's keyspace
 *                     notifications knows that this DEL was one of ours
 *                     (which wakes its queue itself) and not a foreign one.
 *
 *   This format is written once, as Lua functions (lock/lua/format.lua):
 *   every script of this module that touches a lock is built on them, and
 *   lock_script_compose builds a caller's script on them, for one that
 *   takes or frees a lock inside its own atomic step.
 *
 * THE FORMAT, ZOOKEEPER. The recipe of ZooKeeper's documentation and of
 * Curator's InterProcessMutex, in Curator's node format (so the two
 * exclude each other on the same path; not tested against Curator here):
 *
 *     BASE            the URL's path (default /locks): persistent nodes,
 *                     created if missing. Everything lives under it.
 *     BASE/N          one container node per lock name (created as needed;
 *                     the server deletes it once it is empty). N is the
 *                     name with every byte outside printable ASCII
 *                     (0x21-0x7e), and '/' and '%', written as %XX
 *                     (uppercase hex), and a name "." or ".." written
 *                     %2E / %2E%2E: names are opaque bytes, one path
 *                     component each, and distinct names stay distinct
 *                     ("a/b" -> BASE/a%2Fb, "caf\xc3\xa9" -> BASE/caf%C3%A9).
 *     BASE/N/_c_<guid>-lock-<seq>
 *                     one EPHEMERAL_SEQUENTIAL node per acquire: <guid> is
 *                     32 random hex digits (new for every attempt: a create
 *                     whose answer was lost is found and deleted by it),
 *                     <seq> the server's 10-digit sequence. Data:
 *                     "flashsale-lock host=H pid=P". Children sort by what
 *                     follows their last "lock-"; the first holds the lock.
 *     BASE/%incarnation
 *                     a persistent node holding 16 lowercase hex digits,
 *                     the server's incarnation (INCARNATIONS below),
 *                     created if missing (by whoever comes first, with
 *                     its random id). No escaped name starts "%i", so no
 *                     lock's container can be it.
 *
 *   A waiter watches (getData) only the node just before its own and looks
 *   again when that one goes: one release wakes one waiter, no herd. The
 *   token is the own node's czxid (the zxid of its create): zxids grow
 *   across the whole ensemble, a later holder's node was created later, so
 *   tokens strictly increase per name -- and keep increasing when the
 *   container (and with it the sequence counter) is deleted and recreated,
 *   which a sequence number would not.
 *
 *   The lease is the ZooKeeper session: the client opens one session per
 *   distinct ttl asked (at most 16), requesting ttl as the session timeout;
 *   the server clamps it to its [min,max]SessionTimeout (by default 2 and 20
 *   ticks) and the negotiated timeout is the lease. The client library's
 *   heartbeats keep the session; a keeper thread sends a small request every
 *   timeout/3, and the lease ends timeout - drift after the send of the last
 *   request the server answered. When that passes unconfirmed (server
 *   silent, network cut, process paused), or the server says the session
 *   expired, every lock of the session is lost (lock_lost, on_lost -- on the
 *   keeper thread) and the session is closed (if the server can be told,
 *   that deletes its nodes at once; if not, the server expires it in its own
 *   time, and until then others still wait); later acquires open a new one. options.watchdog
 *   has no effect: a held node lives as long as its session. A held node
 *   deleted by anyone else is reported lost at once (a watch on it).
 *
 * THE FORMAT, ETCD. etcd's own recipe (its concurrency.Mutex, the v3lock
 * service, `etcdctl lock`), in the same keys, so they exclude each other:
 *
 *     P<name>/<lease> one key per acquire, attached to a lease of its own:
 *                     P is the URL's path without its leading '/' plus "/"
 *                     ("" without a path: then the keys are exactly those
 *                     of `etcdctl lock <name>`), <lease> the lease id in
 *                     lowercase hex. Created in a transaction only if
 *                     absent (create_revision == 0). Value:
 *                     "flashsale-lock host=H pid=P".
 *     %incarnation    one key for the whole cluster, whatever the prefix,
 *                     holding 16 lowercase hex digits: its incarnation
 *                     (INCARNATIONS below), created if absent (a txn) by
 *                     the first acquire that finds none. It has no '/', so
 *                     it is under no lock name's range.
 *
 *   The holder is the key with the lowest create revision under
 *   "P<name>/"; a waiter watches only the key created just before its own
 *   (the highest create revision below its own) for deletion. The token is
 *   the own key's create revision: revisions grow with every write, so
 *   tokens strictly increase per name. The lease is ttl rounded up to whole
 *   seconds (etcd's unit; the server may raise it to its minimum, by
 *   default 2 s, and the granted TTL is the lease); it is kept alive every
 *   TTL/3 while waiting, and while held by the watchdog (options.watchdog;
 *   without it the lease runs out after TTL, as a Redis lease does). A
 *   renewal is a lease keepalive plus a look at the key. Because names are
 *   prefixes, a lock on "a" also waits for holders of names "a/...".
 *
 *   Both: giving up a wait (timeout) deletes the own node or key (etcd:
 *   revokes its lease); a release deletes it only if it is still ours (the
 *   node by its path in our session; the key by its create revision), and
 *   etcd then revokes the lease. A server that loses its data (restarted
 *   empty) forgets locks and restarts its zxids/revisions: holders are told
 *   (lost), new tokens are smaller than old ones, and they carry a new
 *   incarnation (INCARNATIONS), which a fence orders after the old one.
 *
 * WAITING, REDIS. lock_acquire with a wait first tries once; if the lock is held it
 * subscribes to its own wake channel (one shared subscriber connection per
 * server and client), and only then retries, atomically joining B:waiters
 * if still held, so a release between the retry and the wait is never
 * missed. Between wake-ups it waits at most min(the holder's remaining
 * PTTL, a jittered exponential backoff up to max_backoff_ms), so it also
 * sees a lock that expired or was freed by a client that does not publish.
 * This lock is not fair: a newcomer may take a free lock before the woken
 * waiter's retry arrives (the waiter then keeps its place in the queue),
 * and so may a waiter whose re-check comes at that moment. For a lock
 * that serves in arrival order, see FAIRNESS.
 *
 * FAIRNESS, REDIS (options.fair). The property Alibaba Cloud's
 * article "Implementation Principles and Best Practices of Distributed Lock"
 * names in its section 6.1: "when the lock
 * wakes up, it does so in sequence". The same lock value, taken only by
 * the head of its queue (B:fair): the waiter that asked first holds next,
 * whichever client or process it is in, and a newcomer never takes a
 * lock that has waiters, even a free one (a try with no wait answers
 * BUSY). Its first try takes the lock only if it is free and no one waits;
 * otherwise that same try takes a place at the back of the line (so
 * arrival is that try, not the subscription that follows it). A release
 * wakes the head only (no herd), which takes the lock on its next call,
 * and the lock stays free until it does. Everything else is as for the
 * unfair lock: lease and watchdog, reentry, tokens, keyspace
 * notifications, Sentinel and Cluster (its keys in the name's slot).
 *
 *   A dead waiter does not hold the line. Every call of a waiter (at least
 *   three per lease: its re-checks) moves its place's due to now +
 *   waiter_lease_ms (default LOCK_WAITER_LEASE_MS, 1 s); every call on the
 *   lock first drops the places past their due. A waiter that is killed
 *   has its connection closed: the release's PUBLISH to it reaches nobody
 *   and it is dropped at once (not on a cluster, where a PUBLISH counts
 *   only its own node's listeners: there it is woken all the same, and a
 *   gone one's place lapses). One stopped
 *   or cut off loses its place by its due, within waiter_lease_ms of its
 *   last call; the waiter right behind a woken head looks again exactly
 *   then. So a dead waiter costs the waiters behind it at most
 *   waiter_lease_ms (measured, tests/test_fair_lock.py: killed 0.01 s,
 *   stopped 0.9 s, cut off 0.9 s). A waiter that was silent that long
 *   (a stalled process) and comes back queues again at the back
 *   (lock_stats.requeued). A longer waiter_lease_ms tolerates longer
 *   stalls of live waiters, at that cost per dead one.
 *
 *   Limits: every client of a name must be fair (an unfair client, or
 *   any SET NX client, takes a free lock whatever the line); not Redlock
 *   (N servers' lines could disagree); a failover to a replica that missed
 *   the last writes loses places (they are taken again, in the order the
 *   waiters call next). ZooKeeper and etcd are fair by their recipes
 *   (sequential nodes, create revisions): options.fair changes nothing
 *   there.
 *
 * OTHER CLIENTS' RELEASES, REDIS. node-redlock, redis-py's Lock and the like free
 * the key with a plain DEL (or let it expire) and publish nothing. If the
 * server has keyspace notifications on (notify-keyspace-events with K and
 * g, for del; x adds expired), the waker also subscribes, per lock name
 * with local waiters, to __keyspace@<db>__:NAME (together with B:wake:,
 * before the waiter's own channel, so its confirmation covers both), and a
 * del/expired/evicted event that no marker of ours announced wakes the
 * oldest local waiter of that name: one per client and release, within a
 * round trip. Without notifications the PTTL/backoff re-check above is
 * what finds such a release. The library never changes the server's
 * configuration (CONFIG SET would turn on events for every key of every
 * application on that server): an operator enables them, e.g.
 * CONFIG SET notify-keyspace-events Kgx (adding to any flags already set);
 * lock_client_stats says which servers have them.
 *
 * LEASES. Every lock has a TTL. remaining_ms is measured on the monotonic
 * clock from the start of the acquire (or renewal) that set the lease:
 * start + ttl - drift, drift = ttl * 0.01 + 2 ms (etcd: the granted TTL;
 * ZooKeeper: the session's, see above). With options.watchdog one
 * background thread per client renews every held lock at ttl/3, pipelined
 * in batches; when a renewal finds the lock gone (or the lease runs out
 * while Redis cannot be reached) the handle reports lock_lost() and its
 * lock_on_lost callback fires on the watchdog thread. A renewal stuck on a
 * silent Redis reports only when its timeout ends, so keep timeout_ms below
 * ttl/3, and before a protected write check lock_remaining_ms() > 0 (no
 * I/O) as well as lock_lost() -- or, better, let the resource check the
 * fencing token.
 *
 * REENTRANCY. An owner acquiring a name it already holds through the same
 * client gets a new handle on the same lease (the count goes up; the lease
 * is re-armed to the new ttl after Redis confirms the lock is still ours);
 * only the last lock_release frees it. The owner is the calling thread by
 * default (the count lives with the client, i.e. this process), or any
 * string passed as `owner`, for code that hops threads. ZooKeeper and etcd
 * check with the server that the node or key is still ours (etcd also
 * keeps its lease alive) but cannot re-arm a lease to another length: the
 * hold keeps the lease it was granted, whatever ttl the reentry asks.
 *
 * REDLOCK (nurls > 1). The same calls over N independent servers: a lock is
 * held when N/2+1 servers took it within the validity time, validity = ttl -
 * elapsed - drift; otherwise it is released on all of them and retried after
 * a random delay. The fencing token is made one across servers: the highest
 * token the quorum returned is written back to those servers' counters
 * (and lock values) before the acquire returns, so two majorities, which
 * always share a server, give strictly increasing tokens. Known limits of
 * Redlock apply: a server that restarts without persistence forgets locks
 * (and its counter: see INCARNATIONS for how its tokens stay apart).
 *
 * INCARNATIONS. lock_incarnation() names the data a hold's token came
 * from: a random 64-bit id (never 0) stored on the server beside what makes
 * the tokens (Redis: B:incarnation; ZooKeeper: BASE/%incarnation; etcd:
 * %incarnation), created by the first acquire that finds none. A server
 * that loses its data loses it too, so its tokens, which start over lower,
 * come with a new one; within one incarnation tokens strictly increase.
 * How each kind binds the incarnation to the token (it must never be
 * reported with a token of other data): Redis reads (or stores) it in the
 * acquire script that INCRs the counter; etcd reads it in the transaction
 * that creates the key (whose revision is the token), and a transaction
 * that finds none creates nothing: the acquire stores one and starts
 * again; ZooKeeper reads it once per session, and a session lives in one
 * server's data only (a server that lost its data does not know it: it
 * expires). Redlock: the servers' own incarnations when a quorum agrees,
 * else a new one (redis.c, settle, has the proof that no two acquires get
 * the same incarnation and token). A server restored from a backup is a
 * rollback the incarnation cannot see (same id, tokens going back):
 * delete its incarnation record when restoring, making it a new one.
 *
 * FENCING. (lock_incarnation(), lock_fence()) is different for every
 * successful acquire of a name, for every kind of server (Redis: the
 * counter; ZooKeeper: czxid; etcd: create revision -- tokens of different
 * kinds are not comparable). A lease can run out while its holder is
 * paused; the resource then refuses the stale holder by remembering the
 * holders it has seen in a fence key (per resource, on the protected
 * side, not B:fence; in the resource's hash slot). lock/lua/format.lua
 * writes its format and its checks once, as Lua functions a script may
 * use (lock_script_compose; lock_fenced_set runs them):
 *
 *     "<hi>"                        epoch 0, one unnamed incarnation,
 *                                   highest token hi (a missing key: "0");
 *     "<epoch>:<hi>:<i1>,...,<iK>"  the incarnations seen, oldest first, the
 *                                   last 8; hi the highest token of iK, the
 *                                   newest; epoch the number of new
 *                                   incarnations admitted so far.
 *
 *   lock_fence_admit(KEY, inc, tok[, dry]) -> epoch or nil
 *       a holder's token of the newest incarnation passes if >= hi (and
 *       raises hi); of an incarnation not in the list, always: it becomes
 *       the newest and the epoch goes up (the lock service lost its data;
 *       incarnations are ordered by first use); of an older one, never.
 *       dry: the same answer, nothing changed.
 *   lock_fence_check(KEY, inc, tok, epoch) -> boolean
 *       a holder admitted at epoch may write: the fence is still at its
 *       epoch, incarnation and token (no one else admitted since).
 *   lock_fence_record(KEY, inc, tok)
 *       after such a write: raises hi to tok if it is higher.
 *
 *   A one-step write (lock_fenced_set, lock/lua/fence.lua) is admit, then
 *   the write. A read-check-write (the stock's) admits at its read, which
 *   also blocks every earlier holder, and checks at its write, with the
 *   epoch its read returned; why that keeps two holders from writing over
 *   each other: docs/storage.md, "Locks and fences". The unnamed
 *   incarnation (all zeros) keeps the old plain-integer form and its
 *   semantics (a token below hi refused, equal passes: one holder may write
 *   many times), and an integer written by an older version reads as
 *   that. An incarnation more than 8 incarnations old is forgotten and
 *   would be taken for a new one: its holder would have to outlive eight
 *   losses of the lock service's data. Lua compares tokens as doubles:
 *   exact up to 2^53, far beyond any use (a czxid is epoch << 32 | counter:
 *   exact while the epoch < 2^21). lock_fenced_set needs a Redis client:
 *   with a ZooKeeper or etcd lock, call it on a separate redis:// client
 *   with the handle's token and incarnation.
 *
 * THREADS AND ERRORS. A lock_client is thread-safe: any number of threads
 * acquire and release on it at once (each borrows a pooled connection;
 * ZooKeeper: shares the session). A lock_handle belongs to its owner; the
 * getters may be called from any thread. Nothing aborts on server input:
 * every server call is bounded by timeout_ms, and failures come back as
 * LOCK_ERROR / LOCK_UNKNOWN with a message; the client keeps its last error
 * (code and message) and each handle the reason it was lost. A ZooKeeper
 * client runs the keeper thread and two library threads per session; an
 * etcd client no thread of its own (a watch runs on the waiting thread). */
#ifndef FLASHSALE_LOCK_H
#define FLASHSALE_LOCK_H

#include <stddef.h>
#include <stdint.h>

#define LOCK_MAX_SERVERS 15     /* Redlock over at most this many servers */
#define LOCK_NAME_MAX 1000      /* longest lock name, in bytes */
#define LOCK_OWNER_MAX 200      /* longest explicit owner */

typedef struct lock_client lock_client;

typedef struct lock_options {
    const char *const *urls;    /* redis://host:port/db or unix:/path (rconn.h); or one
                                 * zk://hosts[/base] or etcd://hosts[/prefix] (see above) */
    int nurls;                  /* 1: one server; > 1: Redlock over independent servers */
    int timeout_ms;             /* connect/command timeout per server call; 0: 1000 */
    int watchdog;               /* 1: renew held locks at ttl/3 in one background thread
                                 * (Redis, etcd; ZooKeeper sessions keep themselves) */
    int max_backoff_ms;         /* longest wait between a waiter's retries; 0: 200 (Redis) */
    int fair;                   /* 1: waiters take the lock in arrival order (FAIRNESS);
                                 * Redis: one server, a Sentinel's primary or a cluster,
                                 * not Redlock; ZooKeeper and etcd are fair already */
    int waiter_lease_ms;        /* fair: a waiter silent this long loses its place;
                                 * 0: LOCK_WAITER_LEASE_MS */
} lock_options;

#define LOCK_WAITER_LEASE_MS 1000

/* What went wrong last (lock_client_error) or why a lease ended (lock_err). */
typedef enum lock_errcode {
    LOCK_ERR_NONE = 0,
    LOCK_ERR_ARG,               /* a bad argument: empty name, ttl <= 0, ... */
    LOCK_ERR_IO,                /* the server unreachable, timed out, the connection broke;
                                 * ZooKeeper/etcd: also an error answer, a session gone */
    LOCK_ERR_REDIS,             /* Redis answered with an error */
    LOCK_ERR_QUORUM,            /* Redlock: too few servers answered to decide */
    LOCK_ERR_LOST,              /* the lock was found gone or taken by another */
    LOCK_ERR_NOMEM
} lock_errcode;

/* Creates a client for o->urls (copied; nothing connects until first use).
 * Returns NULL with a message in err on a bad option or URL, or URLs of
 * different kinds. Free with lock_client_free. */
lock_client *lock_client_new(const lock_options *o, char *err, size_t errlen);

/* Stops the client's threads and frees it. No other call on c may be in
 * progress. Locks still held are released on the server (bounded by
 * timeout_ms each; ZooKeeper: closing a session may take up to 4.5 s more
 * when the server does not answer) and their handles freed: do not use
 * them afterwards. NULL is a no-op. */
void lock_client_free(lock_client *c);

/* Copies the client's last error message (of any thread) into buf; returns
 * its code (LOCK_ERR_NONE if nothing failed yet). For logs. */
lock_errcode lock_client_error(lock_client *c, char *buf, size_t len);

typedef struct lock_handle lock_handle;

typedef enum lock_status {
    LOCK_OK,
    LOCK_BUSY,                  /* not acquired before the wait deadline (or at once, wait 0) */
    LOCK_ERROR                  /* could not find out: see err */
} lock_status;

/* Acquires the lock `name` (Redis: the full key; see THE FORMAT) for ttl_ms,
 * waiting up to wait_ms for it (0: try once; < 0: no deadline). owner NULL =
 * the calling thread of this process; else an explicit owner string for
 * reentrancy across threads. On LOCK_OK *out is a new handle (free it with
 * lock_release); otherwise *out is NULL and err says why. Thread-safe. */
lock_status lock_acquire(lock_client *c, const char *name, int64_t ttl_ms, int64_t wait_ms,
                         const char *owner, lock_handle **out, char *err, size_t errlen);

/* The fencing token of this hold: strictly increasing per name within one
 * incarnation (INCARNATIONS). */
uint64_t lock_fence(const lock_handle *h);

/* The incarnation of the lock service's data this hold's token came from
 * (INCARNATIONS): never 0 for a hold; a fence orders incarnations by first
 * use, then tokens (FENCING). 0 for NULL. */
uint64_t lock_incarnation(const lock_handle *h);

/* A fair Redis lock's hold: the ticket of the place in line it came
 * through (FAIRNESS; tickets rise by one per place taken in a name's line,
 * so they are the order the server saw the waiters arrive in). 0 when the
 * hold took a free lock without a place, or the lock is not a fair Redis
 * lock. A reentrant acquire shares the first hold's ticket. */
uint64_t lock_ticket(const lock_handle *h);

/* Milliseconds left of the lease by the monotonic clock (start of the
 * acquire or last renewal + ttl - drift); <= 0 once it has run out. */
int64_t lock_remaining_ms(const lock_handle *h);

/* 1 when the watchdog (or a reentrant acquire; ZooKeeper: the keeper) found
 * the lock gone. */
int lock_lost(const lock_handle *h);

/* The handle's name, as passed to lock_acquire. */
const char *lock_name(const lock_handle *h);

/* Why the lease ended or the last renewal failed (LOCK_ERR_NONE while all is
 * well); the message goes to buf. */
lock_errcode lock_err(const lock_handle *h, char *buf, size_t len);

/* Registers fn(h, ud), called once, on the watchdog thread (ZooKeeper: the
 * keeper thread), when the lock is found lost (at once, on this thread, if
 * it already is). fn may call the getters and lock_release(h); it should be
 * quick. NULL fn unregisters. */
void lock_on_lost(lock_handle *h, void (*fn)(lock_handle *h, void *ud), void *ud);

typedef enum lock_release_result {
    LOCK_RELEASED,              /* it was ours and is freed (or, reentered, one count less) */
    LOCK_NOT_OWNER,             /* it had expired or was taken by another: left alone */
    LOCK_UNKNOWN                /* I/O error: Redis may or may not have freed it */
} lock_release_result;

/* Releases h: one count of a reentrant hold, or the lock itself (one Lua
 * compare-and-delete that also wakes the next waiter). Never deletes a lock
 * it does not own. Frees h in every case. */
lock_release_result lock_release(lock_handle *h);

/* lock_release, with the reason for NOT_OWNER / UNKNOWN in err. */
lock_release_result lock_release_ex(lock_handle *h, char *err, size_t errlen);

/* Writes value to key only if (incarnation, token) passes the fence
 * fence_key, admitting it there (FENCING: lock_fence_admit, then the SET;
 * lock/lua/fence.lua, on the client's first server). incarnation 0 is the
 * unnamed one: the fence then keeps the plain-integer form. Returns 1
 * written, 0 refused (a newer holder or incarnation wrote; *highest, if
 * given, is set to the newest's highest token), -1 on error (err) --
 * always -1 on a ZooKeeper or etcd client: use a redis:// client with
 * their token and incarnation. */
int lock_fenced_set(lock_client *c, const char *fence_key, const char *key, uint64_t token,
                    uint64_t incarnation, const char *value, size_t value_len,
                    uint64_t *highest, char *err, size_t errlen);

/* A caller's Lua script built on the lock's Redis format: a new string,
 * lock/lua/format.lua followed by body, to hand to rconn_script_init (and
 * keep while the script is used; free() it after). format.lua only defines
 * local functions, so body runs as it would alone, with these in scope
 * (NAME, FENCE, WAITERS, WAKE: the lock's key and its derived B:fence,
 * B:waiters and B:wake: of THE FORMAT above, passed in KEYS and ARGV):
 *
 *   lock_free(NAME)                       true when no one holds the lock
 *   lock_take(NAME, FENCE, id, ttl_ms)    takes a free lock for owner id
 *                                         (32 hex): INCR FENCE, then SET
 *                                         NAME "<id>:<token>" PX ttl_ms;
 *                                         returns the token
 *   lock_ours(NAME, id)                   true when id holds the lock
 *   lock_value(id, token)                 the value "<id>:<token>"
 *   lock_release(NAME, WAITERS, id, WAKE, n)
 *                                         lock_release's compare-and-delete:
 *                                         if id holds it, PUBLISH the marker
 *                                         on WAKE, DEL, and wake up to n
 *                                         live waiters; returns 1 freed, 0
 *                                         not id's (nothing done)
 *   lock_fence_admit(KEY, inc, tok[, dry]), lock_fence_check(KEY, inc, tok, epoch),
 *   lock_fence_record(KEY, inc, tok), lock_fence_parse(value)
 *                                         the fence (FENCING above): inc
 *                                         16 hex digits, tok a decimal
 *                                         string
 *
 * A lock taken so is one of this module's: lock_acquire on NAME waits for
 * it, lock_release frees it only for its owner, and a lock_release(...)
 * with n >= 1 wakes a lock_acquire waiting for it. Returns NULL when out
 * of memory. */
char *lock_script_compose(const char *body);

/* Counters since the client was created (for tests, the benchmark, metrics). */
typedef struct lock_stats {
    uint64_t acquired, busy, errors;    /* lock_acquire outcomes */
    uint64_t reentered;                 /* acquires served by an existing hold */
    uint64_t attempts;                  /* acquire scripts run (one per try, any number of
                                         * servers); ZooKeeper/etcd: acquires begun */
    uint64_t wakeups;                   /* release notices delivered to waiters */
    uint64_t timeouts;                  /* waits that ended by PTTL/backoff, not by a notice */
    uint64_t renewals, renew_errors, lost;
    uint64_t released, not_owner, unknown;   /* lock_release outcomes */
    uint64_t requeued;                  /* fair: waiters that lost their place (silent past
                                           waiter_lease_ms) and joined again at the back */
    uint64_t keyspace_wakeups;          /* waits ended by a keyspace notification of
                                           another client's release (in wakeups too) */
    int keyspace_on, keyspace_off;      /* servers whose notify-keyspace-events had
                                           (K and g) / had not, when the subscriber
                                           last connected (CONFIG GET); the rest:
                                           not known yet, or CONFIG refused */
} lock_stats;

void lock_client_stats(lock_client *c, lock_stats *out);

#endif
