"""Cross-check of k3moe's number formats (formats.h, through the format_oracle binary) against an
independent implementation: the ml_dtypes package (float4_e2m1fn, float8_e4m3fn, float8_e8m0fnu,
bfloat16).

Where k3moe's documented rule intentionally differs from ml_dtypes, the test asserts k3moe's rule
explicitly instead of skipping the value:
  * E4M3 encode saturates finite overflow and +-Inf to +-448 (the hardware's satfinite); ml_dtypes
    maps them to NaN. NaN of either sign encodes as 0x7F (ml_dtypes keeps the sign: 0xFF).
  * E2M1 encode maps NaN to +0 (code 0); ml_dtypes gives a signed zero.
  * UE4M3 (NVFP4 block scale) has no ml_dtypes type: it is E4M3 with the sign bit clear, and any
    code with the sign bit set decodes as NaN.
  * E8M0 has no encoder in k3moe besides the MX round-up scale rule; ml_dtypes' float8_e8m0fnu
    checks the byte of every exact power of two and decodes every scale the rule returns.

Environment: K3MOE_FORMAT_ORACLE = path of the format_oracle binary (the module skips without it, fails under ctest).
"""

import subprocess

import numpy as np
import pytest

import crosscheck_env

ml_dtypes = crosscheck_env.module("ml_dtypes")
ORACLE = crosscheck_env.program("K3MOE_FORMAT_ORACLE")

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn
E8 = ml_dtypes.float8_e8m0fnu
BF16 = ml_dtypes.bfloat16
RNG_SEED = 20261129


