"""HolisticTraceAnalysis on one ditprof tb/<run>/ folder, with the answers checked against the raw trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def raw_trace(folder: Path) -> dict:
    (f,) = [p for p in Path(folder).iterdir() if p.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))]
    opener = gzip.open if f.suffix == ".gz" else open
    with opener(f, "rt") as fh:
        return json.load(fh)


def device_busy_us(trace: dict, drop_last_step: bool = True) -> tuple[float, int]:
    """(GPU time, count) of the kernels, memcpys and memsets launched inside the profiler steps HTA analyses (it
    leaves out the last ``ProfilerStep`` by default)."""
    events = trace["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X")
    if drop_last_step and len(steps) > 1:
        steps = steps[:-1]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    total, count = 0.0, 0
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            t = launch.get(e.get("args", {}).get("correlation"))
            if t is not None and any(a <= t <= b for a, b in steps):
                total += float(e["dur"])
                count += 1
    return total, count


def check_hta(folder: Path) -> dict:
    """Run the HTA analyses a user would on a GPU run and check them; returns the numbers for the caller."""
    import contextlib
    import io

    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()):
        ta = TraceAnalysis(trace_dir=str(folder))
        by_type, by_kernel = ta.get_gpu_kernel_breakdown(visualize=False)
        temporal = ta.get_temporal_breakdown(visualize=False)
    busy, n = device_busy_us(raw_trace(folder))
    assert busy > 0, "no GPU kernels in the trace"
    # the same device events as the raw trace: every kernel / memcpy / memset of the analysed steps, none twice
    df = ta.t.get_trace(0)
    sym = ta.t.symbol_table.get_sym_table()
    device = df[df["cat"].map(lambda i: sym[i]).isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    assert len(device) == n, (len(device), n)
    # and their time: HTA keeps whole microseconds (it rounds ns timestamps down and trims overlaps), about 1 us
    # per event, so the two sums agree to n us plus 1 %
    hta_us = float(by_type["sum"].sum())
    assert abs(hta_us - busy) <= n + 0.01 * busy, (hta_us, busy, n)
    row = temporal.iloc[0]
    parts = float(row["idle_time(us)"]) + float(row["compute_time(us)"]) + float(row["non_compute_time(us)"])
    assert abs(parts - float(row["kernel_time(us)"])) <= 1e-3 * parts + 2, row.to_dict()
    assert float(row["compute_time(us)"]) > 0
    return {"busy_us": busy, "by_kernel_rows": len(by_kernel), "temporal": row.to_dict()}
