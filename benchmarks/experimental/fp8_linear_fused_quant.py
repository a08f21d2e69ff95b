"""Can an eager FP8 linear cost less host time than a compiled one? An experiment for issue 43's eager flux target
(fp8 attention + prologue + FP8 linears >= 1.25x SDPA in turns; 0.97x in session 27, where the linears, each
compiled alone, cost more host time per call than their GEMMs take at flux).

Three ways to run one torchao rowwise float8 linear in an eager block:

- ``torchao``: torchao's eager path (its activation quantization is ~6 unfused elementwise kernels per call);
- ``compiled``: the swap's ``CompiledAlone`` (inductor fuses the quantization; dynamo's guards and inductor's
  wrapper run on every call);
- ``fused``: ONE Triton launch quantizes the activation (``_rowwise_e4m3``: per-row amax, torchao's scale, the
  e4m3 codes; torchao's numerics, so the codes and scales are torchao's bit for bit), then torchao's own
  ``addmm_float8_unwrapped_inference`` with the weight torchao quantized. Inputs shared by several linears (q, k,
  v of one block) are quantized once (``SharedInputQuant``: the same tensor object at the same ``_version``).

It first checks ``fused`` against ``torchao`` bit for bit on fresh Gaussian inputs (the codes, the scales, the
output), then times GPU time (CUDA events) and host time (the Python call until it returns) per call at the flux
block's linear shapes, and the three q/k/v projections of one input together. Under ``TRITON_INTERPRET=1`` on the
CPU only the quantize kernel's check against ``kernels.fp8_linear`` (torchao's numerics in torch) runs
(``--check-only``, tested in ``test_fp8_linear_fused_quant.py``). Exploration, not shipped.

    python benchmarks/experimental/fp8_linear_fused_quant.py [--tokens 4608] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import weakref
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import environment, fmt, print_table, results_path, write_json  # noqa: E402

from ditprof.kernels.prep_triton import _to_e4m3  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
E4M3_MAX = 448.0

# flux.1-dev's double-stream block at 1024 x 1024 (4096 image + 512 text tokens): (name, tokens, in, out)
FLUX_LINEARS = (("to_q/k/v", 4096, 3072, 3072), ("add_q/k/v", 512, 3072, 3072), ("to_out", 4096, 3072, 3072),
                ("ff.in", 4096, 3072, 12288), ("ff.out", 4096, 12288, 3072), ("ff_context.in", 512, 3072, 12288))


@triton.jit
def _rowwise_e4m3(x_ptr, x8_ptr, scale_ptr, K, s_m, BLOCK: tl.constexpr, IS_BF16: tl.constexpr,
                  INTERP: tl.constexpr):
    # one row: amax|x| (exact in any dtype), scale = RN_dtype(amax / 448) as fp32 (torchao divides in x's dtype),
    # codes e4m3(clamp(RN(fp32(x) / scale), +-448)) with the IEEE quotient (torch's division); a zero row has
    # scale 0 and NaN codes, as torchao's
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * s_m
    amax = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(base + offs, mask=offs < K, other=0.0).to(tl.float32)))
    a = tl.max(amax, axis=0)
    q = tl.math.div_rn(a, E4M3_MAX)
    if INTERP:  # the interpreter's fp32 -> 16-bit cast truncates: round to nearest even by hand
        bits = q.to(tl.uint32, bitcast=True)
        if IS_BF16:
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            s = bits.to(tl.float32, bitcast=True)
        else:
            s = q.to(tl.float16).to(tl.float32)
    else:
        if IS_BF16:
            s = q.to(tl.bfloat16).to(tl.float32)
        else:
            s = q.to(tl.float16).to(tl.float32)
    tl.store(scale_ptr + row, s)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < K, other=0.0).to(tl.float32)
        y = tl.math.div_rn(x, s)
        # on the GPU cvt.rn.satfinite saturates to +-448 as torch's clamp does and keeps a NaN (a clamp through
        # tl.minimum would drop it); the interpreter rounds with the prep's fp32 sequence and writes NaN's code itself
        c = _to_e4m3(y, INTERP)
        if INTERP:
            c = tl.where(y == y, c, tl.full(y.shape, 0x7F, tl.uint8).to(tl.float8e4nv, bitcast=True))
        tl.store(x8_ptr + row * K + offs, c, mask=offs < K)


def quantize_rows(x: torch.Tensor, block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) 16-bit with a unit last stride -> (codes (M, K) e4m3, scales (M, 1) float32), M = rows of x."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    x8 = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    _rowwise_e4m3[(M,)](x2, x8, scale, K, x2.stride(0), BLOCK=min(block, triton.next_power_of_2(K)),
                        IS_BF16=x.dtype == torch.bfloat16, INTERP=INTERPRET, num_warps=4)
    return x8, scale


class SharedInputQuant:
    """The codes of the last activation quantized, reused while the caller passes the same tensor object unchanged
    (``_version``): q, k and v projections of one input quantize it once."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        """Forget the last input: its next call quantizes again (a new forward's input)."""
        self._ref, self._version, self._out = None, None, None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._ref is not None and self._ref() is x and self._version == x._version:
            return self._out
        self._out = quantize_rows(x)
        self._ref, self._version = weakref.ref(x), x._version
        return self._out


class FusedQuantFp8Linear(torch.nn.Module):
    """torchao's rowwise float8 linear ``fp8`` (its quantized weight, its scaled-mm config) with the activation
    quantized by ``_rowwise_e4m3`` (``quant``: a ``SharedInputQuant`` several linears may share)."""

    def __init__(self, fp8: torch.nn.Linear, quant: SharedInputQuant):
        super().__init__()
        w = fp8.weight
        self.w_data, self.w_scale = w.qdata, w.scale  # (N, K) e4m3, (N, 1) float32
        self.fast_accum = w.mm_config.use_fast_accum
        self.bias = fp8.bias
        self.quant = quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.float8.inference import addmm_float8_unwrapped_inference

        x8, xs = self.quant(x)
        out = addmm_float8_unwrapped_inference(x8, xs, self.w_data.t(), self.w_scale.t(), output_dtype=x.dtype,
                                               bias=self.bias, use_fast_accum=self.fast_accum)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def check_quantize(device: str, seed: int = 0) -> int:
    """``quantize_rows`` against ``kernels.fp8_linear`` (torchao's numerics in torch) on fresh Gaussian rows with a
    few outliers, a zero row and a ragged K: codes and scales bit for bit (NaN codes of the zero row alike). Returns
    the elements checked; raises AssertionError on a difference."""
    from ditprof.kernels.fp8_linear import fp8_scale, quantize_e4m3

    gen = torch.Generator().manual_seed(seed)
    checked = 0
    for dtype, (M, K) in ((torch.bfloat16, (37, 3000)), (torch.float16, (5, 1024)), (torch.bfloat16, (3, 96))):
        x = torch.randn(M, K, generator=gen) * torch.rand(M, 1, generator=gen) * 8
        x[1, 7] = 300.0  # an outlier channel: the scale is its row's
        x[2] = 0.0
        x = x.to(dtype).to(device)
        ref_s = fp8_scale(x, "rowwise")
        ref = quantize_e4m3(x, ref_s)
        x8, s = quantize_rows(x)
        assert torch.equal(s.cpu(), ref_s.cpu()), f"{dtype} {M}x{K}: scales differ"
        a, b = x8.view(torch.uint8).cpu(), ref.view(torch.uint8).cpu()
        nan_a, nan_b = (a & 0x7F) == 0x7F, (b & 0x7F) == 0x7F
        assert torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b]), \
            f"{dtype} {M}x{K}: {int((a != b).sum())} codes differ"
        checked += x.numel()
    return checked


