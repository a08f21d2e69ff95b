"""Built-in model presets: published diffusers configs (MiniMax-H3 the default), and tiny test models.

Plain data (no torch, no diffusers): ``ditprof presets`` and the CLI read it without the heavy imports. What is
derived from a preset lives with the code that derives it: its family adapter (``families.get_family``), block
count and per-block sizes (``presets``: built on the meta device from the config, so they can never drift from
it), its default grid and token count (``inputs.default_layout`` / ``inputs.default_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ditprof.errors import DitprofError


@dataclass(frozen=True)
class Preset:
    name: str
    family: str
    config: dict  # the diffusers config.json of the whole transformer
    kind: str = "main"  # default block stack: main / double / single
    tokens: int | None = None  # default video/image token count ...
    height: int | None = None  # ... or the pixel size the tokens come from
    width: int | None = None
    frames: int | None = None
    text_tokens: int = 512
    description: str = ""
    tiny: bool = False  # small enough to write (and test) the whole model
    checkpoint_dtype: str = "bfloat16"  # dtype of synthetic checkpoints
    extra: dict = field(default_factory=dict)


def _minimax_h3(**over) -> dict:
    """MiniMaxH3Transformer3DModel's defaults (the released model), overridden by ``over``."""
    cfg = {
        "_class_name": "MiniMaxH3Transformer3DModel",
        "_diffusers_version": "0.42.1",
        "num_attention_heads": 56,
        "attention_head_dim": 128,
        "hidden_size": 5376,
        "num_layers": 50,
        "num_refiner_layers": 2,
        "ffn_dim": 14336,
        "in_channels": 24,
        "audio_in_channels": 32,
        "patch_size": [1, 2, 2],
        "text_dim": 5120,
        "freq_dim": 256,
        "time_embed_hidden_dim": 5376,
        "time_embed_dim": 2688,
        "rope_freq_dim": 16,
        "rope_theta": 10000.0,
        "norm_eps": 1e-5,
        "qk_norm_eps": 1e-5,
        "final_norm_eps": 1e-5,
    }
    cfg.update(over)
    return cfg


def _qwen_image(heads, head_dim, layers, **over) -> dict:
    cfg = {
        "_class_name": "QwenImageTransformer2DModel",
        "_diffusers_version": "0.42.1",
        "patch_size": 2,
        "in_channels": 64,
        "out_channels": 16,
        "num_layers": layers,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": 3584,
        "guidance_embeds": False,
        "axes_dims_rope": [16, 56, 56],
    }
    cfg.update(over)
    return cfg


def _wan(heads, head_dim, ffn, layers, **over) -> dict:
    cfg = {
        "_class_name": "WanTransformer3DModel",
        "_diffusers_version": "0.42.1",
        "patch_size": [1, 2, 2],
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 4096,
        "freq_dim": 256,
        "ffn_dim": ffn,
        "num_layers": layers,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": None,
        "added_kv_proj_dim": None,
        "rope_max_seq_len": 1024,
        "pos_embed_seq_len": None,
    }
    cfg.update(over)
    return cfg


def _flux(heads, head_dim, layers, single, **over) -> dict:
    cfg = {
        "_class_name": "FluxTransformer2DModel",
        "_diffusers_version": "0.42.1",
        "patch_size": 1,
        "in_channels": 64,
        "out_channels": None,
        "num_layers": layers,
        "num_single_layers": single,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": 4096,
        "pooled_projection_dim": 768,
        "guidance_embeds": True,
        "axes_dims_rope": [16, 56, 56],
    }
    cfg.update(over)
    return cfg


def _hunyuan(heads, head_dim, layers, single, **over) -> dict:
    cfg = {
        "_class_name": "HunyuanVideoTransformer3DModel",
        "_diffusers_version": "0.42.1",
        "in_channels": 16,
        "out_channels": 16,
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "num_layers": layers,
        "num_single_layers": single,
        "num_refiner_layers": 2,
        "mlp_ratio": 4.0,
        "patch_size": 2,
        "patch_size_t": 1,
        "qk_norm": "rms_norm",
        "guidance_embeds": True,
        "text_embed_dim": 4096,
        "pooled_projection_dim": 768,
        "rope_theta": 256.0,
        "rope_axes_dim": [16, 56, 56],
        "image_condition_type": None,
    }
    cfg.update(over)
    return cfg


def _ltx(heads, head_dim, layers, **over) -> dict:
    cfg = {
        "_class_name": "LTXVideoTransformer3DModel",
        "_diffusers_version": "0.42.1",
        "in_channels": 128,
        "out_channels": 128,
        "patch_size": 1,
        "patch_size_t": 1,
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "cross_attention_dim": heads * head_dim,
        "num_layers": layers,
        "activation_fn": "gelu-approximate",
        "qk_norm": "rms_norm_across_heads",
        "norm_elementwise_affine": False,
        "norm_eps": 1e-6,
        "caption_channels": 4096,
        "attention_bias": True,
        "attention_out_bias": True,
    }
    cfg.update(over)
    return cfg


