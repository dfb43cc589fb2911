/* room.c: the service's side of a waiting room (room.h): tickets, the
 * view between beats, a position's turn, and the rate an instance says. */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/sha256.h"
#include "service/room/room.h"

#define MARKS_CAP 8192            /* as many as Redis keeps */

#define KNOWN_STRIPES 64

struct svc_room {
    int turn_ms;
    long long fixed_rate;
    long long opens_ms;           /* the sale's opening (Redis's clock; 0: none) */
    /* The view: written by the beat thread, read anywhere. */
    atomic_llong seq, serving, sold_out_ms;
    _Atomic double rate, own_rate;
    atomic_llong offset_ms;       /* Redis's clock - this host's wall clock, at the last beat */
    atomic_llong beat_at_ms;      /* this host's monotonic clock at the last beat (0: none) */
    atomic_int event;             /* stock_room_event for the next beat */
    /* When the counter passed each value: a ring, values rising. */
    pthread_mutex_t mu;
    long long mark_pos[MARKS_CAP], mark_ms[MARKS_CAP];
    int mark_head, nmarks;        /* oldest at mark_head */
    long long marks_from;         /* the last value the marks go up to */
    /* Places whose orders were answered finally here, for the next beat
     * (guarded by mu). */
    long long *done;
    int ndone, done_cap;
    /* The orders answered finally here: a count, and what the last beat
     * made of it (orders a second, smoothed). Beat thread only but the
     * count. */
    atomic_llong done_total;
    long long done_seen;
    int64_t done_seen_us;
    double throughput;
    /* Buyers waiting to be told their turn (guarded by mu). */
    struct watcher *watch;
    int nwatch, watch_cap;
    /* The places handed out or given back here lately (svc_room_place_*):
     * slot by the user's tag, each guarded by its stripe's mutex. */
    struct known_place *known;
    pthread_mutex_t known_mu[KNOWN_STRIPES];
};

typedef struct known_place {
    unsigned char tag[8];
    int used;                     /* 0: an empty slot */
    long long position;           /* 0: in the pre-queue */
    long long issued_ms;
    int64_t noted_ms;             /* when Redis last said so (clock_mono_ms) */
} known_place;

typedef struct watcher {
    long long position;
    int64_t since_us;             /* when it began: a wake calls only those before it */
    int64_t deadline_us;
    svc_room_watch_fn *fn;
    void *ud;
} watcher;

svc_room *svc_room_new(int turn_ms, long long fixed_rate, double initial_rate,
                       long long opens_ms) {
    assert(turn_ms > 0 && fixed_rate >= 0 && opens_ms >= 0);
    svc_room *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->turn_ms = turn_ms;
    r->fixed_rate = fixed_rate;
    r->opens_ms = opens_ms;
    atomic_init(&r->own_rate, fmin(fmax(initial_rate, SVC_ROOM_RATE_MIN), SVC_ROOM_RATE_MAX));
    r->known = calloc(SVC_ROOM_KNOWN_PLACES, sizeof *r->known);
    if (!r->known) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    for (int i = 0; i < KNOWN_STRIPES; i++) pthread_mutex_init(&r->known_mu[i], NULL);
    return r;
}

void svc_room_free(svc_room *r) {
    if (!r) return;
    assert(r->nwatch == 0);            /* every wait was answered before the beats stopped */
    free(r->watch);
    free(r->done);
    free(r->known);
    pthread_mutex_destroy(&r->mu);
    for (int i = 0; i < KNOWN_STRIPES; i++) pthread_mutex_destroy(&r->known_mu[i]);
    free(r);
}

int svc_room_turn_ms(const svc_room *r) { return r->turn_ms; }
long long svc_room_fixed_rate(const svc_room *r) { return r->fixed_rate; }
long long svc_room_opens_ms(const svc_room *r) { return r->opens_ms; }

static long long redis_now(const svc_room *r);

long long svc_room_now_ms(const svc_room *r) {
    return atomic_load(&r->beat_at_ms) != 0 ? redis_now(r) : 0;
}

int svc_room_before_opening(const svc_room *r) {
    return r->opens_ms > 0 && redis_now(r) < r->opens_ms + 60000;
}

