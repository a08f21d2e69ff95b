"""CPU checks of fp8_accuracy_study.py's vectorized numerics model: its ``today`` variant is the library's
``fp8_attention_emulated`` (strip loop) up to a few flipped roundings, its Hadamard variant is ``rotate_qk=True``,
with nothing quantized it is the float64 reference up to the bf16 output, and the INT8 block quantizer keeps one
scale per block. If these fail, the study's table says nothing about the kernels."""

import pytest
import torch

import fp8_accuracy_study as study
from ditprof.kernels.accuracy import compare, make_inputs
from ditprof.kernels.fp8_emulation import fp8_attention_emulated
from ditprof.kernels.reference import attention_reference

BY_NAME = {v.name: v for v in study.VARIANTS}
TODAY = BY_NAME["today: emulation (32-key strips, l from fp32 P)"]
HADAMARD = BY_NAME["(i) Hadamard"]
SHAPE, SK = (1, 2, 200, 128), 300  # Sk not a multiple of the strip (32) nor of the sm90 tile (160)


@pytest.mark.parametrize("kind", ["gaussian", "k_bias", "outlier", "peaky"])
@pytest.mark.parametrize("variant, rotate", [(TODAY, False), (HADAMARD, True)], ids=["today", "hadamard"])
def test_model_is_the_emulation(kind, variant, rotate):
    q, k, v = make_inputs(kind, SHAPE, SK, seed=3)
    ours = study.run_variants(q, k, v, [variant], chunk=64)[variant.name]
    lib = fp8_attention_emulated(q, k, v, rotate_qk=rotate, qk_format="e4m3")  # the study's variants are e4m3
    # same numbers up to fp32 rounding of the alpha products (measured 1e-10..3e-5; a 160-key running max or
    # l from P8 instead would differ by 1e-3..2e-2)
    assert compare(ours, lib)["rel_rms"] < 2e-4, kind
    ref = attention_reference(q, k, v)
    assert abs(compare(ours, ref)["rel_rms"] - compare(lib, ref)["rel_rms"]) < 1e-3, kind


def test_nothing_quantized_is_the_reference():
    exact = study.Variant("exact", "test", qk="exact", p="exact", v="exact")
    sm90_like = study.Variant("exact 160", "test", qk="exact", p="exact", v="exact", strip=160, l_from="p8")
    q, k, v = make_inputs("peaky", SHAPE, SK, seed=4)
    ref = attention_reference(q, k, v)
    outs = study.run_variants(q, k, v, [exact, sm90_like], chunk=64)
    for o in outs.values():  # only the bf16 output rounding is left
        assert compare(o, ref)["rel_rms"] < 3e-3


def test_int8_block_scales():
    x = torch.randn(1, 2, 200, 128)
    x[0, 1, 70] *= 50  # one large row: only its own block of 64 gets the coarse scale
    codes, scale = study.quantize(x, "int8", "block64")
    assert codes.abs().max() <= 127 and torch.equal(codes, codes.round())
    s = scale[..., 0]
    assert torch.equal(s[:, :, :64], s[:, :, :1].expand(-1, -1, 64))
    assert s[0, 1, 64] > 10 * s[0, 1, 0] and s[0, 1, 128] < s[0, 1, 64] / 10
    assert ((codes * scale - x).abs() <= scale / 2 * (1 + 1e-6)).all()
    tok_codes, tok_scale = study.quantize(x, "int8", "token")
    assert torch.equal(tok_codes.abs().amax(dim=-1), torch.full((1, 2, 200), 127.0))


def test_linear_exp_p_byte():
    """Issue 20 lever 3's model: the byte decode is float8_e4m3fn's, and P from the linear-exp byte (P >= 2^-6 of
    the running max) is within the measured error band: RMS ~3.1 % (e4m3 rounding of the true exp: 2.6 %), mean
    within 1 %, worst 8.5 %; pad keys (P = 0) stay 0; ``lin`` every n-th column only."""
    b = torch.arange(0, 127, dtype=torch.int32)
    assert torch.equal(study.e4m3_byte_value(b), b.to(torch.uint8).view(torch.float8_e4m3fn).float())
    g = torch.Generator().manual_seed(7)
    p = torch.rand(100_000, generator=g).clamp_min(2.0 ** -6)
    rel = study.linear_exp_p(p) / p - 1
    assert float(rel.pow(2).mean().sqrt()) < 0.035 and abs(float(rel.mean())) < 0.01 and float(rel.abs().max()) < 0.085
    assert float((study.round_p(p, "e4m3") / p - 1).pow(2).mean().sqrt()) < float(rel.pow(2).mean().sqrt())
    assert float(study.linear_exp_p(torch.zeros(3)).abs().max()) == 0.0
    strip = torch.rand(2, 32, generator=g)
    mixed = study.round_p(strip, "lin", lin_every=4)
    cols = torch.arange(32) % 4 == 0
    assert torch.equal(mixed[:, cols], study.linear_exp_p(strip)[:, cols])
    assert torch.equal(mixed[:, ~cols], study.round_p(strip, "e4m3")[:, ~cols])
