/*
 * test_lifecycle.c — the chat-agent life cycle (conformance group H) and the
 * executeCode tool (group T) through the shipped hooks (scripts/code_chat.lua) and the
 * scripted model, against a real sandboxd (provider echo: a cell answers
 * "<language> <n>: <code>") behind tests/faultproxy.py, whose counters say what the
 * daemon really received.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <ev.h>

#include "fault.h"
#include "hosttest.h"
#include "runtime.h"
#include "sbxproc.h"

#define WAIT 20.0                /* seconds: a bound on each wait, never a sleep */
#define HOOKS "scripts/code_chat.lua"

static sbx_proc sbxd;
static fault_proxy proxy;

static long fwd(const char *rpc) { return fault_forwarded(&proxy, rpc); }

typedef struct fwd_want {
  const char *rpc;
  long n;
} fwd_want;

static bool forwarded_at_least(ht *t, void *ud)
{
  (void)t;
  fwd_want *w = ud;
  return fwd(w->rpc) >= w->n;
}

static bool wait_forwarded(ht *t, const char *rpc, long n)
{
  fwd_want w = {rpc, n};
  return ht_wait(t, forwarded_at_least, &w, WAIT);
}

static void short_idle(berth_options *o) { o->idle_timeout = 0.3; }

/* A host with the shipped hooks and a scripted model on the proxied daemon. */
static ht *start(const char *script, const char *hooks, void (*tweak)(berth_options *o),
                 const char *user)
{
  assert_int_equal(fault_reset(&proxy), 0);
  ht *t = calloc(1, sizeof *t);
  ht_init(t);
  ht_model(t, script, "echo");
  ht_host(t, hooks ? hooks : HOOKS, proxy.url, sbxd.token, tweak);
  t->conv = berth_conv_new(t->host, "run-1", user);
  return t;
}

static void stop(ht *t)
{
  ht_free(t);
  free(t);
}

static void send_turn(ht *t, const char *message)
{
  int ends = ht_count(t, "turnEnd");
  assert_int_equal(berth_conv_send(t->conv, message), 0);
  assert_true(ht_wait_events(t, "turnEnd", ends + 1, WAIT));
}

/* Every expectation the script made held, and at least `n` were checked. */
static void assert_checks(ht *t, size_t n)
{
  size_t i;
  json_t *c;
  json_array_foreach(t->checks, i, c)
    if (!json_is_true(json_object_get(c, "ok")))
      fail_msg("expectation failed: %s", json_string_value(json_object_get(c, "what")));
  assert_true(json_array_size(t->checks) >= n);
  assert_int_equal(ht_count(t, "error"), 0);
}

static const json_t *result(ht *t, int i)
{
  const json_t *ev = ht_event(t, "toolResult", i);
  assert_non_null(ev);
  const json_t *r = json_object_get(ev, "result");
  if (!r)
    fail_msg("tool result %d is an error: %s", i,
             json_string_value(json_object_get(ev, "error")));
  return r;
}

