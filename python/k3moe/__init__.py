"""k3moe: Kimi-K3's MXFP4 routed experts on Hopper GPUs, as PyTorch ops.

Importing the package loads the ops library, which registers torch.ops.k3moe.{prepare_experts,
route, forward, forward_out} and torch.classes.k3moe.Checkpoint. See python/README.md.
"""

from ._ops import KernelExperts, MoeConfig, forward, prepare_experts, route
from . import nn

__all__ = ["KernelExperts", "MoeConfig", "forward", "nn", "prepare_experts", "route"]
__version__ = "0.1.0"
