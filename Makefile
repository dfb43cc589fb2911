# flashsale: build, test, demo and benchmarks.
#
#   make              build bin/flashsale (and the other programs)
#   make test         install missing Debian packages, build, run every test
#   make test TESTS="test_holds:: unit/test_db"
#                     only the tests whose name contains a pattern, building
#                     only what they need (the programs for an integration
#                     test, the matching unit-test programs)
#   make unit T=test_db  or  T=test_db:test_holds
#                     one unit-test program, or its cases whose name contains
#                     what follows the colon; builds only that program and
#                     starts a Redis only if the program reads one
#   make test-sanitize   the same tests against an AddressSanitizer+UBSan build
#   make test-tsan    the unit tests and the order-path, lock and fault tests
#                     against a ThreadSanitizer build (build/tsan/bin)
#   make demo         the strategy comparison (see README)
#   make soak         10 minutes of mixed load with Redis restarts (not part
#                     of make test); SOAK_SECONDS=90 for a short run
#   make soak-valgrind   a short, slow run of the same under valgrind
#
# Layout: each module directory (MODULES) becomes one static library,
# build/$(VARIANT)/lib<module>.a: its C files (those of its folders too:
# service/order/, service/repair/, ...) and its own Lua scripts
# (<module>/lua/*.lua, embedded as <module>_lua_<name>[] in
# build/$(VARIANT)/gen/lua_<module>.c). Files named <program>_main.c each
# become bin/<program>, linked with only the archives its LINK_<program> line
# names; tests/unit/test_<name>.c become unit-test programs (LINK_test_<name>).
# Before anything compiles, tools/layering.py checks every #include of the
# modules against their allowed arrows (service -> http, stock, lock, rtopo,
# db, common; stock -> rtopo, lock, db, common; lock -> rtopo, common;
# rtopo, db, http, loadtest -> common) and
# fails the build, naming the rule, on one that breaks them; before the
# tests, tools/calls.py checks on the objects that no two files of one
# folder call each other in a circle -- in every folder of every module,
# but those CALLS_EXCEPT names (below, with why).

VARIANT ?= rel
BUILD   := build/$(VARIANT)
ifeq ($(VARIANT),rel)
BIN     := bin
else
BIN     := $(BUILD)/bin
endif

PYTHON  ?= /usr/bin/python3
CC      ?= cc
MODULES := common rtopo db stock lock http service loadtest
CFLAGS_ALL := -std=gnu11 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread \
              -I. -I$(BUILD)/gen -I/usr/include/postgresql $(CFLAGS)
ifeq ($(VARIANT),san)
CFLAGS_ALL += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined
LDFLAGS_ALL := -fsanitize=address,undefined $(LDFLAGS)
else ifeq ($(VARIANT),tsan)
# ThreadSanitizer (gcc's, runtime libtsan2: a dependency of gcc-12 itself).
# -O1 keeps the reports' stacks close to the source. Under the
# instrumentation gcc's -Wformat-truncation loses track of string sizes
# (loadtest/compare/compare.c: "up to 623103 bytes" from a 32-byte field); the rel
# and san builds keep that check.
CFLAGS_ALL += -O1 -fsanitize=thread -fno-omit-frame-pointer -Wno-format-truncation
LDFLAGS_ALL := -fsanitize=thread $(LDFLAGS)
else
CFLAGS_ALL += -O2
LDFLAGS_ALL := $(LDFLAGS)
endif
LIBS    := -lhiredis -lmicrohttpd -ljansson -lsqlite3 -lpq -lzookeeper_mt -lcurl -lm -pthread

