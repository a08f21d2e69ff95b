"""Tiny diffusers blocks (CPU, seeded) shared by the harness tests."""

import torch


def wan_block(tokens: int = 32):
    """A 2-head Wan block (dim 64) and its call arguments: hidden (1, tokens, 64), text (1, 8, 64), temb, RoPE."""
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    torch.manual_seed(0)
    blk = WanTransformerBlock(dim=64, ffn_dim=128, num_heads=2, qk_norm="rms_norm_across_heads",
                              cross_attn_norm=True, eps=1e-6).eval()
    args = (torch.randn(1, tokens, 64), torch.randn(1, 8, 64), torch.randn(1, 6, 64),
            (torch.ones(1, tokens, 1, 32), torch.zeros(1, tokens, 1, 32)))
    return blk, args


def cog_block():
    """A 2-head CogVideoX block (dim 64) and its call arguments."""
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    torch.manual_seed(0)
    blk = CogVideoXBlock(dim=64, num_attention_heads=2, attention_head_dim=32, time_embed_dim=16).eval()
    return blk, (torch.randn(1, 24, 64), torch.randn(1, 8, 64), torch.randn(1, 16))
