"""`python -m specgen` runs the command line."""

from specgen.cli.app import main

main()
