"""scripts/bench_report.py: the README's table from the benchmark's JSON, and A/B comparisons.

The last test holds the README to the run it cites: its table must be the one that run's JSON gives.
"""

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_report", ROOT / "scripts" / "bench_report.py")
bench_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_report)


def row(shape="local28", tokens=1, mode="a16", us=100.0, floor_ratio=0.5):
    return {"shape": shape, "tokens": tokens, "mode": mode, "active_experts": 16.0, "us": us,
            "us_with_routing": us + 4.25, "tb_s": 3.5712, "tflop_s": 13.44, "floor_ratio": floor_ratio,
            "read_ratio": 0.8534, "baseline_us": 412.31, "speedup": 4.1231}


def write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(json.dumps({"commit": "abc", "rows": rows}))
    return str(path)


def test_table_line_formats_every_column_and_marlin():
    assert bench_report.table_line(row()) == (
        "| local28 | 1 | a16 | 16.0 | 100.0 | 104.2 | 3.57 | 13.4 | 0.500 | 0.853 | 412.3 | 4.12x | 132.5 |")
    assert bench_report.table_line(row(tokens=4096)).endswith("| 16500 |")
    assert bench_report.table_line(row(mode="mxfp8")).endswith("| - |")  # Marlin: a16 only


def test_table_line_shows_no_speedup_without_a_checked_baseline():
    no_baseline = dict(row(), baseline_us=0.0, speedup=0.0)  # bench --no-baseline
    assert bench_report.table_line(no_baseline).endswith("| 0.853 | - | - | 132.5 |")
    failed = dict(row(), baseline_failure="local28 T=1 a16, input set 2: relative L2 0.3 (bound 0.01)")
    assert bench_report.table_line(failed).endswith("| 0.853 | - | - | 132.5 |")
    assert bench_report.table_line(dict(row(), baseline_failure="")).endswith("| 412.3 | 4.12x | 132.5 |")


def test_table_has_header_and_rows_of_every_file_in_order(tmp_path):
    a = write(tmp_path, "a.json", [row(tokens=1), row(tokens=8)])
    b = write(tmp_path, "b.json", [row(tokens=128)])
    lines = bench_report.table([a, b])
    assert lines[0] == bench_report.HEADER and lines[1] == bench_report.RULE
    assert [line.split(" | ")[1] for line in lines[2:]] == ["1", "8", "128"]


def test_compare_gives_the_change_and_rows_of_one_side(tmp_path):
    a = write(tmp_path, "a.json", [row(tokens=1, us=100.0), row(tokens=8, us=50.0)])
    b = write(tmp_path, "b.json", [row(tokens=1, us=95.0, floor_ratio=0.6), row(tokens=32, us=70.0)])
    lines = bench_report.compare(a, b)
    common = next(line for line in lines if line.split()[:2] == ["local28", "1"])
    assert "-5.0%" in common and common.split()[-4:] == ["0.500", "0.600", "-", "-"]
    assert any("(B only)" in line and " 32 " in line for line in lines)
    assert any("(A only)" in line and " 8 " in line for line in lines)


def test_compare_shows_each_runs_clock_where_it_was_sampled(tmp_path):
    capped = dict(row(tokens=4096, us=7221.3), sm_clock={"samples": 316, "min_mhz": 1650.0, "median_mhz": 1665.0,
                                                         "max_mhz": 1980.0, "power_capped_fraction": 0.34})
    a = write(tmp_path, "a.json", [row(tokens=4096, us=7104.0)])
    b = write(tmp_path, "b.json", [capped])
    line = bench_report.compare(a, b)[1]
    assert line.split()[-2:] == ["-", "1665/34%"]
    # Runs since Session 39 also hold the clock the SMs counted, which NVML's median lags behind.
    counted = dict(capped, sm_clock=dict(capped["sm_clock"], counted_median_mhz=1709.0))
    unsampled = dict(capped, sm_clock=dict(counted["sm_clock"], samples=0))
    c = write(tmp_path, "c.json", [counted])
    d = write(tmp_path, "d.json", [unsampled])
    assert bench_report.compare(c, d)[1].split()[-2:] == ["1709/34%", "1709/-"]