def _host_and_gpu(fn, iters: int = 50, warmup: int = 10) -> tuple[float, float]:
    """(host us per call until it returns, GPU ms per call by CUDA events over a back-to-back run)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / iters


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--check-only", action="store_true", help="only the quantize kernel's check")
    args = p.parse_args(argv)
    device = "cpu" if INTERPRET else "cuda"
    print(f"quantize check: {check_quantize(device)} elements bit for bit")
    if args.check_only:
        return 0

    from ditprof.harness.swaps.linears import CompiledAlone
    from ditprof.kernels.fp8_linear import Fp8LinearConfig, torchao_linear

    torch.manual_seed(0)
    config = Fp8LinearConfig(granularity="rowwise")
    rows, record = [], []

    def measure(name: str, shape: str, x, fns: dict, info: dict, quant: SharedInputQuant) -> None:
        # each of fns runs the same linear(s) on x: timed, one table row and one JSON record. Every timed call is
        # a new forward's: ``quant`` forgets x first, or the fused path would time its GEMMs without the quantize
        def call(f):
            quant.clear()
            return f(x)

        times = {k: _host_and_gpu(lambda f=f: call(f)) for k, f in fns.items()}
        rows.append([name, shape] + [f"{fmt(times[k][1])} / {times[k][0]:.0f}" for k in times])
        record.append({"linear": name, **info, **{k: {"gpu_ms": g, "host_us": h} for k, (h, g) in times.items()}})

    with torch.no_grad():
        for name, M, K, N in FLUX_LINEARS:
            ao = torchao_linear(torch.nn.Linear(K, N, dtype=torch.bfloat16, device=device), config)
            quant = SharedInputQuant()
            fused = FusedQuantFp8Linear(ao, quant)
            comp = CompiledAlone(ao, name.replace("/", "_").replace(".", "_"))
            x = torch.randn(1, M, K, dtype=torch.bfloat16, device=device)
            assert torch.equal(ao(x), fused(x)), f"{name}: fused output differs from torchao's"
            measure(name, f"{M}x{K}x{N}", x, {"torchao": ao, "compiled": comp, "fused": fused},
                    {"M": M, "K": K, "N": N}, quant)
        # q, k, v of one input: fused quantizes it once
        aos = [torchao_linear(torch.nn.Linear(3072, 3072, dtype=torch.bfloat16, device=device), config)
               for _ in range(3)]
        shared = SharedInputQuant()
        fused3 = [FusedQuantFp8Linear(a, shared) for a in aos]
        comp3 = [CompiledAlone(a, f"qkv{i}") for i, a in enumerate(aos)]
        x = torch.randn(1, 4096, 3072, dtype=torch.bfloat16, device=device)
        for a, f in zip(aos, fused3):
            assert torch.equal(a(x), f(x)), "q/k/v: fused output differs from torchao's"
        measure("q+k+v, one input", "3 x 4096x3072x3072", x,
                {k: (lambda x, ms=ms: [m(x) for m in ms]) for k, ms in (("torchao", aos), ("compiled", comp3),
                                                                       ("fused", fused3))}, {}, shared)
    print_table("FP8 linears at flux, GPU ms / host us per call (back to back, 50 calls)",
                ["linear", "M x K x N", "torchao eager", "compiled alone", "fused quantize"], rows)
    path = Path(args.json) if args.json else results_path("fp8_linear_fused_quant")
    write_json({"environment": environment(), "linears": record}, path)
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
