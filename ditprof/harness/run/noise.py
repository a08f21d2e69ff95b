"""Whether a before/after difference is a result or noise, and what is likely making the timings noisy.

A change is "within noise" when the interquartile ranges of the two sample sets overlap, or when either set
spreads by more than ``SPREAD_LIMIT`` of its median (p75 - p25 over the median): then the ratio of medians is
shown but not claimed. Timings of a numerics emulation are never a speed result.
"""

from __future__ import annotations

import os
import statistics

SPREAD_LIMIT = 0.25  # (p75 - p25) / median above this: the samples are too noisy to rank
LOAD_LIMIT = 0.75  # load average per core above this: the CPU is shared with other work
NUMERICS_ONLY_WHY = "the swapped backend emulates a kernel's numerics in torch: its time is not a speed"


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    """(p25, median, p75) of ``samples`` (inclusive method: defined for 1 or more samples)."""
    xs = sorted(samples)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def spread(samples: list[float]) -> float:
    p25, med, p75 = quartiles(samples)
    return (p75 - p25) / med if med > 0 else float("inf")


def section_numerics_only(sec: dict) -> bool:
    """A report's run section whose time is no speed: a swap in it emulates numerics (its ``numerics_only``, which
    the measurement records from its swaps) or, in sections written without that field, its attention backend
    does."""
    from ditprof.kernels import registry

    return bool(sec.get("numerics_only") or registry.is_numerics_only(sec["attention_backend"]))


def change(base: list[float] | None, new: list[float] | None, *, numerics_only: bool = False) -> dict | None:
    """{ratio (base/new medians), verdict: faster | slower | within noise | numerics only, spreads, why}."""
    if not base or not new:
        return None
    b25, bm, b75 = quartiles(base)
    n25, nm, n75 = quartiles(new)
    out = {"ratio": bm / nm if nm > 0 else float("inf"), "baseline_spread": spread(base), "new_spread": spread(new),
           "baseline_iqr_ms": [b25, b75], "new_iqr_ms": [n25, n75]}
    if numerics_only:
        return {**out, "verdict": "numerics only",
                "why": NUMERICS_ONLY_WHY}
    noisy = max(out["baseline_spread"], out["new_spread"])
    if noisy > SPREAD_LIMIT:
        return {**out, "verdict": "within noise",
                "why": f"samples spread {noisy * 100:.0f}% of their median (limit {SPREAD_LIMIT * 100:.0f}%)"}
    if b25 <= n75 and n25 <= b75:
        return {**out, "verdict": "within noise", "why": "the interquartile ranges overlap"}
    return {**out, "verdict": "faster" if nm < bm else "slower", "why": ""}


def paired(base_rounds: list[list[float]], new_rounds: list[list[float]]) -> dict:
    """Interleaved rounds (``session.time_interleaved``): each round's ratio of medians (base / new), and a verdict
    from their quartiles -- faster when even the 25th percentile ratio is above 1, slower when the 75th is below."""
    ratios = [statistics.median(b) / statistics.median(n) for b, n in zip(base_rounds, new_rounds)]
    p25, med, p75 = quartiles(ratios)
    out = {"ratio": med, "round_ratios": ratios, "ratio_iqr": [p25, p75]}
    if p25 > 1.0:
        return {**out, "verdict": "faster", "why": ""}
    if p75 < 1.0:
        return {**out, "verdict": "slower", "why": ""}
    return {**out, "verdict": "within noise", "why": "the per-round ratios' interquartile range contains 1"}


def likely_causes(device: str) -> list[str]:
    """What is likely making timings noisy on this machine, in words (empty: nothing found)."""
    causes = []
    try:
        load = os.getloadavg()[0]
        cores = os.cpu_count() or 1
        if load / cores > LOAD_LIMIT:
            causes.append(f"busy CPU: load average {load:.1f} on {cores} cores")
    except OSError:
        pass
    if device.startswith("cuda"):
        causes.extend(_gpu_clock_notes())
    return causes


def _gpu_clock_notes() -> list[str]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        top = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    except Exception:  # noqa: BLE001 -- no NVML on this machine: nothing to say
        return []
    idle = getattr(pynvml, "nvmlClocksThrottleReasonGpuIdle", 1)
    if top and sm < 0.9 * top and reasons & ~idle:
        return [f"GPU SM clock {sm} MHz of {top} MHz (throttle reasons 0x{reasons:x})"]
    return []


def assess(baseline: dict, swapped: dict | None, device: str, *, numerics_only: bool = False) -> dict:
    """The report's ``noise`` section from two run sections (``samples_ms``, ``graph_samples_ms``)."""
    block = change(baseline.get("samples_ms"), swapped.get("samples_ms") if swapped else None,
                   numerics_only=numerics_only)
    graph = change(baseline.get("graph_samples_ms"), swapped.get("graph_samples_ms") if swapped else None,
                   numerics_only=numerics_only)
    spreads = {"baseline": spread(baseline["samples_ms"])} if baseline.get("samples_ms") else {}
    if swapped and swapped.get("samples_ms"):
        spreads["swapped"] = spread(swapped["samples_ms"])
    noisy = [k for k, v in spreads.items() if v > SPREAD_LIMIT]
    overheads = {k: sec["profiler_overhead_pct"] for k, sec in (("baseline", baseline), ("swapped", swapped))
                 if sec and sec.get("profiler_overhead_pct") is not None}
    warning = None
    if noisy or (block and block["verdict"] == "within noise"):
        causes = likely_causes(device)
        what = (f"timings of {' and '.join(noisy)} spread more than {SPREAD_LIMIT * 100:.0f}% of their median"
                if noisy else "the before/after difference is within the run-to-run spread")
        warning = what + ("; likely cause: " + "; ".join(causes) if causes else
                          "; more --iters or a quieter machine would tell")
    return {"method": f"interquartile ranges (p25-p75) of the samples; spread = IQR / median, limit "
                      f"{SPREAD_LIMIT * 100:.0f}%", "block": block, "graph": graph, "spread": spreads,
            "negative_profiler_overhead": sorted(k for k, v in overheads.items() if v < 0),
            "numerics_only": numerics_only, "warning": warning}
