"""Qwen-Image (``QwenImageTransformer2DModel``): one stack ``transformer_blocks`` of ``QwenImageTransformerBlock``,
joint attention over [text, image] with the prompt mask, returning (encoder_hidden_states, hidden_states)."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_qwenimage import (
    QwenEmbedRope,
    QwenImageTransformer2DModel,
    QwenImageTransformerBlock,
)

from ditprof.errors import DitprofError

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, SeqSplit, randn


class QwenImageFamily(BlockFamily):
    name = "qwen-image"
    prologue_missing = ("its text and image streams take separate complex RoPE tables (use_real=False), not one "
                        "(cos, sin) table over the joint rows")
    class_names = ("QwenImageTransformer2DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("img_mod.1", "txt_mod.1"))
    kinds = (BlockKind("main", "transformer_blocks", "num_layers"),)
    # A single prompt is not padded by the pipeline: its length is the prompt's (Qwen2.5-VL tokens after the
    # template); 128 stands for a typical prompt, --text-tokens style sizes come from the preset.
    default_text_tokens = 128
    vae_stride = (1, 8, 8)
    is_video = False
    default_size = (1024, 1024, 1)  # QwenImagePipeline: default_sample_size 128 x VAE 8
    pipeline_timestep = 0.5  # the pipeline hands timestep / 1000

    @property
    def model_class(self):
        return QwenImageTransformer2DModel

    def block_class(self, kind):
        return QwenImageTransformerBlock

    def patch_size(self, config):
        p = self.init_args(config)["patch_size"]  # the pipeline packs p x p latent patches into one token
        return (1, p, p)

    def plan(self, kind):
        # rotary (image freqs (S, D/2), text freqs (T, D/2)): the image rows split, the text's whole. The joint mask
        # the processor builds from the prompt mask covers [text | local image] rows; the backend wrapper drops it
        # when it keeps every key and stops with one line when it masks any (a padded prompt).
        return BlockPlan(outputs=("encoder_hidden_states", "hidden_states"),
                         sp={"hidden_states": SeqSplit(1), "image_rotary_emb": (SeqSplit(0), None)},
                         joint_text="first")

    def _check(self, config):
        a = self.init_args(config)
        for opt in ("zero_cond_t", "use_layer3d_rope", "use_additional_t_cond"):
            if a.get(opt):
                raise DitprofError(f"Qwen-Image configs with {opt}=True (the edit/layered variants) are not "
                                   f"supported yet; use the text-to-image config")
        return a

    def build_block(self, config, kind):
        a = self._check(config)
        dim = a["num_attention_heads"] * a["attention_head_dim"]
        return QwenImageTransformerBlock(dim=dim, num_attention_heads=a["num_attention_heads"],
                                         attention_head_dim=a["attention_head_dim"])

    def _rotary(self, config, grid, text_tokens, batch, device):
        a = self.init_args(config)
        rope = QwenEmbedRope(theta=10000, axes_dim=list(a["axes_dims_rope"]), scale_rope=True)
        img_shapes = [[(grid.frames, grid.height, grid.width)]] * batch
        return rope(img_shapes, max_txt_seq_len=text_tokens, device=device)

    def build_inputs(self, config, kind, grid: LatentGrid, text_tokens, batch, gen, device, dtype, parents=None):
        dim = self.dim(config)
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        text = randn((batch, text_tokens, dim), gen, device, dtype)
        temb = randn((batch, dim), gen, device, dtype)
        # The model normalises the prompt mask to bool (B, L); a full prompt keeps every position.
        mask = torch.ones(batch, text_tokens, dtype=torch.bool, device=device)
        kwargs = dict(hidden_states=hidden, encoder_hidden_states=text, encoder_hidden_states_mask=mask, temb=temb,
                      image_rotary_emb=self._rotary(config, grid, text_tokens, batch, device))
        return (), kwargs

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        return dict(hidden_states=randn((batch, grid.tokens, a["in_channels"]), gen, device, dtype),
                    encoder_hidden_states=randn((batch, text_tokens, a["joint_attention_dim"]), gen, device, dtype),
                    encoder_hidden_states_mask=torch.ones(batch, text_tokens, dtype=torch.long, device=device),
                    timestep=torch.full((batch,), self.pipeline_timestep, device=device),
                    img_shapes=[[(grid.frames, grid.height, grid.width)]] * batch, return_dict=False)
