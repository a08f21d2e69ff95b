"""The fused-prologue swap (harness.swaps.prologue, the families' fused processors, the custom op) on the CPU: the
fused block computes what the unfused FP8 block computes, to the rounding steps the fusion removes; undo restores
the processors; bad input and families without a prologue say so in one line."""

import dataclasses
import math

import pytest
import torch

from ditprof import cli
from ditprof.errors import DitprofError
from ditprof.harness.run.compile_backends import for_compile
from ditprof.harness.swaps.attention import AttentionSwap
from ditprof.harness.swaps.prologue import PrologueSwap
from ditprof.kernels import op, registry
from ditprof.kernels.prologue import PrologueSpec, prologue_torch, spec_from_key, spec_key
from ditprof.model_blocks import get_preset, make_inputs
from ditprof.model_blocks.synthetic import synthetic_block

# wan-tiny with a power-of-two head_dim (16; wan-tiny's 12 has no INT8 Q/K format, which the fused prologue needs)
WAN_D16 = dataclasses.replace(get_preset("wan-tiny"), name="wan-tiny-d16",
                              config=dict(get_preset("wan-tiny").config, attention_head_dim=16))
# modules each family keeps unfused (Wan: the cross-attention reads the prompt, another length than q)
UNFUSED = {"wan": {"attn2"}}


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _outputs(loaded, inputs, swaps):
    outs = []
    with torch.no_grad():
        applied = [s.install(loaded.module) for s in swaps]
        try:
            out = inputs.run(loaded.module)
        finally:
            for inst in reversed(applied):
                inst.undo()
    for o in (out if isinstance(out, (tuple, list)) else (out,)):
        outs.append(torch.full_like(o, float("nan")).copy_(o))
    return outs


@pytest.mark.parametrize("preset,kind,tokens", [("h3-mini", "main", 256), ("h3-mini", "refiner", None),
                                                ("flux-tiny", "double", None), ("flux-tiny", "single", None),
                                                ("flux2-tiny", "double", None), ("flux2-tiny", "single", None),
                                                ("qwen-image-tiny", "main", None),
                                                ("hunyuan-video-tiny", "double", None),
                                                ("hunyuan-video-tiny", "single", None),
                                                (WAN_D16, "main", None)],
                         ids=lambda p: getattr(p, "name", p))
def test_fused_block_matches_the_unfused_fp8_block(preset, kind, tokens, monkeypatch):
    calls = []
    real = op.fp8_attention_prologue
    monkeypatch.setattr(op, "fp8_attention_prologue", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.manual_seed(0)
    loaded = synthetic_block(preset, 0, kind=kind)
    inputs = make_inputs(loaded, tokens=tokens) if tokens else make_inputs(loaded)
    fam = loaded.family
    emu, sdpa = registry.get("fp8-emulated"), registry.get("sdpa")
    procs = {n: m.processor for n, m in loaded.module.named_modules() if hasattr(m, "processor")}
    ref = _outputs(loaded, inputs, [AttentionSwap(sdpa, uses_dispatcher=fam.uses_dispatcher)])
    unfused = _outputs(loaded, inputs, [AttentionSwap(emu, uses_dispatcher=fam.uses_dispatcher)])
    swap = PrologueSwap(emu, fam, uses_dispatcher=fam.uses_dispatcher)
    inst = swap.install(loaded.module)
    rec = inst.record()
    inst.undo()
    assert rec["prologue"]["fused_modules"]
    assert set(rec["prologue"]["unfused_modules"]) == UNFUSED.get(fam.name, set())
    assert rec["attention_backend"] == "fp8-emulated+prologue"
    fused = _outputs(loaded, inputs, [swap])
    # undo put every processor back
    assert {n: m.processor for n, m in loaded.module.named_modules() if hasattr(m, "processor")} == procs
    for f, u, r in zip(fused, unfused, ref):
        assert torch.isfinite(f).all()
        assert _rel(f, u) < 1.5e-2, (preset, kind, _rel(f, u))
        # as close to the bf16 SDPA block as the unfused FP8 block is (the fusion rounds less, not more)
        assert _rel(f, r) < 1.5 * _rel(u, r) + 2e-3, (_rel(f, r), _rel(u, r))
    assert len(calls) == len(rec["prologue"]["fused_modules"])  # the fused path really ran, once per module


def test_op_against_float64_attention():
    """The op on CPU (prologue numerics + the INT8 Q/K emulation) vs float64 norm + RoPE + attention."""
    torch.manual_seed(1)
    B, S, H, D, R = 1, 300, 2, 64, 32
    q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16) * 2 for _ in range(3))
    k = k + 1.5  # a channel offset: the smoothing matters
    wq, wk = (torch.rand(1, D) + 0.5 for _ in range(2))
    ang = torch.rand(S, R // 2) * 6
    cos, sin = torch.cos(ang).repeat(1, 2), torch.sin(ang).repeat(1, 2)
    spec = PrologueSpec("rms", 1e-6, "half", R)
    out = op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)

    def f64(x, w):
        x = x.double()
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        h1, h2 = n[..., :R].chunk(2, -1)
        rot = n[..., :R] * cos.double()[:, None] + torch.cat([-h2, h1], -1) * sin.double()[:, None]
        return torch.cat([rot, n[..., R:]], -1)

    qd, kd = f64(q, wq), f64(k, wk)
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", qd, kd) / math.sqrt(D), -1)
    ref = torch.einsum("bhqk,bkhd->bqhd", p, v.double())
    assert _rel(out, ref) < 0.055


