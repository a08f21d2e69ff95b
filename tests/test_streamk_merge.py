"""The stream-K merge (``ditprof.kernels.streamk_merge``) on the CPU under the Triton interpreter: random pieces of
two tail tiles (one with 3 pieces in scrambled slots, one run whole: no pieces), the merged rows against the float64
formula, every other row untouched; the JIT entry and the launch record's ``MergeLaunch`` (O only) both."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import inner_only, run_under_interpreter

from ditprof.kernels.streamk_schedule import TILE_M


def test_merge_under_the_interpreter():
    run_under_interpreter(__file__, "test_merge_inner")


def _pieces(D, seed):
    g = torch.Generator().manual_seed(seed)
    o_part = torch.randn((6, TILE_M, D), generator=g).to(torch.bfloat16)
    lse_part = torch.randn((6, TILE_M), generator=g) * 3
    return o_part, lse_part


def _reference(o_part, lse_part, slots):
    """float64 merge of the pieces in ``slots``: (O (192, D), LSE (192,))."""
    lp = lse_part[slots].double()
    ref_lse = torch.logsumexp(lp, dim=0)
    return (torch.exp(lp - ref_lse)[..., None] * o_part[slots].double()).sum(0), ref_lse


@inner_only()
@pytest.mark.parametrize("entry", ["jit", "record"])
def test_merge_inner(entry):
    from ditprof.kernels.streamk_merge import MergeLaunch, streamk_merge

    B, H, sq, D = 1, 2, 300, 64  # n_m = 2: work tiles (m, h) = 4; tail tiles 2 = (m 0, head 1), 3 = (m 1, head 1)
    n_full = 2
    o_part, lse_part = _pieces(D, seed=3)
    out = torch.full((B, sq, H, D), 7.0, dtype=torch.bfloat16)
    lse = torch.full((B, H, sq), 7.0)
    if entry == "jit":  # tile 2 from scrambled slots 1, 4, 2; tile 3 run whole by one CTA: no pieces
        pieces = {2: [1, 4, 2], 3: None}
        table = torch.tensor([[1, 4, 2], [-1, -1, -1]], dtype=torch.int32)
        streamk_merge(o_part, lse_part, table, out, lse, n_full, sq)
    else:  # the record's own table for n_tail 2, T 3, 3 key tiles: tile 2 in slots 0, 2; tile 3 in 3, 4
        merge = MergeLaunch(n_full, 2, 3, 3, H, sq, D, "cpu")
        assert merge.table.tolist() == [[0, 2], [3, 4]]
        pieces = {2: [0, 2], 3: [3, 4]}
        merge(o_part, lse_part, out, None)
    for tile, slots in pieces.items():
        rows = slice(0, TILE_M) if tile == 2 else slice(TILE_M, sq)
        n = rows.stop - rows.start
        if slots is None:
            assert (out[0, rows, 1] == 7).all() and (lse[0, 1, rows] == 7).all()
            continue
        ref_o, ref_lse = _reference(o_part, lse_part, slots)
        assert (out[0, rows, 1].double() - ref_o[:n]).abs().max().item() < 2e-2  # bf16 output rounding
        if entry == "jit":
            assert (lse[0, 1, rows].double() - ref_lse[:n]).abs().max().item() < 1e-5
    if entry == "record":
        assert (lse == 7).all()  # the record's merge writes O only
    assert (out[0, :, 0] == 7).all() and (lse[0, 0] == 7).all()  # tiles 0 / 1 (head 0): not tail tiles
