"""The launch record of a fp8-sm120 configuration whose builds all failed their self-check (``self_check``): torch
SDPA on the same calls, with the record's interface (``__call__``, ``summary``, ``calls``, ``replays``) so the front
door, the op and the launch summaries treat it as any other record.

A call is what the kernel's record would compute from the same arguments: (B, S, H, D) q, k, v, the softmax scale,
``key_lens`` (batch item b attends to its first ``min(max(key_lens[b], 0), Sk)`` keys), the fused prologue's norm and
RoPE (``prologue.prologue_torch``) where the record has one, and with ``return_lse`` the natural-log LSE (B, H, Sq)
float32 of the scores. SDPA runs in the inputs' dtype; no FP8 quantization, and no NaN/Inf check of the inputs
(a non-finite input gives non-finite outputs instead of the kernel path's error)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ditprof.kernels.compile_cache import DTYPE_NAMES
from ditprof.kernels.masks import keys_of_lens

LSE_CHUNK_BYTES = 256 << 20  # the LSE's fp32 score blocks are computed a few query rows at a time


class SdpaLaunch:
    """torch SDPA in place of the kernel for one call configuration; ``fallback`` says why ("sdpa: <why>")."""

    self_check = "failed"

    def __init__(self, q: torch.Tensor, k: torch.Tensor, key_lens: bool, return_lse: bool, prologue=None,
                 fallback: Optional[str] = None):
        B, Sq, H, D = q.shape
        self.out_shape, self.Sk, self.dtype = (B, Sq, H, D), k.shape[1], q.dtype
        self.key_lens, self.return_lse, self.prologue = bool(key_lens), bool(return_lse), prologue
        self.fallback = fallback
        self.calls = 0

    def __call__(self, q, k, v, softmax_scale: float, key_lens: Optional[torch.Tensor] = None, pro=None):
        self.calls += 1
        if self.prologue is not None:  # q and k are the raw projections: the processor's norm and RoPE first
            from ditprof.kernels.prologue import prologue_torch

            wq, wk, cos, sin, text_rows = pro[:5]
            rsq, rsk = pro[5:] or (None, None)  # rms_across's row factors
            q = prologue_torch(self.prologue, q, wq, cos, sin, text_rows, rsq)
            k = prologue_torch(self.prologue, k, wk, cos, sin, text_rows, rsk)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        mask = None
        if key_lens is not None:  # (B, 1, 1, Sk): True where the key is attended
            mask = keys_of_lens(key_lens.to(kh.device), kh.shape[2])[:, None, None, :]
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=float(softmax_scale))
        out = o.transpose(1, 2).contiguous()
        if not self.return_lse:
            return out
        return out, scores_lse(qh, kh, mask, float(softmax_scale))

    def summary(self) -> dict:
        """The launch summary's fields (``Fp8Launch.summary``) for SDPA: no Q/K format, no grid of ours."""
        return {"q_shape": list(self.out_shape), "k_len": self.Sk, "dtype": DTYPE_NAMES[self.dtype],
                "kernel": "sdpa", "qk_format": None, "key_lens": self.key_lens, "grid": "plain", "streamk": None,
                "q_in_kernel": False, "launch": "torch", "self_check": self.self_check, "fallback": self.fallback}

    def replays(self) -> int:
        return 0


def scores_lse(qh: torch.Tensor, kh: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """The natural-log LSE (B, H, Sq) float32 of ``scale * q k^T`` over the keys ``mask`` keeps, (B, H, S, D)
    inputs, in blocks of query rows (``LSE_CHUNK_BYTES`` of fp32 scores each)."""
    B, H, Sq, _ = qh.shape
    Sk = kh.shape[2]
    rows = max(1, LSE_CHUNK_BYTES // max(1, B * H * Sk * 4))
    kt = kh.float().transpose(-1, -2)
    parts = []
    for i in range(0, Sq, rows):
        s = torch.matmul(qh[:, :, i:i + rows].float(), kt) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        parts.append(torch.logsumexp(s, dim=-1))
    return torch.cat(parts, dim=-1)


__all__ = ["LSE_CHUNK_BYTES", "SdpaLaunch", "scores_lse"]
