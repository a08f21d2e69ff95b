"""The ``ditprof presets`` table, generated from the real classes and stored beside the configs.

Computing a row builds the block on the meta device (diffusers, ~7 s for every preset); the rows are written to
``presets_table.json`` by ``python -m ditprof.model_blocks.presets_table`` together with a fingerprint of what
they depend on (every preset's fields, the ditprof and diffusers versions). ``load`` returns them only while the
fingerprint still matches -- otherwise the command computes them live -- and a test recomputes them, so the stored
table cannot drift from the classes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from .preset_configs import list_presets

TABLE = Path(__file__).with_name("presets_table.json")
SCHEMA = "ditprof.presets-table/1"


def fingerprint() -> str:
    from ditprof import __version__

    try:
        diffusers = metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        diffusers = "absent"
    data = {"ditprof": __version__, "diffusers": diffusers, "presets": [asdict(p) for p in list_presets()]}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def compute_rows() -> tuple[list[dict], list[str]]:
    """(one row per preset and stack, the notes on packed layouts), from the classes (imports diffusers)."""
    from .families import get_family
    from .inputs import default_layout
    from .presets import block_bytes, block_params

    rows, notes = [], []
    for preset in list_presets():
        family = get_family(preset.family)
        layout = default_layout(preset)
        if layout.packed:  # one sequence of several modalities: say where the count comes from
            notes.append(f"{preset.name}: {layout.describe()}")
        heads, head_dim = family.heads(preset.config)
        for kind in family.kinds:
            rows.append({"preset": preset.name, "family": preset.family, "kind": kind.name,
                         "blocks": family.n_blocks(preset.config, kind.name), "heads": heads,
                         "head_dim": head_dim, "rows": family.rows(layout, kind.name),
                         "text_tokens": preset.text_tokens, "params": block_params(preset, kind.name),
                         "bytes": block_bytes(preset, kind.name)})
    return rows, notes


def load() -> tuple[list[dict], list[str]] | None:
    """The stored rows when they are still those of these presets and versions, else None."""
    try:
        data = json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return None
    if data.get("schema") != SCHEMA or data.get("fingerprint") != fingerprint():
        return None
    return data["rows"], data["notes"]


def write() -> Path:
    rows, notes = compute_rows()
    TABLE.write_text(json.dumps({"schema": SCHEMA, "fingerprint": fingerprint(), "rows": rows, "notes": notes},
                                indent=1) + "\n")
    return TABLE


if __name__ == "__main__":
    print(f"wrote {write()}")
