"""CPU checks of the split-KV tail variant of the Hopper FP8 attention kernel (``fp8_fwd_sm90_splitkv.py``):

* compile-only (sm_90a, bf16 out; e4m3 and INT8 Q/K, head_dim 128 and 64, with and without key lengths): the
  shipped kernel's QGMMA (e4m3) / IGMMA + QGMMA (INT8) counts, TMA loads, no local memory (ptxas spills nothing),
  the launch register budget, and a key-tile loop the size of the shipped kernel's;
* the schedule in plain Python: ``splits_for`` at the DiT shapes, and the CTA -> (work tile, part, key range)
  mapping (every key tile of every work tile covered exactly once, tail tiles last in launch order);
* the merge's math: the Triton merge under the Triton interpreter (a subprocess with TRITON_INTERPRET=1) against
  float64 torch on random partial O / LSE, one part with LSE = -inf.

    python -m pytest -q -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_splitkv_sass.py
"""

from __future__ import annotations

import dataclasses

import math

import pytest

pytest.importorskip("cutlass")

import fp8_fwd_sm90_splitkv as S
from sass_helpers import compile_sass, key_tile_loop
from triton_interpreter import inner_only, run_under_interpreter

from ditprof.kernels import fp8_fwd_sm90 as K

_CACHE: dict = {}
# (head_dim, key_lens, qk_int8)
CASES = [(d, kl, i8) for i8 in (False, True) for d in (128, 64) for kl in (False, True)]
IDS = [f"{'int8' if i8 else 'e4m3'}-d{d}{'-key_lens' if kl else ''}" for d, kl, i8 in CASES]


def _config(head_dim: int):
    """The split-KV build's configuration (``compile_splitkv``'s default: the LDS accumulator preset), given to the
    shipped kernel it is compared with too."""
    return dataclasses.replace(K.config_for("sm_90a", head_dim), mma_preset=False)


def _compiled(tmp_path_factory, compile_fn, head_dim: int, key_lens: bool, qk_int8: bool) -> dict:
    key = (compile_fn.__module__, head_dim, key_lens, qk_int8)
    if key not in _CACHE:
        _CACHE[key] = compile_sass(
            tmp_path_factory, f"skv_{head_dim}_{key_lens}_{qk_int8}",
            lambda extra: compile_fn(head_dim, "bfloat16", fake=True, key_lens=key_lens, qk_int8=qk_int8,
                                     config=_config(head_dim), options_extra=extra))
    return _CACHE[key]


def main_loop(sass: str, head_dim: int) -> list[str]:
    """The key-tile loop: the smallest backward-branch range holding a 64 x tile_n Q K^T wgmma (QGMMA or IGMMA),
    >= 80 exps and no global store."""
    return key_tile_loop(sass, rf"[QI]GMMA\.64x{K.config_for('sm_90a', head_dim).tile_n}")