def _cogvideox(heads, head_dim, layers, **over) -> dict:
    cfg = {
        "_class_name": "CogVideoXTransformer3DModel",
        "_diffusers_version": "0.42.1",
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "in_channels": 16,
        "out_channels": 16,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "time_embed_dim": 512,
        "ofs_embed_dim": None,
        "text_embed_dim": 4096,
        "num_layers": layers,
        "dropout": 0.0,
        "attention_bias": True,
        "sample_width": 90,
        "sample_height": 60,
        "sample_frames": 49,
        "patch_size": 2,
        "patch_size_t": None,
        "temporal_compression_ratio": 4,
        "max_text_seq_length": 226,
        "activation_fn": "gelu-approximate",
        "timestep_activation_fn": "silu",
        "norm_elementwise_affine": True,
        "norm_eps": 1e-5,
        "spatial_interpolation_scale": 1.875,
        "temporal_interpolation_scale": 1.0,
        "use_rotary_positional_embeddings": True,
        "use_learned_positional_embeddings": False,
        "patch_bias": True,
    }
    cfg.update(over)
    return cfg


def _class_defaults(class_name: str, **over) -> dict:
    """A config that is the diffusers class's own defaults (the released model), overridden by ``over``."""
    return {"_class_name": class_name, "_diffusers_version": "0.42.1", **over}


