"""Bad inputs raise RuntimeError naming the argument, one test per argument and fault; errors that
the library raises (k3moe::Error) come through with the library's message."""

import re

import pytest

from k3moe_test_env import require_package

torch, k3moe = require_package()
import k3moe_torch_cases as cases  # noqa: E402

hopper = pytest.mark.hopper

SMALL = dict(num_experts=16, top_k=4, hidden=512, intermediate=256)
T = 6


def expect_error(pattern, fn, *args, **kwargs):
    with pytest.raises(RuntimeError, match=pattern) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------------------- without a GPU


def cpu_raw(num_local=2, hidden=128, intermediate=128):
    return list(cases.random_experts(num_local, hidden, intermediate, seed=0, device="cpu"))


def test_forward_cpu_x_is_named():
    x = torch.zeros((T, 512), dtype=torch.bfloat16)
    experts = [torch.zeros((16, 1), dtype=torch.uint8)] * 4
    expect_error(r"k3moe\.forward: x must be a CUDA tensor, got \[6, 512\] bfloat16 on cpu",
                 torch.ops.k3moe.forward, x, torch.zeros((T, 4), dtype=torch.int32), torch.zeros((T, 4)), *experts,
                 **k3moe.MoeConfig(**SMALL).forward_kwargs())


def test_route_cpu_logits_are_named():
    expect_error(r"k3moe\.route: router_logits must be a CUDA tensor, got \[6, 16\] float32 on cpu",
                 k3moe.route, torch.zeros((T, 16)), torch.zeros(16), 4)


@pytest.mark.parametrize("index, name, shape", [(0, "w13_packed", "[2, 256, 64]"), (1, "w13_scale", "[2, 256, 4]"),
                                                 (2, "w2_packed", "[2, 128, 64]"), (3, "w2_scale", "[2, 128, 4]")])
def test_prepare_wrong_dtype_is_named(index, name, shape):
    raw = cpu_raw()
    raw[index] = raw[index].to(torch.int16)
    expect_error(rf"k3moe\.prepare_experts: {name} must be {re.escape(shape)} uint8 on cpu, got .* int16",
                 k3moe.prepare_experts, *raw)


@pytest.mark.parametrize("index, name", [(1, "w13_scale"), (2, "w2_packed"), (3, "w2_scale")])
def test_prepare_wrong_shape_is_named(index, name):
    raw = cpu_raw()
    raw[index] = raw[index][:, :-1].contiguous()
    expect_error(rf"k3moe\.prepare_experts: {name} must be \[2, ", k3moe.prepare_experts, *raw)


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: the fake implementation, as torch.compile traces
def test_prepare_w13_packed_rank_is_named(device):
    raw = [t.to(device) for t in cpu_raw()]
    raw[0] = raw[0].flatten(1)
    expect_error(r"k3moe\.prepare_experts: w13_packed must be \[E, 2I, H/2\]", k3moe.prepare_experts, *raw)


@pytest.mark.parametrize("shape, top_k, message", [
    ((T, 16), 0, r"top_k must be in \[1, min\(num_experts = 16, 32\)\], got 0"),
    ((T, 16), 17, r"top_k must be in \[1, min\(num_experts = 16, 32\)\], got 17"),
    ((T, 64), 40, r"top_k must be in \[1, min\(num_experts = 64, 32\)\], got 40"),
    ((16,), 4, r"router_logits must be \[T, E\], got \[16\]"),
])
def test_route_fake_names_what_is_wrong(shape, top_k, message):
    """The fake route (what torch.compile traces, on meta tensors) names the argument."""
    logits, bias = torch.empty(shape, device="meta"), torch.empty(shape[-1], device="meta")
    expect_error(r"k3moe\.route: " + message, k3moe.route, logits, bias, top_k)


