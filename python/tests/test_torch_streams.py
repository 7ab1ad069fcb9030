"""The forward on many CUDA streams at once. Outside graph capture each stream keeps a workspace
of its own (python/csrc/stream_workspace.h; up to 64 streams per process, 16 MiB each), and
forwards on further streams or with larger workspaces allocate one per call: whichever way, the
outputs equal the same forwards run one at a time, bit for bit (the library is deterministic),
while the streams' kernels overlap and a stream's workspace grows under forwards in flight."""

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_cases as cases  # noqa: E402

pytestmark = pytest.mark.hopper

SMALL = dict(num_experts=16, top_k=4, hidden=512, intermediate=256)
KEPT_STREAMS = 64  # stream_workspace.h's kMaxKeptWorkspaces


@pytest.fixture(scope="module")
def small():
    config = k3moe.MoeConfig(**SMALL)
    experts = k3moe.prepare_experts(*cases.random_experts(16, config.hidden, config.intermediate, seed=41))
    return config, experts


def inputs_of(config, tokens, seed):
    x = cases.random_x(tokens, config.hidden, seed=seed)
    ids, weights = cases.random_routing(tokens, config.num_experts, config.top_k, seed=seed + 1)
    return x, ids, weights


def alone(config, experts, inputs):
    """Each forward on the current stream, finished before the next starts."""
    outs = []
    for x, ids, weights in inputs:
        outs.append(k3moe.forward(x, ids, weights, experts, config))
        torch.cuda.synchronize()
    return outs


def on_streams(config, experts, inputs, streams, rounds=1):
    """Forward i on streams[i % len(streams)], all enqueued before any is waited for."""
    current = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(current)  # the inputs are ready
    outs = [None] * len(inputs)
    for _ in range(rounds):
        for i, (x, ids, weights) in enumerate(inputs):
            with torch.cuda.stream(streams[i % len(streams)]):
                outs[i] = k3moe.forward(x, ids, weights, experts, config)
    for s in streams:
        current.wait_stream(s)
    torch.cuda.synchronize()
    return outs


def assert_bitwise(got, expected):
    for i, (g, e) in enumerate(zip(got, expected)):
        assert (e != 0).any(), f"forward {i}: an all-zero output proves nothing"
        assert torch.equal(g.view(torch.int16), e.view(torch.int16)), f"forward {i} differs from the same forward alone"


def test_streams_at_once_equal_one_at_a_time(small):
    """Four streams, forwards of 1 to 2,000 tokens: each stream's workspace grows while its earlier
    forwards are in flight, and the 2,000-token forwards (~20 MiB) allocate per call."""
    config, experts = small
    inputs = [inputs_of(config, t, seed=100 + i) for i, t in enumerate([1, 300, 7, 1000, 64, 2000, 128, 1500])]
    expected = alone(config, experts, inputs)
    streams = [torch.cuda.Stream() for _ in range(4)]
    assert_bitwise(on_streams(config, experts, inputs, streams, rounds=3), expected)


def distinct_streams(count):
    """`count` different streams from torch's pools (32 per priority)."""
    least, greatest = torch.cuda.Stream.priority_range()
    found = {}
    for priority in range(least, greatest - 1, -1):
        for _ in range(32):
            stream = torch.cuda.Stream(priority=priority)
            found.setdefault(stream.cuda_stream, stream)
            if len(found) == count:
                return list(found.values())
    pytest.skip(f"torch's stream pools hold {len(found)} distinct streams, this test needs {count}")


def test_more_streams_than_keep_a_workspace(small):
    """70 streams (more than keep a workspace): the ones past the limit allocate per call."""
    config, experts = small
    streams = distinct_streams(KEPT_STREAMS + 6)
    inputs = [inputs_of(config, 16 + i % 5, seed=300 + i) for i in range(len(streams))]
    expected = alone(config, experts, inputs)
    assert_bitwise(on_streams(config, experts, inputs, streams), expected)



def test_per_thread_default_streams_at_the_same_time(small):
    """Four host threads on cudaStreamPerThread, one handle that names a different stream in each
    thread (as cupy's per-thread default stream), forwards running at the same time. T = 1 and 7 fit
    the 16 MiB workspace kept per stream (keyed by stream id); T = 1000-1200 need ~18.5-42 MB (at
    this shape GEMM2 splits K in two, and GEMM1 too from T = 1100: fp32 partial rows), so they are
    allocated per call, in the runtime's stream order. Through torch's caching allocator, which keys
    its blocks by handle, one thread's freed workspace went to another while still in use: this load
    failed both times on the H100 before the fix (a CUDA error, then a hang) and passed both times
    after (Session 47).
    NOTE: the outputs are allocated before the threads start, for the same reason: torch's own
    allocations on that handle are not safe across threads."""
    import threading

    config, experts = small
    per_thread_stream = 2  # cudaStreamPerThread
    threads_n, rounds = 4, 20
    tokens = [1000, 1200, 1, 1100, 7]
    inputs = [[inputs_of(config, t, seed=500 + 20 * n + i) for i, t in enumerate(tokens)] for n in range(threads_n)]
    expected = [alone(config, experts, each) for each in inputs]
    outs = [[torch.empty((t, config.hidden), dtype=torch.bfloat16, device="cuda") for t in tokens]
            for _ in range(threads_n)]
    torch.cuda.synchronize()
    errors = []
    start = threading.Barrier(threads_n)

    def run(n):
        try:
            stream = torch.cuda.ExternalStream(per_thread_stream)
            with torch.cuda.stream(stream):
                start.wait()
                for _ in range(rounds):
                    for (x, ids, weights), out in zip(inputs[n], outs[n]):
                        k3moe.forward(x, ids, weights, experts, config, out=out)
                stream.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below, with the thread
            errors.append((n, e))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for n in range(threads_n):
        assert_bitwise(outs[n], expected[n])
