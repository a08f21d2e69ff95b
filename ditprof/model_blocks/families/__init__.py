"""Block family adapters, looked up by name or by the ``_class_name`` of a diffusers config."""

from __future__ import annotations

from ditprof.errors import DitprofError

from .base import BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit
from .cogvideox import CogVideoXFamily
from .flux import FluxFamily
from .flux2 import Flux2Family
from .hunyuan_video import HunyuanVideoFamily
from .hunyuan_video15 import HunyuanVideo15Family
from .ltx import LTXVideoFamily
from .ltx2 import LTX2Family
from .minimax_h3 import MiniMaxH3Family
from .qwen_image import QwenImageFamily
from .wan import WanFamily

FAMILIES: dict[str, BlockFamily] = {
    f.name: f for f in (MiniMaxH3Family(), WanFamily(), FluxFamily(), HunyuanVideoFamily(), LTXVideoFamily(),
                        CogVideoXFamily(), QwenImageFamily(), Flux2Family(), LTX2Family(), HunyuanVideo15Family())
}


def get_family(name: str) -> BlockFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise DitprofError(f"unknown family {name!r} (known: {', '.join(FAMILIES)})") from None


def family_for_config(config: dict) -> BlockFamily:
    """The adapter for a diffusers transformer config, chosen by its ``_class_name``; a value of the wrong type
    is a one-line error here, before anything is built from the config."""
    class_name = config.get("_class_name")
    for family in FAMILIES.values():
        if class_name in family.class_names:
            family.check_value_types(config)
            return family
    known = ", ".join(n for f in FAMILIES.values() for n in f.class_names)
    raise DitprofError(f"unknown model class {class_name!r} in config.json (known: {known})")


__all__ = ["FAMILIES", "BlockFamily", "BlockKind", "BlockPlan", "LatentGrid", "SeqSplit", "family_for_config",
           "get_family"]
