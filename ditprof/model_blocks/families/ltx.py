"""LTX-Video (``LTXVideoTransformer3DModel``): one stack ``transformer_blocks`` of ``LTXVideoTransformerBlock``."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_ltx import (
    LTXVideoRotaryPosEmbed,
    LTXVideoTransformer3DModel,
    LTXVideoTransformerBlock,
)

from .base import BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit, randn

FRAME_RATE = 25  # LTXPipeline default; RoPE time positions are scaled by vae_stride_t / frame_rate


class LTXVideoFamily(BlockFamily):
    name = "ltx-video"
    class_names = ("LTXVideoTransformer3DModel",)
    kinds = (BlockKind("main", "transformer_blocks", "num_layers"),)
    default_text_tokens = 128  # T5 prompt length of LTXPipeline
    vae_stride = (8, 32, 32)
    default_size = (512, 704, 161)

    @property
    def model_class(self):
        return LTXVideoTransformer3DModel

    def block_class(self, kind):
        return LTXVideoTransformerBlock

    def plan(self, kind):
        # rotary (cos, sin) each (B, S, D); temb (B, 1, 6D) and the text replicated
        return BlockPlan(sp={"hidden_states": SeqSplit(1), "image_rotary_emb": SeqSplit(1)})

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        st, sh, sw = self.vae_stride
        return dict(hidden_states=randn((batch, grid.tokens, a["in_channels"]), gen, device, dtype),
                    encoder_hidden_states=randn((batch, text_tokens, a["caption_channels"]), gen, device, dtype),
                    timestep=torch.full((batch,), self.pipeline_timestep, device=device),
                    encoder_attention_mask=torch.ones(batch, text_tokens, device=device, dtype=torch.long),
                    num_frames=grid.frames, height=grid.height, width=grid.width,
                    rope_interpolation_scale=(st / FRAME_RATE, sh, sw), return_dict=False)

    def patch_size(self, config):
        a = self.init_args(config)
        return (a["patch_size_t"], a["patch_size"], a["patch_size"])

    def build_block(self, config, kind):
        a = self.init_args(config)
        return LTXVideoTransformerBlock(
            dim=a["num_attention_heads"] * a["attention_head_dim"],
            num_attention_heads=a["num_attention_heads"],
            attention_head_dim=a["attention_head_dim"],
            cross_attention_dim=a["cross_attention_dim"],
            qk_norm=a["qk_norm"],
            activation_fn=a["activation_fn"],
            attention_bias=a["attention_bias"],
            attention_out_bias=a["attention_out_bias"],
            eps=a["norm_eps"],
            elementwise_affine=a["norm_elementwise_affine"],
        )

    def build_inputs(self, config, kind, grid: LatentGrid, text_tokens, batch, gen, device, dtype, parents=None):
        a = self.init_args(config)
        dim = self.dim(config)
        st, sh, sw = self.vae_stride
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        text = randn((batch, text_tokens, dim), gen, device, dtype)
        temb = randn((batch, 1, 6 * dim), gen, device, dtype, std=0.1)  # AdaLayerNormSingle output
        # The model turns the (B, L) prompt mask into an additive bias (B, 1, L); 0 = attend.
        mask = torch.zeros(batch, 1, text_tokens, dtype=dtype, device=device)
        rope = LTXVideoRotaryPosEmbed(
            dim=dim, base_num_frames=20, base_height=2048, base_width=2048,
            patch_size=a["patch_size"], patch_size_t=a["patch_size_t"], theta=10000.0,
        )
        rotary = rope(hidden, grid.frames, grid.height, grid.width, (st / FRAME_RATE, sh, sw))
        kwargs = dict(
            hidden_states=hidden, encoder_hidden_states=text, temb=temb,
            image_rotary_emb=rotary, encoder_attention_mask=mask,
        )
        return (), kwargs
