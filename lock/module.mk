# module.mk: the lock module's extra targets (included by the top Makefile).
#
#   make bench-lock   uncontended acquire+release/s and contended hand-off
#                     latency p50/p99 with 8 waiters, next to a
#                     100 ms-polling tryLock, on a private redis-server;
#                     then the same for a private ZooKeeper and etcd.
#                     BENCH_SECONDS sets the time per figure (default 3).

BENCH_SECONDS ?= 3

bench-lock: $(BIN)/lockbench
	$(PYTHON) lock/bench_lock.py $(BIN)/lockbench $(BENCH_SECONDS)
