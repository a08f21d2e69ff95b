"""Compile-only checks of fp8-sm120's ``pv_mma`` choice (issue 44), on the CPU: the "block_scaled" build issues every
P V mma as the MX block-scaled e4m3 mma (``QMMA.SF.16832.F32.E4M3.E4M3.E8``, the full FP8 rate on sm_120) from a zero
accumulator, with no ``QMMA.16832.F32`` left for P V, the Q K^T mmas unchanged and 0 spills on sm_120a for head_dim
64/128, e4m3 and int8 Q/K, key_lens and LSE on/off; the "f32" build is the recorded machine code of the kernel before
the option, and the block-scaled path with the plain mma's text in place of the block-scaled one is byte for byte
the f32 build (the same registers: only the instruction differs); the launcher picks "block_scaled" on sm_120a /
sm_121a only."""

import glob
import hashlib
import os

import pytest

pytest.importorskip("cutlass")

from ditprof.errors import DitprofError  # noqa: E402
from ditprof.kernels.inspect_sass import _elf_sections, find_nvdisasm  # noqa: E402

try:
    find_nvdisasm()
except DitprofError as exc:  # the SASS checks need it; the choice checks below do not
    _NO_NVDISASM = str(exc)
else:
    _NO_NVDISASM = None
needs_nvdisasm = pytest.mark.skipif(_NO_NVDISASM is not None, reason=_NO_NVDISASM or "")

from test_fp8_sm120_int8_sass import _compile, _mma_accumulators, main_loop_opcodes  # noqa: E402
from test_fp8_sm120_key_lens_sass import _TEXT_SHA256  # noqa: E402

BLOCK_SCALED = "QMMA.SF.16832.F32.E4M3.E4M3.E8"
QMMA_F32 = "QMMA.16832.F32.E4M3.E4M3"
IMMA_S8 = "IMMA.16832.S8.S8.SAT"

_CONFIGS = [(128, False, True), (128, True, False), (128, False, False), (64, False, True), (64, True, False)]


@needs_nvdisasm
@pytest.mark.parametrize("qk_int8", [False, True], ids=["e4m3", "int8"])
@pytest.mark.parametrize("head_dim,key_lens,write_lse", _CONFIGS)
def test_block_scaled_pv(head_dim, key_lens, write_lse, qk_int8):
    r = _compile("sm_120a", head_dim, key_lens, write_lse, qk_int8=qk_int8, pv_mma="block_scaled")
    full, base = r["full"], r["base"]
    # 2 strip bodies (steady state + masked tail) x 2 m-tiles x head_dim/8 n-tiles of P V, x 4 n x head_dim/32 k of S
    n_pv, n_qk = 2 * 2 * head_dim // 8, 2 * 2 * 4 * head_dim // 32
    assert full.get(BLOCK_SCALED, 0) == n_pv, full
    # the P V count moved wholly to the block-scaled mma; Q K^T as before (e4m3 QMMA.F32 or int8 IMMA)
    assert full.get(QMMA_F32, 0) == (0 if qk_int8 else n_qk), full
    assert full.get(IMMA_S8, 0) == (n_qk if qk_int8 else 0), full
    assert base["QMMA"] == n_pv + (0 if qk_int8 else n_qk) and base.get("HMMA", 0) == 0
    # two-level accumulation as in the f32 build: every P V mma from zero
    sass = r["sass"]
    assert _mma_accumulators(sass, r"QMMA\.SF") == ["RZ"] * n_pv
    assert r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0
    assert base.get("STL", 0) == 0 and base.get("LDL", 0) == 0
    assert 0 < r["registers"] <= 255


@needs_nvdisasm
@pytest.mark.parametrize("qk_int8", [False, True], ids=["e4m3", "int8"])
def test_block_scaled_strip_like_f32(qk_int8):
    """The launcher's configuration (head_dim 128, no LSE): a steady-state strip of the block-scaled build has the
    f32 build's mmas with only the P V opcode swapped, and costs no more than 2 % more instructions (ptxas's moves
    at 255 registers; the scale register is one constant for the whole kernel)."""
    bs = _compile("sm_120a", 128, False, False, qk_int8=qk_int8, pv_mma="block_scaled")
    f32 = _compile("sm_120a", 128, False, False, qk_int8=qk_int8, pv_mma="f32")
    loop_bs, loop_f32 = main_loop_opcodes(bs["sass"]), main_loop_opcodes(f32["sass"])
    assert loop_bs["QMMA"] == loop_f32["QMMA"] and loop_bs.get("IMMA", 0) == loop_f32.get("IMMA", 0)
    assert loop_bs["MUFU"] == loop_f32["MUFU"] and loop_bs["FADD"] == loop_f32["FADD"]
    assert sum(loop_bs.values()) <= 1.02 * sum(loop_f32.values()), (sum(loop_bs.values()), sum(loop_f32.values()))
    assert f32["full"].get(BLOCK_SCALED, 0) == 0


