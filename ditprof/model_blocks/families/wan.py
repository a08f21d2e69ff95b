"""Wan 2.1 / 2.2 (``WanTransformer3DModel``): one stack ``blocks`` of ``WanTransformerBlock``."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_wan import (
    WanRotaryPosEmbed,
    WanTransformer3DModel,
    WanTransformerBlock,
)

from .base import BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit, randn, shape_only


class WanFamily(BlockFamily):
    name = "wan"
    class_names = ("WanTransformer3DModel",)
    kinds = (BlockKind("main", "blocks", "num_layers"),)
    default_text_tokens = 512  # umT5 prompt length the pipeline pads to
    vae_stride = (4, 8, 8)
    default_size = (480, 832, 81)  # (height, width, frames) of the pipeline default

    @property
    def model_class(self) -> type:
        return WanTransformer3DModel

    def plan(self, kind):
        # rotary (cos, sin) each (1, S, 1, hd); Wan 2.2 TI2V hands a per-token temb (B, S, 6, D)
        return BlockPlan(sp={"hidden_states": SeqSplit(1), "rotary_emb": SeqSplit(1),
                             "temb": SeqSplit(1, ndim=4)})

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        pt, ph, pw = self.patch_size(config)
        return dict(hidden_states=randn((batch, a["in_channels"], grid.frames * pt, grid.height * ph,
                                         grid.width * pw), gen, device, dtype),
                    timestep=torch.full((batch,), self.pipeline_timestep, device=device),
                    encoder_hidden_states=randn((batch, text_tokens, a["text_dim"]), gen, device, dtype),
                    return_dict=False)

    def block_class(self, kind):
        return WanTransformerBlock

    def patch_size(self, config):
        return tuple(self.init_args(config)["patch_size"])

    @property
    def max_axis_tokens(self):  # rope_max_seq_len default; checked again per config below
        return 1024

    def build_block(self, config, kind):
        a = self.init_args(config)
        dim = a["num_attention_heads"] * a["attention_head_dim"]
        return WanTransformerBlock(
            dim, a["ffn_dim"], a["num_attention_heads"], a["qk_norm"], a["cross_attn_norm"], a["eps"],
            a["added_kv_proj_dim"],
        )

    def build_inputs(self, config, kind, grid: LatentGrid, text_tokens, batch, gen, device, dtype, parents=None):
        a = self.init_args(config)
        dim = self.dim(config)
        pt, ph, pw = self.patch_size(config)
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        text = randn((batch, text_tokens, dim), gen, device, dtype)
        # timestep_proj.unflatten(1, (6, -1)): the parent keeps the time embedder in fp32, so temb is
        # fp32 whatever the block dtype. Modulation values are small next to the 1 in (1 + scale).
        temb = randn((batch, 6, dim), gen, device, torch.float32, std=0.1)
        # The model's own rotary module only reads the latent's shape (B, C, F, H, W).
        rope = WanRotaryPosEmbed(a["attention_head_dim"], (pt, ph, pw), a["rope_max_seq_len"]).to(device)
        latent = shape_only((batch, 1, grid.frames * pt, grid.height * ph, grid.width * pw), device)
        # fp32 as in a bf16 pipeline (the rotary table itself is built in fp64).
        rotary = tuple(t.float() for t in rope(latent))
        return (hidden, text, temb, rotary), {}
