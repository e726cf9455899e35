/*
 * json_read.cc — the wire's bodies (the daemon's answers in the client, requests in
 * sandboxd) are read with simdjson, into jansson values.
 *
 * Why: jansson's reader takes a character at a time (UTF-8 check, buffer append,
 * then a second pass for escapes); on a 44 KiB answer that was 600 µs of the
 * client's CPU, against about 10 µs for simdjson's parse and the copy into jansson
 * values that every reader already takes (docs/wire.md §4).  jansson stays the tree;
 * this file is the one place that reads a body.
 *
 * What it accepts is exactly what json_loadb(JSON_ALLOW_NUL | JSON_DECODE_ANY)
 * accepts, because both ends of the wire were written against that reader:
 *  - the text is well-formed UTF-8, and escapes decode to it (a lone surrogate is
 *    refused): simdjson checks both;
 *  - an integer must fit json_int_t: simdjson's unsigned range above INT64_MAX is
 *    refused, as jansson's "too big integer";
 *  - an object key holding U+0000 is refused; strings may hold it;
 *  - a later duplicate key replaces the earlier (or, asked, refuses the text);
 *  - at most 2048 levels of nesting.
 * One difference, on the side of the standard: a raw U+0000 byte is not JSON, and
 * simdjson refuses every text holding one, where jansson takes one right after a
 * number or a literal ("[1\0]").  No daemon writes that.
 * tests/test_json_read.c holds the two readers to the same answers.
 *
 * C++ only because simdjson is: no exception leaves this file (simdjson's are off,
 * the parser is made with nothrow), and the interface is C (json_text.h).
 */
#define SIMDJSON_EXCEPTIONS 0
#include <simdjson.h>

#include <cstdint>
#include <cstring>
#include <new>

#include "json_text.h"

static_assert(PLM_JSON_PADDING >= simdjson::SIMDJSON_PADDING, "the body's padding is simdjson's");

/* jansson's JSON_PARSER_MAX_DEPTH */
static const size_t MAX_DEPTH = 2048;
/* A reader keeps its parser's buffers for texts up to this size: they are reserved
 * at 13 times the text, but only what a text touched stays resident (after a 1.4 MB
 * answer, 1.5 MiB), and a client reading 1 MiB answers spent half its CPU faulting
 * fresh pages in when each parse had buffers of its own (9.4 -> 4.4 ms a call).  A
 * larger text is read with a parser of its own, so one huge answer pins nothing. */
static const size_t KEEP_BYTES = 4 << 20;

struct plm_json_reader {
    simdjson::dom::parser parser;
};

extern "C" plm_json_reader *plm_json_reader_new(void)
{
    plm_json_reader *r = new (std::nothrow) plm_json_reader;
    if (r && r->parser.allocate(4096, MAX_DEPTH) != simdjson::SUCCESS) {
        delete r;
        return NULL;
    }
    return r;
}

extern "C" void plm_json_reader_free(plm_json_reader *r)
{
    delete r;
}

static json_t *to_jansson(simdjson::dom::element e, bool reject_duplicates)
{
    using simdjson::dom::element_type;
    switch (e.type()) {
    case element_type::OBJECT: {
        json_t *o = json_object();
        if (!o)
            return NULL;
        simdjson::dom::object fields = e.get_object().value_unsafe(); /* (a copy: the
                                                            result is a temporary) */
        for (simdjson::dom::key_value_pair f : fields) {
            std::string_view k = f.key;
            if (memchr(k.data(), 0, k.size()) ||
                (reject_duplicates && json_object_getn(o, k.data(), k.size()))) {
                json_decref(o);
                return NULL;
            }
            json_t *v = to_jansson(f.value, reject_duplicates);
            if (!v || json_object_setn_new_nocheck(o, k.data(), k.size(), v) != 0) {
                json_decref(o);
                return NULL;
            }
        }
        return o;
    }
    case element_type::ARRAY: {
        json_t *a = json_array();
        if (!a)
            return NULL;
        simdjson::dom::array items = e.get_array().value_unsafe();
        for (simdjson::dom::element v : items) {
            if (json_array_append_new(a, to_jansson(v, reject_duplicates)) != 0) {
                json_decref(a);
                return NULL;
            }
        }
        return a;
    }
    case element_type::STRING: {
        /* simdjson checked the UTF-8 of the whole text and of every escape */
        std::string_view s = e.get_string().value_unsafe();
        return json_stringn_nocheck(s.data(), s.size());
    }
    case element_type::INT64:
        return json_integer(e.get_int64().value_unsafe());
    case element_type::UINT64:
        return NULL; /* above INT64_MAX: jansson's "too big integer" */
    case element_type::DOUBLE:
        return json_real(e.get_double().value_unsafe());
    case element_type::BOOL:
        return json_boolean(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE:
        return json_null();
    }
    return NULL;
}

extern "C" json_t *plm_json_read(plm_json_reader *r, const char *text, size_t len, int flags)
{
    simdjson::dom::parser own;
    simdjson::dom::parser *p = &r->parser;
    if (len > KEEP_BYTES) {
        if (own.allocate(len, MAX_DEPTH) != simdjson::SUCCESS)
            return NULL;
        p = &own;
    }
    simdjson::dom::element doc;
    if (p->parse(text, len, false).get(doc) != simdjson::SUCCESS)
        return NULL;
    return to_jansson(doc, (flags & PLM_JSON_REJECT_DUPLICATES) != 0);
}
