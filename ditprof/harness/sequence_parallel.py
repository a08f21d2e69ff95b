"""``ditprof profile/compare --sp P``: one block under Ulysses sequence parallelism over P ranks.

What runs on each rank (started by the CLI with ``torch.multiprocessing``, or by torchrun; NCCL on CUDA, gloo on
CPU -- see ``harness.distributed``):

* the whole block (diffusers' own modules, every weight), on S/P of the video tokens: rank r holds tokens
  ``[r*S/P, (r+1)*S/P)`` of the hidden states and the matching rows of the RoPE table (and of a per-token
  ``temb``); the text states and the timestep embedding are replicated;
* self-attention goes through a Ulysses wrapper around the chosen registry backend, installed with the
  normal swap (a real diffusers dispatcher backend ``ditprof_ulysses_<name>``): one all-to-all regroups
  q, k, v from (S/P tokens x H heads) to (S tokens x H/P heads), the backend (``sdpa``, ``fp8``,
  ``fp8-emulated``, ...) runs unchanged on those heads, and the inverse all-to-all brings the output back
  to (S/P x H). Projections, QK-norm (over all heads), RoPE, FFN and norms stay on the local shard.
* cross-attention (``sp_cross="local"``, the default): no communication at all. The text K/V are
  replicated and every query row attends independently, so the local S/P queries x all H heads against the
  full text K/V is exact, does the same FLOPs per rank as the head split (S/P*H = S*H/P query-heads), and
  saves two all-to-alls of the query/output per block; diffusers' own context-parallel Wan plan does the
  same (``parallel_config`` only for self-attention). ``sp_cross="heads"`` is the alternative the issue
  names (all-to-all of the queries only, the replicated K/V sliced to this rank's heads locally, inverse
  all-to-all of the output), kept to measure what it would cost.

Families: each declares its split on its adapter (``BlockPlan.sp``). Wan, LTX-Video, MiniMax-H3 (self-attention,
+ cross-attention to text where there is one, as above); Flux, FLUX.2 and HunyuanVideo double/single blocks,
Qwen-Image and CogVideoX blocks (joint attention over text + image; FLUX.2's single blocks carry [text | image]
in one hidden-states tensor, split with its text rows kept; CogVideoX's processor calls SDPA
itself, so the wrapper is installed by processor replacement with SDPA redirected, text first): the image tokens (and their RoPE rows) are
sharded, the text is replicated; ``joint_ulysses_backend`` regroups only the image part of q, k, v, slices
the full text part to this rank's heads locally, and after the backend sends the image output back by the
inverse all-to-all and all-gathers the text output over heads (every rank carries the whole text stream).

Per-head FP8 scaling survives the split exactly: after the all-to-all a rank holds *all* tokens of its heads,
so the per-(batch, head) amax -- and with it every e4m3 rounding -- is the single-device one.

Outputs of a run folder: ``rank<r>.baseline.trace.json.gz`` / ``rank<r>.swapped.trace.json.gz`` (one per
rank), ``tb/baseline/`` and ``tb/swapped/`` (one HolisticTraceAnalysis job each: one trace per rank with
torch.profiler's ``distributedInfo`` -- rank, world size, backend -- set by the profiler itself),
report.json with per-rank sections and max-over-ranks timings; the extrapolation uses the slowest rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from ditprof.errors import DitprofError
from ditprof.harness import atomic, backends, distributed, report, swap
from ditprof.harness.categories import ALL_CATEGORIES, COMM_RANGE, COMMUNICATION
from ditprof.harness.environment import environment
from ditprof.harness.extrapolate import extrapolate
from ditprof.harness.memory import memory_budget

CROSS_MODES = ("local", "heads")
_PRELOAD = ("torch", "diffusers.models.transformers.transformer_wan", "diffusers.models.transformers.transformer_ltx",
            "diffusers.models.transformers.transformer_flux",
            "diffusers.models.transformers.transformer_hunyuan_video",
            "diffusers.models.transformers.cogvideox_transformer_3d", "ditprof.model_blocks", "ditprof.kernels",
            "ditprof.harness.sequence_parallel", "ditprof.harness.runner")
# Gathered SP output vs the single-device output (rel-RMS). The SP run does the same ops on row subsets;
# only the accumulation order inside GEMM / attention kernels may change with the row count, i.e. a few
# ulp of fp32 per element. fp32: ~1e-7 measured, bound 1e-5. bf16: a changed fp32 partial can flip a bf16
# rounding (one ulp = 2^-8 relative) and that flip propagates through the later ops; the bound is one bf16
# ulp in RMS, 2^-8 ~ 3.9e-3 (measured on CPU: see tests/test_sequence_parallel.py).
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -8}


# --------------------------------------------------------------------------- bad input

def check_degree(P: int, *, heads: int | None = None, tokens: int | None = None,
                 device: torch.device | None = None) -> None:
    """One-line DitprofError for a P that cannot work here; names what does not divide."""
    if P < 1:
        raise DitprofError(f"--sp must be >= 1 (got {P})")
    if device is not None and device.type == "cuda":
        n = torch.cuda.device_count()
        if P > n:
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise DitprofError(f"--sp {P} needs {P} GPUs (one per rank), but {n} "
                               f"{'is' if n == 1 else 'are'} visible"
                               + (f" (CUDA_VISIBLE_DEVICES={vis})" if vis is not None else ""))
    bad = []
    if heads is not None and heads % P:
        bad.append(f"the head count {heads} is not divisible by {P} (Ulysses gives each rank H/P heads)")
    if tokens is not None and tokens % P:
        bad.append(f"the token count {tokens} is not divisible by {P} (each rank holds S/P tokens)")
    if bad:
        raise DitprofError(f"--sp {P}: " + "; ".join(bad))


def _preset_shape(spec) -> tuple[Any, str, int, int] | None:
    """(family, kind, heads, tokens) of a preset run without loading anything; None for checkpoints."""
    if spec.source_kind != "preset":
        return None
    from ditprof.model_blocks import get_preset
    from ditprof.model_blocks.inputs import resolve_grid

    preset = get_preset(spec.source)
    fam = preset.adapter
    kind = fam.kind(spec.kind or preset.kind).name
    heads = fam.heads(preset.config)[0]
    grid, _ = resolve_grid(fam, preset.config, preset, spec.tokens, spec.height, spec.width, spec.frames)
    return fam, kind, heads, fam.rows(grid, kind)


def check_family(family, kind: str | None):
    """The block's plan; a one-line error when the family declares no sequence split for it."""
    plan = family.plan(kind)
    if plan.sp is None:
        from ditprof.model_blocks.families import FAMILIES

        wired = [f.name for f in FAMILIES.values() if all(f.plan(k.name).sp is not None for k in f.kinds)]
        raise DitprofError(
            f"--sp: {family.name} {family.kind(kind).name} blocks declare no sequence split (BlockPlan.sp) yet; "
            f"sequence parallelism is wired up for {', '.join(wired)}")
    return plan


