"""One-shot GPU self-check of the FP8 prep: Triton vs the torch chain on several shapes (bit-exactness, poisoned
output buffers, determinism, error path), timing at the H3 shape (+ per-kernel split and a small launch-config
sweep). Prints everything; writes benchmarks/results/prep-check-<date>.json; exit code 1 on any mismatch.

    python benchmarks/prep_check.py            # on a CUDA machine
    python benchmarks/prep_check.py --no-sweep --no-h3
    python benchmarks/prep_check.py --interpret   # CPU, Triton interpreter, small shapes only (slow)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "--interpret" in sys.argv:  # must be set before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, print_table, results_path, write_json  # noqa: E402

SHAPES = [  # B, Sq, Sk, H, D
    (1, 30272, 30272, 56, 128),  # H3
    (2, 77, 77, 3, 128),
    (1, 1, 1, 1, 128),
    (1, 4096, 512, 8, 128),  # cross-attention-like
    (1, 300, 33, 2, 64),
    (3, 1000, 1000, 5, 128),
    (1, 30271, 30271, 4, 128),
]
SMALL = [s for s in SHAPES if s[0] * s[1] * s[3] <= 20000]


def make_qkv(B, Sq, Sk, H, D, dtype, device, seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((B, Sq, H, D), generator=g, device=device) * 2.5
    k = torch.randn((B, Sk, H, D), generator=g, device=device) + torch.randn((1, 1, H, D), generator=g,
                                                                              device=device) * 4
    v = torch.randn((B, Sk, H, D), generator=g, device=device) * 0.7
    out = tuple(x.to(dtype) for x in (q, k, v))
    for i, x in enumerate(out):  # a few exact signed zeros (-0 must quantize to 0x80)
        flat = x.view(-1)
        flat[(5 * i) % flat.numel()] = -0.0
        flat[flat.numel() // 3] = -0.0
    return out


def compare(a, b) -> dict:
    """Differences between two Fp8Prepared: differing bytes and max |decoded diff| per output."""
    import torch

    out = {}
    for name in ("q8", "k8", "v8t"):
        x, y = getattr(a, name), getattr(b, name)
        if x.shape != y.shape:
            out[name] = {"shape_mismatch": [list(x.shape), list(y.shape)]}
            continue
        bx, by = x.view(torch.uint8), y.view(torch.uint8)
        nbad = int((bx != by).sum())
        maxd = float((x.float() - y.float()).abs().max()) if nbad else 0.0
        nan = int(((bx & 0x7F) == 0x7F).sum())  # e4m3 NaN: poison left behind (never produced)
        out[name] = {"bytes_differ": nbad, "max_abs_diff": maxd, "nan_bytes": nan}
    out["scales_max_rel"] = float(((a.scales - b.scales).abs() / b.scales.abs()).max())
    out["scales_equal"] = bool(torch.equal(a.scales, b.scales))
    if a.k_mean is not None and b.k_mean is not None:
        out["k_mean_equal"] = bool(torch.equal(a.k_mean, b.k_mean))
        out["k_mean_max_abs"] = float((a.k_mean - b.k_mean).abs().max())
    return out


def is_exact(c: dict) -> bool:
    for name in ("q8", "k8", "v8t"):
        d = c[name]
        if "shape_mismatch" in d or d["bytes_differ"] or d["nan_bytes"]:
            return False
    return c["scales_equal"] and c.get("k_mean_equal", True)


def poisoned(ref):
    import torch

    from ditprof.kernels.prep import Fp8Prepared

    bufs = [torch.full(t.shape, 0x7F, dtype=torch.uint8, device=t.device).view(torch.float8_e4m3fn)
            for t in (ref.q8, ref.k8, ref.v8t)]
    return Fp8Prepared(*bufs, torch.full_like(ref.scales, float("nan")), ref.sq, ref.sk)


def cuda_time(fn, iters=20, warmup=3):
    import statistics

    import torch

    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def kernel_split(fn) -> dict:
    """CUDA time per kernel name (ms per call) over 5 calls, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t:
            out[ev.key[:60]] = round(t / 5 / 1e3, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interpret", action="store_true", help="CPU + TRITON_INTERPRET=1, small shapes only")
    p.add_argument("--no-h3", action="store_true", help="skip the big shapes (H3 and the 30271 one)")
    p.add_argument("--no-sweep", action="store_true", help="skip the launch-config sweep")
    p.add_argument("--no-json", action="store_true")
    args = p.parse_args(argv)

    import torch

    from ditprof.errors import DitprofError
    from ditprof.kernels import prep
    from ditprof.kernels.prep import fp8_prepare, fp8_prepare_torch

    if args.interpret:
        device, shapes = "cpu", SMALL
    else:
        if not torch.cuda.is_available():
            print("prep_check: needs CUDA (or --interpret for the CPU interpreter)", file=sys.stderr)
            return 1
        device = "cuda"
        shapes = [s for s in SHAPES if not (args.no_h3 and s[1] > 20000)]
    ok, why = prep.triton_available(device)
    if not ok:
        print(f"prep_check: Triton prep cannot run: {why}", file=sys.stderr)
        return 1
    env = environment()
    print(f"{env['gpu'] or 'CPU (interpreter)'} {env['gpu_capability'] or ''}, torch {env['torch']}, "
          f"triton {env['triton']}", flush=True)

    failures = []
    report = {"env": env, "checks": [], "timing": {}, "sweep": []}
    rows = []
    for (B, Sq, Sk, H, D) in shapes:
        for dtype in (torch.bfloat16,) if Sq > 20000 else (torch.bfloat16, torch.float16):
            for smooth in (True, False):
                label = f"{B}x{Sq}x{Sk}x{H}x{D} {str(dtype)[6:]} {'smooth' if smooth else 'raw'}"
                q = k = v = None
                try:
                    q, k, v = make_qkv(B, Sq, Sk, H, D, dtype, device, seed=Sq % 101)
                    ref = fp8_prepare_torch(q, k, v, smooth_k=smooth)
                    out = poisoned(ref)
                    t0 = time.perf_counter()
                    res = fp8_prepare(q, k, v, smooth_k=smooth, backend="triton", out=out)
                    first_s = time.perf_counter() - t0
                    c = compare(res, ref)
                    again = fp8_prepare(q, k, v, smooth_k=smooth, backend="triton")
                    c["deterministic"] = is_exact(compare(again, res))
                    exact = is_exact(c) and c["deterministic"]
                    c.update(label=label, exact=exact, first_call_s=round(first_s, 3))
                except Exception as exc:  # report and go on
                    c = {"label": label, "exact": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
                    exact = False
                report["checks"].append(c)
                if not exact:
                    failures.append(label)
                rows.append([label, "OK" if exact else "MISMATCH",
                             *(c.get(n, {}).get("bytes_differ") for n in ("q8", "k8", "v8t")),
                             max((c.get(n, {}).get("max_abs_diff", 0) or 0) for n in ("q8", "k8", "v8t")),
                             c.get("scales_max_rel"), c.get("deterministic"), c.get("error", "")[:80]])
                del q, k, v
                if device == "cuda":
                    torch.cuda.empty_cache()
    print_table("Triton prep vs torch prep (bytes that differ; poisoned out buffers; 2nd run = determinism)",
                ["shape", "result", "q8", "k8", "v8t", "max|diff|", "scales rel", "determ.", "error"], rows)

    # layouts, non-contiguous, errors
    extra = []
    q, k, v = make_qkv(2, 333, 129, 3, 128, torch.float16, device, seed=4)
    ref = fp8_prepare_torch(q, k, v)
    packed = torch.cat([k, v], dim=-1)
    variants = {
        "BHSD layout": lambda: fp8_prepare(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), layout="BHSD",
                                           backend="triton"),
        "BHSD view (non-contig)": lambda: fp8_prepare(*(x.transpose(1, 2) for x in (q, k, v)), layout="BHSD",
                                                      backend="triton"),
        "K/V slices of packed": lambda: fp8_prepare(q, packed[..., :128], packed[..., 128:], backend="triton"),
    }
    for name, fn in variants.items():
        try:
            good = is_exact(compare(fn(), ref))
        except Exception as exc:
            good = False
            name += f" ({type(exc).__name__}: {exc})"
        extra.append((name, good))
    for which in "qkv":
        qq, kk, vv = (x.clone() for x in (q, k, v))
        {"q": qq, "k": kk, "v": vv}[which][1, 100, 2, 3] = float("nan")
        try:
            fp8_prepare(qq, kk, vv, backend="triton")
            extra.append((f"NaN in {which} raises", False))
        except DitprofError as exc:
            extra.append((f"NaN in {which} raises: {exc}", str(exc) == f"{which} contains NaN or Inf"))
    for name, good in extra:
        print(f"  {'OK ' if good else 'BAD'} {name}")
        if not good:
            failures.append(name)
    report["extra"] = [{"check": n, "ok": g} for n, g in extra]

    # timing at H3
    if device == "cuda" and not args.no_h3:
        from ditprof.kernels import prep_triton
        from ditprof.kernels.fp8_config import PrepConfig

        B, Sq, Sk, H, D = SHAPES[0]
        q, k, v = make_qkv(B, Sq, Sk, H, D, torch.bfloat16, device)
        nbytes = B * H * D * (Sq + 2 * Sk) * (2 * 2 + 1)
        big_a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)  # ~1.4 ms of GEMM: "the kernel"

        def with_work(check):
            res = fp8_prepare(q, k, v, backend="triton", check_finite=check)
            torch.mm(big_a, big_a)
            if check == "defer":
                res.check_finite()

        copy_src = torch.empty(B * Sq * H * D * 4, dtype=torch.bfloat16, device=device).normal_()
        tm = {
            "triton_ms": cuda_time(lambda: fp8_prepare(q, k, v, backend="triton")),
            "triton_defer_ms": cuda_time(lambda: fp8_prepare(q, k, v, backend="triton",
                                                             check_finite="defer").check_finite()),
            "triton_no_check_ms": cuda_time(lambda: fp8_prepare(q, k, v, backend="triton", check_finite=False)),
            "triton_raw_no_smooth_ms": cuda_time(lambda: fp8_prepare(q, k, v, smooth_k=False, backend="triton",
                                                                     check_finite=False)),
            "torch_ms": cuda_time(lambda: fp8_prepare_torch(q, k, v), iters=5),
            "prep_check_then_gemm_ms": cuda_time(lambda: with_work(True)),
            "prep_defer_gemm_check_ms": cuda_time(lambda: with_work("defer")),
            "prep_nocheck_gemm_ms": cuda_time(lambda: with_work(False)),
            "gemm_ms": cuda_time(lambda: torch.mm(big_a, big_a)),
            "copy_tbps": 2 * copy_src.numel() * 2 / (cuda_time(lambda: copy_src.clone()) * 1e-3) / 1e12,
        }
        del copy_src, big_a
        tm["triton_gbps_vs_2read_1write"] = nbytes / (tm["triton_no_check_ms"] * 1e-3) / 1e9
        try:
            tm["kernels_ms"] = kernel_split(lambda: fp8_prepare(q, k, v, backend="triton", check_finite=False))
        except Exception as exc:
            tm["kernels_ms"] = f"profiler failed: {exc}"
        report["timing"] = tm
        print(f"H3 prep: triton {tm['triton_ms']:.3f} ms (deferred check {tm['triton_defer_ms']:.3f} ms, "
              f"no finite check {tm['triton_no_check_ms']:.3f} ms, "
              f"no smoothing {tm['triton_raw_no_smooth_ms']:.3f} ms, "
              f"{tm['triton_gbps_vs_2read_1write']:.0f} GB/s of 2 reads + 1 write), torch {tm['torch_ms']:.3f} ms"
              f" — budget 1 ms; copy {tm['copy_tbps']:.2f} TB/s (read + write)")
        print(f"  prep + 8192^3 GEMM: eager check {tm['prep_check_then_gemm_ms']:.3f} ms, deferred "
              f"{tm['prep_defer_gemm_check_ms']:.3f} ms, no check {tm['prep_nocheck_gemm_ms']:.3f} ms "
              f"(GEMM alone {tm['gemm_ms']:.3f} ms)")
        print(f"  per kernel (ms/call): {tm['kernels_ms']}")
        if not args.no_sweep:
            qs, ks, vs = q, k, v
            base = prep_triton.prepare_triton(qs, ks, vs, True)
            srows = []
            configs = [dict(quant_block=qb, quant_warps=qw) for qb, qw in ((16, 4), (64, 4), (64, 8))]
            configs += [dict(fast_div=False)]
            configs += [dict(stats_chunk=c, stats_r=r, stats_warps=w)
                        for c, r, w in ((256, 8, 4), (1024, 8, 4), (512, 4, 4), (512, 16, 4), (1024, 16, 8))]
            for cfg in configs:
                try:
                    got = prep_triton.prepare_triton(qs, ks, vs, True, config=PrepConfig(**cfg))
                    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got[:3], base[:3]))
                    ms = cuda_time(lambda: prep_triton.prepare_triton(qs, ks, vs, True, config=PrepConfig(**cfg)),
                                   iters=10)
                    report["sweep"].append({**cfg, "ms": ms, "same_bytes": same})
                    srows.append([str(cfg), ms, same, ""])
                    if not same:
                        failures.append(f"sweep {cfg}")
                except Exception as exc:
                    srows.append([str(cfg), None, None, f"{type(exc).__name__}: {exc}"[:100]])
            d = PrepConfig()
            print_table("launch-config sweep at H3 (whole prep, no finite check; defaults: quant_block "
                        f"{d.quant_block}/{d.quant_warps} warps, stats chunk "
                        f"{d.stats_chunk}/R {d.stats_r}/{d.stats_warps} warps)",
                        ["config", "ms", "same bytes", "error"], srows)

    report["failures"] = failures
    print("ALL OK" if not failures else f"FAILURES: {failures}")
    if not args.no_json and not args.interpret:
        path = results_path("prep-check")
        write_json(report, path)
        print(f"wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
