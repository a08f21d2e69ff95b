"""Compile our kernels for a target arch on any machine (no GPU needed) and report what ptxas made of them.

``inspect_kernel("fp8-sm120", "sm_120a")`` -> ``{"kernel", "arch", "registers", "spill_bytes", "smem_bytes",
"compile_s", "instructions": {opcode: count}, ...}``.  Registers and the stack frame come from the cubin's
``.nv.info`` attributes, spill bytes from the ptxas remarks (``remarks{ptx}``; the stack frame when the remarks
are missing), SASS opcode counts from ``nvdisasm``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

from ditprof.errors import DitprofError

KNOWN_KERNELS = {
    "fp8-sm120": {
        "description": "FP8 e4m3 FlashAttention forward, mma.sync m16n8k32 (CuTe DSL); native QMMA on "
                       "sm_89/sm_120/sm_121, emulated (HMMA) on sm_90; P V as the block-scaled QMMA.SF (unit "
                       "scales, full FP8 rate) on sm_120a/sm_121a, QMMA.F32 elsewhere (pv_mma)",
        "archs": ("sm_120a", "sm_121a", "sm_120", "sm_89", "sm_90a"),
        "default_arch": "sm_120a",
    },
    "fp8-sm90": {
        "description": "FP8 e4m3 FlashAttention forward for Hopper: TMA + mbarrier pipeline, producer warpgroup "
                       "+ 3 consumer warpgroups, warpgroup MMA (QGMMA), P V promoted to FP32 per key tile "
                       "(CuTe DSL); sm_90a only",
        "archs": ("sm_90a",),
        "default_arch": "sm_90a",
    },
}

# opcodes always present in the report (0 when absent)
KEY_OPCODES = ("QMMA", "QGMMA", "HMMA", "HGMMA", "UTMALDG", "LDSM", "LDGSTS", "LDG", "STG", "STL", "LDL", "MUFU", "SHFL", "BAR")

# .nv.info attribute codes (EIATTR_*)
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAX_STACK_SIZE = 0x23

_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


# ---------------------------------------------------------------------------------------------- tools

def find_nvdisasm() -> str:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel (or PATH / CUDA_HOME)."""
    cands = []
    try:
        import nvidia  # namespace package of the NVIDIA wheels

        for base in list(getattr(nvidia, "__path__", [])):
            cands += sorted(glob.glob(os.path.join(base, "*", "bin", "nvdisasm")), reverse=True)
    except ImportError:
        pass
    on_path = shutil.which("nvdisasm")
    if on_path:
        cands.append(on_path)
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            cands.append(os.path.join(home, "bin", "nvdisasm"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise DitprofError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def _elf_sections(data: bytes) -> list[tuple[str, int, int, int]]:
    """(name, type, offset, size) of each section of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise DitprofError("not an ELF64 cubin")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        raw.append((name, typ, off, size))
    stroff = raw[shstrndx][2]

    def cstr(o):
        end = data.index(b"\0", stroff + o)
        return data[stroff + o:end].decode()

    return [(cstr(n), t, o, s) for n, t, o, s in raw]


def _nv_info_attrs(data: bytes, off: int, size: int):
    """Yield (attr, payload bytes | int) from an .nv.info section."""
    p, end = off, off + size
    while p + 4 <= end:
        fmt, attr = data[p], data[p + 1]
        if fmt == 0x04:  # EIFMT_SVAL: u16 size + payload
            n = struct.unpack_from("<H", data, p + 2)[0]
            yield attr, data[p + 4:p + 4 + n]
            p += 4 + n
        elif fmt == 0x03:  # EIFMT_HVAL
            yield attr, struct.unpack_from("<H", data, p + 2)[0]
            p += 4
        elif fmt == 0x02:  # EIFMT_BVAL
            yield attr, data[p + 2]
            p += 4
        else:  # EIFMT_NVAL
            yield attr, None
            p += 4


def cubin_resources(path: str) -> dict:
    """registers, stack frame, static shared memory of the (single) kernel in a cubin."""
    data = open(path, "rb").read()
    secs = _elf_sections(data)
    regs, frame, stack = None, 0, 0
    for name, _t, off, size in secs:
        if name == ".nv.info":
            for attr, payload in _nv_info_attrs(data, off, size):
                if not isinstance(payload, (bytes, bytearray)) or len(payload) < 8:
                    continue
                _sym, val = struct.unpack_from("<II", payload, 0)
                if attr == _EIATTR_REGCOUNT:
                    regs = val if regs is None else max(regs, val)
                elif attr == _EIATTR_FRAME_SIZE:
                    frame = max(frame, val)
                elif attr in (_EIATTR_MIN_STACK_SIZE, _EIATTR_MAX_STACK_SIZE):
                    stack = max(stack, val)
    static_smem = sum(s for n, _t, _o, s in secs
                      if n.startswith(".nv.shared.") and not n.startswith(".nv.shared.reserved"))
    return {"registers": regs, "stack_frame_bytes": frame, "stack_bytes": stack, "static_smem_bytes": static_smem}


def sass_opcodes(sass: str) -> tuple[dict, dict]:
    """(base opcode -> count, full opcode with modifiers -> count) from nvdisasm text."""
    base, full = {}, {}
    for line in sass.splitlines():
        m = _SASS_LINE.search(line)
        if not m:
            continue
        op, mods = m.group(1), m.group(2)
        base[op] = base.get(op, 0) + 1
        full[op + mods] = full.get(op + mods, 0) + 1
    return base, full


class _CaptureFds:
    """Capture what C code and Python write to fds 1 and 2 (the ptxas remarks come that way)."""

    def __enter__(self):
        self.tmp = tempfile.TemporaryFile(mode="w+b")
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.tmp.fileno(), 1)
        os.dup2(self.tmp.fileno(), 2)
        return self

    def __exit__(self, *exc):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os.dup2(self.saved[0], 1)
            os.dup2(self.saved[1], 2)
            os.close(self.saved[0])
            os.close(self.saved[1])
        self.tmp.seek(0)
        self.text = self.tmp.read().decode(errors="replace")
        self.tmp.close()
        return False


# ---------------------------------------------------------------------------------------------- main

def loop_bodies(sass: str) -> list[list[str]]:
    """Every backward-branch range of the nvdisasm text (label .. the branch to it), as instruction strings."""
    ins, labels, pending = [], {}, []
    for line in sass.splitlines():
        lm = re.match(r"^(\.L_x_\d+):", line.strip())
        if lm:
            pending.append(lm.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            labels.update({name: len(ins) for name in pending})
            pending = []
            ins.append(m.group(2).strip())
    loops = []
    for i, txt in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", txt)
        if m and labels.get(m.group(1), i) < i:
            loops.append(ins[labels[m.group(1)]:i + 1])
    return loops


def _compile_fp8_sm120(arch: str, dump_dir: str, head_dim: int, out_dtype: str, key_lens: bool = False,
                       qk_int8: bool = False, streamk: bool = False, q_rot: bool = False, pv_mma: str | None = None):
    from ditprof.kernels import fp8_fwd_sm120 as K

    if streamk:
        raise DitprofError("the stream-K grid is fp8-sm90's (fp8-sm120 has the plain grid only)")
    if q_rot:
        raise DitprofError("Q in the kernel is fp8-sm90's build; fp8-sm120 takes the prep's Q")

    return K.compile_fp8_fwd(
        arch, head_dim=head_dim, out_dtype=out_dtype, write_lse=True,
        extra_options=f"--keep-cubin --keep-ptx --dump-dir {dump_dir} remarks{{ptx}}", key_lens=key_lens,
        qk_int8=qk_int8, pv_mma=pv_mma or "f32",
    ), K.smem_bytes(head_dim)


def _compile_fp8_sm90(arch: str, dump_dir: str, head_dim: int, out_dtype: str, key_lens: bool = False,
                      qk_int8: bool = False, streamk: bool = False, q_rot: bool = False, pv_mma: str | None = None):
    from ditprof.kernels import fp8_fwd_sm90 as K

    if pv_mma not in (None, "f32"):
        raise DitprofError("pv_mma is fp8-sm120's choice (fp8-sm90's P V is its wgmma)")
    options = f"--keep-cubin --keep-ptx --dump-dir {dump_dir} remarks{{ptx}}"
    if q_rot and (not qk_int8 or key_lens):
        raise DitprofError("Q in the kernel is fp8-sm90's INT8 build without key_lens (--qk-format int8)")
    if streamk:
        from ditprof.kernels.fp8_fwd_sm90_streamk import compile_streamk, streamk_smem_bytes

        if key_lens:
            raise DitprofError("the stream-K grid has no key_lens variant (key_lens calls run the plain grid)")
        if q_rot:
            raise DitprofError("the stream-K grid takes the prep's Q (Q in the kernel is the plain grid's build)")
        fn = compile_streamk(head_dim, out_dtype, fake=True, arch=arch, qk_int8=qk_int8, options_extra=options)
        return fn, streamk_smem_bytes(head_dim, qk_int8=qk_int8)
    fn = K.compile_sm90(head_dim, out_dtype, fake=True, arch=arch, key_lens=key_lens, qk_int8=qk_int8,
                        options_extra=options, q_rot=q_rot)
    return fn, K.smem_bytes(head_dim, q_rot=q_rot, qk_int8=qk_int8)


_COMPILERS = {"fp8-sm120": _compile_fp8_sm120, "fp8-sm90": _compile_fp8_sm90}


def _check_build(kernel: str, arch: str, grid: str) -> None:
    """One-line DitprofError unless ``kernel`` is known, compiles for ``arch`` and has the ``grid`` build."""
    if kernel not in KNOWN_KERNELS:
        raise DitprofError(f"unknown kernel {kernel!r}; known: {', '.join(KNOWN_KERNELS)}")
    if grid not in ("plain", "stream-K"):
        raise DitprofError(f"unknown grid {grid!r}; known: plain, stream-K")
    archs = KNOWN_KERNELS[kernel]["archs"]
    if arch not in archs:
        raise DitprofError(f"kernel {kernel} compiles for {', '.join(archs)}, not {arch!r}")


def _compile_to_sass(kernel: str, arch: str, head_dim: int, out_dtype: str, keep_sass: str | None, key_lens: bool,
                     qk_int8: bool, grid: str, q_in_kernel: bool,
                     pv_mma: str | None = None) -> tuple[str, dict, int, float, str]:
    """Compile one build into a temporary dump directory and disassemble its cubin: (SASS text, the cubin's
    resources, dynamic shared memory bytes, compile seconds, what the compiler printed)."""
    nvdisasm = find_nvdisasm()
    from ditprof.kernels.cute_arch import cute_dsl_arch

    with tempfile.TemporaryDirectory(prefix="ditprof-sass-") as tmp:
        t0 = time.perf_counter()
        try:
            with _CaptureFds() as cap, cute_dsl_arch(arch):
                _fn, dyn_smem = _COMPILERS[kernel](arch, tmp, head_dim, out_dtype, key_lens=key_lens,
                                                   qk_int8=qk_int8, streamk=grid == "stream-K", q_rot=q_in_kernel,
                                                   pv_mma=pv_mma)
        except DitprofError:
            raise
        except Exception as exc:  # compile errors are long; keep the first line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DitprofError(f"compiling {kernel} for {arch} failed: {first}") from exc
        compile_s = time.perf_counter() - t0
        cubins = glob.glob(os.path.join(tmp, "*.cubin"))
        if not cubins:
            raise DitprofError(f"compiling {kernel} for {arch} wrote no cubin")
        cubin = max(cubins, key=os.path.getmtime)
        res = cubin_resources(cubin)
        proc = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
        if proc.returncode != 0:
            raise DitprofError(f"nvdisasm failed: {proc.stderr.strip().splitlines()[:1]}")
        sass = proc.stdout
        if keep_sass:
            with open(keep_sass, "w") as f:
                f.write(sass)
    return sass, res, dyn_smem, compile_s, cap.text


def _spills_and_registers(ptxas_text: str, res: dict) -> tuple[int, str, int | None]:
    """(spill bytes, where that figure comes from, registers): ptxas's remarks where it printed them, else the
    cubin's stack frame (the local memory per thread, spills included) and register count."""
    m = _PTXAS_SPILL.search(ptxas_text)
    if m:
        spill = int(m.group(2)) + int(m.group(3))
        spill_source = "ptxas"
    else:  # no remark captured: the stack frame is the local memory per thread (spills included)
        spill = res["stack_frame_bytes"]
        spill_source = "stack frame"
    regs = res["registers"]
    if regs is None:
        mr = _PTXAS_REGS.search(ptxas_text)
        regs = int(mr.group(1)) if mr else None
    return spill, spill_source, regs


def inspect_kernel(kernel: str, arch: str, head_dim: int = 128, out_dtype: str = "bfloat16",
                   keep_sass: str | None = None, key_lens: bool = False, qk_format: str | None = None,
                   grid: str = "plain", q_in_kernel: bool = False, pv_mma: str | None = None) -> dict:
    """Compile ``kernel`` for ``arch`` with placeholder arguments (CPU is enough) and report registers,
    spills, shared memory, compile time and SASS opcode counts.  ``keep_sass``: also write the SASS there.
    ``key_lens``: the variant with per-batch key counts read on the device (key-padding masks).
    ``qk_format``: "e4m3" or "int8" (Hadamard-rotated INT8 Q/K: the Q K^T MMA is IMMA / IGMMA); None: the process
    default (``kernels.qk_format``). ``grid``: "plain" or "stream-K" (fp8-sm90's build for few-round grids).
    ``q_in_kernel``: fp8-sm90 INT8's build that rotates and quantizes Q itself (``q_rot``, the build the op's launch
    record runs on the plain grid; the stream-K grid takes the prep's Q). ``pv_mma``: fp8-sm120's P V mma, "f32"
    (QMMA.F32) or "block_scaled" (QMMA.SF, sm_120a / sm_121a); None: what the launcher compiles for ``arch``
    (``fp8_fwd_sm120.default_pv_mma``)."""
    from ditprof.kernels.qk_format import qk_format as resolve_qk_format

    qk_int8 = resolve_qk_format(qk_format, head_dim) == "int8"
    _check_build(kernel, arch, grid)
    if kernel == "fp8-sm120" and pv_mma is None:
        from ditprof.kernels.fp8_fwd_sm120 import default_pv_mma

        pv_mma = default_pv_mma(arch)
    sass, res, dyn_smem, compile_s, ptxas_text = _compile_to_sass(kernel, arch, head_dim, out_dtype, keep_sass,
                                                                  key_lens, qk_int8, grid, q_in_kernel, pv_mma)
    base, full = sass_opcodes(sass)
    instructions = {op: base.get(op, 0) for op in KEY_OPCODES}
    instructions.update(dict(sorted(base.items(), key=lambda kv: -kv[1])))
    spill, spill_source, regs = _spills_and_registers(ptxas_text, res)
    mma = {k: v for k, v in full.items() if k.startswith(("QMMA", "HMMA", "IMMA", "QGMMA", "HGMMA", "IGMMA"))}
    return {
        "kernel": kernel,
        "arch": arch,
        "registers": regs,
        "spill_bytes": spill,
        "smem_bytes": dyn_smem + res["static_smem_bytes"],
        "compile_s": round(compile_s, 3),
        "instructions": instructions,
        "stack_frame_bytes": res["stack_frame_bytes"],
        "spill_source": spill_source,
        "smem_dynamic_bytes": dyn_smem,
        "smem_static_bytes": res["static_smem_bytes"],
        "mma_variants": mma,
        "head_dim": head_dim,
        "key_lens": key_lens,
        "qk_format": "int8" if qk_int8 else "e4m3",
        "grid": grid,
        "q_in_kernel": bool(q_in_kernel),
        "pv_mma": pv_mma,
        "native_fp8_mma": mma_is_native(base),
    }


def mma_is_native(base_opcodes: dict) -> bool:
    return base_opcodes.get("QMMA", 0) > 0 or base_opcodes.get("QGMMA", 0) > 0


__all__ = ["KNOWN_KERNELS", "inspect_kernel", "cubin_resources", "sass_opcodes", "loop_bodies", "find_nvdisasm"]
