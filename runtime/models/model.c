/*
 * model.c — choosing a model adapter by its spec ("scripted:FILE", "openai",
 * "openai:MODEL").
 */
#include "model.h"
#include "xalloc.h"
#include "openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

berth_model *berth_model_new(const char *spec, const berth_model_options *o, char **err)
{
  *err = NULL;
  if (strncmp(spec, "scripted:", 9) == 0) {
    json_t *script = berth_script_load(spec + 9, err);
    if (!script)
      return NULL;
    berth_model *m = berth_scripted_new(script, o, err);
    json_decref(script);
    return m;
  }
  if (strcmp(spec, "openai") == 0 || strncmp(spec, "openai:", 7) == 0) {
    berth_openai_options oo;
    berth_openai_options_init(&oo);
    if (berth_openai_options_env(&oo, err) != 0)
      return NULL;
    if (spec[6] == ':')         /* openai:MODEL overrides BERTH_MODEL */
      oo.model = spec + 7;
    return berth_openai_new(&oo, o, err);
  }
  size_t n = strlen(spec) + 128;
  *err = berth_xmalloc(n);
  snprintf(*err, n, "unknown model \"%s\" (available: scripted:FILE, openai, openai:MODEL)", spec);
  return NULL;
}

void berth_model_free(berth_model *m)
{
  if (m)
    m->ops->free(m);
}
