"""``ditprof profile`` / ``ditprof compare``: load the block, measure each backend, write the run folder."""

from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from rich.console import Console
from rich.progress import Progress

from ditprof.errors import DitprofError
from ditprof import dispatch
from ditprof.progress import make_progress
from ditprof.harness.report import document, limits
from ditprof.harness.report import summary as report
from ditprof.harness.run import atomic, compile_mode
from ditprof.harness.run.environment import environment
from ditprof.harness.run.extrapolate import extrapolate
from ditprof.harness.run.finite import check_inputs, first_nonfinite
from ditprof.harness.run.measure import Prepare, measure_swapped
from ditprof.harness.run.measure import swapped as measured_block
from ditprof.harness.run.memory import memory_budget
from ditprof.harness.run.parts import Phases, model_section, plot_title, resident_bytes, write_run  # noqa: F401
from ditprof.harness.run.plan import check_plan, make_plan
from ditprof.harness.run.session import BackendRun
from ditprof.harness.swaps import backends
from ditprof.harness.swaps.attention import AttentionSwap
from ditprof.harness.swaps.base import Swap
from ditprof.harness.swaps.linears import linears_swaps
from ditprof.kernels.fp8_linear import fp8_tensor_cores
from ditprof.harness.swaps.base import label as swaps_label
from ditprof.kernels.fp8_config import Fp8Options
from ditprof.kernels import registry
from ditprof.report_stdout import stdout_to_stderr
from ditprof.kernels.registry import Backend

from ditprof.harness.cli.args import DEFAULT_CPU_PRESET, DEFAULT_CUDA_PRESET  # noqa: F401 -- re-exported
from ditprof.harness.cli.args import (check_counts, check_gpu_memory, check_size, default_out, fp8_options_of,
                                      source_of)


