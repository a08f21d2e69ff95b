"""Compile-only checks of the fp8-sm120 kernel's ``key_lens`` option (per-batch key counts read on the device), on
the CPU: with it the SASS still uses the native FP8 mma and spills nothing on sm_120a and sm_89; without it the
kernel is the machine code compiled before the option existed (the unmasked kernel is not touched by it)."""

import glob
import hashlib
import os

import pytest

cutlass = pytest.importorskip("cutlass")

from ditprof.kernels.inspect_sass import _elf_sections, inspect_kernel  # noqa: E402


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_key_lens_native_qmma_no_spills(arch):
    r = inspect_kernel("fp8-sm120", arch, key_lens=True)
    assert r["key_lens"] is True and r["arch"] == arch
    ins = r["instructions"]
    # the same two strip bodies as without key_lens (steady state + masked tail): 2 x (4 x 2 x 4 + 2 x 16)
    assert ins["QMMA"] == 128, ins
    assert ins["HMMA"] == 0
    assert r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0
    assert ins["STL"] == 0 and ins["LDL"] == 0
    assert 0 < r["registers"] <= 255
    assert r["native_fp8_mma"]


# sha256 over the kernel's .text sections (section name, which carries the kernel symbol, + machine code) of
# compile_fp8_fwd(arch, 128, "bfloat16", write_lse=True) with key_lens off, recorded from the kernel as it was before
# the option was added (nvidia-cutlass-dsl 4.8.1). The whole SASS of sm_120a, sm_89 and sm_90a x bf16/fp16 x
# head_dim 64/128 x LSE on/off was byte-identical before and after; these two guard it cheaply.
_TEXT_SHA256 = {
    "sm_120a": "6772af0a87cbb133e72dabe6762df8a078bfb1d21dfbddf8be8cb8cb57b10766",
    "sm_89": "8845badd8e7f9de0d02338d27a6ef0c00de310362a57df73db81872236668a6d",
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
