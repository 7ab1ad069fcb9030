"""The test oracle itself: the pure-PyTorch reference (k3moe_torch_reference) against the library's
float64 reference (`k3moe reference`, src/reference) on a reduced synthetic checkpoint read through
torch.classes.k3moe.Checkpoint. Runs on the CPU; needs K3MOE_BIN (the k3moe program).

Bounds: routing ids equal and weights bit for bit (the same fp32 operations in the same order).
Emulate: the two differ only where h lands within a few fp32 ulps of a bf16 / E4M3 rounding
boundary of `a` or `out` (fp32 matmul here, exact float64 products rounded once there; torch's tanh
and exp against the C library's): measured up to 2.9e-4 in a16 and 0 in mxfp8 (Session 43's log),
bounded at a16 1e-3, mxfp8 2.5e-3 (test_torch_forward.py's bounds). Ideal: an
fp32 matmul of n <= 256 terms against float64, ~sqrt(n) 2^-24 ~ 1e-6 relative: <= 1e-5.
"""

import json
import os
import subprocess

import pytest

from k3moe_test_env import import_safetensors_torch, require_package, require_tool

torch, k3moe = require_package()
safetensors_torch = import_safetensors_torch()
import k3moe_torch_reference as ref  # noqa: E402

K3MOE_BIN = os.environ.get("K3MOE_BIN")
require_tool(bool(K3MOE_BIN), "K3MOE_BIN is not set (path of the k3moe program)")

BOUNDS = {"a16": 1e-3, "mxfp8": 2.5e-3}
IDEAL_BOUND = 1e-5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reduced") / "ckpt"
    subprocess.run([K3MOE_BIN, "make-checkpoint", str(directory), "--reduced", "--seed", "5"], check=True,
                   capture_output=True)
    return directory, torch.classes.k3moe.Checkpoint(str(directory))


@pytest.mark.parametrize("mode", ["a16", "mxfp8"])
@pytest.mark.parametrize("activation", ["situ", "swiglu", "swiglu_oai"])
@pytest.mark.parametrize("ep_size, ep_rank", [(1, 0), (2, 1)])
def test_torch_reference_matches_the_library_reference(checkpoint, tmp_path, mode, activation, ep_size, ep_rank):
    directory, ckpt = checkpoint
    config = json.loads(ckpt.config_json())
    path = tmp_path / "reference.safetensors"
    subprocess.run([K3MOE_BIN, "reference", "--checkpoint", str(directory), "--tokens", "40", "--mode", mode,
                    "--activation", activation, "--ep-size", str(ep_size), "--ep-rank", str(ep_rank), "--seed", "3",
                    "--out", str(path)], check=True, capture_output=True)
    library = safetensors_torch.load_file(str(path))
    x = library["x"] if library["x"].dtype == torch.bfloat16 else library["x"].view(torch.bfloat16)

    ids, weights = ref.route(library["logits"], library["bias"], config["top_k"], config["renormalize"],
                             config["routed_scaling_factor"])
    assert torch.equal(ids, library["ids"].to(torch.int32))
    assert torch.equal(weights.view(torch.int32), library["weights"].view(torch.int32))

    raw = ckpt.load_experts(ckpt.moe_layers()[0], ep_size, ep_rank)
    params = {k: config[k] for k in ("situ_beta", "situ_linear_beta", "swiglu_alpha", "swiglu_limit")}
    first = ep_rank * config["num_experts"] // ep_size
    ours = {p: ref.forward(x, ids, weights, *raw, first_expert=first, mode=mode, activation_kind=activation,
                           params=params, precision=p) for p in ("emulate", "ideal")}
    assert torch.linalg.vector_norm(library["out_ideal"].double()) > 0
    emulate = ref.rel_l2(ours["emulate"], library["out_emulate"])
    ideal = ref.rel_l2(ours["ideal"], library["out_ideal"])
    print(f"oracle {mode} {activation} EP{ep_size}/{ep_rank}: emulate {emulate:.2e}, ideal {ideal:.2e}")
    assert emulate <= BOUNDS[mode]
    assert ideal <= IDEAL_BOUND
