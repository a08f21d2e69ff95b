"""HunyuanVideo (``HunyuanVideoTransformer3DModel``): double ``transformer_blocks`` + single stack."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_hunyuan_video import (
    HunyuanVideoRotaryPosEmbed,
    HunyuanVideoSingleTransformerBlock,
    HunyuanVideoTransformer3DModel,
    HunyuanVideoTransformerBlock,
)

from ditprof.errors import DitprofError

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit, randn, shape_only


class HunyuanVideoFamily(BlockFamily):
    name = "hunyuan-video"
    prologue_missing = ("its text rows come last without RoPE and its blocks pass a key-padding mask; the fused "
                        "prologue takes one RoPE table over all rows and no mask")
    class_names = ("HunyuanVideoTransformer3DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("norm1.linear", "norm1_context.linear", "norm.linear"))
    kinds = (
        BlockKind("double", "transformer_blocks", "num_layers"),
        BlockKind("single", "single_transformer_blocks", "num_single_layers"),
    )
    default_text_tokens = 256  # Llama prompt length of the HunyuanVideo pipeline
    vae_stride = (4, 8, 8)
    default_size = (720, 1280, 129)

    @property
    def model_class(self):
        return HunyuanVideoTransformer3DModel

    def block_class(self, kind):
        if self.kind(kind).name == "double":
            return HunyuanVideoTransformerBlock
        return HunyuanVideoSingleTransformerBlock

    def plan(self, kind):
        # joint attention over [image, text]; mask (B, 1, 1, S + T); rotary (cos, sin) each (S, D)
        rotary = "freqs_cis" if self.kind(kind).name == "double" else "image_rotary_emb"
        return BlockPlan(outputs=("hidden_states", "encoder_hidden_states"),
                         sp={"hidden_states": SeqSplit(1), "attention_mask": SeqSplit(3, text="last"),
                             rotary: SeqSplit(0)},
                         joint_text="last")

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        pt, ph, pw = self.patch_size(config)
        ts = lambda v: torch.full((batch,), v, device=device)  # noqa: E731
        return dict(hidden_states=randn((batch, a["in_channels"], grid.frames * pt, grid.height * ph,
                                         grid.width * pw), gen, device, dtype),
                    timestep=ts(self.pipeline_timestep),
                    encoder_hidden_states=randn((batch, text_tokens, a["text_embed_dim"]), gen, device, dtype),
                    encoder_attention_mask=torch.ones(batch, text_tokens, device=device, dtype=torch.long),
                    pooled_projections=randn((batch, a["pooled_projection_dim"]), gen, device, dtype),
                    guidance=ts(6000.0) if a["guidance_embeds"] else None, return_dict=False)

    def patch_size(self, config):
        a = self.init_args(config)
        return (a["patch_size_t"], a["patch_size"], a["patch_size"])

    def build_block(self, config, kind):
        a = self.init_args(config)
        if a.get("image_condition_type") == "token_replace":
            raise DitprofError("HunyuanVideo token_replace (I2V) blocks are not supported; use the T2V config")
        cls = self.block_class(kind)
        return cls(a["num_attention_heads"], a["attention_head_dim"], mlp_ratio=a["mlp_ratio"], qk_norm=a["qk_norm"])

    def build_inputs(self, config, kind, grid: LatentGrid, text_tokens, batch, gen, device, dtype, parents=None):
        a = self.init_args(config)
        dim = self.dim(config)
        pt, ph, pw = self.patch_size(config)
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        text = randn((batch, text_tokens, dim), gen, device, dtype)
        temb = randn((batch, dim), gen, device, dtype)
        # The model builds a (B, 1, 1, S + L) bool mask over [video tokens, prompt tokens]; a full
        # prompt keeps every position (the shape and the masked attention path are what matter).
        mask = torch.ones(batch, 1, 1, grid.tokens + text_tokens, dtype=torch.bool, device=device)
        rope = HunyuanVideoRotaryPosEmbed(a["patch_size"], a["patch_size_t"], list(a["rope_axes_dim"]), a["rope_theta"])
        rotary = rope(shape_only((batch, 1, grid.frames * pt, grid.height * ph, grid.width * pw), device))
        return (hidden, text, temb, mask, rotary), {}

