/*
 * transcript.c — a conversation's events as text: what the user said, what the
 * assistant said, each tool call with its code, each result with its flags and
 * output.  One line prefix per kind ("user>", "tool>", "result>", …) so a transcript
 * reads well and greps well.
 */
#include "cli.h"

#include <string.h>

#define MAX_OUTPUT_LINES 20

static const char *str(const json_t *v, const char *otherwise)
{
  return json_is_string(v) ? json_string_value(v) : otherwise;
}

/* Prints text with `first` before its first line and `more` before the others. */
static void lines(FILE *out, const char *first, const char *more, const char *text, size_t len,
                  size_t max_lines)
{
  size_t i = 0, n = 0;
  const char *prefix = first;
  while (i < len) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t end = nl ? (size_t)(nl - text) : len;
    if (max_lines && n == max_lines) {
      fprintf(out, "%s… (%zu more bytes)\n", more, len - i);
      return;
    }
    fprintf(out, "%s%.*s\n", prefix, (int)(end - i), text + i);
    prefix = more;
    n++;
    i = end + 1;
  }
}

static void print_call(berth_transcript *t, const json_t *call)
{
  const json_t *fn = json_object_get(call, "function");
  const char *name = json_string_value(json_object_get(fn, "name"));
  const char *args_text = json_string_value(json_object_get(fn, "arguments"));
  const char *id = json_string_value(json_object_get(call, "id"));
  json_t *args = args_text ? json_loads(args_text, JSON_ALLOW_NUL, NULL) : NULL;
  const char *lang = json_string_value(json_object_get(args, "language"));
  fprintf(t->out, "tool> %s %s [%s]\n", name ? name : "?", lang ? lang : "(default language)",
          id ? id : "?");
  const json_t *code = json_object_get(args, "code");
  if (json_is_string(code))
    lines(t->out, "  | ", "  | ", json_string_value(code), json_string_length(code), 0);
  else
    fprintf(t->out, "  arguments: %s\n", args_text ? args_text : "(none)");
  size_t i;
  json_t *f;
  json_array_foreach(json_object_get(args, "files"), i, f)
    fprintf(t->out, "  file %s (%zu bytes)\n", json_string_value(json_object_get(f, "path")),
            json_string_length(json_object_get(f, "content")));
  json_decref(args);
}

static void print_result(berth_transcript *t, const json_t *ev)
{
  const json_t *r = json_object_get(ev, "result");
  if (!json_is_object(r) || json_object_get(r, "error")) {
    const json_t *e = json_is_object(r) ? r : ev;
    fprintf(t->out, "result> error [%s] %s\n",
            str(json_object_get(e, "code"), "?"),
            str(json_object_get(e, "error"), "?"));
    return;
  }
  fprintf(t->out, "result> exitCode %lld", (long long)json_integer_value(json_object_get(r, "exitCode")));
  static const char *const flags[] = {"timedOut", "truncated", "stateKept", "freshInterpreter",
                                      "filesPersist", "freshSandbox", NULL};
  for (int i = 0; flags[i]; i++)
    if (json_is_true(json_object_get(r, flags[i])))
      fprintf(t->out, ", %s", flags[i]);
  const char *sha = json_string_value(json_object_get(r, "recordSha256"));
  fprintf(t->out, ", isolation %s, record %.12s\n",
          str(json_object_get(r, "isolation"), "?"), sha ? sha : "?");
  if (t->no_code_runs)
    fputs("  note| NO CODE RAN: the echo provider echoes the code back as its output\n",
          t->out);
  static const char *const streams[] = {"stdout", "stderr"};
  for (int i = 0; i < 2; i++) {
    const json_t *s = json_object_get(r, streams[i]);
    if (json_string_length(s)) {
      char p[16];
      snprintf(p, sizeof p, "  %s| ", streams[i]);
      lines(t->out, p, p, json_string_value(s), json_string_length(s), MAX_OUTPUT_LINES);
    }
  }
}

static void close_delta(berth_transcript *t)
{
  if (t->in_delta) {
    fputc('\n', t->out);
    t->in_delta = false;
  }
}

void berth_transcript_event(berth_transcript *t, const char *kind, const json_t *data)
{
  if (strcmp(kind, "delta") == 0) {
    if (!t->streaming || !json_is_string(data))
      return;
    if (!t->in_delta)
      fputs("assistant> ", t->out);
    fwrite(json_string_value(data), 1, json_string_length(data), t->out);
    t->in_delta = true;
    fflush(t->out);
    return;
  }
  if (strcmp(kind, "assistant") == 0 && t->in_delta) {
    close_delta(t);             /* already shown, piece by piece */
    return;
  }
  close_delta(t);
  if (strcmp(kind, "user") == 0 || strcmp(kind, "assistant") == 0) {
    char p[16];
    snprintf(p, sizeof p, "%s> ", kind);
    const char *s = json_string_value(data);
    lines(t->out, p, "  ", s ? s : "", s ? json_string_length(data) : 0, 0);
  } else if (strcmp(kind, "toolCall") == 0)
    print_call(t, data);
  else if (strcmp(kind, "toolResult") == 0)
    print_result(t, data);
  else if (strcmp(kind, "error") == 0)
    fprintf(t->out, "error> %s failed: %s\n",
            str(json_object_get(data, "hook"), "a hook"),
            str(json_object_get(data, "message"), "?"));
  else if (strcmp(kind, "suspend") == 0)
    fputs("-- idle: the conversation suspended (onSuspend ran) --\n", t->out);
  else if (strcmp(kind, "resume") == 0)
    fputs("-- a new message resumes the conversation --\n", t->out);
  else if (strcmp(kind, "complete") == 0)
    fputs("-- the conversation completed (onComplete ran) --\n", t->out);
  else if (strcmp(kind, "turnEnd") == 0)
    ;
  else {
    char *s = data ? json_dumps(data, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    fprintf(t->out, "%s> %s\n", kind, s ? s : "");
    free(s);
  }
  fflush(t->out);
}

void berth_transcript_check(berth_transcript *t, bool ok, const char *what)
{
  close_delta(t);
  fprintf(t->out, "  check %s: %s\n", ok ? "ok" : "FAILED", what);
  fflush(t->out);
}
