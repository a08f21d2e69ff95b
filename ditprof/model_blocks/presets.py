"""Built-in model presets (``preset_configs``, plain data) and what needs the family adapters (diffusers) to answer
about them: the block count, the block built on the meta device, its parameter count and bytes."""

from __future__ import annotations

import json
from functools import lru_cache

import torch

from .families import BlockFamily, get_family
from .preset_configs import (  # noqa: F401 -- re-exported: the public names live here
    _TINY, PRESETS, Preset, _class_defaults, _cogvideox, _flux, _hunyuan, _ltx, _minimax_h3, _qwen_image, _wan,
    get_preset, list_presets,
)


def n_blocks(preset: Preset, kind: str | None = None) -> int:
    """Blocks in the preset's ``kind`` stack (default: the preset's own stack)."""
    return get_family(preset.family).n_blocks(preset.config, kind or preset.kind)


def block_on_meta(family: BlockFamily, config: dict, kind: str | None) -> torch.nn.Module:
    """The block built without allocating weights: shapes and names only."""
    with torch.device("meta"):
        return family.build_block(config, kind)


@lru_cache(maxsize=None)
def _params_cached(family_name: str, config_key: str, kind: str | None) -> int:
    family = get_family(family_name)
    block = block_on_meta(family, json.loads(config_key), kind)
    return sum(p.numel() for p in block.parameters())


def block_params(preset: Preset, kind: str | None = None) -> int:
    """Parameters of one block of the preset, counted on a meta-device build of the block."""
    return _params_cached(preset.family, json.dumps(preset.config, sort_keys=True), kind or preset.kind)


def block_size(family: BlockFamily, config: dict, kind: str | None,
               dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(params, bytes) of one block as loaded in ``dtype`` (fp32-kept tensors at 4 bytes), from a meta build."""
    block = block_on_meta(family, config, kind)
    params = sum(p.numel() for p in block.parameters())
    nbytes = sum(t.numel() * (torch.finfo(family.tensor_dtype(name, dtype)).bits // 8)
                 for name, t in block.state_dict().items())
    return params, nbytes


def block_bytes(preset: Preset, kind: str | None = None, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of one block of the preset in ``dtype``, counting the tensors diffusers keeps in fp32 at 4 bytes."""
    return block_size(get_family(preset.family), preset.config, kind or preset.kind, dtype)[1]
