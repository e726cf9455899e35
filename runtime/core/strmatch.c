/*
 * strmatch.c — string.find, string.match, string.gmatch and string.gsub for hooks,
 * with Lua 5.4's pattern semantics and a step count; string.rep and table.move that
 * cannot loop in C unbounded.
 *
 * Why a matcher of our own: lstrlib's matcher backtracks (`.-.-.-.-.-.-b` over 30 000
 * bytes is O(n^6)) inside one C call, where the instruction-count hook never runs, and
 * it has no step hook to patch.  A check of subject length times pattern complexity
 * before calling it would refuse harmless patterns and miss harmful ones (the cost
 * depends on the data); a thread or a signal cannot stop it safely.  Counting the
 * matcher's own work is exact: every entry to `match`, every subject byte a repetition
 * or a %b scans, every pattern byte a set or a class end reads is a step, charged to
 * the hook call's instruction budget every STEP_CHUNK steps (berth_charge, which also
 * checks the resumption's wall clock) and once more when the function returns.  The
 * matcher allocates nothing, so the error raised mid-match leaks nothing.  Plain finds
 * (no special characters, or `plain`) use glibc's memmem, linear in its input.
 *
 * The grammar and results are those of the Lua 5.4 reference manual §6.4.1 (classes,
 * sets, `* + - ?`, anchors, captures and position captures, %1-%9, %b, %f), including
 * 5.4's rule that gmatch and gsub skip an empty match right after the previous match.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE             /* memmem */
#endif
#include "runtime.h"

#include <ctype.h>
#include <string.h>

#define ESC '%'
#define SPECIALS "^$*+?.([%-"
#define MAX_DEPTH 200           /* nested match calls: "pattern too complex" */
#define STEP_CHUNK 4096         /* steps between two charges */
#ifndef LUA_MAXCAPTURES
#define LUA_MAXCAPTURES 32      /* as lstrlib */
#endif
#define CAP_UNFINISHED (-1)
#define CAP_POSITION (-2)

#define uchar(c) ((unsigned char)(c))

typedef struct mstate {
  const char *src, *src_end;    /* the subject */
  const char *pat_end;          /* the pattern (NUL-terminated: *pat_end == '\0') */
  lua_State *L;
  int depth;                    /* match calls left before "too complex" */
  int level;                    /* captures open or closed */
  long left;                    /* steps before the next charge */
  struct {
    const char *init;
    ptrdiff_t len;              /* or CAP_UNFINISHED, CAP_POSITION */
  } cap[LUA_MAXCAPTURES];
} mstate;

/* {====================================================== steps */

static void steps(mstate *ms, ptrdiff_t n)
{
  ms->left -= (long)n;
  if (ms->left < 0) {
    long long used = STEP_CHUNK - ms->left;
    ms->left = STEP_CHUNK;
    berth_charge(ms->L, used);  /* raises when over */
  }
}

/* Charges what the call did since the last charge. */
static void settle(mstate *ms)
{
  long long used = STEP_CHUNK - ms->left;
  ms->left = STEP_CHUNK;
  if (used > 0)
    berth_charge(ms->L, used);
}

static void ms_init(mstate *ms, lua_State *L, const char *s, size_t ls, const char *p,
                    size_t lp)
{
  ms->L = L;
  ms->src = s;
  ms->src_end = s + ls;
  ms->pat_end = p + lp;
  ms->left = STEP_CHUNK;
  ms->depth = MAX_DEPTH;
  ms->level = 0;
}

/* }====================================================== */

/* {====================================================== one character */

/* The end of the single-character class starting at p (past a set's ']'). */
static const char *class_end(mstate *ms, const char *p)
{
  const char *start = p;
  switch (*p++) {
    case ESC:
      if (p == ms->pat_end)
        luaL_error(ms->L, "malformed pattern (ends with '%%')");
      return p + 1;
    case '[':
      if (*p == '^')
        p++;
      do {                      /* the first character is literal, even a ']' */
        if (p == ms->pat_end)
          luaL_error(ms->L, "malformed pattern (missing ']')");
        if (*p++ == ESC && p < ms->pat_end)
          p++;
      } while (*p != ']');
      steps(ms, p - start);
      return p + 1;
    default:
      return p;
  }
}

