"""Measure one block with one attention backend: warm-up, clean timing, then a profiled window.

Clean timing runs the block outside the profiler: CUDA events around each call on a GPU, the host clock
(``time.perf_counter``) on CPU. The profiled window (``torch.profiler``, CPU + CUDA activities) then runs the
same calls, each inside a ``ditprof::block`` range; its per-iteration block time next to the clean timing
shows the profiler's overhead. On a GPU the block is also captured once into a CUDA graph and its replays timed:
eager minus replay is the host (Python / launch) overhead, which decides small blocks (see ``time_block_graph``).
The trace is exported with ``tensorboard_trace_handler`` (which calls ``prof.export_chrome_trace``) into ``tb/``
and gzip-copied to ``<label>.trace.json.gz``.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ditprof.harness.trace.categories import BLOCK_RANGE, Split, load_trace, split_trace
from ditprof.harness.trace.op_bytes import category_bytes
from ditprof.harness.run.finite import NonFiniteOutput


def _band(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


@dataclass
class BackendRun:
    label: str  # "baseline" / "swapped"
    backend: str
    device: str
    timing_source: str  # "cuda_events" or "host_clock"
    samples_ms: list[float]
    split: Split
    profiled_block_ms: float
    peak_memory_bytes: int | None
    peak_memory_source: str
    trace_file: str  # name inside the run folder
    tb_file: str  # path relative to the run folder
    route: str = ""
    # CUDA-graph replay timing (GPU): samples, or None with the reason in graph_note
    graph_samples_ms: list[float] | None = None
    graph_note: str = ""
    output: torch.Tensor | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)
    # norm / elementwise bytes per block call from the profiled calls' recorded shapes (trace.op_bytes)
    split_bytes: dict[str, Any] | None = None

    @property
    def block_ms(self) -> dict[str, float]:
        return _band(self.samples_ms)

    @property
    def graph_block_ms(self) -> dict[str, float] | None:
        return _band(self.graph_samples_ms) if self.graph_samples_ms else None

    @property
    def profiler_overhead_pct(self) -> float:
        med = self.block_ms["median"]
        return (self.profiled_block_ms / med - 1.0) * 100.0 if med > 0 else 0.0



@contextlib.contextmanager
def _without_kineto_chatter():
    """Kineto prints a 'USDT: ... profiler_start/stop' line to fd 2 at every profiler cycle (no switch turns it
    off). Send fd 2 to a temp file for the profiled window, then pass every other line on to the real stderr."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured/replaced stderr (pytest): nothing to filter
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(("USDT:", "INFO:")):
                    sys.stderr.write(line)
            sys.stderr.flush()

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock; elapsed in ms."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1000.0

    def wait(self, m) -> None:
        if self.cuda:
            m.synchronize()


def time_block(call: Callable[[], Any], device: torch.device, iters: int,
               on_call: Callable[[int], None] | None = None) -> tuple[list[float], str]:
    """Per-call milliseconds, outside the profiler. ``on_call(n)`` after each timed call (n calls done so far),
    outside the timed span: the progress of a phase that can take minutes."""
    samples = []
    if device.type == "cuda":
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
            if on_call:
                on_call(len(samples))
        return samples, "cuda_events"
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000.0)
        if on_call:
            on_call(len(samples))
    return samples, "host_clock"


INTERLEAVED_CALLS_PER_ROUND = 5


def time_interleaved(runs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], device: torch.device, rounds: int,
                     calls: int = INTERLEAVED_CALLS_PER_ROUND,
                     on_round: Callable[[int], None] | None = None) -> dict[str, list[list[float]]]:
    """Eager block calls of several setups taken in turns, so that drift of the host or the clocks during the
    run lands on all of them alike (two phases one after the other put it into their ratio). ``runs``: name ->
    (context factory, call); each turn enters the context, makes one untimed call (the first after a switch),
    times ``calls`` calls as ``time_block`` does and leaves; the order of the turns reverses every round, so no
    setup always follows the same one; ``on_round(n)`` after each round. Returns name -> per-round lists of
    milliseconds."""
    names = list(runs)
    out: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            enter, call = runs[name]
            with enter():
                call()
                _sync(device)
                samples, _ = time_block(call, device, calls)
            out[name].append(samples)
        if on_round:
            on_round(r + 1)
    return out


