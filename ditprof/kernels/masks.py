"""Key-padding masks: the attention masks diffusers' processors pass for padded prompts, as one boolean per key.

Processors pass a boolean mask (True = attend) or an additive float bias (0 = attend, a large negative number =
masked), shaped to broadcast over (B, H, S_q, S_k): (B, S_k), (B, 1, 1, S_k), or a full (B, 1, S_q, S_k) built as
``m_i & m_j`` (HunyuanVideo-1.5: padded query rows mask everything). All of these are one key subset per batch
item on every query row that attends to anything; rows that attend to nothing are padding, whose outputs the
model never reads. ``key_mask`` returns that subset as a (B, S_k) bool tensor; a mask that is not one (a soft
bias, a mask that differs between heads or between real query rows) is a one-line error. ``compact_keys`` turns a
(B, S_k) subset into what the FP8 kernels read: each item's kept keys first and its key count.
"""

from __future__ import annotations

import torch

from ditprof.errors import DitprofError

MASKED_BELOW = -1e3  # an additive bias this negative (or -inf) masks its key: exp() of it is 0 in fp32 softmax


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        return mask != 0  # integer 0/1 masks (what tokenizers return)
    keep, drop = mask == 0, mask <= MASKED_BELOW
    if not bool((keep | drop).all()):
        raise DitprofError("the attention mask is a soft additive bias (values other than 0 and a large negative "
                           "number): it is not a key-padding mask, which is all the fp8 backends take")
    return keep


def _as_4d(m: torch.Tensor, mask: torch.Tensor, batch: int, heads: int, sq: int, sk: int) -> torch.Tensor:
    """``m`` (the bool form of ``mask``) as (B, H or 1, S_q or 1, S_k)."""
    if m.dim() == 2:
        m = m[:, None, None, :]
    if m.dim() != 4:
        raise DitprofError(f"attention mask of shape {tuple(mask.shape)}: expected (B, S_k) or 4-D broadcasting "
                           f"to (B, H, S_q, S_k) = ({batch}, {heads}, {sq}, {sk})")
    try:
        return m.expand(batch, m.shape[1], m.shape[2], sk)
    except RuntimeError:
        raise DitprofError(f"attention mask of shape {tuple(mask.shape)} does not broadcast to (B, H, S_q, S_k) = "
                           f"({batch}, {heads}, {sq}, {sk})") from None


def key_mask(mask: torch.Tensor, batch: int, heads: int, sq: int, sk: int) -> torch.Tensor:
    """(B, S_k) bool, True where the key is attended, from any mask form above; one host sync (the checks)."""
    m = _as_4d(_as_bool(mask), mask, batch, heads, sq, sk)
    if m.shape[1] != 1 and not bool((m == m[:, :1]).all()):
        raise DitprofError("the attention mask differs between heads: not a key-padding mask")
    m = m[:, 0]  # (B, S_q or 1, S_k)
    rows = m.any(dim=-1, keepdim=True)  # query rows that attend to something
    keys = m.any(dim=1)  # (B, S_k)
    if not bool(((m == keys[:, None, :]) | ~rows).all()):
        raise DitprofError("the attention mask differs between query rows: not a key-padding mask "
                           "(the fp8 backends take one key subset per batch item)")
    if not bool(keys.any(dim=-1).all()):
        raise DitprofError("the attention mask masks every key of a batch item")
    return keys


def attended_keys(mask: torch.Tensor, batch: int, heads: int, sq: int, sk: int) -> torch.Tensor:
    """``key_mask`` of a mask whose form ``key_mask`` has already checked (for this shape): device ops only, no
    host sync, so timed calls stay asynchronous."""
    m = mask if mask.dtype == torch.bool else (mask == 0 if mask.is_floating_point() else mask != 0)
    return _as_4d(m, mask, batch, heads, sq, sk)[:, 0].any(dim=1)


def keys_of_lens(key_lens: torch.Tensor, sk: int) -> torch.Tensor:
    """(B, sk) bool: True for the keys batch item b attends with key counts ``key_lens`` (B,): its first
    ``min(max(key_lens[b], 0), sk)`` keys, the kernels' rule."""
    return torch.arange(sk, device=key_lens.device)[None, :] < key_lens.long()[:, None]


def prefix_key_lens(mask: torch.Tensor, batch: int, heads: int, sq: int, sk: int, *,
                    check: bool = True) -> torch.Tensor:
    """(B,) int32: each batch item's attended-key count, for a mask whose attended keys are the item's first ones
    (HunyuanVideo's padded prompt: [video, prompt, padding]). The fused prologue takes counts, not a key subset:
    its RoPE table ties each key to its row, so it cannot move the kept keys to the front (``compact_keys``).
    ``check``: ``key_mask``'s checks and the prefix check (host syncs); else device ops only (no sync)."""
    if not check:
        return attended_keys(mask, batch, heads, sq, sk).sum(dim=1, dtype=torch.int32)
    keys = key_mask(mask, batch, heads, sq, sk)
    lens = keys.sum(dim=1, dtype=torch.int32)
    if not bool((keys == keys_of_lens(lens, sk)).all()):
        raise DitprofError("the attention mask's attended keys are not each batch item's first keys: the fused "
                           "prologue takes a key count per item (its RoPE rows pin each key to its position)")
    return lens


def compact_keys(k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor):
    """Any key subset as a prefix, on the device (no sync, CUDA-graph capturable): ``keep`` (B, Sk) bool ->
    (k, v with each batch item's kept keys first, in order, and the others zeroed; key_lens (B,) int32).
    Zeroing keeps dropped keys out of the descales; attention over a key subset does not depend on key order."""
    order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
    kept = torch.gather(keep, 1, order)[:, :, None, None]
    idx = order[:, :, None, None].expand(-1, -1, k.shape[2], k.shape[3])
    zero = torch.zeros((), dtype=k.dtype, device=k.device)
    k2 = torch.where(kept, torch.gather(k, 1, idx), zero)
    v2 = torch.where(kept, torch.gather(v, 1, idx), zero)
    return k2, v2, keep.sum(dim=1, dtype=torch.int32)
