"""Atomic outputs: files go through temp + rename; a run writes into a staging folder next to its output
folder and is moved into place only when everything succeeded. A failed run leaves nothing behind.

One run per folder: every committed run records the entries it wrote in ``MANIFEST``; the next run into the same
folder first removes the previous run's entries (and only those: files ditprof did not write stay untouched).
A run never replaces a file it did not write: an output folder whose ``report.json`` (or any entry the run
writes) is not from an earlier ditprof run is refused in one line, before any work. Folders that a failed run
created on the way to its output folder (the default ``traces/``) are removed again."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ditprof.errors import DitprofError

MANIFEST = "ditprof-files.json"  # {"entries": [top-level names this run wrote]}
REPORT_SCHEMA_PREFIX = "ditprof."  # the ``schema`` of every report ditprof writes (ditprof.report/1, ...)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def check_writable(out: str | Path) -> Path:
    """Fail early (one line) when ``out`` cannot be created or written."""
    out = Path(out).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise DitprofError(f"output dir {out} exists and is not a folder")
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DitprofError(f"output dir {out} is not writable: {existing} is a file, not a folder")
    if out.is_dir():
        refuse_foreign(out, ["report.json"])
    parent = out if out.exists() else out.parent
    created = missing_parents(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=parent, prefix=".ditprof-probe-", delete=True)
        probe.close()
    except OSError as exc:
        remove_if_empty(created)
        raise DitprofError(f"output dir {out} is not writable ({exc.strerror or exc})") from None
    _CREATED.setdefault(out, created)
    return out


# output folder -> the folders check_writable created on the way to it (removed again if the run fails)
_CREATED: dict[Path, list[Path]] = {}


def missing_parents(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def remove_if_empty(folders: list[Path]) -> None:
    """Remove each folder (deepest first) while it is empty: what a failed run created and left empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def remove_created_left_empty() -> None:
    """Remove the folders check_writable created for runs that did not commit, where they are still empty (the
    CLI calls it when a command ends, so a failed run leaves no empty ``traces/`` behind)."""
    while _CREATED:
        remove_if_empty(_CREATED.popitem()[1])


def forget_created(out: Path) -> list[Path]:
    """The folders created for ``out`` by check_writable, no longer to be cleaned up by this process."""
    return _CREATED.pop(Path(out).expanduser().absolute(), [])


def is_ditprof_report(path: Path) -> bool:
    """Whether ``path`` is a report ditprof wrote (its ``schema`` names ditprof); JSON only, never unpickled."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and str(data.get("schema", "")).startswith(REPORT_SCHEMA_PREFIX)


def refuse_foreign(out: Path, names) -> None:
    """One-line DitprofError when any of ``names`` exists in ``out`` and was not written by an earlier ditprof run
    (a run would replace the user's own file)."""
    ours = previous_entries(out)
    foreign = sorted(n for n in names if (out / n).exists() and n not in ours)
    if foreign:
        raise DitprofError(f"output dir {out} holds {', '.join(foreign)} that ditprof did not write: choose an "
                           f"empty or new folder (--out)")


@contextlib.contextmanager
def staged_dir(out: str | Path) -> Iterator[Path]:
    """Yield a staging folder; on success its contents replace ``out``; on any failure it is removed.

    If ``out`` already exists, entries of the same name are replaced one by one (others are kept);
    ``report.json`` is moved last so that its presence marks a complete run.
    """
    out = check_writable(out)
    from ditprof import interrupt

    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    interrupt.register_staging(stage)  # a hard exit on Ctrl-C removes it too
    os.chmod(stage, 0o777 & ~_umask())
    try:
        try:
            yield stage
            commit(stage, out)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            remove_if_empty(forget_created(out))
            raise
        forget_created(out)
        shutil.rmtree(stage, ignore_errors=True)
    finally:
        interrupt.unregister_staging(stage)


def _entry_name(name) -> str | None:
    """A top-level entry name from a manifest or an old report's file list; None for anything else."""
    if not isinstance(name, str) or not name:
        return None
    top = name.split("/")[0]
    return None if top in (".", "..", MANIFEST) or "\\" in top else top


def previous_entries(out: Path) -> set[str]:
    """Entries an earlier ditprof run wrote into ``out``: its manifest, or (a run from before manifests) the
    ``files`` its report.json lists. JSON only; anything unreadable counts as nothing to remove."""
    names: list = []
    try:
        if (out / MANIFEST).is_file():
            names = json.loads((out / MANIFEST).read_text()).get("entries", [])
        elif is_ditprof_report(out / "report.json"):
            names = json.loads((out / "report.json").read_text()).get("files", []) + ["report.json"]
    except (OSError, ValueError, AttributeError):
        return set()
    return {n for n in map(_entry_name, names if isinstance(names, list) else []) if n}


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def commit(stage: Path, out: Path) -> None:
    written = sorted(p.name for p in stage.iterdir() if p.name != MANIFEST)
    if out.exists():
        refuse_foreign(out, written)
    (stage / MANIFEST).write_text(json.dumps({"entries": written}) + "\n")
    if not out.exists():
        os.rename(stage, out)
        return
    # report.json first out and last in: its presence marks a complete run
    stale = previous_entries(out) - set(written)
    for name in sorted(stale, key=lambda n: n != "report.json"):
        _remove(out / name)
    if "report.json" in written:
        _remove(out / "report.json")
    entries = sorted(stage.iterdir(), key=lambda p: p.name == "report.json")
    for entry in entries:
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{entry.name}.old-", dir=out))
            os.rename(target, old / entry.name)
            os.rename(entry, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(entry, target)
