"""Reading a diffusers-format transformer folder without reading its weights.

A folder holds ``config.json`` and either one ``diffusion_pytorch_model.safetensors`` or shards
named by ``diffusion_pytorch_model.safetensors.index.json``. Everything here looks at JSON and
safetensors headers only; tensor data is read later, one block at a time (see ``loading``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ditprof.errors import DitprofError

CONFIG_NAME = "config.json"
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
SINGLE_NAME = "diffusion_pytorch_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def shard_name(i: int, n: int) -> str:
    """diffusers' shard file name, e.g. diffusion_pytorch_model-00001-of-00003.safetensors."""
    return f"diffusion_pytorch_model-{i:05d}-of-{n:05d}.safetensors"


@dataclass
class CheckpointLayout:
    folder: Path
    config: dict
    weight_map: dict[str, str]  # tensor name -> shard file name (relative to folder)
    metadata: dict


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DitprofError(f"missing {what}: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DitprofError(f"{what} {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DitprofError(f"{what} {path} is not a JSON object")
    return data


def transformer_folder(folder: str | Path) -> Path:
    """The folder holding config.json: the folder itself or a pipeline's ``transformer/``."""
    folder = Path(folder).expanduser()
    if folder.suffix in PICKLE_SUFFIXES:
        raise DitprofError(f"refusing to unpickle {folder}: only safetensors checkpoints are read")
    if not folder.is_dir():
        raise DitprofError(f"checkpoint folder not found: {folder}")
    if not (folder / CONFIG_NAME).is_file() and (folder / "transformer" / CONFIG_NAME).is_file():
        return folder / "transformer"
    return folder


def read_layout(folder: str | Path) -> CheckpointLayout:
    folder = transformer_folder(folder)
    config = read_json(folder / CONFIG_NAME, "config.json")
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = read_json(index_path, "index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise DitprofError(f"index {index_path} has no weight_map")
        return CheckpointLayout(folder, config, weight_map, index.get("metadata") or {})
    single = folder / SINGLE_NAME
    if single.is_file():
        with open_safetensors(single) as f:
            weight_map = {k: SINGLE_NAME for k in f.keys()}
        return CheckpointLayout(folder, config, weight_map, {})
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise DitprofError(
            f"refusing to unpickle {pickles[0]} in {folder}: only safetensors checkpoints are read "
            "(convert with diffusers save_pretrained(safe_serialization=True))"
        )
    raise DitprofError(f"no {INDEX_NAME} or {SINGLE_NAME} in {folder}")


def shards_for_prefix(weight_map: dict[str, str], prefix: str) -> dict[str, list[str]]:
    """Shard file -> the tensor names under ``prefix`` it holds (only shards that hold any)."""
    shards: dict[str, list[str]] = defaultdict(list)
    for name in sorted(weight_map):
        if name.startswith(prefix):
            shards[weight_map[name]].append(name)
    return dict(sorted(shards.items()))


class open_safetensors:
    """``safe_open`` that turns a missing, corrupt or truncated file into a one-line DitprofError.

    safe_open reads only the JSON header and memory-maps the rest; it checks the header's
    offsets against the file size, so a truncated file fails here, before any tensor is read.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self):
        if not self.path.is_file():
            raise DitprofError(f"missing shard {self.path.name} (named by the index) in {self.path.parent}")
        try:
            self._cm = safe_open(str(self.path), framework="pt", device="cpu")
            return self._cm.__enter__()
        except Exception as exc:  # safetensors raises SafetensorError / OSError with a long message
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DitprofError(f"corrupt or truncated safetensors file {self.path}: {reason}") from None

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class TensorReader:
    """Reads single tensors of a safetensors file (already validated by ``safe_open``) with plain
    ``readinto`` calls into fresh tensors.

    Why not ``safe_open(...).get_tensor``: on CPU it returns views of the memory-mapped file, so
    a block would hold its mapped pages *and* the copy we need anyway (aligned memory, no pinned
    mapping) -- twice the block in resident memory. Reading each tensor's byte range directly
    keeps the host at one block plus one tensor being converted.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = open(self.path, "rb")
        size = int.from_bytes(self._fh.read(8), "little")
        self._base = 8 + size
        self.header = json.loads(self._fh.read(size))

    def read(self, name: str) -> torch.Tensor:
        entry = self.header[name]
        begin, end = entry["data_offsets"]
        raw = torch.empty(end - begin, dtype=torch.uint8)
        self._fh.seek(self._base + begin)
        if self._fh.readinto(raw.numpy()) != end - begin:
            raise DitprofError(f"truncated safetensors file {self.path}: {name} ends past the end of the file")
        return raw.view(SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])

    def close(self) -> None:
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
