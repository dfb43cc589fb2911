/* mhdhello_main.c: bin/mhdhello, a bare libmicrohttpd server that answers
 * every request with "hello": the ceiling of the HTTP layer the service is
 * built on, for `make bench`. Set up the way http/ sets up the service
 * (epoll, a thread pool, keep-alive by answering on the second call of the
 * access handler), so the gap between the two is the service's own work.
 *
 *   mhdhello [--listen 127.0.0.1:PORT] [--threads N]
 *
 * Prints "listening on <port>" once ready; stops on SIGTERM or SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <microhttpd.h>

#include "common/version.h"

static volatile sig_atomic_t stop;

static void fl_hello_on_signal(int sig) {
    (void)sig;
    stop = 1;
}

/* libmicrohttpd closes the connection when the answer is queued on the
 * first call; remembering the request and answering on the next keeps it. */
static enum MHD_Result fl_hello_on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **state) {
    static int seen;
    struct MHD_Response *hello = cls;
    (void)url;
    (void)method;
    (void)version;
    (void)data;
    if (!*state) {
        *state = &seen;
        return MHD_YES;
    }
    if (*data_size) {            /* a body: swallow it */
        *data_size = 0;
        return MHD_YES;
    }
    return MHD_queue_response(c, MHD_HTTP_OK, hello);
}

int main(int argc, char **argv) {
    const char *listen = "127.0.0.1:0";
    int threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--listen") && i + 1 < argc) listen = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--version")) {
            printf("mhdhello %s\n", flashsale_version);
            return 0;
        } else {
            fprintf(stderr, "usage: mhdhello [--listen 127.0.0.1:PORT] [--threads N]\n");
            return 2;
        }
    }
    const char *colon = strrchr(listen, ':');
    struct sockaddr_in addr = { .sin_family = AF_INET };
    char host[64];
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - listen) : 0, listen);
    if (!colon || inet_pton(AF_INET, host, &addr.sin_addr) != 1 || threads < 1) {
        fprintf(stderr, "mhdhello: bad --listen or --threads\n");
        return 2;
    }
    addr.sin_port = htons((uint16_t)atoi(colon + 1));
    static const char body[] = "hello\n";
    struct MHD_Response *hello =
        MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(hello, "Content-Type", "text/plain");
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO, 0, NULL, NULL,
        fl_hello_on_request, hello, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)16384, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "mhdhello: cannot listen on %s\n", listen);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("listening on %u\n", info ? (unsigned)info->port : 0u);
    fflush(stdout);
    struct sigaction sa = { .sa_handler = fl_hello_on_signal };
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    while (!stop) pause();
    MHD_stop_daemon(d);
    MHD_destroy_response(hello);
    return 0;
}
