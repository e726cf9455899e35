/*
 * contain.c — what keeps a hook from taking the host down: a memory cap, an
 * instruction budget per hook call, an allow-listed global environment, and
 * coroutine.* replacements that keep the host's own yields out of user coroutines.
 */
#include "runtime.h"
#include "sanitizer.h"             /* lib/ */

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lualib.h>

/* {====================================================== memory cap */

/* The Lua heap lives in jemalloc, through its own entry points, whatever allocator the
 * process has.  A host holding many conversations keeps hundreds of thousands of
 * small tables and strings, and each turn frees and allocates among them: glibc's
 * malloc then spends most of a turn consolidating and searching its bins (40 % of the
 * host's CPU at 100 000 conversations, README "Figures"), jemalloc's size classes
 * do not.  Lua always passes the block's size, so a free is jemalloc's sized one.
 * Under AddressSanitizer the heap stays on malloc, where the sanitizer checks it. */
#ifdef BUILT_WITH_ASAN
static void heap_free(void *p, size_t size) { (void)size; free(p); }
static void *heap_realloc(void *p, size_t n) { return realloc(p, n); }
#else
#include <jemalloc/jemalloc.h>
static void heap_free(void *p, size_t size) { sdallocx(p, size, 0); }
static void *heap_realloc(void *p, size_t n) { return p ? rallocx(p, n, 0) : mallocx(n, 0); }
#endif

/* The cap applies only while a task's Lua code runs (mem->enforce): the host's own
 * work (creating a coroutine, pushing a result, a traceback) must not fail because a
 * hook filled the state, or Lua would panic outside a protected call. */
void *berth_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  berth_mem *m = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    if (ptr)
      heap_free(ptr, osize);
    m->used -= old;
    return NULL;
  }
  if (m->enforce && m->limit && nsize > old && m->used + (nsize - old) > m->limit) {
    m->refused = true;          /* the host collects when the task ends */
    return NULL;                /* Lua collects, retries once, then raises "not enough memory" */
  }
  void *p = heap_realloc(ptr, nsize);
  if (p) {
    if (nsize > old)
      m->grown += nsize - old;
    m->used = m->used - old + nsize;
    if (m->used > m->peak)
      m->peak = m->used;
  }
  return p;
}

/* }====================================================== */

/* {====================================================== instruction budget */

#define BUDGET_STEP 1000        /* instructions between two count-hook calls */

enum { STOP_BUDGET = 1, STOP_TIME };

static bool limited(const berth_host *h, const berth_task *t)
{
  return t->budget >= 0 || h->hook_time_limit > 0;
}

/* Whether the task went over a limit now; records which. */
static bool over_limit(berth_host *h, berth_task *t)
{
  if (t->budget == 0)
    t->stop = STOP_BUDGET;
  else if (h->hook_time_limit > 0 && berth_clock() - t->resumed > h->hook_time_limit)
    t->stop = STOP_TIME;
  else
    return false;
  return true;
}

/* Fails on every line and every instruction from now on, in this thread and (through
 * berth_budget_arm) in any coroutine it resumes, so that `while true do pcall(f) end`
 * gets the error again at once (Redis #8661). */
static int stop_task(lua_State *L, berth_host *h, berth_task *t);

static void budget_hook(lua_State *L, lua_Debug *ar)
{
  berth_host *h = berth_host_of(L);
  berth_task *t = h->current;
  if (!t || !limited(h, t))
    return;
  if (!t->spent) {
    if (ar->event == LUA_HOOKCOUNT && t->budget >= 0) /* clamped: < 0 means none */
      t->budget = t->budget > BUDGET_STEP ? t->budget - BUDGET_STEP : 0;
    if (!over_limit(h, t))
      return;
  }
  stop_task(L, h, t);
}

static int stop_task(lua_State *L, berth_host *h, berth_task *t)
{
  t->spent = true;
  lua_sethook(L, budget_hook, LUA_MASKLINE | LUA_MASKCOUNT, 1);
  if (t->stop == STOP_TIME) {
    char limit[32];
    snprintf(limit, sizeof limit, "%g", h->hook_time_limit);
    return luaL_error(L, "%s ran for more than %s s without waiting (its time limit; "
                         "time in C functions such as string.find counts)", t->what, limit);
  }
  return luaL_error(L, "%s exceeded its instruction budget of %I instructions", t->what,
                    (LUAI_UACINT)h->o.instruction_budget);
}

