"""What the binding's tests can use here: torch, the built k3moe package, a Hopper GPU.

Without one of them the tests that need it skip with a message saying which is missing (CI's
case). scripts/python-check.sh sets K3MOE_REQUIRE_GPU=1, which turns every such skip into an
error, so that a broken build or a missing GPU cannot pass there as "skipped".
"""

from __future__ import annotations

import os

import pytest

REQUIRE_GPU = os.environ.get("K3MOE_REQUIRE_GPU") == "1"


def _missing() -> tuple[str | None, str | None]:
    """(why the package cannot be used, why the GPU tests cannot run); None where nothing is missing."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not installed ({e})", "torch is not installed"
    try:
        import k3moe  # noqa: F401
    except ImportError as e:
        return f"the k3moe package is not built or not installed ({e})", "k3moe is not importable"
    if not torch.cuda.is_available():
        return None, "no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(0)
        return None, f"device 0 is {name} (compute capability {major}.{minor}); k3moe's kernels need 9.0 (Hopper)"
    return None, None


PACKAGE_MISSING, GPU_MISSING = _missing()


def require_package():
    """(torch, k3moe) for a test module, or a module-level skip saying what is missing."""
    if PACKAGE_MISSING:
        if REQUIRE_GPU:
            raise RuntimeError(f"K3MOE_REQUIRE_GPU=1 but {PACKAGE_MISSING}")
        pytest.skip(PACKAGE_MISSING, allow_module_level=True)
    import torch

    import k3moe

    return torch, k3moe


def require_tool(available: bool, why: str) -> None:
    """A module-level skip when a tool a test module needs (the safetensors package, the k3moe
    program) is missing; under K3MOE_REQUIRE_GPU=1 (the GPU machine's full run) an error instead,
    so that a test of the tests' own reference cannot pass there as "skipped"."""
    if available:
        return
    if REQUIRE_GPU:
        raise RuntimeError(f"K3MOE_REQUIRE_GPU=1 but {why}")
    pytest.skip(why, allow_module_level=True)


def import_safetensors_torch():
    """safetensors.torch, or require_tool's skip / error."""
    try:
        import safetensors.torch
    except ImportError as e:
        require_tool(False, f"the safetensors package is not installed ({e})")
    return safetensors.torch
