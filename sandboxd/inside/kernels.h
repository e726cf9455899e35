/*
 * kernels.h — the interpreters' kernels (sandboxd/inside/kernels/kernel.py and kernel.js),
 * embedded as C strings by sandboxd/inside/kernels/embed.py into kernels.c, and the flags
 * they are started with.  The supervisor passes the kernels in argv (`python3 -c`,
 * `node -e`), so nothing of a kernel is read from a file the sandbox could write.
 */
#ifndef SBX_KERNELS_H
#define SBX_KERNELS_H

extern const char sbx_kernel_py[];
extern const char sbx_kernel_js[];

/* The flags each interpreter takes before the kernel's source (`python3 <flags> -c`,
 * `node <flags> -e`), NULL-terminated: sandboxd/inside/kernels/flags, which says why
 * each is there.  The bare-kernel harness and bench/cells' floor start kernels with
 * them too. */
extern const char *const sbx_python_flags[];
extern const char *const sbx_node_flags[];

#endif