void berth_budget_arm(berth_host *h, lua_State *co)
{
  berth_task *t = h->current;
  if (!t || !limited(h, t))
    return;
  if (t->spent)
    lua_sethook(co, budget_hook, LUA_MASKLINE | LUA_MASKCOUNT, 1);
  else
    lua_sethook(co, budget_hook, LUA_MASKCOUNT, BUDGET_STEP);
}

void berth_charge(lua_State *L, long long steps)
{
  berth_host *h = berth_host_of(L);
  berth_task *t = h->current;
  if (!t || !h->mem.enforce || !limited(h, t))
    return;
  if (!t->spent) {
    if (t->budget >= 0)
      t->budget = steps < t->budget ? t->budget - steps : 0;
    if (!over_limit(h, t))
      return;
  }
  stop_task(L, h, t);
}

/* }====================================================== */

/* {====================================================== emitted events */

/* What an event holds, roughly in bytes as the face will buffer it: its strings and
 * keys, and a few bytes of framing per value. */
static size_t json_weight(const json_t *v, int depth)
{
  size_t n = 8;
  if (depth > 64)
    return n;
  if (json_is_string(v))
    n += json_string_length(v);
  else if (json_is_object(v)) {
    const char *k;
    json_t *m;
    json_object_foreach((json_t *)v, k, m)
      n += strlen(k) + json_weight(m, depth + 1);
  } else if (json_is_array(v))
    for (size_t i = 0; i < json_array_size(v); i++)
      n += json_weight(json_array_get(v, i), depth + 1);
  return n;
}

void berth_charge_event(lua_State *L, const json_t *data)
{
  berth_host *h = berth_host_of(L);
  berth_task *t = h->current;
  if (!t)
    return;
  t->events++;
  if (h->max_events && t->events > h->max_events)
    luaL_error(L, "%s emitted more than %I events (its bound per hook call)", t->what,
               (LUAI_UACINT)h->max_events);
  /* Events leave the Lua state (a face buffers them until its client reads them), so
   * the state's cap would not see them: they count against it for the whole call. */
  t->event_bytes += json_weight(data, 0);
  if (h->mem.limit && h->mem.used + t->event_bytes > h->mem.limit)
    luaL_error(L, "%s emitted %I bytes of events, over the memory cap of %I bytes with "
                  "the state's own", t->what, (LUAI_UACINT)t->event_bytes,
               (LUAI_UACINT)h->mem.limit);
}
/* }====================================================== */

/* {====================================================== coroutines */

const char berth_host_yield_tag = 0;

enum { CO_RESUME = 0, CO_WRAP = 1 };

static int resume_k(lua_State *L, int status, lua_KContext kind);

/* Resumes co with the narg values on top of L, like lcorolib's auxresume, except that
 * a host yield coming out of co (a native inside it waits) is passed on: L yields the
 * tag in turn, and when the host resumes L, resume_k resumes co again.  Whatever the
 * depth of user coroutines, the wait reaches the task's own coroutine, and the
 * completion reaches the native. */
