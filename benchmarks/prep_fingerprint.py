"""Fingerprints of the Triton prep's compiled kernels (sm_90, compiled offline: no GPU): one sha256 per kernel over
its PTX (the debug information dropped: ``.loc`` / ``.file`` lines and the ``.debug_*`` sections carry source
line numbers and the checkout's path) and one over its SASS (nvdisasm text), for the launch configurations the
shipped prep compiles, so two checkouts can be compared kernel by kernel.

    python benchmarks/prep_fingerprint.py --json before.json
    python benchmarks/prep_fingerprint.py --json after.json --compare before.json   # exit 1 on any difference

Runs against a checkout that takes a ``PrepConfig`` (``compile_offline(config=...)``) or one that still has the
prep's module constants (set on the module for the variant builds).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import re
import subprocess
import sys
import tempfile

from fingerprint_io import write_and_compare  # benchmarks/ (the script's own folder)

# (name, dtype, head_dim, qk_int8, overrides of the launch configuration): the shipped configuration at both head
# dims and Q/K formats, plus the INT8 variants a GPU launch picks by grid size (16-row rotated stats tiles, a
# halved stats chunk)
BUILDS = [
    ("d128-e4m3", "bf16", 128, False, {}),
    ("d64-e4m3", "bf16", 64, False, {}),
    ("d128-int8", "bf16", 128, True, {}),
    ("d64-int8", "bf16", 64, True, {}),
    ("d128-int8-rot16", "bf16", 128, True, {"stats_rot_rows": 16}),
    ("d128-int8-chunk256", "bf16", 128, True, {"stats_chunk": 256}),
    ("d128-e4m3-fp16", "fp16", 128, False, {}),
]

_DEBUG = re.compile(r"^\s*\.(loc|file)\b.*$", re.M)
_DEBUG_SECTIONS = re.compile(r"^\s*\.section\s+\.debug", re.M)


def _code(ptx: str) -> str:
    """The PTX without its debug information."""
    m = _DEBUG_SECTIONS.search(ptx)
    return _DEBUG.sub("", ptx[:m.start()] if m else ptx)


def _sass(cubin: bytes) -> str:
    from ditprof.kernels.inspect_sass import find_nvdisasm

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout


def _compile(dtype: str, head_dim: int, qk_int8: bool, overrides: dict) -> dict:
    from ditprof.kernels import prep_triton

    if "config" in inspect.signature(prep_triton.compile_offline).parameters:
        from ditprof.kernels.fp8_config import PrepConfig

        return prep_triton.compile_offline(90, dtype=dtype, head_dim=head_dim, qk_int8=qk_int8,
                                           config=PrepConfig(**overrides))
    # a checkout with module constants: stats_chunk was a keyword, the others module names
    kwargs = {"stats_chunk": overrides["stats_chunk"]} if "stats_chunk" in overrides else {}
    saved = {}
    for key, value in overrides.items():
        if key != "stats_chunk":
            saved[key.upper()] = getattr(prep_triton, key.upper())
            setattr(prep_triton, key.upper(), value)
    try:
        return prep_triton.compile_offline(90, dtype=dtype, head_dim=head_dim, qk_int8=qk_int8, **kwargs)
    finally:
        for key, value in saved.items():
            setattr(prep_triton, key, value)


def fingerprints() -> dict:
    out = {}
    for name, dtype, head_dim, qk_int8, overrides in BUILDS:
        for kernel, compiled in _compile(dtype, head_dim, qk_int8, overrides).items():
            ptx = _code(compiled.asm["ptx"])
            sass = _sass(compiled.asm["cubin"])
            out[f"{name}/{kernel}"] = {"ptx": hashlib.sha256(ptx.encode()).hexdigest(),
                                      "sass": hashlib.sha256(sass.encode()).hexdigest(),
                                      "sass_lines": sass.count("\n")}
            print(f"{name + '/' + kernel:32s} ptx {out[name + '/' + kernel]['ptx'][:16]}  "
                  f"sass {out[name + '/' + kernel]['sass'][:16]}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the fingerprints here")
    ap.add_argument("--compare", default=None, help="a JSON of an earlier run: exit 1 where a kernel differs")
    args = ap.parse_args(argv)
    out = fingerprints()
    return write_and_compare(out, args.json, args.compare, "prep PTX and SASS identical for every kernel",
                             "prep differs")


if __name__ == "__main__":
    sys.exit(main())
