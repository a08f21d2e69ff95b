"""``--no-fp8-graphs`` / ``--no-tvm-ffi``: profile, compare and validate turn them into the run's ``Fp8Options``
(``RunSpec.fp8_options``, ``ValidateSpec.fp8_options``), every place a run resolves a backend hands them to the
backends that take FP8 options (``backends.resolve`` -> ``Backend.with_options``), the others ignore them, and the
report's ``settings.fp8_options`` records what the FP8 backends ran with.

CPU: the ``fp8`` backend is made available and its op (``kernels.op.fp8_attention``) replaced by a recorder that
runs SDPA, so the options the swap's calls carry are seen without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
from pathlib import Path

import jsonschema
import pytest
import torch

from ditprof.cli import main
from ditprof.harness.cli import commands
from ditprof.harness.run import compile_backends
from ditprof.harness.run.runner import spec_from_args
from ditprof.harness.swaps import backends
from ditprof.harness.validate import commands as validate_commands
from ditprof.kernels import op, registry
from ditprof.kernels.fp8_config import Fp8Options, default_options

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json").read_text())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    commands.register(sub)
    validate_commands.register(sub)
    return parser


def _spec(*argv):
    return spec_from_args(_parser().parse_args(list(argv)), argv[0])


@pytest.fixture
def fp8_recorded(monkeypatch):
    """The fp8 backend available here, its op recording the options of each call and running SDPA."""
    calls: list = []

    def recorder(q, k, v, *, scale=None, key_mask=None, options=None):
        calls.append(options)
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale).transpose(1, 2)

    real = backends.availability
    monkeypatch.setattr(backends, "availability", lambda n, d: (True, "") if n == "fp8" else real(n, d))
    monkeypatch.setattr(op, "fp8_attention", recorder)
    return calls


@pytest.mark.parametrize("command", ["profile", "compare"])
def test_flags_reach_the_run_spec(command):
    assert _spec(command, "--device", "cpu").fp8_options is None  # no flag: the process's options
    opts = _spec(command, "--device", "cpu", "--no-fp8-graphs").fp8_options
    assert opts == dataclasses.replace(default_options(), graphs=False) and opts.tvm_ffi is True
    opts = _spec(command, "--device", "cpu", "--no-tvm-ffi").fp8_options
    assert opts == dataclasses.replace(default_options(), tvm_ffi=False) and opts.graphs is True
    both = _spec(command, "--device", "cpu", "--no-fp8-graphs", "--no-tvm-ffi").fp8_options
    assert (both.graphs, both.tvm_ffi) == (False, False)
    # the sequence-parallel ranks get the spec pickled (torch.multiprocessing)
    spec = _spec(command, "--device", "cpu", "--no-fp8-graphs")
    assert pickle.loads(pickle.dumps(spec)).fp8_options == spec.fp8_options


def test_resolve_gives_fp8_the_options_and_others_ignore_them(fp8_recorded):
    opts = Fp8Options(graphs=False, tvm_ffi=False)
    b = backends.resolve("fp8", torch.device("cpu"), opts)
    q = torch.randn(1, 8, 2, 16)
    b.fn(q, q, q)
    assert fp8_recorded == [opts]
    backends.resolve("fp8", torch.device("cpu")).fn(q, q, q)
    assert fp8_recorded[-1] is None  # no options given: the process's
    assert backends.resolve("sdpa", torch.device("cpu"), opts) is registry.get("sdpa")
    assert backends.options_used(opts, ("sdpa", "fp8"))["graphs"] is False
    assert backends.options_used(opts, ("sdpa", None)) is None
    assert backends.options_used(None, ("fp8",)) == dataclasses.asdict(default_options())


def test_compare_runs_the_swap_with_the_options_and_reports_them(fp8_recorded, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--attention", "fp8", "--no-fp8-graphs",
                 "--iters", "1", "--warmup", "0", "--interleave", "0", "--json", "--out", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out)
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)
    want = dataclasses.replace(default_options(), graphs=False)
    assert fp8_recorded and all(o == want for o in fp8_recorded)
    assert rep["settings"]["fp8_options"] == dataclasses.asdict(want)
    assert rep["swapped"]["attention_backend"] == "fp8"


def test_a_run_without_fp8_backends_reports_no_options(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--no-tvm-ffi", "--iters", "1",
                 "--warmup", "0", "--json", "--out", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out)
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert rep["settings"]["fp8_options"] is None


def test_validate_spec_gets_the_options(monkeypatch, tmp_path):
    from ditprof.harness.validate import run as validate_run

    seen = []

    class Stop(Exception):
        pass

    def fake(spec, console=None):
        seen.append(spec)
        raise Stop

    monkeypatch.setattr(validate_run, "validate", fake)
    args = _parser().parse_args(["validate", "--device", "cpu", "--no-fp8-graphs", "--out", str(tmp_path / "v")])
    with pytest.raises(Stop):
        validate_commands.cmd_validate(args)
    assert seen[0].fp8_options == dataclasses.replace(default_options(), graphs=False)
    args = _parser().parse_args(["validate", "--device", "cpu", "--out", str(tmp_path / "w")])
    with pytest.raises(Stop):
        validate_commands.cmd_validate(args)
    assert seen[1].fp8_options is None


def test_for_compile_runs_a_numerics_backend_with_its_options():
    seen = []

    def emulation(q, k, v, *, scale=None, options=None):
        seen.append(options)
        return q * 2

    def with_options(options):
        return {"fn": lambda q, k, v, *, scale=None: emulation(q, k, v, scale=scale, options=options)}

    base = registry.Backend(name="fp8-emulated", fn=emulation, description="", availability=registry.anywhere,
                            numerics_only=True, options=with_options)
    opts = Fp8Options(graphs=False)
    b = compile_backends.for_compile(base.with_options(opts))
    q = torch.randn(1, 4, 2, 8)
    assert torch.equal(b.fn(q, q, q), q * 2)
    assert seen == [opts]
