"""fp8-sm120's first-use self-check (``kernels.self_check``) and its fallbacks.

CPU: ``SelfCheck`` with injected runners (the emulation as the reference, a stand-in "kernel" that agrees, drifts,
leaves elements unwritten or raises, per P V form), the verdict cache and the one warning, the SDPA fallback record
(``sdpa_fallback.SdpaLaunch``) against float64, and what the launch summaries and the report say. GPU (marked
``gpu``): on the GPU at hand the process's checker passes fp8-sm120 (on Hopper its sm_90a build, pv_mma f32) for
e4m3 and int8 Q/K at head_dim 64 and 128, a record says so, and a forced failure runs SDPA through the real path."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch

from ditprof.kernels.compile_cache import KernelSpec
from ditprof.kernels.fp8_config import Fp8Options, SelfCheckConfig
from ditprof.kernels.self_check import SelfCheck, SelfCheckWarning, check_key, rel_rms, run_emulation

CPU = lambda index: torch.device("cpu")  # noqa: E731 -- the checker's problem made on the CPU
SMALL = SelfCheckConfig(batch=1, heads=2, seq=64, seed=0, bound=0.01)  # a smaller problem: the CPU emulation
SPEC = KernelSpec("fp8-sm120", "sm_120a", 64, "bfloat16", False, False, qk_int8=True, pv_mma="block_scaled")


class Kernel:
    """A stand-in kernel: the emulation's output times (1 + drift[pv_mma]), counting its runs; "unwritten" leaves
    the second half of the output as it was, "raise" fails."""

    def __init__(self, **drift):
        self.drift = drift
        self.runs = []

    def __call__(self, spec, q, k, v, out, scale):
        self.runs.append(spec.pv_mma)
        d = self.drift.get(spec.pv_mma, 0.0)
        if d == "raise":
            raise RuntimeError("no QMMA.SF on this GPU\nsecond line")
        ref = run_emulation(spec, q, k, v, scale)
        if d == "unwritten":
            out[:, : out.shape[1] // 2] = ref[:, : out.shape[1] // 2]
            return
        out.copy_((ref.float() * (1.0 + d)).to(out.dtype))


def _checker(kernel, config=SMALL):
    return SelfCheck(kernel, run_emulation, config, device=CPU)


def _verdict(checker, spec=SPEC):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        v = checker.verdict(spec, 0)
    return v, [w for w in caught if issubclass(w.category, SelfCheckWarning)]


def test_passing_build_keeps_the_spec():
    kernel = Kernel()
    v, warned = _verdict(_checker(kernel))
    assert v.spec == SPEC and v.fallback is None and v.status == "passed"
    assert warned == [] and kernel.runs == ["block_scaled"]


def test_block_scaled_mismatch_switches_to_f32_and_warns_once():
    kernel = Kernel(block_scaled=0.2)
    checker = _checker(kernel)
    v, warned = _verdict(checker)
    assert v.spec == dataclasses.replace(SPEC, pv_mma="f32") and v.status == "failed"
    assert v.fallback.startswith("pv_mma f32: block_scaled rel-RMS ")
    assert len(warned) == 1
    msg = str(warned[0].message)
    assert "\n" not in msg
    assert "pv_mma block_scaled" in msg and "head_dim 64" in msg and "Q/K int8" in msg and "bfloat16" in msg
    assert "rel-RMS 2" in msg and "running pv_mma f32 instead" in msg  # ~20 % measured, what runs now
    assert kernel.runs == ["block_scaled", "f32"]
    again, warned = _verdict(checker)  # cached: no run, no second warning
    assert again == v and warned == [] and kernel.runs == ["block_scaled", "f32"]


def test_both_forms_fail_runs_sdpa():
    kernel = Kernel(block_scaled="raise", f32="unwritten")
    v, warned = _verdict(_checker(kernel))
    assert v.spec is None and v.status == "failed"
    assert v.fallback.startswith("sdpa: block_scaled RuntimeError: no QMMA.SF on this GPU;")
    assert "f32 4096 of 8192 output elements not written or not finite" in v.fallback
    assert len(warned) == 1 and "running torch SDPA instead" in str(warned[0].message)
    assert "second line" not in v.fallback


def test_f32_build_failing_runs_sdpa():
    v, _ = _verdict(_checker(Kernel(f32=0.5)), dataclasses.replace(SPEC, pv_mma="f32"))
    assert v.spec is None and v.fallback.startswith("sdpa: f32 rel-RMS ")


def test_verdict_is_kept_per_configuration():
    kernel = Kernel()
    checker = _checker(kernel)
    for spec in (SPEC, dataclasses.replace(SPEC, write_lse=True), dataclasses.replace(SPEC, key_lens=True)):
        v, _ = _verdict(checker, spec)
        assert v.spec == spec  # the build itself, not the first one checked
    assert kernel.runs == ["block_scaled"]  # LSE and key lengths are not part of the configuration
    _verdict(checker, dataclasses.replace(SPEC, qk_int8=False))
    _verdict(checker, dataclasses.replace(SPEC, out_dtype="float16"))
    checker.verdict(SPEC, 1)  # another device
    assert len(kernel.runs) == 4
    assert check_key(SPEC, 0) != check_key(SPEC, 1)


@pytest.mark.parametrize("drift,passed", [(0.008, True), (0.012, False)])
def test_bound(drift, passed):
    """An output off by a relative drift just inside the bound passes, just outside fails."""
    checker = SelfCheck(Kernel(block_scaled=drift), run_emulation, dataclasses.replace(SMALL, seq=32), device=CPU)
    got = checker.outcome(SPEC, 0)
    assert got.passed is passed
    assert got.error == pytest.approx(drift, abs=1e-3)  # and the bf16 rounding of the drifted output


def test_fallback_reaches_the_launch_summary_and_the_report():
    """A record that runs the f32 form and one that runs SDPA, as launch_summaries and report.md give them; both
    summaries fit report.json's schema."""
    jsonschema = pytest.importorskip("jsonschema")
    from ditprof.harness.report import summary as R
    from ditprof.kernels import launch_record as L
    from ditprof.kernels.sdpa_fallback import SdpaLaunch

    rec = object.__new__(L.Fp8Launch)  # the fields a summary reads; building one needs a GPU
    rec.out_shape, rec.Sk, rec.dtype, rec.streamk, rec.calls, rec.graphs = (1, 256, 2, 64), 256, torch.bfloat16, \
        None, 3, None
    rec.spec = dataclasses.replace(SPEC, pv_mma="f32")
    rec.self_check, rec.fallback = "failed", "pv_mma f32: block_scaled rel-RMS 20.00% against the emulation"
    q = torch.zeros(1, 300, 2, 64, dtype=torch.bfloat16)
    sdpa = SdpaLaunch(q, q, False, False, fallback="sdpa: f32 RuntimeError: boom")
    sdpa.calls = 1
    summaries = [{**r.summary(), "calls": r.calls, "graph_replays": r.replays()} for r in (rec, sdpa)]
    schema = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json")
                        .read_text())
    item = {**schema["$defs"]["run"]["properties"]["fp8_launches"]["items"], "$defs": schema.get("$defs", {})}
    for s in summaries:
        jsonschema.validate(s, item, cls=jsonschema.Draft202012Validator)
    assert (summaries[0]["kernel"], summaries[1]["kernel"]) == ("fp8-sm120 f32", "sdpa")
    rep = {"baseline": {"label": "baseline"},
           "swapped": {"label": "swapped", "attention_backend": "fp8", "qk_format": "int8",
                       "fp8_launches": summaries}}
    lines = R.fp8_launch_lines(rep)
    assert "- fallback (swapped, q (1, 256, 2, 64)): pv_mma f32: block_scaled rel-RMS 20.00% against the " \
           "emulation" in lines
    assert "- fallback (swapped, q (1, 300, 2, 64)): sdpa: f32 RuntimeError: boom" in lines
    assert any("| sdpa | none | plain | torch |" in row for row in lines)
    rec.fallback = None
    assert R.fallback_lines({"swapped": {"label": "s", "fp8_launches": [rec.summary()]}}) == []


