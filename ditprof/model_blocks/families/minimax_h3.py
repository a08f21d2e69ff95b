"""MiniMax-H3 (``MiniMaxH3Transformer3DModel``): ``transformer_blocks`` over one packed sequence, plus the text
refiner's ``token_refiner.refiner_blocks``.

There is no cross-attention: text, audio and video rows form ONE packed sequence ``[text | audio | video]`` with
full self-attention. Everything about that sequence -- row order, the float64 (t, h, w) position grid, the
modality tags, the per-row timestep indices -- comes from the pipeline's own code
(``diffusers.modular_pipelines.minimax_h3``); the rotary table from the model's ``MiniMaxH3RotaryPosEmbed``; the
timestep embedding from the model's own ``time_proj`` + ``time_embedder`` (fp32, its weights read from the
checkpoint with the block).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from diffusers.models.transformers.transformer_minimax_h3 import (
    MINIMAX_H3_MODALITY_NUM,
    MiniMaxH3Attention,
    MiniMaxH3RotaryPosEmbed,
    MiniMaxH3TokenRefinerBlock,
    MiniMaxH3Transformer3DModel,
    MiniMaxH3TransformerBlock,
)

from ditprof.errors import DitprofError

from .base import MODULATION, BlockFamily, BlockKind, BlockPlan, LatentGrid, PrologueProcessor, SeqSplit, randn

# The pipeline's geometry constants (its ModularPipeline properties with no VAE loaded).
VAE_SPATIAL = 16  # MiniMaxH3ModularPipeline.vae_spatial_compression_ratio
FRAMES_PER_CHUNK, LATENTS_PER_CHUNK = 17, 5  # vae_frames_per_chunk, vae_latents_per_chunk: 17n + 5 frames
DEFAULT_STEPS = 50  # num_inference_steps default; inputs are those of the middle step
VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0  # the two schedules of a request
DEFAULT_LATENT_FRAMES = 37  # the pipeline's default 124 frames (5.2 s at 24 fps)


def _pipeline():
    """The pipeline's own layout helpers (imported late: the modular pipeline pulls in transformers)."""
    from diffusers.modular_pipelines.minimax_h3 import before_denoise, modular_pipeline

    return before_denoise, modular_pipeline


@dataclass(frozen=True)
class PackedLayout(LatentGrid):
    """One MiniMax-H3 request as packed rows: ``text`` rows, ``audio_latents`` x ``audio_channels`` audio rows,
    and the video grid (``frames`` x ``height`` x ``width`` patches); ``pixel_size`` when it came from one."""

    text: int = 0
    audio_latents: int = 0
    audio_channels: int = 2
    pixel_size: tuple[int, int, int] | None = None  # (height, width, frames) of the request
    packed = True

    @property
    def audio_rows(self) -> int:
        return self.audio_latents * self.audio_channels

    @property
    def tokens(self) -> int:
        return self.text + self.audio_rows + self.video_tokens

    def describe(self) -> str:
        src = (f" from {self.pixel_size[0]}x{self.pixel_size[1]}x{self.pixel_size[2]} px" if self.pixel_size
               else " (laid out from a row count)")
        return (f"{self.tokens} packed rows = {self.text} text + {self.audio_rows} audio "
                f"({self.audio_channels} x {self.audio_latents}) + {self.video_tokens} video "
                f"({self.frames}x{self.height}x{self.width} frames x height x width patches){src}")

    def __str__(self) -> str:
        return self.describe()


def _audio_latents_for(latent_frames: float) -> float:
    """Audio latents per channel covering ``latent_frames`` video latents (the pipeline's rates, continuous)."""
    _, mp = _pipeline()
    pixel_frames = (latent_frames - 2) / LATENTS_PER_CHUNK * FRAMES_PER_CHUNK + LATENTS_PER_CHUNK
    return max(pixel_frames, 1.0) / mp.MINIMAX_H3_FPS * mp.MINIMAX_H3_AUDIO_LATENTS_PER_SECOND


