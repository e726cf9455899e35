/*
 * record.c — RunRecord values: from and to proto3 JSON, copy, free.
 */
#include "internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void plm_record_free(plm_record *r)
{
    if (!r)
        return;
    free(r->request_sha256);
    free(r->result_sha256);
    free(r->provider);
    free(r->isolation);
    free(r->environment);
    free(r->policy);
    free(r->session);
    free(r->previous_sha256);
    free(r->record_sha256);
    free(r->software_identity);
    free(r->software_rule_id);
    free(r->unanswered);
    free(r);
}

/* The string members, in one place so copy and free cannot drift apart. */
#define RECORD_STRINGS(X) \
    X(request_sha256) X(result_sha256) X(provider) X(isolation) X(environment) X(policy) \
    X(session) X(previous_sha256) X(record_sha256) X(software_identity) \
    X(software_rule_id) X(unanswered)

plm_record *plm_record_copy(const plm_record *src)
{
    if (!src)
        return NULL;
    plm_record *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    *r = *src;
#define COPY(f) r->f = plm_strdup_or_empty(src->f);
    RECORD_STRINGS(COPY)
#undef COPY
    return r;
}

plm_record *plm_record_from_json(const json_t *obj, plm_error **err)
{
    if (!err)
        return NULL;
    *err = NULL;
    if (!obj) {
        *err = plm_err_new(PLM_INVALID_ARGUMENT, PLM_REFUSAL_NONE, "plimsoll: the record is required");
        return NULL;
    }
    if (!json_is_object(obj)) {
        *err = plm_err_malformed("the record is not an object");
        return NULL;
    }
    plm_record *r = calloc(1, sizeof *r);
    if (!r) {
        *err = plm_err_new(PLM_INTERNAL, PLM_REFUSAL_NONE, "plimsoll: out of memory");
        return NULL;
    }
    /* (each label is its error's, a literal: a record that checks formats nothing) */
#define STR(camel, snake, field) {camel, snake, "the record's " camel, offsetof(plm_record, field)}
    static const struct { const char *camel, *snake, *what; size_t off; } strs[] = {
        STR("requestSha256", "request_sha256", request_sha256),
        STR("resultSha256", "result_sha256", result_sha256),
        STR("provider", NULL, provider),
        STR("isolation", NULL, isolation),
        STR("environment", NULL, environment),
        STR("policy", NULL, policy),
        STR("session", NULL, session),
        STR("previousSha256", "previous_sha256", previous_sha256),
        STR("recordSha256", "record_sha256", record_sha256),
        STR("softwareIdentity", "software_identity", software_identity),
        STR("softwareRuleId", "software_rule_id", software_rule_id),
        STR("unanswered", NULL, unanswered),
    };
#undef STR
    for (size_t i = 0; i < PLM_ARRAY_LEN(strs); i++) {
        const char *s;
        if (plm_jstring(plm_jget(obj, strs[i].camel, strs[i].snake), strs[i].what, &s, err) < 0)
            goto fail;
        char **slot = (char **)((char *)r + strs[i].off);
        *slot = strdup(s);
    }
    uint64_t version = 0;
    if (plm_jrecord_int(plm_jget(obj, "version", NULL), "version", false, NULL, &version, err) < 0 ||
        plm_jrecord_int(plm_jget(obj, "startedUnixMs", "started_unix_ms"), "startedUnixMs", true,
                        &r->started_unix_ms, NULL, err) < 0 ||
        plm_jrecord_int(plm_jget(obj, "endedUnixMs", "ended_unix_ms"), "endedUnixMs", true,
                        &r->ended_unix_ms, NULL, err) < 0 ||
        plm_jrecord_int(plm_jget(obj, "sequence", NULL), "sequence", false, NULL, &r->sequence,
                        err) < 0)
        goto fail;
    if (version > UINT32_MAX) {
        *err = plm_err_new(PLM_DATA_LOSS, PLM_REFUSAL_NONE, "plimsoll: the record's version is out of range");
        goto fail;
    }
    r->version = (uint32_t)version;
    return r;
fail:
    plm_record_free(r);
    return NULL;
}

static void set_str(json_t *o, const char *name, const char *v)
{
    if (v && *v)
        json_object_set_new(o, name, json_string(v));
}

static void set_i64(json_t *o, const char *name, int64_t v)
{
    if (v) {
        char s[PLM_INT_TEXT];
        plm_i64_text(s, v);
        json_object_set_new(o, name, json_string(s));
    }
}

json_t *plm_record_to_json(const plm_record *r)
{
    if (!r)
        return NULL;
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (r->version)
        json_object_set_new(o, "version", json_integer(r->version));
    set_str(o, "requestSha256", r->request_sha256);
    set_str(o, "resultSha256", r->result_sha256);
    set_str(o, "provider", r->provider);
    set_str(o, "isolation", r->isolation);
    set_str(o, "environment", r->environment);
    set_str(o, "policy", r->policy);
    set_i64(o, "startedUnixMs", r->started_unix_ms);
    set_i64(o, "endedUnixMs", r->ended_unix_ms);
    set_str(o, "session", r->session);
    if (r->sequence) {
        char seq[PLM_INT_TEXT];
        plm_u64_text(seq, r->sequence);
        json_object_set_new(o, "sequence", json_string(seq));
    }
    set_str(o, "previousSha256", r->previous_sha256);
    set_str(o, "recordSha256", r->record_sha256);
    set_str(o, "softwareIdentity", r->software_identity);
    set_str(o, "softwareRuleId", r->software_rule_id);
    set_str(o, "unanswered", r->unanswered);
    return o;
}