def meta_forward_args(**changes):
    """Valid arguments of torch.ops.k3moe.forward_out for SMALL, on meta tensors (what the fake
    implementation sees under torch.compile), with `changes` applied."""
    config = k3moe.MoeConfig(**SMALL)
    H, I, L = config.hidden, config.intermediate, config.num_local
    meta = lambda shape, dtype=torch.uint8: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
    args = dict(x=meta((T, H), torch.bfloat16), topk_ids=meta((T, 4), torch.int32),
                topk_weights=meta((T, 4), torch.float32), w13_codes=meta((L, I * H)),
                w13_scales=meta((L, I * H // 16)), w2_codes=meta((L, H * I // 2)), w2_scales=meta((L, H * I // 32)),
                out=meta((T, H), torch.bfloat16), **config.forward_kwargs())
    return {**args, **changes}


def test_fake_forward_gives_the_output_shape():
    args = meta_forward_args()
    out = args.pop("out")
    y = torch.ops.k3moe.forward(**args)
    assert (y.device.type, tuple(y.shape), y.dtype) == ("meta", (T, 512), torch.bfloat16)
    torch.ops.k3moe.forward_out(**args, out=out)


FAKE_FAULTS = [
    # change, expected message after "k3moe.forward_out: " (the fake checks what the op checks)
    (dict(precision="fp4"), r"precision must be one of \('a16', 'mxfp8'\), got 'fp4'"),
    (dict(activation="gelu"), r"activation must be one of .*, got 'gelu'"),
    (dict(hidden=2 ** 40), r"x must be \[6, 1099511627776\] bfloat16 on meta, got \[6, 512\]"),
    (dict(top_k=0), r"top_k must be >= 1, got 0"),
    (dict(ep_size=3), r"ep_size must divide num_experts \(16\)"),
    (dict(ep_rank=1), r"ep_size must divide .* ep_rank be in \[0, ep_size\), got ep_size 1, ep_rank 1"),
    (dict(x=torch.empty((T, 512), device="meta")), r"x must be \[6, 512\] bfloat16 on meta, got \[6, 512\] float32"),
    (dict(x=torch.empty((T, 512), dtype=torch.uint8, device="meta")), r'x is uint8 .*, which needs precision "mxfp8"'),
    (dict(x=torch.empty((T, 512), dtype=torch.uint8, device="meta"), precision="mxfp8"),
     r"x is pre-quantized, so x_scales must be \[6, 4\] int32 on meta, got no tensor"),
    (dict(x_scales=torch.empty((T, 4), dtype=torch.int32, device="meta")), r"x_scales is only taken with a pre-quantized"),
    (dict(topk_ids=torch.empty((T, 4), dtype=torch.int64, device="meta")), r"topk_ids must be \[6, 4\] int32"),
    (dict(topk_weights=torch.empty((T, 3), device="meta")), r"topk_weights must be \[6, 4\] float32 on meta, got \[6, 3\]"),
    (dict(w13_codes=torch.empty((8, 131072), dtype=torch.uint8, device="meta")), r"w13_codes must be \[16, 131072\]"),
    (dict(w2_scales=torch.empty((16, 4096), dtype=torch.int8, device="meta")), r"w2_scales must be .* uint8 .*, got .* int8"),
    (dict(out=torch.empty(3, device="meta")), r"out must be \[6, 512\] bfloat16 on meta, got \[3\] float32"),
]


@pytest.mark.parametrize("change, message", FAKE_FAULTS, ids=[",".join(c) for c, _ in FAKE_FAULTS])
def test_fake_forward_refuses_what_the_op_refuses(change, message):
    """Under torch.compile a bad argument fails the trace, as the eager call would fail."""
    expect_error(r"k3moe\.forward_out: " + message, torch.ops.k3moe.forward_out, **meta_forward_args(**change))


@pytest.mark.parametrize("index", range(4))
def test_fake_prepare_refuses_what_the_op_refuses(index):
    raw = [t.to("meta") for t in cpu_raw()]
    raw[index] = raw[index].to(torch.int16)
    expect_error(r"k3moe\.prepare_experts: .* must be \[2, .*\] uint8 on meta, got .* int16", k3moe.prepare_experts,
                 *raw)


def test_fake_route_refuses_what_the_op_refuses():
    logits, bias = torch.empty((T, 16), device="meta"), torch.empty(16, device="meta")
    expect_error(r"k3moe\.route: router_logits must be \[6, 16\] float32 on meta, got .* float16", k3moe.route,
                 logits.half(), bias, 4)
    expect_error(r"k3moe\.route: router_bias must be \[16\] float32 on meta, got \[15\]", k3moe.route, logits,
                 bias[:15], 4)


def test_a_meta_tensor_among_real_ones_is_named():
    """Any meta argument sends the call to the fake implementation (the dispatcher ranks Meta first):
    an unmaterialised weight among real tensors is refused there, naming it, instead of returning
    uninitialised memory."""
    config = k3moe.MoeConfig(**SMALL)
    x, ids, weights = torch.zeros((T, 512), dtype=torch.bfloat16), torch.zeros((T, 4), dtype=torch.int32), torch.zeros((T, 4))
    experts = [torch.zeros(t.shape, dtype=t.dtype) for t in list(meta_forward_args().values())[3:7]]
    experts[2] = experts[2].to("meta")
    expect_error(r"k3moe\.forward: w2_codes must be \[16, 65536\] uint8 on cpu, got .* on meta", k3moe.forward, x,
                 ids, weights, experts, config)
    out = torch.full((T, 512), 7.0, dtype=torch.bfloat16)
    expect_error(r"k3moe\.forward_out: w2_codes must be .* on cpu, got .* on meta", k3moe.forward, x, ids, weights,
                 experts, config, out=out)
    expect_error(r"k3moe\.route: router_bias must be \[16\] float32 on cpu, got \[16\] float32 on meta",
                 k3moe.route, torch.zeros((T, 16)), torch.zeros(16, device="meta"), 4)
    raw = cpu_raw()
    raw[3] = raw[3].to("meta")
    expect_error(r"k3moe\.prepare_experts: w2_scale must be .* on cpu, got .* on meta", k3moe.prepare_experts, *raw)


def test_sparse_tensor_is_named():
    raw = cpu_raw()
    raw[1] = raw[1].to_sparse()
    expect_error(r"k3moe\.prepare_experts: w13_scale must be a dense \(strided\) tensor, got a Sparse one",
                 k3moe.prepare_experts, *raw)


def test_experts_must_be_four_tensors():
    experts = list(meta_forward_args().values())[3:6]
    x = torch.zeros((T, 512), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"k3moe\.forward: experts must be the four kernel-layout tensors .*got 3"):
        k3moe.forward(x, torch.zeros((T, 4), dtype=torch.int32), torch.zeros((T, 4)), experts, k3moe.MoeConfig(**SMALL))
    with pytest.raises(ValueError, match=r"KimiK3RoutedExperts: experts must be the four kernel-layout tensors"):
        k3moe.nn.KimiK3RoutedExperts(k3moe.MoeConfig(**SMALL), experts)


def test_prepare_takes_any_strides_and_alignment():
    """prepare_experts copies to the host, so it takes tensors as an engine's loader gives them:
    safetensors' load_file puts them at any byte offset of the file."""
    raw = cpu_raw()
    expected = k3moe.prepare_experts(*raw)

    def at_odd_address(t):
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)
        return flat[1:].view(t.shape).copy_(t)

    def strided(t):
        return t.transpose(1, 2).contiguous().transpose(1, 2)

    for layout in (at_odd_address, strided):
        inputs = [layout(t) for t in raw]
        assert torch.equal(inputs[0], raw[0])
        for got, want in zip(k3moe.prepare_experts(*inputs), expected):
            assert torch.equal(got, want), layout.__name__


def test_prepare_library_error_comes_through():
    """A scale byte the kernels cannot take (129: a group scale of 4) is the library's error."""
    raw = cpu_raw()
    raw[3][1, 5, 2] = 129
    message = expect_error(r"k3moe\.prepare_experts: expert 1 w2\.weight_scale\[5, 2\] = 129 \(2\^2\): the kernels "
                           r"take E8M0 scales 0\.\.128", k3moe.prepare_experts, *raw)
    assert re.search(r"\[.*device_experts\.cu:\d+\]", message), f"no library location in: {message}"


@pytest.mark.parametrize("hidden, intermediate", [(96, 128), (128, 64), (64, 128), (192, 128), (128, 320)])
def test_prepare_dimensions_the_kernel_layout_cannot_hold_are_named(hidden, intermediate):
    """H and I must be multiples of 128 (the layout step checked only 64, and wrote past its
    buffers for the rest: a segfault or a corrupted heap)."""
    raw = cpu_raw(hidden=hidden, intermediate=intermediate)
    expect_error(r"k3moe\.prepare_experts: .*the kernel layout needs H and I to be multiples of 128 \(it stores K in "
                 rf"chunks of 128\), got H = {hidden}, I = {intermediate}", k3moe.prepare_experts, *raw)


def test_prepare_bad_dimensions_are_the_library_error():
    raw = cpu_raw(num_local=0)
    expect_error(r"k3moe\.prepare_experts: .*num_experts must be >= 1, got 0", k3moe.prepare_experts, *raw)


def test_prepare_devices_must_agree_named():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for a second device")
    raw = cpu_raw()
    raw[2] = raw[2].cuda()
    expect_error(r"k3moe\.prepare_experts: w2_packed must be .* on cpu, got .* on cuda:0", k3moe.prepare_experts, *raw)


def test_checkpoint_error_comes_through(tmp_path):
    expect_error(r"k3moe\.Checkpoint: .*", torch.classes.k3moe.Checkpoint, str(tmp_path / "absent"))


def test_library_error_quoting_undecodable_bytes_is_a_runtime_error(tmp_path):
    """The library's message quotes the file's byte 0xff: it comes through as \\xff in a
    RuntimeError, not as a UnicodeDecodeError."""
    (tmp_path / "config.json").write_bytes(b'{"text_config": {"hidden_act": "\xff"}}')
    expect_error(r"k3moe\.Checkpoint: .*config\.json: not valid JSON: .*\\xff", torch.classes.k3moe.Checkpoint,
                 str(tmp_path))


# --------------------------------------------------------------------------------- on the GPU


@pytest.fixture(scope="module")
def valid():
    """Valid arguments of torch.ops.k3moe.forward_out for the small configuration."""
    config = k3moe.MoeConfig(**SMALL)
    experts = k3moe.prepare_experts(*cases.random_experts(16, 512, 256, seed=1))
    x = cases.random_x(T, 512, seed=2)
    ids, weights = cases.random_routing(T, 16, 4, seed=3)
    out = torch.empty((T, 512), dtype=torch.bfloat16, device="cuda")
    args = dict(x=x, topk_ids=ids, topk_weights=weights, w13_codes=experts[0], w13_scales=experts[1],
                w2_codes=experts[2], w2_scales=experts[3], out=out)
    torch.ops.k3moe.forward_out(**args, **config.forward_kwargs())  # valid as given
    return args, config.forward_kwargs()


def call_forward_out(valid, **changes):
    args, kwargs = valid
    merged = {**args, **kwargs, **changes}
    torch.ops.k3moe.forward_out(**merged)


def non_contiguous(t):
    wide = torch.zeros((t.shape[0], 2 * t.shape[1]), dtype=t.dtype, device=t.device)
    return wide[:, ::2]


def misaligned(t):
    flat = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
    return flat[1:].view(t.shape)


TENSOR_FAULTS = [
    # argument, fault, expected message (after "k3moe.forward_out: ")
    ("x", lambda t: t.float(), r"x must be \[6, 512\] bfloat16 on cuda:0, got \[6, 512\] float32 on cuda:0"),
    ("x", lambda t: t[:, :384].contiguous(), r"x must be \[6, 512\] bfloat16 on cuda:0, got \[6, 384\]"),
    ("x", lambda t: t.flatten(), r"x must have 2 dimensions, got \[3072\]"),
    ("x", lambda t: t.cpu(), r"x must be a CUDA tensor, got \[6, 512\] bfloat16 on cpu"),
    ("x", non_contiguous, r"x must be contiguous"),
    ("x", misaligned, r"x must start 16-byte aligned"),
    ("topk_ids", lambda t: t.long(), r"topk_ids must be \[6, 4\] int32 on cuda:0, got \[6, 4\] int64"),
    ("topk_ids", lambda t: t[:, :3].contiguous(), r"topk_ids must be \[6, 4\] int32 on cuda:0, got \[6, 3\] int32"),
    ("topk_ids", lambda t: t.cpu(), r"topk_ids must be \[6, 4\] int32 on cuda:0, got \[6, 4\] int32 on cpu"),
    ("topk_ids", non_contiguous, r"topk_ids must be contiguous"),
    ("topk_weights", lambda t: t.bfloat16(), r"topk_weights must be \[6, 4\] float32 on cuda:0, got .* bfloat16"),
    ("topk_weights", lambda t: t[:5].contiguous(), r"topk_weights must be \[6, 4\] float32 on cuda:0, got \[5, 4\]"),
    ("topk_weights", lambda t: t.cpu(), r"topk_weights must be .* on cuda:0, got .* on cpu"),
    ("w13_codes", lambda t: t[:8].contiguous(), r"w13_codes must be \[16, 131072\] uint8 on cuda:0, got \[8, 131072\]"),
    ("w13_codes", lambda t: t.view(torch.int8), r"w13_codes must be .* uint8 on cuda:0, got .* int8"),
    ("w13_codes", lambda t: t.cpu(), r"w13_codes must be .* on cuda:0, got .* on cpu"),
    ("w13_scales", lambda t: t[:, :100].contiguous(), r"w13_scales must be \[16, 8192\] uint8 on cuda:0, got \[16, 100\]"),
    ("w13_scales", lambda t: t.cpu(), r"w13_scales must be .* on cuda:0, got .* on cpu"),
    ("w2_codes", lambda t: t.flatten(), r"w2_codes must be \[16, 65536\] uint8 on cuda:0, got \[1048576\]"),
    ("w2_codes", non_contiguous, r"w2_codes must be contiguous"),
    ("w2_scales", lambda t: t.view(torch.int32), r"w2_scales must be \[16, 4096\] uint8 on cuda:0, got \[16, 1024\] int32"),
    ("w2_scales", lambda t: t.cpu(), r"w2_scales must be .* on cuda:0, got .* on cpu"),
    ("out", lambda t: t.float(), r"out must be \[6, 512\] bfloat16 on cuda:0, got \[6, 512\] float32"),
    ("out", lambda t: t[:4].contiguous(), r"out must be \[6, 512\] bfloat16 on cuda:0, got \[4, 512\]"),
    ("out", lambda t: t.cpu(), r"out must be .* on cuda:0, got .* on cpu"),
    ("out", non_contiguous, r"out must be contiguous"),
]


@hopper
@pytest.mark.parametrize("name, fault, message", TENSOR_FAULTS,
                         ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(TENSOR_FAULTS)])
