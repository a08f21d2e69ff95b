"""`ditprof --help`, `--version` and `presets` stay light: they import neither torch nor diffusers (the time
itself is measured by benchmarks/cli_startup.py); the stored presets table is what the classes give today."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[1])
PROBE = ("import sys, runpy\nsys.argv = ['ditprof'] + sys.argv[1:]\n"
         "try:\n    runpy.run_module('ditprof', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print('HEAVY=' + ','.join(m for m in ('torch', 'diffusers', 'transformers', 'matplotlib') "
         "if m in sys.modules), file=sys.stderr)\n")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["presets"], ["profile", "--help"]])
def test_light_commands_import_no_torch(argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, timeout=120)
    heavy = [line for line in res.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy == ["HEAVY="], res.stderr[-2000:]
    assert res.stdout.strip()


def test_stored_presets_table_matches_the_classes():
    """Regenerate with `python -m ditprof.model_blocks.presets_table` when a preset or the diffusers pin changes."""
    from ditprof.model_blocks import presets_table

    stored = presets_table.load()
    assert stored is not None, "presets_table.json is stale: regenerate it"
    assert stored == tuple(json.loads(json.dumps(x)) for x in presets_table.compute_rows())
    row = next(r for r in stored[0] if r["preset"] == "h3" and r["kind"] == "main")
    assert (row["params"], row["rows"]) == (645_571_840, 30272) and round(row["bytes"] / 2**30, 2) == 1.20
