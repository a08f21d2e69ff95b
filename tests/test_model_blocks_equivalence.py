"""A block loaded alone from diffusers shards computes exactly what block i computes inside the model."""

from __future__ import annotations

import inspect

import pytest
import torch

from ditprof.model_blocks import get_family, get_preset, load_block, make_inputs
from ditprof.model_blocks.checkpoint import read_layout, shards_for_prefix

SEED = 1234


def _full_model_call(family: str, model, b: int = 1):
    """Inputs for the tiny full model matching pixel size H=64, W=64 (Flux W=96), 9 frames (LTX 128x128x17)."""
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cfg = model.config
    t = torch.full((b,), 500.0)
    if family == "wan":
        return dict(hidden_states=r(b, cfg.in_channels, 3, 8, 8), timestep=t, encoder_hidden_states=r(b, 8, cfg.text_dim))
    if family == "flux":
        h, w = 4, 6
        img_ids = torch.zeros(h, w, 3)
        img_ids[..., 1] += torch.arange(h)[:, None]
        img_ids[..., 2] += torch.arange(w)[None, :]
        return dict(
            hidden_states=r(b, h * w, cfg.in_channels), encoder_hidden_states=r(b, 8, cfg.joint_attention_dim),
            pooled_projections=r(b, cfg.pooled_projection_dim), timestep=t / 1000, img_ids=img_ids.reshape(-1, 3),
            txt_ids=torch.zeros(8, 3), guidance=torch.full((b,), 3.5) if cfg.guidance_embeds else None,
        )
    if family == "hunyuan-video":
        return dict(
            hidden_states=r(b, cfg.in_channels, 3, 8, 8), timestep=t, encoder_hidden_states=r(b, 8, cfg.text_embed_dim),
            encoder_attention_mask=torch.ones(b, 8), pooled_projections=r(b, cfg.pooled_projection_dim),
            guidance=torch.full((b,), 6.0),
        )
    if family == "ltx-video":
        return dict(
            hidden_states=r(b, 3 * 4 * 4, cfg.in_channels), encoder_hidden_states=r(b, 8, cfg.caption_channels),
            timestep=t, encoder_attention_mask=torch.ones(b, 8), num_frames=3, height=4, width=4,
            rope_interpolation_scale=(8 / 25, 32, 32),
        )
    if family == "cogvideox":
        from diffusers.models.embeddings import get_3d_rotary_pos_embed

        from ditprof.model_blocks.families.cogvideox import get_resize_crop_region_for_grid

        p = cfg.patch_size
        crops = get_resize_crop_region_for_grid((4, 4), cfg.sample_width // p, cfg.sample_height // p)
        rope = get_3d_rotary_pos_embed(cfg.attention_head_dim, crops, (4, 4), 3)
        return dict(
            hidden_states=r(b, 3, cfg.in_channels, 8, 8), encoder_hidden_states=r(b, 8, cfg.text_embed_dim),
            timestep=t, image_rotary_emb=rope,
        )
    if family == "qwen-image":
        h, w = 4, 6
        return dict(
            hidden_states=r(b, h * w, cfg.in_channels), encoder_hidden_states=r(b, 8, cfg.joint_attention_dim),
            encoder_hidden_states_mask=torch.ones(b, 8, dtype=torch.long), timestep=t / 1000,
            img_shapes=[[(1, h, w)]] * b,
        )
    if family == "flux2":  # Flux2Pipeline: 4-axis ids (t, h, w, l), sigma = t / 1000, guidance 4
        from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

        h, w = 4, 6
        prompt = r(b, 8, cfg.joint_attention_dim)
        return dict(
            hidden_states=r(b, h * w, cfg.in_channels), encoder_hidden_states=prompt, timestep=t / 1000,
            img_ids=Flux2Pipeline._prepare_latent_ids(torch.empty(b, 1, h, w)),
            txt_ids=Flux2Pipeline._prepare_text_ids(prompt),
            guidance=torch.full((b,), 4.0) if cfg.guidance_embeds else None,
        )
    if family == "ltx2":  # LTX2Pipeline: 3 x 4 x 6 latents, 17 frames at 24 fps -> 18 audio latents
        return dict(
            hidden_states=r(b, 3 * 4 * 6, cfg.in_channels), audio_hidden_states=r(b, 18, cfg.audio_in_channels),
            encoder_hidden_states=r(b, 8, cfg.caption_channels),
            audio_encoder_hidden_states=r(b, 8, cfg.caption_channels), timestep=t, sigma=t,
            encoder_attention_mask=torch.ones(b, 8), audio_encoder_attention_mask=torch.ones(b, 8),
            num_frames=3, height=4, width=6, fps=24.0, audio_num_frames=18,
        )
    if family == "hunyuan-video-1.5":  # T2V: an 8-token prompt padded to 1000, no glyph text, no image
        mask = torch.zeros(b, 1000)
        mask[:, :8] = 1
        return dict(
            hidden_states=r(b, cfg.in_channels, 3, 4, 6), timestep=t,
            encoder_hidden_states=r(b, 1000, cfg.text_embed_dim), encoder_attention_mask=mask,
            encoder_hidden_states_2=torch.zeros(b, 256, cfg.text_embed_2_dim),
            encoder_attention_mask_2=torch.zeros(b, 256), image_embeds=torch.zeros(b, 729, cfg.image_embed_dim),
        )
    if family == "minimax-h3":
        # The pipeline's own layout and timestep code for 64 x 96 px x 22 frames, an 8-row prompt, at the
        # middle of 50 steps of the two schedules (video shift 12, audio shift 3).
        from diffusers.modular_pipelines.minimax_h3.before_denoise import (
            MiniMaxH3PrepareLayoutStep,
            MiniMaxH3SetTimestepsStep,
        )
        from diffusers.schedulers import MiniMaxH3Scheduler

        pos, tags, vid, aud, txt, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            torch.ones(8, dtype=torch.long), 7, 4, 6, 37, (1, 2, 2), 2, 2, 0)
        ts = []
        for shift in (12.0, 3.0):
            sched = MiniMaxH3Scheduler(shift=shift)
            sched.set_timesteps(50)
            ts.append(float(sched.timesteps[25]))
        timestep, t_idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(vid, aud, 0, 0, 8, ts[0], ts[1], ts[0], 1.0)
        return dict(
            hidden_states=r(b, vid.numel(), cfg.in_channels * 4), audio_hidden_states=r(b, aud.numel(),
                                                                                           cfg.audio_in_channels),
            encoder_hidden_states=r(b, 8, cfg.text_dim), timestep=timestep, timestep_indices=t_idx,
            token_tags=tags, position_ids=pos, video_indices=vid, audio_indices=aud, text_indices=txt,
        )
    raise AssertionError(family)