/* ------------------------------------------------------------- tickets */

static void hex(const unsigned char *d, size_t n, char *out) {
    static const char X[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = X[d[i] >> 4];
        out[2 * i + 1] = X[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static int unhex(const char *s, size_t n, unsigned char *out) {
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char c = s[2 * i + k];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0) return -1;
            v = v * 16 + d;
        }
        out[i] = (unsigned char)v;
    }
    return 0;
}

void svc_room_user_tag(const char *user, unsigned char tag[8]) {
    unsigned char d[SHA256_LEN];
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, user, strlen(user));
    sha256_final(&c, d);
    memcpy(tag, d, 8);
}

/* HMAC-SHA-256 of msg under secret, the key made ready once per thread
 * and secret (a ticket is checked on every waiting buyer's request; the
 * secret changes only when learnt, and is compared each time). */
static void room_hmac(const char *secret, const char *msg, size_t len,
                      unsigned char out[SHA256_LEN]) {
    static __thread char ready_for[SVC_ROOM_SECRET_MAX + 1];
    static __thread int ready;
    static __thread hmac_sha256_key key;
    size_t sl = strlen(secret);
    if (sl > SVC_ROOM_SECRET_MAX) {       /* not one the instance keeps: no cache */
        hmac_sha256(secret, sl, msg, len, out);
        return;
    }
    if (!ready || strcmp(ready_for, secret) != 0) {
        hmac_sha256_key_init(&key, secret, sl);
        memcpy(ready_for, secret, sl + 1);
        ready = 1;
    }
    hmac_sha256_keyed(&key, msg, len, out);
}

/* The mac of a ticket: the first 16 bytes of HMAC-SHA-256 of
 * "t1|sku|position|issued_ms|tag-hex". */
static void ticket_mac(const char *secret, const char *sku, long long position,
                       long long issued_ms, const char *tag_hex, unsigned char mac[16]) {
    char msg[256];
    unsigned char d[SHA256_LEN];
    int n = snprintf(msg, sizeof msg, "t1|%s|%lld|%lld|%s", sku, position, issued_ms, tag_hex);
    assert(n > 0 && (size_t)n < sizeof msg);   /* a SKU is at most 64 bytes */
    room_hmac(secret, msg, (size_t)n, d);
    memcpy(mac, d, 16);
}

void svc_room_ticket_sign(const char *secret, const char *sku, const unsigned char tag[8],
                          long long position, long long issued_ms,
                          char out[SVC_ROOM_TICKET_MAX + 1]) {
    unsigned char mac[16];
    char tag_hex[17], mac_hex[33];
    assert(position > 0 && issued_ms >= 0);
    hex(tag, 8, tag_hex);
    ticket_mac(secret, sku, position, issued_ms, tag_hex, mac);
    hex(mac, sizeof mac, mac_hex);
    snprintf(out, SVC_ROOM_TICKET_MAX + 1, "t1.%lld.%lld.%s.%s", position, issued_ms, tag_hex,
             mac_hex);
}

/* A decimal of 1 to 18 digits, without a sign or a leading zero, ending at
 * '.': its value and the end, or NULL. */
static const char *number(const char *s, long long *v) {
    long long n = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (p - s == 18) return NULL;
        n = n * 10 + (*p - '0');
    }
    if (p == s || (*s == '0' && p - s > 1) || *p != '.') return NULL;
    *v = n;
    return p + 1;
}

int svc_room_ticket_read(const char *secret, const char *sku, const char *text, svc_ticket *t) {
    if (!text || strlen(text) > SVC_ROOM_TICKET_MAX || strncmp(text, "t1.", 3) != 0) return -1;
    const char *p = text + 3;
    long long pos, ms;
    if (!(p = number(p, &pos)) || !(p = number(p, &ms)) || pos <= 0) return -1;
    if (strlen(p) != 16 + 1 + 32 || p[16] != '.') return -1;
    char tag_hex[17];
    unsigned char mac[16], want[16];
    memcpy(tag_hex, p, 16);
    tag_hex[16] = '\0';
    if (unhex(tag_hex, 8, t->user_tag) || unhex(p + 17, 16, mac)) return -1;
    ticket_mac(secret, sku, pos, ms, tag_hex, want);
    if (!sha256_equal(mac, want, sizeof mac)) return -1;
    t->position = pos;
    t->issued_ms = ms;
    return 0;
}

