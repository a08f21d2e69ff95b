"""``--attention-alone``: where a run's in-block attention time goes ("attention in context").

After a run's measured calls, the block runs ``iters`` more un-profiled forwards with its attention swap wrapped
(``AttentionSwap.wrapped``): a clock mark on each side of every attention call (CUDA events on CUDA, the host clock
on the CPU) gives each call's in-block time, and the first forward's calls keep the arguments each got at the
backend. Each captured call is then re-run alone ``iters`` times on those very tensors and, on CUDA, once more with
the block's largest linear run ``GEMM_CALLS_BEFORE`` times before each call (the state a GEMM leaves: clock, L2).
The SM clock (NVML through ``torch.cuda.clock_rate``; None without pynvml) is read after each phase. The section's
last field is ``context_verdict.verdict``'s line on what the numbers point to."""

from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import Any, Callable, Sequence

import torch

from ditprof.errors import DitprofError
from ditprof.harness.run.context_verdict import CPU_NOTE, NO_LINEAR_NOTE, verdict
from ditprof.harness.run.measure import swapped
from ditprof.harness.run.session import Clock, _band, _sync
from ditprof.harness.swaps.attention import AttentionSwap
from ditprof.harness.swaps.base import Swap

GEMM_CALLS_BEFORE = 4  # calls of the block's largest linear before each "after GEMMs" attention call
PHASES = ("in_block", "alone", "after_gemm")


@dataclasses.dataclass
class Captured:
    """One attention call of the block: the function the swap runs and the arguments it got."""

    fn: Callable
    args: tuple
    kwargs: dict

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    def shapes(self) -> dict:
        q, k = (self.args + (None, None))[:2]
        return {"q_shape": list(getattr(q, "shape", [])), "k_shape": list(getattr(k, "shape", []))}


class CallCapture:
    """Wraps attention functions: while a forward runs (``forward``), clock marks around each outermost call; the
    first forward's calls are kept as ``Captured``."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.calls: list[Captured] = []
        self.forwards: list[list[tuple[Any, Any]]] = []
        self._active = False
        self._depth = 0  # a backend calling another wrapped function counts once

    def wrap(self, fn: Callable) -> Callable:
        @functools.wraps(fn)  # keeps the signature: the dispatcher reads which mask arguments the backend takes
        def call(*args, **kwargs):
            if not self._active or self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            try:
                a = self.clock.mark()
                out = fn(*args, **kwargs)
                b = self.clock.mark()
            finally:
                self._depth -= 1
            self.forwards[-1].append((a, b))
            if len(self.forwards) == 1:
                self.calls.append(Captured(fn, args, kwargs))
            return out

        return call

    def forward(self, run: Callable[[], Any]) -> None:
        self.forwards.append([])
        self._active = True
        try:
            run()
        finally:
            self._active = False

    def in_block_ms(self) -> list[list[float]]:
        """Per attention call of the block (in call order), its time in each forward."""
        counts = sorted({len(f) for f in self.forwards})
        if counts == [0]:
            raise DitprofError("--attention-alone: the block made no attention call through the swapped backend")
        if len(counts) != 1:
            raise DitprofError(f"--attention-alone: the block's forwards made different numbers of attention "
                               f"calls ({counts}): cannot time them call by call")
        return [[self.clock.elapsed(*f[i]) for f in self.forwards] for i in range(counts[0])]


def sm_clock_mhz(device: torch.device) -> float | None:
    """The GPU's SM clock now (NVML's reading over its last sample period), or None: no GPU or no pynvml."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 -- pynvml missing or NVML unusable: the clock is simply not known
        return None


def largest_linear(block: torch.nn.Module) -> str | None:
    """The name of the block's largest ``nn.Linear`` (by weight elements), or None when it has none."""
    linears = [(n, m) for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)]
    return max(linears, key=lambda nm: nm[1].weight.numel())[0] if linears else None


def _gemm_load(block: torch.nn.Module, name: str, calls: Sequence[Captured]) -> tuple[Callable[[], Any], dict]:
    """The module at ``name`` as the run has it (a swapped FP8 linear too) on a (B, S, in_features) activation,
    B and S those of the largest captured q; and its description."""
    base = block.get_submodule(name)
    while not isinstance(base, torch.nn.Linear) and isinstance(getattr(base, "module", None), torch.nn.Module):
        base = base.module  # a wrapper (CompiledAlone) around the linear: its shapes are the linear's
    w = base.weight
    q = max((c.args[0] for c in calls), key=lambda t: t.shape[0] * t.shape[1])
    g = torch.Generator(device=w.device).manual_seed(0)
    x = torch.randn((q.shape[0], q.shape[1], w.shape[1]), generator=g, device=w.device, dtype=w.dtype)
    run = block.get_submodule(name)
    return (lambda: run(x)), {"module": name, "input_shape": list(x.shape), "out_features": int(w.shape[0]),
                              "calls_before": GEMM_CALLS_BEFORE}


