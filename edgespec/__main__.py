"""`python -m edgespec` is the `edgespec` command."""

from edgespec.cli import main

main()
