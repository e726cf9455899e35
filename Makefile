# Berth — build, test and demo.  `make demo` and `make test` are the two entry points;
# both start by installing missing Debian packages (`make deps`, quiet when all are there).

CC       ?= cc
PREFIX   ?= /usr/local
BUILD    ?= build
OPT      ?= -O2 -g
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
ifdef CI
WARN     += -Werror
endif
CPPFLAGS += -D_GNU_SOURCE -Ilib
CFLAGS   += -std=c11 $(OPT) $(WARN) -fPIC
LIBDEPS   = libcurl jansson openssl
PKGLIBS   = $(shell pkg-config --libs $(LIBDEPS) 2>/dev/null)
LDLIBS   += $(PKGLIBS) -lev -lm
MHDLIBS   = $(shell pkg-config --libs libmicrohttpd 2>/dev/null)

# Debian 12 packages the project needs to build, test and demo.
DEPS := build-essential pkg-config liblua5.4-dev lua5.4 lua-cjson libcurl4-openssl-dev \
        libev-dev libssl-dev libjansson-dev libmicrohttpd-dev libseccomp-dev runsc \
        bubblewrap python3 nodejs libcmocka-dev valgrind clang libclang-rt-14-dev

LIB_SRC  := $(sort $(wildcard lib/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
SBX_SRC  := $(sort $(wildcard sandboxd/*.c))
SBX_OBJ  := $(SBX_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTLIB_SRC := $(sort $(wildcard tests/lib/*.c))
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=$(BUILD)/obj/%.o)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps test demo bench install clean check-deps
all: $(BUILD)/libplimsoll.a $(BUILD)/libplimsoll.so $(BUILD)/sandboxd $(BUILD)/plimsoll.pc

deps:
	@missing=$$(for p in $(DEPS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing:" $$missing; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || \
	    { echo "make deps: apt-get failed for:" $$missing >&2; exit 1; }; \
	fi

$(BUILD)/obj/%.o: %.c $(wildcard lib/*.h sandboxd/*.h tests/lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/libplimsoll.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libplimsoll.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libplimsoll.so.0 -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/plimsoll.pc: lib/plimsoll.pc.in
	sed -e 's|@PREFIX@|$(PREFIX)|g' $< > $@

$(BUILD)/sandboxd: $(SBX_OBJ) $(BUILD)/libplimsoll.a
	$(CC) $(LDFLAGS) -o $@ $(SBX_OBJ) $(BUILD)/libplimsoll.a $(MHDLIBS) $(LDLIBS) -lseccomp

$(BUILD)/tests/%: tests/%.c $(TESTLIB_OBJ) $(BUILD)/libplimsoll.a $(wildcard lib/*.h tests/lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/lib $(CFLAGS) -o $@ $< $(TESTLIB_OBJ) $(BUILD)/libplimsoll.a $(LDFLAGS) $(LDLIBS) -lcmocka

$(BUILD)/bench/%: bench/%.c $(TESTLIB_OBJ) $(BUILD)/libplimsoll.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/lib $(CFLAGS) -o $@ $< $(TESTLIB_OBJ) $(BUILD)/libplimsoll.a $(LDFLAGS) $(LDLIBS)

test: deps
	@$(MAKE) --no-print-directory all tests
	@BUILD=$(BUILD) sh tests/run.sh $(TEST_BIN)

tests: $(TEST_BIN)

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh scripts/demo.sh

bench: deps
	@$(MAKE) --no-print-directory all $(BENCH_BIN)
	@for b in $(BENCH_BIN); do BUILD=$(BUILD) $$b || exit 1; done

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(BUILD)/libplimsoll.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libplimsoll.so $(DESTDIR)$(PREFIX)/lib/libplimsoll.so.0
	ln -sf libplimsoll.so.0 $(DESTDIR)$(PREFIX)/lib/libplimsoll.so
	install -m 644 lib/plimsoll.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/plimsoll.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	install -m 755 $(BUILD)/sandboxd $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf $(BUILD)
