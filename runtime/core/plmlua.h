/*
 * plmlua.h — libplimsoll values in Lua, shared by the host's natives (natives.c) and
 * the stock-Lua module (module/plimsoll.c, which links libplimsoll but not libberth,
 * hence static functions in a header).
 *
 *   plmlua_check_input   {code=, language=, files={{path=, content=}, ...}, timeoutMs=}
 *                        -> input (runId and userId are the caller's to read)
 *   plmlua_check_keys    an unknown key in an options table raises, naming the known
 *   plmlua_push_output   the executeCode result table (docs/client.md §7.2 fields)
 *   plmlua_push_error    nil, message, code
 */
#ifndef BERTH_PLMLUA_H
#define BERTH_PLMLUA_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "plimsoll_sandboxes.h"

#define PLMLUA_OUTPUT_MT "plimsoll.codeOutput"

/* The short stable code of an error: the not-dispatched reason when nothing ran
 * ("capacity", "environment", "request", …), else the Connect code ("data_loss"). */
static inline const char *plmlua_error_code(const plm_error *e)
{
  if (e->not_dispatched != PLM_REFUSAL_NONE && plm_refusal_name(e->not_dispatched))
    return plm_refusal_name(e->not_dispatched);
  return plm_code_name(e->code);
}

static inline int plmlua_push_fail(lua_State *L, const char *message, const char *code)
{
  luaL_pushfail(L);
  lua_pushstring(L, message);
  lua_pushstring(L, code);
  return 3;
}

static inline int plmlua_push_error(lua_State *L, const plm_error *e)
{
  return plmlua_push_fail(L, e->message ? e->message : plm_code_name(e->code),
                          plmlua_error_code(e));
}

/* Raises (misuse) when the table at idx holds a key not in `known` (NULL-terminated),
 * naming the known ones: a misspelt option ("lang") would otherwise be ignored and the
 * call run with the default.  `what` names the call in the message. */
static inline void plmlua_check_keys(lua_State *L, int idx, const char *what,
                                     const char *const *known)
{
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    bool ok = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (const char *const *k = known; *k && !ok; k++)
        ok = strcmp(lua_tostring(L, -1), *k) == 0;
    if (!ok) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (const char *const *k = known; *k; k++) {
        if (k != known)
          luaL_addstring(&b, ", ");
        luaL_addstring(&b, *k);
      }
      luaL_pushresult(&b);
      if (lua_type(L, -2) == LUA_TSTRING)
        luaL_error(L, "%s: unknown option '%s' (known: %s)", what, lua_tostring(L, -2),
                   lua_tostring(L, -1));
      luaL_error(L, "%s: unknown option [%s] (known: %s)", what, luaL_typename(L, -2),
                 lua_tostring(L, -1));
    }
  }
}

/* An optional timeout in milliseconds: nil (0: the default), else an integer in
 * [1, 2^31-1]; anything else raises. */
static inline int64_t plmlua_opt_ms(lua_State *L, int idx, const char *what, const char *key)
{
  lua_getfield(L, idx, key);
  int64_t ms = 0;
  if (!lua_isnil(L, -1)) {
    int isint = 0;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint || v < 1 || v > 2147483647)
      luaL_error(L, "%s: %s must be a whole number of milliseconds in 1 .. 2147483647",
                 what, key);
    ms = (int64_t)v;
  }
  lua_pop(L, 1);
  return ms;
}

/* Fills `in` from the table at idx.  Strings stay owned by Lua (the table is on the
 * caller's stack); the files array is a userdata pushed on the stack.  Wrong types
 * raise (misuse); values the library judges (an empty code, 199 files, a bad path)
 * are left to it, so they come back as nil, message, code. */
