#!/usr/bin/env python3
"""bench/figures.py — the README's table of figures, drawn from bench/results.json.

Each row says what is measured, the figures of the last `make bench`, and each target
with whether those figures meet it.  Both are decided here from the numbers, so the
README never carries a figure or a "met" typed by hand.  What the figures mean, where
their time goes and what changed them is docs/performance.md.

report.py writes the table into README.md between the lines MARK_BEGIN and MARK_END
after each run.  By hand:

  python3 bench/figures.py [--results FILE] [--write README.md | --check README.md]

prints the table (and the line before it that names the run), writes it into the
file, or exits 1 when the file's table is not the one the results give
(tests/test_figures.sh checks the committed README that way).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK_BEGIN = "<!-- figures: written by bench/figures.py from bench/results.json -->"
MARK_END = "<!-- /figures -->"

PROVIDERS = [("echo", "echo"), ("process", "process"), ("bwrap", "bwrap"),
             ("gvisor", "gVisor")]
LANGUAGES = [("python", "Python"), ("javascript", "JavaScript")]


class Missing(Exception):
    """A figure the results do not hold (a benchmark failed or was not run)."""


# ------------------------------------------------------------------ reading results

def get(obj, *path):
    for key in path:
        try:
            obj = obj[key]
        except (KeyError, IndexError, TypeError):
            raise Missing("/".join(str(p) for p in path))
    return obj["value"] if isinstance(obj, dict) and "value" in obj else obj


def column(table, name):
    """{x: value} of one column of a curve TABLE (report.py)."""
    names = [c["name"] for c in table["columns"]]
    if name not in names:
        raise Missing(name)
    k = names.index(name) + 1
    return {row[0]: row[k] for row in table["rows"]}


def dist(cells, provider, language, what, p="p50"):
    return get(cells, "providers", provider, language, what, "percentiles", p)


# ------------------------------------------------------------------ formatting

def grouped(n):
    """An integer with a space between thousands, every digit kept."""
    return "{:,}".format(int(n)).replace(",", " ")


def num(x):
    """A count with a space between thousands, to three significant figures."""
    if x >= 1000:
        x = round(x, -(len(str(int(x))) - 3))
    return grouped(round(x))


def sig(x, digits=2):
    """A measurement to `digits` significant figures, trailing zeros kept, no exponent."""
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return "%.0f" % x
    return ("%#.*g" % (digits, x)).rstrip(".")


def ms(x):
    return sig(x / 1000) + " s" if x >= 1000 else sig(x) + " ms"


def us_or_ms(us):
    return sig(us / 1000) + " ms" if us >= 1000 else sig(us, 3) + " µs"


def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else "%s–%s" % (fmt(lo), fmt(hi))


# ------------------------------------------------------------------ the rows
#
# Each row function takes results["benchmarks"] and returns (figures, [target]), where
# a target is (text, failures): failures lists what misses it, empty when it is met.

def row_verify_small(b):
    v = get(b, "client", "verify", 0)
    return ("%s µs (%s× a bare SHA-256 of %s)"
            % (sig(get(v, "verify")), sig(get(v, "ratio")), kib(get(v, "stdout"))), [])


def row_verify_large(b):
    v = get(b, "client", "verify", -1)
    ratio = get(v, "ratio")
    return ("%s (%s× a bare SHA-256; base64 decoding the wire form %s)"
            % (us_or_ms(get(v, "verify")), sig(ratio, 3), us_or_ms(get(v, "base64_decode"))),
            [("≤ 1.3× a bare SHA-256", [] if ratio <= 1.3 else ["%s×" % sig(ratio, 3)])])


def kib(size):
    return "%d %s" % ((size // 1048576, "MiB") if size >= 1048576 else (size // 1024, "KiB"))


def row_client(b):
    def by_size(key):
        return {get(r, "stdout"): get(r, "client_cpu") for r in get(b, "client", key)}

    def sizes(cpu, notes=None):
        return ", ".join("%s %s%s" % (kib(s), us_or_ms(cpu[s]), (notes or {}).get(s, ""))
                         for s in sorted(cpu))

    runs = by_size("end_to_end")
    # Each figure is the median of a few runs, each against a sandboxd of its own
    # (bench/client.c); at 1 KiB, whose target is at the line, every run is shown.
    notes = {get(r, "stdout"): " (median of %s)" % ", ".join(us_or_ms(x) for x in r["starts"])
             for r in get(b, "client", "end_to_end")
             if get(r, "stdout") == 1024 and r.get("starts")}
    text = sizes(runs, notes)
    try:  # the client and sandboxd on one core (bench/client.c says why it differs)
        one = by_size("end_to_end_one_core")
    except Missing:
        one = {}
    if one:
        text += "; on one core with sandboxd: " + sizes(one)
    targets = []
    for size, limit in ((1024, 50), (32768, 150)):
        if size not in runs:
            raise Missing("client at %d B" % size)
        targets.append(("≤ %d µs at %s" % (limit, kib(size)),
                        [] if runs[size] <= limit else [us_or_ms(runs[size])]))
    return text, targets


def row_warm(language):
    def row(b):
        cells = get(b, "cells")
        parts, p50 = [], {}
        for key, name in PROVIDERS:
            try:
                p50[key] = dist(cells, key, language, "warm")
            except Missing:
                continue
            parts.append("%s %s (%s) ms" % (name, sig(p50[key]),
                                            sig(dist(cells, key, language, "warm", "p95"))))
        targets = []
        for key, name, limit in (("echo", "echo", 0.08), ("bwrap", "bwrap", 0.2),
                                 ("gvisor", "gVisor", 0.6)):
            got = p50.get(key)
            miss = ["not measured"] if got is None else [] if got <= limit else [sig(got)]
            targets.append(("%s ≤ %g ms" % (name, limit), miss))
        return ", ".join(parts), targets
    return row


def row_pooled(b):
    cells = get(b, "cells")
    parts, got = [], []
    for key, name in PROVIDERS[1:]:
        try:
            pair = [dist(cells, key, lang, "pooled_open_first") for lang, _ in LANGUAGES]
        except Missing:
            continue
        parts.append("%s %s / %s ms" % (name, sig(pair[0]), sig(pair[1])))
        got += [("%s %s" % (name, lname), v) for (_, lname), v in zip(LANGUAGES, pair)]
    if not got:
        raise Missing("pooled_open_first")
    idle = []  # what a member costs while it waits (bench/cells.c idle_cpu), when measured
    for key, name in PROVIDERS[1:]:
        try:
            idle.append("%s %s" % (name, sig(get(cells, "providers", key, "idle",
                                                 "cpu_per_sandbox"))))
        except Missing:
            continue
    text = ", ".join(parts)
    if idle:
        text += "; an idle member uses %s %% of a core" % ", ".join(idle)
    targets = [("≤ %g ms each" % limit,
                ["%s %s" % (what, sig(v)) for what, v in got if v > limit])
               for limit in (5, 2)]
    return text, targets


def row_paused(b):
    """The cells after a 10 s pause (bench/cells.c bench_pause): no target, the cost a
    conversation's next turn pays beside the warm figures."""
    cells = get(b, "cells")
    parts = []
    for key, name in PROVIDERS[1:]:
        try:
            pairs = ["%s / %s (%s)" % (sig(dist(cells, key, lang, "paused_first")),
                                       sig(dist(cells, key, lang, "paused_next")),
                                       sig(dist(cells, key, lang, "paused_next", "p95")))
                     for lang, _ in LANGUAGES]
        except Missing:
            continue
        parts.append("%s %s ms" % (name, ", ".join(pairs)))
    if not parts:
        raise Missing("paused_first")
    return ", ".join(parts), []