# --------------------------------------------------------------------------- attention wrappers

def ulysses_backend(inner: Callable, world: int, group=None) -> Callable:
    """Self-attention on local tokens: all-to-all (q, k, v) -> ``inner`` on H/P heads -> all-to-all back."""

    def ulysses(q, k, v, *, scale=None):
        with torch.profiler.record_function(COMM_RANGE + "/qkv"):
            qh, kh, vh = distributed.seq_to_heads([q, k, v], world, group)
        o = inner(qh, kh, vh, scale=scale)
        with torch.profiler.record_function(COMM_RANGE + "/out"):
            return distributed.heads_to_seq(o, world, group)

    return ulysses


def joint_ulysses_backend(inner: Callable, world: int, rank: int, text_tokens: int, text_first: bool = True,
                          group=None) -> Callable:
    """Joint attention over replicated text + local image tokens (Flux, HunyuanVideo): only the image part
    of q, k, v goes through the all-to-all; the full text part is sliced to this rank's heads locally and
    concatenated (in the block's order) -> ``inner`` on H/P heads over all T + S tokens -> the image output
    goes back by the inverse all-to-all, the text output (every rank needs all of it: the text stream is
    replicated) by an all-gather over heads."""
    T = text_tokens

    def split(x):  # (text, image) along the sequence
        n = x.shape[1]
        return (x[:, :T], x[:, T:]) if text_first else (x[:, n - T:], x[:, :n - T])

    def join(t, i):
        return torch.cat([t, i] if text_first else [i, t], dim=1)

    def joint(q, k, v, *, scale=None):
        parts = [split(x) for x in (q, k, v)]
        with torch.profiler.record_function(COMM_RANGE + "/qkv"):
            img = distributed.seq_to_heads([p[1] for p in parts], world, group)
        hp = q.shape[2] // world
        txt = [p[0][:, :, rank * hp:(rank + 1) * hp] for p in parts]
        qh, kh, vh = (join(t, i).contiguous() for t, i in zip(txt, img))
        ot, oi = split(inner(qh, kh, vh, scale=scale))
        with torch.profiler.record_function(COMM_RANGE + "/out"):
            oi = distributed.heads_to_seq(oi.contiguous(), world, group)
            ot = distributed.all_gather_heads(ot, world, group)
        return join(ot, oi)

    return joint


