# blobref: plain Makefile. `make` builds bin/blobrefd and bin/blobref; `make test` builds the
# sanitizer variant and runs every test; `make fuzz` builds and briefly runs the libFuzzer targets.

PKGS := libmicrohttpd lmdb libcrypto libcurl jansson inih avro-c zlib snappy libzstd liblz4 \
        libbrotlidec libbrotlienc gnutls libpq libmagic
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

# Two archives, layered as the folders are: libblobref.a is everything below HTTP (base, index,
# store, parquet, iceberg, reconcile, core), which the CLI and the unit tests link; libblobref-http.a
# is the HTTP front (server/http/), which the daemon links, and the unit and fuzz targets of its
# pure parsers (Range, lookup bodies). Neither holds the console assets.
LIB_DIRS := base index store parquet orc iceberg delta reconcile core
LIB_SRCS := $(foreach d,$(LIB_DIRS),$(wildcard server/$(d)/*.c))
HTTP_SRCS := $(wildcard server/http/*.c)
# The operator console (server/ui/): its files and uPlot (npm, pinned by
# server/ui/package-lock.json) become one generated C file shared by every MODE, linked into
# blobrefd alone: building the CLI or a unit test needs no npm.
UI_DIR := server/ui
UI_GEN := $(BUILD_ROOT)/gen/ui_assets.c
UI_OBJ := $(OBJ)/gen/ui_assets.o
UPLOT := $(UI_DIR)/node_modules/uplot/dist/uPlot.iife.min.js
# The OpenAPI description (conf/openapi.json, served at /v1/openapi.json): one generated C file,
# linked into blobrefd alone, like the console.
OPENAPI_GEN := $(BUILD_ROOT)/gen/openapi.c
OPENAPI_OBJ := $(OBJ)/gen/openapi.o
LIB_OBJS := $(LIB_SRCS:%.c=$(OBJ)/%.o)
HTTP_OBJS := $(HTTP_SRCS:%.c=$(OBJ)/%.o)
LIB := $(BUILD_ROOT)/$(MODE)/libblobref.a
HTTP_LIB := $(BUILD_ROOT)/$(MODE)/libblobref-http.a
DAEMON_OBJS := $(OBJ)/server/blobrefd.o $(UI_OBJ) $(OPENAPI_OBJ)
TOOL_OBJS := $(patsubst %.c,$(OBJ)/%.o,$(wildcard tools/*.c))
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD_ROOT)/$(MODE)/tests/%)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD_ROOT)/fuzz/bin/%)

# Keep the objects of unit and fuzz binaries (make would delete them as intermediates).
.SECONDARY:
.PHONY: all deps run test unit unit-bins fuzz-bins fuzz bench bench-reconcile bench-scale print-bench-flags bench-deletes bench-tables bench-direct bench-cluster test-failover clean format install
all: $(BIN)/blobrefd $(BIN)/blobref

deps:
	@tools/install-deps.sh build

# Header dependencies come from the compiler (-MMD -MP): each object lists what it included.
$(OBJ)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

-include $(shell find $(OBJ) -name '*.d' 2>/dev/null)

# npm ci when server/ui/node_modules is missing or older than the lockfile.
$(UPLOT): $(UI_DIR)/package.json $(UI_DIR)/package-lock.json
	cd $(UI_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(UI_GEN): tools/ui-embed.sh $(UI_DIR)/index.html $(UI_DIR)/app.js $(UI_DIR)/style.css $(UPLOT)
	@mkdir -p $(dir $@)
	tools/ui-embed.sh $@ $(UI_DIR)

$(UI_OBJ): $(UI_GEN)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(OPENAPI_GEN): tools/openapi-embed.sh conf/openapi.json
	@mkdir -p $(dir $@)
	tools/openapi-embed.sh $@ conf/openapi.json

$(OPENAPI_OBJ): $(OPENAPI_GEN)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(HTTP_LIB): $(HTTP_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/blobrefd: $(DAEMON_OBJS) $(HTTP_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/blobref: $(TOOL_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD_ROOT)/$(MODE)/tests/%: $(OBJ)/tests/unit/%.o $(HTTP_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $(CFLAGS) -o $@ $^ $(LDLIBS)

unit-bins: $(UNIT_BINS)

# The C unit tests alone (sanitizer build; no npm, no daemon): `make unit`.
unit:
	@$(MAKE) --no-print-directory MODE=san unit-bins
	tests/run-unit.sh $(BUILD_ROOT)/san/tests

# Builds and runs the server on its embedded default (local store + LMDB under ./var).
run:
	@tools/install-deps.sh build
	@$(MAKE) --no-print-directory all
	./bin/blobrefd

# Everything: dependencies, sanitizer build, unit tests, fuzz smoke runs, integration tests (on
# BLOBREF_TEST_JOBS pytest workers, 2). Prints each phase's seconds at the end, failed or not.
test:
	@times=$$(mktemp); trap 'echo "make test: phase times"; cat "$$times"; rm -f "$$times"' EXIT; \
	phase() { name=$$1; shift; t0=$$(date +%s); rc=0; "$$@" || rc=$$?; \
	  printf '  %-12s %5ss%s\n' "$$name" $$(( $$(date +%s) - t0 )) \
	    "$$([ $$rc = 0 ] || echo "  FAILED (exit $$rc)")" >>"$$times"; return $$rc; }; \
	phase install-deps tools/install-deps.sh test && \
	phase build-san $(MAKE) --no-print-directory MODE=san all unit-bins && \
	phase build $(MAKE) --no-print-directory all && \
	phase unit tests/run-unit.sh $(BUILD_ROOT)/san/tests && \
	phase build-fuzz $(MAKE) --no-print-directory MODE=fuzz fuzz-bins && \
	phase fuzz tests/run-fuzz.sh $(BUILD_ROOT)/fuzz/bin $${FUZZ_SECONDS:-15} && \
	phase integration tests/run-integration.sh $(BUILD_ROOT)/san/bin; \
	rc=$$?; t=0; for s in $$(awk '{print $$2}' "$$times" | tr -d s); do t=$$((t + s)); done; \
	printf '  %-12s %5ss\n' total $$t >>"$$times"; exit $$rc

# libFuzzer targets (clang); each runs FUZZ_SECONDS on its seed corpus in tests/fuzz/corpus/NAME.
FUZZ_SECONDS ?= 30
$(BUILD_ROOT)/fuzz/bin/%: $(OBJ)/tests/fuzz/%.o $(HTTP_LIB) $(LIB)
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

# Cluster benchmark (not in `make test`, about 4 minutes): one LMDB node vs one and two
# PostgreSQL nodes for new uploads, HEAD, redirect and batch lookup, with ratios (README table).
bench-cluster:
	@$(MAKE) --no-print-directory all
	/usr/bin/python3 tests/bench/cluster_bench.py bin

# Patroni failover (not in `make test`): three etcd members, Patroni over two PostgreSQL 15, the
# leader killed -9 under load, the window until writes are acknowledged again (about 3.5 minutes).
test-failover:
	@tools/install-deps.sh failover
	@$(MAKE) --no-print-directory MODE=san all
	BLOBREF_FAILOVER=1 tests/run-integration.sh $(BUILD_ROOT)/san/bin tests/integration/test_patroni_failover.py -s

# Reconcile at scale: 1M indexed blobs, 100 snapshots, 1,000 data files (about 3 minutes).
# SIZE=10000000 FILES=10000 [SNAPSHOTS=100]: a table and index of those totals, the index
# bulk-loaded; SIZES="1000000 10000000": one run per size and their peak RSS side by side
# (tests/bench/reconcile-bench.sh lists the rest; make passes command-line variables through).
bench-reconcile:
	@tools/install-deps.sh test
	@$(MAKE) --no-print-directory all
	BENCH_CFLAGS="$(PKG_CFLAGS)" BENCH_LDLIBS="$(LDLIBS)" tests/bench/reconcile-bench.sh $(LIB)

# How cost grows with the index (not in `make test`; about 15 minutes at the default SIZES on an
# idle box, mostly the 10M load): an LMDB index bulk-loaded through the writer's batch API to each
# of SIZES="1000000 10000000" (100000000 where the disk allows: about 500 bytes a blob), then at
# each size HEAD/redirect cold and warm, batch lookup, new uploads, export, --fsck and a
# --rebuild-index estimate (tests/bench/scale_bench.py; it drops the page cache, so run as root).
bench-scale:
	@$(MAKE) --no-print-directory all
	@mkdir -p $(BUILD_ROOT)/bench
	$(CC) -O2 -g -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Wall -Wextra -Werror -Wshadow \
	  -Wno-unused-parameter -Iinclude $(PKG_CFLAGS) -o $(BUILD_ROOT)/bench/scale_load \
	  tests/bench/scale_load.c $(LIB) $(LDLIBS)
	$(CC) -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow \
	  -o $(BUILD_ROOT)/bench/upload_load tests/bench/upload_load.c -lcrypto -lpthread
	/usr/bin/python3 tests/bench/scale_bench.py bin $(BUILD_ROOT)/bench/scale_load \
	  $(BUILD_ROOT)/bench/upload_load

# Reconcile's final deletes of 100k quarantined blobs on radosgw, one by one against batched
# (DeleteObjects, 1,000 keys a request); BLOBS=N to change the count, QUICK=1 for 5,000.
bench-deletes:
	@tools/install-deps.sh test
	@$(MAKE) --no-print-directory all
	BENCH_CFLAGS="$(PKG_CFLAGS)" BENCH_LDLIBS="$(LDLIBS)" tests/bench/delete-bench.sh $(LIB)

# ORC against Parquet string-column decode, Delta listing of 1,000 commits (about 2 minutes).
bench-direct:
	@$(MAKE) --no-print-directory all
	tests/bench/direct-bench.sh bin

bench-tables:
	@tools/install-deps.sh test
	@$(MAKE) --no-print-directory all
	tests/bench/tables-bench.sh bin

# Installs the release build: `make install [PREFIX=/usr/local] [DESTDIR=] [SYSCONFDIR=/etc]`.
# Binaries in PREFIX/bin, man pages in PREFIX/share/man, the systemd unit (its ExecStart pointing
# at PREFIX/bin) in PREFIX/lib/systemd/system, the bash completion, and the annotated example
# config in PREFIX/share/doc/blobref; SYSCONFDIR/blobref/blobref.conf only when there is none
# (an operator's config is never overwritten).
PREFIX ?= /usr/local
SYSCONFDIR ?= /etc
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man8 \
	  $(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	  $(DESTDIR)$(PREFIX)/share/doc/blobref $(DESTDIR)$(SYSCONFDIR)/blobref
	install -m 0755 bin/blobrefd bin/blobref $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 conf/man/blobref.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 conf/man/blobref.conf.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 0644 conf/man/blobrefd.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	sed 's|/usr/local/bin/|$(PREFIX)/bin/|; s|/etc/blobref/|$(SYSCONFDIR)/blobref/|; s|/usr/share/doc/blobref/|$(PREFIX)/share/doc/blobref/|' conf/blobrefd.service \
	  > $(DESTDIR)$(PREFIX)/lib/systemd/system/blobrefd.service
	install -m 0644 conf/blobref.bash-completion $(DESTDIR)$(PREFIX)/share/bash-completion/completions/blobref
	install -m 0644 conf/blobref.conf README.md CHANGELOG.md $(DESTDIR)$(PREFIX)/share/doc/blobref/
	test -e $(DESTDIR)$(SYSCONFDIR)/blobref/blobref.conf || \
	  install -m 0640 conf/blobref.conf $(DESTDIR)$(SYSCONFDIR)/blobref/blobref.conf

format:
	clang-format -i $(wildcard server/*.c server/*/*.c server/*/*.h include/blobref/*.h tools/*.c tools/*.h \
	  tests/unit/*.c tests/unit/*.h tests/fuzz/*.c tests/bench/*.c)

# The flags a bench script links with when run directly (make bench-* passes them itself).
print-bench-flags:
	@printf 'BENCH_CFLAGS=%s\nBENCH_LDLIBS=%s\n' '$(PKG_CFLAGS)' '$(LDLIBS)'

clean:
	rm -rf build bin
