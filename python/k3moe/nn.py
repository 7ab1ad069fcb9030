"""k3moe.nn.KimiK3RoutedExperts: one expert-parallel rank's routed experts as an nn.Module."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Union

import torch

from ._ops import KernelExperts, MoeConfig, forward, prepare_experts, route


class KimiK3RoutedExperts(torch.nn.Module):
    """Holds one rank's experts in the kernel layout (buffers w13_codes, w13_scales, w2_codes,
    w2_scales) and, optionally, the router's correction bias (buffer router_bias, [E] fp32).

    forward(x, topk_ids, topk_weights) -> this rank's partial output [T, H] bf16 (sum it over the
    EP ranks). route(router_logits) -> (topk_ids, topk_weights) with the layer's bias.

    Building the module on a GPU creates the ops' plans (warmup()), so its forward can be captured
    in a CUDA graph straight away; after moving it to another GPU, call warmup() again before
    capturing there.
    """

    def __init__(self, config: MoeConfig, experts: KernelExperts, router_bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.config = config
        if len(experts) != len(KernelExperts._fields):
            raise ValueError(f"KimiK3RoutedExperts: experts must be the four kernel-layout tensors "
                             f"{KernelExperts._fields}, got {len(experts)}")
        for name, tensor in zip(KernelExperts._fields, experts):
            self.register_buffer(name, tensor)
        self.register_buffer("router_bias", router_bias)
        if self.w13_codes.is_cuda:
            self.warmup()

    # -------------------------------------------------------------------------------- constructors
    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Union[str, os.PathLike], layer: int, ep_size: int = 1, ep_rank: int = 0,
                        device: Union[str, torch.device] = "cuda", *, mode: str = "a16",
                        activation: Optional[str] = None, load_router_bias: bool = True) -> "KimiK3RoutedExperts":
        """Loads the experts [r E/P, (r+1) E/P) of `layer` from a Kimi-K3 checkpoint directory
        (config.json + safetensors shards) with the library's loader, reading only this rank's
        bytes, and the layer's e_score_correction_bias unless load_router_bias is False."""
        checkpoint = torch.classes.k3moe.Checkpoint(os.fspath(checkpoint_dir))
        fields = json.loads(checkpoint.config_json())
        config = MoeConfig(
            num_experts=fields["num_experts"], top_k=fields["top_k"], hidden=fields["hidden"],
            intermediate=fields["intermediate"], activation=activation or fields["activation"],
            situ_beta=fields["situ_beta"], situ_linear_beta=fields["situ_linear_beta"],
            swiglu_alpha=fields["swiglu_alpha"], swiglu_limit=fields["swiglu_limit"],
            renormalize=fields["renormalize"], routed_scaling_factor=fields["routed_scaling_factor"], mode=mode,
            ep_size=ep_size, ep_rank=ep_rank)
        experts = KernelExperts(*(t.to(device) for t in checkpoint.load_kernel_layout(layer, ep_size, ep_rank)))
        bias = checkpoint.load_router(layer)[1].to(device) if load_router_bias else None
        return cls(config, experts, bias)

    @classmethod
    def from_tensors(cls, w13_packed: torch.Tensor, w13_scale: torch.Tensor, w2_packed: torch.Tensor,
                     w2_scale: torch.Tensor, config: MoeConfig,
                     router_bias: Optional[torch.Tensor] = None) -> "KimiK3RoutedExperts":
        """From an engine's expert tensors of this rank (checkpoint layout, W13 = [W1; W3]):
        [E_local, 2I, H/2], [E_local, 2I, H/32], [E_local, H, I/2], [E_local, H, I/32] uint8."""
        if w13_packed.dim() != 3 or w13_packed.shape[0] != config.num_local:
            raise ValueError(f"KimiK3RoutedExperts.from_tensors: w13_packed must hold the rank's {config.num_local} "
                             f"experts ({config.num_experts} / EP {config.ep_size}), got {tuple(w13_packed.shape)}")
        # The kernel layout keeps only each matrix's bytes: shapes with H and I swapped would pass
        # every later check, so the config's H and I are held to the tensors here.
        L, H, I = config.num_local, config.hidden, config.intermediate
        expected = {"w13_packed": (L, 2 * I, H // 2), "w13_scale": (L, 2 * I, H // 32),
                    "w2_packed": (L, H, I // 2), "w2_scale": (L, H, I // 32)}
        for (name, shape), tensor in zip(expected.items(), (w13_packed, w13_scale, w2_packed, w2_scale)):
            if tuple(tensor.shape) != shape:
                raise ValueError(f"KimiK3RoutedExperts.from_tensors: {name} must be {shape} for the config's H {H}, "
                                 f"I {I}, got {tuple(tensor.shape)}")
        return cls(config, prepare_experts(w13_packed, w13_scale, w2_packed, w2_scale), router_bias)

    # ------------------------------------------------------------------------------------- compute
    @property
    def experts(self) -> KernelExperts:
        return KernelExperts(self.w13_codes, self.w13_scales, self.w2_codes, self.w2_scales)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                x_scales: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        return forward(x, topk_ids, topk_weights, self.experts, self.config, x_scales=x_scales, out=out)

    def route(self, router_logits: torch.Tensor,
              router_bias: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing with the layer's bias (or the one given): logits [T, E] fp32 -> (ids, weights)."""
        bias = router_bias if router_bias is not None else self.router_bias
        if bias is None:
            raise ValueError("KimiK3RoutedExperts.route: no router bias (load it with from_checkpoint, or pass one)")
        c = self.config
        return route(router_logits, bias, c.top_k, c.renormalize, c.routed_scaling_factor)

    def _apply(self, fn, recurse=True):
        # module.to(torch.bfloat16) or .half() would convert the router bias too: routing takes it
        # as fp32, and a rounded bias can change which experts are chosen. It keeps its dtype and
        # values and follows the module's device.
        bias = self.router_bias
        result = super()._apply(fn, recurse)
        moved = self.router_bias
        if bias is not None and moved is not None and moved.dtype != bias.dtype:
            self.router_bias = bias.to(device=moved.device)
        return result

    def warmup(self) -> None:
        """Runs the ops once with zero tokens on the module's device, which creates their plans (a
        plan cannot be created during CUDA graph capture)."""
        c, device = self.config, self.w13_codes.device
        x = torch.empty((0, c.hidden), dtype=torch.bfloat16, device=device)
        ids = torch.empty((0, c.top_k), dtype=torch.int32, device=device)
        weights = torch.empty((0, c.top_k), dtype=torch.float32, device=device)
        self.forward(x, ids, weights)  # NOTE: one plan serves bf16 and pre-quantized x alike
        if self.router_bias is not None:
            self.route(torch.empty((0, c.num_experts), dtype=torch.float32, device=device))

    def extra_repr(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self.config, f.name)!r}" for f in dataclasses.fields(self.config))
        return f"{fields}, local experts {self.config.first_expert}..{self.config.first_expert + self.config.num_local - 1}"
