"""The forward op's cost through PyTorch at T = 1, launch to launch: called eagerly from Python
(arguments by position, as k3moe.forward passes them), and replayed as a CUDA graph holding one
forward. Asserted: the eager call costs at most 15 us more than the graph replay (issue 6), in the
median of five rounds that each time the eager call and the replay back to back. The eager loop is
host-bound, and a shared host's speed moves within seconds (bench/NOTES.md, Session 44), so an
eager torch.add of x (one launch, one allocation) is printed beside the figures as the host's
speed, with the device time of one forward (a graph of 20 forwards, divided by 20) and the C++
benchmark's rows for the same shape on the same GPU model (bench/results, when present). Run
pytest with -s, or read the `k3moe overhead` lines in the log.
"""

import glob
import json
import os

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_cases as cases  # noqa: E402

pytestmark = pytest.mark.hopper

EAGER_OVERHEAD_LIMIT_US = 15.0
CALLS = 300
ROUNDS = 5  # paired eager / replay measurements; the median round's overhead is asserted
# How the op enqueues an eager forward (K3MOE_EAGER_GRAPH, read when the module loads).
EAGER_LAUNCH = "kernel launches" if os.environ.get("K3MOE_EAGER_GRAPH") == "0" else "one graph launch"


def per_call_us(fn, calls=CALLS):
    return cases.per_call_us(fn, calls)


def graph_of(fn, repeats=1):
    fn()  # the plan exists before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    return graph


def cpp_bench_row(mode: str):
    """The T = 1, local28, 16-active-experts rows of the newest date's decode benchmarks on this GPU model
    (bench/results; sustained runs left out), if the tree has any."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "results")
    gpu = torch.cuda.get_device_name()
    found = {}
    for path in glob.glob(os.path.join(root, "*decode*.json")):
        with open(path) as f:
            result = json.load(f)
        if "sustained" in os.path.basename(path) or result.get("machine", {}).get("gpu") != gpu:
            continue
        for row in result.get("rows", []):
            if row.get("tokens") == 1 and row.get("mode") == mode and row.get("shape") == "local28":
                row_text = f"{row['us']:.1f} us (commit {result.get('commit')})"
                found.setdefault(result.get("date", ""), []).append(row_text)
    if not found:
        return f"none on {gpu} in bench/results"
    newest = max(found)
    return f"{', '.join(sorted(found[newest]))} on {gpu}, {newest}"


def measure(label, config, experts, ids, mode_note=""):
    x = cases.random_x(1, config.hidden, seed=1)
    weights = torch.rand((1, config.top_k), device="cuda")
    op = torch.ops.k3moe.forward.default
    args, kwargs = (x, ids, weights, *experts, *config.op_args), config.forward_kwargs()

    def call_op():
        return op(*args)

    def call_op_keywords():
        return op(x, ids, weights, *experts, **kwargs)

    def call_python_api():
        return k3moe.forward(x, ids, weights, experts, config)

    graph = graph_of(call_op)
    # Eager and replay back to back in each round, so that both see the host as it is then.
    rounds = [(per_call_us(call_op), per_call_us(graph.replay)) for _ in range(ROUNDS)]
    middle = ROUNDS // 2
    eager = sorted(e for e, _ in rounds)[middle]
    replay = sorted(r for _, r in rounds)[middle]
    overheads = sorted(e - r for e, r in rounds)
    overhead = overheads[middle]
    one_kernel = per_call_us(lambda: torch.add(x, x))  # the host's speed: one launch, one allocation
    eager_keywords = per_call_us(call_op_keywords)
    eager_api = per_call_us(call_python_api)
    device = per_call_us(graph_of(call_op, repeats=20).replay, calls=CALLS // 10) / 20
    print(f"\nk3moe overhead [{label}] T=1: eager op {eager:.1f} us (config by keyword {eager_keywords:.1f} us, "
          f"k3moe.forward() {eager_api:.1f} us), graph replay {replay:.1f} us, device time {device:.1f} us per "
          f"forward; eager overhead {overhead:.1f} us (limit {EAGER_OVERHEAD_LIMIT_US}; rounds "
          f"{', '.join(f'{o:.1f}' for o in overheads)}); eager torch.add on this host {one_kernel:.1f} us; eager "
          f"forwards as {EAGER_LAUNCH}{mode_note}")
    return overhead


def test_overhead_small():
    """H = 512, I = 256, E = 16, K = 4: the device time is a few us, so this measures the host path."""
    config = k3moe.MoeConfig(num_experts=16, top_k=4, hidden=512, intermediate=256)
    experts = k3moe.prepare_experts(*cases.random_experts(16, 512, 256, seed=2))
    ids = torch.tensor([[3, 9, 12, 0]], dtype=torch.int32, device="cuda")
    overhead = measure("H 512, I 256, E 16, K 4", config, experts, ids)
    assert overhead <= EAGER_OVERHEAD_LIMIT_US, f"eager overhead {overhead:.1f} us > {EAGER_OVERHEAD_LIMIT_US} us"


def test_overhead_kimi_k3():
    """Kimi-K3, EP32 rank 0 (28 local experts), all 16 slots on this rank (the C++ decode bench's row)."""
    config = k3moe.MoeConfig(ep_size=32, ep_rank=0)
    experts = k3moe.prepare_experts(*cases.random_experts(28, config.hidden, config.intermediate, seed=3))
    ids = torch.arange(6, 22, dtype=torch.int32, device="cuda").unsqueeze(0)  # 16 of the 28 local experts
    overhead = measure("Kimi-K3 local28, 16 active", config, experts, ids,
                       mode_note=f"; C++ bench: {cpp_bench_row('a16')}")
    assert overhead <= EAGER_OVERHEAD_LIMIT_US, f"eager overhead {overhead:.1f} us > {EAGER_OVERHEAD_LIMIT_US} us"