def _inputs(B, Sq, Sk, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Sq, H, D, generator=g).to(torch.bfloat16),
            torch.randn(B, Sk, H, D, generator=g).to(torch.bfloat16),
            torch.randn(B, Sk, H, D, generator=g).to(torch.bfloat16))


def test_sdpa_fallback_record_matches_float64_with_key_lens_and_lse():
    from ditprof.kernels.reference import attention_reference
    from ditprof.kernels.sdpa_fallback import SdpaLaunch

    q, k, v = _inputs(2, 40, 70, 3, 64, seed=1)
    lens = torch.tensor([70, 33], dtype=torch.int32)
    scale = 0.1
    rec = SdpaLaunch(q, k, True, True, fallback="sdpa: test")
    out, lse = rec(q, k, v, scale, lens)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous() and lse.dtype == torch.float32
    for b, n in enumerate(lens.tolist()):
        ref, ref_lse = attention_reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], scale=scale,
                                           return_lse=True)
        assert rel_rms(out[b:b + 1], ref) < 1e-2
        assert (lse[b:b + 1].double() - ref_lse).abs().max().item() < 1e-3
    assert rec.calls == 1 and rec.replays() == 0


def test_sdpa_fallback_lse_in_chunks(monkeypatch):
    from ditprof.kernels import sdpa_fallback

    q, k, _ = _inputs(1, 50, 20, 2, 64, seed=2)
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)
    whole = sdpa_fallback.scores_lse(qh, kh, None, 0.125)
    monkeypatch.setattr(sdpa_fallback, "LSE_CHUNK_BYTES", 2 * 20 * 4 * 7)  # 7 query rows a block
    assert torch.allclose(sdpa_fallback.scores_lse(qh, kh, None, 0.125), whole)
    s = (qh.float() @ kh.float().transpose(-1, -2)) * 0.125
    assert torch.allclose(whole, torch.logsumexp(s, -1), atol=1e-5)


