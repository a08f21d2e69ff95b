"""``torch.ops.ditprof.fp8_attention``: the FP8 attention as a torch custom op (torch.library).

torch.compile treats it as one opaque node (``register_fake`` gives the output's shape and checks the inputs
during tracing, so bad input is the same one-line ``DitprofError`` under compile), so a block with the swap compiles
with ``fullgraph=True`` without dynamo tracing into the kernel's Python. CUDA runs our CuTe DSL kernel
(``interface``); any other device runs the numerics emulation, so the op works everywhere.

Key-padding masks (``key_mask`` (B, Sk) bool, any key subset): the emulation takes the mask as it is. On CUDA
each batch item's kept keys are moved to the front on the device (``launch.compact_keys``: a stable sort of the
mask, gathers) and the kernels read the per-batch key counts on the device: no host sync, CUDA-graph capturable.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.checks import SUPPORTED_HEAD_DIMS, check_key_mask, check_qkv


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor]) -> None:
    """What the op checks on shapes and dtypes alone (also under compile, on fake tensors)."""
    _, ks, _ = check_qkv(q, k, v, who="fp8 attention", head_dims=SUPPORTED_HEAD_DIMS, same_dtype=True)
    check_key_mask(key_mask, ks)


# Defined with torch.library's schema API rather than ``torch.library.custom_op``: the same op for torch.compile,
# CUDA graphs and the dispatcher, without custom_op's Python autograd and aliasing-check layers on every eager call
# (~70 us of host time per call on the H200 host, 2026-12-02, benchmarks/host_overhead.py). No backward: calling
# backward through it raises torch's "not implemented" error.
_LIB = torch.library.Library("ditprof", "DEF")
_LIB.define("fp8_attention(Tensor q, Tensor k, Tensor v, float scale, Tensor? key_mask=None) -> Tensor")


def fp8_attention_cuda_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                            key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """o (B, Sq, H, D) in q's dtype; q (B, Sq, H, D), k and v (B, Sk, H, D), CUDA: our kernel."""
    # the launch record checks q, k, v once per configuration (shapes, strides, dtypes, device), not per call
    from ditprof.kernels.launch import compact_keys, fp8_attention_cuda

    if key_mask is None:
        return fp8_attention_cuda(q, k, v, scale)
    check_key_mask(key_mask, k)
    if key_mask.device != k.device:
        raise DitprofError(f"key_mask must be on {k.device}, got {key_mask.device}")
    k, v, key_lens = compact_keys(k, v, key_mask)
    return fp8_attention_cuda(q, k, v, scale, key_lens)


def fp8_attention_cpu_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                           key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Any other device: the numerics emulation."""
    check(q, k, v, key_mask)
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.qk_format import qk_format

    # the Q/K format the GPU path would take in this process (DITPROF_FP8_QK), so the CPU shows its numerics
    return fp8_attention_emulated(q, k, v, scale=scale, key_mask=key_mask, qk_format=qk_format(head_dim=q.shape[-1]))


_LIB.impl("fp8_attention", fp8_attention_cuda_impl, "CUDA")
_LIB.impl("fp8_attention", fp8_attention_cpu_impl, "CPU")


@torch.library.register_fake("ditprof::fp8_attention")
def _fake(q, k, v, scale, key_mask=None):
    check(q, k, v, key_mask)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                  key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Python entry: the default scale (1/sqrt(head_dim)) and a one-line error for a bad scale, then the op."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise DitprofError(f"scale must be a positive finite number, got {scale!r}")
    return torch.ops.ditprof.fp8_attention(q, k, v, float(scale), key_mask)