def test_forward_bad_tensor_is_named(valid, name, fault, message):
    expect_error(r"k3moe\.forward_out: " + message, call_forward_out, valid, **{name: fault(valid[0][name])})


CONFIG_FAULTS = [
    # keyword, value, expected message: the binding's or the library's (validating the plan)
    ("num_experts", 15, r"EP size 1 must divide|w13_codes must be \[15"),
    ("num_experts", 2000, r"routing supports up to 1024 experts, got 2000"),
    ("top_k", 0, r"num_experts_per_token \(K\) must be in \[1, num_experts = 16\], got 0"),
    ("top_k", 40, r"num_experts_per_token \(K\)|top_k must be <= 32, got 40"),
    ("hidden", 448, r"the expert GEMMs need H and I to be multiples of 128, got H = 448"),
    ("intermediate", 192, r"the expert GEMMs need H and I to be multiples of 128, got H = 512, I = 192"),
    ("precision", "fp4", r'mode must be "a16" or "mxfp8", got "fp4"'),
    ("activation", "gelu", r'activation must be "situ", "swiglu" or "swiglu_oai", got "gelu"'),
    ("situ_beta", 0.0, r"activation_situ_beta must be finite and > 0, got 0"),
    ("situ_linear_beta", float("inf"), r"situ_linear_beta must be finite and > 0"),
    ("swiglu_alpha", float("nan"), r"swiglu_alpha must be finite"),
    ("swiglu_limit", -1.0, r"swiglu_limit must be finite and > 0, got -1"),
    ("ep_size", 3, r"EP size 3 must divide num_experts = 16"),
    ("ep_rank", 1, r"EP rank must be in \[0, 1\), got 1"),
    ("ep_rank", 2 ** 40, r"ep_rank is out of range"),
]


