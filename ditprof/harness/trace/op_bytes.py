"""Bytes a block call's norm and elementwise ops read and write, from the shapes and dtypes ``torch.profiler``
records (``record_shapes=True``: each CPU op event carries ``Input Dims`` / ``Input type`` / ``Input Strides``).

The profiler records an op's inputs, not its output, so the output is estimated from them. Which ops count:
each aten op inside a ``ditprof::block`` range whose category (``categories.category_for_stack``, the rule the
time split uses) is norm or elementwise, unless an enclosing op of the same category already counted it (a
``layer_norm`` counts, its ``native_layer_norm`` does not; an ``add`` counts, the scalar ``to`` inside it does
not). Views and allocations move nothing; ``to`` / ``contiguous`` / ``clone`` / ``reshape`` / ``repeat`` count
through the ``copy_`` they run (none when they return their input). An op's bytes:

* reads: every tensor input, counting the elements its strides reach (a broadcast input with stride 0 along a
  dimension is read once along it);
* writes: in-place ops (``add_``) their first input; ``cat`` / ``stack`` the sum of their inputs; comparisons
  one byte per element; reductions (``mean``, ``sum``...) nothing (their output is the reduced, small one);
  every other op the broadcast of its inputs' shapes in the widest input dtype. ``copy_``, ``fill_`` and
  ``zero_`` write their first input without reading it.

An estimate of the bytes the ops must move (cache reuse and a kernel's own extra passes are not in it), so a rate
from it is a lower bound on the memory traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ditprof.harness.trace.categories import TraceIndex, category_for_stack
from ditprof.harness.trace.inductor_kernels import COMPILED_REGION_PREFIXES

BYTE_CATEGORIES = ("norm", "elementwise")

# element sizes of the profiler's "Input type" strings (c10 type names as the trace writes them)
ITEMSIZE = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}
# ops that move no data themselves: views, metadata, allocations
NO_DATA_OPS = {
    "view", "_unsafe_view", "as_strided", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze", "select",
    "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "alias", "detach", "unfold", "view_as",
    "view_as_real", "view_as_complex", "resolve_conj", "resolve_neg", "lift_fresh", "result_type", "empty",
    "empty_like", "empty_strided", "resize_", "_reshape_alias", "movedim", "swapaxes", "numpy_T", "expand_as",
}
# ops that count through the copies they run (a no-op when they return their input)
COPY_WRAPPERS = {"to", "_to_copy", "type_as", "contiguous", "clone", "reshape", "flatten", "unflatten", "repeat",
                 "repeat_interleave"}
WRITE_ONLY_FIRST = {"copy_", "fill_", "zero_"}
REDUCTIONS = {"mean", "sum", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "norm",
              "linalg_vector_norm", "prod", "any", "all", "argmax", "argmin", "logsumexp"}
COMPARISONS = {"eq", "ne", "lt", "gt", "le", "ge", "logical_not", "isnan", "isinf", "isfinite"}
CONCATS = {"cat", "stack"}


@dataclass
class CategoryBytes:
    """Bytes per block call by category (None: not known, ``note`` says why); ``unsized``: counted ops with an
    input whose dtype the table above lacks (left out of the sum)."""

    bytes: dict[str, float] | None
    note: str = ""
    ops: dict[str, int] = field(default_factory=dict)
    unsized: int = 0

    def to_dict(self) -> dict:
        return {"bytes": self.bytes, "note": self.note, "ops": dict(self.ops), "unsized_ops": self.unsized}


def _tensors(args: dict, list_itemsize: int) -> list[tuple[list[int], list[int] | None, int | None]] | None:
    """(dims, strides, itemsize) of each tensor input; a tensor list's members get ``list_itemsize`` (the trace
    names no dtype for them); None without recorded shapes."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if dims is None or types is None:
        return None
    strides = args.get("Input Strides") or [None] * len(dims)
    out = []
    for d, t, s in zip(dims, types, strides):
        if t == "TensorList":
            out += [(m, ms, list_itemsize) for m, ms in zip(d, s if isinstance(s, list) else [None] * len(d))]
        elif isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append((d, s if isinstance(s, list) and len(s) == len(d) else None, ITEMSIZE.get(t)))
    return out


