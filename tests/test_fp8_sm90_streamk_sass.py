"""Compile-only checks of fp8-sm90's stream-K grid (``fp8_fwd_sm90_streamk``; sm_90a, INT8 and e4m3, head_dim 128
and 64; a CPU is enough): no local memory, two key-tile loops (whole tiles and tail segments), each within 10
instructions of the plain kernel's loop (every key-loop instruction is the plain ``attend``'s; the register
allocation moves a few), and the launch spec that asks for it compiles it."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

from ditprof.kernels import fp8_fwd_sm90 as K  # noqa: E402
from ditprof.kernels import fp8_fwd_sm90_streamk as SK  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "experimental"))
from sass_helpers import compile_sass, key_tile_loops  # noqa: E402


def _streamk_and_plain(tmp_path_factory, head_dim: int, qk_int8: bool, **streamk_kw) -> tuple[dict, dict]:
    """``compile_sass`` of the stream-K build (``streamk_kw``: e.g. q_rot) and of the plain one."""
    name = "_".join([str(qk_int8), str(head_dim), *streamk_kw])
    r = compile_sass(tmp_path_factory, f"streamk_{name}",
                     lambda extra: SK.compile_streamk(head_dim, "bfloat16", fake=True, qk_int8=qk_int8,
                                                      options_extra=extra, **streamk_kw))
    plain = compile_sass(tmp_path_factory, f"plain_{name}",
                         lambda extra: functools.partial(K.compile_sm90, qk_int8=qk_int8)(
                             head_dim, "bfloat16", fake=True, options_extra=extra))
    return r, plain


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
def test_streamk_sass(tmp_path_factory, qk_int8, head_dim):
    tile_n = K.config_for("sm_90a", head_dim).tile_n
    r, plain = _streamk_and_plain(tmp_path_factory, head_dim, qk_int8)
    res = r["res"]
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res
    wgmma = rf"[QI]GMMA\.64x{tile_n}"
    loops = sorted(len(x) for x in key_tile_loops(r["sass"], wgmma))
    (ship,) = [len(x) for x in key_tile_loops(plain["sass"], wgmma)]
    print(f"key loops: stream-K {loops}, plain {ship}")
    assert len(loops) == 2 and all(abs(n - ship) <= 20 for n in loops), (loops, ship)
    assert min(loops) - ship <= 10


@pytest.mark.parametrize("head_dim", [128, 64])
def test_streamk_q_rot_sass(tmp_path_factory, head_dim):
    """The stream-K grid with Q in the kernel on its whole-tile CTAs (``Sm90Fp8StreamKQRotAttention``): the
    rotation on the 16-bit wgmma once (the whole-tile path; HGMMA, D/16 k-steps), Q's amax with the NaN-propagating
    max, the INT8 / FP8 wgmmas of the stream-K build, two key-tile loops within a few instructions of the plain
    kernel's, no local memory, the shared memory of the formula (the compile checks it)."""
    tile_n = K.config_for("sm_90a", head_dim).tile_n
    r, plain = _streamk_and_plain(tmp_path_factory, head_dim, True, q_rot=True)
    sk = compile_sass(tmp_path_factory, f"streamk_ref_{head_dim}",
                      lambda extra: SK.compile_streamk(head_dim, "bfloat16", fake=True, qk_int8=True,
                                                       options_extra=extra))
    res = r["res"]
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res
    ops = {}
    for x in re.findall(r"\b([HIQ]GMMA)\.\w+", r["sass"]):
        ops[x] = ops.get(x, 0) + 1
    ref = {}
    for x in re.findall(r"\b([HIQ]GMMA)\.\w+", sk["sass"]):
        ref[x] = ref.get(x, 0) + 1
    assert ops.get("HGMMA") == head_dim // 16 and "HGMMA" not in ref, ops
    assert ops["IGMMA"] == ref["IGMMA"] > 0 and ops["QGMMA"] == ref["QGMMA"] > 0, (ops, ref)
    assert "FMNMX.NAN" in r["sass"] and "FMNMX.NAN" not in sk["sass"]
    wgmma = rf"IGMMA\.64x{tile_n}"
    loops = sorted(len(x) for x in key_tile_loops(r["sass"], wgmma))
    (ship,) = [len(x) for x in key_tile_loops(plain["sass"], wgmma)]
    print(f"key loops: stream-K q_rot {loops}, plain {ship}")
    assert len(loops) == 2 and all(abs(n - ship) <= 20 for n in loops), (loops, ship)
    assert SK.streamk_smem_bytes(head_dim, q_rot=True) == SK.streamk_smem_bytes(head_dim) + 2 * head_dim ** 2 + 1024
    with pytest.raises(ValueError, match="INT8 without key_lens"):
        SK.compile_streamk(head_dim, "bfloat16", fake=True, qk_int8=False, q_rot=True)


