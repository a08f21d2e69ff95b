"""The key order V is stored in, so that P can go from the score accumulator to the P.V MMA in registers.

With mma.sync m16n8k32, a lane's fp32 score fragment holds keys 2c, 2c+1 of each 8-key tile, but the FP8 A
operand wants 4 consecutive k-slots per lane. The MMA only sums slot i of P against slot i of V, so instead of
moving P between lanes, each lane drops its own scores into its own A slots and V is stored with the same
permutation (write-up, "P stays in registers"). Lane 0 holds keys 0, 1, 8, 9 -> V positions 0..3; lane 1 holds
keys 2, 3, 10, 11 -> positions 4..7; and so on, independently inside every 16-key group:

    position p holds key  g + 8*(e//2) + 2*quad + e%2,   g = p//16*16, quad = (p%16)//4, e = p%4

The permutation acts on whole 16-key groups, so lengths must be multiples of 16. Callers pad the key axis to a
multiple of 32 (the kernel's key strip; ``prep.fp8_prepare`` does) before permuting; pad keys are zeros.
"""

from __future__ import annotations

from typing import Union

import torch

from ditprof.errors import DitprofError

GROUP = 16


def key_order_for_positions(positions: Union[torch.Tensor, int]) -> Union[torch.Tensor, int]:
    """Which key sits at each storage position (works on ints and integer tensors)."""
    group = positions // GROUP * GROUP
    quad = (positions % GROUP) // 4
    element = positions % 4
    return group + 8 * (element // 2) + 2 * quad + element % 2


def _order(length: int, device) -> torch.Tensor:
    if length % GROUP:
        raise DitprofError(
            f"key axis length {length} is not a multiple of {GROUP}; pad keys to a multiple of 32 first")
    return key_order_for_positions(torch.arange(length, device=device))


def permute_keys(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Storage order: ``out.select(dim, p) == x.select(dim, key_order_for_positions(p))``."""
    return x.index_select(dim, _order(x.shape[dim], x.device))


def unpermute_keys(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of ``permute_keys``: back to natural key order."""
    order = _order(x.shape[dim], x.device)
    return x.index_select(dim, torch.argsort(order))


__all__ = ["GROUP", "key_order_for_positions", "permute_keys", "unpermute_keys"]