@hopper
@pytest.mark.parametrize("keyword, value, message", CONFIG_FAULTS,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(CONFIG_FAULTS)])
def test_forward_bad_config_is_named(valid, keyword, value, message):
    expect_error(r"k3moe\.forward_out: .*(" + message + ")", call_forward_out, valid, **{keyword: value})


@hopper
def test_forward_x_scales_rules(valid):
    args, kwargs = valid
    x, codes = args["x"], torch.zeros((T, 512), dtype=torch.uint8, device="cuda")
    scales = torch.zeros((T, 4), dtype=torch.int32, device="cuda")
    mxfp8 = dict(kwargs, precision="mxfp8")
    expect_error(r"x_scales is only taken with a pre-quantized x", call_forward_out, (args, mxfp8), x=x,
                 x_scales=scales)
    expect_error(r'x is \[6, 512\] uint8 on cuda:0 \(pre-quantized MXFP8 codes\), which needs precision "mxfp8"',
                 call_forward_out, valid, x=codes, x_scales=scales)
    expect_error(r"x_scales must be \[6, 4\] int32 on cuda:0, got no tensor", call_forward_out, (args, mxfp8), x=codes)
    expect_error(r"x_scales must be \[6, 4\] int32 on cuda:0, got \[6, 16\] uint8", call_forward_out, (args, mxfp8),
                 x=codes, x_scales=torch.zeros((T, 16), dtype=torch.uint8, device="cuda"))
    expect_error(r"x_scales must be \[6, 4\] int32 on cuda:0, got .* on cpu", call_forward_out, (args, mxfp8),
                 x=codes, x_scales=scales.cpu())