def cross_heads_backend(inner: Callable, world: int, rank: int, group=None) -> Callable:
    """Cross-attention with the head split: all-to-all the queries only, slice the replicated K/V to this
    rank's heads locally, all-to-all the output back."""

    def cross_heads(q, k, v, *, scale=None):
        with torch.profiler.record_function(COMM_RANGE + "/q"):
            (qh,) = distributed.seq_to_heads([q], world, group)
        hk = k.shape[2] // world
        kh = k[:, :, rank * hk:(rank + 1) * hk].contiguous()
        vh = v[:, :, rank * hk:(rank + 1) * hk].contiguous()
        o = inner(qh, kh, vh, scale=scale)
        with torch.profiler.record_function(COMM_RANGE + "/out"):
            return distributed.heads_to_seq(o, world, group)

    return cross_heads


def is_cross_attention(name: str, module: torch.nn.Module) -> bool:
    flag = getattr(module, "is_cross_attention", None)
    if flag is not None:
        return bool(flag)
    return name.split(".")[-1] == "attn2"


@contextlib.contextmanager
def sp_swapped(module: torch.nn.Module, b: backends.BackendInfo, *, world: int, rank: int, cross: str = "local",
               uses_dispatcher: bool | None = None, group=None,
               joint: tuple[int, bool] | None = None) -> Iterator[dict]:
    """Install the Ulysses wrapper around ``b`` on the self-attention modules and ``b`` (local) or the
    head-split wrapper on the cross-attention modules, through ``swap.install``; restore on exit."""
    if cross not in CROSS_MODES:
        raise DitprofError(f"sp cross-attention mode {cross!r}: use one of {', '.join(CROSS_MODES)}")
    mods = swap.attention_modules(module)
    self_mods = [(n, m) for n, m in mods if not is_cross_attention(n, m)]
    cross_mods = [(n, m) for n, m in mods if is_cross_attention(n, m)]
    if not self_mods:
        raise DitprofError(f"--sp: no self-attention module found in {type(module).__name__}")
    states: list[swap.SwapState] = []
    info: dict[str, Any] = {"modules": {}, "routes": set(), "masks": {}, "diffusers_backends": {}}
    if joint is not None:  # (text tokens, text first): the joint variant on the joint-attention modules
        plan = [(self_mods, f"ulysses-joint-{b.name}",
                 joint_ulysses_backend(b.fn, world, rank, joint[0], joint[1], group))]
    else:
        plan = [(self_mods, f"ulysses-{b.name}", ulysses_backend(b.fn, world, group))]
    if cross == "local":
        plan.append((cross_mods, b.name, b.fn))
    else:
        plan.append((cross_mods, f"ulysses-heads-{b.name}", cross_heads_backend(b.fn, world, rank, group)))
    try:
        for targets, name, fn in plan:
            for mod_name, mod in targets:
                st = swap.install(mod, name, fn, uses_dispatcher=uses_dispatcher)
                states.append(st)
                info["modules"][mod_name] = name
                info["routes"].add(st.route)
                if st.member is not None:
                    info["diffusers_backends"][mod_name] = st.member.value
        info["route"] = info["routes"].pop() if len(info["routes"]) == 1 else "mixed"
        del info["routes"]
        info["_states"] = states
        yield info
    finally:
        for st in reversed(states):
            st.restore()
        for st in states:
            for k, v in st.masks.items():
                info["masks"][k] = info["masks"].get(k, 0) + v


# --------------------------------------------------------------------------- inputs

