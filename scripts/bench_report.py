#!/usr/bin/env python3
"""The benchmark's JSON (`k3moe bench --json`) as the README's table, or two runs side by side.

  scripts/bench_report.py table DECODE.json [PREFILL.json ...]   the README's Markdown table
  scripts/bench_report.py sustained BURST.json ... --sustained SUSTAINED.json ...
                                                                  the README's table of the same rows
                                                                  under sustained load (bench --sustain-ms)
  scripts/bench_report.py compare A.json B.json                   per row: A and B us, B / A - 1, floor/t,
                                                                  and each run's SM clock (median MHz / share
                                                                  under the power cap) where it was sampled
  scripts/bench_report.py ab --a A1.json [A2.json ...] --b B1.json [B2.json ...] [--tolerance PCT]
                                                                  rounds of two builds (scripts/ab.sh --json-dir):
                                                                  per row each build's us per round and the change
                                                                  of B's mean over A's, then a verdict: B faster in
                                                                  sum and no row slower by more than PCT (0.3)
  scripts/bench_report.py targets DECODE.json [PREFILL.json ...]  the README's table of issues 4 and 5's
                                                                  targets against the run's floor/t, and the
                                                                  floor/t of a pure read of the same bytes
  scripts/bench_report.py stages DECODE.json                      the README's breakdown of each decode row:
                                                                  each stage's us and each GEMM's TB/s
  scripts/bench_report.py readme RUN                              the README's four tables and its JSON path
                                                                  moved to run RUN (bench/results/RUN-decode.json,
                                                                  -prefill, -sustained-decode, -sustained-prefill)

A diagnostic run (`bench --no-l2-flush`, or a forced --tile, --kernel or --splits) makes no
README table; `compare` takes it.

Only the standard library; tests/python/test_bench_report.py checks them and that the README's
tables are the ones its "Latest run" JSON gives.
"""
import argparse
import collections
import json
import re
import sys
from pathlib import Path

# Marlin MoE on the same H200, whole flow in a CUDA graph (../shared/docs/PERF.md), a16 only.
MARLIN_US = {
    ("local28", 1, "a16"): 132.5,
    ("local28", 8, "a16"): 213,
    ("local28", 32, "a16"): 315,
    ("local28", 128, "a16"): 736,
    ("local28", 4096, "a16"): 16500,
    ("ep32", 64, "a16"): 176,
    ("ep16", 256, "a16"): 459,
    ("ep16", 8192, "a16"): 3690,
}

HEADER = ("| shape | T | mode | active experts | µs | µs +route | TB/s | TFLOP/s | floor/t | read/t "
          "| baseline µs | speed-up | Marlin µs |")
RULE = "|" + "---|" * 13

ROW_FIELDS = ("shape", "tokens", "mode", "active_experts", "us", "us_with_routing", "tb_s", "tflop_s",
              "floor_ratio", "read_ratio", "baseline_us", "speedup")


class ReportError(Exception):
    pass


def diagnostic_settings(run):
    """What makes a run a diagnostic rather than the protocol: `bench --no-l2-flush` or
    `--idle-launch`, or a forced tile, kernel or K split (the JSON's `forced`; not the shipped
    choice)."""
    found = []
    if run.get("protocol", {}).get("l2_flush") is False:
        found.append("--no-l2-flush")
    if str(run.get("protocol", {}).get("launch", "")).startswith("idle"):
        found.append("--idle-launch")
    forced = run.get("forced", {})
    if forced.get("tile", 0):
        found.append(f"--tile {forced['tile']}")
    if forced.get("kernel", "auto") != "auto":
        found.append(f"--kernel {forced['kernel']}")
    if any(forced.get("splits") or []):
        found.append("--splits " + ",".join(str(x) for x in forced["splits"]))
    return found