def row_idle_memory(b):
    curve = get(b, "idle_memory", "curve")
    alloc, rss = column(curve, "one_turn_allocator"), column(curve, "one_turn_rss")
    kb = lambda x: sig(x / 1024)  # noqa: E731
    text = ("%s–%s conversations, after one turn: %s KiB allocated, RSS %s KiB each"
            % (num(min(alloc)), num(max(alloc)), span(list(alloc.values()), kb),
               span(list(rss.values()), kb)))
    worst = max(rss.values())
    # a run whose turns failed measured no idle conversation: its bytes say nothing
    failed = ["%s turns failed at %s" % (grouped(r["failed_turns"]["value"]),
                                         num(r["params"]["conversations"]))
              for r in get(b, "idle_memory", "runs")
              if r.get("failed_turns", {}).get("value")]
    return text, [("≤ 8 KiB (RSS)", failed + ([] if worst <= 8192 else ["%s KiB" % kb(worst)]))]


def row_turns(b):
    curve = get(b, "turns_per_second", "curve")
    rate, cpu = column(curve, "rate_wall"), column(curve, "cpu_per_turn")
    xs = sorted(rate)
    text = ", ".join("%s at %s" % (num(rate[x]), num(x)) for x in xs)
    text += " (CPU a turn %s → %s µs)" % (sig(cpu[xs[0]], 3), sig(cpu[xs[-1]], 3))
    at1000 = rate.get(1000)
    return text, [
        ("≥ 20 000 at each point", ["%s at %s" % (num(rate[x]), num(x))
                                    for x in xs if rate[x] < 20000]),
        ("≥ 50 000 at 1 000", ["not measured"] if at1000 is None
         else [] if at1000 >= 50000 else [num(at1000)])]


