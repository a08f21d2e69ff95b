"""One source resolver (``model_blocks.source``) and the one-line errors of bad model sources, caches and configs.

The network is never reached: huggingface_hub's client and the reachability probe are replaced by fakes that fail
the test when a string that is no ``owner/name`` id (or an offline Hub) would reach them.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from ditprof import cli
from ditprof.errors import DitprofError
from ditprof.model_blocks import get_family, get_preset, list_presets, load_block, make_checkpoint, make_inputs
from ditprof.model_blocks import hub as hub_mod
from ditprof.model_blocks import source as source_mod
from ditprof.model_blocks.inputs import resolve_layout
from ditprof.model_blocks.source import ModelSource, resolve_as, resolve_source

REAL_HUB_OFFLINE = hub_mod.hub_offline


@pytest.fixture
def no_hub(monkeypatch):
    """Any use of the Hub client or the probe fails the test; ``calls`` records the attempts."""
    import huggingface_hub

    calls = []

    class NoApi:
        def __init__(self, *a, **k):
            calls.append("HfApi")
            raise AssertionError("the Hub client was used")

    def no_probe():
        calls.append("probe")
        raise AssertionError("the Hub was probed")

    monkeypatch.setattr(huggingface_hub, "HfApi", NoApi)
    monkeypatch.setattr(hub_mod, "hub_unreachable", no_probe)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_mod, "hub_offline", lambda: False)
    monkeypatch.setattr(source_mod, "hub_offline", lambda: False)
    return calls


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    folder, _ = make_checkpoint(get_preset("wan-tiny"), tmp_path_factory.mktemp("src") / "wan", blocks=None,
                                progress=False)
    return folder


def _raises(match, fn, *a, **k) -> str:
    with pytest.raises(DitprofError, match=match) as info:
        fn(*a, **k)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def _one_line_error(capsys, argv, out: Path) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ditprof: error: "), err
    assert not out.exists()  # no run folder, nothing staged beside it
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return err[0]


# --------------------------------------------------------------------------- the resolver

def test_resolves_preset_folder_and_hub(wan_folder, no_hub):
    p = resolve_source("wan-tiny")
    assert (p.kind, p.preset, p.path, p.repo_id, p.source_kind) == ("preset", get_preset("wan-tiny"), None, None,
                                                                     "preset")
    f = resolve_source(str(wan_folder))
    assert (f.kind, f.path, f.preset, f.source_kind) == ("folder", wan_folder, None, "checkpoint")
    h = resolve_source("someone/some-model")
    assert (h.kind, h.repo_id, h.path, h.text) == ("hub", "someone/some-model", None, "someone/some-model")
    assert isinstance(h, ModelSource) and not no_hub  # resolving asks nothing of the Hub
    with pytest.raises(AttributeError):
        h.kind = "folder"  # frozen


def test_an_existing_folder_wins_over_a_repo_id(tmp_path, monkeypatch, wan_folder, no_hub):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(wan_folder, tmp_path / "owner" / "name")
    src = resolve_source("owner/name")
    assert src.kind == "folder" and src.path == Path("owner/name")
    loaded = load_block("owner/name", 0, dtype=torch.float32, progress=False)
    assert loaded.family.name == "wan" and not no_hub


def test_checkpoint_sources_take_no_preset_names(tmp_path, monkeypatch, wan_folder, no_hub):
    msg = _raises("is not a folder or a Hugging Face repo id", resolve_as, "wan-tiny", "checkpoint")
    assert "wan-tiny is a preset: give it with --preset" in msg
    monkeypatch.chdir(tmp_path)
    shutil.copytree(wan_folder, tmp_path / "wan-tiny")  # a folder of that name: --checkpoint means the folder
    assert resolve_as("wan-tiny", "checkpoint").kind == "folder"
    assert resolve_as("wan-tiny", "preset").kind == "preset"
    _raises(r"unknown preset 'nope' \(known: h3, h3-mini", resolve_as, "nope", "preset")


@pytest.mark.parametrize("text,match", [
    ("./nope", "checkpoint folder not found: ./nope .and not a preset name."),
    ("no/such/folder", "checkpoint folder not found: no/such/folder"),
    ("nope", r"'nope' is not a preset \(h3, h3-mini.*\), a folder, or a Hugging Face repo id"),
    ("~/no-such-ditprof-folder", "checkpoint folder not found: ~/no-such-ditprof-folder \\(/"),
    ("", "empty model source"),
    ("weights.pt", "refusing to unpickle weights.pt"),
    ("owner/model.ckpt", "refusing to unpickle owner/model.ckpt"),
])
def test_bad_strings_are_one_line_and_never_reach_the_hub(text, match, no_hub):
    _raises(match, resolve_source, text)
    _raises(match, load_block, text, progress=False)
    assert no_hub == []


def test_a_file_is_not_a_checkpoint_folder(wan_folder, no_hub):
    _raises("checkpoint folder not found: .*config.json is a file", resolve_source, str(wan_folder / "config.json"))


def test_pickled_weights_are_refused_in_an_existing_folder(tmp_path, no_hub):
    (tmp_path / "config.json").write_text(json.dumps(get_preset("wan-tiny").config))
    (tmp_path / "diffusion_pytorch_model.bin").write_bytes(b"not read")
    _raises("refusing to unpickle diffusion_pytorch_model.bin", load_block, str(tmp_path), progress=False)


# --------------------------------------------------------------------------- the Hub: offline and unreachable

def test_offline_hub_is_one_line_at_once(monkeypatch, no_hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(source_mod, "hub_offline", REAL_HUB_OFFLINE)  # as HF_HUB_OFFLINE=1 sets it
    t0 = time.perf_counter()
    msg = _raises("no folder fx/goood here .and not a preset name., and the Hugging Face Hub is offline "
                  r"\(HF_HUB_OFFLINE is set\), so repo fx/goood cannot be looked up", resolve_source, "fx/goood")
    _raises("Hugging Face Hub is offline", load_block, "fx/goood", progress=False)
    assert time.perf_counter() - t0 < 1.0 and no_hub == [] and "Retry" not in msg


def test_hub_offline_reads_the_environment(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert REAL_HUB_OFFLINE()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not REAL_HUB_OFFLINE()


def test_unreachable_hub_is_one_line_without_listing(monkeypatch, no_hub):
    monkeypatch.setattr(hub_mod, "hub_unreachable", lambda: "[Errno -2] Name or service not known")
    msg = _raises(r"no folder fx/goood here \(and not a preset name\), and the Hugging Face Hub cannot be reached to look up repo fx/goood "
                  r"\(\[Errno -2\] Name or service not known\)", load_block, "fx/goood", progress=False)
    assert no_hub == [] and "Retry" not in msg  # the client (which retries for half a minute) was not called


def test_missing_repo_names_the_missing_folder_too(monkeypatch, no_hub):
    import huggingface_hub

    class MissingRepo:
        def list_repo_files(self, repo_id, revision=None):
            raise RuntimeError("404 Client Error: Repository Not Found for url ...\nmore lines")

    monkeypatch.setattr(huggingface_hub, "HfApi", MissingRepo)
    monkeypatch.setattr(hub_mod, "hub_unreachable", lambda: None)
    _raises(r"no folder fx/goood here \(and not a preset name\), and cannot list Hugging Face repo fx/goood: 404 Client Error: Repository "
            r"Not Found for url \.\.\.$", load_block, "fx/goood", progress=False)


@pytest.mark.parametrize("command", ["profile", "compare", "validate"])
def test_cli_offline_typo_is_one_line_before_any_work(command, tmp_path, capsys, monkeypatch, no_hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read as huggingface_hub reads it, not a patched flag
    monkeypatch.setattr(source_mod, "hub_offline", REAL_HUB_OFFLINE)
    monkeypatch.setattr(hub_mod, "hub_offline", REAL_HUB_OFFLINE)
    out = tmp_path / "run"
    t0 = time.perf_counter()
    line = _one_line_error(capsys, [command, "--checkpoint", "fx/goood", "--device", "cpu", "--out", str(out)], out)
    assert line == ("ditprof: error: no folder fx/goood here (and not a preset name), and the Hugging Face Hub is "
                    "offline (HF_HUB_OFFLINE is set), so repo fx/goood cannot be looked up")
    assert no_hub == [] and time.perf_counter() - t0 < 5.0


def test_cli_missing_repo_is_one_line_naming_folder_and_preset(tmp_path, capsys, monkeypatch, no_hub):
    import huggingface_hub

    class MissingRepo:
        def list_repo_files(self, repo_id, revision=None):
            raise RuntimeError("404 Client Error: Repository Not Found for url ...\nmore lines")

    monkeypatch.setattr(huggingface_hub, "HfApi", MissingRepo)
    monkeypatch.setattr(hub_mod, "hub_unreachable", lambda: None)
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", "--checkpoint", "fx/goood", "--device", "cpu", "--out", str(out)],
                           out)
    assert line == ("ditprof: error: no folder fx/goood here (and not a preset name), and cannot list Hugging Face "
                    "repo fx/goood: 404 Client Error: Repository Not Found for url ...")


@pytest.mark.parametrize("text", ["./fx/goood", "fx/goood/", "fx/goood/x"])
def test_cli_typo_path_that_is_no_repo_id_never_reaches_the_hub(text, tmp_path, capsys, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", "--checkpoint", text, "--device", "cpu", "--out", str(out)], out)
    assert line == f"ditprof: error: checkpoint folder not found: {text}" and no_hub == []


def test_cli_missing_folder_is_one_line(tmp_path, capsys, no_hub):
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", "--checkpoint", str(tmp_path / "goood"), "--device", "cpu",
                                    "--out", str(out)], out)
    assert f"checkpoint folder not found: {tmp_path / 'goood'}" in line and no_hub == []


# --------------------------------------------------------------------------- the checkpoint cache

def test_cache_at_a_file_is_one_line(tmp_path, monkeypatch):
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("DITPROF_CACHE", str(blocker))
    msg = _raises(rf"cannot write the wan-tiny checkpoint to .*\(\$DITPROF_CACHE\): {blocker} is a file, not a "
                  "folder", make_checkpoint, get_preset("wan-tiny"), progress=False)
    assert "NotADirectoryError" not in msg and blocker.read_text() == ""
    monkeypatch.setenv("DITPROF_CACHE", str(blocker / "below"))
    _raises(f"{blocker} is a file, not a folder", load_block, "wan-tiny", progress=False)


def test_unwritable_cache_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """Tests run as root, so the permission error is injected where the staging folder is made."""
    import tempfile

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setenv("DITPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    _raises(r"cannot write the wan-tiny checkpoint to .*\(\$DITPROF_CACHE\): Permission denied", make_checkpoint,
            get_preset("wan-tiny"), progress=False)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


def _sys_refuses(path: Path) -> bool:
    try:
        path.mkdir()
    except PermissionError:
        return True
    except OSError:
        return False
    path.rmdir()
    return False


def test_cache_where_the_os_refuses_a_folder_is_one_line(monkeypatch):
    """A place even root may not write (sysfs takes no new folders): the real PermissionError, not an injected one."""
    cache = Path("/sys/ditprof-test-cache")
    if not _sys_refuses(cache):
        pytest.skip("this OS lets /sys take a new folder")
    monkeypatch.setenv("DITPROF_CACHE", str(cache))
    _raises(rf"cannot write the wan-tiny checkpoint to {cache}/.* \(\$DITPROF_CACHE\): Operation not permitted$",
            make_checkpoint, get_preset("wan-tiny"), progress=False)
    assert not cache.exists()


def test_cache_the_user_may_not_look_into_is_one_line(tmp_path, monkeypatch):
    """A non-root user's stat below another user's folder raises PermissionError (root's never does: injected)."""
    cache = tmp_path / "theirs" / "cache"
    real_is_dir = Path.is_dir

    def is_dir(self):
        if str(self).startswith(str(cache)):
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_dir(self)

    monkeypatch.setenv("DITPROF_CACHE", str(cache))
    monkeypatch.setattr(Path, "is_dir", is_dir)
    _raises(rf"cannot read the wan-tiny checkpoint at {cache}/.* \(\$DITPROF_CACHE\): Permission denied$",
            make_checkpoint, get_preset("wan-tiny"), progress=False)


def test_write_failure_midway_removes_the_staging_folder(tmp_path, monkeypatch):
    from ditprof.model_blocks import synthetic

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synthetic, "save_file", full)
    out = tmp_path / "ckpt"
    _raises(r"cannot write the wan-tiny checkpoint to .*\(--out\): No space left on device", make_checkpoint,
            get_preset("wan-tiny"), out, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_out_at_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    _raises("exists and is a file, not a checkpoint folder", make_checkpoint, get_preset("wan-tiny"), tmp_path / "f",
            progress=False)


def test_cli_unwritable_cache_is_one_line_and_no_run_folder(tmp_path, capsys, monkeypatch):
    cache = Path("/sys/ditprof-test-cache")
    if not _sys_refuses(cache):
        pytest.skip("this OS lets /sys take a new folder")
    monkeypatch.setenv("DITPROF_CACHE", str(cache))
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", "--preset", "wan-tiny", "--device", "cpu", "--tokens", "32",
                                    "--iters", "1", "--out", str(out)], out)
    assert line.startswith(f"ditprof: error: cannot write the wan-tiny checkpoint to {cache}/")
    assert line.endswith("($DITPROF_CACHE): Operation not permitted") and not cache.exists()


