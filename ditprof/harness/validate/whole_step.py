"""The whole denoising step: N blocks + the rest of the model, measured once from the model's own modules.

"The rest" is everything a diffusers transformer's ``forward`` does outside its block stacks: patch embedding,
timestep / text (/ guidance / pooled) embedders, RoPE, the token refiner (HunyuanVideo), the output norm and
projection, unpatchify. It is measured by building the model's own class from its config with every block
stack emptied (``num_layers = 0`` ...) and calling its real ``forward`` on the latent the blocks' token count
comes from. Weights: synthetic for presets (the same seeded rule as the blocks; on CPU bit-identical to a
whole-model synthetic checkpoint), the checkpoint's own tensors otherwise.

Per step = n_blocks x block time + rest; per video = per step x steps x (2 with classifier-free guidance,
one conditional and one unconditional pass).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from ditprof.errors import DitprofError
from ditprof.harness.run.session import time_block


def rest_config(family, config: dict) -> dict:
    """The model's config with every block stack emptied."""
    cfg = dict(config)
    for k in family.kinds:
        cfg[k.count_key] = 0
    return cfg


def _rest_tensors(src, model: torch.nn.Module, device: torch.device, dtype: torch.dtype, seed: int) -> dict:
    names = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    if src.preset is not None:
        from ditprof.model_blocks.synthetic import synth_tensors

        return synth_tensors(src.family, names, seed, dtype, device)
    from ditprof.model_blocks.loading import read_tensors

    return read_tensors(src.layout, src.family, names, device=device, dtype=dtype,
                        fetch_shards=src.hub.fetch_shards if src.hub is not None else None,
                        owner=f"checkpoint {src.name}", what="non-block tensor(s) of the model")


