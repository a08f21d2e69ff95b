"""The one definition of the Hadamard rotation of Q and K (the INT8 Q/K format): the prep (torch and Triton), the
numerics emulation and the kernels' tests all take it from here.

- ``hadamard_signs(D)``: a fixed +-1 vector (torch.Generator seeded with 0);
- ``sylvester(D)``: the Sylvester Hadamard matrix, H[i, j] = (-1)^popcount(i & j), H H^T = D I;
- ``rotation_pm1(D)`` = diag(signs) @ H: entries +-1 (exact in bf16/fp16), Rpm1 Rpm1^T = D I. The INT8 prep uses
  Q' = (Q @ Rpm1) / D and K' = K @ Rpm1, so Q' K'^T = Q K^T in real arithmetic (/D is a power of two);
- ``hadamard_rotation(D, seed)``: the orthonormal diag(signs) @ H / sqrt(D) (``rotate_qk`` of the e4m3
  emulation; ``fp8_emulation`` re-exports it).

Power-of-two D only.
"""

from __future__ import annotations

import math

import torch

from ditprof.errors import DitprofError


def _check_pow2(head_dim: int) -> None:
    if not isinstance(head_dim, int) or head_dim < 1 or head_dim & (head_dim - 1):
        raise DitprofError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")


def hadamard_signs(head_dim: int, seed: int = 0) -> torch.Tensor:
    """(head_dim,) float64 +-1 on the CPU: ``torch.randint(0, 2, (D,), generator=gen) * 2 - 1``, gen seeded."""
    _check_pow2(head_dim)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (head_dim,), generator=gen).double() * 2 - 1


def sylvester(head_dim: int) -> torch.Tensor:
    """(head_dim, head_dim) float64 Sylvester Hadamard matrix on the CPU (entries +-1, symmetric)."""
    _check_pow2(head_dim)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < head_dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotation_pm1(head_dim: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """diag(hadamard_signs(D)) @ sylvester(D): entries +-1 (exact in any float dtype), Rpm1 @ Rpm1.T = D * I."""
    return (hadamard_signs(head_dim)[:, None] * sylvester(head_dim)).to(dtype=dtype, device=device)


def hadamard_rotation(head_dim: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """An orthogonal (head_dim, head_dim) fp32 matrix diag(random signs) @ H / sqrt(head_dim), H the Sylvester
    Hadamard matrix (FA3's "incoherent processing"): Q R (K R)^T = Q K^T, while a few large channels of Q and K
    spread over all of them, so a per-head scale no longer leaves the other channels coarse."""
    signs = hadamard_signs(head_dim, seed)
    return (signs[:, None] * sylvester(head_dim) / math.sqrt(head_dim)).float().to(device)


__all__ = ["hadamard_rotation", "hadamard_signs", "rotation_pm1", "sylvester"]