static void assert_hex64(const char *s)
{
  assert_non_null(s);
  assert_int_equal(strlen(s), 64);
  for (const char *p = s; *p; p++)
    assert_true((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
}

/* {====================================================== H01, H05, T03, T07 */

static const char orders_script[] =
  "local csv = json.array{{path = 'orders.csv', content = 'id,total\\n1,30\\n2,12\\n'}}\n"
  "return { turns = {\n"
  "  { user = 'load the orders and count them', replies = {\n"
  "    { call = { code = 'import csv\\nrows = list(csv.DictReader(open(\"orders.csv\")))',\n"
  "               files = csv,\n"
  "               expect = { stdoutContains = 'python 1: import csv', freshSandbox = true,\n"
  "                          freshInterpreter = true, stateKept = true, filesPersist = true,\n"
  "                          isolation = 'container', exitCode = 0, language = 'python' } } },\n"
  "    { call = { code = 'len(rows)',\n"
  "               expect = { stdout = 'python 2: len(rows)', stderr = '', freshSandbox = false,\n"
  "                          freshInterpreter = false, stateKept = true, filesPersist = true,\n"
  "                          isolation = 'container' } } },\n"
  "    { say = 'There are 2 orders.' } } },\n"
  "  { user = 'and the total?', replies = {\n"
  "    { call = { code = \"sum(float(r['total']) for r in rows)\",\n"
  "               expect = { stdoutContains = 'python 3: sum(', freshSandbox = false } } },\n"
  "    { say = 'The total is 42.' } } },\n"
  "} }\n";

static void test_H05_T03_T07_T08_one_sandbox_per_run(void **state)
{
  (void)state;
  ht *t = start(orders_script, NULL, NULL, NULL);
  send_turn(t, "load the orders and count them");
  send_turn(t, "and the total?");      /* sent at once: no idle window between */
  assert_checks(t, 15);
  assert_int_equal(ht_count(t, "toolResult"), 3);
  for (int i = 0; i < 3; i++) {
    const json_t *r = result(t, i);
    assert_hex64(json_string_value(json_object_get(r, "recordSha256")));
    assert_string_equal(json_string_value(json_object_get(r, "language")), "python");
  }
  /* T03: the keys, in the reference's order (the optional ones when present) */
  static const char *const order[] = {"language", "exitCode", "timedOut", "stdout",
                                      "stderr", "truncated", "stateKept", "freshInterpreter",
                                      "filesPersist", "freshSandbox", "isolation",
                                      "recordSha256"};
  const json_t *first = result(t, 0);
  assert_int_equal(json_object_size(first), 12);
  size_t k = 0;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)first, key, v)
    assert_string_equal(key, order[k++]);
  /* T07: the fresh flags are absent, never false */
  assert_null(json_object_get(result(t, 1), "freshSandbox"));
  assert_null(json_object_get(result(t, 1), "freshInterpreter"));
  assert_int_equal(json_object_size(result(t, 1)), 10);
  /* the daemon saw one sandbox, three cells, no close */
  assert_int_equal(fwd("OpenSession"), 1);
  assert_int_equal(fwd("SessionRun"), 3);
  assert_int_equal(fwd("CloseSession"), 0);
  assert_true(ht_complete(t, WAIT));
  stop(t);
}

static const char say_only_script[] =
  "return { turns = { { user = 'hi', replies = { { say = 'hello' } } } } }\n";

static void test_H01_H03_turn_start_warms_without_waiting(void **state)
{
  (void)state;
  ht *t = start(say_only_script, NULL, NULL, NULL);
  send_turn(t, "hi");
  /* no code ran, yet the sandbox was opened by onTurnStart's warm */
  assert_true(wait_forwarded(t, "OpenSession", 1));
  assert_int_equal(fwd("SessionRun"), 0);
  assert_string_equal(json_string_value(ht_event(t, "assistant", 0)), "hello");
  assert_string_equal(berth_conv_warmed_run_id(t->conv), "run-1");
  assert_true(ht_complete(t, WAIT));
  assert_true(wait_forwarded(t, "CloseSession", 1));
  stop(t);
}

/* }====================================================== */

/* {====================================================== H06, H11, H07 */

static const char suspend_script[] =
  "return { turns = {\n"
  "  { user = 'define x', replies = {\n"
  "    { call = { code = 'x = 41', expect = { freshSandbox = true, stdoutContains = 'python 1: x = 41' } } },\n"
  "    { say = 'done' } } },\n"
  "  { idle = 'wait' },\n"
  "  { user = 'x + 1?', replies = {\n"
  "    { call = { code = 'x + 1', expect = { freshSandbox = true, freshInterpreter = true,\n"
  "                                          stdoutContains = 'python 1: x + 1' } } },\n"
  "    { call = { code = 'x = 41', expect = { freshSandbox = false, stdoutContains = 'python 2:' } } },\n"
  "    { say = 'rebuilt' } } },\n"
  "} }\n";

static void test_H06_suspend_disposes_sandbox(void **state)
{
  (void)state;
  ht *t = start(suspend_script, NULL, short_idle, NULL);
  send_turn(t, "define x");
  assert_int_equal(fwd("OpenSession"), 1);
  assert_int_equal(fwd("CloseSession"), 0);
  /* no message for the idle timeout: onSuspend disposes the sandbox */
  assert_true(ht_wait_events(t, "suspend", 1, WAIT));
  assert_true(wait_forwarded(t, "CloseSession", 1));
  assert_true(berth_conv_suspended(t->conv));
  assert_int_equal(plm_sandboxes_count(t->host->sandboxes), 0);
  stop(t);
}