@hopper
def test_forward_allocating_op_checks_too(valid):
    args, kwargs = valid
    inputs = {k: v for k, v in args.items() if k != "out"}
    expect_error(r"k3moe\.forward: topk_weights must be \[6, 4\] float32 on cuda:0, got \[6, 4\] float64",
                 torch.ops.k3moe.forward, **dict(inputs, topk_weights=inputs["topk_weights"].double()), **kwargs)


@hopper
def test_forward_too_many_tokens_names_x():
    # K = 32, H = I = 128: one forward takes at most (2^32 - 2) / (32 x 128 / 8) = 8,388,607 tokens.
    config = k3moe.MoeConfig(num_experts=32, top_k=32, hidden=128, intermediate=128)
    experts = k3moe.prepare_experts(*cases.random_experts(32, 128, 128, seed=4))
    tokens = 8_388_608
    x = torch.empty((tokens, 128), dtype=torch.bfloat16, device="cuda")
    ids = torch.empty((tokens, 32), dtype=torch.int32, device="cuda")
    weights = torch.empty((tokens, 32), dtype=torch.float32, device="cuda")
    expect_error(r"k3moe\.forward: x has 8388608 tokens; one forward takes at most 8388607 at top_k 32, H 128, I 128",
                 torch.ops.k3moe.forward, x, ids, weights, *experts, **config.forward_kwargs())


