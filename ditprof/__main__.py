from ditprof.cli import entry

entry()
