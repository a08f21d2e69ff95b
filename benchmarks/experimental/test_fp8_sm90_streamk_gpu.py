"""GPU checks of the stream-K tail variant (``fp8_fwd_sm90_streamk.py``): fresh Gaussian inputs, INT8 and e4m3
Q/K, head_dim 128 and 64, SM counts forced small so that small shapes have a tail (segments crossing tile
boundaries, a tail tile run whole), and the flux shape on the device's own SM count. Outputs NaN-poisoned: every
element written; the rows of whole work tiles equal the shipped kernel's bit for bit; everything within the float64
bound of the other grid variants; the tail rows close to the shipped kernel's (P re-quantized per piece, printed).

    python -m pytest -q -s -m gpu benchmarks/experimental/test_fp8_sm90_streamk_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import fp8_fwd_sm90_streamk as SK
from fp8_gpu_cases import rel_rms
from sm90_gpu_cases import check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped

pytestmark = pytest.mark.gpu

CASES = [  # (B, H, Sq, Sk, D), forced SM count (None: the device's)
    ((1, 2, 1000, 1000, 128), 5),
    ((2, 3, 777, 1200, 64), 7),
    ((1, 1, 1300, 300, 128), 4),  # tail tile 2 is run whole by one CTA
    ((1, 24, 4608, 4608, 128), None),
]


def _whole_rows(shape, n_full):
    """(B, Sq, H) bool: rows of work tiles < n_full (m_block fastest, then head, then batch)."""
    B, H, Sq, _, _ = shape
    n_m = -(-Sq // SK.TILE_M)
    mask = torch.zeros((B, Sq, H), dtype=torch.bool)
    for t in range(n_full):
        m, h, b = t % n_m, (t // n_m) % H, t // (n_m * H)
        mask[b, m * SK.TILE_M:(m + 1) * SK.TILE_M, h] = True
    return mask.cuda()


@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_streamk_vs_shipped_and_float64(case, qk_int8):
    need_sm90()
    shape, n_sms = CASES[case]
    q, k, v, _, prep, scale = gaussian_case(shape, seed=500 + case, qk_int8=qk_int8)
    B, H, Sq, Sk, D = shape
    o, lse = nan_outputs(B, Sq, H, D)
    n_full, n_tail, T = SK.run_streamk(prep, scale, o, lse, n_sms=n_sms)
    torch.cuda.synchronize()
    assert n_tail > 0 and T > n_tail, (n_full, n_tail, T)
    assert o.isfinite().all() and lse.isfinite().all()  # every element written
    o_ref, lse_ref = run_shipped(prep, scale)
    whole = _whole_rows(shape, n_full)
    assert torch.equal(o[whole], o_ref[whole])
    assert torch.equal(lse.transpose(1, 2)[whole], lse_ref.transpose(1, 2)[whole])
    tail = ~whole
    gap = rel_rms(o[tail], o_ref[tail])
    print(f"{shape} {'int8' if qk_int8 else 'e4m3'} plan {(n_full, n_tail, T)}: tail rows vs shipped {gap:.3%}, "
          f"LSE max {(lse - lse_ref).abs().max().item():.1e}")
    assert gap < 0.05, gap
    check_float64(o, lse, q, k, v, prep, scale)
