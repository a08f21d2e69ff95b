"""The checks every measuring command (``profile``, ``compare``, ``validate``) makes of its arguments before any
work: one source, one way to give the size, counts that are counts. One-line ``DitprofError``s."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from pathlib import Path
from typing import Any

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_config import Fp8Options, default_options
from ditprof.model_blocks.source import resolve_as

DEFAULT_CUDA_PRESET = "h3"
DEFAULT_CPU_PRESET = "h3-mini"


def fp8_options_of(args: Any) -> Fp8Options | None:
    """The run's ``Fp8Options`` from ``--no-fp8-graphs`` / ``--no-tvm-ffi`` (the process's options with those
    fields turned off); None without either flag: the process's options, ``default_options()``."""
    graphs, tvm_ffi = bool(getattr(args, "fp8_graphs", True)), bool(getattr(args, "tvm_ffi", True))
    if graphs and tvm_ffi:
        return None
    return dataclasses.replace(default_options(), graphs=graphs, tvm_ffi=tvm_ffi)


def source_of(args: Any, device: torch.device) -> tuple[str, str]:
    """(source, "preset" | "checkpoint"): ``--checkpoint``, else ``--preset``, else the default preset of the
    device; checked by ``model_blocks.source.resolve_as``."""
    if args.preset and args.checkpoint:
        raise DitprofError("give --preset or --checkpoint, not both")
    # resolved here, so a bad name is one line before any work (and before any network call)
    if args.checkpoint:
        return resolve_as(args.checkpoint, "checkpoint").text, "checkpoint"
    name = args.preset or (DEFAULT_CUDA_PRESET if device.type == "cuda" else DEFAULT_CPU_PRESET)
    return resolve_as(name, "preset").text, "preset"


def check_size(args: Any) -> None:
    if args.tokens is not None and any(v is not None for v in (args.height, args.width, args.frames)):
        raise DitprofError("give --tokens or --height/--width/--frames, not both")
    if (args.height is None) != (args.width is None):
        raise DitprofError("--height and --width go together")


def check_counts(args: Any, positive: tuple[str, ...], non_negative: tuple[str, ...] = ("warmup",)) -> None:
    """``positive`` options must be >= 1 and ``non_negative`` ones >= 0 where given (option names as attributes)."""
    for opt in positive:
        v = getattr(args, opt, None)
        if v is not None and v < 1:
            raise DitprofError(f"--{opt.replace('_', '-')} must be >= 1 (got {v})")
    for opt in non_negative:
        v = getattr(args, opt, None)
        if v is not None and v < 0:
            raise DitprofError(f"--{opt.replace('_', '-')} must be >= 0 (got {v})")


def check_gpu_memory(args: Any) -> None:
    if getattr(args, "gpu_memory", None) is not None:
        from ditprof.harness.run.memory import parse_size

        parse_size(args.gpu_memory)  # unparsable: fail before any work


def default_out(out: str | None, name: str, prefix: str = "") -> Path:
    """``--out``, else ``traces/<prefix><name>-<timestamp>`` (``name`` slugged: a checkpoint path gives its last
    part)."""
    if out:
        return Path(out)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name.rstrip("/").split("/")[-1] or "checkpoint")
    return Path("traces") / f"{prefix}{slug}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
