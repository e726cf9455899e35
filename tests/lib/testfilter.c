/*
 * testfilter.c — one way to run one test, in every C suite: TEST_FILTER=PATTERN (cmocka's
 * filter: * and ? wildcards over test names, e.g. TEST_FILTER='test_I11_*') runs only the
 * tests whose names match.  Linked into every test program with the rest of tests/lib, it
 * sets the filter before main() runs, so no suite has to.  The shell suites read the same
 * variable (tests/lib/shtest.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

__attribute__((constructor)) static void test_filter_from_env(void)
{
    const char *pattern = getenv("TEST_FILTER");
    if (pattern && *pattern)
        cmocka_set_test_filter(pattern);
}
