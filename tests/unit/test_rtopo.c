/* test_rtopo.c: the Redis topology module (rtopo/rtopo.h) against real
 * topologies it starts itself (tests/unit/ttopo.h): a Cluster of three
 * primaries, and a primary + replica watched by three sentinels.
 * - URLs: the three forms, and each mistake with its message;
 * - slots: rtopo_slot against the server's CLUSTER KEYSLOT, hash tag edge
 *   cases ({}, {{a}}, a{b}c{d}, ...) and random binary keys;
 * - the slot map: loaded past a dead seed, checked against CLUSTER NODES
 *   and against where keys really live; refused from a non-cluster node;
 *   malformed CLUSTER SLOTS answers refused with the map unchanged;
 * - answers: a real MOVED (a key sent to the wrong node), a real ASK and
 *   TRYAGAIN during a slot migration done by hand (SETSLOT MIGRATING /
 *   IMPORTING, MIGRATE), the MOVED after it, applied to a stale map; a
 *   real CLUSTERDOWN (a primary killed); a real READONLY; the routed
 *   client following all of it;
 * - Sentinel: discovery past a dead sentinel, a stale sentinel that names
 *   the replica refused (ROLE says slave), a forced failover
 *   (SENTINEL FAILOVER) seen on +switch-master and rediscovered.
 * Every server is killed by PID at exit, even after a failed check, and
 * its temp dir removed. */
#include <hiredis/hiredis.h>

#include "rtopo/rtopo.h"
#include "tests/unit/t.h"
#include "tests/unit/ttopo.h"

#define TO 1000                   /* connect and command timeout, ms */

static tcluster CL;
static tsentinels SN;
static tredis stale;

static void stop_all(void) {
    tc_cleanup(&CL);
    ts_cleanup(&SN);
    tr_cleanup(&stale);
}

/* Starts both topologies once (the sentinels meet each other while the
 * cluster is being made). 0 or -1. */
static int up(void) {
    static int state;             /* 0: not yet, 1: up, -1: failed */
    if (state) return state > 0 ? 0 : -1;
    atexit(stop_all);
    state = -1;
    if (ts_start(&SN)) fprintf(stderr, "  could not start the sentinels\n");
    else if (tc_start(&CL, 3)) fprintf(stderr, "  could not make the cluster\n");
    else state = 1;
    return state > 0 ? 0 : -1;
}

#define NEED_SERVERS()                                                           \
    do {                                                                         \
        if (up()) {                                                              \
            CHECK(!"the topologies are up");                                     \
            return;                                                              \
        }                                                                        \
    } while (0)

static int parse_ok(const char *url, rtopo_spec *s) {
    char err[256];
    int rc = rtopo_parse(url, s, err, sizeof err);
    if (rc) fprintf(stderr, "  %s: %s\n", url, err);
    return rc == 0;
}

/* rtopo_parse refuses url with a message containing want. */
static int parse_fails(const char *url, const char *want) {
    rtopo_spec s;
    char err[256] = "";
    if (rtopo_parse(url, &s, err, sizeof err) == 0) {
        fprintf(stderr, "  %s: accepted\n", url);
        return 0;
    }
    if (!strstr(err, want)) fprintf(stderr, "  %s: '%s' lacks '%s'\n", url, err, want);
    return strstr(err, want) != NULL;
}