@needs_nvdisasm
def test_block_scaled_sm121a():
    r = _compile("sm_121a", 128, False, False, qk_int8=True, pv_mma="block_scaled")
    assert r["full"].get(BLOCK_SCALED, 0) == 64 and r["full"].get(QMMA_F32, 0) == 0
    assert r["spill_bytes"] == 0


def _text(arch: str, head_dim: int, qk_int8: bool, pv_mma: str, tmp) -> bytes:
    """The kernel's .text sections (names + machine code) of one build."""
    from ditprof.kernels import fp8_fwd_sm120 as K

    os.makedirs(tmp, exist_ok=True)
    K.compile_fp8_fwd(arch, head_dim, "bfloat16", write_lse=True, qk_int8=qk_int8, pv_mma=pv_mma,
                      extra_options=f"--keep-cubin --dump-dir {tmp}")
    (cubin,) = glob.glob(os.path.join(tmp, "*.cubin"))
    data = open(cubin, "rb").read()
    return b"".join(name.encode() + data[off:off + size]
                    for name, _type, off, size in _elf_sections(data) if name.startswith(".text."))


# the f32 e4m3 mma with the block-scaled path's operand numbering ($11, the scale register, unused)
_PLAIN_MMA_ASM = ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                  "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $10, $10, $10};")


@pytest.mark.parametrize("arch,head_dim,qk_int8", [("sm_120a", 128, True), ("sm_120a", 64, False),
                                                   ("sm_89", 128, False)])
def test_block_scaled_path_with_the_plain_mma_is_the_f32_kernel(arch, head_dim, qk_int8, tmp_path, monkeypatch):
    """The block-scaled path's register plumbing (A, B, D words of each mma in cute.gemm's order for MmaFP8Op),
    checked without the instruction: with the plain e4m3 mma's text in its inline PTX, the build is byte for byte
    the f32 one (cute.gemm), so the block-scaled build differs from it in the mma instruction alone."""
    from ditprof.kernels import fp8_fwd_sm120 as K

    f32 = _text(arch, head_dim, qk_int8, "f32", tmp_path / "f32")
    monkeypatch.setattr(K, "BLOCK_SCALED_ARCHS", (arch,))
    monkeypatch.setattr(K, "_PV_MMA_BLOCK_SCALED_ASM", _PLAIN_MMA_ASM)
    assert _text(arch, head_dim, qk_int8, "block_scaled", tmp_path / "path") == f32


def test_f32_is_the_recorded_kernel(tmp_path):
    """pv_mma="f32" (named explicitly) compiles to the machine code recorded before the option (sm_120a, head_dim
    128, bf16, LSE, e4m3; the hash of test_fp8_sm120_key_lens_sass, which also pins sm_89)."""
    import cutlass

    if getattr(cutlass, "__version__", None) != "4.8.1":
        pytest.skip("machine code recorded with nvidia-cutlass-dsl 4.8.1")
    assert hashlib.sha256(_text("sm_120a", 128, False, "f32", tmp_path)).hexdigest() == _TEXT_SHA256["sm_120a"]


def test_default_pv_mma_and_launch_choice():
    from ditprof.kernels import launch_choice
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.fp8_fwd_sm120 import default_pv_mma

    assert [default_pv_mma(a) for a in ("sm_120a", "sm_121a")] == ["block_scaled"] * 2
    assert [default_pv_mma(a) for a in ("sm_89", "sm_90a", "sm_100a", "sm_120")] == ["f32"] * 4
    for arch, want in (("sm_120a", "block_scaled"), ("sm_121a", "block_scaled"), ("sm_89", "f32")):
        choice = launch_choice.choose_launch(arch, (1, 2, 64, 64, 128), "bfloat16", Fp8Options(), key_lens=False,
                                             write_lse=False, q_in_kernel_ok=True)
        assert choice.spec.kernel == "fp8-sm120" and choice.spec.pv_mma == want, choice.spec
    forced = launch_choice.choose_launch("sm_90a", (1, 2, 64, 64, 128), "bfloat16", Fp8Options(kernel="fp8-sm120"),
                                         key_lens=False, write_lse=False, q_in_kernel_ok=True)
    assert forced.spec.pv_mma == "f32"
    sm90 = launch_choice.choose_launch("sm_90a", (1, 2, 64, 64, 128), "bfloat16", Fp8Options(streamk=False),
                                       key_lens=False, write_lse=False, q_in_kernel_ok=True)
    assert sm90.spec.kernel == "fp8-sm90" and sm90.spec.pv_mma == "f32"


def test_bad_pv_mma():
    from ditprof.kernels import fp8_fwd_sm120 as K

    with pytest.raises(DitprofError, match="needs sm_120a or sm_121a, not sm_89"):
        K.compile_fp8_fwd("sm_89", 128, pv_mma="block_scaled")
    with pytest.raises(DitprofError, match="pv_mma must be one of f32, block_scaled"):
        K.Fp8FlashAttentionSm120(128, pv_mma="f16")
