"""Hugging Face repo ids: only config.json, the index and the block's shards are downloaded.

The network is not reachable in CI, so shard selection is tested on a real index file (the
FLUX.1-dev transformer, 3 shards) and the download path on a fake huggingface_hub.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.model_blocks import get_family, get_preset, load_block, make_checkpoint
from ditprof.model_blocks.presets import block_on_meta
from ditprof.model_blocks.checkpoint import shards_for_prefix
from ditprof.model_blocks.hub import looks_like_repo_id, transformer_subfolder, weights_file

DATA = Path(__file__).parent / "data"
S1, S2, S3 = (f"diffusion_pytorch_model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


@pytest.fixture(scope="module")
def flux_index():
    return json.loads((DATA / "flux1-dev.transformer.index.json").read_text())["weight_map"]


def test_real_flux_index_shard_selection(flux_index):
    assert len(flux_index) == 1160
    assert list(shards_for_prefix(flux_index, "transformer_blocks.0.")) == [S1]
    # block 14 straddles shards 1 and 2 in the published checkpoint: both are needed
    assert list(shards_for_prefix(flux_index, "transformer_blocks.14.")) == [S1, S2]
    assert list(shards_for_prefix(flux_index, "single_transformer_blocks.0.")) == [S2]
    assert list(shards_for_prefix(flux_index, "single_transformer_blocks.37.")) == [S3]
    # "transformer_blocks.1." must not pick up blocks 10-18 (prefix ends with the dot)
    keys = shards_for_prefix(flux_index, "transformer_blocks.1.")
    assert all(k.startswith("transformer_blocks.1.") for names in keys.values() for k in names)
    # and the published names are exactly our standalone block's state-dict keys
    block = block_on_meta(get_family("flux"), get_preset("flux.1-dev").config, "double")
    names = {k[len("transformer_blocks.1."):] for v in keys.values() for k in v}
    assert names == set(block.state_dict())


def test_repo_layout_helpers():
    pipeline = ["model_index.json", "transformer/config.json", "transformer/" + "diffusion_pytorch_model.safetensors.index.json"]
    assert transformer_subfolder(pipeline) == "transformer"
    assert weights_file(pipeline, "transformer").endswith(".index.json")
    assert transformer_subfolder(["config.json", "diffusion_pytorch_model.safetensors"]) == ""
    with pytest.raises(DitprofError, match="pickled weights are not read"):
        weights_file(["config.json", "diffusion_pytorch_model.bin"], "")
    assert looks_like_repo_id("Wan-AI/Wan2.1-T2V-14B-Diffusers")
    assert not looks_like_repo_id("./local/folder") and not looks_like_repo_id("h3")


def test_repo_id_downloads_only_needed_files(tmp_path, monkeypatch):
    """load_block on a repo id, with huggingface_hub replaced by a local fake 'repo'."""
    import huggingface_hub

    repo = tmp_path / "repo"
    folder, _ = make_checkpoint(get_preset("wan-tiny"), tmp_path / "src", blocks=None, progress=False)
    shutil.copytree(folder, repo / "transformer")
    (repo / "model_index.json").write_text("{}")
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    snapshot = tmp_path / "snapshot"
    downloaded = []

    class FakeApi:
        def list_repo_files(self, repo_id, revision=None):
            return files

    def fake_download(repo_id, filename, subfolder=None, revision=None):
        rel = f"{subfolder}/{filename}" if subfolder else filename
        downloaded.append(rel)
        dst = snapshot / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / rel, dst)
        return str(dst)

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr("ditprof.model_blocks.hub.hub_unreachable", lambda: None)  # the probe: no network in tests
    monkeypatch.setattr("ditprof.model_blocks.hub.hub_offline", lambda: False)
    monkeypatch.setattr("ditprof.model_blocks.source.hub_offline", lambda: False)
    loaded = load_block("someone/wan-tiny-diffusers", 1, dtype=torch.float32, progress=False)
    assert loaded.source == "someone/wan-tiny-diffusers"
    assert downloaded[:2] == ["transformer/config.json", "transformer/diffusion_pytorch_model.safetensors.index.json"]
    assert downloaded[2:] == [f"transformer/{s}" for s in loaded.shards]
    assert len([f for f in files if f.endswith(".safetensors")]) > len(loaded.shards)
