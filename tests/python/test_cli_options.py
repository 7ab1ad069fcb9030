"""The option checks of the `k3moe` command: a bad value, or a backend that cannot run here, fails
at once with a message naming the option, before a GPU is looked for or minutes go into loading a
full-size layer, and before a negative value could wrap or stand for the default. These run on any
machine, with or without a GPU.

The k3moe binary comes from the environment variable K3MOE_BIN (ctest sets it).
"""

import json
import os
import struct
import subprocess

import pytest

import crosscheck_env

SECONDS_BEFORE_ANY_WEIGHT_LOADS = 30


def k3moe(*args, cwd=None):
    return subprocess.run([crosscheck_env.program("K3MOE_BIN"), *args], capture_output=True, text=True,
                          timeout=SECONDS_BEFORE_ANY_WEIGHT_LOADS, cwd=cwd)


@pytest.mark.parametrize("command,expected", [
    (["run", "--tokens", "1", "--backend", "bogus"], "{auto,gpu,cpu}"),
    (["run", "--tokens", "1", "--mode", "fp4"], '"a16" or "mxfp8"'),
    (["run", "--tokens", "1", "--activation", "relu"], '"situ", "swiglu" or "swiglu_oai"'),
    (["bench", "--suite", "decoder"], "{decode,prefill,all}"),
    (["bench", "--shape", "ep8"], "{local28,ep32,ep16}"),
    (["bench", "--mode", "fp4"], "{a16,mxfp8}"),
], ids=lambda c: " ".join(c[:1] + c[-2:]) if isinstance(c, list) else None)
def test_an_unknown_name_fails_at_once_naming_the_choices(command, expected):
    result = k3moe(*command)
    assert result.returncode != 0
    assert command[-1] in result.stderr and expected in result.stderr, result.stderr
    assert "local experts" not in result.stdout, "the weights were loaded before the option was checked"


def test_backend_gpu_without_a_usable_gpu_fails_before_loading():
    try:
        result = k3moe("run", "--tokens", "1", "--backend", "gpu")
    except subprocess.TimeoutExpired:
        pytest.skip("a Hopper GPU is here: run --backend gpu is loading the layer")
    if result.returncode == 0:
        pytest.skip("a Hopper GPU is here: run --backend gpu ran")
    assert "--backend gpu:" in result.stderr, result.stderr
    assert "no Hopper GPU" in result.stderr or "built without CUDA" in result.stderr, result.stderr
    assert "local experts" not in result.stdout, "the weights were loaded before the backend was checked"


@pytest.mark.parametrize("command", [
    ["run", "--layer", "-4"],
    ["run", "--seed", "-1"],
    ["reference", "--checkpoint", "unused", "--out", "unused", "--layer", "-1"],
    ["reference", "--checkpoint", "unused", "--out", "unused", "--seed", "-3"],
    ["make-checkpoint", "unused", "--seed", "-2"],
], ids=lambda c: " ".join(c[:1] + c[-2:]))
def test_a_negative_layer_or_seed_is_an_error_not_the_default_or_a_wrapped_value(command, tmp_path):
    result = k3moe(*command, cwd=tmp_path)
    assert result.returncode != 0
    assert f"{command[-2]}: must be a non-negative decimal integer, got '{command[-1]}'" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command,expected", [
    (["reference", "--checkpoint", "unused", "--out", "unused", "--seed", "010"], "must be a decimal integer without leading zeros, got 010"),
    (["run", "--ep-rank", "010"], "must be a decimal integer without leading zeros, got 010"),
    (["make-checkpoint", "unused", "--layers", "1,010"], "must be a decimal integer without leading zeros, got 010"),
    (["run", "--ep-size", "0x10"], "must be a non-negative decimal integer, got '0x10'"),
    (["make-checkpoint", "unused", "--threads", ""], "must be a non-negative decimal integer, got ''"),
    (["inspect", "unused", "--ep-size", "1e3"], "must be a non-negative decimal integer, got '1e3'"),
    (["bench", "--tokens", "0b1"], "must be a non-negative decimal integer, got '0b1'"),
    (["run", "--seed", "18446744073709551616"], "must be at most 18446744073709551615, got 18446744073709551616"),
    (["make-checkpoint", "unused", "--seed", "99999999999999999999"], "must be at most 18446744073709551615"),
], ids=lambda c: " ".join(c[:1] + c[-2:]) if isinstance(c, list) else None)
def test_an_integer_is_plain_decimal_not_octal_hex_or_clamped(command, expected, tmp_path):
    """CLI11 alone reads "010" as 8 and "0x10" as 16 and clamps a seed past 2^64 - 1: every integer
    option takes decimal digits only, within range."""
    result = k3moe(*command, cwd=tmp_path)
    assert result.returncode != 0
    assert f"{command[-2]}: {expected}" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command,expected", [
    (["bench", "--sustain-ms", "-5"], "600000"),
    (["bench", "--sustain-ms", "abc"], "600000"),
    (["bench", "--sustain-ms", "700000"], "600000"),
    (["reference", "--checkpoint", "unused", "--out", "unused", "--tokens", "2000000000"], "1048576"),
], ids=lambda c: " ".join(c[:1] + c[-2:]) if isinstance(c, list) else None)
def test_a_number_outside_its_range_names_the_option_the_value_and_the_range(command, expected):
    result = k3moe(*command)
    assert result.returncode != 0
    assert command[-2] in result.stderr and command[-1] in result.stderr and expected in result.stderr, result.stderr


