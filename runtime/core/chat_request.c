/*
 * chat_request.c — model.chat's request, read from the Lua tables (chat_request.h).
 *
 * The readers run inside an adapter's chat(), a C call from l_chat: they must not
 * raise (an adapter's frames hold memory of their own) nor run script code (no
 * metamethods: raw accesses only).  A string field is found by a raw lookup of a name
 * pushed beforehand, or by walking the message's keys: neither allocates.  What
 * allocates (a tree, a text) runs under lua_pcall, its arguments pushed without
 * allocating (a light C function, light userdata, values already on the stack), so a
 * memory error comes back as NULL.
 */
#include "chat_request.h"
#include "jsonlua.h"

#include <lauxlib.h>

#include <stdlib.h>
#include <string.h>

static long r_count(const berth_model_request *base)
{
  return ((const berth_chat_request *)base)->count;
}

/* Pushes message i; false (nothing pushed) when the stack cannot grow. */
static bool push_message(const berth_chat_request *r, size_t i)
{
  if (!lua_checkstack(r->L, 4))
    return false;
  lua_rawgeti(r->L, r->messages, (lua_Integer)i + 1);
  return true;
}

/* The field names adapters read most, pushed by berth_chat_request_init: a message's
 * field is then one raw lookup of the interned name (lua_rawget allocates nothing),
 * where another name walks the message's keys.  The scripted model reads the role of
 * every message at every call: the walk was 10 % of a scripted turn. */
static const char *const known_names[] = {"role", "content", "tool_call_id", "name"};
#define N_KNOWN_NAMES ((int)(sizeof known_names / sizeof *known_names))

static int known_name(const char *name)
{
  for (int k = 0; k < N_KNOWN_NAMES; k++)
    if (strcmp(name, known_names[k]) == 0)
      return k;
  return -1;
}

static const char *r_string(const berth_model_request *base, size_t i, const char *name,
                            size_t *len)
{
  const berth_chat_request *r = (const berth_chat_request *)base;
  lua_State *L = r->L;
  if (!push_message(r, i))
    return NULL;
  if (lua_type(L, -1) != LUA_TTABLE) {
    lua_pop(L, 1);
    return NULL;
  }
  const char *s = NULL;
  int k = known_name(name);
  if (k >= 0) {
    lua_pushvalue(L, r->names + k);
    if (lua_rawget(L, -2) == LUA_TSTRING)
      s = lua_tolstring(L, -1, len);  /* anchored by the message, which the messages
                                         on the stack anchor */
    lua_pop(L, 1);
  } else {
    size_t nlen = strlen(name);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      size_t klen;
      const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : NULL;
      if (key && klen == nlen && memcmp(key, name, nlen) == 0) {
        if (lua_type(L, -1) == LUA_TSTRING)
          s = lua_tolstring(L, -1, len);
        lua_pop(L, 2);
        break;
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  return s;
}

typedef struct convert_args {
  size_t i;
  const char *name;
  json_t *out;
} convert_args;

/* Under lua_pcall: 1 the messages, 2 the arguments. */
static int convert_field(lua_State *L)
{
  convert_args *a = lua_touserdata(L, 2);
  if (lua_rawgeti(L, 1, (lua_Integer)a->i + 1) != LUA_TTABLE)
    return 0;
  lua_pushstring(L, a->name);
  if (lua_rawget(L, -2) != LUA_TNIL)
    a->out = berth_json_check(L, -1);
  return 0;
}

static const json_t *r_value(const berth_model_request *base, size_t i, const char *name)
{
  berth_chat_request *r = (berth_chat_request *)base;   /* keeps what it converts */
  lua_State *L = r->L;
  if (r->n_values == r->cap_values) {
    size_t cap = r->cap_values ? 2 * r->cap_values : 4;
    json_t **v = realloc(r->values, cap * sizeof *v);
    if (!v)
      return NULL;
    r->values = v;
    r->cap_values = cap;
  }
  if (!lua_checkstack(L, 4))
    return NULL;
  convert_args a = {i, name, NULL};
  lua_pushcfunction(L, convert_field);
  lua_pushvalue(L, r->messages);
  lua_pushlightuserdata(L, &a);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    lua_pop(L, 1);              /* the error: memory ran out */
    return NULL;
  }
  if (a.out)
    r->values[r->n_values++] = a.out;
  return a.out;
}

/* Under lua_pcall: 1 the value, 2 where its text goes.  The text is malloc'd, outside
 * the Lua heap: a long history must not count twice against the memory cap. */
static int encode_part(lua_State *L)
{
  size_t *len = lua_touserdata(L, 2);
  char *text = berth_json_encode_alloc(L, 1, len);
  lua_pushlightuserdata(L, text);
  return 1;
}

static int r_text(const berth_model_request *base, int k, const char **text, size_t *len)
{
  berth_chat_request *r = (berth_chat_request *)base;   /* keeps each text it writes */
  lua_State *L = r->L;
  int slot = k == BERTH_PART_MESSAGES ? r->messages : r->tools;
  if (!slot)
    return 0;
  if (!r->text[k]) {
    if (!lua_checkstack(L, 4))
      return -1;
    lua_pushcfunction(L, encode_part);
    lua_pushvalue(L, slot);
    lua_pushlightuserdata(L, &r->text_len[k]);
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
      lua_pop(L, 1);
      return -1;
    }
    r->text[k] = lua_touserdata(L, -1);
    lua_pop(L, 1);
  }
  *text = r->text[k];
  *len = r->text_len[k];
  return 0;
}

