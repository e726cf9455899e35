# Berth — build, test and demo.  `make demo` and `make test` are the two entry points;
# both start by installing missing Debian packages (`make deps`, quiet when all are there).

CC       ?= cc
CXX      ?= c++
PREFIX   ?= /usr/local
BUILD    ?= build
OPT      ?= -O2 -g
WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
            -Wno-missing-field-initializers  # libseccomp's SCMP_A0 macros trip it
ifdef CI
WARN     += -Werror
endif
# Each folder sees only the headers it may use: lib/ (libplimsoll) its own; httpd/ (what
# both servers share) its own; sandboxd/ those and libplimsoll's; runtime/ (berth) those
# and Lua's and the stores' client libraries; tests and benchmarks everything.
# -MMD -MP: each object depends on the headers it really includes (build/obj/**/*.d).
CPPFLAGS += -D_GNU_SOURCE -MMD -MP
CFLAGS   += -std=c11 $(OPT) $(WARN) -fPIC
# C++ only where a library is C++ (lib/json_read.cc, simdjson): no exceptions cross it.
CXXFLAGS += -std=c++17 $(OPT) $(filter-out -Wstrict-prototypes,$(WARN)) -fPIC -fno-exceptions -fno-rtti
LIBDEPS   = libcurl jansson openssl
PKGLIBS   = $(shell pkg-config --libs $(LIBDEPS) 2>/dev/null)
# simdjson reads the wire's bodies (lib/json_read.cc); it needs the C++ runtime.
JSON_READ_LIBS = -lsimdjson -lstdc++
LDLIBS   += $(PKGLIBS) $(JSON_READ_LIBS) -lev -lm
MHDLIBS   = $(shell pkg-config --libs libmicrohttpd 2>/dev/null)
PQ_CFLAGS = $(shell pkg-config --cflags libpq 2>/dev/null || echo -I/usr/include/postgresql)
# The conversation stores' engines (runtime/store/): SQLite and PostgreSQL's libpq.
STORE_LIBS = -lsqlite3 -lpq

# Debian 12 packages the project needs to build, test and demo (the browser test drives
# Debian's chromium with Debian's python3-selenium and chromium-driver: no npm, nothing
# fetched from a registry other than Debian's).
DEPS := build-essential pkg-config liblua5.4-dev lua5.4 lua-cjson libcurl4-openssl-dev \
        libev-dev libssl-dev libjansson-dev libsimdjson-dev libjemalloc-dev libmicrohttpd-dev \
        libseccomp-dev runsc \
        bubblewrap python3 nodejs libcmocka-dev valgrind clang libclang-rt-14-dev openssl \
        lua-busted lua-check gnuplot-nox \
        python3-numpy python3-scipy python3-pandas python3-matplotlib libsqlite3-dev sqlite3 \
        libpq-dev postgresql chromium python3-selenium chromium-driver libreadline-dev tmux haproxy

