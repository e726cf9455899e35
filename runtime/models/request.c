/*
 * request.c — the readers of a model call's request (model.h), and a request read
 * from a JSON value, for callers in C.
 */
#include "request.h"
#include "json_text.h"            /* lib/: the one compact JSON writer */

#include <stdlib.h>
#include <string.h>

long berth_request_count(const berth_model_request *r)
{
  return r->ops->count(r);
}

const char *berth_request_string(const berth_model_request *r, size_t i, const char *name,
                                 size_t *len)
{
  long n = r->ops->count(r);
  if (n < 0 || i >= (size_t)n || !name)
    return NULL;
  return r->ops->string(r, i, name, len);
}

size_t berth_request_user_turns(const berth_model_request *r, size_t *last)
{
  size_t count = 0, at = 0;
  long n = r->ops->count(r);
  if (n > 0 && !(r->ops->user_turns && r->ops->user_turns(r, &count, &at)))
    for (size_t i = 0; i < (size_t)n; i++) {
      size_t len;
      const char *role = r->ops->string(r, i, "role", &len);
      if (role && len == 4 && memcmp(role, "user", 4) == 0) {
        count++;
        at = i;
      }
    }
  if (last)
    *last = at;
  return count;
}

const json_t *berth_request_value(const berth_model_request *r, size_t i, const char *name)
{
  long n = r->ops->count(r);
  if (n < 0 || i >= (size_t)n || !name)
    return NULL;
  return r->ops->value(r, i, name);
}

int berth_request_text(const berth_model_request *r, const char *part, const char **text,
                       size_t *len)
{
  static const char *const names[BERTH_PARTS] = {"messages", "tools"};
  *text = NULL;
  *len = 0;
  for (int k = 0; part && k < BERTH_PARTS; k++)
    if (strcmp(part, names[k]) == 0)
      return r->ops->text(r, k, text, len);
  return 0;
}

void berth_request_free(berth_model_request *r)
{
  if (r && r->ops->free)
    r->ops->free(r);
}

/* {====================================================== from a JSON value */

typedef struct json_request {
  berth_model_request base;
  const json_t *request;
  char *text[BERTH_PARTS];      /* written when first asked for */
  size_t len[BERTH_PARTS];
} json_request;

static long j_count(const berth_model_request *r)
{
  const json_t *msgs = json_object_get(((const json_request *)r)->request, "messages");
  return json_is_array(msgs) ? (long)json_array_size(msgs) : -1;
}

static const json_t *message(const berth_model_request *r, size_t i)
{
  return json_array_get(json_object_get(((const json_request *)r)->request, "messages"), i);
}

static const char *j_string(const berth_model_request *r, size_t i, const char *name,
                            size_t *len)
{
  const json_t *v = json_object_get(message(r, i), name);
  if (!json_is_string(v))
    return NULL;
  if (len)
    *len = json_string_length(v);
  return json_string_value(v);
}

static const json_t *j_value(const berth_model_request *r, size_t i, const char *name)
{
  return json_object_get(message(r, i), name);
}

static int j_text(const berth_model_request *r, int k, const char **text, size_t *len)
{
  json_request *j = (json_request *)r;   /* the text is kept once written */
  if (!j->text[k]) {
    const json_t *v = json_object_get(j->request, k == BERTH_PART_MESSAGES ? "messages"
                                                                           : "tools");
    if (!v || json_is_null(v))
      return 0;
    if (!(j->text[k] = plm_json_write(v, &j->len[k])))
      return -1;
  }
  *text = j->text[k];
  *len = j->len[k];
  return 0;
}

static void j_free(berth_model_request *r)
{
  json_request *j = (json_request *)r;
  for (int k = 0; k < BERTH_PARTS; k++)
    free(j->text[k]);
  free(j);
}

static const berth_request_ops json_ops = {j_count, j_string, j_value, j_text, NULL, j_free};

berth_model_request *berth_request_from_json(const json_t *request)
{
  json_request *j = calloc(1, sizeof *j);
  if (!j)
    return NULL;
  j->base.ops = &json_ops;
  j->request = request;
  return &j->base;
}

/* }====================================================== */
