"""Compile-only checks of the fp8-sm120 kernel's ``key_lens`` option (per-batch key counts read on the device), on
the CPU: with it the SASS still uses the native FP8 mma, adds every strip's P V from a zero accumulator (two-level
accumulation) and spills nothing on sm_120a and sm_89; without it the kernel is the recorded machine code of the
unmasked kernel (the option does not touch it)."""

import glob
import hashlib
import os
import re

import pytest

cutlass = pytest.importorskip("cutlass")

from ditprof.kernels.inspect_sass import _elf_sections, inspect_kernel  # noqa: E402


def _qmma_accumulators(sass: str) -> list:
    """The C operand (accumulator input) of every QMMA in the SASS: ``RZ`` or a register."""
    return re.findall(r"QMMA\.[\w.]+\s+R\d+,\s*R\d+[\w.]*,\s*R\d+[\w.]*,\s*(R\w+)", sass)


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_key_lens_native_qmma_no_spills(arch, tmp_path):
    sass_path = str(tmp_path / "k.sass")
    r = inspect_kernel("fp8-sm120", arch, key_lens=True, keep_sass=sass_path, qk_format="e4m3")
    assert r["key_lens"] is True and r["arch"] == arch
    ins = r["instructions"]
    # the same two strip bodies as without key_lens (steady state + masked tail): 2 x (4 x 2 x 4 + 2 x 16)
    assert ins["QMMA"] == 128, ins
    # two-level accumulation: every P V mma (2 x 32) and the first k-step of S (2 x 8) start from zero
    acc = _qmma_accumulators(open(sass_path).read())
    assert len(acc) == 128 and acc.count("RZ") == 80, acc
    assert ins["HMMA"] == 0
    assert r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0
    assert ins["STL"] == 0 and ins["LDL"] == 0
    assert 0 < r["registers"] <= 255
    assert r["native_fp8_mma"]


# sha256 over the kernel's .text sections (section name, which carries the kernel symbol, + machine code) of
# compile_fp8_fwd(arch, 128, "bfloat16", write_lse=True) with key_lens off (nvidia-cutlass-dsl 4.8.1). First recorded
# from the kernel as it was before the option was added (the whole SASS of sm_120a, sm_89 and sm_90a x bf16/fp16 x
# head_dim 64/128 x LSE on/off was byte-identical before and after); re-recorded 2026-12-02 for the two-level P V
# accumulation (issue 18), which changes the kernel on purpose. These two guard it cheaply.
_TEXT_SHA256 = {
    "sm_120a": "f393d58ff4e01cfc14a441ae3e31bac8d913b527d7bc6c2035d7226a50d8a162",
    "sm_89": "24f42a53cfbf4899273fe517fe153869091beec0bc69b4ff5801586587ece088",
}


def _text_sha256(arch: str, tmp_path) -> str:
    from ditprof.kernels import fp8_fwd_sm120 as K

    K.compile_fp8_fwd(arch, 128, "bfloat16", write_lse=True, extra_options=f"--keep-cubin --dump-dir {tmp_path}")
    (cubin,) = glob.glob(os.path.join(tmp_path, "*.cubin"))
    data = open(cubin, "rb").read()
    h = hashlib.sha256()
    for name, _type, off, size in _elf_sections(data):
        if name.startswith(".text."):
            h.update(name.encode())
            h.update(data[off:off + size])
    return h.hexdigest()


@pytest.mark.skipif(getattr(cutlass, "__version__", None) != "4.8.1",
                    reason="machine code recorded with nvidia-cutlass-dsl 4.8.1")
@pytest.mark.parametrize("arch", sorted(_TEXT_SHA256))
def test_key_lens_off_is_the_unmasked_kernel(arch, tmp_path):
    assert _text_sha256(arch, tmp_path) == _TEXT_SHA256[arch], (
        f"the fp8-sm120 kernel without key_lens compiles to different machine code for {arch}: if the kernel was "
        "changed on purpose, record the new hash here; the key_lens option alone must not change it")
