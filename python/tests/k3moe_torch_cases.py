"""Random inputs for the binding's tests: MXFP4 experts (random codes, scales in a realistic
range), activations and routings, all from a seeded generator."""

from __future__ import annotations

import time

import torch

# E8M0 scale bytes of the random experts: 2^-17 .. 2^1. The kernel layout takes bytes up to 128
# (group scales <= 2; 129..254 are rejected by prepare_experts, which test_torch_errors checks).
SCALE_LOW, SCALE_HIGH = 110, 128


def random_experts(num_local: int, hidden: int, intermediate: int, seed: int, device="cuda"):
    """(w13_packed [L, 2I, H/2], w13_scale [L, 2I, H/32], w2_packed [L, H, I/2], w2_scale [L, H, I/32]) uint8."""
    g = torch.Generator(device=device).manual_seed(seed)
    L, H, I = num_local, hidden, intermediate

    def codes(*shape):
        return torch.randint(0, 256, shape, generator=g, device=device, dtype=torch.uint8)

    def scales(*shape):
        return torch.randint(SCALE_LOW, SCALE_HIGH + 1, shape, generator=g, device=device, dtype=torch.uint8)

    return codes(L, 2 * I, H // 2), scales(L, 2 * I, H // 32), codes(L, H, I // 2), scales(L, H, I // 32)


def random_x(tokens: int, hidden: int, seed: int, device="cuda", std=0.5) -> torch.Tensor:
    """bf16 activations, N(0, std^2). NOTE: with the experts above (weights of rms ~1.5), std 0.5
    puts h = x W13^T at rms ~17 for H = 512: gate and up values across the activations' curved
    ranges rather than deep in saturation."""
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn((tokens, hidden), generator=g, device=device) * std).to(torch.bfloat16)


def random_routing(tokens: int, num_experts: int, top_k: int, seed: int, device="cuda", unused_fraction=0.1,
                   experts=None):
    """Distinct ids per token drawn from `experts` (default: all E), about unused_fraction of the
    slots set to -1; weights uniform in (0, 1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    pool = torch.arange(num_experts, device=device) if experts is None else torch.as_tensor(experts, device=device)
    order = torch.rand((tokens, pool.numel()), generator=g, device=device).argsort(dim=1)[:, :top_k]
    ids = pool[order].to(torch.int32)
    unused = torch.rand((tokens, top_k), generator=g, device=device) < unused_fraction
    ids = torch.where(unused, torch.full_like(ids, -1), ids)
    weights = torch.rand((tokens, top_k), generator=g, device=device, dtype=torch.float32)
    return ids.contiguous(), weights


def per_call_us(fn, calls: int, warmup: int = 20) -> float:
    """fn's launch-to-launch microseconds over `calls` back-to-back calls, after `warmup` calls,
    the GPU synchronised before and after."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6
