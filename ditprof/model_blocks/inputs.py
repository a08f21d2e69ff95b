"""Forward inputs for a loaded block, shaped exactly as its parent model hands them over."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ditprof.errors import DitprofError

from .block import LoadedBlock
from .families import LatentGrid, get_family


Size = tuple[int, int, int]  # (height, width, frames) in pixels


@dataclass
class BlockInputs:
    args: tuple  # empty when made by make_inputs: every input is named in ``kwargs``
    kwargs: dict
    tokens: int  # rows of the hidden states (image/video tokens; every packed row for a packed family)
    text_tokens: int  # rows of the separate text stream (0: none, or packed into the hidden states)
    grid: LatentGrid
    output_index: int | None = None  # where the hidden states sit in the block's output tuple
    mask_note: str | None = None  # why the block's attention mask masks positions (None: it keeps every key)
    requested_size: Size | None = None  # the pixel size asked for (or the preset's); None: a token count
    used_size: Size | None = None  # the pixel size the grid stands for, after the pipeline's rounding
    size_rule: str = ""  # the sizes the family keeps unchanged, in words

    @property
    def size_note(self) -> str | None:
        """One line when the requested pixel size was rounded to another one, else None."""
        return size_note(self.requested_size, self.used_size, self.size_rule)

    def run(self, module: torch.nn.Module) -> torch.Tensor:
        """Call the block; return the image/video hidden states whatever tuple order it uses."""
        out = module(*self.args, **self.kwargs)
        return out if self.output_index is None else out[self.output_index]


def size_text(size: Size) -> str:
    return "x".join(map(str, size))


def size_note(requested: Size | None, used: Size | None, rule: str = "") -> str | None:
    if requested is None or used is None or tuple(requested) == tuple(used):
        return None
    return (f"size {size_text(requested)} (height x width x frames) runs as {size_text(used)}"
            + (f": the pipeline takes {rule}" if rule else ""))


@dataclass(frozen=True)
class Layout:
    """What a size request resolves to: the grid, the prompt length and, for a pixel size, that size as asked
    and as used (the family rounds it to whole latents and patches)."""

    grid: LatentGrid
    text_tokens: int
    requested_size: Size | None = None
    used_size: Size | None = None
    size_rule: str = ""


def resolve_layout(family, config, preset, tokens=None, height=None, width=None, frames=None,
                   text_tokens=None) -> Layout:
    """The latent grid and prompt length the blocks see: ``tokens`` or ``height``/``width`` (+ ``frames``);
    with neither, the preset's default size (or the family's pipeline default)."""
    if tokens is not None and (height or width):
        raise DitprofError("give tokens or height/width, not both")
    if tokens is None and not (height or width):
        if preset is not None and preset.tokens is not None:
            tokens = preset.tokens
        elif preset is not None:
            height, width, frames = preset.height, preset.width, preset.frames
        else:
            height, width, frames = family.default_size
    text = preset.text_tokens if preset is not None else family.default_text_tokens
    if text_tokens is not None:
        text = int(text_tokens)
    if tokens is not None:
        return Layout(family.layout_from_tokens(config, int(tokens), text), text)
    if not (height and width):
        raise DitprofError("give both height and width")
    grid = family.layout_from_size(config, int(height), int(width), frames, text)
    requested = (int(height), int(width), int(frames) if frames is not None else 1)
    return Layout(grid, text, requested, tuple(family.pixel_size(config, grid)), family.size_rule(config))


def resolve_grid(family, config, preset, tokens=None, height=None, width=None, frames=None, text_tokens=None):
    """(grid, prompt length) of ``resolve_layout``."""
    lay = resolve_layout(family, config, preset, tokens, height, width, frames, text_tokens)
    return lay.grid, lay.text_tokens


def default_layout(preset) -> LatentGrid:
    """The grid (a packed layout for MiniMax-H3) of the preset's default size or token count."""
    return resolve_grid(get_family(preset.family), preset.config, preset)[0]


def default_tokens(preset) -> int:
    """The preset's default row count: its token count, else that of its default size."""
    return preset.tokens if preset.tokens is not None else default_layout(preset).tokens


def named(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by parameter name of ``module.forward`` (so plans can address them)."""
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    return dict(bound.arguments)


def make_inputs(
    loaded: LoadedBlock,
    *,
    tokens: int | None = None,
    height: int | None = None,
    width: int | None = None,
    frames: int | None = None,
    batch: int = 1,
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    text_tokens: int | None = None,
) -> BlockInputs:
    """Deterministic (seeded, drawn on CPU) non-zero inputs for ``loaded.module``.

    Give either ``tokens`` or ``height``/``width`` (+ ``frames`` for video); with neither, the
    preset's default (or the family's pipeline default size) is used.
    """
    family, config = loaded.family, loaded.config
    if batch < 1 or (text_tokens is not None and text_tokens < 1):
        raise DitprofError(f"batch and text_tokens must be positive (got {batch}, {text_tokens})")
    lay = resolve_layout(family, config, loaded.preset, tokens, height, width, frames, text_tokens)
    grid, text_tokens = lay.grid, lay.text_tokens
    device = torch.device(device) if device is not None else loaded.device
    dtype = dtype or loaded.dtype or torch.float32
    gen = torch.Generator().manual_seed(seed)
    args, kwargs = family.build_inputs(config, loaded.kind, grid, text_tokens, batch, gen, device, dtype,
                                       parents=loaded.parents)
    kwargs = named(loaded.module, args, kwargs)
    stream = family.stream_rows(config, text_tokens, loaded.kind)
    return BlockInputs((), kwargs, family.rows(grid, loaded.kind), stream, grid, family.output_index(loaded.kind),
                       family.masks_positions(config, text_tokens), lay.requested_size, lay.used_size, lay.size_rule)