static void test_H11_next_message_gets_fresh_sandbox(void **state)
{
  (void)state;
  ht *t = start(suspend_script, NULL, short_idle, NULL);
  send_turn(t, "define x");
  assert_true(ht_wait_events(t, "suspend", 1, WAIT));
  assert_true(wait_forwarded(t, "CloseSession", 1));
  send_turn(t, "x + 1?");
  assert_int_equal(ht_count(t, "resume"), 1);
  assert_checks(t, 6);
  assert_true(json_is_true(json_object_get(result(t, 1), "freshSandbox")));
  assert_int_equal(fwd("OpenSession"), 2);
  assert_int_equal(fwd("SessionRun"), 3);
  assert_int_equal(fwd("CloseSession"), 1);
  stop(t);
}

static void test_H07_H14_complete_disposes_and_forgets_owner(void **state)
{
  (void)state;
  ht *t = start(say_only_script, NULL, NULL, "alice@example.com");
  send_turn(t, "hi");
  assert_true(wait_forwarded(t, "OpenSession", 1));
  assert_string_equal(berth_owner_get(t->host, "run-1"), "alice@example.com");
  long closes = fwd("CloseSession");
  assert_true(ht_complete(t, WAIT));
  assert_int_equal(ht_count(t, "complete"), 1);
  assert_true(wait_forwarded(t, "CloseSession", closes + 1));
  assert_null(berth_owner_get(t->host, "run-1"));
  stop(t);
}

/* }====================================================== */

/* {====================================================== H04, H18, T12 */

static const char unwarmed_script[] =
  "return { turns = { { user = 'run it', replies = {\n"
  "  { call = { code = '1 + 1', expect = { error = 'Nothing ran (environment): ',\n"
  "                                        errorCode = 'environment' } } },\n"
  "  { say = 'could not run' } } } } }\n";

static void test_H04_unwarmed_turn_is_refused(void **state)
{
  (void)state;
  ht *t0 = calloc(1, sizeof *t0);
  ht_init(t0);
  char hooks[256];
  snprintf(hooks, sizeof hooks, "%s", ht_file(t0, "nowarm.lua",
    "local M = setmetatable({}, {__index = require 'code_chat'})\n"
    "function M.onTurnStart(ctx) end\n"
    "return M\n"));
  ht *t = start(unwarmed_script, hooks, NULL, NULL);
  send_turn(t, "run it");
  assert_checks(t, 2);
  assert_int_equal(fwd("OpenSession"), 0);
  assert_int_equal(fwd("SessionRun"), 0);
  stop(t);
  stop(t0);
}

static bool shut;

static void on_shut(void *ud)
{
  (void)ud;
  shut = true;
}

static bool is_shut(ht *t, void *ud)
{
  (void)t;
  (void)ud;
  return shut;
}

static void test_H18_shutdown_disposes_every_sandbox(void **state)
{
  (void)state;
  ht *t = start(say_only_script, NULL, NULL, NULL);
  send_turn(t, "hi");
  berth_conv *other = berth_conv_new(t->host, "run-2", NULL);
  int ends = ht_count(t, "turnEnd");
  berth_conv_send(other, "hi");
  assert_true(ht_wait_events(t, "turnEnd", ends + 1, WAIT));
  assert_true(wait_forwarded(t, "OpenSession", 2));
  berth_conv_free(other);
  /* no onComplete ran; the worker shuts down: disposeAll closes both */
  assert_int_equal(fwd("CloseSession"), 0);
  shut = false;
  berth_host_shutdown(t->host, on_shut, NULL);
  assert_true(ht_wait(t, is_shut, NULL, WAIT));
  assert_int_equal(fwd("CloseSession"), 2);
  stop(t);
}

static const char one_call_script[] =
  "return { turns = { { user = 'go', replies = {\n"
  "  { call = { code = '1', expect = { error = 'Nothing ran', errorCode = 'environment' } } },\n"
  "  { say = 'the sandbox is down' } } } } }\n";

static void test_T12_infrastructure_failure_is_a_tool_error(void **state)
{
  (void)state;
  ht *t = calloc(1, sizeof *t);
  ht_init(t);
  ht_model(t, one_call_script, "echo");
  ht_host(t, HOOKS, "http://127.0.0.1:1", "nobody", NULL);  /* nothing listens there */
  t->conv = berth_conv_new(t->host, "run-1", NULL);
  send_turn(t, "go");
  /* the model got the error as the tool's result and the turn went on */
  assert_checks(t, 2);
  assert_string_equal(json_string_value(ht_event(t, "assistant", 0)), "the sandbox is down");
  stop(t);
}

