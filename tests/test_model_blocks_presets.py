"""Preset sizes, token grids and block inputs."""

from __future__ import annotations

import pytest
import torch
from accelerate import init_empty_weights

from ditprof.cli import main
from ditprof.model_blocks import get_family, get_preset, list_presets, load_block, make_inputs
from ditprof.model_blocks.inputs import default_tokens
from ditprof.model_blocks.presets import block_bytes, block_on_meta, block_params, n_blocks

# Per-block parameter counts published in shared/reference/diffusers-notes.md (millions).
PUBLISHED_M = {
    ("h3", "main"): 645.6, ("wan2.1-t2v-14b", "main"): 351.4, ("wan2.1-t2v-1.3b", "main"): 46.4,
    ("flux.1-dev", "double"): 339.8, ("flux.1-dev", "single"): 141.6,
    ("hunyuan-video", "double"): 339.8, ("hunyuan-video", "single"): 141.6,
    ("ltx-video", "main"): 67.2, ("cogvideox-5b", "main"): 132.2,
}


@pytest.mark.parametrize("name,kind", sorted(PUBLISHED_M))
def test_block_params_match_published_sizes(name, kind):
    assert block_params(get_preset(name), kind) / 1e6 == pytest.approx(PUBLISHED_M[name, kind], abs=0.1)


def test_h3_is_the_real_minimax_h3_block_645m_params_1_20_gib():
    h3 = get_preset("h3")
    fam = get_family("minimax-h3")
    assert get_family(h3.family) is fam and type(block_on_meta(fam, h3.config, "main")).__name__ == "MiniMaxH3TransformerBlock"
    assert n_blocks(h3) == 50 and default_tokens(h3) == 30272 and h3.text_tokens == 512
    assert fam.heads(h3.config) == (56, 128) and fam.dim(h3.config) == 5376  # inner 7168 > hidden 5376
    assert block_params(h3) / 1e6 == pytest.approx(645.6, abs=0.1)
    assert block_bytes(h3) / 2**30 == pytest.approx(1.20, abs=0.005)
    assert fam.n_blocks(h3.config, "refiner") == 2
    assert type(block_on_meta(fam, h3.config, "refiner")).__name__ == "MiniMaxH3TokenRefinerBlock"
    mini = get_preset("h3-mini")
    assert n_blocks(mini) == 50 and fam.heads(mini.config) == (4, 128) and get_family(mini.family) is fam
    assert n_blocks(get_preset("wan2.1-t2v-14b")) == 40


@pytest.mark.parametrize("name", [p.name for p in list_presets() if p.tiny] + ["h3-mini", "ltx-video"])
def test_standalone_block_matches_the_models_own_block(name):
    """Our block construction equals diffusers' block i in the full model (names, shapes)."""
    preset = get_preset(name)
    family = get_family(preset.family)
    with init_empty_weights():
        model = family.model_class.from_config(preset.config)
    for kind in family.kinds:
        ours = block_on_meta(family, preset.config, kind.name).state_dict()
        theirs = family.stack(model, kind.name)[0].state_dict()
        assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
        assert len(family.stack(model, kind.name)) == family.n_blocks(preset.config, kind.name)


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
    assert get_family(preset.family).grid_from_size(preset.config, *size).tokens == tokens
    assert default_tokens(preset) == tokens


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
    assert loaded.module.attn.to_q.weight.dtype == torch.bfloat16
    assert loaded.parents["time_embedder"].linear_1.weight.dtype == torch.float32  # kept in fp32 like diffusers
    inputs = make_inputs(loaded)
    kw = inputs.kwargs
    hidden, temb, idx, (cos, sin) = kw["hidden_states"], kw["temb"], kw["adaln_indices"], kw["rotary_emb"]
    lay = inputs.grid
    assert (lay.text, lay.tokens, inputs.tokens, inputs.text_tokens) == (512, 2048, 2048, 0)
    assert hidden.shape == (1, 2048, 384) and hidden.dtype == torch.bfloat16
    # two noise levels (the video and audio schedules' middle step), one AdaLN row per (timestep, modality)
    assert temb.shape == (2, 192) and temb.dtype == torch.float32
    assert cos.shape == sin.shape == (2048, 96) and cos.dtype == torch.float32
    T, A = lay.text, lay.audio_rows
    assert idx.dtype == torch.long and idx.shape == (2048,)
    video_t = idx[0] // 3  # text rows share the video rows' timestep
    assert (idx[:T] == video_t * 3 + 1).all() and (idx[T + A:] == video_t * 3 + 0).all()
    assert (idx[T:T + A] % 3 == 2).all() and (idx[T:T + A] // 3 != video_t).all()
    with torch.inference_mode():
        out = inputs.run(loaded.module)
    assert out.shape == hidden.shape and torch.isfinite(out).all()
    assert 0.1 < out.float().std() < 100 and not torch.equal(out, hidden)


@pytest.mark.parametrize("rows", [30272, 2048, 1024, 4096, 16384, 75600, 97])
def test_minimax_h3_row_layouts_are_exact(rows):
    fam = get_family("minimax-h3")
    cfg = get_preset("h3").config
    lay = fam.layout_from_tokens(cfg, rows, 512)
    assert lay.tokens == rows == lay.text + lay.audio_rows + lay.frames * lay.height * lay.width
    assert lay.text == min(512, rows // 4) and lay.audio_latents >= 1
    assert 1 / 4 <= lay.width / lay.height <= 4
    pos, tags, vid, aud, txt = fam.packed_sequence(cfg, lay)
    assert pos.shape == (rows, 3) and pos.dtype == torch.float64
    assert (vid.numel(), aud.numel(), txt.numel()) == (lay.video_tokens, lay.audio_rows, lay.text)
    assert str(rows) in str(lay) and "packed rows" in lay.describe()


def test_minimax_h3_layout_from_the_pipeline_geometry():
    fam = get_family("minimax-h3")
    cfg = get_preset("h3").config
    lay = fam.layout_from_size(cfg, 768, 1344, 124, 512)  # the pipeline's default request
    assert (lay.frames, lay.height, lay.width) == (37, 24, 42)  # 5n+2 latent frames, 1/16 then 2x2 patches
    assert lay.audio_latents == 207 and lay.audio_rows == 414 and lay.tokens == 512 + 414 + 37 * 24 * 42
    assert fam.layout_from_size(cfg, 768, 1344, 120, 512).pixel_size == (768, 1344, 124)  # snapped to 17n+5


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
    assert "645.6 M" in row and "1.20 GiB" in row and "56 x 128" in row and "30,272" in row
    assert "minimax-h3" in row
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
