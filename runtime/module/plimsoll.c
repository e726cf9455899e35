/*
 * plimsoll.c — `require "plimsoll"` for stock Lua 5.4: one sandbox per conversation
 * key against a plimsoll daemon, with blocking calls (there is no host loop: each
 * call runs the client's private libev loop until its answer is checked).
 *
 *   local plimsoll = require "plimsoll"
 *   local sb = plimsoll.new{url = "http://127.0.0.1:8080", token = "…"}
 *   local r, msg, code = sb:executeCode{runId = "conv-1", code = "x = 41"}
 *   sb:dispose("conv-1")
 *   sb:close()
 *
 * Same values as the host's natives (plmlua.h): a result table, or nil, message, code.
 * Without runId a call runs fresh.  new() without url reads PLIMSOLL_URL and
 * PLIMSOLL_TOKEN.  Options: new{url, token, minimumIsolation (default: container for
 * http on loopback, kernel for https), timeoutMs, idleCloseMs}; executeCode{code,
 * language, files, runId, userId, timeoutMs}.  An unknown key raises.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ev.h>
#include <lauxlib.h>
#include <lua.h>

#include "jsonlua.h"
#include "plmlua.h"

#define SANDBOXES_MT "plimsoll.Sandboxes"

typedef struct sandboxes {
  plm_client *client;           /* NULL once closed */
  plm_sandboxes *sb;
} sandboxes;

/* {====================================================== blocking */

static void run_until(sandboxes *s, const bool *done)
{
  struct ev_loop *loop = plm_client_loop(s->client);
  while (!*done)
    ev_run(loop, EVRUN_ONCE);
}

typedef struct code_wait {
  bool done;
  plm_error *err;
  plm_code_output *out;
} code_wait;

static void on_code(void *ud, plm_error *err, plm_code_output *out)
{
  code_wait *w = ud;
  w->err = err;
  w->out = out;
  w->done = true;
}

static void on_done(void *ud)
{
  *(bool *)ud = true;
}

/* }====================================================== */

static sandboxes *check_open(lua_State *L)
{
  sandboxes *s = luaL_checkudata(L, 1, SANDBOXES_MT);
  if (!s->client)
    luaL_error(L, "attempt to use a closed plimsoll sandboxes handle");
  return s;
}

static const char *opt_field(lua_State *L, int t, const char *k)
{
  lua_getfield(L, t, k);
  const char *v = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
  lua_pop(L, 1);                /* anchored by the table */
  return v;
}