def test_the_streamk_spec_compiles_the_streamk_kernel():
    from ditprof.kernels.launch import KernelSpec, compile_spec

    spec = KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, False, False, True, streamk=True)
    fn = compile_spec(spec, fake=True)
    assert fn is not None
    with pytest.raises(ValueError, match="no key_lens mode"):
        compile_spec(KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, True, False, True, streamk=True),
                     fake=True)
    with pytest.raises(ValueError, match="plain grid"):
        compile_spec(KernelSpec("fp8-sm120", "sm_120a", 128, "bfloat16", True, False, False, False, streamk=True),
                     fake=True)


def test_inspect_reports_the_streamk_build(capsys):
    """``ditprof kernels inspect --kernel fp8-sm90 --arch sm_90a --grid stream-K``: native FP8 / INT8 wgmma, no
    spills, the shared memory of the second Q box (``--q-in-kernel``: and of the rotation matrix, with its 16-bit
    wgmma); key_lens and fp8-sm120 have no stream-K build, e4m3 and fp8-sm120 no Q-in-the-kernel build (one-line
    errors)."""
    import json

    from ditprof.cli import main
    from ditprof.errors import DitprofError
    from ditprof.kernels.inspect_sass import find_nvdisasm, inspect_kernel

    try:
        find_nvdisasm()
    except DitprofError as exc:
        pytest.skip(str(exc))
    assert main(["kernels", "inspect", "--kernel", "fp8-sm90", "--arch", "sm_90a", "--grid", "stream-K",
                 "--qk-format", "int8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["grid"] == "stream-K" and r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0
    assert r["instructions"]["IGMMA"] > 0 and r["instructions"]["QGMMA"] > 0
    assert r["smem_dynamic_bytes"] == SK.streamk_smem_bytes(128) == K.smem_bytes(128) + 192 * 128
    assert r["q_in_kernel"] is False and r["instructions"]["HGMMA"] == 0
    # --q-in-kernel: the build whose whole-tile CTAs rotate and quantize Q (the 16-bit rotation wgmma)
    assert main(["kernels", "inspect", "--kernel", "fp8-sm90", "--arch", "sm_90a", "--grid", "stream-K",
                 "--qk-format", "int8", "--q-in-kernel", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["q_in_kernel"] is True and r["spill_bytes"] == 0 and r["instructions"]["HGMMA"] == 128 // 16
    assert r["smem_dynamic_bytes"] == SK.streamk_smem_bytes(128, q_rot=True)
    with pytest.raises(DitprofError, match="INT8 build without key_lens"):
        inspect_kernel("fp8-sm90", "sm_90a", qk_format="e4m3", grid="stream-K", q_in_kernel=True)
    with pytest.raises(DitprofError, match="takes the prep's Q"):
        inspect_kernel("fp8-sm120", "sm_120a", q_in_kernel=True)
    with pytest.raises(DitprofError, match="no key_lens variant"):
        inspect_kernel("fp8-sm90", "sm_90a", key_lens=True, grid="stream-K")
    with pytest.raises(DitprofError, match="plain grid only"):
        inspect_kernel("fp8-sm120", "sm_120a", grid="stream-K")
    with pytest.raises(DitprofError, match="unknown grid"):
        inspect_kernel("fp8-sm90", "sm_90a", grid="split-KV")