uint64_t svc_room_draw(const char *secret, const char *sku, const char *user) {
    char msg[640];
    unsigned char d[SHA256_LEN];
    int n = snprintf(msg, sizeof msg, "pre|%s|%s", sku, user);
    assert(n > 0 && (size_t)n < sizeof msg);   /* a SKU is 64 bytes at most, a user id 512 */
    room_hmac(secret, msg, (size_t)n, d);
    uint64_t v = 0;
    for (int i = 0; i < 6; i++) v = v << 8 | d[i];
    assert(v <= STOCK_ROOM_DRAW_MAX);
    return v;
}

int svc_room_ticket_is_users(const svc_ticket *t, const char *user) {
    unsigned char tag[8];
    svc_room_user_tag(user, tag);
    return sha256_equal(tag, t->user_tag, sizeof tag);
}

/* ------------------------------------------------------------ the view */

static long long redis_now(const svc_room *r) {
    return clock_wall_ms() + atomic_load_explicit(&r->offset_ms, memory_order_relaxed);
}

/* When the counter reached position (Redis ms): the first mark at or past
 * it; -1 when the marks do not go back that far (or not yet that far).
 * r->mu held. */
static long long reached_at(const svc_room *r, long long position) {
    assert(mutex_held(&r->mu));
    int lo = 0, hi = r->nmarks;
    while (lo < hi) {             /* the first mark whose value is >= position */
        int mid = (lo + hi) / 2;
        if (r->mark_pos[(r->mark_head + mid) % MARKS_CAP] >= position) hi = mid;
        else lo = mid + 1;
    }
    if (lo == r->nmarks) return -1;
    if (lo == 0 && r->nmarks == MARKS_CAP) return -1;   /* it may have been before the oldest */
    return r->mark_ms[(r->mark_head + lo) % MARKS_CAP];
}

svc_turn svc_room_turn(svc_room *r, long long position, long long *ms) {
    *ms = 0;
    if (atomic_load(&r->beat_at_ms) == 0) return SVC_TURN_UNKNOWN;
    if (atomic_load(&r->sold_out_ms) > 0) return SVC_TURN_SOLD_OUT;
    long long serving = atomic_load(&r->serving), now = redis_now(r);
    if (position > serving) {
        double rate = atomic_load(&r->rate);
        *ms = rate > 0 ? (long long)ceil((double)(position - serving) * 1000.0 / rate)
                       : SVC_ROOM_RETRY_MAX_MS;
        return SVC_TURN_WAIT;
    }
    pthread_mutex_lock(&r->mu);
    long long at = reached_at(r, position);
    pthread_mutex_unlock(&r->mu);
    if (at < 0) {                 /* not in the marks heard: the whole turn, generously */
        *ms = r->turn_ms;
        return SVC_TURN_NOW;
    }
    long long end = at + r->turn_ms;
    if (now > end) {
        *ms = now - end;
        return SVC_TURN_OVER;
    }
    *ms = end - now;
    return SVC_TURN_NOW;
}

void svc_room_figures_get(svc_room *r, svc_room_figures *out) {
    *out = (svc_room_figures){ .issued = atomic_load(&r->seq),
                               .serving = atomic_load(&r->serving),
                               .rate = atomic_load(&r->rate),
                               .sold_out_ms = atomic_load(&r->sold_out_ms) };
}

