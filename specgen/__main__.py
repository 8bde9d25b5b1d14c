"""`python -m specgen` runs the command line."""

from specgen.cli import main

main()
