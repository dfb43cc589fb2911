/* route.c: matching a request's raw path against the route table.
 *
 * libmicrohttpd decodes the whole path before handing it over, which turns
 * "/v1/products%2Fp1" into "/v1/products/p1": an escaped slash would become
 * a separator, and a route the client never named would answer. So routing
 * takes the path as sent (from the URI log callback), splits it on '/'
 * first, and decodes each segment on its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/internal.h"

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

long http_decode_segment(const char *src, size_t n, char *dst) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\0') return -1;
        if (c == '%') {
            if (i + 2 >= n) return -1;                 /* needs two hex digits */
            int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return -1;
            dst[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            dst[o++] = c;
        }
    }
    dst[o] = '\0';
    return (long)o;
}

/* Whether method may use a route registered for route_method. */
static int method_serves(const char *route_method, const char *method) {
    return !strcmp(route_method, method) ||
           (!strcmp(route_method, "GET") && !strcmp(method, "HEAD"));
}

/* Matches the segments of path against pattern, decoding the {} ones
 * into params. A segment longer than HTTP_PARAM_MAX is handed on clipped
 * to that length: longer than any identifier a route takes, it stays
 * invalid, and the route answers with its own 404. Returns 1 on a match,
 * 0 on none, -1 on a malformed path (or no memory to decode it). */
static int match(const char *pattern, const char *path,
                 char params[HTTP_MAX_PARAMS][HTTP_PARAM_MAX + 1]) {
    char small[HTTP_PARAM_MAX + 1];
    int np = 0;
    if (*pattern != '/' || *path != '/') return *path == '/' ? 0 : -1;
    pattern++;
    path++;
    for (;;) {
        size_t pl = strcspn(pattern, "/"), sl = strcspn(path, "/");
        char *seg = sl <= HTTP_PARAM_MAX ? small : malloc(sl + 1);
        if (!seg) return -1;
        long dl = http_decode_segment(path, sl, seg);
        int ok = dl >= 0;
        if (ok && pl == 2 && pattern[0] == '{' && pattern[1] == '}') {
            ok = dl > 0 && np < HTTP_MAX_PARAMS;
            if (ok) {
                size_t keep = (size_t)dl < HTTP_PARAM_MAX ? (size_t)dl : HTTP_PARAM_MAX;
                memcpy(params[np], seg, keep);
                params[np++][keep] = '\0';
            }
        } else if (ok) {
            ok = (size_t)dl == pl && memcmp(seg, pattern, pl) == 0;
        }
        if (seg != small) free(seg);
        if (dl < 0) return -1;
        if (!ok) return 0;
        pattern += pl;
        path += sl;
        if (*pattern == '\0' || *path == '\0') return *pattern == *path;
        pattern++;                                     /* both at '/' */
        path++;
    }
}

/* Adds m (and HEAD after GET) to the comma-separated list in allow. */
static void allow_add(char *allow, size_t len, const char *m) {
    const char *add[2] = { m, !strcmp(m, "GET") ? "HEAD" : NULL };
    for (int i = 0; i < 2 && add[i]; i++) {
        size_t used = strlen(allow), ml = strlen(add[i]);
        int present = 0;
        for (const char *p = allow; (p = strstr(p, add[i])) != NULL; p += ml)
            present |= (p == allow || p[-1] == ' ') && (p[ml] == ',' || p[ml] == '\0');
        if (present || used + ml + 3 > len) continue;
        snprintf(allow + used, len - used, "%s%s", used ? ", " : "", add[i]);
    }
}

http_match http_route_find(const http_route *routes, size_t nroutes, const char *method,
                           const char *path, size_t *route,
                           char params[HTTP_MAX_PARAMS][HTTP_PARAM_MAX + 1], char *allow,
                           size_t allowlen) {
    char scratch[HTTP_MAX_PARAMS][HTTP_PARAM_MAX + 1];
    allow[0] = '\0';
    if (path[0] != '/') return HTTP_MATCH_BAD_PATH;    /* "*", absolute-form URIs */
    for (size_t i = 0; i < nroutes; i++) {
        int m = match(routes[i].pattern, path, method_serves(routes[i].method, method)
                                                   ? params : scratch);
        if (m < 0) return HTTP_MATCH_BAD_PATH;
        if (m == 0) continue;
        if (method_serves(routes[i].method, method)) {
            *route = i;
            return HTTP_MATCH_OK;
        }
        allow_add(allow, allowlen, routes[i].method);
    }
    return allow[0] ? HTTP_MATCH_METHOD : HTTP_MATCH_NONE;
}
