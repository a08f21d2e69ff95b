"""Our attention kernels in your own diffusers pipeline.

    import ditprof.diffusers                       # registers "ditprof_fp8" and "ditprof_fp8_emulated"
    pipe.transformer.set_attention_backend("ditprof_fp8")

    from diffusers.models.attention_dispatch import attention_backend
    with attention_backend("ditprof_fp8"):         # or for one call only
        video = pipe(prompt).frames[0]

Both names are real members of diffusers' ``AttentionBackendName`` registered with its dispatcher, so every
model whose attention processors go through ``dispatch_attention_fn`` (Flux, FLUX.2, Wan, LTX, LTX-2,
HunyuanVideo, HunyuanVideo-1.5, Qwen-Image, MiniMax-H3, ...) runs our kernel: ``ditprof_fp8`` is the FP8 kernel
(CUDA; elsewhere the numerics emulation), ``ditprof_fp8_emulated`` the emulation on any device. Masks: the
key-padding masks diffusers' processors pass for padded prompts are taken (each form reduced to one key subset per
batch item, checked once per shape); a mask that is not key padding, dropout or causal attention is a one-line
``DitprofError``. Each call runs inside ``record_function("ditprof::attention")``: a torch.profiler trace of your
pipeline shows the attention as one range.

diffusers' ``set_attention_backend`` also makes the backend its process-wide active one (and
``reset_attention_backend`` leaves that): other models then use it too; ``use_backend`` below touches one model only.

Models whose processors call ``torch.nn.functional.scaled_dot_product_attention`` themselves (CogVideoX, Mochi,
SD3, ...) never reach the dispatcher, so ``set_attention_backend`` would change nothing there:
``set_backend(model, "fp8")`` says so in one line, and ``use_backend(model, "fp8")`` (a context manager) swaps
their processors for the duration instead (it works for dispatcher-routed models too).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ditprof.errors import DitprofError

BACKENDS = ("fp8", "fp8-emulated")


def dispatcher_name(name: str) -> str:
    """The diffusers backend name of a ditprof backend: ``fp8-emulated`` -> ``ditprof_fp8_emulated``."""
    from ditprof.dispatch import dispatcher_value

    return dispatcher_value(name)


def register_diffusers_backends(names=BACKENDS) -> list[str]:
    """Register ditprof backends with diffusers' attention dispatcher (idempotent); returns their names there."""
    from ditprof.dispatch import register_with_dispatcher
    from ditprof.kernels import registry

    out = []
    for name in names:
        backend = registry.get(name)
        out.append(register_with_dispatcher(backend.name, backend.fn).value)
    return out


def legacy_attention_modules(model: torch.nn.Module) -> list[str]:
    """Names of the attention modules whose processor calls torch's SDPA itself (no dispatcher)."""
    out = []
    for name, mod in model.named_modules():
        proc = getattr(mod, "processor", None)
        if proc is not None and not hasattr(proc, "_attention_backend"):
            out.append(name)
    return out


def set_backend(model: torch.nn.Module, name: str = "fp8") -> None:
    """``model.set_attention_backend("ditprof_<name>")`` after registering it; a one-line ``DitprofError`` for a
    model whose processors bypass the dispatcher (use ``use_backend`` there)."""
    legacy = legacy_attention_modules(model)
    if legacy:
        raise DitprofError(
            f"{type(model).__name__}'s attention processors call torch's SDPA directly ({len(legacy)} modules, e.g. "
            f"{legacy[0]}), not diffusers' dispatcher: use `with ditprof.diffusers.use_backend(model, {name!r}):`")
    value = register_diffusers_backends((name,))[0]
    model.set_attention_backend(value)


@contextlib.contextmanager
def use_backend(model: torch.nn.Module, name: str = "fp8") -> Iterator[None]:
    """Within the block, ``model``'s attention runs on the ditprof backend ``name``, whatever route its processors
    take (dispatcher-routed: the processors' backend is set and restored; SDPA-calling processors: wrapped with SDPA
    redirected to the backend). The previous processors and backends are restored on exit."""
    from ditprof import dispatch
    from ditprof.kernels import registry

    backend = registry.get(name)
    with dispatch.swapped(model, backend.name, backend.fn):
        yield


register_diffusers_backends()

__all__ = ["BACKENDS", "dispatcher_name", "register_diffusers_backends", "legacy_attention_modules", "set_backend",
           "use_backend"]
