"""``torch.ops.ditprof.fp8_attention``: the FP8 attention as a torch custom op (torch.library).

torch.compile treats it as one opaque node (``register_fake`` gives the output's shape and checks the inputs
during tracing, so bad input is the same one-line ``DitprofError`` under compile), so a block with the swap compiles
with ``fullgraph=True`` without dynamo tracing into the kernel's Python. CUDA runs our CuTe DSL kernel through the
one launch record (``launch_record.fp8_call``, the front door's own call); any other device runs the numerics
emulation, so the op works everywhere.

``options`` (a string in the schema, so it is a constant of a compiled graph): "" for the process's options
(``fp8_config.default_options``), else ``options_key(Fp8Options(...))``, which names the non-default fields.

Key-padding masks (``key_mask`` (B, Sk) bool, any key subset): the emulation takes the mask as it is. On CUDA
each batch item's kept keys are moved to the front on the device (``masks.compact_keys``: a stable sort of the
mask, gathers) and the kernels read the per-batch key counts on the device: no host sync, CUDA-graph capturable.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.checks import SUPPORTED_HEAD_DIMS, check_key_mask, check_qkv
from ditprof.kernels.fp8_config import Fp8Options, default_options
from ditprof.kernels.masks import keys_of_lens


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor]) -> None:
    """What the op checks on shapes and dtypes alone (also under compile, on fake tensors)."""
    _, ks, _ = check_qkv(q, k, v, who="fp8 attention", head_dims=SUPPORTED_HEAD_DIMS, same_dtype=True)
    check_key_mask(key_mask, ks)


_BY_KEY: dict = {}  # options_key(o) -> o
_KEY_BY_ID: dict = {}  # id(o) -> (o, options_key(o)): no per-call field walk


def options_key(options: Optional[Fp8Options]) -> str:
    """The op's ``options`` argument for ``options`` (None: "", the process's options): the fields that differ
    from ``Fp8Options()``, e.g. "Fp8Options(graphs=False)". Remembered, so the op finds the object again."""
    if options is None:
        return ""
    hit = _KEY_BY_ID.get(id(options))
    if hit is not None and hit[0] is options:
        return hit[1]
    if not isinstance(options, Fp8Options):
        raise DitprofError(f"options must be an Fp8Options, got {type(options).__name__}")
    base = Fp8Options()
    diff = ", ".join(f"{f.name}={getattr(options, f.name)!r}" for f in dataclasses.fields(options)
                     if getattr(options, f.name) != getattr(base, f.name))
    key = f"Fp8Options({diff})"
    _BY_KEY.setdefault(key, options)
    if len(_KEY_BY_ID) >= 256:  # callers that make a new options object per call
        _KEY_BY_ID.clear()
    _KEY_BY_ID[id(options)] = (options, key)
    return key


def options_for(key: str) -> Fp8Options:
    """The options of the op's ``options`` argument ("": the process's)."""
    if not key:
        return default_options()
    opts = _BY_KEY.get(key)
    if opts is None:
        raise DitprofError(f"unknown fp8 options {key!r}: build the argument with op.options_key")
    return opts


# Defined with torch.library's schema API rather than ``torch.library.custom_op``: the same op for torch.compile,
# CUDA graphs and the dispatcher, without custom_op's Python autograd and aliasing-check layers on every eager call
# (their host cost is measured by benchmarks/host_overhead.py). No backward: calling backward through it raises
# torch's "not implemented" error.
_LIB = torch.library.Library("ditprof", "DEF")
_LIB.define('fp8_attention(Tensor q, Tensor k, Tensor v, float scale, Tensor? key_mask=None, str options="") '
            '-> Tensor')


def fp8_attention_cuda_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                            key_mask: Optional[torch.Tensor] = None, options: str = "") -> torch.Tensor:
    """o (B, Sq, H, D) in q's dtype; q (B, Sq, H, D), k and v (B, Sk, H, D), CUDA: our kernel."""
    # the launch record checks q, k, v once per configuration (shapes, strides, dtypes, device), not per call
    from ditprof.kernels.launch_record import fp8_call

    opts = options_for(options)
    if key_mask is None:
        return fp8_call(q, k, v, scale, options=opts)
    from ditprof.kernels.masks import compact_keys

    check_key_mask(key_mask, k)
    if key_mask.device != k.device:
        raise DitprofError(f"key_mask must be on {k.device}, got {key_mask.device}")
    k, v, key_lens = compact_keys(k, v, key_mask)
    return fp8_call(q, k, v, scale, key_lens, options=opts)


