"""Fingerprints of the CPU FP8 emulation (``fp8_emulation.fp8_attention_emulated``): fixed seeds, a few shapes and
input kinds, both Q/K formats, key masks, LSE; one sha256 per output over its bytes, so two checkouts can be
compared case by case.

    python benchmarks/emulation_fingerprint.py --json before.json
    python benchmarks/emulation_fingerprint.py --json after.json --compare before.json   # exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import torch

from fingerprint_io import write_and_compare  # benchmarks/ (the script's own folder)

# (B, Sq, Sk, H, D)
SHAPES = [(1, 77, 130, 2, 64), (2, 200, 150, 3, 128)]
# name -> keyword arguments of fp8_attention_emulated besides the inputs
VARIANTS = {
    "int8": {"qk_format": "int8"},
    "e4m3": {"qk_format": "e4m3"},
    "int8-lse": {"qk_format": "int8", "return_lse": True},
    "e4m3-lse": {"qk_format": "e4m3", "return_lse": True},
    "e4m3-nosmooth-lse": {"qk_format": "e4m3", "smooth_k": False, "return_lse": True},
    "int8-nosmooth": {"qk_format": "int8", "smooth_k": False},
    "e4m3-rotate-lse": {"qk_format": "e4m3", "rotate_qk": True, "return_lse": True},
    "e4m3-acc13": {"qk_format": "e4m3", "acc_bits": 13},
    "int8-acc13-nopromote": {"qk_format": "int8", "acc_bits": 13, "acc_promote": False},
    "int8-scale": {"qk_format": "int8", "scale": 0.05},
}
KINDS = ("gaussian", "k_bias")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_inputs(shape, kind: str, dtype, seed: int):
    B, Sq, Sk, H, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((B, Sq, H, D), generator=g)
    k = torch.randn((B, Sk, H, D), generator=g)
    v = torch.randn((B, Sk, H, D), generator=g)
    if kind == "k_bias":
        k = k + 10.0 * torch.randn((1, 1, H, D), generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def key_mask_for(shape, seed: int):
    B, _, Sk, _, _ = shape
    g = torch.Generator().manual_seed(seed + 1000)
    mask = torch.rand((B, Sk), generator=g) < 0.7
    mask[:, 0] = True  # every item keeps a key
    return mask


def digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() + str((t.dtype, tuple(t.shape))).encode()).hexdigest()


def cases():
    seed = 0
    for shape in SHAPES:
        for kind in KINDS:
            for dname, dtype in DTYPES.items():
                for vname, kwargs in VARIANTS.items():
                    for masked in (False, True):
                        seed += 1
                        name = f"{'x'.join(map(str, shape))}-{kind}-{dname}-{vname}" + ("-keymask" if masked else "")
                        yield name, shape, kind, dtype, seed, kwargs, masked


def fingerprints() -> dict:
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated

    out = {}
    for name, shape, kind, dtype, seed, kwargs, masked in cases():
        q, k, v = make_inputs(shape, kind, dtype, seed)
        mask = key_mask_for(shape, seed) if masked else None
        res = fp8_attention_emulated(q, k, v, key_mask=mask, **kwargs)
        outs = res if isinstance(res, tuple) else (res,)
        out[name] = [digest(t) for t in outs]
        print(f"{name:60s} " + " ".join(h[:12] for h in out[name]), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the fingerprints here")
    ap.add_argument("--compare", default=None, help="a JSON of an earlier run: exit 1 where an output differs")
    args = ap.parse_args(argv)
    out = fingerprints()
    return write_and_compare(out, args.json, args.compare, f"emulation identical for all {len(out)} cases",
                             "emulation differs")


if __name__ == "__main__":
    sys.exit(main())