ALL_C    := $(wildcard $(addsuffix /*.c,$(MODULES)) $(addsuffix /*/*.c,$(MODULES)))
MAIN_C   := $(filter %_main.c,$(ALL_C))
# Generated objects, each in the archive of the module that owns it: the
# version stamp in common (every program links it), the OpenAPI document in
# service (rules below).
GEN_common  := $(BUILD)/gen/version.o
GEN_service := $(BUILD)/gen/openapi.o
GEN_OBJ     := $(GEN_common) $(GEN_service)
PROGRAMS := $(patsubst %_main.c,$(BIN)/%,$(notdir $(MAIN_C)))
UNIT_C   := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BIN)/tests/%,$(UNIT_C))
# What the unit tests share (tests/unit/*.c but test_*.c: traw.c): no
# program of its own, an archive each unit test links before its modules'.
UNIT_LIB_C := $(filter-out $(UNIT_C),$(wildcard tests/unit/*.c))
UNIT_LIB   := $(BUILD)/libunit.a

# The archives each program links, highest layer first; nothing else is on
# its command line, so a call across a forbidden boundary cannot link.
LINK_flashsale      := service http stock lock rtopo db common
LINK_flashload      := loadtest common
LINK_mhdhello       := loadtest common
LINK_flashlock      := lock rtopo common
LINK_lockbench      := lock rtopo common
LINK_lockfair       := lock rtopo common
LINK_lockcheck      := lock rtopo common
# Unit tests link what they test.
LINK_test_aconn     := common
LINK_test_cpus      := common
LINK_test_sha256    := common
LINK_test_utctime   := common
LINK_test_db        := db common
LINK_test_http      := http common
LINK_test_flashload := loadtest common
LINK_test_lock      := lock rtopo common
LINK_test_loop      := common
LINK_test_service   := service http stock lock rtopo db common
LINK_test_order     := service http stock lock rtopo db common
LINK_test_admission := service http stock lock rtopo db common
LINK_test_room      := service http stock lock rtopo db common
LINK_test_stock     := stock lock rtopo db common
LINK_test_stock_async := stock lock rtopo db common
LINK_test_fence     := stock lock rtopo db common
LINK_test_rtopo     := rtopo common

# Sources that go into no archive: each module.mk says what it becomes
# (loadtest/clockjump.c: bin/libclockjump.so, an LD_PRELOAD shim).
NOT_ARCHIVED := loadtest/clockjump.c

mod_lua   = $(wildcard $(1)/lua/*.lua)
mod_obj   = $(patsubst %.c,$(BUILD)/%.o,$(filter-out %_main.c $(NOT_ARCHIVED),$(wildcard \
              $(1)/*.c $(1)/*/*.c))) \
            $(if $(call mod_lua,$(1)),$(BUILD)/gen/lua_$(1).o) $(GEN_$(1))
link_libs = $(if $(LINK_$(1)),$(patsubst %,$(BUILD)/lib%.a,$(LINK_$(1))),$(error \
              no LINK_$(1) in the Makefile: say which module archives $(1) may link))
LAYERING  := $(BUILD)/layering.ok

# Keep intermediate objects (unit-test .o files) between runs.
.SECONDARY:

.PHONY: all deps test test-run test-sanitize test-tsan demo bench bench-lock clean fuzz soak \
        soak-valgrind
all: $(PROGRAMS) $(UNIT_BIN)

deps:
	@tools/deps.sh

# The module boundaries, checked before anything compiles.
$(LAYERING): tools/layering.py $(wildcard $(addsuffix /*.[ch],$(MODULES)) \
                                $(addsuffix /*/*.[ch],$(MODULES)))
	@mkdir -p $(dir $@)
	@$(PYTHON) tools/layering.py
	@touch $@

$(BUILD)/%.o: %.c | $(LAYERING)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c -o $@ $<

# Lua sources become C string constants named <module>_lua_<file>, one
# generated file per module, so each archive carries only its own scripts.
lua_sym = $(firstword $(subst /, ,$(1)))_lua_$(basename $(notdir $(1)))
$(BUILD)/gen/lua_%.o: $(BUILD)/gen/lua_%.c
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

# ---- operability: generated sources (version stamp, embedded OpenAPI) ----
# build/<variant>/gen/version.c holds `git describe` (or VERSION) and is
# rewritten only when that changes; gen/openapi.c holds docs/openapi.yaml
# as JSON (GET /openapi.json). Each goes into its module's archive
# (GEN_common, GEN_service above).
$(BUILD)/gen/version.c: FORCE
	@mkdir -p $(dir $@)
	@tools/version.sh --c $@