static void test_parse(void) {
    rtopo_spec s;
    CHECK(parse_ok("redis://:pw@127.0.0.1:7000/3", &s));
    CHECK(s.kind == RTOPO_SINGLE && s.nseeds == 1 && s.seeds[0].port == 7000 && s.db == 3);
    CHECK_STR(s.password, "pw");
    CHECK(parse_ok("unix:/tmp/r.sock?db=2", &s) && s.kind == RTOPO_SINGLE && s.db == 2);

    CHECK(parse_ok("redis-sentinel://:se/cr?t@a:1,b,[::1]:3/my-master?db=4", &s));
    CHECK(s.kind == RTOPO_SENTINEL && s.nseeds == 3 && s.db == 4);
    CHECK_STR(s.password, "se/cr?t");
    CHECK_STR(s.master, "my-master");
    CHECK_STR(s.seeds[0].host, "a");
    CHECK(s.seeds[0].port == 1 && s.seeds[1].port == 26379 && s.seeds[2].port == 3);
    CHECK_STR(s.seeds[2].host, "::1");
    CHECK(s.seeds[0].password[0] == '\0' && s.seeds[0].db == 0);   /* sentinels: none */
    rconn_addr a;
    rtopo_node_addr(&s, "10.0.0.9", 6380, &a);
    CHECK_STR(a.password, "se/cr?t");
    CHECK(a.db == 4 && a.port == 6380);

    CHECK(parse_ok("redis-cluster://u:p@h1:7000,h2", &s));
    CHECK(s.kind == RTOPO_CLUSTER && s.nseeds == 2 && s.seeds[1].port == 6379);
    CHECK_STR(s.seeds[1].user, "u");
    CHECK_STR(s.seeds[1].password, "p");
    CHECK(parse_ok("redis-cluster://h1:7000/", &s) && s.db == 0);
    char buf[256];
    CHECK_STR(rtopo_describe(&s, buf, sizeof buf), "cluster h1:7000");

    CHECK(parse_fails("redis-sentinel:///m", "empty address list"));
    CHECK(parse_fails("redis-cluster://", "empty address list"));
    CHECK(parse_fails("redis-cluster://a:1,,b:2", "address 2 of the list"));
    CHECK(parse_fails("redis-cluster://a:1,", "address 2 of the list"));
    CHECK(parse_fails("redis-cluster://a:0", "bad address 'a:0'"));
    CHECK(parse_fails("redis-cluster://a:65536", "bad address"));
    CHECK(parse_fails("redis-cluster://a:x1", "bad address"));
    CHECK(parse_fails("redis-cluster://[::1", "bad address"));
    CHECK(parse_fails("redis-cluster://a:1/2", "only database 0"));
    CHECK(parse_fails("redis-cluster://a:1?db=2", "only database 0"));
    CHECK(parse_fails("redis-cluster://a:1/x", "unexpected '/x'"));
    CHECK(parse_fails("redis-sentinel://a:1", "missing master name"));
    CHECK(parse_fails("redis-sentinel://a:1/", "missing master name"));
    CHECK(parse_fails("redis-sentinel://a:1/?db=1", "missing master name"));
    CHECK(parse_fails("redis-sentinel://a:1/m/x", "bad master name"));
    CHECK(parse_fails("redis-sentinel://a:1/m?db=x", "bad query"));
    CHECK(parse_fails("redis-sentinel://a:1/m?dc=1", "bad query"));
    CHECK(parse_fails("redis-sentinel://pw@a:1/m", "bad credentials"));
    CHECK(parse_fails("redis-sentinel:a:1/m", "want redis-sentinel://"));
    CHECK(parse_fails("redis://a:99999/0", "bad Redis URL"));
    CHECK(parse_fails("", "empty Redis URL"));
    CHECK(parse_fails("redis-cluster://1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
                      "more than 16"));
    CHECK(parse_ok("redis-cluster://1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", &s));
}

/* The slot the server computes for key. */
static long long keyslot(int port, const char *key, size_t len) {
    redisReply *r = tq(port, "CLUSTER KEYSLOT %b", key, len);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return v;
}

