"""The harness: profile one block, split its time, swap parts of it, compare, extrapolate, report.

Packages: ``run`` (a profile/compare run: the spec and plan, the measurement of a block under a list of swaps,
compile mode, memory, noise, extrapolation), ``swaps`` (what a measurement changes in the block: a swap installs
itself and undoes itself; the attention backend swap), ``trace`` (the time split by category, the profiler ranges,
the diff of two runs), ``report`` (report.json, report.md, the plot), ``validate`` (``ditprof validate`` and
``ditprof accuracy``), ``sp`` (``--sp``: Ulysses sequence parallelism) and ``cli`` (the subcommands and their flags).
"""
