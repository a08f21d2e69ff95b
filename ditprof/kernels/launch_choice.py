"""What one FP8 attention call runs, picked in one place: ``choose_launch(arch, shape, dtype, options, ...)`` ->
``LaunchChoice`` (the kernel, its Q/K format, the stream-K plan or the plain grid, Q in the kernel or from the prep,
fp8-sm90's ``Sm90Config``, the launcher), as the compile cache's ``KernelSpec`` plus the grid's plan. A launch
record is built from one choice; nothing here reads the environment (``Fp8Options`` says what a caller wants).

- kernel: ``fp8-sm90`` (wgmma) on sm_90a, ``fp8-sm120`` (mma.sync) elsewhere; ``Fp8Options.kernel`` may force one
  (``fp8-sm120`` also runs on Hopper, emulated there: correct, slow, useful to compare the two).
- fp8-sm120's P V mma: ``fp8_fwd_sm120.default_pv_mma(arch)`` (the block-scaled mma on sm_120a / sm_121a).
- grid: fp8-sm90 runs on the stream-K grid (``fp8_fwd_sm90_streamk``) where ``streamk_schedule.streamk_plan``
  takes the problem (a partial last round after a few full ones, no key_lens) and ``Fp8Options.streamk`` is on.
- Q in the kernel (``q_rot``): fp8-sm90 INT8 on the plain grid with a contiguous, 16-byte aligned (B, Sq, H, D) q,
  when ``Fp8Options.q_in_kernel`` is on; the prep then skips Q. The stream-K grid keeps the prep's Q (quantizing Q
  in the kernel was measured slower there; benchmarks/NOTES.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.compile_cache import KernelSpec
from ditprof.kernels.fp8_config import CHECK_CHOICES, Fp8Options
from ditprof.kernels.kernel_args import tvm_ffi_launch_enabled
from ditprof.kernels.qk_format import qk_format

KERNELS = ("fp8-sm120", "fp8-sm90")


def arch_for_capability(cap: tuple[int, int]) -> str:
    """Compute capability -> the arch string the kernel is compiled for (DitprofError if unsupported)."""
    major, minor = cap
    if (major, minor) == (8, 9):
        return "sm_89"
    if major == 9:
        return "sm_90a"  # fp8-sm120's mma.sync e4m3 is emulated here: correct, not fast
    if major == 10:
        return "sm_100a" if minor == 0 else f"sm_10{minor}a"  # emulated as on Hopper
    if major == 12:
        return f"sm_12{minor}a"
    raise DitprofError(
        f"fp8 attention needs an sm_89, sm_90, sm_100 or sm_120 class GPU, got compute capability {major}.{minor}"
    )


_ARCH_BY_DEVICE: dict = {}


def arch_of(device_index: int) -> str:
    """The arch of CUDA device ``device_index`` (read once per device)."""
    arch = _ARCH_BY_DEVICE.get(device_index)
    if arch is None:
        arch = _ARCH_BY_DEVICE[device_index] = arch_for_capability(torch.cuda.get_device_capability(device_index))
    return arch


def kernel_name_for_arch(arch: str, requested: Optional[str] = None) -> str:
    """Which kernel runs on ``arch``: the Hopper-native wgmma kernel on sm_90a, the mma.sync one elsewhere;
    ``requested`` (``Fp8Options.kernel``; None or "auto": by arch) forces one."""
    requested = requested or "auto"
    if requested == "auto":
        return "fp8-sm90" if arch == "sm_90a" else "fp8-sm120"
    if requested not in KERNELS:
        raise DitprofError(f"unknown fp8 kernel {requested!r}; known: auto, {', '.join(KERNELS)}")
    if requested == "fp8-sm90" and arch != "sm_90a":
        raise DitprofError(f"kernel fp8-sm90 needs an sm_90a GPU (H100/H200), this one is {arch}")
    return requested


def sm_count(device_index: int) -> int:
    """The device's SM count (the stream-K grid's tail width; tests replace it to give small problems a tail)."""
    from ditprof.kernels import triton_launch

    return triton_launch.sm_count(device_index)


def check_options(options: Fp8Options) -> None:
    """One-line errors for option values no call could run with (the kernel is checked against the arch when a
    record is built)."""
    if not isinstance(options, Fp8Options):
        raise DitprofError(f"options must be an Fp8Options, got {type(options).__name__}")
    if options.kernel not in ("auto", *KERNELS):
        raise DitprofError(f"unknown fp8 kernel {options.kernel!r}; known: auto, {', '.join(KERNELS)}")
    if options.check not in CHECK_CHOICES:
        raise DitprofError(f"Fp8Options.check must be one of {', '.join(CHECK_CHOICES)}, got {options.check!r}")
    if options.qk_format is not None:
        qk_format(options.qk_format)


def q_in_kernel_ok(q: torch.Tensor) -> bool:
    """Whether a record of ``q`` may quantize Q in the kernel: the q_rot build reads a contiguous, 16-byte aligned
    q, and a record first made inside a graph capture keeps the prep's Q (the rotation matrix's copy to the device
    cannot be captured)."""
    return q.is_contiguous() and q.data_ptr() % 16 == 0 and not torch.cuda.is_current_stream_capturing()


@dataclass(frozen=True)
class LaunchChoice:
    """What a call runs: the kernel build (``spec``) and, on the stream-K grid, its plan
    (n_full, n_tail, T, n_kt); None on the plain grid."""

    spec: KernelSpec
    streamk: Optional[tuple] = None


def choose_launch(arch: str, shape: tuple, dtype_name: str, options: Fp8Options, *, key_lens: bool,
                  write_lse: bool, q_in_kernel_ok: bool, device_index: int = 0) -> LaunchChoice:
    """The launch of a call of ``shape`` (B, H, Sq, Sk, D) on ``arch`` under ``options``. ``key_lens``: per-batch
    key counts read on the device; ``write_lse``: the caller takes the LSE; ``q_in_kernel_ok``: q has the layout
    and alignment the q_rot build reads (contiguous, 16-byte aligned) and the record is not being made inside a
    graph capture (the rotation matrix's copy to the device cannot be captured)."""
    B, H, Sq, Sk, D = shape
    kernel = kernel_name_for_arch(arch, options.kernel)
    qk_int8 = qk_format(options.qk_format, D) == "int8"
    if kernel != "fp8-sm90":
        from ditprof.kernels.fp8_fwd_sm120 import default_pv_mma

        return LaunchChoice(KernelSpec(kernel, arch, D, dtype_name, write_lse, key_lens, qk_int8=qk_int8,
                                       pv_mma=default_pv_mma(arch)))
    from ditprof.kernels.fp8_fwd_sm90 import config_for
    from ditprof.kernels.streamk_schedule import streamk_plan

    config = config_for(arch, D)
    plan = None
    if options.streamk and not key_lens:
        plan = streamk_plan(B, H, Sq, Sk, config.tile_n, sm_count(device_index))
    q_rot = qk_int8 and plan is None and options.q_in_kernel and q_in_kernel_ok
    # fp8-sm90 always writes its LSE
    spec = KernelSpec(kernel, arch, D, dtype_name, True, key_lens, tvm_ffi_launch_enabled(options.tvm_ffi),
                      qk_int8, streamk=plan is not None, q_rot=q_rot, config=config)
    return LaunchChoice(spec, plan)


__all__ = ["KERNELS", "LaunchChoice", "arch_for_capability", "arch_of", "check_options", "choose_launch",
           "kernel_name_for_arch", "q_in_kernel_ok", "sm_count"]
