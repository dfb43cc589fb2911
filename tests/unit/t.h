/* t.h: the smallest test framework that does the job: CHECK records a
 * failure and carries on, TEST_MAIN runs the listed tests and prints the
 * summary line the runner reads ("N passed, N failed"). */
#ifndef FLASHSALE_T_H
#define FLASHSALE_T_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failed_now;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                      \
            t_failed_now = 1;                                                    \
        }                                                                        \
    } while (0)

#define CHECK_STR(a, b)                                                          \
    do {                                                                         \
        const char *t_a = (a), *t_b = (b);                                       \
        if (strcmp(t_a, t_b) != 0) {                                             \
            fprintf(stderr, "  %s:%d: CHECK failed: %s == %s (\"%s\" vs \"%s\")\n", \
                    __FILE__, __LINE__, #a, #b, t_a, t_b);                       \
            t_failed_now = 1;                                                    \
        }                                                                        \
    } while (0)

typedef struct t_case {
    const char *name;
    void (*fn)(void);
} t_case;

#define T(fn) { #fn, fn }

/* Runs the cases whose name contains filter (NULL: all), their names
 * printed after prefix; adds to *passed and *failed. */
static inline void t_run(const char *filter, const char *prefix, const t_case *cases, size_t n,
                         int *passed, int *failed) {
    for (size_t i = 0; i < n; i++) {
        if (filter && !strstr(cases[i].name, filter)) continue;
        t_failed_now = 0;
        cases[i].fn();
        if (t_failed_now) {
            (*failed)++;
            printf("FAIL %s%s\n", prefix, cases[i].name);
        } else {
            (*passed)++;
            printf("ok   %s%s\n", prefix, cases[i].name);
        }
        fflush(stdout);
    }
}

/* Runs the cases whose name contains argv[1] (all without it). */
static inline int t_main(int argc, char **argv, const t_case *cases, size_t n) {
    int passed = 0, failed = 0;
    t_run(argc > 1 ? argv[1] : NULL, "", cases, n, &passed, &failed);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define TEST_MAIN(...)                                                           \
    int main(int argc, char **argv) {                                            \
        static const t_case cases[] = { __VA_ARGS__ };                           \
        return t_main(argc, argv, cases, sizeof cases / sizeof cases[0]);        \
    }

#endif
