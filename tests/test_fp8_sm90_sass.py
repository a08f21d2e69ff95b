"""Compile-only checks of the shipped Hopper (sm_90a) FP8 attention kernel: a CPU is enough, CuTe DSL compiles for any
arch. Its SASS is the explored variants module's at its defaults (the schedule that was measured), up to the
kernel's symbol name; native FP8 wgmma, no spills, the register budget."""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

from ditprof.kernels import fp8_fwd_sm90 as K  # noqa: E402
from ditprof.kernels.inspect_sass import cubin_resources, find_nvdisasm, sass_opcodes  # noqa: E402

EXPERIMENTAL = Path(__file__).resolve().parents[1] / "benchmarks" / "experimental"


def _sass(compile_fn, tmp: Path, head_dim: int, dtype: str) -> tuple[str, dict]:
    compile_fn(head_dim, dtype, fake=True, options_extra=f"--keep-cubin --dump-dir {tmp}")
    cubin = max(glob.glob(os.path.join(tmp, "*.cubin")), key=os.path.getmtime)
    sass = subprocess.run([find_nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True).stdout
    return sass, cubin_resources(cubin)


def _without_names(sass: str) -> str:
    # the symbol carries the defining module's path (ditprofkernelsfp8_fwd_sm90 vs fp8_fwd_sm90_variants)
    return re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", sass)


@pytest.mark.parametrize("head_dim,dtype", [(128, "bfloat16"), (64, "float16")])
def test_shipped_kernel_is_the_measured_schedule(tmp_path, head_dim, dtype):
    sys.path.insert(0, str(EXPERIMENTAL))
    try:
        import fp8_fwd_sm90_variants as V
    finally:
        sys.path.remove(str(EXPERIMENTAL))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shipped, res = _sass(K.compile_sm90, tmp_path / "a", head_dim, dtype)
    tile_n = K.config_for("sm_90a", head_dim).tile_n  # the variants' default is 160 keys, the shipped 192 at 64
    variant, _ = _sass(functools.partial(V.compile_sm90, tile_n=tile_n), tmp_path / "b", head_dim, dtype)
    assert _without_names(shipped) == _without_names(variant)
    assert "KERNEL" in _without_names(shipped)
    base, _full = sass_opcodes(shipped)
    assert any(op.startswith("QGMMA") for op in base), "FP8 wgmma (QGMMA) expected on sm_90a"
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res  # no local memory: no spills
    assert 0 < res["registers"] <= 65536 // (128 * 4)  # the launch budget of 4 warpgroups (setmaxnreg moves it)


def test_config_and_smem():
    c = K.config_for("sm_90a", 128)
    assert (c.tile_n, c.kv_stages, c.consumer_wgs, c.pv_split, c.mma_preset) == (160, 3, 3, 2, True)
    assert K.config_for("sm_90a", 64) == K.Sm90Config(tile_n=192)  # half the O accumulator: a wider key tile fits
    with pytest.raises(ValueError, match="sm_90a only"):
        K.config_for("sm_120a", 128)
    with pytest.raises(ValueError, match="head_dim 96"):
        K.config_for("sm_90a", 96)
    barriers = -(-(2 + 4 * 3) * 8 // 1024) * 1024
    expect = barriers + 64 * 3 * 128 + 2 * 3 * 160 * 128 + 8 * 160
    assert K.smem_bytes(128) == -(-expect // 1024) * 1024 <= 227 * 1024


def test_key_order_is_the_shared_definition():
    import torch

    from ditprof.kernels.key_order import key_order_for_positions

    p = torch.arange(320)
    assert torch.equal(K.sm90_key_order_for_positions(p), key_order_for_positions(p))


@pytest.mark.parametrize("head_dim", [128, 64])
def test_int8_qk_kernel_sass(tmp_path, head_dim):
    """INT8 Q/K (qk_int8) with the accumulator preset by LDS.128 of the smem constant (head_dim 64's build; 128
    ships the wgmma preset, tests/test_fp8_sm90_preset_sass.py): Q K^T on the s8 wgmma (IGMMA), P V still FP8
    (QGMMA), no per-register moves of 0x4B400000, no I2F for S, no spills without key lengths."""
    import dataclasses

    config = dataclasses.replace(K.config_for("sm_90a", head_dim), mma_preset=False)
    K.compile_sm90(head_dim, "bfloat16", fake=True, qk_int8=True, config=config,
                   options_extra=f"--keep-cubin --dump-dir {tmp_path}")
    cubin = max(glob.glob(os.path.join(tmp_path, "*.cubin")), key=os.path.getmtime)
    sass = subprocess.run([find_nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True).stdout
    res = cubin_resources(cubin)
    base, _full = sass_opcodes(sass)
    assert base.get("IGMMA", 0) == 2 * head_dim // 32, base  # D/32 k-blocks, prologue + main loop
    assert base.get("QGMMA", 0) > 0 and base.get("LDS", 0) >= 2 * 160 // 8, base
    assert sass.lower().count("0x4b400000") == 1 and "I2F.F32.S32" not in sass  # one: the smem constant's store
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res


def _compiled_sass(tmp: Path, fn, head_dim: int, **kw) -> tuple[str, dict]:
    fn(head_dim, "bfloat16", fake=True, options_extra=f"--keep-cubin --dump-dir {tmp}", **kw)
    cubin = max(glob.glob(os.path.join(tmp, "*.cubin")), key=os.path.getmtime)
    return (subprocess.run([find_nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True).stdout,
            cubin_resources(cubin))


@pytest.mark.parametrize("head_dim", [128, 64])
def test_q_in_the_kernel_sass(tmp_path, head_dim):
    """``q_rot`` (Q rotated and quantized in the consumer warpgroups): the rotation on the 16-bit wgmma (HGMMA,
    D/16 k-steps), Q's amax with the NaN-propagating max, the INT8 Q K^T and the key-tile loop as the prep's-Q
    build (a few instructions of register allocation apart), no local memory inside the loop."""
    sys.path.insert(0, str(EXPERIMENTAL))
    try:
        from sass_helpers import key_tile_loop
    finally:
        sys.path.remove(str(EXPERIMENTAL))
    fn = K.compile_sm90
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sass, res = _compiled_sass(tmp_path / "a", fn, head_dim, qk_int8=True, q_rot=True)
    ref, _ = _compiled_sass(tmp_path / "b", fn, head_dim, qk_int8=True)
    base, _ = sass_opcodes(sass)
    ref_base, _ = sass_opcodes(ref)
    assert base.get("HGMMA", 0) == head_dim // 16 and "HGMMA" not in ref, base
    assert base.get("IGMMA", 0) == ref_base.get("IGMMA", 0) > 0 and base.get("QGMMA") == ref_base.get("QGMMA"), base
    assert "FMNMX.NAN" in sass
    tile = K.config_for("sm_90a", head_dim).tile_n
    loop, ref_loop = (key_tile_loop(s, rf"IGMMA\.64x{tile}") for s in (sass, ref))
    assert abs(len(loop) - len(ref_loop)) <= 8, (len(loop), len(ref_loop))
    assert not any(x.startswith(("LDL", "STL", "HGMMA")) for x in loop)
    assert res["stack_frame_bytes"] <= 16, res  # at most a few values kept across the loop


def test_inspect_reports_the_q_in_the_kernel_build(capsys):
    """``ditprof kernels inspect --q-in-kernel``: the INT8 build the op runs on the plain grid (the 16-bit rotation
    wgmma, the shared memory with the rotation tile); one-line errors where there is no such build (e4m3, the
    stream-K grid, fp8-sm120)."""
    import json

    from ditprof.cli import main
    from ditprof.errors import DitprofError
    from ditprof.kernels.inspect_sass import inspect_kernel

    assert main(["kernels", "inspect", "--kernel", "fp8-sm90", "--arch", "sm_90a", "--qk-format", "int8",
                 "--q-in-kernel", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["q_in_kernel"] is True and r["grid"] == "plain" and r["instructions"]["HGMMA"] == 128 // 16
    assert r["smem_dynamic_bytes"] == K.smem_bytes(128, q_rot=True, qk_int8=True) > K.smem_bytes(128, qk_int8=True)
    with pytest.raises(DitprofError, match="INT8 build without key_lens"):
        inspect_kernel("fp8-sm90", "sm_90a", qk_format="e4m3", q_in_kernel=True)
    with pytest.raises(DitprofError, match="takes the prep's Q"):
        inspect_kernel("fp8-sm90", "sm_90a", qk_format="int8", grid="stream-K", q_in_kernel=True)
    with pytest.raises(DitprofError, match="takes the prep's Q"):
        inspect_kernel("fp8-sm120", "sm_120a", q_in_kernel=True)
