"""A resolved model source opened without loading a block: its family adapter, config, block stack and the
blocks a checkpoint holds (a folder's or a Hub repo's config.json and index; a preset's config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ditprof.errors import DitprofError

from .checkpoint import CheckpointLayout, read_layout
from .families import BlockFamily, family_for_config, get_family
from .hub import HubCheckpoint
from .preset_configs import Preset
from .source import NOT_A_PRESET, ModelSource


@dataclass
class OpenedModel:
    source: ModelSource
    family: BlockFamily
    config: dict
    kind: str  # the block stack, resolved (a preset's own by default, else the family's first)
    n_blocks: int  # blocks in that stack in the whole model
    preset: Preset | None = None
    layout: CheckpointLayout | None = None  # folder / hub: config.json and the index
    hub: HubCheckpoint | None = None
    held: list[int] = field(default_factory=list)  # blocks of the stack whose tensors exist (a preset: all)

    @property
    def fetch_shards(self):
        """The Hub fetcher of the shards a block needs (None: every shard is local)."""
        return self.hub.fetch_shards if self.hub is not None else None


def open_model(source: ModelSource, kind: str | None = None) -> OpenedModel:
    """``source`` opened: for a Hub repo, config.json and the index are fetched (no shard yet)."""
    if source.kind == "preset":
        preset = source.preset
        family = get_family(preset.family)
        k = family.kind(kind or preset.kind).name
        n = family.n_blocks(preset.config, k)
        return OpenedModel(source, family, preset.config, k, n, preset=preset, held=list(range(n)))
    if source.kind == "folder":
        hub, layout = None, read_layout(source.path)
    elif source.kind == "hub":
        hub = HubCheckpoint(source.repo_id, why=f"no folder {source.text} here{NOT_A_PRESET}")
        layout = read_layout(hub.folder)
    else:
        raise DitprofError(f"unknown model source kind {source.kind!r} (known: preset, folder, hub)")
    family = family_for_config(layout.config)
    k = family.kind(kind).name
    n = family.n_blocks(layout.config, k)
    stack = family.kind(k).attribute + "."
    held = sorted({int(name[len(stack):].split(".")[0]) for name in layout.weight_map if name.startswith(stack)})
    return OpenedModel(source, family, layout.config, k, n, layout=layout, hub=hub, held=held)