static void test_slot(void) {
    /* Known values (from CLUSTER KEYSLOT; 123456789 is CRC16's check). */
    static const struct { const char *k; int slot; } known[] = {
        { "foo", 12182 }, { "{}", 15257 }, { "{{a}}", 10276 }, { "a{b}c{d}", 3300 },
        { "{}a", 10875 }, { "a{}b", 13694 }, { "{a", 10276 }, { "a}", 5921 }, { "", 0 },
        { "{user1000}.following", 3443 }, { "}{x}", 16287 }, { "123456789", 12739 },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        CHECK(rtopo_slot(known[i].k, strlen(known[i].k)) == known[i].slot);
    CHECK(rtopo_slot("{b}", 3) == rtopo_slot("a{b}c{d}", 8));
    CHECK(rtopo_slot("{a}x", 4) == rtopo_slot("{a}y", 4));
    NEED_SERVERS();
    int port = CL.node[0].port;
    static const char *const edge[] = { "{}", "{{a}}", "a{b}c{d}", "{}{x}", "{{}}", "}{",
                                        "{a}{b}", "x{}", "{ }", "{\xff}", "fs:stock:{phone-x}:0" };
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        CHECK(rtopo_slot(edge[i], strlen(edge[i])) == keyslot(port, edge[i], strlen(edge[i])));
    unsigned seed = 21;
    int bad = 0;
    for (int i = 0; i < 300; i++) {     /* random bytes, NULs and braces included */
        char k[24];
        size_t n = rand_r(&seed) % sizeof k;
        for (size_t j = 0; j < n; j++) {
            int c = rand_r(&seed) % 260;
            k[j] = c >= 256 ? "{}{}"[c - 256] : (char)c;
        }
        bad += rtopo_slot(k, n) != keyslot(port, k, n);
    }
    CHECK(bad == 0);
}

/* The primaries' slot ranges from CLUSTER NODES on port: owner[slot] =
 * the primary's port. 0 or -1. */
static int nodes_owners(int port, int *owner) {
    redisReply *r = tq(port, "CLUSTER NODES");
    if (!r || r->type != REDIS_REPLY_STRING) return -1;
    for (int s = 0; s < RTOPO_SLOTS; s++) owner[s] = 0;
    for (char *save, *line = strtok_r(r->str, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *tok[64];
        int n = 0;
        for (char *s2, *t = strtok_r(line, " ", &s2); t && n < 64; t = strtok_r(NULL, " ", &s2))
            tok[n++] = t;
        if (n < 8 || !strstr(tok[2], "master")) continue;
        int p = atoi(strchr(tok[1], ':') + 1);
        for (int i = 8; i < n; i++) {
            int lo, hi;
            if (tok[i][0] == '[') continue;          /* a slot in migration */
            if (sscanf(tok[i], "%d-%d", &lo, &hi) != 2) hi = lo = atoi(tok[i]);
            for (int s = lo; s <= hi && s < RTOPO_SLOTS; s++) owner[s] = p;
        }
    }
    freeReplyObject(r);
    return 0;
}

static rtopo_spec cluster_spec(int first_port) {
    rtopo_spec s;
    char url[128], err[256];
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d", first_port,
             CL.node[1].port);
    if (rtopo_parse(url, &s, err, sizeof err)) fprintf(stderr, "  %s\n", err);
    return s;
}

static void test_slotmap(void) {
    NEED_SERVERS();
    int dead = tr_free_port(), owner[RTOPO_SLOTS], wrong = 0;
    rtopo_spec spec = cluster_spec(dead);          /* the first seed is down */
    rtopo_slotmap *m = rtopo_slotmap_new();
    char err[512];
    CHECK(rtopo_slotmap_load(m, &spec, TO, err, sizeof err) == 0);
    CHECK(rtopo_slotmap_nshards(m) == 3 && rtopo_slotmap_served(m) == RTOPO_SLOTS);
    CHECK(nodes_owners(CL.node[2].port, owner) == 0);
    for (int s = 0; s < RTOPO_SLOTS; s++) {
        const rtopo_shard *sh = rtopo_slotmap_lookup(m, s);
        wrong += !sh || sh->primary.port != owner[s] || strcmp(sh->primary.host, "127.0.0.1");
    }
    CHECK(wrong == 0);
    CHECK(strlen(rtopo_slotmap_shard(m, 0)->id) == 40);
    for (int i = 0; i < 200; i++) {       /* each key is accepted where the map says */
        char k[32];
        int n = snprintf(k, sizeof k, "key:%d", i);
        const rtopo_shard *sh = rtopo_slotmap_lookup(m, rtopo_slot(k, (size_t)n));
        redisReply *r = sh ? tq(sh->primary.port, "SET %s v", k) : NULL;
        wrong += !r || r->type != REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    CHECK(wrong == 0);
    CHECK(rtopo_slotmap_lookup(m, -1) == NULL && rtopo_slotmap_lookup(m, RTOPO_SLOTS) == NULL);

    /* Nobody to ask, or a node without cluster support: refused, the
     * map as it was. */
    rtopo_spec none, plain;
    char url[64];
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d", dead);
    CHECK(rtopo_parse(url, &none, err, sizeof err) == 0);
    rtopo_slotmap *empty = rtopo_slotmap_new();
    CHECK(rtopo_slotmap_load(empty, &none, TO, err, sizeof err) == -1);
    CHECK(strstr(err, "onnect") != NULL);
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d", SN.primary.port);
    CHECK(rtopo_parse(url, &plain, err, sizeof err) == 0);
    CHECK(rtopo_slotmap_load(empty, &plain, TO, err, sizeof err) == -1);
    CHECK(strstr(err, "cluster support disabled") != NULL);
    CHECK(rtopo_slotmap_served(empty) == 0 && rtopo_slotmap_lookup(empty, 0) == NULL);
    /* A reload asks the map's own primaries first: no seed needed. */
    CHECK(rtopo_slotmap_load(m, &none, TO, err, sizeof err) == 0);
    CHECK(rtopo_slotmap_served(m) == RTOPO_SLOTS);
    rtopo_slotmap_free(empty);
    rtopo_slotmap_free(m);
}

/* ------------------------------------------- hand-made answers */

static redisReply *mk_node(const char *host, long long port) {
    return mk_arr(3, mk_str(REDIS_REPLY_STRING, host), mk_int(port),
                  mk_str(REDIS_REPLY_STRING, "0123456789012345678901234567890123456789"));
}
/* rtopo_slotmap_set on r (freed): its return. */
static int set_map(rtopo_slotmap *m, redisReply *r) {
    rtopo_spec spec;
    char err[256];
    rtopo_parse("redis-cluster://:pw@seed:1", &spec, err, sizeof err);
    int rc = rtopo_slotmap_set(m, &spec, "10.0.0.1", r, err, sizeof err);
    freeReplyObject(r);
    return rc;
}

static void test_slotmap_answers(void) {
    rtopo_slotmap *m = rtopo_slotmap_new();
    /* "" is the node asked; "?" an unknown endpoint: its slots unserved. */
    CHECK(set_map(m, mk_arr(2, mk_arr(4, mk_int(0), mk_int(99), mk_node("", 7000),
                                      mk_node("r", 7001)),
                            mk_arr(3, mk_int(100), mk_int(199), mk_node("?", 7002)))) == 0);
    CHECK(rtopo_slotmap_served(m) == 100 && rtopo_slotmap_lookup(m, 100) == NULL);
    const rtopo_shard *sh = rtopo_slotmap_lookup(m, 99);
    CHECK(sh && !strcmp(sh->primary.host, "10.0.0.1") && sh->primary.port == 7000);
    CHECK(sh && sh->nreplicas == 1 && sh->replicas[0].port == 7001);
    CHECK(sh && !strcmp(sh->primary.password, "pw"));
    /* Malformed: each refused, the map unchanged. */
    CHECK(set_map(m, mk_str(REDIS_REPLY_ERROR, "ERR no cluster")) == -1);
    CHECK(set_map(m, mk_arr(0)) == -1);                                   /* nothing served */
    CHECK(set_map(m, mk_arr(1, mk_arr(3, mk_int(5), mk_int(4), mk_node("a", 1)))) == -1);
    CHECK(set_map(m, mk_arr(1, mk_arr(3, mk_int(0), mk_int(16384), mk_node("a", 1)))) == -1);
    CHECK(set_map(m, mk_arr(1, mk_arr(3, mk_int(0), mk_int(1), mk_node("a", 0)))) == -1);
    CHECK(set_map(m, mk_arr(1, mk_arr(2, mk_int(0), mk_int(1)))) == -1);
    CHECK(set_map(m, mk_arr(1, mk_arr(3, mk_int(0), mk_int(1), mk_int(7)))) == -1);
    CHECK(set_map(m, mk_arr(1, mk_int(3))) == -1);
    CHECK(rtopo_slotmap_served(m) == 100 && rtopo_slotmap_nshards(m) == 1);
    /* A MOVED to a node the map does not know adds it. */
    rtopo_spec spec;
    char err[128];
    rtopo_parse("redis-cluster://:pw@seed:1", &spec, err, sizeof err);
    rtopo_redirect rd = { .slot = 16383, .host = "h", .port = 9 };
    CHECK(rtopo_slotmap_moved(m, &spec, &rd) == 0 && rtopo_slotmap_nshards(m) == 2);
    CHECK(rtopo_slotmap_lookup(m, 16383) && rtopo_slotmap_lookup(m, 16383)->primary.port == 9);
    rd.slot = 16384;
    CHECK(rtopo_slotmap_moved(m, &spec, &rd) == -1);
    rtopo_slotmap_free(m);
}

/* rtopo_classify on an error answer text. */
static rtopo_verdict classify(const char *text, rtopo_redirect *rd) {
    redisReply *r = mk_str(REDIS_REPLY_ERROR, text);
    rtopo_verdict v = rtopo_classify(r, rd);
    freeReplyObject(r);
    return v;
}

static void test_classify(void) {
    rtopo_redirect rd;
    CHECK(classify("MOVED 3999 127.0.0.1:6381", &rd) == RTOPO_MOVED);
    CHECK(rd.slot == 3999 && rd.port == 6381 && !strcmp(rd.host, "127.0.0.1"));
    CHECK(classify("ASK 16383 ::1:7000", &rd) == RTOPO_ASK);
    CHECK(rd.slot == 16383 && rd.port == 7000 && !strcmp(rd.host, "::1"));
    CHECK(classify("MOVED 0 redis-3.example:7000", &rd) == RTOPO_MOVED);
    static const char *const bad[] = { "MOVED", "MOVED ", "MOVED 1", "MOVED 1 h", "MOVED 16384 h:1",
                                       "MOVED x h:1", "MOVED 1 h:0", "MOVED 1 h:65536",
                                       "MOVED 1 :1", "ASK 1 h:1 x", "MOVEDX 1 h:1", "ASKING",
                                       "ERR unknown command" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK(classify(bad[i], &rd) == RTOPO_ERROR);
    CHECK(classify("TRYAGAIN Multiple keys request during rehashing of slot", NULL) ==
          RTOPO_TRYAGAIN);
    CHECK(classify("CLUSTERDOWN The cluster is down", NULL) == RTOPO_CLUSTERDOWN);
    CHECK(classify("LOADING Redis is loading the dataset in memory", NULL) == RTOPO_REDISCOVER);
    CHECK(classify("MASTERDOWN Link with MASTER is down", NULL) == RTOPO_REDISCOVER);
    CHECK(classify("READONLY You can't write against a read only replica.", NULL) ==
          RTOPO_REDISCOVER);
    CHECK(rtopo_classify(NULL, NULL) == RTOPO_REDISCOVER);
    redisReply *ok = mk_str(REDIS_REPLY_STATUS, "MOVED 1 h:1");     /* not an error */
    CHECK(rtopo_classify(ok, NULL) == RTOPO_OK);
    freeReplyObject(ok);
}

/* ------------------------------------------------ real redirections */

/* The verdict of the answer to fmt on port; *rd filled for MOVED/ASK. */
static rtopo_verdict verdict(int port, rtopo_redirect *rd, const char *fmt, const char *key) {
    redisReply *r = tq(port, fmt, key);
    rtopo_verdict v = rtopo_classify(r, rd);
    if (r) freeReplyObject(r);
    return v;
}

/* The shard of m whose primary listens on port, or NULL. */
static const rtopo_shard *shard_at(const rtopo_slotmap *m, int port) {
    for (int i = 0; i < rtopo_slotmap_nshards(m); i++)
        if (rtopo_slotmap_shard(m, i)->primary.port == port) return rtopo_slotmap_shard(m, i);
    return NULL;
}

static int ok(redisReply *r) {
    int good = r && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING ||
                     r->type == REDIS_REPLY_INTEGER);
    if (r && !good && r->str) fprintf(stderr, "  unexpected answer: %s\n", r->str);
    if (r) freeReplyObject(r);
    return good;
}

/* GET key through the client: whether it answers want. */
static int client_get(rtopo_client *c, const char *key, const char *want) {
    const char *argv[] = { "GET", key };
    size_t len[] = { 3, strlen(key) };
    char err[512];
    redisReply *r = rtopo_client_run(c, key, strlen(key), 2, argv, len, err, sizeof err);
    int good = r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, want);
    if (!r) fprintf(stderr, "  GET %s: %s\n", key, err);
    if (r) freeReplyObject(r);
    return good;
}

static void test_moved_and_ask(void) {
    NEED_SERVERS();
    rtopo_spec spec = cluster_spec(CL.node[0].port);
    rtopo_slotmap *m = rtopo_slotmap_new();
    rtopo_redirect rd;
    char err[512];
    CHECK(rtopo_slotmap_load(m, &spec, TO, err, sizeof err) == 0);
    rtopo_client *cl = rtopo_client_new(&spec, TO);

    /* A real MOVED: a key sent to a node that does not serve its slot. */
    int slot = rtopo_slot("{mv}k", 5);
    int a = rtopo_slotmap_lookup(m, slot)->primary.port;
    int b = CL.node[0].port == a ? CL.node[1].port : CL.node[0].port;
    CHECK(verdict(b, &rd, "GET %s", "{mv}k") == RTOPO_MOVED);
    CHECK(rd.slot == slot && rd.port == a && !strcmp(rd.host, "127.0.0.1"));

    /* A slot migrated by hand from its owner a to b. */
    slot = rtopo_slot("{ask}", 5);
    a = rtopo_slotmap_lookup(m, slot)->primary.port;
    b = CL.node[0].port == a ? CL.node[1].port : CL.node[0].port;
    const char *aid = shard_at(m, a)->id, *bid = shard_at(m, b)->id;
    CHECK(ok(tq(a, "MSET {ask}a 1 {ask}b 2 {ask}c 3")));
    CHECK(client_get(cl, "{ask}a", "1"));                      /* the client's map loads */
    CHECK(ok(tq(b, "CLUSTER SETSLOT %d IMPORTING %s", slot, aid)));
    CHECK(ok(tq(a, "CLUSTER SETSLOT %d MIGRATING %s", slot, bid)));
    CHECK(ok(tq(a, "MIGRATE 127.0.0.1 %d {ask}a 0 5000", b)));
    CHECK(verdict(a, &rd, "GET %s", "{ask}a") == RTOPO_ASK);     /* moved: ask b */
    CHECK(rd.slot == slot && rd.port == b);
    CHECK(verdict(a, &rd, "GET %s", "{ask}b") == RTOPO_OK);      /* still on a */
    CHECK(verdict(b, &rd, "GET %s", "{ask}a") == RTOPO_MOVED);   /* b, unasked: go to a */
    CHECK(rd.port == a);
    /* Keys of the slot split between a and b: TRYAGAIN, even ASKING. */
    redisContext *c = redisConnect("127.0.0.1", b);
    redisReply *r1 = NULL, *r2 = NULL;
    redisAppendCommand(c, "ASKING");
    redisAppendCommand(c, "MGET {ask}a {ask}b");
    CHECK(redisGetReply(c, (void **)&r1) == REDIS_OK && redisGetReply(c, (void **)&r2) == REDIS_OK);
    CHECK(rtopo_classify(r2, NULL) == RTOPO_TRYAGAIN);
    if (r1) freeReplyObject(r1);
    if (r2) freeReplyObject(r2);
    redisFree(c);
    CHECK(client_get(cl, "{ask}a", "1"));                      /* follows the ASK */
    CHECK(client_get(cl, "{ask}b", "2"));

    /* The migration done: a answers MOVED, which mends a stale map. */
    CHECK(ok(tq(a, "MIGRATE 127.0.0.1 %d %s 0 5000 KEYS {ask}b {ask}c", b, "")));
    for (int i = 0; i < CL.n; i++)
        CHECK(ok(tq(CL.node[i].port, "CLUSTER SETSLOT %d NODE %s", slot, bid)));
    CHECK(verdict(a, &rd, "GET %s", "{ask}c") == RTOPO_MOVED && rd.port == b);
    CHECK(rtopo_slotmap_lookup(m, slot)->primary.port == a);
    CHECK(rtopo_slotmap_moved(m, &spec, &rd) == 0);
    CHECK(rtopo_slotmap_lookup(m, slot)->primary.port == b);
    CHECK(rtopo_slotmap_served(m) == RTOPO_SLOTS && rtopo_slotmap_nshards(m) == 3);
    CHECK(client_get(cl, "{ask}c", "3"));                      /* follows the MOVED */
    rtopo_client_free(cl);
    rtopo_slotmap_free(m);
}

static void test_client_cluster(void) {
    NEED_SERVERS();
    rtopo_spec spec = cluster_spec(CL.node[2].port);
    rtopo_client *cl = rtopo_client_new(&spec, TO);
    char err[512], k[32], v[32];
    int bad = 0;
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "cl:%d", i);
        snprintf(v, sizeof v, "v%d", i);
        const char *argv[] = { "SET", k, v };
        size_t len[] = { 3, strlen(k), strlen(v) };
        redisReply *r = rtopo_client_run(cl, k, strlen(k), 3, argv, len, err, sizeof err);
        bad += !r || r->type != REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    CHECK(bad == 0);
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "cl:%d", i);
        snprintf(v, sizeof v, "v%d", i);
        bad += !client_get(cl, k, v);
    }
    CHECK(bad == 0);
    const char *argv[] = { "INCR", "cl:1" };                   /* the command's own error */
    size_t len[] = { 4, 4 };
    redisReply *r = rtopo_client_run(cl, "cl:1", 4, 2, argv, len, err, sizeof err);
    CHECK(r && r->type == REDIS_REPLY_ERROR && rtopo_classify(r, NULL) == RTOPO_ERROR);
    if (r) freeReplyObject(r);
    const char *ping[] = { "PING" };
    size_t plen[] = { 4 };
    r = rtopo_client_run(cl, NULL, 0, 1, ping, plen, err, sizeof err);   /* any primary */
    CHECK(r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG"));
    if (r) freeReplyObject(r);
    rtopo_client_free(cl);
}

