"""Issue 20 lever 4 (V mean-centering), asked of the accumulator: with V - mean(V) quantized instead of V (exact:
O = softmax (V - mu) + mu, the mean added back in the epilogue), can O live in the FP8 MMA's narrow accumulator
across key tiles again -- no fresh accumulator and FP32 add per tile -- at the accuracy of today's two-level
scheme? CPU only: the library emulation's strip loop (``fp8_attention_emulated``) with its accumulator model
(``acc_bits`` mantissa bits kept per MMA output, ``acc_promote``), the strip width set to the kernel's key tile.

Rows (rel-RMS % vs float64, output in the inputs' dtype; INT8 Q/K, the default):
- two-level (today): each tile's P V from a fresh accumulator cut to ``acc_bits``, added to an FP32 O;
- across tiles: O itself in the accumulator (O <- trunc(O alpha + P V)), what the kernels did before the promotion;
- the same two with V centred per (batch, head) channel (mean in float64 over the keys, V - mu in fp32, quantized
  per head as today; mu added to the fp32 output).
Tiles of 32 keys model fp8-sm120 (mma.sync; Ada / consumer Blackwell keep ~13 mantissa bits, "FP22"), 160 keys
fp8-sm90 (wgmma; Hopper's FP8 accumulation also keeps a short mantissa: modelled with the same 13 bits).

    python benchmarks/experimental/v_center_acc_study.py --json /tmp/v_center.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ditprof.kernels import fp8_emulation as E  # noqa: E402
from ditprof.kernels.accuracy import compare, make_inputs  # noqa: E402
from ditprof.kernels.reference import attention_reference  # noqa: E402

# (kind, (B, H, Sq, D), Sk): the accuracy kinds at 2048 keys, and biased V over 30720 keys (the long case of
# docs/RESULTS.md, where a large |O| loses the most bits in a narrow accumulator)
CASES = [("gaussian", (1, 4, 256, 128), 2048), ("v_bias", (1, 4, 256, 128), 2048), ("peaky", (1, 4, 256, 128), 2048),
         ("outlier", (1, 4, 256, 128), 2048), ("v_bias", (1, 2, 64, 128), 30720)]
ROWS = [("two-level (today)", False, True), ("across tiles", False, False),
        ("V centred, two-level", True, True), ("V centred, across tiles", True, False)]


def centred(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(V - mu in fp32, mu (B, 1, H, D) fp32): mu the float64 mean over the keys per (batch, head) channel."""
    mu = v.double().mean(dim=1, keepdim=True).float()
    return v.float() - mu, mu


def run(q, k, v, center: bool, promote: bool, acc_bits: int, strip: int) -> torch.Tensor:
    saved = E.STRIP
    E.STRIP = strip
    try:
        if center:
            vc, mu = centred(v)
            o = E.fp8_attention_emulated(q.float(), k.float(), vc, acc_bits=acc_bits, acc_promote=promote,
                                         qk_format="int8")
            return (o + mu).to(q.dtype)
        return E.fp8_attention_emulated(q, k, v, acc_bits=acc_bits, acc_promote=promote, qk_format="int8")
    finally:
        E.STRIP = saved


def study(acc_bits: int, strips: list[int], seeds: list[int], log=print) -> list[dict]:
    out = []
    for kind, (B, H, Sq, D), Sk in CASES:
        for seed in seeds:
            q, k, v = make_inputs(kind, (B, H, Sq, D), kv_len=Sk, seed=seed)
            ref = attention_reference(q, k, v)
            for strip in strips:
                for name, center, promote in ROWS:
                    err = compare(run(q, k, v, center, promote, acc_bits, strip), ref)["rel_rms"]
                    out.append({"kind": kind, "Sk": Sk, "seed": seed, "tile": strip, "row": name,
                                "rel_rms_pct": 100 * err})
                    log(f"{kind:9s} Sk {Sk:6d} seed {seed} tile {strip:3d}  {name:26s} {100 * err:7.3f} %")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acc-bits", type=int, default=13)
    ap.add_argument("--tiles", type=int, nargs="+", default=[32, 160])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = study(args.acc_bits, args.tiles, args.seeds)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": res, "torch": torch.__version__},
                                              indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