SIZE = {  # (height, width, frames) giving the same token grid as _full_model_call
    "wan": (64, 64, 9), "flux": (64, 96, None), "hunyuan-video": (64, 64, 9),
    "ltx-video": (128, 128, 17), "cogvideox": (64, 64, 9), "minimax-h3": (64, 96, 22),
    "qwen-image": (64, 96, None), "flux2": (64, 96, None), "ltx2": (128, 192, 17), "hunyuan-video-1.5": (64, 96, 9),
}
# Inputs that are not random in the model (embeddings of the timestep, per-row indices): equal by value.
DETERMINISTIC = {"minimax-h3": {"temb", "adaln_indices"}, "flux2": {"temb_mod_img", "temb_mod_txt", "temb_mod"},
                 "ltx2": {"temb", "temb_audio", "temb_ca_scale_shift", "temb_ca_audio_scale_shift", "temb_ca_gate",
                          "temb_ca_audio_gate"},
                 "hunyuan-video-1.5": {"temb"}}

CASES = [
    ("minimax-h3-tiny", "main"), ("minimax-h3-tiny", "refiner"), ("qwen-image-tiny", "main"),
    ("wan-tiny", "main"), ("flux-tiny", "double"), ("flux-tiny", "single"), ("hunyuan-video-tiny", "double"),
    ("hunyuan-video-tiny", "single"), ("ltx-video-tiny", "main"), ("cogvideox-tiny", "main"),
    ("flux2-tiny", "double"), ("flux2-tiny", "single"), ("ltx2-tiny", "main"), ("hunyuan-video-1.5-tiny", "main"),
]


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """Each tiny family model, random-initialised and saved by diffusers into many small shards."""
    out = {}
    for name in sorted({c[0] for c in CASES}):
        preset = get_preset(name)
        torch.manual_seed(SEED)
        model = get_family(preset.family).model_class.from_config(preset.config).eval()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder, max_shard_size="4KB")
        out[name] = (model, folder)
    return out


