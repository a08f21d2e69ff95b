"""Loader benchmark: one block from a sharded checkpoint vs reading the same bytes raw from the same files.

    python benchmarks/load.py                       # h3-mini and h3 (h3: a 1.53 GiB synthetic checkpoint is
                                                    # written to the cache on first use, ~45 s)
    python benchmarks/load.py --presets h3-mini --repeats 5

Per case a fresh subprocess (so peak RSS is the case's own): ``load`` = ``ditprof.model_blocks.load_block``
(index + headers, meta build, reads, ``load_state_dict``) to CPU in bf16; ``raw`` = ``readinto`` of exactly the
block's tensor byte ranges from the same shard files into fresh buffers, all held at the end like a loaded block.
``load`` first builds the block once on the meta device (diffusers' lazy imports and other one-time Python
costs happen before the clock); ``load-first`` is the same without that, i.e. the first load in a fresh process.
All run on a warm page cache (the files are read once first), alternating, ``--repeats`` times; medians.
Goals: load time <= 1.2 x raw; host peak RSS growth <= 1.1 x block bytes. Peak RSS growth is VmHWM after the
case minus VmRSS before it, with the high-water mark reset first (``/proc/self/clear_refs`` 5).
Results: ``benchmarks/results/load-<date>.json`` (machine, date, versions) and a rich table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, print_table, results_path, write_json  # noqa: E402

GOAL_TIME = 1.2
GOAL_RSS = 1.1


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _block_ranges(preset_name: str):
    """(folder, [(shard, name, begin, end)], block bytes) of block 0 of the preset's cached checkpoint."""
    from ditprof.model_blocks import get_family, get_preset
    from ditprof.model_blocks.checkpoint import read_layout, shards_for_prefix
    from ditprof.model_blocks.synthetic import ensure_checkpoint

    preset = get_preset(preset_name)
    folder = ensure_checkpoint(preset, blocks=[0], kind=preset.kind, progress=True)
    layout = read_layout(folder)
    prefix = get_family(preset.family).prefix(preset.kind, 0)
    ranges = []
    for shard, names in shards_for_prefix(layout.weight_map, prefix).items():
        with open(folder / shard, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        base = 8 + size
        for n in names:
            b, e = header[n]["data_offsets"]
            ranges.append((shard, n, base + b, base + e))
    return folder, sorted(ranges, key=lambda r: (r[0], r[2])), sum(e - b for *_, b, e in ranges)


def child(case: str, preset_name: str) -> dict:
    import torch

    from ditprof.model_blocks import load_block

    folder, ranges, nbytes = _block_ranges(preset_name)
    if case == "load":  # one-time Python costs (diffusers' lazy imports, first meta build) before the clock
        from ditprof.model_blocks import get_family, get_preset
        from ditprof.model_blocks.presets import block_on_meta

        preset = get_preset(preset_name)
        block_on_meta(get_family(preset.family), preset.config, preset.kind)
    before = _status()["VmRSS"]
    reset = True
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        reset = False
    t0 = time.perf_counter()
    if case == "raw":
        held = []
        files = {}
        for shard, _name, b, e in ranges:
            f = files.get(shard) or files.setdefault(shard, open(folder / shard, "rb"))
            buf = torch.empty(e - b, dtype=torch.uint8)
            f.seek(b)
            if f.readinto(buf.numpy()) != e - b:
                raise RuntimeError("short read")
            held.append(buf)
        for f in files.values():
            f.close()
        loaded_bytes = sum(t.numel() for t in held)
    else:
        lb = load_block(preset_name, 0, device="cpu", dtype=torch.bfloat16, progress=False)
        loaded_bytes = lb.bytes
    seconds = time.perf_counter() - t0
    st = _status()
    return {"case": case, "seconds": seconds, "bytes": loaded_bytes, "block_range_bytes": nbytes,
            "rss_before": before, "rss_peak": st["VmHWM"], "peak_growth": st["VmHWM"] - before,
            "hwm_reset": reset}


def run_case(case: str, preset: str) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", case, "--preset", preset], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{case} {preset} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="h3-mini,h3")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--child", choices=["raw", "load", "load-first"], help=argparse.SUPPRESS)
    p.add_argument("--preset", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.preset)))
        return 0

    results = []
    for preset in [x.strip() for x in args.presets.split(",") if x.strip()]:
        folder, ranges, nbytes = _block_ranges(preset)  # writes the checkpoint on first use
        for shard in sorted({r[0] for r in ranges}):  # warm the page cache for both cases alike
            with open(folder / shard, "rb") as f:
                while f.read(1 << 26):
                    pass
        runs = {"raw": [], "load": [], "load-first": []}
        for _ in range(args.repeats):
            for case in runs:
                runs[case].append(run_case(case, preset))
        raw_s = statistics.median(r["seconds"] for r in runs["raw"])
        load_s = statistics.median(r["seconds"] for r in runs["load"])
        first_s = statistics.median(r["seconds"] for r in runs["load-first"])
        load_rss = max(r["peak_growth"] for r in runs["load"])
        raw_rss = max(r["peak_growth"] for r in runs["raw"])
        block_bytes = runs["load"][0]["bytes"]
        results.append({
            "preset": preset, "checkpoint": str(folder), "tensors": len(ranges),
            "shards": len({r[0] for r in ranges}), "block_bytes": block_bytes, "block_range_bytes": nbytes,
            "raw_s": raw_s, "load_s": load_s, "time_ratio": load_s / raw_s,
            "load_first_s": first_s, "first_time_ratio": first_s / raw_s,
            "raw_gib_s": nbytes / raw_s / 2**30, "load_gib_s": block_bytes / load_s / 2**30,
            "load_peak_rss_growth": load_rss, "raw_peak_rss_growth": raw_rss,
            "rss_ratio": load_rss / block_bytes, "raw_rss_ratio": raw_rss / nbytes,
            "goal_time_ratio": GOAL_TIME, "goal_rss_ratio": GOAL_RSS,
            "time_ok": load_s / raw_s <= GOAL_TIME, "rss_ok": load_rss / block_bytes <= GOAL_RSS,
            "hwm_reset": all(r["hwm_reset"] for v in runs.values() for r in v),
            "runs": runs,
        })
    cols = ["preset", "block", "raw s", "load s", "load/raw (<=1.2)", "1st load s", "1st/raw", "peak RSS growth",
            "RSS/block (<=1.1)", "raw RSS/bytes"]
    rows = [[r["preset"], f"{r['block_bytes'] / 2**30:.3f} GiB", r["raw_s"], r["load_s"], r["time_ratio"],
             r["load_first_s"], r["first_time_ratio"],
             f"{r['load_peak_rss_growth'] / 2**30:.3f} GiB", r["rss_ratio"], r["raw_rss_ratio"]] for r in results]
    print_table("one-block load vs raw read of the same bytes (warm page cache, CPU, medians)", cols, rows)
    payload = {"benchmark": "load", "environment": environment(), "repeats": args.repeats,
               "method": "fresh subprocess per case; warm page cache; raw = readinto of the block's byte ranges; "
                         "load = ditprof.model_blocks.load_block(device=cpu, bf16) after a meta build of the block "
                         "(one-time imports off the clock); load-first = the same in a cold process; peak RSS growth = VmHWM "
                         "(reset via clear_refs) - VmRSS before", "results": results}
    path = Path(args.json_path) if args.json_path else results_path("load")
    write_json(payload, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
