/*
 * jsonlua.c — jansson <-> Lua conversion and the `json` module (rules in jsonlua.h).
 */
#include "jsonlua.h"
#include "plimsoll.h"  /* the one UTF-8 checker */
#include "json_text.h" /* the one compact JSON writer (lib/) */

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#define MAX_DEPTH 512           /* deeper than any message; far below the C stack */

/* Its address is json.null: a light userdata no script can forge. */
static const char null_tag = 0;

void berth_json_pushnull(lua_State *L)
{
  lua_pushlightuserdata(L, (void *)&null_tag);
}

static void setmarker(lua_State *L, int idx, const char *mt)
{
  idx = lua_absindex(L, idx);
  luaL_getmetatable(L, mt);
  if (lua_isnil(L, -1)) {       /* first use in this state */
    lua_pop(L, 1);
    luaL_newmetatable(L, mt);
  }
  lua_setmetatable(L, idx);
}

void berth_json_setarray(lua_State *L, int idx) { setmarker(L, idx, BERTH_JSON_ARRAY_MT); }
void berth_json_setobject(lua_State *L, int idx) { setmarker(L, idx, BERTH_JSON_OBJECT_MT); }

/* {====================================================== jansson -> Lua */

static void push_value(lua_State *L, const json_t *v, int depth)
{
  luaL_checkstack(L, 4, "JSON value nested too deeply");
  switch (json_typeof(v)) {
    case JSON_OBJECT: {
      const char *key;
      size_t klen;
      json_t *item;
      lua_createtable(L, 0, (int)json_object_size(v));
      json_object_keylen_foreach((json_t *)v, key, klen, item) {
        if (json_is_null(item))
          continue;             /* absent, so `t.field` is nil (see jsonlua.h) */
        lua_pushlstring(L, key, klen);
        push_value(L, item, depth + 1);
        lua_rawset(L, -3);
      }
      break;
    }
    case JSON_ARRAY: {
      size_t n = json_array_size(v);
      lua_createtable(L, (int)n, 0);
      for (size_t i = 0; i < n; i++) {
        push_value(L, json_array_get(v, i), depth + 1);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
      }
      berth_json_setarray(L, -1);
      break;
    }
    case JSON_STRING:
      lua_pushlstring(L, json_string_value(v), json_string_length(v));
      break;
    case JSON_INTEGER:
      lua_pushinteger(L, (lua_Integer)json_integer_value(v));
      break;
    case JSON_REAL:
      lua_pushnumber(L, (lua_Number)json_real_value(v));
      break;
    case JSON_TRUE:
      lua_pushboolean(L, 1);
      break;
    case JSON_FALSE:
      lua_pushboolean(L, 0);
      break;
    case JSON_NULL:
    default:
      berth_json_pushnull(L);
      break;
  }
}

void berth_json_push(lua_State *L, const json_t *v)
{
  if (v == NULL)
    berth_json_pushnull(L);
  else
    push_value(L, v, 0);
}

/* }====================================================== */

/* {====================================================== Lua -> jansson */

/* The partial result lives in a box userdata whose __gc drops it, so an error raised
 * half way through (a function inside a table, a cycle) leaks nothing. */
typedef struct jbox {            /* the state of one conversion (on the C stack) */
  json_t *root;                 /* a one-element array holding the value (boxed) */
  int depth;
  const void *seen[MAX_DEPTH];  /* tables on the current path, to find cycles */
  struct { const char *key; size_t len; lua_Integer index; } path[MAX_DEPTH];
} jbox;

/* __gc of a jbox and of the one-pointer boxes below: both start with the root. */
static int jbox_gc(lua_State *L)
{
  json_t **root = lua_touserdata(L, 1);
  json_decref(*root);
  *root = NULL;
  return 0;
}

/* Pushes a one-pointer box owning v: collected, it drops v. */
static void push_owner(lua_State *L, json_t *v)
{
  json_t **root = lua_newuserdatauv(L, sizeof *root, 0);
  *root = v;
  luaL_setmetatable(L, "berth.json.box");
}

static int conv_error(lua_State *L, jbox *b, const char *what)
{
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  luaL_addstring(&buf, "$");
  for (int i = 1; i < b->depth; i++) {   /* path[0] is the root's place in the box */
    if (b->path[i].key) {
      luaL_addchar(&buf, '.');
      luaL_addlstring(&buf, b->path[i].key, b->path[i].len);
    } else {
      lua_pushfstring(L, "[%I]", (LUAI_UACINT)b->path[i].index);
      luaL_addvalue(&buf);
    }
  }
  luaL_pushresult(&buf);
  return luaL_error(L, "cannot encode %s as JSON at %s", what, lua_tostring(L, -1));
}

