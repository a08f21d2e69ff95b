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


def device_busy_us(trace: dict) -> float:
    """GPU time of every kernel, memcpy and memset in the trace (what HTA's kernel breakdown covers)."""
    cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    return sum(float(e.get("dur", 0)) for e in trace["traceEvents"] if e.get("cat") in cats and e.get("ph") == "X")


def check_hta(folder: Path) -> dict:
    """Run the HTA analyses a user would on a GPU run and check them; returns the numbers for the caller."""
    import contextlib
    import io

    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()):
        ta = TraceAnalysis(trace_dir=str(folder))
        by_type, by_kernel = ta.get_gpu_kernel_breakdown(visualize=False)
        temporal = ta.get_temporal_breakdown(visualize=False)
    busy = device_busy_us(raw_trace(folder))
    assert busy > 0, "no GPU kernels in the trace"
    assert abs(float(by_type["sum"].sum()) - busy) <= 1e-3 * busy + 2, (float(by_type["sum"].sum()), busy)
    row = temporal.iloc[0]
    parts = float(row["idle_time(us)"]) + float(row["compute_time(us)"]) + float(row["non_compute_time(us)"])
    assert abs(parts - float(row["kernel_time(us)"])) <= 1e-3 * parts + 2, row.to_dict()
    assert float(row["compute_time(us)"]) > 0
    return {"busy_us": busy, "by_kernel_rows": len(by_kernel), "temporal": row.to_dict()}
