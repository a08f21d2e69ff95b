"""The merge of the split-KV tail variant (``fp8_fwd_sm90_splitkv.py``): one Triton launch that combines the key
parts of every tail work tile into the real output.

Each part p of a tail tile wrote its normalised O_p (output dtype) and LSE_p = ln(sum of its exps) (fp32) per row
into the workspace o_part (splits, n_tail, 192, D), lse_part (splits, n_tail, 192). For every row:

    LSE = m + ln(sum_p exp(LSE_p - m)),  m = max_p LSE_p
    O   = sum_p exp(LSE_p - m) O_p / sum_p exp(LSE_p - m)

in fp32. A part with LSE_p = -inf (no key: an empty key_lens part) weighs 0 and its O_p is not read (it may hold
anything); a NaN LSE_p (a fully masked item, as the shipped kernel gives) propagates to the row. One program per
(tail tile, 64 rows); rows past Sq are neither read nor written.
"""

from __future__ import annotations

import triton
import triton.language as tl

TILE_M = 192  # query rows per work tile (3 consumer warpgroups x 64)
BLOCK_R = 64  # rows per program (TILE_M is 3 of them)


@triton.jit
def _merge_kernel(o_part, lse_part, out, lse_out, n_full, n_tail, n_m, H, sq, splits,
                  D: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr, WRITE_LSE: tl.constexpr):
    u = tl.program_id(0)  # tail tile
    t = n_full + u  # its work tile in the shipped grid's order: m_block fastest, then head, then batch
    m_block = t % n_m
    head = (t // n_m) % H
    bat = t // (n_m * H)
    r = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # rows of the work tile
    row = m_block * TILE + r
    valid = row < sq
    cols = tl.arange(0, D)

    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for p in range(splits):
        lp = tl.load(lse_part + (p * n_tail + u) * TILE + r, mask=valid, other=float("-inf"))
        m = tl.maximum(m, lp)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every part empty: weights exp(-inf) = 0, not NaN

    acc = tl.zeros((BLOCK, D), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    for p in range(splits):
        base = (p * n_tail + u) * TILE + r
        lp = tl.load(lse_part + base, mask=valid, other=float("-inf"))
        w = tl.exp(lp - m_safe)
        has = lp != float("-inf")  # an empty part's O is never read (garbage x 0 could still be NaN)
        o = tl.load(o_part + base[:, None].to(tl.int64) * D + cols[None, :], mask=(valid & has)[:, None], other=0.0)
        acc += w[:, None] * o.to(tl.float32)
        total += w
    o = acc / total[:, None]
    dst = ((bat * sq + row).to(tl.int64) * H + head) * D
    tl.store(out + dst[:, None] + cols[None, :], o.to(out.dtype.element_ty), mask=valid[:, None])
    if WRITE_LSE:
        tl.store(lse_out + (bat * H + head).to(tl.int64) * sq + row, m_safe + tl.log(total), mask=valid)


def splitkv_merge(o_part, lse_part, out, lse, n_full: int, sq: int) -> None:
    """Merge the parts in ``o_part`` (splits, n_tail, 192, D) / ``lse_part`` (splits, n_tail, 192) fp32 into
    ``out`` (B, Sq, H, D) contiguous and ``lse`` (B, H, Sq) fp32 (None: the LSE is not written); tail tile u is
    work tile n_full + u."""
    splits, n_tail, tile, D = o_part.shape
    B, sq_, H, D_ = out.shape
    if tile != TILE_M or sq_ != sq or D_ != D or tuple(lse_part.shape) != (splits, n_tail, tile):
        raise ValueError(f"workspace {tuple(o_part.shape)} / {tuple(lse_part.shape)} does not fit out "
                         f"{tuple(out.shape)}")
    if not (out.is_contiguous() and o_part.is_contiguous() and lse_part.is_contiguous()):
        raise ValueError("contiguous out and workspace expected")
    n_m = -(-sq // TILE_M)
    _merge_kernel[(n_tail, TILE_M // BLOCK_R)](
        o_part, lse_part, out, lse if lse is not None else lse_part, n_full, n_tail, n_m, H, sq, splits,
        D=D, TILE=TILE_M, BLOCK=BLOCK_R, WRITE_LSE=lse is not None)


__all__ = ["splitkv_merge"]
