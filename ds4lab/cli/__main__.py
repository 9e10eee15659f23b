"""``python -m ds4lab.cli``: the command line."""

from . import main

main()
