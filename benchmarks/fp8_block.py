"""The whole-block FP8 targets: SDPA bf16 vs FP8 attention + FP8 linears (torchao), and with the fused attention
prologue (``--prologue``: norm + RoPE in the FP8 prep), eager and compiled, h3 and flux.1-dev, each case one ``ditprof compare`` in this one process (baseline and swap measured back to back, ratios
from the same run). Prints a table last; writes the JSON (environment, every report's figures) to --json.

    python benchmarks/fp8_block.py [--cases h3-eager,flux-compiled,...] [--out DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import environment, fmt, print_table, results_path, write_json

# name: (compare arguments, which time the target reads, target ratio or None)
CASES = {
    "h3-eager": (["--preset", "h3", "--linears", "rowwise"], "block_ms", 1.45),
    "h3-eager-tensorwise": (["--preset", "h3", "--linears", "tensorwise"], "block_ms", 1.45),
    "h3-eager-torchao-unfused": (["--preset", "h3", "--linears", "rowwise", "--linears-eager"], "block_ms", None),
    "h3-compiled": (["--preset", "h3", "--linears", "rowwise", "--compile"], "block_ms", 1.5),
    "flux-graph": (["--preset", "flux.1-dev", "--linears", "rowwise"], "graph_block_ms", 1.15),
    "flux-compiled-graph": (["--preset", "flux.1-dev", "--linears", "rowwise", "--compile"], "graph_block_ms", 1.15),
    # the fused prologue: alone and with FP8 linears (flux: graph replay and in turns; h3: eager)
    "flux-prologue-graph": (["--preset", "flux.1-dev", "--prologue"], "graph_block_ms", 1.1),
    "flux-prologue-linears-graph": (["--preset", "flux.1-dev", "--prologue", "--linears", "rowwise"],
                                    "graph_block_ms", 1.25),
    "h3-prologue": (["--preset", "h3", "--prologue"], "block_ms", None),
    "h3-prologue-linears": (["--preset", "h3", "--prologue", "--linears", "rowwise"], "block_ms", 1.5),
}


def _ratio(base: dict, sw: dict, key: str) -> float | None:
    b, s = base.get(key), sw.get(key)
    return b["median"] / s["median"] if b and s else None


def row_of(name: str, rep: dict, key: str, target: float | None) -> dict:
    base, sw, acc = rep["baseline"], rep["swapped"], rep["accuracy"] or {}
    inter = rep.get("interleaved") or {}
    ratio = _ratio(base, sw, key)
    return {"case": name, "execution": rep["settings"]["execution"], "configuration": sw.get("configuration"),
            "baseline_ms": base["block_ms"]["median"], "swapped_ms": sw["block_ms"]["median"],
            "baseline_graph_ms": (base.get("graph_block_ms") or {}).get("median"),
            "swapped_graph_ms": (sw.get("graph_block_ms") or {}).get("median"),
            "ratio_eager": _ratio(base, sw, "block_ms"), "ratio_graph": _ratio(base, sw, "graph_block_ms"),
            "ratio_in_turns": inter.get("ratio"), "target_on": key, "target": target,
            "met": None if target is None or ratio is None else ratio >= target,
            "rel_rms": acc.get("block_output_rel_rms"), "cosine": acc.get("block_output_cosine"),
            "split_ms": {"baseline": base["split_ms"], "swapped": sw["split_ms"]}, "linears": sw.get("linears"),
            "prologue": sw.get("prologue")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--out", default=None, help="folder for the run folders (default: a temporary one)")
    ap.add_argument("--json", default=None, help="results JSON (default: benchmarks/results/fp8_block-<date>.json)")
    args = ap.parse_args()
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"fp8_block: unknown case(s) {', '.join(unknown)} (known: {', '.join(CASES)})", file=sys.stderr)
        return 2
    from ditprof import cli

    root = Path(args.out or tempfile.mkdtemp(prefix="fp8_block-"))
    rows = []
    for name in names:
        argv, key, target = CASES[name]
        out = root / name
        rc = cli.main(["compare", *argv, "--yes", "--out", str(out)])
        if rc != 0:
            rows.append({"case": name, "error": f"ditprof compare exited {rc}"})
            continue
        rows.append(row_of(name, json.loads((out / "report.json").read_text()), key, target))
    path = write_json({"environment": environment(), "cases": rows}, Path(args.json) if args.json
                      else results_path("fp8_block"))

    print_table("FP8 attention + FP8 linears vs SDPA bf16 (one block; ratios from one compare each)",
                ["case", "execution", "base ms", "swap ms", "eager x", "graph x", "in turns x", "target", "met",
                 "rel-RMS"],
                [[r["case"], r.get("execution", r.get("error")), fmt(r.get("baseline_ms")), fmt(r.get("swapped_ms")),
                  fmt(r.get("ratio_eager")), fmt(r.get("ratio_graph")), fmt(r.get("ratio_in_turns")),
                  fmt(r.get("target")) + (f" ({r['target_on']})" if r.get("target") else ""), fmt(r.get("met")),
                  fmt(r.get("rel_rms"))] for r in rows])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
