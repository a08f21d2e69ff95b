"""``ditprof validate``: is "N x one block" the time of N real blocks?

Runs N *distinct* blocks chained (each block's output is the next block's hidden states, with its own
weights) and times the chain the same way the harness times one block (CUDA events on a GPU, the host clock
on CPU), then compares it with the one-block extrapolation N x (median one-block time).

Weights:

* presets: distinct synthetic weights per block, generated from (seed, tensor name) -- the tensor name
  holds the block index, so block i is the same on every run -- directly on the target device (h3 x 50
  blocks is 77 GB: nothing is written to disk). On CPU the values are bit-identical to the block of a
  synthetic checkpoint (``model_blocks.synthetic.init_tensor``); on CUDA they come from a CUDA generator
  with the same scales.
* checkpoints: the real shards, loaded block by block (only the shards holding block i are opened).

Memory: when N blocks + activations fit the device (or the ``--gpu-memory`` budget), all blocks stay
resident. Otherwise the blocks are kept in host memory and streamed, one at a time, into a working block on
the device; only the compute is timed (per-block events around the forward, copies left out) and the
report says so. A budget that cannot hold one block plus its activations is an error naming the amount.

Swaps: every block runs its attention on ``--attention`` (with ``--prologue``: the family's fused prologue) and,
with ``--linears``, its linears in FP8; where that is not the model's own configuration the report holds its
accuracy against it (``validate.accuracy``), and with the fused prologue also against the unfused FP8 blocks.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ditprof.errors import DitprofError
from ditprof.progress import make_progress
from ditprof.harness.run import compile_mode
from ditprof.harness.run.activation import estimate_forward_bytes
from ditprof.harness.run.environment import environment
from ditprof.harness.run.measure import swapped
from ditprof.harness.run.memory import fmt_bytes, memory_budget, parse_size
from ditprof.harness.run.session import Clock, time_block
from ditprof.harness.swaps import backends
from ditprof.harness.swaps.attention import AttentionSwap
from ditprof.harness.swaps.linears import linears_swaps
from ditprof.harness.swaps.base import Swap, label
from ditprof.harness.validate.accuracy import chain_accuracy
from ditprof.harness.validate.chain import Chain, Streamer, run_chain
from ditprof.harness.validate.memory_plan import MemoryPlan, plan_memory
from ditprof.harness.validate.report import SCHEMA
from ditprof.harness.validate.source import Source, check_blocks, open_source
from ditprof.kernels.fp8_config import Fp8Options
from ditprof.model_blocks.presets import block_size

GOAL_PCT = 3.0  # |error| goal of the extrapolation (issue 6)
CPU_DEFAULT_BLOCKS = 4


@dataclass
class ValidateSpec:
    source: str
    source_kind: str  # "preset" / "checkpoint"
    kind: str | None
    blocks: int | None
    attention: str
    device: torch.device
    dtype: torch.dtype = torch.bfloat16
    tokens: int | None = None
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    gpu_memory: str | None = None
    steps: int | None = None
    cfg: bool = False
    out: Path | None = None
    warmup: int | None = None
    iters: int | None = None  # one-block timed calls
    chain_iters: int | None = None  # timed chain passes
    seed: int = 0
    whole_step: bool = True
    stream: bool | None = None  # None: decide from memory; True/False: force (tests, debugging)
    compile: str | None = None  # --compile MODE: every block torch.compiled (harness.compile_mode); None: eager
    # what an FP8 backend runs with (--no-fp8-graphs, --no-tvm-ffi; backends.resolve); None: the process's
    fp8_options: Fp8Options | None = None
    linears: str | None = None  # --linears GRANULARITY: every block's linears in FP8 too (harness.swaps.linears)
    linears_compile: bool = True  # eager runs: each FP8 linear compiled alone (--linears-eager: not)
    # --prologue: every block's attention with the family's norm_q/norm_k and RoPE fused into the FP8 prep
    # (harness.swaps.prologue); the accuracy then also holds the fused chain against the unfused FP8 one
    prologue: bool = False


def _stats(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- building and timing the chain

@dataclass
class _Blocks:
    """The N blocks as built: resident modules, or host copies streamed into one working block."""

    first: Any  # block 0 as loaded (its inputs are made from it)
    modules: list[torch.nn.Module]  # resident: every block; streamed: empty
    streamer: Streamer | None
    build_s: float

    @property
    def working(self) -> list[torch.nn.Module]:
        return self.modules if self.streamer is None else [self.streamer.working]

    def load0(self) -> None:
        if self.streamer is not None:
            self.streamer.load(0)


def _build_blocks(spec: ValidateSpec, src: Source, n: int, plan: MemoryPlan, console) -> _Blocks:
    """Generate or load the N blocks: on the device (resident) or into host memory (streamed)."""
    dev = spec.device
    modules: list[torch.nn.Module] = []
    streamer = None
    t_build = time.perf_counter()
    # normal tensors, as the runner's blocks are, though the run is in inference mode: the fused prologue's
    # weight cache (families.base.PrologueWeights) reads their version counters, and the streamer copies into them
    with make_progress(console) as progress, torch.inference_mode(False):
        verb = "generating" if src.preset is not None else "loading"
        task = progress.add_task(f"{verb} {n} blocks" + (" into host memory" if plan.mode == "streamed" else ""),
                                 total=n)
        first = src.block(0, dev, spec.dtype, spec.seed)
        if plan.mode == "resident":
            modules.append(first.module)
        else:
            streamer = Streamer(first.module)
            streamer.add({k: streamer.to_host(v) for k, v in first.module.state_dict().items()})
        progress.advance(task)
        for i in range(1, n):
            if plan.mode == "resident":
                modules.append(src.block(i, dev, spec.dtype, spec.seed).module)
            else:
                streamer.add(src.host_state(i, dev, spec.dtype, spec.seed, streamer.to_host))
            progress.advance(task)
    return _Blocks(first, modules, streamer, time.perf_counter() - t_build)


def _time_interleaved(blocks: _Blocks, chain_modules: list, block0, inputs, chain: Chain, clock: Clock,
                      dev: torch.device, n: int, warmup: int, iters: int, chain_iters: int, progress) -> dict:
    """Warm-up (one block, then every block once), then rounds of one-block calls and chain passes taken in turns
    (clock drift hits both numbers alike)."""
    task = progress.add_task(f"warm-up: 1 block x {max(warmup, 1)}, {n} blocks x 1", total=2)
    blocks.load0()
    for _ in range(max(warmup, 1)):
        inputs.run(block0)
    _sync(dev)
    progress.advance(task)
    run_chain(chain, chain_modules, clock, streamer=blocks.streamer, n=n)  # every block once
    progress.advance(task)

    one_samples: list[float] = []
    chain_samples: list[float] = []
    per_block: list[list[float]] = []
    out = None
    per_round = max(1, math.ceil(iters / chain_iters))
    task = progress.add_task(f"timing: 1 block x {iters}, {n} blocks x {chain_iters} (interleaved)",
                             total=chain_iters)
    for r in range(chain_iters):
        blocks.load0()
        k = iters - len(one_samples) if r == chain_iters - 1 else min(per_round, iters - len(one_samples))
        if k > 0:
            one_samples += time_block(lambda: inputs.run(block0), dev, k)[0]
        ms, per, out = run_chain(chain, chain_modules, clock, streamer=blocks.streamer, n=n)
        chain_samples.append(ms)
        per_block.append(per)
        progress.advance(task)
    return {"one": one_samples, "chain": chain_samples, "per_block": per_block,
            "finite": bool(torch.isfinite(out).all().item())}


def _measure(spec: ValidateSpec, src: Source, swaps: Sequence[Swap], reference: Sequence[Swap] | None, n: int,
             plan: MemoryPlan, warmup: int, iters: int, chain_iters: int, input_args: dict, console, *,
             unfused: Sequence[Swap] | None = None) -> dict:
    """Build the N blocks (resident or host copies); ``reference`` given: the chain's accuracy against it
    (``accuracy.chain_accuracy``, untimed, eager; ``unfused``: also against the run without its fused prologue);
    then time one block and the chain, interleaved, with ``swaps`` in every block (``run.measure.swapped``, as
    every harness measurement)."""
    from ditprof.model_blocks import make_inputs

    dev = spec.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    clock = Clock(dev)
    blocks = _build_blocks(spec, src, n, plan, console)
    working = blocks.working
    inputs = make_inputs(blocks.first, device=dev, dtype=spec.dtype, **input_args)
    chain = Chain(inputs, src.family.plan(src.kind))
    chain_modules, block0, compiled_stats, acc = blocks.modules, working[0], None, None
    with contextlib.ExitStack() as stack, make_progress(console) as progress:
        if reference is not None:
            task = progress.add_task(f"accuracy: {label(swaps)} vs {label(reference)}, {n} blocks", total=1)
            acc = chain_accuracy(chain, blocks.modules, reference, swaps, streamer=blocks.streamer, n=n,
                                 unfused=unfused)
            progress.advance(task)
        installed = stack.enter_context(swapped(working, swaps))
        records: dict = {}
        for inst in installed[:len(swaps)]:  # block 0's installations (every block's are alike)
            records.update(inst.record())
        if spec.compile:  # after the swap: each block compiles with the attention it is measured with
            chain_modules, working, compiled_stats = _compile_blocks(spec, blocks.modules, working, inputs, chain,
                                                                     clock, blocks.streamer, n, progress, console)
            block0 = working[0]
            stack.enter_context(compile_mode.stable(spec.compile, "the timed calls", what=f"{n} chained blocks"))
        res = _time_interleaved(blocks, chain_modules, block0, inputs, chain, clock, dev, n, warmup, iters,
                                chain_iters, progress)
    peak = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
    return {**res, "inputs": inputs, "peak": peak, "build_s": blocks.build_s, "compile": compiled_stats,
            "accuracy": acc, "linears": records.get("linears"), "prologue": records.get("prologue"),
            "pinned": None if blocks.streamer is None or dev.type != "cuda" else bool(blocks.streamer.pinned)}


def _compile_blocks(spec: ValidateSpec, modules: list, working: list, inputs, chain: Chain, clock: Clock,
                    streamer: Streamer | None, n: int, progress, console) -> tuple[list, list, dict]:
    """torch.compile every block (streamed: the one working block); the first one-block call is the compile
    time, then chain passes until one compiles nothing (blocks of one class share a graph unless their guards
    fail). Returns (chain modules, working modules, the report's compile section)."""
    compiled = compile_mode.compile_blocks(working, spec.compile, spec.device)
    chain_modules = compiled if streamer is None else modules
    task = progress.add_task("compile (first call), then chain passes until nothing compiles", total=2)
    if streamer is not None:
        streamer.load(0)
    stats = compile_mode.warm_up(lambda: inputs.run(compiled[0]), spec.device, spec.compile,
                                 what=f"the block with {spec.attention} attention")
    progress.advance(task)
    passes = compile_mode.warm_up(lambda: run_chain(chain, chain_modules, clock, streamer=streamer, n=n),
                                  spec.device, spec.compile, what=f"{n} chained blocks", expect_graphs=False)
    progress.advance(task)
    section = stats.as_dict()
    # graphs the chain added: blocks whose guards did not match block 0's graph
    section.update(graphs=stats.graphs + passes.graphs, recompiles=stats.recompiles + passes.graphs,
                   chain_warmup_passes=passes.warmup_calls, chain_first_pass_s=passes.first_call_s)
    console.print(compile_mode.line(section, f"one block ({spec.attention})"), highlight=False)
    return chain_modules, compiled, section


# --------------------------------------------------------------------------- the command

def _counts(spec: ValidateSpec, src: Source) -> tuple[int, int, int, int]:
    """(blocks, warm-up calls, one-block timed calls, chain passes): the spec's or the device's defaults."""
    n = spec.blocks if spec.blocks is not None else (
        src.model_blocks if spec.device.type == "cuda" else min(src.model_blocks, CPU_DEFAULT_BLOCKS))
    check_blocks(src, n)
    if spec.gpu_memory is not None:
        parse_size(spec.gpu_memory)
    warmup = spec.warmup if spec.warmup is not None else (2 if spec.device.type == "cuda" else 1)
    iters = spec.iters if spec.iters is not None else (10 if spec.device.type == "cuda" else 5)
    chain_iters = spec.chain_iters if spec.chain_iters is not None else 3
    if iters < 1 or chain_iters < 1 or warmup < 0:
        raise DitprofError("--iters and --chain-iters must be >= 1, --warmup >= 0")
    return n, warmup, iters, chain_iters


def _errors(res: dict, n: int) -> dict:
    """The extrapolation N x (one block) against the measured chain: the report's timing and error fields."""
    one, ch, per_block = _stats(res["one"]), _stats(res["chain"]), res["per_block"]
    extrap = n * one["median"]
    error_pct = (extrap / ch["median"] - 1.0) * 100.0 if ch["median"] > 0 else float("nan")
    # Noise-robust variant (busy hosts): best one-block call vs the sum of each block's best call in the chain.
    best_chain = sum(min(p[i] for p in per_block) for i in range(n))
    error_best_pct = (n * one["min"] / best_chain - 1.0) * 100.0 if best_chain > 0 else float("nan")
    chain_samples = res["chain"]
    mid = per_block[sorted(range(len(chain_samples)), key=lambda i: chain_samples[i])[len(chain_samples) // 2]]
    return {
        "one_block_ms": one,
        "chain_ms": ch,
        "chain_per_block_ms": {"median": statistics.median(mid), "min": min(mid), "max": max(mid),
                               "samples": mid},
        "extrapolated_ms": extrap,
        "error_pct": error_pct,
        "abs_error_ms": extrap - ch["median"],
        "error_best_pct": error_best_pct,
        "error_best_note": "N x fastest one-block call vs the sum over blocks of each block's fastest call in the "
                           "chain passes; robust to other processes on a busy host",
        "goal_pct": GOAL_PCT,
        "within_goal": abs(error_pct) <= GOAL_PCT,
    }


def _model_section(spec: ValidateSpec, src: Source, inputs, params: int, bbytes: int) -> dict:
    heads, head_dim = src.family.heads(src.config)[:2]
    return {
        "preset": src.name if src.preset is not None else None,
        "checkpoint": src.name if src.preset is None else None,
        "family": src.family.name, "kind": src.kind, "block_class": src.family.block_class(src.kind).__name__,
        "model_n_blocks": src.model_blocks, "heads": heads, "head_dim": head_dim, "tokens": inputs.tokens,
        "text_tokens": inputs.text_tokens, "grid": str(inputs.grid), "batch": 1,
        "dtype": str(spec.dtype).replace("torch.", ""), "block_params": params, "block_bytes": bbytes,
    }


def _whole_step(spec: ValidateSpec, src: Source, rep: dict, n: int, warmup: int, iters: int, console) -> dict:
    """The model's non-block modules measured once, and the step estimate from one block and from the chain."""
    from ditprof.harness.validate.whole_step import measure_rest, step_estimate

    rest = measure_rest(src, device=spec.device, dtype=spec.dtype, seed=spec.seed, warmup=warmup,
                        iters=iters, console=console, tokens=spec.tokens, height=spec.height,
                        width=spec.width, frames=spec.frames)
    model_chain_ms = rep["chain_ms"]["median"] * src.model_blocks / n
    return {
        "rest": rest,
        "extrapolated": step_estimate(rep["one_block_ms"]["median"], src.model_blocks, rest["rest_ms"]["median"],
                                      steps=spec.steps, cfg=spec.cfg),
        "from_chain": step_estimate(model_chain_ms / src.model_blocks, src.model_blocks,
                                    rest["rest_ms"]["median"], steps=spec.steps, cfg=spec.cfg),
        "note": (f"block part = {src.model_blocks} blocks x one-block median ('extrapolated') or the measured "
                 f"{n}-block chain scaled to {src.model_blocks} blocks ('from_chain'); rest = the model's "
                 f"non-block modules measured once, as the model has them (no swap; the blocks run "
                 f"{rep['configuration']})"),
        # the error the blocks hand to the rest of the model (the chain's accuracy); None: no swap to measure
        "accuracy": {"blocks": n, **rep["accuracy"]["chain"]} if rep["accuracy"] else None,
    }


def _swaps(spec: ValidateSpec, src: Source, b, swaps: Sequence[Swap] | None,
           console=None) -> tuple[list, list | None, list | None]:
    """(what every block runs with: ``swaps``, default its attention on ``b`` -- with --prologue the family's fused
    prologue, or the unfused path after one line where the family has none (``runner.attention_swap``) -- then,
    with --linears, its linears in FP8; the accuracy's reference -- the model's own attention, bf16 linears -- or
    None where the run is it; the same swaps with the unfused FP8 attention where the prologue is fused, else
    None)."""
    from types import SimpleNamespace

    from ditprof.harness.run.runner import attention_swap
    from ditprof.harness.swaps.prologue import PrologueSwap

    head_dim = src.family.heads(src.config)[1]
    uses = src.family.uses_dispatcher
    if swaps is None:
        att = attention_swap(spec, SimpleNamespace(family=src.family, head_dim=head_dim), b, fuse=True,
                             console=console)
        swaps = [att] + linears_swaps(spec.linears, spec.device, src.family,
                                      compile_each=spec.linears_compile and not spec.compile)
    swaps = list(swaps)
    unfused = None
    if swaps and isinstance(swaps[0], PrologueSwap):
        unfused = [AttentionSwap(swaps[0].backend, uses_dispatcher=uses, head_dim=head_dim)] + swaps[1:]
    base = backends.resolve(backends.DEFAULT_BASELINE, spec.device, spec.fp8_options)
    reference = [AttentionSwap(base, uses_dispatcher=uses, head_dim=head_dim)]
    return swaps, (None if label(swaps) == label(reference) else reference), unfused


def _prologue_section(spec: ValidateSpec, src: Source, record: dict | None) -> dict | None:
    """The report's ``prologue``: block 0's fused / unfused modules, or why the family has none; None without
    --prologue."""
    if not spec.prologue:
        return None
    if record is not None:
        return {"fused": bool(record["fused_modules"]), **record}
    return {"fused": False, "missing": src.family.prologue_missing or "no module of this block was fused"}


def validate(spec: ValidateSpec, console=None, *, swaps: Sequence[Swap] | None = None) -> dict:
    """Run the validation; returns the report dict (nothing written). ``swaps``: what every block runs with
    (default: its attention on ``spec.attention``, and its linears in FP8 with ``spec.linears``)."""
    from rich.console import Console

    console = console or Console(stderr=True)
    b = backends.resolve(spec.attention, spec.device, spec.fp8_options)
    src = open_source(spec.source, spec.source_kind, spec.kind)
    n, warmup, iters, chain_iters = _counts(spec, src)
    input_args = dict(tokens=spec.tokens, height=spec.height, width=spec.width, frames=spec.frames, seed=spec.seed)
    swaps, reference, unfused = _swaps(spec, src, b, swaps, console)

    params, bbytes = block_size(src.family, src.config, src.kind, spec.dtype)
    est = estimate_forward_bytes(src.family, src.config, src.kind, preset=src.preset, dtype=spec.dtype, **input_args)
    plan = plan_memory(spec, n, bbytes, est)
    weights = ("synthetic, distinct per block (seeded by block index), generated on " + spec.device.type
               if src.preset is not None else "checkpoint shards, loaded block by block")
    console.print(f"[bold]ditprof validate[/]: {src.kind_of_source} {src.name}, {n} of {src.model_blocks} "
                  f"{src.kind} blocks, {est['tokens']} tokens, {label(swaps)}, {spec.device}; "
                  f"{fmt_bytes(bbytes)} per block; {plan.note}")

    budget_cm = memory_budget(spec.gpu_memory if spec.device.type == "cuda" else None, spec.device)
    with budget_cm, torch.inference_mode():
        res = _measure(spec, src, swaps, reference, n, plan, warmup, iters, chain_iters, input_args, console,
                       unfused=unfused)
    model = _model_section(spec, src, res.pop("inputs"), params, bbytes)
    if spec.device.type == "cuda":
        torch.cuda.empty_cache()
    rep: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model": model,
        "weights": weights,
        "attention_backend": b.name,
        "configuration": label(swaps),
        "swaps": [s.describe() for s in swaps],
        # an emulation among the swaps: its numbers are the point, its times are not a speed
        "numerics_only": any(s.numerics_only for s in swaps),
        "linears": res["linears"],  # --linears: block 0's swapped / kept linears and how they ran; None without
        "accuracy": res["accuracy"],  # against the model's own attention with bf16 linears; None: the run is that
        "prologue": _prologue_section(spec, src, res["prologue"]),  # --prologue: fused modules or why none
        "blocks": n,
        "mode": plan.mode,
        "memory": {**plan.as_dict(), "peak_allocated_bytes": res["peak"],
                   "activation_estimate_method": est["method"],
                   "streamed_host_pinned": res["pinned"]},
        "timing_source": "cuda_events" if spec.device.type == "cuda" else "host_clock",
        "timed": "compute only (weight copies left out)" if plan.mode == "streamed" else "whole chain",
        **_errors(res, n),
        "output_finite": res["finite"],
        "settings": {"device": str(spec.device), "warmup": warmup, "iters": iters, "chain_iters": chain_iters,
                     "seed": spec.seed, "gpu_memory": spec.gpu_memory, "steps": spec.steps, "cfg": spec.cfg,
                     "build_s": res["build_s"], "argv": sys.argv[1:],
                     "execution": compile_mode.execution(spec.compile),
                     "fp8_options": backends.options_used(spec.fp8_options, (spec.attention,))},
        "compile": res["compile"],  # --compile: the first block's compile and the chain's warm-up; None: eager
        "environment": environment(spec.device, src.family.heads(src.config)[1]),
        "whole_step": None,
    }
    if spec.whole_step:
        rep["whole_step"] = _whole_step(spec, src, rep, n, warmup, iters, console)
    return rep


__all__ = ["CPU_DEFAULT_BLOCKS", "GOAL_PCT", "ValidateSpec", "validate"]