void svc_room_issued(svc_room *r, const stock_room_place *pl) {
    long long position = pl->position;
    long long m = atomic_load(&r->seq);   /* the floor of every later place */
    while (position > m && !atomic_compare_exchange_weak(&r->seq, &m, position)) {}
    /* The counter the call left (it moves it too): the places up to it
     * have their turn here now, not a beat later (their marks come with
     * the next beat; until then each has its whole turn). */
    m = atomic_load(&r->serving);
    while (pl->serving > m && !atomic_compare_exchange_weak(&r->serving, &m, pl->serving)) {}
    if (atomic_load(&r->beat_at_ms) != 0) return;
    /* Not heard yet: this answer is the view until the first beat (a race
     * with it only sets the same kind of figures, a moment older). */
    atomic_store(&r->offset_ms, pl->now_ms - clock_wall_ms());
    if (atomic_load(&r->rate) <= 0) atomic_store(&r->rate, atomic_load(&r->own_rate));
    atomic_store(&r->beat_at_ms, clock_mono_ms() > 0 ? clock_mono_ms() : 1);
}

/* ----------------------------------------------------- places known here */

static unsigned known_slot(const unsigned char tag[8]) {
    /* The tag is a digest's first bytes: any two of them are as good as
     * a hash. */
    return ((unsigned)tag[0] << 8 | tag[1]) % SVC_ROOM_KNOWN_PLACES;
}

void svc_room_place_note(svc_room *r, const unsigned char tag[8], long long position,
                         long long issued_ms) {
    assert(position >= 0);
    unsigned i = known_slot(tag);
    pthread_mutex_t *mu = &r->known_mu[i % KNOWN_STRIPES];
    pthread_mutex_lock(mu);
    memcpy(r->known[i].tag, tag, 8);
    r->known[i].used = 1;
    r->known[i].noted_ms = clock_mono_ms();
    r->known[i].position = position;
    r->known[i].issued_ms = issued_ms;
    pthread_mutex_unlock(mu);
}

int svc_room_place_known(svc_room *r, const unsigned char tag[8], long long *position,
                         long long *issued_ms) {
    unsigned i = known_slot(tag);
    pthread_mutex_t *mu = &r->known_mu[i % KNOWN_STRIPES];
    int found = 0;
    int64_t noted = 0;
    pthread_mutex_lock(mu);
    if (r->known[i].used && memcmp(r->known[i].tag, tag, 8) == 0) {
        *position = r->known[i].position;
        *issued_ms = r->known[i].issued_ms;
        noted = r->known[i].noted_ms;
        found = 1;
    }
    pthread_mutex_unlock(mu);
    if (!found) return 0;
    /* In the pre-queue: so while the sale has not opened by the view (at
     * the opening, Redis gives the pre-queue its places), and for a
     * second after Redis last said so -- a Redis restarted empty before
     * the opening lost its pre-queue, and a user's next ask after that
     * second puts it back, as every ask did. */
    if (*position == 0)
        return clock_mono_ms() - noted < SVC_ROOM_PRE_QUEUE_KNOWN_MS &&
               atomic_load(&r->beat_at_ms) != 0 && r->opens_ms > 0 && redis_now(r) < r->opens_ms;
    /* A place whose turn is over is not given back: its user gets a new
     * one at the back, from Redis. */
    long long ms;
    svc_turn t = svc_room_turn(r, *position, &ms);
    return t == SVC_TURN_WAIT || t == SVC_TURN_NOW;
}

void svc_room_note_sold_out(svc_room *r) {
    if (atomic_load_explicit(&r->sold_out_ms, memory_order_relaxed) == 0)
        atomic_store(&r->event, STOCK_ROOM_SOLD_OUT);
}

void svc_room_note_units(svc_room *r) { atomic_store(&r->event, STOCK_ROOM_REOPEN); }

void svc_room_done(svc_room *r, long long position) {
    assert(position > 0);
    pthread_mutex_lock(&r->mu);
    if (r->ndone == r->done_cap && r->done_cap < SVC_ROOM_DONE_MAX) {
        int cap = r->done_cap ? 2 * r->done_cap : 256;
        long long *d = realloc(r->done, (size_t)cap * sizeof *d);
        if (d) {
            r->done = d;
            r->done_cap = cap;
        }
    }
    /* Full (or out of memory): this place counts as holding its unit until
     * its turn passes -- the room admits a little slower, never unfairly. */
    if (r->ndone < r->done_cap) r->done[r->ndone++] = position;
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add_explicit(&r->done_total, 1, memory_order_relaxed);
}

/* ------------------------------------------------------------ watchers */

