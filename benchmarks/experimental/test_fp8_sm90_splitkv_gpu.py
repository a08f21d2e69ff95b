"""The split-KV tail variant of fp8-sm90 (``fp8_fwd_sm90_splitkv.py`` + ``splitkv_merge.py``) on an sm_90 GPU, on
the shared prep's tensors, e4m3 and INT8 Q/K. Marked ``gpu``; skipped without CUDA and on GPUs other than sm_90.

    python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_splitkv_gpu.py

What each check means (the plan is ``splits_for`` on 132 SMs, the H200's, whatever the GPU, so the shapes below
always have a tail):

* every output and LSE element written and finite: out and lse are NaN before the run, and the kernel's workspace
  is NaN-poisoned at allocation (``poisoned_outputs``), so a part row left unwritten poisons its merged row;
* rows of full work tiles ``torch.equal`` to the shipped kernel's (the same instructions on the same data);
* tail rows against an exact model of the split: the shipped kernel run on each part's key slice (K/V copied out at
  multiples of 160 keys; its O and LSE are bit for bit what that part writes to the workspace), merged in float64:
  rel-RMS < 2e-3 (what is left is the fp32 merge and the final bf16 rounding; a key tile lost, doubled or wrongly
  masked shows up here);
* tail rows against the shipped kernel only loosely: P's e4m3 bytes are quantized against each part's own running
  max, not the whole row's, so the rounding noise of P is drawn again (a CPU model of flux rows: 2.0 % rel-RMS with
  2 parts, 3.1 % with 29; vs float64 the split is as accurate as the shipped kernel). LSE within 0.02 of it;
* everything against float64 (``attention_reference``) on fresh random inputs, with the persistent test's bounds.
"""

from __future__ import annotations

import pytest
import torch
from fp8_gpu_cases import poisoned_outputs, rel_rms
from sm90_gpu_cases import check_float64, gaussian_case, nan_outputs, need_sm90, run_shipped

pytestmark = pytest.mark.gpu

SMS = 132  # the plan is the H200's on any sm_90 GPU
TILE_M, TILE_N = 192, 160

# (B, H, Sq, Sk, D) -> the plan on 132 SMs
SHAPES = {
    "flux": ((1, 24, 4608, 4608, 128), (528, 48, 2)),  # 576 tiles = 4 x 132 + 48: 48 tail tiles x 2 parts
    "all-split12": ((1, 1, 2000, 3000, 128), (0, 11, 12)),  # 11 tiles < 132: every tile in 12 parts
    "cross16-d64": ((1, 14, 1900, 2500, 64), (132, 8, 16)),  # partial last m_block (172 rows), last key tile 100
    "b2-onetile": ((2, 10, 1200, 1500, 128), (132, 8, 10)),  # 10 key tiles, 10 parts: one key tile per part
}
FORMATS = ["e4m3", "int8"]
EXACT_REL_RMS = 2e-3
VS_SHIPPED_REL_RMS = 0.045


def _case(shape, fmt, seed, lens=None):
    return gaussian_case(shape, seed, lens, qk_int8=fmt == "int8")


def _run_split(prep, scale, key_lens=None, plan=None):
    from fp8_fwd_sm90_splitkv import plan_for, run_splitkv

    B, H, _, D = prep.q8.shape
    o, lse = nan_outputs(B, prep.sq, H, D)
    n_full, n_tail, splits = plan or plan_for(prep.q8.device, B, H, prep.sq, prep.sk, n_sms=SMS)
    ws = [((splits, n_tail, TILE_M, D), torch.bfloat16), ((splits, n_tail, TILE_M), torch.float32)]
    with poisoned_outputs(*ws) as hits:
        used = run_splitkv(prep.q8, prep.k8, prep.v8t, prep.scales, prep.sq, prep.sk, scale, o, lse,
                           key_lens=key_lens, q_scales=prep.q_scales, plan=(n_full, n_tail, splits))
    torch.cuda.synchronize()
    assert used == (n_full, n_tail, splits)
    assert hits["n"] == (2 if n_tail else 0)  # the workspace was poisoned (and only then used)
    return o, lse


