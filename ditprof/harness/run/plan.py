"""What a run will cost, printed before it starts: rows, FLOPs, bytes, the activation peak traced on the meta
device, and a time estimate for this device from a quick measured matmul rate. A run that would not fit the
memory stops with one line before anything is loaded; one that would take longer than ``--time-limit`` asks for
``--yes`` or a smaller size."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from ditprof.errors import DitprofError
from ditprof.harness.run.memory import fmt_bytes, parse_size
from ditprof.progress import human_duration

DEFAULT_TIME_LIMIT_MIN = 15.0
CPU_CHECKPOINT_TOKENS = 1024  # a checkpoint on CPU with no size: a small grid, not the pipeline's
PROFILER_FACTOR = 1.5  # a profiled call costs about this much more than a timed one
OTHER_OPS_FACTOR = 1.3  # norms, elementwise and copies on top of the matmul and attention time


@dataclass
class RunPlan:
    tokens: int
    text_tokens: int
    grid: str
    attention_flops: int
    gemm_flops: int
    block_bytes: int
    input_module_bytes: int
    input_bytes: int
    activation_bytes: int
    peak_bytes: int
    budget_bytes: int | None
    budget_source: str
    matmul_flops_per_s: float
    attention_flops_per_s: float
    block_ms_estimate: float
    calls: int
    run_s_estimate: float
    note: str = ""
    swap_name: str | None = None
    swap_attention_flops_per_s: float | None = None  # a numerics emulation's own rate (far below SDPA's)
    copy_bytes_per_s: float | None = None  # measured device copy rate (read + write): report.limits' fallback

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        tf = (self.attention_flops + self.gemm_flops) / 1e12
        return [
            f"plan: {self.tokens} rows ({self.grid})" + (f" + {self.text_tokens} text" if self.text_tokens else "")
            + f"; {tf:.3g} TFLOP a call (attention {self.attention_flops / 1e12:.3g}, GEMM "
              f"{self.gemm_flops / 1e12:.3g})",
            f"plan: memory ~{fmt_bytes(self.peak_bytes)} (block {fmt_bytes(self.block_bytes)}, input modules "
            f"{fmt_bytes(self.input_module_bytes)}, inputs {fmt_bytes(self.input_bytes)}, activations "
            f"{fmt_bytes(self.activation_bytes)})"
            + (f" of {fmt_bytes(self.budget_bytes)} ({self.budget_source})" if self.budget_bytes else ""),
            f"plan: ~{human_duration(self.block_ms_estimate / 1e3)} a block call (measured here: matmul "
            f"{self.matmul_flops_per_s / 1e12:.3g}, SDPA {self.attention_flops_per_s / 1e12:.3g}"
            + (f", {self.swap_name} {self.swap_attention_flops_per_s / 1e12:.3g}"
               if self.swap_attention_flops_per_s else "")
            + " TFLOP/s" + (f", copy {self.copy_bytes_per_s / 1e9:.3g} GB/s" if self.copy_bytes_per_s else "")
            + f"), {self.calls} calls: ~{human_duration(self.run_s_estimate)}",
        ] + ([f"plan: {self.note}"] if self.note else [])


def _best_time(fn, device: torch.device, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measured_rates(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """(matmul, attention) FLOP/s in the run's dtype on ``device``: a square matmul and a torch SDPA call,
    best of a few (~0.2 s on a CPU)."""
    import torch.nn.functional as F

    n, s = (4096, 4096) if device.type == "cuda" else (512, 1024)
    a = torch.randn(n, n, device=device).to(dtype)
    mm = 2 * n ** 3 / _best_time(lambda: a @ a, device, 4)
    q = torch.randn(1, 8, s, 128, device=device).to(dtype)
    attn = 4 * 8 * s * s * 128 / _best_time(lambda: F.scaled_dot_product_attention(q, q, q), device, 3)
    return mm, attn


def measured_copy_rate(device: torch.device) -> float:
    """Bytes/s a device-to-device copy moves (read + write), best of a few: the memory rate a run's norm and
    elementwise ops are compared with where the device's datasheet peak is not known (CPU: ~10 ms)."""
    n = (32 if device.type == "cuda" else 4) * 2 ** 20  # float32 elements: 128 MiB / 16 MiB, well past the caches
    a = torch.empty(n, device=device).fill_(1.0)
    b = torch.empty_like(a)
    reps = 8 if device.type == "cuda" else 1  # a few copies per timing: one H100 copy is ~80 us

    def copies():
        for _ in range(reps):
            b.copy_(a)

    rate = 2 * a.numel() * a.element_size() * reps / _best_time(copies, device, 4)
    del a, b
    return rate


def emulated_attention_rate(name: str | None, device: torch.device, dtype: torch.dtype) -> float | None:
    """FLOP/s of the swap's attention where it is a numerics emulation (several times slower than SDPA, so an
    estimate from SDPA's rate would be far too low); None for a real kernel (timed as SDPA's rate)."""
    from ditprof.kernels import registry

    if not name or not registry.is_numerics_only(name):
        return None
    fn = registry.get(name).fn
    s = 1024  # long enough that the emulation's per-call set-up does not dominate
    q = torch.randn(1, s, 8, 128, device=device).to(dtype)
    fn(q, q, q)  # first call: one-time set-up out of the timing
    return 4 * 8 * s * s * 128 / _best_time(lambda: fn(q, q, q), device, 2)


