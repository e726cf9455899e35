/*
 * provider.c — the table of compiled-in providers and the result helpers every
 * provider shares.
 */
#include "provider.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

extern const sbx_provider_ops sbx_echo_provider;
extern const sbx_provider_ops sbx_gvisor_provider;
extern const sbx_provider_ops sbx_bwrap_provider;
extern const sbx_provider_ops sbx_process_provider;

static const sbx_provider_ops *const providers[] = {
    &sbx_echo_provider,
    &sbx_gvisor_provider,
    &sbx_bwrap_provider,
    &sbx_process_provider,
};

const sbx_provider_ops *sbx_provider_find(const char *name)
{
    for (size_t i = 0; i < SBX_ARRAY_LEN(providers); i++)
        if (strcmp(providers[i]->name, name) == 0)
            return providers[i];
    return NULL;
}

const char *sbx_provider_names(void)
{
    return "auto, gvisor, bwrap, process, echo";
}

sbx_result *sbx_result_new(sbx_kind kind)
{
    sbx_result *r = sbx_xcalloc(1, sizeof *r);
    r->kind = kind;
    r->ended = PLM_END_OPEN;
    return r;
}

void sbx_buf_set(sbx_buf *b, const void *data, size_t len)
{
    free(b->data);
    b->data = sbx_xmalloc(len + 1);
    if (len)
        memcpy(b->data, data, len);
    b->data[len] = '\0';
    b->len = len;
}

void sbx_result_free(sbx_result *r)
{
    if (!r)
        return;
    sbx_err_free(r->error);
    free(r->out.data);
    free(r->err.data);
    free(r->outcome_detail);
    for (size_t i = 0; i < r->n_steps; i++) {
        free(r->steps[i].command);
        free(r->steps[i].out.data);
        free(r->steps[i].err.data);
    }
    free(r->steps);
    for (size_t i = 0; i < r->n_artifacts; i++) {
        free(r->artifacts[i].path);
        free(r->artifacts[i].content.data);
    }
    free(r->artifacts);
    free(r->environment);
    free(r->software_identity);
    free(r->end_detail);
    free(r);
}