def _capture(model, module, call):
    seen = {}

    def hook(mod, args, kwargs, output):
        seen["args"], seen["kwargs"], seen["out"] = _clone(args), _clone(kwargs), _clone(output)

    handle = module.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(**call)
    handle.remove()
    return seen


def _bound(module, args, kwargs) -> dict:
    sig = inspect.signature(module.forward)
    bound = sig.bind(*args, **kwargs)
    variadic = {n for n, p in sig.parameters.items() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return {k: v for k, v in bound.arguments.items() if k not in variadic}


@pytest.mark.parametrize("name,kind", CASES)
def test_standalone_block_equals_block_inside_model(saved_models, name, kind):
    model, folder = saved_models[name]
    _check_block_and_inputs(model, folder, get_preset(name).family, kind)


def _check_block_and_inputs(model, folder, family: str, kind: str) -> None:
    """Block 1 loaded alone from ``folder`` computes exactly what it computes inside ``model``, and make_inputs
    hands it what the model does (shapes, dtypes, masks / indices / rotary tables / timestep embeddings by value)."""
    from ditprof.model_blocks import get_family

    layout = read_layout(folder)
    assert len(set(layout.weight_map.values())) >= 8, "the model should be spread over many shards"
    index = 1
    stack = get_family(family).stack(model, kind)
    seen = _capture(model, stack[index], _full_model_call(family, model))

    loaded = load_block(folder, index, kind=kind, dtype=torch.float32, progress=False)
    assert type(loaded.module) is type(stack[index])
    assert (loaded.index, loaded.kind, loaded.n_blocks) == (index, kind, len(stack))
    with torch.no_grad():
        out = loaded.module(*seen["args"], **seen["kwargs"])
    expected = seen["out"]
    if isinstance(expected, tuple):
        assert all(torch.equal(a, b) for a, b in zip(out, expected))
    else:
        assert torch.equal(out, expected)

    # make_inputs for the same pixel size gives the same shapes and the model's own RoPE values.
    h, w, f = SIZE[family]
    mine = _bound(loaded.module, *_args_kwargs(make_inputs(loaded, height=h, width=w, frames=f, text_tokens=8)))
    theirs = _bound(loaded.module, seen["args"], seen["kwargs"])
    for arg, value in mine.items():
        ref = theirs[arg]
        if isinstance(value, torch.Tensor):
            assert value.shape == ref.shape, arg
            assert value.dtype == ref.dtype, arg
            if value.dtype == torch.bool or arg.endswith("mask") or not value.is_floating_point():
                assert torch.equal(value, ref), arg  # masks, indices and tags: by value
            elif arg in DETERMINISTIC.get(family, ()):
                torch.testing.assert_close(value, ref, rtol=1e-6, atol=1e-6)
            else:
                assert value.abs().sum() > 0, arg
        elif isinstance(value, tuple):  # rotary (cos, sin): positions must match the model's
            for a, b in zip(value, ref):
                torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-6, atol=1e-6)
    # and the captured tensors the block really uses are all provided by make_inputs
    assert {k for k, v in theirs.items() if isinstance(v, (torch.Tensor, tuple))} <= set(mine)


def _args_kwargs(inputs):
    return inputs.args, inputs.kwargs


