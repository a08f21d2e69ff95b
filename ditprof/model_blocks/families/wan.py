"""Wan 2.1 / 2.2 (``WanTransformer3DModel``): one stack ``blocks`` of ``WanTransformerBlock``."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_wan import (
    WanAttention,
    WanRotaryPosEmbed,
    WanTransformer3DModel,
    WanTransformerBlock,
    _get_qkv_projections,
)

from ditprof.errors import DitprofError

from .base import (BlockFamily, BlockKind, BlockPlan, LatentGrid, PrologueProcessor, SeqSplit, randn, shape_only,
                   version_of)

# diffusers' Wan attention processor splits the prompt at this many text rows (hardcoded there): everything before
# them is the image context of I2V / FLF2V models.
WAN_TEXT_LEN = 512
CLIP_IMAGE_TOKENS = 257  # CLIP ViT-H/14 image embedding rows the I2V pipeline hands over (x2 for FLF2V)
WAN22_LATENT_CHANNELS = 48  # Wan 2.2's VAE (16x spatial) latents; every Wan 2.1 model has 16 (36 for I2V)


# the last rotary input's fused-prologue table: (freqs_cos, freqs_sin, their versions, table); every block of a
# forward gets the same rotary tensors, so the table is made once per forward, not once per block
_ROPE_TABLE: list = [None]


def rope_table(rotary_emb) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan's rotary (freqs_cos, freqs_sin), each (1, S, 1, D), as the fused prologue's "interleaved" table (cos,
    sin), each (S, D) float32. ``WanAttnProcessor`` turns pair i by cos[2i] and sin[2i + 1] (out[2i] = x[2i] cos[2i]
    - x[2i+1] sin[2i+1], out[2i+1] = x[2i] sin[2i+1] + x[2i+1] cos[2i]), so both slots of pair i take those: exact
    for any table, not only the repeat-interleaved one ``WanRotaryPosEmbed`` makes."""
    fc, fs = rotary_emb
    if fc.dim() != 4 or fc.shape[0] != 1 or fc.shape[2] != 1 or fs.shape != fc.shape:
        raise DitprofError(f"the fused Wan prologue takes rotary (cos, sin) of shape (1, S, 1, D) each, got "
                           f"{tuple(fc.shape)} and {tuple(fs.shape)}")
    if torch.compiler.is_compiling():  # built in the graph (dynamo does not trace the cache)
        return _interleaved(fc, fs)
    versions = (version_of(fc), version_of(fs))
    hit = _ROPE_TABLE[0]
    if hit is None or hit[0] is not fc or hit[1] is not fs or hit[2] != versions:
        hit = _ROPE_TABLE[0] = (fc, fs, versions, _interleaved(fc, fs))  # holds fc, fs: their identity stays theirs
    return hit[3]


def _interleaved(fc: torch.Tensor, fs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t[0, :, 0, first::2].float().repeat_interleave(2, dim=-1).contiguous()
                 for t, first in ((fc, 0), (fs, 1)))