@hopper
@pytest.mark.parametrize("argument, change, message", [
    ("router_logits", lambda l, b: (l.half(), b), r"router_logits must be \[6, 16\] float32 on cuda:0, got .* float16"),
    ("router_logits", lambda l, b: (l.flatten(), b), r"router_logits must have 2 dimensions, got \[96\]"),
    ("router_logits", lambda l, b: (non_contiguous(l), b), r"router_logits must be contiguous"),
    ("router_bias", lambda l, b: (l, b[:15].contiguous()), r"router_bias must be \[16\] float32 on cuda:0, got \[15\]"),
    ("router_bias", lambda l, b: (l, b.double()), r"router_bias must be \[16\] float32 on cuda:0, got \[16\] float64"),
    ("router_bias", lambda l, b: (l, b.cpu()), r"router_bias must be \[16\] float32 on cuda:0, got \[16\] float32 on cpu"),
])
def test_route_bad_tensor_is_named(argument, change, message):
    logits, bias = change(torch.randn((T, 16), device="cuda"), torch.zeros(16, device="cuda"))
    expect_error(r"k3moe\.route: " + message, k3moe.route, logits, bias, 4)


@hopper
@pytest.mark.parametrize("top_k, message", [(0, r"num_experts_per_token \(K\) must be in \[1, num_experts = 16\]"),
                                            (17, r"num_experts_per_token \(K\) must be in \[1, num_experts = 16\]")])
