"""torch.ops.k3moe.forward against the pure-PyTorch model of the experts (k3moe_torch_reference).

Tolerances, per mode, about twice the largest measured (docs/PRECISION.md; the library's own
matrix: src/validation/validation.cpp):
  vs the emulating reference (the mode's roundings applied where the kernels apply them):
    a16:   rel-L2 <= 1e-3. The kernel and the model differ only in fp32 summation order (and an
           fp32 matmul's blocking), which now and then flips a bf16 rounding of `a` or of `out`
           by one unit (2^-8 relative) on a small fraction of elements (the matrix: up to 8.46e-4,
           in one full-size T = 1 case; these small shapes flip less), plus the model's own
           distance from the library's emulation (up to 2.9e-4, the oracle test). Measured here:
           up to 2.4e-4.
    mxfp8: rel-L2 <= 2.5e-3. The same flips, but in an E4M3 intermediate one unit is 2^-3
           relative, and a whole group moves when its amax crosses a power of two.
  vs the ideal reference (no rounding at all), about twice the mode's own rounding error:
    a16: rel-L2 <= 5e-3 (bf16 `a` and `out`, measured ~2.4e-3); mxfp8: <= 1.5e-1 (E4M3 x and a,
    measured up to 8.2e-2).
Outputs are pre-filled with NaN where the caller gives `out`, so an unwritten element fails.
"""

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_cases as cases  # noqa: E402
import k3moe_torch_reference as ref  # noqa: E402

pytestmark = pytest.mark.hopper

TOLERANCE = {"a16": (1e-3, 5e-3), "mxfp8": (2.5e-3, 1.5e-1)}  # (vs emulate, vs ideal)
SMALL = dict(num_experts=16, top_k=4, hidden=512, intermediate=256)


@pytest.fixture(scope="module", autouse=True)
def exact_fp32_matmuls():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference's matmuls are true fp32
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.fixture(scope="module")
def small_experts():
    """E = 16 experts of H = 512, I = 256 (one rank), checkpoint layout and kernel layout."""
    raw = cases.random_experts(16, SMALL["hidden"], SMALL["intermediate"], seed=1)
    return raw, k3moe.prepare_experts(*raw)


def reference_outputs(x, ids, weights, raw, config):
    params = dict(situ_beta=config.situ_beta, situ_linear_beta=config.situ_linear_beta,
                  swiglu_alpha=config.swiglu_alpha, swiglu_limit=config.swiglu_limit)
    return [ref.forward(x, ids, weights, *raw, first_expert=config.first_expert, mode=config.mode,
                        activation_kind=config.activation, params=params, precision=p)
            for p in ("emulate", "ideal")]


def check_against_reference(out, x, ids, weights, raw, config, label=""):
    emulate, ideal = reference_outputs(x, ids, weights, raw, config)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape[:1] + (config.hidden,)
    assert torch.isfinite(out).all(), f"{label}: non-finite output"
    tol_emulate, tol_ideal = TOLERANCE[config.mode]
    e, i = ref.rel_l2(out, emulate), ref.rel_l2(out, ideal)
    print(f"{label}: rel-L2 vs emulate {e:.3e} (<= {tol_emulate}), vs ideal {i:.3e} (<= {tol_ideal})")
    assert e <= tol_emulate, f"{label}: rel-L2 vs the emulating reference {e:.3e} > {tol_emulate}"
    assert i <= tol_ideal, f"{label}: rel-L2 vs the ideal reference {i:.3e} > {tol_ideal}"


@pytest.mark.parametrize("mode", ["a16", "mxfp8"])
@pytest.mark.parametrize("tokens", [1, 7, 128, 1000, 4096])
def test_forward_small(small_experts, mode, tokens):
    """T = 4096 needs a ~40 MiB workspace, which comes from torch's allocator per call (the others
    use the one kept for the stream: python/csrc/stream_workspace.h)."""
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL, mode=mode)
    x = cases.random_x(tokens, config.hidden, seed=tokens)
    ids, weights = cases.random_routing(tokens, config.num_experts, config.top_k, seed=tokens + 1)
    out = k3moe.forward(x, ids, weights, experts, config)
    check_against_reference(out, x, ids, weights, raw, config, f"{mode} T={tokens}")


