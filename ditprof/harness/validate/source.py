"""Where ``ditprof validate``'s blocks come from: a preset (synthetic weights, distinct per block, generated on the
device) or a checkpoint (the real shards, block by block); the check that the N blocks asked for exist."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ditprof.errors import DitprofError
from ditprof.model_blocks.synthetic import synth_tensor, synthetic_block


@dataclass
class Source:
    """Where blocks come from: a preset (synthetic on device) or a checkpoint (shards)."""

    name: str
    kind_of_source: str
    family: Any
    config: dict
    kind: str
    model_blocks: int
    preset: Any = None
    layout: Any = None
    hub: Any = None
    held: list[int] = field(default_factory=list)

    def block(self, index: int, device: torch.device, dtype: torch.dtype, seed: int):
        if self.preset is not None:
            return synthetic_block(self.preset, index, kind=self.kind, device=device, dtype=dtype, seed=seed)
        from ditprof.model_blocks.loading import load_block_from_layout

        return load_block_from_layout(self.layout, index, kind=self.kind, device=device, dtype=dtype, progress=False,
                                      fetch_shards=self.hub.fetch_shards if self.hub else None, source=self.name)

    def host_state(self, index: int, device: torch.device, dtype: torch.dtype, seed: int,
                   to_host: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
        """Block ``index``'s tensors in host memory, holding at most one tensor on ``device`` at a time
        (presets: generated on the device, so the values match a resident run)."""
        if self.preset is None:
            lb = self.block(index, torch.device("cpu"), dtype, seed)
            return {k: to_host(v) for k, v in lb.module.state_dict().items()}
        from ditprof.model_blocks.presets import block_on_meta

        prefix = self.family.prefix(self.kind, index)
        out = {}
        for k, t in block_on_meta(self.family, self.config, self.kind).state_dict().items():
            out[k] = to_host(synth_tensor(prefix + k, tuple(t.shape), seed, self.family.tensor_dtype(k, dtype),
                                          device))
        return out


def open_source(source: str, source_kind: str, kind: str | None) -> Source:
    """The run's source (``model_blocks.source.resolve_as``) opened, nothing loaded."""
    from ditprof.model_blocks.opened import open_model
    from ditprof.model_blocks.source import resolve_as

    m = open_model(resolve_as(source, source_kind), kind)
    return Source(source, m.source.source_kind, m.family, m.config, m.kind, m.n_blocks, preset=m.preset,
                  layout=m.layout, hub=m.hub, held=m.held)


def _ranges(ids: list[int]) -> str:
    out, start, prev = [], None, None
    for i in ids + [None]:
        if start is None:
            start = prev = i
        elif i is not None and i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    return ", ".join(out) if ids else "none"


def check_blocks(src: Source, n: int) -> None:
    if n < 1:
        raise DitprofError(f"--blocks must be >= 1 (got {n})")
    what = f"preset {src.name}" if src.preset is not None else f"checkpoint {src.name}"
    if n > src.model_blocks:
        raise DitprofError(f"--blocks {n} is larger than the {what}'s block count "
                           f"({src.model_blocks} {src.kind} blocks)")
    missing = sorted(set(range(n)) - set(src.held))
    if missing:
        raise DitprofError(f"--blocks {n} needs blocks 0-{n - 1}, but {what} holds only blocks "
                           f"{_ranges(src.held)} of {src.model_blocks} (missing {_ranges(missing)})")
