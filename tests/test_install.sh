#!/bin/sh
# test_install.sh — `make install PREFIX=…` installs like a library: the NPC example
# (runtime/examples/npc_server.c) builds against the installed prefix with pkg-config
# alone and runs from it; stock lua5.4 requires the installed Lua module; the installed
# berth finds its shipped scripts; `make uninstall` removes what install put there.
# Prints cmocka-style summary lines for tests/run.sh.
set -u
BUILD=${BUILD:-build}
. tests/lib/shtest.sh
prefix="$work/prefix"

test_make_install_into_a_prefix() {
    make --no-print-directory BUILD="$BUILD" PREFIX="$prefix" install > "$work/install.out" 2>&1 ||
        { tail -20 "$work/install.out"; return 1; }
    cat "$work/install.out" | tail -1
    for f in lib/libplimsoll.so.0 lib/libberth.so.0 lib/libberth.a include/berth.h \
             include/berth_model.h include/plimsoll.h include/plimsoll_sandboxes.h \
             lib/pkgconfig/berth.pc lib/pkgconfig/plimsoll.pc bin/berth bin/sandboxd \
             share/man/man1/berth.1 share/man/man8/sandboxd.8 \
             share/berth/scripts/code_chat.lua share/berth/scripts/examples/approval.lua \
             lib/lua/5.4/plimsoll.so; do
        [ -e "$prefix/$f" ] || { echo "not installed: $f"; return 1; }
    done
    has "$work/install.out" "the Lua module is $prefix/lib/lua/5.4/plimsoll.so"
}

test_the_npc_example_builds_from_the_prefix_with_pkg_config_only() {
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
    flags=$(pkg-config --cflags --libs berth) || { echo "pkg-config --libs berth failed"; return 1; }
    echo "cc $flags"
    # Only the installed headers: the source folder's are out of reach.
    cp runtime/examples/npc_server.c "$work/npc_server.c"
    cc -std=c11 -D_GNU_SOURCE -Wall -Werror -o "$work/npc_server" "$work/npc_server.c" $flags \
        > "$work/cc.out" 2>&1 || { cat "$work/cc.out"; return 1; }
    LD_LIBRARY_PATH="$prefix/lib" "$work/npc_server" --help > "$work/help.out" 2>&1 ||
        { cat "$work/help.out"; return 1; }
    has "$work/help.out" "--npcs"
    # It runs a short game from the prefix: its sandboxd and scripts are the installed ones.
    LD_LIBRARY_PATH="$prefix/lib" BERTH_SANDBOXD="$prefix/bin/sandboxd" \
        BERTH_SCRIPTS="$prefix/share/berth/scripts" \
        "$work/npc_server" --npcs 4 --ticks 3 --tick-ms 20 --provider echo > "$work/game.out" 2>&1 ||
        { tail -20 "$work/game.out"; return 1; }
    has_re "$work/game.out" "^npc_server: ok$"
}

test_stock_lua_requires_the_installed_module() {
    LUA_CPATH_5_4="$prefix/lib/lua/5.4/?.so;;" lua5.4 -e \
        'local p = require "plimsoll"; print(type(p.new))' > "$work/lua.out" 2>&1 ||
        { cat "$work/lua.out"; return 1; }
    has "$work/lua.out" "function"
}

test_the_installed_berth_finds_its_scripts() {
    env -u BERTH_SCRIPTS "$prefix/bin/berth" replay --provider echo \
        --sandboxd "$prefix/bin/sandboxd" "$prefix/share/berth/scripts/demo_conversation.lua" \
        > "$work/replay.out" 2>&1 || { tail -20 "$work/replay.out"; return 1; }
    ! grep -q "check FAILED" "$work/replay.out"
}

test_make_uninstall_removes_it() {
    make --no-print-directory BUILD="$BUILD" PREFIX="$prefix" uninstall > "$work/un.out" 2>&1 ||
        { tail -20 "$work/un.out"; return 1; }
    left=$(find "$prefix" -type f -o -type l | head -5)
    [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}

run make_install_into_a_prefix
run the_npc_example_builds_from_the_prefix_with_pkg_config_only
run stock_lua_requires_the_installed_module
run the_installed_berth_finds_its_scripts
run make_uninstall_removes_it
finish
