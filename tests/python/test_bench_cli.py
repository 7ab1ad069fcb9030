"""`k3moe bench`'s option checks, which run before it looks for a GPU (so they hold on any machine).

The k3moe binary comes from the environment variable K3MOE_BIN (ctest sets it).
"""

import subprocess

import pytest

import crosscheck_env


def bench(*args):
    path = crosscheck_env.program("K3MOE_BIN")
    return subprocess.run([path, "bench", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("value", ["-5", "abc", "700000"])
def test_sustain_ms_outside_its_range_names_the_option_the_value_and_the_range(value):
    result = bench("--sustain-ms", value)
    assert result.returncode != 0
    assert "--sustain-ms" in result.stderr and value in result.stderr and "600000" in result.stderr, result.stderr


@pytest.mark.parametrize("option,value,choices", [
    ("--suite", "decoder", "{decode,prefill,all}"),
    ("--shape", "ep8", "{local28,ep32,ep16}"),
    ("--mode", "fp4", "{a16,mxfp8}"),
])
def test_an_unknown_name_fails_naming_the_choices(option, value, choices):
    result = bench(option, value)
    assert result.returncode != 0
    assert option in result.stderr and value in result.stderr and choices in result.stderr, result.stderr


def test_no_case_selected_is_an_error_not_an_empty_table():
    result = bench("--suite", "decode", "--tokens", "3")
    assert result.returncode != 0
    assert "no case of --suite decode" in result.stderr and "need --shape" in result.stderr, result.stderr