def row_held(b):
    curves = get(b, "turns_held", "curves")
    parts = []
    for engine in sorted(curves, key=lambda e: e != "memory"):
        rate = column(curves[engine], "rate_wall")
        parts.append("%s: %s" % (engine, ", ".join(
            "%s beside %s" % (num(rate[x]), num(x)) for x in sorted(rate))))
    memory = column(get(curves, "memory"), "rate_wall")
    most = max(memory)
    got = memory[most]
    return "; ".join(parts), [("≥ 40 000 beside %s (memory store)" % num(most),
                               [] if most >= 100000 and got >= 40000 else [num(got)])]


def store_sizes(st):
    """The conversation counts store_turns ran at, from its keys (memory_1000, ...)."""
    return sorted({int(k.split("_")[1]) for k in st
                   if "_" in k and k.split("_")[1].isdigit()})


def row_store(b):
    st = get(b, "store_turns")
    sizes = store_sizes(st)
    at = lambda engine, what: [get(st, "%s_%d" % (engine, n), what) for n in sizes]  # noqa
    mem, sql, pg = at("memory", "rate_wall"), at("sqlite", "rate_wall"), at("postgresql",
                                                                          "rate_wall")
    ratio = at("sqlite", "ratio_to_memory")
    text = ("at %s conversations: memory %s turns/s; sqlite %s (%s× memory); "
            "PostgreSQL %s" % (" / ".join(num(n) for n in sizes),
                               " / ".join(num(x) for x in mem), " / ".join(num(x) for x in sql),
                               " / ".join(sig(x) for x in ratio), " / ".join(num(x) for x in pg)))
    return text, [
        ("sqlite ≥ 0.7× memory", ["%s× at %s" % (sig(r), num(n))
                                  for r, n in zip(ratio, sizes) if r < 0.7]),
        ("PostgreSQL ≥ 5 000", ["%s at %s" % (num(r), num(n))
                                for r, n in zip(pg, sizes) if r < 5000])]


def row_resumed(b):
    st = get(b, "store_turns")
    sizes = store_sizes(st)
    parts, late = [], []
    for engine, name in (("sqlite", "sqlite"), ("postgresql", "PostgreSQL")):
        keys = ["%s_%d" % (engine, n) for n in sizes]
        more = [(get(st, k, "resumed_message") - get(st, k, "warm_message"), k) for k in keys]
        parts.append("%s %s ms" % (name, " / ".join("+%s" % sig(m) for m, _ in more)))
        late += ["%s +%s ms" % (k, sig(m)) for m, k in more if m > 5]
    return ("%s at %s conversations" % (", ".join(parts), " / ".join(num(x) for x in sizes)),
            [("≤ 5 ms more", late)])


def serve_losses(run):
    """A serve_load run's turns lost (never answered or never finished) and misclassified,
    over every round it ran: bench/report.py keeps each round's in "rounds", so a turn
    lost in any round is never hidden by the median's.  A run with no rounds (one
    benchmark's own fragment) counts its own."""
    if "rounds" in run:
        return (sum(x["lost"] for x in run["rounds"]),
                sum(x["misclassified"] for x in run["rounds"]))
    return get(run, "lost") + get(run, "never_finished"), get(run, "misclassified")


def row_serve(b):
    runs = sorted(get(b, "serve_load", "runs"), key=lambda r: r["params"]["conversations"])
    parts, at100 = [], None
    for r in runs:
        n = r["params"]["conversations"]
        text = "%s at once %s turns/s, p99 %s" % (
            num(n), num(get(r, "rate")), ms(get(r, "turn_latency", "percentiles", "p99")))
        notes = []
        later = r.get("later_turn_latency")
        if later and "percentiles" in later:
            notes.append("%s after the first turns" % ms(later["percentiles"]["p99"]))
        if len(r.get("rounds", [])) > 1:  # the run of median p99 (bench/report.py)
            notes.append("runs' p99 %s" % ", ".join(ms(x["p99"]) for x in r["rounds"]))
        if notes:
            text += " (%s)" % "; ".join(notes)
        parts.append(text)
        if n == 100:
            at100 = r
    losses = [serve_losses(r) for r in runs]
    lost, wrong = sum(x[0] for x in losses), sum(x[1] for x in losses)
    parts.append("%d lost, %d misclassified" % (lost, wrong))
    if at100 is None:
        raise Missing("serve_load at 100")
    rate, p99 = get(at100, "rate"), get(at100, "turn_latency", "percentiles", "p99")
    return "; ".join(parts), [
        ("≥ 5 000 turns/s at 100 streams", [] if rate >= 5000 else [num(rate)]),
        ("p99 ≤ 30 ms there", [] if p99 <= 30 else [ms(p99)]),
        ("nothing lost or misclassified", [] if lost == wrong == 0
         else ["%d lost, %d misclassified" % (lost, wrong)])]