def test_ab_gives_each_builds_rounds_and_a_verdict(tmp_path):
    a = [write(tmp_path, f"A-r{r}.json", [row(tokens=8, us=100.0 + r), row(tokens=16, us=200.0)]) for r in (1, 2)]
    b = [write(tmp_path, f"B-r{r}.json", [row(tokens=8, us=95.0 + r), row(tokens=16, us=200.4)]) for r in (1, 2)]
    lines = bench_report.ab(a, b)
    t8 = next(line for line in lines if line.split()[:2] == ["local28", "8"])
    assert t8.split()[3:8] == ["101.0", "102.0", "96.0", "97.0", "-4.9%"]
    assert lines[-1].startswith("verdict: B is faster in sum and slower by more than 0.3% in no row; "
                                "sum of the rows' means 301.5 -> 296.9 us")
    # A row slower by more than the tolerance decides, however much the others gain.
    assert lines[-1] != bench_report.ab(a, b, tolerance_pct=0.1)[-1]
    assert bench_report.ab(a, b, tolerance_pct=0.1)[-1].startswith(
        "verdict: B is slower by more than 0.1% in local28 T=16 a16 (+0.2%)")
    assert bench_report.ab(a, a)[-1].startswith("verdict: B is not faster in sum")


def test_ab_lists_rows_of_one_build_and_needs_a_common_row(tmp_path):
    a = write(tmp_path, "A-r1.json", [row(tokens=1, us=80.0), row(tokens=8, us=100.0)])
    b = write(tmp_path, "B-r1.json", [row(tokens=8, us=99.0), row(tokens=32, us=70.0)])
    lines = bench_report.ab([a], [b])
    assert any("(A only)" in line and " 1 " in line for line in lines)
    assert any("(B only)" in line and " 32 " in line for line in lines)
    assert "sum of the rows' means 100.0 -> 99.0 us" in lines[-1]
    c = write(tmp_path, "C-r1.json", [row(tokens=64)])
    with pytest.raises(bench_report.ReportError, match="no row that both builds ran"):
        bench_report.ab([a], [c])
    failed = write(tmp_path, "A-r2.json", [row(tokens=8, us=0.0)])
    with pytest.raises(bench_report.ReportError, match="local28 T=8 a16: build A's time is 0.0 us"):
        bench_report.ab([failed], [b])


FAKE_K3MOE = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
us = {us}
print("generate inputs ...")
print("row us", us)
with open("{log}", "a") as f:
    f.write("{label} " + " ".join(args) + "\\n")
if "--json" in args:
    json.dump({{"rows": [{{"shape": "local28", "tokens": 8, "mode": "a16", "us": us, "floor_ratio": 0.8,
                          "active_experts": 16.0, "us_with_routing": us, "tb_s": 1.0, "tflop_s": 1.0,
                          "read_ratio": 0.9, "baseline_us": 0.0, "speedup": 0.0}}]}},
              open(args[args.index("--json") + 1], "w"))
