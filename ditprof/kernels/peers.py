"""Built-in attention backends other than the emulation: torch SDPA (plain and forced variants), FA4,
SageAttention, and the lazy ``fp8`` entry for our CuTe DSL kernel.

All take and return (B, S, H, D) (the registry contract). Optional packages are imported when a backend is
called or its availability is checked, never at import time, so listing backends stays cheap and an absent
package shows up as a reason ("flash_attn.cute not importable: No module named 'flash_attn'").
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Callable

import torch
import torch.nn.functional as F

from ditprof.kernels.registry import LaunchStats, anywhere, register

# GPUs our FP8 mma.sync kernel compiles for: native QMMA on sm_89/sm_120/sm_121, emulated (correct) on sm_90.
FP8_KERNEL_CAPABILITIES = ((8, 9), (9, 0), (12, 0), (12, 1))
FA4_CAPABILITY_MAJORS = (9, 10)  # flash_attn.cute targets Hopper and Blackwell datacenter parts


# ------------------------------------------------------------------------------------------ probes

def _cuda_reason(device: torch.device) -> str:
    """'' when ``device`` is a usable CUDA device, else why not."""
    if device.type != "cuda":
        return f"needs a CUDA device (got {device.type})"
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    return ""


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device.index if device.index is not None else torch.cuda.current_device())


def _import_reason(module: str) -> str:
    """'' when ``module`` imports, else 'module not importable: error'."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a CUDA extension failing to load
        return f"{module} not importable: {exc}"
    return ""


def _needs_cuda(device: torch.device) -> tuple[bool, str]:
    reason = _cuda_reason(device)
    return not reason, reason


# ------------------------------------------------------------------------------------------ torch SDPA

def _sdpa_bshd(q, k, v, scale, attn_mask=None):
    # the mask broadcasts over (B, H, S_q, S_k) in either layout: only q, k, v are transposed
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=attn_mask, scale=scale)
    return o.transpose(1, 2)


@register("sdpa", description="torch scaled_dot_product_attention, torch picks the kernel", available=anywhere)
def sdpa(q, k, v, *, scale=None, attn_mask=None):
    return _sdpa_bshd(q, k, v, scale, attn_mask)


def _forced_sdpa(name: str, backend_attr: str, description: str, available):
    def forced(q, k, v, *, scale=None, attn_mask=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend_attr)):
            return _sdpa_bshd(q, k, v, scale, attn_mask)

    forced.__name__ = name.replace("-", "_")
    register(name, description=description, available=available)(forced)


def _cudnn_available(device: torch.device) -> tuple[bool, str]:
    reason = _cuda_reason(device)
    if reason:
        return False, reason
    if not torch.backends.cudnn.is_available():
        return False, "cuDNN is not available in this torch build"
    if _capability(device) < (8, 0):
        return False, f"cuDNN attention needs sm_80 or newer (got sm_{''.join(map(str, _capability(device)))})"
    return True, ""


def _flash_available(device: torch.device) -> tuple[bool, str]:
    reason = _cuda_reason(device)
    if reason:
        return False, reason
    if _capability(device) < (8, 0):
        return False, f"flash attention needs sm_80 or newer (got sm_{''.join(map(str, _capability(device)))})"
    return True, ""


_forced_sdpa("sdpa-cudnn", "CUDNN_ATTENTION", "torch SDPA forced to cuDNN attention", _cudnn_available)
_forced_sdpa("sdpa-flash", "FLASH_ATTENTION", "torch SDPA forced to FlashAttention-2", _flash_available)
_forced_sdpa("sdpa-efficient", "EFFICIENT_ATTENTION", "torch SDPA forced to memory-efficient attention",
             _needs_cuda)
_forced_sdpa("sdpa-math", "MATH", "torch SDPA forced to the math (unfused) path", anywhere)


# ------------------------------------------------------------------------------------------ FA4

def _fa4_available(device: torch.device) -> tuple[bool, str]:
    reason = _cuda_reason(device) or _import_reason("flash_attn.cute")
    if reason:
        return False, reason
    major, minor = _capability(device)
    if major not in FA4_CAPABILITY_MAJORS:
        return False, f"flash_attn.cute runs on sm_90/sm_100 only (got sm_{major}{minor})"
    return True, ""


@register("fa4", description="FlashAttention 4 (flash_attn.cute, CuTe DSL)", available=_fa4_available)
def fa4(q, k, v, *, scale=None):
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(q, k, v, softmax_scale=scale, causal=False)
    return out[0] if isinstance(out, tuple) else out  # some versions return (out, lse)


# ------------------------------------------------------------------------------------------ SageAttention

def _sage_available(device: torch.device) -> tuple[bool, str]:
    reason = _cuda_reason(device) or _import_reason("sageattention")
    return not reason, reason


@register("sage", description="SageAttention (INT8 QK, FP8/FP16 PV)", available=_sage_available)
def sage(q, k, v, *, scale=None):
    from sageattention import sageattn

    kwargs = {} if scale is None else {"sm_scale": scale}
    return sageattn(q, k, v, tensor_layout="NHD", is_causal=False, **kwargs)


# ------------------------------------------------------------------------------------------ our FP8 kernel

def _fp8_available(device: torch.device) -> tuple[bool, str]:
    reason = _cuda_reason(device)
    if reason:
        return False, reason
    major, minor = _capability(device)
    if (major, minor) not in FP8_KERNEL_CAPABILITIES:
        wanted = ", ".join(f"sm_{a}{b}" for a, b in FP8_KERNEL_CAPABILITIES)
        return False, f"FP8 kernel targets {wanted} (got sm_{major}{minor})"
    reason = _import_reason("cutlass.cute")
    if reason:
        return False, f"CuTe DSL (nvidia-cutlass-dsl) missing: {reason}"
    return True, ""


def _fp8_qk_format(options=None) -> Callable[[int], str]:
    def fmt(head_dim: int) -> str:
        from ditprof.kernels.qk_format import qk_format

        return qk_format(None if options is None else options.qk_format, head_dim)

    return fmt


def _fp8_snapshot() -> object:
    from ditprof.kernels.launch_record import call_counts

    return call_counts()


def _fp8_since(snapshot: object) -> list:
    from ditprof.kernels.launch_record import launch_summaries

    return launch_summaries(since=snapshot)


def _fp8_fn(options=None) -> Callable:
    def fp8(q, k, v, *, scale=None, key_mask=None):
        from ditprof.kernels.op import fp8_attention  # the custom op; the kernel (CuTe DSL) loads at the first call

        return fp8_attention(q, k, v, scale=scale, key_mask=key_mask, options=options)

    return fp8


def _fp8_with_options(options) -> dict:
    return {"fn": _fp8_fn(options), "qk_format": _fp8_qk_format(options)}


register("fp8", description="our FP8 FlashAttention kernels (CuTe DSL): wgmma fp8-sm90 on Hopper, "
                            "mma.sync fp8-sm120 on sm_89/sm_120", available=_fp8_available,
         qk_format=_fp8_qk_format(), launch_stats=LaunchStats(_fp8_snapshot, _fp8_since),
         options=_fp8_with_options)(_fp8_fn())


__all__ = ["FP8_KERNEL_CAPABILITIES", "FA4_CAPABILITY_MAJORS"]
