"""The float64 reference (`k3moe reference`) against an independent NumPy implementation written
here from the contract (docs K3_CONTRACT.md, include/k3moe/reference.h): its own E2M1 table, E8M0
decode, bf16 rounding, MXFP8 quantizer (the contract's round-up rule), activations, routing and
combine. The checkpoint is a reduced synthetic one from `k3moe make-checkpoint --reduced`, read
with the `safetensors` package.

What is asserted, and why the bounds are what they are:
  * routing: ids equal, weights bit for bit (the same fp32 operations in the same order).
  * out_ideal: rel-L2 <= 1e-12. Both sides sum the same float64 products in different orders
    (BLAS here, four partial sums there); each dot product of n <= 256 terms differs by at most
    2 (n - 1) u sum|terms| (u = 2^-53), ~2 (n - 1) u sqrt(n) ~ 1e-13 relative for random-sign
    terms, through two GEMMs and the activation; typical is 1e-15.
  * out_emulate: bit for bit. Every product in both GEMMs is exact in double (bf16 or E4M3
    values times E2M1 values times powers of two: <= 12 significant bits) and the sums stay far
    inside 53 bits, so h and y are exact whatever the order; the activation is evaluated with the
    same libm (Python's math module calls the C library, as the C++ reference does) in the same
    operation order; the roundings (fp32, bf16, MXFP8) are exact functions; the combine adds the
    same fp32 x fp32 products (exact in double) in slot order. A flip could only come from a libm
    difference between the two processes, i.e. never on one machine.
  * EP: ranks 0 and 1 of EP2 each match the NumPy model of their own slice exactly as above, and
    their out_ideal sum to EP1's within rel-L2 1e-14: the same K = 4 terms summed per rank then
    added, (2K - 1) u sqrt(K) ~ 1.5e-15.

Environment: K3MOE_BIN = path of the k3moe program (the module skips without it, fails under ctest).
"""

import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import crosscheck_env

safetensors = crosscheck_env.module("safetensors")
K3MOE_BIN = crosscheck_env.program("K3MOE_BIN")

TOKENS = 24
SEED = 11

# ------------------------------------------------------------------------- formats, from scratch

E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def e8m0_decode(s):
    s = s.astype(np.float64)
    return np.where(s == 255, np.nan, np.exp2(s - 127.0))


def mxfp4_dequantize(packed, scales):
    """packed [rows, cols/2] (low nibble = even column), scales [rows, cols/32] E8M0 -> float64."""
    rows, half = packed.shape
    values = np.empty((rows, half * 2))
    values[:, 0::2] = E2M1_VALUES[packed & 0xF]
    values[:, 1::2] = E2M1_VALUES[packed >> 4]
    return values * np.repeat(e8m0_decode(scales), 32, axis=1)