def test_bench_with_no_case_selected_is_an_error_not_an_empty_table():
    result = k3moe("bench", "--suite", "decode", "--tokens", "3")
    assert result.returncode != 0
    assert "no case of --suite decode" in result.stderr and "need --shape" in result.stderr, result.stderr


@pytest.mark.parametrize("out,message", [
    ("no/such/dir/r.safetensors", "the directory no/such/dir does not exist"),
    (".", "is a directory, not a file to write"),
    ("", "--out must name the file to write, got an empty path"),
])
def test_reference_checks_where_its_output_goes_before_loading(out, message, tmp_path):
    result = k3moe("reference", "--checkpoint", "unused", "--out", out, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_inspect_refuses_an_option_that_does_not_apply_to_the_path(tmp_path):
    ckpt = tmp_path / "ckpt"
    made = k3moe("make-checkpoint", str(ckpt), "--reduced", "--layers", "1", "--shards", "1", "--experts", "4",
                 "--top-k", "2")
    assert made.returncode == 0, made.stderr
    shard = next(ckpt.glob("*.safetensors"))
    for path, option, applies_to in ((ckpt, ["--json"], "a .safetensors file"),
                                     (shard, ["--layer", "1"], "a checkpoint directory"),
                                     (shard, ["--ep-size", "2"], "a checkpoint directory")):
        result = k3moe("inspect", str(path), *option)
        assert result.returncode != 0 and result.stdout == "", (option, result.stdout)
        assert f"{option[0]}: applies only to {applies_to}, and {path} is" in result.stderr, result.stderr
    assert k3moe("inspect", str(shard), "--json").returncode == 0
    assert k3moe("inspect", str(ckpt), "--layer", "1", "--ep-size", "2").returncode == 0


def test_inspect_escapes_control_characters_a_file_holds(tmp_path):
    forged = "a\n  validation  all layers: valid\x1b[31m"
    header = json.dumps({"__metadata__": {"k": "v\rX"},
                         forged: {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    path = tmp_path / "forged.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x01\x02")
    result = k3moe("inspect", str(path))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    assert "a\\x0a  validation  all layers: valid\\x1b[31m" in result.stdout
    assert "metadata k = v\\x0dX" in result.stdout
    assert len(result.stdout.splitlines()) == 3, result.stdout  # the file's line, its metadata, one tensor
    # Errors that quote a name escape it as well.
    bad = json.dumps({forged: {"dtype": "U8", "shape": [3], "data_offsets": [0, 2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(bad)) + bad + b"\x01\x02")
    result = k3moe("inspect", str(path))
    assert result.returncode == 1 and "\x1b" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert "a\\x0a  validation" in result.stderr, result.stderr


def test_out_of_host_memory_is_a_clear_error_and_leaves_no_partial_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    # One expert of H = I = 2^20 is 1.75 TB: past the 4 GB of address space this run may take.
    command = (f"ulimit -v 4000000; exec '{crosscheck_env.program('K3MOE_BIN')}' make-checkpoint '{out}' --reduced "
               "--hidden 1048576 --intermediate 1048576 --experts 1 --top-k 1 --shards 1")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            timeout=SECONDS_BEFORE_ANY_WEIGHT_LOADS)
    assert result.returncode == 1, result.stderr
    assert "k3moe: error: out of host memory" in result.stderr, result.stderr
    assert list(out.iterdir()) == [], "a failed make-checkpoint left files behind"


def test_run_refuses_more_tokens_than_host_memory_holds_before_loading():
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    # Kimi-K3's per-token host bytes: x 2 H, x_model 4 D, logits 4 E, ids and weights 8 K, two
    # float64 [T, H] outputs.
    needed = (2 * 3584 + 4 * 7168 + 4 * 896 + 8 * 16 + 16 * 3584) * (1 << 20)
    if needed <= machine:
        pytest.skip(f"this machine holds {machine} bytes, enough for --tokens 2^20")
    result = k3moe("run", "--backend", "cpu", "--tokens", str(1 << 20))
    assert result.returncode == 1
    assert "--tokens 1048576: its inputs and the float64 reference's outputs alone take 101.60 GB" in result.stderr, \
        result.stderr
    assert "local experts" not in result.stdout, "the layer was loaded before the memory was checked"
