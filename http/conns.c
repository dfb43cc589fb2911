/* conns.c: open connections and the deadline of slow requests.
 *
 * libmicrohttpd's only timer is an idle timeout that every byte resets, so
 * a client sending one byte every few seconds holds its connection for
 * ever (slowloris): 250 such clients kept a 250-connection service full.
 * Here a request, once started, must be complete (head and body) within
 * request_timeout_ms, however it trickles in.
 *
 * A new connection's first request is "started" at the accept. After that,
 * "started" is seen two ways. The request line arriving is reported by
 * libmicrohttpd (the URI log callback). Bytes before that (a request line
 * sent slowly, or garbage without a newline) never reach us, so the
 * sweeper also asks the kernel (TCP_INFO's bytes received) whether an idle
 * connection has received anything since it went idle. Either way the
 * clock starts, and a connection still receiving after the timeout is shut
 * down; libmicrohttpd then sees the end of the stream and closes it. An
 * idle connection whose client has closed its side is shut down too.
 *
 * The sweep runs on the event loop that owns the connections (a timer), so
 * it never races their close; the list's mutex stays because deferred
 * answers from other threads end requests too (http_conn_answered). */
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "http/internal.h"

/* A sweep costs a getsockopt per idle connection (~1 us): every 50 ms up
 * to 1,000 connections, then less often, so it stays near 2% of a core
 * (20,000 connections: every second). */
#define SWEEP_MIN_MS 50
#define SWEEP_MAX_MS 1000
#define SWEEP_CONNS_PER_MS 20
#define BYTES_UNKNOWN UINT64_MAX
#define RECHECK_MS 20            /* a client that closed mid-request: look again soon */
/* tcpi_state of a connection whose peer has closed its side (the kernel's
 * include/net/tcp_states.h; <netinet/tcp.h> names it but clashes with the
 * tcp_info of <linux/tcp.h>, which has tcpi_bytes_received). */
#define STATE_CLOSE_WAIT 8

/* Bytes the kernel has received on fd (0 when it cannot say), and whether
 * the peer has closed its side (the connection is in CLOSE_WAIT). */
static uint64_t bytes_received(int fd, int *peer_closed) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (peer_closed) *peer_closed = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0;
    if (peer_closed) *peer_closed = ti.tcpi_state == STATE_CLOSE_WAIT;
    return ti.tcpi_bytes_received;
}

/* One pass over the connections. Returns 1 when one awaits a second look
 * soon (see RECHECK_MS). */
static int sweep(http_conns *cs, long *count) {
    int64_t now = clock_mono_us();
    int recheck = 0;
    *count = 0;
    pthread_mutex_lock(&cs->mu);
    for (http_conn *c = cs->head; c; c = c->next) {
        ++*count;
        int peer_closed;
        if (c->phase == CONN_IDLE && c->bytes_idle == BYTES_UNKNOWN) {
            /* Idle since the last sweep: its count now is the baseline.
             * (Taken here, not at every answer: a syscall less per request.
             * A request that started before this look is seen at its next
             * byte, or ends with the idle timeout.) */
            c->bytes_idle = bytes_received(c->fd, &peer_closed);
            if (peer_closed) {
                shutdown(c->fd, SHUT_RDWR);
                c->phase = CONN_BUSY;
            }
        } else if (c->phase == CONN_IDLE && bytes_received(c->fd, &peer_closed) > c->bytes_idle) {
            c->phase = CONN_RECEIVING;
            c->started_us = now;
            c->closed_seen_us = peer_closed ? now : 0;
            recheck |= peer_closed;
        } else if (c->phase == CONN_IDLE && peer_closed) {
            /* The client finished sending and everything it sent is
             * answered: nothing more can come. libmicrohttpd may have read
             * past the end of the stream without noticing it, and would
             * hold the connection until the idle timeout. */
            shutdown(c->fd, SHUT_RDWR);
            c->phase = CONN_BUSY;
        } else if (c->phase == CONN_RECEIVING && (bytes_received(c->fd, &peer_closed), peer_closed)) {
            /* The client stopped sending in the middle of a request: it
             * can never be completed. Seen twice RECHECK_MS apart, so a
             * whole request that libmicrohttpd is about to hand over (it
             * arrived with the close) is left be. */
            if (!c->closed_seen_us) {
                c->closed_seen_us = now;
                recheck = 1;
            } else if (now - c->closed_seen_us >= (RECHECK_MS - 5) * 1000) {
                shutdown(c->fd, SHUT_RDWR);
                c->phase = CONN_BUSY;
            } else {
                recheck = 1;
            }
        } else if (c->phase == CONN_RECEIVING && cs->timeout_us &&
                   now - c->started_us > cs->timeout_us) {
            shutdown(c->fd, SHUT_RDWR);
            c->phase = CONN_BUSY;                 /* once is enough */
            atomic_fetch_add(&cs->timed_out, 1);
        }
    }
    pthread_mutex_unlock(&cs->mu);
    return recheck;
}