def _split(t: torch.Tensor, how, name: str, S: int, T: int, lo: int, hi: int) -> torch.Tensor:
    """Rows ``[lo, hi)`` of ``t`` along ``how.dim`` (a ``SeqSplit``), the replicated text rows kept whole."""
    if how.ndim is not None and t.ndim != how.ndim:
        return t
    d = how.dim
    want = S + (T if how.text else 0)
    if t.ndim <= d or t.shape[d] != want:
        raise DitprofError(f"--sp: expected {want} rows on dim {d} of {name}, got shape {tuple(t.shape)}")
    if how.text == "first":
        return torch.cat([t.narrow(d, 0, T), t.narrow(d, T + lo, hi - lo)], dim=d).contiguous()
    if how.text == "last":
        return torch.cat([t.narrow(d, lo, hi - lo), t.narrow(d, S, T)], dim=d).contiguous()
    return t.narrow(d, lo, hi - lo).contiguous()


def gather_output(out: torch.Tensor, how, text_tokens: int, world: int, device: torch.device) -> torch.Tensor:
    """Every rank's block output back into the one-device sequence (on the host). A hidden-states split that
    keeps replicated text rows (``how.text``) returns them on every rank: they are taken once, from rank 0."""
    full = distributed.all_gather_tokens(out, world, device)
    if how is None or not how.text or world == 1:
        return full
    T = text_tokens
    parts = full.chunk(world, dim=1)
    if how.text == "first":
        return torch.cat([parts[0][:, :T]] + [p[:, T:] for p in parts], dim=1)
    return torch.cat([p[:, :p.shape[1] - T] for p in parts] + [parts[0][:, -T:]], dim=1)


def shard_inputs(loaded: Any, inputs: Any, rank: int, world: int) -> Any:
    """This rank's share of the block inputs, as the family's ``BlockPlan.sp`` declares it: rows
    ``[r*S/P, (r+1)*S/P)`` of every split input (each item of a tuple such as a rotary pair); text and
    everything not named replicated."""
    plan = check_family(loaded.family, loaded.kind)
    S, T = inputs.tokens, inputs.text_tokens
    s = S // world
    lo, hi = rank * s, (rank + 1) * s
    kw = dict(inputs.kwargs)
    if inputs.args:
        raise DitprofError("--sp: block inputs must be named (make_inputs names them)")
    for name, how in plan.sp.items():
        value = kw.get(name)
        if value is None:
            continue
        if isinstance(value, (tuple, list)):
            hows = how if isinstance(how, tuple) else (how,) * len(value)  # one split per item, None: replicated
            kw[name] = type(value)(t if h is None else _split(t, h, name, S, T, lo, hi) for t, h in zip(value, hows))
        else:
            kw[name] = _split(value, how, name, S, T, lo, hi)
    return dataclasses.replace(inputs, args=(), kwargs=kw, tokens=s)


