#!/usr/bin/env python3
"""bench/report.py — runs every benchmark, writes bench/results.json, draws bench/plots.

`make bench` calls it after building.  Each benchmark prints its figures for a person
as it runs (they pass straight through) and, with BENCH_JSON=PATH, writes them as one
JSON fragment (bench/benchjson.h); the scale benchmarks run once per point of their
curve.  This script then merges the fragments into bench/results.json:

  {"schema": 1, "date", "duration_s", "machine": {cpu, cores, memory_bytes, kernel,
   os, kvm, compiler}, "commit": {sha, modified},
   "benchmarks": {"client": FRAGMENT, "cells": FRAGMENT, "store_turns": FRAGMENT,
                  "turns_per_second" | "idle_memory" | "serve_load":
                      {"runs": [FRAGMENT, ...], "curve": TABLE},
                  "turns_held": {"runs": [FRAGMENT, ...], "curves": {ENGINE: TABLE}}},
                  (a turns_per_second or turns_held run is the median of its point's
                  rounds by turns/s, with every round's turns/s in rounds_rate_wall;
                  a serve_load run the median by p99, with every round's rate, p99
                  and losses in rounds)
   "failed": [{"bench", "args", "exit"}], "plots": [paths]}

where a TABLE is {"x": {name, unit}, "columns": [{name, unit}], "rows": [[x, ...]]}, and
draws the PNGs with gnuplot (bench/plots.gp) from data files it writes under
BUILD/bench/plotdata, and writes README.md's table of figures (bench/figures.py).
Exits non-zero when a benchmark failed (after writing all).

  python3 bench/report.py [--build DIR] [--merge-only | --quick]

--merge-only skips the runs and rebuilds the report from the fragments already in
BUILD/bench/json; --quick runs two points a curve and fewer cells (a smoke run, not a
report: it writes BUILD/bench/quick/).  BENCH_WARM and BENCH_PROVIDERS (cells) pass through to the benchmarks.
A benchmark still running after BENCH_TIMEOUT seconds (900) is killed with what it
started (its own process group) and reported failed: `make bench` never hangs.
"""
import argparse
import datetime
import json
import glob
import os
import platform
import re
import signal
import subprocess
import sys
import time

import figures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The points of the scale curves: conversations per run.  Sized for `make bench` to
# take a few minutes on the project's 2-core machine.
TPS_POINTS = [100, 300, 1000, 3000, 10000, 30000]
IDLE_POINTS = [1000, 3000, 10000, 30000, 100000]
SERVE_POINTS = [10, 30, 100, 300, 1000, 2000]
# turns_per_second --held: 1 000 conversations turning beside this many held (suspended,
# stored) ones, on each store engine.  (Without a store, 100 000 held with three turns
# each keep their history in the Lua heap, past 15/16 of its 256 MiB cap: the host
# refuses new messages there, and the run stops.)
HELD_POINTS = [0, 1000, 10000, 100000]
HELD_ENGINES = ["memory", "sqlite"]
HELD_ROUNDS = 3  # each point is the run of median turns/s (this machine varies 20-40 %)
TPS_ROUNDS = 3   # the same for turns_per_second's points: a run at 1 000 lasts 0.2 s
# serve_load's points: each is the run of median p99.  A run's p99 is its first turns',
# which all start at once: a stall of the machine's in those 20-40 ms moves it whole
# (the same build read 26-50 ms at 100 in eight runs in a row, docs/performance.md §1)
SERVE_ROUNDS = 3
QUICK = False


def plan():
    global HELD_ROUNDS, TPS_ROUNDS, SERVE_ROUNDS
    if QUICK:
        TPS_POINTS[:] = IDLE_POINTS[:] = [100, 1000]
        SERVE_POINTS[:] = [10, 100]
        HELD_POINTS[:] = [0, 1000]
        HELD_ROUNDS = TPS_ROUNDS = SERVE_ROUNDS = 1
    runs = [("client", "client", []), ("cells", "cells", [])]
    # the stores: PostgreSQL in a private cluster the benchmark starts (when installed)
    engines = "memory,sqlite" + (",postgresql" if glob.glob("/usr/lib/postgresql/*/bin/initdb")
                                 else "")
    runs += [("store_turns", "store_turns",
              ["--engines", engines, "--conversations", "1000" if QUICK else "1000,10000",
               "--rounds", "1" if QUICK else "3"])]
    runs += [("turns_per_second", "turns_per_second-%d-r%d" % (n, k),
              ["--conversations", str(n)])
             for k in range(TPS_ROUNDS) for n in TPS_POINTS]
    runs += [("turns_per_second", "turns_held_%s-%d-r%d" % (engine, n, k),
              ["--conversations", "1000", "--held", str(n), "--store", engine,
               "--time-limit", "240"])
             for k in range(HELD_ROUNDS) for engine in HELD_ENGINES for n in HELD_POINTS]
    runs += [("idle_memory", "idle_memory-%d" % n, ["--conversations", str(n)])
             for n in IDLE_POINTS]
    runs += [("serve_load", "serve_load-%d-r%d" % (n, k), ["--conversations", str(n)])
             for k in range(SERVE_ROUNDS) for n in SERVE_POINTS]
    return runs


