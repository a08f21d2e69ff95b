"""ditprof validate: N distinct blocks chained vs N x one block (CPU, small token counts)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ditprof.cli import main
from ditprof.errors import DitprofError
from ditprof.harness.run import session as S
from ditprof.harness.run.activation import estimate_forward_bytes
from ditprof.harness.validate import chain as VC
from ditprof.harness.validate import run as V
from ditprof.harness.validate.source import open_source
from ditprof.kernels.qk_format import qk_format
from ditprof.model_blocks import get_family, load_block, make_inputs
from ditprof.model_blocks.synthetic import synthetic_block


def _call(*argv):
    """Run a command without main()'s error printing, so DitprofError reaches the test."""
    from ditprof.cli import build_parser

    args = build_parser().parse_args(list(argv))
    return args.func(args)


def _run(capsys, *argv) -> dict:
    assert main(["validate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_validate_h3_mini_report(tmp_path, capsys, one_thread):
    out = tmp_path / "run"
    rep = _run(capsys, "--preset", "h3-mini", "--blocks", "3", "--tokens", "256", "--device", "cpu",
               "--iters", "3", "--chain-iters", "3", "--steps", "4", "--cfg", "--out", str(out))
    assert rep["schema"] == V.SCHEMA
    assert rep["blocks"] == 3 and rep["mode"] == "resident" and rep["timing_source"] == "host_clock"
    assert rep["model"]["preset"] == "h3-mini" and rep["model"]["model_n_blocks"] == 50
    assert rep["model"]["tokens"] == 256 and rep["model"]["block_bytes"] > 6 * 2**20
    assert len(rep["one_block_ms"]["samples"]) == 3 and len(rep["chain_ms"]["samples"]) == 3
    assert len(rep["chain_per_block_ms"]["samples"]) == 3
    assert rep["extrapolated_ms"] == pytest.approx(3 * rep["one_block_ms"]["median"])
    assert rep["error_pct"] == pytest.approx((rep["extrapolated_ms"] / rep["chain_ms"]["median"] - 1) * 100)
    # Same work per block: on a quiet host the error is a few %; busy CI hosts get a wide bound.
    assert abs(rep["error_best_pct"]) < 60, rep["error_best_pct"]
    assert rep["output_finite"]
    assert "distinct per block" in rep["weights"]
    assert rep["environment"]["torch"] == torch.__version__
    ws = rep["whole_step"]
    ex = ws["extrapolated"]
    rest = ws["rest"]["rest_ms"]["median"]
    assert ex["block_part_ms"] == pytest.approx(50 * rep["one_block_ms"]["median"])
    assert ex["per_step_ms"] == pytest.approx(ex["block_part_ms"] + rest)
    assert ex["passes"] == 8 and ex["per_video_ms"] == pytest.approx(8 * ex["per_step_ms"])
    assert ws["from_chain"]["block_part_ms"] == pytest.approx(rep["chain_ms"]["median"] * 50 / 3)
    assert ws["rest"]["modules_not_run"] == []
    saved = json.loads((out / "validate.json").read_text())
    assert saved["error_pct"] == pytest.approx(rep["error_pct"])
    assert "error" in (out / "validate.md").read_text()


def test_streamed_chain_equals_resident_chain():
    """Streaming block weights through one working block computes exactly what resident blocks compute."""
    src = open_source("h3-mini", "preset", None)
    blocks = [synthetic_block("h3-mini", i) for i in range(3)]
    inputs = make_inputs(blocks[0], tokens=64)
    chain = VC.Chain(inputs, blocks[0].family.plan(blocks[0].kind))
    clock = S.Clock(torch.device("cpu"))
    with torch.inference_mode():
        _, per, resident = VC.run_chain(chain, [b.module for b in blocks], clock, n=3)
        working = synthetic_block("h3-mini", 0).module
        streamer = VC.Streamer(working)
        for i in range(3):
            streamer.add(src.host_state(i, torch.device("cpu"), torch.bfloat16, 0, streamer.to_host))
        _, per_s, streamed = VC.run_chain(chain, None, clock, streamer=streamer, n=3)
    assert len(per) == len(per_s) == 3
    assert torch.equal(resident, streamed)
    # and the chain really depends on every block: a different last block changes the output
    with torch.inference_mode():
        _, _, other = VC.run_chain(chain, [blocks[0].module, blocks[1].module, blocks[0].module], clock, n=3)
    assert not torch.equal(resident, other)


def test_synthetic_blocks_distinct_deterministic_and_equal_to_checkpoint():
    b0 = synthetic_block("h3-mini", 0)
    b1 = synthetic_block("h3-mini", 1)
    ck = load_block("h3-mini", 0, progress=False)
    s0, s1, sc = b0.module.state_dict(), b1.module.state_dict(), ck.module.state_dict()
    assert s0.keys() == sc.keys()
    for k in s0:
        assert s0[k].dtype == sc[k].dtype, k  # fp32-kept params stay fp32
        assert torch.equal(s0[k], sc[k]), k  # CPU: bit-identical to the synthetic checkpoint
    big = [k for k in s0 if s0[k].ndim == 2]
    assert all(not torch.equal(s0[k], s1[k]) for k in big)
    again = synthetic_block("h3-mini", 1).module.state_dict()
    assert all(torch.equal(again[k], s1[k]) for k in s1)
    # fp32 exactly where diffusers keeps it (MiniMax-H3 keeps nothing of its blocks in fp32)
    assert all((t.dtype == torch.float32) == b0.family.keeps_fp32(k) for k, t in s0.items())


def test_validate_checkpoint_streamed_with_tiny_model(tmp_path, capsys, one_thread):
    """A real sharded checkpoint (tiny Flux: double blocks return (encoder, hidden)), streamed through one
    working block under a planning budget."""
    from ditprof.model_blocks import get_preset
    from ditprof.model_blocks.synthetic import ensure_checkpoint

    folder = ensure_checkpoint(get_preset("flux-tiny"), blocks=None, kind="double", progress=False)
    rep = _run(capsys, "--checkpoint", str(folder), "--blocks", "2", "--device", "cpu", "--stream",
               "--iters", "2", "--chain-iters", "2", "--out", str(tmp_path / "ck"))
    assert rep["model"]["checkpoint"] == str(folder) and rep["model"]["family"] == "flux"
    assert rep["mode"] == "streamed" and "compute only" in rep["timed"]
    assert rep["weights"].startswith("checkpoint shards")
    assert rep["whole_step"]["rest"]["modules_not_run"] == []


def test_bad_blocks_and_budget(tmp_path, capsys):
    with pytest.raises(DitprofError, match=r"--blocks 51 is larger than the preset h3-mini's block count \(50"):
        _call("validate", "--preset", "h3-mini", "--blocks", "51", "--device", "cpu", "--out", str(tmp_path / "a"))
    # a checkpoint whose config says 50 blocks but that holds only block 0
    from ditprof.model_blocks import get_preset
    from ditprof.model_blocks.synthetic import ensure_checkpoint

    folder = ensure_checkpoint(get_preset("h3-mini"), blocks=[0], kind=None, progress=False)
    with pytest.raises(DitprofError, match=r"needs blocks 0-1, but checkpoint .* holds only blocks 0 of 50"):
        _call("validate", "--checkpoint", str(folder), "--blocks", "2", "--device", "cpu", "--out", str(tmp_path))
    with pytest.raises(DitprofError, match=r"too small to hold one block: it needs 6.30 MiB of weights .* = ~"):
        _call("validate", "--preset", "h3-mini", "--blocks", "2", "--tokens", "256", "--device", "cpu",
              "--gpu-memory", "4MiB", "--out", str(tmp_path / "b"))
    with pytest.raises(DitprofError, match="not a size"):
        _call("validate", "--preset", "h3-mini", "--gpu-memory", "lots", "--device", "cpu")
    with pytest.raises(DitprofError, match="unknown attention backend"):
        _call("validate", "--preset", "wan-tiny", "--attention", "nope", "--device", "cpu", "--out", str(tmp_path))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # through the CLI entry point: one line, exit 2
    assert main(["validate", "--preset", "wan-tiny", "--blocks", "3", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ditprof: error: --blocks 3 is larger than the preset wan-tiny's block count (2 main blocks)"]


def test_activation_estimate_scales_with_tokens():
    from ditprof.model_blocks import get_preset

    p = get_preset("h3-mini")
    a = estimate_forward_bytes(get_family(p.family), p.config, "main", preset=p, tokens=256)
    b = estimate_forward_bytes(get_family(p.family), p.config, "main", preset=p, tokens=1024)
    assert 0 < a["activation_bytes"] < b["activation_bytes"] < 8 * a["activation_bytes"]
    # at least the FFN intermediate (tokens x ffn_dim bf16) is alive at the peak
    assert b["activation_bytes"] >= 1024 * 1024 * 2


@pytest.mark.gpu
def test_validate_cuda_h3_mini(tmp_path, capsys):
    rep = _run(capsys, "--preset", "h3-mini", "--blocks", "8", "--device", "cuda", "--out", str(tmp_path / "g"))
    assert rep["timing_source"] == "cuda_events" and rep["mode"] == "resident"
    assert rep["memory"]["peak_allocated_bytes"] >= 8 * rep["model"]["block_bytes"]
    assert abs(rep["error_pct"]) < 25


@pytest.mark.parametrize("preset", ["flux2-tiny", "ltx2-tiny", "hunyuan-video-1.5-tiny", "qwen-image-tiny"])
def test_validate_2026_families(tmp_path, capsys, one_thread, preset):
    """validate chains the families added for 2026 (their outputs feed the next block as the plan declares) and
    the whole-step estimate runs every non-block module of the model (the rest model takes model_inputs)."""
    rep = _run(capsys, "--preset", preset, "--blocks", "2", "--device", "cpu", "--iters", "1", "--chain-iters", "1",
               "--out", str(tmp_path / preset))
    assert rep["model"]["preset"] == preset and rep["blocks"] == 2
    assert rep["chain_ms"]["median"] > 0 and math.isfinite(rep["error_pct"])
    # the Q/K format the fp8 backends take for this model's head_dim (INT8 for a power of two >= 16, else e4m3)
    assert rep["environment"]["fp8_qk_format"] == qk_format(head_dim=rep["model"]["head_dim"])
    assert rep["whole_step"]["rest"]["modules_not_run"] == []


def test_validate_linears_accuracy_against_the_model_attention(tmp_path, capsys, one_thread):
    """--linears: every block's linears in FP8 after the attention swap; the report records them and the chain's
    accuracy against sdpa with bf16 linears, which FP8 linears make worse than FP8 attention alone (and bounded)."""
    common = ["--preset", "flux-tiny", "--blocks", "2", "--device", "cpu", "--iters", "1", "--chain-iters", "1",
              "--attention", "fp8-emulated"]
    att = _run(capsys, *common, "--out", str(tmp_path / "a"))
    lin = _run(capsys, *common, "--linears", "rowwise", "--out", str(tmp_path / "l"))
    assert att["configuration"] == "fp8-emulated" and att["linears"] is None and att["numerics_only"]
    assert lin["configuration"] == "fp8-emulated + fp8-linears-rowwise" and lin["numerics_only"]
    sec = lin["linears"]
    assert sec["granularity"] == "rowwise" and sec["swapped"] and sec["numerics_only"]
    assert {"norm1.linear", "norm1_context.linear"} <= set(sec["kept"])  # flux's modulation projections
    for rep in (att, lin):
        acc = rep["accuracy"]
        assert acc["reference"] == "sdpa" and acc["configuration"] == rep["configuration"]
        assert len(acc["per_block_rel_rms"]) == 2 and acc["per_block_rel_rms"][-1] == acc["chain"]["rel_rms"]
        assert acc["block"]["finite"] and acc["chain"]["finite"] and acc["chain"]["cosine"] > 0.99
        assert rep["whole_step"]["accuracy"] == {"blocks": 2, **acc["chain"]}
    for key in ("block", "chain"):
        assert 0 < att["accuracy"][key]["rel_rms"] < lin["accuracy"][key]["rel_rms"] < 0.1, key
    md = (tmp_path / "l" / "validate.md").read_text()
    assert "## FP8 linears" in md and "## Accuracy: `fp8-emulated + fp8-linears-rowwise` vs `sdpa`" in md
    assert "numerics only" in md
    # the model's own configuration: nothing to measure the accuracy of
    plain = _run(capsys, "--preset", "flux-tiny", "--blocks", "2", "--device", "cpu", "--iters", "1",
                 "--chain-iters", "1", "--no-whole-step", "--out", str(tmp_path / "p"))
    assert plain["configuration"] == "sdpa" and plain["accuracy"] is None and not plain["numerics_only"]


def test_validate_linears_streamed_accuracy_equals_resident(tmp_path, capsys, one_thread):
    """The lockstep accuracy pass over blocks streamed through one working block gives the resident numbers."""
    common = ["--preset", "qwen-image-tiny", "--blocks", "2", "--device", "cpu", "--iters", "1", "--chain-iters",
              "1", "--no-whole-step", "--linears", "tensorwise"]
    res = _run(capsys, *common, "--out", str(tmp_path / "r"))
    st = _run(capsys, *common, "--stream", "--out", str(tmp_path / "s"))
    assert res["mode"] == "resident" and st["mode"] == "streamed"
    assert res["configuration"] == "sdpa + fp8-linears-tensorwise"
    assert st["accuracy"] == res["accuracy"] and res["accuracy"]["chain"]["rel_rms"] > 0
    assert res["accuracy"]["per_block_rel_rms"][0] != res["accuracy"]["per_block_rel_rms"][1]  # a real chain


def test_validate_linears_torchao_cannot_take_and_bad_input(tmp_path, capsys, monkeypatch):
    """wan-tiny's linears are 24 wide: none runs in FP8, the report lists each kept one with its reason and the
    accuracy is exact; an FP8 GPU without torchao is one line before any work."""
    rep = _run(capsys, "--preset", "wan-tiny", "--blocks", "2", "--device", "cpu", "--iters", "1", "--chain-iters",
               "1", "--no-whole-step", "--linears", "rowwise", "--out", str(tmp_path / "w"))
    sec = rep["linears"]
    assert sec["swapped"] == [] and len(sec["kept"]) == 10
    assert all("not a multiple of 16" in why for why in sec["kept"].values())
    assert rep["accuracy"]["chain"]["rel_rms"] == 0.0
    assert "no linear of this block runs in FP8" in (tmp_path / "w" / "validate.md").read_text()
    from ditprof.kernels import fp8_linear

    monkeypatch.setattr(fp8_linear, "fp8_tensor_cores", lambda device: True)
    monkeypatch.setattr(fp8_linear, "torchao_version", lambda: None)
    with pytest.raises(DitprofError, match="--linears rowwise on cpu needs torchao"):
        _call("validate", "--preset", "wan-tiny", "--device", "cpu", "--linears", "rowwise",
              "--out", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_validate_prologue_against_the_unfused_chain_and_sdpa(tmp_path, capsys, one_thread):
    """--prologue: every block's attention with the family's fused prologue; the accuracy holds the fused chain
    against sdpa and against the same chain's unfused FP8 attention, both finite and bounded, and the fusion
    keeps the chain as close to sdpa as the unfused one (it rounds less, not more)."""
    common = ["--blocks", "2", "--device", "cpu", "--iters", "1", "--chain-iters", "1", "--no-whole-step",
              "--attention", "fp8-emulated", "--prologue"]
    rep = _run(capsys, "--preset", "flux-tiny", *common, "--out", str(tmp_path / "f"))
    assert rep["configuration"] == "fp8-emulated+prologue" and rep["numerics_only"]
    assert rep["prologue"]["fused"] and rep["prologue"]["fused_modules"] == ["attn"]
    acc, vs = rep["accuracy"], rep["accuracy"]["vs_unfused"]
    assert acc["reference"] == "sdpa" and vs["reference"] == "fp8-emulated"
    for sec in (acc, vs):
        assert len(sec["per_block_rel_rms"]) == 2 and sec["per_block_rel_rms"][-1] == sec["chain"]["rel_rms"]
        for key in ("block", "chain"):
            a = sec[key]
            assert a["finite"] and math.isfinite(a["rel_rms"]) and a["cosine"] > 0.99, (key, a)
    for key in ("block", "chain"):
        assert 0 < acc[key]["rel_rms"] < 0.1 and 0 < vs[key]["rel_rms"] < 1.5e-2, key
    for fused, unfused in zip(acc["per_block_rel_rms"], vs["unfused_vs_reference_rel_rms"]):
        assert 0 < unfused < 0.1 and fused < 1.5 * unfused + 2e-3, (fused, unfused)
    md = (tmp_path / "f" / "validate.md").read_text()
    assert "## Fused attention prologue" in md and "- fused: attn;" in md
    # streamed through one working block, the fused processors see each block's own norm weights (remade when
    # the streamer copies the next block in)
    st = _run(capsys, "--preset", "flux-tiny", *common, "--stream", "--out", str(tmp_path / "s"))
    assert st["mode"] == "streamed" and st["accuracy"] == rep["accuracy"]
    assert "## Fused vs unfused prologue: `fp8-emulated+prologue` vs `fp8-emulated`" in md


def test_validate_prologue_family_without_one_and_bad_input(tmp_path, capsys, one_thread):
    """A family without a fused prologue: its one line (prologue_missing), the unfused FP8 chain validated; a
    backend with no fused prologue is one line before any work; the help lists the flag."""
    assert main(["validate", "--preset", "ltx-video-tiny", "--blocks", "2", "--device", "cpu", "--iters", "1",
                 "--chain-iters", "1", "--no-whole-step", "--attention", "fp8-emulated", "--prologue",
                 "--out", str(tmp_path / "w"), "--json"]) == 0
    cap = capsys.readouterr()
    rep, err = json.loads(cap.out), " ".join(cap.err.split())
    assert "--prologue: ltx-video has no fused prologue (" + get_family("ltx-video").prologue_missing + ")" in err
    assert err.count("has no fused prologue") == 1
    assert rep["configuration"] == "fp8-emulated" and "vs_unfused" not in rep["accuracy"]
    assert rep["prologue"] == {"fused": False, "missing": get_family("ltx-video").prologue_missing}
    assert rep["accuracy"]["chain"]["finite"] and 0 < rep["accuracy"]["chain"]["rel_rms"] < 0.1
    assert "none fused: its adapter declares no fused attention prologue" in (tmp_path / "w" / "validate.md").read_text()
    for attention in ([], ["--attention", "sdpa-math"]):
        assert main(["validate", "--preset", "flux-tiny", "--device", "cpu", "--prologue", *attention,
                     "--out", str(tmp_path / "x")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "--prologue fuses the processor's norm and RoPE" in lines[0], lines
    assert not (tmp_path / "x").exists()
    from ditprof.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["validate", "--help"])
    assert "--prologue" in capsys.readouterr().out
