"""What ``profile``/``compare`` and their ``--sp`` variant share: the report's model section, the progress of one
backend's phases, the bytes a run keeps resident, the run folder's files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from ditprof.errors import DitprofError
from ditprof.harness.report import document
from ditprof.harness.report import plots
from ditprof.harness.report import summary as report
from ditprof.harness.run import atomic
from ditprof.progress import LineProgress


def resident_bytes(obj: Any) -> int:
    """Device bytes a nest of tensors holds: whole storages (a view counts the storage it keeps alive), meta tensors
    nothing -- unlike ``model_blocks.memory.tensor_bytes``, the numel x size that estimates count."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "meta":
            return 0
        try:
            return obj.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001
            return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(resident_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(resident_bytes(o) for o in obj.values())
    return 0


def model_section(spec: Any, loaded: Any, inputs: Any) -> dict:
    """The report's ``model`` section: what ran, from the run spec, the loaded block and its inputs."""
    g = lambda o, k, d=None: getattr(o, k, d)  # noqa: E731
    family = g(loaded, "family")
    return {
        "preset": spec.source if spec.source_kind == "preset" else None,
        "checkpoint": spec.source if spec.source_kind == "checkpoint" else None,
        "source": str(g(loaded, "source", spec.source)),
        "family": g(family, "name", str(family)),
        "block_class": type(loaded.module).__name__,
        "kind": g(loaded, "kind"),
        "block_index": g(loaded, "index", spec.block),
        "n_blocks": spec.n_blocks or g(loaded, "n_blocks"),
        "model_n_blocks": g(loaded, "n_blocks"),
        "heads": g(loaded, "heads"),
        "head_dim": g(loaded, "head_dim"),
        "tokens": g(inputs, "tokens"),
        "text_tokens": g(inputs, "text_tokens"),
        "grid": str(g(inputs, "grid")) if g(inputs, "grid") is not None else None,
        # a packed family: how the one sequence splits into its modalities' rows, in words
        "layout": (g(inputs, "grid").describe() if getattr(g(inputs, "grid"), "packed", False) else None),
        "batch": spec.batch,
        "dtype": str(spec.dtype).replace("torch.", ""),
        "block_params": g(loaded, "params"),
        "block_bytes": g(loaded, "bytes"),
        "load_s": g(loaded, "load_s"),
        "uses_dispatcher": g(family, "uses_dispatcher"),
        "attention_mask": g(inputs, "mask_note"),
    }


class Phases:
    """rich progress for warm-up / timing / profiling of one backend: ``phases(name, done, total)``, called as each
    call of a phase ends (``session.measure``'s ``on_phase``)."""

    def __init__(self, progress: Progress | None, label: str):
        self.progress = progress
        self.label = label
        self.tasks: dict[str, Any] = {}
        # the line progress's own clock, so that a phase's start and its lines' times are read off one clock
        self.clock = progress.clock if isinstance(progress, LineProgress) else time.monotonic
        self.last = self.clock()  # a phase starts where the previous report left off

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.progress is None:
            return
        if phase not in self.tasks:
            # a phase reported first at its end (one warm-up call) is dated from the previous report
            start = {"start": self.last} if isinstance(self.progress, LineProgress) else {}
            self.tasks[phase] = self.progress.add_task(f"{self.label}: {phase}", total=total, completed=done,
                                                       **start)
        self.progress.update(self.tasks[phase], completed=done, total=total)
        self.last = self.clock()


def plot_title(rep: dict) -> str:
    """split.png's title: what ran, in which time unit; for --sp, which rank's columns these are."""
    m = rep["model"]
    unit = "GPU kernel time" if rep["baseline"]["split_mode"] == "cuda" else "CPU op self time"
    execution = rep["settings"].get("execution", "eager")
    title = (f"{m.get('preset') or m.get('checkpoint')} block {m['block_index']}, {m['tokens']} tokens"
             + ("" if execution == "eager" else f", {execution}") + f" ({unit})")
    sp = rep.get("sp")
    if sp:  # the columns are one rank's: say which
        title += (f"\nrank {rep['baseline'].get('rank', 0)} of {sp['degree']} (the slowest), "
                  f"{sp['tokens_per_rank']} tokens per rank")
    return title


def write_run(stage: Path, rep: dict, fail_after: str | None = None) -> None:
    """split.png, report.md and report.json of one run into its staging folder (report.json last)."""
    runs = document.configurations_of(rep)  # one bar per configuration
    atomic.write_bytes(stage / "split.png", plots.split_png(runs, plot_title(rep), note=plots.speedup_note(rep)))
    atomic.write_text(stage / "report.md", report.markdown(rep))
    if fail_after == "write":
        raise DitprofError("forced failure while writing (test)")
    atomic.write_text(stage / "report.json", document.to_json(rep))
