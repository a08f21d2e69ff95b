"""The FP8 numerics emulation: accuracy bounds (measured, see fp8_emulation's docstring), an independent slow
implementation of the numerics spec that it must match, LSE, the quantization helpers and input validation."""

import math
import random

import numpy as np
import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels import fp8_emulation, registry
from ditprof.kernels.accuracy import compare, make_inputs
from ditprof.kernels.fp8_emulation import fp8_attention_emulated, quantize_per_head, smooth_k
from ditprof.kernels.reference import attention_reference

# Bounds from the measurements in ditprof/kernels/fp8_emulation.py (gaussian 4.9-5.3%, k_bias the same with
# smoothing and 20-23% without, peaky 7-9%).
GAUSSIAN_MAX_REL_RMS = 0.055
K_BIAS_MAX_REL_RMS = 0.055
K_BIAS_UNSMOOTHED_MIN_REL_RMS = 0.15
PEAKY_MAX_REL_RMS = 0.10
MIN_COSINE = 0.998
PEAKY_MIN_COSINE = 0.995


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


# (B, H, Sq, D), Sk: self-attention, short odd lengths, cross-attention, one key, Sk not a multiple of 32
SHAPES = [((1, 4, 1024, 128), 1024), ((2, 3, 77, 128), 77), ((1, 4, 256, 128), 77), ((1, 2, 64, 128), 1),
          ((1, 4, 256, 128), 1000)]


@pytest.mark.parametrize("shape, kv_len", SHAPES, ids=lambda x: str(x))
def test_accuracy_vs_float64(shape, kv_len):
    seed = fresh_seed()
    where = f"shape {shape}, Sk {kv_len}, seed {seed}"
    for family, max_rel, min_cos in (("gaussian", GAUSSIAN_MAX_REL_RMS, MIN_COSINE),
                                     ("k_bias", K_BIAS_MAX_REL_RMS, MIN_COSINE),
                                     ("peaky", PEAKY_MAX_REL_RMS, PEAKY_MIN_COSINE)):
        q, k, v = make_inputs(family, shape, kv_len, seed)
        m = compare(fp8_attention_emulated(q, k, v), attention_reference(q, k, v))
        assert m["rel_rms"] <= max_rel, f"{family}: {m} ({where})"
        assert m["cosine"] >= min_cos, f"{family}: {m} ({where})"


def test_k_smoothing_is_what_keeps_k_bias_accurate():
    seed = fresh_seed()
    q, k, v = make_inputs("k_bias", (1, 4, 512, 128), None, seed)
    ref = attention_reference(q, k, v)
    smoothed = compare(fp8_attention_emulated(q, k, v, smooth_k=True, qk_format="e4m3"), ref)["rel_rms"]
    raw = compare(fp8_attention_emulated(q, k, v, smooth_k=False, qk_format="e4m3"), ref)["rel_rms"]
    assert smoothed <= K_BIAS_MAX_REL_RMS and raw >= K_BIAS_UNSMOOTHED_MIN_REL_RMS, (smoothed, raw, seed)


# ------------------------------------------------------------------------------- independent implementation

def e4m3_round(x: np.ndarray) -> np.ndarray:
    """float8_e4m3fn rounding from first principles: 3 mantissa bits, min exponent -6 (subnormal step 2^-9),
    saturate at 448, round half to even (np.round). float64 arithmetic, exact (scaling by powers of two)."""
    x = np.clip(x.astype(np.float64), -448.0, 448.0)
    mag = np.abs(x)
    _, exponent = np.frexp(mag)  # mag = f * 2**exponent, f in [0.5, 1)
    step = np.ldexp(1.0, np.maximum(exponent - 1, -6) - 3)
    return (np.sign(x) * np.round(mag / step) * step).astype(np.float32)


