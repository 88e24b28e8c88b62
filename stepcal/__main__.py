"""`python -m stepcal`: the same command line as the `stepcal` script."""
import sys

from stepcal.experiments.cli import main

sys.exit(main())
