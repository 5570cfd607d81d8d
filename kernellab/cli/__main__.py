"""``python -m kernellab.cli``: the command line."""

from kernellab.cli._main import main

main()
