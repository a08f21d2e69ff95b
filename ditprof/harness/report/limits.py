"""How close a run came to its GPU's limits: each category's achieved rate against the device's peak.

Attention and GEMM: TFLOP/s = the plan's FLOPs per block call (``run.plan``: the meta-device pass) / the
category's time in the split. Norm and elementwise: GB/s = the bytes their ops read and write
(``trace.op_bytes``, from the profiled calls' recorded shapes) / their time. The peak is the device's datasheet
figure from ``PEAKS`` (dense, no sparsity: BF16 or FP8 tensor cores, whichever the category ran in; memory
bandwidth); a device the table lacks (the CPU included), or a figure it leaves out, falls back to what the plan
measured on this device -- its matmul rate for FLOPs, its copy rate for bytes -- labelled "measured", not "peak".
A numerics emulation's time is no speed, so its category gets a rate but no share of peak.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeaks:
    """Datasheet peaks of one GPU, by ``torch.cuda.get_device_name``. TFLOP/s are dense tensor-core rates with
    FP32 accumulation (what attention and GEMM kernels use; GeForce cards run it at half their FP16-accumulate
    rate); FP16 runs take the BF16 figure (the same on every card here). None: not in the vendor's datasheet,
    or not known well enough to state."""

    name: str
    bf16_tflops: float | None
    fp8_tflops: float | None
    memory_gbs: float | None
    source: str  # the vendor document the figures come from


PEAKS: tuple[DevicePeaks, ...] = (
    # the datasheets give sparse rates beside dense ones ("* with sparsity"): the dense (half) figures here
    DevicePeaks("NVIDIA H100 80GB HBM3", 989.4, 1978.9, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"),
    DevicePeaks("NVIDIA H100 PCIe", 756.0, 1513.0, 2000.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe"),
    DevicePeaks("NVIDIA H200", 989.4, 1978.9, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM"),
    DevicePeaks("NVIDIA A100-SXM4-80GB", 312.0, None, 2039.0,
                "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM (no FP8 tensor cores)"),
    DevicePeaks("NVIDIA A100-SXM4-40GB", 312.0, None, 1555.0,
                "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM (no FP8 tensor cores)"),
    DevicePeaks("NVIDIA A100 80GB PCIe", 312.0, None, 1935.0,
                "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB PCIe (no FP8 tensor cores)"),
    DevicePeaks("NVIDIA L40S", 362.05, 733.0, 864.0, "NVIDIA L40S GPU datasheet"),
    # GeForce Ada: the FP32-accumulate rows of the Ada whitepaper's appendix (FP16-accumulate is twice these)
    DevicePeaks("NVIDIA GeForce RTX 4090", 165.2, 330.3, 1008.0,
                "NVIDIA Ada GPU Architecture whitepaper, GeForce RTX 4090, FP32 accumulate"),
    # the datasheet states FP8 (1,457 sparse) but no BF16 tensor rate: BF16 falls back to the measured rate
    DevicePeaks("NVIDIA RTX 6000 Ada Generation", None, 728.5, 960.0, "NVIDIA RTX 6000 Ada Generation datasheet"),
    # the FP32-accumulate tensor rates of GeForce Blackwell are not stated here (unsure): measured rate for FLOPs
    DevicePeaks("NVIDIA GeForce RTX 5090", None, None, 1792.0, "NVIDIA GeForce RTX 5090 specifications (memory)"),
)
_BY_NAME = {" ".join(p.name.casefold().split()): p for p in PEAKS}


def peaks_for(device_name: str | None) -> DevicePeaks | None:
    """The table's entry for a device name (case and spacing ignored), or None (unknown device, the CPU)."""
    if not device_name:
        return None
    return _BY_NAME.get(" ".join(device_name.casefold().split()))


FLOP_CATEGORIES = {"attention": "attention_flops", "gemm": "gemm_flops"}  # category -> the plan's field
BYTE_CATEGORIES = ("norm", "elementwise")
PRECISION_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _attention_format(sec: dict, dtype: str) -> tuple[str, str | None]:
    """(precision, why no share) of the run's attention: FP8 where the swap records a Q/K format or launches."""
    from ditprof.kernels import registry

    name = sec.get("attention_backend") or ""
    launches = sec.get("fp8_launches") or []
    fp8 = (sec.get("qk_format") or launches) and not (launches and all(la["kernel"] == "sdpa" for la in launches))
    precision = "fp8" if fp8 else PRECISION_OF_DTYPE.get(dtype, dtype)  # sdpa: fp8-sm120's self-check fallback
    if registry.is_numerics_only(name):
        return precision, f"numerics only: {name} emulates the FP8 kernel's numerics, its time is no speed"
    return precision, None


