"""CLI: ``ditprof profile``, ``ditprof compare``, ``ditprof backends``."""

from __future__ import annotations

import argparse


def add_compile_flag(group) -> None:
    """``--compile [MODE]`` (profile, compare, validate)."""
    from ditprof.harness.run.compile_mode import MODES

    group.add_argument("--compile", nargs="?", const="default", choices=MODES, metavar="MODE",
                       help="torch.compile the block (fullgraph) before measuring it: MODE default (bare --compile) "
                            "or max-autotune-no-cudagraphs; reports the compile time and a 'fused' category for "
                            "kernels that fuse ops of several categories (default: eager)")


def add_linears_flag(p: argparse.ArgumentParser, compare: bool, where: str | None = None) -> None:
    """``--linears GRANULARITY`` (profile, compare, validate): the block's linears in FP8 through torchao.
    ``where``: which blocks run them, as the help says it (default: profile's or compare's)."""
    from ditprof.kernels.fp8_linear_config import GRANULARITIES, TORCHAO_PIN

    where = where or ("in the swapped run (with its attention backend)" if compare else "in the measured block")
    group = p.add_argument_group("linears")
    group.add_argument(
        "--linears", choices=GRANULARITIES, metavar="|".join(GRANULARITIES),
        help=f"run the block's linears in FP8 {where}: torchao's dynamic float8 ({TORCHAO_PIN}) with rowwise or "
             f"tensorwise scales on a GPU with FP8 tensor cores (sm_89+), its numerics emulated elsewhere (numerics "
             f"only); the family keeps its modulation projections in bf16, the report lists every kept linear. "
             f"In an eager run each FP8 linear is compiled alone (torch.compile), so that inductor fuses torchao's "
             f"activation quantization into one kernel")
    group.add_argument("--linears-eager", dest="linears_compile", action="store_false",
                       help="--linears without the per-linear compile: torchao's eager path, its activation "
                            "quantization as separate elementwise kernels")


def add_fp8_flags(group) -> None:
    """``--no-fp8-graphs`` and ``--no-tvm-ffi`` (profile, compare, validate): the run's ``Fp8Options``
    (``args.fp8_options_of``); backends that take no FP8 options (sdpa, ...) ignore them."""
    group.add_argument("--no-fp8-graphs", dest="fp8_graphs", action="store_false",
                       help="fp8 backend: launch every call directly (by default a call repeating an earlier one's "
                            "arguments replays that call's launches, the prep's and the kernel's, as one CUDA graph)")
    group.add_argument("--no-tvm-ffi", dest="tvm_ffi", action="store_false",
                       help="fp8 backend: launch the kernel through the CuTe DSL's own JIT launcher (by default "
                            "through TVM-FFI where apache-tvm-ffi is importable: less host time per launch)")


def add_prologue_flag(group) -> None:
    """``--prologue`` (profile, compare, validate): the FP8 attention with the family's norm and RoPE fused into its prep."""
    group.add_argument(
        "--prologue", action="store_true",
        help="fuse the attention processor's norm_q/norm_k (RMSNorm per head or across heads) and RoPE into the "
             "FP8 prep, which then reads the raw projections (the fp8 backend, or fp8-emulated on the CPU: numerics "
             "only); a family without a fused prologue says so and runs the unfused path")


def add_attention_alone_flag(group) -> None:
    """``--attention-alone`` (profile, compare): the report's "attention in context" section per run."""
    group.add_argument(
        "--attention-alone", dest="attention_alone", action="store_true",
        help="after the measured calls, time each attention call of the block in the block, alone on the very "
             "tensors it got, and (CUDA) alone right after the block's largest linear ran; the SM clock (pynvml) "
             "after each phase: where the in-block attention time goes (eager blocks, one GPU)")


def add_each_swap_flag(p: argparse.ArgumentParser) -> None:
    """``--each-swap`` (compare): every prefix of the swap list measured as its own configuration."""
    p.add_argument_group("configurations").add_argument(
        "--each-swap", dest="each_swap", action="store_true",
        help="measure the swaps added one at a time, each as its own configuration: baseline | + the --attention "
             "backend | + FP8 linears (needs --linears: with the attention swap alone it is the plain compare); the "
             "report has one column per configuration, each with its accuracy against the baseline, its model time "
             "and its change against the previous one")


