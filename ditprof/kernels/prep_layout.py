"""The prep's output layout, shared by its Python side (``prep``) and its Triton kernels (``prep_triton``): the
padded row counts of q8 (whole 128-row query tiles) and of k8 / v8t (whole 32-key strips). A leaf module."""

from __future__ import annotations

Q_ROW_PAD = 128
K_ROW_PAD = 32


def padded_lengths(sq: int, sk: int) -> tuple[int, int]:
    """(Sq_pad, Sk_pad): the query and key counts rounded up to Q_ROW_PAD and K_ROW_PAD."""
    return -(-sq // Q_ROW_PAD) * Q_ROW_PAD, -(-sk // K_ROW_PAD) * K_ROW_PAD
