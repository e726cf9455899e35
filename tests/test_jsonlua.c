/*
 * test_jsonlua.c — the jansson <-> Lua bridge (runtime/core/jsonlua.c) and the `json`
 * module built on it: integers exact, [] kept apart from {}, nesting, 64-bit and
 * too-big integers, NUL bytes and ill-formed UTF-8, errors that name their path and
 * leak nothing (run under valgrind).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <lauxlib.h>
#include <lualib.h>

#include "json_text.h"
#include "jsonlua.h"

static lua_State *L;

static int setup(void **state)
{
  (void)state;
  L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "json", luaopen_berth_json, 1);
  lua_pop(L, 1);
  return 0;
}

static int teardown(void **state)
{
  (void)state;
  lua_close(L);
  return 0;
}

/* Runs Lua code that asserts; fails the test with Lua's message. */
static void lua_ok(const char *code)
{
  if (luaL_dostring(L, code) != LUA_OK) {
    print_error("%s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
    fail();
  }
}

/* Decodes text through C (json_loads + berth_json_push) and encodes back through C. */
static char *roundtrip_c(const char *text)
{
  json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  assert_non_null(v);
  berth_json_push(L, v);
  json_decref(v);
  json_t *back = berth_json_check(L, -1);
  lua_pop(L, 1);
  char *s = json_dumps(back, JSON_ENCODE_ANY | JSON_COMPACT);
  json_decref(back);
  return s;
}

static void test_integers_stay_integers(void **state)
{
  (void)state;
  json_t *v = json_loads("[1, 9007199254740993, -9223372036854775808, 9223372036854775807, "
                         "1.0, 1.5]", 0, NULL);
  berth_json_push(L, v);
  json_decref(v);
  lua_rawgeti(L, -1, 1);
  assert_true(lua_isinteger(L, -1));
  assert_int_equal(lua_tointeger(L, -1), 1);
  lua_rawgeti(L, -2, 2);
  assert_true(lua_isinteger(L, -1));
  assert_true(lua_tointeger(L, -1) == 9007199254740993LL);
  lua_rawgeti(L, -3, 3);
  assert_true(lua_tointeger(L, -1) == INT64_MIN);
  lua_rawgeti(L, -4, 4);
  assert_true(lua_tointeger(L, -1) == INT64_MAX);
  lua_rawgeti(L, -5, 5);
  assert_false(lua_isinteger(L, -1));   /* 1.0 is a real */
  lua_pop(L, 6);
  char *s = roundtrip_c("[1,9007199254740993,-9223372036854775808,9223372036854775807,1.0,1.5]");
  assert_string_equal(s, "[1,9007199254740993,-9223372036854775808,9223372036854775807,1.0,1.5]");
  free(s);
  lua_ok("assert(json.encode(json.decode('[1]')) == '[1]')\n"
         "assert(math.type(json.decode('[7]')[1]) == 'integer')\n"
         "assert(json.encode({big = 9007199254740993}) == '{\"big\":9007199254740993}')\n"
         "assert(json.encode(1.0) == '1.0' and json.encode(3) == '3')\n"
         "assert(json.decode('1234567890123456789') == 1234567890123456789)\n");
}

static void test_big_integers_refused(void **state)
{
  (void)state;
  lua_ok("local v, err = json.decode('[18446744073709551616]')\n"
         "assert(v == nil and err:find('too big'), err)\n");
}

static void test_empty_array_vs_object(void **state)
{
  (void)state;
  char *s = roundtrip_c("{\"a\":[],\"b\":{},\"c\":[[],{}]}");
  assert_string_equal(s, "{\"a\":[],\"b\":{},\"c\":[[],{}]}");
  free(s);
  lua_ok("assert(json.encode(json.decode('[]')) == '[]')\n"
         "assert(json.encode(json.decode('{}')) == '{}')\n"
         "assert(json.encode({}) == '{}')\n"
         "assert(json.encode(json.array{}) == '[]')\n"
         "assert(json.encode(json.object{}) == '{}')\n"
         "assert(json.isArray(json.decode('[]')) and not json.isArray(json.decode('{}')))\n"
         "assert(json.encode({1, 2, 3}) == '[1,2,3]')\n");
}

static void test_nested_and_nulls(void **state)
{
  (void)state;
  char *s = roundtrip_c("{\"m\":[{\"role\":\"user\",\"content\":\"hi\"},"
                        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}],"
                        "\"n\":[1,null,3]}");
  /* a null member is left out; a null element keeps its place */
  assert_string_equal(s, "{\"m\":[{\"content\":\"hi\",\"role\":\"user\"},"
                         "{\"role\":\"assistant\",\"tool_calls\":[]}],\"n\":[1,null,3]}");
  free(s);
  lua_ok("local v = json.decode('{\"a\":null,\"b\":[null]}')\n"
         "assert(v.a == nil and v.b[1] == json.null and #v.b == 1)\n"
         "assert(json.encode({a = {b = {c = {1, {d = 'x'}}}}}) == "
         "'{\"a\":{\"b\":{\"c\":[1,{\"d\":\"x\"}]}}}')\n");
}