static bool class_has(int c, int cl)
{
  bool in;
  switch (tolower(cl)) {
    case 'a': in = isalpha(c); break;
    case 'c': in = iscntrl(c); break;
    case 'd': in = isdigit(c); break;
    case 'g': in = isgraph(c); break;
    case 'l': in = islower(c); break;
    case 'p': in = ispunct(c); break;
    case 's': in = isspace(c); break;
    case 'u': in = isupper(c); break;
    case 'w': in = isalnum(c); break;
    case 'x': in = isxdigit(c); break;
    default: return cl == c;
  }
  return isupper(cl) ? !in : in;
}

/* p at the set's '[', last at its ']'. */
static bool set_has(mstate *ms, int c, const char *p, const char *last)
{
  bool yes = true;
  steps(ms, last - p);
  if (p[1] == '^') {
    yes = false;
    p++;
  }
  while (++p < last) {
    if (*p == ESC) {
      p++;
      if (class_has(c, uchar(*p)))
        return yes;
    } else if (p[1] == '-' && p + 2 < last) {
      if (uchar(p[0]) <= c && c <= uchar(p[2]))
        return yes;
      p += 2;
    } else if (uchar(*p) == c)
      return yes;
  }
  return !yes;
}

/* Whether the subject byte at s matches the class [p, ep). */
static bool single(mstate *ms, const char *s, const char *p, const char *ep)
{
  if (s >= ms->src_end)
    return false;
  int c = uchar(*s);
  switch (*p) {
    case '.': return true;
    case ESC: return class_has(c, uchar(p[1]));
    case '[': return set_has(ms, c, p, ep - 1);
    default: return uchar(*p) == c;
  }
}

/* }====================================================== */

/* {====================================================== the matcher */

static const char *match(mstate *ms, const char *s, const char *p);

static const char *balance(mstate *ms, const char *s, const char *p)
{
  if (p >= ms->pat_end - 1)
    luaL_error(ms->L, "malformed pattern (missing arguments to '%%b')");
  if (s >= ms->src_end || *s != *p)
    return NULL;
  int open = *p, close = p[1], n = 1;
  const char *start = s;
  while (++s < ms->src_end) {
    if (*s == close) {
      if (--n == 0) {
        steps(ms, s - start);
        return s + 1;
      }
    } else if (*s == open)
      n++;
  }
  steps(ms, s - start);
  return NULL;
}

static const char *max_expand(mstate *ms, const char *s, const char *p, const char *ep)
{
  ptrdiff_t i = 0;
  while (single(ms, s + i, p, ep))
    i++;
  steps(ms, i);
  for (; i >= 0; i--) {         /* the longest first, then back off */
    const char *r = match(ms, s + i, ep + 1);
    if (r)
      return r;
  }
  return NULL;
}

static const char *min_expand(mstate *ms, const char *s, const char *p, const char *ep)
{
  for (;;) {
    const char *r = match(ms, s, ep + 1);
    if (r)
      return r;
    if (!single(ms, s, p, ep))
      return NULL;
    s++;
  }
}

static const char *open_capture(mstate *ms, const char *s, const char *p, ptrdiff_t what)
{
  if (ms->level >= LUA_MAXCAPTURES)
    luaL_error(ms->L, "too many captures");
  ms->cap[ms->level].init = s;
  ms->cap[ms->level].len = what;
  ms->level++;
  const char *r = match(ms, s, p);
  if (!r)
    ms->level--;
  return r;
}

static const char *close_capture(mstate *ms, const char *s, const char *p)
{
  int l = ms->level - 1;
  while (l >= 0 && ms->cap[l].len != CAP_UNFINISHED)
    l--;
  if (l < 0)
    luaL_error(ms->L, "invalid pattern capture");
  ms->cap[l].len = s - ms->cap[l].init;
  const char *r = match(ms, s, p);
  if (!r)
    ms->cap[l].len = CAP_UNFINISHED;
  return r;
}

static int capture_index(mstate *ms, int digit)
{
  int l = digit - '1';
  if (l < 0 || l >= ms->level || ms->cap[l].len == CAP_UNFINISHED)
    luaL_error(ms->L, "invalid capture index %%%d", l + 1);
  return l;
}

static const char *back_reference(mstate *ms, const char *s, int digit)
{
  int l = capture_index(ms, digit);
  size_t len = (size_t)ms->cap[l].len;    /* a position capture: never matches */
  steps(ms, ms->cap[l].len > 0 ? ms->cap[l].len : 0);
  if ((size_t)(ms->src_end - s) >= len && memcmp(ms->cap[l].init, s, len) == 0)
    return s + len;
  return NULL;
}

