/*
 * test_store_host.c — the host on a store (berth_options.store), without a daemon:
 * a suspended conversation's ctx leaves the Lua heap once the store committed it, and
 * comes back from the store, whole, when a message wakes it (issue 15 item 4: idle
 * conversations cost the running ones nothing).  On an SQLite file and on memory.
 * A stored history that is not JSON any more is data_loss on both ways back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <ev.h>
#include <lua.h>
#include <sqlite3.h>

#include "berth.h"
#include "hosttest.h"
#include "store/store.h"

#define N_CONVS 200
#define BIG 4096                 /* bytes each turn adds to a conversation's history */

static berth_store *the_store;

static void use_store(berth_options *o)
{
  o->store = the_store;
  o->idle_timeout = 3600;        /* suspends come from berth_conv_suspend only */
}

static const char hooks[] =
  "local M = {}\n"
  "function M.onTurn(ctx, message)\n"
  "  ctx.state.n = (ctx.state.n or 0) + 1\n"
  "  ctx.messages[#ctx.messages + 1] = {role = 'user', content = message .. ('x'):rep(4096)}\n"
  "  ctx:emit('seen', {n = ctx.state.n, messages = #ctx.messages,\n"
  "                    k = ctx.metadata and ctx.metadata.k or 'none', run = ctx.runId})\n"
  "end\n"
  "return M\n";

static size_t heap(ht *t)
{
  lua_State *L = berth_host_lua(t->host);
  lua_gc(L, LUA_GCCOLLECT, 0);
  lua_gc(L, LUA_GCCOLLECT, 0);
  berth_stats st;
  berth_host_stats(t->host, &st);
  return (size_t)st.lua_bytes;
}

static bool synced;

static void on_sync(void *ud, const berth_error *err)
{
  (void)ud;
  assert_null(err);
  synced = true;
}

static bool is_synced(ht *t, void *ud)
{
  (void)t;
  (void)ud;
  return synced;
}

/* Waits until everything written before is committed. */
static void sync_store(ht *t)
{
  synced = false;
  berth_store_sync(the_store, on_sync, NULL);
  assert_true(ht_wait(t, is_synced, NULL, 20));
}

/* The host, then its store, then the loop. */
static void close_all(ht *t)
{
  berth_host_free(t->host);
  t->host = NULL;
  berth_store_free(the_store);
  the_store = NULL;
  ht_free(t);
}

static void run_with(const char *url)
{
  ht t;
  ht_init(&t);
  char path[300];
  snprintf(path, sizeof path, url, t.dir);
  berth_error *e = berth_store_open(t.loop, path, &the_store);
  assert_null(e);
  ht_host(&t, ht_file(&t, "hooks.lua", hooks), NULL, NULL, use_store);

  berth_conv *convs[N_CONVS];
  json_t *meta = json_pack("{s:s}", "k", "v");
  for (int i = 0; i < N_CONVS; i++) {
    berth_conv_options co = {0};
    co.metadata = meta;
    assert_null(berth_conv_open(t.host, &co, &convs[i]));
    assert_int_equal(berth_conv_send(convs[i], "hello"), 0);
  }
  json_decref(meta);
  assert_true(ht_wait_events(&t, "seen", N_CONVS, 20));
  size_t held = heap(&t);
  for (int i = 0; i < N_CONVS; i++)
    berth_conv_suspend(convs[i]);
  assert_true(ht_wait_events(&t, "suspend", N_CONVS, 20));
  sync_store(&t);                /* after the suspends' own syncs */
  size_t idle = heap(&t);
  print_message("%s: Lua heap %zu KiB with %d conversations held, %zu KiB once suspended\n",
                path, held / 1024, N_CONVS, idle / 1024);
  /* each held BIG bytes of history (and its state): gone from the heap */
  assert_true(held - idle > (size_t)N_CONVS * BIG * 9 / 10);

  /* a message wakes one: its history, state and metadata are back */
  assert_int_equal(berth_conv_send(convs[7], "again"), 0);
  assert_true(ht_wait_events(&t, "seen", N_CONVS + 1, 20));
  const json_t *seen = ht_event(&t, "seen", N_CONVS);
  assert_int_equal(json_integer_value(json_object_get(seen, "n")), 2);
  assert_int_equal(json_integer_value(json_object_get(seen, "messages")), 2);
  assert_string_equal(json_string_value(json_object_get(seen, "k")), "v");
  assert_string_equal(json_string_value(json_object_get(seen, "run")),
                      berth_conv_run_id(convs[7]));
  /* and what it stores now is the whole history (nothing rewritten from nothing) */
  char **texts = NULL;
  size_t n = 0;
  sync_store(&t);
  /* (the record is written at the turn's end; events are not needed here) */
  assert_null(berth_store_load_messages(the_store, berth_conv_store_id(convs[7]), &texts, &n)
              ? "x" : NULL);
  assert_int_equal(n, 2);
  assert_non_null(strstr(texts[0], "hello"));
  assert_non_null(strstr(texts[1], "again"));
  berth_store_texts_free(texts, n);

  for (int i = 0; i < N_CONVS; i++)
    berth_conv_free(convs[i]);
  close_all(&t);
}