static int resume_step(lua_State *L, lua_State *co, int narg, int kind)
{
  berth_host *h = berth_host_of(L);
  int nres, status;
  if (!lua_checkstack(co, narg)) {
    lua_pushliteral(L, "too many arguments to resume");
    status = LUA_ERRRUN;
    goto fail;
  }
  lua_xmove(L, co, narg);
  berth_budget_arm(h, co);
  status = lua_resume(co, L, narg, &nres);
  if (status == LUA_YIELD && nres == 1 && lua_touserdata(co, -1) == &berth_host_yield_tag) {
    lua_pop(co, 1);
    if (!lua_isyieldable(L)) {
      /* Nothing can carry the wait out of here: give it up so its completion does not
       * resume the task at the wrong place. */
      if (h->current && h->current->op)
        berth_op_abandon(h->current->op);
      return luaL_error(L, "attempt to yield across a C-call boundary (a native that "
                           "waits was called from a coroutine resumed inside a "
                           "metamethod, an iterator or require)");
    }
    lua_pushlightuserdata(L, (void *)&berth_host_yield_tag);
    return lua_yieldk(L, 1, kind, resume_k);
  }
  if (status == LUA_OK || status == LUA_YIELD) {
    if (!lua_checkstack(L, nres + 1)) {
      lua_pop(co, nres);
      lua_pushliteral(L, "too many results to resume");
      status = LUA_ERRRUN;
      goto fail;
    }
    lua_xmove(co, L, nres);
    if (kind == CO_RESUME) {
      lua_pushboolean(L, 1);
      lua_insert(L, -(nres + 1));
      return nres + 1;
    }
    return nres;
  }
  lua_xmove(co, L, 1);          /* the error */
fail:
  if (kind == CO_RESUME) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  /* wrap: propagate, as lcorolib's auxwrap does */
  {
    int stat = lua_status(co);
    if (stat != LUA_OK && stat != LUA_YIELD) {
      stat = lua_resetthread(co);
      lua_xmove(co, L, 1);
      lua_replace(L, -2);
    }
    if (stat != LUA_ERRMEM && lua_type(L, -1) == LUA_TSTRING) {
      luaL_where(L, 1);
      lua_insert(L, -2);
      lua_concat(L, 2);
    }
  }
  return lua_error(L);
}

static int resume_k(lua_State *L, int status, lua_KContext kind)
{
  (void)status;
  if (kind == CO_RESUME)
    return resume_step(L, lua_tothread(L, 1), lua_gettop(L) - 1, CO_RESUME);
  return resume_step(L, lua_tothread(L, lua_upvalueindex(1)), lua_gettop(L), CO_WRAP);
}

static int co_resume(lua_State *L)
{
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co, 1, "coroutine");
  return resume_step(L, co, lua_gettop(L) - 1, CO_RESUME);
}

static int co_wrapped(lua_State *L)
{
  lua_State *co = lua_tothread(L, lua_upvalueindex(1));
  return resume_step(L, co, lua_gettop(L), CO_WRAP);
}

static int co_create(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_State *co = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, co, 1);
  return 1;
}

static int co_wrap(lua_State *L)
{
  co_create(L);
  lua_pushcclosure(L, co_wrapped, 1);
  return 1;
}

void berth_open_coroutine(lua_State *L)
{
  static const luaL_Reg funcs[] = {
    {"create", co_create}, {"resume", co_resume}, {"wrap", co_wrap}, {NULL, NULL}
  };
  lua_getglobal(L, "coroutine");
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}

/* }====================================================== */

/* {====================================================== restricted environment */

/* Resolves `path` (relative ones against the scripts directory, upvalue 1) and checks
 * that it lies inside that directory.  Returns the resolved path (pushed), or NULL with
 * nil and a message pushed (a missing file is an ordinary failure, as for io.open);
 * raises for a path outside the directory, which is misuse. */
static const char *inside_scripts(lua_State *L, const char *path)
{
  const char *dir = lua_tostring(L, lua_upvalueindex(1));
  if (path[0] == '/')
    lua_pushstring(L, path);
  else
    lua_pushfstring(L, "%s/%s", dir, path);
  char *real = realpath(lua_tostring(L, -1), NULL);
  lua_pop(L, 1);
  if (!real) {
    luaL_pushfail(L);
    lua_pushfstring(L, "%s: %s", path, strerror(errno));
    return NULL;
  }
  size_t dlen = strlen(dir);
  bool ok = strncmp(real, dir, dlen) == 0 && real[dlen] == '/';
  lua_pushstring(L, real);
  free(real);
  if (!ok)
    luaL_error(L, "'%s' is outside the scripts directory %s (hooks may read only there)",
               path, dir);
  return lua_tostring(L, -1);
}

