#!/usr/bin/env python3
"""Where each kernel's warps stall, from Nsight Compute's per-instruction source page.

On the GPU machine (bench/NOTES.md, Session 30, has the figures this gave):

  ncu --clock-control none --section WarpStateStats --section SourceCounters \\
      -k regex:expert_gemm --launch-count 2 -o prof \\
      k3moe bench --no-baseline --shape local28 --tokens 1 --mode a16
  ncu -i prof.ncu-rep --page source --print-source sass --csv > source.csv

then anywhere:

  scripts/ncu_stalls.py source.csv [--top N]

For every kernel in the file: its stall samples by reason, each innermost loop (a backward branch
and the instructions it jumps over) that holds at least 2 % of the samples, with that share, its stall reasons and its
instruction mix, and the N instructions with the most samples. A loop's reasons leave out its
barrier-wait branches (one instruction holding most of its long-scoreboard samples) in a separate
line, so that what the loop's work waits on stands apart from waiting for data.

Only the standard library; tests/python/test_ncu_stalls.py checks it on a constructed file.
"""
import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(0x[0-9a-fA-F]+)")


class ProfileError(Exception):
    pass


def read_kernels(lines):
    """[(name, [instruction dict])] from the CSV: a "Kernel Name" row, a header row, then rows."""
    kernels, header = [], None
    for row in csv.reader(lines):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append((row[1], []))
            header = None
        elif row[0] == "Address":
            header = row
        elif kernels and header:
            kernels[-1][1].append(dict(zip(header, row)))
    if not kernels:
        raise ProfileError("no kernel found: expected ncu --page source --csv output")
    for name, rows in kernels:
        if rows and (SAMPLES not in rows[0] or EXECUTED not in rows[0]):
            raise ProfileError(f"kernel {name[:60]}: no '{SAMPLES}' column (collect --section SourceCounters)")
    return kernels


def count(row, column):
    value = row.get(column, "")
    try:
        return int(float(value))
    except ValueError:
        return 0


def reasons(rows):
    """Stall samples by reason (the stall_* columns, issued and not), largest first."""
    total = collections.Counter()
    for row in rows:
        for column in row:
            if column.startswith("stall_") and "Not Issued" not in column:
                total[column[len("stall_"):]] += count(row, column)
    return [(reason, n) for reason, n in total.most_common() if n]


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def innermost_loops(rows):
    """[(first, last)] row ranges of backward branches that hold no other backward branch."""
    index = {}
    for i, row in enumerate(rows):
        try:
            index[int(row["Address"], 16)] = i
        except (KeyError, ValueError):
            pass
    loops = []
    for i, row in enumerate(rows):
        match = BRANCH.search(row.get("Source", ""))
        if match:
            target = index.get(int(match.group(1), 16))
            if target is not None and target < i:
                loops.append((target, i))
    return [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]


def share(n, total):
    return f"{100.0 * n / total:5.1f} %" if total else "    -"


def report(kernels, top, out, min_share=0.02):
    for name, rows in kernels:
        total = sum(count(r, SAMPLES) for r in rows)
        out.write(f"\n{name}\n  {total} samples over {len(rows)} instructions\n")
        for reason, n in reasons(rows):
            out.write(f"    {reason:<18} {n:7d} {share(n, total)}\n")
        for first, last in innermost_loops(rows):
            body = rows[first:last + 1]
            samples = sum(count(r, SAMPLES) for r in body)
            if samples < min_share * total:
                continue
            waits = [r for r in body if opcode(r["Source"]) == "BRA"
                     and count(r, "stall_long_sb") > 0.5 * count(r, SAMPLES)]
            work = [r for r in body if r not in waits]
            work_samples = sum(count(r, SAMPLES) for r in work)
            out.write(f"  loop {rows[first]['Address']} .. {rows[last]['Address']}: {len(body)} instructions, "
                      f"executed {count(body[0], EXECUTED)} times, {share(samples, total)} of the samples\n")
            if waits:
                wait_samples = sum(count(r, SAMPLES) for r in waits)
                out.write(f"    waiting at its barrier branches: {share(wait_samples, samples)} of the loop's samples\n")
            for reason, n in reasons(work)[:8]:
                out.write(f"    {reason:<18} {n:7d} {share(n, work_samples)} of the rest\n")
            mix = collections.Counter(opcode(r["Source"]) for r in body)
            out.write("    mix: " + ", ".join(f"{op} {n}" for op, n in mix.most_common(10)) + "\n")
        ranked = sorted(rows, key=lambda r: -count(r, SAMPLES))[:top]
        for row in ranked:
            top_reasons = sorted(((count(row, c), c[len("stall_"):]) for c in row
                                  if c.startswith("stall_") and "Not Issued" not in c), reverse=True)[:2]
            why = ", ".join(f"{reason} {n}" for n, reason in top_reasons if n)
            out.write(f"    {count(row, SAMPLES):6d}  {row['Source'].strip()[:56]:<56}  {why}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu -i REPORT --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=10, help="instructions listed per kernel (default 10)")
    args = parser.parse_args(argv)
    try:
        with open(args.csv, newline="") as f:
            report(read_kernels(f), args.top, sys.stdout)
    except (OSError, ProfileError) as error:
        sys.exit(f"ncu_stalls.py: {error}")


if __name__ == "__main__":
    main()
