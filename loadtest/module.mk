# module.mk: flashload's extra targets (included by the top Makefile).
#
#   make demo    the README's first command: installs what is missing,
#                builds, and runs `flashload compare` with defaults that
#                finish in about a minute; prints the table and where
#                report.html is. DEMO_ARGS adds flashload compare options.
#   make bench   same-run ceilings next to the service, as ratios:
#                redis-benchmark running stock/lua/reserve.lua by EVALSHA,
#                a bare libmicrohttpd hello server (bin/mhdhello), and
#                flashload against the `lua` strategy, all with
#                LOAD_BENCH_CONNECTIONS connections, LOAD_BENCH_SECONDS each.

DEMO_ARGS              ?=
LOAD_BENCH_CONNECTIONS ?= 64
LOAD_BENCH_SECONDS     ?= 5

.PHONY: demo-run bench-run

demo: deps
	$(MAKE) demo-run

demo-run: $(BIN)/flashload $(BIN)/flashsale
	$(BIN)/flashload compare $(DEMO_ARGS)

bench: deps
	@tools/deps.sh wrk
	$(MAKE) bench-run

bench-run: $(BIN)/flashload $(BIN)/flashsale $(BIN)/mhdhello
	$(PYTHON) loadtest/bench.py $(BIN) $(LOAD_BENCH_CONNECTIONS) $(LOAD_BENCH_SECONDS)