/* The loop's timer: a full sweep when its period is due (longer with more
 * connections), a quick second look when a close awaits confirmation. */
void http_conns_tick(http_conns *cs) {
    int64_t now = clock_mono_us();
    if (now < cs->next_sweep_us && !(cs->recheck && now >= cs->recheck_us)) return;
    long count;
    cs->recheck = sweep(cs, &count);
    cs->recheck_us = now + RECHECK_MS * 1000;
    long every = count / SWEEP_CONNS_PER_MS;
    every = every < SWEEP_MIN_MS ? SWEEP_MIN_MS : every > SWEEP_MAX_MS ? SWEEP_MAX_MS : every;
    cs->next_sweep_us = now + every * 1000;
}

void http_conns_init(http_conns *cs, unsigned request_timeout_ms) {
    pthread_mutex_init(&cs->mu, NULL);
    cs->head = NULL;
    cs->timeout_us = (int64_t)request_timeout_ms * 1000;
    cs->next_sweep_us = 0;
    cs->recheck = 0;
    atomic_init(&cs->timed_out, 0);
}

void http_conns_fini(http_conns *cs) {
    while (cs->head) {                         /* libmicrohttpd is stopped: nothing races */
        http_conn *c = cs->head;
        cs->head = c->next;
        free(c);
    }
    pthread_mutex_destroy(&cs->mu);
}

http_conn *http_conn_opened(http_conns *cs, int fd) {
    http_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;                       /* untracked: only the idle timeout applies */
    c->fd = fd;
    /* The first request's deadline runs from the accept: a connection
     * that never sends a byte must not hold its slot until the idle
     * timeout (a minute), which is how a few hundred silent clients would
     * fill --max-connections. */
    c->phase = CONN_RECEIVING;
    c->started_us = clock_mono_us();
    c->bytes_idle = 0;
    c->cs = cs;
    pthread_mutex_lock(&cs->mu);
    c->next = cs->head;
    if (cs->head) cs->head->prev = c;
    cs->head = c;
    pthread_mutex_unlock(&cs->mu);
    return c;
}

void http_conn_closed(http_conn *c) {
    if (!c) return;
    http_conns *cs = c->cs;
    pthread_mutex_lock(&cs->mu);
    if (c->prev) c->prev->next = c->next;
    else cs->head = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&cs->mu);
    free(c);
}

/* Phase changes take the list's mutex: they are three per request, and
 * the sweeper's check of an idle connection (phase, then the kernel's
 * byte count) must not interleave with the connection going idle. */
void http_conn_request_seen(http_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&c->cs->mu);
    if (c->phase == CONN_IDLE) {
        c->phase = CONN_RECEIVING;
        c->started_us = clock_mono_us();
        c->closed_seen_us = 0;
    }
    pthread_mutex_unlock(&c->cs->mu);
}

void http_conn_request_in(http_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&c->cs->mu);
    c->phase = CONN_BUSY;
    pthread_mutex_unlock(&c->cs->mu);
}

void http_conn_answered(http_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&c->cs->mu);
    c->bytes_idle = BYTES_UNKNOWN;             /* the next sweep takes the baseline */
    c->phase = CONN_IDLE;
    pthread_mutex_unlock(&c->cs->mu);
}