/* Strings and keys are checked by the one UTF-8 checker (it skips ASCII 32 bytes at a
 * time; jansson's own check takes a character at a time) and ill-formed ones made
 * well-formed, U+FFFD for each bad part. */
static json_t *make_string(const char *s, size_t len)
{
  if (plm_utf8_valid(s, len))
    return json_stringn_nocheck(s, len);
  size_t n;
  char *clean = plm_utf8_lossy((const unsigned char *)s, len, &n);
  json_t *j = clean ? json_stringn_nocheck(clean, n) : NULL;
  free(clean);
  return j;
}

/* Takes v, as json_object_setn_new_nocheck does, on success and on failure.  (Not
 * json_object_setn_new: on an ill-formed key it frees v before saying so.) */
static int set_key(json_t *obj, const char *k, size_t klen, json_t *v)
{
  if (plm_utf8_valid(k, klen))
    return json_object_setn_new_nocheck(obj, k, klen, v);
  size_t n;
  char *clean = plm_utf8_lossy((const unsigned char *)k, klen, &n);
  int rc;
  if (clean)
    rc = json_object_setn_new_nocheck(obj, clean, n, v);
  else {
    json_decref(v);
    rc = -1;
  }
  free(clean);
  return rc;
}

static void add_value(lua_State *L, jbox *b, int idx, json_t *parent, const char *key,
                      size_t klen);

/* 1: keys are exactly 1..n (n >= 1); 2: all strings; 0: empty; -1: neither. */
static int classify(lua_State *L, int idx, lua_Integer *n)
{
  lua_Integer count = 0, max = 0;
  int strings = 0, ints = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    count++;
    if (lua_type(L, -1) == LUA_TSTRING)
      strings = 1;
    else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1) {
      ints = 1;
      if (lua_tointeger(L, -1) > max)
        max = lua_tointeger(L, -1);
    } else {
      lua_pop(L, 1);
      return -1;
    }
  }
  *n = max;
  if (count == 0)
    return 0;
  if (strings && !ints)
    return 2;
  if (ints && !strings && max == count)
    return 1;
  return -1;
}

typedef struct skey { const char *s; size_t len; int slot; } skey;

#define SMALL_OBJECT 8          /* keys of an object filled in one traversal */

static int cmp_keys(const void *a, const void *b)
{
  const skey *x = a, *y = b;
  int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* An object's keys in byte order, so that output is deterministic. */
static void sort_keys(skey *keys, size_t n)
{
  if (n <= SMALL_OBJECT) {       /* insertion: no call per comparison for a few keys */
    for (size_t i = 1; i < n; i++) {
      skey k = keys[i];
      size_t j = i;
      for (; j > 0 && cmp_keys(&keys[j - 1], &k) > 0; j--)
        keys[j] = keys[j - 1];
      keys[j] = k;
    }
  } else
    qsort(keys, n, sizeof *keys, cmp_keys);
}

/* Sets the fields of keys[0..n) of the table at idx in byte order of the keys.  A
 * key's value is at its slot on the stack, or (slot 0) fetched from the table as its
 * turn comes.  With `ordered`, a key __jsonorder already set is skipped. */
static void add_sorted(lua_State *L, jbox *b, int idx, json_t *obj, skey *keys, size_t n,
                       int ordered)
{
  sort_keys(keys, n);
  for (size_t i = 0; i < n; i++) {
    if (ordered && json_object_getn(obj, keys[i].s, keys[i].len))
      continue;
    if (keys[i].slot) {
      add_value(L, b, keys[i].slot, obj, keys[i].s, keys[i].len);
      continue;
    }
    lua_pushlstring(L, keys[i].s, keys[i].len);
    lua_rawget(L, idx);
    add_value(L, b, lua_gettop(L), obj, keys[i].s, keys[i].len);
    lua_pop(L, 1);
  }
}

/* An object of at most SMALL_OBJECT keys (a message, a tool call: nearly every one)
 * in one traversal: its keys and values are left on the stack and sorted in a C
 * array, so it costs no Lua allocation and no second lookup of each value.  False,
 * with the stack as it was, for a larger one. */
static bool fill_small_object(lua_State *L, jbox *b, int idx, json_t *obj, int ordered,
                              const char *not_string)
{
  skey keys[SMALL_OBJECT];
  int base = lua_gettop(L);
  size_t n = 0;
  /* The stack grows a pair at a time, not by the most a small object could take: a
   * turn's coroutine waits for the model with the stack its conversion grew, and with
   * 100 000 turns at once the spare slots of 2 * SMALL_OBJECT took the Lua state past
   * its cap (bench/idle_memory). */
  luaL_checkstack(L, 3, "JSON value nested too deeply");
  lua_pushnil(L);
  while (lua_next(L, idx)) {      /* ... k1 v1 ... k v */
    if (lua_type(L, -2) != LUA_TSTRING)
      conv_error(L, b, not_string);
    if (n == SMALL_OBJECT) {
      lua_settop(L, base);
      return false;
    }
    keys[n].s = lua_tolstring(L, -2, &keys[n].len);
    keys[n].slot = lua_gettop(L);
    n++;
    lua_pushvalue(L, -2);         /* the key lua_next takes; the pair stays below */
    luaL_checkstack(L, 2, "JSON value nested too deeply");  /* the next pair's */
  }
  add_sorted(L, b, idx, obj, keys, n, ordered);
  lua_settop(L, base);
  return true;
}

static void fill_large_object(lua_State *L, jbox *b, int idx, json_t *obj, int ordered,
                              const char *not_string)
{
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      conv_error(L, b, not_string);
    n++;
  }
  /* The key list is a userdata so it is collected if add_value raises; the key
   * strings themselves are anchored by the table, which nothing changes meanwhile.
   * Each value is fetched again by its key as its turn comes (slot 0). */
  skey *keys = lua_newuserdatauv(L, n * sizeof *keys, 0);
  int keys_idx = lua_gettop(L);
  size_t i = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    keys[i].s = lua_tolstring(L, -1, &keys[i].len);
    keys[i].slot = 0;
    i++;
  }
  add_sorted(L, b, idx, obj, keys, n, ordered);
  lua_remove(L, keys_idx);
}