def _budget(spec) -> tuple[int | None, str]:
    from ditprof.harness.validate.memory_plan import host_available_bytes

    if spec.gpu_memory is not None:
        return parse_size(spec.gpu_memory), f"--gpu-memory {spec.gpu_memory}"
    if spec.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(spec.device)
        return int(free), "free device memory"
    return host_available_bytes(), "available host memory"


def make_plan(spec, *, rates: tuple[float, float] | None = None) -> RunPlan:
    """The plan of ``spec`` (a ``runner.RunSpec``), from the family's config alone: nothing is loaded."""
    from ditprof.harness.run.activation import estimate_forward_bytes
    from ditprof.model_blocks.opened import open_model
    from ditprof.model_blocks.presets import block_size
    from ditprof.model_blocks.source import resolve_as

    src = open_model(resolve_as(spec.source, spec.source_kind), spec.kind)
    est = estimate_forward_bytes(src.family, src.config, src.kind, preset=src.preset, dtype=spec.dtype,
                                 tokens=spec.tokens, height=spec.height, width=spec.width, frames=spec.frames,
                                 batch=getattr(spec, "batch", 1), text_tokens=getattr(spec, "text_tokens", None))
    _, block_bytes = block_size(src.family, src.config, src.kind, spec.dtype)
    peak = block_bytes + est["input_module_bytes"] + est["input_bytes"] + est["activation_bytes"]
    budget, budget_src = _budget(spec)
    mm, attn = rates or measured_rates(spec.device, spec.dtype)
    swap_attn = None if rates else emulated_attention_rate(spec.swap, spec.device, spec.dtype)
    copy = None if rates else measured_copy_rate(spec.device)
    block_s = (est["gemm_flops"] / mm + est["attention_flops"] / attn) * OTHER_OPS_FACTOR
    swap_block_s = block_s if swap_attn is None else (
        (est["gemm_flops"] / mm + est["attention_flops"] / swap_attn) * OTHER_OPS_FACTOR)
    per_backend = max(spec.warmup, 1) + spec.iters + (spec.iters + 1) * PROFILER_FACTOR
    if spec.device.type == "cuda" and spec.cuda_graph:
        per_backend += spec.iters + 1
    if getattr(spec, "attention_alone", False):
        # run.attention_context: iters + 1 forwards, then the alone and after-GEMMs phases, counted as iters + 1
        # block calls (each phase re-runs the attention calls alone, plus the GEMM loads: at most a block call)
        per_backend += 2 * (spec.iters + 1)
    # swapped measurements: one, or one per swap added (--each-swap: the attention, then the linears too)
    swapped_runs = (2 if getattr(spec, "each_swap", False) else 1) if spec.swap else 0
    calls = round(per_backend * (1 + swapped_runs))
    run_s = block_s * per_backend + swap_block_s * per_backend * swapped_runs
    if spec.swap:  # the rounds in turns (runner._interleaved): per round and backend one untimed call + the timed ones
        # (spec.interleave is 0 where they do not run)
        from ditprof.harness.run.session import INTERLEAVED_CALLS_PER_ROUND

        turns = getattr(spec, "interleave", 0) * (1 + INTERLEAVED_CALLS_PER_ROUND)
        calls += 2 * turns
        run_s += (block_s + swap_block_s) * turns
    return RunPlan(tokens=est["tokens"], text_tokens=est["text_tokens"], grid=est["grid"],
                   attention_flops=est["attention_flops"], gemm_flops=est["gemm_flops"], block_bytes=block_bytes,
                   input_module_bytes=est["input_module_bytes"], input_bytes=est["input_bytes"],
                   activation_bytes=est["activation_bytes"], peak_bytes=peak, budget_bytes=budget,
                   budget_source=budget_src, matmul_flops_per_s=mm, attention_flops_per_s=attn, block_ms_estimate=block_s * 1e3,
                   calls=calls, run_s_estimate=run_s, swap_name=spec.swap if swap_attn else None,
                   swap_attention_flops_per_s=swap_attn, copy_bytes_per_s=copy)


def check_plan(plan: RunPlan, *, time_limit_min: float, yes: bool) -> None:
    """One line when the run would not fit or would take longer than the limit (without ``--yes``)."""
    if plan.budget_bytes is not None and plan.peak_bytes > plan.budget_bytes:
        raise DitprofError(
            f"this run needs ~{fmt_bytes(plan.peak_bytes)} (block {fmt_bytes(plan.block_bytes)} + activations "
            f"{fmt_bytes(plan.activation_bytes)} + inputs {fmt_bytes(plan.input_bytes + plan.input_module_bytes)})"
            f", more than the {fmt_bytes(plan.budget_bytes)} of {plan.budget_source}; give a smaller size")
    if not yes and plan.run_s_estimate > time_limit_min * 60:
        raise DitprofError(
            f"this run would take ~{human_duration(plan.run_s_estimate)} ({plan.calls} block calls of "
            f"~{human_duration(plan.block_ms_estimate / 1e3)}, {plan.tokens} rows), over the {time_limit_min:g} min limit; "
            f"pass --yes to run it anyway, or a smaller size (--tokens / --height --width --frames)")