/* The watched map (rtopo_cluster): routes as CLUSTER SLOTS says; a MOVED
 * told is applied at once (a new version); a reload finds the map again
 * and bumps the version only when something moved. */
static void test_cluster_watch(void) {
    NEED_SERVERS();
    rtopo_spec spec = cluster_spec(CL.node[1].port);
    rtopo_slotmap *m = rtopo_slotmap_new();
    char err[512];
    CHECK(rtopo_slotmap_load(m, &spec, TO, err, sizeof err) == 0);
    rtopo_cluster *cl = rtopo_cluster_start(&spec, TO, err, sizeof err);
    CHECK(cl != NULL);
    if (!cl) goto out;
    CHECK(!rtopo_cluster_error(cl, err, sizeof err));
    rconn_addr at;
    int bad = 0;
    for (int slot = 0; slot < RTOPO_SLOTS; slot += 97)
        bad += !rtopo_cluster_route(cl, slot, &at) ||
               at.port != rtopo_slotmap_lookup(m, slot)->primary.port;
    CHECK(bad == 0);
    unsigned v = rtopo_cluster_version(cl);
    CHECK(v > 0);
    /* A MOVED for a slot (a real one: the slot moved by hand). */
    int slot = rtopo_slot("{watch}", 7);
    int a = rtopo_slotmap_lookup(m, slot)->primary.port;
    int b = CL.node[0].port == a ? CL.node[1].port : CL.node[0].port;
    const char *bid = shard_at(m, b)->id;
    for (int i = 0; i < CL.n; i++)
        CHECK(ok(tq(CL.node[i].port, "CLUSTER SETSLOT %d NODE %s", slot, bid)));
    rtopo_redirect rd;
    CHECK(verdict(a, &rd, "GET %s", "{watch}") == RTOPO_MOVED && rd.port == b);
    rtopo_cluster_moved(cl, &rd);
    CHECK(rtopo_cluster_route(cl, slot, &at) > v && at.port == b);
    /* The reload that follows finds the same: no new version after it. */
    clock_sleep_ms(200);
    v = rtopo_cluster_version(cl);
    rtopo_cluster_suspect(cl);
    clock_sleep_ms(200);
    CHECK(rtopo_cluster_version(cl) == v);
    CHECK(rtopo_cluster_route(cl, slot, &at) == v && at.port == b);
    /* Moved back by hand, told to no one: the thread's own reload finds it. */
    for (int i = 0; i < CL.n; i++)
        CHECK(ok(tq(CL.node[i].port, "CLUSTER SETSLOT %d NODE %s", slot, shard_at(m, a)->id)));
    rtopo_cluster_suspect(cl);
    int64_t until = clock_mono_ms() + 3000;
    while (clock_mono_ms() < until && (!rtopo_cluster_route(cl, slot, &at) || at.port != a))
        clock_sleep_ms(20);
    CHECK(at.port == a && rtopo_cluster_version(cl) > v);
    rtopo_cluster_stop(cl);
out:
    rtopo_slotmap_free(m);
    /* Not a cluster: refused. */
    rtopo_spec one;
    CHECK(rtopo_parse("redis://127.0.0.1:1", &one, err, sizeof err) == 0);
    CHECK(rtopo_cluster_start(&one, TO, err, sizeof err) == NULL);
    CHECK(strstr(err, "not a cluster") != NULL);
}

