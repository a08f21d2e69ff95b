"""A loaded block and how weights go into modules built on the meta device (shared by the checkpoint loader and
the synthetic checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ditprof.errors import DitprofError

from .families import BlockFamily
from .preset_configs import Preset


@dataclass
class LoadedBlock:
    module: torch.nn.Module  # diffusers' own block class, eval mode, no grad
    family: BlockFamily
    kind: str
    index: int
    n_blocks: int
    config: dict
    source: str
    params: int
    bytes: int
    heads: int
    head_dim: int
    load_s: float
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype | None = None  # the requested compute dtype (fp32-kept params stay fp32)
    folder: Path | None = None
    shards: list[str] = field(default_factory=list)  # shard files opened for this block
    preset: Preset | None = None
    parents: dict[str, torch.nn.Module] = field(default_factory=dict)  # family.input_modules, weights set


def parent_modules(family: BlockFamily, config: dict, kind: str, tensors) -> dict[str, torch.nn.Module]:
    """The family's ``input_modules`` with their weights: ``tensors({full_name: shape})`` supplies them (read
    from the checkpoint with ``read_tensors``, or synthetic), in the dtype diffusers would load them in."""
    with torch.device("meta"):
        mods = family.input_modules(config, kind)
    for name, mod in mods.items():
        state = tensors({f"{name}.{k}": tuple(t.shape) for k, t in mod.state_dict().items()})
        install_state(mod, {k[len(name) + 1:]: t for k, t in state.items()},
                      f"input module {name} has tensors not in the checkpoint")
    return mods


def module_bytes(module: torch.nn.Module) -> tuple[int, int]:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(p.numel() for p in module.parameters()), sum(t.numel() * t.element_size() for t in tensors)


def install_state(module: torch.nn.Module, state: dict[str, torch.Tensor], missing: str) -> tuple[int, int]:
    """Put ``state`` into a block built on the meta device (strict; the tensors are taken, not copied), fail if a
    tensor is still on meta (``missing`` says why that would be), freeze it. Returns (params, bytes)."""
    module.load_state_dict(state, strict=True, assign=True)
    leftovers = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.is_meta]
    if leftovers:
        raise DitprofError(f"{missing}: {_first(leftovers)}")
    module.eval().requires_grad_(False)
    return module_bytes(module)


def _first(names, n=5) -> str:
    names = sorted(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more
