"""LTX-2 (``LTX2VideoTransformer3DModel``): one stack ``transformer_blocks`` of audio-video blocks.

Each block carries two streams -- video rows and audio rows -- through self-attention, cross-attention to the
prompt, and audio-to-video / video-to-audio cross-attention, with a timestep modulation per stream and per cross
path. The forward prepares all of it (RoPE from the model's own coordinate code, the prompt connector's mask,
ten modulation tensors), so the inputs are captured from the model's own forward (``BlockFamily.captured``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformer3DModel, LTX2VideoTransformerBlock

from ditprof.errors import DitprofError

from .base import BlockFamily, BlockKind, BlockPlan, LatentGrid, randn

FRAME_RATE = 24.0  # LTX2Pipeline frame_rate (x motion_speed 1.0: the conditioning frame rate)
AUDIO_SAMPLE_RATE, AUDIO_HOP, AUDIO_VAE_T = 16000, 160, 4  # LTX2Pipeline defaults without an audio VAE


@dataclass(frozen=True)
class AudioVideoGrid(LatentGrid):
    """The video token grid plus the audio latent frames of the same clip (the block's second stream)."""

    audio: int = 0

    def describe(self) -> str:
        return f"{super().describe()} + {self.audio} audio rows"


def audio_rows(pixel_frames: int) -> int:
    """Audio latent frames for a clip of ``pixel_frames`` at the pipeline's frame rate (LTX2Pipeline's rule)."""
    return round(pixel_frames / FRAME_RATE * AUDIO_SAMPLE_RATE / AUDIO_HOP / AUDIO_VAE_T)


class LTX2Family(BlockFamily):
    name = "ltx2"
    class_names = ("LTX2VideoTransformer3DModel",)
    kinds = (BlockKind("main", "transformer_blocks", "num_layers"),)
    default_text_tokens = 1024  # LTX2Pipeline max_sequence_length: the connector output keeps every row
    vae_stride = (8, 32, 32)
    default_size = (512, 768, 121)
    pipeline_timestep = 500.0
    captured = True
    output_children = ("norm_out", "proj_out", "audio_norm_out", "audio_proj_out")

    @property
    def model_class(self):
        return LTX2VideoTransformer3DModel

    def block_class(self, kind):
        return LTX2VideoTransformerBlock

    def plan(self, kind):
        # Not wired for --sp: video-to-audio cross-attention reads every video row from each audio query.
        return BlockPlan(outputs=("hidden_states", "audio_hidden_states"), sp=None)

    def patch_size(self, config):
        a = self.init_args(config)
        return (a["patch_size_t"], a["patch_size"], a["patch_size"])

    def check_config(self, config):
        a = self.init_args(config)
        if (a["patch_size"], a["patch_size_t"], a["audio_patch_size"], a["audio_patch_size_t"]) != (1, 1, 1, 1):
            raise DitprofError("LTX-2 configs with patch sizes other than 1 are not supported (the pipeline "
                               "packs latents 1 x 1 x 1)")

    def layout_from_size(self, config, height, width, frames, text_tokens):
        grid = self.grid_from_size(config, height, width, frames)
        return AudioVideoGrid(grid.frames, grid.height, grid.width, audio=audio_rows(frames or 1))

    def layout_from_tokens(self, config, tokens, text_tokens):
        grid = self.grid_from_tokens(tokens)
        pixel_frames = (grid.frames * self.patch_size(config)[0] - 1) * self.vae_stride[0] + 1
        return AudioVideoGrid(grid.frames, grid.height, grid.width, audio=max(1, audio_rows(pixel_frames)))

    def model_inputs(self, config, grid: LatentGrid, text_tokens, batch, gen, device, dtype):
        self.check_config(config)
        a = self.init_args(config)
        audio = getattr(grid, "audio", None) or audio_rows((grid.frames - 1) * self.vae_stride[0] + 1)
        t = torch.full((batch,), self.pipeline_timestep, device=device)
        return dict(
            hidden_states=randn((batch, grid.tokens, a["in_channels"]), gen, device, dtype),
            audio_hidden_states=randn((batch, audio, a["audio_in_channels"]), gen, device, dtype),
            encoder_hidden_states=randn((batch, text_tokens, a["caption_channels"]), gen, device, dtype),
            audio_encoder_hidden_states=randn((batch, text_tokens, a["caption_channels"]), gen, device, dtype),
            timestep=t, sigma=t,
            # the connector replaces padding with learned registers: its mask keeps every row
            encoder_attention_mask=torch.ones(batch, text_tokens, dtype=torch.long, device=device),
            audio_encoder_attention_mask=torch.ones(batch, text_tokens, dtype=torch.long, device=device),
            num_frames=grid.frames, height=grid.height, width=grid.width, fps=FRAME_RATE,
            audio_num_frames=audio, return_dict=False)