def fp8_attention_cpu_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                           key_mask: Optional[torch.Tensor] = None, options: str = "") -> torch.Tensor:
    """Any other device: the numerics emulation."""
    check(q, k, v, key_mask)
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.qk_format import qk_format

    opts = options_for(options)
    # the Q/K format the GPU path would take with these options, so the CPU shows its numerics
    return fp8_attention_emulated(q, k, v, scale=scale, key_mask=key_mask, smooth_k=opts.smooth_k,
                                  qk_format=qk_format(opts.qk_format, head_dim=q.shape[-1]))


_LIB.impl("fp8_attention", fp8_attention_cuda_impl, "CUDA")
_LIB.impl("fp8_attention", fp8_attention_cpu_impl, "CPU")


# The fused prologue (kernels.prologue): q and k are the projections' raw output, the processor's RMSNorm and RoPE
# run inside the FP8 prep (``prologue``: kernels.prologue.spec_key of the family's PrologueSpec).
# ``key_lens`` (B,) int32: batch item b attends to its first key_lens[b] keys (a key-padding mask whose kept keys
# are a prefix: the RoPE table ties each key to its row, so the keys cannot be moved to the front as
# ``fp8_attention`` does with a key subset). ``rsq``/``rsk``: the row factors of a norm across heads
# (``rms_across``, computed by the Python entry), None otherwise. The optional ones come last in the schema, so
# positional callers keep their meaning.
_LIB.define('fp8_attention_prologue(Tensor q, Tensor k, Tensor v, Tensor? wq, Tensor? wk, Tensor? cos, '
            'Tensor? sin, int text_rows, float scale, str prologue, str options="", Tensor? key_lens=None, '
            'Tensor? rsq=None, Tensor? rsk=None) -> Tensor')


def check_key_lens(key_lens: Optional[torch.Tensor], q: torch.Tensor) -> None:
    """A one-line DitprofError unless ``key_lens`` is None or (B,) int32 on q's device."""
    if key_lens is None:
        return
    if key_lens.dim() != 1 or key_lens.shape[0] != q.shape[0] or key_lens.dtype != torch.int32:
        raise DitprofError(f"key_lens must be ({q.shape[0]},) int32 (one key count per batch item), got "
                           f"{key_lens.dtype} {tuple(key_lens.shape)}")
    if key_lens.device != q.device:
        raise DitprofError(f"key_lens must be on {q.device}, got {key_lens.device}")


def _prologue_check(q, k, v, wq, wk, cos, sin, text_rows, prologue, key_lens=None, rsq=None, rsk=None):
    from ditprof.kernels.prologue import check_prologue_call, spec_from_key

    spec = spec_from_key(prologue)
    if q.device.type == "cuda" or q.device.type == "meta":  # the kernel's head dims; the emulation takes any 2^n
        check(q, k, v, None)
    else:
        check_qkv(q, k, v, who="fp8 attention (fused prologue)", same_dtype=True, pow2_head_dim=True)
    if spec.across and (rsq is None or rsk is None):
        raise DitprofError("the fused prologue's rms_across needs the row factors rsq and rsk "
                           "(kernels.prologue.row_factors; op.fp8_attention_prologue computes them)")
    check_prologue_call(spec, q, k, wq, wk, cos, sin, text_rows, rsq, rsk)
    check_key_lens(key_lens, q)
    return spec


def fp8_attention_prologue_cuda_impl(q, k, v, wq, wk, cos, sin, text_rows: int, scale: float, prologue: str,
                                     options: str = "", key_lens: Optional[torch.Tensor] = None, rsq=None,
                                     rsk=None) -> torch.Tensor:
    """o (B, S, H, D): the prologue in the prep, then our kernel (``launch_record.fp8_call``)."""
    from ditprof.kernels.launch_record import fp8_call
    from ditprof.kernels.prologue import prologue_tensors

    spec = _prologue_check(q, k, v, wq, wk, cos, sin, text_rows, prologue, key_lens, rsq, rsk)
    return fp8_call(q, k, v, scale, key_lens, options=options_for(options), prologue=spec,
                    pro=prologue_tensors(spec, wq, wk, cos, sin, text_rows, rsq, rsk))


