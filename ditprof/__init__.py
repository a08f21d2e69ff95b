"""ditprof: profile one DiT block, split its time, swap its attention for an FP8 kernel."""

__version__ = "0.1.0"
