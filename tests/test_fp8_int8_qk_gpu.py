"""The INT8 Q/K path (``kernels.qk_format`` "int8": Hadamard-rotated Q and K, INT8 with per-row Q descales) on a
GPU, both kernels (``fp8-sm90`` native; ``fp8-sm120`` compiled for the GPU at hand, its FP8 mma.sync emulated on
Hopper), through the public entry:

- every input kind of ``ditprof kernels accuracy`` against a float64 reference, with issue 18's goals as bounds
  (the e4m3 format fails the outlier goal on the same draw, so the check can fail);
- the kernel against the numerics model (``fp8_attention_emulated(qk_format="int8")``) on the same inputs;
- per-batch key lengths, odd lengths, head_dim 64, the LSE, the op under ``DITPROF_FP8_QK=int8``, NaN inputs.

Outputs are poisoned with NaN before each run (an element the kernel does not write stays NaN). Marked ``gpu``.
"""

from __future__ import annotations

import math

import pytest
import torch

from ditprof.kernels.fp8_config import Fp8Options
from fp8_gpu_cases import poisoned_outputs, rel_rms

pytestmark = pytest.mark.gpu

KERNELS = ["fp8-sm90", "fp8-sm120"]
# issue 18's goals (rel-RMS vs float64)
GOALS = {"gaussian": 0.055, "k_bias": 0.06, "v_bias": 0.005, "outlier": 0.08, "peaky": 0.06}


def _cuda(kernel: str):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if kernel == "fp8-sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fp8-sm90 needs an sm_90a GPU (H100/H200)")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind", list(GOALS))
def test_int8_qk_meets_the_accuracy_goals(kernel, kind):
    _cuda(kernel)
    from ditprof.kernels.accuracy import make_inputs
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.interface import fp8_attention
    from ditprof.kernels.reference import attention_reference

    B, H, S, D = 1, 4, 4096, 128
    q, k, v = make_inputs(kind, (B, H, S, D), seed=5, device="cuda")
    ref = attention_reference(q, k, v)
    with poisoned_outputs(((B, S, H, D), q.dtype)) as hits:
        o = fp8_attention(q, k, v, options=Fp8Options(kernel=kernel, qk_format="int8"))
        torch.cuda.synchronize()
    assert hits["n"] >= 1 and torch.isfinite(o).all(), "output not fully written"
    err = rel_rms(o, ref)
    model = fp8_attention_emulated(q, k, v, qk_format="int8")
    model_gap = rel_rms(o, model)
    e4m3 = rel_rms(fp8_attention(q, k, v, options=Fp8Options(kernel=kernel, qk_format="e4m3")), ref)
    print(f"{kernel} {kind}: int8 {err:.3%} (model {rel_rms(model, ref):.3%}, kernel vs model {model_gap:.3%}), "
          f"e4m3 {e4m3:.3%}")
    assert err <= GOALS[kind], (kind, err)
    # the kernel computes what the model says, up to fp8-sm90's own tiling: 160-key running maxima and l summed
    # from the e4m3 P8 by the tensor cores (the model: 32-key strips, fp32 l), worth ~0.15 pp on biased V
    assert model_gap <= max(0.25 * err, 0.002), (kind, model_gap)
    if kind == "outlier":
        assert e4m3 > GOALS[kind], e4m3  # the inputs do exercise what INT8 fixes


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("D", [128, 64])
def test_int8_qk_key_lens_lse_and_odd_lengths(kernel, D):
    _cuda(kernel)
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.launch_record import fp8_call
    from ditprof.kernels.reference import attention_reference

    B, H, Sq, Sk = 3, 2, 333, 517
    g = torch.Generator(device="cuda").manual_seed(100 + D)
    q, k, v = (torch.randn((B, s, H, D), generator=g, device="cuda").to(torch.bfloat16) for s in (Sq, Sk, Sk))
    lengths = [517, 301, 7]
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    scale = 1.0 / math.sqrt(D)
    with poisoned_outputs(((B, Sq, H, D), q.dtype), ((B, H, Sq), torch.float32)) as hits:
        o, lse = fp8_call(q, k, v, scale, lens, return_lse=True, options=Fp8Options(kernel=kernel, qk_format="int8"))
        torch.cuda.synchronize()
    assert hits["n"] >= 2
    for b, n in enumerate(lengths):
        assert torch.isfinite(o[b]).all() and torch.isfinite(lse[b]).all(), f"item {b}: not fully written"
        ref, ref_lse = attention_reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], scale=scale,
                                           return_lse=True)
        model, model_lse = fp8_attention_emulated(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], return_lse=True,
                                                  qk_format="int8")
        err = rel_rms(o[b:b + 1], ref)
        lse_gap = (lse[b:b + 1] - model_lse).abs().max().item()
        lse_err = (lse[b:b + 1].double() - ref_lse).abs().max().item()
        print(f"{kernel} D={D} item {b} ({n} keys): rel-RMS {err:.3%}, vs model {rel_rms(o[b:b + 1], model):.3%}, "
              f"LSE vs model {lse_gap:.1e}, vs float64 {lse_err:.3f}")
        assert err <= 0.055, (b, err)
        # fp8-sm90's l sums the e4m3-rounded P8 (the model's l, fp32 P): ~6e-3 over hundreds of keys, and up to
        # the rounding of a few P (~2.6e-2 measured) when an item has only a handful of keys
        assert lse_gap < (1e-2 if n >= 64 else 4e-2), (b, lse_gap)
        assert lse_err < 0.05, (b, lse_err)


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_qk_through_the_op(kernel, monkeypatch):
    _cuda(kernel)
    monkeypatch.setenv("DITPROF_FP8_QK", "int8")  # the process's Q/K format; the call names only its kernel
    from ditprof.kernels.accuracy import make_inputs
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.launch_record import record_for
    from ditprof.kernels.op import options_key  # importing op registers torch.ops.ditprof.fp8_attention
    from ditprof.kernels.reference import attention_reference

    q, k, v = make_inputs("outlier", (2, 4, 1000, 128), seed=9, device="cuda")
    keep = torch.rand(2, 1000, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3)) < 0.7
    forced = Fp8Options(kernel=kernel)
    o = torch.ops.ditprof.fp8_attention(q, k, v, 0.1, None, options_key(forced))
    om = torch.ops.ditprof.fp8_attention(q, k, v, 0.1, keep, options_key(forced))
    finish_finite_checks()
    assert record_for(q, k, v, False, forced).spec.qk_int8
    assert rel_rms(o, attention_reference(q, k, v, scale=0.1)) <= GOALS["outlier"]
    for b in range(2):
        idx = keep[b].nonzero().flatten()
        ref = attention_reference(q[b:b + 1], k[b:b + 1, idx], v[b:b + 1, idx], scale=0.1)
        assert rel_rms(om[b:b + 1], ref) <= GOALS["outlier"], b
    bad = q.clone()
    bad[1, 5, 2, 7] = float("nan")
    from ditprof.errors import DitprofError

    with pytest.raises(DitprofError, match="q contains NaN or Inf"):
        torch.ops.ditprof.fp8_attention(bad, k, v, 0.1, None, options_key(forced))
        finish_finite_checks()