/* The end of the match of pattern p at s, or NULL. */
static const char *match(mstate *ms, const char *s, const char *p)
{
  if (ms->depth-- == 0)
    luaL_error(ms->L, "pattern too complex");
  steps(ms, 1);
  while (p != ms->pat_end) {
    switch (*p) {
      case '(':
        s = p[1] == ')' ? open_capture(ms, s, p + 2, CAP_POSITION)
                        : open_capture(ms, s, p + 1, CAP_UNFINISHED);
        goto out;
      case ')':
        s = close_capture(ms, s, p + 1);
        goto out;
      case '$':
        if (p + 1 != ms->pat_end)
          break;                /* an ordinary character */
        s = s == ms->src_end ? s : NULL;
        goto out;
      case ESC:
        if (p[1] == 'b') {
          s = balance(ms, s, p + 2);
          if (!s)
            goto out;
          p += 4;
          continue;
        }
        if (p[1] == 'f') {
          p += 2;
          if (*p != '[')
            luaL_error(ms->L, "missing '[' after '%%f' in pattern");
          const char *ep = class_end(ms, p);
          int prev = s == ms->src ? '\0' : uchar(s[-1]);
          int here = s < ms->src_end ? uchar(*s) : '\0';
          if (!set_has(ms, prev, p, ep - 1) && set_has(ms, here, p, ep - 1)) {
            p = ep;
            continue;
          }
          s = NULL;
          goto out;
        }
        if (isdigit(uchar(p[1]))) {
          s = back_reference(ms, s, uchar(p[1]));
          if (!s)
            goto out;
          p += 2;
          continue;
        }
        break;                  /* a class */
      default:
        break;
    }
    /* A single-character class, maybe repeated. */
    const char *ep = class_end(ms, p);
    if (!single(ms, s, p, ep)) {
      if (*ep == '*' || *ep == '?' || *ep == '-') {   /* may match nothing */
        p = ep + 1;
        continue;
      }
      s = NULL;
      goto out;
    }
    switch (*ep) {
      case '?': {
        const char *r = match(ms, s + 1, ep + 1);
        if (r) {
          s = r;
          goto out;
        }
        p = ep + 1;
        continue;
      }
      case '+': s = max_expand(ms, s + 1, p, ep); goto out;
      case '*': s = max_expand(ms, s, p, ep); goto out;
      case '-': s = min_expand(ms, s, p, ep); goto out;
      default:
        s++;
        p = ep;
        continue;
    }
  }
out:
  ms->depth++;
  return s;
}

/* }====================================================== */

/* {====================================================== captures */

/* Capture i of a match [s, e): its bytes (*cap, length returned), or CAP_POSITION
 * with the position pushed.  Capture 0 of a pattern without captures is the match. */
static ptrdiff_t get_capture(mstate *ms, int i, const char *s, const char *e,
                             const char **cap)
{
  if (i >= ms->level) {
    if (i != 0)
      luaL_error(ms->L, "invalid capture index %%%d", i + 1);
    *cap = s;
    return e - s;
  }
  ptrdiff_t len = ms->cap[i].len;
  *cap = ms->cap[i].init;
  if (len == CAP_UNFINISHED)
    luaL_error(ms->L, "unfinished capture");
  else if (len == CAP_POSITION)
    lua_pushinteger(ms->L, (ms->cap[i].init - ms->src) + 1);
  return len;
}

static void push_capture(mstate *ms, int i, const char *s, const char *e)
{
  const char *cap;
  ptrdiff_t len = get_capture(ms, i, s, e, &cap);
  if (len != CAP_POSITION)
    lua_pushlstring(ms->L, cap, (size_t)len);
}

/* s NULL: only the captures (find pushes the positions itself). */
static int push_captures(mstate *ms, const char *s, const char *e)
{
  int n = ms->level == 0 && s ? 1 : ms->level;
  luaL_checkstack(ms->L, n, "too many captures");
  for (int i = 0; i < n; i++)
    push_capture(ms, i, s, e);
  return n;
}

/* }====================================================== */

/* {====================================================== the library functions */

/* A start position as lstrlib reads it: negative counts from the end, 0 is 1. */
static size_t start_at(lua_Integer pos, size_t len)
{
  if (pos > 0)
    return (size_t)pos;
  if (pos == 0 || pos < -(lua_Integer)len)
    return 1;
  return len + (size_t)pos + 1;
}