/* Last of the cluster's: a primary killed, the others say CLUSTERDOWN. */
static void test_clusterdown(void) {
    NEED_SERVERS();
    rtopo_spec spec = cluster_spec(CL.node[0].port);
    rtopo_slotmap *m = rtopo_slotmap_new();
    char err[512];
    CHECK(rtopo_slotmap_load(m, &spec, TO, err, sizeof err) == 0);
    int victim = rtopo_slotmap_lookup(m, rtopo_slot("{down}", 6))->primary.port, other = 0;
    for (int i = 0; i < CL.n; i++) {
        if (CL.node[i].port == victim) tr_kill(&CL.node[i]);
        else other = CL.node[i].port;
    }
    rtopo_verdict v = RTOPO_OK;
    for (int64_t until = clock_mono_ms() + 8000; clock_mono_ms() < until; clock_sleep_ms(50))
        if ((v = verdict(other, NULL, "GET %s", "{down}")) == RTOPO_CLUSTERDOWN) break;
    CHECK(v == RTOPO_CLUSTERDOWN);
    rtopo_slotmap_free(m);
}

/* ---------------------------------------------------------- Sentinel */

/* The spec of the sentinels on ports (n of them) watching name. */
static rtopo_spec sentinel_spec(const int *ports, int n, const char *name) {
    char url[256], err[256];
    size_t used = (size_t)snprintf(url, sizeof url, "redis-sentinel://");
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(url + used, sizeof url - used, "%s127.0.0.1:%d", i ? "," : "",
                                 ports[i]);
    snprintf(url + used, sizeof url - used, "/%s", name);
    rtopo_spec s;
    if (rtopo_parse(url, &s, err, sizeof err)) fprintf(stderr, "  %s: %s\n", url, err);
    return s;
}

