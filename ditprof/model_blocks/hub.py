"""Hugging Face Hub sources: fetch config.json, the index and only the shards holding one block.

Files land in the normal huggingface_hub cache, so the snapshot folder looks like a local
diffusers folder in which only some shards exist; the loader never opens the others.
"""

from __future__ import annotations

import re
from pathlib import Path

from ditprof.errors import DitprofError

from .checkpoint import CONFIG_NAME, INDEX_NAME, SINGLE_NAME

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


class HubCheckpoint:
    """A repo id resolved to a local folder holding config.json + index; shards on demand."""

    def __init__(self, repo_id: str, revision: str | None = None):
        try:
            from huggingface_hub import HfApi, hf_hub_download
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise DitprofError(f"huggingface_hub is needed for repo ids: {exc}") from None
        self._download = hf_hub_download
        self.repo_id, self.revision = repo_id, revision
        try:
            files = HfApi().list_repo_files(repo_id, revision=revision)
        except Exception as exc:
            raise DitprofError(f"cannot list Hugging Face repo {repo_id}: {str(exc).splitlines()[0]}") from None
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
            raise DitprofError(f"cannot download {filename} from {self.repo_id}: {str(exc).splitlines()[0]}") from None

    def fetch_shards(self, shards: list[str]) -> None:
        for shard in shards:
            self.fetch(shard)
