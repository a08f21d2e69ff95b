"""The command line glue: subcommands and their flags (``commands``), argument checks (``args``), progress bars."""
