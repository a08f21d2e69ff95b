"""``--compile [MODE]``: measure the block as production DiT serving runs it, through ``torch.compile``.

* The block module is compiled with ``fullgraph=True``: a graph break would leave parts of the block eager and
  make the measurement neither eager nor compiled, so it is an error naming the break (file, line, reason), never
  a silent fallback. ``torch._dynamo.config.suppress_errors`` stays off for the same reason: a failing compile
  (no C/C++ compiler for CPU inductor, an op inductor cannot lower) is a one-line ``DitprofError``.
* Compile time = the wall time of the first call (dynamo tracing + inductor codegen + kernel compiles; the
  inductor FX-graph cache can make it short, so its hits and misses are reported alongside).
* Warm-up goes on until a call compiles nothing new (dynamo's ``unique_graphs`` counter stays put), at most
  ``MAX_WARMUP_CALLS``; a block that keeps recompiling is an error. A recompile during the timed or profiled
  calls is an error too (``check_stable``): its seconds of compiling would be measured as block time.
* Each measurement compiles afresh (``torch._dynamo.reset()``): baseline and swap share one module object, and
  the swapped run must be compiled with the swapped attention, not re-use (or guard-fail into) the baseline's
  graph.
* CPU inductor's C++ kernels are invisible to the profiler unless ``cpp.enable_kernel_profile`` is on (each then
  runs inside a ``graph_N_cpp_fused_...`` range); inductor names a kernel after at most
  ``kernel_name_max_ops`` of the ops it fuses, raised here so the split sees them all (``categories``).
* ``reduce-overhead`` / ``max-autotune`` are not offered: their CUDA graphs replay kernels without the launches
  the profiler attributes them by (and the harness times CUDA-graph replays of the block itself).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ditprof.errors import DitprofError

if TYPE_CHECKING:  # torch is imported where used: the CLI parser reads MODES without it
    import torch

MODES = ("default", "max-autotune-no-cudagraphs")
MAX_WARMUP_CALLS = 8  # calls after the first that may still compile before the block counts as never stable
KERNEL_NAME_MAX_OPS = 64  # inductor's default 10 cuts long fused-op lists short, hiding what a kernel mixes


def execution(mode: str | None) -> str:
    """What the report calls the way the block ran: ``eager`` or ``compile:<mode>``."""
    return "eager" if mode is None else f"compile:{mode}"


def check_args(args: Any) -> str | None:
    """The ``--compile`` mode of the parsed arguments (None: eager); one-line errors for combinations that do not
    run."""
    mode = getattr(args, "compile", None)
    if mode is None:
        return None
    if mode not in MODES:
        raise DitprofError(f"--compile {mode!r} is not a mode; use one of: {', '.join(MODES)}")
    if getattr(args, "sp", None) is not None:
        raise DitprofError("--compile does not run with --sp: the Ulysses all-to-all wrappers are not compiled; "
                           "profile the compiled block without --sp")
    return mode


@dataclass
class CompileStats:
    mode: str
    first_call_s: float  # wall time of the first call: tracing + codegen + kernel compiles + one run
    warmup_calls: int  # calls made until one compiled nothing (the first call included)
    graphs: int  # graphs dynamo compiled for the block (fullgraph: 1 unless guards made it recompile)
    recompiles: int  # graphs compiled after the first call
    cache_hits: int  # inductor FX-graph cache: compiled graphs read from disk ...
    cache_misses: int  # ... and compiled here
    fullgraph: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


def line(stats: dict, label: str) -> str:
    """The compile line of one measurement: what the first call cost and whether it settled."""
    cache = f"inductor cache {stats['cache_hits']} hit(s), {stats['cache_misses']} miss(es)"
    return (f"{label}: compiled ({execution(stats['mode'])}, fullgraph) in {stats['first_call_s']:.2f} s (first "
            f"call), {stats['graphs']} graph(s), {stats['recompiles']} recompile(s), stable after "
            f"{stats['warmup_calls']} call(s); {cache}")


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _cache() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


def compile_blocks(modules: list[torch.nn.Module], mode: str, device: torch.device) -> list[Callable]:
    """``torch.compile(module, fullgraph=True)`` of each module with ``mode``'s inductor options (compiling happens
    at the first call). Clears dynamo's caches first: this measurement gets its own compile."""
    import torch
    import torch._inductor

    torch._dynamo.reset()
    # torch.compile takes a mode or options, not both: the mode's own options plus the profiling ones
    options: dict[str, Any] = dict(torch._inductor.list_mode_options(mode))
    options["kernel_name_max_ops"] = KERNEL_NAME_MAX_OPS
    if device.type == "cpu":
        options["cpp.enable_kernel_profile"] = True
    with failures_as_errors(mode):  # torch.compile checks its arguments (and the backend) before any call
        return [torch.compile(m, fullgraph=True, options=options) for m in modules]