static void fill_object(lua_State *L, jbox *b, int idx, json_t *obj, const char *not_string)
{
  /* Keys named by __jsonorder first, in that order. */
  int ordered = 0;
  if (lua_getmetatable(L, idx)) {
    if (lua_getfield(L, -1, "__jsonorder") == LUA_TTABLE) {
      lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
      for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -1, i) == LUA_TSTRING) {
          size_t klen;
          const char *k = lua_tolstring(L, -1, &klen);
          lua_pushvalue(L, -1);
          if (lua_rawget(L, idx) != LUA_TNIL)
            add_value(L, b, lua_gettop(L), obj, k, klen);
          lua_pop(L, 1);
        }
        lua_pop(L, 1);
      }
      ordered = 1;
    }
    lua_pop(L, 2);
  }
  /* The rest in byte order, so output is deterministic. */
  if (!fill_small_object(L, b, idx, obj, ordered, not_string))
    fill_large_object(L, b, idx, obj, ordered, not_string);
}

/* Builds the value at idx and attaches it to parent (an array when key is NULL)
 * before filling it, so everything built so far is always reachable from the box. */
static void add_value(lua_State *L, jbox *b, int idx, json_t *parent, const char *key,
                      size_t klen)
{
  json_t *v = NULL;
  idx = lua_absindex(L, idx);
  if (key) {
    b->path[b->depth].key = key;
    b->path[b->depth].len = klen;
  } else {
    b->path[b->depth].key = NULL;
    b->path[b->depth].index = (lua_Integer)json_array_size(parent) + 1;
  }
  b->depth++;
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
      v = json_null();
      break;
    case LUA_TBOOLEAN:
      v = json_boolean(lua_toboolean(L, idx));
      break;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx))
        v = json_integer((json_int_t)lua_tointeger(L, idx));
      else {
        lua_Number x = lua_tonumber(L, idx);
        if (isnan(x) || isinf(x))
          conv_error(L, b, "NaN or an infinity");
        v = json_real((double)x);
      }
      break;
    case LUA_TSTRING: {
      size_t len;
      const char *s = lua_tolstring(L, idx, &len);
      v = make_string(s, len);
      break;
    }
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) == &null_tag) {
        v = json_null();
        break;
      }
      /* FALLTHROUGH */
    default:
      conv_error(L, b, lua_pushfstring(L, "a %s", luaL_typename(L, idx)));
      break;
    case LUA_TTABLE:
      break;
  }
  if (v) {
    if (key ? set_key(parent, key, klen, v) : json_array_append_new(parent, v))
      luaL_error(L, "not enough memory");
    b->depth--;
    return;
  }
  /* A table. */
  if (b->depth >= MAX_DEPTH)
    conv_error(L, b, "a value nested too deeply");
  const void *p = lua_topointer(L, idx);
  for (int i = 0; i < b->depth - 1; i++)
    if (b->seen[i] == p)
      conv_error(L, b, "a table that contains itself");
  b->seen[b->depth - 1] = p;
  luaL_checkstack(L, 6, "JSON value nested too deeply");

  int kind = -2;                /* -2: decide by the keys */
  if (lua_getmetatable(L, idx)) {
    luaL_getmetatable(L, BERTH_JSON_ARRAY_MT);
    if (lua_rawequal(L, -1, -2))
      kind = 1;
    lua_pop(L, 1);
    luaL_getmetatable(L, BERTH_JSON_OBJECT_MT);
    if (lua_rawequal(L, -1, -2))
      kind = 2;
    lua_pop(L, 2);
  }
  static const char mixed[] = "a table with mixed or sparse keys (use json.array or "
                               "string keys)";
  const char *not_string = "a table whose keys are not all strings";
  lua_Integer n = 0;
  if (kind == 1)
    n = (lua_Integer)lua_rawlen(L, idx);
  else if (kind == -2) {
    /* A string first key makes an object (a message, nearly every table): filling it
     * checks the other keys, so it is walked once, not classified first. */
    int first = LUA_TNIL;       /* the type of the first key; none when empty */
    lua_pushnil(L);
    if (lua_next(L, idx)) {
      first = lua_type(L, -2);
      lua_pop(L, 2);
    }
    if (first == LUA_TSTRING) {
      kind = 2;
      not_string = mixed;
    } else {
      kind = classify(L, idx, &n);
      if (kind < 0)
        conv_error(L, b, mixed);
      if (kind == 0)
        kind = 2;               /* {} is an object, as in lua-cjson */
    }
  }
  v = kind == 1 ? json_array() : json_object();
  if (key ? set_key(parent, key, klen, v) : json_array_append_new(parent, v))
    luaL_error(L, "not enough memory");
  if (kind == 1) {
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, idx, i);
      add_value(L, b, -1, v, NULL, 0);
      lua_pop(L, 1);
    }
  } else
    fill_object(L, b, idx, v, not_string);
  b->depth--;
}

