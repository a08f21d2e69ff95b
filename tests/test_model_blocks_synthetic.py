"""Synthetic checkpoints: deterministic, diffusers layout, cached, atomic."""

from __future__ import annotations

import hashlib
import json

import torch

from ditprof.cli import main
from ditprof.model_blocks import get_family, get_preset, load_block, make_checkpoint
from ditprof.model_blocks.checkpoint import INDEX_NAME, read_layout
from ditprof.model_blocks.synthetic import default_dir


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_deterministic_and_independent_of_other_blocks(tmp_path):
    preset = get_preset("h3-mini")
    a, _ = make_checkpoint(preset, tmp_path / "a", blocks=[0, 1], progress=False)
    b, _ = make_checkpoint(preset, tmp_path / "b", blocks=[0, 1], progress=False)
    assert _digest(a) == _digest(b)
    c, _ = make_checkpoint(preset, tmp_path / "c", blocks=[1], progress=False)
    d, _ = make_checkpoint(preset, tmp_path / "d", blocks=[1], seed=1, progress=False)
    one = load_block(c, 1, progress=False).module.state_dict()
    both = load_block(a, 1, progress=False).module.state_dict()
    other_seed = load_block(d, 1, progress=False).module.state_dict()
    assert all(torch.equal(one[k], both[k]) for k in one)
    assert not torch.equal(one["attn.to_q.weight"], other_seed["attn.to_q.weight"])


def test_layout_names_and_real_block_count(tmp_path):
    folder, reused = make_checkpoint(get_preset("h3-mini"), tmp_path / "x", blocks=[0, 1], progress=False)
    assert not reused
    names = sorted(p.name for p in folder.iterdir())
    assert names == [  # one shard per block, one for the time embedder the block's inputs come from
        "config.json",
        "diffusion_pytorch_model-00001-of-00003.safetensors",
        "diffusion_pytorch_model-00002-of-00003.safetensors",
        "diffusion_pytorch_model-00003-of-00003.safetensors",
        INDEX_NAME,
    ]
    layout = read_layout(folder)
    assert layout.config["num_layers"] == 50  # the model's real depth, though only 2 blocks are stored
    blocks = {k for k in layout.weight_map if k.startswith("transformer_blocks.")}
    assert {k.split(".")[1] for k in blocks} == {"0", "1"}
    assert {k for k in layout.weight_map if k not in blocks} == {
        f"time_embedder.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")}
    index = json.loads((folder / INDEX_NAME).read_text())
    sizes = sum((folder / s).stat().st_size for s in set(layout.weight_map.values()))
    assert 0 < index["metadata"]["total_size"] <= sizes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir renamed away


def test_cache_reuse_and_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DITPROF_CACHE", str(tmp_path))
    assert main(["make-checkpoint", "--preset", "wan-tiny"]) == 0
    first = capsys.readouterr().out
    assert "wrote" in first and str(tmp_path / "checkpoints" / "wan-tiny-") in first.replace("\n", "")
    folder = next((tmp_path / "checkpoints").iterdir())
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert main(["make-checkpoint", "--preset", "wan-tiny"]) == 0
    assert "reused" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert main(["make-checkpoint", "--preset", "h3-mini", "--block-indices", "2,3", "--out", str(tmp_path / "o")]) == 0
    wmap = read_layout(tmp_path / "o").weight_map
    assert {k.split(".")[1] for k in wmap if k.startswith("transformer_blocks.")} == {"2", "3"}
    assert main(["make-checkpoint", "--preset", "h3-mini", "--block-indices", "x"]) == 2
    assert "--block-indices must be" in capsys.readouterr().err


def test_tiny_whole_model_loads_in_diffusers(tmp_path, monkeypatch):
    """The whole-model synthetic checkpoint is a real diffusers checkpoint, and block i agrees."""
    monkeypatch.setenv("DITPROF_CACHE", str(tmp_path))
    preset = get_preset("flux-tiny")
    loaded = load_block("flux-tiny", 1, kind="single", dtype=torch.float32, progress=False)
    assert loaded.folder.parent == tmp_path / "checkpoints"
    model = get_family(preset.family).model_class.from_pretrained(loaded.folder)
    theirs = model.single_transformer_blocks[1].state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in loaded.module.state_dict().items())
    # the same cache folder serves both stacks
    assert load_block("flux-tiny", 0, kind="double", progress=False).folder == loaded.folder
    assert default_dir(preset, "abc").name == "flux-tiny-abc"


def test_realistic_scales(tmp_path):
    folder, _ = make_checkpoint(get_preset("h3-mini"), tmp_path / "x", blocks=[0], progress=False)
    sd = load_block(folder, 0, dtype=torch.float32, progress=False).module.state_dict()
    assert abs(sd["attn.to_q.weight"].std().item() - 384**-0.5) < 0.002
    assert abs(sd["ff.net.2.weight"].std().item() - 1024**-0.5) < 0.002
    assert abs(sd["norm2.weight"].mean().item() - 1) < 0.01
    assert abs(sd["adaln_proj.linear.weight"].std().item() - 192**-0.5) < 0.002
    assert sd["adaln_proj.linear.bias"].abs().max() < 0.2


def test_loading_holds_at_most_the_block_in_host_memory(tmp_path):
    """Resident memory grows by the block's bytes (+10%) when loading, not by the shard or model."""
    import subprocess
    import sys

    preset = get_preset("wan2.1-t2v-1.3b")  # 88.6 MiB bf16 block: large against allocator noise
    folder, _ = make_checkpoint(preset, tmp_path / "c", blocks=[1], progress=False)
    code = f"""
import gc, torch
from ditprof.model_blocks import load_block
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
gc.collect()
before = status("VmRSS:")
loaded = load_block({str(folder)!r}, 1, progress=False)
print(status("VmHWM:") - before, loaded.bytes)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    grown, block = map(int, out.split())
    assert block > 80 * 2**20
    assert grown <= 1.1 * block, f"host memory grew {grown / 2**20:.0f} MiB for a {block / 2**20:.0f} MiB block"
