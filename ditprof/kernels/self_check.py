"""fp8-sm120's first-use self-check, for GPUs its builds were never run on.

The first launch record of fp8-sm120 per configuration -- (device index, arch, head_dim, Q/K format, output dtype,
pv_mma) -- runs a small fixed problem (``SelfCheckConfig``: fresh seeded Gaussian q, k, v on the device) through the
compiled kernel, into an output filled with NaN first, and through ``fp8_emulation`` (the numerics model of the same
kernel) on the same device. The kernel passes when every output element was written and is finite and its rel-RMS
against the emulation is within the bound. The verdict is kept for the process. Where the build fails, the
configuration runs the path that passed instead: first the same build with ``pv_mma="f32"`` (checked the same way),
else torch SDPA (``Verdict.spec`` None); one ``SelfCheckWarning`` names the configuration, what was measured and
what runs now.

``SelfCheck(run_kernel, run_reference, config)`` takes its runners, so a test can force a disagreement on the CPU;
the process's is ``launch_record.SELF_CHECK``, over the launch record's own kernel path (``run_for_check``) and the
emulation (``run_emulation``); this module does not import the launch record. The check launches kernels
and waits for them, so it never runs inside a CUDA graph capture: a record first built there keeps the chosen build
unchecked (``Verdict.status`` "not run") and caches nothing, and the next record built outside a capture checks it.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ditprof.kernels.compile_cache import KernelSpec
from ditprof.kernels.fp8_config import SelfCheckConfig

# run_kernel(spec, q, k, v, out, softmax_scale): the build ``spec`` on (B, S, H, D) q, k, v, writing into ``out``
KernelRunner = Callable[[KernelSpec, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], None]
# run_reference(spec, q, k, v, softmax_scale) -> o: what the build should give (the emulation of its numerics)
ReferenceRunner = Callable[[KernelSpec, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class SelfCheckWarning(UserWarning):
    """A fp8-sm120 configuration failed its self-check and runs another path."""


@dataclass(frozen=True)
class Outcome:
    """One build's check: passed, and why not (None when it passed); ``error`` the rel-RMS, None where the run
    failed or left elements unwritten."""

    passed: bool
    why: Optional[str]
    error: Optional[float]


@dataclass(frozen=True)
class Verdict:
    """What a fp8-sm120 configuration runs: ``spec`` (the chosen build, its pv_mma "f32" form, or None: SDPA),
    ``fallback`` (None, "pv_mma f32: <why>" or "sdpa: <why>"), ``status`` ("passed", "failed" -- a fallback runs --,
    "off" or "not run")."""

    spec: Optional[KernelSpec]
    fallback: Optional[str]
    status: str


def check_key(spec: KernelSpec, device_index: int) -> tuple:
    """What a verdict is kept per: (device index, arch, head_dim, Q/K format, out dtype, pv_mma)."""
    return (device_index, spec.arch, spec.head_dim, "int8" if spec.qk_int8 else "e4m3", spec.out_dtype, spec.pv_mma)


def describe(spec: KernelSpec, device_index: int) -> str:
    """The configuration in words, for the warning."""
    return (f"fp8-sm120 pv_mma {spec.pv_mma} on device {device_index} ({spec.arch}), head_dim {spec.head_dim}, "
            f"Q/K {'int8' if spec.qk_int8 else 'e4m3'}, {spec.out_dtype}")


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def cuda_device(device_index: int) -> torch.device:
    return torch.device("cuda", device_index)


class SelfCheck:
    """Checks fp8-sm120 builds once each (module docstring). ``device``: device index -> where the problem is made
    (CUDA by default; a CPU test passes its own)."""

    def __init__(self, run_kernel: KernelRunner, run_reference: ReferenceRunner,
                 config: SelfCheckConfig = SelfCheckConfig(),
                 device: Callable[[int], torch.device] = cuda_device):
        self.run_kernel, self.run_reference = run_kernel, run_reference
        self.config, self.device = config, device
        self.outcomes: dict = {}  # check_key -> Outcome of that build
        self.verdicts: dict = {}  # check_key of the chosen build -> Verdict
        self._lock = threading.RLock()

    def inputs(self, spec: KernelSpec, device_index: int) -> tuple:
        """The fixed problem: fresh seeded Gaussian (B, S, H, D) q, k, v in the build's dtype on the device."""
        c = self.config
        dev = self.device(device_index)
        g = torch.Generator(device=dev).manual_seed(c.seed)
        shape = (c.batch, c.seq, c.heads, spec.head_dim)
        return tuple(torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(DTYPES[spec.out_dtype])
                     for _ in range(3))

    def outcome(self, spec: KernelSpec, device_index: int) -> Outcome:
        """The check of one build (run on first use, then kept)."""
        key = check_key(spec, device_index)
        with self._lock:
            hit = self.outcomes.get(key)
            if hit is None:
                hit = self.outcomes[key] = self._measure(spec, device_index)
            return hit

    def _measure(self, spec: KernelSpec, device_index: int) -> Outcome:
        q, k, v = self.inputs(spec, device_index)
        scale = spec.head_dim ** -0.5
        out = torch.full_like(q, float("nan"))  # an element the kernel does not write stays NaN
        try:
            self.run_kernel(spec, q, k, v, out, scale)
            ref = self.run_reference(spec, q, k, v, scale)
        except Exception as exc:  # noqa: BLE001 -- a build that cannot run on this GPU fails its check
            return Outcome(False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300],
                           None)
        bad = int((~torch.isfinite(out)).sum().item())
        if bad:
            return Outcome(False, f"{bad} of {out.numel()} output elements not written or not finite", None)
        err = rel_rms(out, ref)
        if not err <= self.config.bound:
            return Outcome(False, f"rel-RMS {err:.2%} against the emulation, over the bound "
                                  f"{self.config.bound:.2%}", err)
        return Outcome(True, None, err)

    def verdict(self, spec: KernelSpec, device_index: int) -> Verdict:
        """What the configuration of ``spec`` runs (checked on first use; warns once where it falls back)."""
        key = check_key(spec, device_index)
        with self._lock:
            hit = self.verdicts.get(key)
            if hit is not None:
                return _with_spec(hit, spec)
            first = self.outcome(spec, device_index)
            if first.passed:
                hit = Verdict(spec, None, "passed")
            else:
                hit, now = self._fallback(spec, device_index, first)
                warnings.warn(f"ditprof: {describe(spec, device_index)} failed its self-check ({first.why}); {now}",
                              SelfCheckWarning, stacklevel=2)
            self.verdicts[key] = hit
            return _with_spec(hit, spec)

    def _fallback(self, spec: KernelSpec, device_index: int, first: Outcome) -> tuple[Verdict, str]:
        """(the verdict of a build that failed, what runs now in words)."""
        if spec.pv_mma != "f32":
            f32 = dataclasses.replace(spec, pv_mma="f32")
            second = self.outcome(f32, device_index)
            if second.passed:
                return (Verdict(f32, f"pv_mma f32: {spec.pv_mma} {first.why}", "failed"),
                        "running pv_mma f32 instead (it passed)")
            return (Verdict(None, f"sdpa: {spec.pv_mma} {first.why}; f32 {second.why}", "failed"),
                    f"pv_mma f32 failed too ({second.why}); running torch SDPA instead")
        return Verdict(None, f"sdpa: {spec.pv_mma} {first.why}", "failed"), "running torch SDPA instead"

    def cached(self, spec: KernelSpec, device_index: int) -> Optional[Verdict]:
        """The verdict already made for ``spec``'s configuration, None before its check."""
        hit = self.verdicts.get(check_key(spec, device_index))
        return None if hit is None else _with_spec(hit, spec)

    def clear(self) -> None:
        with self._lock:
            self.outcomes.clear()
            self.verdicts.clear()


