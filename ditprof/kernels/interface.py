"""Torch-facing entry point of our FP8 attention kernel: ``fp8_attention(q, k, v, ...)``.

Validates the inputs (one-line ``DitprofError``s), runs the FP8 prep (``ditprof.kernels.prep.fp8_prepare``),
picks the kernel for the device's compute capability, compiles it once per configuration (cache keyed on
arch, head_dim, dtype, tile config and flags) and launches it on the current CUDA stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.checks import LAYOUTS, check_qkv  # noqa: F401 -- LAYOUTS re-exported
from ditprof.kernels.checks import SUPPORTED_HEAD_DIMS
from ditprof.kernels.launch import (  # noqa: F401 -- KERNELS and spec_for re-exported
    DTYPE_NAMES, KERNELS, arch_for_capability, kernel_name_for_arch, spec_for)

# ---------------------------------------------------------------------------------------------- arch

# ---------------------------------------------------------------------------------------------- prep

def _prepare_torch(q, k, v, smooth_k=True, layout="BSHD"):
    """Fallback prep (only used when ``ditprof.kernels.prep`` cannot be imported); same contract."""
    from types import SimpleNamespace

    from ditprof.kernels.key_order import key_order_for_positions
    from ditprof.kernels.prep import padded_lengths

    qs, ks, vs = (x if layout == "BSHD" else x.transpose(1, 2) for x in (q, k, v))
    B, Sq, H, D = qs.shape
    Sk = ks.shape[1]
    sq_pad, sk_pad = padded_lengths(Sq, Sk)
    qf, kf, vf = (x.transpose(1, 2).float() for x in (qs, ks, vs))  # (B,H,S,D)
    k_mean = None
    if smooth_k:
        k_mean = kf.double().mean(dim=2).float()
        kf = kf - k_mean[:, :, None, :]
    amax = torch.stack([x.abs().amax(dim=(2, 3)) for x in (qf, kf, vf)], dim=-1)
    if not torch.isfinite(amax).all():
        raise DitprofError("q, k or v contains NaN or Inf")
    scales = torch.where(amax == 0, torch.ones_like(amax), amax / 448.0)

    def quant(x, i, rows):
        out = torch.zeros((B, H, rows, D), dtype=torch.float8_e4m3fn, device=x.device)
        out[:, :, : x.shape[2]] = (x / scales[:, :, i, None, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        return out

    perm = key_order_for_positions(torch.arange(sk_pad, device=q.device))
    v8 = quant(vf, 2, sk_pad)
    v8t = v8.view(torch.uint8)[:, :, perm].transpose(2, 3).contiguous().view(torch.float8_e4m3fn)
    return SimpleNamespace(q8=quant(qf, 0, sq_pad), k8=quant(kf, 1, sk_pad), v8t=v8t, scales=scales,
                           sq=Sq, sk=Sk, k_mean=k_mean)


def _prepare(q, k, v, smooth_k, layout, key_lens=None, qk_int8=False):
    try:
        from ditprof.kernels.prep import fp8_prepare
    except ImportError:
        if key_lens is not None or qk_int8:
            raise
        return _prepare_torch(q, k, v, smooth_k, layout)
    # the finiteness check's device->host sync waits until after the kernel launch (fp8_attention)
    return fp8_prepare(q, k, v, smooth_k=smooth_k, layout=layout, check_finite="defer", key_lens=key_lens,
                       qk_int8=qk_int8)


# ---------------------------------------------------------------------------------------------- checks

def _validate(q, k, v, layout, scale):
    check_qkv(q, k, v, who="fp8 attention", layout=layout, head_dims=SUPPORTED_HEAD_DIMS, device_type="cuda",
              same_dtype=True, max_grid=65535)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise DitprofError(f"scale must be a positive finite number, got {scale!r}")


def _inner_contiguous(x: torch.Tensor) -> torch.Tensor:
    # the prep reads rows of head_dim elements; anything with a strided last dim is copied once
    return x if x.stride(-1) == 1 else x.contiguous()


# ---------------------------------------------------------------------------------------------- compile

def clear_cache() -> None:
    from ditprof.kernels.launch import clear_cache as clear

    clear()


# ---------------------------------------------------------------------------------------------- launch

def launch_prepared(prep, out: torch.Tensor, layout: str, softmax_scale: float,
                    lse: Optional[torch.Tensor] = None, kernel: Optional[str] = None,
                    key_lens: Optional[torch.Tensor] = None) -> None:
    """Run the kernel on an already prepared input; ``out`` (B,Sq,H,D) or (B,H,Sq,D) per ``layout``.
    ``key_lens`` (B,) int32 on the device: batch item b attends to its first key_lens[b] keys."""
    from ditprof.kernels.launch import compiled, launch_compiled, streamk_for, streamk_workspace

    B, H, sq_pad, D = prep.q8.shape
    Sq, Sk = int(prep.sq), int(prep.sk)
    arch = arch_for_capability(torch.cuda.get_device_capability(out.device))
    name = kernel_name_for_arch(arch, kernel)
    if key_lens is not None and (key_lens.dtype != torch.int32 or tuple(key_lens.shape) != (B,)
                                 or key_lens.device != out.device or not key_lens.is_contiguous()):
        raise DitprofError(f"key_lens must be a contiguous int32 tensor of shape ({B},) on {out.device}, got "
                           f"{key_lens.dtype} {tuple(key_lens.shape)} on {key_lens.device}")
    for n, t in (("q8", prep.q8), ("k8", prep.k8), ("v8t", prep.v8t), ("scales", prep.scales)):
        if not t.is_contiguous():
            raise DitprofError(f"prepared {n} must be contiguous")
    q_scales = getattr(prep, "q_scales", None)  # per-row Q descales: the prep ran with int8 Q/K
    if q_scales is not None and not q_scales.is_contiguous():
        raise DitprofError("prepared q_scales must be contiguous")
    spec = spec_for(name, arch, D, DTYPE_NAMES[out.dtype], lse is not None, key_lens is not None,
                    qk_int8=q_scales is not None)
    stream = torch.cuda.current_stream(out.device).cuda_stream
    if name == "fp8-sm90":
        # writes a contiguous, 16-byte aligned (B,Sq,H,D) output (16-byte stores) and always an LSE
        direct = layout == "BSHD" and out.is_contiguous() and out.data_ptr() % 16 == 0
        o = out if direct else torch.empty((B, Sq, H, D), dtype=out.dtype, device=out.device)
        lse_buf = lse if lse is not None and lse.is_contiguous() else torch.empty(
            (B, H, Sq), dtype=torch.float32, device=out.device)
        # the launch record's grid (the same bits as the op's call); on the stream-K grid the kernel, then the
        # merge with the LSE
        plan = streamk_for(name, arch, B, H, Sq, Sk, D, key_lens is not None, out.device.index)
        parts = None
        if plan is not None:
            spec = dataclasses.replace(spec, streamk=True)
            parts = (*streamk_workspace(plan, D, out.dtype, out.device), plan[:3])
        launch_compiled(spec, compiled(spec), prep.q8, prep.k8, prep.v8t, prep.scales, q_scales, key_lens, o,
                        lse_buf, B, H, Sq, Sk, softmax_scale, stream, streamk=parts)
        if parts is not None:
            from ditprof.kernels.streamk_merge import device_table, streamk_merge

            streamk_merge(parts[0], parts[1], device_table(*plan, out.device), o, lse_buf, plan[0], Sq)
        if not direct:
            out.copy_(o if layout == "BSHD" else o.transpose(1, 2))
        if lse is not None and lse_buf is not lse:
            lse.copy_(lse_buf)
        return
    if layout == "BSHD":
        sb, ss, sh = out.stride(0), out.stride(1), out.stride(2)
    else:
        sb, sh, ss = out.stride(0), out.stride(1), out.stride(2)
    if out.stride(3) != 1 or ss % 8 or sh % 8 or sb % 8:
        raise DitprofError("fp8 attention output must have unit stride in head_dim and 16-byte aligned rows")
    if (Sq - 1) * ss + D >= 2**31:
        raise DitprofError(f"fp8 attention: one head's output spans over 2^31 elements (Sq={Sq}, row stride {ss})")
    launch_compiled(spec, compiled(spec), prep.q8, prep.k8, prep.v8t, prep.scales, q_scales, key_lens, out,
                    lse if lse is not None else prep.scales, B, H, Sq, Sk, softmax_scale, stream,
                    out_strides=(sb, sh, ss))


@contextlib.contextmanager
def deferred_finite_checks():
    """A scope whose fp8 calls' NaN/Inf checks of q, k, v are all finished at its exit.

    No fp8 call waits for its check (``launch``'s module docstring): each is read by a later call once its copy has
    landed, or here at the latest -- non-finite inputs raise the same one-line DitprofError, never silently."""
    from ditprof.kernels.launch import finish_finite_checks

    yield
    finish_finite_checks()


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str = "BSHD",
                  scale: Optional[float] = None, return_lse: bool = False, smooth_k: bool = True,
                  kernel: Optional[str] = None, key_mask: Optional[torch.Tensor] = None):
    """FP8 attention (our CuTe DSL kernel).  q (B,Sq,H,D), k/v (B,Sk,H,D) for ``layout="BSHD"``
    ((B,H,S,D) for ``"BHSD"``), bf16 or fp16, CUDA.  Returns o in q's dtype and layout, and with
    ``return_lse`` also the log-sum-exp (B,H,Sq) float32 of the scaled scores (natural log, of the
    original scores: the K-smoothing shift ``scale * q . mean(k)`` is added back).  ``kernel``: ``None``/"auto"
    picks by arch (``fp8-sm90`` on Hopper, ``fp8-sm120`` elsewhere); naming one forces it.

    The common call (BSHD, no LSE, smoothing on, the kernel chosen by arch) goes through the custom op
    ``torch.ops.ditprof.fp8_attention`` (``kernels.op``: torch.compile sees one node); ``key_mask`` (B, Sk) bool
    is taken there only."""
    if layout == "BSHD" and not return_lse and smooth_k and kernel is None and isinstance(q, torch.Tensor):
        from ditprof.kernels.op import fp8_attention as op_entry

        _validate(q, k, v, layout, scale)
        return op_entry(q, k, v, scale=scale, key_mask=key_mask)
    if key_mask is not None:
        raise DitprofError("key_mask is taken by the BSHD call without return_lse (torch.ops.ditprof.fp8_attention)")
    return fp8_attention_kernel(q, k, v, layout=layout, scale=scale, return_lse=return_lse, smooth_k=smooth_k,
                                kernel=kernel)


def fp8_attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str = "BSHD",
                         scale: Optional[float] = None, return_lse: bool = False, smooth_k: bool = True,
                         kernel: Optional[str] = None, key_lens: Optional[torch.Tensor] = None,
                         qk_format: Optional[str] = None):
    """The kernel call itself (prep + launch + finiteness check); ``fp8_attention`` documents the arguments.
    ``key_lens`` (B,) int32 on the device: batch item b attends to its first key_lens[b] keys.
    ``qk_format``: "int8" or "e4m3" (``kernels.qk_format``; None: the process default)."""
    from ditprof.kernels.qk_format import qk_format as resolve_qk_format

    qk_int8 = resolve_qk_format(qk_format, q.shape[-1]) == "int8"
    _validate(q, k, v, layout, scale)
    q, k, v = (_inner_contiguous(x) for x in (q, k, v))
    kernel = kernel_name_for_arch(arch_for_capability(torch.cuda.get_device_capability(q.device)), kernel)
    D = q.shape[3]
    softmax_scale = float(scale) if scale is not None else 1.0 / math.sqrt(D)
    with torch.cuda.device(q.device):
        prep = _prepare(q, k, v, smooth_k, layout, key_lens, qk_int8)
        B, H = prep.q8.shape[0], prep.q8.shape[1]
        Sq = int(prep.sq)
        if layout == "BSHD":
            out = torch.empty((B, Sq, H, D), dtype=q.dtype, device=q.device)
        else:
            out = torch.empty((B, H, Sq, D), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device) if return_lse else None
        launch_prepared(prep, out, layout, softmax_scale, lse, kernel=kernel, key_lens=key_lens)
        if hasattr(prep, "take_finite_check"):
            pending = prep.take_finite_check()
            if pending is not None:
                from ditprof.kernels.launch import drain, pending_queue, sync_checks

                queue = pending_queue()
                queue.append(pending)
                drain(queue, wait=sync_checks())
        if not return_lse:
            return out
        k_mean = getattr(prep, "k_mean", None)
        if k_mean is not None:
            qh = q.transpose(1, 2) if layout == "BSHD" else q  # (B,H,Sq,D)
            lse = lse + softmax_scale * torch.einsum("bhsd,bhd->bhs", qh.float(), k_mean.float())
        return out, lse


__all__ = ["fp8_attention", "fp8_attention_kernel", "deferred_finite_checks", "arch_for_capability",
           "kernel_name_for_arch", "KERNELS", "spec_for", "launch_prepared", "clear_cache",
           "SUPPORTED_HEAD_DIMS"]