def test_self_check_option_is_part_of_the_op_key():
    """Turning the check off is an option like any other: the op's options string carries it and gives the same
    object back."""
    from ditprof.kernels.op import options_for, options_key

    off = Fp8Options(self_check=False)
    assert options_key(off) == "Fp8Options(self_check=False)"
    assert options_for(options_key(off)) is off


# ------------------------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
@pytest.mark.parametrize("qk", ["e4m3", "int8"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_self_check_passes(qk, D):
    """fp8-sm120 forced on the GPU at hand (on Hopper its sm_90a build, P V as f32 mma: Hopper has no block-scaled
    form) passes the process's check, and the record built after it says so."""
    from ditprof.kernels import launch_record as L
    from ditprof.kernels.interface import fp8_attention
    from ditprof.kernels.launch_choice import arch_of
    L.clear_cache()
    spec = KernelSpec("fp8-sm120", arch_of(0), D, "bfloat16", False, False, qk_int8=qk == "int8")
    got = L.SELF_CHECK.outcome(spec, 0)
    print(f"\nfp8-sm120 {arch_of(0)} D={D} {qk}: rel-RMS vs emulation {got.error}")
    assert got.passed, got.why
    q, k, v = (t.cuda() for t in _inputs(1, 300, 300, 2, D, seed=5))
    before = L.call_counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SelfCheckWarning)
        fp8_attention(q, k, v, options=Fp8Options(kernel="fp8-sm120", qk_format=qk))
    (s,) = L.launch_summaries(since=before)
    assert (s["kernel"], s["self_check"], s["fallback"]) == ("fp8-sm120 f32", "passed", None)


@pytest.mark.gpu
def test_gpu_forced_failure_runs_sdpa(monkeypatch):
    """A checker whose reference disagrees with everything: the record runs SDPA (the reference's output), warns
    once, and its summary says why."""
    from ditprof.kernels import launch_record as L
    from ditprof.kernels.interface import fp8_attention
    from ditprof.kernels.reference import attention_reference

    L.clear_cache()
    wrong = SelfCheck(L.run_for_check, lambda spec, q, k, v, scale: -run_emulation(spec, q, k, v, scale))
    monkeypatch.setattr(L, "SELF_CHECK", wrong)
    q, k, v = (t.cuda() for t in _inputs(2, 200, 300, 2, 128, seed=6))
    before = L.call_counts()
    with pytest.warns(SelfCheckWarning, match="running torch SDPA instead"):
        o, lse = fp8_attention(q, k, v, return_lse=True, options=Fp8Options(kernel="fp8-sm120"))
    ref, ref_lse = attention_reference(q, k, v, return_lse=True)
    assert rel_rms(o, ref) < 1e-2 and (lse.double() - ref_lse).abs().max().item() < 1e-3
    (s,) = L.launch_summaries(since=before)
    assert s["kernel"] == "sdpa" and s["fallback"].startswith("sdpa: f32 rel-RMS ")
    L.clear_cache()  # the SDPA records and the forced verdicts go
