"""Compile-only checks of the persistent Hopper FP8 attention variant (``fp8_fwd_sm90_persistent.py``) on a CPU:
sm_90a, head_dim 128 and 64, bf16 out, with and without key lengths: native FP8 wgmma (the shipped kernel's count),
no local memory (ptxas spills nothing), the launch register budget, and a main loop (the key-tile loop) the size of
the shipped kernel's. The static schedule's coverage is checked in plain Python.

    python -m pytest -q benchmarks/experimental/test_fp8_sm90_persistent_sass.py
"""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

import fp8_fwd_sm90_persistent as P
from sass_helpers import compile_sass, key_tile_loop

from ditprof.kernels import fp8_fwd_sm90 as K

_CACHE: dict = {}
CASES = [(128, False), (128, True), (64, False), (64, True)]


def _compiled(tmp_path_factory, compile_fn, head_dim: int, key_lens: bool) -> dict:
    key = (compile_fn.__module__, head_dim, key_lens)
    if key not in _CACHE:
        _CACHE[key] = compile_sass(
            tmp_path_factory, f"pers_{head_dim}_{key_lens}",
            lambda extra: compile_fn(head_dim, "bfloat16", fake=True, key_lens=key_lens, options_extra=extra))
    return _CACHE[key]


def main_loop(sass: str) -> list[str]:
    """The instructions of the key-tile loop: the smallest backward-branch range holding a Q K^T wgmma (QGMMA),
    >= 80 exps (one 160-key tile's) and no global store (the work-tile loop and the mbarrier retry branches hold
    more)."""
    return key_tile_loop(sass, r"QGMMA\.64x160")


@pytest.mark.parametrize("head_dim,key_lens", CASES, ids=[f"d{d}{'-key_lens' if k else ''}" for d, k in CASES])
def test_persistent_sm90a_qgmma_no_spills(tmp_path_factory, head_dim, key_lens):
    r = _compiled(tmp_path_factory, P.compile_persistent, head_dim, key_lens)
    base, res, sass = r["base"], r["res"], r["sass"]
    c = K.config_for("sm_90a", head_dim)
    kb = c.tile_n // 32
    # Q K^T (prologue + loop), P V in pv_split slices (loop + last tile), the row sums beside slice 0
    assert base.get("QGMMA", 0) == 2 * (head_dim // 32) + 2 * kb * c.pv_split + 2 * kb, base
    assert f"QGMMA.64x{c.tile_n}x32.F32.E4M3.E4M3" in sass
    assert f"QGMMA.64x{head_dim // c.pv_split}x32.F32.E4M3.E4M3 R" in sass  # P from registers
    assert base.get("HMMA", 0) == 0 and base.get("QMMA", 0) == 0
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res  # no local memory: ptxas spilled nothing
    assert base.get("STL", 0) == 0 and base.get("LDL", 0) == 0
    assert 0 < res["registers"] <= 65536 // (128 * (1 + c.consumer_wgs))  # launch budget (setmaxnreg moves it)
    assert base.get("UTMALDG", 0) >= 3 and sass.count("SR_CLOCKLO") == 1  # TMA loads; the one clock fence
    assert "c[0x0][0xc]" in sass  # the work-tile loop strides by gridDim.x (read from the constant bank)


@pytest.mark.parametrize("head_dim,key_lens", CASES, ids=[f"d{d}{'-key_lens' if k else ''}" for d, k in CASES])
def test_persistent_main_loop_is_the_shipped_one(tmp_path_factory, head_dim, key_lens):
    """The key-tile loop is the shipped kernel's up to register allocation and the Q buffer's address: the same
    wgmmas, exps and FFMAs, within a few instructions in all."""
    shipped = main_loop(_compiled(tmp_path_factory, K.compile_sm90, head_dim, key_lens)["sass"])
    pers = main_loop(_compiled(tmp_path_factory, P.compile_persistent, head_dim, key_lens)["sass"])
    print(f"key-tile loop: shipped {len(shipped)}, persistent {len(pers)} instructions")
    for op in ("QGMMA", "MUFU.EX2", "FFMA", "FMNMX", "F2FP", "SYNCS"):
        assert sum(op in x for x in pers) == sum(op in x for x in shipped), op
    assert abs(len(pers) - len(shipped)) <= 16, (len(pers), len(shipped))


def test_persistent_smem_and_errors():
    c = K.config_for("sm_90a", 128)
    assert P.smem_bytes(128) == K.smem_bytes(128) + 64 * c.consumer_wgs * 128 <= 227 * 1024
    assert P.smem_bytes(64) == K.smem_bytes(64) + 64 * c.consumer_wgs * 64
    with pytest.raises(ValueError, match="INT8"):
        P.Sm90Fp8PersistentAttention(128, qk_int8=True)


@pytest.mark.parametrize("B,H,sq,grid", [(1, 24, 4608, 132), (2, 3, 3001, 7), (1, 2, 100, 132), (3, 5, 1000, 1)])
def test_static_schedule_covers_every_tile_once(B, H, sq, grid):
    """CTA c runs tiles c, c + grid, ...: every (m_block, head, batch) exactly once, m_block fastest."""
    kern = P.Sm90Fp8PersistentAttention(128)
    n_m = -(-sq // kern.tile_m)
    n_work = P.work_tiles(B, H, sq)
    assert n_work == n_m * H * B
    seen = [kern.work_coords(t, n_m, H) for c in range(grid) for t in range(c, n_work, grid)]
    assert sorted(seen) == sorted((m, h, b) for b in range(B) for h in range(H) for m in range(n_m))
    assert [kern.work_coords(t, n_m, H) for t in range(min(n_m, 3))] == [(m, 0, 0) for m in range(min(n_m, 3))]