static bool has_specials(const char *p, size_t lp)
{
  for (size_t i = 0; i < lp; i++)
    if (p[i] && strchr(SPECIALS, p[i]))
      return true;
  return false;
}

static int find_or_match(lua_State *L, bool find)
{
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  size_t init = start_at(luaL_optinteger(L, 3, 1), ls) - 1;
  if (init > ls) {
    luaL_pushfail(L);
    return 1;
  }
  if (find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
    const char *at = memmem(s + init, ls - init, p, lp);
    if (!at) {
      luaL_pushfail(L);
      return 1;
    }
    lua_pushinteger(L, (at - s) + 1);
    lua_pushinteger(L, (lua_Integer)((at - s) + lp));
    return 2;
  }
  mstate ms;
  bool anchor = *p == '^';
  if (anchor) {
    p++;
    lp--;
  }
  ms_init(&ms, L, s, ls, p, lp);
  const char *from = s + init;
  do {
    ms.level = 0;
    const char *e = match(&ms, from, p);
    if (e) {
      settle(&ms);
      if (!find)
        return push_captures(&ms, from, e);
      lua_pushinteger(L, (from - s) + 1);
      lua_pushinteger(L, e - s);
      return push_captures(&ms, NULL, NULL) + 2;
    }
  } while (from++ < ms.src_end && !anchor);
  settle(&ms);
  luaL_pushfail(L);
  return 1;
}

static int l_find(lua_State *L) { return find_or_match(L, true); }
static int l_match(lua_State *L) { return find_or_match(L, false); }

typedef struct gmatch_state {
  const char *from, *p, *last;  /* next start, the pattern, the last match's end */
  mstate ms;
} gmatch_state;

static int gmatch_next(lua_State *L)
{
  gmatch_state *g = lua_touserdata(L, lua_upvalueindex(3));
  g->ms.L = L;
  for (const char *from = g->from; from <= g->ms.src_end; from++) {
    g->ms.level = 0;
    const char *e = match(&g->ms, from, g->p);
    if (e && e != g->last) {
      g->from = g->last = e;
      settle(&g->ms);
      return push_captures(&g->ms, from, e);
    }
  }
  g->from = g->ms.src_end + 1;
  settle(&g->ms);
  return 0;
}

static int l_gmatch(lua_State *L)
{
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  size_t init = start_at(luaL_optinteger(L, 3, 1), ls) - 1;
  lua_settop(L, 2);             /* the subject and the pattern stay as upvalues */
  gmatch_state *g = lua_newuserdatauv(L, sizeof *g, 0);
  if (init > ls)
    init = ls + 1;              /* no match, ever */
  ms_init(&g->ms, L, s, ls, p, lp);
  g->from = s + init;
  g->p = p;
  g->last = NULL;
  lua_pushcclosure(L, gmatch_next, 3);
  return 1;
}

static void add_string(mstate *ms, luaL_Buffer *b, const char *s, const char *e)
{
  lua_State *L = ms->L;
  size_t l;
  const char *r = lua_tolstring(L, 3, &l), *esc;
  while ((esc = memchr(r, ESC, l))) {
    luaL_addlstring(b, r, (size_t)(esc - r));
    esc++;                      /* the replacement is NUL-terminated */
    if (*esc == ESC)
      luaL_addchar(b, ESC);
    else if (*esc == '0')
      luaL_addlstring(b, s, (size_t)(e - s));
    else if (isdigit(uchar(*esc))) {
      const char *cap;
      ptrdiff_t len = get_capture(ms, *esc - '1', s, e, &cap);
      if (len == CAP_POSITION)
        luaL_addvalue(b);
      else
        luaL_addlstring(b, cap, (size_t)len);
    } else
      luaL_error(L, "invalid use of '%c' in replacement string", ESC);
    l -= (size_t)(esc + 1 - r);
    r = esc + 1;
  }
  luaL_addlstring(b, r, l);
  steps(ms, e - s);
}

