# flashsale: build, test, demo and benchmarks.
#
#   make              build bin/flashsale (and the other programs)
#   make test         install missing Debian packages, build, run every test
#   make test-sanitize   the same tests against an AddressSanitizer+UBSan build
#   make demo         the strategy comparison (see README)
#   make soak         10 minutes of mixed load with Redis restarts (not part
#                     of make test); SOAK_SECONDS=90 for a short run
#   make soak-valgrind   a short, slow run of the same under valgrind
#
# Layout: every C file of a module directory goes into one static library,
# except files named <program>_main.c, which each become bin/<program>.
# Lua scripts in <module>/lua/*.lua are embedded as <module>_lua_<name>[].
# tests/unit/test_*.c become unit-test programs.

VARIANT ?= rel
BUILD   := build/$(VARIANT)
ifeq ($(VARIANT),rel)
BIN     := bin
else
BIN     := $(BUILD)/bin
endif

PYTHON  ?= /usr/bin/python3
CC      ?= cc
MODULES := common db stock lock http service loadtest
CFLAGS_ALL := -std=gnu11 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread \
              -I. -I$(BUILD)/gen $(CFLAGS)
ifeq ($(VARIANT),san)
CFLAGS_ALL += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined
LDFLAGS_ALL := -fsanitize=address,undefined $(LDFLAGS)
else
CFLAGS_ALL += -O2
LDFLAGS_ALL := $(LDFLAGS)
endif
LIBS    := -lhiredis -lmicrohttpd -ljansson -lsqlite3 -lm -pthread

ALL_C    := $(wildcard $(addsuffix /*.c,$(MODULES)))
MAIN_C   := $(filter %_main.c,$(ALL_C))
LIB_C    := $(filter-out %_main.c,$(ALL_C))
LUA      := $(wildcard $(addsuffix /lua/*.lua,$(MODULES)))
LUA_C    := $(BUILD)/gen/lua_scripts.c
LIB_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(LIB_C)) $(BUILD)/gen/lua_scripts.o
# operability: the version stamp and the OpenAPI document (rules below)
GEN_OBJ  := $(BUILD)/gen/version.o $(BUILD)/gen/openapi.o
LIB_OBJ  += $(GEN_OBJ)
LIBA     := $(BUILD)/libflashsale.a
PROGRAMS := $(patsubst %_main.c,$(BIN)/%,$(notdir $(MAIN_C)))
UNIT_C   := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BIN)/tests/%,$(UNIT_C))

# Keep intermediate objects (unit-test .o files) between runs.
.SECONDARY:

.PHONY: all deps test test-run test-sanitize demo bench bench-lock clean fuzz soak \
        soak-valgrind
all: $(PROGRAMS) $(UNIT_BIN)

deps:
	@tools/deps.sh

# Lua sources become C string constants named <module>_lua_<file>.
lua_sym = $(firstword $(subst /, ,$(1)))_lua_$(basename $(notdir $(1)))
$(LUA_C): $(LUA) tools/embed.sh
	@mkdir -p $(dir $@)
	tools/embed.sh $@ $(foreach f,$(LUA),$(call lua_sym,$(f))=$(f))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c -o $@ $<

$(BUILD)/gen/lua_scripts.o: $(LUA_C)
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

# ---- operability: generated sources (version stamp, embedded OpenAPI) ----
# build/<variant>/gen/version.c holds `git describe` (or VERSION) and is
# rewritten only when that changes; gen/openapi.c holds docs/openapi.yaml
# as JSON (GET /openapi.json). Both go into the library like the Lua.
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

$(LIBA): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

define program_rule
$(BIN)/$(patsubst %_main.c,%,$(notdir $(1))): $(BUILD)/$(1:.c=.o) $(LIBA)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS_ALL) -o $$@ $$< $(LIBA) $$(LIBS)
endef
$(foreach m,$(MAIN_C),$(eval $(call program_rule,$(m))))

$(BIN)/tests/%: $(BUILD)/tests/unit/%.o $(LIBA)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIBA) $(LIBS)

test: deps
	$(MAKE) test-run

test-run: all
	FLASHSALE_BIN=$(abspath $(BIN)) $(PYTHON) tests/run.py $(TESTS)

test-sanitize: deps
	$(MAKE) VARIANT=san test-run

# libFuzzer harnesses (clang), each run for a bounded number of executions;
# FUZZ_RUNS per target, FUZZ_SECONDS at most each, 10 million in total.
FUZZ_RUNS    ?= 5000000
FUZZ_SECONDS ?= 120
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_CFLAGS  := -g -O1 -std=gnu11 -D_GNU_SOURCE -pthread -I. -Ibuild/rel/gen \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_LIBSRC  := service/validate.c service/orderid.c stock/stock.c common/rconn.c \
                build/rel/gen/lua_scripts.c $(FUZZ_EXTRA_SRC)

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIBSRC)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $^ -lhiredis -ljansson -lm

# Per-target sources, as extra prerequisites so that $^ links them.
build/fuzz/fuzz_http: loadtest/httpresp.c

fuzz:
	@tools/deps.sh clang libclang-rt-14-dev
	$(MAKE) build/rel/gen/lua_scripts.c $(patsubst %,build/fuzz/fuzz_%,$(FUZZ_TARGETS))
	tools/fuzz.sh build/fuzz $(FUZZ_RUNS) $(FUZZ_SECONDS) 10000000 $(FUZZ_TARGETS)

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