def _common(p: argparse.ArgumentParser, compare: bool) -> None:
    src = p.add_argument_group("what to run")
    src.add_argument("--preset", help="built-in preset (ditprof presets); default h3 on CUDA, h3-mini on CPU")
    src.add_argument("--checkpoint", metavar="DIR_OR_REPO",
                     help="diffusers-format folder or Hugging Face repo id instead of a preset")
    src.add_argument("--block", type=int, default=0, metavar="I", help="block index (default 0)")
    src.add_argument("--kind", default=None, metavar="STACK",
                     help="block stack: main, double / single (Flux, FLUX.2, HunyuanVideo), refiner (MiniMax-H3); "
                          "default: the preset's (ditprof presets lists each stack)")
    att = p.add_argument_group("attention")
    if compare:
        att.add_argument("--baseline", metavar="BACKEND",
                         help="baseline backend (default: sdpa, what the model uses)")
        att.add_argument("--attention", metavar="BACKEND",
                         help="backend swapped in (default: fp8 on CUDA if available, else fa4 > sdpa-cudnn > "
                              "sdpa-flash; fp8-emulated on CPU)")
    else:
        att.add_argument("--attention", metavar="BACKEND", help="attention backend (default: sdpa)")
    add_prologue_flag(att)
    add_attention_alone_flag(att)
    add_linears_flag(p, compare)
    if compare:
        add_each_swap_flag(p)
    add_fp8_flags(att)
    run = p.add_argument_group("inputs and device")
    run.add_argument("--device", choices=None, metavar="cpu|cuda", help="default: cuda when available")
    run.add_argument("--tokens", type=int, metavar="N",
                     help="video/image tokens; MiniMax-H3: packed rows, split into text, audio and video "
                          "(default: the preset's)")
    run.add_argument("--height", type=int, metavar="H", help="pixel height (with --width, --frames)")
    run.add_argument("--width", type=int, metavar="W", help="pixel width")
    run.add_argument("--frames", type=int, metavar="F", help="video frames")
    run.add_argument("--text-tokens", dest="text_tokens", type=int, metavar="N",
                     help="prompt length in tokens (default: the preset's, or the pipeline's)")
    run.add_argument("--batch", type=int, metavar="B", help="batch size (default 1)")
    run.add_argument("--dtype", metavar="DTYPE", help="bfloat16 (default), float16 or float32")
    run.add_argument("--gpu-memory", dest="gpu_memory", metavar="SIZE",
                     help="cap GPU memory like a smaller card, e.g. 16GiB")
    run.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    run.add_argument("--warmup", type=int, metavar="N", help="warm-up calls (default 3 on CUDA, 1 on CPU)")
    run.add_argument("--iters", type=int, metavar="N",
                     help="timed and profiled calls each (default 10 on CUDA, 5 on CPU)")
    run.add_argument("--interleave", type=int, metavar="N",
                     help="compare: N rounds of eager block calls with the baseline and the swap in turns after both "
                          "measurements, a ratio that host drift cannot bias (default --iters on CUDA, 0 on CPU)")
    run.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                     help="skip the CUDA-graph replay timing (GPU; it shows the host overhead per block call)")
    run.add_argument("--time-limit", dest="time_limit", type=float, metavar="MIN",
                     help="stop before a run the plan estimates to take longer (default 15 minutes)")
    run.add_argument("--yes", action="store_true", help="run even when the plan's estimate is over --time-limit")
    add_compile_flag(run)
    run.add_argument("--sp", type=int, metavar="P",
                     help="Ulysses sequence parallelism over P ranks (NCCL, one GPU each; gloo on CPU)")
    run.add_argument("--sp-cross", dest="sp_cross", choices=("local", "heads"), help=argparse.SUPPRESS)
    ex = p.add_argument_group("extrapolation")
    ex.add_argument("--blocks", type=int, metavar="N",
                    help="blocks the extrapolation covers: the model's block count (default: the model's)")
    ex.add_argument("--steps", type=int, metavar="S", help="denoising steps")
    ex.add_argument("--cfg", action="store_true", help="classifier-free guidance (2 passes per step)")
    p.add_argument("--out", metavar="DIR", help="output folder (default traces/<preset>-<timestamp>/)")
    p.add_argument("--json", action="store_true",
                   help="print report.json on stdout (schema ditprof.report/1, ditprof/harness/report/report.schema.json); "
                        "the table and progress go to stderr")


