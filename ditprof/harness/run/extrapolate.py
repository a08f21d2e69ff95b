"""From one block to the whole model: N blocks x steps x (2 with CFG), and Amdahl's prediction."""

from __future__ import annotations

import math

from ditprof.harness.run.noise import NUMERICS_ONLY_WHY

# the extrapolation's ``speedup_note`` where the ratios are None: what the summary prints in their place
NUMERICS_ONLY_NOTE = f"numerics only: {NUMERICS_ONLY_WHY}"

def scale_factor(n_blocks: int, steps: int | None = None, cfg: bool = False) -> int:
    if n_blocks < 1:
        raise ValueError("n_blocks must be >= 1")
    f = n_blocks
    if steps:
        f *= steps
    if cfg:
        f *= 2
    return f


def band(block_ms: dict[str, float], factor: int) -> dict[str, float]:
    return {k: block_ms[k] * factor for k in ("median", "min", "max")}


def amdahl(attention_share: float, attention_speedup: float) -> float:
    """Whole-block speedup when only the attention part (``attention_share`` of the time) gets faster."""
    if not 0.0 <= attention_share <= 1.0:
        raise ValueError("attention_share must be within [0, 1]")
    if attention_speedup <= 0 or math.isnan(attention_speedup):
        raise ValueError("attention_speedup must be > 0")
    return 1.0 / ((1.0 - attention_share) + attention_share / attention_speedup)


def extrapolate(
    *,
    n_blocks: int,
    baseline_block_ms: dict[str, float],
    swapped_block_ms: dict[str, float] | None = None,
    baseline_attention_share: float | None = None,
    baseline_attention_ms: float | None = None,
    swapped_attention_ms: float | None = None,
    steps: int | None = None,
    cfg: bool = False,
    numerics_only: bool = False,
) -> dict:
    """The report's ``extrapolation`` section.

    ``baseline_ms``/``swapped_ms`` are medians scaled to the whole model (``*_band`` hold min/max);
    ``speedup`` is measured (baseline/swapped medians); ``amdahl_predicted_speedup`` uses the baseline
    attention share and the attention-only speedup from the profiler split. ``numerics_only``: the swap emulates
    a kernel's numerics, so its times are kept but every ratio derived from them is None and ``speedup_note``
    says why (as the summary's "numerics only").
    """
    factor = scale_factor(n_blocks, steps, cfg)
    out: dict = {
        "n_blocks": n_blocks,
        "steps": steps or 1,
        "cfg": bool(cfg),
        "factor": factor,
        "baseline_ms": baseline_block_ms["median"] * factor,
        "baseline_band_ms": band(baseline_block_ms, factor),
        "swapped_ms": None,
        "swapped_band_ms": None,
        "speedup": None,
        "attention_speedup": None,
        "amdahl_predicted_speedup": None,
        "amdahl_predicted_swapped_block_ms": None,
        "measured_swapped_block_ms": None,
        "speedup_note": None,
    }
    if swapped_block_ms is None:
        return out
    out["swapped_ms"] = swapped_block_ms["median"] * factor
    out["swapped_band_ms"] = band(swapped_block_ms, factor)
    out["measured_swapped_block_ms"] = swapped_block_ms["median"]
    if numerics_only:
        out["speedup_note"] = NUMERICS_ONLY_NOTE
        return out
    out["speedup"] = baseline_block_ms["median"] / swapped_block_ms["median"]
    if baseline_attention_share is not None and baseline_attention_ms and swapped_attention_ms:
        a = baseline_attention_ms / swapped_attention_ms
        pred = amdahl(baseline_attention_share, a)
        out["attention_speedup"] = a
        out["amdahl_predicted_speedup"] = pred
        out["amdahl_predicted_swapped_block_ms"] = baseline_block_ms["median"] / pred
    return out