/* Adds the replacement of the match [s, e); whether it changed anything. */
static bool add_value(mstate *ms, luaL_Buffer *b, const char *s, const char *e, int tr)
{
  lua_State *L = ms->L;
  if (tr == LUA_TFUNCTION) {
    lua_pushvalue(L, 3);
    int n = push_captures(ms, s, e);
    lua_call(L, n, 1);
  } else if (tr == LUA_TTABLE) {
    push_capture(ms, 0, s, e);
    lua_gettable(L, 3);
  } else {
    add_string(ms, b, s, e);
    return true;
  }
  if (!lua_toboolean(L, -1)) {  /* nil or false: keep the original */
    lua_pop(L, 1);
    luaL_addlstring(b, s, (size_t)(e - s));
    return false;
  }
  if (!lua_isstring(L, -1))
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  luaL_addvalue(b);
  return true;
}

static int l_gsub(lua_State *L)
{
  size_t ls, lp;
  const char *src = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  const char *last = NULL;
  int tr = lua_type(L, 3);
  lua_Integer max = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
  luaL_argexpected(L, tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION ||
                   tr == LUA_TTABLE, 3, "string/function/table");
  bool anchor = *p == '^', changed = false;
  if (anchor) {
    p++;
    lp--;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  mstate ms;
  ms_init(&ms, L, src, ls, p, lp);
  lua_Integer n = 0;
  while (n < max) {
    ms.level = 0;
    const char *e = match(&ms, src, p);
    if (e && e != last) {
      n++;
      changed = add_value(&ms, &b, src, e, tr) || changed;
      src = last = e;
    } else if (src < ms.src_end)
      luaL_addchar(&b, *src++);
    else
      break;
    if (anchor)
      break;
  }
  settle(&ms);
  if (!changed)
    lua_pushvalue(L, 1);
  else {
    luaL_addlstring(&b, src, (size_t)(ms.src_end - src));
    luaL_pushresult(&b);
  }
  lua_pushinteger(L, n);
  return 2;
}

/* string.rep: lstrlib loops n times even when each copy is empty (string.rep("",
 * 1e15) never returns).  An empty result is answered at once; any other result is
 * allocated before the copying starts, so the memory cap bounds it. */
static int l_rep(lua_State *L)
{
  size_t l, lsep;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || (l == 0 && (lsep == 0 || n == 1))) {
    lua_pushliteral(L, "");
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

#define MOVE_CHUNK 65536        /* slots between two charges */

/* table.move: ltablib's loop over a range touches no memory when the slots are nil
 * (table.move({}, 1, 1e15, 2) runs for days).  Done in chunks, each charged, in the
 * order that keeps an overlapping move right: forward when the destination starts at
 * or before the source, or after its end, or is another table; backward otherwise. */
static int l_move(lua_State *L)
{
  lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
  lua_Integer t = luaL_checkinteger(L, 4);
  int tt = !lua_isnoneornil(L, 5) ? 5 : 1;
  if (e < f || (lua_Unsigned)e - (lua_Unsigned)f < MOVE_CHUNK) { /* small, or refused */
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
  }
  luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
  lua_Integer n = e - f + 1;
  luaL_argcheck(L, t <= LUA_MAXINTEGER - n + 1, 4, "destination wrap around");
  bool forward = t > e || t <= f || (tt != 1 && !lua_compare(L, 1, tt, LUA_OPEQ));
  for (lua_Integer done = 0; done < n; done += MOVE_CHUNK) {
    lua_Integer k = n - done < MOVE_CHUNK ? n - done : MOVE_CHUNK;
    lua_Integer off = forward ? done : n - done - k;
    berth_charge(L, k);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushvalue(L, 1);
    lua_pushinteger(L, f + off);
    lua_pushinteger(L, f + off + k - 1);
    lua_pushinteger(L, t + off);
    lua_pushvalue(L, tt);
    lua_call(L, 5, 0);
  }
  lua_pushvalue(L, tt);
  return 1;
}

static void replace_field(lua_State *L, const char *lib, const char *name, lua_CFunction f,
                          bool keep_original)
{
  lua_getglobal(L, lib);
  if (keep_original) {
    lua_getfield(L, -1, name);
    lua_pushcclosure(L, f, 1);
  } else
    lua_pushcfunction(L, f);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

void berth_open_bounded(lua_State *L)
{
  replace_field(L, "string", "find", l_find, false);
  replace_field(L, "string", "match", l_match, false);
  replace_field(L, "string", "gmatch", l_gmatch, false);
  replace_field(L, "string", "gsub", l_gsub, false);
  replace_field(L, "string", "rep", l_rep, true);
  replace_field(L, "table", "move", l_move, true);
}

/* }====================================================== */