_TINY = dict(tiny=True, checkpoint_dtype="float32")

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "h3", "minimax-h3", _minimax_h3(), tokens=30272, text_tokens=512,
            description="MiniMaxAI/MiniMax-H3 (class defaults), the design write-up's 30272 packed rows: a row "
                        "count, no request size gives it exactly (768x1344 px x 124 frames, the pipeline "
                        "default, packs 38222 rows; --height/--width/--frames for that)",
        ),
        Preset(
            "h3-mini", "minimax-h3",
            _minimax_h3(num_attention_heads=4, hidden_size=384, ffn_dim=1024, text_dim=320,
                        time_embed_hidden_dim=384, time_embed_dim=192),
            tokens=2048, text_tokens=512,
            description="MiniMax-H3 scaled down (4 x 128 heads, hidden 384) so a CPU runs one block in a second",
        ),
        Preset(
            "wan2.1-t2v-14b", "wan", _wan(40, 128, 13824, 40), height=720, width=1280, frames=81,
            description="Wan-AI/Wan2.1-T2V-14B-Diffusers, 720p x 81 frames",
        ),
        Preset(
            "wan2.1-t2v-1.3b", "wan", _wan(12, 128, 8960, 30), height=480, width=832, frames=81,
            description="Wan-AI/Wan2.1-T2V-1.3B-Diffusers, 480p x 81 frames",
        ),
        Preset(
            "wan2.2-t2v-a14b", "wan", _wan(40, 128, 13824, 40), height=720, width=1280, frames=81,
            description="Wan-AI/Wan2.2-T2V-A14B-Diffusers (each of its two experts), 720p x 81 frames",
        ),
        Preset(
            "wan2.2-ti2v-5b", "wan", _wan(24, 128, 14336, 30, in_channels=48, out_channels=48),
            height=704, width=1280, frames=121,
            description="Wan-AI/Wan2.2-TI2V-5B-Diffusers, 1280x704 x 121 frames (16x VAE, per-token timestep)",
        ),
        Preset(
            "flux.1-dev", "flux", _flux(24, 128, 19, 38), kind="double", height=1024, width=1024,
            description="black-forest-labs/FLUX.1-dev, 1024x1024 (use kind=single for the single stack)",
        ),
        Preset(
            "hunyuan-video", "hunyuan-video", _hunyuan(24, 128, 20, 40), kind="double",
            height=720, width=1280, frames=129, text_tokens=256,
            description="hunyuanvideo-community/HunyuanVideo, 720p x 129 frames",
        ),
        Preset(
            "ltx-video", "ltx-video", _ltx(32, 64, 28), height=512, width=704, frames=161, text_tokens=128,
            description="Lightricks/LTX-Video 2B (0.9.x), 704x512 x 161 frames",
        ),
        Preset(
            "cogvideox-5b", "cogvideox", _cogvideox(48, 64, 42), height=480, width=720, frames=49,
            text_tokens=226, description="THUDM/CogVideoX-5b, 720x480 x 49 frames",
        ),
        Preset(
            "qwen-image", "qwen-image", _qwen_image(24, 128, 60), height=1024, width=1024, text_tokens=128,
            description="Qwen/Qwen-Image, 1024x1024, a 128-token prompt (joint attention with the prompt mask)",
        ),
        Preset(
            "flux.2-dev", "flux2", _class_defaults("Flux2Transformer2DModel"), kind="double",
            height=1024, width=1024, text_tokens=512,
            description="black-forest-labs/FLUX.2-dev (class defaults), 1024x1024, the prompt padded to 512 "
                        "(use kind=single for the single stack)",
        ),
        Preset(
            "ltx-2", "ltx2", _class_defaults("LTX2VideoTransformer3DModel"), height=512, width=768, frames=121,
            text_tokens=1024,
            description="Lightricks/LTX-2 (class defaults), 768x512 x 121 frames at 24 fps with its audio stream",
        ),
        Preset(
            "hunyuan-video-1.5", "hunyuan-video-1.5",
            _class_defaults("HunyuanVideo15Transformer3DModel", task_type="t2v"), height=480, width=848,
            frames=121, text_tokens=128,
            description="hunyuanvideo-community/HunyuanVideo-1.5 480p T2V, 848x480 x 121 frames, a 128-token "
                        "prompt in a 1985-row padded text stream (its attention masks the padding)",
        ),
        # Tiny whole models for CPU tests (each block runs in milliseconds).
        Preset(
            "flux2-tiny", "flux2",
            _class_defaults("Flux2Transformer2DModel", num_layers=2, num_single_layers=2, attention_head_dim=16,
                            num_attention_heads=2, joint_attention_dim=16, in_channels=8,
                            timestep_guidance_channels=16, axes_dims_rope=[4, 4, 4, 4]),
            kind="double", tokens=36, text_tokens=8, description="tiny FLUX.2 for tests", **_TINY,
        ),
        Preset(
            "ltx2-tiny", "ltx2",
            _class_defaults("LTX2VideoTransformer3DModel", in_channels=8, out_channels=8, num_attention_heads=2,
                            attention_head_dim=8, cross_attention_dim=16, audio_in_channels=8,
                            audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=4,
                            audio_cross_attention_dim=8, num_layers=2, caption_channels=16),
            tokens=48, text_tokens=8, description="tiny LTX-2 for tests", **_TINY,
        ),
        Preset(
            "hunyuan-video-1.5-tiny", "hunyuan-video-1.5",
            _class_defaults("HunyuanVideo15Transformer3DModel", in_channels=9, out_channels=4,
                            num_attention_heads=2, attention_head_dim=16, num_layers=2, num_refiner_layers=1,
                            text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=8, rope_axes_dim=[4, 6, 6],
                            task_type="t2v"),
            tokens=48, text_tokens=8, description="tiny HunyuanVideo-1.5 for tests", **_TINY,
        ),
        Preset(
            "qwen-image-tiny", "qwen-image",
            _qwen_image(2, 16, 2, in_channels=8, out_channels=2, joint_attention_dim=16, axes_dims_rope=[4, 6, 6]),
            tokens=36, text_tokens=8, description="tiny Qwen-Image for tests", **_TINY,
        ),
        Preset(
            "minimax-h3-tiny", "minimax-h3",
            _minimax_h3(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2,
                        ffn_dim=48, in_channels=4, audio_in_channels=4, text_dim=16, freq_dim=16,
                        time_embed_hidden_dim=24, time_embed_dim=12, rope_freq_dim=2),
            tokens=64, text_tokens=8, description="tiny MiniMax-H3 for tests", **_TINY,
        ),
        Preset(
            "wan-tiny", "wan", _wan(2, 12, 48, 2, text_dim=16, freq_dim=16, in_channels=4, out_channels=4),
            tokens=48, text_tokens=8, description="tiny Wan for tests", **_TINY,
        ),
        Preset(
            "flux-tiny", "flux",
            _flux(2, 16, 2, 2, in_channels=8, joint_attention_dim=16, pooled_projection_dim=8,
                  axes_dims_rope=[4, 6, 6]),
            kind="double", tokens=36, text_tokens=8, description="tiny Flux for tests", **_TINY,
        ),
        Preset(
            "hunyuan-video-tiny", "hunyuan-video",
            _hunyuan(2, 16, 2, 2, in_channels=4, out_channels=4, num_refiner_layers=1, text_embed_dim=16,
                     pooled_projection_dim=8, rope_axes_dim=[4, 6, 6]),
            kind="double", tokens=48, text_tokens=8, description="tiny HunyuanVideo for tests", **_TINY,
        ),
        Preset(
            "ltx-video-tiny", "ltx-video", _ltx(2, 12, 2, in_channels=8, out_channels=8, caption_channels=16),
            tokens=48, text_tokens=8, description="tiny LTX-Video for tests", **_TINY,
        ),
        Preset(
            "cogvideox-tiny", "cogvideox",
            _cogvideox(2, 16, 2, in_channels=4, out_channels=4, time_embed_dim=16, text_embed_dim=16,
                       sample_width=8, sample_height=8, sample_frames=5, max_text_seq_length=8),
            tokens=48, text_tokens=8, description="tiny CogVideoX for tests", **_TINY,
        ),
    )
}


def list_presets() -> list[Preset]:
    return list(PRESETS.values())


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise DitprofError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None