"""


def test_ab_script_alternates_the_order_and_ends_with_the_verdict(tmp_path):
    log = tmp_path / "calls.log"
    bins = []
    for label, us in (("A", 100.0), ("B", 98.0)):
        (tmp_path / label).mkdir()
        path = tmp_path / label / "k3moe"
        path.write_text(FAKE_K3MOE.format(us=us, log=log, label=label))
        path.chmod(0o755)
        bins.append(str(path))
    (tmp_path / "A" / "BUILT_FROM").write_text("abc1234\n")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "ab.sh"), *bins, "2", "--json-dir", str(tmp_path / "ab"),
                             "--shape", "local28", "--tokens", "8"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["A", "B", "B", "A"]
    assert all(c.split()[1:6] == ["bench", "--no-baseline", "--shape", "local28", "--tokens"] for c in calls)
    # A's BUILT_FROM names its commit in its runs; B has none.
    assert all(c.endswith("--commit abc1234") == c.startswith("A") for c in calls)
    assert sorted(p.name for p in (tmp_path / "ab").iterdir()) == ["A-r1.json", "A-r2.json", "B-r1.json", "B-r2.json"]
    # The input generator's progress is left out, the bench's own lines (one starting with r) are not.
    assert "generate" not in result.stdout and result.stdout.count("row us") == 4
    assert result.stdout.splitlines()[-1].startswith("verdict: B is faster in sum")
    refused = subprocess.run(["bash", str(ROOT / "scripts" / "ab.sh"), *bins, "1", "--json-dir", str(tmp_path / "x"),
                              "--json", "y.json"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "drop --json" in refused.stderr
    log.unlink()
    named = subprocess.run(["bash", str(ROOT / "scripts" / "ab.sh"), *bins, "1", "--commit", "def5678"],
                           capture_output=True, text=True, timeout=60)
    assert named.returncode == 0, named.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(c.endswith("--commit def5678") for c in calls)
    log.unlink()
    subprocess.run(["bash", str(ROOT / "scripts" / "ab.sh"), *bins, "1", "--commit=def5678"], check=True,
                   capture_output=True, timeout=60)
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(c.endswith("--commit=def5678") for c in calls)


def test_prebuild_commit_refuses_a_name_that_is_no_commit_before_it_builds(tmp_path):
    out = tmp_path / "out"
    def worktree_list():
        return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout

    worktrees = worktree_list()
    result = subprocess.run(["bash", str(ROOT / "scripts" / "prebuild-commit.sh"), "no-such-commit-k3moe", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "'no-such-commit-k3moe' names no commit" in result.stderr
    assert not out.exists()
    assert worktree_list() == worktrees
    extra = subprocess.run(["bash", str(ROOT / "scripts" / "prebuild-commit.sh"), "HEAD", str(out), "more"],
                           capture_output=True, text=True, timeout=60)
    assert extra.returncode == 2 and "usage:" in extra.stderr and not out.exists()


def test_sustained_sets_each_case_beside_its_burst_row(tmp_path):
    burst = write(tmp_path, "burst.json", [row(tokens=1, us=80.0, floor_ratio=0.85), row(tokens=8, us=100.0)])
    steady = write(tmp_path, "steady.json", [row(tokens=1, us=84.0, floor_ratio=0.8)])
    lines = bench_report.sustained([burst], [steady])
    assert lines[:2] == [bench_report.SUSTAINED_HEADER, bench_report.SUSTAINED_RULE]
    assert lines[2:] == ["| local28 | 1 | a16 | 80.0 | 84.0 | +5.0 % | 0.850 | 0.800 | 13.4 |"]
    orphan = write(tmp_path, "orphan.json", [row(tokens=32)])
    with pytest.raises(bench_report.ReportError, match=r"orphan\.json: \('local28', 32, 'a16'\) has no burst row"):
        bench_report.sustained([burst], [orphan])


def test_targets_say_met_or_how_far_short_for_each_mode(tmp_path):
    decode = write(tmp_path, "d.json", [row(tokens=1, floor_ratio=0.905), row(tokens=1, mode="mxfp8", floor_ratio=0.85),
                                        row(shape="ep16", tokens=256, floor_ratio=0.88)])
    lines = bench_report.targets([decode])
    assert lines[:2] == [bench_report.TARGETS_HEADER, bench_report.TARGETS_RULE]
    # pure read floor/t = floor/t / read/t (0.8534 in row())
    assert lines[2] == "| 4 | local28 | 1 | a16 | 0.90 | 0.905 | met | 1.060 |"
    assert lines[3] == "| 4 | local28 | 1 | mxfp8 | 0.90 | 0.850 | short by 0.050 | 0.996 |"
    assert "| 4 | ep16 | 256 | a16 | 0.88 | 0.880 | met | 1.031 |" in lines  # at the target is met
    assert "| 5 | ep16 | 8192 | mxfp8 | 0.65 | - | not in this run | - |" in lines
    # one row per (case, mode) of the issues: 6 decode cases x 2 modes, 4096 x 1 + 1, 128 x 2, 8192 x 1
    assert len(lines) == 2 + 12 + 2 + 2 + 1


def test_targets_say_where_a_pure_read_falls_below_the_target(tmp_path):
    slow_read = dict(row(shape="ep32", tokens=8, floor_ratio=0.375), read_ratio=0.554)
    prefill = dict(row(tokens=4096, floor_ratio=0.784), read_ratio=0.018)
    lines = bench_report.targets([write(tmp_path, "d.json", [slow_read, prefill])])
    assert "| 4 | ep32 | 8 | a16 | 0.70 | 0.375 | short by 0.325 | 0.677 (below the target) |" in lines
    assert "| 5 | local28 | 4096 | a16 | 0.70 | 0.784 | met | - |" in lines  # compute floor: no read bound


def spans(**ends):
    """bench --stages spans with these last ends (a wait of 0.5 us after each stage's start)."""
    return {stage: {"last_start": 0.0, "last_wait": 0.5, "last_end": end} for stage, end in ends.items()}


def test_stages_split_the_time_into_consecutive_spans_and_rates(tmp_path):
    w13, w2 = bench_report.W13_BYTES, bench_report.W2_BYTES
    whole_k = dict(row(us=80.0), active_experts=16.0, bytes=16 * (w13 + w2), streaming_read_us=70.0,
                   stages_us=spans(permutation=1.0, GEMM1=49.0, GEMM2=71.0, combine=73.0))
    split_k = dict(whole_k, tokens=8, stages_us=spans(permutation=2.0, GEMM1=86.0, activation=90.0, GEMM2=130.0,
                                                     combine=133.0))
    prefill = dict(whole_k, tokens=4096, stages_us=dict(spans(permutation=9.0, GEMM1=4900.0, GEMM2=6900.0,
                                                              combine=7100.0), GEMM2={"last_start": 1.0,
                                                                                      "last_wait": -1,
                                                                                      "last_end": 6900.0}))
    unmarked = {k: v for k, v in dict(whole_k, tokens=32).items() if k != "stages_us"}
    lines = bench_report.stages([write(tmp_path, "d.json", [whole_k, split_k, prefill, unmarked])])
    assert lines[:2] == [bench_report.STAGES_HEADER, bench_report.STAGES_RULE]
    # GEMM1 48 us for 16 x W13 (187.2 MB): 3.90 TB/s; GEMM2 22 us for 16 x W2; read 280.8 MB in 70 us
    assert lines[2] == "| local28 | 1 | a16 | 80.0 | 1.0 | 48.0 | 3.90 | - | 22.0 | 4.25 | 2.0 | 7.0 | 4.01 |"
    assert lines[3] == "| local28 | 8 | a16 | 80.0 | 2.0 | 84.0 | 2.23 | 4.0 | 40.0 | 2.34 | 3.0 | -53.0 | 4.01 |"
    assert len(lines) == 4  # the wgmma row (GEMM2 without a wait) and the row without spans are left out
    backwards = dict(whole_k, stages_us=spans(permutation=1.0, GEMM1=49.0, GEMM2=40.0, combine=73.0))
    with pytest.raises(bench_report.ReportError, match=r"b\.json: \('local28', 1, 'a16'\) has stage ends out of order"):
        bench_report.stages([write(tmp_path, "b.json", [backwards])])
    reduced = dict(whole_k, bytes=whole_k["bytes"] / 4)  # a reduced-size layer: W13 / W2 bytes unknown here
    with pytest.raises(bench_report.ReportError, match=r"not 16.0 full-size Kimi-K3 experts"):
        bench_report.stages([write(tmp_path, "r.json", [reduced])])
    no_combine = dict(whole_k, stages_us=spans(permutation=1.0, GEMM1=49.0, GEMM2=71.0))
    with pytest.raises(bench_report.ReportError, match=r"has stage spans without 'combine'"):
        bench_report.stages([write(tmp_path, "c.json", [no_combine])])


def test_bad_input_names_the_file_and_what_is_missing(tmp_path):
    no_rows = tmp_path / "no_rows.json"
    no_rows.write_text(json.dumps({"commit": "abc"}))
    with pytest.raises(bench_report.ReportError, match=r"no_rows\.json: expected an object with a 'rows' list"):
        bench_report.load_rows(str(no_rows))
    partial = dict(row())
    del partial["floor_ratio"]
    path = write(tmp_path, "partial.json", [row(), partial])
    with pytest.raises(bench_report.ReportError, match=r"partial\.json: row 1 lacks floor_ratio"):
        bench_report.load_rows(path)
    assert bench_report.main(["compare", str(no_rows), path]) == 2


def test_a_diagnostic_run_makes_no_readme_table_but_compares(tmp_path):
    protocol = write(tmp_path, "protocol.json", [row(us=100.0)])
    for name, extra, named in [
        ("no_flush.json", {"protocol": {"l2_flush": False}}, "--no-l2-flush"),
        ("idle_launch.json", {"protocol": {"launch": "idle: the host's submission inside the events"}},
         "--idle-launch"),
        ("tile.json", {"forced": {"tile": 24, "kernel": "auto", "splits": []}}, "--tile 24"),
        ("kernel.json", {"forced": {"tile": 0, "kernel": "wgmma", "splits": []}}, "--kernel wgmma"),
        ("splits.json", {"forced": {"tile": 0, "kernel": "auto", "splits": [2, 0]}}, "--splits 2,0"),
    ]:
        path = tmp_path / name
        path.write_text(json.dumps({"commit": "abc", "rows": [row(us=110.0)], **extra}))
        for report in (bench_report.table, bench_report.targets, bench_report.stages):
            with pytest.raises(bench_report.ReportError, match=re.escape(f"{name}: a diagnostic run ({named})")):
                report([str(path)])
        assert "+10.0%" in "\n".join(bench_report.compare(protocol, str(path)))
    # The protocol's own flags, written out, are no diagnostic.
    path = tmp_path / "defaults.json"
    path.write_text(json.dumps({"commit": "abc", "rows": [row()],
                                "protocol": {"l2_flush": True, "launch": "held: the GPU's work only"},
                                "forced": {"tile": 0, "kernel": "auto", "splits": [0]}}))
    assert len(bench_report.table([str(path)])) == 3


def write_run(results, run, us):
    """A run of the four files the README's tables come from, decode rows with stage spans."""
    decode = dict(row(us=us, floor_ratio=40.0 / us), bytes=16 * (bench_report.W13_BYTES + bench_report.W2_BYTES),
                  streaming_read_us=70.0, stages_us=spans(permutation=1.0, GEMM1=49.0, GEMM2=71.0, combine=73.0))
    prefill = row(tokens=4096, us=50 * us, floor_ratio=60.0 / us)
    for suite, rows in [("decode", [decode]), ("prefill", [prefill]), ("sustained-decode", [row(us=us + 4.0)]),
                        ("sustained-prefill", [row(tokens=4096, us=60 * us)])]:
        (results / f"{run}-{suite}.json").write_text(json.dumps({"commit": run, "rows": rows}))


def test_readme_moves_every_table_and_the_json_path_to_another_run(tmp_path):
    write_run(tmp_path, "old", 80.0)
    write_run(tmp_path, "new", 75.0)
    prose = "Latest run: NVIDIA H200, commit old. JSON: bench/results/old-*.json, more."
    old_tables = bench_report.readme_tables("old", tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# k3moe\n\n" + "\n\ntext\n\n".join("\n".join(t) for t in old_tables.values())
                      + "\n\n" + prose + "\n", encoding="utf-8")
    bench_report.update_readme(readme, "new", tmp_path)
    text = readme.read_text(encoding="utf-8")
    assert bench_report.cited_run(text) == "new"
    assert "Latest run: NVIDIA H200, commit old." in text  # the prose is a person's to rewrite
    for name, lines in bench_report.readme_tables("new", tmp_path).items():
        assert "\n".join(lines) in text, name
        assert "\n".join(old_tables[name]) not in text, name
    # A README whose table is not its cited run's is refused, and left as it was.
    readme.write_text(text.replace("| 75.0 |", "| 75.1 |"), encoding="utf-8")
    with pytest.raises(bench_report.ReportError, match=r"its table is not the one its cited run new gives"):
        bench_report.update_readme(readme, "old", tmp_path)
    assert bench_report.cited_run(readme.read_text(encoding="utf-8")) == "new"
    with pytest.raises(bench_report.ReportError, match=r"missing-decode\.json: cannot read"):
        bench_report.update_readme(readme, "missing", tmp_path)


def test_readme_tables_are_the_ones_its_latest_run_gives():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    run = bench_report.cited_run(readme)
    for name, lines in bench_report.readme_tables(run).items():
        assert "\n".join(lines) in readme, (f"README.md's {name} differs from the one bench/results/{run}-*.json "
                                             "give (scripts/bench_report.py table|sustained|targets|stages)")


def test_readme_h100_targets_table_is_the_one_its_json_gives():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### On an H100", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"JSON: bench/results/(\S+?)-\*\.json", section)
    assert match, "README.md's H100 section cites no 'JSON: bench/results/<run>-*.json'"
    files = [str(ROOT / "bench" / "results" / f"{match.group(1)}-{suite}.json") for suite in ("decode", "prefill")]
    assert "\n".join(bench_report.targets(files)) in section, (
        f"README.md's H100 targets table differs from scripts/bench_report.py targets {' '.join(files)}")


def test_gpu_check_records_the_commit_a_prebuilt_directory_names(tmp_path):
    log = tmp_path / "calls.log"
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "k3moe"
    fake.write_text(f'#!/bin/bash\necho "$@" >> {log}\necho "236 cases, 0 failed"; echo\n')
    fake.chmod(0o755)
    script = str(ROOT / "scripts" / "gpu-check.sh")

    def commit_of_run(*options):
        log.unlink(missing_ok=True)
        result = subprocess.run(["bash", script, str(tmp_path / "out"), "--steps", "validate", *options],
                                capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)})
        assert result.returncode == 0, result.stdout + result.stderr
        args = log.read_text().split()
        return args[args.index("--commit") + 1]

    # Without BUILT_FROM: the HEAD of the checkout it runs in, here none.
    assert commit_of_run("--bin", str(tmp_path / "bin")) == "unknown"
    (tmp_path / "bin" / "BUILT_FROM").write_text("abc1234\n")
    assert commit_of_run("--bin", str(tmp_path / "bin")) == "abc1234"
    assert commit_of_run("--bin", str(tmp_path / "bin"), "--commit", "def5678") == "def5678"
