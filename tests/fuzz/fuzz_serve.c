/*
 * fuzz_serve.c — the request bodies of `berth serve` (runtime/faces/serve.c): any bytes a
 * caller can POST, decoded as the body of POST /v1/conversations and of POST
 * /v1/conversations/{id}/messages by the functions the server calls.
 *
 * Checked: nothing crashes, leaks or reads out of bounds; a body is either taken, with
 * fields of the promised shape (cli.h), or refused with a reason that fits the error
 * body unchanged: valid UTF-8 (jansson refuses anything else, and the caller would get
 * "{}" instead of the error) and shorter than the 512 bytes error_response keeps.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void check_reason(char *why)
{
  json_t *s = json_string(why);
  if (!s || strlen(why) >= 512)
    abort();
  json_decref(s);
  free(why);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const char *body = (const char *)data;

  berth_serve_create c;
  char *why = berth_serve_create_body(body, size, &c);
  if (why) {
    if (c.body)
      abort();
    check_reason(why);
  } else {
    if (!json_is_object(c.body) || json_object_size(c.body) > 2)
      abort();
    if (c.user && (strlen(c.user) == 0 || strlen(c.user) > 128 ||
                   strlen(c.user) != json_string_length(json_object_get(c.body, "userId"))))
      abort();
    if (c.metadata && (!json_is_object(c.metadata) ||
                       c.metadata != json_object_get(c.body, "metadata")))
      abort();
    json_decref(c.body);
  }

  json_t *m;
  const char *content;
  why = berth_serve_message_body(body, size, &m, &content);
  if (why) {
    if (m || content)
      abort();
    check_reason(why);
  } else {
    if (!json_is_object(m) || json_object_size(m) != 1 || !content ||
        strlen(content) != json_string_length(json_object_get(m, "content")))
      abort();
    json_decref(m);
  }
  return 0;
}
