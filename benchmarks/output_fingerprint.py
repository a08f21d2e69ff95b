"""Output fingerprints of the FP8 attention and of a swapped block: sha256 of each output's bytes on fixed-seed
random inputs, so two checkouts can be compared call by call (bit identity across a refactor).

    python benchmarks/output_fingerprint.py --device cuda --json new.json [--compare old.json] [--blocks h3,flux.1-dev]

Cases: the op at the h3 / flux / ltx attention shapes (what ``benchmarks/attention.py`` calls), a key-padding mask,
the BHSD layout with the LSE, a forced fp8-sm120 on Hopper; then one block per preset with ``use_backend(block,
"fp8")`` (the public entry the compare's swap shares). Each case is run twice with the same inputs and must repeat
its own bits too.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import sys

import torch

from fingerprint_io import write_and_compare  # benchmarks/ (the script's own folder)

SHAPES = {"h3": (1, 30272, 56, 128), "flux": (1, 4608, 24, 128), "ltx": (1, 7392, 32, 64), "small": (2, 1000, 4, 128)}


def digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def qkv(shape, device, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype) for _ in range(3)]


def attention_call(**kw):
    """The interface's fp8_attention with ``kernel`` as the old (keyword) or new (options) API takes it."""
    from ditprof.kernels import interface

    kernel = kw.pop("kernel", None)
    params = inspect.signature(interface.fp8_attention).parameters
    if kernel is not None:
        if "options" in params:
            from ditprof.kernels.fp8_config import Fp8Options

            kw["options"] = Fp8Options(kernel=kernel)
        else:
            kw["kernel"] = kernel
    return lambda q, k, v: interface.fp8_attention(q, k, v, **kw)


def cases(device):
    from ditprof.kernels.op import fp8_attention as op

    sizes = ("h3", "flux", "ltx") if device == "cuda" else ("small",)
    for name in sizes:
        yield f"op-{name}", SHAPES[name], (lambda q, k, v: op(q, k, v)), None
    B, S, H, D = SHAPES["small"] if device != "cuda" else SHAPES["flux"]
    mask = torch.ones((B, S), dtype=torch.bool)
    mask[:, S * 3 // 4:] = False
    mask[0, ::7] = False
    yield "op-key-mask", (B, S, H, D), (lambda q, k, v: op(q, k, v, key_mask=mask.to(q.device))), None
    if device == "cuda":
        bhsd = attention_call(layout="BHSD", return_lse=True)
        yield "bhsd-lse", (B, H, S, D), bhsd, None
        yield "sm120-on-hopper", SHAPES["small"], attention_call(kernel="fp8-sm120"), None


def block_case(preset: str, device: str):
    from ditprof.diffusers import use_backend
    from ditprof.model_blocks import load_block, make_inputs

    loaded = load_block(preset, device=device, progress=False)
    inputs = make_inputs(loaded, seed=0, device=device)
    with torch.no_grad(), use_backend(loaded.module, "fp8"):
        outs = [inputs.run(loaded.module) for _ in range(2)]
    if device == "cuda":
        from ditprof.kernels import interface

        (getattr(interface, "finish_finite_checks", None) or interface.deferred_finite_checks().__enter__)()
        torch.cuda.synchronize()
    return outs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", required=True)
    ap.add_argument("--compare", default=None)
    ap.add_argument("--blocks", default="", help="comma-separated presets run as one swapped block each")
    args = ap.parse_args(argv)
    out = {}
    for i, (name, shape, fn, _) in enumerate(cases(args.device)):
        q, k, v = qkv(shape, args.device, seed=100 + i)
        with torch.no_grad():
            a, b = fn(q, k, v), fn(q, k, v)
        if args.device == "cuda":
            torch.cuda.synchronize()
        a, b = (x if isinstance(x, tuple) else (x,) for x in (a, b))
        out[name] = {"sha256": digest(*a), "repeat_same": digest(*a) == digest(*b),
                     "finite": bool(all(torch.isfinite(t).all() for t in a))}
        print(f"{name:22s} {out[name]['sha256'][:16]} repeat_same={out[name]['repeat_same']}", flush=True)
    for preset in filter(None, args.blocks.split(",")):
        outs = block_case(preset, args.device)
        out[f"block-{preset}"] = {"sha256": digest(outs[0]), "repeat_same": digest(outs[0]) == digest(outs[1]),
                                  "finite": bool(torch.isfinite(outs[0]).all())}
        print(f"block-{preset:16s} {out[f'block-{preset}']['sha256'][:16]}", flush=True)
    return write_and_compare(out, args.json, args.compare, "outputs identical in every case", "outputs differ",
                             field=lambda entry: entry.get("sha256"), both_sides=False)


if __name__ == "__main__":
    sys.exit(main())