def test_op_rms_across_against_float64_attention():
    """Wan's norm across heads through the op on CPU (row factors computed by the entry, then the prologue's
    numerics and the INT8 Q/K emulation) vs float64 norm over (H, D) + interleaved RoPE + attention; the op itself
    takes no rms_across call without the row factors."""
    torch.manual_seed(3)
    B, S, H, D = 1, 200, 3, 64
    q, k, v = (torch.randn(B, S, H, D) * 2 for _ in range(3))
    q = q * torch.tensor([0.5, 1.0, 3.0])[:, None]  # heads of unlike scales: no head's own factor is the row's
    q, k, v = (x.to(torch.bfloat16) for x in (q, k + 1.5, v))
    wq, wk = (torch.rand(H, D) + 0.5 for _ in range(2))
    ang = torch.rand(S, D // 2) * 6
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    spec = PrologueSpec("rms_across", 1e-6, "interleaved", 0)
    out = op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)

    def f64(x, w):
        x = x.double()
        n = x * torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + 1e-6) * w.double()
        rot = torch.stack((-n[..., 1::2], n[..., 0::2]), -1).flatten(-2)
        return n * cos.double()[:, None] + rot * sin.double()[:, None]

    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", f64(q, wq), f64(k, wk)) / math.sqrt(D), -1)
    ref = torch.einsum("bhqk,bkhd->bqhd", p, v.double())
    assert _rel(out, ref) < 0.055
    with pytest.raises(DitprofError, match="needs the row factors"):
        torch.ops.ditprof.fp8_attention_prologue(q, k, v, wq, wk, cos, sin, 0, D ** -0.5, spec_key(spec))


def test_wan_rope_table_is_the_processors_rotation():
    """Wan's rotary (cos, sin) as the interleaved table: pair i turned by cos[2i] and sin[2i + 1], as
    WanAttnProcessor does, for any table; made once for the same tensors, again when one changes in place."""
    from ditprof.model_blocks.families.wan import rope_table

    S, D = 10, 16
    fc, fs = torch.randn(1, S, 1, D), torch.randn(1, S, 1, D)  # not repeat-interleaved: both slots matter
    x = torch.randn(1, S, 2, D)
    cos, sin = rope_table((fc, fs))
    got = prologue_torch(PrologueSpec(None, rope="interleaved"), x, cos=cos, sin=sin)
    x1, x2 = x.double().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = fc.double()[..., 0::2], fs.double()[..., 1::2]
    ref = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    assert rope_table((fc, fs))[0] is cos
    fc.mul_(2)
    again = rope_table((fc, fs))[0]
    assert again is not cos and torch.equal(again, 2 * cos)
    with pytest.raises(DitprofError, match=r"\(1, S, 1, D\)"):
        rope_table((fc[0], fs[0]))


