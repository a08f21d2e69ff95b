"""report.json: the sections of a run (``run_section``), the whole document (``build``, schema ``ditprof.report/1``,
``report.schema.json`` beside this module), its ``configurations`` (every measured configuration in order, each with
its accuracy, model time and change against the one before: ``configuration_entries``, ``configurations_of``) and
its JSON text."""

from __future__ import annotations

import json
from typing import Any, Sequence

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


def change_vs_previous(prev: dict, sec: dict) -> dict:
    """A configuration's change against the one measured before it: ``speedup`` = previous / this median block time
    (None with ``speedup_note`` where either is numerics only, as ``extrapolate`` does) and the noise verdicts of
    the block samples (``block``) and of the CUDA-graph replays (``graph``)."""
    from ditprof.harness.run import noise
    from ditprof.harness.run.extrapolate import NUMERICS_ONLY_NOTE

    emulated = noise.section_numerics_only(prev) or noise.section_numerics_only(sec)
    return {"previous": prev["label"],
            "previous_configuration": prev.get("configuration") or prev["attention_backend"],
            "speedup": None if emulated else prev["block_ms"]["median"] / sec["block_ms"]["median"],
            "speedup_note": NUMERICS_ONLY_NOTE if emulated else None,
            "block": noise.change(prev.get("samples_ms"), sec.get("samples_ms"), numerics_only=emulated),
            "graph": noise.change(prev.get("graph_samples_ms"), sec.get("graph_samples_ms"),
                                  numerics_only=emulated)}


def configuration_entries(sections: list[dict], accuracies: list[dict | None], extrapolations: list[dict | None],
                          baseline_band_ms: dict | None) -> list[dict]:
    """The report's ``configurations``: each run section (a copy) with its ``accuracy`` against the baseline, its
    ``extrapolation`` against the baseline (the report's section of that form; None for the baseline itself), its
    own whole-model time (``model_ms``, ``model_band_ms``) and ``change_vs_previous`` (None for the first)."""
    out = []
    for i, sec in enumerate(sections):
        ex = extrapolations[i]
        band = baseline_band_ms if i == 0 else (ex or {}).get("swapped_band_ms")
        out.append({**sec, "accuracy": accuracies[i], "extrapolation": ex,
                    "model_ms": band["median"] if band else None, "model_band_ms": band,
                    "change_vs_previous": change_vs_previous(sections[i - 1], sec) if i else None})
    return out


def configurations_of(report: dict) -> list[dict]:
    """Every configuration of ``report`` in order: its ``configurations``, or, for a report without them (written
    before they existed, or built by hand), entries made from its baseline and swapped sections."""
    if report.get("configurations"):
        return report["configurations"]
    sections = [s for s in (report.get("baseline"), report.get("swapped")) if s]
    ex = report.get("extrapolation") or {}
    return configuration_entries(sections, [None, report.get("accuracy")][:len(sections)],
                                 [None, ex][:len(sections)], ex.get("baseline_band_ms"))


def sections_of(report: dict) -> list[dict]:
    """Every measured run section of ``report`` in order (the configurations, or its baseline and swapped ones), for
    readers that need the sections alone (per-run tables of ops, launches, limits)."""
    return report.get("configurations") or [s for s in (report.get("baseline"), report.get("swapped")) if s]


def build(*, command: str, model: dict, environment: dict, settings: dict, baseline: BackendRun | dict,
          swapped: BackendRun | dict | None, extrapolation: dict, accuracy_section: dict | None,
          files: list[str], created: str, middle: Sequence[tuple[BackendRun | dict, dict | None, dict]] = (),
          **extra: Any) -> dict:
    """``baseline``/``swapped``: a run, or an already built section (sequence parallel: the slowest rank's
    section with per-rank fields). ``middle``: (run, accuracy, extrapolation against the baseline) of the
    configurations measured between them (``compare --each-swap``), in order. ``extra``: more top-level sections
    (``sp``)."""
    def section(run):
        return run if isinstance(run, dict) or run is None else run_section(run)

    from ditprof.harness.run import noise

    base, sw = section(baseline), section(swapped)
    emulated = bool(sw) and noise.section_numerics_only(sw)
    ends = [(base, None, None)] + ([(sw, accuracy_section, extrapolation)] if sw else [])
    runs = ends[:1] + [(section(r), acc, ex) for r, acc, ex in middle] + ends[1:]
    configurations = configuration_entries([r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs],
                                           extrapolation.get("baseline_band_ms"))
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
        "configurations": configurations,
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
