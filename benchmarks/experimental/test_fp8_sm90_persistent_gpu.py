"""The persistent fp8-sm90 variant (``fp8_fwd_sm90_persistent.py``) on an sm_90 GPU, on the shared prep's tensors:
outputs and LSE poisoned with NaN before each run (every element must be written), bit for bit against the shipped
kernel on the same prep, and against float64 on fresh random inputs. Shapes: flux and ltx (the short shapes it is
for), an odd length, B=2, cross-attention both ways, per-batch key lengths, more work tiles than CTAs (down to one
CTA) and fewer (idle CTAs). Marked ``gpu``; skipped without CUDA and on GPUs other than sm_90.

    python -m pytest -q -m gpu benchmarks/experimental/test_fp8_sm90_persistent_gpu.py

Why bit-identical: every query row goes through the same instructions in the same order in both kernels (the same
wgmma shapes and k-block order, the same per-tile softmax, promotion and epilogue: the persistent kernel calls the
shipped class's methods, and the CPU SASS test checks that its key-tile loop has the same wgmma, MUFU, FFMA,
FMNMX and F2FP instructions). Only which CTA runs a work tile, and when, differs; nothing is reduced across
CTAs. So the check is ``torch.equal``; a difference of any size means a race (a Q or K/V buffer refilled too early,
a pipeline phase wrong across work tiles), not rounding.
"""

from __future__ import annotations

import pytest
import torch
from fp8_gpu_cases import rel_rms
from sm90_gpu_cases import check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped

pytestmark = pytest.mark.gpu

# (B, H, Sq, Sk, D)
SHAPES = {
    "flux": (1, 24, 4608, 4608, 128),  # 576 work tiles > 132 CTAs
    "ltx": (1, 32, 7392, 7392, 64),  # 1248 work tiles
    "s3001": (1, 4, 3001, 3001, 128),  # odd length: the last query block and the last key tile are partial
    "b2": (2, 6, 1537, 1537, 64),
    "cross4096x333": (1, 8, 4096, 333, 128),  # Sq > Sk: 3 key tiles, the last one of 13 keys
    "cross200x5000": (2, 4, 200, 5000, 64),  # Sq < Sk: 2 query blocks per head, 32 key tiles each
}


def _run_persistent(prep, scale, key_lens=None, num_ctas=None, tvm_ffi=None):
    from fp8_fwd_sm90_persistent import run_persistent

    B, H, _, D = prep.q8.shape
    o, lse = nan_outputs(B, prep.sq, H, D)
    grid = run_persistent(prep.q8, prep.k8, prep.v8t, prep.scales, prep.sq, prep.sk, scale, o, lse,
                          key_lens=key_lens, num_ctas=num_ctas, tvm_ffi=tvm_ffi)
    torch.cuda.synchronize()
    return o, lse, grid


def _check(shape, seed, lens=None, num_ctas=None, expect_grid=None):
    need_sm90()
    q, k, v, key_lens, prep, scale = gaussian_case(shape, seed, lens)
    o, lse, grid = _run_persistent(prep, scale, key_lens, num_ctas)
    if expect_grid is not None:
        assert grid == expect_grid
    assert torch.isfinite(o).all(), "output not fully written (NaN poison left) or non-finite"
    assert torch.isfinite(lse).all(), "LSE not fully written"
    o0, lse0 = run_shipped(prep, scale, key_lens)
    assert torch.isfinite(o0).all() and torch.isfinite(lse0).all()
    assert torch.equal(o, o0) and torch.equal(lse, lse0), (
        "persistent != shipped", rel_rms(o, o0), (lse - lse0).abs().max().item(),
        (o != o0).any(-1).any(-1).nonzero()[:8].tolist())
    check_float64(o, lse, q, k, v, prep, scale, lens)


@pytest.mark.parametrize("name", list(SHAPES))
def test_persistent_default_grid(name):
    """Default grid (SM count, at most the work tiles)."""
    from fp8_fwd_sm90_persistent import default_num_ctas, work_tiles

    B, H, Sq, _, _ = SHAPES[name]
    expect = default_num_ctas(torch.device("cuda"), work_tiles(B, H, Sq)) if torch.cuda.is_available() else None
    _check(SHAPES[name], seed=list(SHAPES).index(name), expect_grid=expect)


@pytest.mark.parametrize("num_ctas", [1, 7, 131, 132, 133, 500],
                         ids=lambda n: f"ctas{n}")
def test_persistent_grid_sizes(num_ctas):
    """Explicit grids on (2, 3, 3001, 3001, 128), 96 work tiles: one CTA for everything (Q buffers and ring phases
    reused 96 times), a few CTAs with ~14 tiles each, and more CTAs than tiles (idle CTAs exit at once)."""
    _check((2, 3, 3001, 3001, 128), seed=num_ctas, num_ctas=num_ctas)


@pytest.mark.parametrize("D", [128, 64])
def test_persistent_fewer_tiles_than_ctas(D):
    """(1, 2, 300, 300): 4 work tiles on the SM count's grid (the default grid clamps to 4; 132 explicit)."""
    shape = (1, 2, 300, 300, D)
    _check(shape, seed=D, expect_grid=4)
    _check(shape, seed=D + 1, num_ctas=132, expect_grid=132)


# 1200 keys: all; 701: partial last tile; 97 and 33: one tile; 321 = 2 * 160 + 1: one key in the last tile
KEY_LENS = [1200, 701, 97, 33, 321]


@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("num_ctas", [None, 3], ids=["default-grid", "ctas3"])
def test_persistent_key_lens(D, num_ctas):
    """Per-batch key lengths read on the device: work tiles of different lengths (1 to 8 key tiles) interleaved
    on the same CTAs; against the shipped kernel and float64 over each item's first key_lens[b] keys."""
    _check((len(KEY_LENS), 3, 1000, 1200, D), seed=11 + D, lens=KEY_LENS, num_ctas=num_ctas)


def test_persistent_deterministic():
    need_sm90()
    _, _, _, _, prep, scale = gaussian_case((1, 24, 4608, 4608, 128), seed=5)
    o1, l1, _ = _run_persistent(prep, scale)
    o2, l2, _ = _run_persistent(prep, scale, num_ctas=97)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_persistent_jit_launch_matches_default():
    """cute's JIT executor (the fallback when TVM-FFI is missing or fails) runs the same kernel: same bits."""
    need_sm90()
    _, _, _, _, prep, scale = gaussian_case((2, 3, 1000, 777, 128), seed=6)
    o1, l1, _ = _run_persistent(prep, scale)
    o2, l2, _ = _run_persistent(prep, scale, tvm_ffi=False)
    assert torch.isfinite(o2).all() and torch.equal(o1, o2) and torch.equal(l1, l2)