/* }====================================================== */

/* {====================================================== T16 */

/* Each refusal as "value|code|message", one per line. */
static const char t16_hooks[] =
  "local M = {}\n"
  "local function line(r, msg, code)\n"
  "  return tostring(r) .. '|' .. tostring(code) .. '|' .. tostring(msg)\n"
  "end\n"
  "function M.onTurn(ctx)\n"
  "  local out = {}\n"
  "  out[#out + 1] = line(sandbox.warm(ctx.runId, ''))\n"
  "  out[#out + 1] = line(sandbox.warm('', 'alice'))\n"
  "  out[#out + 1] = line(sandbox.warm(''))\n"
  "  out[#out + 1] = line(sandbox.warm('', ''))\n"
  /* a refused warm recorded nothing: this turn is still not warmed (H04) */
  "  out[#out + 1] = line(sandbox.executeCode{code = '1'})\n"
  /* executeCode refuses the same key with the same code */
  "  out[#out + 1] = line(sandbox.executeCode{runId = ctx.runId, userId = '', code = '1'})\n"
  "  ctx:say(table.concat(out, '\\n'))\n"
  "end\n"
  "return M\n";

#define KEY_REFUSAL "plimsoll: a sandbox key is a nonempty string, or a nonempty owner and " \
                    "conversation"

static void test_T16_warm_with_an_empty_user_or_conversation_is_refused(void **state)
{
  (void)state;
  ht *t0 = calloc(1, sizeof *t0);
  ht_init(t0);
  char hooks[256];
  snprintf(hooks, sizeof hooks, "%s", ht_file(t0, "t16.lua", t16_hooks));
  ht *t = start(say_only_script, hooks, NULL, NULL);
  send_turn(t, "hi");
  assert_int_equal(ht_count(t, "error"), 0);
  const char *said = json_string_value(ht_event(t, "assistant", 0));
  assert_non_null(said);
  char *copy = strdup(said), *save = NULL;
  const char *lines[8] = {0};
  int n = 0;
  for (char *l = strtok_r(copy, "\n", &save); l && n < 8; l = strtok_r(NULL, "\n", &save))
    lines[n++] = l;
  assert_int_equal(n, 6);
  for (int i = 0; i < 4; i++)
    assert_string_equal(lines[i], "nil|request|" KEY_REFUSAL);
  assert_non_null(strstr(lines[4], "nil|environment|Nothing ran (environment): this turn's "
                                   "sandbox was never warmed"));
  assert_string_equal(lines[5], "nil|request|Nothing ran (request): " KEY_REFUSAL);
  free(copy);
  /* synchronous and before the client: nothing reached the daemon, not even Describe,
   * and no run id or owner was recorded */
  assert_int_equal(fwd("Describe"), 0);
  assert_int_equal(fwd("OpenSession"), 0);
  assert_null(berth_conv_warmed_run_id(t->conv));
  assert_null(berth_owner_get(t->host, "run-1"));
  assert_null(berth_owner_get(t->host, ""));
  assert_int_equal(plm_sandboxes_count(t->host->sandboxes), 0);
  stop(t);
  stop(t0);
}

/* }====================================================== */

/* {====================================================== H10 */

/* The shipped hooks, wrapped: every value the natives return is logged and kept in a
 * global, and
 * after each hook the whole Lua state (from the registry: tables' keys, values and
 * metatables, functions' upvalues, userdata's user values, threads' frames and locals)
 * is walked and its strings emitted as one "dump" event, with the names of string
 * fields called session* and the tool's parameter names. */
