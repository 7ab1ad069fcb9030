"""KimiK3RoutedExperts.from_checkpoint through the library's loader (torch.classes.k3moe.Checkpoint),
on a small K3-format checkpoint written here with the safetensors package: the rank's experts
come back as written (W13 = [W1; W3]), in the kernel layout equal to prepare_experts', with the
layer's router bias; the loaded module computes what from_tensors' does."""

import json

import pytest

from k3moe_test_env import import_safetensors_torch, require_package

torch, k3moe = require_package()
safetensors_torch = import_safetensors_torch()
import k3moe_torch_cases as cases  # noqa: E402

E, K, H, I, D = 16, 4, 256, 128, 64  # D: the model width the router sees
LAYER = 1


def write_checkpoint(directory, intermediate=I):
    """A two-layer checkpoint (layer 0 dense, layer 1 MoE) in one model.safetensors: (its raw
    experts, gate weight, correction bias)."""
    I = intermediate
    config = {"text_config": {
        "hidden_size": D, "routed_expert_hidden_size": H, "moe_intermediate_size": I, "num_experts": E,
        "num_experts_per_token": K, "num_hidden_layers": 2, "first_k_dense_replace": 1, "hidden_act": "situ",
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "routed_scaling_factor": 2.5,
        "moe_renormalize": True,
        "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                                "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32}}}}}}
    (directory / "config.json").write_text(json.dumps(config))
    w13_packed, w13_scale, w2_packed, w2_scale = cases.random_experts(E, H, I, seed=3, device="cpu")
    tensors = {}
    prefix = f"language_model.model.layers.{LAYER}.mlp"
    for e in range(E):
        base = f"{prefix}.experts.{e}"
        tensors[f"{base}.w1.weight_packed"] = w13_packed[e, :I].clone()
        tensors[f"{base}.w3.weight_packed"] = w13_packed[e, I:].clone()
        tensors[f"{base}.w1.weight_scale"] = w13_scale[e, :I].clone()
        tensors[f"{base}.w3.weight_scale"] = w13_scale[e, I:].clone()
        tensors[f"{base}.w2.weight_packed"] = w2_packed[e].clone()
        tensors[f"{base}.w2.weight_scale"] = w2_scale[e].clone()
    gate = torch.randn((E, D)).to(torch.bfloat16)
    bias = torch.randn((E,)) * 0.1
    tensors[f"{prefix}.gate.weight"] = gate
    tensors[f"{prefix}.gate.e_score_correction_bias"] = bias
    safetensors_torch.save_file(tensors, str(directory / "model.safetensors"))
    return (w13_packed, w13_scale, w2_packed, w2_scale), gate, bias


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("k3_small")
    return (directory, *write_checkpoint(directory))


def test_loader_reads_what_was_written(checkpoint):
    directory, raw, gate, bias = checkpoint
    ckpt = torch.classes.k3moe.Checkpoint(str(directory))
    fields = json.loads(ckpt.config_json())
    assert (fields["num_experts"], fields["top_k"], fields["hidden"], fields["intermediate"]) == (E, K, H, I)
    assert fields["activation"] == "situ" and fields["routed_scaling_factor"] == 2.5
    assert list(ckpt.moe_layers()) == [LAYER]
    for rank in range(2):
        loaded = ckpt.load_experts(LAYER, 2, rank)
        for got, want in zip(loaded, raw):
            assert torch.equal(got, want[rank * 8:(rank + 1) * 8])
    weight, loaded_bias = ckpt.load_router(LAYER)
    assert torch.equal(weight, gate.float()) and torch.equal(loaded_bias, bias)


@pytest.mark.parametrize("method,args,name", [
    ("load_experts", (LAYER + 2 ** 32, 1, 0), "layer"),
    ("load_experts", (LAYER, 1 + 2 ** 32, 0), "ep_size"),
    ("load_kernel_layout", (LAYER, 2, 2 ** 32), "ep_rank"),
    ("load_router", (LAYER + 2 ** 32,), "layer"),
])
def test_int_arguments_past_int32_are_errors_not_wrapped(checkpoint, method, args, name):
    """2^32 + 1 must not wrap to 1 (a silently different layer or EP size)."""
    ckpt = torch.classes.k3moe.Checkpoint(str(checkpoint[0]))
    with pytest.raises(RuntimeError, match=rf"{method}: {name} is out of range: must fit in a 32-bit int "
                                           rf"\[-2147483648, 2147483647\], got {max(args)}"):
        getattr(ckpt, method)(*args)