static void test_nul_bytes_and_utf8(void **state)
{
  (void)state;
  lua_ok("local s = json.decode('\"a\\\\u0000b\"')\n"
         "assert(#s == 3 and s:byte(2) == 0)\n"
         "assert(json.encode('a\\0b') == '\"a\\\\u0000b\"')\n"
         "assert(json.encode({['k\\0ey'] = 1}) == '{\"k\\\\u0000ey\":1}')\n"
         /* ill-formed UTF-8 becomes U+FFFD, so the text stays valid JSON */
         "assert(json.encode('a\\xffb') == '\"a\\u{FFFD}b\"')\n"
         "assert(json.encode('\\xed\\xa0\\x80') == '\"\\u{FFFD}\\u{FFFD}\\u{FFFD}\"')\n"
         "assert(json.encode('h\\u{e9}') == '\"h\\u{e9}\"')\n"
         /* ...in a key too (jansson's json_object_setn_new frees the value it was
          * given when the key is ill-formed: the key is checked before) */
         "assert(json.encode({['k\\xff'] = {1}}) == '{\"k\\u{FFFD}\":[1]}')\n");
}

static void test_errors_name_the_path(void **state)
{
  (void)state;
  lua_ok("local ok, err = pcall(json.encode, {messages = {{content = print}}})\n"
         "assert(not ok and err:find('$.messages[1].content', 1, true), err)\n"
         "ok, err = pcall(json.encode, {[1] = 1, [3] = 3})\n"
         "assert(not ok and err:find('sparse'), err)\n"
         "ok, err = pcall(json.encode, {1, x = 2})\n"
         "assert(not ok and err:find('mixed'), err)\n"
         /* the same words whichever key comes first, in a small table or a large one */
         "for _, n in ipairs{1, 3, 12} do\n"
         "  for _, bad in ipairs{7, true, 2.5} do\n"
         "    local t = {[bad] = 1}\n"
         "    for i = 1, n do t['k' .. i] = i end\n"
         "    ok, err = pcall(json.encode, {m = t})\n"
         "    assert(not ok and err:find('mixed or sparse keys', 1, true) and\n"
         "           err:find('JSON at $.m', 1, true), err)\n"
         "  end\n"
         "end\n"
         "ok, err = pcall(json.encode, json.object{[2] = 1})\n"
         "assert(not ok and err:find('keys are not all strings'), err)\n"
         "local t = {} t.self = t\n"
         "ok, err = pcall(json.encode, t)\n"
         "assert(not ok and err:find('contains itself'), err)\n"
         "ok, err = pcall(json.encode, {x = 0/0})\n"
         "assert(not ok and err:find('NaN'), err)\n"
         "ok, err = pcall(json.encode, {x = math.huge})\n"
         "assert(not ok and err:find('infinit'), err)\n"
         "local v, msg = json.decode('{\"a\":')\n"
         "assert(v == nil and msg:find('invalid JSON'), msg)\n");
}