@pytest.mark.parametrize("activation", ["situ", "swiglu", "swiglu_oai"])
def test_forward_activations(small_experts, activation):
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL, activation=activation, situ_beta=3.0, swiglu_alpha=1.5, swiglu_limit=6.0)
    x = cases.random_x(33, config.hidden, seed=5)
    ids, weights = cases.random_routing(33, config.num_experts, config.top_k, seed=6)
    out = k3moe.forward(x, ids, weights, experts, config)
    check_against_reference(out, x, ids, weights, raw, config, activation)


def test_forward_routed_by_route(small_experts):
    """router -> forward: the ids and weights route() produces feed forward() as they are."""
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL)
    logits = torch.randn((64, config.num_experts), device="cuda")
    bias = torch.randn((config.num_experts,), device="cuda") * 0.1
    ids, weights = k3moe.route(logits, bias, config.top_k)
    x = cases.random_x(64, config.hidden, seed=9)
    check_against_reference(k3moe.forward(x, ids, weights, experts, config), x, ids, weights, raw, config, "routed")


@pytest.mark.parametrize("ep_size", [2, 4])
def test_forward_expert_parallel(ep_size):
    """Each rank holds E / P experts and gets global ids; the ranks' outputs are partial sums."""
    H, I, E, K = SMALL["hidden"], SMALL["intermediate"], SMALL["num_experts"], SMALL["top_k"]
    raw = cases.random_experts(E, H, I, seed=2)
    x = cases.random_x(50, H, seed=3)
    ids, weights = cases.random_routing(50, E, K, seed=4)
    total = torch.zeros((50, H), dtype=torch.float32, device="cuda")
    L = E // ep_size
    for rank in range(ep_size):
        config = k3moe.MoeConfig(**SMALL, ep_size=ep_size, ep_rank=rank)
        rank_raw = [t[rank * L:(rank + 1) * L].contiguous() for t in raw]
        out = k3moe.forward(x, ids, weights, k3moe.prepare_experts(*rank_raw), config)
        check_against_reference(out, x, ids, weights, rank_raw, config, f"EP rank {rank}/{ep_size}")
        total += out.float()
    whole = ref.forward(x, ids, weights, *raw, first_expert=0, mode="a16", activation_kind="situ",
                        params=dict(situ_beta=4.0, situ_linear_beta=25.0), precision="ideal")
    # NOTE: P partial sums each rounded to bf16 (2^-9 relative), on top of the a16 bound.
    assert ref.rel_l2(total, whole) <= TOLERANCE["a16"][1] + ep_size * 2.0 ** -9


def test_forward_out_and_unused_rows(small_experts):
    """out= is written in place, every element (NaN pre-fill); rows whose ids are all -1, or
    garbage (>= E or < -1, as graph padding may hold), come out zero."""
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL)
    x = cases.random_x(20, config.hidden, seed=11)
    ids, weights = cases.random_routing(20, config.num_experts, config.top_k, seed=12)
    ids[3] = -1
    ids[4] = torch.tensor([16, 1 << 30, -2, -(1 << 30)], dtype=torch.int32)
    out = torch.full((20, config.hidden), torch.nan, dtype=torch.bfloat16, device="cuda")
    returned = k3moe.forward(x, ids, weights, experts, config, out=out)
    assert returned is out
    assert torch.isfinite(out).all()
    assert (out[3] == 0).all() and (out[4] == 0).all()
    clean = ids.clone()
    clean[4] = -1
    check_against_reference(out, x, clean, weights, raw, config, "out=")
    assert torch.equal(out, k3moe.forward(x, ids, weights, experts, config)), "out= and the allocating op differ"