def run_one(argv, env):
    """One benchmark's exit status, or a string saying it was killed: a benchmark (and
    the daemons it started) still running after BENCH_TIMEOUT seconds is killed as a
    group."""
    limit = float(os.environ.get("BENCH_TIMEOUT", "900"))
    p = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        return p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return "killed after %g s" % limit
    finally:  # timed out, or ^C (which reaches this script alone: its own session)
        if p.returncode is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_all(build, frags):
    os.makedirs(frags, exist_ok=True)
    for f in os.listdir(frags):  # no fragment of an earlier run is merged
        os.unlink(os.path.join(frags, f))
    failed = []
    env = dict(os.environ, BUILD=build)
    if QUICK:
        env.setdefault("BENCH_WARM", "50")
    for bench, tag, args in plan():
        path = os.path.join(frags, tag + ".json")
        sys.stdout.flush()
        rc = run_one([os.path.join(build, "bench", bench)] + args, dict(env, BENCH_JSON=path))
        if rc != 0:
            print("bench/report: %s %s exited %s" % (bench, " ".join(args), rc))
            failed.append({"bench": bench, "args": args, "exit": rc})
    return failed


def first_line(cmd):
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def machine():
    cpu = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    osname = None
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    osname = line.split("=", 1)[1].strip().strip('"')
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "kernel": platform.release(), "os": osname, "arch": platform.machine(),
            "kvm": os.path.exists("/dev/kvm"), "compiler": first_line(["cc", "--version"])}


def commit():
    sha = first_line(["git", "rev-parse", "HEAD"])
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                            cwd=ROOT, capture_output=True, text=True)
    return {"sha": sha, "modified": bool(status.stdout.strip())} if sha else None


