"""Hugging Face Hub sources: fetch config.json, the index and only the shards holding one block.

Files land in the normal huggingface_hub cache, so the snapshot folder looks like a local
diffusers folder in which only some shards exist; the loader never opens the others.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ditprof.errors import DitprofError

from .checkpoint import CONFIG_NAME, INDEX_NAME, SINGLE_NAME

PROBE_TIMEOUT_S = 5.0  # the one reachability request before the Hub is listed
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_repo_id(source: str) -> bool:
    return bool(REPO_ID.match(source)) and not source.startswith((".", "/", "~"))


def transformer_subfolder(repo_files: list[str]) -> str:
    """Where the transformer lives: ``transformer/`` in pipeline repos, the root in model repos."""
    if f"transformer/{CONFIG_NAME}" in repo_files:
        return "transformer"
    if CONFIG_NAME in repo_files:
        return ""
    raise DitprofError("repo has neither transformer/config.json nor config.json")


def weights_file(repo_files: list[str], subfolder: str) -> str:
    """The index (sharded) or the single safetensors file; pickled weights are refused."""
    prefix = f"{subfolder}/" if subfolder else ""
    for name in (INDEX_NAME, SINGLE_NAME):
        if prefix + name in repo_files:
            return name
    raise DitprofError(f"repo has no {prefix}{INDEX_NAME} or {prefix}{SINGLE_NAME} (pickled weights are not read)")


def hub_offline() -> bool:
    """huggingface_hub's offline mode (``HF_HUB_OFFLINE``), as it reads it or as the environment sets it now."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES",
                                                                                             "TRUE")


def hub_unreachable() -> str | None:
    """Why the Hub endpoint cannot be reached, or None: one request, no retries (huggingface_hub's own calls
    retry a failed connection for about half a minute), through its session so proxies and HF_ENDPOINT apply."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:  # httpx connect/timeout errors and the like: any answer at all means reachable
        return _first_line(exc)
    return None


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class HubCheckpoint:
    """A repo id resolved to a local folder holding config.json + index; shards on demand. ``why`` prefixes the
    errors with why the Hub was asked at all (e.g. that no local folder of that name exists)."""

    def __init__(self, repo_id: str, revision: str | None = None, *, why: str = ""):
        try:
            from huggingface_hub import HfApi, hf_hub_download
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise DitprofError(f"huggingface_hub is needed for repo ids: {exc}") from None
        self._download = hf_hub_download
        self.repo_id, self.revision = repo_id, revision
        lead = f"{why}, and " if why else ""
        if hub_offline():
            raise DitprofError(f"{lead}the Hugging Face Hub is offline (HF_HUB_OFFLINE is set), so repo {repo_id} "
                               f"cannot be looked up")
        reason = hub_unreachable()
        if reason is not None:
            raise DitprofError(f"{lead}the Hugging Face Hub cannot be reached to look up repo {repo_id} ({reason})")
        try:
            files = HfApi().list_repo_files(repo_id, revision=revision)
        except Exception as exc:
            raise DitprofError(f"{lead}cannot list Hugging Face repo {repo_id}: {_first_line(exc)}") from None
        self.subfolder = transformer_subfolder(files)
        config = self.fetch(CONFIG_NAME)
        self.folder = Path(config).parent
        name = weights_file(files, self.subfolder)
        if name == INDEX_NAME:
            self.fetch(INDEX_NAME)
        else:
            self.fetch(SINGLE_NAME)  # one unsharded file: the block is somewhere inside it

    def fetch(self, filename: str) -> str:
        try:
            return self._download(
                self.repo_id, filename, subfolder=self.subfolder or None, revision=self.revision
            )
        except Exception as exc:
            raise DitprofError(f"cannot download {filename} from {self.repo_id}: {_first_line(exc)}") from None

    def fetch_shards(self, shards: list[str]) -> None:
        for shard in shards:
            self.fetch(shard)