static int safe_open(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  const char *mode = luaL_optstring(L, 2, "r");
  if (strcmp(mode, "r") != 0 && strcmp(mode, "rb") != 0)
    return luaL_error(L, "io.open: hooks may open files for reading only (mode \"%s\")", mode);
  const char *real = inside_scripts(L, path);
  if (!real)
    return 2;
  lua_pushvalue(L, lua_upvalueindex(2));     /* the real io.open */
  lua_pushstring(L, real);
  lua_pushstring(L, mode);
  lua_call(L, 2, 3);
  return 3;
}

static int safe_lines(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  int n = lua_gettop(L);
  const char *real = inside_scripts(L, path);
  if (!real)
    return luaL_error(L, "%s", lua_tostring(L, -1));   /* as io.lines does */
  lua_pushvalue(L, lua_upvalueindex(2));     /* the real io.lines */
  lua_pushstring(L, real);
  for (int i = 2; i <= n; i++)
    lua_pushvalue(L, i);
  lua_call(L, n, 4);
  return 4;
}

static int safe_loadfile(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  int env = !lua_isnone(L, 3) ? 3 : 0;
  const char *real = inside_scripts(L, path);
  if (!real)
    return 2;
  if (luaL_loadfilex(L, real, "t") != LUA_OK) {
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
  }
  if (env) {
    lua_pushvalue(L, env);
    if (!lua_setupvalue(L, -2, 1))
      lua_pop(L, 1);
  }
  return 1;
}

static int safe_dofile(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  const char *real = inside_scripts(L, path);
  if (!real)
    return lua_error(L);
  if (luaL_loadfilex(L, real, "t") != LUA_OK)
    return lua_error(L);
  int base = lua_gettop(L) - 1;
  lua_call(L, 0, LUA_MULTRET);
  return lua_gettop(L) - base;
}

/* load, text chunks only: a crafted binary chunk can crash the VM. */
static int safe_load(lua_State *L)
{
  const char *mode = luaL_optstring(L, 3, "t");
  if (strchr(mode, 'b'))
    return luaL_error(L, "load: binary chunks are not allowed in hooks");
  int nargs = lua_gettop(L) >= 4 ? 4 : 3;  /* an absent env differs from a nil one */
  lua_settop(L, nargs);
  lua_pushliteral(L, "t");
  lua_replace(L, 3);
  lua_pushvalue(L, lua_upvalueindex(1));     /* the real load */
  lua_insert(L, 1);
  lua_call(L, nargs, LUA_MULTRET);
  return lua_gettop(L);
}

/* setmetatable refusing __gc and __close: finalizers run with hooks off, and so can a
 * __close run while a dead coroutine is reset after a budget error, so either could
 * loop beyond the instruction budget. */
static int safe_setmetatable(lua_State *L)
{
  static const char *const refused[] = {"__gc", "__close"};
  for (int i = 0; i < 2 && lua_istable(L, 2); i++) {
    lua_pushstring(L, refused[i]);
    if (lua_rawget(L, 2) != LUA_TNIL)
      return luaL_error(L, "setmetatable: %s metamethods are not allowed in hooks", refused[i]);
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

/* xpcall whose message handler is skipped once the budget is spent: Lua runs the
 * handler of an error raised inside a hook with hooks off, so a looping handler
 * would never be stopped.  Otherwise lbaselib's xpcall, yieldable. */
static int guarded_msgh(lua_State *L)
{
  berth_host *h = berth_host_of(L);
  if (h->current && h->current->spent)
    return 1;                   /* the budget error, as it is */
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

static int finish_xpcall(lua_State *L, int status, lua_KContext extra)
{
  if (status != LUA_OK && status != LUA_YIELD) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, -2);
    return 2;
  }
  return lua_gettop(L) - (int)extra;
}

static int safe_xpcall(lua_State *L)
{
  int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_pushcclosure(L, guarded_msgh, 1);
  lua_replace(L, 2);
  lua_pushboolean(L, 1);
  lua_pushvalue(L, 1);
  lua_rotate(L, 3, 2);
  int status = lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, finish_xpcall);
  return finish_xpcall(L, status, 2);
}

