"""How close a swapped block's output is to the baseline's (used by the session, the reports and --sp)."""

from __future__ import annotations

import math

import torch


def accuracy(baseline: torch.Tensor, swapped: torch.Tensor, chunk: int = 1 << 22) -> dict:
    """rel-RMS and cosine of the swapped block output against the baseline output.

    Accumulated in float64 over chunks, so a 30k-token x 7168 output does not need 2 GiB of float64 at once.
    """
    if baseline.shape != swapped.shape:
        raise ValueError(f"output shapes differ: {tuple(baseline.shape)} vs {tuple(swapped.shape)}")
    a_all = baseline.detach().reshape(-1)
    b_all = swapped.detach().reshape(-1)
    aa = bb = ab = dd = 0.0
    max_abs = 0.0
    finite = True
    for i in range(0, a_all.numel(), chunk):
        a = a_all[i:i + chunk].to("cpu", torch.float64)
        b = b_all[i:i + chunk].to("cpu", torch.float64)
        d = b - a
        aa += float(a @ a)
        bb += float(b @ b)
        ab += float(a @ b)
        dd += float(d @ d)
        max_abs = max(max_abs, float(d.abs().max())) if d.numel() else max_abs
        finite = finite and bool(torch.isfinite(b).all())
    rel = math.sqrt(dd / aa) if aa > 0 else math.inf
    denom = math.sqrt(aa * bb)
    cos = ab / denom if denom > 0 else float("nan")
    return {
        "block_output_rel_rms": rel,
        "block_output_cosine": cos,
        "block_output_max_abs_diff": max_abs,
        "finite": finite,
        "reference": "baseline block output on the same inputs",
    }