static void test_key_order(void **state)
{
  (void)state;
  lua_ok("assert(json.encode({b = 1, a = 2, c = 3}) == '{\"a\":2,\"b\":1,\"c\":3}')\n"
         "local t = setmetatable({z = 1, a = 2, m = 3}, {__jsonorder = {'z', 'm'}})\n"
         "assert(json.encode(t) == '{\"z\":1,\"m\":3,\"a\":2}')\n"
         /* 8 keys and fewer are sorted on the stack, more through a key list: both
          * in byte order, nested values in place, __jsonorder first */
         "for _, n in ipairs{1, 7, 8, 9, 40} do\n"
         "  local t, want = {}, {}\n"
         "  for i = 1, n do t[string.format('k%03d', n - i)] = {v = i} end\n"
         "  for i = 0, n - 1 do want[#want + 1] = string.format('\"k%03d\":{\"v\":%d}', i, n - i) end\n"
         "  assert(json.encode(t) == '{' .. table.concat(want, ',') .. '}', n)\n"
         "  setmetatable(t, {__jsonorder = {string.format('k%03d', n - 1)}})\n"
         "  table.insert(want, 1, table.remove(want))\n"
         "  assert(json.encode(t) == '{' .. table.concat(want, ',') .. '}', n)\n"
         "end\n"
         "assert(not pcall(json.encode, {a = 1, b = 2, [3] = 3}))\n"
         "local big = {}\n"
         "for i = 1, 20 do big['k' .. i] = i end\n"
         "big[true] = 1\n"
         "assert(not pcall(json.encode, big))\n");
}

static void test_deep_nesting_refused(void **state)
{
  (void)state;
  lua_ok("local t = {} local c = t for i = 1, 600 do c[1] = {} c = c[1] end\n"
         "local ok, err = pcall(json.encode, t)\n"
         "assert(not ok and err:find('nested too deeply'), err)\n"
         "local function chain(n)\n"
         "  local t = {} local c = t for i = 1, n - 1 do c[1] = {} c = c[1] end\n"
         "  return t\n"
         "end\n"
         "assert(json.encode(chain(511)) == ('['):rep(510) .. '{}' .. (']'):rep(510))\n"
         "ok, err = pcall(json.encode, chain(512))\n"
         "assert(not ok and err:find('nested too deeply'), err)\n");
}

static void test_floats_round_trip_exactly(void **state)
{
  (void)state;
  lua_ok("for _, x in ipairs{0.1, 1/3, 1e300, -2.5e-300, 123456.789} do\n"
         "  assert(json.decode(json.encode(x)) == x, x)\n"
         "end\n");
}

/* The text of the value on top through the jansson tree (what berth_json_encode did
 * for every value before the direct path), malloc'd. */
static char *tree_text(void)
{
  json_t *v = berth_json_check(L, -1);
  char *text = plm_json_write(v, NULL);
  json_decref(v);
  assert_non_null(text);
  return text;
}

/* For each value of the list the chunk returns: the direct path takes it (or gives
 * up, as `direct` says) and json.encode gives the tree's bytes either way. */
static void same_text(const char *chunk, bool direct)
{
  if (luaL_dostring(L, chunk) != LUA_OK)
    fail_msg("%s", lua_tostring(L, -1));
  int list = lua_gettop(L);
  lua_Integer n = luaL_len(L, list);
  assert_true(n > 0);
  lua_getglobal(L, "json");
  lua_getfield(L, -1, "encode");
  int encode = lua_gettop(L);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, list, i);
    char *want = tree_text();
    int top = lua_gettop(L);
    if (!berth_json_converts(L, -1, NULL))  /* what model.chat checks a request with */
      fail_msg("value %lld: the check says no to what converts: %.300s", (long long)i, want);
    assert_int_equal(lua_gettop(L), top);
    bool took = berth_json_encode_direct(L, -1);
    if (took != direct)
      fail_msg("value %lld: the direct path %s it (tree text %.300s)", (long long)i,
               took ? "took" : "gave up on", want);
    if (took) {
      assert_int_equal(lua_gettop(L), top + 1);
      size_t len;
      const char *got = lua_tolstring(L, -1, &len);
      if (len != strlen(want) || memcmp(got, want, len) != 0)
        fail_msg("value %lld: direct %.300s\n  tree %.300s", (long long)i, got, want);
      lua_pop(L, 1);
    }
    assert_int_equal(lua_gettop(L), top);
    size_t alen;                        /* the malloc'd text, outside the heap: the same */
    char *alloc = berth_json_encode_alloc(L, -1, &alen);
    assert_int_equal(lua_gettop(L), top);
    if (alen != strlen(want) || strcmp(alloc, want) != 0)
      fail_msg("value %lld: alloc %.300s\n  tree %.300s", (long long)i, alloc, want);
    free(alloc);
    lua_pushvalue(L, encode);
    lua_pushvalue(L, -2);
    lua_call(L, 1, 1);
    assert_string_equal(lua_tostring(L, -1), want);
    lua_pop(L, 2);
    free(want);
  }
  lua_settop(L, list - 1);
}

