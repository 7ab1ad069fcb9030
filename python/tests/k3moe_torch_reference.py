"""A pure-PyTorch model of Kimi-K3's routing and routed experts, written here from the contract
(K3_CONTRACT.md; include/k3moe/config.h and reference.h for the modes) and independent of the
library's C++ reference: its own E2M1 table, E8M0 decode, MXFP8 quantizer, activations, routing
and combine. Matmuls run in float32 with TF32 off.

Two precisions, as in the library's validation:
  emulate: the mode's roundings applied where the kernels apply them
           a16:   a = bf16(act(h)),               out = bf16(sum_k w_k y_k in fp32, slot order)
           mxfp8: x -> MXFP8, a = MXFP8(act(h)),   out = bf16(...)
  ideal:   no rounding at all: bf16 x as given, exact weights, fp32 activation, fp32 output.
"""

from __future__ import annotations

import torch

# E2M1 (OCP MX FP4): codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E4M3_MAX = 448.0


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 byte s -> 2^(s - 127) in float32 (exact: computed in float64), 255 -> NaN."""
    value = torch.pow(2.0, scale.to(torch.float64) - 127.0)
    return torch.where(scale == 255, torch.nan, value).to(torch.float32)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """packed [..., N, K/2] uint8 (low nibble = even k), scale [..., N, K/32] uint8 -> [..., N, K] fp32."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)
    return table[codes.long()] * e8m0_to_float(scale).repeat_interleave(32, dim=-1)


def quantize_mxfp8(v: torch.Tensor):
    """The contract's MXFP8 along the last dimension (groups of 32): scale 2^e with the smallest e
    such that amax <= 448 * 2^e (E8M0, clamped to [-127, 127]; amax below fp32's smallest normal
    gives e = -127), codes = E4M3 RNE of v / 2^e. Returns (dequantized fp32, codes uint8, scale
    bytes uint8 [..., N/32])."""
    groups = v.to(torch.float32).unflatten(-1, (-1, 32))
    amax = groups.abs().amax(dim=-1)
    mantissa, exponent = torch.frexp(amax)  # amax = mantissa * 2^exponent, mantissa in [0.5, 1)
    # amax = A * 2^Ea with A in [1, 2): Ea = exponent - 1, A = 2 mantissa; 448 = 1.75 * 2^8.
    e = (exponent - 1) - 8 + (2.0 * mantissa > 1.75).to(exponent.dtype)
    e = torch.where(amax < 2.0**-126, torch.full_like(e, -127), e).clamp(-127, 127)
    scale = torch.pow(2.0, e.to(torch.float64)).to(torch.float32).unsqueeze(-1)
    down = torch.pow(2.0, -e.to(torch.float64)).to(torch.float32).unsqueeze(-1)
    q = (groups * down).to(torch.float8_e4m3fn)
    dequantized = (q.to(torch.float32) * scale).flatten(-2)
    return dequantized, q.view(torch.uint8).flatten(-2), (e + 127).to(torch.uint8)


def activation(kind: str, h: torch.Tensor, params: dict) -> torch.Tensor:
    """Gated activation on h = [gate | up] (the gate is the first half), in fp32."""
    g, u = h.chunk(2, dim=-1)
    if kind == "situ":
        beta, beta_lin = params["situ_beta"], params["situ_linear_beta"]
        return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (beta_lin * torch.tanh(u / beta_lin))
    if kind == "swiglu":
        return g * torch.sigmoid(g) * u
    if kind == "swiglu_oai":
        alpha, limit = params["swiglu_alpha"], params["swiglu_limit"]
        g = torch.clamp(g, max=limit)
        u = torch.clamp(u, -limit, limit)
        return g * torch.sigmoid(alpha * g) * (u + 1.0)
    raise ValueError(kind)


def route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, renormalize: bool = True,
          scaling: float = 1.0):
    """The contract's routing: s = sigmoid(logit) in float64 rounded once to fp32; choice = s + bias
    in fp32; the K largest choices, ties to the lower expert id; w = s / (sum of the K s in slot
    order, fp32, + 1e-20) * scaling."""
    s = torch.sigmoid(logits.to(torch.float64)).to(torch.float32)
    choice = s + bias.to(torch.float32)
    # NOTE: a stable descending sort keeps equal choices in id order, i.e. ties to the lower id.
    order = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = torch.gather(s, 1, order)
    if renormalize:
        total = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)
        for k in range(top_k):  # slot order, one fp32 rounding per addition
            total = total + w[:, k]
        w = w / (total + torch.tensor(1e-20, dtype=torch.float32)).unsqueeze(1)
    w = w * torch.tensor(scaling, dtype=torch.float32)
    return order.to(torch.int32), w


def forward(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w13_packed, w13_scale, w2_packed,
            w2_scale, *, first_expert: int, mode: str, activation_kind: str, params: dict,
            precision: str) -> torch.Tensor:
    """One EP rank's routed experts. x [T, H] bf16, ids [T, K] global (-1, other ranks' and
    out-of-range ids contribute nothing), weights [T, K] fp32, the rank's experts in the checkpoint
    layout. Returns fp32 [T, H]: bf16-representable values for 'emulate', unrounded for 'ideal'."""
    emulate = precision == "emulate"
    T, H = x.shape
    K = ids.shape[1]
    num_local = w13_packed.shape[0]
    xf = x.to(torch.float32)
    if emulate and mode == "mxfp8":
        xf = quantize_mxfp8(xf)[0]
    y = torch.zeros((T, K, H), dtype=torch.float32, device=x.device)
    for e in range(num_local):
        token, slot = torch.nonzero(ids == first_expert + e, as_tuple=True)
        if token.numel() == 0:
            continue
        w13 = dequantize_mxfp4(w13_packed[e], w13_scale[e])  # [2I, H]
        w2 = dequantize_mxfp4(w2_packed[e], w2_scale[e])  # [H, I]
        h = xf[token] @ w13.t()
        a = activation(activation_kind, h, params)
        if emulate:
            a = a.to(torch.bfloat16).to(torch.float32) if mode == "a16" else quantize_mxfp8(a)[0]
        y[token, slot] = a @ w2.t()
    out = torch.zeros((T, H), dtype=torch.float32, device=x.device)
    for k in range(K):  # the combine: fp32, slot order
        out = out + weights[:, k : k + 1] * y[:, k]
    return out.to(torch.bfloat16).to(torch.float32) if emulate else out


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64."""
    a, b = actual.to(torch.float64), expected.to(torch.float64)
    norm = torch.linalg.vector_norm(b).item()
    return torch.linalg.vector_norm(a - b).item() / norm if norm > 0 else torch.linalg.vector_norm(a).item()
