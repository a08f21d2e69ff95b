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

import json
import os
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ditprof.errors import DitprofError
from ditprof.harness.run import atomic
from ditprof.harness.swaps import backends
from ditprof.harness.sp import distributed
from ditprof.harness.report import document
from ditprof.harness.report import summary as report
from ditprof.harness.sp.attention import (  # noqa: F401 -- the checks, wrappers and sharding, re-exported
    CROSS_MODES, _preset_shape, check_degree, check_family, cross_heads_backend, gather_output, is_cross_attention,
    joint_ulysses_backend, shard_inputs, SpAttentionSwap, ulysses_backend)
from ditprof.harness.sp.rank import TOLERANCE, combine_ranks, query_chunked, rank_body  # noqa: F401 -- re-exported

_PRELOAD = ("torch", "diffusers.models.transformers.transformer_wan", "diffusers.models.transformers.transformer_ltx",
            "diffusers.models.transformers.transformer_flux",
            "diffusers.models.transformers.transformer_hunyuan_video",
            "diffusers.models.transformers.cogvideox_transformer_3d", "ditprof.model_blocks", "ditprof.kernels",
            "ditprof.harness.sp.launch", "ditprof.harness.run.runner")


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
    backends.resolve(spec.baseline, spec.device, spec.fp8_options)
    if spec.swap:
        backends.resolve(spec.swap, spec.device, spec.fp8_options)
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
    from ditprof.harness.run.plan import check_plan, make_plan

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
        atomic.write_text(stage / "report.json", document.to_json(rep))
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