LIB_SRC  := $(sort $(wildcard lib/*.c))
LIB_CXX_SRC := $(sort $(wildcard lib/*.cc))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(LIB_CXX_SRC:%.cc=$(BUILD)/obj/%.o)
# sandboxd/: server/ (HTTP, RPC, sessions, config), providers/ (gvisor, bwrap, process,
# echo and what the real ones share), inside/ (the supervisor and the kernels).
SBX_DIRS := sandboxd/server sandboxd/providers sandboxd/inside
SBX_SRC  := $(sort $(wildcard $(SBX_DIRS:%=%/*.c)))
SBX_OBJ  := $(SBX_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTLIB_SRC := $(sort $(wildcard tests/lib/*.c))
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SH  := $(sort $(wildcard tests/test_*.sh))
# runtime/: berth.  libberth (embeddable) is core/ (the host, conversations, natives,
# containment, the public API, the local sandboxd), models/ (scripted, openai, SSE)
# and store/; faces/ is the berth program (CLI, chat, replay, serve and its page).
LUA_CFLAGS = $(shell pkg-config --cflags lua5.4 2>/dev/null)
LUA_LIBS   = $(shell pkg-config --libs lua5.4 2>/dev/null)
# GNU readline: the line editing of `berth chat` (runtime/faces/cli.c).
RL_LIBS    = -lreadline
HTTPD_SRC := $(sort $(wildcard httpd/*.c))
HTTPD_OBJ := $(HTTPD_SRC:%.c=$(BUILD)/obj/%.o)
RT_SRC   := $(sort $(wildcard runtime/core/*.c runtime/models/*.c runtime/store/*.c))
FACES_SRC := $(sort $(filter-out runtime/faces/main.c,$(wildcard runtime/faces/*.c)))
FACES_OBJ := $(FACES_SRC:%.c=$(BUILD)/obj/%.o)
# jemalloc holds the Lua heaps only (runtime/core/contain.c calls mallocx and sdallocx):
# libc is named before it so that malloc stays glibc's, in our programs as in one that
# embeds libberth.so, and mallinfo2 still sees the C side.  libstdc++ (simdjson's, in
# libplimsoll) is named before it too, and kept even where nothing here calls it:
# Debian's jemalloc also defines C++'s operator new and delete, and its delete frees
# with glibc's free, so a process that found jemalloc's operators first (a C program
# on libberth.so, whose libstdc++ came later) freed jemalloc's memory with glibc.
HEAP_LIBS  = -lc -Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state -ljemalloc
# Our own programs (berth, the examples, the benchmarks) go further: named before
# everything, jemalloc is their whole process's malloc.  A host's C memory (jansson
# values, the store's records, curl's buffers) churns among what idle conversations
# keep, and glibc's malloc slows as they add up: 1 000 conversations took 54.9 µs a
# turn beside 10 000 held (suspended, stored) ones against 37.8 µs alone; on jemalloc
# 36.3 and 34.6 (medians of 7, bench/turns_per_second --held --store memory).  With
# one malloc in the process, C++'s new and delete agree with it.  valgrind sees it
# with --soname-synonyms=somalloc=libjemalloc.so*.
PROG_HEAP_LIBS = -ljemalloc
# What a program that embeds berth links after libberth.a and libplimsoll.a; the
# berth program's faces add libmicrohttpd (serve) and readline (chat).
RT_LIBS   = $(LUA_LIBS) $(STORE_LIBS) $(LDLIBS) $(HEAP_LIBS)
FACES_LIBS = $(LUA_LIBS) $(MHDLIBS) $(STORE_LIBS) $(RL_LIBS) $(LDLIBS) $(HEAP_LIBS)
# (-iquote: a project header never hides a system one, such as providers/seccomp.h.)
DIR_lib      = -iquote lib
DIR_httpd    = -iquote httpd
DIR_sandboxd = -iquote lib -iquote httpd $(SBX_DIRS:%=-iquote %)
# runtime/'s sub-folders: libberth's (core, models, store) see lib/ and one another;
# faces/ sees those and httpd/; the Lua module (module/) the core's Lua glue only.
DIR_runtime/core   = -iquote lib -iquote runtime/core -iquote runtime/models -iquote runtime \
                     $(LUA_CFLAGS) $(PQ_CFLAGS)
DIR_runtime/models = $(DIR_runtime/core)
DIR_runtime/store  = $(DIR_runtime/core)
DIR_runtime/faces  = $(DIR_runtime/core) -iquote httpd -iquote runtime/faces
DIR_runtime/module = -iquote lib -iquote runtime/core $(LUA_CFLAGS)
DIR_runtime  = $(DIR_runtime/faces)
DIR_tests    = $(DIR_runtime) -iquote tests/lib
DIR_bench    = $(DIR_tests) -iquote sandboxd/inside
RT_OBJ   := $(RT_SRC:%.c=$(BUILD)/obj/%.o)
MOD_SRC  := $(sort $(wildcard runtime/module/*.c))
MOD_OBJ  := $(MOD_SRC:%.c=$(BUILD)/obj/%.o)
EXAMPLE_SRC := $(sort $(wildcard runtime/examples/*.c))
EXAMPLE_BIN := $(EXAMPLE_SRC:runtime/examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# Keep intermediate objects: test programs share them, and builds may overlap.
.SECONDARY:

.DEFAULT_GOAL := all
FORCE:
.PHONY: FORCE all deps test demo bench install uninstall clean check-asan check-valgrind fuzz
RT_TARGETS := $(if $(wildcard runtime/faces/main.c),$(BUILD)/libberth.a $(BUILD)/libberth.so \
                $(BUILD)/berth $(BUILD)/berth.pc) \
              $(if $(MOD_SRC),$(BUILD)/lua/plimsoll.so) $(EXAMPLE_BIN)
all: $(BUILD)/libplimsoll.a $(BUILD)/libplimsoll.so $(BUILD)/sandboxd $(BUILD)/plimsoll.pc $(RT_TARGETS)

deps:
	@missing=$$(for p in $(DEPS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing:" $$missing; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || \
	    { echo "make deps: apt-get failed for:" $$missing >&2; exit 1; }; \
	fi

# The include paths of a source file are its folder's: DIR_<top>/<sub> where one is
# set (runtime/core, ...), else DIR_<top>.
dir_of = $(or $(DIR_$(word 1,$(subst /, ,$1))/$(word 2,$(subst /, ,$1))),$(DIR_$(word 1,$(subst /, ,$1))))
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(call dir_of,$*) $(CFLAGS) -c $< -o $@
$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(call dir_of,$*) $(CXXFLAGS) -c $< -o $@

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The kernels are edited as Python and JavaScript; sandboxd carries them as C strings,
# and the interpreters' flags as C arrays.
sandboxd/inside/kernels.c: sandboxd/inside/kernels/kernel.py sandboxd/inside/kernels/kernel.js \
                           sandboxd/inside/kernels/flags sandboxd/inside/kernels/embed.py \
                           tools/c_embed.py
	python3 sandboxd/inside/kernels/embed.py

# The page of berth serve likewise: runtime/faces/web/*.{html,js,css} as C strings.
runtime/faces/web/assets.c: runtime/faces/web/index.html runtime/faces/web/app.js \
                            runtime/faces/web/style.css runtime/faces/web/embed.py tools/c_embed.py
	python3 runtime/faces/web/embed.py
$(BUILD)/obj/runtime/faces/web.o: runtime/faces/web/assets.c

$(BUILD)/libberth.a: $(RT_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The berth program's faces, apart from main.o so tests link them too (not installed).
$(BUILD)/berth-faces.a: $(FACES_OBJ) $(HTTPD_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The shared libberth exports the functions of its public headers (berth.h, model.h)
# and needs libplimsoll.so.0.
$(BUILD)/berth.map: runtime/core/berth.h runtime/models/model.h
	@mkdir -p $(dir $@)
	@{ echo '{ global:'; grep -ohE '\bberth_[a-z0-9_]+ *\(' $^ | tr -d ' (' | sort -u | \
	   sed 's/$$/;/'; echo 'local: *; };'; } > $@

$(BUILD)/libberth.so: $(RT_OBJ) $(BUILD)/libplimsoll.so $(BUILD)/berth.map
	$(CC) -shared -Wl,-soname,libberth.so.0 -Wl,--version-script=$(BUILD)/berth.map \
	  -o $@ $(RT_OBJ) $(BUILD)/libplimsoll.so $(LDFLAGS) $(RT_LIBS)

# -Wl,-E exports Lua's API from the binary, so C modules such as cjson load.
$(BUILD)/berth: $(BUILD)/obj/runtime/faces/main.o $(BUILD)/berth-faces.a $(BUILD)/libberth.a \
               $(BUILD)/libplimsoll.a
	$(CC) $(LDFLAGS) -Wl,-E -o $@ $^ $(PROG_HEAP_LIBS) $(FACES_LIBS)

$(BUILD)/lua/plimsoll.so: $(MOD_OBJ) $(BUILD)/libplimsoll.a
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $(MOD_OBJ) $(BUILD)/libplimsoll.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/examples/%: runtime/examples/%.c $(BUILD)/libberth.a $(BUILD)/libplimsoll.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -MF $(@D)/.$(@F).d $(DIR_runtime/core) $(CFLAGS) -Wl,-E -o $@ $< $(BUILD)/libberth.a $(BUILD)/libplimsoll.a $(PROG_HEAP_LIBS) $(RT_LIBS)

$(BUILD)/libplimsoll.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Only the public API leaves the shared library: a version script lists every plm_
# function the public headers declare, and curl_ev.h's (the curl-on-libev driver that
# libberth's model client shares), idmap.h's (the one id hash table), json_text.h's
# (the one JSON reader and writer of the wire, sandboxd's too) and random.h's (ids per
# request); the rest of lib/ (internal.h) stays local.
$(BUILD)/plimsoll.map: lib/plimsoll.h lib/plimsoll_sandboxes.h lib/curl_ev.h lib/idmap.h \
                       lib/json_text.h lib/random.h
	@mkdir -p $(dir $@)
	@{ echo '{ global:'; grep -ohE '\bplm_[a-z0-9_]+ *\(' $^ | tr -d ' (' | sort -u | \
	   sed 's/$$/;/'; echo 'local: *; };'; } > $@

$(BUILD)/libplimsoll.so: $(LIB_OBJ) $(BUILD)/plimsoll.map
	$(CC) -shared -Wl,-soname,libplimsoll.so.0 -Wl,--version-script=$(BUILD)/plimsoll.map \
	  -o $@ $(LIB_OBJ) $(LDFLAGS) $(LDLIBS)

# The prefix is part of the file: remade whenever PREFIX differs from the one it holds,
# so `make` then `make install PREFIX=/opt/x` installs a .pc that points at /opt/x.
PC_STALE := $(shell grep -qx 'prefix=$(PREFIX)' $(BUILD)/plimsoll.pc 2>/dev/null || echo FORCE)
$(BUILD)/plimsoll.pc: lib/plimsoll.pc.in $(PC_STALE)
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' $< > $@
BERTH_PC_STALE := $(shell grep -qx 'prefix=$(PREFIX)' $(BUILD)/berth.pc 2>/dev/null || echo FORCE)
$(BUILD)/berth.pc: runtime/berth.pc.in $(BERTH_PC_STALE)
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' $< > $@

$(BUILD)/sandboxd: $(SBX_OBJ) $(HTTPD_OBJ) $(BUILD)/libplimsoll.a
	$(CC) $(LDFLAGS) -o $@ $(SBX_OBJ) $(HTTPD_OBJ) $(BUILD)/libplimsoll.a $(MHDLIBS) $(LDLIBS) -lseccomp

$(BUILD)/tests/%: tests/%.c $(TESTLIB_OBJ) $(BUILD)/libplimsoll.a $(BUILD)/libberth.a \
                  $(BUILD)/berth-faces.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -MF $(@D)/.$(@F).d $(DIR_tests) $(CFLAGS) -Wl,-E -o $@ $< $(TESTLIB_OBJ) $(BUILD)/berth-faces.a $(BUILD)/libberth.a $(BUILD)/libplimsoll.a $(LDFLAGS) $(FACES_LIBS) -lcmocka

# A benchmark's own objects beyond the libraries: bench/cells' floor starts the kernels
# sandboxd carries, with their flags, on the command line its supervisor gives them.
BENCH_OBJ_cells := $(BUILD)/obj/sandboxd/inside/kernels.o $(BUILD)/obj/sandboxd/inside/kernel_argv.o
$(BUILD)/bench/cells: $(BENCH_OBJ_cells)
$(BUILD)/bench/%: bench/%.c $(TESTLIB_OBJ) $(BUILD)/libplimsoll.a $(BUILD)/libberth.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -MF $(@D)/.$(@F).d $(DIR_bench) $(CFLAGS) -Wl,-E -o $@ $< $(BENCH_OBJ_$*) $(TESTLIB_OBJ) $(BUILD)/libberth.a $(BUILD)/libplimsoll.a $(LDFLAGS) $(PROG_HEAP_LIBS) $(RT_LIBS) -lcmocka

# The builds behind test, demo and the checks use every core unless make was given its
# own -j (its jobserver then reaches the sub-make): single-threaded, building with
# sanitizers took a good part of CI's 20 minutes on 2 cores.
NPROC := $(shell nproc 2>/dev/null || echo 1)
JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))

test: deps
	@$(MAKE) --no-print-directory $(JOBS) all tests
	@BUILD=$(BUILD) sh tests/run.sh $(TEST_BIN) $(FUZZ_REPLAY) $(TEST_SH)

tests: $(TEST_BIN)

demo: deps
	@$(MAKE) --no-print-directory $(JOBS) all
	@BUILD=$(BUILD) sh scripts/demo.sh

# Every benchmark, its figures printed as it runs; bench/report.py runs them (the scale
# curves several times), merges what each writes to $$BENCH_JSON into bench/results.json
# and draws bench/plots/*.png with gnuplot (bench/plots.gp).
bench: deps
	@$(MAKE) --no-print-directory all $(BENCH_BIN)
	@python3 bench/report.py --build $(BUILD)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer (clang; the
# runtime comes from libclang-rt-14-dev).  Daemons the tests start are built the same way.
# The sanitizer's malloc is the process's there: jemalloc is not linked first
# (PROG_HEAP_LIBS), or its C++ operator new (simdjson's buffers) would allocate from
# jemalloc and its delete free through the sanitizer's free.
SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
check-asan: deps
	@$(MAKE) --no-print-directory $(JOBS) BUILD=build-asan CC=clang CXX=clang++ \
	  OPT="-O1 -g $(SAN)" LDFLAGS="$(SAN)" PROG_HEAP_LIBS= all tests
	@BUILD=build-asan ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 sh tests/run.sh $(TEST_BIN:$(BUILD)/%=build-asan/%) \
	  $(FUZZ_REPLAY:$(BUILD)/%=build-asan/%) $(filter-out $(NOT_UNDER_ASAN),$(TEST_SH))
# test_install.sh builds a program and loads a Lua module the way a user would, with
# the system's compiler and stock lua5.4, which cannot take sanitized libraries: it
# runs in `make test` only.
NOT_UNDER_ASAN := tests/test_install.sh

# Memcheck over the C test programs: any error or definite leak fails the run.
check-valgrind: deps
	@$(MAKE) --no-print-directory $(JOBS) all tests
	@BUILD=$(BUILD) WRAP="valgrind -q --error-exitcode=99 --leak-check=full \
	  --errors-for-leak-kinds=definite --show-leak-kinds=definite" sh tests/run.sh $(TEST_BIN)

# libFuzzer harnesses, one per parser; each starts from tests/fuzz/corpus/<name>
# (tests/fuzz/README.md lists them).  Every harness links lib/; one that reaches
# further names its extra sources, flags and libraries as FUZZ_<VAR>_<harness>.
FUZZ_SECONDS ?= 30
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
FUZZ_SRCS_fuzz_frames := sandboxd/inside/frames.c
FUZZ_SRCS_fuzz_scripted := $(RT_SRC) $(FACES_SRC) $(HTTPD_SRC)
FUZZ_SRCS_fuzz_serve := $(RT_SRC) $(FACES_SRC) $(HTTPD_SRC)
FUZZ_CFLAGS_fuzz_frames = -iquote sandboxd/inside
FUZZ_CFLAGS_fuzz_request = $(SBX_DIRS:%=-iquote %)
FUZZ_CFLAGS_fuzz_sse = -iquote runtime/core -iquote runtime/models
FUZZ_CFLAGS_fuzz_scripted = $(DIR_runtime)
FUZZ_CFLAGS_fuzz_serve = $(DIR_runtime)
FUZZ_LIBS_fuzz_scripted = $(LUA_LIBS) $(MHDLIBS) $(STORE_LIBS) $(RL_LIBS) $(HEAP_LIBS)
FUZZ_LIBS_fuzz_serve = $(LUA_LIBS) $(MHDLIBS) $(STORE_LIBS) $(RL_LIBS) $(HEAP_LIBS)
build-fuzz/fuzz_frames: $(FUZZ_SRCS_fuzz_frames) $(wildcard sandboxd/inside/*.h)
build-fuzz/fuzz_scripted build-fuzz/fuzz_serve: $(RT_SRC) $(FACES_SRC) $(HTTPD_SRC) \
                                                $(wildcard runtime/*/*.h httpd/*.h)
# (No vptr check: UBSan's needs its C++ runtime, which a link by the C driver lacks.)
build-fuzz/%: tests/fuzz/%.c $(LIB_SRC) $(LIB_CXX_SRC) $(wildcard lib/*.h)
	@mkdir -p $(dir $@)
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr -D_GNU_SOURCE -iquote lib \
	  $(FUZZ_CFLAGS_$*) \
	  -o $@ $< $(FUZZ_SRCS_$*) $(LIB_SRC) $(LIB_CXX_SRC) $(PKGLIBS) $(FUZZ_LIBS_$*) \
	  $(JSON_READ_LIBS) -lev -lm

# Inputs kept in tests/fuzz/regressions/<name> (crashes found before) seed the run too.
# A crash is copied there, so that once fixed it stays a regression input `make test`
# replays; the fuzzer stops at the first one.
fuzz: deps $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do n=$${f#build-fuzz/fuzz_}; mkdir -p build-fuzz/found-$$n; \
	  r=tests/fuzz/regressions/$$n; echo "== fuzz $$n for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=build-fuzz/found-$$n/ \
	    build-fuzz/found-$$n tests/fuzz/corpus/$$n $$([ -d $$r ] && echo $$r) \
	    >build-fuzz/$$n.log 2>&1 \
	  || { tail -30 build-fuzz/$$n.log; \
	       a=$$(sed -n 's/.*Test unit written to \(build-fuzz\/found-[^ ]*\/\(crash\|leak\|timeout\|oom\)-[^ ]*\).*/\1/p' build-fuzz/$$n.log); \
	       if [ -n "$$a" ]; then mkdir -p $$r && cp $$a $$r/ && \
	         echo "fuzz $$n: crash, input saved as" $$(for x in $$a; do echo $$r/$${x##*/}; done); \
	         echo "  fix the bug; \`make test\` then replays it for good (build-fuzz/found-$$n: the rest)"; \
	       else echo "fuzz $$n: crash, no input written; see build-fuzz/$$n.log"; fi; exit 1; }; \
	  tail -1 build-fuzz/$$n.log; done

# The same harnesses without the fuzzer, run by `make test` (and so under check-asan,
# with its compiler and sanitizers): tests/fuzz/replay.c calls each on every input of
# corpus/<name> and regressions/<name>, so a crash once fixed stays fixed.  Built with
# the project's CC and flags (warnings and all), from the objects the rest shares;
# the harness is compiled here for its FUZZ_CFLAGS_, and depends on the sources of
# runtime/ and sandboxd/ too because some #include the files they test.
FUZZ_REPLAY := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzzreplay/%)
$(foreach h,$(FUZZ_SRC:tests/fuzz/%.c=%),$(eval \
  $(BUILD)/fuzzreplay/$(h): $(FUZZ_SRCS_$(h):%.c=$(BUILD)/obj/%.o)))
$(BUILD)/fuzzreplay/%: tests/fuzz/%.c tests/fuzz/replay.c $(BUILD)/libplimsoll.a \
                       $(wildcard runtime/*/*.[ch] $(SBX_DIRS:%=%/*.[ch]))
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -MF $(@D)/.$(@F).d -iquote lib $(FUZZ_CFLAGS_$*) $(CFLAGS) -DREPLAY_NAME='"$*"' \
	  -DREPLAY_DIR='"$(CURDIR)/tests/fuzz"' -o $@ $< tests/fuzz/replay.c \
	  $(FUZZ_SRCS_$*:%.c=$(BUILD)/obj/%.o) $(BUILD)/libplimsoll.a $(LDFLAGS) $(FUZZ_LIBS_$*) $(LDLIBS)
tests: $(FUZZ_REPLAY)

# Installs like a library: versioned shared libraries, their headers and .pc files
# (pkg-config --cflags --libs berth links an embedding program), the programs and their
# man pages, the shipped scripts where berth finds them (PREFIX/share/berth/scripts),
# and the Lua module where Debian's stock lua5.4 looks under that prefix
# (INSTALL_CMOD: PREFIX/lib/lua/5.4, on its default package.cpath for /usr/local).
INSTALL_CMOD ?= $(PREFIX)/lib/lua/5.4
D = $(DESTDIR)$(PREFIX)
install: all
	install -d $(D)/lib/pkgconfig $(D)/include $(D)/bin $(D)/share/man/man1 $(D)/share/man/man8 \
	  $(D)/share/berth/scripts/examples $(DESTDIR)$(INSTALL_CMOD)
	install -m 644 $(BUILD)/libplimsoll.a $(BUILD)/libberth.a $(D)/lib/
	install -m 755 $(BUILD)/libplimsoll.so $(D)/lib/libplimsoll.so.0
	install -m 755 $(BUILD)/libberth.so $(D)/lib/libberth.so.0
	ln -sf libplimsoll.so.0 $(D)/lib/libplimsoll.so
	ln -sf libberth.so.0 $(D)/lib/libberth.so
	install -m 644 lib/plimsoll.h lib/plimsoll_sandboxes.h runtime/core/berth.h $(D)/include/
	install -m 644 runtime/models/model.h $(D)/include/berth_model.h
	install -m 644 $(BUILD)/plimsoll.pc $(BUILD)/berth.pc $(D)/lib/pkgconfig/
	install -m 755 $(BUILD)/sandboxd $(BUILD)/berth $(D)/bin/
	install -m 644 sandboxd/sandboxd.8 $(D)/share/man/man8/
	install -m 644 runtime/berth.1 $(D)/share/man/man1/
	install -m 644 scripts/*.lua scripts/.luacheckrc $(D)/share/berth/scripts/
	install -m 644 scripts/examples/*.lua $(D)/share/berth/scripts/examples/
	install -m 755 $(BUILD)/lua/plimsoll.so $(DESTDIR)$(INSTALL_CMOD)/
	@echo "make install: the Lua module is $(INSTALL_CMOD)/plimsoll.so ($(if $(filter /usr/local,$(PREFIX)),on stock lua5.4's package.cpath,add $(INSTALL_CMOD)/?.so to LUA_CPATH_5_4 for stock lua5.4))"

uninstall:
	rm -f $(D)/lib/libplimsoll.a $(D)/lib/libberth.a $(D)/lib/libplimsoll.so.0 \
	  $(D)/lib/libberth.so.0 $(D)/lib/libplimsoll.so $(D)/lib/libberth.so \
	  $(D)/include/plimsoll.h $(D)/include/plimsoll_sandboxes.h $(D)/include/berth.h \
	  $(D)/include/berth_model.h $(D)/lib/pkgconfig/plimsoll.pc $(D)/lib/pkgconfig/berth.pc \
	  $(D)/bin/sandboxd $(D)/bin/berth $(D)/share/man/man8/sandboxd.8 \
	  $(D)/share/man/man1/berth.1 $(DESTDIR)$(INSTALL_CMOD)/plimsoll.so
	rm -rf $(D)/share/berth

clean:
	rm -rf $(BUILD) build-asan build-fuzz