static void test_sentinel_discover(void) {
    NEED_SERVERS();
    int ports[] = { tr_free_port(), SN.s[0].port, SN.s[1].port, SN.s[2].port };
    rtopo_spec spec = sentinel_spec(ports, 4, "mymaster");    /* the first one is down */
    rconn_addr p, a;
    char err[1024];
    CHECK(rtopo_sentinel_discover(&spec, TO, &p, err, sizeof err) == 0);
    CHECK(p.port == SN.primary.port && !strcmp(p.host, "127.0.0.1"));
    rtopo_spec other = sentinel_spec(ports + 1, 1, "nosuch");
    CHECK(rtopo_sentinel_discover(&other, TO, &p, err, sizeof err) == -1);
    CHECK(strstr(err, "does not know a master named 'nosuch'") != NULL);
    rtopo_node_addr(&spec, "127.0.0.1", SN.replica.port, &a);
    CHECK(rtopo_check_master(&a, TO, err, sizeof err) == -1 && strstr(err, "replica") != NULL);
    rtopo_node_addr(&spec, "127.0.0.1", SN.s[0].port, &a);
    CHECK(rtopo_check_master(&a, TO, err, sizeof err) == -1 && strstr(err, "sentinel") != NULL);
    /* A write on the replica: READONLY, which means "find the primary". */
    CHECK(verdict(SN.replica.port, NULL, "SET %s 1", "ro") == RTOPO_REDISCOVER);
    /* The routed client on the Sentinel address. */
    rtopo_client *cl = rtopo_client_new(&spec, TO);
    const char *argv[] = { "SET", "sn:k", "v1" };
    size_t len[] = { 3, 4, 2 };
    redisReply *r = rtopo_client_run(cl, "sn:k", 4, 3, argv, len, err, sizeof err);
    CHECK(r && r->type == REDIS_REPLY_STATUS);
    if (r) freeReplyObject(r);
    CHECK(tq_has(SN.primary.port, "v1", "GET sn:k"));
    rtopo_client_free(cl);
}

