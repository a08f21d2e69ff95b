"""Compiled blocks in a trace: the host ranges that mark them, the ops that stay attention, and the category of an
inductor-generated kernel read from its name.

Inductor names a kernel after the aten ops its nodes were generated from (``triton.descriptive_names =
"original_aten"``, the default): ``triton_<kind>_fused_<op>_<op>..._<n>`` on GPUs (kind ``poi`` pointwise,
``red``/``per`` reductions, ``tem`` a template such as a max-autotune GEMM), ``cpp_fused_<ops>_<n>`` on CPUs
(``graph_<g>_cpp_fused_...``: the profiler range ``cpp.enable_kernel_profile`` puts around it). The ops are
sorted, deduplicated and joined by ``_``, and aten names hold ``_`` themselves (``native_layer_norm``,
``_to_copy``), so the list is read greedily against the known op names; an unknown piece is an unknown op.

The rule (``compiled_kernel_category``): each op has a category (``op_tables``, as in eager); layout, cast and
indexing ops (views, ``_to_copy``, ``cat``, ``slice``...) are the kernel's loads and stores and decide nothing
next to a compute op (alone they make an elementwise copy kernel, as in eager); a decomposed norm
(``x * rsqrt(mean(x ** 2) + eps)``, diffusers' ``RMSNorm``: ``mean`` and ``rsqrt`` in one kernel) owns the
``pow``/``add``/``mul`` it is made of. One category left: that one. Several: ``fused`` -- norm + modulation
(``add_mul_native_layer_norm``), a GEMM template with an elementwise epilogue, RoPE fused into the SDPA input copy.
The names list ops, not how much work each does: a kernel is one category or ``fused``, never split between them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from ditprof.harness.trace.op_tables import ELEMENTWISE_OPS, GEMM_OPS, NORM_OPS

FUSED = "fused"

# ops that run attention whole; in a compiled graph they are one (extern / custom-op) node each
ATTENTION_OP_PREFIXES = (
    "aten::_scaled_dot_product", "aten::scaled_dot_product_attention", "aten::_flash_attention",
    "aten::_efficient_attention", "aten::_cudnn_attention", "ditprof::fp8_attention",
    "ditprof_compile::opaque_attention",
)
# host ranges the compiled runtime opens around a compiled graph's call
COMPILED_REGION_PREFIXES = ("Torch-Compiled Region", "## Call CompiledFxGraph", "CompiledFunction")
# ... and all of its own host ranges (guards, wrappers): their self time is runtime overhead, not op time
COMPILED_RUNTIME_PREFIXES = COMPILED_REGION_PREFIXES + (
    "TorchDynamo Cache Lookup", "Pregraph bytecode", "AOTDispatcher Runtime Wrapper")

INDUCTOR_KERNEL = re.compile(r"^(?:graph_\d+_)?(?:triton_(?:[a-z]+_)?|cpp_)fused(?P<ops>(?:_.*?)??)(?:_\d+)?$")

ATTENTION_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
    "scaled_dot_product_attention", "_flash_attention_forward", "_efficient_attention_forward",
    "_cudnn_attention_forward", "fp8_attention", "opaque_attention",
}
LAYOUT_OPS = {
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "expand_as", "squeeze", "unsqueeze",
    "as_strided", "alias", "detach", "slice", "select", "split", "split_with_sizes", "unbind", "narrow", "flatten",
    "unflatten", "view_as_real", "view_as_complex", "_to_copy", "to", "copy", "copy_", "clone", "contiguous",
    "type_as", "convert_element_type", "cat", "stack", "repeat", "repeat_interleave", "index", "index_select",
    "gather", "flip", "roll", "constant_pad_nd", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like",
    "empty", "empty_like", "arange", "iota", "lift_fresh_copy", "fill", "fill_", "zero_",
}
OTHER_OPS = {  # known ops that are none of the categories (reductions, sorting): "other", as in eager
    "mean", "sum", "amax", "amin", "max", "min", "argmax", "argmin", "var", "var_mean", "prod", "cumsum", "sort",
    "topk", "any", "all", "_softmax", "softmax", "_safe_softmax", "_log_softmax", "embedding", "scatter",
    "scatter_add", "index_put",
}
OP_CATEGORY: dict[str, str] = {
    **{op: "other" for op in OTHER_OPS},
    **{op: "elementwise" for op in (o.removeprefix("aten::") for o in ELEMENTWISE_OPS)},
    **{op.removeprefix("aten::"): "norm" for op in NORM_OPS},
    **{op.removeprefix("aten::"): "gemm" for op in GEMM_OPS},
    **{op: "layout" for op in LAYOUT_OPS},
    **{op: "attention" for op in ATTENTION_OPS},
}
_VOCABULARY = sorted(OP_CATEGORY, key=len, reverse=True)  # longest first: native_layer_norm before a "norm"
# a decomposed norm's signature ops, and the ops it is made of
DECOMPOSED_NORMS = (
    (frozenset({"mean", "rsqrt"}), frozenset({"pow", "square", "mean", "add", "rsqrt", "mul"})),  # RMS norm
    (frozenset({"var_mean", "rsqrt"}), frozenset({"var_mean", "sub", "add", "rsqrt", "mul"})),  # layer norm
)


def is_attention_op(name: str) -> bool:
    return name.startswith(ATTENTION_OP_PREFIXES)


def is_compiled_stack(names: Iterable[str]) -> bool:
    return any(n.startswith(COMPILED_REGION_PREFIXES) for n in names)


@functools.lru_cache(maxsize=4096)
def kernel_ops(name: str) -> tuple[str, ...] | None:
    """The aten ops an inductor kernel is named after (``triton_poi_fused__to_copy_add_0`` -> ``('_to_copy',
    'add')``); None for a name inductor did not generate."""
    m = INDUCTOR_KERNEL.match(name)
    if m is None:
        return None
    s, i, ops = m["ops"][1:], 0, []  # [1:]: the separator after "fused"
    while i < len(s):
        word = next((w for w in _VOCABULARY if s.startswith(w, i) and s[i + len(w):i + len(w) + 1] in ("", "_")),
                    None)
        if word is None:  # an op we do not know: up to the next separator (its own leading "_" included)
            end = s.find("_", i + 1)
            word = s[i:] if end < 0 else s[i:end]
        ops.append(word)
        i += len(word) + 1
    return tuple(ops)


@functools.lru_cache(maxsize=4096)
def compiled_kernel_category(name: str) -> str:
    """attention / gemm / norm / elementwise / other of an inductor kernel, or ``fused`` when its ops mix
    categories (module docstring)."""
    ops = kernel_ops(name)
    if not ops:
        return "other"  # no op names (descriptive names off): nothing to go by
    present = set(ops)
    owned: set[str] = set()
    cats: set[str] = set()
    for signature, parts in DECOMPOSED_NORMS:
        if signature <= present:
            owned |= present & parts
            cats.add("norm")
    for op in ops:
        if op not in owned:
            cats.add(OP_CATEGORY.get(op, "other"))
    cats.discard("layout")
    if not cats:
        return "elementwise"  # only loads, stores and casts: a copy kernel
    return cats.pop() if len(cats) == 1 else FUSED
