"""CPU check of ``streamk_merge`` under the Triton interpreter (run in its own process: TRITON_INTERPRET must be set
before triton is imported): random pieces of two tail tiles (one with 3 pieces, one run whole: no pieces), the
merged rows against the float64 formula, the whole tile's rows and the non-tail rows untouched. Exit status 0 on
success; prints the largest error.

    TRITON_INTERPRET=1 python benchmarks/experimental/streamk_merge_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_fwd_sm90_streamk as SK  # noqa: E402


def main() -> int:
    g = torch.Generator().manual_seed(0)
    B, H, sq, D = 1, 2, 300, 64  # n_m = 2: work tiles (m, h) = 4; tail tiles 2 and 3 (n_full = 2)
    n_full = 2
    slots = 6
    o_part = torch.randn((slots, SK.TILE_M, D), generator=g).to(torch.bfloat16)
    lse_part = torch.randn((slots, SK.TILE_M), generator=g) * 3
    table = torch.tensor([[1, 4, 2], [-1, -1, -1]], dtype=torch.int32)  # tile 2: slots 1, 4, 2; tile 3: whole
    out = torch.full((B, sq, H, D), 7.0, dtype=torch.bfloat16)
    lse = torch.full((B, H, sq), 7.0)
    SK.streamk_merge(o_part, lse_part, table, out, lse, n_full, sq)
    # tile 2 = (m_block 0, head 1): rows 0..191 of head 1
    lp = lse_part[[1, 4, 2]].double()  # (3, 192)
    ref_lse = torch.logsumexp(lp, dim=0)
    w = torch.exp(lp - ref_lse)
    ref_o = (w[..., None] * o_part[[1, 4, 2]].double()).sum(0)  # (192, D)
    rows = min(SK.TILE_M, sq)
    err_o = (out[0, :rows, 1].double() - ref_o[:rows]).abs().max().item()
    err_l = (lse[0, 1, :rows].double() - ref_lse[:rows]).abs().max().item()
    untouched = bool((out[0, :, 0] == 7).all() and (lse[0, 0] == 7).all()  # tiles 0 / 1: head 0
                     and (out[0, SK.TILE_M:, 1] == 7).all() and (lse[0, 1, SK.TILE_M:] == 7).all())  # tile 3
    print(f"merge vs float64: O max {err_o:.2e}, LSE max {err_l:.2e}; other rows untouched: {untouched}")
    return 0 if err_o < 2e-2 and err_l < 1e-5 and untouched else 1


if __name__ == "__main__":
    sys.exit(main())