/* A sentinel that watches the replica as "mymaster" (misconfigured, or
 * left behind by a failover it missed) names the replica: refused, and
 * the next sentinel's answer taken. */
static void test_sentinel_stale(void) {
    NEED_SERVERS();
    CHECK(ts_start_sentinel(&stale, SN.replica.port, "mymaster", 60000) == 0);
    int ports[] = { stale.port, SN.s[0].port };
    rtopo_spec only = sentinel_spec(ports, 1, "mymaster"), both = sentinel_spec(ports, 2,
                                                                                 "mymaster");
    rconn_addr p;
    char err[1024];
    CHECK(rtopo_sentinel_discover(&only, TO, &p, err, sizeof err) == -1);
    CHECK(strstr(err, "ROLE says it is a replica") != NULL);
    CHECK(rtopo_sentinel_discover(&both, TO, &p, err, sizeof err) == 0);
    CHECK(p.port == SN.primary.port);
    tr_cleanup(&stale);
}

static void test_sentinel_failover(void) {
    NEED_SERVERS();
    int ports[] = { SN.s[0].port, SN.s[1].port, SN.s[2].port };
    rtopo_spec spec = sentinel_spec(ports, 3, "mymaster");
    rtopo_switch sw;
    rconn_addr p;
    char err[1024];
    redisContext *sub = rtopo_sentinel_subscribe(&spec, TO, err, sizeof err);
    CHECK(sub != NULL);
    if (!sub) return;
    CHECK(rtopo_sentinel_wait_switch(sub, "mymaster", 50, &sw, err, sizeof err) == 0);
    /* Forced: the sentinels need not agree, only know the replica. */
    int forced = 0;
    for (int64_t until = clock_mono_ms() + 10000; !forced && clock_mono_ms() < until;
         clock_sleep_ms(100))
        forced = tq_has(SN.s[0].port, "OK", "SENTINEL FAILOVER mymaster");
    CHECK(forced);
    CHECK(rtopo_sentinel_wait_switch(sub, "mymaster", 10000, &sw, err, sizeof err) == 1);
    CHECK(!strcmp(sw.name, "mymaster") && sw.old_port == SN.primary.port &&
          sw.new_port == SN.replica.port && !strcmp(sw.new_host, "127.0.0.1"));
    redisFree(sub);
    CHECK(rtopo_sentinel_discover(&spec, TO, &p, err, sizeof err) == 0);
    CHECK(p.port == SN.replica.port);
    rtopo_node_addr(&spec, "127.0.0.1", SN.replica.port, &p);
    CHECK(rtopo_check_master(&p, TO, err, sizeof err) == 0);
}

