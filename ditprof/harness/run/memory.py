"""``--gpu-memory``: make a big GPU behave like a smaller card, and turn an OOM into one line."""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch

from ditprof.errors import DitprofError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_size(text: str) -> int:
    """``16GiB``, ``16 GB``, ``24g``, ``8000MiB``, ``1.5TiB`` -> bytes (``G``/``GB`` are decimal)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise DitprofError(f"--gpu-memory {text!r} is not a size; write e.g. 16GiB, 24GB or 8000MiB")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise DitprofError(f"--gpu-memory {text!r} must be larger than zero")
    return int(value)


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


@contextlib.contextmanager
def memory_budget(budget: str | None, device: torch.device) -> Iterator[int | None]:
    """Cap this process at ``budget`` bytes of ``device`` memory (None: no cap); OOM -> DitprofError.

    The fraction is restored on exit. Yields the budget in bytes.
    """
    if budget is None:
        with oom_as_error(None, device):
            yield None
        return
    nbytes = parse_size(budget)
    if device.type != "cuda":
        raise DitprofError(f"--gpu-memory {budget} needs --device cuda (this run is on {device.type})")
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    if nbytes > total:
        raise DitprofError(
            f"--gpu-memory {budget} ({fmt_bytes(nbytes)}) is larger than the card "
            f"({torch.cuda.get_device_name(index)}: {fmt_bytes(total)})"
        )
    torch.cuda.set_per_process_memory_fraction(nbytes / total, index)
    try:
        with oom_as_error(nbytes, device):
            yield nbytes
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)


@contextlib.contextmanager
def oom_as_error(budget_bytes: int | None, device: torch.device) -> Iterator[None]:
    try:
        yield
    except torch.OutOfMemoryError as exc:
        peak = None
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
            torch.cuda.empty_cache()
        limit = f"budget {fmt_bytes(budget_bytes)}" if budget_bytes else "no --gpu-memory budget (whole card)"
        raise DitprofError(
            f"out of memory on {device}: {limit}, peak reached {fmt_bytes(peak)}; "
            f"try fewer tokens or a larger --gpu-memory"
        ) from exc
