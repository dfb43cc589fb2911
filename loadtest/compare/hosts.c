/* hosts.c: the "between hosts" group of `flashload compare`.
 *
 * The faults that break real flash sales happen between machines: a Redis
 * split brain, a database leader lost, cut off or switched over, and who
 * decides (Patroni, etcd its store). Each scene of this group runs on a
 * deployment of its own -- one network namespace per host: Redis primary
 * and replica, three sentinels, two PostgreSQL nodes run by Patroni with
 * etcd, HAProxy, three instances of the service, the load generator -- that
 * the tests' harness makes (tests/hosts.py) and tools/hosts_scene.py runs,
 * one scene per call. Its Python is what the tests already trust to cut a
 * partition and check that it cut; rewriting it here would give the same
 * faults two homes. This file runs the script, reads what it wrote (the
 * load's own `flashload run --json`, with the verdict of the verifier that
 * ran on the load's host, and what the fault did) and fills the scene.
 *
 * The group needs root (ip netns): without it each scene is skipped with
 * the reason, never passed. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"

/* A scene's deployment takes ~4 s (~12 s with Patroni), its load up to 18
 * s, the split brain's heal up to 20 s more, the verifier a few: 5
 * minutes is far past any that works, and a wedged one must not hold the
 * comparison forever. */
#define HOSTS_SCENE_TIMEOUT_MS (300 * 1000)
#define HOSTS_STOP_GRACE_MS (30 * 1000)

const char *fl_between_title(fl_between b) {
    switch (b) {
    case FL_HOSTS_SPLIT: return "a Redis split brain";
    case FL_HOSTS_ASYNC: return "Patroni's leader lost, an asynchronous replica promoted";
    case FL_HOSTS_SYNC: return "Patroni's leader lost, its synchronous standby promoted";
    case FL_HOSTS_CUT: return "Patroni's leader cut from etcd and its replica, and demoted";
    case FL_HOSTS_SWITCHOVER: return "a planned Patroni switchover";
    default: return NULL;
    }
}

const char *fl_between_name(fl_between b) {
    switch (b) {
    case FL_HOSTS_SPLIT: return "split-brain";
    case FL_HOSTS_ASYNC: return "async-standby";
    case FL_HOSTS_SYNC: return "sync-standby";
    case FL_HOSTS_CUT: return "leader-cut";
    case FL_HOSTS_SWITCHOVER: return "switchover";
    default: return "none";
    }
}

/* tools/hosts_scene.py of the tree the service was built in: beside its
 * bin/ (bin/flashsale), or three up (build/<variant>/bin/flashsale). */
static void default_script(const char *bindir, char *out, size_t len) {
    snprintf(out, len, "%s/../tools/hosts_scene.py", bindir);
    if (access(out, R_OK)) snprintf(out, len, "%s/../../../tools/hosts_scene.py", bindir);
}

/* Runs argv to its end (SIGINT after the timeout or an interrupt, SIGKILL
 * a grace later: SIGINT lets the script remove the namespaces it made).
 * Its exit status, or -1 with why filled. */
static int run_script(char *const argv[], const atomic_int *interrupted, char *why,
                      size_t len) {
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, len, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "flashload: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int64_t deadline = clock_mono_ms() + HOSTS_SCENE_TIMEOUT_MS, killed_at = 0;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            snprintf(why, len, "waitpid: %s", strerror(errno));
            return -1;
        }
        int64_t now = clock_mono_ms();
        int stop = now > deadline || (interrupted && atomic_load(interrupted));
        if (stop && !killed_at) {
            kill(pid, SIGINT);
            killed_at = now;
        } else if (killed_at && now - killed_at > HOSTS_STOP_GRACE_MS) {
            kill(pid, SIGKILL);
        }
        usleep(100 * 1000);
    }
    if (killed_at) {
        snprintf(why, len, "%s", interrupted && atomic_load(interrupted)
                                     ? "interrupted" : "the scene took more than 5 minutes");
        return -1;
    }
    if (!WIFEXITED(status)) {
        snprintf(why, len, "%s died of signal %d", argv[1], WTERMSIG(status));
        return -1;
    }
    return WEXITSTATUS(status);
}

static long long jint(json_t *o, const char *k) {
    return (long long)json_integer_value(json_object_get(o, k));
}

/* The verdict as the load's flashload wrote it (run.c's JSON). */
static void verdict_read(json_t *jv, fl_verdict *vd) {
    memset(vd, 0, sizeof *vd);
    vd->pass = json_is_true(json_object_get(jv, "pass"));
    vd->initial = jint(jv, "initial");
    vd->sold = jint(jv, "sold");
    vd->available = jint(jv, "available");
    vd->units_201 = jint(jv, "units_201");
    vd->oversold = jint(jv, "oversold");
    vd->lost = jint(jv, "lost");
    vd->min_stock = jint(jv, "min_stock");
    vd->orders_without_201 = jint(jv, "orders_without_201");
    vd->created_without_order = jint(jv, "created_without_order");
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(jv, "violations"), i, x) {
        if (vd->nv == FL_MAX_VIOLATIONS) break;
        fl_violation *v = &vd->v[vd->nv++];
        const char *s = json_string_value(json_object_get(x, "vantage"));
        snprintf(v->vantage, sizeof v->vantage, "%s", s ? s : "");
        s = json_string_value(json_object_get(x, "what"));
        snprintf(v->what, sizeof v->what, "%s", s ? s : "");
        v->size = jint(x, "size");
    }
    vd->nv_total = vd->nv;
    vd->api_checked = vd->db_checked = 1;
    vd->db_vantage = "postgresql";
}