def rows_layout(rows: int, text: int, audio_channels: int = 2, aspect: float = 16 / 9,
                max_frames: int = 128) -> PackedLayout:
    """A plausible request of exactly ``rows`` packed rows: ``text`` text rows, and the rest split between a
    video grid (frames x height x width patches, frame aspect near 16:9, a latent frame count of the VAE's
    5n + 2 form and the pipeline's default 37 preferred) and the audio that the video's duration implies (2
    channels). Scored by how far the audio is from the duration's, the frame from 16:9 and the frame count
    from the default; exact in the row count, so a small count gets a short, small video."""
    rest = rows - text
    if text < 0 or rest < 1 + audio_channels:
        raise DitprofError(f"a MiniMax-H3 packed layout of {rows} rows cannot hold {text} text rows plus at "
                           f"least one video row and one audio latent ({audio_channels} rows)")
    best = None
    for f in range(1, min(max_frames, rest) + 1):
        target_a = _audio_latents_for(f)
        vae_form = (f - 2) % LATENTS_PER_CHUNK == 0
        for hp in range(1, math.isqrt(rest // f) * 2 + 2):
            # the width giving the duration's audio, then its neighbours (parity and rounding)
            ideal = (rest - audio_channels * target_a) / (f * hp)
            for wp in {max(1, math.floor(ideal) + d) for d in (-1, 0, 1, 2)}:
                if not 1 / 4 <= wp / hp <= 4:
                    continue
                left = rest - f * hp * wp
                if left < audio_channels or left % audio_channels:
                    continue
                a = left // audio_channels
                score = (abs(math.log(a / target_a)) + abs(math.log((wp / hp) / aspect))
                         + (0.0 if vae_form else 0.5) + 0.5 * abs(math.log(f / DEFAULT_LATENT_FRAMES)))
                if best is None or score < best[0]:
                    best = (score, PackedLayout(f, hp, wp, text=text, audio_latents=a,
                                                audio_channels=audio_channels))
    if best is None:
        raise DitprofError(f"no MiniMax-H3 packed layout has exactly {rows} rows with {text} text rows "
                           f"(video frames of aspect 1:4 to 4:1 and {audio_channels}-channel audio)")
    return best[1]


class FusedPrologueProcessor(PrologueProcessor):
    """``MiniMaxH3AttnProcessor`` with its norm_q/norm_k (RMSNorm per head) and its RoPE ("half" form, over the
    table's leading channels) handed to ``attend`` with the raw projections (the fused prologue)."""

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        if attention_mask is not None:
            raise DitprofError("the fused prologue takes no attention mask (MiniMax-H3's model passes none)")
        if attn.fused_projections:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key, value = (x.unflatten(-1, (attn.heads, -1)) for x in (query, key, value))
        D = query.shape[-1]
        wq, wk, eps = self.weights(attn, (attn.norm_q,), (attn.norm_k,), D, query)
        cos, sin = rotary_emb if rotary_emb is not None else (None, None)
        out = self.attend(query, key, value, wq=wq, wk=wk, eps=eps, rope="half", cos=cos, sin=sin)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


class MiniMaxH3Family(BlockFamily):
    name = "minimax-h3"
    class_names = ("MiniMaxH3Transformer3DModel",)
    fp8_keep_linears = tuple((p, MODULATION) for p in ("adaln_proj.linear",))
    kinds = (
        BlockKind("main", "transformer_blocks", "num_layers"),
        BlockKind("refiner", "token_refiner.refiner_blocks", "num_refiner_layers"),
    )
    default_text_tokens = 512
    vae_stride = (4, VAE_SPATIAL, VAE_SPATIAL)  # time: 17 frames -> 5 latents, see layout_from_size
    default_size = (768, 1344, 124)  # the pipeline's 16:9 canvas and num_frames default
    prologue_missing = ""

    def prologue_processor(self, module, attend):
        # every attention of the model (blocks and text refiner) is MiniMaxH3Attention with one processor
        return FusedPrologueProcessor(attend) if isinstance(module, MiniMaxH3Attention) else None

    @property
    def model_class(self):
        return MiniMaxH3Transformer3DModel

    def block_class(self, kind):
        return MiniMaxH3TransformerBlock if self.kind(kind).name == "main" else MiniMaxH3TokenRefinerBlock

    def patch_size(self, config):
        return tuple(self.init_args(config)["patch_size"])

    def dim(self, config):
        return int(self.init_args(config)["hidden_size"])  # the residual stream; heads x head_dim is larger

    def build_block(self, config, kind):
        a = self.init_args(config)
        common = dict(hidden_size=a["hidden_size"], num_attention_heads=a["num_attention_heads"],
                      attention_head_dim=a["attention_head_dim"], ffn_dim=a["ffn_dim"], norm_eps=a["norm_eps"],
                      qk_norm_eps=a["qk_norm_eps"])
        if self.kind(kind).name == "main":
            return MiniMaxH3TransformerBlock(time_embed_dim=a["time_embed_dim"], **common)
        return MiniMaxH3TokenRefinerBlock(**common)

    def plan(self, kind):
        if self.kind(kind).name == "refiner":
            return BlockPlan(sp={"hidden_states": SeqSplit(1)})
        # the model's own _cp_plan splits the same three per-row inputs; temb is per timestep: replicated
        return BlockPlan(sp={"hidden_states": SeqSplit(1), "adaln_indices": SeqSplit(0),
                             "rotary_emb": SeqSplit(0)})

    def text_stream(self, kind):
        return False  # text rows are packed into the hidden states (the refiner sees only them)

    def rows(self, grid: LatentGrid, kind) -> int:
        return grid.text if self.kind(kind).name == "refiner" else grid.tokens

    def input_modules(self, config, kind):
        if self.kind(kind).name == "refiner":
            return {}
        a = self.init_args(config)
        return {"time_embedder": TimestepEmbedding(in_channels=a["freq_dim"],
                                                   time_embed_dim=a["time_embed_hidden_dim"],
                                                   out_dim=a["time_embed_dim"])}

    # ----- layouts ---------------------------------------------------------------------------
    def layout_from_tokens(self, config, tokens, text_tokens):
        """``tokens`` packed rows; the prompt takes at most a quarter of them (a short row count for a quick run
        keeps mostly media rows), the rest as ``rows_layout`` splits it."""
        if tokens < 1:
            raise DitprofError(f"tokens must be positive, got {tokens}")
        _, mp = _pipeline()
        text = min(int(text_tokens), int(tokens) // 4)
        return rows_layout(int(tokens), text, mp.MINIMAX_H3_AUDIO_CHANNELS)

    def layout_from_size(self, config, height, width, frames, text_tokens):
        """The pipeline's geometry: frames snapped up to 17n + 5, latents at 1/16, 40 audio latents a second."""
        _, mp = _pipeline()
        _, ph, pw = self.patch_size(config)
        multiple = VAE_SPATIAL * pw  # MiniMaxH3ModularPipeline.canvas_multiple
        if height % multiple or width % multiple or height < multiple or width < multiple:
            raise DitprofError(f"MiniMax-H3 needs height and width that are positive multiples of {multiple} "
                               f"(VAE 16 x patch {pw}), got {height}x{width}")
        frames = mp.align_num_frames(int(frames or 1), FRAMES_PER_CHUNK, LATENTS_PER_CHUNK)
        latent_frames = mp.video_latent_num_frames(frames, FRAMES_PER_CHUNK, LATENTS_PER_CHUNK)
        return PackedLayout(latent_frames, height // VAE_SPATIAL // ph, width // VAE_SPATIAL // pw,
                            text=int(text_tokens), audio_latents=mp.audio_latent_num_frames(frames),
                            audio_channels=mp.MINIMAX_H3_AUDIO_CHANNELS, pixel_size=(height, width, frames))

    def pixel_size(self, config, layout: PackedLayout):
        return layout.pixel_size

    def size_rule(self, config):
        _, ph, _ = self.patch_size(config)
        return (f"height and width in multiples of {VAE_SPATIAL * ph} (VAE {VAE_SPATIAL} x patch {ph}), "
                f"{FRAMES_PER_CHUNK}n + {LATENTS_PER_CHUNK} frames")

    def packed_sequence(self, config, layout: PackedLayout):
        """(position_ids float64 (S, 3), token_tags, video_indices, audio_indices, text_indices) from the
        pipeline's ``MiniMaxH3PrepareLayoutStep.build_packed_sequence``."""
        bd, mp = _pipeline()
        patch = self.patch_size(config)
        text_tags = torch.full((layout.text,), mp.MINIMAX_H3_TEXT_TAG, dtype=torch.long)
        pos, tags, vid, aud, txt, _, _ = bd.MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            text_tags, layout.frames, layout.height * patch[1], layout.width * patch[2], layout.audio_latents,
            patch, layout.audio_channels, mp.MINIMAX_H3_AUDIO_TAG, mp.MINIMAX_H3_VIDEO_TAG)
        return pos, tags, vid, aud, txt

    def mid_step_timesteps(self, video_indices, audio_indices, text_rows: int):
        """(distinct timesteps, per-row indices) of the middle denoising step, from the two schedules and the
        pipeline's ``MiniMaxH3SetTimestepsStep.build_row_timesteps``."""
        from diffusers.schedulers import MiniMaxH3Scheduler

        bd, _ = _pipeline()
        ts = []
        for shift in (VIDEO_SHIFT, AUDIO_SHIFT):
            sched = MiniMaxH3Scheduler(shift=shift)
            sched.set_timesteps(DEFAULT_STEPS)
            ts.append(float(sched.timesteps[DEFAULT_STEPS // 2]))
        return bd.MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_indices, audio_indices, 0, 0, text_rows, ts[0], ts[1], ts[0], 1.0)

    # ----- inputs ----------------------------------------------------------------------------
    def build_inputs(self, config, kind, grid, text_tokens, batch, gen, device, dtype, parents=None):
        a = self.init_args(config)
        dim = a["hidden_size"]
        if self.kind(kind).name == "refiner":  # the projected prompt rows, before they are packed
            return (), dict(hidden_states=randn((batch, grid.text, dim), gen, device, dtype))
        pos, tags, vid, aud, txt = self.packed_sequence(config, grid)
        timestep, t_idx = self.mid_step_timesteps(vid, aud, grid.text)
        hidden = randn((batch, grid.tokens, dim), gen, device, dtype)
        # temb = time_embedder(time_proj(timestep)): the model's own modules, fp32 as the class keeps them
        proj = Timesteps(num_channels=a["freq_dim"], flip_sin_to_cos=True, downscale_freq_shift=0)
        embedder = (parents or {}).get("time_embedder")
        if embedder is None:
            if torch.device(device).type != "meta":
                raise DitprofError("MiniMax-H3 block inputs need the model's time_embedder weights")
            with torch.device("meta"):
                embedder = self.input_modules(config, kind)["time_embedder"]
        with torch.no_grad():
            temb = embedder(proj(timestep.to(device)).to(torch.float32))
        adaln_indices = (t_idx * MINIMAX_H3_MODALITY_NUM + tags).to(device)
        rope = MiniMaxH3RotaryPosEmbed(rope_freq_dim=a["rope_freq_dim"], rope_theta=a["rope_theta"]).to(device)
        rotary = rope(pos.to(device))  # float64 grid, as the pipeline hands it; the rope casts to fp32
        return (), dict(hidden_states=hidden, temb=temb, adaln_indices=adaln_indices, rotary_emb=rotary)

    def model_inputs(self, config, grid, text_tokens, batch, gen, device, dtype):
        a = self.init_args(config)
        pt, ph, pw = self.patch_size(config)
        pos, tags, vid, aud, txt = self.packed_sequence(config, grid)
        timestep, t_idx = self.mid_step_timesteps(vid, aud, grid.text)
        return dict(
            hidden_states=randn((batch, vid.numel(), a["in_channels"] * pt * ph * pw), gen, device, dtype),
            audio_hidden_states=randn((batch, aud.numel(), a["audio_in_channels"]), gen, device, dtype),
            encoder_hidden_states=randn((batch, txt.numel(), a["text_dim"]), gen, device, dtype),
            timestep=timestep.to(device), timestep_indices=t_idx.to(device), token_tags=tags.to(device),
            position_ids=pos.to(device), video_indices=vid.to(device),
            audio_indices=aud.to(device), text_indices=txt.to(device), return_dict=False)
