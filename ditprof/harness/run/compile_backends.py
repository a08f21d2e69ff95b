"""Attention backends under ``--compile``.

torch's SDPA backends and our ``fp8`` (the custom op ``ditprof::fp8_attention``) reach the compiled graph as one op
each, which the split finds by name in the compiled trace (``categories``). A numerics emulation
(``fp8-emulated``) is plain torch code: dynamo would trace into it, stop at its per-call NaN/Inf check (a host
read: a graph break) and, without it, fuse its internals into the block's kernels, where no attention time could
be told apart. Under ``--compile`` it therefore runs as one opaque op, ``ditprof_compile::opaque_attention`` --
what the kernel it emulates is to the compiler.

(No ``from __future__ import annotations`` here: ``torch.library.custom_op`` reads the op's schema from the
annotations.)
"""

import dataclasses

import torch

from ditprof.kernels.registry import Backend

OPAQUE_OP = "ditprof_compile::opaque_attention"
# the op's ``backend`` argument -> the backend it runs, for one that is not the registry's own (a backend with
# FP8 options, ``Backend.with_options``): the op's schema takes a string, not the object
_GIVEN: dict = {}


@torch.library.custom_op(OPAQUE_OP, mutates_args=())
def opaque_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
                     key_mask: torch.Tensor | None, backend: str) -> torch.Tensor:
    """Registry backend ``backend`` on (B, S, H, D), as one node of the compiled graph."""
    from ditprof.kernels import registry

    kw = {"scale": scale} if key_mask is None else {"scale": scale, "key_mask": key_mask}
    # contiguous: the fake below promises a fresh contiguous tensor, which inductor plans the next ops' strides by
    b = _GIVEN.get(backend) or registry.get(backend)
    return b.fn(q, k, v, **kw).contiguous()


@opaque_attention.register_fake
def _fake(q, k, v, scale, key_mask, backend):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def for_compile(b: Backend) -> Backend:
    """The backend as the compiled block should see it: numerics emulations behind the opaque op (which runs the
    backend as given, with its FP8 options if any), others as they are (``fp8`` is a custom op already)."""
    if not b.numerics_only:
        return b
    from ditprof.kernels import registry

    name = b.name
    if b != registry.get(name):  # the backend as given (its options), not the registry's
        name = next((k for k, v in _GIVEN.items() if v == b), None) or f"{b.name}#{len(_GIVEN)}"
        _GIVEN[name] = b

    def opaque(q, k, v, *, scale=None, key_mask=None):
        return torch.ops.ditprof_compile.opaque_attention(q, k, v, scale, key_mask, name)

    opaque.__name__ = f"opaque_{b.name.replace('-', '_')}"
    return dataclasses.replace(b, fn=opaque)
