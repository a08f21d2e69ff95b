"""HunyuanVideo-1.5 (``HunyuanVideo15Transformer3DModel``): one stack ``transformer_blocks`` of double-stream
blocks, joint attention over [video | text] with a mask that really masks positions.

The text stream is what the model's forward builds from three padded inputs -- the SigLIP image tokens (all
masked for text-to-video), the ByT5 glyph tokens (masked when the prompt quotes no text) and the Qwen2.5-VL prompt
padded to 1000 rows -- reordered valid rows first. Captured from the model's own forward
(``BlockFamily.captured``); on the meta device (the memory estimate) the same shapes are built directly, since
the reordering indexes by the mask's values.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_hunyuan_video15 import (
    HunyuanVideo15RotaryPosEmbed,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideo15TransformerBlock,
)

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, randn, shape_only

# HunyuanVideo15Pipeline: tokenizer_max_length, tokenizer_2_max_length, vision_num_semantic_tokens
PROMPT_ROWS, GLYPH_ROWS, IMAGE_ROWS = 1000, 256, 729


class HunyuanVideo15Family(BlockFamily):
    name = "hunyuan-video-1.5"
    class_names = ("HunyuanVideo15Transformer3DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("norm1.linear", "norm1_context.linear"))
    kinds = (BlockKind("main", "transformer_blocks", "num_layers"),)
    default_text_tokens = 128  # valid prompt tokens (the pipeline pads them to 1000 rows)
    vae_stride = (4, 16, 16)
    default_size = (480, 848, 121)  # target_size 640 at 16:9, the pipeline's default frames
    pipeline_timestep = 500.0
    captured = True
    output_children = ("norm_out", "proj_out")
    # the text stream the block sees: every padded row of the three inputs, whatever the prompt length
    stream = IMAGE_ROWS + GLYPH_ROWS + PROMPT_ROWS

    @property
    def model_class(self):
        return HunyuanVideo15Transformer3DModel

    def block_class(self, kind):
        return HunyuanVideo15TransformerBlock

    def patch_size(self, config):
        a = self.init_args(config)
        return (a["patch_size_t"], a["patch_size"], a["patch_size"])

    def plan(self, kind):
        # Not wired for --sp: the Ulysses joint wrapper would drop the text mask this family passes.
        return BlockPlan(outputs=("hidden_states", "encoder_hidden_states"), sp=None, joint_text="last")

    def stream_rows(self, config, text_tokens, kind):
        return self.stream

    def masks_positions(self, config, text_tokens) -> str | None:
        return (f"the text stream is padded to {self.stream} rows of which {min(text_tokens, PROMPT_ROWS)} "
                f"are valid; attention masks the rest")

    def model_inputs(self, config, grid: LatentGrid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        pt, ph, pw = self.patch_size(config)
        valid = min(int(text_tokens), PROMPT_ROWS)
        prompt_mask = torch.zeros(batch, PROMPT_ROWS, dtype=torch.long, device=device)
        prompt_mask[:, :valid] = 1
        return dict(
            hidden_states=randn((batch, a["in_channels"], grid.frames * pt, grid.height * ph, grid.width * pw),
                                gen, device, dtype),
            timestep=torch.full((batch,), self.pipeline_timestep, device=device, dtype=dtype),
            encoder_hidden_states=randn((batch, PROMPT_ROWS, a["text_embed_dim"]), gen, device, dtype),
            encoder_attention_mask=prompt_mask,
            # a prompt without quoted text: the pipeline passes zero glyph embeddings with an all-zero mask
            encoder_hidden_states_2=torch.zeros(batch, GLYPH_ROWS, a["text_embed_2_dim"], device=device, dtype=dtype),
            encoder_attention_mask_2=torch.zeros(batch, GLYPH_ROWS, dtype=torch.long, device=device),
            # text-to-video: zero image embeddings (the model then masks the image rows)
            image_embeds=torch.zeros(batch, IMAGE_ROWS, a["image_embed_dim"], device=device, dtype=dtype),
            return_dict=False)

    def build_inputs(self, config, kind, grid, text_tokens, batch, gen, device, dtype, parents=None):
        if torch.device(device).type != "meta":
            return super().build_inputs(config, kind, grid, text_tokens, batch, gen, device, dtype, parents)
        a = self.init_args(config)
        dim = self.dim(config)
        pt, ph, pw = self.patch_size(config)
        rope = HunyuanVideo15RotaryPosEmbed(a["patch_size"], a["patch_size_t"], list(a["rope_axes_dim"]),
                                            a["rope_theta"])
        rotary = rope(shape_only((batch, 1, grid.frames * pt, grid.height * ph, grid.width * pw), device))
        return (), dict(hidden_states=randn((batch, grid.tokens, dim), gen, device, dtype),
                        encoder_hidden_states=randn((batch, self.stream, dim), gen, device, dtype),
                        temb=randn((batch, dim), gen, device, dtype),
                        attention_mask=torch.zeros(batch, self.stream, dtype=torch.bool, device=device),
                        freqs_cis=rotary)
