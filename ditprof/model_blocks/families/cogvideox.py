"""CogVideoX (``CogVideoXTransformer3DModel``): one stack ``transformer_blocks`` of ``CogVideoXBlock``.

Its attention processor calls ``F.scaled_dot_product_attention`` directly (not the dispatcher).
"""

from __future__ import annotations

import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed
from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock, CogVideoXTransformer3DModel

from ditprof.errors import DitprofError

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit, randn


def get_resize_crop_region_for_grid(src, tgt_width, tgt_height):
    """Same as the CogVideoX pipeline's helper (importing the pipeline module pulls in transformers)."""
    h, w = src
    if h / w > tgt_height / tgt_width:
        resize_height, resize_width = tgt_height, int(round(tgt_height / h * w))
    else:
        resize_width, resize_height = tgt_width, int(round(tgt_width / w * h))
    top = int(round((tgt_height - resize_height) / 2.0))
    left = int(round((tgt_width - resize_width) / 2.0))
    return (top, left), (top + resize_height, left + resize_width)


class CogVideoXFamily(BlockFamily):
    name = "cogvideox"
    class_names = ("CogVideoXTransformer3DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("norm1.linear", "norm2.linear"))
    kinds = (BlockKind("main", "transformer_blocks", "num_layers"),)
    uses_dispatcher = False
    default_text_tokens = 226  # max_text_seq_length
    vae_stride = (4, 8, 8)
    default_size = (480, 720, 49)

    @property
    def model_class(self):
        return CogVideoXTransformer3DModel

    def block_class(self, kind):
        return CogVideoXBlock

    def plan(self, kind):
        # joint attention over [text, image] (the processor concatenates text first); rotary (S, D) or None
        return BlockPlan(outputs=("hidden_states", "encoder_hidden_states"),
                         sp={"hidden_states": SeqSplit(1), "image_rotary_emb": SeqSplit(0)}, joint_text="first")

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        # RoPE is computed once per video by the pipeline and is only read by the blocks: None here.
        a = self.init_args(config)
        pt, ph, pw = self.patch_size(config)
        return dict(hidden_states=randn((batch, grid.frames * pt, a["in_channels"], grid.height * ph,
                                         grid.width * pw), gen, device, dtype),
                    encoder_hidden_states=randn((batch, text_tokens, a["text_embed_dim"]), gen, device, dtype),
                    timestep=torch.full((batch,), int(self.pipeline_timestep), device=device, dtype=torch.long),
                    return_dict=False)

    def patch_size(self, config):
        a = self.init_args(config)
        return (a["patch_size_t"] or 1, a["patch_size"], a["patch_size"])

    def build_block(self, config, kind):
        a = self.init_args(config)
        return CogVideoXBlock(
            dim=a["num_attention_heads"] * a["attention_head_dim"],
            num_attention_heads=a["num_attention_heads"],
            attention_head_dim=a["attention_head_dim"],
            time_embed_dim=a["time_embed_dim"],
            dropout=a["dropout"],
            activation_fn=a["activation_fn"],
            attention_bias=a["attention_bias"],
            norm_elementwise_affine=a["norm_elementwise_affine"],
            norm_eps=a["norm_eps"],
        )

    def build_inputs(self, config, kind, grid: LatentGrid, text_tokens, batch, gen, device, dtype, parents=None):
        a = self.init_args(config)
        dim = self.dim(config)
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        text = randn((batch, text_tokens, dim), gen, device, dtype)
        temb = randn((batch, a["time_embed_dim"]), gen, device, dtype)
        rotary = None
        if a["use_rotary_positional_embeddings"]:
            if a["patch_size_t"] is not None:
                raise DitprofError("CogVideoX 1.5 (patch_size_t) RoPE is not supported; use CogVideoX 1.0 configs")
            # As CogVideoXPipeline._prepare_rotary_positional_embeddings does for CogVideoX 1.0.
            p = a["patch_size"]
            crops = get_resize_crop_region_for_grid(
                (grid.height, grid.width), a["sample_width"] // p, a["sample_height"] // p
            )
            rotary = get_3d_rotary_pos_embed(
                embed_dim=a["attention_head_dim"], crops_coords=crops, grid_size=(grid.height, grid.width),
                temporal_size=grid.frames, device=device,
            )
        kwargs = dict(hidden_states=hidden, encoder_hidden_states=text, temb=temb, image_rotary_emb=rotary)
        return (), kwargs