def cast(x, dtype):
    """ml_dtypes cast of float32 values (NaN/Inf/overflow on purpose: silence NumPy's warning)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


def oracle(command, array, out_dtype):
    """Runs `format_oracle` on one array and returns its output as `out_dtype`."""
    array = np.ascontiguousarray(array)
    request = f"{command} {array.size}\n".encode() + array.tobytes()
    result = subprocess.run([ORACLE], input=request, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    return np.frombuffer(result.stdout, dtype=out_dtype)


def f32(values):
    return np.asarray(values, dtype=np.float32)


def neighbours(values):
    """Each value, and the next fp32 value below and above it (both signs)."""
    v = f32(values)
    inf = np.float32(np.inf)
    with np.errstate(over="ignore"):  # FLT_MAX's upper neighbour is Inf, on purpose
        both = np.concatenate([v, np.nextafter(v, -inf), np.nextafter(v, inf)])
    return np.concatenate([both, -both])


def binade_samples(rng, n, lo, hi):
    """n fp32 values, log-uniform over 2^lo .. 2^hi, both signs."""
    mags = np.exp2(rng.uniform(lo, hi, n))
    signs = rng.choice([-1.0, 1.0], n)
    return f32(mags * signs)


def random_bit_patterns(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


# -------------------------------------------------------------------------------------- decode

def test_e2m1_decode_every_code():
    codes = np.arange(16, dtype=np.uint8)
    ours = oracle("e2m1_decode", codes, np.float32)
    theirs = codes.view(F4).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))


def test_e4m3_decode_every_code():
    codes = np.arange(256, dtype=np.uint8)
    ours = oracle("e4m3_decode", codes, np.float32)
    theirs = codes.view(F8).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.isnan(ours).sum() == 2  # 0x7F and 0xFF
    np.testing.assert_array_equal(ours, theirs)  # NaN == NaN in assert_array_equal
    np.testing.assert_array_equal(np.signbit(ours[~np.isnan(ours)]), np.signbit(theirs[~np.isnan(theirs)]))


def test_e8m0_decode_every_code():
    codes = np.arange(256, dtype=np.uint8)
    ours = oracle("e8m0_decode", codes, np.float32)
    theirs = codes.view(E8).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs)
    assert np.isnan(ours[255]) and np.isnan(ours).sum() == 1
    assert ours[0] == np.float32(2.0**-127)  # an fp32 subnormal, kept exactly


def test_ue4m3_decode_every_code():
    codes = np.arange(256, dtype=np.uint8)
    ours = oracle("ue4m3_decode", codes, np.float32)
    theirs = codes.view(F8).astype(np.float32)
    np.testing.assert_array_equal(ours[:0x7F], theirs[:0x7F])
    assert not np.signbit(ours[:0x7F]).any()
    # Documented: 0x7F and every code with the sign bit set are NaN (a scale is never negative).
    assert np.isnan(ours[0x7F:]).all()


# -------------------------------------------------------------------------------------- encode

def e2m1_edges():
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    midpoints = (grid[:-1] + grid[1:]) / 2
    tiny = [np.finfo(np.float32).smallest_subnormal, np.finfo(np.float32).tiny, 1e-30]
    big = [6.5, 7.0, 1e6, np.finfo(np.float32).max]
    return np.concatenate([neighbours(np.concatenate([grid, midpoints, tiny, big])),
                           f32([np.inf, -np.inf, 0.0, -0.0])])


def e4m3_edges():
    values = np.arange(0x7F, dtype=np.uint8).view(F8).astype(np.float64)  # every finite magnitude
    midpoints = (values[:-1] + values[1:]) / 2
    tiny = [np.finfo(np.float32).smallest_subnormal, np.finfo(np.float32).tiny, 2.0**-10, 3 * 2.0**-10]
    big = [464.0, 480.0, 1e10, np.finfo(np.float32).max]
    return np.concatenate([neighbours(np.concatenate([values, midpoints, tiny, big])),
                           f32([np.inf, -np.inf, 0.0, -0.0])])


def check_e2m1_encode(x):
    x = f32(x)
    ours = oracle("e2m1_encode", x, np.uint8)
    theirs = cast(x, F4).view(np.uint8)
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], theirs[~nan], err_msg="E2M1 encode differs from ml_dtypes")
    # Documented: NaN encodes as +0.
    assert (ours[nan] == 0).all()


def check_e4m3_encode(x):
    x = f32(x)
    ours = oracle("e4m3_encode", x, np.uint8)
    theirs = cast(x, F8).view(np.uint8)
    nan_in = np.isnan(x)
    overflow = ~nan_in & ((theirs & 0x7F) == 0x7F)  # ml_dtypes: NaN on overflow and +-Inf
    ordinary = ~nan_in & ~overflow
    np.testing.assert_array_equal(ours[ordinary], theirs[ordinary], err_msg="E4M3 encode differs from ml_dtypes")
    # Documented satfinite: beyond 464 (448's upper rounding boundary) and +-Inf -> +-448.
    assert (np.abs(x[overflow]) > 464).all()
    np.testing.assert_array_equal(ours[overflow], np.where(np.signbit(x[overflow]), 0xFE, 0x7E))
    # Documented: NaN of either sign -> 0x7F.
    assert (ours[nan_in] == 0x7F).all()
    return int(overflow.sum()), int(ordinary.sum())


def test_e2m1_encode_edges():
    check_e2m1_encode(e2m1_edges())
    # Every midpoint goes to the even code, stated outright.
    mids = f32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    np.testing.assert_array_equal(oracle("e2m1_encode", mids, np.uint8), [0, 2, 2, 4, 4, 6, 6])


def test_e2m1_encode_random():
    rng = np.random.default_rng(RNG_SEED)
    check_e2m1_encode(binade_samples(rng, 100_000, -5, 4))
    check_e2m1_encode(random_bit_patterns(rng, 100_000))


def test_e4m3_encode_edges():
    overflow, ordinary = check_e4m3_encode(e4m3_edges())
    assert overflow > 0 and ordinary > 700
    special = f32([448.0, 464.0, 465.0, np.inf, -np.inf, np.nan, -np.nan, 2.0**-10])
    np.testing.assert_array_equal(oracle("e4m3_encode", special, np.uint8),
                                  [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F, 0x00])


def test_e4m3_encode_random():
    rng = np.random.default_rng(RNG_SEED + 1)
    check_e4m3_encode(binade_samples(rng, 100_000, -12, 10))
    check_e4m3_encode(random_bit_patterns(rng, 100_000))


def test_ue4m3_encode():
    rng = np.random.default_rng(RNG_SEED + 2)
    x = np.concatenate([e4m3_edges(), binade_samples(rng, 100_000, -12, 10)])
    ours = oracle("ue4m3_encode", x, np.uint8)
    positive = ~np.isnan(x) & ~np.signbit(x)
    e4m3 = oracle("e4m3_encode", x, np.uint8)
    np.testing.assert_array_equal(ours[positive], e4m3[positive])
    # Documented: negative values and NaN -> 0x7F; -0 -> 0.
    negative = ~np.isnan(x) & np.signbit(x) & (x != 0)
    assert (ours[negative] == 0x7F).all()
    assert (ours[np.isnan(x)] == 0x7F).all()
    assert (ours[(x == 0)] == 0).all()


# -------------------------------------------------------------------------------- bf16

def test_bf16_round():
    rng = np.random.default_rng(RNG_SEED + 3)
    bf16_grid = np.arange(0, 2**16, 7, dtype=np.uint32) << 16
    ties = (bf16_grid | 0x8000).view(np.float32)
    x = np.concatenate([random_bit_patterns(rng, 100_000), binade_samples(rng, 50_000, -130, 127),
                        ties, (bf16_grid | 0x7FFF).view(np.float32), (bf16_grid | 0x8001).view(np.float32),
                        f32([np.inf, -np.inf, 0.0, -0.0, np.nan, -np.nan, np.finfo(np.float32).max])])
    ours = oracle("bf16_round", x, np.float32)
    theirs = cast(x, BF16).astype(np.float32)
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))
    assert np.isnan(ours[nan]).all()
    np.testing.assert_array_equal(np.signbit(ours[nan]), np.signbit(x[nan]))


# ------------------------------------------------------------------------------ MX scale rule

def round_up_scale_exponent(amax, elem_max):
    """The smallest e with max(amax, 2^-126) <= elem_max * 2^e, clamped to [-127, 127]."""
    a = np.maximum(np.abs(amax.astype(np.float64)), 2.0**-126)
    _, ea = np.frexp(a)
    _, em = np.frexp(elem_max)
    e = (ea - em - 1).astype(np.int64)
    for _ in range(4):  # elem_max * 2^e is exact in float64: settle e from below
        e = np.where(a > elem_max * np.exp2(e.astype(np.float64)), e + 1, e)
    return np.clip(e, -127, 127)


@pytest.mark.parametrize("name,elem_max", [("mx_scale_e2m1", 6.0), ("mx_scale_e4m3", 448.0)])
def test_mx_scale_round_up(name, elem_max):
    rng = np.random.default_rng(RNG_SEED + 4)
    exact = f32(elem_max * np.exp2(np.arange(-120, 120, dtype=np.float64)))
    amax = np.concatenate([np.abs(binade_samples(rng, 100_000, -140, 127)), neighbours(exact)])
    amax = amax[amax >= 0]
    ours = oracle(name, amax, np.uint8)
    e = round_up_scale_exponent(amax, elem_max)
    np.testing.assert_array_equal(ours.astype(np.int64), e + 127)
    # ml_dtypes decodes our byte to 2^e, and encodes the exact powers of two to the same byte.
    np.testing.assert_array_equal(ours.view(E8).astype(np.float64), np.exp2(e.astype(np.float64)))
    np.testing.assert_array_equal(oracle(name, exact, np.uint8),
                                  f32(exact / elem_max).astype(E8).view(np.uint8))
    # No element saturates: amax <= elem_max * scale.
    assert (amax.astype(np.float64) <= elem_max * ours.view(E8).astype(np.float64)).all()
    special = oracle(name, f32([np.inf, np.nan, 0.0]), np.uint8)
    np.testing.assert_array_equal(special, [255, 255, 0])


# ------------------------------------------------------------------------------ MX quantizers

def mx_groups(rng, groups):
    """groups x 32 values: normal data whose scale spreads over ~40 binades, plus zero groups."""
    x = rng.standard_normal((groups, 32)) * np.exp2(rng.uniform(-30, 10, (groups, 1)))
    x[::17] = 0.0
    return f32(x)


def test_mxfp8_quantize_matches_an_ml_dtypes_quantizer():
    rng = np.random.default_rng(RNG_SEED + 5)
    x = mx_groups(rng, 2000)
    out = oracle("mxfp8_quantize", x.reshape(-1), np.uint8)
    codes, scales = out[:x.size].reshape(x.shape), out[x.size:]
    e = round_up_scale_exponent(np.abs(x).max(axis=1), 448.0)
    np.testing.assert_array_equal(scales.astype(np.int64), e + 127)
    scaled = np.ldexp(x, -e[:, None].astype(np.int32)).astype(np.float32)  # exact: power of two
    assert (np.abs(scaled) <= 448).all()  # the round-up rule: nothing saturates
    np.testing.assert_array_equal(codes, scaled.astype(F8).view(np.uint8))


def test_mxfp8_quantize_non_finite_groups():
    x = np.ones((3, 32), dtype=np.float32)
    x[1, 4] = np.nan
    x[2, 31] = -np.inf
    out = oracle("mxfp8_quantize", x.reshape(-1), np.uint8)
    codes, scales = out[:96].reshape(3, 32), out[96:]
    # Documented: a non-finite group gets the NaN scale (255) and x / NaN -> 0x7F codes.
    np.testing.assert_array_equal(scales, [127 - 8, 255, 255])
    assert (codes[1:] == 0x7F).all()
    np.testing.assert_array_equal(codes[0], np.full(32, f32(256.0).astype(F8).view(np.uint8)))


def test_mxfp4_quantize_matches_an_ml_dtypes_quantizer():
    rng = np.random.default_rng(RNG_SEED + 6)
    x = mx_groups(rng, 2000)
    x[5, 3] = np.nan
    out = oracle("mxfp4_quantize", x.reshape(-1), np.uint8)
    packed, scales = out[:x.size // 2].reshape(x.shape[0], 16), out[x.size // 2:]
    codes = np.empty(x.shape, dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF  # low nibble = even element
    codes[:, 1::2] = packed >> 4
    finite = np.isfinite(x).all(axis=1)
    e = round_up_scale_exponent(np.abs(np.where(np.isfinite(x), x, 0)).max(axis=1), 6.0)
    np.testing.assert_array_equal(scales[finite].astype(np.int64), e[finite] + 127)
    scaled = np.ldexp(x, -e[:, None].astype(np.int32)).astype(np.float32)
    assert (np.abs(scaled[finite]) <= 6).all()
    np.testing.assert_array_equal(codes[finite], scaled[finite].astype(F4).view(np.uint8))
    # Documented: a NaN group gets the NaN scale and codes 0.
    assert scales[5] == 255 and (codes[5] == 0).all()


def test_oracle_rejects_bad_requests():
    for request in [b"no_such_command 4\n\0\0\0\0", b"e4m3_decode 8\n\0", b"mxfp8_quantize 3\n" + bytes(12)]:
        result = subprocess.run([ORACLE], input=request, capture_output=True, check=False)
        assert result.returncode == 2, request
        assert result.stderr.startswith(b"format_oracle:")
