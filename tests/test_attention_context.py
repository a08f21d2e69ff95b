"""``--attention-alone``: the flag reaches the run spec, the "attention in context" section (in block / alone /
after GEMMs) is in the report and follows the schema, and the verdict line says what given numbers point to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch

from ditprof import cli, dispatch
from ditprof.errors import DitprofError
from ditprof.harness.run.attention_context import CallCapture, section
from ditprof.harness.run.context_verdict import CLOCK_DROP, CPU_NOTE, SAME_WITHIN, verdict
from ditprof.harness.run.runner import spec_from_args
from ditprof.harness.run.session import Clock

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json").read_text())


def _spec(*argv):
    return spec_from_args(cli.build_parser().parse_args(list(argv)), argv[0])


def test_flag_reaches_the_run_spec_and_its_limits():
    base = ("--preset", "minimax-h3-tiny", "--device", "cpu")
    assert _spec("profile", *base, "--attention-alone").attention_alone is True
    assert _spec("compare", *base, "--attention-alone").attention_alone is True
    assert _spec("compare", *base).attention_alone is False
    from ditprof.harness.run.plan import make_plan

    plain, alone = (make_plan(_spec("profile", *base, "--iters", "2", *x)).calls for x in ((), ("--attention-alone",)))
    assert alone == plain + 2 * (2 + 1)  # the estimate counts the extra forwards and alone phases
    with pytest.raises(DitprofError, match="without --compile"):
        _spec("profile", *base, "--attention-alone", "--compile")
    with pytest.raises(DitprofError, match="--sp"):
        _spec("profile", *base, "--attention-alone", "--sp", "2")


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_compare_on_cpu_carries_the_section_and_follows_the_schema(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["compare", "--preset", "minimax-h3-tiny", "--device", "cpu", "--prologue", "--attention-alone",
            "--iters", "2", "--warmup", "1", "--json", "--out", str(out)]
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)
    for sec in rep["configurations"]:
        ctx = sec["attention_context"]
        assert ctx["timing_source"] == "host_clock" and ctx["iters"] == 2 and ctx["calls"]
        for key in ("in_block_ms", "alone_ms", "in_block_over_alone"):
            assert _finite_positive(ctx[key]), (sec["label"], key, ctx[key])
        for c in ctx["calls"]:
            assert all(_finite_positive(c[p][s]) for p in ("in_block_ms", "alone_ms") for s in ("median", "min"))
            assert c["after_gemm_ms"] is None and len(c["q_shape"]) == 4
        assert ctx["after_gemm_ms"] is None and ctx["gemm"] is None  # no after-GEMMs phase on the CPU
        assert set(ctx["sm_clock_mhz"].values()) == {None} and ctx["verdict"].endswith(CPU_NOTE)
    # the fused prologue's op is captured as the unfused backend is: the same attention calls per block
    assert rep["swapped"]["attention_backend"] == "fp8-emulated+prologue"
    assert len(rep["swapped"]["attention_context"]["calls"]) == len(rep["baseline"]["attention_context"]["calls"])
    assert "attention in context" in cap.err and CPU_NOTE in cap.err.replace("\n", " ")
    md = (out / "report.md").read_text()
    assert "## Attention in context" in md and rep["baseline"]["attention_context"]["verdict"] in md


def test_without_the_flag_no_section(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["profile", "--preset", "minimax-h3-tiny", "--device", "cpu", "--iters", "1", "--warmup", "0",
                     "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert all("attention_context" not in s for s in rep["configurations"])
    assert "Attention in context" not in (out / "report.md").read_text()


# --------------------------------------------------------------------------- the verdict, a pure function

IN_BLOCK = 30.0
FASTER = IN_BLOCK * (1 - 3 * SAME_WITHIN)  # alone clearly below the in-block time
SLOWER = FASTER * (1 + 3 * SAME_WITHIN)  # after GEMMs clearly above alone
CLOCK = 1700.0


def test_verdict_points_to_the_gpu_state_after_the_gemms_with_a_lower_clock():
    low = CLOCK * (1 - 3 * CLOCK_DROP)
    line = verdict(IN_BLOCK, FASTER, SLOWER, {"alone": CLOCK, "after_gemm": low})
    assert "9 % less time than in the block: not the inputs' layout" in line
    assert f"9 % more time than alone with the SM clock at {low:.0f} MHz (alone: {CLOCK:.0f} MHz)" in line
    assert line.endswith("the in-block gap follows the GPU's state after the GEMMs")


def test_verdict_after_gemms_slower_at_an_unchanged_clock_is_not_the_clock():
    line = verdict(IN_BLOCK, FASTER, SLOWER, {"alone": CLOCK, "after_gemm": CLOCK * (1 - CLOCK_DROP / 2)})
    assert "about unchanged" in line and "not a lower clock" in line
    assert "SM clock not read" in verdict(IN_BLOCK, FASTER, SLOWER, {"alone": None, "after_gemm": None})


def test_verdict_when_the_gemms_explain_nothing_or_there_is_no_gap():
    same = FASTER * (1 + SAME_WITHIN / 2)
    line = verdict(IN_BLOCK, FASTER, same, {"alone": CLOCK, "after_gemm": CLOCK})
    assert "about the alone time" in line and "does not explain the in-block gap" in line
    line = verdict(IN_BLOCK, IN_BLOCK * (1 - SAME_WITHIN / 2), IN_BLOCK, {"alone": CLOCK, "after_gemm": CLOCK})
    assert "about the in-block time" in line and "gap" not in line
    assert "more time than in the block" in verdict(IN_BLOCK, IN_BLOCK * (1 + 3 * SAME_WITHIN), None)
    assert verdict(IN_BLOCK, FASTER, None).endswith(CPU_NOTE)


# --------------------------------------------------------------------------- capture

def test_capture_times_each_call_keeps_the_first_forwards_arguments_and_the_signature():
    calls = []

    def backend(q, k, v, *, scale=None, attn_mask=None):
        calls.append(q)
        return q

    cap = CallCapture(Clock(torch.device("cpu")))
    fn = cap.wrap(backend)
    assert dispatch.accepts_mask(fn)  # the dispatcher still sees the backend's mask argument
    x, y = torch.ones(1, 4, 2, 8), torch.zeros(1, 4, 2, 8)
    fn(x, x, x)  # outside a forward: not recorded
    cap.forward(lambda: (fn(x, x, x), fn(y, x, x, scale=0.5)))
    cap.forward(lambda: (fn(y, y, y), fn(y, y, y)))
    samples = cap.in_block_ms()
    assert len(samples) == 2 and all(len(s) == 2 and min(s) >= 0 for s in samples)
    assert [c.args[0] is t for c, t in zip(cap.calls, (x, y))] == [True, True]
    assert cap.calls[1].kwargs == {"scale": 0.5} and cap.calls[1]() is y
    sec = section(cap.calls, [[1.0, 2.0], [3.0, 3.0]], [[1.0, 1.0], [2.0, 2.0]], None,
                  {"in_block": None, "alone": None, "after_gemm": None}, None, torch.device("cpu"), 2)
    assert (sec["in_block_ms"], sec["alone_ms"], sec["in_block_over_alone"]) == (4.5, 3.0, 1.5)
    cap.forward(lambda: fn(x, x, x))
    with pytest.raises(DitprofError, match="different numbers of attention calls"):
        cap.in_block_ms()


def test_after_gemms_phase_runs_the_largest_linear_with_the_runs_swaps_in():
    """The after-GEMMs phase (CUDA's by default, forced here on the CPU) runs the block's largest linear, the module
    the run has at its name while the swaps (here with --linears) are in, before each alone call; the section then
    has all three times."""
    from ditprof.harness.run.attention_context import attention_context, largest_linear
    from ditprof.harness.swaps import backends
    from ditprof.harness.swaps.attention import AttentionSwap
    from ditprof.harness.swaps.linears import linears_swaps
    from ditprof.model_blocks import load_block, make_inputs

    dev = torch.device("cpu")
    loaded = load_block("minimax-h3-tiny", 0, device=dev, progress=False)
    inputs = make_inputs(loaded, device=dev)
    attn = AttentionSwap(backends.resolve("sdpa", dev, None), uses_dispatcher=loaded.family.uses_dispatcher)
    swaps = [attn, *linears_swaps("rowwise", dev, loaded.family, compile_each=False)]
    ran = []
    name = largest_linear(loaded.module)
    ctx = attention_context(loaded.module, swaps, inputs.run, device=dev, iters=2, after_gemms=True,
                            on_phase=lambda what, done, total: ran.append(what))
    assert type(loaded.module.get_submodule(name)) is torch.nn.Linear  # the swaps undone afterwards
    jsonschema.validate(ctx, {**SCHEMA["$defs"]["attention_context"], "$defs": SCHEMA["$defs"]})
    assert ctx["gemm"]["module"] == name and ctx["gemm"]["calls_before"] == 4
    assert _finite_positive(ctx["after_gemm_ms"]) and _finite_positive(ctx["after_gemm_over_alone"])
    assert all(_finite_positive(c["after_gemm_ms"]["median"]) for c in ctx["calls"])
    assert ran[-1] == "attention in context: after GEMMs" and "right after the block's GEMMs" in ctx["verdict"]
