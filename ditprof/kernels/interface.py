"""The FP8 attention's front door: ``fp8_attention(q, k, v, *, layout, scale, return_lse, key_mask, options)``.

Every caller reaches our CuTe DSL kernel through here or through the custom op this module calls
(``torch.ops.ditprof.fp8_attention``, ``op.py``), and both run the one launch record (``launch_record``): inputs
checked once per configuration, the FP8 prep and the kernel launched on the current CUDA stream, NaN/Inf in q, k, v
reported as one-line ``DitprofError``s (``finish_finite_checks``). What a call runs -- kernel, Q/K format, grid,
graph replay, launcher, check mode, K smoothing, the prep's configuration -- is ``Fp8Options`` (None: the process's,
``default_options()``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.checks import LAYOUTS, SUPPORTED_HEAD_DIMS, check_key_mask, check_qkv
from ditprof.kernels.compile_cache import COMPILE_STATS
from ditprof.kernels.finite_checks import finish_finite_checks
from ditprof.kernels.fp8_config import Fp8Options, PrepConfig, default_options
from ditprof.kernels.kernel_args import LAUNCH_INFO
from ditprof.kernels.launch_choice import KERNELS, arch_for_capability, kernel_name_for_arch
from ditprof.kernels.launch_record import (WORKSPACE_REUSE_BYTES, call_counts, canonical_options, clear_cache,
                                           fp8_call, launch_summaries, record_for)
from ditprof.kernels.masks import compact_keys
from ditprof.kernels.op import fp8_attention as _op_entry


def _validate(q, k, v, layout, scale):
    check_qkv(q, k, v, who="fp8 attention", layout=layout, head_dims=SUPPORTED_HEAD_DIMS, device_type="cuda",
              same_dtype=True, max_grid=65535)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise DitprofError(f"scale must be a positive finite number, got {scale!r}")


def _inner_contiguous(x: torch.Tensor) -> torch.Tensor:
    # the prep reads rows of head_dim elements; anything with a strided last dim is copied once
    return x if x.stride(-1) == 1 else x.contiguous()


@contextlib.contextmanager
def deferred_finite_checks():
    """A scope whose fp8 calls' NaN/Inf checks of q, k, v are all finished at its exit.

    No fp8 call waits for its check (``finite_checks``): each is read by a later call once its copy has landed, or
    here at the latest -- non-finite inputs raise the same one-line DitprofError, never silently."""
    yield
    finish_finite_checks()


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str = "BSHD",
                  scale: Optional[float] = None, return_lse: bool = False, key_mask: Optional[torch.Tensor] = None,
                  options: Optional[Fp8Options] = None):
    """FP8 attention (our CuTe DSL kernel). q (B,Sq,H,D), k/v (B,Sk,H,D) for ``layout="BSHD"`` ((B,H,S,D) for
    ``"BHSD"``), bf16 or fp16, CUDA. Returns o in q's dtype and layout, and with ``return_lse`` also the
    log-sum-exp (B,H,Sq) float32 of the scaled scores (natural log, of the original scores: the K-smoothing shift
    ``scale * q . mean(k)`` is added back). ``key_mask`` (B, Sk) bool: batch item b attends to the keys where it
    is True. ``options``: what the call runs (``Fp8Options``; None: the process's).

    A BSHD call without the LSE goes through the custom op ``torch.ops.ditprof.fp8_attention`` (torch.compile sees
    one node); the others call the same launch record directly."""
    _validate(q, k, v, layout, scale)
    if layout == "BSHD" and not return_lse:
        return _op_entry(q, k, v, scale=scale, key_mask=key_mask, options=options)
    opts = canonical_options(options)
    q, k, v = (_inner_contiguous(x) for x in (q, k, v))
    softmax_scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    key_lens = None
    if key_mask is not None:
        ks, vs = (k, v) if layout == "BSHD" else (k.transpose(1, 2), v.transpose(1, 2))
        check_key_mask(key_mask, ks)
        if key_mask.device != k.device:
            raise DitprofError(f"key_mask must be on {k.device}, got {key_mask.device}")
        ks, vs, key_lens = compact_keys(ks, vs, key_mask)
        k, v = (ks, vs) if layout == "BSHD" else (ks.transpose(1, 2), vs.transpose(1, 2))
    return fp8_call(q, k, v, softmax_scale, key_lens, layout=layout, return_lse=return_lse, options=opts)


__all__ = ["COMPILE_STATS", "Fp8Options", "KERNELS", "LAUNCH_INFO", "LAYOUTS", "PrepConfig", "SUPPORTED_HEAD_DIMS",
           "WORKSPACE_REUSE_BYTES", "arch_for_capability", "call_counts", "clear_cache", "default_options",
           "deferred_finite_checks", "finish_finite_checks", "fp8_attention", "kernel_name_for_arch",
           "launch_summaries", "record_for"]
