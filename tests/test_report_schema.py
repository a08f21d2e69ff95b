"""report.json follows its documented, versioned JSON Schema (ditprof/harness/report/report.schema.json); `--json`
prints exactly that report on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from ditprof.cli import main

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json").read_text())


def _validate(rep: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("argv", [
    ["compare", "--preset", "wan-tiny"],
    ["profile", "--preset", "flux2-tiny", "--kind", "single", "--batch", "2", "--text-tokens", "5",
     "--dtype", "float32"],
    ["compare", "--preset", "hunyuan-video-1.5-tiny"],  # the swap skipped: its mask masks positions
    ["compare", "--preset", "wan-tiny", "--attention", "sdpa-math", "--interleave", "2"],  # rounds in turns
])
def test_json_stdout_is_the_report_and_follows_the_schema(tmp_path, capsys, argv):
    out = tmp_path / "run"
    assert main([*argv, "--device", "cpu", "--iters", "2", "--warmup", "1", "--json", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("{") and text.endswith("}\n"), text[:80]  # stdout holds the JSON alone
    printed = json.loads(text)
    _validate(printed)
    assert printed == json.loads((out / "report.json").read_text())
    ex, sw = printed["extrapolation"], printed["swapped"]
    if sw is not None and sw["attention_backend"] == "fp8-emulated":  # numerics only: no ratio is a speed
        assert ex["speedup"] is None and ex["attention_speedup"] is None and ex["amdahl_predicted_speedup"] is None
        assert ex["speedup_note"].startswith("numerics only") and ex["swapped_ms"] > 0
    elif sw is not None:
        assert ex["speedup"] > 0 and ex["speedup_note"] is None
    assert (printed["interleaved"] is not None) == ("--interleave" in argv)
    if "--batch" in argv:
        assert (printed["model"]["batch"], printed["model"]["text_tokens"], printed["model"]["dtype"]) == \
            (2, 5, "float32")


def test_json_stdout_stays_clean_when_libraries_write_to_stdout(tmp_path, capfd, monkeypatch):
    """--json: writes to stdout during the run (Python's and C code's, straight to descriptor 1) go to stderr."""
    import os

    from ditprof.harness.run import runner

    make_plan = runner.make_plan

    def noisy_plan(spec, **kw):
        print("\n")  # what a library printing blank lines on stdout does
        os.write(1, b"\nfrom C\n")
        return make_plan(spec, **kw)

    monkeypatch.setattr(runner, "make_plan", noisy_plan)
    argv = ["compare", "--preset", "wan-tiny", "--device", "cpu", "--iters", "1", "--warmup", "1", "--json",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    cap = capfd.readouterr()
    assert cap.out.startswith("{"), cap.out[:80]
    rep = json.loads(cap.out)
    assert rep["extrapolation"]["speedup"] is None  # fp8-emulated, the CPU's default swap
    assert "from C" in cap.err


def test_extrapolation_schema_ties_the_note_to_null_ratios():
    ex = SCHEMA["properties"]["extrapolation"]
    good = {"n_blocks": 2, "steps": 1, "cfg": False, "baseline_ms": 2.0, "speedup": None,
            "attention_speedup": None, "speedup_note": "numerics only: x"}
    jsonschema.validate(good, ex)
    with pytest.raises(jsonschema.ValidationError):  # a ratio next to the note saying there is none
        jsonschema.validate({**good, "speedup": 1.5}, ex)


def test_schema_rejects_what_the_report_must_not_be():
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema": "ditprof.report/2"}, SCHEMA)
    bad_run = {"label": "x", "attention_backend": "sdpa", "block_ms": {"median": 1.0, "min": 1.0, "max": 1.0},
               "timing_source": "wall", "samples_ms": [1.0], "profiled_block_ms": 1.0, "profiler_overhead_pct": 0.0,
               "split_mode": "cpu", "split_ms": {}, "split_total_ms": 1.0, "attention_share": 0.5, "top_ops": [],
               "peak_memory_bytes": 1, "trace": "t", "tb_trace": "t"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_run, SCHEMA["$defs"]["run"])


def test_bad_dtype_batch_text_tokens_are_one_line(capsys):
    for argv, words in ((["--dtype", "int8"], "--dtype 'int8' is not supported"),
                        (["--batch", "0"], "--batch must be >= 1"), (["--text-tokens", "0"], "--text-tokens must be")):
        assert main(["profile", "--preset", "wan-tiny", "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