/* A turn's messages and state are written straight from their tables, in the bytes
 * the tree gives; the values only the tree writes are left to it. */
static void test_direct_text_is_the_tree_text(void **state)
{
  (void)state;
  same_text("return {\n"
            "  'plain', '', 'quote \" back \\\\ slash', 'controls \\0 \\1 \\b\\f\\n\\r\\t \\31 \\127',\n"
            "  'unicode é € 😀', string.rep('x', 100000), 0, -1, math.maxinteger, math.mininteger,\n"
            "  true, false, json.null, {}, json.array{}, json.object{}, json.array{1, 2},\n"
            "  {role = 'user', content = 'hi'}, {1, 'two', {3}, {four = 4}},\n"
            "  {a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8},\n"
            "  {['b'] = 1, ['a'] = 2, ['ab'] = 3, ['\\0k'] = 4, ['k\"'] = 5, [''] = 6},\n"
            "  {messages = {{role = 'system', content = 'be brief'}, {role = 'assistant',\n"
            "    tool_calls = json.array{{id = 'c1', type = 'function',\n"
            "      ['function'] = {name = 'executeCode', arguments = '{\"code\":\"1\"}'}}}}}},\n"
            "  json.object{x = json.array{json.null, json.null}}, {[1] = json.null, [2] = false},\n"
            "  0.5, 1.0, -0.0, 1e300, -1e-300, 5e-324, 1e17, 1e16, 123456789.125, 0.1, 2^53,\n"
            "  math.pi, 1 / 3, -2.5e-7, {x = 0.25}, {json.array{1.5}},\n"
            "}", true);
  /* Objects of up to TEXT_OBJECT_MOST keys, and the order a metatable's __jsonorder
   * gives (an executeCode result's), as fill_object writes them: the named keys
   * first, each once, then the others in byte order; a metatable without one, or
   * with one that is not a table, orders nothing; keys that are not strings make an
   * array there too. */
  same_text("local function keys(n) local t = {} for i = 1, n do t['k' .. i] = i end return t end\n"
            "local order = {__jsonorder = {'stdout', 'language', 'stdout', 7, 'absent', 'exitCode'}}\n"
            "return {\n"
            "  {a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8, i = 9}, keys(32),\n"
            "  setmetatable({b = 1, a = 2}, {__jsonorder = {'b'}}), setmetatable({}, {}),\n"
            "  setmetatable({language = 'python', exitCode = 0, stdout = 'x', stderr = '',\n"
            "    timedOut = false, z = {1.5}, a = json.null}, order),\n"
            "  setmetatable(keys(20), {__jsonorder = {'k20', 'k3', 'k10'}}),\n"
            "  setmetatable({b = 1, a = 2}, {__jsonorder = 'b'}),\n"
            "  setmetatable({b = 1, a = 2}, {__index = {}}), setmetatable({10, 20}, order),\n"
            "  setmetatable({}, order), {nested = setmetatable({y = 1, x = 2}, {__jsonorder = {'y'}})},\n"
            "  setmetatable(json.object{b = 1, a = 2}, nil), json.object(keys(9)),\n"
            "}", true);
  /* json.object's own order, when a script gives its metatable one (undone after) */
  same_text("getmetatable(json.object{}).__jsonorder = {'c', 'b'}\n"
            "return {json.object{a = 1, b = 2, c = 3}, json.object{}, {c = 1, a = 2}}", true);
  lua_ok("getmetatable(json.object{}).__jsonorder = nil\n"
         "assert(json.encode(json.object{b = 1, a = 2}) == '{\"a\":2,\"b\":1}')\n");
  same_text("local function keys(n) local t = {} for i = 1, n do t['k' .. i] = i end return t end\n"
            "return {\n"
            "  'bad \\255 utf8', {['\\255'] = 1}, keys(33),\n"
            "  setmetatable({b = 1, a = 2}, setmetatable({__jsonorder = {'a'}}, {})),\n"
            "  setmetatable({x = '\\255'}, {__jsonorder = {'x'}}),\n"
            "}", false);
  /* What the tree refuses, the direct path gives up on, and json.encode raises. */
  lua_ok("local t = {} t.self = t\n"
         "for _, v in ipairs{t, {1, nil, 3}, {[1] = 1, x = 2}, {f = print}, {0/0}} do\n"
         "  assert(not pcall(json.encode, v))\n"
         "end\n");
}

