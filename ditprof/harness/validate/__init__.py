"""``ditprof validate`` (is N x one block the time of N chained blocks?) and ``ditprof accuracy``."""