def test_spec_key_round_trip_and_bad_input():
    spec = PrologueSpec("rms", 1e-5, "interleaved", 0)
    assert spec_from_key(spec_key(spec)) == spec
    with pytest.raises(DitprofError, match="not a prologue key"):
        spec_from_key("rms,1e-5")
    with pytest.raises(DitprofError, match="rope must be one of"):
        PrologueSpec(rope="complex")
    x = torch.randn(1, 8, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(DitprofError, match=r"cos must be \(8, 32\)"):
        prologue_torch(PrologueSpec(), x, torch.ones(1, 32), torch.ones(8, 16), torch.ones(8, 16))
    with pytest.raises(DitprofError, match="norm weight of q"):
        op.fp8_attention_prologue(x, x, x, PrologueSpec(rope=None), wq=torch.ones(1, 16), wk=torch.ones(1, 32))


def test_prologue_flag_errors_and_a_family_without_one(tmp_path, capsys):
    rc = cli.main(["compare", "--preset", "flux-tiny", "--device", "cpu", "--attention", "sdpa-math", "--prologue",
                   "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert rc != 0 and "--prologue fuses" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()
    rc = cli.main(["compare", "--preset", "ltx-video-tiny", "--device", "cpu", "--prologue", "--iters", "1",
                   "--warmup", "0", "--out", str(tmp_path / "w")])
    err = capsys.readouterr()
    assert rc in (0, None)
    assert "ltx-video has no fused prologue" in (err.out + err.err).replace("\n", " ")


@pytest.mark.parametrize("preset,kind", [("flux-tiny", "single"), ("qwen-image-tiny", "main"),
                                         ("hunyuan-video-tiny", "double"), (WAN_D16, "main")],
                         ids=lambda p: getattr(p, "name", p))
def test_fused_block_compiles_fullgraph(preset, kind):
    """The op is opaque to torch.compile (its fake checks and shapes): the fused block traces fullgraph (Qwen-Image:
    its joint RoPE table and its prompt-mask check in the graph too; HunyuanVideo: its key-padding mask turned
    into key counts in the graph; Wan: its row factors and rotary table computed in the graph)."""
    torch.manual_seed(2)
    loaded = synthetic_block(preset, 0, kind=kind)
    inputs = make_inputs(loaded)
    fam = loaded.family
    # the backend as a compiled block sees it (``for_compile``): Wan's unfused cross-attention runs it
    swap = PrologueSwap(for_compile(registry.get("fp8-emulated")), fam, uses_dispatcher=fam.uses_dispatcher)
    eager = _outputs(loaded, inputs, [swap])
    inst = swap.install(loaded.module)
    try:
        compiled = torch.compile(loaded.module, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            out = inputs.run(compiled)
    finally:
        inst.undo()
    out = out if isinstance(out, (tuple, list)) else (out,)
    for a, b in zip(out, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_prologue_weights_are_made_once_and_remade_when_a_weight_changes():
    from diffusers.models.normalization import RMSNorm

    from ditprof.model_blocks.families.base import PrologueWeights

    a, b = RMSNorm(32, eps=1e-6), torch.nn.RMSNorm(32, eps=1e-6, elementwise_affine=False)
    torch.nn.init.normal_(a.weight)
    attn, x = torch.nn.Module(), torch.randn(1, 4, 2, 32)
    pw = PrologueWeights()
    with pytest.raises(DitprofError, match="one RMSNorm eps"):  # one eps for every row: 1e-5 beside 1e-6 refused
        pw(torch.nn.Module(), (torch.nn.RMSNorm(32, eps=1e-5), a), (a,), 32, x)
    wq, wk, eps = pw(attn, (b, a), (a,), 32, x)
    assert wq.shape == (2, 32) and wk.shape == (1, 32) and eps == 1e-6
    assert torch.equal(wq[0], torch.ones(32)) and torch.equal(wq[1], a.weight)
    again = pw(attn, (b, a), (a,), 32, x)
    assert again[0] is wq and again[1] is wk  # the same tensors: a stable graph-replay key
    with torch.no_grad():
        a.weight.mul_(2)
    fresh = pw(attn, (b, a), (a,), 32, x)
    assert fresh[0] is not wq and torch.equal(fresh[0][1], a.weight)
    with pytest.raises(DitprofError, match="computes an RMSNorm"):
        pw(torch.nn.Module(), (torch.nn.LayerNorm(32),), (a,), 32, x)


def test_prologue_weights_of_inference_mode_norms():
    """Norms made under torch.inference_mode (no version counter): the weights are made once and kept, by storage."""
    from diffusers.models.normalization import RMSNorm

    from ditprof.model_blocks.families.base import PrologueWeights

    with torch.inference_mode():
        a = RMSNorm(32, eps=1e-6)
        torch.nn.init.normal_(a.weight)
        x = torch.randn(1, 4, 2, 32)
    attn, pw = torch.nn.Module(), PrologueWeights()
    wq, wk, _ = pw(attn, (a,), (a,), 32, x)
    assert torch.equal(wq[0], a.weight) and pw(attn, (a,), (a,), 32, x)[0] is wq
    with torch.inference_mode():
        a.weight = torch.nn.Parameter(a.weight * 2)  # a new storage: remade
    assert torch.equal(pw(attn, (a,), (a,), 32, x)[0][0], a.weight)


def test_profile_and_each_swap_runs_carry_the_prologue(tmp_path):
    import json

    assert cli.main(["profile", "--preset", "minimax-h3-tiny", "--device", "cpu", "--attention", "fp8-emulated",
                     "--prologue", "--iters", "1", "--warmup", "0", "--out", str(tmp_path / "p")]) in (0, None)
    rep = json.loads((tmp_path / "p" / "report.json").read_text())
    assert rep["baseline"]["attention_backend"] == "fp8-emulated+prologue"
    assert rep["baseline"]["prologue"]["fused_modules"] == ["attn"]
    assert cli.main(["compare", "--preset", "flux-tiny", "--device", "cpu", "--prologue", "--linears", "rowwise",
                     "--each-swap", "--iters", "1", "--warmup", "0", "--out", str(tmp_path / "c")]) in (0, None)
    rep = json.loads((tmp_path / "c" / "report.json").read_text())
    assert [c["configuration"] for c in rep["configurations"]] == [
        "sdpa", "fp8-emulated+prologue", "fp8-emulated+prologue + fp8-linears-rowwise"]


def _qwen_attention():
    """The qwen-image-tiny block's attention with four different random norm weights (the groups must not mix)."""
    torch.manual_seed(3)
    loaded = synthetic_block("qwen-image-tiny", 0, kind="main", dtype=torch.float32)
    attn = loaded.module.attn
    with torch.no_grad():
        for norm in (attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k):
            norm.weight.copy_(torch.rand_like(norm.weight) + 0.5)
    return loaded, attn


def test_qwen_joint_table_equals_the_per_stream_rotation():
    """prologue_torch with the joint (cos, sin) table and the two weight groups == diffusers' own norm + complex
    RoPE on each stream, then [text, image] concatenated, in float32 (to rounding)."""
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    from ditprof.model_blocks.families.qwen_image import joint_rope_table

    loaded, attn = _qwen_attention()
    img_freqs, txt_freqs = make_inputs(loaded).kwargs["image_rotary_emb"]
    T, S, H, D = txt_freqs.shape[0], img_freqs.shape[0], attn.heads, attn.inner_dim // attn.heads
    cos, sin = joint_rope_table(img_freqs, txt_freqs)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (T + S, D)
    spec = PrologueSpec("rms", attn.norm_q.eps, "interleaved", D)
    x = torch.randn(2, T + S, H, D) * 3
    for txt_norm, img_norm in ((attn.norm_added_q, attn.norm_q), (attn.norm_added_k, attn.norm_k)):
        txt = apply_rotary_emb_qwen(txt_norm(x[:, :T]), txt_freqs, use_real=False)
        img = apply_rotary_emb_qwen(img_norm(x[:, T:]), img_freqs, use_real=False)
        w = torch.stack([txt_norm.weight, img_norm.weight]).detach()
        fused = prologue_torch(spec, x, w, cos, sin, text_rows=T)
        torch.testing.assert_close(fused, torch.cat([txt, img], dim=1), rtol=1e-5, atol=1e-5)
        # the groups matter: one weight for all rows is far off
        assert not torch.allclose(prologue_torch(spec, x, w[1:], cos, sin), torch.cat([txt, img], 1), atol=1e-2)


def test_qwen_fused_prologue_refuses_a_padded_prompt_and_mixed_eps():
    loaded, attn = _qwen_attention()
    inputs = make_inputs(loaded)
    fam = loaded.family
    swap = PrologueSwap(registry.get("fp8-emulated"), fam, uses_dispatcher=fam.uses_dispatcher)
    inputs.kwargs["encoder_hidden_states_mask"][:, -2:] = False
    inst = swap.install(loaded.module)
    try:
        with torch.no_grad(), pytest.raises(DitprofError, match="takes no key mask"):
            inputs.run(loaded.module)
    finally:
        inst.undo()
    attn.norm_added_k.eps = 1e-5
    with pytest.raises(DitprofError, match="one RMSNorm eps"):
        swap.install(loaded.module)
    assert type(attn.processor).__name__ == "QwenDoubleStreamAttnProcessor2_0"  # the failed install undid itself


def test_qwen_joint_table_is_made_once_and_remade_when_a_table_changes():
    from ditprof.model_blocks.families.qwen_image import JointRopeTables

    loaded, _ = _qwen_attention()
    img_freqs, txt_freqs = make_inputs(loaded).kwargs["image_rotary_emb"]
    tables = JointRopeTables()
    cos, sin = tables(img_freqs, txt_freqs)
    again = tables(img_freqs, txt_freqs[:])  # a new view of the same memory: the same table
    assert again[0] is cos and again[1] is sin
    txt_freqs.mul_(1j)  # rotated in place (the version counter moves): remade
    fresh = tables(img_freqs, txt_freqs)
    T = txt_freqs.shape[0]
    assert fresh[0] is not cos and torch.allclose(fresh[0][:T], -sin[:T]) and torch.equal(fresh[0][T:], cos[T:])


def _padded_hunyuan(kind, pad=3):
    """A HunyuanVideo block and inputs of two batch items, the second's last ``pad`` prompt rows padded (masked)."""
    torch.manual_seed(3)
    loaded = synthetic_block("hunyuan-video-tiny", 0, kind=kind)
    inputs = make_inputs(loaded, batch=2)
    inputs.kwargs["attention_mask"][1, ..., -pad:] = False
    return loaded, inputs


@pytest.mark.parametrize("kind", ["double", "single"])
def test_hunyuan_padded_prompt_fused_matches_unfused_and_ignores_the_padding(kind):
    loaded, inputs = _padded_hunyuan(kind)
    fam = loaded.family
    emu, sdpa = registry.get("fp8-emulated"), registry.get("sdpa")
    ref = _outputs(loaded, inputs, [AttentionSwap(sdpa, uses_dispatcher=fam.uses_dispatcher)])
    unfused = _outputs(loaded, inputs, [AttentionSwap(emu, uses_dispatcher=fam.uses_dispatcher)])
    swap = PrologueSwap(emu, fam, uses_dispatcher=fam.uses_dispatcher)
    fused = _outputs(loaded, inputs, [swap])
    for f, u, r in zip(fused, unfused, ref):
        assert _rel(f, u) < 1.5e-2 and _rel(f, r) < 1.5 * _rel(u, r) + 2e-3, (_rel(f, u), _rel(f, r), _rel(u, r))
    # the padded prompt rows take no part as keys: new values there leave the video rows unchanged, bit for bit,
    # where new values in a kept prompt row change them
    text = inputs.kwargs["encoder_hidden_states"]
    saved = text.clone()
    for rows, same in ((slice(-3, None), True), (slice(0, 1), False)):
        text[1, rows] = torch.randn_like(text[1, rows]) * 4
        try:
            again = _outputs(loaded, inputs, [swap])
        finally:
            text.copy_(saved)
        assert torch.equal(again[0][1], fused[0][1]) == same


def test_hunyuan_mask_that_is_not_a_prefix_is_one_line_error():
    loaded, inputs = _padded_hunyuan("double")
    inputs.kwargs["attention_mask"][0, ..., 5] = False  # a video key masked: no longer each item's first keys
    fam = loaded.family
    swap = PrologueSwap(registry.get("fp8-emulated"), fam, uses_dispatcher=fam.uses_dispatcher)
    with pytest.raises(DitprofError, match="not each batch item's first keys") as err:
        _outputs(loaded, inputs, [swap])
    assert "\n" not in str(err.value)


def test_rows_without_rope_take_the_identity_table():
    """cos = 1, sin = 0 rows give the norm alone: n * 1 + rotate(n) * 0 = n in fp32, so the rounded result is the
    rope-free prologue's bit for bit (a -0.0 with a positive partner would come out +0.0: equal values)."""
    from ditprof.model_blocks.families.base import PrologueTables

    torch.manual_seed(4)
    S, T, D = 40, 9, 32
    x = torch.randn(2, S + T, 3, D, dtype=torch.bfloat16) * 3
    w = torch.rand(1, D) + 0.5
    ang = torch.rand(S, D // 2) * 6
    cos, sin = torch.cos(ang).repeat_interleave(2, -1), torch.sin(ang).repeat_interleave(2, -1)
    tables = PrologueTables()
    tc, ts = tables(cos, sin, T)
    assert tc.shape == (S + T, D) and tc.dtype == torch.float32
    assert tables(cos, sin, T)[0] is tc  # the same tensors: a stable graph-replay key
    assert tables(cos, sin, T + 1)[0].shape == (S + T + 1, D)  # remade when the rows change
    fused = prologue_torch(PrologueSpec("rms", 1e-6, "interleaved", 0), x, w, tc, ts)
    plain = prologue_torch(PrologueSpec("rms", 1e-6, None, 0), x[:, S:], w)
    assert torch.equal(fused[:, S:].view(torch.int16), plain.view(torch.int16))
    roped = prologue_torch(PrologueSpec("rms", 1e-6, "interleaved", 0), x[:, :S], w, cos, sin)
    assert torch.equal(fused[:, :S].view(torch.int16), roped.view(torch.int16))


def test_op_key_lens_masks_the_last_keys_and_bad_key_lens_are_one_line():
    torch.manual_seed(5)
    B, S, H, D = 2, 80, 2, 32
    q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16) for _ in range(3))
    spec = PrologueSpec("rms", 1e-6, None, 0)
    w = torch.ones(1, D)
    lens = torch.tensor([S, 50], dtype=torch.int32)
    out = op.fp8_attention_prologue(q, k, v, spec, wq=w, wk=w, key_lens=lens)
    k2, v2 = k.clone(), v.clone()
    k2[1, 50:], v2[1, 50:] = 7.0, -7.0  # keys past the count take no part
    assert torch.equal(op.fp8_attention_prologue(q, k2, v2, spec, wq=w, wk=w, key_lens=lens), out)
    full = op.fp8_attention_prologue(q, k, v, spec, wq=w, wk=w)
    assert torch.equal(out[0], full[0]) and not torch.equal(out[1], full[1])
    with pytest.raises(DitprofError, match=r"key_lens must be \(2,\) int32"):
        op.fp8_attention_prologue(q, k, v, spec, wq=w, wk=w, key_lens=lens.long())

