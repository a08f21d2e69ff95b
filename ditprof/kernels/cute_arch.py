"""``CUTE_DSL_ARCH`` for the duration of one compile: CuTe DSL ops that check the target arch read it at trace
time, so compiling for an arch we do not have (sm_120a, sm_89 on a CPU machine) sets it, and puts back what was
there after."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def cute_dsl_arch(arch: str) -> Iterator[None]:
    old = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = old
