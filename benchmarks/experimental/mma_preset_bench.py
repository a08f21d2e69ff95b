"""The INT8 accumulator preset as a wgmma (``Sm90Config.mma_preset``, shipped at head_dim 128) against the 20 LDS.128
it replaced, in the op's launch record: two records of the same configuration (the shipped rule: grid, Q in the
kernel), one with its compiled kernel rebuilt with ``mma_preset=False``; whole calls (prep + kernel) alternating
behind a sleep (``bench_helpers.sleep_alternating``), median of ``--rounds``, the outputs compared bit for bit (the
preset is exact, so they must be equal). Shapes whose build has no wgmma preset (head_dim 64, e4m3) are not timed.

    python benchmarks/experimental/mma_preset_bench.py --shapes flux,wan1.3b,h3,wan14b --rounds 15 --json out.json
"""

from __future__ import annotations

import dataclasses
import math
import sys

from bench_helpers import VIDEO_SHAPES  # the script's folder is on sys.path

SHAPES = {**{n: VIDEO_SHAPES[n] for n in ("flux", "wan1.3b", "h3", "wan14b", "hunyuan")},
          "small128": (1, 6000, 8, 128)}  # B, S, H, D


def lds_record(q, k, v, options=None):
    """(shipped record, LDS-preset record): two launch records of q, k, v under ``options`` (``Fp8Options``, its
    ``qk_format`` left None; default ``Fp8Options()``), the second keyed by the same options with the Q/K format the
    first resolved to named explicitly (a distinct record of the same configuration) and running the build with
    ``mma_preset=False``; None for the second where the shipped build has no wgmma preset."""
    from ditprof.kernels import fp8_fwd_sm90 as K
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.launch_record import record_for
    from ditprof.kernels.fp8_fwd_sm90_streamk import compile_streamk

    options = options or Fp8Options()
    if options.qk_format is not None:
        raise ValueError("lds_record names the Q/K format itself: pass options with qk_format=None")
    shipped = record_for(q, k, v, False, options=options)
    fmt = "int8" if shipped.spec.qk_int8 else "e4m3"
    other = record_for(q, k, v, False, options=dataclasses.replace(options, qk_format=fmt))
    spec = other.spec
    shipped_config = K.config_for(spec.arch, spec.head_dim)
    if other is shipped or not spec.qk_int8 or not shipped_config.mma_preset:
        return shipped, None
    config = dataclasses.replace(shipped_config, mma_preset=False)
    if other.streamk is not None:
        other.fn = compile_streamk(spec.head_dim, spec.out_dtype, fake=False, tvm_ffi=spec.tvm_ffi, config=config,
                                   qk_int8=True)
    else:
        other.fn = K.compile_sm90(spec.head_dim, spec.out_dtype, fake=False, tvm_ffi=spec.tvm_ffi, config=config,
                                  qk_int8=True, q_rot=spec.q_rot)
    return shipped, other


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import calls_ab, gaussian_qkv

    from ditprof.kernels.kernel_args import LAUNCH_INFO

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=5)
    scale = 1.0 / math.sqrt(D)
    shipped, lds = lds_record(q, k, v)
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": shipped.summary()["grid"],
           "q_in_kernel": shipped.q_rot}
    if lds is None:
        return row
    lds_fn = lds.fn
    row.update(calls_ab({"mma_preset": lambda: shipped(q, k, v, scale), "lds_preset": lambda: lds(q, k, v, scale)},
                        rounds))
    if lds.fn is not lds_fn:  # a failed TVM-FFI call falls back to the shipped kernel: not this build
        raise RuntimeError(f"the LDS-preset record fell back to another kernel: {LAUNCH_INFO}")
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "flux,wan1.3b,h3,wan14b", measure, ("mma_preset", "lds_preset"),
                           "no wgmma preset in this build: not timed")


if __name__ == "__main__":
    sys.exit(main())
