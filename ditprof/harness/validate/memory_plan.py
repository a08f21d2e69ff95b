"""Whether ``ditprof validate``'s N blocks stay resident on the device or are streamed from host memory, and the
one-line errors when even one block (or the host copies) cannot fit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ditprof.errors import DitprofError
from ditprof.harness.run.memory import fmt_bytes, parse_size


def host_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class MemoryPlan:
    mode: str  # "resident" / "streamed"
    budget_bytes: int | None
    budget_source: str
    block_bytes: int
    input_bytes: int
    activation_bytes: int
    one_block_need_bytes: int
    resident_need_bytes: int
    host_need_bytes: int
    note: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def plan_memory(spec, n: int, block_bytes: int, est: dict, nonblock_bytes: int = 0) -> MemoryPlan:
    act, inp = est["activation_bytes"], est["input_bytes"]
    one = block_bytes + inp + act
    resident = n * block_bytes + inp + act
    if spec.gpu_memory is not None:
        budget, budget_src = parse_size(spec.gpu_memory), f"--gpu-memory {spec.gpu_memory}"
        if spec.device.type != "cuda":
            budget_src += " (CPU: plans residency only, no allocator cap)"
    elif spec.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(spec.device)
        budget, budget_src = int(free), "free device memory (torch.cuda.mem_get_info)"
    else:
        budget, budget_src = host_available_bytes(), "available host memory (/proc/meminfo)"
    if budget is not None and one > budget:
        raise DitprofError(
            f"{budget_src.split(' (')[0]} ({fmt_bytes(budget)}) is too small to hold one block: it needs "
            f"{fmt_bytes(block_bytes)} of weights + ~{fmt_bytes(act + inp)} of activations and inputs "
            f"= ~{fmt_bytes(one)}"
        )
    if spec.stream is not None:
        mode = "streamed" if spec.stream else "resident"
    else:
        mode = "resident" if budget is None or resident <= budget else "streamed"
    host_need = n * block_bytes if mode == "streamed" or spec.device.type == "cpu" else 0
    if host_need:
        avail = host_available_bytes()
        if avail is not None and host_need > avail:
            raise DitprofError(
                f"{n} blocks need {fmt_bytes(host_need)} of host memory ({fmt_bytes(resident)} with activations), "
                f"{fmt_bytes(avail)} available; use fewer --blocks"
            )
    if mode == "resident":
        note = f"all {n} blocks resident on {spec.device.type}"
    else:
        note = (f"{n} blocks ({fmt_bytes(resident)} with activations) do not fit {fmt_bytes(budget)}: blocks are "
                f"kept in host memory and streamed into one working block on {spec.device.type}; "
                f"compute only is timed (copies left out)")
    return MemoryPlan(mode, budget, budget_src, block_bytes, inp, act, one, resident, host_need, note)