static const char h10_hooks[] =
  "local base = require 'code_chat'\n"
  "local M = setmetatable({}, {__index = base})\n"
  "H10_kept = {}\n"
  "for _, name in ipairs{'executeCode', 'warm', 'dispose', 'tool'} do\n"
  "  local f = sandbox[name]\n"
  "  sandbox[name] = function(...)\n"
  "    local r = table.pack(f(...))\n"
  "    H10_kept[#H10_kept + 1] = r\n"
  "    local parts = {}\n"
  "    for i = 1, r.n do\n"
  "      parts[i] = type(r[i]) == 'table' and json.encode(r[i]) or tostring(r[i])\n"
  "    end\n"
  "    log.debug('sandbox.' .. name .. ' -> ' .. table.concat(parts, ', '))\n"
  "    return table.unpack(r, 1, r.n)\n"
  "  end\n"
  "end\n"
  "local function dump(ctx, where, ...)\n"
  "  local out, keys, seen = {}, {}, {}\n"
  "  seen[out], seen[keys], seen[seen] = true, true, true\n"
  "  local function walk(v)\n"
  "    local tv = type(v)\n"
  "    if tv == 'string' then out[#out + 1] = v:gsub('%z', '?') return end\n"  /* C reads it */
  "    if tv ~= 'table' and tv ~= 'function' and tv ~= 'userdata' and tv ~= 'thread' then return end\n"
  "    if seen[v] then return end\n"
  "    seen[v] = true\n"
  "    if tv == 'table' then\n"
  "      for k, x in next, v do\n"
  "        if type(k) == 'string' and k:lower():find('session') and type(x) == 'string' then\n"
  "          keys[#keys + 1] = k\n"
  "        end\n"
  "        walk(k) walk(x)\n"
  "      end\n"
  "    elseif tv == 'function' then\n"
  "      for i = 1, 255 do\n"
  "        local n, x = debug.getupvalue(v, i)\n"
  "        if not n then break end\n"
  "        walk(x)\n"
  "      end\n"
  "    elseif tv == 'userdata' then\n"
  "      for i = 1, 16 do\n"
  "        local x, ok = debug.getuservalue(v, i)\n"
  "        if not ok then break end\n"
  "        walk(x)\n"
  "      end\n"
  "    else\n"
  "      for level = 0, 200 do\n"
  "        local info = debug.getinfo(v, level, 'f')\n"
  "        if not info then break end\n"
  "        walk(info.func)\n"
  "        for i = 1, 255 do\n"
  "          local n, x = debug.getlocal(v, level, i)\n"
  "          if not n then break end\n"
  "          walk(x)\n"
  "        end\n"
  "      end\n"
  "    end\n"
  "    walk(debug.getmetatable(v))\n"
  "  end\n"
  "  walk(debug.getregistry())\n"
  "  walk(ctx) walk({...})\n"
  "  local params = {}\n"
  "  for k in pairs(sandbox.tool()['function'].parameters.properties) do params[#params + 1] = k end\n"
  "  table.sort(params)\n"
  "  ctx:emit('dump', {where = where, text = table.concat(out, '\\n'), n = #out,\n"
  "                   sessionKeys = json.array(keys), params = json.array(params)})\n"
  "end\n"
  "function M.onTurnStart(ctx) base.onTurnStart(ctx) dump(ctx, 'onTurnStart') end\n"
  "function M.onTurn(ctx, message) base.onTurn(ctx, message) dump(ctx, 'onTurn', message) end\n"
  "function M.onSuspend(ctx) base.onSuspend(ctx) dump(ctx, 'onSuspend') end\n"
  "function M.onComplete(ctx) base.onComplete(ctx) dump(ctx, 'onComplete') end\n"
  "return M\n";

static const char h10_script[] =
  "return { turns = {\n"
  "  { user = 'define x', replies = {\n"
  "    { call = { code = 'x = 41', expect = { freshSandbox = true, stdoutContains = 'python 1: x = 41' } } },\n"
  "    { call = { code = 'x + 1', expect = { stdout = 'python 2: x + 1' } } },\n"
  "    { say = 'done' } } },\n"
  "  { idle = 'wait' },\n"
  "  { user = 'again', replies = {\n"
  "    { call = { code = 'x', expect = { freshSandbox = true, stdoutContains = 'python 1: x' } } },\n"
  "    { say = 'rebuilt' } } },\n"
  "} }\n";

static void h10_options(berth_options *o)
{
  o->idle_timeout = 0.3;
  o->unrestricted = true;      /* the walk needs debug.getregistry and friends */
}

/* The distinct 12-character session id prefixes sandboxd logged ("... in session
 * 0123456789ab ..." / "CloseSession: session 0123456789ab closed ..."), from `from`
 * on, as a JSON array. */
static json_t *logged_session_ids(const char *log, size_t from)
{
  json_t *ids = json_array();
  for (const char *p = log + from; (p = strstr(p, "session ")); ) {
    p += strlen("session ");
    size_t n = strspn(p, "0123456789abcdef");
    if (n >= 12) {
      json_t *id = json_stringn(p, 12);
      bool dup = false;
      size_t i;
      json_t *v;
      json_array_foreach(ids, i, v)
        dup = dup || json_equal(v, id);
      if (dup)
        json_decref(id);
      else
        json_array_append_new(ids, id);
    }
  }
  return ids;
}