/* {------ what earlier calls checked
 * A history is an array that grows by appending, and walking all of it at every call
 * (twice a turn) was a sixth of berth serve's main thread at 30 turns a
 * conversation, growing with every turn.  So the state keeps, in a table with weak
 * keys, how many entries of each array with the marker a call found to convert; a
 * later call with the same array walks only the entries appended since.  That is the
 * store's rule for ctx.messages (runtime/README.md): an entry changed in place after
 * a call saw it is not read again.  Such an entry reaches the adapter, whose reader
 * of it fails (the call fails: nil, message, code) where model.chat would have
 * raised.  The keys are the arrays themselves, so an entry goes with its array and
 * holds nothing alive: not a conversation unloaded, nor an array a hook built for one
 * call.
 *
 * The same pass counts the user messages among the messages it walks (the user
 * turns: berth_request_user_turns, model.h), kept in the same entry: the scripted
 * model finds its place in its script from that count, and reading every message's
 * role at every call was a tenth of berth serve's main thread at 40 turns a
 * conversation.  One integer holds the three: the entries checked, the user messages
 * among them and the last one's index, MEMO_BITS each; an array of more entries than
 * that holds is walked whole at every call. */
static const char checked_key = 0;

#define MEMO_BITS 21
#define MEMO_MASK (((lua_Integer)1 << MEMO_BITS) - 1)

/* Pushes the table of what was checked, made on first use. */
static void push_checked(lua_State *L)
{
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &checked_key) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &checked_key);
}

/* Adds the user messages among entries from..n of the array at `idx` (absolute) to
 * *users, and the last one's index (from 1) to *last. */
