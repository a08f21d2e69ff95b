"""Float64 reference attention, the yardstick every backend is measured against.

Computed on the inputs' device in float64, in query chunks so that a long sequence never materialises the
full (Sq, Sk) score matrix of every head at once (float64 scores of the H3 shape would be ~400 GB).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

# float64 score bytes per chunk; small enough for any GPU, large enough that chunks are few on CPU tests
_CHUNK_BYTES = 512 * 2**20


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                        return_lse: bool = False):
    """softmax(q k^T * scale) v in float64; q (B, Sq, H, D), k and v (B, Sk, H, D) -> float64 (B, Sq, H, D).

    With ``return_lse`` also returns the natural-log log-sum-exp of each score row, float64 (B, H, Sq).
    """
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qd = q.transpose(1, 2).double()  # (B, H, Sq, D)
    kd = k.transpose(1, 2).double()
    vd = v.transpose(1, 2).double()
    out = torch.empty((B, H, Sq, D), dtype=torch.float64, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float64, device=q.device)
    chunk = max(1, _CHUNK_BYTES // (8 * B * H * Sk))
    for start in range(0, Sq, chunk):
        rows = slice(start, min(start + chunk, Sq))
        scores = torch.matmul(qd[:, :, rows], kd.transpose(-1, -2)) * scale
        row_lse = torch.logsumexp(scores, dim=-1)
        out[:, :, rows] = torch.matmul(torch.exp(scores - row_lse[..., None]), vd)
        lse[:, :, rows] = row_lse
    out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


__all__ = ["attention_reference"]
