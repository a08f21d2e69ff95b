"""`python -m pytest benchmarks/experimental`: the kernel variants module and the shared GPU test helpers import as
top-level modules (these tests are not part of CI's `tests/`)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests"))