$(BUILD)/gen/openapi.json: docs/openapi.yaml tools/openapi_json.py
	@mkdir -p $(dir $@)
	$(PYTHON) tools/openapi_json.py $< $@

$(BUILD)/gen/openapi.c: $(BUILD)/gen/openapi.json tools/embed.sh
	tools/embed.sh $@ docs_openapi_json=$<

$(GEN_OBJ): %.o: %.c
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

.PHONY: FORCE
FORCE:

# The Node.js tools the tests use (OpenAPI linter, node-redlock), pinned by
# tools/node/package-lock.json; a no-op once installed.
.PHONY: npm-deps
npm-deps:
	@tools/npm-deps.sh
test-run: npm-deps
# ---- end operability: generated sources ----

define module_rule
$(BUILD)/gen/lua_$(1).c: $(call mod_lua,$(1)) tools/embed.sh
	@mkdir -p $$(dir $$@)
	tools/embed.sh $$@ $(foreach f,$(call mod_lua,$(1)),$(call lua_sym,$(f))=$(f))

$(BUILD)/lib$(1).a: $(call mod_obj,$(1))
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach m,$(MODULES),$(eval $(call module_rule,$(m))))

# $(1): the program's object, $(2): its binary, $(3): its name, $(4):
# archives it links besides its modules' (a unit test: $(UNIT_LIB)).
define program_rule
$(2): $(1) $(4) $(call link_libs,$(3))
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS_ALL) -o $$@ $$< $(4) $(call link_libs,$(3)) $$(LIBS)
endef
$(UNIT_LIB): $(patsubst %.c,$(BUILD)/%.o,$(UNIT_LIB_C))
	@rm -f $@
	ar rcs $@ $^
$(foreach m,$(MAIN_C),$(eval $(call program_rule,$(BUILD)/$(m:.c=.o),$(BIN)/$(patsubst \
    %_main.c,%,$(notdir $(m))),$(patsubst %_main.c,%,$(notdir $(m))))))
$(foreach t,$(UNIT_C),$(eval $(call program_rule,$(patsubst %.c,$(BUILD)/%.o,$(t)),$(patsubst \
    tests/unit/%.c,$(BIN)/tests/%,$(t)),$(basename $(notdir $(t))),$(UNIT_LIB))))

# What a test run builds: everything; with TESTS, the programs (unless
# every pattern names unit tests) and the unit-test programs a pattern
# matches (run.py names them unit/<program>, and a pattern matches what
# contains it).
ifeq ($(strip $(TESTS)),)
TEST_BUILD := all
else
TEST_UNITS := $(foreach u,$(UNIT_BIN),$(if $(strip $(foreach p,$(TESTS),$(findstring \
                $(p),unit/$(notdir $(u))))),$(u)))
TEST_BUILD := $(if $(filter-out unit/%,$(TESTS)),$(PROGRAMS) $(BIN)/libclockjump.so) \
              $(TEST_UNITS)
endif

test: deps
	$(MAKE) test-run

# The circle check reads every module's objects: on a whole build only.
# It checks every folder but those CALLS_EXCEPT names, each a circle known
# and being taken apart, with why (tests/test_build.py reads this list
# too). None today.
CALLS_EXCEPT :=
test-run: $(TEST_BUILD)
	$(PYTHON) tools/layering.py
	$(if $(strip $(TESTS)),,$(PYTHON) tools/calls.py $(BUILD) $(addprefix --except ,$(CALLS_EXCEPT)))
	FLASHSALE_BIN=$(abspath $(BIN)) $(PYTHON) tests/run.py $(TESTS)

# One unit-test program, or some of its cases: T=test_db, T=test_db:case.
.PHONY: unit
unit:
	@test -n "$(T)" || { echo 'make unit: say which, e.g. T=test_db or T=test_db:test_holds' >&2; exit 2; }
	@test -f tests/unit/$(firstword $(subst :, ,$(T))).c || { echo \
	    "make unit: no tests/unit/$(firstword $(subst :, ,$(T))).c" >&2; exit 2; }
	$(MAKE) $(BIN)/tests/$(firstword $(subst :, ,$(T)))
	FLASHSALE_BIN=$(abspath $(BIN)) $(PYTHON) tests/run.py --unit $(T)

