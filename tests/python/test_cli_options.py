"""The option checks of `k3moe run`, `reference` and `make-checkpoint`: a bad value, or a backend
that cannot run here, fails at once with a message naming the option, before minutes of loading a
full-size layer, and before a negative value could wrap or stand for the default.

The k3moe binary comes from the environment variable K3MOE_BIN (ctest sets it).
"""

import subprocess

import pytest

import crosscheck_env

SECONDS_BEFORE_ANY_WEIGHT_LOADS = 30


def k3moe(*args):
    return subprocess.run([crosscheck_env.program("K3MOE_BIN"), *args], capture_output=True, text=True,
                          timeout=SECONDS_BEFORE_ANY_WEIGHT_LOADS)


def run(*args):
    return k3moe("run", "--tokens", "1", *args)


@pytest.mark.parametrize("option,value,expected", [
    ("--backend", "bogus", "{auto,gpu,cpu}"),
    ("--mode", "fp4", '"a16" or "mxfp8"'),
    ("--activation", "relu", '"situ", "swiglu" or "swiglu_oai"'),
])
def test_a_bad_value_fails_before_loading_and_names_the_choices(option, value, expected):
    result = run(option, value)
    assert result.returncode != 0
    assert value in result.stderr and expected in result.stderr, result.stderr
    assert "local experts" not in result.stdout, "the weights were loaded before the option was checked"


def test_backend_gpu_without_a_usable_gpu_fails_before_loading():
    try:
        result = run("--backend", "gpu")
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
    result = subprocess.run([crosscheck_env.program("K3MOE_BIN"), *command], capture_output=True, text=True,
                            timeout=SECONDS_BEFORE_ANY_WEIGHT_LOADS, cwd=tmp_path)
    assert result.returncode != 0
    assert f"{command[-2]}: must be a non-negative integer, got {command[-1]}" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_reference_tokens_beyond_the_cli_limit_are_refused_before_loading():
    result = k3moe("reference", "--checkpoint", "unused", "--out", "unused", "--tokens", "2000000000")
    assert result.returncode != 0
    assert "--tokens" in result.stderr and "2000000000" in result.stderr and "1048576" in result.stderr, result.stderr


@pytest.mark.parametrize("out,message", [
    ("no/such/dir/r.safetensors", "the directory no/such/dir does not exist"),
    (".", "is a directory, not a file to write"),
])
def test_reference_checks_where_its_output_goes_before_loading(out, message, tmp_path):
    result = subprocess.run([crosscheck_env.program("K3MOE_BIN"), "reference", "--checkpoint", "unused", "--out", out],
                            capture_output=True, text=True, timeout=SECONDS_BEFORE_ANY_WEIGHT_LOADS, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
