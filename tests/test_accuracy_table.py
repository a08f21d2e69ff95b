"""ditprof accuracy-table: swap accuracy per family on the tiny presets (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from ditprof.cli import build_parser, main
from ditprof.errors import DitprofError
from ditprof.harness.validate.commands import ACCURACY_SCHEMA, accuracy_table

TINY = ["minimax-h3-tiny", "qwen-image-tiny", "wan-tiny", "flux-tiny", "hunyuan-video-tiny", "ltx-video-tiny", "cogvideox-tiny"]


def test_accuracy_table_structure(tmp_path, capsys):
    out = tmp_path / "acc"
    assert main(["accuracy-table", "--presets", ",".join(TINY), "--tokens", "48,1031", "--device", "cpu",
                 "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["schema"] == ACCURACY_SCHEMA and rep["baseline"] == "sdpa" and rep["backends"] == ["fp8-emulated"]
    assert len(rep["rows"]) == len(TINY) * 2
    families = {r["family"] for r in rep["rows"]}
    assert families == {"minimax-h3", "qwen-image", "wan", "flux", "hunyuan-video", "ltx-video", "cogvideox"}  # every family with a preset
    ok = [r for r in rep["rows"] if r["status"] == "ok"]
    assert {r["preset"] for r in ok if r["tokens"] == 48} == set(TINY)
    for r in ok:
        assert 0 < r["rel_rms"] < 0.2, r
        assert 0.98 < r["cosine"] <= 1.0 + 1e-9, r
        assert r["finite"] and r["route"] in ("dispatcher", "processor")
    assert {r["route"] for r in ok if r["family"] == "cogvideox"} == {"processor"}
    # 1031 is prime: a Wan grid would need an axis of 1031 > the 1024-long RoPE table -> a skipped row, not a crash
    wan_1031 = [r for r in rep["rows"] if r["family"] == "wan" and r["tokens"] == 1031]
    assert wan_1031 and wan_1031[0]["status"] == "skipped" and "1024" in wan_1031[0]["reason"]
    saved = json.loads((out / "accuracy-table.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(rep["rows"]))
    md = (out / "accuracy-table.md").read_text()
    assert "| family | preset |" in md and "fp8-emulated" in md


def test_same_inputs_same_backend_is_exact():
    rep = accuracy_table(["wan-tiny"], [48], torch.device("cpu"), ["sdpa"])
    (row,) = rep["rows"]
    assert row["rel_rms"] == 0.0 and row["cosine"] == pytest.approx(1.0)


def test_accuracy_table_bad_input(tmp_path):
    def call(*argv):
        args = build_parser().parse_args(list(argv))
        return args.func(args)

    with pytest.raises(DitprofError, match="unknown preset"):
        call("accuracy-table", "--presets", "nope", "--device", "cpu", "--out", str(tmp_path / "x"))
    with pytest.raises(DitprofError, match="unknown attention backend"):
        call("accuracy-table", "--presets", "wan-tiny", "--backends", "nope", "--device", "cpu",
             "--out", str(tmp_path / "x"))
    with pytest.raises(DitprofError, match="comma-separated"):
        call("accuracy-table", "--presets", "wan-tiny", "--tokens", "a,b", "--device", "cpu")
    assert not (tmp_path / "x").exists()


def test_qk_outlier_variant_reaches_the_block_number(tmp_path, capsys, monkeypatch):
    """--qk-outliers: the synthetic QK-norm weights get 4 channels per head x 20 (as trained DiTs have), and the
    block-level FP8 error shows it with e4m3 Q/K; the INT8 format (the default) holds (issue 18)."""
    import json

    from ditprof.cli import main

    rows = {}
    for fmt in ("e4m3", "int8"):
        monkeypatch.setenv("DITPROF_FP8_QK", fmt)
        for flag in ([], ["--qk-outliers"]):
            out = tmp_path / (fmt + ("o" if flag else "p"))
            assert main(["accuracy-table", "--device", "cpu", "--presets", "h3-mini", "--tokens", "256", "--json",
                         "--out", str(out), *flag]) == 0
            rep = json.loads(capsys.readouterr().out)
            assert rep["qk_outliers"] == bool(flag)
            (row,) = rep["rows"]
            rows[fmt, bool(flag)] = row
    assert rows["e4m3", False]["qk_outlier_norms"] == 0 and rows["e4m3", True]["qk_outlier_norms"] == 2
    assert rows["e4m3", True]["rel_rms"] > 5 * rows["e4m3", False]["rel_rms"]
    assert rows["int8", True]["rel_rms"] < 0.2 * rows["e4m3", True]["rel_rms"]


def test_qk_outlier_norms_per_head_and_across_heads():
    import torch

    from ditprof.model_blocks.synthetic import QK_OUTLIER_FACTOR, qk_outlier_norms, synthetic_block

    wan = synthetic_block("wan-tiny", 0, dtype=torch.float32)  # rms_norm_across_heads: (heads x head_dim,)
    before = {n: p.clone() for n, p in wan.module.named_parameters()}
    changed = qk_outlier_norms(wan.module, wan.head_dim, seed=1)
    assert changed and all(n.split(".")[-2] in ("norm_q", "norm_k", "norm_added_q", "norm_added_k") for n in changed)
    for name, p in wan.module.named_parameters():
        ratio = (p / before[name]).view(-1).round(decimals=3)
        if name in changed:
            per_head = ratio.view(-1, wan.head_dim)
            assert torch.equal(per_head, per_head[:1].expand_as(per_head))  # the same channels in every head
            assert int((per_head[0] == QK_OUTLIER_FACTOR).sum()) == 4 and int((per_head[0] == 1).sum()) == 8
        else:
            assert torch.equal(p, before[name])


def _help_of(command: str) -> str:
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command].format_help()


def test_help_lists_the_default_preset_tuples():
    """The --presets help is built from the tuples the run uses: the CPU list, then the CUDA extras (issue 41)."""
    import re

    from ditprof.harness.validate import commands

    flat = re.sub(r"\s+", "", _help_of("accuracy-table"))  # argparse wraps lines, also at hyphens
    m = re.search(r"defaultonCPU:(.*?);onCUDAalso(.*?),notonCPU:", flat)
    assert m, flat
    cpu, extras = m.group(1).split(","), m.group(2).split(",")
    assert tuple(cpu) == commands.CPU_ACCURACY_PRESETS
    assert tuple(cpu + extras) == commands.CUDA_ACCURACY_PRESETS
    assert re.sub(r"\s+", "", commands.CPU_LEFT_OUT_WHY) in flat
    tokens = ",".join(map(str, commands.CPU_ACCURACY_TOKENS)) + "onCPU"
    assert tokens in flat and ",".join(map(str, commands.CUDA_ACCURACY_TOKENS)) + "onCUDA" in flat


def test_cpu_default_names_the_presets_it_leaves_out(tmp_path, capsys, monkeypatch):
    """A CPU run of the default list prints one line naming the CUDA-only presets and records them in the JSON."""
    from ditprof.harness.validate import commands

    monkeypatch.setattr(commands, "CPU_ACCURACY_PRESETS", ("wan-tiny",))
    monkeypatch.setattr(commands, "CUDA_ACCURACY_PRESETS", ("wan-tiny", "flux-tiny", "ltx2-tiny"))
    assert main(["accuracy-table", "--tokens", "48", "--device", "cpu", "--out", str(tmp_path / "a"),
                 "--json"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["presets"] == ["wan-tiny"] and {r["preset"] for r in rep["rows"]} == {"wan-tiny"}
    assert rep["presets_not_run"] == {"flux-tiny": commands.CPU_LEFT_OUT_WHY, "ltx2-tiny": commands.CPU_LEFT_OUT_WHY}
    notes = [ln for ln in cap.err.splitlines() if "leaves out" in ln]
    assert len(notes) == 1 and "flux-tiny, ltx2-tiny" in notes[0] and notes[0].endswith("--presets runs them"), cap.err
    # a named list runs as given: nothing left out, no note
    assert main(["accuracy-table", "--presets", "wan-tiny", "--tokens", "48", "--device", "cpu",
                 "--out", str(tmp_path / "b"), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["presets_not_run"] == {} and "leaves out" not in cap.err


def test_accuracy_table_with_fp8_linears(tmp_path, capsys):
    """--linears: per preset and token count, each backend alone, with FP8 linears, and sdpa with FP8 linears;
    FP8 linears add error (bounded); wan-tiny's 24-wide linears stay bf16 (none swapped, recorded)."""
    out = tmp_path / "acc"
    assert main(["accuracy-table", "--presets", "flux-tiny,wan-tiny", "--tokens", "48", "--device", "cpu",
                 "--linears", "rowwise", "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["configs"] == ["attention", "attention+linears", "linears"]
    rows = {(r["preset"], r["config"]): r for r in rep["rows"]}
    assert len(rows) == len(rep["rows"]) == 6 and all(r["status"] == "ok" for r in rep["rows"])
    att, both, lin = (rows["flux-tiny", c] for c in rep["configs"])
    assert att["backend"] == both["backend"] == "fp8-emulated" and lin["backend"] == "sdpa"
    assert att["linears"] is None and both["linears"]["swapped"] > 0 and both["linears"]["numerics_only"]
    assert both["configuration"] == "fp8-emulated + fp8-linears-rowwise"
    assert lin["configuration"] == "sdpa + fp8-linears-rowwise"
    assert 0 < att["rel_rms"] < both["rel_rms"] < 0.1 and 0 < lin["rel_rms"] < 0.1
    assert both["cosine"] > 0.99 and lin["cosine"] > 0.99
    # nothing of wan-tiny runs in FP8: with FP8 linears the numbers are attention's, sdpa + linears is exact
    assert rows["wan-tiny", "attention+linears"]["linears"]["swapped"] == 0
    assert rows["wan-tiny", "attention+linears"]["rel_rms"] == rows["wan-tiny", "attention"]["rel_rms"]
    assert rows["wan-tiny", "linears"]["rel_rms"] == 0.0
    sec = rep["linears"]
    assert sec["granularity"] == "rowwise" and sec["numerics_only"]
    assert sec["presets"]["wan-tiny"]["swapped"] == [] and len(sec["presets"]["wan-tiny"]["kept"]) == 10
    assert "norm1.linear" in sec["presets"]["flux-tiny"]["kept"]
    md = (out / "accuracy-table.md").read_text()
    assert "| backend | linears | rel-RMS |" in md and "FP8: " in md and "bf16 (none can run in FP8)" in md
    # a chosen subset of configurations
    assert main(["accuracy-table", "--presets", "flux-tiny", "--tokens", "48", "--device", "cpu", "--linears",
                 "tensorwise", "--configs", "linears", "--out", str(tmp_path / "b"), "--json"]) == 0
    sub = json.loads(capsys.readouterr().out)
    assert [(r["config"], r["backend"]) for r in sub["rows"]] == [("linears", "sdpa")]


def test_accuracy_table_configs_bad_input(tmp_path, capsys):
    for argv, msg in ((["--configs", "linears"], "--configs linears runs the linears in FP8: give --linears"),
                      (["--configs", "attention,nope", "--linears", "rowwise"], "unknown configuration 'nope'")):
        rc = main(["accuracy-table", "--presets", "wan-tiny", "--device", "cpu", "--out", str(tmp_path / "x"),
                   *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "x").exists()


def test_accuracy_table_with_fused_prologue(tmp_path, capsys):
    """--prologue: per attention configuration a '+ fused prologue' row where the family declares one (flux,
    minimax-h3), with the same metrics, finite and within the others' bounds; ltx-video has none: one line, its
    unfused rows only, the reason in the JSON."""
    from ditprof.model_blocks import get_family

    out = tmp_path / "acc"
    assert main(["accuracy-table", "--presets", "flux-tiny,ltx-video-tiny,minimax-h3-tiny", "--tokens", "48",
                 "--device", "cpu", "--prologue", "--linears", "rowwise", "--out", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    notes = [ln for ln in " ".join(cap.err.split()).split("--prologue: ")[1:]]
    assert len(notes) == 1 and notes[0].startswith("ltx-video has no fused prologue")
    rows = {(r["preset"], r["config"], r["prologue"]): r for r in rep["rows"]}
    assert len(rows) == len(rep["rows"]) and all(r["status"] == "ok" for r in rep["rows"])
    for preset in ("flux-tiny", "minimax-h3-tiny"):
        for config in ("attention", "attention+linears"):
            fused, plain = rows[preset, config, True], rows[preset, config, False]
            assert fused["backend"] == plain["backend"] == "fp8-emulated"
            assert fused["configuration"] == plain["configuration"].replace("fp8-emulated", "fp8-emulated+prologue")
            assert fused.keys() == plain.keys() and fused["finite"]
            assert 0 < fused["rel_rms"] < 0.2 and 0.98 < fused["cosine"] <= 1.0 + 1e-9, fused
            assert fused["rel_rms"] < 1.5 * plain["rel_rms"] + 2e-3, (fused["rel_rms"], plain["rel_rms"])
        assert rows[preset, "attention", True]["rel_rms"] != rows[preset, "attention", False]["rel_rms"]
        assert rep["prologue"]["presets"][preset]["fused_modules"] == ["attn"]
    assert not any(p == "ltx-video-tiny" and f for p, _, f in rows)
    assert rep["prologue"]["presets"]["ltx-video-tiny"] == {"missing": get_family("ltx-video").prologue_missing}
    assert rep["prologue"]["backends"] == ["fp8-emulated"] and not rows["flux-tiny", "linears", False]["prologue"]
    md = (out / "accuracy-table.md").read_text()
    assert "| fp8-emulated + fused prologue | bf16 |" in md and "No fused prologue, unfused rows only: ltx-video-tiny" in md
    assert "--prologue" in _help_of("accuracy-table")


def test_accuracy_table_prologue_bad_input(tmp_path, capsys):
    for argv, msg in ((["--backends", "sdpa-math"], "--prologue fuses the processor's norm and RoPE into the FP8 "
                                                    "prep: it needs the swap backend fp8 or fp8-emulated"),
                      (["--configs", "linears", "--linears", "rowwise"], "--configs linears has none")):
        rc = main(["accuracy-table", "--presets", "flux-tiny", "--device", "cpu", "--prologue",
                   "--out", str(tmp_path / "x"), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "x").exists()
