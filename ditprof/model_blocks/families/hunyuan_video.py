"""HunyuanVideo (``HunyuanVideoTransformer3DModel``): double ``transformer_blocks`` + single stack."""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import Attention
from diffusers.models.transformers.transformer_hunyuan_video import (
    HunyuanVideoAttnProcessor2_0,
    HunyuanVideoRotaryPosEmbed,
    HunyuanVideoSingleTransformerBlock,
    HunyuanVideoTransformer3DModel,
    HunyuanVideoTransformerBlock,
)

from ditprof.errors import DitprofError

from .base import (
    MODULATION,
    BlockFamily,
    BlockKind,
    BlockPlan,
    LatentGrid,
    PrologueProcessor,
    SeqSplit,
    randn,
    shape_only,
)


class FusedPrologueProcessor(PrologueProcessor):
    """``HunyuanVideoAttnProcessor2_0`` with its norms and RoPE handed to ``attend`` with the raw projections (the
    fused prologue). The joint sequence is [video, prompt]: the video rows take norm_q/norm_k and the RoPE
    (interleaved pairs); the prompt rows take norm_added_q/norm_added_k in the double blocks (their own
    projections; norm_q/norm_k in the single blocks, one projection of the concatenation) and no RoPE, which the
    table expresses as cos = 1, sin = 0 on those rows (``PrologueTables``). The two norm weights split the rows by
    position: the first ``text_rows`` rows take row 0, here the video rows. The block's key-padding mask (the
    padded prompt's last rows) goes to ``attend``, which hands the op a key count per batch item."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        joint = attn.add_q_proj is None and encoder_hidden_states is not None  # single block: one projection
        if joint:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        q, k, v = (p(hidden_states).unflatten(2, (attn.heads, -1)) for p in (attn.to_q, attn.to_k, attn.to_v))
        D, video = q.shape[-1], q.shape[1] - (encoder_hidden_states.shape[1] if joint else 0)
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            eq, ek, ev = (p(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                          for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
            wq, wk, eps = self.weights(attn, (attn.norm_q, attn.norm_added_q), (attn.norm_k, attn.norm_added_k), D, q)
            q, k, v = torch.cat([q, eq], dim=1), torch.cat([k, ek], dim=1), torch.cat([v, ev], dim=1)
        else:
            wq, wk, eps = self.weights(attn, (attn.norm_q,), (attn.norm_k,), D, q)
        cos = sin = None
        if image_rotary_emb is not None:
            cos, sin = self.tables(*image_rotary_emb, q.shape[1] - video)
        out = self.attend(q, k, v, wq=wq, wk=wk, eps=eps, rope="interleaved", cos=cos, sin=sin,
                          text_rows=video if wq.shape[0] == 2 else 0, attn_mask=attention_mask)
        out = out.flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is None:
            return out, encoder_hidden_states
        out, enc = out[:, :video], out[:, video:]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            enc = attn.to_add_out(enc)
        return out, enc


class HunyuanVideoFamily(BlockFamily):
    name = "hunyuan-video"
    prologue_missing = ""
    class_names = ("HunyuanVideoTransformer3DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("norm1.linear", "norm1_context.linear", "norm.linear"))
    kinds = (
        BlockKind("double", "transformer_blocks", "num_layers"),
        BlockKind("single", "single_transformer_blocks", "num_single_layers"),
    )
    default_text_tokens = 256  # Llama prompt length of the HunyuanVideo pipeline
    vae_stride = (4, 8, 8)
    default_size = (720, 1280, 129)

    def prologue_processor(self, module, attend):
        # the model's own processor with every norm it applies present (an RMSNorm each: checked at the first call)
        if not (isinstance(module, Attention) and type(module.processor) is HunyuanVideoAttnProcessor2_0):
            return None
        norms = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if module.add_q_proj is not None else ())
        if any(getattr(module, n, None) is None for n in norms):
            return None
        return FusedPrologueProcessor(attend)

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