const json_t *berth_json_check_boxed(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  /* The box on the Lua stack owns the value (one pointer, collected with it); the
   * walk's state (16 KiB of path and cycle marks) lives on the C stack, so a
   * conversion allocates no more Lua memory than the box itself. */
  json_t **root = lua_newuserdatauv(L, sizeof *root, 0);
  *root = NULL;
  if (luaL_newmetatable(L, "berth.json.box")) {
    lua_pushcfunction(L, jbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  *root = json_array();
  if (!*root)
    luaL_error(L, "not enough memory");
  jbox b;
  b.root = *root;
  b.depth = 0;
  add_value(L, &b, idx, b.root, NULL, 0);
  return json_array_get(*root, 0);
}

void berth_json_box_free(lua_State *L, int idx)
{
  json_t **root = luaL_checkudata(L, idx, "berth.json.box");
  json_decref(*root);
  *root = NULL;
}

json_t *berth_json_check(lua_State *L, int idx)
{
  json_t *v = json_incref((json_t *)berth_json_check_boxed(L, idx));
  berth_json_box_free(L, -1);
  lua_pop(L, 1);
  return v;
}

/* }====================================================== */

/* {====================================================== Lua -> text */

/* json.encode and the store (every message and state a turn stores) write a plain
 * value's text straight from its tables: building the jansson tree, writing it and
 * freeing it cost about 5 700 instructions a message.  Only a value the tree path
 * would write without complaint is written here, in the same bytes (a real as
 * plm_json_put_real writes it, which is jansson's form): at a NaN or an infinity, a
 * metatable with a metatable of its own (the tree path reads __jsonorder through it),
 * a string or key that is not well-formed UTF-8 (made well-formed there), an object
 * of more than TEXT_OBJECT_MOST keys, or anything the tree path refuses, the walk
 * gives up and the tree path does the whole value, errors included.  So the rules
 * stay in one place.  Nothing here raises or runs Lua code: raw accesses only, the
 * stack grown with lua_checkstack, the text in a C buffer. */
#define TEXT_OBJECT_MOST 32     /* keys of an object whose pairs the walk holds on the
                                   stack (a result of executeCode has 12) */
typedef struct twalk {
  plm_json_out *o;
  const void *array_mt, *object_mt; /* NULL: tables with it give up */
} twalk;

static bool text_value(lua_State *L, const twalk *w, int idx, int depth);

/* Writes one member: its key, and its value from its slot. */
static bool text_member(lua_State *L, const twalk *w, const skey *k, bool first, int depth)
{
  if (!first)
    plm_json_put_raw(w->o, ",", 1);
  plm_json_put_string(w->o, k->s, k->len);
  plm_json_put_raw(w->o, ":", 1);
  return text_value(L, w, k->slot, depth + 1);
}

/* The object at idx (at most TEXT_OBJECT_MOST keys, all strings): keys and values are
 * left on the stack as in fill_small_object, then written as fill_object orders them:
 * the keys the table at `order` (0: none) names first, in its order, each once; the
 * others in byte order. */
static bool text_object(lua_State *L, const twalk *w, int idx, int depth, int order)
{
  skey keys[TEXT_OBJECT_MOST];
  bool done[TEXT_OBJECT_MOST];
  int base = lua_gettop(L);
  size_t n = 0;
  bool ok = true;
  lua_pushnil(L);
  while (ok && lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING || n == TEXT_OBJECT_MOST) {
      ok = false;
      break;
    }
    keys[n].s = lua_tolstring(L, -2, &keys[n].len);
    keys[n].slot = lua_gettop(L);
    ok = plm_utf8_valid(keys[n].s, keys[n].len) && lua_checkstack(L, 3);
    done[n] = false;
    n++;
    if (ok)
      lua_pushvalue(L, -2);     /* the key lua_next takes; the pair stays below */
  }
  if (ok) {
    sort_keys(keys, n);
    plm_json_put_raw(w->o, "{", 1);
    bool first = true;
    lua_Integer m = order ? (lua_Integer)lua_rawlen(L, order) : 0;
    for (lua_Integer i = 1; ok && i <= m; i++) {
      if (lua_rawgeti(L, order, i) == LUA_TSTRING) {
        skey name;
        name.s = lua_tolstring(L, -1, &name.len);
        const skey *k = n ? bsearch(&name, keys, n, sizeof *keys, cmp_keys) : NULL;
        if (k && !done[k - keys]) {  /* named twice: the tree sets it twice, in place */
          done[k - keys] = true;
          ok = text_member(L, w, k, first, depth);
          first = false;
        }
      }
      lua_pop(L, 1);
    }
    for (size_t i = 0; ok && i < n; i++)
      if (!done[i]) {
        ok = text_member(L, w, &keys[i], first, depth);
        first = false;
      }
    plm_json_put_raw(w->o, "}", 1);
  }
  lua_settop(L, base);
  return ok;
}

static bool text_array(lua_State *L, const twalk *w, int idx, lua_Integer n, int depth)
{
  bool ok = true;
  plm_json_put_raw(w->o, "[", 1);
  for (lua_Integer i = 1; ok && i <= n; i++) {
    if (i > 1)
      plm_json_put_raw(w->o, ",", 1);
    lua_rawgeti(L, idx, i);
    ok = text_value(L, w, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
  }
  plm_json_put_raw(w->o, "]", 1);
  return ok;
}

/* The kinds add_value gives a table, decided the same way. */
static bool text_table(lua_State *L, const twalk *w, int idx, int depth)
{
  /* The tree path counts the root as 1 and refuses a table at MAX_DEPTH; a table
   * that contains itself reaches that limit and gives up too, for the tree path to
   * name it. */
  if (depth + 1 >= MAX_DEPTH || !lua_checkstack(L, 6))
    return false;
  int base = lua_gettop(L), order = 0;
  bool marked_object = false;
  if (lua_getmetatable(L, idx)) {
    const void *mt = lua_topointer(L, -1);
    if (mt == w->array_mt) {
      lua_settop(L, base);
      return text_array(L, w, idx, (lua_Integer)lua_rawlen(L, idx), depth);
    }
    marked_object = mt == w->object_mt;
    /* fill_object's order: the metatable's __jsonorder, read as it reads it */
    if (lua_getmetatable(L, -1)) {
      lua_settop(L, base);
      return false;
    }
    lua_pushliteral(L, "__jsonorder");
    if (lua_rawget(L, -2) == LUA_TTABLE)
      order = lua_gettop(L);
  }
  bool ok;
  lua_pushnil(L);
  if (!lua_next(L, idx)) {
    plm_json_put_raw(w->o, "{}", 2);
    ok = true;
  } else {
    int first = lua_type(L, -2);
    lua_pop(L, 2);
    lua_Integer n = 0;
    if (first == LUA_TSTRING || marked_object)
      ok = text_object(L, w, idx, depth, order);
    else
      ok = classify(L, idx, &n) == 1 && text_array(L, w, idx, n, depth);
  }
  lua_settop(L, base);
  return ok;
}

static bool text_value(lua_State *L, const twalk *w, int idx, int depth)
{
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
      plm_json_put_raw(w->o, "null", 4);
      return true;
    case LUA_TBOOLEAN:
      if (lua_toboolean(L, idx))
        plm_json_put_raw(w->o, "true", 4);
      else
        plm_json_put_raw(w->o, "false", 5);
      return true;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) {
        plm_json_put_integer(w->o, (json_int_t)lua_tointeger(L, idx));
      } else {
        lua_Number x = lua_tonumber(L, idx);
        if (isnan(x) || isinf(x))
          return false;             /* the tree path raises */
        plm_json_put_real(w->o, (double)x);
      }
      return true;
    case LUA_TSTRING: {
      size_t len;
      const char *s = lua_tolstring(L, idx, &len);
      if (!plm_utf8_valid(s, len))
        return false;
      plm_json_put_string(w->o, s, len);
      return true;
    }
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) != &null_tag)
        return false;
      plm_json_put_raw(w->o, "null", 4);
      return true;
    case LUA_TTABLE:
      return text_table(L, w, idx, depth);
    default:
      return false;
  }
}

