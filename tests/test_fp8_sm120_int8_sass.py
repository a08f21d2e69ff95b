"""Compile-only checks of the fp8-sm120 kernel's ``qk_int8`` option (int8 Q and K, per-row Q descales; issue 18), on
the CPU: Q K^T is the int8 mma (IMMA.16832.S8.S8) and P V the native FP8 one (QMMA), every P V mma starts from zero
(two-level accumulation), no int8 mma starts from zero (the accumulator is preset to the float bias 0x4B400000), no
int-to-float conversion, 0 spills on sm_120a and sm_89 for head_dim 64/128, key_lens on/off, LSE on/off; and a strip
of the steady-state loop costs no more instructions than the e4m3 kernel's.  The e4m3 kernel itself is guarded by
the SASS hashes of test_fp8_sm120_key_lens_sass.py (the option does not touch it)."""

import collections
import glob
import io
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

pytest.importorskip("cutlass")

from ditprof.kernels.inspect_sass import (
    _PTXAS_SPILL,
    _CaptureFds,
    cubin_resources,
    find_nvdisasm,
    sass_opcodes,
)

_CACHE: dict = {}


class _Capture(_CaptureFds):
    """``_CaptureFds`` plus what Python writes to ``sys.stdout`` / ``sys.stderr``: where the ptxas remarks come
    (under pytest's capture those objects do not write to fds 1 and 2, and the remarks would be lost)."""

    def __enter__(self):
        self.saved_py = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self.py = io.StringIO()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            super().__exit__(*exc)
        finally:
            sys.stdout, sys.stderr = self.saved_py
        self.text += self.py.getvalue()
        return False


def _compile(arch: str, head_dim: int, key_lens: bool, write_lse: bool, qk_int8: bool = True,
             out_dtype: str = "bfloat16", pv_mma: str = "f32") -> dict:
    """SASS, opcode counts, spills and registers of one configuration (compiled once per test session)."""
    key = (arch, head_dim, key_lens, write_lse, qk_int8, out_dtype, pv_mma)
    if key not in _CACHE:
        from ditprof.kernels import fp8_fwd_sm120 as K

        with tempfile.TemporaryDirectory() as tmp:
            with _Capture() as cap:
                K.compile_fp8_fwd(arch, head_dim, out_dtype, write_lse=write_lse, key_lens=key_lens, qk_int8=qk_int8,
                                  extra_options=f"--keep-cubin --dump-dir {tmp} remarks{{ptx}}", pv_mma=pv_mma)
            (cubin,) = glob.glob(os.path.join(tmp, "*.cubin"))
            res = cubin_resources(cubin)
            sass = subprocess.run([find_nvdisasm(), "-c", cubin], capture_output=True, text=True, check=True).stdout
        m = _PTXAS_SPILL.search(cap.text)
        assert m, repr(cap.text[-3000:])
        base, full = sass_opcodes(sass)
        _CACHE[key] = {"sass": sass, "base": base, "full": full, "registers": res["registers"],
                       "stack_frame_bytes": res["stack_frame_bytes"],
                       "spill_bytes": int(m.group(2)) + int(m.group(3))}
    return _CACHE[key]


def _mma_accumulators(sass: str, op: str) -> list:
    """The C operand (accumulator input) of every ``op`` (QMMA / IMMA) in the SASS: ``RZ`` or a register."""
    return re.findall(op + r"\.[\w.]+\s+R\d+,\s*R\d+[\w.]*,\s*R\d+[\w.]*,\s*(R\w+)", sass)


_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
_BRA_TARGET = re.compile(r"\bBRA\b[^`]*`\(\.(L_x_\d+)\)")


def main_loop_opcodes(sass: str) -> collections.Counter:
    """Opcode counts of the steady-state strip loop: the instructions from the label of the first backward branch
    whose body holds mmas up to that branch (one strip: a loop iteration is one 32-key strip)."""
    labels, instrs = {}, []
    for line in sass.splitlines():
        lm = _LABEL.match(line)
        if lm:
            labels[lm.group(1)] = len(instrs)
            continue
        im = _INSTR.search(line)
        if im:
            instrs.append((im.group(1), line))
    for i, (op, line) in enumerate(instrs):
        t = _BRA_TARGET.search(line) if op == "BRA" else None
        if t and t.group(1) in labels and labels[t.group(1)] <= i:
            body = [o for o, _ in instrs[labels[t.group(1)]:i + 1]]
            if any(o in ("QMMA", "IMMA", "HMMA") for o in body):
                return collections.Counter(body)
    raise AssertionError("no strip loop found in the SASS")