test-sanitize: deps
	$(MAKE) VARIANT=san test-run

# ThreadSanitizer: the unit tests, the order path (api, concurrency,
# strategies), the locks (lock, lock_backends, lock_strategies) and the
# faults, against build/tsan/bin; tests/run.py gives the programs
# TSAN_OPTIONS (tests/tsan.supp: third-party libraries only) and fails a test
# on any report. TSAN_TESTS picks the tests (run.py patterns).
TSAN_TESTS ?= unit/ test_api:: test_concurrency:: test_strategies:: test_lock:: \
              test_lock_backends:: test_lock_strategies:: test_faults::
test-tsan: deps
	$(MAKE) VARIANT=tsan test-run TESTS="$(TSAN_TESTS)"

# libFuzzer harnesses (clang), each run for a bounded number of executions;
# FUZZ_RUNS per target, FUZZ_SECONDS at most each, 10 million in total.
FUZZ_RUNS    ?= 5000000
FUZZ_SECONDS ?= 120
FUZZ_JOBS    ?= 1
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_CFLAGS  := -g -O1 -std=gnu11 -D_GNU_SOURCE -pthread -I. -Ibuild/rel/gen \
                -I/usr/include/postgresql \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
# What the small harnesses test (validation, ids) and what that code links
# with: the stock module, and the lock and db modules under it.
FUZZ_LIBSRC  := service/api/validate.c service/order/orderid.c \
                $(filter-out %_main.c,$(wildcard common/*.c rtopo/*.c stock/*.c lock/*.c db/*.c)) \
                build/rel/gen/lua_stock.c build/rel/gen/lua_lock.c $(FUZZ_EXTRA_SRC)

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIBSRC)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $^ -lhiredis -ljansson -lsqlite3 -lpq -lzookeeper_mt -lcurl -lm

# Per-target sources, as extra prerequisites so that $^ links them.
build/fuzz/fuzz_http: loadtest/client/httpresp.c

# The request-surface harness runs the whole service in its process.
FUZZ_SERVICE_SRC := $(filter-out %_main.c,$(wildcard common/*.c rtopo/*.c http/*.c db/*.c stock/*.c \
                    lock/*.c service/*.c service/*/*.c))
build/fuzz/fuzz_request: tests/fuzz/fuzz_request.c $(FUZZ_SERVICE_SRC) loadtest/client/httpresp.c \
                         build/rel/gen/lua_stock.c build/rel/gen/lua_lock.c \
                         build/rel/gen/version.c build/rel/gen/openapi.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $^ -lhiredis -ljansson -lmicrohttpd -lsqlite3 -lpq -lzookeeper_mt -lcurl -lm

fuzz:
	@tools/deps.sh clang libclang-rt-14-dev
	$(MAKE) all $(patsubst %,build/fuzz/fuzz_%,$(FUZZ_TARGETS))
	FUZZ_JOBS=$(FUZZ_JOBS) tools/fuzz.sh build/fuzz $(FUZZ_RUNS) $(FUZZ_SECONDS) 10000000 $(FUZZ_TARGETS)

# Soak: every safe strategy under a moderate open-loop load for SOAK_SECONDS
# while Redis restarts every minute (sometimes losing its data); fails on a
# verifier FAIL, an audit discrepancy, or RSS growing past the warm-up by
# more than 20% + 8 MB. See tests/soak.py.
SOAK_SECONDS          ?= 600
SOAK_VALGRIND_SECONDS ?= 60

soak: all
	FLASHSALE_BIN=$(abspath $(BIN)) $(PYTHON) tests/soak.py --seconds $(SOAK_SECONDS)

soak-valgrind:
	@tools/deps.sh valgrind
	$(MAKE) all
	FLASHSALE_BIN=$(abspath $(BIN)) $(PYTHON) tests/soak.py --valgrind \
	    --seconds $(SOAK_VALGRIND_SECONDS)

clean:
	rm -rf build bin

-include $(shell find build -name '*.d' 2>/dev/null)
-include $(wildcard */module.mk)
