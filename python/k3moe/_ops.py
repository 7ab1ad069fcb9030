"""The ops under torch.ops.k3moe: loading the compiled library, their fake (meta) implementations
for torch.compile, and thin Python functions over them.

torch.ops.k3moe.prepare_experts(w13_packed, w13_scale, w2_packed, w2_scale)
    -> (w13_codes, w13_scales, w2_codes, w2_scales)
torch.ops.k3moe.route(router_logits, router_bias, top_k, renormalize=True, routed_scaling_factor=1.0)
    -> (topk_ids, topk_weights)
torch.ops.k3moe.forward(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales,
    num_experts, top_k, hidden, intermediate, precision="a16", activation="situ", situ_beta=4.0,
    situ_linear_beta=25.0, swiglu_alpha=1.702, swiglu_limit=7.0, ep_size=1, ep_rank=0,
    x_scales=None) -> out
torch.ops.k3moe.forward_out(... same ..., *, out) -> None

The configuration arguments can be passed by keyword or by position; by position is cheaper to
parse (a few microseconds per call), which is how forward() below passes them.

`precision` is the mode, "a16" | "mxfp8" (MoeConfig.mode). It is not called `mode` in the schemas
because torch.compile's auto_functionalized_v2 (which wraps forward_out) has a `mode` argument of
its own.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import torch

# ---------------------------------------------------------------------------- the compiled library

_LIBRARY_NAME = "_k3moe_ops.so"


def _library_path() -> Path:
    # NOTE: K3MOE_OPS_LIBRARY points at a library built outside the package (a CMake build tree).
    override = os.environ.get("K3MOE_OPS_LIBRARY")
    return Path(override) if override else Path(__file__).with_name(_LIBRARY_NAME)


def _load_library() -> None:
    if hasattr(torch.ops.k3moe, "forward_out"):
        return  # already loaded (the library registers every op at once)
    path = _library_path()
    if not path.is_file():
        raise ImportError(
            f"k3moe: the compiled ops library {path} is missing. Build and install the package with "
            "`pip install --no-build-isolation --no-deps ./python` (see python/README.md), or point "
            "K3MOE_OPS_LIBRARY at a built _k3moe_ops.so"
        )
    torch.ops.load_library(str(path))


_load_library()

# ------------------------------------------------------------------------------ fake implementations
# For FakeTensorMode (torch.compile, torch.export) and meta tensors: the outputs' shapes and dtypes,
# after the checks the C++ op makes of its arguments' dtypes, shapes and devices, so that a traced
# graph fails where an eager call would. The dispatcher also runs these when any argument is a
# meta tensor: the device check then refuses a meta tensor among real ones (an unmaterialised
# weight) instead of returning uninitialised memory. The library's own limits on the configuration
# (H and I multiples of 128, ...) are checked when the op runs.

_PRECISIONS = ("a16", "mxfp8")
_ACTIVATIONS = ("situ", "swiglu", "swiglu_oai")
_MAX_TOP_K = 32  # the routing kernel's (kRoutingMaxTopK)
_MAX_EXPERTS = 1024  # kRoutingMaxExperts


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_tensor(op: str, name: str, t, dtypes: tuple, shape: tuple, device) -> None:
    want = lambda: (f"{list(shape)} {' or '.join(_dtype_name(d) for d in dtypes)} on {device}")  # noqa: E731
    got = lambda: f"{list(t.shape)} {_dtype_name(t.dtype)} on {t.device}"  # noqa: E731
    torch._check(t is not None, lambda: f"{op}: {name} must be {want()}, got no tensor")
    torch._check(t.dtype in dtypes and t.device == device and t.dim() == len(shape),
                 lambda: f"{op}: {name} must be {want()}, got {got()}")
    for have, size in zip(t.shape, shape):
        torch._check(have == size, lambda: f"{op}: {name} must be {want()}, got {got()}")


def _check_positive(op: str, **values) -> None:
    for name, value in values.items():
        torch._check(value >= 1, lambda: f"{op}: {name} must be >= 1, got {value}")


@torch.library.register_fake("k3moe::prepare_experts")
def _prepare_experts_fake(w13_packed, w13_scale, w2_packed, w2_scale):
    op = "k3moe.prepare_experts"
    torch._check(w13_packed.dim() == 3 and w13_packed.shape[1] % 2 == 0,
                 lambda: f"{op}: w13_packed must be [E, 2I, H/2] uint8, got {list(w13_packed.shape)}")
    E, two_i, half_h = w13_packed.shape
    I, H = two_i // 2, 2 * half_h
    _check_positive(op, E=E, I=I, H=H)
    device = w13_packed.device
    _check_tensor(op, "w13_packed", w13_packed, (torch.uint8,), (E, 2 * I, H // 2), device)
    _check_tensor(op, "w13_scale", w13_scale, (torch.uint8,), (E, 2 * I, H // 32), device)
    _check_tensor(op, "w2_packed", w2_packed, (torch.uint8,), (E, H, I // 2), device)
    _check_tensor(op, "w2_scale", w2_scale, (torch.uint8,), (E, H, I // 32), device)
    new = lambda n: w13_packed.new_empty((E, n), dtype=torch.uint8)  # noqa: E731
    return new(I * H), new(I * H // 16), new(H * I // 2), new(H * I // 32)


@torch.library.register_fake("k3moe::route")
def _route_fake(router_logits, router_bias, top_k, renormalize=True, routed_scaling_factor=1.0):
    op = "k3moe.route"
    torch._check(router_logits.dim() == 2,
                 lambda: f"{op}: router_logits must be [T, E], got {list(router_logits.shape)}")
    T, E = router_logits.shape
    device = router_logits.device
    _check_tensor(op, "router_logits", router_logits, (torch.float32,), (T, E), device)
    _check_tensor(op, "router_bias", router_bias, (torch.float32,), (E,), device)
    torch._check(1 <= E <= _MAX_EXPERTS, lambda: f"{op}: the routing takes 1 to {_MAX_EXPERTS} experts, got {E}")
    torch._check(1 <= top_k <= min(E, _MAX_TOP_K),
                 lambda: f"{op}: top_k must be in [1, min(num_experts = {E}, {_MAX_TOP_K})], got {top_k}")
    return (router_logits.new_empty((T, top_k), dtype=torch.int32),
            router_logits.new_empty((T, top_k), dtype=torch.float32))


def _check_forward_args(op, x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, num_experts,
                        top_k, hidden, intermediate, precision, activation, ep_size, ep_rank, x_scales):
    torch._check(precision in _PRECISIONS, lambda: f"{op}: precision must be one of {_PRECISIONS}, got {precision!r}")
    torch._check(activation in _ACTIVATIONS,
                 lambda: f"{op}: activation must be one of {_ACTIVATIONS}, got {activation!r}")
    _check_positive(op, num_experts=num_experts, top_k=top_k, hidden=hidden, intermediate=intermediate,
                    ep_size=ep_size)
    torch._check(0 <= ep_rank < ep_size and num_experts % ep_size == 0,
                 lambda: f"{op}: ep_size must divide num_experts ({num_experts}) and ep_rank be in [0, ep_size), "
                         f"got ep_size {ep_size}, ep_rank {ep_rank}")
    torch._check(x.dim() == 2, lambda: f"{op}: x must be [T, {hidden}], got {list(x.shape)}")
    T, H, I, K, L = x.shape[0], hidden, intermediate, top_k, num_experts // ep_size
    device = x.device
    if x.dtype in (torch.uint8, torch.float8_e4m3fn):
        torch._check(precision == "mxfp8", lambda: f"{op}: x is {_dtype_name(x.dtype)} (pre-quantized MXFP8 codes), "
                                                   f"which needs precision \"mxfp8\", got {precision!r}")
        _check_tensor(op, "x", x, (torch.uint8, torch.float8_e4m3fn), (T, H), device)
        torch._check(x_scales is not None, lambda: f"{op}: x is pre-quantized, so x_scales must be [{T}, {H // 128}] "
                                                   f"int32 on {device}, got no tensor")
        _check_tensor(op, "x_scales", x_scales, (torch.int32,), (T, H // 128), device)
    else:
        _check_tensor(op, "x", x, (torch.bfloat16,), (T, H), device)
        torch._check(x_scales is None, lambda: f"{op}: x_scales is only taken with a pre-quantized x (uint8 E4M3 "
                                               f"codes); x is {_dtype_name(x.dtype)}")
    _check_tensor(op, "topk_ids", topk_ids, (torch.int32,), (T, K), device)
    _check_tensor(op, "topk_weights", topk_weights, (torch.float32,), (T, K), device)
    _check_tensor(op, "w13_codes", w13_codes, (torch.uint8,), (L, I * H), device)
    _check_tensor(op, "w13_scales", w13_scales, (torch.uint8,), (L, I * H // 16), device)
    _check_tensor(op, "w2_codes", w2_codes, (torch.uint8,), (L, H * I // 2), device)
    _check_tensor(op, "w2_scales", w2_scales, (torch.uint8,), (L, H * I // 32), device)
    return T, H


@torch.library.register_fake("k3moe::forward")
def _forward_fake(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, num_experts,
                  top_k, hidden, intermediate, precision="a16", activation="situ", situ_beta=4.0,
                  situ_linear_beta=25.0, swiglu_alpha=1.702, swiglu_limit=7.0, ep_size=1, ep_rank=0,
                  x_scales=None):
    T, H = _check_forward_args("k3moe.forward", x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes,
                               w2_scales, num_experts, top_k, hidden, intermediate, precision, activation, ep_size,
                               ep_rank, x_scales)
    return x.new_empty((T, H), dtype=torch.bfloat16)


@torch.library.register_fake("k3moe::forward_out")
def _forward_out_fake(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, num_experts,
                      top_k, hidden, intermediate, precision="a16", activation="situ", situ_beta=4.0,
                      situ_linear_beta=25.0, swiglu_alpha=1.702, swiglu_limit=7.0, ep_size=1, ep_rank=0,
                      x_scales=None, *, out):
    T, H = _check_forward_args("k3moe.forward_out", x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes,
                               w2_scales, num_experts, top_k, hidden, intermediate, precision, activation, ep_size,
                               ep_rank, x_scales)
    _check_tensor("k3moe.forward_out", "out", out, (torch.bfloat16,), (T, H), x.device)
    return None


# ------------------------------------------------------------------------------------ Python API


class KernelExperts(NamedTuple):
    """A rank's experts in the kernel layout: four uint8 tensors [local experts, bytes per expert]
    on one GPU (opaque: made by prepare_experts or Checkpoint.load_kernel_layout)."""

    w13_codes: torch.Tensor
    w13_scales: torch.Tensor
    w2_codes: torch.Tensor
    w2_scales: torch.Tensor


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """The routed experts' configuration and the forward's options. Defaults are Kimi-K3's, one
    rank (ep_size 1), bf16 activations (mode "a16")."""

    num_experts: int = 896  # global E
    top_k: int = 16
    hidden: int = 3584  # H, the width the routed experts see
    intermediate: int = 3072  # I
    activation: str = "situ"  # "situ" | "swiglu" | "swiglu_oai"
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    renormalize: bool = True
    routed_scaling_factor: float = 1.0
    mode: str = "a16"  # "a16" (bf16 activations) | "mxfp8"
    ep_size: int = 1
    ep_rank: int = 0

    @property
    def num_local(self) -> int:
        return self.num_experts // self.ep_size

    @property
    def first_expert(self) -> int:
        return self.ep_rank * self.num_local

    def __post_init__(self):
        # The rest is the library's to check; these would fail in Python first (num_local divides)
        # or only at the first forward (the names).
        if self.ep_size < 1 or not 0 <= self.ep_rank < self.ep_size:
            raise ValueError(f"MoeConfig: ep_size must be >= 1 and ep_rank in [0, ep_size), got ep_size "
                             f"{self.ep_size}, ep_rank {self.ep_rank}")
        if self.mode not in _PRECISIONS:
            raise ValueError(f"MoeConfig: mode must be one of {_PRECISIONS}, got {self.mode!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"MoeConfig: activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        # NOTE: the op's configuration arguments, in schema order, built once (not a field).
        object.__setattr__(self, "op_args", (
            self.num_experts, self.top_k, self.hidden, self.intermediate, self.mode, self.activation,
            float(self.situ_beta), float(self.situ_linear_beta), float(self.swiglu_alpha), float(self.swiglu_limit),
            self.ep_size, self.ep_rank))

    def forward_kwargs(self) -> dict:
        """The configuration arguments of torch.ops.k3moe.forward as keywords."""
        names = ("num_experts", "top_k", "hidden", "intermediate", "precision", "activation", "situ_beta",
                 "situ_linear_beta", "swiglu_alpha", "swiglu_limit", "ep_size", "ep_rank")
        return dict(zip(names, self.op_args))


def prepare_experts(w13_packed: torch.Tensor, w13_scale: torch.Tensor, w2_packed: torch.Tensor,
                    w2_scale: torch.Tensor) -> KernelExperts:
    """The engine's MXFP4 expert tensors (checkpoint layout, W13 = [W1 gate; W3 up]) of one rank,
    [E_local, 2I, H/2] / [E_local, 2I, H/32] / [E_local, H, I/2] / [E_local, H, I/32] uint8, to the
    kernel layout on the same device. One-time and synchronous: it copies to the host, reorders
    there and copies back."""
    return KernelExperts(*torch.ops.k3moe.prepare_experts(w13_packed, w13_scale, w2_packed, w2_scale))


def route(router_logits: torch.Tensor, router_bias: torch.Tensor, top_k: int, renormalize: bool = True,
          routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Kimi-K3 routing: logits [T, E] fp32 + correction bias [E] fp32 -> global ids [T, K] int32
    and weights [T, K] fp32 (sigmoid scores, top-k of score + bias, ties to the lower id)."""
    return torch.ops.k3moe.route(router_logits, router_bias, top_k, renormalize, routed_scaling_factor)


def forward(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: Sequence[torch.Tensor],
            config: MoeConfig, *, x_scales: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The routed experts of one rank: x [T, H] bf16 (or, in mode "mxfp8", uint8 E4M3 codes with
    x_scales [T, H/128] int32), global topk_ids [T, K] int32 (-1 and other ranks' ids contribute
    nothing), topk_weights [T, K] fp32 -> out [T, H] bf16, this rank's partial sum. Enqueued on
    the current stream, no host synchronisation."""
    if len(experts) != 4:
        raise ValueError(f"k3moe.forward: experts must be the four kernel-layout tensors (w13_codes, w13_scales, "
                         f"w2_codes, w2_scales: KernelExperts), got {len(experts)}")
    w13_codes, w13_scales, w2_codes, w2_scales = experts
    if out is None:
        return _FORWARD(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, *config.op_args,
                        x_scales)
    _FORWARD_OUT(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, *config.op_args, x_scales,
                 out=out)
    return out


# The overloads, looked up once rather than through torch.ops at every call.
_FORWARD = torch.ops.k3moe.forward.default
_FORWARD_OUT = torch.ops.k3moe.forward_out.default