# a replay may differ from the eager call only by a non-deterministic kernel's rounding (fp32 atomics): well
# under one bf16 ulp (2^-8) in RMS
GRAPH_REPLAY_TOLERANCE = 1e-3


def time_block_graph(call: Callable[[], Any], device: torch.device, iters: int,
                     on_call: Callable[[int], None] | None = None
                     ) -> tuple[list[float] | None, str, torch.Tensor | None]:
    """Capture ``call`` once into a CUDA graph, then time ``iters`` replays with CUDA events.

    Replays skip Python, the dispatcher and kernel launches, so eager minus replay is what the host adds to a
    block call; for small blocks (a few ms) that can be most of the eager time, and it differs between
    attention backends (ours runs Triton + CuTe-DSL launches from Python). Returns (samples, note, output on
    the CPU); samples None when the block cannot be captured (a host sync, a CPU-side branch on GPU data...),
    with the reason in ``note``: the caller reports it and goes on. ``on_call``: as ``time_block``'s, per replay."""
    if device.type != "cuda":
        return None, "no CUDA graphs on the CPU", None
    graph = torch.cuda.CUDAGraph()
    out = None
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs ask
            for _ in range(2):
                call()
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.cuda.graph(graph):
            out = call()
        graph.replay()
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - any capture failure is reported, the run goes on without it
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"not capturable: {type(exc).__name__}: {first}", None
    samples, _ = time_block(graph.replay, device, iters, on_call)
    result = out.detach().to("cpu", copy=True) if isinstance(out, torch.Tensor) else None
    del graph, out
    torch.cuda.empty_cache()  # the graph's private memory pool: gone before the profiled window
    return samples, "cuda_graph", result


def _cpu_peak_from_trace(trace: dict) -> int:
    peak = 0
    for ev in trace.get("traceEvents", []):
        if ev.get("name") == "[memory]":
            args = ev.get("args") or {}
            if args.get("Device Type", 0) == 0:
                peak = max(peak, int(args.get("Total Allocated", 0)))
    return peak


def _warm_up(call: Callable[[], torch.Tensor], device: torch.device, warmup: int, what: str,
             phase: Callable[[str, int, int], None]) -> torch.Tensor:
    """``max(warmup, 1)`` calls; the last output, on the CPU, checked finite (``what`` names the run)."""
    output = None
    for i in range(max(warmup, 1)):
        output = call()
        _sync(device)
        phase("warm-up", i + 1, max(warmup, 1))
    output = output.detach().to("cpu", copy=True)  # off the GPU: keeps the next run's peak clean
    if output.is_floating_point() and not bool(torch.isfinite(output).all()):
        raise NonFiniteOutput(f"{what}: the block output holds NaN/Inf")
    return output


def _graph_timing(call: Callable[[], torch.Tensor], device: torch.device, iters: int, output: torch.Tensor,
                  phase: Callable[[str, int, int], None]) -> tuple[list[float] | None, str]:
    """CUDA-graph replay samples (None where the replay's output is not the eager ``output``) and their note."""
    phase("CUDA graph", 0, iters)
    graph_samples, graph_note, graph_out = time_block_graph(call, device, iters,
                                                            lambda n: phase("CUDA graph", n, iters))
    phase("CUDA graph", iters, iters)
    if graph_out is not None and not torch.equal(graph_out, output):
        # same kernels on the same inputs: bit-identical unless a kernel is non-deterministic; a replay
        # that differs more than that means the capture went wrong, and its timing is not used
        from ditprof.harness.run.metrics import accuracy

        diff = accuracy(output, graph_out)["block_output_rel_rms"]
        if not diff <= GRAPH_REPLAY_TOLERANCE:
            graph_samples = None
            graph_note = f"replay output differs from the eager output (rel-RMS {diff:.2e}): not used"
        else:
            graph_note = f"cuda_graph (replay vs eager rel-RMS {diff:.2e})"
    del graph_out
    return graph_samples, graph_note