def load(frags, tag):
    try:
        with open(os.path.join(frags, tag + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def val(fig):
    return fig["value"] if isinstance(fig, dict) else None


def curve(runs, columns, x="conversations"):
    """columns: [(name, unit, fn(fragment) -> value)]; x is params[x]."""
    rows = [[r["params"][x]] + [fn(r) for _, _, fn in columns]
            for r in sorted(runs, key=lambda r: r["params"][x])]
    return {"x": {"name": x, "unit": "conversations"},
            "columns": [{"name": n, "unit": u} for n, u, _ in columns], "rows": rows}


def pct(p):
    return lambda r: r["turn_latency"]["percentiles"][p]


def rounds_of(frags, tag, rounds):
    """The fragments of tag-r0 ... that ran, in the order they ran."""
    return [f for f in (load(frags, "%s-r%d" % (tag, k)) for k in range(rounds)) if f]


def median_round(frags, tag, rounds):
    """The fragment of the round with the median turns/s among tag-r0 ... (None if
    none ran), with every round's turns/s in rounds_rate_wall."""
    got = sorted(rounds_of(frags, tag, rounds), key=lambda r: val(r["rate_wall"]))
    if not got:
        return None
    median = dict(got[(len(got) - 1) // 2])
    median["rounds_rate_wall"] = [val(r["rate_wall"]) for r in got]
    return median


def median_serve_round(frags, tag, rounds):
    """The serve_load fragment of the round with the median p99 among tag-r0 ... (None
    if none ran), with every round's rate, p99 and losses in "rounds", in the order they
    ran: a turn lost or misclassified in any round is never hidden by the median."""
    ran = rounds_of(frags, tag, rounds)
    if not ran:
        return None
    median = dict(sorted(ran, key=pct("p99"))[(len(ran) - 1) // 2])
    median["rounds"] = []
    for r in ran:
        lost, wrong = figures.serve_losses(r)
        median["rounds"].append({"rate": val(r["rate"]), "p99": pct("p99")(r), "lost": lost,
                                 "misclassified": wrong})
    return median


def merge(frags):
    out = {}
    for name in ("client", "cells", "store_turns"):
        frag = load(frags, name)
        if frag:
            out[name] = frag
    scale = {
        "turns_per_second": (TPS_POINTS, [
            ("rate_wall", "turns/s", lambda r: val(r["rate_wall"])),
            ("rate_cpu", "turns/s", lambda r: val(r["rate_cpu"])),
            ("cpu_per_turn", "us", lambda r: val(r["cpu_per_turn"])),
            ("latency_p50", "ms", pct("p50")), ("latency_p99", "ms", pct("p99")),
            ("lua_state_per_conversation", "B",
             lambda r: val(r["lua_state"]) / r["params"]["conversations"])]),
        "idle_memory": (IDLE_POINTS, [
            ("%s_%s" % (state, what), "B/conversation",
             (lambda s, w: lambda r: val(r[s][w]))(state, what))
            for state in ("opened", "one_turn", "suspended")
            for what in ("allocator", "lua", "rss")]),
        "serve_load": (SERVE_POINTS, [
            ("rate", "turns/s", lambda r: val(r["rate"])),
            ("latency_p50", "ms", pct("p50")), ("latency_p90", "ms", pct("p90")),
            ("latency_p99", "ms", pct("p99")),
            ("latency_max", "ms", lambda r: r["turn_latency"]["max"]),
            ("lost", "turns", lambda r: figures.serve_losses(r)[0]),
            ("misclassified", "turns", lambda r: figures.serve_losses(r)[1])]),
    }
    for name, (points, columns) in scale.items():
        if name == "turns_per_second":
            runs = [r for r in (median_round(frags, "%s-%d" % (name, n), TPS_ROUNDS)
                                for n in points) if r]
        elif name == "serve_load":
            runs = [r for r in (median_serve_round(frags, "%s-%d" % (name, n), SERVE_ROUNDS)
                                for n in points) if r]
        else:
            runs = [f for f in (load(frags, "%s-%d" % (name, n)) for n in points) if f]
        if runs:
            out[name] = {"runs": runs, "curve": curve(runs, columns)}
    held = {"runs": [], "curves": {}}
    for engine in HELD_ENGINES:
        runs = [r for r in (median_round(frags, "turns_held_%s-%d" % (engine, n), HELD_ROUNDS)
                            for n in HELD_POINTS) if r]
        if runs:
            held["runs"] += runs
            held["curves"][engine] = curve(runs, [
                ("rate_wall", "turns/s", lambda r: val(r["rate_wall"])),
                ("rate_cpu", "turns/s", lambda r: val(r["rate_cpu"])),
                ("cpu_per_turn", "us", lambda r: val(r["cpu_per_turn"])),
                ("held_lua_state", "B", lambda r: val(r["held_lua_state"]))], x="held")
    if held["runs"]:
        out["turns_held"] = held
    return out


# ------------------------------------------------------------------ plots

def write(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(" ".join(str(x) for x in row) + "\n")


def cdf_rows(dist):
    """(x, fraction <= x) rows from a distribution's samples or histogram."""
    n = dist["n"]
    if not n:
        return []
    if "samples" in dist:
        return [(x, (i + 1) / n) for i, x in enumerate(dist["samples"])]
    rows, seen = [(dist["min"], 0)], 0
    h = dist["histogram"]
    for le, c in zip(h["le"], h["count"]):
        seen += c
        rows.append((min(le, dist["max"]), seen / n))
    return rows


def plot(results, build, dest):
    data = os.path.join(build, "bench", "plotdata")
    plots = os.path.join(dest, "plots")
    os.makedirs(data, exist_ok=True)
    os.makedirs(plots, exist_ok=True)
    b = results["benchmarks"]
    m = results["machine"]
    var = {"data": data, "plots": plots,
           "machine": "%s, %s cores, Linux %s, %s" % (m["cpu"], m["cores"], m["kernel"],
                                                     results["date"][:10])}
    made = []
    if "cells" in b:
        provs = [p for p, v in b["cells"]["providers"].items() if v.get("available")]
        bars = []
        for p in provs:
            for lang in ("python", "javascript"):
                d = b["cells"]["providers"][p].get(lang, {})
                if "warm" in d:
                    write(os.path.join(data, "cells_%s_%s.dat" % (p, lang)), cdf_rows(d["warm"]))
                cold = d.get("cold_open_first", {}).get("percentiles", {}).get("p50", "NaN")
                pooled = d.get("pooled_open_first", {}).get("percentiles", {}).get("p50", "NaN")
                bars.append(('"%s %s"' % (p, lang), cold, pooled))
        write(os.path.join(data, "cells_open.dat"), bars)
        var["cells"] = " ".join(provs)
        made += ["cells_warm_cdf.png", "cells_open.png"]
    for name in ("serve_load", "turns_per_second"):
        if name in b:
            runs = sorted(b[name]["runs"], key=lambda r: r["params"]["conversations"])
            for r in runs:
                write(os.path.join(data, "%s_cdf_%d.dat" % (name, r["params"]["conversations"])),
                      cdf_rows(r["turn_latency"]))
            var[name] = " ".join(str(r["params"]["conversations"]) for r in runs)
            made += ["%s_latency_cdf.png" % name, "%s_scale.png" % name]
    for name in ("serve_load", "turns_per_second", "idle_memory"):
        if name in b:
            write(os.path.join(data, "%s_scale.dat" % name), b[name]["curve"]["rows"])
    if "turns_held" in b:
        engines = sorted(b["turns_held"]["curves"])
        for e in engines:  # a log x axis has no 0: none held is drawn at 100
            write(os.path.join(data, "turns_held_%s.dat" % e),
                  [[max(r[0], 100)] + r[1:] for r in b["turns_held"]["curves"][e]["rows"]])
        var["turns_held"] = " ".join(engines)
        made.append("turns_held_scale.png")
    if "idle_memory" in b:
        var["idle_memory"] = "yes"
        made.append("idle_memory_scale.png")
    if "client" in b:
        write(os.path.join(data, "client_verify.dat"),
              [(val(r["stdout"]), val(r["verify"]), val(r["sha256"]), val(r["base64_decode"]))
               for r in b["client"]["verify"]])
        write(os.path.join(data, "client_e2e.dat"),
              [(val(r["stdout"]), val(r["client_cpu"]), val(r["wall"]))
               for r in b["client"].get("end_to_end", [])])
        made.append("client_verify.png")
    for f in made:
        if os.path.exists(os.path.join(plots, f)):
            os.unlink(os.path.join(plots, f))
    args = "; ".join("%s='%s'" % (k, v.replace("'", "")) for k, v in var.items())
    rc = subprocess.call(["gnuplot", "-e", args, os.path.join(ROOT, "bench", "plots.gp")])
    if rc != 0:
        print("bench/report: gnuplot exited %d" % rc)
    return [os.path.relpath(os.path.join(plots, f), ROOT) for f in made
            if os.path.exists(os.path.join(plots, f))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--merge-only", action="store_true")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    global QUICK
    QUICK = a.quick
    build = os.path.join(ROOT, a.build)
    frags = os.path.join(build, "bench", "json")
    dest = os.path.join(build, "bench", "quick") if QUICK else os.path.join(ROOT, "bench")
    t0 = time.monotonic()
    start = datetime.datetime.now(datetime.timezone.utc)
    failed = [] if a.merge_only else run_all(build, frags)
    results = {"schema": 1, "date": start.isoformat(timespec="seconds"),
               "duration_s": None if a.merge_only else round(time.monotonic() - t0, 1),
               "machine": machine(), "commit": commit(), "benchmarks": merge(frags),
               "failed": failed}
    if a.merge_only:
        old = os.path.join(dest, "results.json")
        if os.path.exists(old):  # the runs' own date and duration stand
            with open(old) as f:
                prev = json.load(f)
            results["date"], results["duration_s"] = prev["date"], prev["duration_s"]
            results["failed"] = prev.get("failed", [])
    results["plots"] = plot(results, build, dest)
    # Indented, with each list of numbers (samples, bins, rows) on one line.
    text = re.sub(r"\[\s+([-0-9.eE+,\snul]+?)\s+\]",
                  lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]",
                  json.dumps(results, indent=1))
    with open(os.path.join(dest, "results.json"), "w") as f:
        f.write(text + "\n")
    # the README's table of figures is this run's (bench/figures.py)
    if not QUICK and figures.update(os.path.join(ROOT, "README.md"), results,
                                    write=True) == "unmarked":
        print("bench/report: README.md has no table markers; not written", file=sys.stderr)
    print("bench/report: %s/results.json, %d plots in %s/plots (%s s)"
          % (os.path.relpath(dest, ROOT), len(results["plots"]), os.path.relpath(dest, ROOT),
             results["duration_s"]))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