static int safe_collectgarbage(lua_State *L)
{
  static const char *const allowed[] = {"collect", "count", "step", "isrunning", NULL};
  luaL_checkoption(L, 1, "collect", allowed);
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

/* os.getenv without secrets: the daemon token must never reach a script. */
static int safe_getenv(lua_State *L)
{
  const char *name = luaL_checkstring(L, 1);
  char up[256];
  size_t i;
  for (i = 0; name[i] && i < sizeof up - 1; i++)
    up[i] = (char)toupper((unsigned char)name[i]);
  up[i] = '\0';
  if (strstr(up, "TOKEN") || strstr(up, "KEY") || strstr(up, "SECRET") ||
      strstr(up, "PASSWORD")) {
    luaL_pushfail(L);
    return 1;
  }
  const char *v = getenv(name);
  if (v)
    lua_pushstring(L, v);
  else
    luaL_pushfail(L);
  return 1;
}

static void keep_fields(lua_State *L, const char *lib, const char *const keep[])
{
  lua_getglobal(L, lib);
  lua_newtable(L);
  for (int i = 0; keep[i]; i++) {
    lua_getfield(L, -2, keep[i]);
    lua_setfield(L, -2, keep[i]);
  }
  lua_setglobal(L, lib);
  lua_pop(L, 1);
}

/* Replaces lib.name (or the global name) by f, whose upvalues are the scripts
 * directory (when dir is given) and then the original function. */
static void wrap_global(lua_State *L, const char *lib, const char *name, lua_CFunction f,
                        const char *dir)
{
  if (dir)
    lua_pushstring(L, dir);
  if (lib) {
    lua_getglobal(L, lib);
    lua_getfield(L, -1, name);
    lua_remove(L, -2);
  } else
    lua_getglobal(L, name);
  lua_pushcclosure(L, f, (dir ? 1 : 0) + 1);
  if (lib) {
    lua_getglobal(L, lib);
    lua_insert(L, -2);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
  } else
    lua_setglobal(L, name);
}

void berth_restrict(lua_State *L, const char *scripts_dir)
{
  static const char *const base_drop[] = {"dofile", "loadfile", NULL};
  static const char *const os_keep[] = {"clock", "date", "difftime", "time", NULL};
  static const char *const debug_keep[] = {"traceback", NULL};
  static const char *const string_drop[] = {"dump", NULL};

  /* Library functions that could run long in C, bounded (strmatch.c). */
  berth_open_bounded(L);
  /* Wrapped before their libraries are trimmed. */
  wrap_global(L, "io", "open", safe_open, scripts_dir);
  wrap_global(L, "io", "lines", safe_lines, scripts_dir);
  wrap_global(L, NULL, "load", safe_load, NULL);
  wrap_global(L, NULL, "setmetatable", safe_setmetatable, NULL);
  wrap_global(L, NULL, "collectgarbage", safe_collectgarbage, NULL);
  for (int i = 0; base_drop[i]; i++) {
    lua_pushnil(L);
    lua_setglobal(L, base_drop[i]);
  }
  lua_pushcfunction(L, safe_xpcall);
  lua_setglobal(L, "xpcall");
  lua_pushstring(L, scripts_dir);
  lua_pushcclosure(L, safe_loadfile, 1);
  lua_setglobal(L, "loadfile");
  lua_pushstring(L, scripts_dir);
  lua_pushcclosure(L, safe_dofile, 1);
  lua_setglobal(L, "dofile");

  keep_fields(L, "os", os_keep);
  lua_getglobal(L, "os");
  lua_pushcfunction(L, safe_getenv);
  lua_setfield(L, -2, "getenv");
  lua_pop(L, 1);
  {
    /* No io.stdout: a hook closing it would end the transcript. */
    static const char *const io_keep[] = {"open", "lines", "write", "type", NULL};
    keep_fields(L, "io", io_keep);
  }
  keep_fields(L, "debug", debug_keep);
  lua_getglobal(L, "string");
  for (int i = 0; string_drop[i]; i++) {
    lua_pushnil(L);
    lua_setfield(L, -2, string_drop[i]);
  }
  lua_pop(L, 1);
  /* `package` stays reachable only through require (paths fixed by the host), so a
   * hook cannot point the searchers elsewhere or call package.loadlib. */
  lua_pushnil(L);
  lua_setglobal(L, "package");
}

/* }====================================================== */
