"""SASS fingerprints of the shipped FP8 attention builds, compiled on any machine (no GPU): one sha256 per build
over its nvdisasm text with kernel symbol names blanked, so two checkouts can be compared build by build.

    python benchmarks/sass_fingerprint.py --json before.json [--sass-dir DIR]
    python benchmarks/sass_fingerprint.py --json after.json --compare before.json   # exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tempfile
from pathlib import Path

from fingerprint_io import write_and_compare  # benchmarks/ (the script's own folder)

# (kernel, arch, head_dim, qk_format, grid, key_lens, q_in_kernel): the builds the launch paths can pick
BUILDS = [
    *[("fp8-sm90", "sm_90a", d, f, "plain", False, False) for d in (128, 64) for f in ("int8", "e4m3")],
    *[("fp8-sm90", "sm_90a", d, "int8", "stream-K", False, False) for d in (128, 64)],
    ("fp8-sm90", "sm_90a", 128, "e4m3", "stream-K", False, False),
    ("fp8-sm90", "sm_90a", 128, "int8", "plain", False, True),
    ("fp8-sm90", "sm_90a", 128, "int8", "plain", True, False),
    *[("fp8-sm120", "sm_120a", d, f, "plain", False, False) for d in (128, 64) for f in ("int8", "e4m3")],
    ("fp8-sm120", "sm_120a", 128, "int8", "plain", True, False),
]

_NAMES = re.compile(r"(\.text\.|\.section\s+\S*|\bkernel_\w+|\b_Z\w+|cutlass_\w+)")


def build_name(b) -> str:
    kernel, arch, d, fmt, grid, lens, qrot = b
    return f"{kernel}-{arch}-d{d}-{fmt}-{grid}" + ("-keylens" if lens else "") + ("-qrot" if qrot else "")


def fingerprint(b, sass_dir: Path | None) -> dict:
    from ditprof.kernels.inspect_sass import inspect_kernel

    kernel, arch, d, fmt, grid, lens, qrot = b
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(sass_dir or tmp) / f"{build_name(b)}.sass"
        info = inspect_kernel(kernel, arch, head_dim=d, keep_sass=str(path), key_lens=lens, qk_format=fmt,
                              grid=grid, q_in_kernel=qrot)
        text = _NAMES.sub("NAME", path.read_text())
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "registers": info["registers"],
            "spill_bytes": info["spill_bytes"], "lines": text.count("\n")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the fingerprints here")
    ap.add_argument("--sass-dir", default=None, help="keep each build's SASS text here")
    ap.add_argument("--compare", default=None, help="a JSON of an earlier run: exit 1 where a build differs")
    args = ap.parse_args(argv)
    if args.sass_dir:
        Path(args.sass_dir).mkdir(parents=True, exist_ok=True)
    out = {}
    for b in BUILDS:
        out[build_name(b)] = fingerprint(b, Path(args.sass_dir) if args.sass_dir else None)
        print(f"{build_name(b):45s} {out[build_name(b)]['sha256'][:16]}  regs {out[build_name(b)]['registers']}",
              flush=True)
    return write_and_compare(out, args.json, args.compare, "SASS identical for every build", "SASS differs",
                             field=lambda entry: entry.get("sha256"), both_sides=False)


if __name__ == "__main__":
    sys.exit(main())