def load_rows(path, diagnostic_ok=False):
    """The rows of one bench JSON, or a ReportError naming the file and what is missing. Only
    `compare` takes a diagnostic run (diagnostic_settings); the README's tables do not."""
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: cannot read a bench JSON ({e})") from e
    rows = run.get("rows") if isinstance(run, dict) else None
    if not isinstance(rows, list):
        raise ReportError(f"{path}: expected an object with a 'rows' list, got {type(run).__name__}"
                          + ("" if not isinstance(run, dict) else f" with keys {sorted(run)}"))
    for i, row in enumerate(rows):
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise ReportError(f"{path}: row {i} lacks {', '.join(missing)}")
    settings = diagnostic_settings(run)
    if settings and not diagnostic_ok:
        raise ReportError(f"{path}: a diagnostic run ({', '.join(settings)}), not the benchmark protocol; "
                          "only `compare` takes it")
    return rows


def key(row):
    return (row["shape"], int(row["tokens"]), row["mode"])


def table_line(row):
    """A run without the baseline (`bench --no-baseline`), or whose baseline failed its check against
    the forward (`baseline_failure`), shows "-" for it and for the speed-up."""
    marlin = MARLIN_US.get(key(row))
    baseline_ok = row["baseline_us"] > 0 and not row.get("baseline_failure")
    baseline = f"{row['baseline_us']:.1f} | {row['speedup']:.2f}x" if baseline_ok else "- | -"
    return ("| {shape} | {tokens} | {mode} | {active_experts:.1f} | {us:.1f} | {us_with_routing:.1f} | {tb_s:.2f} "
            "| {tflop_s:.1f} | {floor_ratio:.3f} | {read_ratio:.3f} | {baseline} | {marlin} |"
            ).format(**row, baseline=baseline, marlin="-" if marlin is None else f"{marlin:g}")


def table(paths):
    lines = [HEADER, RULE]
    for path in paths:
        lines += [table_line(row) for row in load_rows(path)]
    return lines


SUSTAINED_HEADER = ("| shape | T | mode | µs burst | µs sustained | change | floor/t burst | floor/t sustained "
                    "| TFLOP/s sustained |")
SUSTAINED_RULE = "|" + "---|" * 9


# The speed targets of issues 4 (decode: floor/t against the memory floor) and 5 (prefill: floor/t,
# which from T = 4096 is the fraction of the mode's GEMM ceiling, bf16 for a16 and fp8 for mxfp8).
TARGETS = [
    (4, "local28", 1, ("a16", "mxfp8"), 0.90),
    (4, "local28", 8, ("a16", "mxfp8"), 0.88),
    (4, "local28", 32, ("a16", "mxfp8"), 0.88),
    (4, "ep32", 64, ("a16", "mxfp8"), 0.85),
    (4, "ep16", 256, ("a16", "mxfp8"), 0.88),
    (4, "ep32", 8, ("a16", "mxfp8"), 0.70),
    (5, "local28", 4096, ("mxfp8",), 0.65),
    (5, "local28", 4096, ("a16",), 0.70),
    (5, "local28", 128, ("a16", "mxfp8"), 0.75),
    (5, "ep16", 8192, ("mxfp8",), 0.65),
]

TARGETS_HEADER = "| issue | shape | T | mode | target floor/t | floor/t | | pure read floor/t |"
TARGETS_RULE = "|" + "---|" * 8


def targets(paths):
    """Each target of TARGETS beside the run's floor/t: met, or how far short (a case the run lacks: '-').

    For issue 4's memory-bound rows also the floor/t of the run's pure read of the same bytes (floor /
    read time = floor/t / read/t, timed under the same protocol): what a kernel that only streams
    those bytes reached on that GPU, marked where that falls below the target; prefill's floor is
    the tensor cores', so its rows show '-'."""
    rows = {key(r): r for path in paths for r in load_rows(path)}
    lines = [TARGETS_HEADER, TARGETS_RULE]
    for issue, shape, tokens, modes, target in TARGETS:
        for mode in modes:
            r = rows.get((shape, tokens, mode))
            if r is None:
                lines.append(f"| {issue} | {shape} | {tokens} | {mode} | {target:.2f} | - | not in this run | - |")
                continue
            ratio = r["floor_ratio"]
            verdict = "met" if ratio >= target else f"short by {target - ratio:.3f}"
            read = "-"
            if issue == 4 and r["read_ratio"] > 0:
                read_floor = ratio / r["read_ratio"]
                read = f"{read_floor:.3f}" + (" (below the target)" if read_floor < target else "")
            lines.append(f"| {issue} | {shape} | {tokens} | {mode} | {target:.2f} | {ratio:.3f} | {verdict} | {read} |")
    return lines


