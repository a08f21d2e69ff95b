"""Flux.1 (``FluxTransformer2DModel``): ``transformer_blocks`` (double) + ``single_transformer_blocks``."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_flux import (
    FluxAttention,
    FluxAttnProcessor,
    FluxPosEmbed,
    FluxSingleTransformerBlock,
    FluxTransformer2DModel,
    FluxTransformerBlock,
    _get_qkv_projections,
)

from ditprof.errors import DitprofError

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, PrologueProcessor, SeqSplit, randn


class FusedPrologueProcessor(PrologueProcessor):
    """``FluxAttnProcessor`` with its norms (norm_q/norm_k, and norm_added_q/norm_added_k of the text stream: two
    weights, the text rows first) and its RoPE (interleaved pairs, over the joint [text, image] rows) handed to
    ``attend`` with the raw projections (the fused prologue). ``projections``: the model module's
    ``_get_qkv_projections`` (FLUX.2's double blocks share this processor's shape with their own)."""

    def __init__(self, attend, projections=_get_qkv_projections):
        super().__init__(attend)
        self.projections = projections

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if attention_mask is not None:
            raise DitprofError("the fused prologue takes no attention mask (Flux's blocks pass none)")
        q, k, v, eq, ek, ev = self.projections(attn, hidden_states, encoder_hidden_states)
        q, k, v = (x.unflatten(-1, (-1, attn.head_dim)) for x in (q, k, v))
        D = attn.head_dim
        text_rows = 0
        if attn.added_kv_proj_dim is not None:
            eq, ek, ev = (x.unflatten(-1, (-1, D)) for x in (eq, ek, ev))
            wq, wk, eps = self.weights(attn, (attn.norm_added_q, attn.norm_q), (attn.norm_added_k, attn.norm_k), D, q)
            text_rows = eq.shape[1]
            q, k, v = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1), torch.cat([ev, v], dim=1)
        else:
            wq, wk, eps = self.weights(attn, (attn.norm_q,), (attn.norm_k,), D, q)
        cos, sin = image_rotary_emb if image_rotary_emb is not None else (None, None)
        out = self.attend(q, k, v, wq=wq, wk=wk, eps=eps, rope="interleaved", cos=cos, sin=sin,
                          text_rows=text_rows)
        out = out.flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is None:
            return out
        enc, out = out.split_with_sizes([text_rows, out.shape[1] - text_rows], dim=1)
        out = attn.to_out[1](attn.to_out[0](out.contiguous()))
        return out, attn.to_add_out(enc.contiguous())


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
    prologue_missing = ""

    def prologue_processor(self, module, attend):
        # the model's own processor only (an IP-adapter processor keeps its own path)
        if isinstance(module, FluxAttention) and type(module.processor) is FluxAttnProcessor:
            return FusedPrologueProcessor(attend)
        return None

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

