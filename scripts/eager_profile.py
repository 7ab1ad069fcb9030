#!/usr/bin/env python3
"""Where the eager forward's host time goes, through PyTorch, at the binding's overhead test shape.

On the GPU machine, with the binding installed (e.g. into a directory by pip, as
scripts/python-check.sh does):

  PYTHONPATH=SITE scripts/eager_profile.py [--profile] [--calls N]

Prints launch-to-launch microseconds of the eager forward (by position, under inference mode,
forward_out, k3moe.forward()), of eager routing (one kernel), of torch.empty and of aten.add for
scale, and of a CUDA graph replay of one forward, at H 512, I 256, E 16, K 4, T = 1 (the shape
of python/tests/test_torch_overhead.py's test_overhead_small). --profile adds torch.profiler's
table over 200 forwards: the CUDA runtime calls (each kernel launch), the allocations and the
op's own time (bench/NOTES.md, Session 43, has the figures this gave).
"""
import argparse
import sys
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler's table over 200 forwards")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed figure (default 2000)")
    args = parser.parse_args()
    if args.calls < 1:
        parser.error(f"--calls must be >= 1, got {args.calls}")
    import torch  # after the arguments: --help works without torch

    if not torch.cuda.is_available():
        sys.exit("eager_profile.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import k3moe
    except ImportError as e:
        sys.exit(f"eager_profile.py: the k3moe package is not importable ({e}); install it and set PYTHONPATH")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "tests"))
    import k3moe_torch_cases as cases

    config = k3moe.MoeConfig(num_experts=16, top_k=4, hidden=512, intermediate=256)
    experts = k3moe.prepare_experts(*cases.random_experts(16, 512, 256, seed=2))
    ids = torch.tensor([[3, 9, 12, 0]], dtype=torch.int32, device="cuda")
    x = cases.random_x(1, 512, seed=1)
    weights = torch.rand((1, 4), device="cuda")
    logits, bias = torch.randn((1, 16), device="cuda"), torch.zeros(16, device="cuda")
    out = torch.empty((1, 512), dtype=torch.bfloat16, device="cuda")
    op, op_out, route = torch.ops.k3moe.forward.default, torch.ops.k3moe.forward_out.default, torch.ops.k3moe.route.default
    op_args = (x, ids, weights, *experts, *config.op_args)

    def timed(label, fn):
        print(f"{label:<32} {cases.per_call_us(fn, args.calls, warmup=50):8.2f} us")

    timed("eager forward (by position)", lambda: op(*op_args))
    with torch.inference_mode():
        timed("eager forward, inference mode", lambda: op(*op_args))
    timed("eager forward_out", lambda: op_out(*op_args, None, out=out))
    timed("k3moe.forward()", lambda: k3moe.forward(x, ids, weights, experts, config))
    timed("eager route (one kernel)", lambda: route(logits, bias, 4, True, 1.0))
    timed("torch.empty", lambda: torch.empty((1, 512), dtype=torch.bfloat16, device="cuda"))
    timed("aten.add (one kernel)", lambda: torch.ops.aten.add.Tensor(x, x))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*op_args)
    timed("graph replay of one forward", graph.replay)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(200):
                op(*op_args)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=50))


if __name__ == "__main__":
    main()
