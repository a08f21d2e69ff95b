"""16 GB feasibility: for each preset at its default size, does one block's load + forward fit 16 GiB?

    python benchmarks/feasibility.py                 # CPU: an estimate; CUDA: measured under --gpu-memory 16GiB
    python benchmarks/feasibility.py --budget 24GiB --presets h3,flux.1-dev

On CUDA each (preset, stack) is loaded and run once inside ``ditprof.harness.run.memory.memory_budget`` (the
process capped at the budget like a smaller card); peak = ``torch.cuda.max_memory_allocated`` of load and of the
forward (``model_blocks.measure_load_and_forward``); an OOM means "does not fit". On a machine without a GPU the
peak is computed: block bytes (bf16, fp32-kept tensors at 4 B) + inputs + the activation peak traced on the
meta device (``harness.run.activation.estimate_forward_bytes``: every live tensor, attention as a flash-style kernel),
labelled as an estimate. Results: ``benchmarks/results/feasibility-<device>-<date>.json`` and a rich table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, print_table, results_path, write_json  # noqa: E402


def rows_for(presets, budget_text: str, device: str) -> list[dict]:
    import torch

    from ditprof.errors import DitprofError
    from ditprof.harness.run.activation import estimate_forward_bytes
    from ditprof.harness.run.memory import memory_budget, parse_size
    from ditprof.model_blocks import get_family, measure_load_and_forward
    from ditprof.model_blocks.presets import block_size

    budget = parse_size(budget_text)
    out = []
    for preset in presets:
        fam = get_family(preset.family)
        for kind in fam.kinds:
            params, nbytes = block_size(fam, preset.config, kind.name)
            est = estimate_forward_bytes(fam, preset.config, kind.name, preset=preset)
            est_peak = nbytes + est["input_module_bytes"] + est["input_bytes"] + est["activation_bytes"]
            row = {"preset": preset.name, "family": fam.name, "kind": kind.name,
                   "default_kind": kind.name == preset.kind, "tokens": est["tokens"],
                   "text_tokens": est["text_tokens"], "block_params": params, "block_bytes": nbytes,
                   "input_bytes": est["input_bytes"], "input_module_bytes": est["input_module_bytes"],
                   "activation_estimate_bytes": est["activation_bytes"],
                   "estimated_peak_bytes": est_peak, "budget_bytes": budget}
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                try:
                    with memory_budget(budget_text, torch.device("cuda")):
                        rep, loaded, inputs = measure_load_and_forward(preset.name, 0, kind=kind.name,
                                                                       device="cuda")
                        del loaded, inputs
                    row.update(source="measured", fits=True, peak_load_bytes=rep.peak_load_bytes,
                               peak_bytes=rep.peak_forward_bytes, note="")
                except DitprofError as exc:
                    row.update(source="measured", fits=False, peak_bytes=int(torch.cuda.max_memory_allocated()),
                               note=str(exc))
                torch.cuda.empty_cache()
            else:
                row.update(source="estimate", fits=est_peak <= budget, peak_bytes=est_peak,
                           note="CPU estimate: block bytes + input modules + inputs + meta-traced activations")
            out.append(row)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", default="16GiB")
    p.add_argument("--presets", default=None, help="comma list (default: every non-tiny preset)")
    p.add_argument("--device", default=None, help="cpu (estimate) or cuda (measured); default cuda if available")
    p.add_argument("--json", dest="json_path", default=None)
    args = p.parse_args()
    import torch

    from ditprof.model_blocks import get_preset, list_presets

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    presets = ([get_preset(x.strip()) for x in args.presets.split(",")] if args.presets
               else [pr for pr in list_presets() if not pr.tiny])
    rows = rows_for(presets, args.budget, device)
    gib = lambda n: f"{n / 2**30:.2f}"  # noqa: E731
    label = "measured under the budget" if device == "cuda" else "ESTIMATE (no GPU here)"
    print_table(
        f"one block load + forward vs a {args.budget} budget, default sizes ({device}: {label})",
        ["preset", "stack", "tokens", "block GiB", "inputs GiB", "activations GiB", "peak GiB", "fits"],
        [[r["preset"], r["kind"] + ("" if r["default_kind"] else " (alt)"), r["tokens"], gib(r["block_bytes"]),
          gib(r["input_bytes"]), gib(r["activation_estimate_bytes"]), gib(r["peak_bytes"]),
          "yes" if r["fits"] else "NO"] for r in rows],
    )
    payload = {"benchmark": "feasibility", "device": device, "budget": args.budget, "source": rows[0]["source"]
               if rows else None, "environment": environment(), "results": rows}
    path = Path(args.json_path) if args.json_path else results_path(f"feasibility-{device}")
    write_json(payload, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
