"""The settings of FP8 linears, importable without torch (the CLI's help is built from them)."""

from __future__ import annotations

from dataclasses import dataclass

from ditprof.errors import DitprofError

GRANULARITIES = ("rowwise", "tensorwise")
TORCHAO_PIN = "torchao==0.18.0"


@dataclass(frozen=True)
class Fp8LinearConfig:
    """How the linears run in FP8: ``granularity`` of the scales (``rowwise`` or ``tensorwise``)."""

    granularity: str = "rowwise"

    def __post_init__(self):
        if self.granularity not in GRANULARITIES:
            raise DitprofError(f"FP8 linear granularity {self.granularity!r} is not one of: {', '.join(GRANULARITIES)}")

    @property
    def name(self) -> str:
        return f"fp8-linears-{self.granularity}"
