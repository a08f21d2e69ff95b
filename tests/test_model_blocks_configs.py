"""Checkpoints as diffusers writes them, with configs our presets don't use: each either profiles from
``--checkpoint`` or gets one line naming what is not supported."""

from __future__ import annotations

import json

import pytest
import torch

from ditprof.cli import main
from ditprof.errors import DitprofError
from ditprof.model_blocks import get_family, get_preset, load_block, make_inputs
from ditprof.model_blocks.presets import _wan

TINY = ["minimax-h3-tiny", "wan-tiny", "flux-tiny", "hunyuan-video-tiny", "ltx-video-tiny", "cogvideox-tiny",
        "qwen-image-tiny", "flux2-tiny", "ltx2-tiny", "hunyuan-video-1.5-tiny"]


def _save(cls, config: dict, folder, seed: int = 0):
    torch.manual_seed(seed)
    model = cls.from_config(config).eval()
    model.save_pretrained(folder, max_shard_size="8KB")
    return model


@pytest.mark.parametrize("name", TINY)
def test_profile_a_diffusers_saved_checkpoint(tmp_path, capsys, name):
    """save_pretrained of a tiny random model, then `ditprof profile --checkpoint DIR --block 1` on the CPU: the
    block holds exactly the saved tensors, and the run writes its report."""
    preset = get_preset(name)
    model = _save(get_family(preset.family).model_class, preset.config, tmp_path / "ckpt")
    out = tmp_path / "run"
    rc = main(["profile", "--checkpoint", str(tmp_path / "ckpt"), "--block", "1", "--device", "cpu",
               "--iters", "1", "--warmup", "1", "--tokens", "48", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"]["block_index"] == 1 and rep["model"]["family"] == preset.family
    loaded = load_block(tmp_path / "ckpt", 1, dtype=torch.float32, progress=False)
    theirs = get_family(preset.family).stack(model, loaded.kind)[1].state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in loaded.module.state_dict().items())


def _wan_model():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel


def _capture_block_inputs(model, call, index=1):
    seen = {}

    def hook(mod, args, kwargs, output):
        seen.update(kwargs)
        names = ["hidden_states", "encoder_hidden_states", "temb", "rotary_emb"]
        seen.update(dict(zip(names, args)))

    handle = model.blocks[index].register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(**call)
    handle.remove()
    return seen


def test_wan_rope_table_shorter_than_the_grid_is_one_line(tmp_path, capsys):
    cfg = _wan(2, 12, 48, 2, text_dim=16, freq_dim=16, in_channels=4, out_channels=4, rope_max_seq_len=32)
    _save(_wan_model(), cfg, tmp_path / "ckpt")
    # the pipeline's default size (what a CUDA run without a size uses)
    rc = main(["profile", "--checkpoint", str(tmp_path / "ckpt"), "--device", "cpu", "--iters", "1",
               "--height", "480", "--width", "832", "--frames", "81", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "width axis of the 21x30x52 token grid has 52 positions, more than this model's rope_max_seq_len=32" \
        in err[0]
    assert not (tmp_path / "run").exists()
    # a size inside the table profiles
    assert main(["profile", "--checkpoint", str(tmp_path / "ckpt"), "--device", "cpu", "--iters", "1",
                 "--warmup", "1", "--height", "128", "--width", "128", "--frames", "9",
                 "--out", str(tmp_path / "ok")]) == 0


def test_cpu_checkpoint_without_a_size_gets_a_small_default(tmp_path, capsys):
    """On CPU a checkpoint without a size runs a small grid (said to be one) instead of the pipeline's."""
    preset = get_preset("hunyuan-video-tiny")
    _save(get_family(preset.family).model_class, preset.config, tmp_path / "ckpt")
    out = tmp_path / "run"
    assert main(["profile", "--checkpoint", str(tmp_path / "ckpt"), "--device", "cpu", "--iters", "1",
                 "--warmup", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr().out
    assert "no size given on CPU: a small default of 1024 tokens" in " ".join(captured.split())
    rep = json.loads((out / "report.json").read_text())
    assert rep["model"]["tokens"] == 1024 and "small default" in rep["plan"]["note"]
    assert rep["plan"]["tokens"] == 1024 and rep["plan"]["attention_flops"] > 0 and rep["plan"]["gemm_flops"] > 0


def test_wan_i2v_blocks_get_the_image_context(tmp_path):
    """Wan I2V (image_dim, added_kv_proj_dim): the block's context is [257 CLIP image rows | 512 prompt rows],
    as the model hands it over; the image cross-attention is not left with 0 image rows."""
    cfg = _wan(2, 12, 48, 2, text_dim=16, freq_dim=16, in_channels=8, out_channels=4, image_dim=20,
               added_kv_proj_dim=24)
    model = _save(_wan_model(), cfg, tmp_path / "ckpt")
    g = torch.Generator().manual_seed(0)
    call = dict(hidden_states=torch.randn(1, 8, 3, 8, 8, generator=g), timestep=torch.tensor([500.0]),
                encoder_hidden_states=torch.randn(1, 512, 16, generator=g),
                encoder_hidden_states_image=torch.randn(1, 257, 20, generator=g))
    seen = _capture_block_inputs(model, call)
    loaded = load_block(tmp_path / "ckpt", 1, dtype=torch.float32, progress=False)
    mine = make_inputs(loaded, height=64, width=64, frames=9, text_tokens=512).kwargs
    assert mine["encoder_hidden_states"].shape == seen["encoder_hidden_states"].shape == (1, 769, 24)
    with torch.no_grad():
        out = loaded.module(**mine)
    assert torch.isfinite(out).all()
    with pytest.raises(DitprofError, match="must have 512 text tokens, got 8"):
        make_inputs(loaded, tokens=48, text_tokens=8)


def test_wan22_ti2v_blocks_get_a_per_token_temb(tmp_path):
    """Wan 2.2 TI2V-5B (48 latent channels): its pipeline expands the timestep per token, so every block gets a
    (B, S, 6, D) modulation -- the shape the model hands over for a (B, S) timestep."""
    cfg = _wan(2, 12, 48, 2, text_dim=16, freq_dim=16, in_channels=48, out_channels=48)
    model = _save(_wan_model(), cfg, tmp_path / "ckpt")
    g = torch.Generator().manual_seed(0)
    call = dict(hidden_states=torch.randn(1, 48, 3, 8, 8, generator=g), timestep=torch.full((1, 48), 500.0),
                encoder_hidden_states=torch.randn(1, 8, 16, generator=g))
    seen = _capture_block_inputs(model, call)
    loaded = load_block(tmp_path / "ckpt", 1, dtype=torch.float32, progress=False)
    mine = make_inputs(loaded, height=128, width=128, frames=9, text_tokens=8).kwargs  # 16x VAE: 3x4x4 tokens
    assert mine["temb"].shape == seen["temb"].shape == (1, 48, 6, 24)
    for a, b in zip(mine["rotary_emb"], seen["rotary_emb"]):
        torch.testing.assert_close(a, b.to(a.dtype))


def test_minimax_h3_with_other_head_counts_and_prompt_lengths(tmp_path, capsys):
    cfg = dict(get_preset("minimax-h3-tiny").config, num_attention_heads=3, attention_head_dim=16, hidden_size=32)
    preset = get_preset("minimax-h3-tiny")
    _save(get_family(preset.family).model_class, cfg, tmp_path / "ckpt")
    loaded = load_block(tmp_path / "ckpt", 0, dtype=torch.float32, progress=False)
    inputs = make_inputs(loaded, height=64, width=64, frames=22, text_tokens=20)
    assert inputs.grid.text == 20 and inputs.tokens == 20 + 74 + 7 * 2 * 2
    with torch.no_grad():
        assert inputs.run(loaded.module).shape == (1, inputs.tokens, 32)


def test_qwen_image_variants_are_one_line():
    """Qwen-Image's edit/layered configs are named as unsupported."""
    from ditprof.model_blocks import get_family

    fam = get_family("qwen-image")
    cfg = dict(get_preset("qwen-image-tiny").config, zero_cond_t=True)
    with pytest.raises(DitprofError, match="zero_cond_t=True .* not supported yet"):
        fam.build_block(cfg, "main")


@pytest.mark.parametrize("preset, family", [("ltx2-tiny", "ltx2"), ("hunyuan-video-1.5-tiny", "hunyuan-video-1.5")])
def test_sp_unwired_family_is_one_line(capsys, preset, family):
    """LTX-2 (video-to-audio cross-attention reads every video row) and HunyuanVideo-1.5 (a mask that masks
    positions) declare no sequence split: --sp says so in one line."""
    rc = main(["profile", "--preset", preset, "--device", "cpu", "--sp", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"{family} main blocks declare no sequence split" in err[0]


def test_masked_family_sdpa_baseline_is_exact_and_compare_says_the_swap_needs_masks(tmp_path, capsys):
    """HunyuanVideo-1.5 masks most of its padded text stream: the sdpa baseline passes the mask on (its output
    equals the block's own forward, which masks through diffusers' default backend); fp8-emulated gets the key
    subset; a backend without masks is reported as not run instead of failing."""
    from ditprof import dispatch as swap
    from ditprof.kernels import registry

    loaded = load_block("hunyuan-video-1.5-tiny", 0, dtype=torch.float32, progress=False)
    inputs = make_inputs(loaded, seed=3)
    mask = inputs.kwargs["attention_mask"]
    assert mask.dtype == torch.bool and 0 < int(mask.sum()) < mask.numel()  # really masks positions
    assert "1985 rows of which 8 are valid" in inputs.mask_note
    with torch.no_grad():
        ref = inputs.run(loaded.module)
        with swap.swapped(loaded.module, "sdpa", registry.get("sdpa").fn) as state:
            out = inputs.run(loaded.module)
    assert state.masks.get("passed", 0) >= 1
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # a backend that ignored the mask would differ: the check above can fail
    with torch.no_grad():
        unmasked = dict(inputs.kwargs, attention_mask=torch.ones_like(mask))
        assert not torch.allclose(loaded.module(**unmasked)[0], ref, atol=1e-4)

    out_dir = tmp_path / "run"
    rc = main(["compare", "--preset", "hunyuan-video-1.5-tiny", "--device", "cpu", "--iters", "1", "--warmup", "1",
               "--out", str(out_dir)])
    assert rc == 0, capsys.readouterr().err
    rep = json.loads((out_dir / "report.json").read_text())
    # fp8-emulated takes key-padding masks: it runs, on the valid keys only, close to the masked sdpa baseline
    assert rep["swapped"]["attention_masks"]["key_padding"] >= 1 and "swap_skipped" not in rep
    assert rep["accuracy"]["block_output_rel_rms"] < 0.02
    assert rep["model"]["attention_mask"].startswith("the text stream is padded to 1985 rows")
    # a backend that takes no mask is reported as not run instead of failing; ours take key masks
    from types import SimpleNamespace

    from ditprof.harness.run.runner import swap_skipped
    from ditprof.kernels import registry

    plain = SimpleNamespace(name="plain", fn=lambda q, k, v, *, scale=None: q)
    why = swap_skipped(plain, rep["model"]["attention_mask"])
    assert "plain was not run" in why and "needs key-padding mask support" in why
    for name in ("fp8", "fp8-emulated"):
        assert swap_skipped(registry.get(name), rep["model"]["attention_mask"]) is None