def test_cli_cache_at_a_file_is_one_line_and_no_run_folder(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("DITPROF_CACHE", str(blocker))
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", "--preset", "wan-tiny", "--device", "cpu", "--tokens", "32",
                                    "--iters", "1", "--out", str(out)], out)
    assert f"{blocker} is a file, not a folder" in line


# --------------------------------------------------------------------------- config values of the wrong type

def test_config_value_of_the_wrong_type_is_one_line(tmp_path, capsys, wan_folder):
    folder = tmp_path / "ckpt"
    shutil.copytree(wan_folder, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_attention_heads"] = "two"
    (folder / "config.json").write_text(json.dumps(cfg))
    match = r"config.json: num_attention_heads is 'two', but WanTransformer3DModel takes a number there"
    _raises(match, load_block, str(folder), progress=False)
    for command in ("profile", "compare", "validate"):  # the plan's meta-device estimate is reached by each
        out = tmp_path / f"run-{command}"
        line = _one_line_error(capsys, [command, "--checkpoint", str(folder), "--device", "cpu", "--tokens", "32",
                                        "--out", str(out)], out)
        assert re.search(match, line) and "TypeError" not in line, (command, line)


@pytest.mark.parametrize("name", [p.name for p in list_presets()])
def test_every_preset_config_passes_the_type_check(name):
    preset = get_preset(name)
    get_family(preset.family).check_value_types(preset.config)


# --------------------------------------------------------------------------- sizes the pipeline rounds

def test_rounded_size_is_said_and_both_sizes_kept(wan_folder):
    loaded = load_block(str(wan_folder), 0, dtype=torch.float32, progress=False)
    inputs = make_inputs(loaded, height=100, width=100, frames=6)
    assert inputs.grid.describe().startswith("2x6x6") and inputs.tokens == 72
    assert (inputs.requested_size, inputs.used_size) == ((100, 100, 6), (96, 96, 5))
    note = inputs.size_note
    assert note.startswith("size 100x100x6 (height x width x frames) runs as 96x96x5") and "\n" not in note
    assert "multiples of 16 (VAE 8 x patch 2)" in note and "4n + 1 frames" in note
    exact = make_inputs(loaded, height=96, width=96, frames=5)
    assert exact.size_note is None and exact.requested_size == exact.used_size == (96, 96, 5)
    counted = make_inputs(loaded, tokens=72)
    assert counted.size_note is None and counted.requested_size is None and counted.used_size is None


@pytest.mark.parametrize("name", [p.name for p in list_presets()])
def test_used_size_lays_out_the_same_grid_and_defaults_are_not_rounded(name):
    preset = get_preset(name)
    family = get_family(preset.family)
    default = resolve_layout(family, preset.config, preset)
    assert default.requested_size == default.used_size  # a preset's (or the pipeline's) default is exact
    if family.name == "minimax-h3":  # refuses spatial sizes off its multiples: only the frames round
        sizes = [(768, 1344, 120), (512, 512, 30)]
    else:
        sizes = [(500, 700, 30), (1000, 520, 7), (256, 256, 1)]
    for size in sizes:
        lay = resolve_layout(family, preset.config, preset, height=size[0], width=size[1], frames=size[2])
        again = resolve_layout(family, preset.config, preset, height=lay.used_size[0], width=lay.used_size[1],
                               frames=lay.used_size[2])
        assert (again.grid.frames, again.grid.height, again.grid.width) == (lay.grid.frames, lay.grid.height,
                                                                            lay.grid.width), (name, size)
        assert again.used_size == lay.used_size, (name, size)


def test_report_settings_carry_both_sizes_and_the_note_is_one_line(tmp_path, capsys, one_thread):
    out = tmp_path / "run"
    assert cli.main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--height", "100", "--width", "100",
                     "--frames", "5", "--iters", "1", "--warmup", "0", "--out", str(out)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "runs as" in ln]
    assert lines == ["size 100x100x5 (height x width x frames) runs as 96x96x5: the pipeline takes height and width "
                     "in multiples of 16 (VAE 8 x patch 2), 4n + 1 frames"]
    settings = json.loads((out / "report.json").read_text())["settings"]
    assert settings["size_requested"] == {"height": 100, "width": 100, "frames": 5}
    assert settings["size_used"] == {"height": 96, "width": 96, "frames": 5}
