/*
 * jsonlua.h — JSON values between jansson and Lua, converted directly in C.
 *
 * Every value that crosses the native boundary (tool results, model messages, tool
 * call arguments, events) goes through here, never through lua-cjson, because Debian's
 * lua-cjson 2.1.0 turns 1 into 1.0, mangles 64-bit integers and cannot tell [] from {}.
 *
 * Rules (also the rules of the `json` module scripts get):
 *   - JSON integers become lua_Integer exactly; reals become lua_Number.  Lua integers
 *     encode as JSON integers, floats as reals (1.0 stays 1.0); NaN and infinities
 *     have no JSON form and raise an error.
 *   - A decoded array is a table with the array marker (json.array's metatable), so []
 *     encodes back as [].  A null array element decodes to json.null, keeping the
 *     positions; a null object member is left out (so `msg.content` is nil, not a
 *     truthy sentinel).
 *   - A table without a marker encodes as an array when its keys are exactly 1..n
 *     (n >= 1), as an object when every key is a string, and as {} when empty.
 *     Mixed or sparse keys raise an error naming the path ($.messages[2].content).
 *   - A metatable field __jsonorder (an array of key names) fixes the order of those
 *     keys; other keys follow in byte order, so encoding is deterministic.
 *   - Strings may hold NUL bytes (decoded with JSON_ALLOW_NUL, encoded as \u0000).
 *     Ill-formed UTF-8 in a Lua string is replaced by U+FFFD when encoded.
 */
#ifndef BERTH_JSONLUA_H
#define BERTH_JSONLUA_H

#include <jansson.h>
#include <lua.h>
#include <stdbool.h>

/* Registry / metatable names. */
#define BERTH_JSON_ARRAY_MT "berth.json.array"
#define BERTH_JSON_OBJECT_MT "berth.json.object"

/* Pushes `v` (borrowed) onto L's stack.  Raises only on memory errors. */
void berth_json_push(lua_State *L, const json_t *v);
/* Converts the value at `idx` into a new JSON reference.  Raises a Lua error naming
 * the path on values that have no JSON form (functions, cycles, sparse tables, NaN).
 * Nothing leaks when it raises: the partial value is owned by a collectable box. */
json_t *berth_json_check(lua_State *L, int idx);
/* The same, but the value stays owned by a box left on the stack (collected with
 * it): the returned value is borrowed for as long as that slot lives. */
const json_t *berth_json_check_boxed(lua_State *L, int idx);
/* Drops the value a box (from berth_json_check_boxed, at `idx`) owns, now rather than
 * when the GC gets to the box: boxed JSON lives outside Lua's memory accounting, so
 * the GC does not feel it, and a box has a finalizer, so it is freed only in the
 * cycle after the one that found it garbage.  The value must not be used after. */
void berth_json_box_free(lua_State *L, int idx);
/* Whether the value at `idx` is a table with the array marker (json.isArray). */
bool berth_json_isarray(lua_State *L, int idx);
/* Sets the array (or object) marker on the table at `idx`. */
void berth_json_setarray(lua_State *L, int idx);
void berth_json_setobject(lua_State *L, int idx);
/* Pushes json.null. */
void berth_json_pushnull(lua_State *L);
/* Encodes the value at `idx` as compact JSON text, pushed as a Lua string. */
void berth_json_encode(lua_State *L, int idx, int pretty);
/* What berth_json_encode tries first for compact text: the text written straight from
 * the tables, with no jansson tree, pushed, and true.  False, with nothing pushed, for
 * a value only the tree path writes (ill-formed UTF-8, a metatable that has a
 * metatable, an object of more than 32 keys) or refuses.  Objects ordered by their
 * metatable's __jsonorder are written here, in that order.  The bytes are the tree
 * path's; it raises only when memory runs out. */
bool berth_json_encode_direct(lua_State *L, int idx);
/* The same bytes as berth_json_encode (compact), but malloc'd and NUL-terminated, its
 * length in *len, made outside the Lua heap (a model call's history is sent this way:
 * it must not count twice against the memory cap).  Raises as berth_json_encode. */
char *berth_json_encode_alloc(lua_State *L, int idx, size_t *len);

/* Whether the value at `idx` converts (berth_json_check would not raise), found by a
 * walk that builds nothing.  True only for what converts; false, too, where it cannot
 * tell (nesting near the limit).  *length (when not NULL) is the number of elements
 * when the value converts to an array, else -1 ({} converts to an object).  Raises
 * only when memory runs out. */
bool berth_json_converts(lua_State *L, int idx, lua_Integer *length);
/* berth_json_converts for an array seen to convert before: when the value at `idx` is
 * a table with the array marker and at least from - 1 entries, only its entries from
 * `from` on are walked, those before taken to convert still (the caller's to know:
 * chat_request.c); any other value is walked whole.  *length as there. */
bool berth_json_converts_from(lua_State *L, int idx, lua_Integer from, lua_Integer *length);
/* Raises berth_json_check's error (the path and what is wrong there) unless the value
 * at `idx` converts; builds a tree only for a value the walk says no to. */
void berth_json_check_converts(lua_State *L, int idx);

/* The `json` module: encode, decode, null, array, object, isArray. */
int luaopen_berth_json(lua_State *L);

#endif
