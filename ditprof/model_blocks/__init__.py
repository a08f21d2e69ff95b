"""Model blocks: presets, one-block loading from safetensors shards, inputs, synthetic checkpoints.

Public API (see docs/ARCHITECTURE.md): ``list_presets``, ``get_preset``, ``load_block``,
``make_inputs``, ``Preset``, ``LoadedBlock``, ``BlockInputs``; plus ``make_checkpoint``,
``get_family`` / ``FAMILIES`` and the memory helpers.
"""

from .families import FAMILIES, BlockFamily, LatentGrid, family_for_config, get_family
from .inputs import BlockInputs, make_inputs
from .loading import LoadedBlock, load_block
from .memory import MemoryReport, block_memory, measure_load_and_forward
from .presets import PRESETS, Preset, block_params, get_preset, list_presets
from .synthetic import make_checkpoint

__all__ = [
    "FAMILIES", "PRESETS", "BlockFamily", "BlockInputs", "LatentGrid", "LoadedBlock", "MemoryReport", "Preset",
    "block_memory", "block_params", "family_for_config", "get_family", "get_preset", "list_presets",
    "load_block", "make_checkpoint", "make_inputs", "measure_load_and_forward",
]