def fp8_attention_prologue_cpu_impl(q, k, v, wq, wk, cos, sin, text_rows: int, scale: float, prologue: str,
                                    options: str = "", key_lens: Optional[torch.Tensor] = None, rsq=None,
                                    rsk=None) -> torch.Tensor:
    """Any other device: the prologue's reference numerics, then the attention's emulation."""
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.prologue import prologue_torch

    spec = _prologue_check(q, k, v, wq, wk, cos, sin, text_rows, prologue, key_lens, rsq, rsk)
    opts = options_for(options)
    qp = prologue_torch(spec, q, wq, cos, sin, text_rows, rsq)
    kp = prologue_torch(spec, k, wk, cos, sin, text_rows, rsk)
    key_mask = None
    if key_lens is not None:  # the kernels' rule: the first min(max(key_lens[b], 0), Sk) keys
        key_mask = keys_of_lens(key_lens, k.shape[1])
    # the GPU path quantizes Q/K in the INT8 format whatever the options say (the prologue lives in that prep)
    return fp8_attention_emulated(qp, kp, v, scale=scale, smooth_k=opts.smooth_k, key_mask=key_mask,
                                  qk_format="int8")


_LIB.impl("fp8_attention_prologue", fp8_attention_prologue_cuda_impl, "CUDA")
_LIB.impl("fp8_attention_prologue", fp8_attention_prologue_cpu_impl, "CPU")


@torch.library.register_fake("ditprof::fp8_attention_prologue")
def _prologue_fake(q, k, v, wq, wk, cos, sin, text_rows, scale, prologue, options="", key_lens=None, rsq=None,
                   rsk=None):
    _prologue_check(q, k, v, wq, wk, cos, sin, text_rows, prologue, key_lens, rsq, rsk)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def fp8_attention_prologue(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec, *,
                           wq: Optional[torch.Tensor] = None, wk: Optional[torch.Tensor] = None,
                           cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
                           text_rows: int = 0, scale: Optional[float] = None,
                           options: Optional[Fp8Options] = None,
                           key_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Python entry of the fused-prologue op: q, k RAW (B, S, H, D) projections, v (B, S, H, D); ``spec`` a
    ``kernels.prologue.PrologueSpec``; the norm weights (G, D) ((H, D) for ``rms_across``), the RoPE table
    (S, rope_dim), see kernels.prologue; ``key_lens`` (B,) int32 or None: batch item b attends to its first
    key_lens[b] keys. With ``rms_across`` the row factors of q and k are computed here, before the op (one fp32
    reduction each, outside the opaque op: under torch.compile inductor may fuse it)."""
    from ditprof.kernels.prologue import row_factors, spec_key

    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise DitprofError(f"scale must be a positive finite number, got {scale!r}")
    rsq = rsk = None
    if getattr(spec, "across", False) and q.dim() == 4 and k.dim() == 4:  # else the op's check says what is wrong
        rsq, rsk = row_factors(q, spec.eps), row_factors(k, spec.eps)
    return torch.ops.ditprof.fp8_attention_prologue(q, k, v, wq, wk, cos, sin, int(text_rows), float(scale),
                                                    spec_key(spec), options_key(options), key_lens, rsq, rsk)


@torch.library.register_fake("ditprof::fp8_attention")
def _fake(q, k, v, scale, key_mask=None, options=""):
    check(q, k, v, key_mask)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                  key_mask: Optional[torch.Tensor] = None, options: Optional[Fp8Options] = None) -> torch.Tensor:
    """Python entry: the default scale (1/sqrt(head_dim)) and a one-line error for a bad scale, then the op."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise DitprofError(f"scale must be a positive finite number, got {scale!r}")
    return torch.ops.ditprof.fp8_attention(q, k, v, float(scale), key_mask, options_key(options))
