"""Split a profiled block's time into attention / gemm / norm / elementwise / other.

Works on a Chrome trace as exported by ``torch.profiler`` (``prof.export_chrome_trace``), so the same
code reads a live run, a saved ``*.trace.json.gz`` and a recorded test fixture.

The category of a piece of time comes from the op that *launched* it, not from its kernel name:

* CUDA: every device event (``kernel``, ``gpu_memcpy``, ``gpu_memset``) is tied to its launching runtime
  or driver call through ``args.correlation`` (kineto's link), and that call sits inside a stack of CPU ops
  and ``record_function`` ranges on its host thread. Fallback link: ``args["External id"]`` to the CPU op.
  Kernel-name rules only apply when neither link resolves.
* CPU: the self time of every aten op (its duration minus its child ops) on the host thread.

Only time inside a ``ditprof::block`` range counts (one range per block call). Anything inside a
``ditprof::attention`` range is attention, whatever its name: the harness puts that range around the
attention call of every backend, baseline included, so an unknown kernel (CuTe DSL, FA4, cuDNN) is still
attention. Communication comes first, even inside the attention range (the sequence-parallel all-to-alls
run inside the attention call): collectives (``c10d::``, ``nccl:``, ``gloo:`` ops, NCCL kernels) and the
``ditprof::all_to_all`` ranges the Ulysses wrapper puts around its regroups (layout copies included); on
CPU the self time of that range (the wait for the peers, which gloo spends on its own thread) counts too.
Otherwise the first matching rule wins: gemm, then norm, then elementwise, else other.

Compiled blocks (``--compile``; an event whose host stack holds a ``Torch-Compiled Region`` / ``## Call
CompiledFxGraph`` range) get two more rules, because dynamo drops ``record_function`` ranges inside the compiled
graph and inductor's kernels are launched by no aten op:

* attention by op name: torch's SDPA ops (``aten::_scaled_dot_product_*``), ``ditprof::fp8_attention`` and the
  harness's ``ditprof_compile::opaque_attention`` reach the compiled graph as one op each; what runs inside is
  attention.
* an inductor kernel (``triton_poi_fused_add_mul_0``, ``triton_red_/per_/tem_...``, CPU ``cpp_fused_...``,
  which the profiler sees as the range around its launch) gets the category of the aten ops it was generated from
  (inductor names it after them, ``compiled_kernel_category``): one category, that one; several, ``fused``.
  Extern kernels (cuBLAS through ``aten::mm``/``addmm``) keep their aten op: gemm.

The split of a compiled block always has a ``fused`` key; eager splits never do. On the CPU, the compiled
runtime's own host time (guards, wrappers) is left out, as eager's Python time is.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ditprof.harness.trace.inductor_kernels import (
    COMPILED_REGION_PREFIXES,
    COMPILED_RUNTIME_PREFIXES,
    FUSED,
    INDUCTOR_KERNEL,
    compiled_kernel_category,
    is_attention_op,
    is_compiled_stack,
)
from ditprof.harness.trace.op_tables import ELEMENTWISE_OPS, GEMM_OPS, NORM_OPS
from ditprof.harness.trace.ranges import ATTENTION_RANGE, BLOCK_RANGE, COMM_RANGE, NORM_RANGE_PREFIX  # noqa: F401

CATEGORIES = ("attention", "gemm", "norm", "elementwise", "other")  # every split has these keys
COMMUNICATION = "communication"  # a split has this key only when its trace holds communication (--sp runs)
ALL_CATEGORIES = ("attention", COMMUNICATION, "gemm", "norm", "elementwise", "other")
# every category a report can hold, in the order tables and plots show them
# (FUSED: compiled blocks only, an inductor kernel generated from ops of several categories)
REPORTED_CATEGORIES = ("attention", COMMUNICATION, "gemm", "norm", "elementwise", FUSED, "other")
COMM_PREFIXES = ("c10d::", "nccl:", "gloo:")

# Host-side events that nest on a thread (record_function ranges, ops, launch calls).
HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function", "runtime"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}

# Fallback rules on device-kernel names (only when the launching op cannot be found).
KERNEL_NAME_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"^nccl|nccl(Dev)?Kernel|gloo", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|_fwd_kernel|softmax_rescale", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cublas|cutlass.*(mma|gemm)|wgmma|hmma|matmul|xmma|s\d+gemm|splitk", re.I)),
    ("norm", re.compile(r"layer_?norm|rms_?norm|group_?norm|batch_?norm|welford", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|triton_poi|copy|cast|fill", re.I)),
)


def is_communication(name: str) -> bool:
    return name == COMM_RANGE or name.startswith(COMM_RANGE + "/") or name.startswith(COMM_PREFIXES)


def category_for_stack(names: Iterable[str]) -> str:
    """Category from the names of the enclosing host ranges/ops, outermost first."""
    names = list(names)
    if any(is_communication(n) for n in names):
        return "communication"
    if any(n == ATTENTION_RANGE or n.startswith(ATTENTION_RANGE + "/") for n in names):
        return "attention"
    if is_compiled_stack(names):
        cat = _compiled_category(names)
        if cat is not None:
            return cat
    if any(n in GEMM_OPS for n in names):
        return "gemm"
    if any(n in NORM_OPS or n.startswith(NORM_RANGE_PREFIX) for n in names):
        return "norm"
    aten = [n for n in names if n.startswith("aten::")]
    if aten:
        inner = aten[-1][len("aten::"):]
        if inner in ELEMENTWISE_OPS:
            return "elementwise"
        return "other"
    return "other"


def _compiled_category(names: list[str]) -> str | None:
    """Inside a compiled graph: attention ops by name, an inductor kernel by the ops it was generated from (the
    innermost such range launched the kernel); None for the eager rules (extern kernels: their aten op)."""
    if any(is_attention_op(n) for n in names):
        return "attention"
    for n in reversed(names):
        if INDUCTOR_KERNEL.match(n):
            return compiled_kernel_category(n)
    return None


def category_for_kernel_name(name: str) -> str:
    if INDUCTOR_KERNEL.match(name):
        return compiled_kernel_category(name)
    for cat, rule in KERNEL_NAME_RULES:
        if rule.search(name):
            return cat
    return "other"


@dataclass
class _Node:
    name: str
    cat: str
    ts: float
    end: float
    pid: Any
    tid: Any
    args: dict
    parent: int = -1  # index into the node list
    child_time: float = 0.0


@dataclass
class Split:
    """Per-iteration times (ms) by category, averaged over the block ranges found in the trace."""

    mode: str  # "cuda" (device kernel time) or "cpu" (op self time)
    iterations: int
    split_ms: dict[str, float]
    total_ms: float
    attention_share: float
    block_range_ms: list[float] = field(default_factory=list)  # per iteration, wall span of the block
    resolved: dict[str, int] = field(default_factory=dict)  # how device events were linked
    top_ops: list[dict] = field(default_factory=list)  # heaviest launching ops
    iterations_used: int = 0  # calls averaged (slow outliers left out)
    compiled: bool = False  # the block ran compiled (torch.compile): the split has a ``fused`` key

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "iterations": self.iterations,
            "iterations_used": self.iterations_used,
            "split_ms": dict(self.split_ms),
            "total_ms": self.total_ms,
            "attention_share": self.attention_share,
            "block_range_ms": list(self.block_range_ms),
            "resolved": dict(self.resolved),
            "top_ops": list(self.top_ops),
            "compiled": self.compiled,
        }


def load_trace(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


class TraceIndex:
    """Host-thread nesting of a Chrome trace plus the kineto correlation links."""

    def __init__(self, trace: dict):
        events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
        self.nodes: list[_Node] = []
        self.device: list[dict] = []
        self.gpu_ranges: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for ev in events:
            if ev.get("ph") != "X":
                continue
            cat = ev.get("cat", "")
            if cat in HOST_CATS:
                ts = float(ev["ts"])
                self.nodes.append(_Node(ev.get("name", ""), cat, ts, ts + float(ev.get("dur", 0.0)),
                                        ev.get("pid"), ev.get("tid"), ev.get("args") or {}))
            elif cat in DEVICE_CATS:
                self.device.append(ev)
            elif cat == "gpu_user_annotation":
                ts = float(ev["ts"])
                self.gpu_ranges[ev.get("name", "")].append((ts, ts + float(ev.get("dur", 0.0))))
        self._nest()
        self.by_correlation: dict[Any, int] = {}
        self.by_external_id: dict[Any, int] = {}
        for i, n in enumerate(self.nodes):
            if n.cat in LAUNCH_CATS and "correlation" in n.args:
                self.by_correlation[n.args["correlation"]] = i
            elif n.cat in ("cpu_op", "user_annotation") and "External id" in n.args:
                # innermost wins: nodes are visited parent-first, so later (deeper) ones overwrite
                self.by_external_id[n.args["External id"]] = i

    def _nest(self) -> None:
        eps = 0.01  # µs of rounding slack in exported timestamps
        threads: dict[tuple, list[int]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            threads[(n.pid, n.tid)].append(i)
        order: list[int] = []
        for idx in threads.values():
            idx.sort(key=lambda i: (self.nodes[i].ts, -(self.nodes[i].end - self.nodes[i].ts)))
            stack: list[int] = []
            for i in idx:
                n = self.nodes[i]
                while stack and self.nodes[stack[-1]].end + eps < n.end:
                    stack.pop()
                if stack and self.nodes[stack[-1]].ts <= n.ts + eps:
                    n.parent = stack[-1]
                stack.append(i)
                order.append(i)
        # re-number parent-first so that later passes can rely on it
        remap = {old: new for new, old in enumerate(order)}
        nodes = [self.nodes[i] for i in order]
        for n in nodes:
            n.parent = remap[n.parent] if n.parent >= 0 else -1
        self.nodes = nodes
        for n in self.nodes:
            if n.parent >= 0 and n.cat in ("cpu_op", "user_annotation"):
                self.nodes[n.parent].child_time += n.end - n.ts

    def ancestors(self, i: int) -> list[int]:
        """Indices from the outermost enclosing node down to ``i`` itself."""
        chain = []
        while i >= 0:
            chain.append(i)
            i = self.nodes[i].parent
        return chain[::-1]

    def names(self, i: int) -> list[str]:
        return [self.nodes[j].name for j in self.ancestors(i)]

    def block_of(self, i: int) -> int:
        """Index of the enclosing ``ditprof::block`` range, or -1."""
        for j in self.ancestors(i):
            if self.nodes[j].name == BLOCK_RANGE:
                return j
        return -1

    def launcher(self, ev: dict) -> tuple[int, str]:
        args = ev.get("args") or {}
        corr = args.get("correlation")
        if corr is not None and corr in self.by_correlation:
            return self.by_correlation[corr], "correlation"
        ext = args.get("External id")
        if ext is not None and ext in self.by_external_id:
            return self.by_external_id[ext], "external_id"
        return -1, "kernel_name"

    def block_ranges(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.name == BLOCK_RANGE]


OUTLIER_FACTOR = 1.5  # a block call slower than this x the median call is left out of the split


def _finish(mode: str, blocks: list[int], per_block: dict[int, dict[str, float]],
            per_block_op: dict[int, dict[tuple[str, str], float]], spans_us: dict[int, float],
            resolved: dict[str, int], compiled: bool = False) -> Split:
    """Average the per-call splits, leaving out calls much slower than the median (a busy host, a
    clock hiccup): one 10x outlier among five calls would otherwise dominate the mean."""
    span_list = [spans_us[b] for b in blocks if b in spans_us]
    med = statistics.median(span_list) if span_list else 0.0
    used = [b for b in blocks if b in per_block and (not med or spans_us.get(b, med) <= OUTLIER_FACTOR * med)]
    if not used:
        used = [b for b in blocks if b in per_block]
    n = max(len(used), 1)
    cats = ALL_CATEGORIES if any(per_block[b].get(COMMUNICATION) for b in used) else CATEGORIES
    if compiled:
        cats = tuple(c for c in REPORTED_CATEGORIES if c in cats or c == FUSED)
    split_ms = {c: sum(per_block[b].get(c, 0.0) for b in used) / 1000.0 / n for c in cats}
    total = sum(split_ms.values())
    share = split_ms["attention"] / total if total > 0 else 0.0
    ops: dict[tuple[str, str], float] = defaultdict(float)
    for b in used:
        for key, us in per_block_op.get(b, {}).items():
            ops[key] += us
    every = [{"op": op, "category": cat, "ms": us / 1000.0 / n} for (op, cat), us in
             sorted(ops.items(), key=lambda kv: -kv[1])]
    out = Split(mode, len(blocks), split_ms, total, share, [s / 1000.0 for s in span_list], dict(resolved), every[:12])
    out.iterations_used = len(used)
    out.compiled = compiled
    out.op_ms = every  # every launching op (ditprof diff); the report keeps the top 12
    return out


class _Tally:
    """Per block call: microseconds per category and per (op, category); how each event found its launcher."""

    def __init__(self) -> None:
        self.per_block: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.per_block_op: dict[int, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
        self.resolved: dict[str, int] = defaultdict(int)

    def add(self, b: int, cat: str, op: str, us: float) -> None:
        self.per_block[b][cat] += us
        self.per_block_op[b][(op, cat)] += us


def _launched_op(index: TraceIndex, ev: dict, i: int) -> tuple[str, str]:
    """(category, op) of a device event launched by host node ``i``."""
    names = index.names(i)
    cat = category_for_stack(names)
    if cat == "other" and not any(n.startswith("aten::") for n in names):
        cat = category_for_kernel_name(ev.get("name", ""))
    ops = [n for n in names if n.startswith("aten::")]
    return cat, ATTENTION_RANGE if cat == "attention" else (ops[0] if ops else ev.get("name", "?"))


def _unlinked_category(index: TraceIndex, ev: dict, ts: float) -> str:
    """Category of a device event with no host link: the GPU-side attention range, else its kernel name."""
    if any(a <= ts <= e for a, e in index.gpu_ranges.get(ATTENTION_RANGE, ())):
        return "attention"
    return category_for_kernel_name(ev.get("name", ""))


def _tally_cuda(index: TraceIndex, blocks: list[int], tally: _Tally) -> dict[int, float]:
    """Device events into ``tally`` per block call; the device span (us) of each call."""
    extent: dict[int, list[float]] = {}
    gpu_blocks = sorted(index.gpu_ranges.get(BLOCK_RANGE, ()))
    host_for_gpu = dict(enumerate(blocks)) if len(gpu_blocks) == len(blocks) else {}
    orphans: list[tuple[str, str, float]] = []
    for ev in index.device:
        i, how = index.launcher(ev)
        dur = float(ev.get("dur", 0.0))
        ts = float(ev["ts"])
        if i >= 0:
            b = index.block_of(i)
            if b < 0:
                continue  # launched outside the measured block
            cat, op = _launched_op(index, ev, i)
        else:
            # no host link: fall back to the GPU-side ranges (gpu_user_annotation) and kernel names
            k = next((j for j, (a, e) in enumerate(gpu_blocks) if a <= ts <= e), None)
            if k is None:
                continue
            cat = _unlinked_category(index, ev, ts)
            op = ev.get("name", "?")
            b = host_for_gpu.get(k, -2)
            if b == -2:
                tally.resolved[how] += 1
                orphans.append((cat, op, dur))
                continue
        tally.resolved[how] += 1
        tally.add(b, cat, op, dur)
        if how != "kernel_name":
            x = extent.setdefault(b, [ts, ts + dur])
            x[0] = min(x[0], ts)
            x[1] = max(x[1], ts + dur)
    for cat, op, dur in orphans:  # GPU block ranges not matched to host ranges: spread evenly
        for b in blocks:
            tally.add(b, cat, op, dur / max(len(blocks), 1))
    return {b: x[1] - x[0] for b, x in extent.items()}


def _tally_cpu(index: TraceIndex, blocks: list[int], tally: _Tally) -> dict[int, float]:
    """Host op self time (and the waits inside the all-to-all ranges) into ``tally``; each call's span (us)."""
    for i, n in enumerate(index.nodes):
        if n.cat != "cpu_op" or n.name.startswith(COMPILED_RUNTIME_PREFIXES):
            continue  # the compiled runtime's guards and wrappers: host overhead, as eager's Python time
        b = index.block_of(i)
        if b < 0:
            continue
        self_us = max(n.end - n.ts - n.child_time, 0.0)
        cat = category_for_stack(index.names(i))
        tally.add(b, cat, ATTENTION_RANGE if cat == "attention" else n.name, self_us)
        tally.resolved["cpu_op"] += 1
    for i, n in enumerate(index.nodes):  # waiting inside the all-to-all ranges (gloo works on its own thread)
        if n.cat != "user_annotation" or not (n.name == COMM_RANGE or n.name.startswith(COMM_RANGE + "/")):
            continue
        b = index.block_of(i)
        self_us = n.end - n.ts - n.child_time
        if b >= 0 and self_us > 0:
            tally.add(b, "communication", f"{n.name} (wait)", self_us)
    return {b: index.nodes[b].end - index.nodes[b].ts for b in blocks}


def split_trace(trace: dict, mode: str | None = None) -> Split:
    """Split the ``ditprof::block`` ranges of a trace into categories (per-call average, ms).

    ``mode``: "cuda" uses device events, "cpu" uses host op self time; None picks "cuda" when the trace
    has device events.
    """
    index = TraceIndex(trace)
    if mode is None:
        mode = "cuda" if index.device else "cpu"
    blocks = index.block_ranges()
    compiled = any(n.name.startswith(COMPILED_REGION_PREFIXES) and index.block_of(i) >= 0
                   for i, n in enumerate(index.nodes))
    tally = _Tally()
    if mode == "cuda":
        spans = _tally_cuda(index, blocks, tally)
    else:
        spans = _tally_cpu(index, blocks, tally)
        mode = "cpu"
    return _finish(mode, blocks, tally.per_block, tally.per_block_op, spans, tally.resolved, compiled)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0
