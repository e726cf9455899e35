/*
 * capability.h — what a test does when this machine lacks something it needs.
 *
 * While working on a machine without bubblewrap, gVisor or an interpreter, a test that
 * needs one is skipped with the reason, and tests/run.sh counts it as skipped.  Under CI
 * (CI=true) `make deps` has installed everything the suites use, so a missing capability
 * is a broken install, never a pass: the same call fails the test instead.
 *
 * Skips that are by design (tier process makes no isolation claim, say) are not missing
 * capabilities: those call cmocka's skip() directly.
 *
 * Include after <cmocka.h>.
 */
#ifndef CAPABILITY_H
#define CAPABILITY_H

#include <stdlib.h>
#include <string.h>

/* True when the run is CI's: every capability make deps installs must be there. */
static inline int capability_required(void)
{
    const char *ci = getenv("CI");
    return ci && strcmp(ci, "true") == 0;
}

/* Prints the reason (printf arguments), then skips the test, or fails it under CI. */
#define skip_missing_capability(...)                                                     \
    do {                                                                                 \
        print_message(__VA_ARGS__);                                                      \
        if (capability_required())                                                       \
            fail_msg("CI=true: a capability that make deps installs is missing (above)"); \
        skip();                                                                          \
    } while (0)

#endif