static void test_switch_parse(void) {
    rtopo_switch sw;
    char err[128];
    static const struct { const char *payload; int want; } cases[] = {
        { "mymaster 10.0.0.1 6379 10.0.0.2 6380", 1 }, { "other 10.0.0.1 6379 10.0.0.2 6380", 0 },
        { "mymaster 10.0.0.1 6379 10.0.0.2", -1 }, { "mymaster 10.0.0.1 6379 10.0.0.2 0", -1 },
        { "mymaster  10.0.0.1 6379 10.0.0.2 6380", -1 }, { "mymaster a 1 b 2 c", -1 },
        { "", -1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        redisReply *r = mk_arr(3, mk_str(REDIS_REPLY_STRING, "message"),
                               mk_str(REDIS_REPLY_STRING, "+switch-master"),
                               mk_str(REDIS_REPLY_STRING, cases[i].payload));
        CHECK(rtopo_switch_parse(r, "mymaster", &sw, err, sizeof err) == cases[i].want);
        freeReplyObject(r);
    }
    CHECK(sw.new_port == 6380 && !strcmp(sw.old_host, "10.0.0.1"));
    redisReply *r = mk_arr(3, mk_str(REDIS_REPLY_STRING, "subscribe"),
                           mk_str(REDIS_REPLY_STRING, "+switch-master"), mk_int(1));
    CHECK(rtopo_switch_parse(r, "mymaster", &sw, err, sizeof err) == 0);
    freeReplyObject(r);
    r = mk_int(3);
    CHECK(rtopo_switch_parse(r, "mymaster", &sw, err, sizeof err) == -1);
    freeReplyObject(r);
}

TEST_MAIN(T(test_parse), T(test_slot), T(test_classify), T(test_slotmap_answers),
          T(test_switch_parse), T(test_slotmap), T(test_moved_and_ask), T(test_client_cluster), T(test_cluster_watch),
          T(test_sentinel_discover), T(test_sentinel_stale), T(test_sentinel_failover),
          T(test_clusterdown))