static int sb_execute(lua_State *L)
{
  sandboxes *s = check_open(L);
  plm_code_input in;
  plmlua_check_input(L, 2, &in);
  const char *run = opt_field(L, 2, "runId"), *user = opt_field(L, 2, "userId");
  plm_key key = {user, run};
  code_wait w = {false, NULL, NULL};
  plm_error *e = plm_sandboxes_run(s->sb, run ? &key : NULL, &in, NULL, on_code, &w);
  if (e) {
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  run_until(s, &w.done);
  if (w.err) {
    int n = plmlua_push_error(L, w.err);
    plm_error_free(w.err);
    plm_code_output_free(w.out);
    return n;
  }
  plmlua_push_output(L, w.out);
  plm_code_output_free(w.out);
  return 1;
}

/* warm and dispose take (runId [, userId]) and nothing else. */
static void check_no_more(lua_State *L, int first, const char *what)
{
  if (!lua_isnoneornil(L, first))
    luaL_error(L, "%s takes (runId [, userId]); argument #%d is one too many", what,
               first - 1);
}

static int sb_warm(lua_State *L)
{
  sandboxes *s = check_open(L);
  check_no_more(L, 4, "warm");
  plm_key key = {luaL_optstring(L, 3, NULL), luaL_checkstring(L, 2)};
  plm_error *e = plm_sandboxes_warm(s->sb, &key);
  if (e) {
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int sb_dispose(lua_State *L)
{
  sandboxes *s = check_open(L);
  check_no_more(L, 4, "dispose");
  plm_key key = {luaL_optstring(L, 3, NULL), luaL_checkstring(L, 2)};
  bool done = false;
  plm_error *e = plm_sandboxes_dispose(s->sb, &key, on_done, &done);
  if (e) {
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  run_until(s, &done);
  lua_pushboolean(L, 1);
  return 1;
}

static int sb_dispose_all(lua_State *L)
{
  sandboxes *s = check_open(L);
  bool done = false;
  plm_sandboxes_dispose_all(s->sb, on_done, &done);
  run_until(s, &done);
  lua_pushboolean(L, 1);
  return 1;
}

static int sb_count(lua_State *L)
{
  sandboxes *s = check_open(L);
  lua_pushinteger(L, (lua_Integer)plm_sandboxes_count(s->sb));
  return 1;
}

/* The executeCode tool as a model sees it (chat-completions shape). */
static int sb_tool(lua_State *L)
{
  sandboxes *s = check_open(L);
  char *desc = plm_tool_description(s->sb, lua_toboolean(L, 2));
  json_t *params = plm_tool_parameters(s->sb);
  json_t *tool = json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function",
                           "name", "executeCode", "description", desc ? desc : "",
                           "parameters", params ? params : json_object());
  free(desc);
  berth_json_push(L, tool);
  json_decref(tool);
  return 1;
}

/* Idempotent: __gc and __close too (liolib's pattern). */
static int sb_close(lua_State *L)
{
  sandboxes *s = luaL_checkudata(L, 1, SANDBOXES_MT);
  if (s->client) {
    bool done = false;
    plm_sandboxes_dispose_all(s->sb, on_done, &done);
    run_until(s, &done);
    plm_sandboxes_free(s->sb);
    plm_client_free(s->client);
    s->sb = NULL;
    s->client = NULL;
  }
  return 0;
}

static int sb_tostring(lua_State *L)
{
  sandboxes *s = luaL_checkudata(L, 1, SANDBOXES_MT);
  if (s->client)
    lua_pushfstring(L, "plimsoll sandboxes (%d held)", (int)plm_sandboxes_count(s->sb));
  else
    lua_pushliteral(L, "plimsoll sandboxes (closed)");
  return 1;
}

/* The floor without minimumIsolation, the rule berth's faces and berth_options follow
 * (berth_default_floor): "container" for a daemon over cleartext http, which the
 * client allows only to loopback (a daemon on this machine), else "kernel". */
static const char *default_floor(const char *url)
{
  return strncasecmp(url, "http://", 7) == 0 ? "container" : "kernel";
}

static int m_new(lua_State *L)
{
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  static const char *const keys[] = {
    "url", "token", "minimumIsolation", "timeoutMs", "idleCloseMs", NULL
  };
  plmlua_check_keys(L, 1, "plimsoll.new", keys);
  const char *url = opt_field(L, 1, "url");
  const char *token = opt_field(L, 1, "token");
  if (!url) {
    url = getenv("PLIMSOLL_URL");
    if (!token)
      token = getenv("PLIMSOLL_TOKEN");
  }
  if (!url || !*url)
    return luaL_error(L, "plimsoll.new: no daemon URL (give url, or set PLIMSOLL_URL)");
  /* In a consistent (closed) state first, as liolib's newprefile does. */
  sandboxes *s = lua_newuserdatauv(L, sizeof *s, 0);
  s->client = NULL;
  s->sb = NULL;
  luaL_setmetatable(L, SANDBOXES_MT);

  plm_client_options co;
  plm_client_options_init(&co);
  co.base_url = url;
  co.token = token;
  plm_client *client = NULL;
  plm_error *e = plm_client_new(NULL, &co, &client);
  plm_sandboxes *sb = NULL;
  if (!e) {
    plm_sandboxes_options so;
    plm_sandboxes_options_init(&so);
    so.client = client;
    const char *floor = opt_field(L, 1, "minimumIsolation");
    so.minimum_isolation = floor ? floor : default_floor(url);
    so.timeout_ms = plmlua_opt_ms(L, 1, "plimsoll.new", "timeoutMs");
    lua_getfield(L, 1, "idleCloseMs");
    if (!lua_isnil(L, -1))
      so.idle_close_ms = (int64_t)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    e = plm_sandboxes_new(&so, &sb);
  }
  if (e) {
    plm_client_free(client);
    int n = plmlua_push_error(L, e);
    plm_error_free(e);
    return n;
  }
  s->client = client;
  s->sb = sb;
  return 1;
}

static const luaL_Reg funcs[] = {
  {"new", m_new},
  {NULL, NULL}
};

static const luaL_Reg meth[] = {
  {"executeCode", sb_execute},
  {"warm", sb_warm},
  {"dispose", sb_dispose},
  {"disposeAll", sb_dispose_all},
  {"count", sb_count},
  {"tool", sb_tool},
  {"close", sb_close},
  {NULL, NULL}
};

static const luaL_Reg metameth[] = {
  {"__index", NULL},            /* placeholder */
  {"__gc", sb_close},
  {"__close", sb_close},
  {"__tostring", sb_tostring},
  {NULL, NULL}
};

LUAMOD_API int luaopen_plimsoll(lua_State *L)
{
  plm_global_init();
  luaL_newlib(L, funcs);
  luaL_newmetatable(L, SANDBOXES_MT);
  luaL_setfuncs(L, metameth, 0);
  luaL_newlibtable(L, meth);
  luaL_setfuncs(L, meth, 0);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  lua_pushliteral(L, PLIMSOLL_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
