/*
 * jsonlua_shared.c — the JSON bridge compiled into build/lua/plimsoll.so as well: the
 * module links libplimsoll but not libberth, and must convert the tool's parameters
 * exactly as the host does.
 */
#include "../core/jsonlua.c"