ROWS = [
    ("verification of a session cell, 1 KiB stdout", row_verify_small),
    ("verification of a session cell, 1 MiB stdout", row_verify_large),
    ("client CPU per verified call, through sandboxd echo", row_client),
    ("warm trivial Python cell, p50 (p95)", row_warm("python")),
    ("warm trivial JavaScript cell, p50 (p95)", row_warm("javascript")),
    ("pooled open + first cell, p50, Python / JavaScript", row_pooled),
    ("after a 10 s pause: the first cell, p50 / the four after it, p50 (p95); Python, "
     "JavaScript",
     row_paused),
    ("memory per idle conversation in one host", row_idle_memory),
    ("scripted turns/s, no code, one core (median of 3 rounds)", row_turns),
    ("scripted turns/s of 1 000 conversations beside others held idle, suspended and "
     "stored", row_held),
    ("scripted turns/s with a store, the loop on one core", row_store),
    ("first message after a restart, more than a warm one's", row_resumed),
    ("`berth serve`, 10 echo cells a conversation, conversations at once (the run of median "
     "p99 of 3)", row_serve),
]


def verdict(targets):
    out = []
    for text, failures in targets:
        out.append("%s: %s" % (text, "met" if not failures
                               else "**not met** (%s)" % ", ".join(failures)))
    return "; ".join(out)


def table(results):
    b = results["benchmarks"]
    machine, when = results.get("machine", {}), results.get("date", "?")
    sha = (results.get("commit") or {}).get("sha", "?")[:7]
    lines = ["The last `make bench`: %s, commit %s%s, on %s (%s cores, %s GiB, %s, Linux %s%s)."
             % (when.replace("T", " ")[:16], sha,
                " with changes" if (results.get("commit") or {}).get("modified") else "",
                machine.get("cpu", "?"), machine.get("cores", "?"),
                sig((machine.get("memory_bytes") or 0) / 2**30),
                machine.get("os", "?"), machine.get("kernel", "?"),
                "" if machine.get("kvm") else ", no KVM"),
             "", "| What | Figures | Targets |", "|---|---|---|"]
    for what, fn in ROWS:
        try:
            figures, targets = fn(b)
            said = verdict(targets) or "none set"
        except Missing as e:
            figures, said = "not measured (%s)" % e, ""
        lines.append("| %s | %s | %s |" % (what, figures, said))
    failed = results.get("failed") or []
    if failed:
        lines += ["", "Failed in that run: " + ", ".join(
            "%s %s (exit %s)" % (f["bench"], " ".join(f.get("args", [])), f["exit"])
            for f in failed) + "."]
    return "\n".join(lines) + "\n"


def splice(text, block):
    """text with what lies between the markers replaced by block; None without them."""
    start, end = text.find(MARK_BEGIN), text.find(MARK_END)
    if start < 0 or end < start:
        return None
    head = text[:start + len(MARK_BEGIN)] + "\n"
    return head + block + text[end:]


def update(path, results, write):
    """Compares the table in the file at path with the one results give, and writes it
    there when write is true.  Returns "same", "changed" (written when write) or
    "unmarked" (the file has no markers: nothing written)."""
    with open(path) as f:
        text = f.read()
    new = splice(text, table(results))
    if new is None:
        return "unmarked"
    if new == text:
        return "same"
    if write:
        with open(path, "w") as f:
            f.write(new)
    return "changed"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results.json"))
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE")
    group.add_argument("--check", metavar="FILE")
    a = ap.parse_args()
    with open(a.results) as f:
        results = json.load(f)
    path = a.write or a.check
    if not path:
        sys.stdout.write(table(results))
        return 0
    status = update(path, results, write=bool(a.write))
    if status == "unmarked":
        print("bench/figures: %s has no %r ... %r lines" % (path, MARK_BEGIN, MARK_END),
              file=sys.stderr)
        return 2
    if a.check and status == "changed":
        print("bench/figures: the table in %s is not the one %s gives; "
              "python3 bench/figures.py --write %s" % (path, a.results, path),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