static void test_H10_session_id_never_reaches_lua_logs_or_results(void **state)
{
  (void)state;
  char *before = sbx_read_log(&sbxd);
  size_t from = before ? strlen(before) : 0;
  free(before);
  ht *t0 = calloc(1, sizeof *t0);
  ht_init(t0);
  char hooks[256];
  snprintf(hooks, sizeof hooks, "%s", ht_file(t0, "h10.lua", h10_hooks));
  ht *t = start(h10_script, hooks, h10_options, "alice@example.com");
  send_turn(t, "define x");
  assert_true(ht_wait_events(t, "suspend", 1, WAIT));   /* onSuspend disposes */
  assert_true(wait_forwarded(t, "CloseSession", 1));
  send_turn(t, "again");
  assert_true(ht_complete(t, WAIT));
  assert_true(wait_forwarded(t, "CloseSession", 2));
  assert_checks(t, 5);
  assert_int_equal(fwd("OpenSession"), 2);

  /* the ids this test's two sessions really had, as sandboxd saw them */
  char *log = sbx_read_log(&sbxd);
  assert_non_null(log);
  json_t *ids = logged_session_ids(log, from);
  free(log);
  assert_int_equal(json_array_size(ids), 2);

  /* every hook's walk saw the real values: the run id, the owner, the results */
  int dumps = ht_count(t, "dump");
  assert_true(dumps >= 6);     /* 2 × onTurnStart, 2 × onTurn, onSuspend, onComplete */
  const char *digest = json_string_value(json_object_get(result(t, 0), "recordSha256"));
  assert_hex64(digest);
  bool saw_result = false;
  for (int i = 0; i < dumps; i++) {
    const json_t *d = ht_event(t, "dump", i);
    const char *text = json_string_value(json_object_get(d, "text"));
    assert_non_null(text);
    assert_non_null(strstr(text, "run-1"));
    assert_non_null(strstr(text, "alice@example.com"));
    saw_result = saw_result || (strstr(text, digest) && strstr(text, "python 2: x + 1"));
    if (json_array_size(json_object_get(d, "sessionKeys")))
      fail_msg("a Lua table has a session field: %s",
               json_dumps(json_object_get(d, "sessionKeys"), 0));
    /* the model chooses only the code, its language and its files */
    char *params = json_dumps(json_object_get(d, "params"), JSON_COMPACT);
    assert_string_equal(params, "[\"code\",\"files\",\"language\"]");
    free(params);
  }
  assert_true(saw_result);

  /* and no session id is anywhere: Lua values, events (tool results, the transcript's
   * source), log lines */
  char *events = json_dumps(t->events, JSON_COMPACT);
  char *lines = json_dumps(t->logs, JSON_COMPACT);
  /* the log really holds what the hooks saw (each result logged as JSON) */
  assert_non_null(strstr(lines, digest));
  assert_non_null(strstr(lines, "sandbox.executeCode -> {"));
  size_t i;
  json_t *id;
  json_array_foreach(ids, i, id) {
    const char *s = json_string_value(id);
    if (strstr(events, s))
      fail_msg("session id %s... is in the events (Lua values or results)", s);
    if (strstr(lines, s))
      fail_msg("session id %s... is in the host's log", s);
  }
  free(events);
  free(lines);
  json_decref(ids);
  stop(t);
  stop(t0);
}

/* }====================================================== */

/* {====================================================== natives outside hooks */

