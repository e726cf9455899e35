/*
 * kernel_argv.c — a kernel's command line (kernels.h), laid out in one place for the
 * supervisor, which starts kernels inside a sandbox, and for bench/cells' floor, which
 * starts them bare: a floor started any other way would measure another kernel.
 */
#include "kernels.h"

bool sbx_kernel_argv(const char **argv, size_t cap, bool python, const char *interpreter,
                     const char *heap, const char *prefix, const char *token)
{
    const char *const *flags = python ? sbx_python_flags : sbx_node_flags;
    size_t n = 0;
    while (flags[n])
        n++;
    /* the interpreter, its flags, the heap limit, -c/-e, source, prefix, token, NULL */
    if (n + 7 > cap)
        return false;
    size_t i = 0;
    argv[i++] = interpreter;
    for (size_t k = 0; k < n; k++)
        argv[i++] = flags[k];
    if (heap)
        argv[i++] = heap;
    argv[i++] = python ? "-c" : "-e";
    argv[i++] = python ? sbx_kernel_py : sbx_kernel_js;
    argv[i++] = prefix;
    argv[i++] = token;
    argv[i] = NULL;
    return true;
}
