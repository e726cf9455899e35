/*
 * openai.h — the `openai` model adapter (OpenAI-compatible chat completions with
 * `stream: true`, model_openai.c) and the I/O-free assembler that turns the streamed
 * chunks into one assistant message (openai_stream.c; unit-tested and fuzzed alone).
 */
#ifndef BERTH_OPENAI_H
#define BERTH_OPENAI_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "model.h"

/* Ollama's OpenAI-compatible endpoint: local, keyless, cleartext allowed (loopback). */
#define BERTH_OPENAI_DEFAULT_URL "http://127.0.0.1:11434/v1"

/* {====================================================== the adapter */

typedef struct berth_openai_options {
  const char *url;              /* base URL; "/chat/completions" is appended */
  const char *api_key;          /* NULL or "": no Authorization header */
  const char *model;            /* required */
  bool insecure_http;           /* allow cleartext http to a non-loopback host */
  int max_attempts;             /* 429/5xx before any stream byte: tries in all (4) */
  double backoff_base;          /* seconds before the 2nd attempt, doubling (0.5) */
  double backoff_max;           /* cap of one backoff (8) */
  double max_retry_after;       /* a longer Retry-After is not waited for (60) */
  double connect_timeout;       /* seconds (10) */
  double idle_timeout;          /* seconds without a byte (120; whole seconds) */
  double timeout;               /* seconds for one attempt (600) */
} berth_openai_options;

void berth_openai_options_init(berth_openai_options *o);
/* Fills url, api_key, model, insecure_http and timeout from BERTH_MODEL_URL,
 * BERTH_API_KEY, BERTH_MODEL, BERTH_MODEL_INSECURE_HTTP and BERTH_MODEL_TIMEOUT (the
 * strings point into the environment).  Returns -1 with *err for a bad value. */
int berth_openai_options_env(berth_openai_options *o, char **err);
/* Checks the options (URL, cleartext rule, model name) and creates the adapter on
 * o->loop.  Returns NULL with *err (malloc'd, never holding the key).
 *
 * As model.h says, plus: `delta` and `done` run from the loop, never inside libcurl;
 * `delta` must not cancel the call or free the model (natives.c's only queue);
 * cancel() calls `done` ("canceled") before it returns; freeing the model drops the
 * calls still running without calling back. */
berth_model *berth_openai_new(const berth_openai_options *oo, const berth_model_options *o,
                              char **err);

/* }====================================================== */

/* {====================================================== the stream assembler */

typedef struct berth_oai_stream berth_oai_stream;

/* `delta` (may be NULL) gets the reply's text as it arrives, never cut inside a
 * UTF-8 sequence. */
berth_oai_stream *berth_oai_stream_new(berth_delta_fn delta, void *ud);
void berth_oai_stream_free(berth_oai_stream *s);
/* Body bytes of a text/event-stream response, in pieces of any size.  Returns 0 to
 * go on, 1 once the stream said [DONE] (stop reading), -1 when it is malformed or
 * reported an error (berth_oai_stream_error). */
int berth_oai_stream_feed(berth_oai_stream *s, const char *buf, size_t len);
/* A whole non-streamed chat.completion body (a server that ignored stream: true).
 * Returns 0 or -1 as above. */
int berth_oai_stream_whole(berth_oai_stream *s, const char *body, size_t len);
/* The stream said it finished: [DONE], or a finish_reason for the reply's choice. */
bool berth_oai_stream_complete(const berth_oai_stream *s);
/* The first error (NULL if none) and its code. */
const char *berth_oai_stream_error(const berth_oai_stream *s, const char **code);
/* The body ended: the assistant message {role, content, tool_calls?} (new reference),
 * or NULL with *code and *err (malloc'd) when the stream failed, was cut before it
 * finished, or its text is not valid UTF-8. */
json_t *berth_oai_stream_finish(berth_oai_stream *s, const char **code, char **err);

/* }====================================================== */

#endif
