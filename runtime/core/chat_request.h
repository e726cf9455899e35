/*
 * chat_request.h — the request model.chat hands an adapter, read from its Lua tables.
 *
 * model.chat used to convert the whole {messages, tools} into a jansson tree at every
 * call, 40 % of a scripted turn, though the scripted model reads a few fields and the
 * openai adapter sends text.  Now the tables are checked to have a JSON form without
 * building anything (berth_json_converts), and each adapter reads what it needs
 * through model.h's readers, from the tables themselves, while chat() runs.
 */
#ifndef BERTH_CHAT_REQUEST_H
#define BERTH_CHAT_REQUEST_H

#include <lua.h>

#include "request.h"

typedef struct berth_chat_request {
  berth_model_request base;
  lua_State *L;
  int messages, tools;          /* stack slots of l_chat's frame; tools 0: none */
  int names;                    /* the first of the field names init pushed */
  long count;
  size_t users, last_user;      /* the user messages, counted with the check */
  char *text[BERTH_PARTS];      /* the texts written, owned */
  size_t text_len[BERTH_PARTS];
  json_t **values;              /* what berth_request_value converted, owned */
  size_t n_values, cap_values;
} berth_chat_request;

/* Fills r for the messages and tools at those slots (tools 0: none) of the running C
 * function's frame, where they must stay until berth_chat_request_done.  Raises
 * jsonlua's error, naming the path from the request ($.messages[2].content), when a
 * part has no JSON form.  An array with the array marker that an earlier call checked
 * is walked only from the entries appended since (chat_request.c says why and what it
 * costs); the same walk counts the user messages (berth_request_user_turns).  Pushes
 * the field names the readers look up (4 values), which must stay too.  The readers
 * leave L's stack as they found it. */
void berth_chat_request_init(berth_chat_request *r, lua_State *L, int messages, int tools);
/* Frees what the readers converted.  Never raises. */
void berth_chat_request_done(berth_chat_request *r);

#endif /* BERTH_CHAT_REQUEST_H */