/* The buffer the text is written in: one per state, kept in the registry and freed
 * with it, so that a memory error while the text is pushed leaks nothing.  Nothing
 * can use it twice at once: the walk runs no Lua code, and pushing the text copies it
 * before the collector can run a finalizer. */
static const char text_buffer_key = 0;
#define TEXT_BUFFER_KEPT (64 << 10)  /* a larger buffer is freed after each use */

static int text_buffer_gc(lua_State *L)
{
  plm_json_out *o = lua_touserdata(L, 1);
  free(o->p);
  memset(o, 0, sizeof *o);
  return 0;
}

static plm_json_out *text_buffer(lua_State *L)
{
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &text_buffer_key) == LUA_TUSERDATA) {
    plm_json_out *o = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return o;
  }
  lua_pop(L, 1);
  plm_json_out *o = lua_newuserdatauv(L, sizeof *o, 0);
  memset(o, 0, sizeof *o);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, text_buffer_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &text_buffer_key);
  return o;
}

/* The two marker metatables, for the walks that compare pointers (NULL: not made yet
 * in this state). */
static void get_markers(lua_State *L, const void **array_mt, const void **object_mt)
{
  int top = lua_gettop(L);
  luaL_getmetatable(L, BERTH_JSON_ARRAY_MT);
  *array_mt = lua_topointer(L, -1);
  luaL_getmetatable(L, BERTH_JSON_OBJECT_MT);
  *object_mt = lua_topointer(L, -1);
  lua_settop(L, top);
}

