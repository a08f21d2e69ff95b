"""Accuracy of attention backends against the float64 reference on five input families (``FAMILIES``).

- ``gaussian``: q, k, v ~ N(0, 1).
- ``peaky``: q x 3, so scores are 3x larger and the softmax much sharper (rounding of Q/K hurts more).
- ``k_bias``: K plus a large per-(batch, head, channel) bias ~ N(0, 8^2) shared by all tokens. It moves every
  score of a query row by the same q . bias, so attention is unchanged (softmax-invariant), but it blows up K's
  amax and with it the FP8 quantization step of K; K smoothing removes the bias exactly.
- ``outlier``: 4 of the head_dim channels of Q and K (the same 4, drawn from the seed) x 20 -- what trained per-head
  QK RMSNorm weights produce: with per-head scales the other channels' scores become coarse and the attention
  peaked.
- ``v_bias``: V plus 6 on every element: a large mean P V term that an accumulator with few mantissa bits loses
  the small per-tile contributions against (``fp8_attention_emulated(acc_bits=...)`` models it).

All families derive from the same base draw (one seed), are cast to bf16 first, and the reference is
computed from those bf16 tensors, so the numbers measure the backend, not input rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch

from ditprof.errors import DitprofError
from ditprof.kernels import registry
from ditprof.kernels.accuracy_cases import DEFAULT_SHAPE, FAMILIES
from ditprof.kernels.fp8_emulation import fp8_attention_emulated
from ditprof.kernels.reference import attention_reference

PEAKY_FACTOR = 3.0
K_BIAS_STD = 8.0
OUTLIER_CHANNELS, OUTLIER_FACTOR = 4, 20.0
V_BIAS = 6.0
INPUT_DTYPE = torch.bfloat16


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """'B,H,S,D' -> ints, all >= 1."""
    parts = text.replace("x", ",").split(",")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise DitprofError(f"--shape must be four positive integers B,H,S,D (e.g. 1,4,1024,128), got {text!r}")
    return dims  # type: ignore[return-value]


def make_inputs(family: str, shape: Sequence[int], kv_len: Optional[int] = None, seed: int = 0,
                device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) in bf16, (B, S, H, D) layout; drawn on the CPU so a seed gives the same inputs on any device."""
    if family not in FAMILIES:
        raise DitprofError(f"unknown input family {family!r}; known: {', '.join(FAMILIES)}")
    B, H, S, D = shape
    Sk = S if kv_len is None else kv_len
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=gen)
    k = torch.randn(B, Sk, H, D, generator=gen)
    v = torch.randn(B, Sk, H, D, generator=gen)
    bias = torch.randn(B, 1, H, D, generator=gen) * K_BIAS_STD  # drawn for every family: same q, k, v
    channels = torch.randperm(D, generator=gen)[:OUTLIER_CHANNELS]
    if family == "peaky":
        q = q * PEAKY_FACTOR
    elif family == "k_bias":
        k = k + bias
    elif family == "outlier":
        scale = torch.ones(D)
        scale[channels] = OUTLIER_FACTOR
        q, k = q * scale, k * scale
    elif family == "v_bias":
        v = v + V_BIAS
    return tuple(x.to(INPUT_DTYPE).to(device) for x in (q, k, v))  # type: ignore[return-value]


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """rel_rms = ||out - ref|| / ||ref||, max_abs = max |out - ref|, cosine of the flattened tensors."""
    o = out.double().flatten()
    r = ref.double().flatten()
    diff = o - r
    return {
        "rel_rms": (diff.norm() / r.norm()).item(),
        "max_abs": diff.abs().max().item(),
        "cosine": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
    }


def backend_runners(device: torch.device, smooth_k: bool = True) -> tuple[dict[str, Callable], list[str]]:
    """{name: fn(q, k, v)} to measure on ``device``, and notes about backends left out (with the reason)."""
    runners: dict[str, Callable] = {
        "sdpa": registry.get("sdpa").fn,  # bf16 baseline row
        # the process's default Q/K format (kernels.qk_format: INT8 unless DITPROF_FP8_QK says otherwise)
        "fp8-emulated": lambda q, k, v: fp8_attention_emulated(q, k, v, smooth_k=smooth_k),
        "fp8-emulated-e4m3": lambda q, k, v: fp8_attention_emulated(q, k, v, smooth_k=smooth_k, qk_format="e4m3"),
        # the candidate fix for Q/K outlier channels (issue 18), in the numerics only so far
        "fp8-emulated+hadamard": lambda q, k, v: fp8_attention_emulated(q, k, v, smooth_k=smooth_k, rotate_qk=True),
        # issue 18's decision: Hadamard-rotated INT8 Q/K, per-token Q scales, per-head K (prep qk_int8=True)
        "fp8-emulated-int8": lambda q, k, v: fp8_attention_emulated(q, k, v, smooth_k=smooth_k, qk_format="int8"),
    }
    notes = []
    ok, reason = registry.available("fp8", device)
    if ok:
        from ditprof.kernels.interface import default_options, fp8_attention

        def fp8_with(fmt):
            # fmt None: the process's default Q/K format (kernels.qk_format); the process's check mode either way
            opts = dataclasses.replace(default_options(), smooth_k=smooth_k, **({"qk_format": fmt} if fmt else {}))
            return lambda q, k, v: fp8_attention(q, k, v, layout="BSHD", options=opts)

        runners["fp8"] = fp8_with(None)
        runners["fp8-e4m3"] = fp8_with("e4m3")
        runners["fp8-int8"] = fp8_with("int8")
    elif device.type == "cuda":  # on a CPU run the kernel's absence is expected, not news
        notes.append(f"fp8 skipped: {reason}")
    return runners, notes


def run_accuracy(shape: Optional[Sequence[int]] = None, kv_len: Optional[int] = None, seed: int = 0,
                 device="cpu", smooth_k: bool = True) -> tuple[dict, list[str]]:
    """{family: {backend: {"rel_rms", "max_abs", "cosine"}}} and notes about skipped backends."""
    dev = registry.resolve_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DitprofError("--device cuda: CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise DitprofError(f"--device must be cpu or cuda, got {dev.type}")
    shape = tuple(shape) if shape is not None else DEFAULT_SHAPE[dev.type]
    if kv_len is not None and kv_len < 1:
        raise DitprofError(f"--kv-len must be >= 1, got {kv_len}")
    runners, notes = backend_runners(dev, smooth_k)
    results: dict = {}
    for family in FAMILIES:
        q, k, v = make_inputs(family, shape, kv_len, seed, dev)
        ref = attention_reference(q, k, v)
        results[family] = {name: compare(fn(q, k, v), ref) for name, fn in runners.items()}
    return results, notes


__all__ = ["FAMILIES", "DEFAULT_SHAPE", "compare", "make_inputs", "parse_shape", "run_accuracy"]