static const char natives_lua[] =
  "assert(sandbox.warm('run-x'))\n"
  "local r = assert(sandbox.executeCode{runId = 'run-x', code = '1 + 1'})\n"
  "assert(r.stdout == 'python 1: 1 + 1' and r.freshSandbox == true and r.exitCode == 0, r.stdout)\n"
  "assert(math.type(r.exitCode) == 'integer')\n"
  "local r2 = assert(sandbox.executeCode{runId = 'run-x', code = '2'})\n"
  "assert(r2.stdout == 'python 2: 2' and r2.freshSandbox == nil and r2.freshInterpreter == nil)\n"
  "assert(json.encode(r):find('^{\"language\":\"python\",\"exitCode\":0,\"timedOut\":false,\"stdout\":'))\n"
  /* H13 with echo: JavaScript in the same sandbox starts an interpreter, not a sandbox */
  "local js = assert(sandbox.executeCode{runId = 'run-x', code = '[30, 12]', language = 'javascript'})\n"
  "assert(js.freshInterpreter and not js.freshSandbox and js.stdout == 'javascript 1: [30, 12]')\n"
  "assert(sandbox.dispose('run-x') == true)\n"
  "local r3 = assert(sandbox.executeCode{runId = 'run-x', code = '3'})\n"
  "assert(r3.freshSandbox and r3.stdout == 'python 1: 3')\n"
  /* no conversation, no runId: nothing ran */
  "local n, msg, code = sandbox.executeCode{code = '1'}\n"
  "assert(n == nil and code == 'environment' and msg:find('^Nothing ran %(environment%): '), msg)\n"
  /* T02: 199 files are refused before sending, as nil, message, code */
  "local files = {} for i = 1, 199 do files[i] = {path = 'f' .. i .. '.txt', content = ''} end\n"
  "local n2, msg2, code2 = sandbox.executeCode{runId = 'run-x', code = '1', files = files}\n"
  "assert(n2 == nil and code2 == 'request' and msg2:find('^Nothing ran'), tostring(msg2))\n"
  "local ok198 = {} for i = 1, 198 do ok198[i] = {path = 'f' .. i .. '.txt', content = ''} end\n"
  "assert(sandbox.executeCode{runId = 'run-x', code = '1', files = ok198})\n"
  /* T01: the tool as the model sees it */
  "local tool = assert(sandbox.tool())\n"
  "local fn = tool['function']\n"
  "assert(tool.type == 'function' and fn.name == 'executeCode')\n"
  "assert(fn.parameters.properties.code and json.isArray(fn.parameters.required))\n"
  "assert(fn.description:find('Python'))\n"
  /* each call a new table: what a hook did to one is not in the next */
  "fn.name = 'changed' fn.parameters.properties.code = nil tool.extra = true\n"
  "local again = assert(sandbox.tool())\n"
  "assert(again ~= tool and again['function'].name == 'executeCode' and not again.extra)\n"
  "assert(again['function'].parameters.properties.code)\n"
  "assert(json.encode(again) == json.encode(assert(sandbox.tool())))\n"
  "assert(sandbox.dispose('run-x'))\n"
  /* T14: the key is {owner = userId, conversation = runId}: alice's chat-1 keeps its
   * sandbox, bob's chat-1 is another, and disposing alice's leaves bob's */
  "local function ex(user, code)\n"
  "  return assert(sandbox.executeCode{runId = 'chat-1', userId = user, code = code}).stdout\n"
  "end\n"
  "assert(ex('alice', 'a') == 'python 1: a')\n"
  "assert(ex('alice', 'b') == 'python 2: b')\n"
  "assert(ex('bob', 'c') == 'python 1: c')\n"
  "assert(sandbox.dispose('chat-1', 'alice') == true)\n"
  "assert(ex('alice', 'd') == 'python 1: d')\n"
  "assert(ex('bob', 'e') == 'python 2: e')\n"
  "local nd, msgd, coded = sandbox.dispose('chat-1', '')\n"
  "assert(nd == nil and coded == 'request', tostring(msgd))\n"
  "assert(sandbox.dispose('chat-1', 'alice') and sandbox.dispose('chat-1', 'bob'))\n"
  "ran = true\n";

static int file_status = -1;

static void file_done(void *ud, int status)
{
  (void)ud;
  file_status = status;
}

static bool file_finished(ht *t, void *ud)
{
  (void)t;
  (void)ud;
  return file_status >= 0;
}

static void test_T01_T02_T14_H13_natives_with_explicit_run_id(void **state)
{
  (void)state;
  assert_int_equal(fault_reset(&proxy), 0);
  ht *t = calloc(1, sizeof *t);
  ht_init(t);
  char path[256];
  snprintf(path, sizeof path, "%s", ht_file(t, "natives.lua", natives_lua));
  ht_host(t, NULL, proxy.url, sbxd.token, NULL);
  char *argv[] = {path, NULL};
  file_status = -1;
  assert_int_equal(berth_run_file(t->host, 1, argv, file_done, NULL), 0);
  assert_true(ht_wait(t, file_finished, NULL, WAIT));
  assert_int_equal(file_status, 0);
  assert_true(wait_forwarded(t, "CloseSession", 5));
  stop(t);
}

