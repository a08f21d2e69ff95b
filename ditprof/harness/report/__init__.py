"""report.json (``document``, ``report.schema.json``), its summary table and report.md (``summary``), the split plot."""
