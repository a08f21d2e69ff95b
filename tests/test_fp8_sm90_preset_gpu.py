"""The INT8 accumulator preset as a wgmma (``Sm90Config.mma_preset``, shipped at head_dim 128) on the GPU: the preset
is exact, so on fresh Gaussian inputs the shipped kernel's O and LSE, written into NaN-poisoned outputs, equal the
LDS-preset build's (``mma_preset=False``) bit for bit, every element written, partial last query and key tiles; the
prep's-Q build through ``launch_compiled`` (and the float64 bound), the op's launch records on the plain grid (Q in
the kernel) and the stream-K grid, bf16 and fp16.

    python -m pytest -q -m gpu tests/test_fp8_sm90_preset_gpu.py
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "experimental"))
from sm90_gpu_cases import (check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped,  # noqa: E402
                            shipped_spec)

pytestmark = pytest.mark.gpu

CASES = [(1, 3, 1000, 1000, 128), (2, 2, 777, 1200, 128), (1, 2, 4608, 4608, 128)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prep_q_build_equals_the_lds_preset(case):
    need_sm90()
    from ditprof.kernels import fp8_fwd_sm90 as K
    from ditprof.kernels.kernel_args import launch_compiled

    shape = CASES[case]
    q, k, v, _, prep, scale = gaussian_case(shape, seed=400 + case, qk_int8=True)
    o_ref, lse_ref = run_shipped(prep, scale)  # the shipped build: the wgmma preset
    B, H, Sq, Sk, D = shape
    assert K.config_for("sm_90a", D).mma_preset
    spec = shipped_spec(D, key_lens=False, qk_int8=True)
    lds = dataclasses.replace(K.config_for("sm_90a", D), mma_preset=False)
    fn = K.compile_sm90(D, "bfloat16", fake=False, tvm_ffi=spec.tvm_ffi, config=lds, qk_int8=True)
    o, lse = nan_outputs(B, Sq, H, D)
    _, used_fn = launch_compiled(spec, fn, prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, None, o, lse, B,
                                 H, prep.sq, prep.sk, scale, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert used_fn is fn  # not a fallback to the shipped kernel
    assert o_ref.isfinite().all() and lse_ref.isfinite().all()  # every element written
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    check_float64(o_ref, lse_ref, q, k, v, prep, scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("grid", ["plain", "streamk"])
def test_launch_records_equal_the_lds_preset(grid, dtype):
    """The op's record (the shipped rule, grid forced) and a second record of the same configuration whose kernel
    is the LDS-preset build: the same output bits, and that build really ran (no fallback)."""
    need_sm90()
    from mma_preset_bench import lds_record

    from ditprof.kernels import launch_record
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.fp8_config import Fp8Options

    launch_record._RECORDS.clear()
    B, S, H, D = (1, 4608, 24, 128) if grid == "streamk" else (1, 5000, 6, 128)
    g = torch.Generator(device="cuda").manual_seed(S + H)
    q, k, v = (torch.randn((B, S, H, D), device="cuda", dtype=dtype, generator=g) for _ in range(3))
    try:
        shipped, other = lds_record(q, k, v, Fp8Options(streamk=grid == "streamk"))
        assert other is not None and (other.streamk is not None) == (grid == "streamk")
        assert other.q_rot == (grid == "plain")
        fn = other.fn
        scale = 1.0 / math.sqrt(D)
        out_ref = shipped(q, k, v, scale)
        out = other(q, k, v, scale)
        finish_finite_checks()
        assert other.fn is fn
        assert out_ref.isfinite().all() and torch.equal(out, out_ref)
    finally:
        launch_record._RECORDS.clear()
