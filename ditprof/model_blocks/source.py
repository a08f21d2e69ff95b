"""Where a model comes from: one string resolved to a preset, a local checkpoint folder or a Hugging Face repo id.

The one set of checks every entry point (``load_block``, the run plan, the CLI's ``--preset`` / ``--checkpoint``)
applies, in this order: a preset name; a pickle file name (refused: weights are never unpickled); an existing
folder; an ``owner/name`` string that names no local path (a Hub repo id); anything else is a one-line error that
says what it is not. Nothing here reads weights or reaches the network: an offline Hub (``HF_HUB_OFFLINE``) is
refused here, at once, and the Hub itself is asked only when the repo is opened (``opened.open_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ditprof.errors import DitprofError

from .checkpoint import PICKLE_SUFFIXES
from .hub import hub_offline, looks_like_repo_id
from .preset_configs import PRESETS, Preset, get_preset

NOT_A_PRESET = " (and not a preset name)"  # a repo id (owner/name) is never a preset name


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "preset" | "folder" | "hub"
    text: str  # the string as given
    preset: Preset | None = None  # kind "preset"
    path: Path | None = None  # kind "folder": the folder given (``read_layout`` finds a pipeline's transformer/)
    repo_id: str | None = None  # kind "hub"

    @property
    def source_kind(self) -> str:
        """"preset" or "checkpoint" (a folder or a repo), the two kinds the run settings and reports name."""
        return "preset" if self.kind == "preset" else "checkpoint"


def resolve_source(text: str | Path, *, presets: bool = True) -> ModelSource:
    """``text`` as a preset (unless ``presets`` is False: ``--checkpoint`` takes folders and repos only), an
    existing folder or a Hub repo id; a one-line ``DitprofError`` naming what was tried otherwise."""
    text = str(text)
    if not text.strip():
        raise DitprofError("empty model source: give a preset name, a checkpoint folder or a Hugging Face repo id")
    if presets and text in PRESETS:
        return ModelSource("preset", text, preset=PRESETS[text])
    path = Path(text).expanduser()
    if path.suffix in PICKLE_SUFFIXES:
        raise DitprofError(f"refusing to unpickle {_shown(text, path)}: only safetensors checkpoints are read")
    if path.is_dir():
        return ModelSource("folder", text, path=path)
    if path.exists():
        raise DitprofError(f"checkpoint folder not found: {_shown(text, path)} is a file (give the folder holding "
                           "config.json)")
    preset_hint = _preset_hint(text, presets)
    if looks_like_repo_id(text):  # never a preset name (those hold no "/"), whether or not presets were asked
        if hub_offline():
            raise DitprofError(f"no folder {text} here{NOT_A_PRESET}, and the Hugging Face Hub is offline "
                               f"(HF_HUB_OFFLINE is set), so repo {text} cannot be looked up")
        return ModelSource("hub", text, repo_id=text)
    if "/" in text or "\\" in text or text.startswith((".", "~")):
        raise DitprofError(f"checkpoint folder not found: {_shown(text, path)}{preset_hint}")
    if presets:
        raise DitprofError(f"{text!r} is not a preset ({', '.join(PRESETS)}), a folder, or a Hugging Face repo id")
    raise DitprofError(f"{text!r} is not a folder or a Hugging Face repo id (owner/name){preset_hint}")


def _shown(text: str, path: Path) -> str:
    """The string as given, with its expansion when ``~`` changed it."""
    return text if str(path) == text or not text.startswith("~") else f"{text} ({path})"


def _preset_hint(text: str, presets: bool) -> str:
    if not presets and text in PRESETS:
        return f"; {text} is a preset: give it with --preset"
    return NOT_A_PRESET if presets else ""


def resolve_preset(text: str) -> ModelSource:
    """``--preset NAME``: a preset, or the one line listing the known ones."""
    return ModelSource("preset", text, preset=get_preset(text))


def resolve_as(text: str, source_kind: str) -> ModelSource:
    """The source of a run's settings: ``source_kind`` "preset" (``--preset``) or "checkpoint" (``--checkpoint``:
    a folder or a repo id, never a preset)."""
    if source_kind == "preset":
        return resolve_preset(text)
    if source_kind == "checkpoint":
        return resolve_source(text, presets=False)
    raise DitprofError(f"unknown source kind {source_kind!r} (known: preset, checkpoint)")
