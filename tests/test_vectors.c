/*
 * test_vectors.c — every vector of tests/vectors/golden-vectors.json reproduced
 * (conformance R03–R07, R16, R19, S11 on the exchange vectors).  One cmocka case per
 * vector, named after its conformance item and the vector's own name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"

static const char *kind(const json_t *v)
{
    return json_string_value(json_object_get(v, "kind"));
}

static const char *expect(const json_t *v)
{
    return json_string_value(json_object_get(v, "expect"));
}

static const json_t *input(const json_t *v, const char *key)
{
    return json_object_get(json_object_get(v, "input"), key);
}

static void assert_no_error(plm_error *e)
{
    if (e) {
        print_error("unexpected error: %s\n", e->message);
        plm_error_free(e);
        fail();
    }
}

static void test_request(void **state)
{
    const json_t *v = *state;
    plm_hex hex;
    assert_no_error(plm_request_digest(input(v, "request"), hex));
    assert_string_equal(hex, expect(v));
}

static void test_result(void **state)
{
    const json_t *v = *state;
    plm_hex hex;
    assert_no_error(plm_result_digest(input(v, "response"), hex));
    assert_string_equal(hex, expect(v));
}

static void test_record(void **state)
{
    const json_t *v = *state;
    plm_error *e = NULL;
    plm_record *rec = plm_record_from_json(input(v, "record"), &e);
    assert_no_error(e);
    assert_non_null(rec);
    plm_hex hex;
    assert_no_error(plm_record_digest(rec, hex));
    assert_string_equal(hex, expect(v));
    plm_record_free(rec);
}

static void test_fingerprint(void **state)
{
    const json_t *v = *state;
    const char *id = json_string_value(input(v, "sessionId"));
    plm_hex hex;
    plm_sha256_hex(id, strlen(id), hex);
    assert_string_equal(hex, expect(v));
}

static void test_rule_id(void **state)
{
    const json_t *v = *state;
    char *id = plm_software_rule_id(input(v, "softwareRule"));
    assert_non_null(id);
    assert_string_equal(id, expect(v));
    free(id);
}

static void test_exchange(void **state)
{
    const json_t *v = *state;
    const json_t *chain_j = input(v, "chain");
    plm_chain chain = {0};
    if (chain_j) {
        chain.fingerprint = json_string_value(json_object_get(chain_j, "fingerprint"));
        chain.last_sha256 = json_string_value(json_object_get(chain_j, "previousSha256"));
        chain.last_sequence = strtoull(
            json_string_value(json_object_get(chain_j, "previousSequence")), NULL, 10);
    }
    plm_error *err = NULL;
    plm_check c;
    if (input(v, "unanswered")) {
        plm_record *rec = plm_record_from_json(input(v, "unanswered"), &err);
        assert_no_error(err);
        c = plm_verify_unanswered(input(v, "request"), rec, &chain, &err);
        plm_record_free(rec);
    } else {
        plm_record *rec = NULL;
        c = plm_verify_answer(input(v, "request"), input(v, "response"), chain_j ? &chain : NULL,
                              &rec, &err);
        plm_record_free(rec);
    }
    if (strcmp(expect(v), "valid") == 0) {
        assert_no_error(err);
        assert_int_equal(c, PLM_CHECK_OK);
    } else {
        assert_non_null(err);
        assert_int_equal(err->code, PLM_DATA_LOSS);
        assert_int_equal(err->not_dispatched, PLM_REFUSAL_NONE);
        assert_string_equal(plm_check_name(c), expect(v));
        plm_error_free(err);
    }
}

static const struct {
    const char *kind, *item;
    void (*fn)(void **);
} kinds[] = {
    {"request", "R03", test_request},
    {"result", "R04", test_result},
    {"record", "R05", test_record},
    {"session_fingerprint", "R05", test_fingerprint},
    {"software_rule_id", "R06", test_rule_id},
    {"exchange", "R16_R19_S11", test_exchange},
};

int main(void)
{
    json_error_t jerr;
    json_t *root = json_load_file("tests/vectors/golden-vectors.json", 0, &jerr);
    if (!root) {
        fprintf(stderr, "cannot load golden vectors: %s\n", jerr.text);
        return 1;
    }
    json_t *vectors = json_object_get(root, "vectors");
    size_t n = json_array_size(vectors);
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    char **names = calloc(n, sizeof *names);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(vectors, i);
        for (size_t k = 0; k < PLM_ARRAY_LEN(kinds); k++) {
            if (strcmp(kind(v), kinds[k].kind) != 0)
                continue;
            names[count] = plm_printf("test_%s_%s", kinds[k].item,
                                      json_string_value(json_object_get(v, "name")));
            tests[count].name = names[count];
            tests[count].test_func = kinds[k].fn;
            tests[count].initial_state = v;
            count++;
        }
    }
    if (count != n) {
        fprintf(stderr, "%zu of %zu vectors have a kind this test does not know\n", n - count, n);
        return 1;
    }
    int failed = _cmocka_run_group_tests("golden_vectors", tests, count, NULL, NULL);
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    free(tests);
    json_decref(root);
    return failed;
}
