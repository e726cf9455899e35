#!/usr/bin/env python3
"""Tests of bench/figures.py, the README's table of figures.

    python3 tests/figures_test.py

The committed README's table must be the one the committed bench/results.json gives,
and each target's verdict must follow the numbers: a figure moved past its line turns
"met" into "not met" naming it, and a benchmark that did not run reads "not measured".
Prints one line per failed check and cmocka-style summary lines; exits non-zero on any
failure.
"""
import copy
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import figures  # noqa: E402
from checks import check, finish  # noqa: E402

def row(results, what):
    """The table's row that starts with what, as its three cells."""
    for line in figures.table(results).splitlines():
        if line.startswith("| " + what):
            return [c.strip() for c in line.strip("|").split(" | ")]
    return None


def set_curve(table, name, x, value):
    k = [c["name"] for c in table["columns"]].index(name) + 1
    for r in table["rows"]:
        if r[0] == x:
            r[k] = value


def main():
    with open(os.path.join(ROOT, "bench", "results.json")) as f:
        results = json.load(f)
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()

    spliced = figures.splice(readme, figures.table(results))
    check("test_readme_table_is_the_committed_results", spliced == readme,
          "run: python3 bench/figures.py --write README.md")
    check("test_splice_is_idempotent",
          figures.splice(spliced, figures.table(results)) == spliced)
    check("test_splice_without_markers_is_none", figures.splice("no table here", "x") is None)

    r = copy.deepcopy(results)
    for run in r["benchmarks"]["client"]["end_to_end"]:
        if run["stdout"]["value"] == 1024:
            run["client_cpu"]["value"] = 61.0
        if run["stdout"]["value"] == 32768:
            run["client_cpu"]["value"] = 149.0
    for run in r["benchmarks"]["client"]["end_to_end"]:
        if run["stdout"]["value"] == 1024:
            run["starts"] = [72.5, 61.0, 48.0]
    cells = row(r, "client CPU")
    check("test_client_cpu_at_1_kib_shows_every_start",
          cells and "1 KiB 61.0 µs (median of 72.5 µs, 61.0 µs, 48.0 µs)" in cells[1], cells)
    check("test_client_cpu_past_its_line_is_not_met",
          cells and "≤ 50 µs at 1 KiB: **not met** (61.0 µs)" in cells[2], cells)
    check("test_client_cpu_under_its_line_is_met",
          cells and "≤ 150 µs at 32 KiB: met" in cells[2], cells)
    r["benchmarks"]["client"]["end_to_end_one_core"] = [
        {"stdout": {"value": 1024, "unit": "B"}, "client_cpu": {"value": 28.0, "unit": "us/call"}}]
    cells = row(r, "client CPU")
    check("test_client_cpu_on_one_core_is_shown_and_decides_nothing",
          cells and "on one core with sandboxd: 1 KiB 28.0 µs" in cells[1]
          and "≤ 50 µs at 1 KiB: **not met** (61.0 µs)" in cells[2], cells)

    r = copy.deepcopy(results)
    at100 = [x for x in r["benchmarks"]["serve_load"]["runs"]
             if x["params"]["conversations"] == 100][0]
    at100["rate"]["value"] = 5200.0
    at100["turn_latency"]["percentiles"]["p99"] = 29.0
    cells = row(r, "`berth serve`")
    check("test_serve_at_5000_turns_and_p99_29_ms_is_met",
          cells and "≥ 5 000 turns/s at 100 streams: met" in cells[2]
          and "p99 ≤ 30 ms there: met" in cells[2], cells)
    at100.pop("rounds", None)     # a run of its own: its own count
    at100["lost"]["value"] = 1
    cells = row(r, "`berth serve`")
    check("test_a_lost_turn_is_named",
          cells and "nothing lost or misclassified: **not met** (1 lost, 0 misclassified)"
          in cells[2], cells)
    at100["lost"]["value"] = 0
    at100["rounds"] = [{"rate": 7000.0, "p99": 26.0, "lost": 0, "misclassified": 0},
                       {"rate": 5200.0, "p99": 44.0, "lost": 0, "misclassified": 1},
                       {"rate": 6900.0, "p99": 29.0, "lost": 0, "misclassified": 0}]
    cells = row(r, "`berth serve`")
    check("test_serve_shows_every_runs_p99",
          cells and "runs' p99 26 ms, 44 ms, 29 ms" in cells[1], cells)
    check("test_a_turn_misclassified_in_a_run_not_the_median_is_named",
          cells and "nothing lost or misclassified: **not met** (0 lost, 1 misclassified)"
          in cells[2], cells)

    r = copy.deepcopy(results)
    set_curve(r["benchmarks"]["turns_per_second"]["curve"], "rate_wall", 1000, 48000.0)
    cells = row(r, "scripted turns/s, no code")
    check("test_turns_at_1000_under_50000_is_not_met",
          cells and "≥ 50 000 at 1 000: **not met** (48 000)" in cells[2], cells)

    r = copy.deepcopy(results)
    for p in r["benchmarks"]["cells"]["providers"].values():
        for lang in ("python", "javascript"):
            if "pooled_open_first" in p.get(lang, {}):
                p[lang]["pooled_open_first"]["percentiles"]["p50"] = 1.5
    cells = row(r, "pooled open + first cell")
    check("test_pooled_under_2_ms_everywhere_is_met",
          cells and cells[2] == "≤ 5 ms each: met; ≤ 2 ms each: met", cells)

    r = copy.deepcopy(results)
    for key, share in (("gvisor", 1.43), ("bwrap", 0.0012), ("process", 0.0)):
        r["benchmarks"]["cells"]["providers"][key]["idle"] = {
            "cpu_per_sandbox": {"value": share, "unit": "% of a core"}}
    cells = row(r, "pooled open + first cell")
    check("test_pooled_row_says_what_an_idle_member_uses",
          cells and cells[1].endswith("; an idle member uses process 0, bwrap 0.0012, "
                                      "gVisor 1.4 % of a core"), cells)
    del r["benchmarks"]["cells"]["providers"]["bwrap"]["idle"]
    cells = row(r, "pooled open + first cell")
    check("test_pooled_row_names_only_the_idle_members_measured",
          cells and "uses process 0, gVisor 1.4 % of a core" in cells[1], cells)

    r = copy.deepcopy(results)
    for run in r["benchmarks"]["idle_memory"]["runs"]:
        if run["params"]["conversations"] == 100000:
            run["failed_turns"] = {"value": 13622, "unit": "turns"}
    cells = row(r, "memory per idle conversation")
    check("test_idle_memory_whose_turns_failed_is_not_met",
          cells and "**not met** (13 622 turns failed at 100 000)" in cells[2], cells)

    r = copy.deepcopy(results)
    del r["benchmarks"]["serve_load"]
    cells = row(r, "`berth serve`")
    check("test_a_benchmark_that_did_not_run_is_not_measured",
          cells and cells[1].startswith("not measured") and cells[2] == "", cells)
    r["failed"] = [{"bench": "serve_load", "args": ["--conversations", "100"], "exit": 1}]
    check("test_a_failed_benchmark_is_said",
          "Failed in that run: serve_load --conversations 100 (exit 1)."
          in figures.table(r))

    for what, _ in figures.ROWS:
        cells = row(results, what)
        check("test_row_has_figures: " + what, cells and not cells[1].startswith("not measured"),
              cells)

    return finish()


if __name__ == "__main__":
    sys.exit(main())
