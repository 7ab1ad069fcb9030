"""What the cross-checks need from their environment: Python modules, and the programs ctest passes
in by environment variable. Under ctest (K3MOE_CROSSCHECKS_REQUIRED=1) a missing one fails the test,
so a misconfigured build cannot pass by skipping everything; run by hand, the test skips."""

import importlib
import os

import pytest

REQUIRED = os.environ.get("K3MOE_CROSSCHECKS_REQUIRED") == "1"


def module(name):
    if REQUIRED:
        return importlib.import_module(name)
    return pytest.importorskip(name)


def program(variable):
    """The path in `variable` (K3MOE_BIN: the k3moe program; K3MOE_FORMAT_ORACLE: format_oracle)."""
    path = os.environ.get(variable)
    if path:
        return path
    message = f"{variable} is not set (ctest sets it to the program's path)"
    if REQUIRED:
        pytest.fail(message)
    pytest.skip(message, allow_module_level=True)