class FusedPrologueProcessor(PrologueProcessor):
    """``WanAttnProcessor`` of the self-attention (attn1) with its norm_q/norm_k (RMSNorms across all heads, over
    inner_dim: ``rms_across``, weights (H, D)) and its RoPE (interleaved pairs, ``rope_table``) handed to ``attend``
    with the raw projections (the fused prologue)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None or attention_mask is not None:
            raise DitprofError("the fused Wan prologue is for the self-attention: no context, no attention mask")
        q, k, v = _get_qkv_projections(attn, hidden_states, None)
        q, k, v = (x.unflatten(2, (attn.heads, -1)) for x in (q, k, v))
        wq, wk, eps = self.weights(attn, (attn.norm_q,), (attn.norm_k,), q.shape[-1], q, heads=attn.heads)
        cos, sin = rope_table(rotary_emb) if rotary_emb is not None else (None, None)
        out = self.attend(q, k, v, wq=wq, wk=wk, eps=eps, norm="rms_across", rope="interleaved", cos=cos, sin=sin)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class WanFamily(BlockFamily):
    name = "wan"
    class_names = ("WanTransformer3DModel",)
    kinds = (BlockKind("main", "blocks", "num_layers"),)
    prologue_missing = ""

    def prologue_processor(self, module, attend):
        # the self-attention only: the cross-attention (attn2) reads the prompt, of another length than q (and an
        # I2V block's image context), so it keeps its processor
        if isinstance(module, WanAttention) and not module.is_cross_attention and module.add_k_proj is None:
            return FusedPrologueProcessor(attend)
        return None
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
        # TI2V-5B: the pipeline's expand_timesteps hands one timestep per token
        shape = (batch, grid.tokens) if self.is_wan22_vae(a) else (batch,)
        kw = dict(hidden_states=randn((batch, a["in_channels"], grid.frames * pt, grid.height * ph,
                                       grid.width * pw), gen, device, dtype),
                  timestep=torch.full(shape, self.pipeline_timestep, device=device),
                  encoder_hidden_states=randn((batch, text_tokens, a["text_dim"]), gen, device, dtype),
                  return_dict=False)
        if self.image_tokens(a):
            kw["encoder_hidden_states_image"] = randn((batch, self.image_tokens(a), a["image_dim"]), gen, device,
                                                      dtype)
        return kw

    def block_class(self, kind):
        return WanTransformerBlock

    def patch_size(self, config):
        return tuple(self.init_args(config)["patch_size"])

    @property
    def max_axis_tokens(self):  # rope_max_seq_len default; checked again per config below
        return 1024

    @staticmethod
    def is_wan22_vae(a: dict) -> bool:
        """TI2V-5B: latents of Wan 2.2's VAE (16x spatial); its pipeline expands the timestep per token."""
        return a["in_channels"] == WAN22_LATENT_CHANNELS

    def image_tokens(self, a: dict) -> int:
        """Rows of CLIP image context in front of the prompt (I2V / FLF2V blocks), else 0."""
        if a["added_kv_proj_dim"] is None:
            return 0
        return int(a["pos_embed_seq_len"] or CLIP_IMAGE_TOKENS)

    def _checked(self, config, grid: LatentGrid) -> LatentGrid:
        """The model's RoPE table has ``rope_max_seq_len`` positions per axis: a longer axis has none."""
        limit = self.init_args(config)["rope_max_seq_len"]
        for axis in ("frames", "height", "width"):
            if getattr(grid, axis) > limit:
                raise DitprofError(
                    f"the {axis} axis of the {grid.frames}x{grid.height}x{grid.width} token grid has "
                    f"{getattr(grid, axis)} positions, more than this model's rope_max_seq_len={limit}; "
                    f"pick a smaller size or token count")
        return grid

    def layout_from_tokens(self, config, tokens, text_tokens):
        return self._checked(config, self.grid_from_tokens(tokens))

    def vae_strides(self, config):
        # Wan 2.2's VAE (TI2V-5B): 16x spatial, 4x temporal
        return (4, 16, 16) if self.is_wan22_vae(self.init_args(config)) else self.vae_stride

    def layout_from_size(self, config, height, width, frames, text_tokens):
        return self._checked(config, self.grid_from_size(config, height, width, frames))

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
        n_img = self.image_tokens(a)
        if n_img:  # I2V / FLF2V: the embedded CLIP image rows go in front of the prompt
            if text_tokens != WAN_TEXT_LEN:
                raise DitprofError(f"Wan image-conditioned blocks (added_kv_proj_dim) split their context at "
                                   f"{WAN_TEXT_LEN} prompt rows (diffusers hardcodes it): the prompt must have "
                                   f"{WAN_TEXT_LEN} text tokens, got {text_tokens}")
            text = torch.cat([randn((batch, n_img, dim), gen, device, dtype), text], dim=1)
        # timestep_proj.unflatten(1, (6, -1)): the parent keeps the time embedder in fp32, so temb is
        # fp32 whatever the block dtype. Modulation values are small next to the 1 in (1 + scale).
        # TI2V-5B's pipeline expands the timestep per token: one modulation per row, (B, S, 6, D).
        shape = (batch, grid.tokens, 6, dim) if self.is_wan22_vae(a) else (batch, 6, dim)
        temb = randn(shape, gen, device, torch.float32, std=0.1)
        # The model's own rotary module only reads the latent's shape (B, C, F, H, W).
        rope = WanRotaryPosEmbed(a["attention_head_dim"], (pt, ph, pw), a["rope_max_seq_len"]).to(device)
        latent = shape_only((batch, 1, grid.frames * pt, grid.height * ph, grid.width * pw), device)
        # fp32 as in a bf16 pipeline (the rotary table itself is built in fp64).
        rotary = tuple(t.float() for t in rope(latent))
        return (hidden, text, temb, rotary), {}