# One full-size Kimi-K3 expert's MXFP4 weights with their E8M0 scales (../shared/docs/PERF.md):
# GEMM1 streams W13, GEMM2 W2.
W13_BYTES = 11_698_176
W2_BYTES = 5_849_088

STAGES_HEADER = ("| shape | T | mode | µs | permutation | GEMM1 | GEMM1 TB/s | activation | GEMM2 | GEMM2 TB/s "
                 "| combine | outside the kernels | pure read TB/s |")
STAGES_RULE = "|" + "---|" * 13


def stages(paths):
    """Where each decode row's time goes, from its stage spans (bench --stages: medians over replays of
    when each kernel's last CTA ended, in us from the forward's first mark), as consecutive spans that
    add up to the row's us: the permutation to its end; GEMM1 from there to its end (W13's bytes over
    it); the activation stage that sums GEMM1's K splits, where it runs, to its end; GEMM2 from there
    to its end (W2's bytes over it; its first stages stream before it, behind GEMM1's tail); the
    combine to its end; and the replay's time outside the kernels (the graph launch and events). The
    pure read's TB/s is the row's bytes over its time under the same protocol, which includes that
    outside time too. Rows on the wgmma kernels (prefill: GEMM2 follows GEMM1's tiles without a
    grid-wide wait, so the spans overlap) and rows without spans are left out."""
    lines = [STAGES_HEADER, STAGES_RULE]
    for path in paths:
        for r in load_rows(path):
            spans = r.get("stages_us")
            if not spans or spans.get("GEMM2", {}).get("last_wait", -1) < 0:
                continue
            try:
                perm, g1, g2, comb = (spans[s]["last_end"] for s in ("permutation", "GEMM1", "GEMM2", "combine"))
                act = spans["activation"]["last_end"] if "activation" in spans else None
            except (KeyError, TypeError) as e:
                raise ReportError(f"{path}: {key(r)} has stage spans without {e}") from e
            g2_begin = g1 if act is None else act
            if not 0 < perm < g1 <= g2_begin < g2 <= comb or r["streaming_read_us"] <= 0:
                raise ReportError(f"{path}: {key(r)} has stage ends out of order: permutation {perm}, GEMM1 {g1}, "
                                  f"activation {act}, GEMM2 {g2}, combine {comb}")
            experts = r["active_experts"]
            weights = experts * (W13_BYTES + W2_BYTES)  # the row's bytes add its tokens' x, ids and output
            if not weights <= r["bytes"] <= 1.01 * weights:
                raise ReportError(f"{path}: {key(r)} streams {r['bytes']:.0f} bytes, not {experts} full-size Kimi-K3 "
                                  f"experts of {W13_BYTES + W2_BYTES} bytes: its GEMMs' TB/s would be wrong")
            lines.append(
                f"| {r['shape']} | {r['tokens']} | {r['mode']} | {r['us']:.1f} | {perm:.1f} | {g1 - perm:.1f} "
                f"| {experts * W13_BYTES / (g1 - perm) * 1e-6:.2f} | {'-' if act is None else f'{act - g1:.1f}'} "
                f"| {g2 - g2_begin:.1f} | {experts * W2_BYTES / (g2 - g2_begin) * 1e-6:.2f} | {comb - g2:.1f} "
                f"| {r['us'] - comb:.1f} | {r['bytes'] / r['streaming_read_us'] * 1e-6:.2f} |")
    return lines


def sustained(burst_paths, sustained_paths):
    """Each sustained row beside the burst row of the same case; floor/t against each run's own ceilings."""
    burst = {key(r): r for path in burst_paths for r in load_rows(path)}
    lines = [SUSTAINED_HEADER, SUSTAINED_RULE]
    for path in sustained_paths:
        for s in load_rows(path):
            b = burst.get(key(s))
            if b is None:
                raise ReportError(f"{path}: {key(s)} has no burst row in {', '.join(burst_paths)}")
            lines.append("| {0} | {1} | {2} | {3:.1f} | {4:.1f} | {5:+.1f} % | {6:.3f} | {7:.3f} | {8:.1f} |".format(
                *key(s), b["us"], s["us"], 100.0 * (s["us"] / b["us"] - 1.0), b["floor_ratio"], s["floor_ratio"],
                s["tflop_s"]))
    return lines