# --------------------------------------------------------------------------- one rank

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
    from ditprof.harness.run_parts import Phases
    from ditprof.harness.session import measure
    from ditprof.kernels.interface import deferred_finite_checks

    uses = getattr(getattr(loaded, "family", None), "uses_dispatcher", None)
    work = stage / f".rank{rank}-{label}"
    name = f"rank{rank}.{label}"
    text = loaded.family.plan(loaded.kind).joint_text
    joint = (local.text_tokens, text == "first") if text else None
    with sp_swapped(loaded.module, b, world=world, rank=rank, cross=spec.sp_cross, uses_dispatcher=uses,
                    joint=joint) as st, \
            swap.norm_ranges(loaded.module), deferred_finite_checks():
        dist.barrier()
        run = measure(lambda: local.run(loaded.module), label=name, backend=b.name, device=device, workdir=work,
                      warmup=spec.warmup, iters=spec.iters, resident_bytes=resident,
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
    run.route = st["route"]
    run.extra["attention_modules"] = st["modules"]
    run.extra["diffusers_backends"] = st["diffusers_backends"]
    if st["masks"]:
        run.extra["attention_masks"] = dict(st["masks"])
    run.extra["device"] = str(device)
    return run


def query_chunked(inner: Callable, world: int) -> Callable:
    """``inner`` called on ``world`` contiguous query chunks against the full K/V: on one device, the
    numerics of local cross-attention under SP (a backend with per-head scales, like FP8, takes the query
    amax over the rank's S/P queries only)."""

    def chunked(q, k, v, *, scale=None):
        return torch.cat([inner(qc, k, v, scale=scale) for qc in q.chunk(world, dim=1)], dim=1)

    return chunked


def _single_device_output(loaded, inputs, b, world: int = 1, cross: str = "heads") -> torch.Tensor:
    """The block on one device with all tokens; ``cross="local"`` with ``world > 1`` chunks the
    cross-attention queries as the ranks hold them (the same numerics as the SP run)."""
    uses = getattr(getattr(loaded, "family", None), "uses_dispatcher", None)
    with contextlib.ExitStack() as stack:
        for name, mod in swap.attention_modules(loaded.module):
            if cross == "local" and world > 1 and is_cross_attention(name, mod):
                st = swap.install(mod, f"chunked-{b.name}", query_chunked(b.fn, world), uses_dispatcher=uses)
            else:
                st = swap.install(mod, b.name, b.fn, uses_dispatcher=uses)
            stack.callback(st.restore)
        with torch.inference_mode():
            return inputs.run(loaded.module).detach().to("cpu")


def _check(loaded, full, b, got: torch.Tensor, dtype: torch.dtype, world: int, cross: str) -> dict:
    """Gathered SP output vs the single-device output (same backend, same inputs)."""
    ref = _single_device_output(loaded, full, b)
    acc = report.accuracy(ref, got)
    acc["reference"] = "the same block and backend on one device, all tokens"
    if cross == "local" and world > 1:
        plain = acc
        ref = _single_device_output(loaded, full, b, world, cross)
        acc = report.accuracy(ref, got)
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

    from ditprof.harness.progress import make_progress
    from ditprof.harness.run_parts import resident_bytes, write_run
    from ditprof.model_blocks import load_block, make_inputs

    device = distributed.rank_device(spec.device.type, local_rank)
    if device.type == "cpu" and threads:
        torch.set_num_threads(threads)
    backend = distributed.pg_backend(device.type) if group_ready else distributed.init(rank, world, device,
                                                                                        init_method)
    base_b = backends.resolve(spec.baseline, device)
    swap_b = backends.resolve(spec.swap, device) if spec.swap else None
    console = Console() if rank == 0 else None
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
            dist.all_gather_object(parts, report.run_section(r))
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
    from ditprof.harness.run_parts import model_section

    model = model_section(spec, loaded, full)
    base = combine_ranks(sections["baseline"])
    sw = combine_ranks(sections["swapped"]) if "swapped" in sections else None
    acc = report.accuracy(gathered["baseline"], gathered["swapped"]) if sw else None
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
    )
    ex["uses"] = "slowest rank (largest median block time)"
    files = ["report.json", "report.md", "split.png"]
    for sec in (base, sw):
        if sec:
            files += sec["traces"] + sec["tb_traces"]
    settings = {
        "device": spec.device.type, "rank_devices": [r["device"] for r in base["ranks"]], "warmup": spec.warmup,
        "iters": spec.iters, "seed": spec.seed, "gpu_memory": spec.gpu_memory, "gpu_memory_budget_bytes": budget,
        "argv": sys.argv[1:],
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
    return report.build(
        command=spec.command, model=model, environment=environment(device), settings=settings,
        baseline=base, swapped=sw, extrapolation=ex, accuracy_section=acc, files=files,
        created=_dt.datetime.now().astimezone().isoformat(timespec="seconds"), sp=sp,
    )


# --------------------------------------------------------------------------- launchers

def _error_file(stage: Path, rank: int) -> Path:
    return stage / f".error-rank{rank}.txt"


def _spawn_entry(rank: int, world: int, spec, stage: str, init_method: str, threads: int, launcher: str) -> None:
    stage_p = Path(stage)
    try:
        rank_body(rank, world, rank, spec, stage_p, launcher=launcher, init_method=init_method, threads=threads)
    except DitprofError as exc:
        _error_file(stage_p, rank).write_text(str(exc))
        raise SystemExit(3) from None  # no barrier: the peers may be gone; the parent stops the others
    except BaseException:
        _error_file(stage_p, rank).write_text("rank %d failed:\n%s" % (rank, traceback.format_exc()))
        raise
    distributed.shutdown()


def _first_error(stage: Path, world: int) -> str | None:
    for r in range(world):
        f = _error_file(stage, r)
        if f.exists():
            return f.read_text().strip()
    return None


def _precheck(spec) -> None:
    P = spec.sp
    check_degree(P, device=spec.device)
    if spec.sp_cross not in CROSS_MODES:
        raise DitprofError(f"sp cross-attention mode {spec.sp_cross!r}: use one of {', '.join(CROSS_MODES)}")
    backends.resolve(spec.baseline, spec.device)
    if spec.swap:
        backends.resolve(spec.swap, spec.device)
    shape = _preset_shape(spec)
    if shape is not None:
        fam, kind, heads, tokens = shape
        check_family(fam, kind)
        check_degree(P, heads=heads, tokens=tokens)


def execute_sp(spec, console=None) -> tuple[dict, Path]:
    """Run ``spec`` (``spec.sp`` = P) over P ranks; returns (report, folder) like ``runner.execute``."""
    from rich.console import Console

    console = console or Console()
    _precheck(spec)
    if distributed.torchrun_env() is not None:
        return _execute_torchrun(spec, console)
    out = atomic.check_writable(spec.out)
    if spec.source_kind == "preset":  # write the synthetic checkpoint once, before P ranks race for it
        from ditprof.model_blocks import get_preset
        from ditprof.model_blocks.synthetic import ensure_checkpoint

        preset = get_preset(spec.source)
        ensure_checkpoint(preset, blocks=[spec.block], kind=spec.kind or preset.kind, progress=True)
    P = spec.sp
    console.print(f"[bold]ditprof {spec.command} --sp {P}[/]: {spec.source_kind} {spec.source}, block {spec.block}, "
                  f"{P} ranks ({distributed.pg_backend(spec.device.type)}), baseline {spec.baseline}"
                  + (f", swap {spec.swap}" if spec.swap else "") + f", cross-attention {spec.sp_cross}")
    from ditprof.harness.run_plan import check_plan, make_plan

    plan = make_plan(spec)  # the one-device block: each rank computes about 1/P of it
    plan.note = "; ".join(n for n in (spec.size_note, f"each of the {P} ranks runs about 1/{P} of this") if n)
    for line in plan.lines():
        console.print(line)
    check_plan(plan, time_limit_min=spec.time_limit_min, yes=spec.yes)
    threads = max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // P))
    import torch.multiprocessing as mp

    # CPU: forkserver, a clean single-threaded server imports torch/diffusers/ditprof once and forks the ranks
    # (no OpenMP pool in it); later runs in the same process reuse the warm server. CUDA: spawn, because a
    # preloaded module may touch CUDA in the server and a forked child cannot re-initialise it (seen on the H200).
    start = os.environ.get("DITPROF_SP_START_METHOD") or ("spawn" if spec.device.type == "cuda" else "forkserver")
    if start == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload(list(_PRELOAD))

    with atomic.staged_dir(out) as stage, distributed.multicast_off_env():
        init_method = f"tcp://127.0.0.1:{distributed.free_port()}"
        try:
            mp.start_processes(_spawn_entry, args=(P, spec, str(stage), init_method, threads,
                                                            f"torch.multiprocessing ({start})"), nprocs=P,
                               join=True, start_method=start)
        except Exception as exc:  # noqa: BLE001 - a rank failed: one message, nothing written
            msg = _first_error(stage, P)
            raise DitprofError(msg or f"--sp {P}: a rank failed ({exc})") from None
        for f in stage.glob(".error-rank*.txt"):
            f.unlink()
        rep = json.loads((stage / "report.json").read_text())
        rep["plan"] = plan.as_dict()
        atomic.write_text(stage / "report.json", report.to_json(rep))
    return rep, out


def _execute_torchrun(spec, console) -> tuple[dict, Path]:
    """Every torchrun process lands here: rank 0 stages the folder, all ranks measure, rank 0 commits."""
    rank, world, local_rank = distributed.torchrun_env()
    if world != spec.sp:
        raise DitprofError(f"--sp {spec.sp} but torchrun started {world} processes (WORLD_SIZE)")
    device = distributed.rank_device(spec.device.type, local_rank)
    distributed.init(rank, world, device, "env://")
    out = Path(spec.out).expanduser().absolute()
    stage = None
    try:
        box: list[Any] = [None]
        if rank == 0:
            atomic.check_writable(out)
            stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
            box[0] = str(stage)
        dist.broadcast_object_list(box, src=0)
        stage = Path(box[0])
        rep = rank_body(rank, world, local_rank, spec, stage, launcher="torchrun", init_method="env://",
                        group_ready=True)
        dist.barrier()
        if rank == 0:
            atomic.commit(stage, out)
    except BaseException:
        if rank == 0 and stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        if rank == 0 and stage is not None and stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    distributed.shutdown()
    if rank != 0:
        raise SystemExit(0)  # rank 0 prints the summary
    return rep, out