def _with_spec(verdict: Verdict, spec: KernelSpec) -> Verdict:
    """``verdict`` for ``spec`` itself: a verdict is kept per configuration, and builds of one configuration differ
    in what the key leaves out (LSE, key lengths), which the fallback keeps."""
    if verdict.spec is None:
        return verdict
    return dataclasses.replace(verdict, spec=dataclasses.replace(spec, pv_mma=verdict.spec.pv_mma))


# ------------------------------------------------------------------------------------------------ the process's

def run_emulation(spec: KernelSpec, q, k, v, softmax_scale: float) -> torch.Tensor:
    """The emulation of the build's numerics (its Q/K format, K smoothed as the check's launch does)."""
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated

    return fp8_attention_emulated(q, k, v, scale=softmax_scale, smooth_k=True,
                                  qk_format="int8" if spec.qk_int8 else "e4m3")


def checked(spec: KernelSpec, device_index: int, checker: SelfCheck) -> Verdict:
    """The verdict of ``checker`` (the process's: ``launch_record.SELF_CHECK``) for a launch record of ``spec`` being
    built. Inside a CUDA graph capture only a verdict made before is used; without one the build runs unchecked,
    "not run"."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return checker.cached(spec, device_index) or Verdict(spec, None, "not run")
    return checker.verdict(spec, device_index)


__all__ = ["Outcome", "SelfCheck", "SelfCheckWarning", "Verdict", "check_key", "checked", "describe", "rel_rms",
           "run_emulation"]
