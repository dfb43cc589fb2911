# module.mk: flashload's extra targets (included by the top Makefile).
#
#   make demo    the README's first command: installs what is missing,
#                builds, and runs `flashload compare` with defaults that
#                finish in under four minutes on two cores (it starts the
#                lock servers too: Redlock's redis-servers, ZooKeeper,
#                etcd; and for the Redis failures group a Sentinel-watched
#                primary and replica for the stock and for a Redlock member,
#                three sentinels, Redlock servers one of which runs under
#                bin/libclockjump.so; last, the holds group); prints the
#                scene table, the holds table and the "choosing a lock"
#                table, and where report.html is. DEMO_ARGS adds flashload
#                compare options (e.g. --quick, --strategies, --no-probes,
#                --no-redis-failures, --no-holds).
#   make demo-pg the same with every order on a throwaway PostgreSQL server,
#                where db-for-update and unsafe-check-outside-tx run too.
#   make demo-hosts  the between-hosts group alone (root): a Redis split
#                brain under unsafe-trust-redis then lua; PostgreSQL run by
#                Patroni (etcd its store): the leader's host killed with
#                synchronous_mode off (unsafe) then on, the leader cut from
#                etcd and its standby, a planned switchover (one instance
#                through HAProxy); each on a deployment of network
#                namespaces of its own; about 4 minutes. `make demo
#                DEMO_ARGS=--between-hosts` adds it to the whole comparison.
#   make bench   the service's `lua` and `lock` x1/x8 order paths side by
#                side with the reference gateway (loadtest/gateway/: nginx +
#                Lua module + lua-resty-redis, one EVALSHA per order, nothing
#                stored) and the HTTP ceilings (nginx return 200, a bare
#                libmicrohttpd server), all by wrk -t2, alternating, medians
#                of LOAD_BENCH_ROUNDS rounds of LOAD_BENCH_SECONDS each, at
#                each of LOAD_BENCH_CONNECTIONS; then the books verified by
#                flashload. Then what a flash sale's goals are about
#                (docs/performance.md, "The goals"): the spike (a fresh SKU
#                of 10,000 units per run), the answers that touch no shared
#                state, and the overload run (flashload's open loop at
#                multiples of the closed-loop capacity over 2,000
#                connections); and the same inside a CPU quota of half a
#                core, as a container's limit puts the service
#                (overload.sh --cpu-quota; root), with the peer beside it
#                where ../shared/peers is. Prints the ratios the
#                performance goals name, with met / NOT met, and writes
#                bench.html (with the goodput chart) and bench.json. About 12
#                minutes; LOAD_BENCH_QUICK=1: about 3. LOAD_BENCH_ARGS adds bench.py
#                options (loadtest/bench.py --help: --groups, --spike-stock,
#                --overload-rates, --overload-connections, ...).

DEMO_ARGS              ?=
LOAD_BENCH_CONNECTIONS ?= 64,256
LOAD_BENCH_SECONDS     ?= 4
LOAD_BENCH_ROUNDS      ?= 3
LOAD_BENCH_QUICK       ?=
LOAD_BENCH_ARGS        ?=

.PHONY: demo-run bench-run

# bin/libclockjump.so: the LD_PRELOAD shim that moves a redis-server's wall
# clock for the Redis failures' clock scene (loadtest/clockjump.c says why
# not libfaketime). Built next to flashload, which looks for it there; with
# flags of its own, never a sanitizer's: it is loaded into Debian's
# redis-server, not into our programs.
CLOCKJUMP := $(BIN)/libclockjump.so
all: $(CLOCKJUMP)

$(CLOCKJUMP): loadtest/clockjump.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -fPIC -shared -o $@ $<

demo: deps
	$(MAKE) demo-run

demo-run: $(BIN)/flashload $(BIN)/flashsale $(CLOCKJUMP)
	$(BIN)/flashload compare $(DEMO_ARGS)

# The same comparison with the orders on a throwaway PostgreSQL server
# (tools/with_postgres.py), where db-for-update and its unsafe twin run too.
.PHONY: demo-pg
demo-pg: deps
	$(MAKE) $(BIN)/flashload $(BIN)/flashsale $(CLOCKJUMP)
	$(PYTHON) tools/with_postgres.py $(BIN)/flashload compare --db '{url}' $(DEMO_ARGS)

# The faults between hosts, which one machine's processes cannot show (a
# network cut, a host's death): tools/hosts_scene.py makes each scene's
# hosts with the tests' harness (tests/hosts.py).
.PHONY: demo-hosts
demo-hosts: deps
	$(MAKE) $(BIN)/flashload $(BIN)/flashsale
	$(BIN)/flashload compare --groups between-hosts $(DEMO_ARGS)