/* }====================================================== */

/* {====================================================== teardown paths */

static const char slow_call_script[] =
  "return { turns = { { user = 'go', replies = {\n"
  "  { call = { code = 'x = 1' } }, { say = 'done' } } } } }\n";

static bool saw_tool_call(ht *t, void *ud)
{
  (void)ud;
  return ht_count(t, "toolCall") > 0;
}

static void test_conversation_freed_mid_call(void **state)
{
  (void)state;
  ht *t = start(slow_call_script, NULL, NULL, NULL);
  assert_int_equal(berth_conv_send(t->conv, "go"), 0);
  /* the toolCall event comes right before executeCode starts, in the same resume */
  assert_true(ht_wait(t, saw_tool_call, NULL, WAIT));
  assert_int_equal(ht_count(t, "toolResult"), 0);
  berth_conv_free(t->conv);     /* its task waits on the call: the op is orphaned */
  t->conv = NULL;
  /* the orphaned call completes (or is cancelled) without anyone to resume */
  ev_run(t->loop, EVRUN_NOWAIT);
  stop(t);                      /* frees the host with the call maybe still in flight */
}

/* }====================================================== */

static int group_setup(void **state)
{
  (void)state;
  const char *args[] = {"--test-endpoints", NULL};
  if (sbx_start(&sbxd, args) != 0)
    return -1;
  return fault_start(&proxy, sbxd.url);
}

static int group_teardown(void **state)
{
  (void)state;
  fault_stop(&proxy);
  sbx_stop(&sbxd);
  return 0;
}

/* A hooks file that inherits the shipped approval example (itself code_chat): its own
 * system prompt is the one used, and a refused cell never reaches the daemon while the
 * approved one runs for real (issue 14: customisation points through ctx.hooks). */
static const char inherit_script[] =
  "return { turns = { { user = 'go', replies = {\n"
  "  { call = { code = 'x = 1', expect = { stdoutContains = 'python 1: x = 1' } } },\n"
  "  { call = { code = 'import subprocess', expect = { error = 'not approved',\n"
  "                                                    errorCode = 'permission' } } },\n"
  "  { say = 'done' } } } } }\n";

static void test_hooks_inheriting_code_chat_customise_system_and_tool_calls(void **state)
{
  (void)state;
  ht *t0 = calloc(1, sizeof *t0);
  ht_init(t0);
  char hooks[256];
  snprintf(hooks, sizeof hooks, "%s", ht_file(t0, "inherit.lua",
    "local M = setmetatable({}, {__index = require 'examples.approval'})\n"
    "M.system = function(ctx) ctx:emit('systemAsked', ctx.runId) return 'Be brief.' end\n"
    "return M\n"));
  ht *t = start(inherit_script, hooks, NULL, NULL);
  send_turn(t, "go");
  assert_checks(t, 2);
  assert_int_equal(ht_count(t, "systemAsked"), 1);
  assert_string_equal(json_string_value(ht_event(t, "systemAsked", 0)), "run-1");
  assert_int_equal(fwd("SessionRun"), 1);  /* the refused cell never left the host */
  stop(t);
  stop(t0);
}

int main(void)
{
  plm_global_init();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_H05_T03_T07_T08_one_sandbox_per_run),
    cmocka_unit_test(test_H01_H03_turn_start_warms_without_waiting),
    cmocka_unit_test(test_H06_suspend_disposes_sandbox),
    cmocka_unit_test(test_H11_next_message_gets_fresh_sandbox),
    cmocka_unit_test(test_H07_H14_complete_disposes_and_forgets_owner),
    cmocka_unit_test(test_H04_unwarmed_turn_is_refused),
    cmocka_unit_test(test_H18_shutdown_disposes_every_sandbox),
    cmocka_unit_test(test_T12_infrastructure_failure_is_a_tool_error),
    cmocka_unit_test(test_T16_warm_with_an_empty_user_or_conversation_is_refused),
    cmocka_unit_test(test_H10_session_id_never_reaches_lua_logs_or_results),
    cmocka_unit_test(test_T01_T02_T14_H13_natives_with_explicit_run_id),
    cmocka_unit_test(test_conversation_freed_mid_call),
    cmocka_unit_test(test_hooks_inheriting_code_chat_customise_system_and_tool_calls),
  };
  return cmocka_run_group_tests_name("lifecycle", tests, group_setup, group_teardown);
}
