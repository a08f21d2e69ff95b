"""Preset sizes, token grids and block inputs."""

from __future__ import annotations

import pytest
import torch
from accelerate import init_empty_weights

from ditprof.cli import main
from ditprof.model_blocks import get_family, get_preset, list_presets, load_block, make_inputs
from ditprof.model_blocks.presets import block_bytes, block_on_meta, block_params

# Per-block parameter counts published in shared/reference/diffusers-notes.md (millions).
PUBLISHED_M = {
    ("h3", "main"): 822.3, ("wan2.1-t2v-14b", "main"): 351.4, ("wan2.1-t2v-1.3b", "main"): 46.4,
    ("flux.1-dev", "double"): 339.8, ("flux.1-dev", "single"): 141.6,
    ("hunyuan-video", "double"): 339.8, ("hunyuan-video", "single"): 141.6,
    ("ltx-video", "main"): 67.2, ("cogvideox-5b", "main"): 132.2,
}


@pytest.mark.parametrize("name,kind", sorted(PUBLISHED_M))
def test_block_params_match_published_sizes(name, kind):
    assert block_params(get_preset(name), kind) / 1e6 == pytest.approx(PUBLISHED_M[name, kind], abs=0.1)


def test_h3_block_is_822m_params_and_1_53_gib():
    h3 = get_preset("h3")
    assert h3.n_blocks == 50 and h3.default_tokens == 30272 and h3.text_tokens == 512
    assert get_family("wan").heads(h3.config) == (56, 128)
    assert block_params(h3) / 1e6 == pytest.approx(822.3, abs=0.1)
    assert block_bytes(h3) / 2**30 == pytest.approx(1.53, abs=0.005)
    mini = get_preset("h3-mini")
    assert mini.n_blocks == 50 and get_family("wan").heads(mini.config) == (4, 128)
    assert get_preset("wan2.1-t2v-14b").n_blocks == 40


@pytest.mark.parametrize("name", [p.name for p in list_presets() if p.tiny] + ["h3-mini", "ltx-video"])
def test_standalone_block_matches_the_models_own_block(name):
    """Our block construction equals diffusers' block i in the full model (names, shapes)."""
    preset = get_preset(name)
    family = preset.adapter
    with init_empty_weights():
        model = family.model_class.from_config(preset.config)
    for kind in family.kinds:
        ours = block_on_meta(family, preset.config, kind.name).state_dict()
        theirs = getattr(model, kind.attribute)[0].state_dict()
        assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
        assert len(getattr(model, kind.attribute)) == family.n_blocks(preset.config, kind.name)


@pytest.mark.parametrize(
    "name,size,tokens",
    [
        ("wan2.1-t2v-1.3b", (480, 832, 81), 32760),
        ("wan2.1-t2v-14b", (720, 1280, 81), 75600),
        ("flux.1-dev", (1024, 1024, None), 4096),
        ("hunyuan-video", (720, 1280, 129), 118800),
        ("ltx-video", (512, 704, 161), 7392),
        ("cogvideox-5b", (480, 720, 49), 17550),
    ],
)
def test_tokens_from_pixel_size(name, size, tokens):
    preset = get_preset(name)
    assert preset.adapter.grid_from_size(preset.config, *size).tokens == tokens
    assert preset.default_tokens == tokens


@pytest.mark.parametrize("tokens", [30272, 2048, 75600, 4096, 97])
def test_grid_from_tokens_is_exact_and_fits_rope(tokens):
    grid = get_family("wan").grid_from_tokens(tokens)
    assert grid.tokens == tokens and max(grid.frames, grid.height, grid.width) <= 1024
    flat = get_family("flux").grid_from_tokens(tokens)
    assert flat.frames == 1 and flat.tokens == tokens


def test_h3_mini_inputs_from_tokens_and_forward(tmp_path, monkeypatch):
    monkeypatch.setenv("DITPROF_CACHE", str(tmp_path))
    loaded = load_block("h3-mini", 0, progress=False)  # bf16; writes a cached synthetic checkpoint
    assert loaded.params == block_params(get_preset("h3-mini")) and (loaded.heads, loaded.head_dim) == (4, 128)
    assert loaded.module.scale_shift_table.dtype == torch.float32  # kept in fp32 like diffusers
    assert loaded.module.attn1.to_q.weight.dtype == torch.bfloat16
    inputs = make_inputs(loaded)
    hidden, text, temb, (cos, sin) = inputs.args
    assert hidden.shape == (1, 2048, 512) and hidden.dtype == torch.bfloat16
    assert text.shape == (1, 512, 512) and temb.shape == (1, 6, 512) and temb.dtype == torch.float32
    assert cos.shape == sin.shape == (1, 2048, 1, 128)
    with torch.inference_mode():
        out = inputs.run(loaded.module)
    assert out.shape == hidden.shape and torch.isfinite(out).all()
    assert 0.1 < out.float().std() < 100 and not torch.equal(out, hidden)


def test_inputs_are_deterministic_and_never_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("DITPROF_CACHE", str(tmp_path))
    for name in ("wan-tiny", "flux-tiny", "hunyuan-video-tiny", "ltx-video-tiny", "cogvideox-tiny"):
        loaded = load_block(name, 0, dtype=torch.float32, progress=False)
        a, b, c = (make_inputs(loaded, tokens=24, seed=s) for s in (0, 0, 1))
        ta = [t for t in list(a.args) + list(a.kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        tb = [t for t in list(b.args) + list(b.kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        tc = [t for t in list(c.args) + list(c.kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        assert all(torch.equal(x, y) for x, y in zip(ta, tb))
        assert not torch.equal(ta[0], tc[0])
        assert ta[0].abs().min() >= 0 and ta[0].abs().sum() > 0 and a.tokens == 24
        batch2 = make_inputs(loaded, tokens=24, batch=2)
        assert batch2.run(loaded.module).shape == (2, 24, loaded.heads * loaded.head_dim)


def test_presets_command_prints_table(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("h3 "))
    assert "822.3 M" in row and "1.53 GiB" in row and "56 x 128" in row and "30,272" in row
    assert "flux.1-dev" in out and "single" in out and "cogvideox-5b" in out


def test_memory_report_on_cpu(tmp_path, monkeypatch):
    from ditprof.model_blocks import measure_load_and_forward

    monkeypatch.setenv("DITPROF_CACHE", str(tmp_path))
    report, loaded, inputs = measure_load_and_forward("wan-tiny", 1, device="cpu", dtype=torch.bfloat16, tokens=24)
    assert report.params == loaded.params == block_params(get_preset("wan-tiny"))
    # bf16 weights plus the fp32-kept scale_shift_table / norm2 (diffusers' _keep_in_fp32_modules)
    assert 2 * report.params < report.bytes == block_bytes(get_preset("wan-tiny")) < 4 * report.params
    assert report.peak_load_bytes is None and report.peak_forward_bytes is None  # CUDA only
    assert report.input_bytes > 0 and inputs.tokens == 24