# What bench.py needs beyond the service's packages: wrk and the reference
# gateway (nginx with the Lua module, lua-resty-redis, cjson). The tests
# need them too: tests/test_bench.py runs bench.py in a tiny mode.
BENCH_DEPS := wrk nginx-light libnginx-mod-http-lua lua-nginx-redis lua-cjson
.PHONY: bench-deps
bench-deps: deps
	@tools/deps.sh $(BENCH_DEPS)
test test-sanitize: bench-deps

bench: bench-deps
	$(MAKE) bench-run

# The orders on PostgreSQL (figures and what they mean: docs/performance.md,
# "Orders on PostgreSQL"): the service beside pgbench's hot-row and
# insert-only transactions, lua beside SQLite, two instances beside one, on
# a throwaway server; BENCH_PG_ARGS adds loadtest/bench_pg.py options
# (--seconds, --rounds, --connections, --quick).
.PHONY: bench-pg
bench-pg: deps $(BIN)/flashload $(BIN)/flashsale
	$(PYTHON) loadtest/bench_pg.py $(BIN) $(BENCH_PG_ARGS)

# Many instances on one PostgreSQL, whether they share its connections
# without starving it or each other: ten instances against two on a server
# with its default max_connections, each at the default connection budget,
# selling lua, db-for-update and db-lock at once while psql connects every
# 100 ms (goal: ten sell at least 0.8 of what two do, no psql refused); lua
# through PgBouncer (transaction pooling) against direct (goal: 0.8).
# BENCH_PGSCALE_ARGS adds loadtest/bench_pgscale.py options (--seconds,
# --rounds, --quick, --lua-connections: the mixed pair's, 64,1024; --lua-alone:
# the pairs sell lua only).
.PHONY: bench-pgscale
bench-pgscale: deps $(BIN)/flashload $(BIN)/flashsale
	$(PYTHON) loadtest/bench_pgscale.py $(BIN) $(BENCH_PGSCALE_ARGS)

# What a Patroni failover costs a sale (root): on one deployment of
# tests/hosts.py, rounds of a switchover, the leader's host killed and the
# leader cut from etcd and its standby, each verified. BENCH_PATRONI_ARGS
# adds loadtest/bench_patroni.py options (--rounds, default 20: about 40
# minutes; --scenes).
.PHONY: bench-patroni
bench-patroni: deps $(BIN)/flashload $(BIN)/flashsale
	$(PYTHON) loadtest/bench_patroni.py $(BIN) $(BENCH_PATRONI_ARGS)

# One hot SKU on a Redis Cluster: its 8 lanes on 1 primary vs over 3, what
# spreading one product over primaries buys (docs/cluster.md).
.PHONY: bench-cluster
bench-cluster: deps $(BIN)/flashload $(BIN)/flashsale
	$(PYTHON) loadtest/bench_cluster.py $(BIN) $(BENCH_CLUSTER_ARGS)

bench-run: $(BIN)/flashload $(BIN)/flashsale $(BIN)/mhdhello
	$(PYTHON) loadtest/bench.py $(BIN) \
	    $(if $(filter-out 0,$(LOAD_BENCH_QUICK)),--quick,$(LOAD_BENCH_SECONDS) $(LOAD_BENCH_ROUNDS)) \
	    --connections $(LOAD_BENCH_CONNECTIONS) $(LOAD_BENCH_ARGS)

# A sale past capacity with the waiting room off and on (docs/waiting-room.md,
# "Measured", says what the room is for and what this found): the
# order path's capacity measured, then the same crowd (3x it, a fifth
# bots, 2 s of stock) twice, each verified; the goals with met / NOT met.
# BENCH_ROOM_ARGS adds loadtest/bench_room.py options (--rounds, --load,
# --ramp, --stock-seconds, --connections, --crowd-hold, --quick; another
# order path: --strategy, --segments, --cs-delay-ms) to both regimes: the
# `lua` path (bound by the HTTP layer on a small machine), then a path
# well below it (`lock`, 4 segments, a 1 ms pause), its waiting buyers on
# connections of their own (docs/waiting-room.md, "Measured").
.PHONY: bench-room
bench-room: deps $(BIN)/flashload $(BIN)/flashsale
	$(PYTHON) loadtest/bench_room.py $(BIN) $(BENCH_ROOM_ARGS)
	$(PYTHON) loadtest/bench_room.py $(BIN) --strategy lock --segments 4 --cs-delay-ms 1 \
	    --crowd-hold 16000 $(BENCH_ROOM_ARGS)