/* Writes the value at idx (absolute) into o, from len 0; false where the walk gave up
 * or memory ran out (o->failed). */
static bool write_direct(lua_State *L, int idx, plm_json_out *o)
{
  twalk w;
  w.o = o;
  get_markers(L, &w.array_mt, &w.object_mt);
  o->len = 0;
  o->failed = false;
  return text_value(L, &w, idx, 0) && !o->failed;
}

bool berth_json_encode_direct(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  plm_json_out *o = text_buffer(L);
  bool ok = write_direct(L, idx, o);
  if (ok)
    lua_pushlstring(L, o->p ? o->p : "", o->len);
  if (o->cap > TEXT_BUFFER_KEPT) {
    free(o->p);
    memset(o, 0, sizeof *o);
  }
  return ok;
}

char *berth_json_encode_alloc(lua_State *L, int idx, size_t *len)
{
  idx = lua_absindex(L, idx);
  plm_json_out o = {0};
  if (write_direct(L, idx, &o)) {
    plm_json_put_raw(&o, "", 1);           /* the NUL */
    if (!o.failed) {
      *len = o.len - 1;
      return o.p;
    }
  }
  free(o.p);                    /* nothing raised while o.p was held: the walk runs no Lua */
  json_t *v = berth_json_check(L, idx);   /* raises where the value has no JSON form */
  char *text = plm_json_write(v, len);
  json_decref(v);
  if (!text)
    luaL_error(L, "not enough memory");
  return text;
}

/* }====================================================== */

/* {====================================================== Lua -> nothing */

