"""report.json: the sections of a run (``run_section``), the whole document (``build``, schema ``ditprof.report/1``,
``report.schema.json`` beside this module) and its JSON text."""

from __future__ import annotations

import json
from typing import Any

import torch

from ditprof.harness.run.metrics import accuracy  # noqa: F401 -- the report's accuracy section, as callers use it
from ditprof.harness.run.session import BackendRun

SCHEMA = "ditprof.report/1"


def run_section(run: BackendRun) -> dict:
    sp = run.split
    return {
        "label": run.label,
        "attention_backend": run.backend,
        "route": run.route,
        "block_ms": run.block_ms,
        "timing_source": run.timing_source,
        "samples_ms": run.samples_ms,
        "profiled_block_ms": run.profiled_block_ms,
        "profiler_overhead_pct": run.profiler_overhead_pct,
        "graph_block_ms": run.graph_block_ms,  # CUDA-graph replays (GPU), or None: graph_note says why
        "graph_samples_ms": run.graph_samples_ms,
        "graph_note": run.graph_note,
        "split_mode": sp.mode,  # "cuda": device kernel time; "cpu": aten op self time
        "split_ms": sp.split_ms,
        "split_total_ms": sp.total_ms,
        "attention_share": sp.attention_share,
        "split_iterations": sp.iterations,
        "split_iterations_used": sp.iterations_used,  # slower than 1.5x the median call: left out
        "split_links": sp.resolved,
        "top_ops": sp.top_ops,
        "split_bytes": run.split_bytes,  # norm / elementwise bytes per call from the recorded shapes
        "peak_memory_bytes": run.peak_memory_bytes,
        "peak_memory_source": run.peak_memory_source,
        "trace": run.trace_file,
        "tb_trace": run.tb_file,
        **run.extra,
    }


def size_settings(inputs: Any) -> dict:
    """The settings' pixel size as requested and as the blocks run it (the family rounds to whole latents and
    patches; ``model_blocks.inputs.BlockInputs``); both None for a token count."""
    def size(s):
        return None if s is None else dict(zip(("height", "width", "frames"), map(int, s)))

    return {"size_requested": size(getattr(inputs, "requested_size", None)),
            "size_used": size(getattr(inputs, "used_size", None))}


def build(*, command: str, model: dict, environment: dict, settings: dict, baseline: BackendRun | dict,
          swapped: BackendRun | dict | None, extrapolation: dict, accuracy_section: dict | None,
          files: list[str], created: str, **extra: Any) -> dict:
    """``baseline``/``swapped``: a run, or an already built section (sequence parallel: the slowest rank's
    section with per-rank fields). ``extra``: more top-level sections (``sp``)."""
    def section(run):
        return run if isinstance(run, dict) or run is None else run_section(run)

    from ditprof.harness.run import noise
    from ditprof.kernels import registry

    base, sw = section(baseline), section(swapped)
    emulated = bool(sw) and bool(sw.get("numerics_only") or registry.is_numerics_only(sw["attention_backend"]))
    return {
        "schema": SCHEMA,
        "command": command,
        "created": created,
        "model": model,
        "environment": environment,
        "settings": settings,
        "baseline": base,
        "swapped": sw,
        "noise": noise.assess(base, sw, str(settings.get("device", "")), numerics_only=emulated),
        "extrapolation": extrapolation,
        "accuracy": accuracy_section,
        "files": files,
        **extra,
    }


def to_json(report: dict) -> str:
    def default(o: Any):
        if isinstance(o, (torch.dtype, torch.device)):
            return str(o)
        if hasattr(o, "item"):
            return o.item()
        return str(o)

    return json.dumps(report, indent=2, default=default, allow_nan=True) + "\n"
