import sys

from ditprof.cli import main

sys.exit(main())