# ---------------------------------------------------------------------- compile-only (CPU)
@pytest.mark.parametrize("head_dim,key_lens,qk_int8", CASES, ids=IDS)
def test_splitkv_sm90a_wgmma_tma_no_spills(tmp_path_factory, head_dim, key_lens, qk_int8):
    r = _compiled(tmp_path_factory, S.compile_splitkv, head_dim, key_lens, qk_int8)
    ship = _compiled(tmp_path_factory, K.compile_sm90, head_dim, key_lens, qk_int8)
    shipped = ship["base"]
    base, res, sass = r["base"], r["res"], r["sass"]
    c = K.config_for("sm_90a", head_dim)
    kb = c.tile_n // 32
    qk = 2 * (head_dim // 32)  # Q K^T: prologue + loop
    pv = 2 * kb * c.pv_split + 2 * kb  # P V in pv_split slices (loop + last tile), the row sums beside slice 0
    if qk_int8:
        assert (base.get("IGMMA", 0), base.get("QGMMA", 0)) == (qk, pv), base
        assert f"IGMMA.64x{c.tile_n}x32.S8.S8" in sass
    else:
        assert (base.get("IGMMA", 0), base.get("QGMMA", 0)) == (0, qk + pv), base
        assert f"QGMMA.64x{c.tile_n}x32.F32.E4M3.E4M3" in sass
    for op in ("QGMMA", "IGMMA"):  # the shipped kernel's counts
        assert base.get(op, 0) == shipped.get(op, 0), op
    assert f"QGMMA.64x{head_dim // c.pv_split}x32.F32.E4M3.E4M3 R" in sass  # P from registers
    assert base.get("HMMA", 0) == 0 and base.get("QMMA", 0) == 0
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res  # no local memory: ptxas spilled nothing
    assert base.get("STL", 0) == 0 and base.get("LDL", 0) == 0
    assert 0 < res["registers"] <= 65536 // (128 * (1 + c.consumer_wgs))  # launch budget (setmaxnreg moves it)
    assert base.get("UTMALDG", 0) >= 3 and sass.count("SR_CLOCKLO") == 1  # TMA loads; the one clock fence
    # the shipped kernel's shared memory (compile_splitkv also checks the dynamic struct's size)
    assert res["static_smem_bytes"] == ship["res"]["static_smem_bytes"]


@pytest.mark.parametrize("head_dim,key_lens,qk_int8", CASES, ids=IDS)
def test_splitkv_main_loop_is_the_shipped_one(tmp_path_factory, head_dim, key_lens, qk_int8):
    """The key-tile loop is the shipped kernel's up to register allocation and the mask's part test (outside the
    loop body proper, on the last tile): the same wgmmas, exps, FFMAs, max and packing instructions."""
    shipped = main_loop(_compiled(tmp_path_factory, K.compile_sm90, head_dim, key_lens, qk_int8)["sass"], head_dim)
    split = main_loop(_compiled(tmp_path_factory, S.compile_splitkv, head_dim, key_lens, qk_int8)["sass"], head_dim)
    print(f"key-tile loop: shipped {len(shipped)}, split-KV {len(split)} instructions")
    for op in ("QGMMA", "IGMMA", "MUFU.EX2", "FFMA", "FMNMX", "F2FP", "SYNCS"):
        assert sum(op in x for x in split) == sum(op in x for x in shipped), op
    assert abs(len(split) - len(shipped)) <= 48, (len(split), len(shipped))


# ---------------------------------------------------------------------- the schedule (pure Python)
H200_SMS = 132


@pytest.mark.parametrize("name,shape,expect", [
    # (B, H, S, D): flux 576 tiles = 4 x 132 + 48 -> 48 tiles x 2 parts (96 CTAs in the 5th round)
    ("flux", (1, 24, 4608, 128), (528, 48, 2)),
    ("ltx", (1, 32, 7392, 64), (1188, 60, 2)),  # 1248 = 9 x 132 + 60
    ("cogvideox", (1, 48, 17776, 64), (4464, 0, 1)),  # 4464 = 33 x 132 + 108: 132 // 108 = 1, no split
    ("h3", (1, 56, 30272, 128), (8844, 4, 32)),  # 8848 = 67 x 132 + 4: 33 parts would fit, capped at 32
])
def test_splits_for_dit_shapes(name, shape, expect):
    B, H, S_, _D = shape
    n_tiles = S.work_tiles(B, H, S_)
    plan = S.splits_for(n_tiles, H200_SMS, S.key_tiles(S_))
    assert plan == expect, (name, n_tiles, plan)
    n_full, n_tail, splits = plan
    assert n_full + n_tail == n_tiles and n_tail * splits <= H200_SMS


def test_splits_for_edges():
    assert S.splits_for(264, 132, 29) == (264, 0, 1)  # whole rounds: the plain grid
    assert S.splits_for(1, 132, 29) == (0, 1, 29)  # one tile: split over all its key tiles
    assert S.splits_for(1, 132, 100) == (0, 1, 32)  # ... at most MAX_SPLITS parts
    assert S.splits_for(3, 132, 1) == (3, 0, 1)  # one key tile: nothing to split
    assert S.splits_for(200, 132, 29) == (200, 0, 1)  # 68 tail tiles: 132 // 68 = 1 part
    assert S.splits_for(133, 132, 2) == (132, 1, 2)  # capped by the key tiles
    assert S.splits_for(5, 4, 8, cap=3) == (4, 1, 3)
    with pytest.raises(ValueError):
        S.splits_for(0, 132, 4)


def _model(B: int, H: int, sq: int, n_kt_of, plan):
    """The kernel's schedule in Python: per CTA in launch order (work tile, part, [begin, end)), and the global
    key tiles each work tile gets."""
    n_full, n_tail, splits = plan
    n_m = -(-sq // 192)
    rows = []
    for cta in range(n_full + n_tail * splits):
        t, part, parts = S.cta_work(cta, n_full, splits)
        m, h, b = S.work_coords(t, n_m, H)
        begin, end = S.part_range(part, parts, n_kt_of(b))
        rows.append(((m, h, b), t, part, parts, begin, end))
    return rows


@pytest.mark.parametrize("B,H,sq,sk,n_sms", [
    (1, 24, 4608, 4608, 132),  # flux: 48 x 2 tail parts
    (1, 56, 30272, 30272, 132),  # h3: 4 x 32
    (2, 3, 1000, 777, 7),  # 36 tiles = 5 x 7 + 1: 1 tail tile in min(7, 5) = 5 parts of 4-5 key tiles
    (1, 2, 100, 5000, 132),  # 2 tiles on 132 SMs: both split, 32 parts of the 32 key tiles
    (3, 5, 1000, 1000, 4),  # 90 tiles = 22 x 4 + 2: 2 parts of 7 key tiles
])
def test_cta_mapping_covers_every_key_tile_once(B, H, sq, sk, n_sms):
    n_tiles = S.work_tiles(B, H, sq)
    n_kt = S.key_tiles(sk)
    plan = S.splits_for(n_tiles, n_sms, n_kt)
    n_full, n_tail, splits = plan
    rows = _model(B, H, sq, lambda b: n_kt, plan)
    covered: dict = {}
    for coords, t, part, parts, begin, end in rows:
        assert end - begin >= 1  # no key_lens: every part has a key tile
        assert parts == (1 if t < n_full else splits)
        for j in range(begin, end):
            covered.setdefault(coords, []).append(j)
    n_m = -(-sq // 192)
    assert sorted(covered) == sorted((m, h, b) for b in range(B) for h in range(H) for m in range(n_m))
    assert all(sorted(js) == list(range(n_kt)) for js in covered.values())  # each key tile exactly once
    # full tiles first, in the shipped grid's order (m_block fastest, then head, then batch), then the tail
    order = [t for _, t, *_ in rows]
    assert order[:n_full] == list(range(n_full))
    assert order[n_full:] == [n_full + i // splits for i in range(n_tail * splits)]
    assert [c for c, *_ in rows[:min(n_m, 3)]] == [(m, 0, 0) for m in range(min(n_m, 3))]
    # the part that masks (part == parts - 1) is the one holding the item's last key tile
    assert all((end == n_kt) == (part == parts - 1) for _, _, part, parts, _, end in rows)


def test_cta_mapping_key_lens_empty_parts():
    """key_lens items with fewer key tiles than parts: the extra parts are empty (begin == end, LSE = -inf), the
    others still cover every key tile once and the last part holds the last key tile."""
    B, H, sq = 3, 2, 300  # 2 query blocks x 2 heads x 3 items = 12 tiles
    lens_tiles = [1, 3, 7]
    plan = S.splits_for(S.work_tiles(B, H, sq), 16, 7)  # 12 % 16 = 12 tail tiles... 16 // 12 = 1: no split
    assert plan == (12, 0, 1)
    plan = (0, 12, 4)  # every tile in 4 parts (what a small GPU would get)
    rows = _model(B, H, sq, lambda b: lens_tiles[b], plan)
    for (m, h, b), t, part, parts, begin, end in rows:
        assert 0 <= begin <= end <= lens_tiles[b]
        if part == parts - 1:
            assert end == lens_tiles[b] and end > begin
    for b, n in enumerate(lens_tiles):
        per_tile: dict = {}
        for coords, _t, _p, _ps, begin, end in rows:
            if coords[2] == b:
                per_tile.setdefault(coords, []).extend(range(begin, end))
        assert all(sorted(js) == list(range(n)) for js in per_tile.values())
    # 4 work tiles per item; item 0 (1 key tile): parts 0-2 empty; item 1 (3): part 0 empty; item 2 (7): none
    assert sum(1 for *_, begin, end in rows if begin == end) == 4 * (3 + 1 + 0)


# ---------------------------------------------------------------------- the merge under the Triton interpreter
def _merge_reference(o_part, lse_part):
    """float64: LSE = logsumexp_p LSE_p, O = sum_p exp(LSE_p - LSE) O_p (over (splits, tail, rows[, D]))."""
    import torch

    lse = torch.logsumexp(lse_part.double(), dim=0)
    w = torch.exp(lse_part.double() - lse)
    return (w[..., None] * o_part.double()).sum(0), lse


def test_merge_under_interpreter():
    run_under_interpreter(__file__, "test_merge_inner")


@inner_only()
@pytest.mark.parametrize("D,sq", [(128, 4608), (64, 1000)])
def test_merge_inner(D, sq):
    """Random partial results of a plan's tail tiles (3 parts; one part of one tile LSE = -inf with NaN in its O,
    as an empty part would not have to write) merged into NaN-poisoned outputs: tail rows match float64, rows
    past Sq and the full tiles' rows are not written."""
    import torch
    from splitkv_merge import splitkv_merge

    g = torch.Generator().manual_seed(D)
    B, H, tile_m = 1, 3, 192
    n_m = -(-sq // tile_m)
    n_tiles = n_m * H * B
    n_tail, splits = 4, 3
    n_full = n_tiles - n_tail
    o_part = torch.randn((splits, n_tail, tile_m, D), generator=g).to(torch.bfloat16)
    lse_part = 3 * torch.randn((splits, n_tail, tile_m), generator=g) + 5
    lse_part[1, 2] = -math.inf  # part 1 of tail tile 2 had no key
    o_part[1, 2] = math.nan  # ... and its O must not poison the merge
    out = torch.full((B, sq, H, D), math.nan, dtype=torch.bfloat16)
    lse = torch.full((B, H, sq), math.nan)
    splitkv_merge(o_part, lse_part, out, lse, n_full, sq)
    ref_o, ref_lse = _merge_reference(torch.nan_to_num(o_part, nan=0.0), lse_part)
    written = torch.zeros((B, sq, H), dtype=torch.bool)
    for u in range(n_tail):
        t = n_full + u
        m, h, b = S.work_coords(t, n_m, H)
        rows = min(tile_m, sq - m * tile_m)
        got_o = out[b, m * tile_m:m * tile_m + rows, h].double()
        got_lse = lse[b, h, m * tile_m:m * tile_m + rows].double()
        assert torch.allclose(got_o, ref_o[u, :rows], rtol=8e-3, atol=8e-3)  # one bf16 rounding of O
        assert torch.allclose(got_lse, ref_lse[u, :rows], rtol=1e-5, atol=1e-5)
        written[b, m * tile_m:m * tile_m + rows, h] = True
    assert written.sum() > 0 and torch.isfinite(out[written]).all()
    assert torch.isnan(out[~written]).all() and torch.isnan(lse.transpose(1, 2)[~written]).all()
    # part 1 of tail tile 2 is -inf: its rows equal the merge of parts 0 and 2 alone
    two_o, two_lse = _merge_reference(o_part[[0, 2], 2:3], lse_part[[0, 2], 2:3])
    m, h, b = S.work_coords(n_full + 2, n_m, H)
    rows = min(tile_m, sq - m * tile_m)
    assert torch.allclose(lse[b, h, m * tile_m:m * tile_m + rows].double(), two_lse[0, :rows], atol=1e-5)
    assert torch.allclose(out[b, m * tile_m:m * tile_m + rows, h].double(), two_o[0, :rows], rtol=8e-3, atol=8e-3)
