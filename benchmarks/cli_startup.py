"""Wall time of light CLI commands (a fresh interpreter each, median of N): `--help`, `--version`, `presets`.

    python benchmarks/cli_startup.py [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["--version"], ["presets"], ["profile", "--help"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for argv in COMMANDS:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "ditprof", *argv], capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        rows.append({"command": "ditprof " + " ".join(argv), "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times)})
    print(f"{'command':<24} {'median s':>9} {'min':>7} {'max':>7}")
    for r in rows:
        print(f"{r['command']:<24} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f}")
    if args.json:
        out = {"benchmark": "cli_startup", "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
               "machine": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
               "runs": args.runs, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
