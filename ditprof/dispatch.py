"""Put an attention function (a ``ditprof.kernels`` backend) into diffusers attention modules, and take it out again.

The public ``ditprof.diffusers`` and the harness's ``AttentionSwap`` (``harness.swaps.attention``) both stand on
this module; it imports neither (and ``ditprof.kernels`` never imports it).

Two routes, after what diffusers' attention modules do:

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
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ditprof.errors import DitprofError

# The profiler range around every attention call (the trace split counts everything inside it as attention).
ATTENTION_RANGE = "ditprof::attention"

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


# what to install on one attention module: (backend name, function), from its name and the module
PerModule = Callable[[str, torch.nn.Module], "tuple[str, Callable]"]


@dataclass
class SwapState:
    """What one installation did, and how to take it out again."""

    name: str
    route: str = ""  # "dispatcher", "processor" or "mixed"
    modules: dict[str, str] = field(default_factory=dict)  # attention module -> backend name installed there
    members: dict[str, Any] = field(default_factory=dict)  # dispatcher route: module -> AttentionBackendName member
    masks: dict = field(default_factory=dict)  # attention masks passed / dropped (all-attend), over all modules
    _restore: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def member(self):
        """The dispatcher member of the first dispatcher-routed module (None: processor route only)."""
        return next(iter(self.members.values()), None)

    def restore(self) -> None:
        while self._restore:
            self._restore.pop()()


def _route_module(state: SwapState, mod: torch.nn.Module, name: str, fn: Callable, registered: dict,
                  uses_dispatcher: bool | None) -> tuple[str, Any]:
    """Install ``fn`` on one attention module; returns (route, dispatcher member or None) and queues the undo."""
    proc = mod.processor
    if proc is not None and hasattr(proc, "_attention_backend") and uses_dispatcher is not False:
        if name not in registered:
            registered[name] = register_with_dispatcher(name, fn, state.masks)
        member = registered[name]
        old = proc._attention_backend
        if hasattr(mod, "set_attention_backend"):
            mod.set_attention_backend(member.value)  # the public per-module entry point
        else:
            proc._attention_backend = member

        def undo(p=proc, o=old):
            p._attention_backend = o

        state._restore.append(undo)
        return "dispatcher", member
    mod.processor = redirecting_processor(proc, name, fn, state.masks)  # plain attribute: set_processor would warn
    _patch_sdpa()

    def undo(m=mod, p=proc):
        m.processor = p
        _unpatch_sdpa()

    state._restore.append(undo)
    return "processor", None


def install(module: torch.nn.Module, name: str, fn: Callable, *, uses_dispatcher: bool | None = None,
            per_module: PerModule | None = None,
            modules: list[tuple[str, torch.nn.Module]] | None = None) -> SwapState:
    """Route every attention call of ``module`` through backend ``name``; returns a state to restore.

    ``per_module`` (optional) picks another (name, function) for some modules (sequence parallelism wraps the
    backend differently for self- and cross-attention); ``modules``: the attention modules to take (default: all
    of ``module``'s)."""
    mods = attention_modules(module) if modules is None else modules
    if not mods:
        raise DitprofError(f"no diffusers attention module found in {type(module).__name__}; cannot swap attention")
    state = SwapState(name=name)
    routes, registered = set(), {}
    try:
        for mod_name, mod in mods:
            mname, mfn = per_module(mod_name, mod) if per_module else (name, fn)
            route, member = _route_module(state, mod, mname, mfn, registered, uses_dispatcher)
            routes.add(route)
            state.modules[mod_name] = mname
            if member is not None:
                state.members[mod_name] = member
    except BaseException:
        state.restore()
        raise
    state.route = routes.pop() if len(routes) == 1 else "mixed"
    return state


@contextlib.contextmanager
def swapped(module: torch.nn.Module, name: str, fn: Callable, *, uses_dispatcher: bool | None = None):
    state = install(module, name, fn, uses_dispatcher=uses_dispatcher)
    try:
        yield state
    finally:
        state.restore()
