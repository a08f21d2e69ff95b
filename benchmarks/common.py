"""Shared benchmark helpers: environment record, CUDA-event timing, JSON results, rich tables.

Importable without a GPU (and without rich: tables then print as plain text).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.metadata as _md
import json
import os
import platform
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[1]

if str(REPO_ROOT) not in sys.path:  # run as `python benchmarks/x.py` from anywhere
    sys.path.insert(0, str(REPO_ROOT))


def _pkg_version(*names: str) -> Optional[str]:
    for name in names:
        try:
            return _md.version(name)
        except _md.PackageNotFoundError:
            continue
    return None


def _module_version(module: str) -> Optional[str]:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "present"))


def environment() -> dict[str, Any]:
    """Machine, GPU, date and the versions that matter for attention timings."""
    import torch

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": None,
        "gpu": None,
        "gpu_capability": None,
        "gpu_count": 0,
        "triton": _pkg_version("triton") or _module_version("triton"),
        "cutlass_dsl": _pkg_version("nvidia-cutlass-dsl"),
        "cudnn_frontend": _pkg_version("nvidia-cudnn-frontend") or _module_version("cudnn"),
        "flash_attn": _pkg_version("flash-attn", "flash_attn", "flash-attn-cute") or _module_version("flash_attn"),
        "sageattention": _pkg_version("sageattention") or _module_version("sageattention"),
        "fa3_fwd": _pkg_version("fa3_fwd", "fa3-fwd"),
        "ditprof_git": _git_head(),
    }
    try:
        env["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    if torch.cuda.is_available():
        env["gpu_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = props.name
        env["gpu_capability"] = f"sm_{props.major}{props.minor}"
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["gpu_sms"] = props.multi_processor_count
        try:
            env["driver"] = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
        except Exception:
            env["driver"] = None
    return env


def _git_head() -> Optional[str]:
    try:
        import subprocess

        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=5)
        return r.stdout.strip() or None
    except Exception:
        return None


def cuda_ready() -> tuple[bool, str]:
    try:
        import torch
    except Exception as exc:
        return False, f"torch import failed: {exc}"
    if not torch.cuda.is_available():
        return False, f"needs CUDA (torch {torch.__version__} sees no CUDA device)"
    return True, ""


def time_cuda(fn: Callable[[], Any], *, warmup: int = 3, iters: int = 10) -> dict[str, Any]:
    """Warm up, then time ``iters`` calls, each between its own pair of CUDA events; median in ms."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {
        "ms": statistics.median(ms),
        "ms_min": min(ms),
        "ms_max": max(ms),
        "iters": iters,
        "warmup": warmup,
    }


def run_entry(
    name: str,
    make: Callable[[], Callable[[], Any]],
    *,
    flops: Optional[float] = None,
    nbytes: Optional[float] = None,
    warmup: int = 3,
    iters: int = 10,
    note: str = "",
) -> dict[str, Any]:
    """Build (``make`` returns the callable; it may raise ``Skip``) and time one entry; never raises."""
    import torch

    rec: dict[str, Any] = {"name": name, "status": "ok", "note": note}
    try:
        fn = make()
        rec.update(time_cuda(fn, warmup=warmup, iters=iters))
        if flops:
            rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
        if nbytes:
            rec["gbps"] = nbytes / (rec["ms"] * 1e-3) / 1e9
    except Skip as exc:
        rec["status"] = "skipped"
        rec["error"] = str(exc)
    except Exception as exc:
        rec["status"] = "failed"
        rec["error"] = f"{type(exc).__name__}: {exc}".strip()[:2000]
        rec["traceback"] = traceback.format_exc(limit=6)[-4000:]
    finally:
        try:
            torch.cuda.synchronize()
        except Exception as exc:  # a sticky CUDA error poisons the rest of the process: say so
            rec.setdefault("error", f"synchronize failed: {exc}")
            rec["status"] = "failed"
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rec


class Skip(Exception):
    """Raised by an entry's ``make`` when the backend is not installed or not supported here."""


def results_path(prefix: str, when: Optional[_dt.date] = None) -> Path:
    when = when or _dt.date.today()
    return RESULTS_DIR / f"{prefix}-{when.isoformat()}.json"


def write_json(payload: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    tmp.replace(path)
    return path


def _json_default(obj):
    try:
        return float(obj)
    except Exception:
        return str(obj)


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def print_table(title: str, columns: list[str], rows: Iterable[list[Any]]) -> None:
    rows = [[fmt(c) for c in r] for r in rows]
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_lines=False)
        for i, c in enumerate(columns):
            table.add_column(c, justify="left" if i == 0 or c == "status" or c.startswith("note") else "right",
                             overflow="fold")
        for r in rows:
            table.add_row(*r)
        Console(width=max(120, 20 * len(columns))).print(table)
    except ImportError:
        print(title)
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
