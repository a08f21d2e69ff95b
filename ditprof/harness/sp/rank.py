"""What one ``--sp`` rank runs: its shard of the block measured with each backend, the gathered output checked
against the single-device one, the per-rank sections combined into one report."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from ditprof.harness.report import document
from ditprof.harness.report import summary as report
from ditprof.harness.run import atomic, noise
from ditprof.harness.run.measure import measure_swapped
from ditprof.harness.sp import distributed
from ditprof.harness.swaps import backends
from ditprof.harness.swaps.attention import AttentionSwap
from ditprof.harness.trace.categories import ALL_CATEGORIES, COMMUNICATION
from ditprof.harness.run.environment import environment
from ditprof.harness.run.extrapolate import extrapolate
from ditprof.harness.run.memory import memory_budget
from ditprof.harness.sp.attention import (check_degree, check_family, gather_output, is_cross_attention,
                                          shard_inputs, SpAttentionSwap)

# Gathered SP output vs the single-device output (rel-RMS). The SP run does the same ops on row subsets;
# only the accumulation order inside GEMM / attention kernels may change with the row count, i.e. a few
# ulp of fp32 per element. fp32: ~1e-7 measured, bound 1e-5. bf16: a changed fp32 partial can flip a bf16
# rounding (one ulp = 2^-8 relative) and that flip propagates through the later ops; the bound is one bf16
# ulp in RMS, 2^-8 ~ 3.9e-3 (measured on CPU: see tests/test_sequence_parallel.py).
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -8}


def _ensure_rank_tag(path: Path, rank: int, world: int, backend: str) -> None:
    """torch.profiler writes ``distributedInfo`` itself when a process group exists; add it if not."""
    data = path.read_bytes()
    if b'"distributedInfo"' in data[:1 << 16]:
        return
    i = data.index(b"{") + 1
    tag = b'\n  "distributedInfo": {"rank": %d, "world_size": %d, "backend": "%s"},' % (
        rank, world, backend.encode())
    atomic.write_bytes(path, data[:i] + tag + data[i:])


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def combine_ranks(sections: list[dict]) -> dict:
    """One report section from the per-rank sections: the slowest rank's (by median block time), with
    ``rank``, ``ranks`` (per-rank timings and splits) and ``block_ms_max_over_ranks`` (per call, the
    slowest rank's time: what a step waits for)."""
    for sec in sections:  # every rank's split has the key, even one whose collectives took no time
        if COMMUNICATION not in sec["split_ms"]:
            sec["split_ms"] = {c: sec["split_ms"].get(c, 0.0) for c in ALL_CATEGORIES}
    slow = max(range(len(sections)), key=lambda r: sections[r]["block_ms"]["median"])
    out = dict(sections[slow])
    out["rank"] = slow
    per_call = [max(xs) for xs in zip(*(sec["samples_ms"] for sec in sections))]
    out["block_ms_max_over_ranks"] = _stats(per_call)
    out["samples_ms_max_over_ranks"] = per_call
    keys = ("block_ms", "samples_ms", "profiled_block_ms", "profiler_overhead_pct", "split_ms", "split_total_ms",
            "attention_share", "split_iterations_used", "peak_memory_bytes", "trace", "tb_trace", "device")
    out["ranks"] = [{"rank": r, **{k: sec.get(k) for k in keys}} for r, sec in enumerate(sections)]
    out["traces"] = [sec["trace"] for sec in sections]
    out["tb_traces"] = [sec["tb_trace"] for sec in sections]
    return out


def _measure_rank(spec, loaded, local, label: str, b, stage: Path, *, rank: int, world: int, backend: str,
                  device: torch.device, progress, resident: int):
    from ditprof.harness.run.parts import Phases

    work = stage / f".rank{rank}-{label}"
    name = f"rank{rank}.{label}"
    text = loaded.family.plan(loaded.kind).joint_text
    joint = (local.text_tokens, text == "first") if text else None
    swap = SpAttentionSwap(b, world=world, rank=rank, cross=spec.sp_cross,
                           uses_dispatcher=getattr(getattr(loaded, "family", None), "uses_dispatcher", None),
                           joint=joint, head_dim=getattr(loaded, "head_dim", None))

    def in_step(block):  # every rank starts its measurement together
        dist.barrier()
        return block, contextlib.nullcontext()

    run = measure_swapped(loaded.module, [swap], local.run, label=name, prepare=in_step, device=device,
                          workdir=work, warmup=spec.warmup, iters=spec.iters, resident_bytes=resident,
                          on_phase=Phases(progress, f"{label} ({b.name}), rank 0 of {world}"),
                          cuda_graph=False)  # NCCL all-to-alls inside a captured graph: not attempted
    # the trace next to the others, the tb trace into this run's HTA job folder
    os.replace(work / run.trace_file, stage / run.trace_file)
    tb_src = work / run.tb_file
    tb_dir = stage / "tb" / label
    tb_dir.mkdir(parents=True, exist_ok=True)
    os.replace(tb_src, tb_dir / tb_src.name)
    _ensure_rank_tag(tb_dir / tb_src.name, rank, world, backend)
    shutil.rmtree(work, ignore_errors=True)
    run.tb_file = f"tb/{label}/{tb_src.name}"
    run.label = label
    run.extra["device"] = str(device)
    return run


def query_chunked(inner: Callable, world: int) -> Callable:
    """``inner`` called on ``world`` contiguous query chunks against the full K/V: on one device, the
    numerics of local cross-attention under SP (a backend with per-head scales, like FP8, takes the query
    amax over the rank's S/P queries only)."""

    def chunked(q, k, v, *, scale=None):
        return torch.cat([inner(qc, k, v, scale=scale) for qc in q.chunk(world, dim=1)], dim=1)

    return chunked


class _ChunkedCrossSwap(AttentionSwap):
    """On one device: ``backend`` everywhere, its cross-attention queries in the ``world`` chunks the ranks hold."""

    def __init__(self, backend, world: int, **kw):
        super().__init__(backend, **kw)
        self.cross_route = (f"chunked-{backend.name}", query_chunked(backend.fn, world))

    def per_module(self):
        own = (self.backend.name, self.backend.fn)
        return lambda mod_name, mod: self.cross_route if is_cross_attention(mod_name, mod) else own


def _single_device_output(loaded, inputs, b, world: int = 1, cross: str = "heads") -> torch.Tensor:
    """The block on one device with all tokens; ``cross="local"`` with ``world > 1`` chunks the
    cross-attention queries as the ranks hold them (the same numerics as the SP run)."""
    uses = getattr(getattr(loaded, "family", None), "uses_dispatcher", None)
    swap = (_ChunkedCrossSwap(b, world, uses_dispatcher=uses) if cross == "local" and world > 1 else
            AttentionSwap(b, uses_dispatcher=uses))
    with swap.applied(loaded.module), torch.inference_mode():
        return inputs.run(loaded.module).detach().to("cpu")


def _check(loaded, full, b, got: torch.Tensor, dtype: torch.dtype, world: int, cross: str) -> dict:
    """Gathered SP output vs the single-device output (same backend, same inputs)."""
    ref = _single_device_output(loaded, full, b)
    acc = document.accuracy(ref, got)
    acc["reference"] = "the same block and backend on one device, all tokens"
    if cross == "local" and world > 1:
        plain = acc
        ref = _single_device_output(loaded, full, b, world, cross)
        acc = document.accuracy(ref, got)
        acc["reference"] = ("the same block and backend on one device, all tokens, cross-attention queries in "
                            f"the {world} chunks the ranks hold (identical to the plain run for backends whose "
                            "rows are independent, e.g. sdpa; per-head-scaled FP8 takes its query amax per chunk)")
        acc["vs_unchunked_rel_rms"] = plain["block_output_rel_rms"]
        acc["vs_unchunked_cosine"] = plain["block_output_cosine"]
    tol = TOLERANCE.get(dtype, 2.0 ** -8)
    acc["tolerance"] = tol
    acc["passed"] = bool(acc["finite"] and acc["block_output_rel_rms"] <= tol)
    return acc


def rank_body(rank: int, world: int, local_rank: int, spec, stage: Path, *, launcher: str,
              init_method: str, threads: int | None = None, group_ready: bool = False) -> dict | None:
    """Everything one rank does; rank 0 returns the report (and writes the run files into ``stage``)."""
    from rich.console import Console

    from ditprof.progress import make_progress
    from ditprof.harness.run.parts import resident_bytes, write_run
    from ditprof.model_blocks import load_block, make_inputs

    device = distributed.rank_device(spec.device.type, local_rank)
    if device.type == "cpu" and threads:
        torch.set_num_threads(threads)
    backend = distributed.pg_backend(device.type) if group_ready else distributed.init(rank, world, device,
                                                                                        init_method)
    base_b = backends.resolve(spec.baseline, device, spec.fp8_options)
    swap_b = backends.resolve(spec.swap, device, spec.fp8_options) if spec.swap else None
    console = Console(stderr=spec.json_out) if rank == 0 else None  # --json: stdout carries the report only
    with memory_budget(spec.gpu_memory, device) as budget:
        loaded = load_block(spec.source, spec.block, kind=spec.kind, device=device, dtype=spec.dtype,
                            progress=rank == 0)
        check_family(loaded.family, loaded.kind)
        full = make_inputs(loaded, tokens=spec.tokens, height=spec.height, width=spec.width, frames=spec.frames,
                           seed=spec.seed, device=device, dtype=spec.dtype, batch=spec.batch,
                           text_tokens=spec.text_tokens)
        check_degree(world, heads=loaded.heads, tokens=full.tokens)
        local = shard_inputs(loaded, full, rank, world)
        if rank != 0:
            full = None  # only rank 0 runs the single-device reference
        resident = int(getattr(loaded, "bytes", 0) or 0) + resident_bytes(local.args) + resident_bytes(local.kwargs)
        progress = make_progress(console) if console else None
        runs = {}
        with progress if progress is not None else contextlib.nullcontext():
            for label, b in (("baseline", base_b), ("swapped", swap_b)):
                if b is not None:
                    runs[label] = _measure_rank(spec, loaded, local, label, b, stage, rank=rank, world=world,
                                                backend=backend, device=device, progress=progress,
                                                resident=resident)
        how = loaded.family.plan(loaded.kind).sp.get("hidden_states")
        gathered = {label: gather_output(r.output, how, local.text_tokens, world, device)
                    for label, r in runs.items()}
        sections = {}
        for label, r in runs.items():
            parts: list[Any] = [None] * world
            dist.all_gather_object(parts, document.run_section(r))
            sections[label] = parts
        checks = {}
        if rank == 0:
            for label, b in (("baseline", base_b), ("swapped", swap_b)):
                if b is not None:
                    checks[label] = _check(loaded, full, b, gathered[label], spec.dtype, world, spec.sp_cross)
        dist.barrier()
        if rank != 0:
            return None
        rep = _assemble(spec, loaded, full, sections, gathered, checks, budget, world=world, backend=backend,
                        launcher=launcher, device=device)
        write_run(stage, rep)
        return rep


def _assemble(spec, loaded, full, sections, gathered, checks, budget, *, world, backend, launcher, device) -> dict:
    from ditprof.harness.run.parts import model_section

    model = model_section(spec, loaded, full)
    base = combine_ranks(sections["baseline"])
    sw = combine_ranks(sections["swapped"]) if "swapped" in sections else None
    acc = document.accuracy(gathered["baseline"], gathered["swapped"]) if sw else None
    if acc:
        acc["reference"] = "baseline block output on the same inputs (both gathered over the SP ranks)"
    ex = extrapolate(
        n_blocks=int(model["n_blocks"] or 1),
        baseline_block_ms=base["block_ms"],
        swapped_block_ms=sw["block_ms"] if sw else None,
        baseline_attention_share=base["attention_share"],
        baseline_attention_ms=base["split_ms"]["attention"],
        swapped_attention_ms=sw["split_ms"]["attention"] if sw else None,
        steps=spec.steps, cfg=spec.cfg,
        numerics_only=bool(sw) and noise.section_numerics_only(sw),
    )
    ex["uses"] = "slowest rank (largest median block time)"
    files = ["report.json", "report.md", "split.png"]
    for sec in (base, sw):
        if sec:
            files += sec["traces"] + sec["tb_traces"]
    settings = {
        "device": spec.device.type, "rank_devices": [r["device"] for r in base["ranks"]], "warmup": spec.warmup,
        "iters": spec.iters, "seed": spec.seed, "gpu_memory": spec.gpu_memory, "gpu_memory_budget_bytes": budget,
        "argv": sys.argv[1:], "fp8_options": backends.options_used(spec.fp8_options, (spec.baseline, spec.swap)),
    }
    heads = int(model["heads"])
    sp = {
        "degree": world,
        "strategy": "ulysses",
        "process_group_backend": backend,
        "launcher": launcher,
        "tokens_per_rank": int(model["tokens"]) // world,
        "heads_per_rank": heads // world,
        "cross_attention": spec.sp_cross,
        "cross_attention_note": ("local: queries of this rank's tokens x all heads against the replicated text "
                                 "K/V, no communication" if spec.sp_cross == "local" else
                                 "heads: all-to-all of the queries, K/V sliced to this rank's heads locally, "
                                 "all-to-all of the output"),
        "environment": {k: os.environ.get(k) for k in distributed.MULTICAST_OFF_ENV},
        "check": checks,
        "check_passed": all(c["passed"] for c in checks.values()),
        "slowest_rank": {"baseline": base["rank"], **({"swapped": sw["rank"]} if sw else {})},
    }
    return document.build(
        command=spec.command, model=model, environment=environment(device, model.get("head_dim")), settings=settings,
        baseline=base, swapped=sw, extrapolation=ex, accuracy_section=acc, files=files,
        created=_dt.datetime.now().astimezone().isoformat(timespec="seconds"), sp=sp,
    )

