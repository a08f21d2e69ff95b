"""Flux.1 (``FluxTransformer2DModel``): ``transformer_blocks`` (double) + ``single_transformer_blocks``."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_flux import (
    FluxPosEmbed,
    FluxSingleTransformerBlock,
    FluxTransformer2DModel,
    FluxTransformerBlock,
)

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit, randn


class FluxFamily(BlockFamily):
    name = "flux"
    class_names = ("FluxTransformer2DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("norm1.linear", "norm1_context.linear", "norm.linear"))
    kinds = (
        BlockKind("double", "transformer_blocks", "num_layers"),
        BlockKind("single", "single_transformer_blocks", "num_single_layers"),
    )
    default_text_tokens = 512  # T5 max_sequence_length of Flux.1-dev
    vae_stride = (1, 8, 8)
    is_video = False
    default_size = (1024, 1024, 1)
    pipeline_timestep = 0.5  # Flux takes sigmas in [0, 1]

    @property
    def model_class(self):
        return FluxTransformer2DModel

    def block_class(self, kind):
        return FluxTransformerBlock if self.kind(kind).name == "double" else FluxSingleTransformerBlock

    def plan(self, kind):
        # joint attention over [text, image]; rotary (cos, sin) each (T + S, D), text rows first
        return BlockPlan(outputs=("encoder_hidden_states", "hidden_states"),
                         sp={"hidden_states": SeqSplit(1), "image_rotary_emb": SeqSplit(0, text="first")},
                         joint_text="first")

    @staticmethod
    def image_ids(grid, device) -> torch.Tensor:
        """Position ids exactly as FluxPipeline._prepare_latent_image_ids: (0, row, col)."""
        img_ids = torch.zeros(grid.height, grid.width, 3, device=device)
        img_ids[..., 1] += torch.arange(grid.height, device=device)[:, None]
        img_ids[..., 2] += torch.arange(grid.width, device=device)[None, :]
        return img_ids.reshape(-1, 3)

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        ts = lambda v: torch.full((batch,), v, device=device)  # noqa: E731
        return dict(hidden_states=randn((batch, grid.height * grid.width, a["in_channels"]), gen, device, dtype),
                    encoder_hidden_states=randn((batch, text_tokens, a["joint_attention_dim"]), gen, device, dtype),
                    pooled_projections=randn((batch, a["pooled_projection_dim"]), gen, device, dtype),
                    timestep=ts(self.pipeline_timestep), img_ids=self.image_ids(grid, device),
                    txt_ids=torch.zeros(text_tokens, 3, device=device),
                    guidance=ts(3.5) if a["guidance_embeds"] else None, return_dict=False)

    def patch_size(self, config):
        # The pipeline packs 2x2 latent patches into one token before x_embedder.
        return (1, 2, 2)

    def build_block(self, config, kind):
        a = self.init_args(config)
        dim = a["num_attention_heads"] * a["attention_head_dim"]
        cls = self.block_class(kind)
        return cls(dim=dim, num_attention_heads=a["num_attention_heads"], attention_head_dim=a["attention_head_dim"])

    def build_inputs(self, config, kind, grid: LatentGrid, text_tokens, batch, gen, device, dtype, parents=None):
        a = self.init_args(config)
        dim = self.dim(config)
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        text = randn((batch, text_tokens, dim), gen, device, dtype)
        temb = randn((batch, dim), gen, device, dtype)  # pooled time/guidance/text embedding
        txt_ids = torch.zeros(text_tokens, 3, device=device)  # text ids are 0
        ids = torch.cat([txt_ids, self.image_ids(grid, device)], dim=0)
        rotary = FluxPosEmbed(theta=10000, axes_dim=list(a["axes_dims_rope"]))(ids)
        kwargs = dict(hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rotary)
        return (), kwargs

