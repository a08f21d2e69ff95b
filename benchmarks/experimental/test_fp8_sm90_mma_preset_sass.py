"""Compile-only checks (CPU) of the INT8 accumulator preset as a wgmma (``fp8_fwd_sm90_mma_preset.py``): the key
loop loses the shipped preset's LDS.128 (20 at tile_n 160, 24 at 192) for one zero-init QGMMA E4M3.E5M2 of the s8
wgmmas' shape that they chain onto with no wait between, stays within the shipped kernel's registers with no new
local memory, and the shared memory formula holds (the compile checks it).

    python -m pytest -q benchmarks/experimental/test_fp8_sm90_mma_preset_sass.py
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass")

import fp8_fwd_sm90_mma_preset as MP  # noqa: E402
from sass_helpers import compile_sass, key_tile_loops  # noqa: E402

from ditprof.kernels import fp8_fwd_sm90 as K  # noqa: E402


def _ops(loop: list[str]) -> dict:
    out: dict = {}
    for line in loop:
        word = line.split()[1 if line.startswith("@") else 0].split(".")[0]
        out[word] = out.get(word, 0) + 1
    return out


@pytest.mark.parametrize("q_rot", [False, True], ids=["prep_q", "q_rot"])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_preset_wgmma_replaces_the_lds(tmp_path_factory, head_dim, q_rot):
    tile_n = K.config_for("sm_90a", head_dim).tile_n
    name = f"{head_dim}_{q_rot}"
    r = compile_sass(tmp_path_factory, f"preset_{name}",
                     lambda extra: MP.compile_mma_preset(head_dim, "bfloat16", fake=True, q_rot=q_rot,
                                                         options_extra=extra))
    ship = compile_sass(tmp_path_factory, f"shipped_{name}",
                        lambda extra: K.compile_sm90(head_dim, "bfloat16", fake=True, qk_int8=True, q_rot=q_rot,
                                                     options_extra=extra))
    (loop,) = key_tile_loops(r["sass"], rf"IGMMA\.64x{tile_n}")
    (ref,) = key_tile_loops(ship["sass"], rf"IGMMA\.64x{tile_n}")
    ops, ref_ops = _ops(loop), _ops(ref)
    print(f"D {head_dim} q_rot {q_rot}: loop {len(loop)} vs shipped {len(ref)}")
    assert ref_ops.get("LDS") == tile_n // 8 and "LDS" not in ops, (ops, ref_ops)
    assert ops["QGMMA"] == ref_ops["QGMMA"] + 1 and ops["IGMMA"] == ref_ops["IGMMA"], (ops, ref_ops)
    assert len(loop) <= len(ref) - 10, (len(loop), len(ref))
    # the preset: zero-init (RZ as C, scale-d off) on the s8 wgmmas' accumulator, then the s8 wgmmas with no
    # warpgroup wait between
    text = "\n".join(loop)
    m = re.search(rf"QGMMA\.64x{tile_n}x32\.F32\.E4M3\.E5M2 (R\d+), [^\n]*RZ, !UPT", text)
    assert m, "no zero-init preset wgmma in the loop"
    first = text.index(m.group(0))
    chain = text[first:text.index(f"IGMMA.64x{tile_n}x32.S8.S8.SAT {m.group(1)}, ", first)]
    assert "DEPBAR" not in chain and "WARPGROUP.ARRIVE" not in chain, chain
    res, ref_res = r["res"], ship["res"]
    assert res["registers"] == ref_res["registers"]
    assert res["stack_frame_bytes"] <= ref_res["stack_frame_bytes"], (res, ref_res)


def test_preset_value_is_the_shipped_bias():
    """32 products of the two constants are S_BIAS exactly (the constants' bytes decoded by torch)."""
    import torch

    a = torch.tensor([MP.PRESET_A], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
    b = torch.tensor([MP.PRESET_B], dtype=torch.uint8).view(torch.float8_e5m2).float().item()
    assert (a, b) == (256.0, 1536.0)
    total = torch.tensor(0.0, dtype=torch.float32)
    for _ in range(MP.PRESET_K):
        total = total + torch.tensor(a * b, dtype=torch.float32)
    assert total.item() == K.S_BIAS and total.view(torch.int32).item() == K.S_BIAS_BITS