def _tail_rows(B, H, sq, plan):
    """(B, Sq, H) bool: the rows of the plan's tail work tiles."""
    from fp8_fwd_sm90_splitkv import work_coords

    n_full, n_tail, _ = plan
    n_m = -(-sq // TILE_M)
    mask = torch.zeros((B, sq, H), dtype=torch.bool, device="cuda")
    for t in range(n_full, n_full + n_tail):
        m, h, b = work_coords(t, n_m, H)
        mask[b, m * TILE_M:(m + 1) * TILE_M, h] = True
    return mask


def _exact_split_model(prep, scale, plan):
    """The split's output without the split kernel: the shipped kernel on each part's key slice (what that part
    computes, bit for bit), merged in float64. (O (B,Sq,H,D), LSE (B,H,Sq)) float64."""
    from fp8_fwd_sm90_splitkv import key_tiles, part_range

    _, _, splits = plan
    n_kt = key_tiles(prep.sk)
    o_parts, lse_parts = [], []
    for p in range(splits):
        begin, end = part_range(p, splits, n_kt)
        lo, hi = begin * TILE_N, min(end * TILE_N, prep.k8.shape[2])
        o, lse = run_shipped(prep, scale, k8=prep.k8[:, :, lo:hi].contiguous(),
                             v8t=prep.v8t[..., lo:hi].contiguous(), sk=min(prep.sk, end * TILE_N) - lo)
        o_parts.append(o.double())
        lse_parts.append(lse.double())
    lse = torch.logsumexp(torch.stack(lse_parts), 0)
    w = [torch.exp(lp - lse).transpose(1, 2)[..., None] for lp in lse_parts]  # (B, Sq, H, 1)
    return sum(wi * oi for wi, oi in zip(w, o_parts)), lse


def _check_tail_vs_shipped(o, lse, o0, lse0, tail):
    """Tail rows: close to the shipped kernel's (P re-quantized per part: a few % rel-RMS), LSE within 0.02."""
    err = rel_rms(o[tail], o0[tail])
    assert err < VS_SHIPPED_REL_RMS, err
    lse_diff = (lse.transpose(1, 2)[tail] - lse0.transpose(1, 2)[tail]).abs().max().item()
    assert lse_diff < 0.02, lse_diff


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_splitkv(name, fmt):
    need_sm90()
    shape, expect_plan = SHAPES[name]
    B, H, Sq, Sk, D = shape
    q, k, v, _, prep, scale = _case(shape, fmt, seed=list(SHAPES).index(name) + 10 * FORMATS.index(fmt))
    from fp8_fwd_sm90_splitkv import plan_for

    plan = plan_for(prep.q8.device, B, H, Sq, Sk, n_sms=SMS)
    assert plan == expect_plan
    o, lse = _run_split(prep, scale)
    assert torch.isfinite(o).all(), "output not fully written (NaN poison left) or non-finite"
    assert torch.isfinite(lse).all(), "LSE not fully written"
    o0, lse0 = run_shipped(prep, scale)
    tail = _tail_rows(B, H, Sq, plan)
    full = ~tail
    assert torch.equal(o[full], o0[full]), ("full tiles differ", rel_rms(o[full], o0[full]))
    assert torch.equal(lse.transpose(1, 2)[full], lse0.transpose(1, 2)[full])
    o_model, lse_model = _exact_split_model(prep, scale, plan)
    err = rel_rms(o[tail], o_model[tail])
    assert err < EXACT_REL_RMS, ("tail rows vs the per-part shipped model", err)
    lse_err = (lse.transpose(1, 2)[tail].double() - lse_model.transpose(1, 2)[tail]).abs().max().item()
    assert lse_err < 1e-4, lse_err
    _check_tail_vs_shipped(o, lse, o0, lse0, tail)
    check_float64(o, lse, q, k, v, prep, scale)


# 1200 keys: all 8 key tiles; 321: 3 key tiles (5 of 8 parts empty), one key in the last; 33: one tile (7 empty)
KEY_LENS = [1200, 321, 33]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("D", [128, 64])
def test_splitkv_key_lens_empty_parts(D, fmt):
    """Every work tile split in 8 parts (an explicit plan): items with fewer key tiles than parts get empty parts
    (LSE -inf, O 0 in the workspace) that must not poison the merge; per-part masking on each item's last tile."""
    need_sm90()
    shape = (len(KEY_LENS), 4, 1000, 1200, D)
    q, k, v, key_lens, prep, scale = _case(shape, fmt, seed=40 + D, lens=KEY_LENS)
    n_tiles = -(-1000 // TILE_M) * 4 * len(KEY_LENS)
    o, lse = _run_split(prep, scale, key_lens, plan=(0, n_tiles, 8))
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    o0, lse0 = run_shipped(prep, scale, key_lens)
    _check_tail_vs_shipped(o, lse, o0, lse0, torch.ones(o.shape[:3], dtype=torch.bool, device="cuda"))
    check_float64(o, lse, q, k, v, prep, scale, KEY_LENS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_splitkv_key_lens_default_plan(fmt):
    """key_lens with the default plan (full tiles + a split tail): full tiles bit-identical to the shipped ones."""
    need_sm90()
    lens = [4608, 3001]
    shape = (2, 12, 4608, 4608, 128)  # 576 tiles, the flux plan: the tail is batch item 1's last 48 tiles
    q, k, v, key_lens, prep, scale = _case(shape, fmt, seed=50, lens=lens)
    o, lse = _run_split(prep, scale, key_lens)
    o0, lse0 = run_shipped(prep, scale, key_lens)
    tail = _tail_rows(2, 12, 4608, (528, 48, 2))
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert torch.equal(o[~tail], o0[~tail])
    _check_tail_vs_shipped(o, lse, o0, lse0, tail)
    check_float64(o, lse, q, k, v, prep, scale, lens)


@pytest.mark.parametrize("fmt", FORMATS)
def test_splitkv_without_tail_is_the_shipped_kernel(fmt):
    """132 work tiles on 132 SMs: no split (the plain 1-D grid, no merge), every row bit-identical."""
    need_sm90()
    shape = (1, 11, 2304, 2304, 64)  # 12 query blocks x 11 heads = 132 tiles
    _, _, _, _, prep, scale = _case(shape, fmt, seed=60)
    o, lse = _run_split(prep, scale)
    o0, lse0 = run_shipped(prep, scale)
    assert torch.isfinite(o).all() and torch.equal(o, o0) and torch.equal(lse, lse0)


def test_splitkv_deterministic():
    need_sm90()
    _, _, _, _, prep, scale = _case((1, 24, 4608, 4608, 128), "int8", seed=70)
    o1, l1 = _run_split(prep, scale)
    o2, l2 = _run_split(prep, scale)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
