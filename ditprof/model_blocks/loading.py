"""Load ONE block of a diffusers transformer from safetensors shards.

The block is built on the meta device (no memory), then each of its tensors is read from the
shard holding it (``safe_open`` memory-maps; ``get_tensor`` copies just that tensor), converted
straight to the target device/dtype and assigned into the block. Host memory peaks at about
one block (plus one tensor while converting), never the whole model.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ditprof.errors import DitprofError

from .block import LoadedBlock, _first, install_state, module_bytes, parent_modules  # noqa: F401 -- re-exported
from .checkpoint import CheckpointLayout, TensorReader, open_safetensors, read_layout, shards_for_prefix
from .families import BlockFamily, family_for_config
from .presets import block_on_meta
from .opened import open_model
from .source import ModelSource, resolve_source
from .synthetic import ensure_checkpoint

FLOAT_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16}


def read_tensors(layout: CheckpointLayout, family: BlockFamily, shapes: dict[str, tuple], *, device, dtype,
                 fetch_shards=None, owner: str, what: str) -> dict[str, torch.Tensor]:
    """Named tensors of a checkpoint outside the block (``shapes``: full name -> expected shape), each shard
    opened once, in the dtype diffusers would load them in; a one-line error for a missing name or a shape."""
    wmap = layout.weight_map
    missing = sorted(k for k in shapes if k not in wmap)
    if missing:
        raise DitprofError(f"{owner} lacks {len(missing)} {what}: {', '.join(missing[:5])}")
    shards: dict[str, list[str]] = {}
    for k in shapes:
        shards.setdefault(wmap[k], []).append(k)
    if fetch_shards is not None:
        fetch_shards(sorted(shards))
    out = {}
    for shard, keys in sorted(shards.items()):
        with TensorReader(layout.folder / shard) as reader:
            for k in keys:
                t = reader.read(k)
                if tuple(t.shape) != shapes[k]:
                    raise DitprofError(f"shape mismatch for {k} in {shard}: checkpoint {tuple(t.shape)}, "
                                       f"model expects {shapes[k]}")
                out[k] = t.to(device=device, dtype=family.tensor_dtype(k, dtype) or t.dtype)
    return out


def check_block_keys(family: BlockFamily, block: torch.nn.Module, found: list[str], where: str) -> None:
    """Missing / unexpected key check on names alone, before any tensor data is read."""
    expected = set(block.state_dict().keys())
    ignore = getattr(family.model_class, "_keys_to_ignore_on_load_unexpected", None) or []
    found_set = {k for k in found if not any(p in k for p in ignore)}
    missing, unexpected = expected - found_set, found_set - expected
    if missing:
        raise DitprofError(f"{where} is missing {len(missing)} key(s) of the block: {_first(missing)}")
    if unexpected:
        raise DitprofError(f"{where} has {len(unexpected)} unexpected key(s) for the block: {_first(unexpected)}")


def load_block_from_layout(
    layout: CheckpointLayout,
    block: int = 0,
    *,
    kind: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = torch.bfloat16,
    progress: bool = True,
    fetch_shards=None,
    source: str | None = None,
) -> LoadedBlock:
    t0 = time.perf_counter()
    device = torch.device(device)
    family = family_for_config(layout.config)
    kind_name = family.kind(kind).name
    n_blocks = family.checked_n_blocks(layout.config, kind_name, [block], family.name)
    prefix = family.prefix(kind_name, block)
    by_shard = shards_for_prefix(layout.weight_map, prefix)
    if not by_shard:
        stack = family.kind(kind_name).attribute + "."
        have = sorted({int(k[len(stack):].split(".")[0]) for k in layout.weight_map if k.startswith(stack)})
        held = f"; it holds blocks {_first(map(str, have), 8)}" if have else ""
        raise DitprofError(f"no tensors with prefix {prefix!r} in {layout.folder}{held}")
    if fetch_shards is not None:
        fetch_shards(list(by_shard))

    module = block_on_meta(family, layout.config, kind_name)
    check_block_keys(family, module, [k[len(prefix):] for keys in by_shard.values() for k in keys], str(layout.folder))
    expected = module.state_dict()

    # Pass 1, headers only: every shard opens cleanly and holds the right names, shapes and
    # dtypes before a single tensor byte is read.
    for shard, names in by_shard.items():
        with open_safetensors(layout.folder / shard) as f:
            absent = [n for n in names if n not in set(f.keys())]
            if absent:
                raise DitprofError(f"shard {shard} lacks {len(absent)} tensor(s) the index puts there: {_first(absent)}")
            for name in names:
                _check_slice(f.get_slice(name), name, expected[name[len(prefix):]], shard)

    # Pass 2: read each tensor straight into the target device/dtype.
    state: dict[str, torch.Tensor] = {}
    with _progress(progress, f"loading {prefix[:-1]}", sum(len(v) for v in by_shard.values())) as advance:
        for shard, names in by_shard.items():
            with TensorReader(layout.folder / shard) as reader:
                for name in names:
                    local = name[len(prefix):]
                    target = family.tensor_dtype(local, dtype)
                    tensor = reader.read(name)  # fresh, aligned memory: one tensor at a time
                    state[local] = tensor.to(device=device, dtype=target or tensor.dtype)
                    del tensor
                    advance()

    # a buffer the checkpoint does not carry: nothing in these families, but fail loudly
    params, nbytes = install_state(module, state, "block has tensors not in the checkpoint")
    del state
    parents = parent_modules(
        family, layout.config, kind_name,
        lambda shapes: read_tensors(layout, family, shapes, device=device, dtype=dtype, fetch_shards=fetch_shards,
                                    owner=str(layout.folder), what="tensor(s) of the modules the block's inputs "
                                                                   "come from"))
    heads, head_dim = family.heads(layout.config)
    return LoadedBlock(
        module=module, family=family, kind=kind_name, index=block, n_blocks=n_blocks, config=layout.config,
        source=source or str(layout.folder), params=params, bytes=nbytes, heads=heads, head_dim=head_dim,
        load_s=time.perf_counter() - t0, device=device, dtype=dtype, folder=layout.folder, shards=list(by_shard),
        parents=parents,
    )


def _check_slice(sl, name: str, expected: torch.Tensor, shard: str) -> None:
    shape = tuple(sl.get_shape())
    if shape != tuple(expected.shape):
        raise DitprofError(f"shape mismatch for {name} in {shard}: checkpoint {shape}, block expects {tuple(expected.shape)}")
    dt = sl.get_dtype()
    if dt not in ("F64", "F32", "F16", "BF16"):
        raise DitprofError(f"dtype mismatch for {name} in {shard}: checkpoint {dt}, block expects a float tensor")


class _progress:
    """Progress over tensors (a bar on a terminal, lines elsewhere), or a no-op."""

    def __init__(self, enabled: bool, label: str, total: int):
        self.enabled, self.label, self.total = enabled, label, total

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        from ditprof.progress import QUIET_S, make_progress, progress_console

        self._p = make_progress(progress_console(True), quiet_s=QUIET_S)
        self._p.__enter__()
        task = self._p.add_task(self.label, total=self.total)
        return lambda: self._p.advance(task)

    def __exit__(self, *exc):
        if self.enabled:
            self._p.__exit__(*exc)


def load_block(
    source: str | Path | ModelSource,
    block: int = 0,
    *,
    kind: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = torch.bfloat16,
    progress: bool = True,
) -> LoadedBlock:
    """One block of a preset (synthetic checkpoint, cached), a diffusers folder, or a HF repo id (a string's
    meaning decided by ``source.resolve_source``, or a ``ModelSource`` already resolved)."""
    src = source if isinstance(source, ModelSource) else resolve_source(source)
    if src.kind == "preset":
        preset = src.preset
        kind = kind or preset.kind
        folder = ensure_checkpoint(preset, blocks=[block], kind=kind, progress=progress)
        loaded = load_block_from_layout(
            read_layout(folder), block, kind=kind, device=device, dtype=dtype, progress=progress, source=src.text
        )
        loaded.preset = preset
        return loaded
    opened = open_model(src, kind)
    return load_block_from_layout(opened.layout, block, kind=kind, device=device, dtype=dtype, progress=progress,
                                  fetch_shards=opened.fetch_shards, source=src.text)
