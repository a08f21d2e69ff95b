"""What a profiler trace says: the time split by category (``categories``), the op tables and inductor kernel names
behind it, the profiler ranges the harness puts around a block's parts (``ranges``) and the diff of two runs."""
