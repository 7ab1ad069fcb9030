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
# Shapes and dtypes only, for FakeTensorMode (torch.compile, torch.export). The real checks run in
# C++ when the op executes.


@torch.library.register_fake("k3moe::prepare_experts")
def _prepare_experts_fake(w13_packed, w13_scale, w2_packed, w2_scale):
    torch._check(w13_packed.dim() == 3,
                 lambda: f"k3moe.prepare_experts: w13_packed must be [E, 2I, H/2], got {tuple(w13_packed.shape)}")
    E, two_i, half_h = w13_packed.shape
    I, H = two_i // 2, 2 * half_h
    new = lambda n: w13_packed.new_empty((E, n), dtype=torch.uint8)  # noqa: E731
    return new(I * H), new(I * H // 16), new(H * I // 2), new(H * I // 32)


@torch.library.register_fake("k3moe::route")
def _route_fake(router_logits, router_bias, top_k, renormalize=True, routed_scaling_factor=1.0):
    torch._check(router_logits.dim() == 2,
                 lambda: f"k3moe.route: router_logits must be [T, E], got {tuple(router_logits.shape)}")
    T, E = router_logits.shape
    torch._check(1 <= top_k <= E, lambda: f"k3moe.route: top_k must be in [1, num_experts = {E}], got {top_k}")
    return (router_logits.new_empty((T, top_k), dtype=torch.int32),
            router_logits.new_empty((T, top_k), dtype=torch.float32))


@torch.library.register_fake("k3moe::forward")
def _forward_fake(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, num_experts,
                  top_k, hidden, intermediate, precision="a16", activation="situ", situ_beta=4.0,
                  situ_linear_beta=25.0, swiglu_alpha=1.702, swiglu_limit=7.0, ep_size=1, ep_rank=0,
                  x_scales=None):
    torch._check(x.dim() == 2, lambda: f"k3moe.forward: x must be [T, {hidden}], got {tuple(x.shape)}")
    return x.new_empty((x.shape[0], hidden), dtype=torch.bfloat16)


@torch.library.register_fake("k3moe::forward_out")
def _forward_out_fake(x, topk_ids, topk_weights, w13_codes, w13_scales, w2_codes, w2_scales, num_experts,
                      top_k, hidden, intermediate, precision="a16", activation="situ", situ_beta=4.0,
                      situ_linear_beta=25.0, swiglu_alpha=1.702, swiglu_limit=7.0, ep_size=1, ep_rank=0,
                      x_scales=None, *, out):
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
        # The rest is the library's to check; these would fail in Python first (num_local divides).
        if self.ep_size < 1 or not 0 <= self.ep_rank < self.ep_size:
            raise ValueError(f"MoeConfig: ep_size must be >= 1 and ep_rank in [0, ep_size), got ep_size "
                             f"{self.ep_size}, ep_rank {self.ep_rank}")
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
