"""torch.compile(fullgraph=True) traces the ops through their fake implementations, and the
compiled module gives the eager result bit for bit; torch.library.opcheck checks the schemas, the
fake implementations and AOT dispatch against the real ops."""

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_cases as cases  # noqa: E402

pytestmark = pytest.mark.hopper

SMALL = dict(num_experts=16, top_k=4, hidden=512, intermediate=256)


class RouterThenExperts(torch.nn.Module):
    """A small MoE layer: router projection (fp32), k3moe routing, k3moe experts."""

    def __init__(self, experts: "k3moe.nn.KimiK3RoutedExperts", gate_weight: torch.Tensor):
        super().__init__()
        self.experts = experts
        self.register_buffer("gate_weight", gate_weight)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        logits = h @ self.gate_weight.t()
        ids, weights = self.experts.route(logits)
        return self.experts(x, ids, weights) * 2.0


def exact_router_inputs(tokens: int, model_hidden: int, seed: int):
    # NOTE: small integers and multiples of 1/8: every logit is exact in fp32 whatever the
    # summation order, so eager and compiled routing see the same logits.
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-4, 5, (tokens, model_hidden), generator=g, device="cuda").float()


@pytest.fixture(scope="module")
def layer():
    config = k3moe.MoeConfig(**SMALL)
    raw = cases.random_experts(16, config.hidden, config.intermediate, seed=1)
    experts = k3moe.nn.KimiK3RoutedExperts.from_tensors(*raw, config=config,
                                                        router_bias=torch.randn(16, device="cuda") * 0.1)
    gate = torch.randint(-8, 9, (16, 64), device="cuda").float() / 8.0
    return RouterThenExperts(experts, gate)


def test_compile_fullgraph_matches_eager(layer):
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    for tokens in (7, 33, 5):  # the second size makes the token dimension dynamic
        h = exact_router_inputs(tokens, 64, seed=tokens)
        x = cases.random_x(tokens, 512, seed=tokens)
        expected = layer(h, x)
        got = compiled(h, x)
        assert got.shape == expected.shape and got.dtype == torch.bfloat16
        assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), f"T={tokens}: compiled != eager"
        assert (expected != 0).any()


def test_compile_reduce_overhead_matches_eager(layer):
    """mode="reduce-overhead": torch.compile replays CUDA graphs (cudagraph trees), and while it warms
    them up it hands every allocation of the thread to the graphs' private pool, whose contents it
    checks; the forward's kept workspace must stay outside that pool (stream_workspace.h)."""
    from torch._dynamo.utils import counters

    x_after, h_after = cases.random_x(9, 512, seed=7), exact_router_inputs(9, 64, seed=7)
    before = layer(h_after, x_after)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for step, tokens in enumerate((9, 9, 9, 9, 21, 21, 21)):  # warm-up, record, replays; a second size
        h = exact_router_inputs(tokens, 64, seed=100 + step)
        x = cases.random_x(tokens, 512, seed=100 + step)
        expected = layer(h, x)
        got = compiled(h, x).clone()  # the graph's output buffer is overwritten by its next replay
        assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), f"call {step}, T={tokens}"
    assert counters["inductor"]["cudagraph_skips"] == 0, "torch.compile ran the layer without CUDA graphs"
    # An eager forward after the graphs, over the kept workspace, as before them.
    assert torch.equal(layer(h_after, x_after).view(torch.int16), before.view(torch.int16))


def test_compile_fullgraph_with_out(layer):
    """The mutating forward_out inside a compiled graph (functionalized by torch.compile)."""
    experts = layer.experts

    def fn(x, ids, weights):
        out = torch.empty((x.shape[0], 512), dtype=torch.bfloat16, device=x.device)
        k3moe.forward(x, ids, weights, experts.experts, experts.config, out=out)
        return out + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    x = cases.random_x(12, 512, seed=3)
    ids, weights = cases.random_routing(12, 16, 4, seed=4)
    assert torch.equal(compiled(x, ids, weights), fn(x, ids, weights))


def test_opcheck(layer):
    experts, config = layer.experts.experts, layer.experts.config
    raw = cases.random_experts(4, 256, 128, seed=5)
    x = cases.random_x(6, 512, seed=6)
    ids, weights = cases.random_routing(6, 16, 4, seed=7)
    logits = torch.randn((6, 16), device="cuda")
    bias = torch.zeros(16, device="cuda")
    kwargs = config.forward_kwargs()
    out = torch.empty((6, 512), dtype=torch.bfloat16, device="cuda")
    torch.library.opcheck(torch.ops.k3moe.prepare_experts.default, raw)
    torch.library.opcheck(torch.ops.k3moe.route.default, (logits, bias, 4, True, 1.0))
    torch.library.opcheck(torch.ops.k3moe.forward.default, (x, ids, weights, *experts), kwargs)
    torch.library.opcheck(torch.ops.k3moe.forward_out.default, (x, ids, weights, *experts), dict(kwargs, out=out))
