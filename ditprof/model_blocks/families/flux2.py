"""FLUX.2 (``Flux2Transformer2DModel``): ``transformer_blocks`` (double stream) + ``single_transformer_blocks``.

The blocks take the modulation the model computes once per step from the timestep and guidance
(``double_stream_modulation_img/_txt``, ``single_stream_modulation``) and a 4-axis RoPE (t, h, w, l) over
[text, image]; the single blocks see text and image rows concatenated in one sequence. No attention mask: the
pipeline pads the prompt to 512 tokens and attends to the padding. The inputs are captured from the model's own
forward (``BlockFamily.captured``).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_flux2 import (
    Flux2Attention,
    Flux2AttnProcessor,
    Flux2ParallelSelfAttention,
    Flux2ParallelSelfAttnProcessor,
    Flux2SingleTransformerBlock,
    Flux2Transformer2DModel,
    Flux2TransformerBlock,
    _get_qkv_projections,
)

from ditprof.errors import DitprofError

from .base import BlockFamily, BlockKind, BlockPlan, LatentGrid, PrologueProcessor, SeqSplit, randn
from .flux import FusedPrologueProcessor


class FusedParallelPrologueProcessor(PrologueProcessor):
    """``Flux2ParallelSelfAttnProcessor`` (single blocks: one projection makes QKV and the MLP input) with its
    norms and RoPE (interleaved pairs) handed to ``attend``; q, k, v stay views of the fused projection."""

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        if attention_mask is not None:
            raise DitprofError("the fused prologue takes no attention mask (FLUX.2's blocks pass none)")
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        q, k, v = (x.unflatten(-1, (-1, attn.head_dim)) for x in qkv.chunk(3, dim=-1))
        wq, wk, eps = self.weights(attn, (attn.norm_q,), (attn.norm_k,), attn.head_dim, q)
        cos, sin = image_rotary_emb if image_rotary_emb is not None else (None, None)
        out = self.attend(q, k, v, wq=wq, wk=wk, eps=eps, rope="interleaved", cos=cos, sin=sin)
        out = out.flatten(2, 3).to(q.dtype)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))


def _pipeline():
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

    return Flux2Pipeline


class Flux2Family(BlockFamily):
    name = "flux2"
    class_names = ("Flux2Transformer2DModel",)
    kinds = (
        BlockKind("double", "transformer_blocks", "num_layers"),
        BlockKind("single", "single_transformer_blocks", "num_single_layers"),
    )
    default_text_tokens = 512  # Flux2Pipeline max_sequence_length: the Mistral prompt is padded to it
    vae_stride = (1, 8, 8)
    is_video = False
    default_size = (1024, 1024, 1)  # default_sample_size 128 x VAE 8
    pipeline_timestep = 0.5  # the pipeline hands sigma = timestep / 1000
    guidance = 4.0  # Flux2Pipeline guidance_scale
    prologue_missing = ""

    def prologue_processor(self, module, attend):
        # the model's own processors only (its KV-cache variants keep their path)
        if isinstance(module, Flux2Attention) and type(module.processor) is Flux2AttnProcessor:
            return FusedPrologueProcessor(attend, projections=_get_qkv_projections)
        if isinstance(module, Flux2ParallelSelfAttention) and type(module.processor) is Flux2ParallelSelfAttnProcessor:
            return FusedParallelPrologueProcessor(attend)
        return None
    captured = True
    output_children = ("norm_out", "proj_out")

    @property
    def model_class(self):
        return Flux2Transformer2DModel

    def block_class(self, kind):
        return Flux2TransformerBlock if self.kind(kind).name == "double" else Flux2SingleTransformerBlock

    def unused_children(self, kind):
        # the forward computes every stack's modulation up front; the other stack's is never read here
        if self.kind(kind).name == "double":
            return ("single_stream_modulation",)
        return ("double_stream_modulation_img", "double_stream_modulation_txt")

    def plan(self, kind):
        # rotary (cos, sin) each (T + S, D), text rows first; single blocks: [text | image] in the hidden states
        # (their rows count the image rows, the text rows are the text stream's)
        if self.kind(kind).name == "double":
            return BlockPlan(outputs=("encoder_hidden_states", "hidden_states"),
                             sp={"hidden_states": SeqSplit(1), "image_rotary_emb": SeqSplit(0, text="first")},
                             joint_text="first")
        return BlockPlan(sp={"hidden_states": SeqSplit(1, text="first"),
                             "image_rotary_emb": SeqSplit(0, text="first")}, joint_text="first")

    def patch_size(self, config):
        # The pipeline patchifies 2x2 latent pixels into the channels (in_channels = 4 x VAE channels).
        return (1, 2, 2)

    def model_inputs(self, config, grid: LatentGrid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        pipe = _pipeline()
        latents = torch.empty(batch, a["in_channels"], grid.height, grid.width)  # ids read only the shape
        prompt = randn((batch, text_tokens, a["joint_attention_dim"]), gen, device, dtype)
        return dict(hidden_states=randn((batch, grid.tokens, a["in_channels"]), gen, device, dtype),
                    encoder_hidden_states=prompt,
                    timestep=torch.full((batch,), self.pipeline_timestep, device=device, dtype=dtype),
                    img_ids=pipe._prepare_latent_ids(latents).to(device),
                    txt_ids=pipe._prepare_text_ids(torch.empty(batch, text_tokens, 1)).to(device),
                    guidance=torch.full((batch,), self.guidance, device=device) if a["guidance_embeds"] else None,
                    return_dict=False)
