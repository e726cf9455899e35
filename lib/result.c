/*
 * result.c — freeing results, infos and close summaries.
 */
#include "internal.h"

#include <stdlib.h>

static void record_clear(plm_record *r)
{
    plm_record *copy = malloc(sizeof *copy);
    if (copy) {
        *copy = *r;
        plm_record_free(copy); /* frees the members */
    }
}

void plm_result_free(plm_result *r)
{
    if (!r)
        return;
    free(r->sandbox);
    free(r->isolation);
    free(r->software_identity);
    free(r->environment);
    record_clear(&r->record);
    if (r->stdout_text != (char *)r->stdout_bytes.data) /* a lossy copy (text_of) */
        free(r->stdout_text);
    if (r->stderr_text != (char *)r->stderr_bytes.data)
        free(r->stderr_text);
    free(r->stdout_bytes.data);
    free(r->stderr_bytes.data);
    free(r->outcome_detail);
    for (size_t i = 0; i < r->n_steps; i++) {
        free(r->steps[i].command);
        free(r->steps[i].stdout_bytes.data);
        free(r->steps[i].stderr_bytes.data);
    }
    free(r->steps);
    for (size_t i = 0; i < r->n_artifacts; i++) {
        free(r->artifacts[i].path);
        free(r->artifacts[i].content.data);
    }
    free(r->artifacts);
    free(r->end_detail);
    free(r);
}

static void env_clear(plm_environment *e)
{
    free(e->identity);
    free(e->software_identity);
    for (size_t i = 0; i < e->n_python_packages; i++) {
        free(e->python_packages[i].name);
        free(e->python_packages[i].version);
    }
    free(e->python_packages);
}

void plm_info_free(plm_info *i)
{
    if (!i)
        return;
    free(i->sandbox);
    free(i->isolation);
    free(i->policy);
    env_clear(&i->javascript);
    env_clear(&i->project);
    env_clear(&i->module);
    env_clear(&i->session);
    free(i);
}

void plm_close_summary_free(plm_close_summary *s)
{
    if (!s)
        return;
    free(s->session);
    free(s->last_record_sha256);
    free(s);
}