# Configs our presets don't use, as a user's own diffusers-saved checkpoint would have them: other head counts and
# widths, guidance-free (distilled) variants, other norms and MLP ratios.
VARIANTS = [
    ("wan-tiny", "main", dict(num_attention_heads=3, attention_head_dim=8, ffn_dim=40, cross_attn_norm=False)),
    ("flux-tiny", "double", dict(num_attention_heads=3, attention_head_dim=8, axes_dims_rope=[2, 2, 4],
                                 guidance_embeds=False)),
    ("flux-tiny", "single", dict(num_attention_heads=3, attention_head_dim=8, axes_dims_rope=[2, 2, 4],
                                 guidance_embeds=False)),
    ("hunyuan-video-tiny", "double", dict(num_attention_heads=3, attention_head_dim=8, rope_axes_dim=[2, 2, 4],
                                          mlp_ratio=2.0)),
    ("ltx-video-tiny", "main", dict(num_attention_heads=3, attention_head_dim=8, cross_attention_dim=24)),
    ("cogvideox-tiny", "main", dict(num_attention_heads=3, attention_head_dim=16)),
    ("qwen-image-tiny", "main", dict(num_attention_heads=3, attention_head_dim=8, axes_dims_rope=[2, 2, 4])),
    ("minimax-h3-tiny", "main", dict(num_attention_heads=3, hidden_size=40, ffn_dim=72)),
    ("flux2-tiny", "single", dict(num_attention_heads=3, attention_head_dim=8, axes_dims_rope=[2, 2, 2, 2],
                                  guidance_embeds=False, mlp_ratio=2.0)),
    ("ltx2-tiny", "main", dict(num_attention_heads=3, attention_head_dim=8, cross_attention_dim=24,
                               audio_num_attention_heads=3, audio_attention_head_dim=4, audio_cross_attention_dim=12)),
    ("hunyuan-video-1.5-tiny", "main", dict(num_attention_heads=3, attention_head_dim=8, rope_axes_dim=[2, 2, 4],
                                            mlp_ratio=2.0)),
]


@pytest.mark.parametrize("name,kind,over", VARIANTS, ids=[f"{v[0]}-{v[1]}" for v in VARIANTS])
def test_other_configs_load_and_get_the_models_inputs(tmp_path, name, kind, over):
    preset = get_preset(name)
    torch.manual_seed(SEED)
    model = get_family(preset.family).model_class.from_config(dict(preset.config, **over)).eval()
    model.save_pretrained(tmp_path, max_shard_size="4KB")
    _check_block_and_inputs(model, tmp_path, preset.family, kind)


def test_loading_opens_only_the_shards_holding_the_block(saved_models, monkeypatch):
    import ditprof.model_blocks.checkpoint as checkpoint

    model, folder = saved_models["wan-tiny"]
    opened = []
    real = checkpoint.safe_open

    def spy(path, *a, **k):
        opened.append(path.rsplit("/", 1)[-1])
        return real(path, *a, **k)

    monkeypatch.setattr(checkpoint, "safe_open", spy)
    layout = read_layout(folder)
    wanted = set(shards_for_prefix(layout.weight_map, "blocks.1."))
    all_shards = set(layout.weight_map.values())
    loaded = load_block(folder, 1, dtype=torch.float32, progress=False)
    assert set(opened) == wanted == set(loaded.shards)
    assert len(wanted) >= 2 and len(wanted) < len(all_shards) / 2


def test_single_unsharded_file(tmp_path):
    preset = get_preset("ltx-video-tiny")
    torch.manual_seed(0)
    model = get_family(preset.family).model_class.from_config(preset.config).eval()
    model.save_pretrained(tmp_path)  # one diffusion_pytorch_model.safetensors, no index
    assert (tmp_path / "diffusion_pytorch_model.safetensors").is_file()
    loaded = load_block(tmp_path, 1, dtype=torch.float32, progress=False)
    for k, v in loaded.module.state_dict().items():
        assert torch.equal(v, model.transformer_blocks[1].state_dict()[k])
