"""Deterministic synthetic checkpoints for presets, in diffusers' sharded layout.

The same loader then runs for presets as for real checkpoints. Each tensor is generated from
(seed, tensor name) alone, so a checkpoint never depends on which other blocks were written
or in what order, and only one shard (at most one block) is held in memory while writing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ditprof.errors import DitprofError

from .checkpoint import CONFIG_NAME, INDEX_NAME, read_json, shard_name
from .block import LoadedBlock, install_state, parent_modules
from .families import BlockFamily, get_family
from .preset_configs import Preset, get_preset
from .presets import block_on_meta

FORMAT_VERSION = 1  # bump when the generated values change, so caches are not reused
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CHUNK = 1 << 22  # elements drawn per randn call: bounds the fp32 scratch for huge tensors
DEVICE_CHUNK = 1 << 24  # the same on a GPU


def cache_root() -> Path:
    """$DITPROF_CACHE, else $XDG_CACHE_HOME/ditprof, else ~/.cache/ditprof."""
    if os.environ.get("DITPROF_CACHE"):
        return Path(os.environ["DITPROF_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "ditprof"


def tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def init_scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(std, offset) of a synthetic tensor: realistic scales, so a bf16 block output is finite and non-trivial.

    Matrices: N(0, 1/fan_in) (unit-variance activations stay unit variance); norm scales ~1;
    biases small; adaLN ``scale_shift_table`` N(0, 1/dim) like diffusers' own init.
    """
    numel = math.prod(shape)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "scale_shift_table":
        return shape[-1] ** -0.5, 0.0
    if len(shape) >= 2:
        return (numel // shape[0]) ** -0.5, 0.0
    if leaf == "weight":  # 1-D weights are norm scales
        return 0.02, 1.0
    return 0.02, 0.0


def init_tensor(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The synthetic tensor ``name`` on the CPU, from (seed, name) alone (``init_scale`` gives its scale)."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, name))
    numel = math.prod(shape)
    out = torch.empty(numel, dtype=dtype)
    scale, offset = init_scale(name, shape)
    for start in range(0, numel, CHUNK):
        n = min(CHUNK, numel - start)
        out[start : start + n] = torch.randn(n, generator=gen) * scale + offset
    return out.view(shape)


def parse_blocks(spec: str | None) -> list[int] | None:
    """'0,1' -> [0, 1]; 'all' -> None (the whole model)."""
    if spec is None or spec == "":
        return [0]
    if spec == "all":
        return None
    try:
        blocks = sorted({int(x) for x in spec.split(",")})
    except ValueError:
        raise DitprofError(f"--block-indices must be 'all' or comma-separated block indices, got {spec!r}") from None
    return blocks


def _plan(preset: Preset, blocks: list[int] | None, kind: str) -> list[list[tuple[str, tuple]]]:
    """Shards as lists of (tensor name, shape): one shard per block, plus one for the rest."""
    family: BlockFamily = get_family(preset.family)
    if blocks is None:  # whole model: every tensor of the diffusers model
        from accelerate import init_empty_weights

        with init_empty_weights():
            model = family.model_class.from_config(preset.config)
        groups: dict[str, list] = {}
        for name, t in model.state_dict().items():
            stack = next((k for k in family.kinds if name.startswith(k.attribute + ".")), None)
            # one shard per block: the stack attribute (possibly dotted) and the block index
            key = ".".join(name.split(".")[:stack.attribute.count(".") + 2]) if stack else "_rest"
            groups.setdefault(key, []).append((name, tuple(t.shape)))
        return list(groups.values())
    family.checked_n_blocks(preset.config, kind, blocks, preset.name)
    block = block_on_meta(family, preset.config, kind)
    shapes = [(k, tuple(t.shape)) for k, t in block.state_dict().items()]
    plan = [[(family.prefix(kind, b) + k, s) for k, s in shapes] for b in blocks]
    with torch.device("meta"):  # the parent modules the block's inputs come from, in a shard of their own
        parents = family.input_modules(preset.config, kind)
    extra = [(f"{n}.{k}", tuple(t.shape)) for n, m in parents.items() for k, t in m.state_dict().items()]
    return plan + ([extra] if extra else [])


def checkpoint_hash(preset: Preset, blocks: list[int] | None, kind: str, seed: int, dtype: str) -> str:
    spec = dict(v=FORMAT_VERSION, config=preset.config, blocks=blocks, kind=kind, seed=seed, dtype=dtype)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def default_dir(preset: Preset, digest: str) -> Path:
    return cache_root() / "checkpoints" / f"{preset.name}-{digest}"


def _existing_hash(folder: Path) -> str | None:
    index = folder / INDEX_NAME
    if not index.is_file():
        return None
    return (read_json(index, "index").get("metadata") or {}).get("ditprof_hash")


def make_checkpoint(
    preset: Preset,
    out: str | Path | None = None,
    *,
    blocks: list[int] | None = (0,),
    kind: str | None = None,
    seed: int = 0,
    dtype: str | None = None,
    progress: bool = True,
) -> tuple[Path, bool]:
    """Write (or reuse) a checkpoint; returns (folder, reused). ``blocks=None``: the whole model."""
    kind = get_family(preset.family).kind(kind or preset.kind).name
    dtype = dtype or preset.checkpoint_dtype
    if dtype not in DTYPES:
        raise DitprofError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    blocks = None if blocks is None else sorted(set(blocks))
    # The whole model is the same whichever stack the caller asked about.
    digest = checkpoint_hash(preset, blocks, kind if blocks is not None else "*", seed, dtype)
    default = out is None
    out = Path(out).expanduser() if out is not None else default_dir(preset, digest)
    where = "--out" if not default else "$DITPROF_CACHE" if os.environ.get("DITPROF_CACHE") else "the user cache"
    try:  # stat raises PermissionError in a folder the user may not look into: one line too
        is_dir = out.is_dir()
        is_file = not is_dir and out.exists()
        found = _existing_hash(out) if is_dir else None
    except OSError as exc:
        raise DitprofError(f"cannot read the {preset.name} checkpoint at {out} ({where}): "
                           f"{_reason(exc, out.parent)}") from None
    if is_file:
        raise DitprofError(f"{out} exists and is a file, not a checkpoint folder; remove it or choose another --out")
    if is_dir:
        if found == digest:
            return out, True
        raise DitprofError(f"{out} exists and is not this checkpoint; remove it or choose another --out")
    plan = _plan(preset, blocks, kind)  # validates the blocks before anything is written

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise DitprofError(f"cannot write the {preset.name} checkpoint to {out} ({where}): "
                           f"{_reason(exc, out.parent)}") from None
    try:
        _write(preset, plan, tmp, seed, DTYPES[dtype], digest, blocks, kind, progress)
        try:
            tmp.rename(out)  # atomic: readers see no folder or a complete one
        except OSError:
            if _existing_hash(out) == digest:  # another process won the race with the same content
                shutil.rmtree(tmp, ignore_errors=True)
                return out, True
            raise
    except OSError as exc:  # disk full, permissions changed under us: one line, nothing left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise DitprofError(f"cannot write the {preset.name} checkpoint to {out} ({where}): "
                           f"{_reason(exc, out.parent)}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, False


def _reason(exc: OSError, folder: Path) -> str:
    """Why a folder cannot be written, in words: a file in the way, or the OS's reason."""
    for p in (folder, *folder.parents):  # the nearest existing path decides; one we may not stat is skipped
        try:
            if p.exists():
                return f"{p} is a file, not a folder" if not p.is_dir() else exc.strerror or str(exc)
        except OSError:
            continue
    return exc.strerror or str(exc)


def _write(preset, plan, folder: Path, seed, dtype, digest, blocks, kind, progress) -> None:
    from ditprof.progress import QUIET_S, make_progress, progress_console

    family = get_family(preset.family)
    n = len(plan)
    total_bytes = 0
    weight_map: dict[str, str] = {}
    sizes = sum(_numel(s) for shard in plan for _, s in shard)
    with make_progress(progress_console(progress), unit="bytes", quiet_s=QUIET_S) as bar:
        task = bar.add_task(f"writing {preset.name} checkpoint", total=sizes * torch.finfo(dtype).bits // 8,
                            unit="bytes")
        for i, shard in enumerate(plan, start=1):
            name = shard_name(i, n)
            tensors = {}
            for tensor_name, shape in shard:
                tensors[tensor_name] = init_tensor(tensor_name, shape, seed, family.tensor_dtype(tensor_name, dtype))
                nbytes = tensors[tensor_name].numel() * tensors[tensor_name].element_size()
                total_bytes += nbytes
                weight_map[tensor_name] = name
                bar.advance(task, _numel(shape) * torch.finfo(dtype).bits // 8)
            save_file(tensors, str(folder / name), metadata={"format": "pt"})
            del tensors
    (folder / CONFIG_NAME).write_text(json.dumps(preset.config, indent=2, sort_keys=True) + "\n")
    held = "all" if blocks is None else ",".join(map(str, blocks))
    index = {
        "metadata": {
            "total_size": total_bytes,
            "ditprof_hash": digest,
            "ditprof_preset": preset.name,
            "ditprof_blocks": f"{kind}:{held}",
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def ensure_checkpoint(preset: Preset, *, blocks: list[int], kind: str | None, progress: bool = True) -> Path:
    """The cached checkpoint load_block uses for a preset (tiny presets: the whole model)."""
    folder, _ = make_checkpoint(preset, blocks=None if preset.tiny else blocks, kind=kind, progress=progress)
    return folder


# --------------------------------------------------------------------------- synthetic weights made on a device

def synth_tensor(name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """Deterministic synthetic tensor generated on ``device`` from (seed, name) alone. On the CPU it is
    ``init_tensor`` (bit-identical to the synthetic checkpoint); on a GPU the same scales from the device's RNG."""
    device = torch.device(device)
    if device.type == "cpu":
        return init_tensor(name, tuple(shape), seed, dtype)
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, name))
    std, offset = init_scale(name, tuple(shape))
    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    flat = out.view(-1)
    for start in range(0, flat.numel(), DEVICE_CHUNK):
        n = min(DEVICE_CHUNK, flat.numel() - start)
        chunk = torch.randn(n, generator=gen, device=device, dtype=torch.float32)
        flat[start:start + n] = chunk.mul_(std).add_(offset)
        del chunk
    return out


def synth_tensors(family: BlockFamily, shapes: dict[str, tuple], seed: int, dtype: torch.dtype,
                  device: torch.device) -> dict[str, torch.Tensor]:
    """``synth_tensor`` for every (full name -> shape), fp32 where diffusers keeps the tensor in fp32."""
    return {k: synth_tensor(k, shape, seed, family.tensor_dtype(k, dtype), device) for k, shape in shapes.items()}


def synthetic_block(preset, index: int = 0, *, kind: str | None = None, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> LoadedBlock:
    """Block ``index`` of a preset with synthetic weights made on ``device`` (nothing read or written).

    fp32-kept parameters (diffusers' ``_keep_in_fp32_modules``) stay fp32, as the loader keeps them.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    t0 = time.perf_counter()
    device = torch.device(device)
    family = get_family(preset.family)
    kind_name = family.kind(kind or preset.kind).name
    n_blocks = family.checked_n_blocks(preset.config, kind_name, [index], preset.name)
    prefix = family.prefix(kind_name, index)
    module = block_on_meta(family, preset.config, kind_name)
    state = {
        k: synth_tensor(prefix + k, tuple(t.shape), seed, family.tensor_dtype(k, dtype), device)
        for k, t in module.state_dict().items()
    }
    params, nbytes = install_state(module, state, "synthetic block has tensors with no generator rule")
    del state
    parents = parent_modules(family, preset.config, kind_name,
                             lambda shapes: synth_tensors(family, shapes, seed, dtype, device))
    heads, head_dim = family.heads(preset.config)
    return LoadedBlock(
        module=module, family=family, kind=kind_name, index=index, n_blocks=n_blocks, config=preset.config,
        source=preset.name, params=params, bytes=nbytes, heads=heads, head_dim=head_dim,
        load_s=time.perf_counter() - t0, device=device, dtype=dtype, preset=preset, parents=parents,
    )


# QK-norm weights of trained DiTs have a few channels much larger than the rest (issue 18): the accuracy table's
# ``--qk-outliers`` variant gives the synthetic block such weights, so block-level FP8 numbers see them.
QK_NORM_LEAVES = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
QK_OUTLIER_CHANNELS, QK_OUTLIER_FACTOR = 4, 20.0


def qk_outlier_norms(module: torch.nn.Module, head_dim: int, seed: int = 0, channels: int = QK_OUTLIER_CHANNELS,
                     factor: float = QK_OUTLIER_FACTOR) -> list[str]:
    """Scale ``channels`` channels of every head (the same ones, drawn from ``seed``) of each QK-norm weight by
    ``factor``, in place; per-head weights (head_dim) and across-heads ones (heads x head_dim) alike. Returns the
    names changed (empty: the block has no QK norm with weights)."""
    gen = torch.Generator().manual_seed(tensor_seed(seed, "qk-outliers"))
    picked = torch.randperm(head_dim, generator=gen)[:channels]
    changed = []
    for name, p in module.named_parameters():
        parts = name.split(".")
        if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in QK_NORM_LEAVES or p.dim() != 1:
            continue
        if p.numel() % head_dim:
            continue
        scale = torch.ones(head_dim)
        scale[picked] = factor
        with torch.no_grad():
            p.mul_(scale.repeat(p.numel() // head_dim).to(p.device, p.dtype))
        changed.append(name)
    return changed