int svc_room_watch(svc_room *r, long long position, int64_t deadline_us, svc_room_watch_fn *fn,
                   void *ud) {
    int rc = -1;
    pthread_mutex_lock(&r->mu);
    if (r->nwatch == r->watch_cap && r->watch_cap < SVC_ROOM_WATCHERS_MAX) {
        int cap = r->watch_cap ? 2 * r->watch_cap : 256;
        watcher *w = realloc(r->watch, (size_t)cap * sizeof *w);
        if (w) {
            r->watch = w;
            r->watch_cap = cap;
        }
    }
    if (r->nwatch < r->watch_cap) {
        r->watch[r->nwatch++] = (watcher){ position, clock_mono_us(), deadline_us, fn, ud };
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void svc_room_wake(svc_room *r, int all) {
    int64_t now = all ? INT64_MAX : clock_mono_us();
    long long serving = atomic_load(&r->serving);
    int sold_out = atomic_load(&r->sold_out_ms) > 0;
    watcher due[512];
    for (;;) {                         /* in slices: the callbacks run without mu */
        int n = 0;
        pthread_mutex_lock(&r->mu);
        for (int i = 0; i < r->nwatch && n < (int)(sizeof due / sizeof due[0]);) {
            watcher *w = &r->watch[i];
            /* One that began during this wake (a callback watching
             * again) waits for the next. */
            if (w->since_us < now &&
                (sold_out || w->position <= serving || now >= w->deadline_us)) {
                due[n++] = *w;
                *w = r->watch[--r->nwatch];   /* order among waiters does not matter */
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < n; i++) {
            long long ms;
            svc_turn t = svc_room_turn(r, due[i].position, &ms);
            due[i].fn(due[i].ud, t, ms);
        }
        if (n < (int)(sizeof due / sizeof due[0])) return;
    }
}

/* ------------------------------------------------------------- a beat */

/* What the buyers waiting here for their turn (held orders, long polls)
 * could bring the path a second: they are not on their way but here, and
 * all of them enter it within a beat of their turn. So the bound on the
 * rate's growth (what the path answers) counts them too: with the
 * answers alone, it held a sale of held orders at 5,000 places a second
 * on a path that took 60,000 (2026-12-05). */
static double held_rate(const svc_room_load *load) {
    return (double)load->held * 1000.0 / STOCK_ROOM_TICK_MS;
}

double svc_room_rate_next(double rate, const svc_room_load *load, int waiting) {
    /* A window's p90 outlives the orders it measured (an idle path closes
     * no window): it is read only while the path holds a quarter of its
     * limit or more. */
    int roomy = load->limit > 0 && load->inflight < load->limit / 4;
    int full = load->limit > 0 && load->inflight >= load->limit * 9 / 10;
    double bound = 2 * fmax(load->throughput, held_rate(load));   /* growth's, see below */
    if (load->shed > 0 || full) {
        /* Its orders are refused, or about to be: the path takes what it
         * answers. Admitted buyers still on their way fill it for a while;
         * cutting below what it answers meanwhile only starves it after. */
        rate = load->throughput > 0 ? fmax(load->throughput, rate * 0.9) : rate * 0.9;
    } else if (roomy) {
        /* The path holds back nothing: if buyers wait, the room holds
         * back buyers it could serve. Grow fast, as a TCP slow start --
         * but only while the buyers it let in come: a buyer let in comes
         * when its estimate said, so a path with room may just be waiting
         * for them, and a rate grown past what it answers lets in a crowd
         * that arrives at once later, overfills the path and is shed
         * (each shed buyer then waits its Retry-After second). */
        if (waiting && rate < bound) rate *= 1.25;
    } else if (load->p90_us > load->target_us) {
        rate *= 0.9;                        /* they queue past the target */
    } else if (waiting && load->p90_us < load->target_us / 2 && rate < bound) {
        rate *= 1.05;
    }
    return fmin(fmax(rate, SVC_ROOM_RATE_MIN), SVC_ROOM_RATE_MAX);
}

/* Adds the marks a beat heard (values past marks_from, rising). r->mu held. */
static void add_marks(svc_room *r, const stock_room_state *st) {
    assert(mutex_held(&r->mu));
    for (int i = 0; i < st->nmarks; i++) {
        if (st->mark_pos[i] <= r->marks_from) continue;
        int slot = (r->mark_head + r->nmarks) % MARKS_CAP;
        if (r->nmarks == MARKS_CAP) r->mark_head = (r->mark_head + 1) % MARKS_CAP;
        else r->nmarks++;
        r->mark_pos[slot] = st->mark_pos[i];
        r->mark_ms[slot] = st->mark_ms[i];
        r->marks_from = st->mark_pos[i];
    }
}

int svc_room_beat(svc_room *r, stock_conn *c, const stock_product *p,
                  const svc_room_load *given) {
    static __thread stock_room_state st;   /* 16 KiB: not on the stack */
    svc_room_load l = *given, *load = &l;
    /* What the path answered of the room's orders since the last beat. */
    int64_t now_us = clock_mono_us();
    long long total = atomic_load_explicit(&r->done_total, memory_order_relaxed);
    if (r->done_seen_us && now_us > r->done_seen_us) {
        double t = (double)(total - r->done_seen) * 1e6 / (double)(now_us - r->done_seen_us);
        r->throughput = r->throughput > 0 ? 0.7 * r->throughput + 0.3 * t : t;
    }
    r->done_seen = total;
    r->done_seen_us = now_us;
    l.throughput = r->throughput;
    pthread_mutex_lock(&r->mu);
    l.held = r->nwatch;
    pthread_mutex_unlock(&r->mu);
    long long seq = atomic_load(&r->seq), serving = atomic_load(&r->serving);
    int waiting = atomic_load(&r->beat_at_ms) != 0 && seq > serving &&
                  atomic_load(&r->sold_out_ms) == 0;
    double own = atomic_load(&r->own_rate);
    if (atomic_load(&r->beat_at_ms) == 0 && load->limit > 0 && load->target_us > 0)
        own = fmax(own, (double)load->limit * 1e6 / (double)load->target_us);   /* Little */
    own = svc_room_rate_next(own, load, waiting);
    atomic_store(&r->own_rate, own);
    stock_room_event ev = (stock_room_event)atomic_exchange(&r->event, STOCK_ROOM_NONE);
    pthread_mutex_lock(&r->mu);
    long long from = r->marks_from;
    long long *done = r->done;            /* taken: new ones go to a new buffer */
    int ndone = r->ndone;
    r->done = NULL;
    r->ndone = r->done_cap = 0;
    pthread_mutex_unlock(&r->mu);
    stock_room_beat in = { .rate = own, .fixed_rate = r->fixed_rate, .marks_from = from,
                           .floor_seq = seq,
                           .floor_serving = serving, .event = ev, .turn_ms = r->turn_ms,
                           .done = done, .ndone = ndone };
    int64_t t0 = clock_wall_ms();
    int rc = stock_room_beat_run(c, p, &in, &st);
    if (rc != 0)                          /* said again next time */
        for (int i = 0; i < ndone; i++) svc_room_done(r, done[i]);
    free(done);
    if (rc != 0) {
        if (ev != STOCK_ROOM_NONE) {        /* said again next time, unless a newer one came */
            int none = STOCK_ROOM_NONE;
            atomic_compare_exchange_strong(&r->event, &none, (int)ev);
        }
        return -1;
    }
    /* Redis's clock against ours, at the middle of the round trip. */
    int64_t t1 = clock_wall_ms();
    atomic_store(&r->offset_ms, st.now_ms - (t0 + t1) / 2);
    long long s = (long long)floor(st.serving);
    if (s > atomic_load(&r->serving)) atomic_store(&r->serving, s);   /* never back */
    if (st.seq > atomic_load(&r->seq)) atomic_store(&r->seq, st.seq);
    atomic_store(&r->rate, st.rate);
    atomic_store(&r->sold_out_ms, st.sold_out_ms);
    pthread_mutex_lock(&r->mu);
    add_marks(r, &st);
    pthread_mutex_unlock(&r->mu);
    atomic_store(&r->beat_at_ms, clock_mono_ms() > 0 ? clock_mono_ms() : 1);
    return 0;
}
