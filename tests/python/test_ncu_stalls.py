"""scripts/ncu_stalls.py: stall reasons per kernel and per innermost loop from ncu's source page."""

import csv
import importlib.util
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ncu_stalls", ROOT / "scripts" / "ncu_stalls.py")
ncu_stalls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_stalls)

HEADER = ["Address", "Source", ncu_stalls.SAMPLES, ncu_stalls.EXECUTED, "stall_long_sb", "stall_math",
          "stall_selected", "stall_long_sb (Not Issued)"]


def instruction(address, source, executed, long_sb=0, math=0, selected=0):
    return [hex(address), "      " + source, str(long_sb + math + selected), str(executed), str(long_sb), str(math),
            str(selected), str(long_sb)]


def profile(kernels):
    """ncu's CSV layout: per kernel a name row, the header row, one row per SASS instruction."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    for name, rows in kernels:
        writer.writerow(["Kernel Name", name, ""])
        writer.writerow(HEADER)
        writer.writerows(rows)
    return out.getvalue().splitlines()


# A kernel with a prologue, a loop of four instructions whose barrier wait (a branch to a retry stub
# past the loop) holds most of its long-scoreboard samples, and an epilogue.
LOOP_KERNEL = ("gemm", [
    instruction(0x100, "LDC R1, c[0x0][0x28]", 10, selected=2),
    instruction(0x110, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R12+URZ], R11", 80, selected=1),
    instruction(0x120, "@!P0  BRA 0x200", 80, long_sb=30, selected=1),
    instruction(0x130, "LOP3.LUT R4, R4, 0x81c081c0, RZ, 0xc0, !PT", 80, math=12, selected=8),
    instruction(0x140, "HMMA.16816.F32.BF16 R20, R8, R20, R32", 80, math=6, selected=4),
    instruction(0x150, "@P1  BRA 0x110", 80, selected=1),
    instruction(0x160, "EXIT", 10),
    instruction(0x200, "BRA 0x110", 5),
])


def test_reads_each_kernel_and_its_instructions():
    kernels = ncu_stalls.read_kernels(profile([LOOP_KERNEL, ("other", LOOP_KERNEL[1][:2])]))
    assert [name for name, _ in kernels] == ["gemm", "other"]
    assert len(kernels[0][1]) == 8 and len(kernels[1][1]) == 2


def test_counts_reasons_without_the_not_issued_copies():
    rows = ncu_stalls.read_kernels(profile([LOOP_KERNEL]))[0][1]
    assert dict(ncu_stalls.reasons(rows)) == {"long_sb": 30, "math": 18, "selected": 17}


def test_finds_the_innermost_backward_branch_only():
    nested = ("nested", LOOP_KERNEL[1][:6] + [instruction(0x158, "BRA 0x100", 10)] + LOOP_KERNEL[1][6:])
    rows = ncu_stalls.read_kernels(profile([nested]))[0][1]
    assert ncu_stalls.innermost_loops(rows) == [(1, 5)]  # the forward branch to the stub is no loop


def test_report_separates_the_loops_barrier_wait_from_its_work():
    out = io.StringIO()
    ncu_stalls.report(ncu_stalls.read_kernels(profile([LOOP_KERNEL])), top=2, out=out)
    text = out.getvalue()
    assert "65 samples over 8 instructions" in text
    assert "executed 80 times,  96.9 % of the samples" in text
    assert "waiting at its barrier branches:  49.2 % of the loop's samples" in text
    # the rest of the loop: math 18, selected 14 of 32 (the wait branch's own selected sample left out)
    assert "math                    18  56.2 % of the rest" in text
    assert "mix: BRA 2, SYNCS 1, LOP3 1, HMMA 1" in text
    assert text.count("@!P0  BRA 0x200") == 1  # the top instruction, listed once


def test_rejects_a_file_without_the_source_counters():
    lines = ['"Kernel Name","gemm",""', '"Address","Source","Instructions Executed"', '"0x100","EXIT","1"']
    with pytest.raises(ncu_stalls.ProfileError, match="SourceCounters"):
        ncu_stalls.read_kernels(lines)
    with pytest.raises(ncu_stalls.ProfileError, match="no kernel"):
        ncu_stalls.read_kernels(["not a profile"])
