/*
 * sanitizer.h — BUILT_WITH_ASAN, defined when this file is compiled under
 * AddressSanitizer (gcc defines __SANITIZE_ADDRESS__; clang answers
 * __has_feature(address_sanitizer)).  The one test of it, for code that must take
 * another way there (make check-asan): the Lua heap stays on malloc, where the sanitizer
 * checks it (runtime/core/contain.c); sandboxd forks instead of its vfork-like clone
 * (sandboxd/providers/proc.c); and the test of that clone is skipped.
 *
 * Header only; not part of plimsoll.h, not installed.
 */
#ifndef BERTH_SANITIZER_H
#define BERTH_SANITIZER_H

#if defined(__SANITIZE_ADDRESS__)
#define BUILT_WITH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUILT_WITH_ASAN 1
#endif
#endif

#endif /* BERTH_SANITIZER_H */
