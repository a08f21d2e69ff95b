"""Put a ``ditprof.kernels`` attention backend into a diffusers block, and take it out again.

Two routes (see ``/work/shared/reference/diffusers-notes.md``):

* Dispatcher-routed families (Wan, Flux, LTX, ...): the backend becomes a real ``AttentionBackendName``
  member (value ``ditprof_<name>``) registered with ``_AttentionBackendRegistry``, so diffusers' own
  ``attention_backend("ditprof_fp8")`` context manager and ``set_attention_backend("ditprof_fp8")`` accept
  it. The harness then sets it on the block's attention processors only (never the global active backend,
  which ``ModelMixin.set_attention_backend`` would leak) and restores the previous values afterwards.
* Legacy processors that call ``F.scaled_dot_product_attention`` themselves (CogVideoX, Mochi, SD3, ...):
  the processor is replaced by a wrapper that runs the original processor with SDPA redirected to the
  backend ((B, H, S, D) <-> (B, S, H, D) transposes around it).

Either way the backend call runs inside ``record_function("ditprof::attention")`` so the profiler
attributes every kernel it launches to attention; the baseline backend is wrapped the same way.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from ditprof.errors import DitprofError
from ditprof.harness.trace.categories import ATTENTION_RANGE

DISPATCH_PREFIX = "ditprof_"


def dispatcher_value(name: str) -> str:
    """Enum value for a registry name: ``fp8-emulated`` -> ``ditprof_fp8_emulated``."""
    return DISPATCH_PREFIX + name.replace("-", "_").replace(".", "_").lower()


def _accepts(fn: Callable, arg: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return arg in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def is_all_attend(mask: torch.Tensor) -> bool:
    """True for a mask that changes nothing: bool all True, or an additive bias of all zeros."""
    if mask.dtype == torch.bool:
        return bool(mask.all().item())
    return bool((mask == 0).all().item())


def accepts_mask(fn: Callable) -> bool:
    """Whether a registry backend takes a mask: ``attn_mask`` (any mask) or ``key_mask`` (key padding); else
    only all-attend masks can be dropped."""
    return _accepts(fn, "attn_mask") or _accepts(fn, "key_mask")


def wrap_backend(name: str, fn: Callable, masks: dict | None = None) -> Callable:
    """``fn(q, k, v, *, scale=None)`` on (B, S, H, D), marked with the attention range.

    Masks: a backend whose signature takes ``attn_mask`` gets it. Otherwise an all-attend mask (what the
    families' full prompts produce) is dropped, which is exact; it is checked once per (shape, dtype,
    device) -- during warm-up -- so the timed calls carry no host sync. Any other mask is an error.
    ``masks`` (optional) collects what happened, for the report.
    """
    takes_mask = _accepts(fn, "attn_mask")
    takes_keys = not takes_mask and _accepts(fn, "key_mask")
    verified: set[tuple] = set()
    if masks is None:
        masks = {}

    def call(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        if dropout_p:
            raise DitprofError(f"attention backend {name!r} does not support dropout (got p={dropout_p})")
        if is_causal:
            raise DitprofError(f"attention backend {name!r} does not support causal masking")
        kw: dict[str, Any] = {"scale": scale}
        if attn_mask is not None:
            if takes_mask:
                kw["attn_mask"] = attn_mask
                masks["passed"] = masks.get("passed", 0) + 1
            elif takes_keys:
                key = (tuple(attn_mask.shape), attn_mask.dtype, attn_mask.device)
                from ditprof.kernels.masks import attended_keys, key_mask

                shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])  # B, H, S_q, S_k
                if key not in verified:  # the form is checked once per shape (a host sync), during warm-up
                    key_mask(attn_mask, *shape)
                    verified.add(key)
                kw["key_mask"] = attended_keys(attn_mask, *shape)
                masks["key_padding"] = masks.get("key_padding", 0) + 1
            else:
                key = (tuple(attn_mask.shape), attn_mask.dtype, attn_mask.device)
                if key not in verified:
                    if not is_all_attend(attn_mask):
                        raise DitprofError(
                            f"attention backend {name!r} takes no attention mask, but this block passes one "
                            f"that masks positions (shape {tuple(attn_mask.shape)}); use a full prompt or a "
                            f"mask-aware backend"
                        )
                    verified.add(key)
                masks["dropped_all_attend"] = masks.get("dropped_all_attend", 0) + 1
        if torch.compiler.is_compiling():
            # dynamo drops record_function ranges (warning each time); in a compiled block the split finds the
            # attention by its op's name instead (categories)
            return fn(q, k, v, **kw)
        with torch.profiler.record_function(ATTENTION_RANGE):
            return fn(q, k, v, **kw)

    call.__name__ = f"ditprof_attention_{name}"
    call.masks = masks  # type: ignore[attr-defined]
    return call


# --------------------------------------------------------------------------- dispatcher registration

_lock = threading.Lock()


def _enum_member(value: str):
    from diffusers.models.attention_dispatch import AttentionBackendName

    existing = AttentionBackendName._value2member_map_.get(value)
    if existing is not None:
        return existing
    member_name = value.upper()
    member = str.__new__(AttentionBackendName, value)
    member._name_ = member_name
    member._value_ = value
    member.__objclass__ = AttentionBackendName
    if hasattr(AttentionBackendName, "_new_member_"):
        member._sort_order_ = len(AttentionBackendName._member_names_)
    type.__setattr__(AttentionBackendName, member_name, member)
    AttentionBackendName._member_map_[member_name] = member
    AttentionBackendName._value2member_map_[value] = member
    AttentionBackendName._member_names_.append(member_name)
    return member


def register_with_dispatcher(name: str, fn: Callable, masks: dict | None = None):
    """Register ``fn`` (ditprof backend contract) as diffusers backend ``ditprof_<name>``; idempotent.

    Returns the ``AttentionBackendName`` member. Re-registering replaces the function (the same name may be
    re-bound, e.g. by tests).
    """
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    with _lock:
        member = _enum_member(dispatcher_value(name))
        wrapped = wrap_backend(name, fn, masks)

        def backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
            return wrapped(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                           is_causal=is_causal, scale=scale)

        backend.__name__ = f"ditprof_{name}"
        _AttentionBackendRegistry.register(member)(backend)
        return member


def is_registered(name: str) -> bool:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    member = AttentionBackendName._value2member_map_.get(dispatcher_value(name))
    return member is not None and member in _AttentionBackendRegistry._backends


# --------------------------------------------------------------------------- processor replacement

class _SdpaRoute:
    """Where ``F.scaled_dot_product_attention`` goes while one of our redirecting processors runs. A plain object
    on purpose: torch.compile traces reads and updates of its list (a ``threading.local`` it cannot), so a swapped
    legacy-processor block (CogVideoX, ...) compiles with fullgraph."""

    def __init__(self):
        self.stack: list = []  # (name, wrapped backend) per active processor call; None while that backend runs
        self.installs = 0  # processors installed: SDPA stays patched while any is
        self.original: Callable | None = None


_ROUTE = _SdpaRoute()


def _routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` (B, H, S, D) while a swap with redirecting processors is installed."""
    top = _ROUTE.stack[-1] if _ROUTE.stack else None
    if top is None:  # outside our processors, or our backend itself using SDPA
        return _ROUTE.original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                               scale=scale, enable_gqa=enable_gqa)
    name, wrapped = top
    if enable_gqa and query.shape[1] != key.shape[1]:
        raise DitprofError(f"attention backend {name!r} does not support grouped-query attention")
    _ROUTE.stack.append(None)
    try:
        out = wrapped(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                      attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    finally:
        _ROUTE.stack.pop()
    return out.transpose(1, 2)


def _patch_sdpa() -> None:
    if _ROUTE.installs == 0:
        _ROUTE.original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = _routed_sdpa
    _ROUTE.installs += 1


def _unpatch_sdpa() -> None:
    _ROUTE.installs -= 1
    if _ROUTE.installs == 0:
        F.scaled_dot_product_attention = _ROUTE.original
        _ROUTE.original = None


class _RedirectingProcessor:
    """Runs the original processor with SDPA redirected to a ditprof backend (``F.scaled_dot_product_attention``
    is patched while the processor is installed; each call routes it to this processor's backend)."""

    def __init__(self, inner, name: str, fn: Callable, masks: dict | None = None):
        self.inner = inner
        self.backend_name = name
        self.backend_fn = fn
        self.masks = masks if masks is not None else {}
        self.wrapped = wrap_backend(name, fn, self.masks)

    def __getattr__(self, item):  # keep attributes diffusers may read on the processor
        if item in ("inner", "backend_name", "backend_fn", "masks", "wrapped"):
            raise AttributeError(item)
        return getattr(self.inner, item)

    def _call(self, attn, *args, **kwargs):
        _ROUTE.stack.append((self.backend_name, self.wrapped))
        try:
            return self.inner(attn, *args, **kwargs)
        finally:
            _ROUTE.stack.pop()


def redirecting_processor(inner, name: str, fn: Callable, masks: dict | None = None):
    """A processor object whose ``__call__`` has the inner processor's signature (diffusers'
    ``Attention.forward`` filters keyword arguments by it)."""
    inner_call = type(inner).__call__

    @functools.wraps(inner_call)
    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    cls = type(f"Ditprof{type(inner).__name__}", (_RedirectingProcessor,), {"__call__": __call__})
    return cls(inner, name, fn, masks)


# --------------------------------------------------------------------------- swapping a block

def attention_modules(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    classes: tuple[type, ...] = (Attention, AttentionModuleMixin)
    try:
        from diffusers.models.attention_processor import MochiAttention

        classes += (MochiAttention,)
    except ImportError:
        pass
    return [(n, m) for n, m in module.named_modules() if isinstance(m, classes) and hasattr(m, "processor")]


@dataclass
class SwapState:
    name: str
    route: str  # "dispatcher", "processor" or "mixed"
    member: Any = None
    modules: list[str] = field(default_factory=list)
    masks: dict = field(default_factory=dict)  # attention masks passed / dropped (all-attend)
    _restore: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def restore(self) -> None:
        while self._restore:
            self._restore.pop()()


def install(module: torch.nn.Module, name: str, fn: Callable, *, uses_dispatcher: bool | None = None) -> SwapState:
    """Route every attention call of ``module`` through backend ``name``; returns a state to restore."""
    mods = attention_modules(module)
    if not mods:
        raise DitprofError(f"no diffusers attention module found in {type(module).__name__}; cannot swap attention")
    state = SwapState(name=name, route="")
    routes = set()
    for mod_name, mod in mods:
        proc = mod.processor
        dispatcher_ok = proc is not None and hasattr(proc, "_attention_backend") and uses_dispatcher is not False
        if dispatcher_ok:
            if state.member is None:
                state.member = register_with_dispatcher(name, fn, state.masks)
            old = proc._attention_backend
            if hasattr(mod, "set_attention_backend"):
                mod.set_attention_backend(state.member.value)  # the public per-module entry point
            else:
                proc._attention_backend = state.member

            def undo(p=proc, o=old):
                p._attention_backend = o

            routes.add("dispatcher")
        else:
            new = redirecting_processor(proc, name, fn, state.masks)
            mod.processor = new  # plain attribute: set_processor would warn about dropping weights
            _patch_sdpa()

            def undo(m=mod, p=proc):
                m.processor = p
                _unpatch_sdpa()

            routes.add("processor")
        state._restore.append(undo)
        state.modules.append(mod_name)
    state.route = routes.pop() if len(routes) == 1 else "mixed"
    return state


@contextlib.contextmanager
def swapped(module: torch.nn.Module, name: str, fn: Callable, *, uses_dispatcher: bool | None = None):
    state = install(module, name, fn, uses_dispatcher=uses_dispatcher)
    try:
        yield state
    finally:
        state.restore()


# --------------------------------------------------------------------------- norm module ranges

def _is_norm_module(mod: torch.nn.Module) -> bool:
    if "Norm" not in type(mod).__name__:
        return False
    return not any(isinstance(m, torch.nn.Linear) for m in mod.modules())


@contextlib.contextmanager
def norm_ranges(module: torch.nn.Module) -> Iterator[list[str]]:
    """Wrap every norm module's forward in ``record_function("ditprof::norm/<Class>")``.

    Some norms never reach an aten norm op (diffusers' ``RMSNorm`` is pow/mean/rsqrt/mul); the range lets
    the split count them as norm instead of elementwise. Modules holding a ``Linear`` (AdaLayerNorm*) are
    left alone: their inner norm gets the range, their projection stays a GEMM.
    """
    from ditprof.harness.trace.categories import NORM_RANGE_PREFIX

    wrapped: list[tuple[torch.nn.Module, bool, Callable]] = []
    names: list[str] = []
    for name, mod in module.named_modules():
        if not _is_norm_module(mod):
            continue
        label = f"{NORM_RANGE_PREFIX}/{type(mod).__name__}"
        inner = mod.forward
        had_attr = "forward" in mod.__dict__

        def forward(*args, _inner=inner, _label=label, **kwargs):
            if torch.compiler.is_compiling():  # dropped under compile: the norm's kernels are named after its ops
                return _inner(*args, **kwargs)
            with torch.profiler.record_function(_label):
                return _inner(*args, **kwargs)

        mod.forward = forward
        wrapped.append((mod, had_attr, inner))
        names.append(name)
    try:
        yield names
    finally:
        for mod, had_attr, inner in wrapped:
            if had_attr:
                mod.forward = inner
            else:
                del mod.forward
