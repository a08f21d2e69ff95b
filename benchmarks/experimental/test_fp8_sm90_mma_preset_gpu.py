"""GPU checks of the INT8 accumulator preset as a wgmma (``fp8_fwd_sm90_mma_preset.py``): the preset is exact, so on
fresh Gaussian inputs the variant's O and LSE, written into NaN-poisoned outputs, equal the shipped kernel's bit for
bit (every element written), head_dim 128 and 64, partial last query and key tiles, bf16 and fp16; the prep's-Q
build through ``launch_compiled`` and the Q-in-the-kernel build through the op's launch record; the float64 sanity
bound of the other variants holds.

    python -m pytest -q -m gpu benchmarks/experimental/test_fp8_sm90_mma_preset_gpu.py
"""

from __future__ import annotations

import math

import pytest
import torch

from sm90_gpu_cases import check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped

pytestmark = pytest.mark.gpu

CASES = [(1, 3, 1000, 1000, 128), (2, 2, 777, 1200, 64), (1, 2, 4608, 4608, 128), (1, 4, 3000, 2500, 64)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prep_q_build_equals_shipped(case):
    need_sm90()
    from fp8_fwd_sm90_mma_preset import compile_mma_preset

    from ditprof.kernels.launch import launch_compiled, spec_for

    shape = CASES[case]
    q, k, v, key_lens, prep, scale = gaussian_case(shape, seed=300 + case, qk_int8=True)
    o_ref, lse_ref = run_shipped(prep, scale)
    B, H, Sq, Sk, D = shape
    spec = spec_for("fp8-sm90", "sm_90a", D, "bfloat16", True, key_lens=False, qk_int8=True)
    fn = compile_mma_preset(D, "bfloat16", fake=False, tvm_ffi=spec.tvm_ffi)
    o, lse = nan_outputs(B, Sq, H, D)
    used_spec, used_fn = launch_compiled(spec, fn, prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, None, o,
                                         lse, B, H, prep.sq, prep.sk, scale, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert used_fn is fn  # not a fallback to the shipped kernel
    assert o.isfinite().all() and lse.isfinite().all()  # every element written
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    check_float64(o, lse, q, k, v, prep, scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1, 5000, 6, 128), (1, 3700, 5, 64)], ids=["d128", "d64"])
def test_q_in_the_kernel_build_through_the_launch_record(shape, dtype, monkeypatch):
    """The op's record with Q in the kernel (the shipped rule; the plain grid forced, as the long shapes run it) and
    a second record of the same configuration whose kernel is the variant: the same output bits, and the variant
    really ran (no fallback)."""
    need_sm90()
    monkeypatch.setenv("DITPROF_FP8_STREAMK", "0")
    from mma_preset_bench import variant_record

    from ditprof.kernels import launch

    B, S, H, D = shape
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    q, k, v = (torch.randn((B, S, H, D), device="cuda", dtype=dtype, generator=g) for _ in range(3))
    shipped, variant = variant_record(q, k, v)
    assert variant is not None and variant.q_rot and variant.streamk is None
    fn = variant.fn
    scale = 1.0 / math.sqrt(D)
    out_ref = shipped(q, k, v, scale)
    out = variant(q, k, v, scale)
    launch.finish_finite_checks()
    assert variant.fn is fn
    assert out.isfinite().all() and torch.equal(out, out_ref)
