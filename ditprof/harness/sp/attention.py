"""``--sp``'s attention side: the Ulysses wrappers around a registry backend (self-attention, joint text + image,
cross-attention split over heads), their installation in a block, and the sharding of a block's inputs and
gathering of its output along the sequence (``sequence_parallel``'s module docstring has the design)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import torch

from ditprof.errors import DitprofError
from ditprof import dispatch
from ditprof.harness.sp import distributed
from ditprof.harness.swaps.attention import AttentionInstalled, AttentionSwap
from ditprof.harness.trace.ranges import COMM_RANGE
from ditprof.kernels.registry import Backend


CROSS_MODES = ("local", "heads")


# --------------------------------------------------------------------------- bad input

def check_degree(P: int, *, heads: int | None = None, tokens: int | None = None,
                 device: torch.device | None = None) -> None:
    """One-line DitprofError for a P that cannot work here; names what does not divide."""
    if P < 1:
        raise DitprofError(f"--sp must be >= 1 (got {P})")
    if device is not None and device.type == "cuda":
        n = torch.cuda.device_count()
        if P > n:
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise DitprofError(f"--sp {P} needs {P} GPUs (one per rank), but {n} "
                               f"{'is' if n == 1 else 'are'} visible"
                               + (f" (CUDA_VISIBLE_DEVICES={vis})" if vis is not None else ""))
    bad = []
    if heads is not None and heads % P:
        bad.append(f"the head count {heads} is not divisible by {P} (Ulysses gives each rank H/P heads)")
    if tokens is not None and tokens % P:
        bad.append(f"the token count {tokens} is not divisible by {P} (each rank holds S/P tokens)")
    if bad:
        raise DitprofError(f"--sp {P}: " + "; ".join(bad))


def _preset_shape(spec) -> tuple[Any, str, int, int] | None:
    """(family, kind, heads, tokens) of a preset run without loading anything; None for checkpoints."""
    if spec.source_kind != "preset":
        return None
    from ditprof.model_blocks import get_family, get_preset
    from ditprof.model_blocks.inputs import resolve_grid

    preset = get_preset(spec.source)
    fam = get_family(preset.family)
    kind = fam.kind(spec.kind or preset.kind).name
    heads = fam.heads(preset.config)[0]
    grid, _ = resolve_grid(fam, preset.config, preset, spec.tokens, spec.height, spec.width, spec.frames)
    return fam, kind, heads, fam.rows(grid, kind)


def check_family(family, kind: str | None):
    """The block's plan; a one-line error when the family declares no sequence split for it."""
    plan = family.plan(kind)
    if plan.sp is None:
        from ditprof.model_blocks.families import FAMILIES

        wired = [f.name for f in FAMILIES.values() if all(f.plan(k.name).sp is not None for k in f.kinds)]
        raise DitprofError(
            f"--sp: {family.name} {family.kind(kind).name} blocks declare no sequence split (BlockPlan.sp) yet; "
            f"sequence parallelism is wired up for {', '.join(wired)}")
    return plan


def ulysses_backend(inner: Callable, world: int, group=None) -> Callable:
    """Self-attention on local tokens: all-to-all (q, k, v) -> ``inner`` on H/P heads -> all-to-all back."""

    def ulysses(q, k, v, *, scale=None):
        with torch.profiler.record_function(COMM_RANGE + "/qkv"):
            qh, kh, vh = distributed.seq_to_heads([q, k, v], world, group)
        o = inner(qh, kh, vh, scale=scale)
        with torch.profiler.record_function(COMM_RANGE + "/out"):
            return distributed.heads_to_seq(o, world, group)

    return ulysses


def joint_ulysses_backend(inner: Callable, world: int, rank: int, text_tokens: int, text_first: bool = True,
                          group=None) -> Callable:
    """Joint attention over replicated text + local image tokens (Flux, HunyuanVideo): only the image part
    of q, k, v goes through the all-to-all; the full text part is sliced to this rank's heads locally and
    concatenated (in the block's order) -> ``inner`` on H/P heads over all T + S tokens -> the image output
    goes back by the inverse all-to-all, the text output (every rank needs all of it: the text stream is
    replicated) by an all-gather over heads."""
    T = text_tokens

    def split(x):  # (text, image) along the sequence
        n = x.shape[1]
        return (x[:, :T], x[:, T:]) if text_first else (x[:, n - T:], x[:, :n - T])

    def join(t, i):
        return torch.cat([t, i] if text_first else [i, t], dim=1)

    def joint(q, k, v, *, scale=None):
        parts = [split(x) for x in (q, k, v)]
        with torch.profiler.record_function(COMM_RANGE + "/qkv"):
            img = distributed.seq_to_heads([p[1] for p in parts], world, group)
        hp = q.shape[2] // world
        txt = [p[0][:, :, rank * hp:(rank + 1) * hp] for p in parts]
        qh, kh, vh = (join(t, i).contiguous() for t, i in zip(txt, img))
        ot, oi = split(inner(qh, kh, vh, scale=scale))
        with torch.profiler.record_function(COMM_RANGE + "/out"):
            oi = distributed.heads_to_seq(oi.contiguous(), world, group)
            ot = distributed.all_gather_heads(ot, world, group)
        return join(ot, oi)

    return joint


def cross_heads_backend(inner: Callable, world: int, rank: int, group=None) -> Callable:
    """Cross-attention with the head split: all-to-all the queries only, slice the replicated K/V to this
    rank's heads locally, all-to-all the output back."""

    def cross_heads(q, k, v, *, scale=None):
        with torch.profiler.record_function(COMM_RANGE + "/q"):
            (qh,) = distributed.seq_to_heads([q], world, group)
        hk = k.shape[2] // world
        kh = k[:, :, rank * hk:(rank + 1) * hk].contiguous()
        vh = v[:, :, rank * hk:(rank + 1) * hk].contiguous()
        o = inner(qh, kh, vh, scale=scale)
        with torch.profiler.record_function(COMM_RANGE + "/out"):
            return distributed.heads_to_seq(o, world, group)

    return cross_heads