static void count_users(lua_State *L, int idx, lua_Integer from, lua_Integer n,
                        lua_Integer *users, lua_Integer *last)
{
  lua_pushliteral(L, "role");
  int role = lua_gettop(L);
  for (lua_Integer i = from; i <= n; i++) {
    if (lua_rawgeti(L, idx, i) == LUA_TTABLE) {
      size_t len;
      lua_pushvalue(L, role);
      const char *s = lua_rawget(L, -2) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
      if (s && len == 4 && memcmp(s, "user", 4) == 0) {
        (*users)++;
        *last = i;
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* Whether the part at `idx` converts, walking only what no earlier call walked of
 * it; *length as berth_json_converts's.  With `r` (the messages), counts their user
 * messages into r.  Raises only when memory runs out. */
static bool part_converts(lua_State *L, int idx, lua_Integer *length, berth_chat_request *r)
{
  luaL_checkstack(L, 5, "model.chat");
  push_checked(L);
  int checked = lua_gettop(L);
  lua_pushvalue(L, idx);
  lua_Integer was = lua_rawget(L, checked) == LUA_TNUMBER ? lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  lua_Integer seen = was & MEMO_MASK, users = (was >> MEMO_BITS) & MEMO_MASK,
              last = (was >> 2 * MEMO_BITS) & MEMO_MASK;
  lua_Integer n;
  bool ok = seen > 0 ? berth_json_converts_from(L, idx, seen + 1, &n)
                     : berth_json_converts(L, idx, &n);
  if (ok && r && n >= 0) {
    /* taken up where the check takes up (berth_json_converts_from): an array with
     * the marker, at least as long as it was */
    bool on = seen > 0 && n >= seen && berth_json_isarray(L, idx);
    if (!on)
      users = last = 0;
    count_users(L, idx, on ? seen + 1 : 1, n, &users, &last);
    r->users = (size_t)users;
    r->last_user = last > 0 ? (size_t)last - 1 : 0;
  }
  /* n is the number of entries only for an array (taken up again only with the
   * marker); an array that shrank is known to its length */
  lua_Integer now = n > 0 && n <= MEMO_MASK ? n | users << MEMO_BITS | last << 2 * MEMO_BITS : 0;
  if (ok && now != was && lua_type(L, idx) == LUA_TTABLE) {
    lua_pushvalue(L, idx);
    if (now)
      lua_pushinteger(L, now);
    else
      lua_pushnil(L);
    lua_rawset(L, checked);
  }
  lua_settop(L, checked - 1);
  if (length)
    *length = n;
  return ok;
}

/* ------} */

/* Asked only of messages that are an array (berth_request_user_turns), which init
 * counted. */
static bool r_user_turns(const berth_model_request *base, size_t *count, size_t *last)
{
  const berth_chat_request *r = (const berth_chat_request *)base;
  *count = r->users;
  *last = r->last_user;
  return true;
}

static const berth_request_ops chat_request_ops = {r_count, r_string, r_value, r_text,
                                                   r_user_turns, NULL};

void berth_chat_request_init(berth_chat_request *r, lua_State *L, int messages, int tools)
{
  memset(r, 0, sizeof *r);
  r->base.ops = &chat_request_ops;
  r->L = L;
  r->messages = lua_absindex(L, messages);
  r->tools = tools ? lua_absindex(L, tools) : 0;
  lua_Integer count;            /* what the check found messages to be: an array's length */
  if (!part_converts(L, r->messages, &count, r) ||
      (r->tools && !part_converts(L, r->tools, NULL, NULL))) {
    /* The error names its path from the request, as it always has. */
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, r->messages);
    lua_setfield(L, -2, "messages");
    if (r->tools) {
      lua_pushvalue(L, r->tools);
      lua_setfield(L, -2, "tools");
    }
    berth_json_check_converts(L, -1);
    lua_pop(L, 1);
  }
  r->count = (long)count;
  r->names = lua_gettop(L) + 1;
  luaL_checkstack(L, N_KNOWN_NAMES, "model.chat");
  for (int k = 0; k < N_KNOWN_NAMES; k++)
    lua_pushstring(L, known_names[k]);
}

void berth_chat_request_done(berth_chat_request *r)
{
  for (size_t i = 0; i < r->n_values; i++)
    json_decref(r->values[i]);
  free(r->values);
  r->values = NULL;
  for (int k = 0; k < BERTH_PARTS; k++) {
    free(r->text[k]);
    r->text[k] = NULL;
  }
  r->n_values = r->cap_values = 0;
}