def test_kernel_layout_equals_prepare(checkpoint):
    directory, raw, _, _ = checkpoint
    ckpt = torch.classes.k3moe.Checkpoint(str(directory))
    rank1 = [t[8:].contiguous() for t in raw]
    for got, want in zip(ckpt.load_kernel_layout(LAYER, 2, 1), k3moe.prepare_experts(*rank1)):
        assert torch.equal(got, want)


def test_kernel_layout_the_dimensions_cannot_hold_is_an_error(tmp_path):
    """I = 64 is a valid checkpoint, but the kernel layout needs multiples of 128 (its layout step
    checked only 64, and wrote past its buffers: a segfault)."""
    write_checkpoint(tmp_path, intermediate=64)
    ckpt = torch.classes.k3moe.Checkpoint(str(tmp_path))
    assert ckpt.load_experts(LAYER, 1, 0)[0].shape == (E, 128, H // 2)
    message = (r"load_kernel_layout: .*the kernel layout needs H and I to be multiples of 128 \(it stores K in "
               rf"chunks of 128\), got H = {H}, I = 64")
    with pytest.raises(RuntimeError, match=message):
        ckpt.load_kernel_layout(LAYER, 1, 0)
    with pytest.raises(RuntimeError, match=message):
        k3moe.nn.KimiK3RoutedExperts.from_checkpoint(tmp_path, LAYER, device="cpu")


def test_from_checkpoint_on_cpu_keeps_tensors(checkpoint):
    """device='cpu' builds the module without running anything (no plan, no GPU)."""
    directory, raw, _, bias = checkpoint
    module = k3moe.nn.KimiK3RoutedExperts.from_checkpoint(directory, LAYER, ep_size=4, ep_rank=3, device="cpu")
    assert module.config == k3moe.MoeConfig(num_experts=E, top_k=K, hidden=H, intermediate=I,
                                             routed_scaling_factor=2.5, ep_size=4, ep_rank=3)
    assert torch.equal(module.router_bias, bias)
    for got, want in zip(module.experts, k3moe.prepare_experts(*[t[12:].contiguous() for t in raw])):
        assert torch.equal(got, want)


def test_dtype_conversion_keeps_the_router_bias_fp32(checkpoint):
    """An engine's model.to(torch.bfloat16) must not round the bias routing takes as fp32."""
    directory, raw, _, bias = checkpoint
    module = k3moe.nn.KimiK3RoutedExperts.from_checkpoint(directory, LAYER, device="cpu")
    codes = module.w13_codes
    assert bias.dtype == torch.float32 and not torch.equal(bias, bias.bfloat16().float())
    for convert in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.double(),
                    lambda m: m.to("cpu", torch.bfloat16)):
        convert(module)
        assert module.router_bias.dtype == torch.float32 and torch.equal(module.router_bias, bias)
        assert module.w13_codes is codes
    assert "router_bias" in module.state_dict()


@pytest.mark.hopper
def test_from_checkpoint_forward(checkpoint):
    directory, raw, _, bias = checkpoint
    module = k3moe.nn.KimiK3RoutedExperts.from_checkpoint(directory, LAYER, ep_size=2, ep_rank=0)
    assert module.w13_codes.is_cuda and module.router_bias.is_cuda
    same = k3moe.nn.KimiK3RoutedExperts.from_tensors(*[t[:8].contiguous().cuda() for t in raw], config=module.config,
                                                     router_bias=bias.cuda())
    logits = torch.randn((10, E), device="cuda")
    ids, weights = module.route(logits)
    assert torch.equal(ids, same.route(logits)[0])
    x = cases.random_x(10, H, seed=5)
    out = module(x, ids, weights)
    assert torch.equal(out, same(x, ids, weights))
    assert (out != 0).any()