static void test_suspended_ctx_leaves_the_heap_and_comes_back_sqlite(void **state)
{
  (void)state;
  run_with("sqlite:%s/convs.db");
}

static void test_suspended_ctx_leaves_the_heap_and_comes_back_memory(void **state)
{
  (void)state;
  run_with("memory");
}

/* Every stored message of the file at `path` made a text that is not JSON, by another
 * connection, as a damaged disk or a hand edit could. */
static void damage_messages(const char *path)
{
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char *err = NULL;
  int rc = sqlite3_exec(db, "UPDATE messages SET body = '{\"role\": '", NULL, NULL, &err);
  if (rc != SQLITE_OK)
    fail_msg("damaging %s: %s", path, err);
  assert_int_equal(sqlite3_changes(db), 1);
  sqlite3_close(db);
}

static void test_a_stored_history_not_json_is_data_loss_both_ways_back(void **state)
{
  (void)state;
  ht t;
  ht_init(&t);
  char path[300];
  snprintf(path, sizeof path, "%s/convs.db", t.dir);
  char url[320];
  snprintf(url, sizeof url, "sqlite:%s", path);
  assert_null(berth_store_open(t.loop, url, &the_store));
  ht_host(&t, ht_file(&t, "hooks.lua", hooks), NULL, NULL, use_store);
  berth_conv_options co = {0};
  co.run_id = "run-damaged";
  berth_conv *c = NULL;
  assert_null(berth_conv_open(t.host, &co, &c));
  assert_int_equal(berth_conv_send(c, "hello"), 0);
  assert_true(ht_wait_events(&t, "seen", 1, 20));
  berth_conv_suspend(c);
  assert_true(ht_wait_events(&t, "suspend", 1, 20));
  sync_store(&t);                /* after the suspend's own sync: its ctx left the heap */
  damage_messages(path);

  /* the unloaded ctx cannot come back: the turn fails with why, the hook never runs */
  int errors = ht_count(&t, "error");
  assert_int_equal(berth_conv_send(c, "again"), 0);
  assert_true(ht_wait_events(&t, "error", errors + 1, 20));
  const char *why = json_string_value(json_object_get(ht_event(&t, "error", errors), "message"));
  assert_non_null(why);
  assert_non_null(strstr(why, "the stored conversation run-damaged cannot be loaded"));
  assert_non_null(strstr(why, "stored message 0 is not JSON"));
  assert_int_equal(ht_count(&t, "seen"), 1);
  berth_conv_free(c);

  /* nor can it be resumed by its id (as after a restart): data_loss, nothing opened */
  co.run_id = NULL;
  co.store_id = "run-damaged";
  berth_error *e = berth_conv_open(t.host, &co, &c);
  assert_non_null(e);
  assert_string_equal(e->code, "data_loss");
  assert_non_null(strstr(e->message, "the stored conversation run-damaged cannot be loaded"));
  assert_non_null(strstr(e->message, "stored message 0 is not JSON"));
  assert_null(c);
  berth_error_free(e);

  close_all(&t);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_suspended_ctx_leaves_the_heap_and_comes_back_sqlite),
    cmocka_unit_test(test_suspended_ctx_leaves_the_heap_and_comes_back_memory),
    cmocka_unit_test(test_a_stored_history_not_json_is_data_loss_both_ways_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
