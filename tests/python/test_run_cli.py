"""`k3moe run`'s option checks: a bad value, or a backend that cannot run here, fails at once with a
message naming the option, before minutes of loading a full-size layer.

The k3moe binary comes from the environment variable K3MOE_BIN (ctest sets it).
"""

import subprocess

import pytest

import crosscheck_env

SECONDS_BEFORE_ANY_WEIGHT_LOADS = 30


def run(*args):
    path = crosscheck_env.program("K3MOE_BIN")
    return subprocess.run([path, "run", "--tokens", "1", *args], capture_output=True, text=True,
                          timeout=SECONDS_BEFORE_ANY_WEIGHT_LOADS)


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