def test_route_bad_top_k_is_the_library_error(top_k, message):
    expect_error(r"k3moe\.route: " + message, k3moe.route, torch.randn((T, 16), device="cuda"),
                 torch.zeros(16, device="cuda"), top_k)


@pytest.mark.parametrize("field, value", [("mode", "fp4"), ("activation", "gelu")])
def test_config_with_an_unknown_name_is_a_value_error(field, value):
    with pytest.raises(ValueError, match=rf"MoeConfig: {field} must be one of .*, got '{value}'"):
        k3moe.MoeConfig(**SMALL, **{field: value})


@pytest.mark.parametrize("ep_size, ep_rank", [(0, 0), (-2, 0), (4, 4), (4, -1)])
def test_config_with_an_impossible_ep_rank_is_a_value_error(ep_size, ep_rank):
    with pytest.raises(ValueError, match="ep_size must be >= 1 and ep_rank in"):
        k3moe.MoeConfig(**SMALL, ep_size=ep_size, ep_rank=ep_rank)


@hopper
def test_module_route_without_bias():
    config = k3moe.MoeConfig(**SMALL)
    module = k3moe.nn.KimiK3RoutedExperts.from_tensors(*cases.random_experts(16, 512, 256, seed=4), config=config)
    with pytest.raises(ValueError, match="no router bias"):
        module.route(torch.randn((T, 16), device="cuda"))
    with pytest.raises(ValueError, match="must hold the rank's 8 experts"):
        k3moe.nn.KimiK3RoutedExperts.from_tensors(*cases.random_experts(16, 512, 256, seed=4),
                                                  config=k3moe.MoeConfig(**SMALL, ep_size=2))
    swapped = dict(SMALL, hidden=SMALL["intermediate"], intermediate=SMALL["hidden"])  # same bytes, other shapes
    with pytest.raises(ValueError, match=r"w13_packed must be \(16, 1024, 128\) for the config's H 256, I 512"):
        k3moe.nn.KimiK3RoutedExperts.from_tensors(*cases.random_experts(16, 512, 256, seed=4),
                                                  config=k3moe.MoeConfig(**swapped))
