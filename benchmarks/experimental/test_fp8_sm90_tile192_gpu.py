"""GPU checks of fp8-sm90 at head_dim 64 with 192-key tiles (``tile_n_bench.py``'s build): fresh Gaussian inputs,
INT8 and e4m3 Q/K, query and key counts that leave partial last tiles (a last key tile of 1 key included),
NaN-poisoned outputs: every element written, within the float64 bound of the other grid variants, and within
no less accurate than the shipped 160-key kernel on the same prep (printed: both errors and their gap).

    python -m pytest -q -m gpu benchmarks/experimental/test_fp8_sm90_tile192_gpu.py
"""

from __future__ import annotations

import pytest

from fp8_gpu_cases import rel_rms
from sm90_gpu_cases import check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped
from tile_n_bench import launch_tile

pytestmark = pytest.mark.gpu

CASES = [(1, 3, 1000, 1000, 64), (2, 2, 777, 193, 64), (1, 4, 2000, 4033, 64)]


@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_tile192_vs_float64_and_shipped(case, qk_int8):
    need_sm90()
    q, k, v, _, prep, scale = gaussian_case(CASES[case], seed=300 + case, qk_int8=qk_int8)
    B, H, Sq, _, D = CASES[case]
    o, lse = nan_outputs(B, Sq, H, D)
    launch_tile(prep, scale, o, lse, 192)
    import torch

    torch.cuda.synchronize()
    assert o.isfinite().all() and lse.isfinite().all()
    check_float64(o, lse, q, k, v, prep, scale)
    from ditprof.kernels.reference import attention_reference

    o_ship, _ = run_shipped(prep, scale)
    ref = attention_reference(q, k, v, scale)
    err, err_ship = rel_rms(o, ref), rel_rms(o_ship, ref)
    print(f"{CASES[case]} {'int8' if qk_int8 else 'e4m3'}: rel-RMS vs float64 {err:.3%} (shipped {err_ship:.3%}), "
          f"vs shipped {rel_rms(o, o_ship):.3%}")
    assert err <= 1.1 * err_ship + 1e-3, (err, err_ship)  # no less accurate than the shipped tiles