def build_rest_model(src, *, device: torch.device, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """The model's own class with no blocks, its weights set (synthetic or from the checkpoint)."""
    device = torch.device(device)
    cfg = rest_config(src.family, src.config)
    cls = src.family.model_class
    with torch.device(device):
        model = cls.from_config(cfg)  # non-persistent buffers (RoPE tables) computed by the model itself
    state = _rest_tensors(src, model, device, dtype, seed)
    model.load_state_dict(state, strict=True, assign=True)
    del state
    model.eval().requires_grad_(False)
    want = torch.device(device)
    if want.type == "cuda" and want.index is None:  # "cuda" means the current device; tensors say cuda:N
        want = torch.device("cuda", torch.cuda.current_device())
    for k, t in model.state_dict().items():  # anything not from the state dict (buffers): compute dtype rule
        if t.is_floating_point() and t.device != want:
            raise DitprofError(f"rest model tensor {k} is on {t.device}, not {device}")
    return model


def grid_and_text(src, tokens=None, height=None, width=None, frames=None):
    """The latent grid and prompt length the blocks see (the rule of ``model_blocks.make_inputs``)."""
    from ditprof.model_blocks.inputs import resolve_grid

    return resolve_grid(src.family, src.config, src.preset, tokens, height, width, frames)


def rest_inputs(src, grid, text_tokens: int, *, device, dtype, seed: int = 0, batch: int = 1) -> dict:
    """Keyword arguments of the model's ``forward`` for a latent of ``grid`` tokens, as its pipeline passes them
    (declared by the family: ``BlockFamily.model_inputs``)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return src.family.model_inputs(src.config, grid, text_tokens, batch, gen, torch.device(device), dtype)


def _parts(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_children() if not (isinstance(m, torch.nn.ModuleList) and len(m) == 0)]


def modules_run(model: torch.nn.Module, call) -> tuple[list[str], list[str]]:
    """(modules whose forward ran, modules holding parameters that did not run) in one call."""
    ran: set[str] = set()
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: ran.add(n)) for n, m in model.named_modules() if n]
    try:
        call()
    finally:
        for h in handles:
            h.remove()
    not_run = [n for n, m in model.named_modules()
               if n and any(True for _ in m.parameters(recurse=False)) and not any(n == r or n.startswith(r + ".")
                                                                                  for r in ran)]
    return sorted(ran), not_run


def time_parts(model: torch.nn.Module, call, device: torch.device, iters: int) -> dict[str, float]:
    """Median ms per top-level part (forward pre/post hooks with CUDA events or the host clock)."""
    from ditprof.harness.run.session import Clock

    clock = Clock(device)
    marks: dict[str, list] = {}
    handles = []
    for n, m in _parts(model):
        handles.append(m.register_forward_pre_hook(lambda mod, i, n=n: marks.setdefault(n, []).append(["s", clock.mark()])))
        handles.append(m.register_forward_hook(lambda mod, i, o, n=n: marks[n].append(["e", clock.mark()])))
    per: dict[str, list[float]] = {}
    try:
        for _ in range(iters):
            marks.clear()
            call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            for n, seq in marks.items():
                total, start = 0.0, None
                for tag, mk in seq:
                    if tag == "s":
                        start = mk
                    elif start is not None:
                        total += clock.elapsed(start, mk)
                        start = None
                per.setdefault(n, []).append(total)
    finally:
        for h in handles:
            h.remove()
    return {n: statistics.median(v) for n, v in per.items()}


def measure_rest(src, *, device, dtype=torch.bfloat16, seed: int = 0, warmup: int = 1, iters: int = 5,
                 console=None, tokens=None, height=None, width=None, frames=None) -> dict:
    """Time the model's non-block parts once (whole forward with no blocks), plus a per-part breakdown."""
    from ditprof.progress import make_progress

    device = torch.device(device)
    grid, text = grid_and_text(src, tokens, height, width, frames)
    with torch.inference_mode():
        model = build_rest_model(src, device=device, dtype=dtype, seed=seed)
        kwargs = rest_inputs(src, grid, text, device=device, dtype=dtype, seed=seed)
        params = sum(p.numel() for p in model.parameters())
        nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())

        def call():
            return model(**kwargs)[0]

        ran, not_run = modules_run(model, call)
        ctx = make_progress(console) if console is not None else None
        if ctx is not None:
            ctx.__enter__()
            task = ctx.add_task("rest of the model (non-block modules)", total=3)
        try:
            for _ in range(max(warmup, 1)):
                out = call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ctx and ctx.advance(task)
            samples, source = time_block(call, device, iters)
            ctx and ctx.advance(task)
            parts = time_parts(model, call, device, iters)
            ctx and ctx.advance(task)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        out_shape = list(out.shape)
        del model, kwargs, out
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "rest_ms": {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
                    "samples": samples},
        "timing_source": source,
        "parts_ms": parts,
        "parts_note": "per top-level module (forward hooks); the rest of the forward (reshapes, unpatchify) "
                      "is the difference to rest_ms",
        "modules_ran": ran,
        "modules_not_run": not_run,
        "params": params,
        "bytes": nbytes,
        "model_class": src.family.model_class.__name__,
        "config_overrides": {k.count_key: 0 for k in src.family.kinds},
        "grid": str(grid),
        "text_tokens": text,
        "output_shape": out_shape,
    }


def step_estimate(block_ms: float, n_blocks: int, rest_ms: float, *, steps: int | None = None,
                  cfg: bool = False) -> dict:
    """Per step = n_blocks x block_ms + rest_ms; per video = per step x steps x (2 with CFG)."""
    if n_blocks < 1:
        raise DitprofError(f"n_blocks must be >= 1 (got {n_blocks})")
    if steps is not None and steps < 1:
        raise DitprofError(f"--steps must be >= 1 (got {steps})")
    block_part = block_ms * n_blocks
    per_step = block_part + rest_ms
    passes = steps * (2 if cfg else 1) if steps else None
    out: dict[str, Any] = {
        "block_ms": block_ms, "n_blocks": n_blocks, "block_part_ms": block_part, "rest_ms": rest_ms,
        "per_step_ms": per_step, "block_share": block_part / per_step if per_step > 0 else float("nan"),
        "steps": steps, "cfg": bool(cfg), "passes": passes,
        "per_video_ms": None, "per_video_block_ms": None, "per_video_rest_ms": None,
    }
    if passes:
        out.update(per_video_ms=per_step * passes, per_video_block_ms=block_part * passes,
                   per_video_rest_ms=rest_ms * passes)
    return out
