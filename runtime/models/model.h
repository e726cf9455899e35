/*
 * model.h — the interface a model adapter implements (scripted; openai in openai.h).
 *
 * A request is {messages, tools} in the OpenAI chat-completions shape: messages are
 * {role, content, tool_calls?, tool_call_id?}; tools are {type = "function",
 * function = {name, description, parameters}}.  An adapter reads it through the
 * berth_request_* functions below: as JSON text to send (openai), or a few fields of
 * a few messages (scripted), so that no call converts the whole history into a tree
 * it does not need.  The reply is one assistant message in the same shape; a tool
 * call's `function.arguments` is JSON text, as the API sends it.
 *
 * Contract (as plimsoll.h's): chat() returns at once; `done` runs from the loop exactly
 * once per started call, never from inside chat(); `delta` may run any number of times
 * before it.  A call refused before it started returns -1 with *err and never calls
 * back.  cancel() makes `done` come soon with code "canceled".
 */
#ifndef BERTH_MODEL_H
#define BERTH_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

struct ev_loop;

typedef struct berth_model berth_model;
typedef struct berth_model_call berth_model_call;

/* ---------------------------------------------------------------- the request */

/* A model call's request.  It lives only during chat(): an adapter copies what it
 * keeps.  The host's (from model.chat's table) was checked before chat() to have a
 * JSON form and is read straight from the Lua tables, no script code run; the readers
 * never raise, and the ones that convert return NULL when memory runs out. */
typedef struct berth_model_request berth_model_request;

/* The number of messages, or -1 when `messages` is not a JSON array ({} is an object). */
long berth_request_count(const berth_model_request *r);
/* String field `name` of message i (from 0), with its length in *len when len is not
 * NULL; NULL when i is out of range, the message is not an object or the field is
 * absent or not a string.  The bytes are as given (UTF-8 not checked, NULs kept). */
const char *berth_request_string(const berth_model_request *r, size_t i, const char *name,
                                 size_t *len);
/* How many messages have the role "user": the user turns so far, the last one's
 * included.  *last (when not NULL) gets the index of the last of them (0 when there is
 * none).  The host's request counts only the messages appended since an earlier call
 * was given the same array (chat_request.c; ctx.messages's rule, runtime/README.md);
 * others read every message's role. */
size_t berth_request_user_turns(const berth_model_request *r, size_t *last);
/* Field `name` of message i as a JSON value (borrowed, until chat() returns); NULL as
 * for berth_request_string, or when memory ran out. */
const json_t *berth_request_value(const berth_model_request *r, size_t i, const char *name);
/* The compact JSON text (json.encode's bytes, NUL-terminated) of the request's
 * "messages" or "tools" (the part named) in *text, its length in *len: 0, with *text
 * NULL when that part is absent (no tools); -1 when memory ran out. */
int berth_request_text(const berth_model_request *r, const char *part, const char **text,
                       size_t *len);

/* A request read from a JSON value {messages, tools} (borrowed: it must outlive the
 * request), for callers in C (tests, fuzzers, a program that drives a model itself).
 * NULL when memory runs out.  Free it after chat() returns. */
berth_model_request *berth_request_from_json(const json_t *request);
void berth_request_free(berth_model_request *r);

typedef void (*berth_delta_fn)(void *ud, const char *text, size_t len);
/* reply (ownership passed) on success; else code (a short stable string such as
 * "canceled", "unavailable", "invalid_argument") and message (malloc'd, passed). */
typedef void (*berth_reply_fn)(void *ud, json_t *reply, const char *code, char *message);

typedef struct berth_model_ops {
  const char *name;
  int (*chat)(berth_model *m, const berth_model_request *request, berth_delta_fn delta,
              berth_reply_fn done, void *ud, berth_model_call **call, char **err);
  void (*cancel)(berth_model *m, berth_model_call *call);
  void (*free)(berth_model *m);
} berth_model_ops;

/* Every adapter's struct starts with this. */
struct berth_model {
  const berth_model_ops *ops;
};

/* One expectation checked by the scripted model (for transcripts). */
typedef void (*berth_check_fn)(void *ud, bool ok, const char *what);

typedef struct berth_model_options {
  struct ev_loop *loop;
  const char *provider;         /* selects provider-specific expectations ("echo") */
  berth_check_fn on_check;
  void *check_ud;
} berth_model_options;

/* "scripted:FILE", "openai" or "openai:MODEL" (openai.h; configured from the
 * environment).  Returns NULL with *err (malloc'd) for an unknown adapter, a bad
 * script or a bad openai setting. */
berth_model *berth_model_new(const char *spec, const berth_model_options *o, char **err);
void berth_model_free(berth_model *m);

/* ---------------------------------------------------------------- scripted */

/* Loads a conversation script (.lua returning a table, or .json); see runtime/README.md.
 * Returns the script as JSON (new reference) or NULL with *err. */
json_t *berth_script_load(const char *path, char **err);
berth_model *berth_scripted_new(json_t *script, const berth_model_options *o, char **err);
/* The script the model plays (borrowed). */
const json_t *berth_scripted_script(const berth_model *m);
/* Ends the play: expectations never reached (a turn that stopped early) are reported
 * through on_check as failed; returns the number of checks made and failed. */
void berth_scripted_finish(berth_model *m, unsigned *checked, unsigned *failed);
/* The provider the expectations are selected for (can be set after creation, e.g.
 * once Describe has named it). */
void berth_scripted_set_provider(berth_model *m, const char *provider);

#endif /* BERTH_MODEL_H */