def compile_block(module: torch.nn.Module, mode: str, device: torch.device) -> Callable:
    return compile_blocks([module], mode, device)[0]


def _where(text: str) -> str:
    """The innermost user-code frame dynamo names in a graph-break message: 'file.py:123'."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', text.split("from user code:", 1)[-1])
    if not frames:
        return ""
    path, lineno = frames[-1]
    return f"{'/'.join(path.split('/')[-2:])}:{lineno}"


def describe_failure(exc: BaseException) -> str:
    """One line for a failed compile: the graph break and where, or the compiler's error."""
    text = str(exc).strip()
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    first = lines[0] if lines else ""
    if type(exc).__name__ == "Unsupported" or "graph break" in text.lower():
        why = next((s[len("Explanation:"):].strip() for s in lines if s.startswith("Explanation:")), "")
        where = _where(text)
        return (f"graph break (fullgraph=True) {('at ' + where + ': ') if where else ''}{first}"
                + (f" -- {why}" if why else ""))
    return f"{type(exc).__name__}: {first[:300]}"


def _ditprof_error(exc: BaseException) -> DitprofError | None:
    """A DitprofError raised inside the compiled code (a backend's input check on fake tensors), if dynamo wrapped
    one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, DitprofError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _from_compiler(exc: BaseException | None) -> bool:
    """Whether dynamo or inductor raised ``exc`` (or an exception it was raised from)."""
    while exc is not None:
        if type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
            return True
        exc = exc.__cause__
    return False


@contextlib.contextmanager
def failures_as_errors(mode: str, what: str = "the block", *, compiler_only: bool = False) -> Iterator[None]:
    """Inside: a compile failure (or an eager fallback dynamo would otherwise take) becomes one ``DitprofError``.
    ``compiler_only``: only what dynamo/inductor raise (after the warm-up: the harness's own errors stay theirs);
    otherwise any failure (the first calls: whatever fails there fails compiling or running compiled code)."""
    import torch._dynamo.config as dynamo_config

    from ditprof.harness.run.finite import NonFiniteOutput

    with dynamo_config.patch(suppress_errors=False, fail_on_recompile_limit_hit=True):
        try:
            yield
        except (DitprofError, NonFiniteOutput):
            raise
        except Exception as exc:  # a failure of the compiled call is reported, in one line
            inner = _ditprof_error(exc)
            if inner is not None:
                raise inner from None
            if compiler_only and not _from_compiler(exc):
                raise
            raise DitprofError(f"--compile {mode}: torch.compile of {what} failed: {describe_failure(exc)}") \
                from None


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(call: Callable[[], Any], device: torch.device, mode: str, *, what: str = "the block",
            max_calls: int = MAX_WARMUP_CALLS, expect_graphs: bool = True) -> CompileStats:
    """First call (timed: the compile), then calls until one compiles nothing new. Under inference mode, as the
    measurement runs: dynamo guards on it, so a warm-up outside it would recompile inside the timed calls.
    ``expect_graphs``: a first call that compiles nothing is an error (dynamo skipped the block: it would run
    eager); False where the graphs may already exist (validate's chain after its first block)."""
    import torch

    graphs0, (hits0, misses0) = _graphs(), _cache()
    with failures_as_errors(mode, what), torch.inference_mode():
        t0 = time.perf_counter()
        call()
        _sync(device)
        first_s = time.perf_counter() - t0
        after_first = _graphs()
        calls = 1
        while True:
            before = _graphs()
            call()
            _sync(device)
            calls += 1
            if _graphs() == before:
                break
            if calls > max_calls:
                raise DitprofError(f"--compile {mode}: {what} still recompiled at warm-up call {calls} "
                                   f"({_graphs() - graphs0} graphs); its guards fail at every call "
                                   f"(TORCH_LOGS=recompiles says why)")
    hits, misses = _cache()
    graphs = _graphs() - graphs0
    if graphs < 1 and expect_graphs:
        raise DitprofError(f"--compile {mode}: {what} ran without compiling any graph (dynamo skipped it)")
    return CompileStats(mode=mode, first_call_s=first_s, warmup_calls=calls, graphs=graphs,
                        recompiles=_graphs() - after_first, cache_hits=hits - hits0, cache_misses=misses - misses0)


@contextlib.contextmanager
def stable(mode: str, during: str, what: str = "the block") -> Iterator[None]:
    """Inside: the compiled block must not compile again (a recompile's seconds would be measured as block time)."""
    before = _graphs()
    with failures_as_errors(mode, what, compiler_only=True):
        yield
    if _graphs() != before:
        raise DitprofError(f"--compile {mode}: {what} recompiled during {during} ({_graphs() - before} new "
                           f"graph(s)) although the warm-up had settled; TORCH_LOGS=recompiles says why")
