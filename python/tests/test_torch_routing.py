"""torch.ops.k3moe.route against the pure-PyTorch routing of the contract (k3moe_torch_reference).

Asserted: ids equal exactly. Weights within 4 fp32 ulps (rtol 2^-21): both sides compute
sigmoid in float64 rounded once to fp32 and add the bias in fp32, so the selection is exact; the
weights then take one fp32 sum of K terms in slot order, one division and one multiplication,
where an implementation may fuse a multiply-add or divide by a reciprocal (one rounding each).
"""

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_reference as ref  # noqa: E402

pytestmark = pytest.mark.hopper

WEIGHT_RTOL = 2.0**-21


def check_routing(logits, bias, top_k, renormalize=True, scaling=1.0):
    ids, weights = k3moe.route(logits, bias, top_k, renormalize, scaling)
    ref_ids, ref_weights = ref.route(logits, bias, top_k, renormalize, scaling)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (logits.shape[0], top_k)
    mismatch = (ids != ref_ids).any(dim=1).nonzero().flatten()
    assert mismatch.numel() == 0, (f"routing ids differ on {mismatch.numel()} tokens, first {mismatch[:5].tolist()}: "
                                   f"{ids[mismatch[0]].tolist()} vs {ref_ids[mismatch[0]].tolist()}")
    torch.testing.assert_close(weights, ref_weights, rtol=WEIGHT_RTOL, atol=0.0)
    return ids, weights


@pytest.mark.parametrize("tokens", [1, 7, 128, 1000])
def test_route_kimi_k3(tokens):
    """896 experts, top-16, the bias in a realistic range (it shifts the choice, not the weight)."""
    g = torch.Generator(device="cuda").manual_seed(tokens)
    logits = torch.randn((tokens, 896), generator=g, device="cuda") * 2.0
    bias = torch.randn((896,), generator=g, device="cuda") * 0.05
    ids, weights = check_routing(logits, bias, 16)
    assert torch.allclose(weights.sum(dim=1), torch.ones(tokens, device="cuda"), rtol=1e-5)
    sorted_ids = ids.sort(dim=1).values
    assert (sorted_ids[:, 1:] != sorted_ids[:, :-1]).all(), "duplicate ids in a token"


@pytest.mark.parametrize("tokens", [1, 7, 128, 1000])
def test_route_small_without_renormalize(tokens):
    g = torch.Generator(device="cuda").manual_seed(100 + tokens)
    logits = torch.randn((tokens, 16), generator=g, device="cuda")
    bias = torch.randn((16,), generator=g, device="cuda") * 0.1
    check_routing(logits, bias, 4, renormalize=False, scaling=2.5)


def test_route_ties_go_to_the_lower_id():
    """Equal choices everywhere: the K lowest ids, in id order."""
    logits = torch.zeros((5, 896), device="cuda")
    bias = torch.zeros((896,), device="cuda")
    ids, weights = check_routing(logits, bias, 16)
    assert ids.tolist() == [list(range(16))] * 5
    # Partial ties: experts 3 and 9 share the top choice, then 0..: 3 before 9.
    bias[3] = bias[9] = 1.0
    ids, _ = check_routing(logits, bias, 4)
    assert ids[0].tolist() == [3, 9, 0, 1]


def test_route_nonfinite_logits_stay_in_range():
    """The contract: non-finite logits never produce out-of-range or duplicate ids."""
    logits = torch.randn((4, 896), device="cuda")
    logits[0, :] = torch.nan
    logits[1, 5] = torch.nan
    logits[2, 7] = torch.inf
    logits[3, 100] = -torch.inf
    ids, weights = k3moe.route(logits, torch.zeros(896, device="cuda"), 16)
    assert ((ids >= 0) & (ids < 896)).all()
    sorted_ids = ids.sort(dim=1).values
    assert (sorted_ids[:, 1:] != sorted_ids[:, :-1]).all()
    assert torch.isfinite(weights[1:]).all(), "a finite row got a non-finite weight"


def test_route_empty():
    ids, weights = k3moe.route(torch.empty((0, 896), device="cuda"), torch.zeros(896, device="cuda"), 16)
    assert ids.shape == (0, 16) and weights.shape == (0, 16)
