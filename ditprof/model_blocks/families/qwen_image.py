"""Qwen-Image (``QwenImageTransformer2DModel``): one stack ``transformer_blocks`` of ``QwenImageTransformerBlock``,
joint attention over [text, image] with the prompt mask, returning (encoder_hidden_states, hidden_states)."""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import Attention
from diffusers.models.transformers.transformer_qwenimage import (
    QwenDoubleStreamAttnProcessor2_0,
    QwenEmbedRope,
    QwenImageTransformer2DModel,
    QwenImageTransformerBlock,
)

from ditprof.errors import DitprofError

from .base import (MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, PrologueProcessor, SeqSplit, randn,
                   version_of)


def joint_rope_table(img_freqs: torch.Tensor, txt_freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused prologue's per-row (cos, sin) table, float32 (T + S, D), of the joint [text, image] rows from
    Qwen's complex tables (image (S, D/2), text (T, D/2)). ``apply_rotary_emb_qwen(use_real=False)`` multiplies the
    channel pairs (2i, 2i+1), read as complex numbers, by freqs[:, i]: that is the "interleaved" rotation with
    cos = Re, sin = Im of freqs[:, i] on both channels of pair i."""
    pairs = torch.view_as_real(torch.cat([txt_freqs, img_freqs])).float()  # (T + S, D/2, 2): Re, Im
    cos, sin = pairs.repeat_interleave(2, dim=1).unbind(-1)
    return cos.contiguous(), sin.contiguous()


class JointRopeTables:
    """``joint_rope_table`` made once per pair of frequency tensors and remade only when one changes: the same
    tensors call after call (the FP8 launch's graph-replay key). The frequency tensors of the cached table are held,
    so no other tensor can take their addresses while it is cached. Under torch.compile built in the graph."""

    def __init__(self):
        self._hit = None

    def __call__(self, img_freqs: torch.Tensor, txt_freqs: torch.Tensor):
        if torch.compiler.is_compiling():
            return joint_rope_table(img_freqs, txt_freqs)
        stamp = tuple((t.device, t.data_ptr(), tuple(t.shape), t.stride(), version_of(t)) for t in
                      (img_freqs, txt_freqs))
        if self._hit is None or self._hit[0] != stamp:
            self._hit = (stamp, (img_freqs, txt_freqs), joint_rope_table(img_freqs, txt_freqs))
        return self._hit[2]


class FusedPrologueProcessor(PrologueProcessor):
    """``QwenDoubleStreamAttnProcessor2_0`` with its norms (norm_added_q/k on the text rows, norm_q/k on the image
    rows: two weights, the text rows first as the processor concatenates) and its complex RoPE (one table over the
    joint rows, ``joint_rope_table``) handed to ``attend`` with the raw projections (the fused prologue). Returns
    (image output, text output), as the processor does."""

    def __init__(self, attend):
        super().__init__(attend)
        self.tables = JointRopeTables()
        self._full_masks: set = set()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                 attention_mask=None, image_rotary_emb=None):
        if encoder_hidden_states is None or attention_mask is not None:
            raise DitprofError("the fused Qwen-Image prologue takes the text stream and no attention_mask, as "
                               "QwenDoubleStreamAttnProcessor2_0 does")
        self._check_full_prompt(encoder_hidden_states_mask)
        D = attn.inner_dim // attn.heads
        img = [p(hidden_states).unflatten(-1, (-1, D)) for p in (attn.to_q, attn.to_k, attn.to_v)]
        txt = [p(encoder_hidden_states).unflatten(-1, (-1, D))
               for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
        T = txt[0].shape[1]
        q, k, v = (torch.cat([t, i], dim=1) for t, i in zip(txt, img))
        wq, wk, eps = self.weights(attn, (attn.norm_added_q, attn.norm_q), (attn.norm_added_k, attn.norm_k), D, q)
        cos, sin = self._table(image_rotary_emb, img[0].shape[1], T, D)
        out = self.attend(q, k, v, wq=wq, wk=wk, eps=eps, rope="interleaved", cos=cos, sin=sin, text_rows=T)
        out = out.flatten(2, 3).to(q.dtype)
        txt_out, img_out = out.split_with_sizes([T, out.shape[1] - T], dim=1)
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)  # dropout
        return img_out, attn.to_add_out(txt_out.contiguous())

    def _table(self, rotary, img_rows: int, text_rows: int, head_dim: int):
        if rotary is None:
            return None, None
        img_freqs, txt_freqs = rotary
        for name, f, rows in (("image", img_freqs, img_rows), ("text", txt_freqs, text_rows)):
            if not f.is_complex() or tuple(f.shape) != (rows, head_dim // 2):
                raise DitprofError(f"the fused Qwen-Image prologue takes complex {name} RoPE frequencies "
                                   f"({rows}, {head_dim // 2}), got {f.dtype} {tuple(f.shape)}")
        return self.tables(img_freqs, txt_freqs)

    def _check_full_prompt(self, mask):
        """The op takes no key mask: the prompt mask must keep every text row (the joint mask the processor
        builds keeps every image row). Checked once per (shape, dtype, device) -- a host sync, in warm-up -- as
        the harness's backend wrapper checks the masks it drops; in a compiled graph by an assert on the device."""
        if mask is None:
            return
        msg = ("the fused Qwen-Image prologue takes no key mask, but this prompt mask masks text rows; use a "
               "full prompt or run without --prologue")
        if torch.compiler.is_compiling():
            torch._assert_async(mask.bool().all(), msg)
            return
        key = (tuple(mask.shape), mask.dtype, mask.device)
        if key not in self._full_masks:
            if not bool(mask.bool().all()):
                raise DitprofError(msg)
            self._full_masks.add(key)


class QwenImageFamily(BlockFamily):
    name = "qwen-image"
    prologue_missing = ""
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

    def prologue_processor(self, module, attend):
        # the model's own processor only; its four norms must share one eps (the prologue takes one)
        if not (isinstance(module, Attention) and type(module.processor) is QwenDoubleStreamAttnProcessor2_0):
            return None
        norms = (module.norm_added_q, module.norm_q, module.norm_added_k, module.norm_k)
        if len({getattr(n, "eps", None) for n in norms}) != 1:
            raise DitprofError(f"the fused prologue takes one RMSNorm eps; this Qwen-Image attention's norms have "
                               f"{[getattr(n, 'eps', None) for n in norms]}")
        return FusedPrologueProcessor(attend)

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