@dataclass
class RunSpec:
    command: str  # "profile" / "compare"
    source: str
    source_kind: str  # "preset" / "checkpoint"
    block: int
    kind: str | None
    device: torch.device
    dtype: torch.dtype
    baseline: str
    swap: str | None
    tokens: int | None
    height: int | None
    width: int | None
    frames: int | None
    n_blocks: int | None
    steps: int | None
    cfg: bool
    gpu_memory: str | None
    out: Path
    warmup: int
    iters: int
    seed: int
    sp: int | None = None  # --sp P: Ulysses sequence parallelism over P ranks (harness.sequence_parallel)
    sp_cross: str = "local"  # cross-attention under SP: "local" (no communication) or "heads"
    cuda_graph: bool = True  # GPU: also time CUDA-graph replays of the block (session.time_block_graph)
    yes: bool = False  # run even when the plan's time estimate is over time_limit_min
    time_limit_min: float = 15.0
    size_note: str = ""  # why the size is not the one the user or preset gave (CPU checkpoint default)
    batch: int = 1
    text_tokens: int | None = None  # prompt length (default: the preset's / the family's pipeline default)
    json_out: bool = False  # --json: the report on stdout, everything else on stderr
    compile: str | None = None  # --compile MODE: torch.compile the block (harness.compile_mode); None: eager
    # compare: rounds of eager block calls with the baseline and the swap taken in turns after both phases
    # (session.time_interleaved); 0: none
    interleave: int = 0
    linears: str | None = None  # --linears GRANULARITY: the block's linears in FP8 (harness.swaps.linears)
    linears_compile: bool = True  # eager runs: each FP8 linear compiled alone (--linears-eager: not)
    # what the FP8 backends run with (--no-fp8-graphs, --no-tvm-ffi; backends.resolve); None: the process's
    fp8_options: Fp8Options | None = None
    # compare --each-swap: every prefix of the swap list measured as its own configuration (baseline | + attention
    # | + FP8 linears), not only the baseline and all swaps together
    each_swap: bool = False
    # --prologue: the swapped attention with the family's norm_q/norm_k and RoPE fused into the FP8 prep
    # (harness.swaps.prologue)
    prologue: bool = False
    # --attention-alone: each run's attention calls timed in the block, alone and after the block's GEMMs
    # (harness.run.attention_context), the report's attention_context section
    attention_alone: bool = False


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DitprofError(f"--device {name!r} is not a device; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DitprofError(f"--device {name}: no CUDA GPU is visible to torch {torch.__version__}")
    if dev.type not in ("cpu", "cuda"):
        raise DitprofError(f"--device {name}: only cpu and cuda are supported")
    return dev


def spec_from_args(args: Any, command: str) -> RunSpec:
    compile_as = compile_mode.check_args(args)
    device = resolve_device(getattr(args, "device", None))
    source, source_kind = source_of(args, device)
    check_size(args)
    check_gpu_memory(args)
    check_counts(args, ("tokens", "height", "width", "frames", "blocks", "steps", "iters", "sp", "batch",
                        "text_tokens"), ("block", "warmup"))
    swap_name = None
    if command == "compare":
        baseline = args.baseline or backends.DEFAULT_BASELINE
        swap_name = args.attention or backends.default_swap(device)
    else:
        baseline = args.attention or backends.DEFAULT_BASELINE
    from ditprof.harness.run.plan import CPU_CHECKPOINT_TOKENS, DEFAULT_TIME_LIMIT_MIN

    tokens, size_note = args.tokens, ""
    if (device.type == "cpu" and source_kind == "checkpoint" and tokens is None and args.height is None):
        # the pipeline's size is a GPU job (HunyuanVideo: 118,800 tokens, hours on a CPU)
        tokens = CPU_CHECKPOINT_TOKENS
        size_note = (f"no size given on CPU: a small default of {tokens} tokens (the pipeline's own size is the "
                     f"default on CUDA; --tokens or --height/--width/--frames to choose)")
    dtype = DTYPES.get(getattr(args, "dtype", None) or "bfloat16")
    if dtype is None:
        raise DitprofError(f"--dtype {args.dtype!r} is not supported (use one of: {', '.join(DTYPES)})")
    limit = getattr(args, "time_limit", None)
    if limit is not None and limit <= 0:
        raise DitprofError(f"--time-limit must be > 0 minutes (got {limit})")
    out = default_out(args.out, source)
    _check_linears(args, device)
    _check_each_swap(args)
    return RunSpec(
        command=command, source=source, source_kind=source_kind, block=args.block or 0,
        kind=getattr(args, "kind", None), device=device,
        dtype=dtype, baseline=baseline, swap=swap_name, tokens=tokens, height=args.height,
        width=args.width, frames=args.frames, n_blocks=args.blocks, steps=args.steps, cfg=bool(args.cfg),
        gpu_memory=args.gpu_memory, out=out,
        warmup=args.warmup if args.warmup is not None else (3 if device.type == "cuda" else 1),
        iters=args.iters if args.iters is not None else (10 if device.type == "cuda" else 5),
        seed=args.seed, sp=getattr(args, "sp", None), sp_cross=getattr(args, "sp_cross", None) or "local",
        cuda_graph=getattr(args, "cuda_graph", True), yes=bool(getattr(args, "yes", False)),
        time_limit_min=limit if limit is not None else DEFAULT_TIME_LIMIT_MIN, size_note=size_note,
        batch=getattr(args, "batch", None) or 1, text_tokens=getattr(args, "text_tokens", None),
        json_out=bool(getattr(args, "json", False)), compile=compile_as,
        interleave=_interleave_rounds(args, command, device, swap_name, compile_as),
        linears=getattr(args, "linears", None), linears_compile=getattr(args, "linears_compile", True),
        fp8_options=fp8_options_of(args),
        each_swap=bool(getattr(args, "each_swap", False)),
        prologue=check_prologue(args, command, swap_name, baseline),
        attention_alone=_check_attention_alone(args, compile_as),
    )


def _check_linears(args: Any, device: torch.device) -> None:
    """``--linears``: a one-line error before any work where it cannot run (no torchao on an FP8 GPU; --sp)."""
    if not getattr(args, "linears", None):
        return
    if getattr(args, "sp", None) is not None:
        raise DitprofError("--linears with --sp is not supported yet: measure FP8 linears on one GPU")
    linears_swaps(args.linears, device)


def check_prologue(args: Any, command: str, swap_name: str | None, baseline: str) -> bool:
    """``--prologue``: a one-line error where it cannot apply (not an FP8 backend; --sp)."""
    if not getattr(args, "prologue", False):
        return False
    from ditprof.harness.swaps.prologue import PROLOGUE_BACKENDS

    name = swap_name if command == "compare" else baseline
    if name not in PROLOGUE_BACKENDS:
        raise DitprofError(f"--prologue fuses the processor's norm and RoPE into the FP8 prep: it needs the "
                           f"attention backend {' or '.join(PROLOGUE_BACKENDS)}, not {name}")
    if getattr(args, "sp", None) is not None:
        raise DitprofError("--prologue with --sp is not supported yet: measure the fused prologue on one GPU")
    return True


def _check_attention_alone(args: Any, compile_as: str | None) -> bool:
    """``--attention-alone`` times the eager block's attention calls on one device: not with --compile or --sp."""
    if not getattr(args, "attention_alone", False):
        return False
    if compile_as:
        raise DitprofError("--attention-alone times the eager block's attention calls: run it without --compile")
    if getattr(args, "sp", None) is not None:
        raise DitprofError("--attention-alone with --sp is not supported yet: measure it on one GPU")
    return True


def _check_each_swap(args: Any) -> None:
    """``--each-swap`` adds the swaps one at a time: with the attention swap alone that is the plain compare."""
    if getattr(args, "each_swap", False) and not getattr(args, "linears", None):
        raise DitprofError("--each-swap measures the swaps added one at a time, and the attention swap is the only "
                           "one here: add --linears (or run compare without --each-swap)")


def _interleave_rounds(args: Any, command: str, device: torch.device, swap_name: str | None,
                       compile_as: str | None) -> int:
    """--interleave N (compare only; default: --iters on CUDA, none on the CPU, where a block call's time is the
    host's anyway); none for a compiled block or a numerics emulation (no speed to compare); a bad value is a
    one-line error. The one decision: the run and its plan both read the result."""
    from ditprof.kernels import registry

    n = getattr(args, "interleave", None)
    if n is not None and n < 0:
        raise DitprofError(f"--interleave must be >= 0 rounds (got {n})")
    if command != "compare":
        if n:
            raise DitprofError("--interleave takes turns between a baseline and a swap: it is for ditprof compare")
        return 0
    if compile_as or (swap_name and registry.is_numerics_only(swap_name)) or \
            (getattr(args, "linears", None) and not fp8_tensor_cores(device)):
        return 0
    if n is None:
        return (args.iters if args.iters is not None else 10) if device.type == "cuda" else 0
    return n


def swap_skipped(b: Backend | None, mask_note: str | None) -> str | None:
    """Why the swap cannot run on this block (its mask masks positions, the backend takes no mask), or None."""
    if b is None or mask_note is None or dispatch.accepts_mask(b.fn):
        return None
    return (f"{b.name} was not run: {mask_note}, and the {b.name} backend takes no attention mask -- the fp8 swap "
            f"needs key-padding mask support for this family")


def attention_swap(spec: RunSpec, loaded: Any, b: Backend, *, fuse: bool = False,
                   console: Console | None = None) -> AttentionSwap:
    """The block's attention on ``b`` (under ``--compile``: as the compiled block should see it). ``fuse`` (the
    measured side of ``--prologue``): with the family's fused prologue, or, for a family without one, the unfused
    path after one line saying so."""
    family = getattr(loaded, "family", None)
    uses, head_dim = getattr(family, "uses_dispatcher", None), getattr(loaded, "head_dim", None)
    if spec.compile:
        from ditprof.harness.run.compile_backends import for_compile

        # the fused prologue's op is opaque to torch.compile already; the modules a family leaves unfused (Wan's
        # cross-attention) run the backend, as the compiled block should see it
        b = for_compile(b)
    if fuse and spec.prologue:
        from ditprof.harness.swaps.prologue import PrologueSwap

        missing = getattr(family, "prologue_missing", "no model family")
        if not missing:
            return PrologueSwap(b, family, options=spec.fp8_options, uses_dispatcher=uses, head_dim=head_dim)
        if console is not None:
            console.print(f"[yellow]--prologue[/]: {getattr(family, 'name', 'this block')} has no fused prologue "
                          f"({missing}); its attention runs the unfused FP8 path", highlight=False)
    return AttentionSwap(b, uses_dispatcher=uses, head_dim=head_dim)


def linears_swap(spec: RunSpec, loaded: Any) -> list[Swap]:
    """``--linears``: the block's linears in FP8, the family's modulation projections kept (none without it)."""
    return linears_swaps(spec.linears, spec.device, getattr(loaded, "family", None),
                         compile_each=spec.linears_compile and not spec.compile)


def _compiler(spec: RunSpec, inputs: Any, label: str, name: str, progress: Progress | None, console: Console,
              stats: dict) -> Prepare:
    """``measure_swapped``'s prepare step under ``--compile``: the swapped block compiled (the compile sees the
    swapped attention), warmed up until a call compiles nothing; ``stats`` gets the compile section."""

    what = f"the block with {name} attention"

    def prepare(block):
        compiled = compile_mode.compile_block(block, spec.compile, spec.device)
        phase = Phases(progress, f"{label} ({name})")
        phase("compile (first call)", 0, 1)
        got = compile_mode.warm_up(lambda: inputs.run(compiled), spec.device, spec.compile, what=what)
        phase("compile (first call)", 1, 1)
        stats.update(got.as_dict())
        console.print(compile_mode.line(stats, f"{label} ({name})"), highlight=False)
        return compiled, compile_mode.stable(spec.compile, "the timed and profiled calls", what=what)

    return prepare


def _measure(spec: RunSpec, loaded: Any, inputs: Any, label: str, swaps: Sequence[Swap], stage: Path,
             progress: Progress | None, resident: int, console: Console) -> BackendRun:
    """One measurement of the block with ``swaps`` in it (whatever they are)."""
    name = swaps_label(swaps)
    stats: dict = {}
    run = measure_swapped(
        loaded.module, swaps, inputs.run, label=label,
        prepare=_compiler(spec, inputs, label, name, progress, console, stats) if spec.compile else None,
        # the eager block finds where the NaN/Inf appears (per module): a compiled one has no module boundaries
        diagnose=lambda: first_nonfinite(loaded.module, lambda: inputs.run(loaded.module)),
        device=spec.device, workdir=stage, warmup=spec.warmup, iters=spec.iters, resident_bytes=resident,
        on_phase=Phases(progress, f"{label} ({name})"), cuda_graph=spec.cuda_graph)
    if stats:
        run.extra["compile"] = stats
    if spec.attention_alone:
        from ditprof.harness.run.attention_context import attention_context

        run.extra["attention_context"] = attention_context(
            loaded.module, swaps, inputs.run, device=spec.device, iters=spec.iters,
            on_phase=Phases(progress, f"{label} ({name})"))
    return run


def _interleaved(spec: RunSpec, loaded: Any, inputs: Any, base: Sequence[Swap], swapped: Sequence[Swap],
                 progress: Progress | None) -> dict | None:
    """Eager block calls with the baseline and the swap taken in turns (``spec.interleave`` rounds), after both
    phases: the report's ``interleaved`` section, or None without rounds (``_interleave_rounds`` says when)."""
    from ditprof.harness.run import noise
    from ditprof.harness.run.session import INTERLEAVED_CALLS_PER_ROUND, _band, time_interleaved

    if not spec.interleave:
        return None
    phase = Phases(progress, "interleaved")
    what, n = "baseline / swapped in turns, rounds", spec.interleave
    phase(what, 0, n)
    with torch.inference_mode():
        rounds = time_interleaved({
            "baseline": (lambda: measured_block(loaded.module, base), lambda: inputs.run(loaded.module)),
            "swapped": (lambda: measured_block(loaded.module, swapped), lambda: inputs.run(loaded.module)),
        }, spec.device, n, on_round=lambda r: phase(what, r, n))
    flat = {k: [x for r in v for x in r] for k, v in rounds.items()}
    return {"rounds": spec.interleave, "calls_per_round": INTERLEAVED_CALLS_PER_ROUND,
            "method": "eager block calls, baseline and swapped in turns (the order reversed every round), one untimed "
                      "call after each switch; ratio = median over rounds of (baseline / swapped) round medians",
            "timing_source": "cuda_events" if spec.device.type == "cuda" else "host_clock",
            "baseline_samples_ms": flat["baseline"], "swapped_samples_ms": flat["swapped"],
            "baseline_ms": _band(flat["baseline"]), "swapped_ms": _band(flat["swapped"]),
            **noise.paired(rounds["baseline"], rounds["swapped"])}


def execute(spec: RunSpec, console: Console | None = None, *, fail_after: str | None = None,
            extra_swaps: Sequence[Swap] = ()) -> tuple[dict, Path]:
    """Run and write the folder; returns (report, folder). The baseline is the block with the baseline backend's
    attention, the swapped run the swap backend's plus ``extra_swaps`` (composed after it; for compare without
    ``spec.swap``, these alone). ``fail_after`` (tests) raises at that point."""
    console = console or Console(stderr=False)
    base_b = backends.resolve(spec.baseline, spec.device, spec.fp8_options)
    swap_b = backends.resolve(spec.swap, spec.device, spec.fp8_options) if spec.swap else None
    out = atomic.check_writable(spec.out)
    try:
        from ditprof.model_blocks import get_preset, load_block, make_inputs
    except ImportError as exc:
        raise DitprofError(f"ditprof.model_blocks is not available ({exc})") from None
    if spec.source_kind == "preset":
        get_preset(spec.source)  # unknown name: one line listing the known presets

    with memory_budget(spec.gpu_memory, spec.device) as budget:
        console.print(f"[bold]ditprof {spec.command}[/]: {spec.source_kind} {spec.source}, block {spec.block}, "
                      f"{spec.device}, baseline {base_b.name}" + (f", swap {swap_b.name}" if swap_b else "")
                      + (f", linears in FP8 ({spec.linears})" if spec.linears else "")
                      + (", the swaps added one at a time" if spec.each_swap else "")
                      + f", {compile_mode.execution(spec.compile)}")
        plan = make_plan(spec)
        plan.note = spec.size_note
        for line in plan.lines():
            console.print(line)
        check_plan(plan, time_limit_min=spec.time_limit_min, yes=spec.yes)
        loaded = load_block(spec.source, spec.block, kind=spec.kind, device=spec.device, dtype=spec.dtype,
                            progress=True)
        inputs = make_inputs(loaded, tokens=spec.tokens, height=spec.height, width=spec.width,
                             frames=spec.frames, seed=spec.seed, device=spec.device, dtype=spec.dtype,
                             batch=spec.batch, text_tokens=spec.text_tokens)
        check_inputs(getattr(inputs, "kwargs", {}))
        if getattr(inputs, "size_note", None):
            console.print(f"[yellow]{inputs.size_note}[/]", highlight=False, soft_wrap=True)
        resident = int(getattr(loaded, "bytes", 0) or 0) + resident_bytes(getattr(inputs, "args", ())) + \
            resident_bytes(getattr(inputs, "kwargs", {}))
        with atomic.staged_dir(out) as stage:
            progress = make_progress(console)
            with progress:
                linears = linears_swap(spec, loaded)
                base = [attention_swap(spec, loaded, base_b, fuse=spec.command == "profile", console=console)] + \
                    (linears if spec.command == "profile" else [])
                base_run = _measure(spec, loaded, inputs, "baseline", base, stage, progress, resident, console)
                if fail_after == "baseline":
                    raise DitprofError("forced failure after the baseline run (test)")
                runs, inter = [], None
                skipped = swap_skipped(swap_b, getattr(inputs, "mask_note", None))
                swapped = ([attention_swap(spec, loaded, swap_b, fuse=True, console=console)] if swap_b else []) + \
                    (linears if spec.command == "compare" else []) + list(extra_swaps)
                if swapped and not skipped:
                    for label, swaps in configurations(swapped, spec.each_swap):
                        runs.append(_measure(spec, loaded, inputs, label, swaps, stage, progress, resident, console))
                    inter = _interleaved(spec, loaded, inputs, base, swapped, progress)
            rep = _assemble(spec, loaded, inputs, base_run, runs, budget)
            rep["interleaved"] = inter
            rep["plan"] = plan.as_dict()
            limits.add_limits(rep)  # rates and shares of peak per category: needs the plan's FLOPs and rates
            if skipped:
                rep["swap_skipped"] = skipped
                console.print(f"[yellow]swap not run[/]: {skipped}")
            write_run(stage, rep, fail_after=fail_after)
    return rep, out


def configurations(swaps: Sequence[Swap], each: bool) -> list[tuple[str, list[Swap]]]:
    """(label, swaps) of each swapped measurement in order: all of ``swaps`` together ("swapped"), or with ``each``
    (``--each-swap``) every prefix of the list, ``step1``, ``step2``, ... and the whole list last as "swapped"."""
    steps = [list(swaps[:k]) for k in range(1, len(swaps) + 1)] if each else [list(swaps)]
    return [(f"step{k}" if k < len(steps) else "swapped", s) for k, s in enumerate(steps, 1)]


def _extrapolation(spec: RunSpec, model: dict, base: BackendRun, sw: BackendRun | None) -> dict:
    """The whole model's time with ``sw`` against ``base`` (without ``sw``: the baseline's alone)."""
    return extrapolate(
        n_blocks=int(model["n_blocks"] or 1),
        baseline_block_ms=base.block_ms,
        swapped_block_ms=sw.block_ms if sw else None,
        baseline_attention_share=base.split.attention_share,
        baseline_attention_ms=base.split.split_ms["attention"],
        swapped_attention_ms=sw.split.split_ms["attention"] if sw else None,
        steps=spec.steps, cfg=spec.cfg, numerics_only=bool(sw) and bool(sw.extra.get("numerics_only")),
    )


def _assemble(spec: RunSpec, loaded: Any, inputs: Any, base: BackendRun, runs: Sequence[BackendRun],
              budget: int | None) -> dict:
    """The report of the baseline and the swapped measurements ``runs`` (in order; the last is "swapped")."""
    model = model_section(spec, loaded, inputs)
    sw = runs[-1] if runs else None
    acc = document.accuracy(base.output, sw.output) if sw is not None else None
    ex = _extrapolation(spec, model, base, sw)
    middle = [(r, document.accuracy(base.output, r.output), _extrapolation(spec, model, base, r))
              for r in runs[:-1]]
    files = ["report.json", "report.md", "split.png", base.trace_file] + [r.trace_file for r in runs]
    files += [base.tb_file] + [r.tb_file for r in runs]
    settings = {
        "device": str(spec.device), "warmup": spec.warmup, "iters": spec.iters, "seed": spec.seed,
        "gpu_memory": spec.gpu_memory, "gpu_memory_budget_bytes": budget, "argv": sys.argv[1:],
        "execution": compile_mode.execution(spec.compile), **document.size_settings(inputs),
        "fp8_options": backends.options_used(spec.fp8_options, (spec.baseline, spec.swap)),
    }
    return document.build(
        command=spec.command, model=model, environment=environment(spec.device, model.get("head_dim")),
        settings=settings,
        baseline=base, swapped=sw, extrapolation=ex, accuracy_section=acc, files=files,
        created=_dt.datetime.now().astimezone().isoformat(timespec="seconds"), middle=middle,
    )


def run_command(args: Any, command: str, on_done: Callable[[dict, Path], None] | None = None) -> int:
    spec = spec_from_args(args, command)
    console = Console(stderr=spec.json_out)  # --json: stdout carries the report only
    if not console.is_terminal and console.width < 120:
        console = Console(width=120, stderr=spec.json_out)
    with stdout_to_stderr(spec.json_out):  # --json: nothing but the report on stdout (libraries' writes too)
        if spec.sp is not None:
            from ditprof.harness.sp.launch import execute_sp

            rep, out = execute_sp(spec, console)
        else:
            rep, out = execute(spec, console)
        report.print_summary(rep, str(out), console)
    if spec.json_out:
        sys.stdout.write(document.to_json(rep))
        sys.stdout.flush()
    if on_done:
        on_done(rep, out)
    return 0
