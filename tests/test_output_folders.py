"""Output folders: a run never replaces a file ditprof did not write, and a failed run leaves no folder it made."""

from __future__ import annotations

import json

import pytest

from ditprof import cli
from ditprof.errors import DitprofError
from ditprof.harness.run import atomic


def test_a_users_report_json_is_refused_before_any_work(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.json").write_text('{"my": "data"}')
    with pytest.raises(DitprofError, match=r"holds report\.json that ditprof did not write"):
        atomic.check_writable(out)
    assert (out / "report.json").read_text() == '{"my": "data"}'


def test_a_ditprof_report_without_manifest_is_ours(tmp_path):
    out = tmp_path / "old-run"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"schema": "ditprof.report/1", "files": ["report.md"]}))
    assert atomic.previous_entries(out) == {"report.json", "report.md"}
    assert atomic.check_writable(out) == out


def test_commit_refuses_to_replace_a_foreign_entry(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "split.png").write_text("the user's picture")
    with pytest.raises(DitprofError, match=r"holds split\.png that ditprof did not write"):
        with atomic.staged_dir(out) as stage:
            (stage / "split.png").write_text("ours")
            (stage / "report.json").write_text("{}")
    assert (out / "split.png").read_text() == "the user's picture"
    assert sorted(p.name for p in out.iterdir()) == ["split.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left


def test_failed_run_removes_the_folders_it_created(tmp_path):
    out = tmp_path / "traces" / "deeper" / "run"
    with pytest.raises(RuntimeError):
        with atomic.staged_dir(out) as stage:
            (stage / "report.md").write_text("half")
            raise RuntimeError("forced")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_existed_stays(tmp_path):
    (tmp_path / "traces").mkdir()
    with pytest.raises(RuntimeError):
        with atomic.staged_dir(tmp_path / "traces" / "run"):
            raise RuntimeError("forced")
    assert [p.name for p in tmp_path.iterdir()] == ["traces"]


def test_cli_failure_leaves_no_empty_traces(tmp_path, monkeypatch, capsys):
    """A run that fails after its output folder was checked (here: a size the family refuses, found when the
    inputs are built) leaves no ``traces/``."""
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["profile", "--preset", "minimax-h3-tiny", "--device", "cpu", "--height", "7", "--width", "7",
                   "--frames", "1"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multiples of 32" in err[0]
    assert list(tmp_path.iterdir()) == []