def clock(row):
    """A row's SM clock while it was timed (bench's sm_clock) as 'MHz/capped%', or '-' (not sampled).
    MHz is the clock the SMs counted after each replay where the run has it (since Session 39),
    else NVML's median, which lags a change by tens of milliseconds."""
    c = row.get("sm_clock")
    if not c:
        return "-"
    mhz = c.get("counted_median_mhz") or c["median_mhz"]
    capped = f"{100.0 * c['power_capped_fraction']:.0f}%" if c.get("samples") else "-"
    return f"{mhz:.0f}/{capped}"


def compare(path_a, path_b):
    rows_a = {key(r): r for r in load_rows(path_a, diagnostic_ok=True)}
    rows_b = load_rows(path_b, diagnostic_ok=True)
    lines = [f"{'shape':8} {'T':>5} {'mode':6} {'A us':>10} {'B us':>10} {'B/A-1':>8} {'A floor/t':>9} {'B floor/t':>9}"
             f" {'A clock':>10} {'B clock':>10}"]
    seen = set()
    for b in rows_b:
        k = key(b)
        seen.add(k)
        a = rows_a.get(k)
        if a is None:
            lines.append(f"{k[0]:8} {k[1]:5} {k[2]:6} {'-':>10} {b['us']:10.1f} {'(B only)':>8}")
            continue
        change = 100.0 * (b["us"] / a["us"] - 1.0) if a["us"] > 0 else float("nan")
        lines.append(f"{k[0]:8} {k[1]:5} {k[2]:6} {a['us']:10.1f} {b['us']:10.1f} {change:+7.1f}% "
                     f"{a['floor_ratio']:9.3f} {b['floor_ratio']:9.3f} {clock(a):>10} {clock(b):>10}")
    for k, a in rows_a.items():
        if k not in seen:
            lines.append(f"{k[0]:8} {k[1]:5} {k[2]:6} {a['us']:10.1f} {'-':>10} {'(A only)':>8}")
    return lines


def ab(paths_a, paths_b, tolerance_pct=0.3):
    """Rounds of an A/B (each path one bench run of one build). Rows that only one build ran are
    listed and left out of the verdict."""
    runs = {"A": collections.defaultdict(list), "B": collections.defaultdict(list)}
    for build, paths in (("A", paths_a), ("B", paths_b)):
        for path in paths:
            for r in load_rows(path, diagnostic_ok=True):
                runs[build][key(r)].append(r["us"])
    lines = [f"{'shape':8} {'T':>5} {'mode':6} {'A us (rounds)':>24} {'B us (rounds)':>24} {'B/A-1':>8}"]
    slower, compared, sum_a, sum_b = [], 0, 0.0, 0.0
    for k in sorted(set(runs["A"]) | set(runs["B"])):
        a, b = runs["A"].get(k, []), runs["B"].get(k, [])
        shown = [" ".join(f"{us:.1f}" for us in x) or "-" for x in (a, b)]
        if not a or not b:
            lines.append(f"{k[0]:8} {k[1]:5} {k[2]:6} {shown[0]:>24} {shown[1]:>24} {'(A only)' if a else '(B only)':>8}")
            continue
        mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
        if mean_a <= 0.0:
            raise ReportError(f"{k[0]} T={k[1]} {k[2]}: build A's time is {mean_a} us, expected a positive time")
        change = 100.0 * (mean_b / mean_a - 1.0)
        compared, sum_a, sum_b = compared + 1, sum_a + mean_a, sum_b + mean_b
        if change > tolerance_pct:
            slower.append(f"{k[0]} T={k[1]} {k[2]} ({change:+.1f}%)")
        lines.append(f"{k[0]:8} {k[1]:5} {k[2]:6} {shown[0]:>24} {shown[1]:>24} {change:+7.1f}%")
    if compared == 0:
        raise ReportError("the A/B has no row that both builds ran")
    total = f"sum of the rows' means {sum_a:.1f} -> {sum_b:.1f} us ({100.0 * (sum_b / sum_a - 1.0):+.1f}%)"
    if slower:
        lines.append(f"verdict: B is slower by more than {tolerance_pct}% in {', '.join(slower)}; {total}")
    elif sum_b < sum_a:
        lines.append(f"verdict: B is faster in sum and slower by more than {tolerance_pct}% in no row; {total}")
    else:
        lines.append(f"verdict: B is not faster in sum; {total}")
    return lines


RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
# The README's paragraph above its table names the run its tables come from.
CITED_RUN = re.compile(r"(Latest run:.*?JSON: bench/results/)(\S+?)(-\*\.json)")


def readme_tables(run, results=RESULTS):
    """The README's tables of one run (its burst and sustained-load JSON in `results`), by name."""
    burst = [str(results / f"{run}-{suite}.json") for suite in ("decode", "prefill")]
    steady = [str(results / f"{run}-sustained-{suite}.json") for suite in ("decode", "prefill")]
    return {"table": table(burst), "sustained-load table": sustained(burst, steady),
            "targets table": targets(burst), "stage breakdown": stages(burst[:1])}


def cited_run(readme):
    match = CITED_RUN.search(readme)
    if not match:
        raise ReportError("the README has no 'Latest run: ... JSON: bench/results/<run>-*.json' line")
    return match.group(2)


def update_readme(readme_path, run, results=RESULTS):
    """Replaces the README's tables of the run it cites with run `run`'s, and the JSON path it cites.
    The prose around them (device, commit, ceilings, what moved) is left for a person to rewrite."""
    readme = Path(readme_path).read_text(encoding="utf-8")
    old = cited_run(readme)
    new_tables = readme_tables(run, results)
    for name, lines in readme_tables(old, results).items():
        block = "\n".join(lines)
        if block not in readme:
            raise ReportError(f"{readme_path}: its {name} is not the one its cited run {old} gives; "
                              "regenerate it by hand first")
        readme = readme.replace(block, "\n".join(new_tables[name]), 1)
    readme = CITED_RUN.sub(lambda m: m.group(1) + run + m.group(3), readme, count=1)
    Path(readme_path).write_text(readme, encoding="utf-8")
    return [f"{readme_path}: the table, sustained-load table, targets table and stage breakdown now come from "
            f"{run} (was {old}); rewrite the 'Latest run:' paragraph's device, commit, date and ceilings by hand"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="the README's Markdown table from one or more bench JSON files")
    t.add_argument("json", nargs="+")
    s = sub.add_parser("sustained", help="burst and sustained-load runs of the same cases side by side")
    s.add_argument("burst", nargs="+")
    s.add_argument("--sustained", nargs="+", required=True)
    g = sub.add_parser("targets", help="issues 4 and 5's speed targets against one run's floor/t")
    g.add_argument("json", nargs="+")
    b = sub.add_parser("stages", help="each decode row's stages: us and the GEMMs' TB/s (rows with stage spans)")
    b.add_argument("json", nargs="+")
    c = sub.add_parser("compare", help="two bench JSON files row by row")
    c.add_argument("a")
    c.add_argument("b")
    a = sub.add_parser("ab", help="rounds of two builds (scripts/ab.sh --json-dir): per row and a verdict")
    a.add_argument("--a", nargs="+", required=True, help="build A's bench JSON files, one per round")
    a.add_argument("--b", nargs="+", required=True, help="build B's bench JSON files, one per round")
    a.add_argument("--tolerance", type=float, default=0.3, help="percent by which B may be slower in a row")
    r = sub.add_parser("readme", help="the README's tables moved to another run of bench/results")
    r.add_argument("run", help="the run's name in bench/results, e.g. 2026-12-06-9f7bbb3")
    r.add_argument("--readme", default=str(RESULTS.parents[1] / "README.md"))
    args = parser.parse_args(argv)
    try:
        if args.command == "table":
            lines = table(args.json)
        elif args.command == "sustained":
            lines = sustained(args.burst, args.sustained)
        elif args.command == "targets":
            lines = targets(args.json)
        elif args.command == "stages":
            lines = stages(args.json)
        elif args.command == "ab":
            lines = ab(args.a, args.b, args.tolerance)
        elif args.command == "readme":
            lines = update_readme(args.readme, args.run)
        else:
            lines = compare(args.a, args.b)
    except ReportError as e:
        print(f"bench_report: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