def slow_fp8_attention(q, k, v, scale, smoothing):
    """ARCHITECTURE.md "FP8 numerics" written out per (batch, head) in numpy float32: keys zero padded to whole
    32-key strips and masked to -inf (as the kernel does), one python iteration per strip."""
    f32 = np.float32
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    n_strips = -(-Sk // 32)
    out = np.zeros((B, Sq, H, D), f32)
    lse = np.zeros((B, H, Sq), f32)
    log2e = f32(math.log2(math.e))
    for b in range(B):
        for h in range(H):
            Q, K, V = (x[b, :, h].double().numpy().astype(f32) for x in (q, k, v))
            mean = np.zeros(D, f32)
            if smoothing:
                mean = (K.astype(np.float64).sum(axis=0) / Sk).astype(f32)
                K = K - mean
            descale = []
            quantized = []
            for X in (Q, K, V):
                amax = np.abs(X).max()
                d = f32(1.0) if amax == 0 else f32(np.float64(amax) / 448.0)  # correctly rounded fp32 division
                descale.append(d)
                quantized.append(e4m3_round(X / d))
            Q8, K8, V8 = quantized
            K8 = np.concatenate([K8, np.zeros((n_strips * 32 - Sk, D), f32)])
            V8 = np.concatenate([V8, np.zeros((n_strips * 32 - Sk, D), f32)])
            qk_scale = f32(descale[0] * descale[1]) * f32(scale * math.log2(math.e))
            m = np.full(Sq, -np.inf, f32)
            l = np.zeros(Sq, f32)
            O = np.zeros((Sq, D), f32)
            for j in range(n_strips):
                keys = slice(32 * j, 32 * j + 32)
                S = (Q8 @ K8[keys].T) * qk_scale
                S[:, np.arange(32 * j, 32 * j + 32) >= Sk] = -np.inf
                m_new = np.maximum(m, S.max(axis=1))
                alpha = np.exp2(m - m_new)
                P = np.exp2(S - m_new[:, None])
                l = l * alpha + P.sum(axis=1)
                O = O * alpha[:, None] + e4m3_round(P * f32(256.0)) @ V8[keys]
                m = m_new
            out[b, :, h] = O * ((descale[2] / f32(256.0)) / l)[:, None]
            lse[b, h] = m / log2e + np.log(l) + f32(scale) * (Q @ mean)
    return out, lse


def test_e4m3_helper_matches_torch_cast():
    x = torch.cat([torch.randn(10000) * s for s in (1e-3, 0.05, 1.0, 30.0, 300.0)])
    x = torch.cat([x, torch.tensor([0.0, 448.0, -448.0, 2.0**-9, 3 * 2.0**-10, 2.0**-10, 17.0, 19.0])])
    assert torch.equal(torch.from_numpy(e4m3_round(x.numpy())), x.to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("smoothing", [True, False])
@pytest.mark.parametrize("B, H, Sq, Sk, D", [(2, 3, 77, 77, 128), (1, 2, 40, 45, 64), (1, 1, 5, 1, 32)])
def test_vectorized_emulation_matches_the_slow_spec(B, H, Sq, Sk, D, smoothing):
    torch.manual_seed(Sq + Sk)
    q = torch.randn(B, Sq, H, D)
    k = torch.randn(B, Sk, H, D) + torch.randn(B, 1, H, D) * 4  # a channel bias so smoothing matters
    v = torch.randn(B, Sk, H, D)
    scale = 0.7 / math.sqrt(D)
    out, lse = fp8_attention_emulated(q, k, v, scale=scale, smooth_k=smoothing, return_lse=True, qk_format="e4m3")
    slow_out, slow_lse = slow_fp8_attention(q, k, v, scale, smoothing)
    slow_out = torch.from_numpy(slow_out)
    # Differences come only from fp32 summation order; a flipped e4m3 rounding of one P would show as ~1e-3.
    assert compare(out, slow_out)["rel_rms"] < 1e-5
    assert (lse - torch.from_numpy(slow_lse)).abs().max().item() < 1e-4


# ------------------------------------------------------------------------------- LSE

@pytest.mark.parametrize("family, smoothing", [("gaussian", True), ("gaussian", False), ("k_bias", True)])
def test_lse_matches_float64(family, smoothing):
    q, k, v = make_inputs(family, (1, 3, 100, 128), 70, seed=fresh_seed())
    _, lse = fp8_attention_emulated(q, k, v, smooth_k=smoothing, return_lse=True)
    _, ref_lse = attention_reference(q, k, v, return_lse=True)
    assert lse.shape == (1, 3, 100) and lse.dtype == torch.float32
    # LSE values are O(5) (k_bias: O(35), smoothing shift added back); FP8 score rounding moves them by
    # 0.02-0.08 at most over 300 rows (measured over 45 seeds)
    assert (lse.double() - ref_lse).abs().max().item() < 0.15


def test_lse_of_unsmoothed_k_bias_shows_the_damage():
    q, k, v = make_inputs("k_bias", (1, 3, 100, 128), 70, seed=fresh_seed())
    _, lse = fp8_attention_emulated(q, k, v, smooth_k=False, return_lse=True, qk_format="e4m3")
    _, ref_lse = attention_reference(q, k, v, return_lse=True)
    assert (lse.double() - ref_lse).abs().max().item() > 0.3  # measured 0.5-1.1


# ------------------------------------------------------------------------------- quantization helpers

def test_quantize_per_head_maps_each_heads_amax_to_448():
    x = torch.randn(2, 3, 50, 16) * torch.tensor([1.0, 10.0, 1e-3])[None, :, None, None]
    x8, descale = quantize_per_head(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 3)
    assert torch.equal(x8.float().abs().amax(dim=(2, 3)), torch.full((2, 3), 448.0))
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for values in the normal range
    back = x8.float() * descale[:, :, None, None]
    normal = x.abs() >= 2.0**-6 * descale[:, :, None, None]
    assert ((back - x).abs() <= x.abs() * 2.0**-4)[normal].all()


def test_quantize_all_zero_head_has_descale_one():
    x8, descale = quantize_per_head(torch.zeros(1, 2, 8, 16))
    assert torch.equal(descale, torch.ones(1, 2)) and not x8.float().any()


def test_smooth_k_removes_the_per_channel_mean():
    k = (torch.randn(2, 3, 40, 16) + 5.0).bfloat16()
    smoothed, mean = smooth_k(k)
    assert smoothed.dtype == torch.float32 and mean.shape == (2, 3, 16)
    assert torch.equal(mean, k.double().mean(dim=2).float())
    assert smoothed.mean(dim=2).abs().max().item() < 1e-5


# ------------------------------------------------------------------------------- contract and bad input

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_output_shape_dtype_and_backend_registration(dtype):
    q = torch.randn(2, 10, 3, 64, dtype=dtype)
    k = torch.randn(2, 33, 3, 64, dtype=dtype)
    out = fp8_attention_emulated(q, k, k)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(registry.get("fp8-emulated")(q, k, k), out)


def test_query_chunking_changes_nothing(monkeypatch):
    q, k, v = make_inputs("gaussian", (2, 2, 100, 64), 50, seed=1)
    whole, whole_lse = fp8_attention_emulated(q, k, v, return_lse=True)
    monkeypatch.setattr(fp8_emulation, "_CHUNK_BYTES", 2 * 2 * 64 * 4 * 16)  # 16 queries per chunk
    chunked, chunked_lse = fp8_attention_emulated(q, k, v, return_lse=True)
    assert torch.equal(whole, chunked) and torch.equal(whole_lse, chunked_lse)


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_is_named(which, bad):
    x = {name: torch.randn(1, 8, 2, 32, dtype=torch.bfloat16) for name in "qkv"}
    x[which][0, 3, 1, 5] = bad
    with pytest.raises(DitprofError, match=f"^{which} contains NaN/Inf$"):
        fp8_attention_emulated(x["q"], x["k"], x["v"])


@pytest.mark.parametrize("q_shape, k_shape, v_shape, dtype, message", [
    ((1, 8, 2, 32), (1, 8, 2, 32), (1, 8, 2, 32), torch.int32, "q must be bfloat16, float16 or float32"),
    ((8, 2, 32), (1, 8, 2, 32), (1, 8, 2, 32), torch.bfloat16, r"q must be 4-D \(B, S, H, D\)"),
    ((1, 8, 2, 32), (1, 8, 3, 32), (1, 8, 3, 32), torch.bfloat16, "must agree in batch, heads and head_dim"),
    ((1, 8, 2, 32), (1, 8, 2, 32), (1, 9, 2, 32), torch.bfloat16, "k and v must have the same shape"),
    ((1, 0, 2, 32), (1, 8, 2, 32), (1, 8, 2, 32), torch.bfloat16, "empty input"),
])
def test_bad_input_is_a_one_line_error(q_shape, k_shape, v_shape, dtype, message):
    q, k, v = (torch.ones(s).to(dtype) for s in (q_shape, k_shape, v_shape))
    with pytest.raises(DitprofError, match=message):
        fp8_attention_emulated(q, k, v)


@pytest.mark.gpu
def test_cuda_emulation_matches_cpu():
    q, k, v = make_inputs("k_bias", (1, 4, 300, 128), 250, seed=2)
    cpu = fp8_attention_emulated(q, k, v)
    gpu = fp8_attention_emulated(q.cuda(), k.cuda(), v.cuda()).cpu()
    assert compare(gpu, cpu.float())["rel_rms"] < 1e-2


# ------------------------------------------------------------------ the accumulator model (sm_89 / sm_120 mma.sync)

def test_truncate_mantissa():
    from ditprof.kernels.fp8_emulation import truncate_mantissa

    x = torch.tensor([1.0, 1.0 + 2 ** -13, 1.0 + 2 ** -14, -3.14159265, 0.0])
    out = truncate_mantissa(x, 13).tolist()
    assert out[:3] == [1.0, 1.0 + 2 ** -13, 1.0] and out[3] == -3.141357421875 and out[4] == 0.0


def test_narrow_accumulator_loses_a_biased_v_across_strips_and_promotion_keeps_it():
    """V with mean +6 over 8192 keys (256 strips): a 13-bit accumulator holding O across strips drops each strip's
    small contribution's low bits every time (the loss grows with the key count); a fresh accumulator per strip
    added in FP32 (two-level accumulation) stays at the FP32 result. A model of sm_89 / sm_120 hardware we have not
    run (docs/ARCHITECTURE.md)."""
    from ditprof.kernels.accuracy import make_inputs
    from ditprof.kernels.reference import attention_reference

    q, k, v = make_inputs("v_bias", (1, 1, 8192, 128), seed=5)
    q = q[:, :128]
    ref = attention_reference(q, k, v)

    def rel(o):
        return float((o.double() - ref).norm() / ref.norm())

    exact = fp8_attention_emulated(q, k, v)
    assert torch.equal(fp8_attention_emulated(q, k, v, acc_bits=None), exact)
    across = rel(fp8_attention_emulated(q, k, v, acc_bits=13, acc_promote=False))
    promoted = rel(fp8_attention_emulated(q, k, v, acc_bits=13, acc_promote=True))
    assert rel(exact) <= 0.005 and promoted <= 0.005
    assert across > 2 * promoted, (across, promoted)


def test_hadamard_rotation_spreads_qk_outliers():
    """The rotation is orthogonal (scores unchanged in exact arithmetic) and takes the outlier family's FP8 error
    from ~40 % to under 10 % without hurting the Gaussian case (issue 18's goal, <= 8 %, needs more)."""
    from ditprof.kernels.accuracy import make_inputs
    from ditprof.kernels.fp8_emulation import hadamard_rotation
    from ditprof.kernels.reference import attention_reference

    r = hadamard_rotation(128, seed=3).double()
    torch.testing.assert_close(r @ r.T, torch.eye(128, dtype=torch.float64), rtol=0, atol=1e-6)
    with pytest.raises(DitprofError, match="power-of-two head_dim"):
        hadamard_rotation(96)

    def rel(o, ref):
        return float((o.double() - ref).norm() / ref.norm())

    errors = {}
    for family in ("outlier", "gaussian"):
        q, k, v = make_inputs(family, (1, 2, 512, 128), seed=2)
        ref = attention_reference(q, k, v)
        errors[family] = (rel(fp8_attention_emulated(q, k, v, qk_format="e4m3"), ref),
                          rel(fp8_attention_emulated(q, k, v, rotate_qk=True), ref))
    plain, rotated = errors["outlier"]
    assert plain > 0.25 and rotated < 0.10, errors
    assert errors["gaussian"][1] <= 0.055 and abs(errors["gaussian"][1] - errors["gaussian"][0]) < 0.005, errors


# ------------------------------------------------------------------------------- INT8 Q/K (issue 18's decision)

# issue 18's goals (rel-RMS vs float64); the study (benchmarks/NOTES.md, session 8) measured gaussian 3.8 %,
# k_bias 3.8 %, v_bias 0.28 %, outlier 3.2 %, peaky 3.8 % for this mode
INT8_GOALS = {"gaussian": 0.055, "k_bias": 0.06, "v_bias": 0.005, "outlier": 0.08, "peaky": 0.06}


@pytest.mark.parametrize("sq, sk", [(512, 1024), (1024, 1000)])
def test_int8_qk_meets_the_goals_and_e4m3_does_not(sq, sk):
    seed = fresh_seed()
    errors = {}
    for family, goal in INT8_GOALS.items():
        q, k, v = make_inputs(family, (1, 2, sq, 128), sk, seed)
        ref = attention_reference(q, k, v)
        errors[family] = compare(fp8_attention_emulated(q, k, v, qk_format="int8"), ref)["rel_rms"]
        if family == "outlier":  # the test can fail: e4m3 Q/K misses this goal by far
            e4m3 = compare(fp8_attention_emulated(q, k, v, qk_format="e4m3"), ref)["rel_rms"]
            assert e4m3 > goal, (e4m3, seed)
    for family, goal in INT8_GOALS.items():
        assert errors[family] <= goal, (family, errors, seed)


def test_int8_emulation_quantizes_as_the_prep_does():
    """One numerics definition: the emulation's codes and scales are the torch prep's (qk_int8=True)."""
    from ditprof.kernels import prep

    q, k, v = make_inputs("outlier", (2, 3, 77, 128), 130, seed=4)
    res = prep.fp8_prepare_torch(q, k, v, qk_int8=True)
    qr, kr = prep.rotate_qk(q.transpose(1, 2), k.transpose(1, 2))
    kr, mu = smooth_k(kr)
    assert torch.equal(prep.k_mean_original_basis(mu), res.k_mean)
    qs = prep.int8_descale(qr.abs().amax(dim=3))
    assert torch.equal(qs, res.q_scales[:, :, :77])
    assert torch.equal(prep.quantize_int8(qr, qs[..., None]), res.q8[:, :, :77])
    dk = prep.int8_descale(kr.abs().amax(dim=(2, 3)))
    assert torch.equal(dk, res.scales[..., 1])
    assert torch.equal(prep.quantize_int8(kr, dk[..., None, None]), res.k8[:, :, :130])


def test_int8_key_mask_lse_and_errors():
    q, k, v = make_inputs("peaky", (2, 2, 64, 64), 96, seed=7)
    mask = torch.ones(2, 96, dtype=torch.bool)
    mask[1, 50:] = False
    o, lse = fp8_attention_emulated(q, k, v, key_mask=mask, return_lse=True, qk_format="int8")
    o1, lse1 = fp8_attention_emulated(q[1:], k[1:, :50], v[1:, :50], return_lse=True, qk_format="int8")
    assert torch.equal(o[1:], o1) and torch.equal(lse[1:], lse1)
    # the LSE (smoothing corrected with the mean in the original basis: O(35) on k_bias) is the float64 one;
    # measured 0.006-0.010 smoothed, 0.15-0.19 without (e4m3: 0.02-0.04, 0.57-0.83; seeds 0-5)
    qb, kb, vb = make_inputs("k_bias", (1, 3, 100, 128), 70, seed=fresh_seed())
    _, ref_lse = attention_reference(qb, kb, vb, return_lse=True)
    for smoothing in (True, False):
        _, lse = fp8_attention_emulated(qb, kb, vb, smooth_k=smoothing, return_lse=True, qk_format="int8")
        assert float((lse.double() - ref_lse).abs().max()) < (0.03 if smoothing else 0.4), smoothing
    with pytest.raises(DitprofError, match="qk_format must be"):
        fp8_attention_emulated(q, k, v, qk_format="int4")
    with pytest.raises(DitprofError, match="rotate_qk"):
        fp8_attention_emulated(q, k, v, qk_format="int8", rotate_qk=True)
    for which in "qkv":
        qq, kk, vv = (x.clone() for x in (q, k, v))
        {"q": qq, "k": kk, "v": vv}[which][0, 1, 0, 0] = float("nan")
        with pytest.raises(DitprofError, match=f"^{which} contains NaN/Inf$"):
            fp8_attention_emulated(qq, kk, vv, qk_format="int8")


def test_default_format_is_int8_where_the_rotation_applies(monkeypatch):
    """No format named (call or DITPROF_FP8_QK): INT8 for power-of-two head dims >= 16, e4m3 for the others; the
    emulation's default is the process default for its head_dim; DITPROF_FP8_QK overrides; a bad name is one line."""
    from ditprof.kernels.qk_format import qk_format

    monkeypatch.delenv("DITPROF_FP8_QK", raising=False)
    assert [qk_format(head_dim=d) for d in (16, 64, 128, 256)] == ["int8"] * 4
    assert [qk_format(head_dim=d) for d in (8, 12, 24, 96)] == ["e4m3"] * 4
    assert qk_format() == "int8" and qk_format("e4m3", 128) == "e4m3"
    q, k, v = make_inputs("gaussian", (1, 2, 64, 128), 80, seed=fresh_seed())
    assert torch.equal(fp8_attention_emulated(q, k, v), fp8_attention_emulated(q, k, v, qk_format="int8"))
    assert not torch.equal(fp8_attention_emulated(q, k, v), fp8_attention_emulated(q, k, v, qk_format="e4m3"))
    q12, k12, v12 = (x[..., :12].contiguous() for x in (q, k, v))
    assert torch.equal(fp8_attention_emulated(q12, k12, v12), fp8_attention_emulated(q12, k12, v12, qk_format="e4m3"))
    monkeypatch.setenv("DITPROF_FP8_QK", "e4m3")
    assert qk_format(head_dim=128) == "e4m3"
    assert torch.equal(fp8_attention_emulated(q, k, v), fp8_attention_emulated(q, k, v, qk_format="e4m3"))
    monkeypatch.setenv("DITPROF_FP8_QK", "fp4")
    with pytest.raises(DitprofError, match="^unknown fp8 Q/K format 'fp4'; known: e4m3, int8$"):
        qk_format(head_dim=128)
