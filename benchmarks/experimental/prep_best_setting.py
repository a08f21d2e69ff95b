"""The fastest setting of a ``prep_tiling_interleaved.py`` JSON, as ``DITPROF_PREP_KNOBS`` text: the setting with the
lowest geometric mean of (median / default's median) over the shapes, printed only when it beats the default by at
least ``--min-gain`` there and is slower at no shape by more than ``--max-loss``, and every output check passed
(a GPU batch runs the tests with the winner without a round trip).

    python benchmarks/experimental/prep_best_setting.py prep-elem.json --min-gain 0.02
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def best_setting(result: dict, min_gain: float, max_loss: float) -> str:
    settings = result["meta"]["settings"]
    shapes = result["shapes"]
    best, best_mean = "", 1.0 - min_gain
    for name, knobs in settings.items():
        if name == "default" or not knobs:
            continue
        rows = [shapes[s][name] for s in shapes]
        if any(row.get("check") for row in rows):  # a non-empty check is a mismatch against the default
            continue
        ratios = [1.0 + row["vs_default"] for row in rows]
        if max(ratios) > 1.0 + max_loss:
            continue
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        if mean < best_mean:
            best, best_mean = ",".join(f"{k}={v}" for k, v in knobs.items()), mean
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--min-gain", type=float, default=0.02)
    ap.add_argument("--max-loss", type=float, default=0.01)
    args = ap.parse_args()
    path = Path(args.json)
    if not path.is_file():
        print(f"error: {path}: no such file", file=sys.stderr)
        return 2
    print(best_setting(json.loads(path.read_text()), args.min_gain, args.max_loss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
