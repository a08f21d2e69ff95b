"""GPU checks of the O store widths (``fp8_fwd_sm90_store.py``): on fresh Gaussian inputs (INT8 and e4m3 Q/K,
head_dim 128 and 64, query counts that leave a partial last tile, per-batch key lengths) the ``u16`` (the epilogue
before session 12) and ``b32`` variants' O and LSE, written into NaN-poisoned outputs, equal the shipped kernel's
(16-byte stores) bit for bit, every element written, and the float64 sanity bound of the other grid variants
holds (the shipped kernel's own float64 tests are in tests/).

    python -m pytest -q -m gpu benchmarks/experimental/test_fp8_sm90_store_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import fp8_fwd_sm90_store as ST
from sm90_gpu_cases import check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped

pytestmark = pytest.mark.gpu

CASES = [  # (B, H, Sq, Sk, D), key lengths per batch item or None
    ((1, 3, 1000, 1000, 128), None),
    ((2, 2, 777, 1200, 64), None),
    ((2, 2, 500, 900, 128), [900, 333]),
    ((1, 2, 4608, 4608, 128), None),
]


@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
@pytest.mark.parametrize("store", ["u16", "b32"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_store_equals_shipped(store, qk_int8, case):
    need_sm90()
    shape, lens = CASES[case]
    q, k, v, key_lens, prep, scale = gaussian_case(shape, seed=100 + case, lens=lens, qk_int8=qk_int8)
    o_ref, lse_ref = run_shipped(prep, scale, key_lens)
    B, H, Sq, _, D = shape
    o, lse = nan_outputs(B, Sq, H, D)
    ST.run_store(prep, scale, o, lse, store, key_lens=key_lens)
    torch.cuda.synchronize()
    assert o.isfinite().all() and lse.isfinite().all()  # every element written
    assert torch.equal(o, o_ref), (o.float() - o_ref.float()).abs().max().item()
    assert torch.equal(lse, lse_ref)
    check_float64(o, lse, q, k, v, prep, scale, lens)


def test_run_store_rejects_misaligned_out():
    need_sm90()
    q, k, v, key_lens, prep, scale = gaussian_case((1, 2, 256, 256, 128), seed=1)
    buf = torch.empty(1 * 256 * 2 * 128 + 1, dtype=torch.bfloat16, device="cuda")
    o = buf[1:].view(1, 256, 2, 128)
    lse = torch.empty((1, 2, 256), dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        ST.run_store(prep, scale, o, lse, "b128")