def time_alone(call: Callable[[], Any], clock: Clock, device: torch.device, iters: int,
               before: Callable[[], Any] | None = None) -> list[float]:
    """``call`` alone ``iters`` times after one warm-up (with ``before`` run ``GEMM_CALLS_BEFORE`` times ahead of
    each call where given), ms each."""
    pairs = []
    for i in range(iters + 1):
        for _ in range(GEMM_CALLS_BEFORE if before is not None else 0):
            before()
        a = clock.mark()
        call()
        b = clock.mark()
        if i:  # the first is the warm-up
            pairs.append((a, b))
    _sync(device)
    return [clock.elapsed(a, b) for a, b in pairs]


def attention_context(block: torch.nn.Module, swaps: Sequence[Swap], call: Callable[[torch.nn.Module], Any], *,
                      device: torch.device, iters: int, on_phase: Callable[[str, int, int], None] | None = None,
                      after_gemms: bool | None = None) -> dict:
    """The report's ``attention_context`` section for ``call(block)`` with ``swaps`` in the block.
    ``after_gemms``: run the after-GEMMs phase (default: on CUDA only, where a GEMM leaves a GPU state)."""
    phase = on_phase or (lambda *a: None)
    clock = Clock(device)
    cap = CallCapture(clock)
    wrapped = [s.wrapped(cap.wrap) if isinstance(s, AttentionSwap) else s for s in swaps]
    after_gemms = device.type == "cuda" if after_gemms is None else after_gemms
    gemm_name = largest_linear(block) if after_gemms else None
    clocks: dict[str, float | None] = dict.fromkeys(PHASES)
    with torch.inference_mode(), swapped(block, wrapped):
        call(block)  # warm-up with the wrapped functions installed (mask checks, launch records)
        for i in range(iters):
            cap.forward(lambda: call(block))
            phase("attention in context: in block", i + 1, iters)
        _sync(device)
        in_block = cap.in_block_ms()
        clocks["in_block"] = sm_clock_mhz(device)
        alone = [time_alone(c, clock, device, iters) for c in cap.calls]
        clocks["alone"] = sm_clock_mhz(device)
        phase("attention in context: alone", iters, iters)
        after, gemm = None, None
        if gemm_name is not None:
            load, gemm = _gemm_load(block, gemm_name, cap.calls)
            after = [time_alone(c, clock, device, iters, before=load) for c in cap.calls]
            clocks["after_gemm"] = sm_clock_mhz(device)
            phase("attention in context: after GEMMs", iters, iters)
    return section(cap.calls, in_block, alone, after, clocks, gemm, device, iters)


def section(calls: Sequence[Captured], in_block: list[list[float]], alone: list[list[float]],
            after: list[list[float]] | None, clocks: dict, gemm: dict | None, device: torch.device,
            iters: int) -> dict:
    """The section from the samples (per call, per phase), the clocks and the GEMM load's description."""
    rows = []
    for i, c in enumerate(calls):
        rows.append({"index": i, **c.shapes(), "in_block_ms": _band(in_block[i]), "alone_ms": _band(alone[i]),
                     "after_gemm_ms": _band(after[i]) if after is not None else None})
    total = {p: sum(statistics.median(s[i]) for i in range(len(calls)))
             for p, s in (("in_block", in_block), ("alone", alone), ("after_gemm", after)) if s is not None}
    return {
        "timing_source": "cuda_events" if device.type == "cuda" else "host_clock",
        "iters": iters, "calls": rows,
        "in_block_ms": total["in_block"], "alone_ms": total["alone"], "after_gemm_ms": total.get("after_gemm"),
        "in_block_over_alone": total["in_block"] / total["alone"] if total["alone"] > 0 else None,
        "after_gemm_over_alone": (total["after_gemm"] / total["alone"]
                                  if "after_gemm" in total and total["alone"] > 0 else None),
        "sm_clock_mhz": clocks, "gemm": gemm,
        "verdict": verdict(total["in_block"], total["alone"], total.get("after_gemm"), clocks,
                           no_after=CPU_NOTE if device.type != "cuda" else NO_LINEAR_NOTE),
    }


__all__ = ["CallCapture", "Captured", "GEMM_CALLS_BEFORE", "attention_context", "largest_linear", "section",
           "sm_clock_mhz", "time_alone"]
