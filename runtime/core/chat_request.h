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
  char *text[BERTH_PARTS];      /* the texts written, owned */
  size_t text_len[BERTH_PARTS];
  json_t **values;              /* what berth_request_value converted, owned */
  size_t n_values, cap_values;
} berth_chat_request;

/* What the model.chat calls of one conversation checked of a part (messages, tools):
 * the array they checked, held by a registry reference (so that its address names it
 * while remembered), and how many of its entries.  A history is an array that grows
 * by appending, and walking all of it at every call was a sixth of a served turn's
 * CPU at 30 turns a conversation, and grew with every turn.  So the next call with
 * the same array walks only the entries appended since: the store's rule for
 * ctx.messages (runtime/README.md), where an entry changed in place after it was seen
 * is not read again.  Such an entry reaches the adapter, whose reader of it fails
 * (the call fails: nil, message, code) where model.chat would have raised.
 * Zeroed, it remembers nothing; berth_chat_checked_forget drops what it holds. */
typedef struct berth_chat_checked {
  int ref;                      /* the array's registry reference; 0: none */
  const void *table;            /* its address */
  lua_Integer n;                /* its entries checked */
} berth_chat_checked;

enum { BERTH_CHAT_CHECKED_MESSAGES, BERTH_CHAT_CHECKED_TOOLS, BERTH_CHAT_CHECKED_PARTS };

/* Fills r for the messages and tools at those slots (tools 0: none) of the running C
 * function's frame, where they must stay until berth_chat_request_done.  Raises
 * jsonlua's error, naming the path from the request ($.messages[2].content), when a
 * part has no JSON form.  `checked` (BERTH_CHAT_CHECKED_PARTS of them, or NULL: every
 * entry is walked) says what earlier calls checked and is updated.  Pushes the field
 * names the readers look up (4 values), which must stay too.  The readers leave L's
 * stack as they found it. */
void berth_chat_request_init(berth_chat_request *r, lua_State *L, int messages, int tools,
                             berth_chat_checked *checked);
/* Drops the references `checked` (BERTH_CHAT_CHECKED_PARTS of them) holds and zeroes
 * it.  Never raises. */
void berth_chat_checked_forget(lua_State *L, berth_chat_checked *checked);
/* Frees what the readers converted.  Never raises. */
void berth_chat_request_done(berth_chat_request *r);

#endif /* BERTH_CHAT_REQUEST_H */
