"""CUDA graphs: the ops captured with torch.cuda.graph and replayed on fresh inputs (copied into
the captured buffers) give the eager result bit for bit (the library promises bitwise
determinism, and the workspace comes from the graph's private pool)."""

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_cases as cases  # noqa: E402

pytestmark = pytest.mark.hopper

SMALL = dict(num_experts=16, top_k=4, hidden=512, intermediate=256)


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


@pytest.mark.parametrize("mode", ["a16", "mxfp8"])
@pytest.mark.parametrize("tokens", [1, 96])
def test_graph_replay_equals_eager(mode, tokens):
    config = k3moe.MoeConfig(**SMALL, mode=mode)
    raw = cases.random_experts(16, config.hidden, config.intermediate, seed=1)
    module = k3moe.nn.KimiK3RoutedExperts.from_tensors(*raw, config=config,
                                                       router_bias=torch.randn(16, device="cuda") * 0.1)
    static_logits = torch.randn((tokens, 16), device="cuda")
    static_x = cases.random_x(tokens, config.hidden, seed=2)

    def step(logits, x):
        ids, weights = module.route(logits)
        return module(x, ids, weights), ids, weights

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(static_logits, static_x)  # warm-up on the capture stream, as torch's docs ask
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_ids, static_weights = step(static_logits, static_x)

    for seed in range(3):
        logits = torch.randn((tokens, 16), device="cuda")
        x = cases.random_x(tokens, config.hidden, seed=100 + seed)
        static_logits.copy_(logits)
        static_x.copy_(x)
        static_out.fill_(torch.nan)
        graph.replay()
        eager_out, eager_ids, eager_weights = step(logits, x)
        torch.cuda.synchronize()
        assert torch.equal(static_ids, eager_ids)
        assert torch.equal(bits(static_weights), bits(eager_weights))
        assert torch.equal(bits(static_out), bits(eager_out)), f"replay {seed} differs from eager"
        assert (eager_out != 0).any(), "an all-zero output proves nothing"


def test_graph_replay_with_out_buffer():
    """forward_out into a caller buffer inside the graph, ids with -1 slots."""
    config = k3moe.MoeConfig(**SMALL)
    raw = cases.random_experts(16, config.hidden, config.intermediate, seed=3)
    experts = k3moe.prepare_experts(*raw)
    static_x = cases.random_x(40, config.hidden, seed=4)
    static_ids, static_weights = cases.random_routing(40, 16, 4, seed=5)
    static_out = torch.empty((40, config.hidden), dtype=torch.bfloat16, device="cuda")
    k3moe.forward(static_x, static_ids, static_weights, experts, config, out=static_out)  # creates the plan
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k3moe.forward(static_x, static_ids, static_weights, experts, config, out=static_out)
    x = cases.random_x(40, config.hidden, seed=6)
    ids, weights = cases.random_routing(40, 16, 4, seed=7)
    static_x.copy_(x)
    static_ids.copy_(ids)
    static_weights.copy_(weights)
    static_out.fill_(torch.nan)
    graph.replay()
    eager = k3moe.forward(x, ids, weights, experts, config)
    torch.cuda.synchronize()
    assert torch.equal(bits(static_out), bits(eager))


def test_first_call_inside_capture_is_refused():
    """A configuration's first call creates its plan, which must not happen during capture: the
    op says so instead of failing inside the CUDA runtime."""
    config = k3moe.MoeConfig(**SMALL, activation="swiglu", swiglu_alpha=1.25)  # a configuration no test used
    experts = k3moe.prepare_experts(*cases.random_experts(16, config.hidden, config.intermediate, seed=8))
    x = cases.random_x(4, config.hidden, seed=9)
    ids, weights = cases.random_routing(4, 16, 4, seed=10)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="must run before CUDA graph capture"):
        with torch.cuda.graph(graph):
            k3moe.forward(x, ids, weights, experts, config)
    # Eagerly it works, and then capture does too.
    eager = k3moe.forward(x, ids, weights, experts, config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = k3moe.forward(x, ids, weights, experts, config)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(captured), bits(eager))