def test_bias_reads_as_12582912_plus_s():
    """The accumulator's preset: int32 0x4B400000 + S, read as a float, is 12582912 + S exactly for |S| <= 2^22
    (head_dim 256 x 128 x 128 at the most)."""
    s = np.concatenate([np.arange(-(1 << 22), -(1 << 22) + 4096), np.arange(-4096, 4097),
                        np.arange((1 << 22) - 4096, (1 << 22) + 1),
                        np.random.default_rng(0).integers(-(1 << 22), (1 << 22) + 1, 100000)]).astype(np.int64)
    from ditprof.kernels.fp8_fwd_sm120 import QK_F32_BIAS, QK_I32_BIAS

    as_float = (s + QK_I32_BIAS).astype(np.int32).view(np.float32).astype(np.float64)
    assert np.array_equal(as_float, QK_F32_BIAS + s.astype(np.float64))
    assert np.float32(QK_F32_BIAS).view(np.int32) == QK_I32_BIAS


_CONFIGS = [(128, False, True), (128, True, False), (128, False, False), (128, True, True),
            (64, False, True), (64, True, False)]


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
@pytest.mark.parametrize("head_dim,key_lens,write_lse", _CONFIGS)
def test_int8_qk_native_mmas_no_spills(arch, head_dim, key_lens, write_lse):
    r = _compile(arch, head_dim, key_lens, write_lse)
    base, full = r["base"], r["full"]
    # 2 strip bodies (steady state + masked tail) x 2 m-tiles x 4 n-tiles x head_dim/32 k-steps of Q K^T, and
    # 2 x 2 x head_dim/8 of P V
    n_qk, n_pv = 2 * 2 * 4 * head_dim // 32, 2 * 2 * head_dim // 8
    assert full.get("IMMA.16832.S8.S8.SAT", 0) == n_qk == base["IMMA"], full
    assert full.get("QMMA.16832.F32.E4M3.E4M3", 0) == n_pv == base["QMMA"], full
    assert base.get("HMMA", 0) == 0
    sass = r["sass"]
    # two-level accumulation: every P V mma from zero; no Q K^T mma from zero (the first k-step adds the preset bias)
    assert _mma_accumulators(sass, "QMMA") == ["RZ"] * n_pv
    imma_c = _mma_accumulators(sass, "IMMA")
    assert len(imma_c) == n_qk and "RZ" not in imma_c, imma_c
    assert base.get("I2F", 0) == 0 and base.get("I2FP", 0) == 0  # the scores need no conversion
    assert r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0
    assert base.get("STL", 0) == 0 and base.get("LDL", 0) == 0
    assert 0 < r["registers"] <= 255


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_int8_qk_fp16_out(arch):
    r = _compile(arch, 128, False, False, out_dtype="float16")
    assert r["base"]["IMMA"] == 64 and r["base"]["QMMA"] == 64
    assert r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_int8_strip_costs_no_more_than_e4m3(arch):
    """The launcher's configuration (head_dim 128, no LSE): one steady-state strip of the int8 kernel has no more
    instructions than the e4m3 kernel's (nvidia-cutlass-dsl 4.8.1: sm_120a 649 vs 678, sm_89 637 vs 637; the int8
    one has no scale FMUL per score and an FFMA in place of the FADD, 28 fewer arithmetic instructions, the rest is
    ptxas's register moves at 255 registers; benchmarks/NOTES.md).  Within 2 %: a ptxas schedule change must not
    make int8 the slower one."""
    int8 = main_loop_opcodes(_compile(arch, 128, False, False)["sass"])
    e4m3 = main_loop_opcodes(_compile(arch, 128, False, False, qk_int8=False)["sass"])
    assert int8["IMMA"] == 32 and int8["QMMA"] == 32 and e4m3["QMMA"] == 64
    # per strip: 32 scores per thread; e4m3 scales them (FMUL) and subtracts the max (FADD), int8 one FFMA each
    assert int8["FMUL"] == e4m3["FMUL"] - 32 + 4, (int8, e4m3)  # + 4: the raw row max times the row's scale
    assert int8["FFMA"] == e4m3["FFMA"] + 32
    assert int8["MUFU"] == e4m3["MUFU"]
    assert sum(int8.values()) <= 1.02 * sum(e4m3.values()), (sum(int8.values()), sum(e4m3.values()))


def test_main_loop_parser():
    text = """
        /*0100*/                   MOV R1, R2 ;
.L_x_3:
        /*0110*/                   IMMA.16832.S8.S8.SAT R8, R4.ROW, R6.COL, R84 ;
        /*0120*/                   FFMA R1, R8, R2, R3 ;
        /*0130*/              @!P0 BRA `(.L_x_4) ;
        /*0140*/                   BRA `(.L_x_3) ;
.L_x_4:
        /*0150*/                   EXIT ;
    """
    assert main_loop_opcodes(text) == collections.Counter({"IMMA": 1, "FFMA": 1, "BRA": 2})
    assert _mma_accumulators(text, "IMMA") == ["R84"]
