"""Q rotated and quantized in the kernel (fp8-sm90's ``q_rot`` build; session 18's experiment, shipped since) vs the
prep's Q, on the H200: the prep without Q's programs (``PrepPlan(skip_q=True)``) + the q_rot kernel against the full
prep + the prep's-Q kernel,
both on the plain grid (the stream-K tail is left out of both), on the same fresh Gaussian inputs. Prep alone, kernel
alone and the two together, the six alternating call by call behind a sleep (``bench_helpers.sleep_alternating``),
median of ``--rounds``; accuracy of both against float64 on the first two heads and the variant against the shipped
output. One table, JSON with machine, date and versions.

    python benchmarks/experimental/qrot_bench.py --shapes flux,ltx,cogvideox,h3 --rounds 15 --json out.json
"""

from __future__ import annotations

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES  # noqa: E402

SHAPES = {**{n: VIDEO_SHAPES[n] for n in ("flux", "ltx", "cogvideox", "h3")},
          "quick": (1, 2048, 8, 128)}  # B, S, H, D


def measure(name: str, rounds: int) -> dict:
    import torch
    import dataclasses

    from bench_helpers import gaussian_qkv, sleep_alternating, warm

    from ditprof.kernels.launch import compiled, launch_compiled, rotation_t, spec_for
    from ditprof.kernels.prep_triton import PrepPlan
    from ditprof.kernels.reference import attention_reference

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=1)
    scale = 1.0 / math.sqrt(D)
    stream = torch.cuda.current_stream().cuda_stream
    full = PrepPlan(q, k, v, True, qk_int8=True)
    skip = PrepPlan(q, k, v, True, qk_int8=True, skip_q=True)
    bf, bs = full.buffers(q.device), skip.buffers(q.device)
    o1, o2 = torch.empty_like(q), torch.empty_like(q)
    l1 = torch.empty((B, H, S), dtype=torch.float32, device="cuda")
    l2 = torch.empty_like(l1)
    spec = spec_for("fp8-sm90", "sm_90a", D, "bfloat16", True, qk_int8=True)
    launcher = {"spec": spec, "fn": compiled(spec)}
    spec_q = dataclasses.replace(spec, q_rot=True)
    launcher_q = {"spec": spec_q, "fn": compiled(spec_q)}
    rot = rotation_t(D, q.dtype, q.device)

    def prep_full():
        full.launch(q, k, v, bf, stream)

    def prep_skip():
        skip.launch(q, k, v, bs, stream)

    def kernel_shipped():
        launcher["spec"], launcher["fn"] = launch_compiled(
            launcher["spec"], launcher["fn"], bf["q8"], bf["k8"], bf["v8t"], bf["scales"], bf["q_scales"], None,
            o1, l1, B, H, S, S, scale, stream)

    def kernel_qrot():
        launcher_q["spec"], launcher_q["fn"] = launch_compiled(
            launcher_q["spec"], launcher_q["fn"], q, bs["k8"], bs["v8t"], bs["scales"], rot, None, o2, l2, B, H, S, S,
            scale, stream)

    def call_shipped():
        prep_full()
        kernel_shipped()

    def call_qrot():
        prep_skip()
        kernel_qrot()

    runners = {"prep_full": prep_full, "prep_skip_q": prep_skip, "kernel_shipped": kernel_shipped,
               "kernel_qrot": kernel_qrot, "call_shipped": call_shipped, "call_qrot": call_qrot}
    warm(runners)
    times = sleep_alternating(runners, rounds)
    import statistics

    row = {"shape": name, "B": B, "S": S, "H": H, "D": D,
           "ms": {n: statistics.median(t) for n, t in times.items()}, "all_ms": times}
    call_shipped()
    call_qrot()
    torch.cuda.synchronize()
    hs = slice(0, min(2, H))
    ref = attention_reference(q[:, :, hs], k[:, :, hs], v[:, :, hs], scale)

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    row["rel_rms_vs_f64"] = {"shipped": rel(o1[:, :, hs], ref), "qrot": rel(o2[:, :, hs], ref)}
    row["rel_rms_qrot_vs_shipped"] = rel(o2, o1)
    row["finite"] = bool(torch.isfinite(o2).all().item())
    del q, k, v, bf, bs, o1, o2, ref
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import parse_shapes_rounds, run_meta

    parsed = parse_shapes_rounds(argv, __doc__, SHAPES, "flux,ltx,cogvideox,h3")
    if parsed is None:
        return 2
    names, rounds, json_path = parsed
    rows = []
    for n in names:
        rows.append(measure(n, rounds))
        r = rows[-1]
        print(f"{n}: " + ", ".join(f"{k} {v:.4f}" for k, v in r["ms"].items()), flush=True)
    print(f"\n{'shape':10} {'prep full':>10} {'prep -Q':>9} {'kern ship':>10} {'kern qrot':>10} {'call ship':>10} "
          f"{'call qrot':>10} {'ratio':>7} {'f64 ship':>9} {'f64 qrot':>9} {'vs ship':>8}")
    for r in rows:
        m = r["ms"]
        print(f"{r['shape']:10} {m['prep_full']:10.4f} {m['prep_skip_q']:9.4f} {m['kernel_shipped']:10.4f} "
              f"{m['kernel_qrot']:10.4f} {m['call_shipped']:10.4f} {m['call_qrot']:10.4f} "
              f"{m['call_qrot'] / m['call_shipped']:7.3f} {r['rel_rms_vs_f64']['shipped']:9.4%} "
              f"{r['rel_rms_vs_f64']['qrot']:9.4%} {r['rel_rms_qrot_vs_shipped']:8.2e}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"meta": run_meta(rounds=rounds), "rows": rows}, f, indent=1)
    return 0 if all(r["finite"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
