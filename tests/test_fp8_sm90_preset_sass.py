"""Compile-only checks (CPU) of the INT8 accumulator preset as a wgmma (``Sm90Config.mma_preset``, shipped at
head_dim 128): against the same build with the LDS.128 preset, the key-tile loop loses its 20 LDS.128 for one
zero-init QGMMA E4M3.E5M2 of the s8 wgmmas' shape that they chain onto with no wait between, keeps the registers
and adds no local memory -- on the plain grid (the prep's Q and Q in the kernel) and the stream-K grid. The
constants' product is S_BIAS exactly."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "experimental"))
from sass_helpers import compile_sass, key_tile_loops  # noqa: E402

from ditprof.kernels import fp8_fwd_sm90 as K  # noqa: E402
from ditprof.kernels.fp8_fwd_sm90_streamk import compile_streamk  # noqa: E402


def _ops(loop: list[str]) -> dict:
    out: dict = {}
    for line in loop:
        word = line.split()[1 if line.startswith("@") else 0].split(".")[0]
        out[word] = out.get(word, 0) + 1
    return out


def test_config_ships_the_wgmma_preset_at_head_dim_128_only():
    assert K.config_for("sm_90a", 128).mma_preset and not K.config_for("sm_90a", 64).mma_preset
    c = K.config_for("sm_90a", 128)
    # the two constant tiles (64 x 32 e4m3, 160 x 32 e5m2), each 1024-aligned, in place of the 16-byte LDS constant
    assert K.smem_bytes(128, c, qk_int8=True) == K.smem_bytes(128, c) + 2048 + 5120 <= 227 * 1024
    assert K.smem_bytes(128, dataclasses.replace(c, mma_preset=False), qk_int8=True) == K.smem_bytes(128, c)


@pytest.mark.parametrize("grid", ["plain", "plain_q_rot", "streamk"])
def test_preset_wgmma_replaces_the_lds(tmp_path_factory, grid):
    c = K.config_for("sm_90a", 128)
    lds = dataclasses.replace(c, mma_preset=False)

    def build(config):
        if grid == "streamk":
            return lambda extra: compile_streamk(128, "bfloat16", fake=True, qk_int8=True, config=config,
                                                 options_extra=extra)
        return lambda extra: K.compile_sm90(128, "bfloat16", fake=True, qk_int8=True, q_rot=grid == "plain_q_rot",
                                            config=config, options_extra=extra)

    r = compile_sass(tmp_path_factory, f"wgmma_{grid}", build(c))
    ref = compile_sass(tmp_path_factory, f"lds_{grid}", build(lds))
    tile_n = c.tile_n
    loops = key_tile_loops(r["sass"], rf"IGMMA\.64x{tile_n}")
    ref_loops = key_tile_loops(ref["sass"], rf"IGMMA\.64x{tile_n}")
    assert loops and len(loops) == len(ref_loops)
    for loop, ref_loop in zip(loops, ref_loops):
        ops, ref_ops = _ops(loop), _ops(ref_loop)
        print(f"{grid}: loop {len(loop)} vs LDS preset {len(ref_loop)}")
        assert ref_ops.get("LDS") == tile_n // 8 and "LDS" not in ops, (ops, ref_ops)
        assert ops["QGMMA"] == ref_ops["QGMMA"] + 1 and ops["IGMMA"] == ref_ops["IGMMA"], (ops, ref_ops)
        assert len(loop) <= len(ref_loop) - 10, (len(loop), len(ref_loop))
        # the preset: zero-init (RZ as C, scale-d off) on the s8 wgmmas' accumulator, then the s8 wgmmas with no
        # warpgroup wait between
        text = "\n".join(loop)
        m = re.search(rf"QGMMA\.64x{tile_n}x32\.F32\.E4M3\.E5M2 (R\d+), [^\n]*RZ, !UPT", text)
        assert m, "no zero-init preset wgmma in the loop"
        first = text.index(m.group(0))
        chain = text[first:text.index(f"IGMMA.64x{tile_n}x32.S8.S8.SAT {m.group(1)}, ", first)]
        assert "DEPBAR" not in chain and "WARPGROUP.ARRIVE" not in chain, chain
    assert r["sass"].lower().count("0x4b400000") == 0  # no LDS constant stored
    assert r["res"]["registers"] == ref["res"]["registers"]
    assert r["res"]["stack_frame_bytes"] <= ref["res"]["stack_frame_bytes"], (r["res"], ref["res"])


def test_preset_value_is_the_bias():
    """32 products of the two constants are S_BIAS exactly (the constants' bytes decoded by torch)."""
    import torch

    a = torch.tensor([K.PRESET_A], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
    b = torch.tensor([K.PRESET_B], dtype=torch.uint8).view(torch.float8_e5m2).float().item()
    assert (a, b) == (256.0, 1536.0)
    total = torch.tensor(0.0, dtype=torch.float32)
    for _ in range(K.PRESET_K):
        total = total + torch.tensor(a * b, dtype=torch.float32)
    assert total.item() == K.S_BIAS and total.view(torch.int32).item() == K.S_BIAS_BITS
