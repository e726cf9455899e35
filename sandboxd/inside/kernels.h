/*
 * kernels.h — the interpreters' kernels (sandboxd/inside/kernels/kernel.py and kernel.js),
 * embedded as C strings by sandboxd/inside/kernels/embed.py into kernels.c, and the flags
 * they are started with.  The supervisor passes the kernels in argv (`python3 -c`,
 * `node -e`), so nothing of a kernel is read from a file the sandbox could write.
 */
#ifndef SBX_KERNELS_H
#define SBX_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

extern const char sbx_kernel_py[];
extern const char sbx_kernel_js[];

/* The flags each interpreter takes before the kernel's source (`python3 <flags> -c`,
 * `node <flags> -e`), NULL-terminated: sandboxd/inside/kernels/flags, which says why
 * each is there.  The bare-kernel harness (tests/kernels_test.py) reads that file too. */
extern const char *const sbx_python_flags[];
extern const char *const sbx_node_flags[];

/* A kernel's command line into argv[cap], NULL-terminated (kernel_argv.c): interpreter
 * (the path of python3 or node), the language's flags above, heap (Node's heap limit,
 * `--max-old-space-size=N`, or NULL for none; Python's memory is capped by RLIMIT_AS
 * instead), `-c` or `-e` with the kernel's source, then the kernel's two arguments:
 * the prefix of its FIFOs and its token.  The strings are borrowed, not copied: they
 * must outlive argv's use.  False, argv untouched, when cap is too small. */
bool sbx_kernel_argv(const char **argv, size_t cap, bool python, const char *interpreter,
                     const char *heap, const char *prefix, const char *token);

#endif
