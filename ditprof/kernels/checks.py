"""The input checks every FP8 attention entry shares (the kernel's Python entry, the custom op -- also on fake
tensors under compile --, the prep and the numerics emulation): one-line ``DitprofError``s naming what was given."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ditprof.errors import DitprofError

LAYOUTS = ("BSHD", "BHSD")
SUPPORTED_HEAD_DIMS = (64, 128)  # what both FP8 kernels compile for
_NAMES = ("q", "k", "v")
_WORDS = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _dtype_words(dtypes: Sequence[torch.dtype]) -> str:
    names = [_WORDS.get(d, str(d)) for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_qkv(q, k, v, *, who: str, layout: str = "BSHD",
              dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16),
              head_dims: Optional[Sequence[int]] = None, pow2_head_dim: bool = False,
              device_type: Optional[str] = None, same_dtype: bool = False,
              max_grid: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check q, k, v (``layout``) and return them as (B, S, H, D) views (no copies)."""
    if layout not in LAYOUTS:
        raise DitprofError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    axes = "B, S, H, D" if layout == "BSHD" else "B, H, S, D"
    for name, x in zip(_NAMES, (q, k, v)):
        if not isinstance(x, torch.Tensor):
            raise DitprofError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if device_type is not None and x.device.type != device_type:
            raise DitprofError(f"{who} needs {device_type.upper()} tensors, {name} is on {x.device}")
        if x.dim() != 4:
            raise DitprofError(f"{name} must be 4-D ({axes}), got shape {tuple(x.shape)}")
        if x.dtype not in dtypes:
            raise DitprofError(f"{name} must be {_dtype_words(dtypes)}, got {x.dtype}")
    if same_dtype and not (q.dtype == k.dtype == v.dtype):
        raise DitprofError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise DitprofError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    qs, ks, vs = (x if layout == "BSHD" else x.transpose(1, 2) for x in (q, k, v))
    B, Sq, H, D = qs.shape
    if ks.shape != vs.shape:
        raise DitprofError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if ks.shape[0] != B or ks.shape[2] != H or ks.shape[3] != D:
        raise DitprofError(f"q {tuple(q.shape)} and k {tuple(k.shape)} ({layout}) must agree in batch, heads and "
                           f"head_dim")
    if min(B, Sq, H, D, ks.shape[1]) < 1:
        raise DitprofError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)} ({layout})")
    if head_dims is not None and D not in head_dims:
        raise DitprofError(f"{who} supports head_dim {tuple(head_dims)}, got {D}")
    if pow2_head_dim and (D < 16 or D > 256 or D & (D - 1)):
        raise DitprofError(f"head_dim must be a power of two in 16..256, got {D}")
    if max_grid is not None and (H > max_grid or B > max_grid):
        raise DitprofError(f"at most {max_grid} heads and batches, got q {tuple(q.shape)} ({layout})")
    return qs, ks, vs


def check_key_mask(key_mask: Optional[torch.Tensor], k_bshd: torch.Tensor) -> None:
    if key_mask is not None and (key_mask.dtype != torch.bool or tuple(key_mask.shape) != tuple(k_bshd.shape[:2])):
        raise DitprofError(f"key_mask must be bool (B, Sk) = {tuple(k_bshd.shape[:2])}, got {key_mask.dtype} "
                           f"{tuple(key_mask.shape)}")
