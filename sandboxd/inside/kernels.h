/*
 * kernels.h — the interpreters' kernels (sandboxd/inside/kernels/kernel.py and kernel.js),
 * embedded as C strings by sandboxd/inside/kernels/embed.py into kernels.c.  The supervisor
 * passes them in argv (`python3 -I -c`, `node -e`), so nothing of the kernel is read
 * from a file the sandbox could write.
 */
#ifndef SBX_KERNELS_H
#define SBX_KERNELS_H

extern const char sbx_kernel_py[];
extern const char sbx_kernel_js[];

#endif