/* Whether the tree path converts a value, found without building anything: a model
 * call checks its whole request this way (the scripted model then reads only a few
 * fields).  It answers true only for what add_value converts; where it answers false
 * the caller runs the tree path, which raises with the path and the words, so those
 * stay in one place.  Raw accesses only, as the text walk. */
typedef struct cwalk {
  const void *array_mt, *object_mt;
  lua_Integer length;           /* the root's, when it is an array; else -1 */
} cwalk;

static bool check_value(lua_State *L, cwalk *w, int idx, int depth);

/* Entries from..n of the array at idx, each checked one level below `depth`. */
static bool check_entries(lua_State *L, cwalk *w, int idx, lua_Integer from, lua_Integer n,
                          int depth)
{
  for (lua_Integer i = from; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    bool ok = check_value(L, w, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
    if (!ok)
      return false;
  }
  return true;
}

/* One traversal a table: the keys are classified (as classify does) while the values
 * are checked, where a first pass over the keys and a second over the values cost a
 * history's walk half again as much. */
static bool check_table(lua_State *L, cwalk *w, int idx, int depth)
{
  if (depth + 1 >= MAX_DEPTH || !lua_checkstack(L, 4))
    return false;               /* too deep, or a cycle: the tree path names it */
  const void *mt = NULL;
  if (lua_getmetatable(L, idx)) {
    mt = lua_topointer(L, -1);
    lua_pop(L, 1);
  }
  if (mt && mt == w->array_mt) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    if (depth == 0)
      w->length = n;
    return check_entries(L, w, idx, 1, n, depth);
  }
  int base = lua_gettop(L);
  lua_pushnil(L);
  if (!lua_next(L, idx))
    return true;                /* {} */
  /* an object when its first key is a string or it is marked one; else an array,
   * whose keys must be exactly 1..n */
  bool object = lua_type(L, -2) == LUA_TSTRING || (mt && mt == w->object_mt);
  lua_Integer count = 0, max = 0;
  do {
    if (object ? lua_type(L, -2) != LUA_TSTRING
               : !lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1)
      goto refused;             /* mixed keys, or keys no JSON value has */
    if (!object) {
      count++;
      if (lua_tointeger(L, -2) > max)
        max = lua_tointeger(L, -2);
    }
    if (!check_value(L, w, lua_gettop(L), depth + 1))
      goto refused;
    lua_pop(L, 1);
  } while (lua_next(L, idx));
  if (object)
    return true;
  if (count != max)
    return false;               /* sparse */
  if (depth == 0)
    w->length = max;
  return true;
refused:
  lua_settop(L, base);
  return false;
}

static bool check_value(lua_State *L, cwalk *w, int idx, int depth)
{
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
    case LUA_TBOOLEAN:
    case LUA_TSTRING:           /* ill-formed UTF-8 is mended, not refused */
      return true;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx))
        return true;
      return !isnan(lua_tonumber(L, idx)) && !isinf(lua_tonumber(L, idx));
    case LUA_TLIGHTUSERDATA:
      return lua_touserdata(L, idx) == &null_tag;
    case LUA_TTABLE:
      return check_table(L, w, idx, depth);
    default:
      return false;
  }
}

bool berth_json_converts(lua_State *L, int idx, lua_Integer *length)
{
  idx = lua_absindex(L, idx);
  cwalk w;
  get_markers(L, &w.array_mt, &w.object_mt);   /* order is not checked */
  w.length = -1;
  bool ok = check_value(L, &w, idx, 0);
  if (length)
    *length = ok ? w.length : -1;
  return ok;
}

bool berth_json_converts_from(lua_State *L, int idx, lua_Integer from, lua_Integer *length)
{
  idx = lua_absindex(L, idx);
  cwalk w;
  get_markers(L, &w.array_mt, &w.object_mt);
  w.length = -1;
  const void *mt = NULL;
  if (from > 1 && lua_type(L, idx) == LUA_TTABLE && lua_getmetatable(L, idx)) {
    mt = lua_topointer(L, -1);
    lua_pop(L, 1);
  }
  lua_Integer n = mt && mt == w.array_mt ? (lua_Integer)lua_rawlen(L, idx) : -1;
  if (n < from - 1 || !lua_checkstack(L, 4))
    return berth_json_converts(L, idx, length);   /* not the array seen before: whole */
  /* the entries check_table would check from `from` on, at the depth it would */
  bool ok = check_entries(L, &w, idx, from, n, 0);
  if (length)
    *length = ok ? n : -1;
  return ok;
}

void berth_json_check_converts(lua_State *L, int idx)
{
  if (!berth_json_converts(L, idx, NULL))
    json_decref(berth_json_check(L, idx));  /* raises where the walk said no */
}

