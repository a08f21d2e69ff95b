"""Extrapolation math, memory budget parsing/limits, atomic writes and forced-failure runs, bad input."""

import os
from types import SimpleNamespace

import pytest
import torch

from ditprof import cli
from ditprof.errors import DitprofError
from ditprof.harness.run import atomic
from ditprof.harness.run import memory
from ditprof.harness.run import runner
from ditprof.harness.run.extrapolate import amdahl, extrapolate, scale_factor

# --------------------------------------------------------------------------- extrapolation


def test_scale_factor():
    assert scale_factor(40) == 40
    assert scale_factor(40, steps=50) == 2000
    assert scale_factor(40, steps=50, cfg=True) == 4000
    assert scale_factor(40, cfg=True) == 80
    with pytest.raises(ValueError):
        scale_factor(0)


def test_amdahl():
    assert amdahl(0.0, 10.0) == pytest.approx(1.0)
    assert amdahl(1.0, 4.0) == pytest.approx(4.0)
    assert amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl(0.6, 1e12) == pytest.approx(2.5)  # limit 1 / (1 - share)
    with pytest.raises(ValueError):
        amdahl(1.5, 2.0)
    with pytest.raises(ValueError):
        amdahl(0.5, 0.0)


def test_extrapolate():
    base = {"median": 10.0, "min": 9.0, "max": 12.0}
    sw = {"median": 8.0, "min": 7.5, "max": 9.0}
    ex = extrapolate(n_blocks=40, baseline_block_ms=base, swapped_block_ms=sw, baseline_attention_share=0.5,
                     baseline_attention_ms=5.0, swapped_attention_ms=2.5, steps=50, cfg=True)
    assert ex["factor"] == 4000
    assert ex["baseline_ms"] == pytest.approx(40000.0)
    assert ex["baseline_band_ms"] == pytest.approx({"median": 40000.0, "min": 36000.0, "max": 48000.0})
    assert ex["swapped_ms"] == pytest.approx(32000.0)
    assert ex["swapped_band_ms"]["min"] == pytest.approx(30000.0)
    assert ex["speedup"] == pytest.approx(1.25)
    assert ex["attention_speedup"] == pytest.approx(2.0)
    assert ex["amdahl_predicted_speedup"] == pytest.approx(1 / 0.75)
    assert ex["amdahl_predicted_swapped_block_ms"] == pytest.approx(7.5)
    assert ex["measured_swapped_block_ms"] == 8.0
    assert ex["speedup_note"] is None
    only = extrapolate(n_blocks=30, baseline_block_ms=base)
    assert only["baseline_ms"] == 300.0 and only["swapped_ms"] is None and only["speedup"] is None
    emu = extrapolate(n_blocks=40, baseline_block_ms=base, swapped_block_ms=sw, baseline_attention_share=0.5,
                      baseline_attention_ms=5.0, swapped_attention_ms=2.5, numerics_only=True)
    assert emu["swapped_ms"] == pytest.approx(320.0) and emu["measured_swapped_block_ms"] == 8.0  # times kept
    assert [emu[k] for k in ("speedup", "attention_speedup", "amdahl_predicted_speedup",
                             "amdahl_predicted_swapped_block_ms")] == [None] * 4
    assert emu["speedup_note"].startswith("numerics only:")


# --------------------------------------------------------------------------- memory budget


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * 2**30), ("16 GiB", 16 * 2**30), ("16gib", 16 * 2**30), ("24GB", 24 * 10**9), ("24g", 24 * 10**9),
    ("8000MiB", 8000 * 2**20), ("1.5TiB", int(1.5 * 2**40)), ("1024", 1024),
])
def test_parse_size(text, expected):
    assert memory.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "16 GiBs", "-1GiB", "0GiB", "1e3GB", "16XB"])
def test_parse_size_rejects(text):
    with pytest.raises(DitprofError, match="gpu-memory"):
        memory.parse_size(text)


class FakeCuda:
    def __init__(self, total):
        self.total = total
        self.fractions = []

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=self.total))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Fake H200")
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i=None: self.fractions.append(f))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 15 * 2**30)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_budget_caps_and_restores(monkeypatch):
    fake = FakeCuda(140 * 2**30)
    fake.install(monkeypatch)
    with memory.memory_budget("16GiB", torch.device("cuda")) as nbytes:
        assert nbytes == 16 * 2**30
        assert fake.fractions == [pytest.approx(16 / 140)]
    assert fake.fractions[-1] == 1.0


def test_budget_larger_than_card(monkeypatch):
    FakeCuda(16 * 2**30).install(monkeypatch)
    with pytest.raises(DitprofError, match="larger than the card .*Fake H200"):
        with memory.memory_budget("24GiB", torch.device("cuda")):
            pass


def test_budget_oom_is_one_line(monkeypatch):
    fake = FakeCuda(140 * 2**30)
    fake.install(monkeypatch)
    with pytest.raises(DitprofError) as err:
        with memory.memory_budget("16GiB", torch.device("cuda")):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB ...")
    msg = str(err.value)
    assert "\n" not in msg and "budget 16.00 GiB" in msg and "peak reached 15.00 GiB" in msg
    assert fake.fractions[-1] == 1.0


def test_budget_needs_cuda():
    with pytest.raises(DitprofError, match="needs --device cuda"):
        with memory.memory_budget("16GiB", torch.device("cpu")):
            pass


# --------------------------------------------------------------------------- atomic outputs


def test_write_bytes_is_atomic(tmp_path, monkeypatch):
    p = tmp_path / "report.json"
    atomic.write_text(p, "old")
    assert oct(p.stat().st_mode & 0o777) != oct(0o600)

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic.write_text(p, "new")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["report.json"]  # no temp file left