/* Many random plain values, nested: each written directly, in the tree's bytes. */
static void test_direct_text_matches_the_tree_on_random_values(void **state)
{
  (void)state;
  same_text("math.randomseed(15)\n"
            "local pieces = {'a', 'é', '😀', '\"', '\\\\', '\\n', '\\0', '\\31', ' ', 'zz', '/'}\n"
            "local function str()\n"
            "  local t = {}\n"
            "  for i = 1, math.random(0, 6) do t[i] = pieces[math.random(#pieces)] end\n"
            "  return table.concat(t)\n"
            "end\n"
            "local function value(depth)\n"
            "  local k = math.random(depth > 3 and 5 or 8)\n"
            "  if k == 1 then return str()\n"
            "  elseif k == 2 then return math.random(math.mininteger, math.maxinteger)\n"
            "  elseif k == 3 then\n"
            "    if math.random(2) == 1 then return math.random(-3, 3) end\n"
            "    return (math.random() - 0.5) * 10.0 ^ math.random(-320, 308)\n"
            "  elseif k == 4 then return math.random(2) == 1\n"
            "  elseif k == 5 then return json.null\n"
            "  elseif k == 6 then\n"
            "    local a = math.random(2) == 1 and json.array{} or {}\n"
            "    for i = 1, math.random(0, 4) do a[i] = value(depth + 1) end\n"
            "    return a\n"
            "  else\n"
            "    local o = k == 7 and {} or json.object{}\n"
            "    for _ = 1, math.random(0, 8) do o[str() .. 'k'] = value(depth + 1) end\n"
            "    return o\n"
            "  end\n"
            "end\n"
            "local list = {}\n"
            "for i = 1, 3000 do list[i] = value(0) end\n"
            "return list\n", true);
}

/* Under pcall: converts the value at 1 by the tree path (raising where it does). */
static int tree_converts(lua_State *S)
{
  json_decref(berth_json_check(S, 1));
  return 0;
}

/* For each value of the list the chunk returns, the check that builds nothing says
 * yes exactly where the tree path converts, and berth_json_check_converts raises the
 * tree path's own error.  Returns how many the tree refused. */
static int check_agrees(const char *chunk)
{
  if (luaL_dostring(L, chunk) != LUA_OK)
    fail_msg("%s", lua_tostring(L, -1));
  int list = lua_gettop(L), refused = 0;
  lua_Integer n = luaL_len(L, list);
  assert_true(n > 0);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, list, i);
    int top = lua_gettop(L);
    bool says = berth_json_converts(L, -1, NULL);
    assert_int_equal(lua_gettop(L), top);
    lua_pushcfunction(L, tree_converts);
    lua_pushvalue(L, -2);
    bool converts = lua_pcall(L, 1, 0, 0) == LUA_OK;
    if (says != converts)
      fail_msg("value %lld: the check says %s, the tree path %s%s", (long long)i,
               says ? "yes" : "no", converts ? "converts it" : "raises: ",
               converts ? "" : lua_tostring(L, -1));
    if (!converts) {
      refused++;
      char *want = strdup(lua_tostring(L, -1));
      lua_pop(L, 1);
      lua_getglobal(L, "check_converts");
      lua_pushvalue(L, top);
      assert_int_not_equal(lua_pcall(L, 1, 0, 0), LUA_OK);
      assert_string_equal(lua_tostring(L, -1), want);
      free(want);
      lua_pop(L, 1);
    }
    lua_settop(L, top - 1);
  }
  lua_settop(L, list - 1);
  return refused;
}