def _reached(dims: list[int], strides: list[int] | None) -> int:
    """Elements a tensor's strides reach (stride-0 dimensions once)."""
    if strides is None:
        return math.prod(dims)
    return math.prod(d for d, s in zip(dims, strides) if s != 0)


def _broadcast(shapes: list[list[int]]) -> int | None:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(1, ndim + 1):
        sizes = {s[-i] for s in shapes if len(s) >= i} - {1}
        if len(sizes) > 1:
            return None  # not a broadcast (index ops...): the caller takes the largest input
        out.append(sizes.pop() if sizes else 1)
    return math.prod(out)


def op_bytes(name: str, tensors: list[tuple[list[int], list[int] | None, int | None]]) -> int | None:
    """Reads + writes of one op (``name`` without ``aten::``), as the module docstring says; None when an input's
    dtype is unknown."""
    if any(size is None for _, _, size in tensors):
        return None
    reads = [_reached(d, s) * size for d, s, size in tensors]
    if name in WRITE_ONLY_FIRST:
        return sum(reads[1:]) + math.prod(tensors[0][0]) * tensors[0][2]
    if name.endswith("_"):
        return sum(reads) + math.prod(tensors[0][0]) * tensors[0][2]
    if name in CONCATS:
        return sum(reads) + sum(math.prod(d) * size for d, _, size in tensors)
    if name in REDUCTIONS:
        return sum(reads)
    shaped = [t for t in tensors if len(t[0]) > 0]  # 0-dim tensors take no part in the output's shape or dtype
    if not shaped:
        return sum(reads)
    numel = _broadcast([d for d, _, _ in shaped])
    if numel is None:
        numel = max(math.prod(d) for d, _, _ in shaped)
    itemsize = 1 if name in COMPARISONS else max(size for _, _, size in shaped)
    return sum(reads) + numel * itemsize


def _is_counted_op(name: str) -> bool:
    if not name.startswith("aten::"):
        return False
    short = name[len("aten::"):]
    return short not in NO_DATA_OPS and short not in COPY_WRAPPERS


def category_bytes(trace: dict, list_itemsize: int = 2) -> CategoryBytes:
    """Norm and elementwise bytes per ``ditprof::block`` call of a trace (the mean over its calls).
    ``list_itemsize``: the element size taken for tensor-list inputs (``cat``), the run's dtype."""
    index = TraceIndex(trace)
    blocks = index.block_ranges()
    if not blocks:
        return CategoryBytes(None, "no ditprof::block range in the trace")
    inside = [(i, n) for i, n in enumerate(index.nodes) if n.cat == "cpu_op" and index.block_of(i) >= 0]
    if any(n.name.startswith(COMPILED_REGION_PREFIXES) and index.block_of(i) >= 0
           for i, n in enumerate(index.nodes)):
        return CategoryBytes(None, "compiled block: inductor's kernels carry no shapes")
    if not any("Input Dims" in n.args for _, n in inside):
        return CategoryBytes(None, "the trace has no shapes (recorded without record_shapes)")
    total = {c: 0.0 for c in BYTE_CATEGORIES}
    ops = {c: 0 for c in BYTE_CATEGORIES}
    unsized = 0
    counted_cat: dict[int, str] = {}  # node -> category of the counted op it is (or lies inside)
    for i, n in inside:  # parent-first order (TraceIndex), so an enclosing op is seen before its children
        chain = index.ancestors(i)
        names = [index.nodes[j].name for j in chain]
        if not _is_counted_op(n.name):
            continue
        cat = category_for_stack(names)
        if cat not in BYTE_CATEGORIES or any(counted_cat.get(j) == cat for j in chain[:-1]):
            continue
        tensors = _tensors(n.args, list_itemsize)
        if not tensors:
            continue
        counted_cat[i] = cat
        b = op_bytes(n.name[len("aten::"):], tensors)
        if b is None:
            unsized += 1
            continue
        total[cat] += b
        ops[cat] += 1
    calls = len(blocks)
    return CategoryBytes({c: v / calls for c, v in total.items()}, "", {c: round(v / calls) for c, v in ops.items()},
                         round(unsized / calls))