/* }====================================================== */

/* {====================================================== the json module */

static size_t dump_flags(int pretty)
{
  return JSON_ENCODE_ANY | (pretty ? JSON_INDENT(2) : JSON_COMPACT) | JSON_REAL_PRECISION(17);
}

/* Text from a JSON value, pushed; the value is owned by a box while dumping. */
typedef struct dumpbuf { luaL_Buffer *b; } dumpbuf;

static int dump_cb(const char *buf, size_t size, void *data)
{
  dumpbuf *d = data;
  luaL_addlstring(d->b, buf, size);
  return 0;
}

/* A value being encoded and its text: the box frees both if pushing the text raises. */
typedef struct encbox {
  json_t *v;                    /* first, as in every box */
  char *text;
} encbox;

static int encbox_gc(lua_State *L)
{
  encbox *e = lua_touserdata(L, 1);
  json_decref(e->v);
  free(e->text);
  e->v = NULL;
  e->text = NULL;
  return 0;
}

void berth_json_encode(lua_State *L, int idx, int pretty)
{
  idx = lua_absindex(L, idx);
  if (!pretty && berth_json_encode_direct(L, idx))
    return;
  encbox *e = lua_newuserdatauv(L, sizeof *e, 0);
  e->v = NULL;
  e->text = NULL;
  if (luaL_newmetatable(L, "berth.json.encbox")) {
    lua_pushcfunction(L, encbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  e->v = berth_json_check(L, idx);
  if (pretty) {                 /* jansson's indentation */
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    dumpbuf d = {&b};
    json_dump_callback(e->v, dump_cb, &d, dump_flags(pretty));
    luaL_pushresult(&b);
  } else {
    /* The compact form is json_dumps's bytes (reals at 17 digits, as dump_flags asks),
     * written by lib/json_text.h without a callback per token: the store encodes every
     * message and state this way at each turn's end. */
    size_t len;
    e->text = plm_json_write(e->v, &len);
    if (!e->text)
      luaL_error(L, "not enough memory");
    lua_pushlstring(L, e->text, len);
  }
  json_decref(e->v);            /* now, not when the collector gets to the box */
  free(e->text);
  e->v = NULL;
  e->text = NULL;
  lua_remove(L, -2);
}

static int json_encode(lua_State *L)
{
  luaL_checkany(L, 1);
  int pretty = 0;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "pretty");
    pretty = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_settop(L, 1);
  berth_json_encode(L, 1, pretty);
  return 1;
}

static int json_decode(lua_State *L)
{
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  json_error_t e;
  json_t *v = json_loadb(s, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  if (!v) {
    luaL_pushfail(L);
    lua_pushfstring(L, "invalid JSON at line %d, column %d: %s", e.line, e.column, e.text);
    return 2;
  }
  push_owner(L, v);              /* a memory error while pushing must not leak v */
  berth_json_push(L, v);
  return 1;
}

static int json_array_fn(lua_State *L)
{
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  berth_json_setarray(L, 1);
  return 1;
}

static int json_object_fn(lua_State *L)
{
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  berth_json_setobject(L, 1);
  return 1;
}

bool berth_json_isarray(lua_State *L, int idx)
{
  int top = lua_gettop(L);
  bool r = false;
  if (lua_istable(L, idx) && lua_getmetatable(L, idx)) {
    luaL_getmetatable(L, BERTH_JSON_ARRAY_MT);
    r = lua_rawequal(L, -1, -2);
  }
  lua_settop(L, top);
  return r;
}

static int json_isarray(lua_State *L)
{
  lua_pushboolean(L, berth_json_isarray(L, 1));
  return 1;
}

static const luaL_Reg jsonlib[] = {
  {"encode", json_encode},
  {"decode", json_decode},
  {"array", json_array_fn},
  {"object", json_object_fn},
  {"isArray", json_isarray},
  {"null", NULL},
  {NULL, NULL}
};

int luaopen_berth_json(lua_State *L)
{
  luaL_newlib(L, jsonlib);
  berth_json_pushnull(L);
  lua_setfield(L, -2, "null");
  luaL_newmetatable(L, BERTH_JSON_ARRAY_MT);
  lua_pushliteral(L, "json.array");
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
  luaL_newmetatable(L, BERTH_JSON_OBJECT_MT);
  lua_pushliteral(L, "json.object");
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
  if (luaL_newmetatable(L, "berth.json.box")) {
    lua_pushcfunction(L, jbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  return 1;
}

/* }====================================================== */
