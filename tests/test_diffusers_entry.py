"""``ditprof.diffusers``: our backends in a user's own diffusers model (a tiny *full* model, not one block).

CPU: the model run through ``set_attention_backend("ditprof_fp8_emulated")`` and ``attention_backend(...)`` equals
the same model with a plain dispatcher backend that calls the emulation directly (so the registration adds
nothing but the route), and differs from the native SDPA run by FP8 rounding only; a legacy-processor model
(CogVideoX) gets a one-line error from ``set_backend`` and runs through ``use_backend``. GPU (marked ``gpu``):
the same with ``ditprof_fp8`` against direct calls of ``torch.ops.ditprof.fp8_attention``.
"""

from __future__ import annotations

import pytest
import torch

from ditprof.errors import DitprofError

FAMILIES = ["flux-tiny", "wan-tiny", "qwen-image-tiny"]


@pytest.fixture(autouse=True)
def _restore_global_backend():
    """diffusers' ``set_attention_backend`` also sets its global active backend (and ``reset_attention_backend``
    leaves it): put it back after each test so no other test runs on our backend."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    saved = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry._active_backend = saved


# the GPU kernel takes head_dim 64 or 128: the tiny presets (head_dim 16) widened for the GPU test, RoPE axes
# summing to the new head_dim
GPU_HEAD_DIM = {"flux-tiny": {"attention_head_dim": 64, "axes_dims_rope": [16, 24, 24]},
                "wan-tiny": {"attention_head_dim": 64},
                "qwen-image-tiny": {"attention_head_dim": 64, "axes_dims_rope": [16, 24, 24]}}


def _tiny_model(preset_name: str, device="cpu", **config):
    from ditprof.model_blocks import get_preset
    from ditprof.model_blocks.families import get_family
    from ditprof.model_blocks.inputs import resolve_grid

    preset = get_preset(preset_name)
    family = get_family(preset.family)
    cfg = {**preset.config, **config}
    torch.manual_seed(0)
    model = family.model_class.from_config(cfg).to(device=device, dtype=torch.bfloat16).eval()
    grid, text = resolve_grid(family, cfg, preset)
    kwargs = family.model_inputs(cfg, grid, text, 1, torch.Generator().manual_seed(1), torch.device(device),
                                 torch.bfloat16)
    return model, kwargs


def _run(model, kwargs):
    with torch.inference_mode():
        out = model(**{**kwargs, "return_dict": False})[0]
    return out.float()


def _direct_backend(value: str, attention):
    """A plain dispatcher backend (no ditprof wrapper) calling ``attention(q, k, v, scale)`` on (B, S, H, D)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from ditprof.dispatch import _enum_member

    member = _enum_member(value)

    def backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        assert attn_mask is None or bool(attn_mask.all()), "the tiny models' prompts are unpadded"
        return attention(query, key, value, scale)

    _AttentionBackendRegistry.register(member)(backend)
    return member.value


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("preset", FAMILIES)
def test_full_model_through_the_dispatcher_equals_direct_emulation(preset, monkeypatch):
    import ditprof.diffusers as dd
    from diffusers.models.attention_dispatch import attention_backend

    from ditprof.kernels import fp8_emulation

    assert {"ditprof_fp8", "ditprof_fp8_emulated"} <= set(dd.register_diffusers_backends())
    model, kwargs = _tiny_model(preset)
    native = _run(model, kwargs)
    calls = {"n": 0}
    real = fp8_emulation.fp8_attention_emulated

    def counted(*args, **kw):
        calls["n"] += 1
        return real(*args, **kw)

    direct = _direct_backend("ditprof_test_direct_emulation",
                             lambda q, k, v, scale: real(q, k, v, scale=scale))
    model.set_attention_backend(direct)
    want = _run(model, kwargs)
    monkeypatch.setattr(fp8_emulation, "fp8_attention_emulated", counted)
    dd.register_diffusers_backends()  # the registry's function object is what the backend calls
    model.set_attention_backend("ditprof_fp8_emulated")
    got = _run(model, kwargs)
    n_attention = calls["n"]
    model.reset_attention_backend()
    with attention_backend("ditprof_fp8_emulated"):  # the global route: processors left at their default
        got_ctx = _run(model, kwargs)
    assert n_attention > 0 and calls["n"] > n_attention
    assert torch.equal(got, want) and torch.equal(got_ctx, want)
    assert torch.isfinite(got).all()
    assert 0 < _rel(got, native) < 0.1, _rel(got, native)  # FP8 rounding, not another function


def test_legacy_processor_model_gets_a_one_line_error_and_use_backend_works():
    import ditprof.diffusers as dd

    model, kwargs = _tiny_model("cogvideox-tiny")
    assert dd.legacy_attention_modules(model)
    with pytest.raises(DitprofError, match=r"call torch's SDPA directly .* use `with ditprof.diffusers.use_backend"):
        dd.set_backend(model, "fp8-emulated")
    native = _run(model, kwargs)
    with dd.use_backend(model, "fp8-emulated"):
        swapped = _run(model, kwargs)
    again = _run(model, kwargs)
    assert torch.equal(again, native)  # restored on exit
    assert 0 < _rel(swapped, native) < 0.1


def test_set_backend_on_a_dispatcher_model():
    import ditprof.diffusers as dd

    model, kwargs = _tiny_model("flux-tiny")
    dd.set_backend(model, "fp8-emulated")
    procs = [m.processor for _, m in model.named_modules() if getattr(m, "processor", None) is not None]
    assert procs and all(str(getattr(p, "_attention_backend", "")) .endswith("ditprof_fp8_emulated") or
                         getattr(p._attention_backend, "value", None) == "ditprof_fp8_emulated" for p in procs)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", FAMILIES)
def test_full_model_with_ditprof_fp8_on_the_gpu(preset):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import ditprof.diffusers as dd

    model, kwargs = _tiny_model(preset, device="cuda", **GPU_HEAD_DIM[preset])
    from ditprof.kernels.op import fp8_attention  # the op's Python entry: scale None -> 1/sqrt(D)

    direct = _direct_backend("ditprof_test_direct_op", lambda q, k, v, scale: fp8_attention(q, k, v, scale))
    model.set_attention_backend(direct)
    want = _run(model, kwargs)
    dd.set_backend(model, "fp8")
    got = _run(model, kwargs)
    assert torch.isfinite(got).all() and torch.equal(got, want)