def is_cross_attention(name: str, module: torch.nn.Module) -> bool:
    flag = getattr(module, "is_cross_attention", None)
    if flag is not None:
        return bool(flag)
    return name.split(".")[-1] == "attn2"


class SpAttentionSwap(AttentionSwap):
    """The Ulysses wrapper around ``backend`` on the self-attention modules (the joint variant where ``joint`` =
    (text tokens, text first) is given) and ``backend`` itself (``cross="local"``) or the head-split wrapper on the
    cross-attention modules; its record names the backend per module."""

    def __init__(self, backend: Backend, *, world: int, rank: int, cross: str = "local",
                 uses_dispatcher: bool | None = None, group=None, joint: tuple[int, bool] | None = None,
                 head_dim: int | None = None):
        if cross not in CROSS_MODES:
            raise DitprofError(f"sp cross-attention mode {cross!r}: use one of {', '.join(CROSS_MODES)}")
        super().__init__(backend, uses_dispatcher=uses_dispatcher, head_dim=head_dim)
        name, fn = backend.name, backend.fn
        if joint is not None:  # (text tokens, text first): the joint variant on the joint-attention modules
            self.self_route = (f"ulysses-joint-{name}", joint_ulysses_backend(fn, world, rank, joint[0], joint[1], group))
        else:
            self.self_route = (f"ulysses-{name}", ulysses_backend(fn, world, group))
        self.cross_route = (name, fn) if cross == "local" else (f"ulysses-heads-{name}",
                                                                 cross_heads_backend(fn, world, rank, group))

    def describe(self) -> str:
        return f"{super().describe()}, Ulysses over the ranks"

    def per_module(self) -> dispatch.PerModule:
        return lambda mod_name, mod: self.cross_route if is_cross_attention(mod_name, mod) else self.self_route

    def install(self, block: torch.nn.Module) -> AttentionInstalled:
        mods = dispatch.attention_modules(block)
        if not any(not is_cross_attention(n, m) for n, m in mods):
            raise DitprofError(f"--sp: no self-attention module found in {type(block).__name__}")
        return super().install(block)

    def record(self, inst: AttentionInstalled) -> dict:
        st = inst.state
        out = {"attention_backend": self.backend.name, "route": st.route, "attention_modules": dict(st.modules),
               "diffusers_backends": {m: member.value for m, member in st.members.items()}}
        if st.masks:
            out["attention_masks"] = dict(st.masks)
        if self.qk_format():
            out["qk_format"] = self.qk_format()
        return out


# --------------------------------------------------------------------------- inputs

def _split(t: torch.Tensor, how, name: str, S: int, T: int, lo: int, hi: int) -> torch.Tensor:
    """Rows ``[lo, hi)`` of ``t`` along ``how.dim`` (a ``SeqSplit``), the replicated text rows kept whole."""
    if how.ndim is not None and t.ndim != how.ndim:
        return t
    d = how.dim
    want = S + (T if how.text else 0)
    if t.ndim <= d or t.shape[d] != want:
        raise DitprofError(f"--sp: expected {want} rows on dim {d} of {name}, got shape {tuple(t.shape)}")
    if how.text == "first":
        return torch.cat([t.narrow(d, 0, T), t.narrow(d, T + lo, hi - lo)], dim=d).contiguous()
    if how.text == "last":
        return torch.cat([t.narrow(d, lo, hi - lo), t.narrow(d, S, T)], dim=d).contiguous()
    return t.narrow(d, lo, hi - lo).contiguous()


def gather_output(out: torch.Tensor, how, text_tokens: int, world: int, device: torch.device) -> torch.Tensor:
    """Every rank's block output back into the one-device sequence (on the host). A hidden-states split that
    keeps replicated text rows (``how.text``) returns them on every rank: they are taken once, from rank 0."""
    full = distributed.all_gather_tokens(out, world, device)
    if how is None or not how.text or world == 1:
        return full
    T = text_tokens
    parts = full.chunk(world, dim=1)
    if how.text == "first":
        return torch.cat([parts[0][:, :T]] + [p[:, T:] for p in parts], dim=1)
    return torch.cat([p[:, :p.shape[1] - T] for p in parts] + [parts[0][:, -T:]], dim=1)


def shard_inputs(loaded: Any, inputs: Any, rank: int, world: int) -> Any:
    """This rank's share of the block inputs, as the family's ``BlockPlan.sp`` declares it: rows
    ``[r*S/P, (r+1)*S/P)`` of every split input (each item of a tuple such as a rotary pair); text and
    everything not named replicated."""
    plan = check_family(loaded.family, loaded.kind)
    S, T = inputs.tokens, inputs.text_tokens
    s = S // world
    lo, hi = rank * s, (rank + 1) * s
    kw = dict(inputs.kwargs)
    if inputs.args:
        raise DitprofError("--sp: block inputs must be named (make_inputs names them)")
    for name, how in plan.sp.items():
        value = kw.get(name)
        if value is None:
            continue
        if isinstance(value, (tuple, list)):
            hows = how if isinstance(how, tuple) else (how,) * len(value)  # one split per item, None: replicated
            kw[name] = type(value)(t if h is None else _split(t, h, name, S, T, lo, hi) for t, h in zip(value, hows))
        else:
            kw[name] = _split(value, how, name, S, T, lo, hi)
    return dataclasses.replace(inputs, args=(), kwargs=kw, tokens=s)