static inline void plmlua_check_input(lua_State *L, int idx, plm_code_input *in)
{
  idx = lua_absindex(L, idx);
  memset(in, 0, sizeof *in);
  luaL_checktype(L, idx, LUA_TTABLE);
  /* The keys an executeCode table may hold (the host's and the module's). */
  static const char *const keys[] = {
    "code", "language", "files", "runId", "userId", "timeoutMs", NULL
  };
  plmlua_check_keys(L, idx, "executeCode", keys);
  in->timeout_ms = plmlua_opt_ms(L, idx, "executeCode", "timeoutMs");
  lua_getfield(L, idx, "code");
  if (lua_type(L, -1) != LUA_TSTRING) /* not a number either: its conversion would not
                                        be anchored by the table */
    luaL_error(L, "executeCode: field 'code' must be a string (got %s)", luaL_typename(L, -1));
  in->code = lua_tostring(L, -1);
  lua_pop(L, 1);               /* still referenced by the table */
  lua_getfield(L, idx, "language");
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "executeCode: field 'language' must be a string");
    in->language = lua_tostring(L, -1);
  }
  lua_pop(L, 1);
  lua_getfield(L, idx, "files");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "executeCode: field 'files' must be an array of {path=, content=}");
  size_t n = (size_t)lua_rawlen(L, -1);
  plm_file *files = lua_newuserdatauv(L, (n ? n : 1) * sizeof *files, 1);
  /* The files table as a user value: it anchors the path and content strings. */
  lua_pushvalue(L, -2);
  lua_setiuservalue(L, -2, 1);
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, -2, (lua_Integer)i + 1);
    if (!lua_istable(L, -1))
      luaL_error(L, "executeCode: files[%d] must be a table {path=, content=}", (int)i + 1);
    static const char *const file_keys[] = {"path", "content", NULL};
    plmlua_check_keys(L, -1, "executeCode: a file", file_keys);
    lua_getfield(L, -1, "path");
    lua_getfield(L, -2, "content");
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "executeCode: files[%d] needs string fields path and content", (int)i + 1);
    files[i].path = lua_tostring(L, -2);
    files[i].content = lua_tostring(L, -1);
    lua_pop(L, 3);
  }
  lua_remove(L, -2);            /* the files table; the userdata stays */
  in->files = files;
  in->n_files = n;
}

static inline void plmlua_setfield_str(lua_State *L, const char *k, const char *v)
{
  lua_pushstring(L, v ? v : "");
  lua_setfield(L, -2, k);
}

static inline void plmlua_setfield_bool(lua_State *L, const char *k, bool v)
{
  lua_pushboolean(L, v);
  lua_setfield(L, -2, k);
}

/* The result table.  freshInterpreter and freshSandbox are present only when true
 * (T07).  Its metatable's __jsonorder gives json.encode the reference key order (T03). */
static inline void plmlua_push_output(lua_State *L, const plm_code_output *o)
{
  static const char *const order[] = {
    "language", "exitCode", "timedOut", "stdout", "stderr", "truncated", "stateKept",
    "freshInterpreter", "filesPersist", "freshSandbox", "isolation", "recordSha256"
  };
  lua_createtable(L, 0, 12);
  plmlua_setfield_str(L, "language", o->language);
  lua_pushinteger(L, o->exit_code);
  lua_setfield(L, -2, "exitCode");
  plmlua_setfield_bool(L, "timedOut", o->timed_out);
  plmlua_setfield_str(L, "stdout", o->stdout_text);
  plmlua_setfield_str(L, "stderr", o->stderr_text);
  plmlua_setfield_bool(L, "truncated", o->truncated);
  plmlua_setfield_bool(L, "stateKept", o->state_kept);
  if (o->fresh_interpreter)
    plmlua_setfield_bool(L, "freshInterpreter", true);
  plmlua_setfield_bool(L, "filesPersist", o->files_persist);
  if (o->fresh_sandbox)
    plmlua_setfield_bool(L, "freshSandbox", true);
  plmlua_setfield_str(L, "isolation", o->isolation);
  plmlua_setfield_str(L, "recordSha256", o->record_sha256);
  if (luaL_newmetatable(L, PLMLUA_OUTPUT_MT)) {
    lua_createtable(L, 12, 0);
    for (int i = 0; i < 12; i++) {
      lua_pushstring(L, order[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "__jsonorder");
  }
  lua_setmetatable(L, -2);
}

#endif
