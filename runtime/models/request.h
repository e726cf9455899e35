/*
 * request.h — what a berth_model_request is made of (internal; model.h has its
 * readers).  Each maker gives its own readers: the host reads the Lua tables model.chat
 * was given (runtime/core/chat_request.c), request.c reads a JSON value.  The readers
 * of model.h check their arguments and dispatch here.
 */
#ifndef BERTH_REQUEST_H
#define BERTH_REQUEST_H

#include "model.h"

#include <stdbool.h>

/* The parts a text is asked of, by the name berth_request_text was given. */
enum { BERTH_PART_MESSAGES, BERTH_PART_TOOLS, BERTH_PARTS };

typedef struct berth_request_ops {
  long (*count)(const berth_model_request *r);
  /* i < count, name not NULL */
  const char *(*string)(const berth_model_request *r, size_t i, const char *name,
                        size_t *len);
  const json_t *(*value)(const berth_model_request *r, size_t i, const char *name);
  /* part: BERTH_PART_MESSAGES or BERTH_PART_TOOLS, an index into each maker's own */
  int (*text)(const berth_model_request *r, int part, const char **text, size_t *len);
  /* berth_request_user_turns where the maker has a cheaper way than reading every
   * message's role (NULL: none); false when it cannot answer (memory), and the readers
   * walk the messages instead */
  bool (*user_turns)(const berth_model_request *r, size_t *count, size_t *last);
  void (*free)(berth_model_request *r);   /* NULL: not freed by berth_request_free */
} berth_request_ops;

/* Every maker's struct starts with this. */
struct berth_model_request {
  const berth_request_ops *ops;
};

#endif /* BERTH_REQUEST_H */
