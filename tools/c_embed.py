"""c_embed.py — files as C string literals, for the programs that carry text in their
binary: sandboxd's interpreter kernels (sandboxd/inside/kernels/embed.py) and berth
serve's page (runtime/faces/web/embed.py).  Each of those renders its C file with `literal`
and hands it to `write_or_check`.
"""
import sys


def literal(decl, data):
    """`decl = "…";` with the bytes of `data`, one source line per line of it.  Bytes
    outside printable ASCII are octal escapes (three digits, so a following digit is
    never taken in), and '?' is escaped so that no trigraph forms under -std=c11."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    lines = [decl + " ="]
    for line in data.splitlines(True):
        out = []
        for b in line:
            c = chr(b)
            if c == "\\":
                out.append("\\\\")
            elif c == '"':
                out.append('\\"')
            elif c == "?":
                out.append("\\?")
            elif c == "\n":
                out.append("\\n")
            elif 32 <= b < 127:
                out.append(c)
            else:
                out.append("\\%03o" % b)
        lines.append('    "%s"' % "".join(out))
    if len(lines) == 1:
        lines.append('    ""')
    lines[-1] += ";"
    return "\n".join(lines) + "\n"


def write_or_check(out, text, regenerate):
    """Writes `text` to `out`; with --check on the command line, writes nothing and
    exits 1 (saying to run `regenerate`) when `out` differs from it."""
    if "--check" in sys.argv[1:]:
        try:
            with open(out) as f:
                same = f.read() == text
        except OSError:
            same = False
        if not same:
            print("%s is stale: run %s" % (out, regenerate))
            sys.exit(1)
        sys.exit(0)
    with open(out, "w") as f:
        f.write(text)
    sys.exit(0)