def bf16_bits_to_f64(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_bf16(values):
    """float64 -> fp32 -> bf16 (round to nearest even on the bit pattern), back to float64."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(values)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32)
    rounded = np.where(nan, (bits >> 16).astype(np.uint32) | 0x40, rounded)
    return bf16_bits_to_f64(rounded.astype(np.uint16))


def e4m3_round(v):
    """Round float64 values with |v| <= 448 to E4M3 (RNE, subnormal step 2^-9)."""
    a = np.abs(v)
    _, exp = np.frexp(np.where(a > 0, a, 1.0))  # a = m 2^exp, m in [0.5, 1)
    ulp = np.where(a < 2.0**-6, 2.0**-9, np.exp2(exp - 4.0))  # 3 mantissa bits below the leading one
    return np.rint(v / ulp) * ulp  # np.rint: half to even; v / ulp is exact (power of two)


def mxfp8_round_trip(values):
    """The contract's MXFP8 along the last axis, groups of 32: e = ceil(log2(amax / 448)) with amax
    floored at fp32's smallest normal, clamped to E8M0's range; q = E4M3(x / 2^e) * 2^e."""
    x = np.asarray(values, dtype=np.float64)
    groups = x.reshape(x.shape[:-1] + (x.shape[-1] // 32, 32))
    amax = np.max(np.abs(groups), axis=-1, keepdims=True)
    finite = np.isfinite(amax)
    a = np.where(finite, np.maximum(amax, 2.0**-126), 1.0)
    _, ea = np.frexp(a)
    e = ea - 9 - 1  # 448 = 0.875 * 2^9: start below and settle upward (448 * 2^e is exact)
    for _ in range(4):
        e = np.where(a > 448.0 * np.exp2(e.astype(np.float64)), e + 1, e)
    scale = np.exp2(np.clip(e, -127, 127).astype(np.float64))
    q = e4m3_round(groups / scale) * scale
    return np.where(finite, q, np.nan).reshape(x.shape)


# ------------------------------------------------------------------------- activations, routing

def _vectorize(fn):
    return np.frompyfunc(fn, 2, 1)


def sigmoid(z):
    """1 / (1 + exp(-z)) in float64; exp overflowing to Inf gives 0, as in C."""
    try:
        return 1.0 / (1.0 + math.exp(-z))
    except OverflowError:
        return 0.0


def make_activation(kind, params):
    """The contract's formulas, evaluated with Python's math (the C library's exp and tanh)."""
    beta, beta_lin = params["situ_beta"], params["situ_linear_beta"]
    alpha, limit = params["swiglu_alpha"], params["swiglu_limit"]

    def situ(g, u):
        return beta * math.tanh(g / beta) * sigmoid(g) * (beta_lin * math.tanh(u / beta_lin))

    def swiglu(g, u):
        return g * sigmoid(g) * u

    def swiglu_oai(g, u):
        g = limit if g > limit else g
        u = -limit if u < -limit else (limit if u > limit else u)
        return g * sigmoid(alpha * g) * (u + 1.0)

    fn = _vectorize({"situ": situ, "swiglu": swiglu, "swiglu_oai": swiglu_oai}[kind])
    return lambda g, u: fn(g, u).astype(np.float64)


def route(logits, bias, top_k, renormalize, scaling):
    """sigmoid in float64 rounded to fp32; choice = s + bias (fp32); top-K by choice, stable (ties
    to the lower id, NaN last); weights s / (fp32 sum in slot order + 1e-20) * scaling."""
    score = np.vectorize(sigmoid, otypes=[np.float64])(logits.astype(np.float64)).astype(np.float32)
    choice = score + bias[None, :]
    ids = np.argsort(-choice, axis=1, kind="stable")[:, :top_k].astype(np.int32)
    w = np.take_along_axis(score, ids, axis=1)
    w = np.where(np.isnan(w), np.float32(0), w).astype(np.float32)
    total = np.zeros(w.shape[0], dtype=np.float32)
    for k in range(top_k):
        total = (total + w[:, k]).astype(np.float32)
    if renormalize:
        w = (w / (total + np.float32(1e-20))[:, None]).astype(np.float32)
    return ids, (w * np.float32(scaling)).astype(np.float32)


# ------------------------------------------------------------------------- checkpoint and CLI

def read_safetensors(path):
    """name -> numpy array, through the safetensors package's parser (BF16 read as uint16 bits)."""
    types = {"F64": np.float64, "F32": np.float32, "I32": np.int32, "U8": np.uint8, "BF16": np.uint16}
    out = {}
    for name, view in safetensors.deserialize(Path(path).read_bytes()):
        out[name] = np.frombuffer(view["data"], dtype=types[view["dtype"]]).reshape(view["shape"])
    return out


class Model:
    """The checkpoint's config, router and experts, dequantized to float64."""

    def __init__(self, ckpt_dir):
        cfg = json.loads((ckpt_dir / "config.json").read_text())
        text = cfg.get("text_config", cfg)
        self.H = text.get("routed_expert_hidden_size", text["hidden_size"])
        self.I = text["moe_intermediate_size"]
        self.E = text.get("num_experts", text.get("n_routed_experts"))
        self.K = text.get("num_experts_per_token", text.get("num_experts_per_tok"))
        self.scaling = np.float32(text.get("routed_scaling_factor", 1.0))
        self.renormalize = text.get("moe_renormalize", text.get("norm_topk_prob", True))
        f32 = lambda v: float(np.float32(v))  # the C++ config holds these as fp32
        self.params = {"situ_beta": f32(text.get("activation_situ_beta", 4.0)),
                       "situ_linear_beta": f32(text.get("activation_situ_linear_beta", 25.0)),
                       "swiglu_alpha": f32(text.get("swiglu_alpha", 1.702)),
                       "swiglu_limit": f32(text.get("swiglu_limit", 7.0))}
        weight_map = json.loads((ckpt_dir / "model.safetensors.index.json").read_text())["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(ckpt_dir / shard))
        pattern = re.compile(r"^(.*)layers\.(\d+)\.mlp\.experts\.0\.w1\.weight_packed$")
        found = [pattern.match(n) for n in weight_map]
        prefix, layer = next((m.group(1), int(m.group(2))) for m in found if m)
        self.layer = layer
        base = f"{prefix}layers.{layer}.mlp"
        self.bias = bf16_bits_to_f64(tensors[f"{base}.gate.e_score_correction_bias"]).astype(np.float32)

        def expert(e, which):
            t = f"{base}.experts.{e}.{which}"
            return mxfp4_dequantize(tensors[f"{t}.weight_packed"], tensors[f"{t}.weight_scale"])

        # W13 = [W1 (gate); W3 (up)] as contiguous halves; W2 [H, I].
        self.w13 = [np.concatenate([expert(e, "w1"), expert(e, "w3")]) for e in range(self.E)]
        self.w2 = [expert(e, "w2") for e in range(self.E)]
        assert self.w13[0].shape == (2 * self.I, self.H) and self.w2[0].shape == (self.H, self.I)

    def forward(self, x, ids, weights, first, count, activation, mode, emulate):
        act = make_activation(activation, self.params)
        to_f32 = (lambda v: v.astype(np.float32).astype(np.float64)) if emulate else (lambda v: v)
        x_in = mxfp8_round_trip(x) if (emulate and mode == "mxfp8") else x
        out = np.zeros((x.shape[0], self.H))
        for t in range(x.shape[0]):
            acc = np.zeros(self.H)
            for k in range(ids.shape[1]):
                e = int(ids[t, k])
                if not first <= e < first + count:
                    continue  # -1 or another rank's expert
                h = to_f32(self.w13[e] @ x_in[t])
                a = act(h[:self.I], h[self.I:])
                if emulate:
                    a = round_bf16(a) if mode == "a16" else mxfp8_round_trip(a.astype(np.float32))
                y = to_f32(self.w2[e] @ a)
                acc = acc + np.float64(weights[t, k]) * y
            out[t] = round_bf16(acc) if emulate else acc
        return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("reduced")
    subprocess.run([K3MOE_BIN, "make-checkpoint", str(ckpt), "--reduced", "--seed", "5"],
                   check=True, capture_output=True)
    return ckpt, Model(ckpt)


def run_reference(ckpt_dir, out, mode, activation, ep_size=1, ep_rank=0):
    result = subprocess.run([K3MOE_BIN, "reference", "--checkpoint", str(ckpt_dir), "--tokens", str(TOKENS),
                             "--mode", mode, "--activation", activation, "--ep-size", str(ep_size),
                             "--ep-rank", str(ep_rank), "--seed", str(SEED), "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with safetensors.safe_open(str(out), framework="np") as f:
        metadata = f.metadata()
    return read_safetensors(out), metadata


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ------------------------------------------------------------------------- tests

@pytest.mark.parametrize("mode", ["a16", "mxfp8"])
@pytest.mark.parametrize("activation", ["situ", "swiglu", "swiglu_oai"])
@pytest.mark.parametrize("ep_size,ep_rank", [(1, 0), (2, 0), (2, 1)])
def test_reference_matches_numpy(checkpoint, tmp_path, mode, activation, ep_size, ep_rank):
    ckpt_dir, model = checkpoint
    ref, meta = run_reference(ckpt_dir, tmp_path / "ref.safetensors", mode, activation, ep_size, ep_rank)
    assert meta["mode"] == mode and meta["activation"] == activation
    assert (meta["ep_size"], meta["ep_rank"]) == (str(ep_size), str(ep_rank))
    assert meta["layer"] == str(model.layer) and meta["seed"] == str(SEED)
    T, H, E, K = TOKENS, model.H, model.E, model.K
    assert ref["x"].shape == (T, H) and ref["logits"].shape == (T, E) and ref["bias"].shape == (E,)
    assert ref["ids"].shape == (T, K) and ref["weights"].shape == (T, K)
    assert ref["out_ideal"].shape == (T, H) and ref["out_emulate"].shape == (T, H)

    # The router's bias is the checkpoint's (bf16 widened to fp32).
    np.testing.assert_array_equal(ref["bias"], model.bias)

    ids, weights = route(ref["logits"], ref["bias"], K, model.renormalize, model.scaling)
    np.testing.assert_array_equal(ref["ids"], ids)
    np.testing.assert_array_equal(ref["weights"].view(np.uint32), weights.view(np.uint32))

    x = bf16_bits_to_f64(ref["x"])
    first, count = ep_rank * (E // ep_size), E // ep_size
    assert int(meta["first_expert"]) == first and int(meta["num_local"]) == count
    ideal = model.forward(x, ids, weights, first, count, activation, mode, emulate=False)
    emulate = model.forward(x, ids, weights, first, count, activation, mode, emulate=True)
    assert np.isfinite(ideal).all() and np.linalg.norm(ideal) > 0

    assert rel_l2(ref["out_ideal"], ideal) <= 1e-12
    mismatch = np.flatnonzero(ref["out_emulate"] != emulate)
    assert mismatch.size == 0, (
        f"{mismatch.size} of {emulate.size} emulate outputs differ, first at {mismatch[:5]}: "
        f"{ref['out_emulate'].reshape(-1)[mismatch[:5]]} vs {emulate.reshape(-1)[mismatch[:5]]}")
    # Sanity of the test itself: Emulate differs from Ideal by the mode's precision.
    distance = rel_l2(emulate, ideal)
    assert (1e-3 < distance < 5e-3) if mode == "a16" else (2e-2 < distance < 1e-1), distance


@pytest.mark.parametrize("mode", ["a16", "mxfp8"])
def test_expert_parallel_ranks_sum_to_one_rank(checkpoint, tmp_path, mode):
    ckpt_dir, _ = checkpoint
    full, _ = run_reference(ckpt_dir, tmp_path / "ep1.safetensors", mode, "situ")
    r0, _ = run_reference(ckpt_dir, tmp_path / "ep2r0.safetensors", mode, "situ", 2, 0)
    r1, _ = run_reference(ckpt_dir, tmp_path / "ep2r1.safetensors", mode, "situ", 2, 1)
    for name in ["x", "logits", "ids", "weights"]:
        np.testing.assert_array_equal(r0[name], full[name])
        np.testing.assert_array_equal(r1[name], full[name])
    assert np.linalg.norm(r0["out_ideal"]) > 0 and np.linalg.norm(r1["out_ideal"]) > 0
    assert rel_l2(r0["out_ideal"] + r1["out_ideal"], full["out_ideal"]) <= 1e-14


def test_reference_rejects_a_bad_rank(checkpoint, tmp_path):
    ckpt_dir, _ = checkpoint
    result = subprocess.run([K3MOE_BIN, "reference", "--checkpoint", str(ckpt_dir), "--ep-size", "2",
                             "--ep-rank", "2", "--out", str(tmp_path / "x.safetensors")],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "rank" in result.stderr
