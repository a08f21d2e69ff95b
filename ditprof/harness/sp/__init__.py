"""``--sp P``: one block under Ulysses sequence parallelism (launchers, the rank body, the attention wrappers, the
process group)."""
