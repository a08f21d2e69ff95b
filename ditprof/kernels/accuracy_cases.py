"""What ``kernels accuracy`` runs by default: the input families and the default shape per device. A leaf module
(no torch), so the CLI's help text is built from the same lists the run uses."""

from __future__ import annotations

FAMILIES = ("gaussian", "peaky", "k_bias", "outlier", "v_bias")
DEFAULT_SHAPE = {"cpu": (1, 4, 1024, 128), "cuda": (1, 8, 4096, 128)}  # (B, H, S, D)


def shape_text(device: str) -> str:
    return ",".join(str(n) for n in DEFAULT_SHAPE[device])
