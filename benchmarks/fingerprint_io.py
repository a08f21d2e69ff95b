"""Writing a fingerprint JSON and comparing it with an earlier one: shared by the *_fingerprint.py scripts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def write_and_compare(out: dict, json_path: str, compare_path: str | None, same: str, differs: str, *,
                      field: Callable[[Any], Any] = lambda entry: entry, both_sides: bool = True) -> int:
    """Write ``out`` to ``json_path``; with ``compare_path``, print ``same`` or ``differs`` plus the names whose
    ``field`` differs (over both files' names, or ``out``'s alone) and return 1 where any does."""
    Path(json_path).write_text(json.dumps(out, indent=1))
    if not compare_path:
        return 0
    before = json.loads(Path(compare_path).read_text())
    names = sorted(set(out) | set(before)) if both_sides else list(out)
    absent = object()

    def value(side: dict, name: str):
        return field(side[name]) if name in side else absent

    diff = [n for n in names if value(before, n) != value(out, n)]
    print(same if not diff else f"{differs}: {', '.join(diff)}")
    return 1 if diff else 0
