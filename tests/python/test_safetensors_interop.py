"""safetensors interop, both ways.

k3moe's files (``k3moe make-checkpoint``) load with the ``safetensors`` package and hold what the
K3 contract says; a file the package writes loads with k3moe (``k3moe inspect FILE --json``) with
the same names, dtypes, shapes and bytes (compared by 64-bit FNV-1a).
The k3moe binary comes from the environment variable K3MOE_BIN (ctest sets it).
"""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import crosscheck_env

safetensors_numpy = crosscheck_env.module("safetensors.numpy")
ml_dtypes = crosscheck_env.module("ml_dtypes")

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1

# numpy dtype -> safetensors spelling
ST_DTYPE = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
}


def fnv1a64(data: bytes) -> str:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return f"{h:016x}"


def k3moe_bin() -> str:
    return crosscheck_env.program("K3MOE_BIN")


def run_k3moe(*args, check=True):
    result = subprocess.run([k3moe_bin(), *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"k3moe {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr}")
    return result


def inspect_json(path: Path) -> dict:
    return json.loads(run_k3moe("inspect", path, "--json").stdout)


def test_k3moe_checkpoint_loads_with_safetensors(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_k3moe("make-checkpoint", ckpt, "--reduced", "--shards", 3, "--layers", "1,2", "--seed", 5,
              "--prefix", "language_model.model.")

    text = json.loads((ckpt / "config.json").read_text())["text_config"]
    H, I = text["routed_expert_hidden_size"], text["moe_intermediate_size"]
    E, M = text["num_experts"], text["hidden_size"]
    assert text["quantization_config"]["format"] == "mxfp4-pack-quantized"
    weights = text["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"]) == (4, 32)

    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert len(shards) == 3

    tensors = {}
    total = 0
    for shard in shards:
        loaded = safetensors_numpy.load_file(str(ckpt / shard))
        assert set(loaded) == {name for name, file in weight_map.items() if file == shard}
        listing = inspect_json(ckpt / shard)
        assert {t["name"] for t in listing["tensors"]} == set(loaded)
        for t in listing["tensors"]:
            arr = loaded[t["name"]]
            assert ST_DTYPE[arr.dtype] == t["dtype"], t["name"]
            assert list(arr.shape) == t["shape"], t["name"]
            assert fnv1a64(np.ascontiguousarray(arr).tobytes()) == t["fnv1a64"], t["name"]
        tensors.update(loaded)
        total += sum(a.nbytes for a in loaded.values())
    assert index["metadata"]["total_size"] == total

    p = "language_model.model.layers"
    for layer in (1, 2):
        for e in range(E):
            for w, rows, k in (("w1", I, H), ("w3", I, H), ("w2", H, I)):
                packed = tensors[f"{p}.{layer}.mlp.experts.{e}.{w}.weight_packed"]
                scale = tensors[f"{p}.{layer}.mlp.experts.{e}.{w}.weight_scale"]
                assert packed.dtype == np.uint8 and packed.shape == (rows, k // 2)
                assert scale.dtype == np.uint8 and scale.shape == (rows, k // 32)
        gate = tensors[f"{p}.{layer}.mlp.gate.weight"]
        bias = tensors[f"{p}.{layer}.mlp.gate.e_score_correction_bias"]
        assert gate.dtype == ml_dtypes.bfloat16 and gate.shape == (E, M)
        assert bias.dtype == ml_dtypes.bfloat16 and bias.shape == (E,)
        # Router logits of O(1) for unit inputs; E8M0 scales spread over several binades.
        assert abs(float(gate.astype(np.float32).std()) * np.sqrt(M) - 1.0) < 0.1
        scales = tensors[f"{p}.{layer}.mlp.experts.0.w1.weight_scale"]
        assert len(np.unique(scales)) >= 3 and scales.max() < 255
    assert len(tensors) == 2 * (6 * E + 2)


def test_safetensors_file_reads_in_k3moe(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {
        "u8": rng.integers(0, 256, size=(3, 5), dtype=np.uint8),
        "i8": rng.integers(-128, 128, size=(7,), dtype=np.int8),
        "bf16": rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16),
        "f16": rng.standard_normal((5,)).astype(np.float16),
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f64": rng.standard_normal((3,)),
        "i32": rng.integers(-(2**31), 2**31, size=(2, 2), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, size=(3,), dtype=np.int64),
        "u16": rng.integers(0, 2**16, size=(6,), dtype=np.uint16),
        "bool": rng.integers(0, 2, size=(9,)).astype(np.bool_),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "scalar": np.array(2.5, dtype=np.float32),
        "model.layers.1.mlp.experts.0.w1.weight_packed": rng.integers(0, 256, size=(64, 128), dtype=np.uint8),
    }
    path = tmp_path / "from_python.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata={"format": "np", "writer": "pytest"})

    listing = inspect_json(path)
    assert listing["metadata"] == {"format": "np", "writer": "pytest"}
    seen = {t["name"]: t for t in listing["tensors"]}
    assert set(seen) == set(tensors)
    end = 0
    for t in listing["tensors"]:  # in offset order, contiguous
        begin, stop = t["data_offsets"]
        assert begin == end, t["name"]
        end = stop
    for name, arr in tensors.items():
        t = seen[name]
        assert t["dtype"] == ST_DTYPE[arr.dtype], name
        assert t["shape"] == list(arr.shape), name
        assert t["data_offsets"][1] - t["data_offsets"][0] == arr.nbytes, name
        assert t["fnv1a64"] == fnv1a64(np.ascontiguousarray(arr).tobytes()), name

    # The human-readable listing names every tensor too.
    text = run_k3moe("inspect", path).stdout
    for name in tensors:
        assert name in text


def test_k3moe_rejects_a_damaged_file_with_a_message(tmp_path):
    path = tmp_path / "damaged.safetensors"
    safetensors_numpy.save_file({"x": np.arange(64, dtype=np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    result = run_k3moe("inspect", path, check=False)
    assert result.returncode != 0
    assert "damaged.safetensors" in result.stderr and "'x'" in result.stderr


def test_inspect_directory_verdict(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_k3moe("make-checkpoint", ckpt, "--reduced", "--shards", 2)
    out = run_k3moe("inspect", ckpt, "--ep-size", 4).stdout
    assert "valid" in out and "INVALID" not in out
    assert "4 ranks x 8 experts" in out
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(b"\x00" * 4)
    result = run_k3moe("inspect", ckpt, check=False)
    assert result.returncode == 2
    assert "model-00002-of-00002.safetensors" in result.stdout and "INVALID" in result.stdout
