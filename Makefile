# blobref: plain Makefile. `make` builds bin/blobrefd and bin/blobref; `make test` builds the
# sanitizer variant and runs every test; `make fuzz` builds and briefly runs the libFuzzer targets.

PKGS := libmicrohttpd lmdb libcrypto libcurl jansson inih avro-c zlib snappy libzstd liblz4 \
        libbrotlidec libbrotlienc gnutls
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CC ?= cc
WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 $(WARN) -Iinclude -Iserver $(PKG_CFLAGS)
LDLIBS := $(PKG_LIBS) -lpthread -lm

# MODE=release (default), san (AddressSanitizer + UndefinedBehaviorSanitizer) or fuzz (clang,
# libFuzzer). BUILD_ROOT lets parallel work trees keep separate objects.
MODE ?= release
BUILD_ROOT ?= build
SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ifeq ($(MODE),san)
  OPT := -O1 -g $(SAN)
  BIN := $(BUILD_ROOT)/san/bin
else ifeq ($(MODE),fuzz)
  CC := clang
  OPT := -O1 -g $(SAN) -fsanitize=fuzzer-no-link -DBR_FUZZING
  BIN := $(BUILD_ROOT)/fuzz/bin
else
  OPT := -O2 -g
  BIN := $(if $(filter build,$(BUILD_ROOT)),bin,$(BUILD_ROOT)/bin)
endif
OBJ := $(BUILD_ROOT)/$(MODE)/obj
CFLAGS ?=
ALL_CFLAGS := $(BASE_CFLAGS) $(OPT) $(CFLAGS)

LIB_SRCS := $(filter-out server/blobrefd.c,$(wildcard server/*.c))
# The operator console (ui/): its files and uPlot (npm, pinned by ui/package-lock.json) are
# compiled into the library as one generated C file shared by every MODE.
UI_GEN := $(BUILD_ROOT)/gen/ui_assets.c
UI_OBJ := $(OBJ)/gen/ui_assets.o
UPLOT := ui/node_modules/uplot/dist/uPlot.iife.min.js
LIB_OBJS := $(LIB_SRCS:%.c=$(OBJ)/%.o) $(UI_OBJ)
LIB := $(BUILD_ROOT)/$(MODE)/libblobref.a
DAEMON_OBJS := $(OBJ)/server/blobrefd.o
TOOL_OBJS := $(patsubst %.c,$(OBJ)/%.o,$(wildcard tools/*.c))
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD_ROOT)/$(MODE)/tests/%)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD_ROOT)/fuzz/bin/%)

.PHONY: all deps run test unit-bins fuzz-bins fuzz bench bench-reconcile clean format
all: $(BIN)/blobrefd $(BIN)/blobref

deps:
	@tools/install-deps.sh build

$(OBJ)/%.o: %.c $(wildcard include/blobref/*.h server/*.h tools/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# npm ci when ui/node_modules is missing or older than the lockfile.
$(UPLOT): ui/package.json ui/package-lock.json
	cd ui && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(UI_GEN): tools/ui-embed.sh ui/index.html ui/app.js ui/style.css $(UPLOT)
	@mkdir -p $(dir $@)
	tools/ui-embed.sh $@ ui

$(UI_OBJ): $(UI_GEN) server/ui_assets.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/blobrefd: $(DAEMON_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/blobref: $(TOOL_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD_ROOT)/$(MODE)/tests/%: $(OBJ)/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS)

unit-bins: $(UNIT_BINS)
# tests/unit/test_cli_*.c compile the tools' pure helpers in (#include "../../tools/x.c").
$(patsubst %.c,$(OBJ)/%.o,$(wildcard tests/unit/test_cli_*.c)): $(wildcard tools/*.c)

# Builds and runs the server on its embedded default (local store + LMDB under ./var).
run:
	@tools/install-deps.sh build
	@$(MAKE) --no-print-directory all
	./bin/blobrefd

# Everything: dependencies, sanitizer build, unit tests, fuzz smoke runs, integration tests.
test:
	@tools/install-deps.sh test
	@$(MAKE) --no-print-directory MODE=san all unit-bins
	@$(MAKE) --no-print-directory all
	tests/run-unit.sh $(BUILD_ROOT)/san/tests
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$${FUZZ_SECONDS:-15}
	tests/run-integration.sh $(BUILD_ROOT)/san/bin

# libFuzzer targets (clang); each runs FUZZ_SECONDS on its seed corpus in tests/fuzz/corpus/NAME.
FUZZ_SECONDS ?= 30
$(BUILD_ROOT)/fuzz/bin/%: $(OBJ)/tests/fuzz/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

fuzz-bins: $(FUZZ_BINS)

fuzz:
	@$(MAKE) --no-print-directory MODE=fuzz fuzz-bins
	tests/run-fuzz.sh $(BUILD_ROOT)/fuzz/bin $(FUZZ_SECONDS)

bench:
	@tools/install-deps.sh bench
	@$(MAKE) --no-print-directory all
	tests/bench/run.sh
	tests/bench/s3-bench.sh

# Reconcile at scale: 1M indexed blobs, 100 snapshots, 1,000 data files (about 3 minutes).
bench-reconcile:
	@tools/install-deps.sh test
	@$(MAKE) --no-print-directory all
	BENCH_CFLAGS="$(PKG_CFLAGS)" BENCH_LDLIBS="$(LDLIBS)" tests/bench/reconcile-bench.sh $(LIB)

format:
	clang-format -i $(wildcard server/*.c server/*.h include/blobref/*.h tools/*.c tools/*.h \
	  tests/unit/*.c tests/unit/*.h tests/fuzz/*.c tests/bench/*.c)

clean:
	rm -rf build bin
