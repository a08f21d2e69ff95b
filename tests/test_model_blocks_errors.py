"""Bad input gives a one-line DitprofError naming the problem, and nothing is written."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ditprof.errors import DitprofError
from ditprof.model_blocks import get_family, get_preset, load_block, make_checkpoint
from ditprof.model_blocks.checkpoint import INDEX_NAME, read_layout


@pytest.fixture(scope="module")
def wan_ckpt(tmp_path_factory):
    """A whole tiny Wan model (fp32) in the synthetic sharded layout: one shard per block."""
    folder, _ = make_checkpoint(get_preset("wan-tiny"), tmp_path_factory.mktemp("w") / "ckpt", blocks=None, progress=False)
    return folder


@pytest.fixture
def ckpt(wan_ckpt, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(wan_ckpt, dst)
    return dst


def _shard_of(folder, key):
    return read_layout(folder).weight_map[key]


def _raises(match, fn, *a, **k):
    with pytest.raises(DitprofError, match=match) as info:
        fn(*a, **k)
    assert "\n" not in str(info.value)
    return str(info.value)


def load(folder, block=0, **k):
    return load_block(folder, block, dtype=torch.float32, progress=False, **k)


def test_missing_folder(tmp_path):
    _raises("checkpoint folder not found", load, tmp_path / "nope")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    _raises("missing config.json", load, ckpt)


def test_missing_shard_named_by_index(ckpt):
    shard = _shard_of(ckpt, "blocks.1.ffn.net.2.weight")
    (ckpt / shard).unlink()
    _raises(f"missing shard {shard}", load, ckpt, 1)
    load(ckpt, 0)  # other blocks still load: only the block's shards are needed


def test_truncated_shard(ckpt):
    shard = ckpt / _shard_of(ckpt, "blocks.0.ffn.net.2.weight")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    _raises("corrupt or truncated safetensors file", load, ckpt, 0)


def test_corrupt_header(ckpt):
    shard = ckpt / _shard_of(ckpt, "blocks.0.ffn.net.2.weight")
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\0" * 64)
    _raises("corrupt or truncated safetensors file", load, ckpt, 0)


def test_block_index_out_of_range(ckpt):
    msg = _raises("block index 7 out of range", load, ckpt, 7)
    assert "2 blocks" in msg
    _raises("block index -1 out of range", load, ckpt, -1)


def test_prefix_with_no_keys(tmp_path):
    folder, _ = make_checkpoint(get_preset("h3-mini"), tmp_path / "c", blocks=[0], progress=False)
    msg = _raises("no tensors with prefix 'transformer_blocks.3.'", load, folder, 3)
    assert "holds blocks 0" in msg


def _rewrite_shard(folder, key, edit):
    shard = _shard_of(folder, key)
    tensors = load_file(str(folder / shard))
    edit(tensors)
    save_file(tensors, str(folder / shard))
    index = json.loads((folder / INDEX_NAME).read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard}
    index["weight_map"].update({k: shard for k in tensors})
    (folder / INDEX_NAME).write_text(json.dumps(index))


def test_missing_keys(ckpt):
    _rewrite_shard(ckpt, "blocks.0.ffn.net.2.weight", lambda t: t.pop("blocks.0.ffn.net.2.weight"))
    _raises(r"missing 1 key\(s\) of the block: ffn.net.2.weight", load, ckpt, 0)


def test_unexpected_keys(ckpt):
    def add(t):
        t["blocks.0.extra.weight"] = torch.ones(3)
        t["blocks.0.more.bias"] = torch.ones(3)

    _rewrite_shard(ckpt, "blocks.0.ffn.net.2.weight", add)
    _raises(r"2 unexpected key\(s\) for the block: extra.weight, more.bias", load, ckpt, 0)


def test_shape_mismatch(ckpt):
    def edit(t):
        t["blocks.0.ffn.net.2.weight"] = torch.ones(5, 5)

    _rewrite_shard(ckpt, "blocks.0.ffn.net.2.weight", edit)
    _raises(r"shape mismatch for blocks.0.ffn.net.2.weight", load, ckpt, 0)


def test_dtype_mismatch(ckpt):
    def edit(t):
        t["blocks.0.ffn.net.2.weight"] = torch.ones_like(t["blocks.0.ffn.net.2.weight"], dtype=torch.int32)

    _rewrite_shard(ckpt, "blocks.0.ffn.net.2.weight", edit)
    _raises(r"dtype mismatch for blocks.0.ffn.net.2.weight .*I32", load, ckpt, 0)


def test_unknown_family_and_model_class(ckpt):
    _raises(r"unknown family 'sd3' \(known: minimax-h3, wan, flux", get_family, "sd3")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["_class_name"] = "SD3Transformer2DModel"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _raises(r"unknown model class 'SD3Transformer2DModel' .*WanTransformer3DModel", load, ckpt)


def test_unknown_preset_lists_known():
    _raises(r"unknown preset 'h4' \(known: h3, h3-mini", get_preset, "h4")


def test_unknown_kind(ckpt):
    _raises(r"no block kind 'single' \(known: main\)", load, ckpt, 0, kind="single")


def test_refuses_pickles(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(get_preset("wan-tiny").config))
    (tmp_path / "diffusion_pytorch_model.bin").write_bytes(b"not read")
    _raises("refusing to unpickle diffusion_pytorch_model.bin", load, tmp_path)
    _raises("refusing to unpickle", load, tmp_path / "diffusion_pytorch_model.bin")


def test_unknown_source_names_the_options():
    _raises("is not a preset .*h3-mini.*, a folder, or a Hugging Face repo id", load_block, "no such thing")


def test_make_checkpoint_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "c"
    _raises("block index 60 out of range", make_checkpoint, get_preset("h3-mini"), out, blocks=[0, 60], progress=False)
    _raises("unknown dtype", make_checkpoint, get_preset("h3-mini"), out, dtype="int8", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_make_checkpoint_refuses_foreign_folder(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _raises("exists and is not this checkpoint", make_checkpoint, get_preset("wan-tiny"), out, progress=False)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_minimax_h3_sizes_and_row_counts_it_cannot_lay_out():
    fam = get_family("minimax-h3")
    cfg = get_preset("h3").config
    _raises(r"multiples of 32 \(VAE 16 x patch 2\), got 770x1344", fam.layout_from_size, cfg, 770, 1344, 124, 512)
    _raises("packed layout of 2 rows cannot hold 0 text rows plus at least one video row",
            fam.layout_from_tokens, cfg, 2, 512)
    _raises("tokens must be positive", fam.layout_from_tokens, cfg, 0, 512)
