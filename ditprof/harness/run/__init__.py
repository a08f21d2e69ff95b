"""One profile/compare run: the run spec and plan, the measurement of a block under a list of swaps (``measure``,
``session``), compile mode, memory budget, timing noise, extrapolation, the environment and the run folder."""
