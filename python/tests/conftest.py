"""Shared setup of the binding's tests: what is missing decides what skips (k3moe_test_env.py);
tests marked `hopper` need a Hopper GPU."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # k3moe_test_env, k3moe_torch_reference

from k3moe_test_env import GPU_MISSING, PACKAGE_MISSING, REQUIRE_GPU  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "hopper: needs CUDA and a Hopper GPU (compute capability 9.0)")


def pytest_collection_modifyitems(config, items):
    if GPU_MISSING and REQUIRE_GPU:
        raise pytest.UsageError(f"K3MOE_REQUIRE_GPU=1 but {GPU_MISSING}")
    if GPU_MISSING:
        skip = pytest.mark.skip(reason=GPU_MISSING)
        for item in items:
            if "hopper" in item.keywords:
                item.add_marker(skip)


def pytest_report_header(config):
    lines = [f"k3moe binding tests: package {'MISSING (' + PACKAGE_MISSING + ')' if PACKAGE_MISSING else 'ok'}; "
             f"GPU {'MISSING (' + GPU_MISSING + ')' if GPU_MISSING else 'ok'}; K3MOE_REQUIRE_GPU={int(REQUIRE_GPU)}"]
    if not PACKAGE_MISSING:
        import torch

        import k3moe

        lines.append(f"k3moe from {os.path.dirname(k3moe.__file__)}; torch {torch.__version__} (CUDA {torch.version.cuda})")
        if not GPU_MISSING:
            lines.append(f"device: {torch.cuda.get_device_name(0)}")
    return lines