def test_forward_zero_tokens(small_experts):
    _, experts = small_experts
    config = k3moe.MoeConfig(**SMALL)
    x = torch.empty((0, config.hidden), dtype=torch.bfloat16, device="cuda")
    ids = torch.empty((0, config.top_k), dtype=torch.int32, device="cuda")
    out = k3moe.forward(x, ids, torch.empty((0, config.top_k), device="cuda"), experts, config)
    assert out.shape == (0, config.hidden)


@pytest.mark.parametrize("codes_dtype", [torch.uint8, torch.float8_e4m3fn])
def test_forward_prequantized_mxfp8(small_experts, codes_dtype):
    """x given as MXFP8 codes + packed E8M0 scales (quantized here by the contract's rule) gives
    the same bits as the op quantizing bf16 x itself."""
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL, mode="mxfp8")
    x = cases.random_x(45, config.hidden, seed=21)
    ids, weights = cases.random_routing(45, config.num_experts, config.top_k, seed=22)
    _, codes, scale_bytes = ref.quantize_mxfp8(x.float())
    x_scales = scale_bytes.contiguous().view(torch.int32)  # four E8M0 bytes per int32, group g at byte g % 4
    assert x_scales.shape == (45, config.hidden // 128)
    out_q = k3moe.forward(codes.view(codes_dtype), ids, weights, experts, config, x_scales=x_scales)
    out_bf16 = k3moe.forward(x, ids, weights, experts, config)
    assert torch.equal(out_q.view(torch.int16), out_bf16.view(torch.int16))
    check_against_reference(out_q, x, ids, weights, raw, config, "pre-quantized")


def test_forward_is_deterministic(small_experts):
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL)
    x = cases.random_x(300, config.hidden, seed=31)
    ids, weights = cases.random_routing(300, config.num_experts, config.top_k, seed=32)
    first = k3moe.forward(x, ids, weights, experts, config)
    for _ in range(3):
        assert torch.equal(k3moe.forward(x, ids, weights, experts, config).view(torch.int16), first.view(torch.int16))


def test_module_from_tensors(small_experts):
    raw, experts = small_experts
    config = k3moe.MoeConfig(**SMALL)
    module = k3moe.nn.KimiK3RoutedExperts.from_tensors(*raw, config=config)
    for name, tensor in zip(k3moe.KernelExperts._fields, experts):
        assert torch.equal(getattr(module, name), tensor), name
    x = cases.random_x(9, config.hidden, seed=41)
    ids, weights = cases.random_routing(9, config.num_experts, config.top_k, seed=42)
    assert torch.equal(module(x, ids, weights), k3moe.forward(x, ids, weights, experts, config))


# ------------------------------------------------------------------------ Kimi-K3 sizes, EP32 rank 5

@pytest.fixture(scope="module")
def kimi_rank():
    """One EP32 rank of a Kimi-K3 layer: 28 local experts of H = 3584, I = 3072 (0.49 GB)."""
    config = k3moe.MoeConfig(ep_size=32, ep_rank=5)
    raw = cases.random_experts(config.num_local, config.hidden, config.intermediate, seed=7)
    return config, raw, k3moe.prepare_experts(*raw)


@pytest.mark.parametrize("mode", ["a16", "mxfp8"])
def test_forward_kimi_k3_one_token(kimi_rank, mode):
    config, raw, experts = kimi_rank
    config = k3moe.MoeConfig(ep_size=config.ep_size, ep_rank=config.ep_rank, mode=mode)
    first = config.first_expert
    # 16 slots: 10 on this rank, 4 on other ranks, 2 unused.
    ids = torch.tensor([[first + 3, 7, first + 27, first, -1, first + 11, 500, first + 5, first + 19, first + 8,
                         first + 1, 895, -1, first + 14, 0, first + 22]], dtype=torch.int32, device="cuda")
    weights = torch.rand((1, 16), device="cuda")
    x = cases.random_x(1, config.hidden, seed=8)
    out = k3moe.forward(x, ids, weights, experts, config)
    check_against_reference(out, x, ids, weights, raw, config, f"Kimi-K3 {mode} T=1")