def _profiled_window(call: Callable[[], torch.Tensor], device: torch.device, iters: int, tb_dir: Path,
                     label: str, phase: Callable[[str, int, int], None]) -> Path:
    """One warm-up step and ``iters`` active steps under ``torch.profiler``; the trace file it wrote."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    before = set(p.name for p in tb_dir.glob("*.pt.trace.json"))
    handler = torch.profiler.tensorboard_trace_handler(str(tb_dir), worker_name=label)
    prof = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=iters, repeat=1),
        on_trace_ready=handler,
        profile_memory=device.type == "cpu",  # CUDA peak comes from the caching allocator instead
        record_shapes=True,  # the bytes of the norm / elementwise ops (trace.op_bytes); a few % of host time
    )
    with _without_kineto_chatter(), prof:
        for i in range(iters + 1):
            call()
            _sync(device)
            prof.step()
            phase("profiling", i + 1, iters + 1)
    new = sorted(p for p in tb_dir.glob("*.pt.trace.json") if p.name not in before)
    if not new:
        raise RuntimeError("torch.profiler wrote no trace")
    return new[-1]


def measure(
    run_block: Callable[[], torch.Tensor],
    *,
    label: str,
    backend: str,
    device: torch.device,
    workdir: Path,
    warmup: int = 3,
    iters: int = 10,
    resident_bytes: int = 0,
    on_phase: Callable[[str, int, int], None] | None = None,
    cuda_graph: bool = True,
) -> BackendRun:
    """Warm up, time, profile. ``run_block()`` runs the block once and returns its output tensor.
    ``cuda_graph`` (GPU): also time CUDA-graph replays of the block (``time_block_graph``)."""
    phase = on_phase or (lambda *a: None)
    workdir = Path(workdir)
    tb_dir = workdir / "tb" / label  # one TensorBoard run / HTA job per measurement
    tb_dir.mkdir(parents=True, exist_ok=True)

    def call():
        with torch.profiler.record_function(BLOCK_RANGE):
            return run_block()

    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        output = _warm_up(call, device, warmup, f"{label} ({backend})", phase)

        phase("timing", 0, iters)
        samples, source = time_block(call, device, iters, lambda n: phase("timing", n, iters))  # each call
        if device.type == "cuda":
            peak = int(torch.cuda.max_memory_allocated(device))
            peak_source = "torch.cuda.max_memory_allocated"
        graph_samples, graph_note = None, "off"
        if cuda_graph and device.type == "cuda":
            graph_samples, graph_note = _graph_timing(call, device, iters, output, phase)
        tb_file = _profiled_window(call, device, iters, tb_dir, label, phase)

    trace = load_trace(tb_file)
    split = split_trace(trace, mode="cuda" if device.type == "cuda" else "cpu")
    moved = category_bytes(trace, list_itemsize=output.element_size())
    trace_name = f"{label}.trace.json.gz"
    with open(tb_file, "rb") as src, gzip.open(workdir / trace_name, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    if device.type != "cuda":
        peak = resident_bytes + _cpu_peak_from_trace(trace)
        peak_source = "block params + inputs + profiler-tracked CPU allocations"
    profiled = statistics.median(split.block_range_ms) if split.block_range_ms else float("nan")
    return BackendRun(
        label=label, backend=backend, device=str(device), timing_source=source, samples_ms=samples,
        split=split, profiled_block_ms=profiled, peak_memory_bytes=peak, peak_memory_source=peak_source,
        trace_file=trace_name, tb_file=str(tb_file.relative_to(workdir)), output=output,
        graph_samples_ms=graph_samples, graph_note=graph_note, split_bytes=moved.to_dict(),
    )