/* Fills res from the script's result file; a note when it ran nothing. */
static void fill(json_t *top, fl_scene_result *res) {
    const char *err = json_string_value(json_object_get(top, "error"));
    json_t *run = json_object_get(top, "run"), *fault = json_object_get(top, "fault");
    int fault_ok = json_is_true(json_object_get(fault, "ok"));
    const char *fault_why = json_string_value(json_object_get(fault, "why"));
    const char *detail = json_string_value(json_object_get(top, "detail"));
    if (err || !json_is_object(run)) {
        snprintf(res->note, sizeof res->note, "skipped: %.250s",
                 err ? err : fault_why && *fault_why ? fault_why : "the load did not finish");
        return;
    }
    json_t *lat = json_object_get(run, "latency_us"), *st = json_object_get(run, "status");
    double secs = json_number_value(json_object_get(run, "seconds"));
    res->ran = 1;
    res->answered = (uint64_t)jint(run, "answered");
    res->created = (uint64_t)jint(run, "created");
    res->transport_errors = (uint64_t)jint(run, "transport_errors");
    res->orders_per_s = secs > 0 ? res->created / secs : 0;
    res->answers_per_s = secs > 0 ? res->answered / secs : 0;
    res->p50_us = (uint64_t)jint(lat, "p50");
    res->p90_us = (uint64_t)jint(lat, "p90");
    res->p99_us = (uint64_t)jint(lat, "p99");
    res->p999_us = (uint64_t)jint(lat, "p999");
    res->max_us = (uint64_t)jint(lat, "max");
    const char *k;
    json_t *v;
    json_object_foreach(st, k, v) {
        int code = atoi(k);
        uint64_t c = (uint64_t)json_integer_value(v);
        if (code == 201) res->status_201 = c;
        else if (code == 409) res->status_409 = c;
        else if (code == 429) res->status_429 = c;
        else if (code >= 500 && code < 600) res->status_5xx += c;
    }
    json_t *gap = json_object_get(run, "max_sale_gap_ms");
    res->sale_gap_us = json_is_number(gap) ? (int64_t)(json_number_value(gap) * 1000) : -1;
    verdict_read(json_object_get(run, "verdict"), &res->verdict);
    fl_verdict_line(&res->verdict, res->verdict_line, sizeof res->verdict_line);
    snprintf(res->detail, sizeof res->detail, "%s", detail ? detail : "");
    /* The unsafe twin shows its flaw: units beyond the stock, or 201s the
     * books lost. A scene whose fault did not come shows nothing. */
    const fl_verdict *vd = &res->verdict;
    int flaw = vd->oversold > 0 || vd->min_stock < 0 || vd->created_without_order > 0;
    res->as_expected = fault_ok && (res->sc.unsafe ? !vd->pass && flaw : vd->pass);
    if (!fault_ok)
        snprintf(res->forced_why, sizeof res->forced_why, "the fault did not come: %.160s",
                 fault_why ? fault_why : "?");
}

void fl_hosts_run(const fl_compare_opts *o, fl_scene_result *res) {
    const fl_scene *sc = &res->sc;
    res->recover_ms = -1;
    if (geteuid() != 0) {
        snprintf(res->note, sizeof res->note,
                 "skipped: needs root (a network namespace per host): run as root, as CI does");
        return;
    }
    char script[460], bindir[420], out[460], secs[16];
    /* The programs the deployment runs: the service's directory. */
    snprintf(bindir, sizeof bindir, "%s", o->service_bin);
    char *slash = strrchr(bindir, '/');
    if (slash) *slash = '\0';
    else snprintf(bindir, sizeof bindir, ".");
    if (o->hosts_script[0]) snprintf(script, sizeof script, "%s", o->hosts_script);
    else default_script(bindir, script, sizeof script);
    if (access(script, R_OK)) {
        snprintf(res->note, sizeof res->note, "skipped: %.200s: %.50s (--hosts-script)", script,
                 strerror(errno));
        return;
    }
    snprintf(out, sizeof out, "%s/hosts-%s-%s.json", o->out_dir, fl_between_name(sc->between),
             sc->strategy);
    snprintf(secs, sizeof secs, "%.0f", sc->duration_s);
    unlink(out);
    const char *py = access("/usr/bin/python3", X_OK) ? "python3" : "/usr/bin/python3";
    char *argv[] = { (char *)py, script, "--bin", bindir, "--scene",
                     (char *)fl_between_name(sc->between), "--strategy", (char *)sc->strategy,
                     "--seconds", secs, "--out", out, NULL };
    char why[300] = "";
    int rc = run_script(argv, o->interrupted, why, sizeof why);
    json_error_t je;
    json_t *top = rc >= 0 ? json_load_file(out, 0, &je) : NULL;
    if (!top) {
        snprintf(res->note, sizeof res->note, "skipped: %.200s%s", rc < 0 ? why : script,
                 rc < 0 ? "" : " wrote no result");
        return;
    }
    fill(top, res);
    json_decref(top);
}