def _gemm_format(sec: dict, dtype: str) -> tuple[str, str | None, str]:
    """(precision, why no share, note) of the run's GEMMs: FP8 where the run's ``linears`` swap put linears in
    FP8 (no such section: the run's dtype)."""
    lin = sec.get("linears")
    if not (isinstance(lin, dict) and lin.get("swapped")):
        return PRECISION_OF_DTYPE.get(dtype, dtype), None, ""
    share = lin.get("swapped_weight_share")
    note = (f"{share * 100:.0f}% of the linears' weights in FP8" if isinstance(share, (int, float)) and share < 1
            else "")
    if lin.get("numerics_only"):
        return "fp8", "numerics only: the FP8 linears are emulated, their time is no speed", note
    return "fp8", None, note


def _flop_peak(peaks: DevicePeaks | None, precision: str, plan: dict) -> tuple[float | None, str, str | None]:
    """(peak in TFLOP/s, its source, "datasheet" / "measured") for a FLOP category."""
    figure = None
    if peaks is not None:
        figure = {"bf16": peaks.bf16_tflops, "fp16": peaks.bf16_tflops, "fp8": peaks.fp8_tflops}.get(precision)
    if figure:
        return figure, f"{peaks.name}: dense {precision.upper()} tensor peak ({peaks.source})", "datasheet"
    mm = plan.get("matmul_flops_per_s")
    if not mm:
        return None, "no peak: the plan measured no matmul rate", None
    why = ("no datasheet figure for this device" if peaks is None
           else f"the {peaks.name} entry has no {precision.upper()} figure")
    return mm / 1e12, f"measured matmul rate (the plan's square matmul in the run's dtype; {why})", "measured"


def _byte_peak(peaks: DevicePeaks | None, plan: dict) -> tuple[float | None, str, str | None]:
    if peaks is not None and peaks.memory_gbs:
        return peaks.memory_gbs, f"{peaks.name}: memory bandwidth ({peaks.source})", "datasheet"
    copy = plan.get("copy_bytes_per_s")
    if not copy:
        return None, "no peak: the plan measured no copy rate", None
    why = "no datasheet figure for this device" if peaks is None else f"the {peaks.name} entry has no memory figure"
    return copy / 1e9, f"measured copy rate (the plan's device copy, read + write; {why})", "measured"


def _entry(work: float | None, work_unit: str, ms: float | None, scale: float, unit: str, precision: str | None,
           peak: tuple[float | None, str, str | None], no_share: str | None, note: str) -> dict:
    """One category's limits; ``no_share``: why its share of peak is left out (numerics only); ``note``: more to
    say (bytes unknown, part of the linears in FP8)."""
    rate = work / (ms / 1e3) / scale if work and ms and ms > 0 else None
    value, source, kind = peak
    share = rate / value if rate is not None and value and not no_share else None
    notes = [x for x in (no_share, note) if x]
    if rate is None and not note:
        notes.append("no time in this category" if not ms else f"no {work_unit} count for this category")
    return {"work": work, "work_unit": work_unit, "ms": ms, "rate": rate, "unit": unit, "precision": precision,
            "peak": value, "peak_source": source, "peak_kind": kind, "share_of_peak": share,
            "note": "; ".join(notes)}


def run_limits(sec: dict, plan: dict, device_name: str | None, dtype: str) -> dict:
    """The ``limits`` of one run section: per category its rate, the peak it is compared with, the share.
    ``plan``: the report's plan section; ``device_name``: the environment's GPU name (None on the CPU)."""
    peaks = peaks_for(device_name)
    split = sec.get("split_ms") or {}
    out = {}
    att_precision, att_no_share = _attention_format(sec, dtype)
    gemm_precision, gemm_no_share, gemm_note = _gemm_format(sec, dtype)
    for cat, precision, no_share, note in (("attention", att_precision, att_no_share, ""),
                                           ("gemm", gemm_precision, gemm_no_share, gemm_note)):
        out[cat] = _entry(plan.get(FLOP_CATEGORIES[cat]), "FLOP", split.get(cat), 1e12, "TFLOP/s", precision,
                          _flop_peak(peaks, precision, plan), no_share, note)
    moved = sec.get("split_bytes") or {}
    for cat in BYTE_CATEGORIES:
        got = (moved.get("bytes") or {}).get(cat)
        unknown = "" if moved.get("bytes") is not None else (moved.get("note") or "bytes unknown")
        out[cat] = _entry(got, "B", split.get(cat), 1e9, "GB/s", None, _byte_peak(peaks, plan), None,
                          unknown and f"bytes unknown: {unknown}")
    return out


def add_limits(report: dict) -> None:
    """Each run section of ``report`` gets its ``limits`` (needs the report's ``plan``; an ``--sp`` report, whose
    ranks run about 1/P of the plan's FLOPs each, gets none)."""
    plan = report.get("plan")
    if not plan or report.get("sp"):
        return
    dtype = (report.get("model") or {}).get("dtype") or "bfloat16"
    gpu = (report.get("environment") or {}).get("gpu")
    for sec in [report.get("baseline"), report.get("swapped"), *(report.get("configurations") or [])]:
        if sec:  # the configurations are copies of the run sections: each gets its own
            sec["limits"] = run_limits(sec, plan, gpu, dtype)
