"""The stream-K tail's merge (``fp8_fwd_sm90_streamk``): one Triton launch combines each tail tile's pieces (O
normalised per piece, in the output dtype, and its LSE) into O and, optionally, the LSE, in fp32:
LSE = m + ln sum_p exp(LSE_p - m), O = sum_p exp(LSE_p - LSE) O_p. Each tail tile's pieces are workspace slots from a
table built on the host (``streamk_schedule.piece_table``, -1 padded); a tail tile that one CTA ran whole has none
and is left alone (its O is already written).

``streamk_merge`` launches through Triton's JIT (tests, benches); ``MergeLaunch`` is the per-configuration launch of
``kernels.launch_record`` (``triton_launch.FixedLaunch``: the compiled kernel's launcher after the first call)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ditprof.kernels.triton_launch import FixedLaunch
from ditprof.kernels.streamk_schedule import TILE_M, piece_table

BLOCK = 64  # query rows per program


@triton.jit
def _streamk_merge_kernel(o_part, lse_part, table, out, lse_out, n_full, n_m, H, sq, P_MAX: tl.constexpr,
                          D: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr, WRITE_LSE: tl.constexpr):
    u = tl.program_id(0)  # tail tile
    t = n_full + u
    m_block = t % n_m
    head = (t // n_m) % H
    bat = t // (n_m * H)
    r = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = m_block * TILE + r
    valid = row < sq
    cols = tl.arange(0, D)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for p in range(P_MAX):
        slot = tl.load(table + u * P_MAX + p) + 0 * r  # as a row vector: the masks below are per row
        lp = tl.load(lse_part + slot * TILE + r, mask=valid & (slot >= 0), other=float("-inf"))
        m = tl.maximum(m, lp)
    acc = tl.zeros((BLOCK, D), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    for p in range(P_MAX):
        slot = tl.load(table + u * P_MAX + p) + 0 * r
        has = valid & (slot >= 0)
        lp = tl.load(lse_part + slot * TILE + r, mask=has, other=float("-inf"))
        w = tl.where(has, tl.exp(lp - m), 0.0)
        o = tl.load(o_part + (slot * TILE + r)[:, None].to(tl.int64) * D + cols[None, :], mask=has[:, None],
                    other=0.0)
        acc += w[:, None] * o.to(tl.float32)
        total += w
    o = acc / total[:, None]
    # a tail tile one CTA ran whole has no pieces (its O is already written): nothing to store
    write = valid & ((tl.load(table + u * P_MAX) + 0 * r) >= 0)
    dst = ((bat * sq + row).to(tl.int64) * H + head) * D
    tl.store(out + dst[:, None] + cols[None, :], o.to(out.dtype.element_ty), mask=write[:, None])
    if WRITE_LSE:
        tl.store(lse_out + (bat * H + head).to(tl.int64) * sq + row, m + tl.log(total), mask=write)


def streamk_merge(o_part, lse_part, table, out, lse, n_full: int, sq: int) -> None:
    """Merge the pieces of each tail tile (``table`` int32 (n_tail, P_MAX), workspace slots, -1 padded) from
    ``o_part`` (slots, 192, D) / ``lse_part`` (slots, 192) into ``out`` (B, Sq, H, D) contiguous and ``lse``
    (B, H, Sq) (None: not written), on the current stream."""
    n_tail, p_max = table.shape
    B, sq_, H, D = out.shape
    n_m = -(-sq // TILE_M)
    _streamk_merge_kernel[(n_tail, TILE_M // BLOCK)](
        o_part, lse_part, table, out, lse if lse is not None else lse_part, n_full, n_m, H, sq, P_MAX=p_max, D=D,
        TILE=TILE_M, BLOCK=BLOCK, WRITE_LSE=lse is not None)


_TABLES: dict = {}


def device_table(n_full: int, n_tail: int, n_ctas_tail: int, n_kt: int, device) -> torch.Tensor:
    """``piece_table`` as an int32 (n_tail, P_MAX) tensor on ``device``, -1 padded; made once per plan and device
    (read-only, shared): a copy from the host per call would break CUDA-graph capture."""
    device = torch.device(device)
    key = (n_full, n_tail, n_ctas_tail, n_kt, device)
    table = _TABLES.get(key)
    if table is None:
        rows = piece_table(n_full, n_tail, n_ctas_tail, n_kt)
        p_max = max(1, max(len(r) for r in rows))
        table = _TABLES[key] = torch.tensor([r + [-1] * (p_max - len(r)) for r in rows], dtype=torch.int32,
                                            device=device)
    return table


class MergeLaunch:
    """The merge of one launch configuration: the table (``device_table``), the grid and the sizes fixed; a call
    passes the workspace, ``out`` (B, Sq, H, D contiguous) and, with ``write_lse``, the LSE (B, H, Sq) to write;
    without it O only."""

    def __init__(self, n_full: int, n_tail: int, n_ctas_tail: int, n_kt: int, heads: int, sq: int, head_dim: int,
                 device, write_lse: bool = False):
        self.table = device_table(n_full, n_tail, n_ctas_tail, n_kt, device)
        p_max = self.table.shape[1]
        self.write_lse = bool(write_lse)
        static = {"table": self.table, "n_full": n_full, "n_m": -(-sq // TILE_M), "H": heads, "sq": sq}
        self.launch = FixedLaunch(_streamk_merge_kernel, (n_tail, TILE_M // BLOCK), {}, {
            **static, "P_MAX": p_max, "D": head_dim, "TILE": TILE_M, "BLOCK": BLOCK, "WRITE_LSE": self.write_lse},
            ("o_part", "lse_part", "out", "lse_out"))

    def __call__(self, o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor, stream: int,
                 lse: torch.Tensor | None = None) -> None:
        # lse_out: the LSE with write_lse; otherwise never written (lse_part stands in)
        self.launch((o_part, lse_part, out, lse if self.write_lse else lse_part), stream)


__all__ = ["BLOCK", "MergeLaunch", "device_table", "streamk_merge"]
