"""Versions and hardware for the report."""

from __future__ import annotations

import platform
from importlib import metadata

import torch


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device | str | None = None, head_dim: int | None = None) -> dict:
    """Machine, versions and process settings; ``head_dim``: the run's, for the Q/K format the fp8 backends take
    for it (INT8 where the rotation applies, kernels.qk_format)."""
    device = torch.device(device) if device is not None else None
    cuda_ok = torch.cuda.is_available()
    gpu = None
    gpu_mem = None
    capability = None
    if cuda_ok and (device is None or device.type == "cuda"):
        idx = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        gpu = props.name
        gpu_mem = int(props.total_memory)
        capability = f"{props.major}.{props.minor}"
    cudnn = None
    try:
        if torch.backends.cudnn.is_available():
            cudnn = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - a broken cuDNN install only means "unknown"
        cudnn = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "gpu": gpu,
        "gpu_memory_bytes": gpu_mem,
        "gpu_capability": capability,
        "nvidia_cutlass_dsl": _dist_version("nvidia-cutlass-dsl"),
        "diffusers": _dist_version("diffusers"),
        "ditprof": _dist_version("ditprof") or _own_version(),  # run from a checkout (PYTHONPATH): no dist
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device) if device is not None else ("cuda" if cuda_ok else "cpu"),
        "fp8_qk_format": _fp8_qk_format(head_dim),  # how the fp8 backends quantize this run's Q and K
    }


def _fp8_qk_format(head_dim: int | None) -> str:
    from ditprof.kernels.qk_format import qk_format

    return qk_format(head_dim=head_dim)


def _own_version() -> str:
    from ditprof import __version__

    return __version__