static int l_check_converts(lua_State *S)
{
  berth_json_check_converts(S, 1);
  return 0;
}

/* model.chat checks a whole request with a walk that builds nothing: it must refuse
 * exactly what the tree path refuses, near the depth limit and in cycles too. */
static void test_check_agrees_with_the_tree(void **state)
{
  (void)state;
  lua_register(L, "check_converts", l_check_converts);
  int refused = check_agrees(
    "local cyc = {} cyc.self = cyc\n"
    "local acyc = {} acyc[1] = {acyc}\n"
    "local function chain(n)\n"
    "  local t = {} local c = t for i = 1, n - 1 do c[1] = {} c = c[1] end\n"
    "  return t\n"
    "end\n"
    "local big = {} for i = 1, 20 do big['k' .. i] = i end big[true] = 1\n"
    "return {\n"
    "  cyc, acyc, chain(511), chain(512), chain(600), {f = print}, {0/0}, {x = math.huge},\n"
    "  {-math.huge}, {1, nil, 3}, {[1] = 1, x = 2}, {x = 2, [1] = 1}, json.object{[2] = 1},\n"
    "  json.object{a = 1, [2] = 1}, json.array{1, print}, big, {[2.5] = 1}, coroutine.create(print),\n"
    "  io.stdout, setmetatable({1, 2}, {}), setmetatable({a = 1}, {__index = error}),\n"
    "  json.array{json.null, nil, 3}, json.object{}, {x = 1.5}, 'bad \\255', {['\\255'] = 1},\n"
    "  setmetatable({b = 1, a = {print}}, {__jsonorder = {'b'}}), {messages = {{content = {}}}},\n"
    "}\n");
  assert_int_equal(refused, 19);
  refused = check_agrees(
    "math.randomseed(16)\n"
    "local bad = {print, 0/0, math.huge, coroutine.create(print)}\n"
    "local function value(depth)\n"
    "  local k = math.random(depth > 3 and 6 or 10)\n"
    "  if k <= 4 then return ({'s', 7, 2.5, true})[k]\n"
    "  elseif k == 5 then return json.null\n"
    "  elseif k == 6 then return math.random(60) == 1 and bad[math.random(#bad)] or 'x'\n"
    "  elseif k == 7 then\n"
    "    local a = math.random(2) == 1 and json.array{} or {}\n"
    "    for i = 1, math.random(0, 4) do a[i] = value(depth + 1) end\n"
    "    if math.random(40) == 1 then a[#a + 2] = 1 end\n"
    "    return a\n"
    "  elseif k == 8 then\n"
    "    local o = {}\n"
    "    for i = 1, math.random(0, 10) do o['k' .. i] = value(depth + 1) end\n"
    "    if math.random(40) == 1 then o[1] = 1 end\n"
    "    return o\n"
    "  else\n"
    "    local o = json.object{}\n"
    "    for i = 1, math.random(0, 3) do o['k' .. i] = value(depth + 1) end\n"
    "    if math.random(40) == 1 then o[math.random(3)] = 1 end\n"
    "    return o\n"
    "  end\n"
    "end\n"
    "local list = {}\n"
    "for i = 1, 3000 do list[i] = value(0) end\n"
    "return list\n");
  assert_true(refused > 100 && refused < 2900);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_integers_stay_integers),
    cmocka_unit_test(test_big_integers_refused),
    cmocka_unit_test(test_empty_array_vs_object),
    cmocka_unit_test(test_nested_and_nulls),
    cmocka_unit_test(test_nul_bytes_and_utf8),
    cmocka_unit_test(test_errors_name_the_path),
    cmocka_unit_test(test_key_order),
    cmocka_unit_test(test_deep_nesting_refused),
    cmocka_unit_test(test_floats_round_trip_exactly),
    cmocka_unit_test(test_direct_text_is_the_tree_text),
    cmocka_unit_test(test_direct_text_matches_the_tree_on_random_values),
    cmocka_unit_test(test_check_agrees_with_the_tree),
  };
  return cmocka_run_group_tests_name("jsonlua", tests, setup, teardown);
}