def test_staged_dir_failure_leaves_nothing(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with atomic.staged_dir(out) as stage:
            (stage / "report.md").write_text("half")
            raise RuntimeError("forced")
    assert list(tmp_path.iterdir()) == []


def test_staged_dir_into_existing_folder(tmp_path):
    out = tmp_path / "run"
    (out / "tb").mkdir(parents=True)
    (out / "tb" / "old.pt.trace.json").write_text("{}")
    (out / "keep.txt").write_text("keep")
    (out / atomic.MANIFEST).write_text('{"entries": ["tb"]}')  # tb is an earlier run's; keep.txt the user's
    with atomic.staged_dir(out) as stage:
        (stage / "tb").mkdir()
        (stage / "tb" / "new.pt.trace.json").write_text("{}")
        (stage / "report.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["ditprof-files.json", "keep.txt", "report.json", "tb"]
    assert [p.name for p in (out / "tb").iterdir()] == ["new.pt.trace.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_not_writable(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DitprofError, match="not writable: .*is a file"):
        atomic.check_writable(f / "run")
    with pytest.raises(DitprofError, match="exists and is not a folder"):
        atomic.check_writable(f)


def _spec(tmp_path, **over):
    args = dict(preset="wan-tiny", checkpoint=None, block=0, device="cpu", baseline=None, attention=None,
                tokens=None, height=None, width=None, frames=None, blocks=None, steps=None, cfg=False,
                gpu_memory=None, out=str(tmp_path / "run"), warmup=0, iters=1, seed=0)
    args.update(over)
    return runner.spec_from_args(SimpleNamespace(**args), "compare")


@pytest.mark.parametrize("when", ["baseline", "write"])
def test_forced_failure_leaves_no_report(tmp_path, when):
    spec = _spec(tmp_path)
    with pytest.raises(DitprofError, match="forced failure"):
        runner.execute(spec, fail_after=when)
    assert list(tmp_path.iterdir()) == []  # no run folder, no staging folder, no trace


def test_default_spec_cpu(tmp_path):
    spec = _spec(tmp_path, preset=None, out=None)
    assert spec.source == "h3-mini" and spec.swap == "fp8-emulated" and spec.baseline == "sdpa"
    assert spec.out.parts[0] == "traces" and spec.out.name.startswith("h3-mini-")


def test_default_swap_on_cuda_prefers_fp8_then_peers(monkeypatch):
    from ditprof.harness.swaps import backends

    avail = {"fp8": False, "fa4": False, "sdpa-cudnn": True, "sdpa-flash": True}
    monkeypatch.setattr(backends, "availability", lambda n, d: (avail.get(n, True), ""))
    assert backends.default_swap(torch.device("cuda")) == "sdpa-cudnn"
    avail["fa4"] = True
    assert backends.default_swap(torch.device("cuda")) == "fa4"
    avail["fp8"] = True
    assert backends.default_swap(torch.device("cuda")) == "fp8"
    assert backends.default_swap(torch.device("cpu")) == "fp8-emulated"


# --------------------------------------------------------------------------- bad input through the CLI


@pytest.mark.parametrize("extra,message", [
    (["--attention", "nope"], r"unknown attention backend 'nope'; available on cpu: .*sdpa.*not available: .*\("),
    (["--attention", "sdpa-flash"], r"'sdpa-flash' is not available on cpu: "),
    (["--baseline", "fa4"], r"'fa4' is not available on cpu: "),
    (["--gpu-memory", "lots"], r"--gpu-memory 'lots' is not a size"),
    (["--gpu-memory", "16GiB"], r"needs --device cuda"),
    (["--tokens", "1031"], r"1031 tokens do not factor"),
    (["--preset", "nope"], r"unknown preset 'nope'"),
    (["--tokens", "64", "--height", "64"], r"--tokens or --height"),
    (["--iters", "0"], r"--iters must be >= 1"),
])
def test_bad_input_one_line(tmp_path, capsys, extra, message):
    argv = ["compare", "--preset", "wan-tiny", "--device", "cpu", "--out", str(tmp_path / "run"), "--iters", "1",
            "--warmup", "0"]
    # later flags win in argparse
    rc = cli.main(argv + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err and err[-1].startswith("ditprof: error: ")
    import re

    assert re.search(message, err[-1]), err[-1]
    assert not (tmp_path / "run").exists()


def test_bad_out_dir(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    rc = cli.main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--out", str(f / "run")])
    assert rc == 2 and "is not writable" in capsys.readouterr().err


def test_backends_command(capsys):
    assert cli.main(["backends", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "fp8-emulated" in out and "ditprof_fp8_emulated" in out and "sdpa-flash" in out


def test_accuracy_metrics():
    from ditprof.harness.report.document import accuracy

    torch.manual_seed(0)
    a = torch.randn(3, 1000, 16)
    acc = accuracy(a, a.clone(), chunk=1000)
    assert acc["block_output_rel_rms"] == 0 and acc["block_output_cosine"] == pytest.approx(1.0)
    noise = 0.01 * torch.randn_like(a)
    b = a + noise
    acc = accuracy(a, b, chunk=777)  # chunking must not change the result
    d = b.double() - a.double()
    ref = ((d ** 2).mean().sqrt() / (a.double() ** 2).mean().sqrt()).item()
    assert acc["block_output_rel_rms"] == pytest.approx(ref, rel=1e-9)
    cos = torch.nn.functional.cosine_similarity(a.double().flatten(), (a + noise).double().flatten(), dim=0).item()
    assert acc["block_output_cosine"] == pytest.approx(cos, rel=1e-12)
    assert acc["block_output_max_abs_diff"] == pytest.approx(noise.abs().max().item(), rel=1e-6)
    assert accuracy(a, -a)["block_output_cosine"] == pytest.approx(-1.0)
