/*
 * sandboxes_fresh.c — what a fresh run sends (docs/client.md §6.8): a project holding the
 * call's files, the code as a cell file and a runner that makes the run behave like a
 * session cell (the last expression printed, top-level await, imports from the work
 * directory), or on a daemon without projects one JavaScript snippet.
 */
#include "internal.h"
#include "sandboxes_internal.h"

#include <stdlib.h>
#include <string.h>

/* Runs under `python3 -I`: no PYTHON* variables, no user site, and neither the script's
 * directory nor the work directory on the path until the runner puts the work directory
 * back, after its own imports and its event loop exist, so a work-directory file (a
 * json.py, an asyncio.py) cannot replace what the runner itself uses.  The cell runs at
 * module level in a namespace of its own, like a session cell; an awaitable result is
 * driven on a private loop, so a cell that calls asyncio.run itself still works. */
static const char python_runner[] =
    "# plimsoll: runs .plimsoll/cell.py as a session cell would run it\n"
    "import ast, asyncio, inspect, linecache, sys\n"
    "\n"
    "loop = asyncio.new_event_loop()\n"
    "sys.path.insert(0, '')\n"
    "# UTF-8 as the client wrote it, whatever the image's locale says.\n"
    "with open('.plimsoll/cell.py', encoding='utf-8') as cell_file:\n"
    "    src = cell_file.read()\n"
    "linecache.cache['cell'] = (len(src), None, src.splitlines(True), 'cell')\n"
    "tree = ast.parse(src, 'cell', 'exec')\n"
    "last = None\n"
    "if tree.body and isinstance(tree.body[-1], ast.Expr):\n"
    "    last = ast.Expression(tree.body.pop().value)\n"
    "namespace = {'__name__': '__main__', '__builtins__': __builtins__}\n"
    "flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT\n"
    "\n"
    "def settle(value):\n"
    "    return loop.run_until_complete(value) if inspect.isawaitable(value) else value\n"
    "\n"
    "settle(eval(compile(tree, 'cell', 'exec', flags=flags), namespace))\n"
    "if last is not None:\n"
    "    value = settle(eval(compile(last, 'cell', 'eval', flags=flags), namespace))\n"
    "    if value is not None:\n"
    "        print(repr(value))\n";

/* A session cell runs in `node -e`, whose globals include require (rooted at the work
 * directory), module, exports, __dirname and __filename; the runner provides the same.
 * Top-level await is Node's own REPL rewrite (internal/repl/await), which only
 * --expose-internals makes loadable and which is not a public API: when it is missing
 * the cell runs unrewritten, and a cell that awaits at the top level fails visibly. */
static const char javascript_runner[] =
    "// plimsoll: runs .plimsoll/cell.js as a session cell would run it\n"
    "const fs = require('node:fs');\n"
    "const util = require('node:util');\n"
    "const vm = require('node:vm');\n"
    "const { createRequire } = require('node:module');\n"
    "globalThis.require = createRequire(process.cwd() + '/');\n"
    "globalThis.module = { exports: {} };\n"
    "globalThis.exports = globalThis.module.exports;\n"
    "globalThis.__dirname = '.';\n"
    "globalThis.__filename = '[eval]';\n"
    "let rewrite = null;\n"
    "try { rewrite = require('internal/repl/await').processTopLevelAwait; } catch (_) {}\n"
    "const src = fs.readFileSync('.plimsoll/cell.js', 'utf8');\n"
    "let wrapped = null;\n"
    "if (rewrite) { try { wrapped = rewrite(src); } catch (_) {} }\n"
    "(async () => {\n"
    "  let value;\n"
    "  if (wrapped) {\n"
    "    const out = await vm.runInThisContext(wrapped, { filename: 'cell.js' });\n"
    "    value = out === undefined ? undefined : out.value;\n"
    "  } else {\n"
    "    value = vm.runInThisContext(src, { filename: 'cell.js' });\n"
    "    if (value instanceof Promise) value = await value;\n"
    "  }\n"
    "  if (value !== undefined) console.log(util.inspect(value, { depth: 4 }));\n"
    "})().catch((err) => { console.error(err); process.exitCode = 1; });\n";

static const plm_runner runners[] = {
    {"python", ".plimsoll/cell.py", ".plimsoll/run.py", "python3 -I .plimsoll/run.py",
     python_runner},
    {"javascript", ".plimsoll/cell.js", ".plimsoll/run.cjs",
     "node --expose-internals .plimsoll/run.cjs", javascript_runner},
};

const plm_runner *plm_runner_for(const char *language)
{
    for (size_t i = 0; language && i < PLM_ARRAY_LEN(runners); i++) {
        if (strcmp(runners[i].language, language) == 0)
            return &runners[i];
    }
    return NULL;
}

plm_file *plm_fresh_files(const plm_runner *r, const char *code, const plm_file *files,
                          size_t n, size_t *n_out)
{
    plm_file *all = malloc((n + 2) * sizeof *all);
    if (!all)
        return NULL;
    if (n)
        memcpy(all, files, n * sizeof *all);
    all[n] = (plm_file){r->cell_path, code};
    all[n + 1] = (plm_file){r->runner_path, r->source};
    *n_out = n + 2;
    return all;
}

/* The code travels as a JSON string literal, which is a JavaScript string literal too.
 * The value is shown with util.inspect where `require` exists (Node), else as JSON, else
 * as a string (QuickJS). */
char *plm_snippet_runner(const char *code)
{
    json_t *s = json_string(code ? code : "");
    char *literal = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    if (!literal)
        return NULL;
    char *snippet = plm_printf(
        "(() => {\n"
        "  const show = (v) => {\n"
        "    if (typeof require === \"function\") {\n"
        "      try { return require(\"node:util\").inspect(v, { depth: 4 }); } catch (_) {}\n"
        "    }\n"
        "    try { const s = JSON.stringify(v); if (s !== undefined) return s; } catch (_) {}\n"
        "    return String(v);\n"
        "  };\n"
        "  const v = (0, eval)(%s);\n"
        "  Promise.resolve(v).then((w) => { if (w !== undefined) console.log(show(w)); });\n"
        "})();\n",
        literal);
    free(literal);
    return snippet;
}

const char *plm_outcome_name(plm_outcome o)
{
    switch (o) {
    case PLM_OUTCOME_COMPLETED: return "completed";
    case PLM_OUTCOME_SETUP_FAILED: return "setup_failed";
    case PLM_OUTCOME_TIMED_OUT: return "timed_out";
    case PLM_OUTCOME_PROTOCOL_ERROR: return "protocol_error";
    default: return "unspecified";
    }
}
