"""The shipped Hopper FP8 attention kernel launched as a programmatic dependent launch (PDL), as an experiment:
``ditprof/kernels/fp8_fwd_sm90.py`` is unchanged but for its ``USE_PDL`` launch attribute (False there).

Why: every fp8 call is the prep's Triton launches and then this kernel. At Flux's shape the whole call is ~0.44 ms,
so the gap between the prep's last grid and the kernel's first CTAs (launch latency, block scheduling, the CTA's
barrier set-up) is a visible share. With the launch attribute ``programmaticStreamSerializationAllowed`` the kernel
may be launched while the previous grid (the V prep) is still draining; ``griddepcontrol.wait`` at the top of each
CTA then blocks until that grid has finished and its memory is visible, before anything reads the prep's outputs
(the key counts, scales and Q/K/V tiles are all read after it). Without a PDL-aware predecessor the wait returns at
once. The device code is the shipped kernel's plus that one instruction.

``compile_pdl(head_dim, dtype_out, ...)`` has ``K.compile_sm90``'s contract (TVM-FFI included), so the result can
stand in for the shipped kernel in a launch record (``pdl_bench.py`` swaps ``record_for(...).fn``).
"""

from __future__ import annotations

from cutlass import BFloat16, cute

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import Sm90Config, Sm90Fp8Attention


class Sm90Fp8PdlAttention(Sm90Fp8Attention):
    """The shipped kernel, launched with PDL, waiting on the previous grid before its first global read."""

    USE_PDL = True

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = False):
        super().__init__(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)

    def work_tile(self, k):
        # the first section of the kernel body: every thread waits here, before smem_setup reads key counts
        cute.arch.griddepcontrol_wait()
        return super().work_tile(k)


def compile_pdl(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                qk_int8: bool = False):
    """``K.compile_sm90``'s contract for the PDL build."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    kern = Sm90Fp8PdlAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
    return K.compile_kernel(kern, K._compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            tvm_ffi=tvm_ffi, smem=K.smem_bytes(head_dim, config, qk_int8=qk_int8))


def compile_for_spec(spec):
    """The PDL build for a launch record's ``KernelSpec`` (fp8-sm90), on the current device."""
    if spec.kernel != "fp8-sm90":
        raise ValueError(f"the PDL variant is fp8-sm90's, not {spec.kernel}")
    return compile_pdl(spec.head_dim, spec.out_dtype, fake=False, arch=spec.arch, tvm_ffi=spec.tvm_ffi,
                       key_lens=spec.key_lens, qk_int8=spec.qk_int8)
