"""Model blocks: presets, one-block loading from safetensors shards, inputs, synthetic checkpoints.

Public API (see docs/ARCHITECTURE.md): ``list_presets``, ``get_preset``, ``load_block``,
``make_inputs``, ``Preset``, ``LoadedBlock``, ``BlockInputs``; plus ``make_checkpoint``,
``get_family`` / ``FAMILIES`` and the memory helpers.
"""

from __future__ import annotations

import importlib

# Loaded on first use: the CLI imports this package to build its parser, and the families import diffusers.
_LAZY = {
    "FAMILIES": "families", "BlockFamily": "families", "LatentGrid": "families", "family_for_config": "families",
    "get_family": "families", "BlockInputs": "inputs", "make_inputs": "inputs", "LoadedBlock": "loading",
    "load_block": "loading", "MemoryReport": "memory", "block_memory": "memory",
    "measure_load_and_forward": "memory", "PRESETS": "presets", "Preset": "presets", "block_params": "presets",
    "get_preset": "presets", "list_presets": "presets", "make_checkpoint": "synthetic",
}


def __getattr__(name: str):
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ditprof.model_blocks' has no attribute {name!r}") from None
    return getattr(importlib.import_module(f"ditprof.model_blocks.{module}"), name)


__all__ = sorted(_LAZY)