def _profile(args) -> int:
    from ditprof.harness.run.runner import run_command

    return run_command(args, "profile")


def _compare(args) -> int:
    from ditprof.harness.run.runner import run_command

    return run_command(args, "compare")


def _backends(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ditprof.dispatch import dispatcher_value
    from ditprof.harness.swaps import backends
    from ditprof.kernels import registry

    devices = [args.device] if args.device else ["cpu", "cuda"]
    table = Table(title="attention backends", title_justify="left")
    table.add_column("name")
    table.add_column("diffusers backend")
    for d in devices:
        table.add_column(f"on {d}")
    table.add_column("description")
    for name in backends.names():
        cells = []
        desc = ""
        for d in devices:
            ok, reason = backends.availability(name, d)
            desc = desc or registry.get(name).description
            cells.append("[green]yes[/]" if ok else f"[red]no[/]: {reason}")
        table.add_row(name, dispatcher_value(name), *cells, desc)
    console = Console()
    if not console.is_terminal and console.width < 140:
        console = Console(width=140)
    console.print(table)
    import torch

    where = "CUDA: " + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible")
    console.print(f"torch {torch.__version__}, {where}")
    return 0


def _diff(args) -> int:
    import json as _json
    import sys as _sys
    from datetime import datetime
    from pathlib import Path

    from rich.console import Console

    from ditprof.errors import DitprofError
    from ditprof.harness.run import atomic
    from ditprof.harness.trace import diff as D

    if args.top < 1:
        raise DitprofError(f"--top must be >= 1 (got {args.top})")
    a, b = D.open_side(args.run_a), D.open_side(args.run_b)
    d = D.diff(a, b, top=args.top)
    out = Path(args.out) if args.out else Path("traces") / (
        f"diff-{a.folder.name}-vs-{b.folder.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    with atomic.staged_dir(out) as stage:
        atomic.write_bytes(stage / "diff.png", D.png(d))
        atomic.write_text(stage / "diff.md", D.markdown(d))
        atomic.write_text(stage / "diff.json", _json.dumps(d, indent=1) + "\n")
    console = Console(stderr=args.json)
    if not console.is_terminal and console.width < 120:  # a log or a pipe: the op names and categories unwrapped
        console = Console(stderr=args.json, width=120)
    console.print(D.terminal_table(d))
    for note in d["notes"]:
        console.print(f"note: {note}", highlight=False)
    console.print(f"outputs: {out}")
    if args.json:
        _sys.stdout.write(_json.dumps(d, indent=1) + "\n")
    return 0


def register(subparsers) -> None:
    d = subparsers.add_parser("diff", help="what changed between two saved runs, per category and per op",
                              description="Compare two run folders (profile or compare; any machines or backends): "
                                          "per-category and per-op deltas, a table, diff.png, diff.json and diff.md. "
                                          "A side is DIR or DIR:baseline / DIR:swapped (default: the swapped "
                                          "measurement of a compare, the baseline of a profile).")
    d.add_argument("run_a", metavar="RUN_A")
    d.add_argument("run_b", metavar="RUN_B")
    d.add_argument("--top", type=int, default=15, help="ops listed (default 15)")
    d.add_argument("--out", metavar="DIR", help="output folder (default traces/diff-<a>-vs-<b>-<timestamp>/)")
    d.add_argument("--json", action="store_true", help="print diff.json on stdout (schema ditprof.diff/1)")
    d.set_defaults(func=_diff)

    p = subparsers.add_parser("profile", help="profile one block with one attention backend",
                              description="Profile one transformer block: time, GPU time split, extrapolation.")
    _common(p, compare=False)
    p.set_defaults(func=_profile)

    p = subparsers.add_parser("compare", help="profile one block before and after swapping its attention",
                              description="Run one block with the baseline attention and with the swapped "
                                          "backend; report both, the speedup, accuracy and extrapolation.")
    _common(p, compare=True)
    p.set_defaults(func=_compare)

    p = subparsers.add_parser("backends", help="attention backends and whether each is available here")
    p.add_argument("--device", metavar="cpu|cuda", help="only this device (default: both)")
    p.set_defaults(func=_backends)
